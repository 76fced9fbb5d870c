"""Ops that make values from nothing but attributes: constant, and call of another function."""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.diagnostics import Location
from compiler.interpreter import run_func
from compiler.ir import (
    Dense,
    DType,
    Func,
    Module,
    Op,
    Sym,
    SymbolRef,
    TensorType,
    Value,
    attribute,
    kernel_shape,
    operand,
)
from dialects.graph.common import along_axis, normalize_axes, size_value

if TYPE_CHECKING:
    from compiler.builder import Builder


class Constant(Op, name="graph.constant"):
    """A literal tensor:  %c = graph.constant {value = dense<1.0> : tensor<4xf32>} : tensor<4xf32>"""

    # Its own kind: fusion folds a constant into whichever kernel reads it rather than launching one.
    kind = "constant"
    value = attribute(Dense)

    def infer(self) -> TensorType:
        return self.value.type

    def reference(self) -> np.ndarray:
        return np.array(self.value.array)

    def flops(self) -> int:
        return 0

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return []  # no operands


class Call(Op, name="graph.call"):
    """Call a function of the module:  %y = graph.call(%x, %w) {callee = @layer} : tensor<64x10xf32>"""

    kind = "opaque"
    args = operand(variadic=True)
    callee = attribute(SymbolRef)

    def called(self) -> SymbolRef:
        return self.callee

    @classmethod
    def check_operand_count(cls, n: int, loc: Location | None) -> None:
        pass  # any number, zero included: a function may take no arguments

    def infer(self, args: list[TensorType]) -> tuple[TensorType, ...]:
        # The callee's signature lives in the module, which infer cannot see: the types written on the op
        # stand, and verify_symbols checks them against the callee.
        types = [r.type for r in getattr(self, "results", [None])]
        if any(t is None for t in types):
            raise self.error("cannot infer the result types of a call; write them")
        return tuple(types)

    def verify_symbols(self, module: Module) -> None:
        """Check the callee exists, takes these operand types, returns these result types, and does not recurse."""
        f = self.lookup(module)
        if any(a.type is None for a in f.args) or any(t is None for t in f.result_types):
            return  # the callee's signature is already in error; comparing with it would only repeat that
        if len(self.operands) != len(f.args):
            raise self.error(f"@{f.name} takes {len(f.args)} argument(s), got {len(self.operands)}")
        for i, (v, a) in enumerate(zip(self.operands, f.args)):
            if not a.type.fits(v.type):  # a `?` of the callee takes any size
                raise self.error(f"operand #{i} has type {v.type} but @{f.name} expects {a.type} for %{a.name}")
        if len(self.results) != len(f.result_types):
            raise self.error(f"@{f.name} returns {len(f.result_types)} value(s), got {len(self.results)} result(s)")
        for i, (r, t) in enumerate(zip(self.results, f.result_types)):
            if not t.fits(r.type):
                raise self.error(f"result #{i} has type {r.type} but @{f.name} returns {t}")
        cycle = _call_cycle(module, f, self)
        if cycle:
            path = " -> ".join("@" + g.name for g in cycle)
            raise self.error(f"recursive call: {path}; GIR has no control flow, so it would never end")
        home = next((g for g in module if any(op is self for op in g.ops)), None)
        if home is not None and not _callers(module, home):  # said once, at the top of the chain
            depth = 1 + _call_depth(module, f)
            if depth > MAX_CALL_DEPTH:
                raise self.error(f"calls nest {depth} deep from @{home.name}; gc supports at most {MAX_CALL_DEPTH} "
                                 "(inline some functions)")

    def lookup(self, module: Module) -> Func:
        name = self.callee.name
        if name not in module:
            near = difflib.get_close_matches(name, list(module.funcs), 1)
            hint = f"; did you mean @{near[0]}?" if near else ""
            raise self.error(f"unknown function @{name}{hint}")
        return module[name]

    def interpret(self, module: Module, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run the callee on the reference interpreter."""
        return run_func(module, self.lookup(module), list(arrays))

    def flops(self) -> int:
        return 0


# Calls nest at most this deep: every stage walks them recursively (the interpreter, inlining), and a
# chain of hundreds would exhaust Python's stack instead of saying so.
MAX_CALL_DEPTH = 32


def _callers(module: Module, f: Func) -> bool:
    return any(isinstance(op, Call) and op.callee.name == f.name for g in module for op in g.ops)


def _call_depth(module: Module, f: Func) -> int:
    """The longest chain of calls below `f` (0 for a function that calls none), without recursion."""
    depth: dict[str, int] = {}
    stack = [(f, False)]
    while stack:
        g, done = stack.pop()
        callees = [module[op.callee.name] for op in g.ops if isinstance(op, Call) and op.callee.name in module]
        if done:
            depth[g.name] = 1 + max((depth.get(c.name, 0) for c in callees), default=-1)
            continue
        if g.name in depth:
            continue
        depth[g.name] = 0  # a cycle (reported elsewhere) ends here
        stack.append((g, True))
        stack.extend((c, False) for c in callees if c.name not in depth)
    return depth[f.name]


def _call_cycle(module: Module, start: Func, call: Call) -> list[Func] | None:
    """The chain of functions from `start` back to the function holding `call`, if there is one."""
    home = next((g for g in module if any(op is call for op in g.ops)), None)
    if home is None:
        return None
    stack: list[tuple[Func, list[Func]]] = [(start, [home, start])]
    seen: set[str] = set()
    while stack:
        g, path = stack.pop()
        if g is home:
            return path
        if g.name in seen:
            continue
        seen.add(g.name)
        for op in g.ops:
            if isinstance(op, Call) and op.callee.name in module:
                nxt = module[op.callee.name]
                stack.append((nxt, [*path, nxt]))
    return None


# --- numel ------------------------------------------------------------------------------------------


class Numel(Op, name="graph.numel"):
    """The number of elements of x over `axes` (all of them if absent), as a scalar: what a mean divides
    by, known only at run time where a counted size is `?` (the gradient of a mean over a dynamic batch):
    %n = graph.numel(%x) {axes = [0], dtype = f32} : tensor<f32>"""
    precision = "follow"
    reads_sizes_only = True

    x = operand()
    axes = attribute("ints", None)
    dtype = attribute(DType, DType.f32)

    def counted(self, shape: tuple) -> tuple:
        axes = range(len(shape)) if self.axes is None else normalize_axes(self, self.axes, len(shape))
        return tuple(shape[a] for a in axes)

    def infer(self, x: TensorType) -> TensorType:
        if self.dtype.is_bool:
            raise self.error("dtype must be a number type, not i1")
        self.counted(x.shape)
        return TensorType((), self.dtype)

    def flops(self) -> int:
        return 0

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.array(math.prod(self.counted(x.shape)), dtype=self.dtype.np)

    def lower(self, x):
        from tvm import te, tirx

        n = math.prod(self.counted(self.operands[0].type.shape))
        return te.compute((), lambda: tirx.const(n, self.dtype.tvm), name="numel")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [None]  # a count of elements does not change with their values


class Shape(Op, name="graph.shape"):
    """The sizes of x's dimensions as a vector (ONNX Shape): with `?` sizes, known at each call, where an
    attribute taken at run time may read it (a reshape to [batch * 128, 768]); folded to a constant once
    the sizes are known:
    %s = graph.shape(%x) : tensor<3xi64>"""
    precision = "follow"
    reads_sizes_only = True

    x = operand()
    dtype = attribute(DType, DType.i64)

    def infer(self, x: TensorType) -> TensorType:
        if self.dtype not in (DType.i32, DType.i64):
            raise self.error(f"dtype must be i32 or i64, got {self.dtype}")
        return TensorType((x.rank,), self.dtype)

    def flops(self) -> int:
        return 0

    def reference(self, x: np.ndarray) -> np.ndarray:
        # Named sizes (a function compiled for every size, specialize.py) are a vector of their expressions.
        symbolic = any(isinstance(d, Sym) for d in x.shape)
        return np.array(x.shape, dtype=object if symbolic else self.dtype.np)

    def lower(self, x):
        from tvm import te, tirx

        sizes = [size_value(d, self.dtype.tvm) for d in kernel_shape(self.operands[0].type.shape)]

        def at(i):
            out = sizes[-1] if sizes else tirx.const(0, self.dtype.tvm)
            for k in range(len(sizes) - 2, -1, -1):
                out = tirx.Select(i == k, sizes[k], out)
            return out

        return te.compute((len(sizes),), at, name="shape")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [None]  # sizes do not change with the values


class Iota(Op, name="graph.iota"):
    """Each element's index along `axis` (0, 1, 2, ...), in x's shape and dtype; x's values are not read:
    the coordinates that ONNX Range, GatherElements and Trilu compute where their sizes are known only at
    run time (a running sum of ones did it in O(n^2)):
    %i = graph.iota(%x) {axis = 1} : tensor<2x3xi64>"""
    kind = "injective"  # fuses into its readers like a broadcast; each element is its own index
    reads_sizes_only = True

    x = operand()
    axis = attribute(int, 0)

    def infer(self, x: TensorType) -> TensorType:
        return along_axis(self, x)

    def flops(self) -> int:
        return 0

    def reference(self, x: np.ndarray) -> np.ndarray:
        axis = self.axis % x.ndim
        index = np.arange(x.shape[axis]).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
        return np.broadcast_to(index, x.shape).astype(x.dtype)

    def lower(self, x):
        from tvm import te

        axis, dtype = self.axis % len(x.shape), x.dtype
        return te.compute(x.shape, lambda *i: i[axis].astype(dtype), name="iota")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [None]  # indices do not change with the values


OPS = [Constant, Call, Numel, Shape, Iota]
