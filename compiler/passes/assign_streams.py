"""assign-streams: put the launches of a planned function on streams, ordered across streams by events.

Independent branches (the towers of an inception module, the two operands of a residual add) go to
different streams, so a GPU can run them at once. A launch continues the stream of a producer it
depends on when that producer is the stream's latest launch; otherwise it opens a new stream (up to
`max-streams`), or takes the stream that has been idle longest.

Every dependence that crosses streams gets an event: `exec.signal {event, stream}` right after the
producer, `exec.wait {event, stream}` before the consumer. Dependences are the data flow and the
arena: a launch that writes bytes which an earlier launch of another tensor read or wrote must wait
for it (the memory plan shares bytes between tensors that are never alive together in the serial
order). Vector clocks drop waits already implied by earlier ones. Streams other than 0 are joined
into stream 0 before the return. Statistics: streams, events.

Runs after plan-memory. The CUDA executor launches on that many CUDA streams; the CPU executor
runs the launches in printed order (TVM's kernels already use every core each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op
from compiler.memory import check_plan, is_planned, view_spans
from compiler.passes import Pass
from dialects.exec import Signal, Wait


@dataclass
class AssignStreams(Pass):
    name = "assign-streams"
    summary = "run independent branches of a planned function on separate streams, synchronized by events"
    max_streams: int = field(default=4, metadata={"help": "the most streams to use"})

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise GCError(f"pass 'assign-streams': max-streams must be at least 1, got {self.max_streams}")

    def run(self, module: Module) -> None:
        for f in module:
            if not is_planned(f) or any(op.name in ("exec.signal", "exec.wait") for op in f.ops):
                continue
            streams, events = _assign(f, self.max_streams)
            self.stats["streams"] += streams
            self.stats["events"] += events
            check_plan(module, f)


def _steps(f: Func) -> list[Op]:
    return [op for op in f.ops if op.name in ("exec.launch", "exec.copy")]


def _dependences(f: Func, steps: list[Op]) -> list[list[int]]:
    """For each step, the earlier steps it must follow: producers of what it reads, and every earlier
    reader and writer of other tensors in the bytes it writes."""
    index = {op: i for i, op in enumerate(steps)}
    where = view_spans(f)
    touch: list[tuple[int, int, int]] = []  # (lo, hi, step) of every access so far
    deps: list[list[int]] = []
    for i, op in enumerate(steps):
        n = len(op.results)
        ins, dests = op.operands[: len(op.operands) - n], op.operands[len(op.operands) - n :]
        mine = {index[v.owner] for v in ins if v.owner in index}
        for d, r in zip(dests, op.results):
            if d in where:
                lo, hi = where[d]
                where[r] = (lo, hi)
                mine |= {s for a, b, s in touch if a < hi and lo < b}
        for v in [*ins, *op.results]:
            if v in where:
                touch.append((*where[v], i))
        mine.discard(i)
        deps.append(sorted(mine))
    return deps


def _assign(f: Func, max_streams: int) -> tuple[int, int]:
    steps = _steps(f)
    index = {op: i for i, op in enumerate(steps)}
    deps = _dependences(f, steps)
    data = [{index[v.owner] for v in op.operands if v.owner in index} for op in steps]
    stream = [0] * len(steps)
    tail: dict[int, int] = {}  # stream -> its latest step
    for i in range(len(steps)):
        cont = [s for s, t in tail.items() if t in data[i]]
        if cont:
            s = min(cont)  # the lowest: the join lands on stream 0 and needs no event back
        elif not tail:
            s = 0
        elif len(tail) < max_streams:
            s = len(tail)
        else:
            s = min(tail, key=lambda s: (tail[s], s))
        stream[i] = s
        tail[s] = i
    # Events: vector clocks say what each stream already waited for.
    known: dict[int, dict[int, int]] = {}  # stream -> {stream: steps of it known complete}
    count: dict[int, int] = {}
    snapshot: list[dict[int, int]] = []
    waits: dict[int, list[int]] = {}  # step -> producers to wait for
    for i in range(len(steps)):
        s = stream[i]
        clock = known.setdefault(s, {})
        for d in sorted(deps[i], reverse=True):  # the latest first: its event often implies the earlier ones
            sd = stream[d]
            if sd == s or clock.get(sd, 0) >= snapshot[d][sd]:
                continue
            waits.setdefault(i, []).append(d)
            for k, t in snapshot[d].items():
                clock[k] = max(clock.get(k, 0), t)
        count[s] = count.get(s, 0) + 1
        clock[s] = count[s]
        snapshot.append(dict(clock))
    signalled: dict[int, int] = {}
    needed = {d for ds in waits.values() for d in ds}
    # Join into stream 0 the streams whose last launch it has not waited for already.
    last = {s: max(i for i in range(len(steps)) if stream[i] == s) for s in set(stream) if s != 0}
    last = {s: i for s, i in last.items() if known.get(0, {}).get(s, 0) < count[s]}
    needed |= set(last.values())
    ops: list[Op] = []
    for op in f.ops:
        i = index.get(op)
        if i is not None:
            for d in waits.get(i, []):
                ops.append(Wait([], {"event": signalled[d], "stream": stream[i]}, None, op.loc))
            op.attrs["stream"] = stream[i]
        ops.append(op)
        if i is not None and i in needed:
            signalled[i] = len(signalled)
            ops.append(Signal([], {"event": signalled[i], "stream": stream[i]}, None, op.loc))
    for s, i in sorted(last.items()):
        ops.append(Wait([], {"event": signalled[i], "stream": 0}, None, f.return_loc or f.loc))
    f.ops = ops
    return len(set(stream)), len(signalled)
