"""cse: ops with the same name, operands, attributes and result types compute the same values; keep one.

The survivor is the first of them; it takes the location of every op merged into it. Ops that say they
are `commutative` (add, mul, maximum, minimum, equal) match with their operands swapped. Constants with the same value merge.
graph.call merges too: graph ops are pure and a callee has no control flow, so equal calls are equal
values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from compiler.diagnostics import Location
from compiler.ir import Dense, Func, Module, Op, Value
from compiler.passes import Pass


def _exact(v: object) -> Hashable:
    """An attribute value as a key, finer than op.attr_key(): that one equates 0.0 and -0.0 (padding with -0.0
    is not padding with 0.0) and tells apart two NaNs inside a list."""
    if isinstance(v, float):
        return ("float", repr(v))
    if isinstance(v, tuple):
        return tuple(_exact(x) for x in v)
    if isinstance(v, Dense):
        # Bitwise: Dense == calls 0.0 and -0.0 equal, and NaNs with different payloads equal.
        return ("dense", v.type, v.array.tobytes())
    return v


def op_key(op: Op) -> tuple:
    """What makes two ops interchangeable: name, operands (unordered if commutative), attributes, types."""
    operands = tuple(op.operands)
    if op.commutative:
        # maximum(-0.0, 0.0) may differ from maximum(0.0, -0.0) in the sign of the zero only; IEEE leaves it open.
        operands = tuple(sorted(operands, key=id))
    attrs = tuple((k, _exact(v)) for k, v in sorted(op.attrs.items()))
    return (op.name, operands, attrs, tuple(r.type for r in op.results))


@dataclass
class CommonSubexpressionElimination(Pass):
    name = "cse"
    summary = "merge ops that compute the same values (same op, operands, attributes, types); the first stays"

    def run(self, module: Module) -> None:
        for f in module:
            self.stats["ops-merged"] += _cse(f)


def _cse(f: Func) -> int:
    """One forward sweep: an op's operands are already canonical when its key is taken."""
    seen: dict[tuple, Op] = {}
    replaced: dict[Value, Value] = {}
    keep: list[Op] = []
    for op in f.ops:
        op.operands = [replaced.get(v, v) for v in op.operands]
        key = op_key(op)
        first = seen.get(key)
        if first is None or not op.results or not op.pure:  # an op with an effect: keep each
            seen[key] = op
            keep.append(op)
            continue
        replaced.update(zip(op.results, first.results))
        first.loc = Location.merge([first.loc, op.loc])
    f.results = [replaced.get(v, v) for v in f.results]
    merged = len(f.ops) - len(keep)
    f.ops = keep
    return merged
