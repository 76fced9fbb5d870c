"""Reductions: reduce_sum, reduce_mean, reduce_prod, reduce_max, reduce_min over a set of axes, argmax, and
cumsum and cumprod (the running sum and product along one axis).

`axes` absent or `[]` reduces every axis (ONNX's `noop_with_empty_axes = 0`); negative axes count
from the end. Reducing an empty set gives ONNX's identities: 0 for sum, 1 for prod, -inf (or the dtype's least
value) for max, +inf (or its greatest) for min, NaN for a float mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import DType, Op, TensorType, Value, attribute, kernel_shape, operand
from dialects.graph.common import (
    along_axis,
    broadcast_like,
    extreme_reducer,
    normalize_axes,
    normalize_axis,
    numel,
    require_numeric,
    reshaped,
    scalar,
)

if TYPE_CHECKING:
    from compiler.builder import Builder


class Reduce(Op):
    """Base of reduce_*: the shape rule and axis checks; subclasses give `fn(x, axes, keepdims)`."""

    kind = "reduction"
    x = operand()
    axes = attribute("ints", None, doc="axes to reduce; absent or [] means all")
    keepdims = attribute(bool, False)

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        if not self.axes:
            return tuple(range(rank))
        for a in self.axes:
            # normalize_axis lets axis 0 through for rank 0 (for unsqueeze); a scalar has no axis to reduce.
            if not -rank <= a < rank:
                raise self.error(f"axis {a} is out of range for rank {rank}")
        return normalize_axes(self, self.axes, rank)

    def infer(self, x: TensorType) -> TensorType:
        require_numeric(self, x)
        axes = self.reduced_axes(x.rank)
        if self.keepdims:
            return x.with_shape(1 if i in axes else d for i, d in enumerate(x.shape))
        return x.with_shape(d for i, d in enumerate(x.shape) if i not in axes)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return self.fn(x, self.reduced_axes(x.ndim), self.keepdims)

    def flops(self) -> int:
        return self.operands[0].type.size

    def kept(self, b: Builder, y: Value) -> Value:
        """A value of the result's shape (y or its gradient) with the reduced axes back as size 1 (keepdims),
        so that it broadcasts against x."""
        x = self.x.type
        axes = self.reduced_axes(x.rank)
        if axes == tuple(range(len(axes))):  # leading axes: broadcasting puts them back by itself
            return y
        return reshaped(b, y, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """Sum and mean spread dy evenly; prod gives each element dy times the product of the others; max and
        min give it to the extremes, split evenly among ties (as PyTorch's amax/amin)."""
        x, dy = self.x, self.kept(b, dys[0])
        if isinstance(self, ReduceProd):
            return [b.mul(dy, _product_of_the_others(b, x, self.reduced_axes(x.type.rank)))]
        if isinstance(self, (ReduceSum, ReduceMean)):
            if isinstance(self, ReduceMean):
                dy = b.div(dy, numel(b, x, self.reduced_axes(x.type.rank), dy.type.dtype))
            return [broadcast_like(b, dy, x)]
        hit = b.cast(b.equal(x, self.kept(b, self.result)), dtype=x.type.dtype)
        count = b.reduce_sum(hit, axes=self.reduced_axes(x.type.rank), keepdims=True)
        return [b.mul(b.div(dy, count), hit)]

    def lower(self, x):
        from tvm import te, tirx

        t, out = self.operands[0].type, self.results[0].type
        axes = self.reduced_axes(t.rank)
        acc = _accumulator(self.name, t.dtype)
        n = int(np.prod([t.shape[a] for a in axes], dtype=np.int64))
        if n == 0:
            # TVM skips a reduction's init when its loop is empty, so the identity is written out instead.
            ident = self.fn(np.zeros([0], t.dtype.np), (0,), False).astype(out.dtype.np)[()]
            return te.compute(out.shape, lambda *i: tirx.const(ident.item(), out.dtype.tvm), name=_short(self))
        # (sizes as the kernel takes them: size variables in a kernel for every size, codegen/symbolic.py)
        shape, out_shape = kernel_shape(t.shape), kernel_shape(out.shape)
        raxes = {a: te.reduce_axis((0, shape[a]), name=f"k{a}") for a in sorted(axes)}  # memory order, whatever order `axes` names them in

        def source(idx: tuple):
            kept = iter(i for a, i in enumerate(idx) if not (self.keepdims and a in raxes))
            elem = x(*[raxes[a] if a in raxes else next(kept) for a in range(t.rank)])
            return elem.astype(acc) if acc != t.dtype.tvm else elem

        mean = self.name == "graph.reduce_mean"
        final = acc == out.dtype.tvm and not mean
        total = te.compute(
            out_shape,
            lambda *idx: _combine(self.name, source(idx), list(raxes.values())),
            name=_short(self) if final else _short(self) + "_acc",
        )
        if final:
            return total

        def finish(*i):
            y = total(*i)
            if mean:  # an integer mean truncates toward zero, as the reference's
                y = tirx.truncdiv(y, tirx.const(n, acc)) if "int" in acc else y / tirx.const(n, acc)
            return y.astype(out.dtype.tvm)

        return te.compute(out_shape, finish, name=_short(self))


def _short(op: Op) -> str:
    return op.name.split(".")[-1]


def _accumulator(name: str, dtype: DType) -> str:
    """16-bit floats accumulate in f32 (as the reference, which rounds once); an integer mean in i64 (u64 for
    unsigned: an i64 total would wrap negative and truncate the wrong way)."""
    if dtype in (DType.f16, DType.bf16):
        return "float32"
    if name == "graph.reduce_mean" and dtype.is_int:
        return "uint64" if dtype.is_unsigned else "int64"
    return dtype.tvm


def _combine(name: str, value, axes: list):
    """The TE reduction of `value` over `axes`: a sum, or a max/min through which a NaN wins."""
    from tvm import te

    if not axes:  # a scalar reduces to itself
        return value
    if name in ("graph.reduce_sum", "graph.reduce_mean"):
        return te.sum(value, axis=axes)
    if name == "graph.reduce_prod":
        return _product(value, axis=axes)
    return extreme_reducer(str(value.ty), name == "graph.reduce_max")(value, axis=axes)


def _product(value, axis: list):
    from tvm import te, tirx

    return te.comm_reducer(lambda a, v: a * v, lambda t: tirx.const(1, t), name="prod")(value, axis=axis)


def _product_of_the_others(b: Builder, x: Value, axes: tuple[int, ...]) -> Value:
    """For each element of x, the product of the other elements of its row (the reduced axes), without
    dividing by a zero: with no zero in the row it is the product over x; with one, it is the product of
    the nonzero ones at the zero and 0 elsewhere; with two or more, 0 everywhere."""
    zero, one = scalar(b, 0, x), scalar(b, 1, x)
    is_zero = b.equal(x, zero)
    zeros = b.reduce_sum(b.cast(is_zero, dtype=x.type.dtype), axes=axes, keepdims=True)
    nonzero = b.where(is_zero, one, x)
    p = b.reduce_prod(nonzero, axes=axes, keepdims=True)
    no_zero = b.where(b.equal(zeros, zero), b.div(p, nonzero), zero)
    at_the_only_zero = b.where(b.equal(zeros, one), p, zero)
    return b.where(is_zero, at_the_only_zero, no_zero)


def _sum(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    # Accumulate in 64 bits; the result is rounded (or wrapped) once to the declared dtype.
    acc = np.float64 if np.issubdtype(x.dtype, np.floating) else np.uint64 if x.dtype.kind == "u" else np.int64
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=acc)


def _prod(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    # As _sum: 64 bits, rounded (or wrapped: a product modulo 2^64 is one modulo 2^n too) once.
    acc = np.float64 if np.issubdtype(x.dtype, np.floating) else np.uint64 if x.dtype.kind == "u" else np.int64
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=acc)


def _mean(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    total = _sum(x, axes, keepdims)
    if np.issubdtype(x.dtype, np.floating):
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / n
    # Integer mean truncates toward zero, as C division (and ONNX's reference cast) does.
    q = np.abs(total) // max(n, 1)
    return np.where(total < 0, -q, q)


def _lowest(dt: np.dtype):
    return -np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).min


def _highest(dt: np.dtype):
    return np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).max


def _max(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=keepdims, initial=_lowest(x.dtype))


def _min(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.min(x, axis=axes, keepdims=keepdims, initial=_highest(x.dtype))


class ReduceSum(Reduce, name="graph.reduce_sum"):
    """Sum over axes:  %y = graph.reduce_sum(%x) {axes = [1], keepdims = true} : tensor<4x1xf32>"""
    precision = "f32"

    fn = staticmethod(_sum)


class ReduceMean(Reduce, name="graph.reduce_mean"):
    """Mean over axes (integers truncate toward zero):  %y = graph.reduce_mean(%x) {axes = [-1]} : tensor<4xf32>"""
    precision = "f32"

    fn = staticmethod(_mean)


class ReduceProd(Reduce, name="graph.reduce_prod"):
    """Product over axes:  %y = graph.reduce_prod(%x) {axes = [1]} : tensor<4xf32>"""
    precision = "f32"

    fn = staticmethod(_prod)


class ReduceMax(Reduce, name="graph.reduce_max"):
    """Maximum over axes (NaN wins):  %y = graph.reduce_max(%x) {axes = [0]} : tensor<3xf32>"""
    precision = "follow"

    fn = staticmethod(_max)


class ReduceMin(Reduce, name="graph.reduce_min"):
    """Minimum over axes (NaN wins):  %y = graph.reduce_min(%x) : tensor<f32>"""
    precision = "follow"

    fn = staticmethod(_min)


class Argmax(Op, name="graph.argmax"):
    """Index of the first maximum along axis:  %i = graph.argmax(%x) {axis = 1} : tensor<4xi64>"""
    precision = "follow"

    kind = "reduction"
    x = operand()
    axis = attribute(int, 0)
    keepdims = attribute(bool, False)

    def infer(self, x: TensorType) -> TensorType:
        require_numeric(self, x)
        if x.rank == 0:
            raise self.error(f"operand must have rank >= 1, got {x}")
        axis = normalize_axis(self, self.axis, x.rank)
        if x.shape[axis] == 0:
            raise self.error(f"axis {self.axis} of {x} is empty: there is no maximum")
        shape = list(x.shape)
        if self.keepdims:
            shape[axis] = 1
        else:
            del shape[axis]
        return TensorType(tuple(shape), DType.i64)

    def reference(self, x: np.ndarray) -> np.ndarray:
        # np.argmax takes the first of equal maxima, and a NaN as the maximum, as PyTorch does.
        return np.argmax(x, axis=self.axis % x.ndim, keepdims=self.keepdims)

    def lower(self, x):
        from tvm import te, tirx

        t, out = self.operands[0].type, self.results[0].type
        axis = self.axis % t.rank
        k = te.reduce_axis((0, t.shape[axis]), name="k")
        # 16-bit floats compare in f32 (exactly the same order; TIR has no isnan for bf16).
        dtype = _accumulator(self.name, t.dtype)
        is_float = t.dtype.is_float

        def combine(lhs, rhs):
            # (index, value) pairs: the larger value wins, a NaN beats any number, and ties go to the first index.
            (i1, v1), (i2, v2) = lhs, rhs
            first = i1 < i2
            if is_float:
                n1, n2 = tirx.isnan(v1), tirx.isnan(v2)
                keep = (n1 & (tirx.Not(n2) | first)) | (tirx.Not(n2) & ((v1 > v2) | ((v1 == v2) & first)))
            else:
                keep = (v1 > v2) | ((v1 == v2) & first)
            return tirx.Select(keep, i1, i2), tirx.Select(keep, v1, v2)

        def identity(t_index, t_value):
            low = tirx.const(-np.inf, t_value) if is_float else te.min_value(t_value)
            return tirx.const(np.iinfo(np.int64).max, t_index), low

        argmax = te.comm_reducer(combine, identity, name="argmax")

        def body(*idx):
            outer = list(idx)
            if self.keepdims:
                del outer[axis]
            elem = x(*outer[:axis], k, *outer[axis:])
            if t.dtype is DType.bf16:
                # The bits themselves: TVM's bf16 storage legalization leaves a bf16 -> f32 cast inside a
                # two-value reduction as an integer conversion of the raw bits.
                bits = tirx.reinterpret("uint16", elem).astype("uint32") << tirx.const(16, "uint32")
                elem = tirx.reinterpret("float32", bits)
            elif dtype != t.dtype.tvm:
                elem = elem.astype(dtype)
            return argmax((k.var.astype("int64"), elem), axis=k)

        index, _ = te.compute(out.shape, body, name="argmax")
        return index

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [None]  # an integer index: piecewise constant in x

    def flops(self) -> int:
        return self.operands[0].type.size


class Cumsum(Op, name="graph.cumsum"):
    """Running sum along axis (ONNX CumSum):  %y = graph.cumsum(%x) {axis = 1, exclusive = true} : tensor<4x5xf32>

    `exclusive` leaves the element itself out of its sum (the first is 0); `reverse` sums from the end."""

    identity = 0  # the running value before the first element (what an exclusive scan starts from)
    scan = staticmethod(np.cumsum)
    kind = "reduction"
    precision = "f32"
    x = operand()
    axis = attribute(int, 0)
    exclusive = attribute(bool, False, doc="each sum leaves its own element out")
    reverse = attribute(bool, False, doc="sum from the end of the axis")

    def infer(self, x: TensorType) -> TensorType:
        return along_axis(self, x)

    def reference(self, x: np.ndarray) -> np.ndarray:
        axis = self.axis % x.ndim
        acc = np.float64 if np.issubdtype(x.dtype, np.floating) else np.uint64 if x.dtype.kind == "u" else np.int64
        v = np.flip(x, axis) if self.reverse else x
        y = self.scan(v, axis=axis, dtype=acc)
        if self.exclusive:  # shift by one along the axis: each sum without its own element
            y = np.concatenate([np.full_like(np.take(y, [0], axis=axis), self.identity), np.delete(y, -1, axis=axis)], axis=axis) \
                if x.shape[axis] else y
        y = np.flip(y, axis) if self.reverse else y
        return y.astype(x.dtype)

    def flops(self) -> int:
        return self.operands[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """Each x_k is in the sums y_i for i >= k (i <= k reversed): dx is the cumsum of dy the other way round."""
        return [b.cumsum(dys[0], axis=self.axis, exclusive=self.exclusive, reverse=not self.reverse)]

    def lower(self, x):
        from tvm import te, tirx

        t = self.operands[0].type
        axis = self.axis % t.rank
        size = x.shape[axis]
        acc = _accumulator(self.name, t.dtype)
        k = te.reduce_axis((0, size), name="k")

        def body(*idx):
            # Reversed, k counts from the end (the sum of x[size - 1 - k] over k <= size - 1 - i): the predicate
            # bounds k from above either way (gc's reduction schedule gets `k >= i` wrong past 16 elements).
            i = size - 1 - idx[axis] if self.reverse else idx[axis]
            inside = k < i if self.exclusive else k <= i
            elem = x(*idx[:axis], size - 1 - k if self.reverse else k, *idx[axis + 1 :])
            elem = elem.astype(acc) if acc != t.dtype.tvm else elem
            # A select rather than te.sum's `where`, which gc's reduction schedules do not keep.
            elem = tirx.Select(inside, elem, tirx.const(self.identity, acc))
            return te.sum(elem, axis=k) if self.identity == 0 else _product(elem, axis=[k])

        name = _short(self)
        if acc == t.dtype.tvm:
            return te.compute(x.shape, body, name=name)
        total = te.compute(x.shape, body, name=f"{name}_acc")
        return te.compute(x.shape, lambda *i: total(*i).astype(t.dtype.tvm), name=name)


class Cumprod(Cumsum, name="graph.cumprod"):
    """Running product along axis (ONNX CumProd):  %y = graph.cumprod(%x) {axis = 1, reverse = true} : tensor<4x5xf32>

    `exclusive` leaves the element itself out of its product (the first is 1); `reverse` multiplies from the end.
    It has no gradient rule (the product of the others, divided out, would divide by a zero)."""

    identity = 1
    scan = staticmethod(np.cumprod)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        from compiler.passes import InputError  # the autodiff pass's diagnostic for an op it cannot go through

        raise InputError(f"{self.name} has no gradient rule (the product of the other elements would divide by "
                         "elements that may be 0; exp(cumsum(log(x))) differentiates for positive x): autodiff "
                         "cannot differentiate through it", self.loc)


OPS = [ReduceSum, ReduceMean, ReduceProd, ReduceMax, ReduceMin, Argmax, Cumsum, Cumprod]
