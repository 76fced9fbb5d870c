"""Reductions: reduce_sum, reduce_mean, reduce_max, reduce_min over a set of axes, and argmax.

`axes` absent or `[]` reduces every axis (ONNX's `noop_with_empty_axes = 0`); negative axes count
from the end. Reducing an empty set gives ONNX's identities: 0 for sum, -inf (or the dtype's least
value) for max, +inf (or its greatest) for min, NaN for a float mean.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import DType, Op, TensorType, attribute, operand
from dialects.graph.common import normalize_axes, normalize_axis, require_numeric


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


def _sum(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    # Accumulate in 64 bits; the result is rounded (or wrapped) once to the declared dtype.
    acc = np.float64 if np.issubdtype(x.dtype, np.floating) else np.int64
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=acc)


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

    fn = staticmethod(_sum)


class ReduceMean(Reduce, name="graph.reduce_mean"):
    """Mean over axes (integers truncate toward zero):  %y = graph.reduce_mean(%x) {axes = [-1]} : tensor<4xf32>"""

    fn = staticmethod(_mean)


class ReduceMax(Reduce, name="graph.reduce_max"):
    """Maximum over axes (NaN wins):  %y = graph.reduce_max(%x) {axes = [0]} : tensor<3xf32>"""

    fn = staticmethod(_max)


class ReduceMin(Reduce, name="graph.reduce_min"):
    """Minimum over axes (NaN wins):  %y = graph.reduce_min(%x) : tensor<f32>"""

    fn = staticmethod(_min)


class Argmax(Op, name="graph.argmax"):
    """Index of the first maximum along axis:  %i = graph.argmax(%x) {axis = 1} : tensor<4xi64>"""

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

    def flops(self) -> int:
        return self.operands[0].type.size


OPS = [ReduceSum, ReduceMean, ReduceMax, ReduceMin, Argmax]
