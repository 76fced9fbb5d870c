"""Liveness, static memory planning and the plan checker.

Time is counted in steps: the kernels of a function in execution order (constants are not steps).
A tensor is alive from the step that writes it to the last step that reads it, both included, so a
kernel's inputs and outputs are alive together. Arguments, constants and function results are not
intermediates: they live outside the arena.

- `lifetimes` / `lower_bound`: what is alive when; the largest total alive at one step is a bound no
  placement can beat (except by writing an output over an input that dies at that step).
- `place`: offsets in one arena for blocks with lifetimes, best-fit over several orders (TFLite's
  "greedy by size" and relatives), keeping the smallest arena.
- `check_plan`: a planned function (mem/exec dialects) never reads bytes that something else has
  written since the value was written, keeps views aligned, and orders conflicting accesses on
  different streams with events.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, Value


def is_planned(f: Func) -> bool:
    """`f` is in the planned form (mem/exec ops): past scheduling, memory planning and graph rewrites."""
    return any(op.name.startswith(("mem.", "exec.")) for op in f.ops)


def view_spans(f: Func) -> dict[Value, tuple[int, int]]:
    """The bytes [lo, hi) of the arena each `mem.view` of a planned function covers."""
    return {op.result: (op.offset, op.offset + op.padded_bytes) for op in f.ops if op.name == "mem.view"}


def steps_of(f: Func) -> list[Op]:
    """The ops of `f` that run as kernels (everything but constants and memory declarations)."""
    return [op for op in f.ops if op.kind != "constant" and not op.name.startswith("mem.")
            and op.name not in ("exec.signal", "exec.wait")]


@dataclass
class Lifetime:
    value: Value
    size: int  # bytes
    start: int  # the step that writes it
    end: int  # the last step that reads it (start if none does)


def lifetimes(f: Func, order: list[Op] | None = None, align: int = 1) -> list[Lifetime]:
    """Lifetimes of the intermediates of graph-level `f` (results of steps that `f` does not return), each
    `size` rounded up to `align`: what a buffer of its own would take."""
    order = steps_of(f) if order is None else order
    returned = set(f.results)
    last: dict[Value, int] = {}
    for i, op in enumerate(order):
        for v in op.operands:
            last[v] = i
    out = []
    for i, op in enumerate(order):
        for r in op.results:
            if r not in returned and r.type.nbytes > 0:
                out.append(Lifetime(r, round_up(r.type.nbytes, align), i, max(i, last.get(r, i))))
    return out


def lower_bound(lts: list[Lifetime] | list[Block]) -> int:
    """The largest total size alive at one step."""
    events: dict[int, int] = {}
    for lt in lts:
        events[lt.start] = events.get(lt.start, 0) + lt.size
        events[lt.end + 1] = events.get(lt.end + 1, 0) - lt.size
    peak = alive = 0
    for t in sorted(events):
        alive += events[t]
        peak = max(peak, alive)
    return peak


def peak_bytes(f: Func, order: list[Op] | None = None, align: int = 1) -> int:
    """The liveness peak of graph-level `f` run in `order` (file order by default)."""
    return lower_bound(lifetimes(f, order, align))


# --- placement ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Block:
    """Bytes to place: one tensor, or several that share storage (an output written over its input)."""

    size: int
    start: int
    end: int
    offset: int = 0
    members: list = field(default_factory=list)  # the values stored here


def round_up(n: int, align: int) -> int:
    return -(-n // align) * align


# 4K aliasing: a load whose address equals an in-flight store's in the low 12 bits waits for that store
# (x86 compares only those bits first). A kernel that reads one arena tensor while writing another at the
# same offset modulo 4 KiB hits it on every element: a conv with a residual input runs 13% slower
# (32x32x32 maps: 156 -> 137 us). Tensors one kernel reads and writes are kept this far apart modulo a page.
PAGE = 4096
SKEW = 256


def place(blocks: list[Block], align: int, *, tries: int = 32, seed: int = 0,
          conflict: Callable[[Block, Block], bool] | None = None,
          apart: dict[Block, set[Block]] | None = None) -> int:
    """Give every block an offset (a multiple of `align`) so that blocks alive at the same step do not
    overlap; returns the arena size. Best fit over several orders: by size (TFLite's greedy by size),
    by start, by duration, by size x duration, then seeded shuffles of the size order while the result is
    above the lower bound. `conflict` replaces "alive at the same step" when steps may run concurrently.
    `apart` pairs blocks that one kernel accesses together: of two such blocks of a page or more, the
    later placed moves up (by `align` steps, in its gap if it still fits) until their offsets differ by
    at least SKEW bytes modulo PAGE. That costs a few hundred bytes of arena at most, and is given up
    where it would make the arena larger than a buffer per block (the plan never costs more memory
    than no plan)."""
    live = [b for b in blocks if b.size > 0]
    if not live:
        return 0
    best = _search(live, align, tries, seed, conflict or _overlap, apart or {})
    if apart and best[0] > sum(round_up(b.size, align) for b in live):
        plain = _search(live, align, tries, seed, conflict or _overlap, {})
        best = min(best, plain, key=lambda r: r[0])
    for b, off in zip(live, best[1]):
        b.offset = off
    for b in blocks:
        if b.size == 0:
            b.offset = 0
    return best[0]


def _search(live: list[Block], align: int, tries: int, seed: int, conflict: Callable[[Block, Block], bool],
            apart: dict[Block, set[Block]]) -> tuple[int, list[int]]:
    """The smallest arena best fit finds over the orders `place` describes, and the offsets of `live`."""
    bound = _round_up_bound(live, align)
    orders = [
        sorted(live, key=lambda b: (-b.size, b.start)),
        sorted(live, key=lambda b: (b.start, -b.size)),
        sorted(live, key=lambda b: (-(b.end - b.start), -b.size)),
        sorted(live, key=lambda b: (-b.size * (b.end - b.start + 1), b.start)),
    ]
    rng = random.Random(seed)
    best: tuple[int, list[int]] | None = None
    for i in range(len(orders) + tries):
        if i < len(orders):
            order = orders[i]
        else:
            if best is not None and best[0] <= bound:
                break
            order = sorted(live, key=lambda b: (-b.size * rng.uniform(0.5, 1.5), b.start))
        size, offsets = _best_fit(order, align, conflict, apart)
        if best is None or size < best[0]:
            best = (size, [offsets[b] for b in live])
    assert best is not None
    return best


def _round_up_bound(blocks: list[Block], align: int) -> int:
    return lower_bound([Block(round_up(b.size, align), b.start, b.end) for b in blocks])


def _overlap(a: Block, b: Block) -> bool:
    return a.start <= b.end and b.start <= a.end


def _best_fit(order: list[Block], align: int, conflict: Callable[[Block, Block], bool],
              apart: dict[Block, set[Block]]) -> tuple[int, dict[Block, int]]:
    """Place blocks in `order`, each in the smallest gap between blocks alive with it that fits."""
    placed: list[tuple[int, int, Block]] = []
    offsets: dict[Block, int] = {}
    top = 0
    for b in order:
        need = round_up(b.size, align)
        busy = sorted((o, o + s) for o, s, p in placed if conflict(p, b))
        partners = [offsets[p] for p in apart.get(b, ()) if p in offsets and p.size >= PAGE] if b.size >= PAGE else []
        best_off, best_gap, prev = None, None, 0
        for lo, hi in busy:
            gap = lo - prev
            off = _skewed(prev, partners, align)
            if off + need <= lo and (best_gap is None or gap < best_gap):
                best_off, best_gap = off, gap
            prev = max(prev, hi)
        off = _skewed(prev, partners, align) if best_off is None else best_off
        placed.append((off, need, b))
        offsets[b] = off
        top = max(top, off + need)
    return top, offsets


def _skewed(off: int, partners: list[int], align: int) -> int:
    """The first offset from `off` on, in `align` steps, at least SKEW bytes from every partner modulo PAGE."""
    for step in range(0, PAGE, align):
        if all(SKEW <= (off + step - q) % PAGE <= PAGE - SKEW for q in partners):
            return off + step
    return off  # more partners than a page has room to keep apart: the first offset will do


# --- the plan checker -----------------------------------------------------------------------------


def check_plan(module: Module, f: Func) -> None:
    """Raise GCError (an internal error of the planner) unless the planned `f` is sound: every view lies in
    its arena at an aligned offset; every value a step reads still holds what was written there (no
    other tensor was written over any of its bytes since); no step reads a view nobody wrote; and two
    steps on different streams that touch the same bytes (one writing) are ordered by events."""
    problems = _check(module, f)
    if problems:
        raise GCError(f"plan-memory produced an unsound plan for @{f.name} (a bug in gc):\n  " + "\n  ".join(problems))


def _check(module: Module, f: Func) -> list[str]:
    problems: list[str] = []
    where: dict[Value, tuple[int, int]] = {}  # value -> its bytes in the arena [lo, hi)
    written: set[Value] = set()
    clobbered: dict[Value, Op] = {}
    writer: dict[Value, Op] = {}
    readers: dict[Value, list[Op]] = {}
    clocks = _Clocks()
    beyond = 1 << 60
    for op in f.ops:
        if op.name == "mem.view":
            arena = op.operands[0].owner
            lo = op.offset
            hi = lo + op.padded_bytes  # a bordered tensor's border too: its writer writes it
            align = getattr(arena, "align", 1)
            if lo % align:
                problems.append(f"{_at(op)}: offset {lo} is not a multiple of {align}")
            if hi > arena.size:
                problems.append(f"{_at(op)}: bytes [{lo}, {hi}) outside the {arena.size}-byte arena")
            where[op.result] = (lo, hi)
            continue
        if op.name == "mem.alloc" and op.pads:  # shared by bordered tensors: bytes of their own, past the arena
            size = op.padded_bytes
            where[op.result] = (beyond, beyond + size)
            beyond += size
            continue
        if op.name in ("exec.signal", "exec.wait"):
            clocks.event(op)
            continue
        if op.name not in ("exec.launch", "exec.copy"):
            continue
        clocks.step(op)
        n = len(op.results)
        ins, dests = op.operands[: len(op.operands) - n], op.operands[len(op.operands) - n :]
        for v in ins:
            if v in where and v not in written:
                problems.append(f"{_at(op)}: reads %{v.name or '?'} before anything wrote it")
            elif v in clobbered:
                problems.append(f"{_at(op)}: reads %{v.name or '?'}, but {_at(clobbered[v])} wrote over its bytes")
            elif v in writer and not clocks.before(writer[v], op):
                problems.append(f"{_at(op)}: reads %{v.name or '?'} on stream {op.stream} with no event after "
                                f"{_at(writer[v])} wrote it on stream {writer[v].stream}")
            readers.setdefault(v, []).append(op)
        for d, r in zip(dests, op.results):
            if d not in where:
                writer[r] = op
                continue
            lo, hi = where[d]
            for k, v in enumerate(ins):
                a, b = where.get(v, (0, 0))
                if (a < hi and lo < b and not ((a, b) == (lo, hi) and _in_place_ok(module, op, k))
                        and not _at_its_place(module, op, k, a - lo, b - a)):
                    problems.append(f"{_at(op)}: writes bytes [{lo}, {hi}) over its own input %{v.name or '?'} "
                                    f"[{a}, {b}), which a kernel may do only where it reads that input element "
                                    "for element")
            for v, (a, b) in list(where.items()):
                if v is d or v is r or not (a < hi and lo < b) or v not in written:
                    continue
                if v not in clobbered:
                    clobbered[v] = op
                for prior in [writer.get(v), *readers.get(v, [])]:
                    if prior is not None and prior is not op and not clocks.before(prior, op):
                        problems.append(f"{_at(op)} on stream {op.stream} writes bytes [{lo}, {hi}) that "
                                        f"{_at(prior)} on stream {prior.stream} uses, with no event between")
            where[r] = (lo, hi)
            written.add(r)
            writer[r] = op
    return problems


IN_PLACE_KINDS = frozenset({"elementwise", "broadcast", "constant"})


def writes_in_place_over(kernel: Func, index: int, epilogues: bool = True) -> bool:
    """Whether `kernel` may write its one result over its argument `index`, of the result's shape: every
    element of the result reads that argument at its own index only, before it is written. So in a kernel
    made only of elementwise ops; and (`epilogues`) in one whose other ops (a conv, a matmul) never read
    the argument, which flows only through elementwise ops of the result's shape into the result: the
    residual `add` in a conv's epilogue reads x[i] as it writes y[i]."""
    if len(kernel.results) != 1 or kernel.args[index].type.shape != kernel.results[0].type.shape:
        return False
    if all(op.kind in IN_PLACE_KINDS for op in kernel.ops):
        return True
    if not epilogues:
        return False
    shape, uses = kernel.results[0].type.shape, kernel.users()
    todo, seen = [kernel.args[index]], set()
    while todo:
        v = todo.pop()
        for op, _ in uses.get(v, []):
            if op is None or op in seen:  # the result itself, or an op checked already
                continue
            if op.kind not in ("elementwise", "broadcast") or any(r.type.shape != shape for r in op.results):
                return False
            seen.add(op)
            todo += op.results
    return True


def _in_place_ok(module: Module, op: Op, index: int) -> bool:
    if op.name != "exec.launch" or op.kernel.name not in module:
        return False
    return writes_in_place_over(module[op.kernel.name], index)


def _tiled(ins: list[Value], where: dict, span, blocks: dict, last: dict, step: int) -> bool:
    """The inputs lie end to end exactly over `span` and die at `step`: one buffer with the output."""
    spans = [where.get(v) for v in ins]
    if not ins or not isinstance(span, tuple) or not all(isinstance(s, tuple) for s in spans):
        return False
    ends = [span[0]] + [s[1] for s in spans]
    return (all(s[0] == e for s, e in zip(spans, ends)) and ends[-1] == span[1]
            and all(v in blocks and last.get(v) == step for v in ins))


def _at_its_place(module: Module, op: Op, index: int, offset: int, size: int) -> bool:
    """The launch's input `index` already lies where its kernel puts it in the result (a concat's
    operand its producer wrote into the concat's bytes): the kernel copies it onto itself."""
    kernel = _launched_op(module, op)
    offsets = kernel.operand_offsets() if kernel is not None else None
    if offsets is None or index >= len(offsets) or offsets[index] != offset:
        return False
    return size == op.operands[index].type.nbytes


def lone_op(kernel: Func) -> Op | None:
    """The one op of a kernel function, its operands the kernel's arguments in order and its results the
    kernel's, else None (an operand read twice is one argument: not in order, so None)."""
    ops = [o for o in kernel.ops if o.kind != "constant"]
    if len(ops) != 1 or ops[0].operands != kernel.args or kernel.results != ops[0].results:
        return None
    return ops[0]


def _launched_op(module: Module, op: Op) -> Op | None:
    if op.name != "exec.launch" or op.kernel.name not in module:
        return None
    return lone_op(module[op.kernel.name])


def copies_nothing(module: Module, f: Func) -> set[Op]:
    """The launches of planned `f` whose every input already lies where the kernel puts it in its one
    result, in the same arena (a concat whose operands' producers wrote into its bytes): nothing to run."""
    where: dict[Value, tuple[Value, int]] = {}  # value -> (arena, offset)
    out = set()
    for op in f.ops:
        if op.name == "mem.view":
            where[op.result] = (op.operands[0], op.offset)
        elif op.name == "exec.launch":
            n = len(op.results)
            ins, dests = op.operands[: len(op.operands) - n], op.operands[len(op.operands) - n :]
            for d, r in zip(dests, op.results):
                if d in where:
                    where[r] = where[d]
            lone = _launched_op(module, op)
            offsets = lone.operand_offsets() if lone is not None and n == 1 else None
            if offsets is None or dests[0] not in where or not ins:
                continue
            arena, base = where[dests[0]]
            if all(v in where and where[v] == (arena, base + o) for v, o in zip(ins, offsets)):
                out.add(op)
    return out


def _at(op: Op) -> str:
    name = op.kernel.name if op.name == "exec.launch" else op.name
    line = f" (line {op.loc.line})" if op.loc is not None and getattr(op.loc, "line", None) else ""
    return f"launch of @{name}{line}" if op.name == "exec.launch" else f"{name}{line}"


class _Clocks:
    """Vector clocks over streams: `before(a, b)` holds when a is ordered before b (same stream, or an
    event chain from a's stream to b's)."""

    def __init__(self) -> None:
        self.stream: dict[int, dict[int, int]] = {}
        self.events: dict[int, dict[int, int]] = {}
        self.at: dict[Op, tuple[int, int, dict[int, int]]] = {}

    def step(self, op: Op) -> None:
        s = op.stream
        clock = self.stream.setdefault(s, {})
        clock[s] = clock.get(s, 0) + 1
        self.at[op] = (s, clock[s], dict(clock))

    def event(self, op: Op) -> None:
        clock = self.stream.setdefault(op.stream, {})
        if op.name == "exec.signal":
            self.events[op.event] = dict(clock)
        else:
            for s, t in self.events.get(op.event, {}).items():
                clock[s] = max(clock.get(s, 0), t)

    def before(self, a: Op, b: Op) -> bool:
        sa, ta, _ = self.at[a]
        _, _, cb = self.at[b]
        return cb.get(sa, 0) >= ta


def plan_stats(f: Func, unit: int = 1) -> dict[str, int]:
    """The memory figures of a planned function: the planned bytes for intermediates (the arena, plus the
    zero-bordered buffers of conv-borders outside it, borders included); the bytes of its intermediates,
    each in a buffer of its own (naive); and the lower bound: the largest total of intermediates alive at
    one step of its order, where an output written in place over an input that dies at that step counts
    once with it (they are one buffer), so that no plan can be smaller. `lower_bound_bytes` counts a
    bordered tensor with its border (the buffer its schedule needs), `tensor_bound_bytes` at its own size
    (the difference is what borders cost). Sizes are in bytes, or rounded up to `unit` (the alignment
    every buffer needs). `bordered_bytes` is the part of `arena_bytes` in buffers outside the arena."""
    steps = [op for op in f.ops if op.name in ("exec.launch", "exec.copy")]
    arena = next((op.size for op in f.ops if op.name == "mem.arena"), 0)
    where: dict[Value, object] = dict(view_spans(f))
    padded: dict[Value, int] = {op.result: op.padded_bytes for op in f.ops if op.name == "mem.view" and op.pads}
    bordered = 0
    for op in f.ops:
        if op.name == "mem.alloc" and op.pads:
            where[op.result] = op  # a buffer of its own: nothing else shares it
            padded[op.result] = op.padded_bytes
            bordered += op.padded_bytes
    last: dict[Value, int] = {}
    for i, op in enumerate(steps):
        for v in op.operands[: len(op.operands) - len(op.results)]:
            last[v] = i
    blocks: dict[Value, Block] = {}  # value -> the buffer it shares (in place) or owns
    own: dict[Value, Block] = {}  # the same at the tensors' own sizes
    naive = 0
    for i, op in enumerate(steps):
        n = len(op.results)
        ins, dests = op.operands[: len(op.operands) - n], op.operands[len(op.operands) - n :]
        for d, r in zip(dests, op.results):
            if d not in where or not r.type.nbytes:
                continue
            naive += round_up(r.type.nbytes, unit)
            _join(blocks, r, d, ins, where, last, i, round_up(padded.get(d, r.type.nbytes), unit))
            _join(own, r, d, ins, where, last, i, round_up(r.type.nbytes, unit))
    return {"arena_bytes": arena + bordered, "naive_bytes": naive,
            "lower_bound_bytes": lower_bound(list(dict.fromkeys(blocks.values()))),
            "tensor_bound_bytes": lower_bound(list(dict.fromkeys(own.values()))), "bordered_bytes": bordered}


def _join(blocks: dict[Value, Block], r: Value, d: Value, ins: list[Value], where: dict, last: dict, i: int,
          size: int) -> None:
    """Result `r`, written into destination `d` at step `i`, joins the buffer it shares (written in place over
    a dying input, or a concat's operands lying in its bytes) or gets one of its own."""
    where[r] = where[d]
    end = max(i, last.get(r, i))
    donor = next((v for v in ins if v in blocks and where.get(v) == where[d] and last.get(v) == i), None)
    if len(ins) > 1 and _tiled(ins, where, where[d], blocks, last, i):  # a concat's operands in its bytes
        b = blocks[ins[0]]
        others = {id(blocks[v]) for v in ins[1:]} - {id(b)}
        b.size, b.start, b.end = max(b.size, size), min(blocks[v].start for v in ins), max(b.end, end)
        for w, wb in blocks.items():
            if id(wb) in others:
                blocks[w] = b
    elif donor is not None:
        b = blocks[donor]
        b.size, b.end = max(b.size, size), max(b.end, end)
    else:
        b = Block(size, i, end)
    blocks[r] = b
