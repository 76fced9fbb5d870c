"""Lifetimes: what is alive at each step of a function's order, and the bound that gives.

Time is counted in steps: the kernels of a function in execution order (constants are not steps).
A tensor is alive from the step that writes it to the last step that reads it, both included, so a
kernel's inputs and outputs are alive together. Arguments, constants and function results are not
intermediates: they live outside the arena. The largest total alive at one step is a bound no
placement can beat (except by writing an output over an input that dies at that step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler.ir import Func, Op, Value

if TYPE_CHECKING:
    from compiler.memory.placement import Block


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


def round_up(n: int, align: int) -> int:
    return -(-n // align) * align
