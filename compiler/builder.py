"""The builder passes use to make IR: `b.matmul(x, w)`, `b.transpose(dy, perm=(1, 0))`."""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.diagnostics import Location
from compiler.ir import Dense, DType, Func, Op, TensorType, Value, lookup_op


class Builder:
    """Inserts ops into `func` before position `index` (at the end if None), all with location `loc`."""

    def __init__(self, func: Func, index: int | None = None, loc: Location | None = None):
        self.func = func
        self.index = index
        self.loc = loc

    def create(self, op: type[Op] | str, operands: list[Value], attrs: dict[str, Any] | None = None,
               types: list | None = None) -> Op:
        """A new op at the insertion point; `types` its result types where not inferred (an attribute
        taken at run time)."""
        cls = lookup_op(op) if isinstance(op, str) else op
        if cls is None:
            raise KeyError(f"no op named {op}")
        new = cls(list(operands), attrs or {}, types, self.loc)
        if self.index is None:
            self.func.ops.append(new)
        else:
            self.func.ops.insert(self.index, new)
            self.index += 1
        return new

    def constant(self, value, dtype: DType | None = None) -> Value:
        from dialects.graph.creation import Constant

        return self.create(Constant.name, [], {"value": Dense.of(np.asarray(value), dtype)}).result

    def __getattr__(self, short: str):
        cls = lookup_op(f"graph.{short}")
        if cls is None:
            raise AttributeError(f"no op graph.{short}")

        def make(*operands: Value, result_types: list | None = None, **attrs: Any) -> Value | tuple[Value, ...]:
            op = self.create(cls, list(operands), attrs, result_types)
            return op.results[0] if len(op.results) == 1 else tuple(op.results)

        return make


def new_func(name: str, args: dict[str, TensorType]) -> tuple[Func, Builder, list[Value]]:
    """A fresh function with the given arguments, and a builder appending to it."""
    values = [Value(t, n) for n, t in args.items()]
    f = Func(name, values, [])
    return f, Builder(f), values


def finish(f: Func, *results: Value) -> Func:
    f.results = list(results)
    f.result_types = [v.type for v in results]
    return f


def bind_arguments(f: Func, values: dict[str, np.ndarray]) -> None:
    """Turn the arguments of `f` named in `values` into graph.constant ops holding those values (same
    name, same location), so that passes can fold them: weights fixed at compile time."""
    b = Builder(f, 0)
    for a in list(f.args):
        if a.name not in values:
            continue
        b.loc = a.loc
        c = b.constant(np.asarray(values[a.name]).reshape(a.type.shape), a.type.dtype)
        c.name = a.name
        f.replace_all_uses(a, c)
    f.args = [a for a in f.args if a.name not in values]
