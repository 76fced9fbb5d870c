"""The plan checker: a planned function (mem/exec dialects) never reads bytes that something else has
written since the value was written, keeps views aligned and inside their arena, and orders
conflicting accesses on different streams with events."""

from __future__ import annotations

from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, Value
from compiler.memory.rules import launched_op, writes_in_place_over


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
            # A concat whose operands all lie in its bytes writes what they hold already: it changes no byte.
            unchanged = bool(ins) and all(v in where and _at_its_place(module, op, k, where[v][0] - lo,
                                                                       where[v][1] - where[v][0])
                                          for k, v in enumerate(ins))
            for v, (a, b) in list(where.items()):
                if unchanged or v is d or v is r or not (a < hi and lo < b) or v not in written:
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


def _in_place_ok(module: Module, op: Op, index: int) -> bool:
    if op.name != "exec.launch" or op.kernel.name not in module:
        return False
    return writes_in_place_over(module[op.kernel.name], index)


def _at_its_place(module: Module, op: Op, index: int, offset: int, size: int) -> bool:
    """The launch's input `index` already lies where its kernel puts it in the result (a concat's
    operand its producer wrote into the concat's bytes): the kernel copies it onto itself."""
    kernel = launched_op(module, op)
    offsets = kernel.operand_offsets() if kernel is not None else None
    if offsets is None or index >= len(offsets) or offsets[index] != offset:
        return False
    return size == op.operands[index].type.nbytes


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
