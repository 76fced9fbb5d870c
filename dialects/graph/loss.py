"""Losses: softmax cross-entropy over class indices and mean squared error, each a scalar.

The scalar is `tensor<f32>`, as the contract says, for f16, bf16 and f32 inputs (16-bit inputs are
summed in f32 anyway, and training wants its loss in f32); f64 inputs keep an f64 loss, which the
contract does not cover and gradient checks need. The mean over an empty batch is NaN, as in PyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import DType, Op, TensorType, Value, differ, operand, shapes_differ
from dialects.graph.common import cast_to, numel, require_float, require_rank, reshaped, same_dtype, scalar

if TYPE_CHECKING:
    from compiler.builder import Builder


class SoftmaxCrossEntropy(Op, name="graph.softmax_cross_entropy"):
    """mean_n -log_softmax(logits)[n, labels[n]]:  %l = graph.softmax_cross_entropy(%x, %y) : tensor<f32>"""
    precision = "f32"

    # Opaque: a row-wise log-sum-exp, a gather by a run-time label and a mean over the batch are two
    # reductions over different axes around a data-dependent index, which no single fused kernel pattern fits.
    kind = "opaque"
    logits = operand()
    labels = operand()

    def infer(self, logits: TensorType, labels: TensorType) -> TensorType:
        require_float(self, logits, "logits")
        require_rank(self, logits, 2, "logits")
        if labels.dtype not in (DType.i32, DType.i64):
            raise self.error(f"labels must be i32 or i64 class indices, got {labels}")
        require_rank(self, labels, 1, "labels")
        if differ(labels.shape[0], logits.shape[0]):
            raise self.error(f"batch sizes differ: {logits.shape[0]} rows of logits vs {labels.shape[0]} labels")
        return TensorType((), loss_dtype(logits.dtype))

    def reference(self, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
        n, c = logits.shape
        bad = np.flatnonzero((labels < 0) | (labels >= c))
        if bad.size:
            i = int(bad[0])
            raise self.error(f"label {int(labels[i])} at position {i} is out of range [0, {c})")
        x = logits.astype(np.float64)
        m = np.max(x, axis=1, keepdims=True)
        log_probs = x - m - np.log(np.sum(np.exp(x - m), axis=1, keepdims=True))
        picked = log_probs[np.arange(n), labels.astype(np.int64)]
        with np.errstate(invalid="ignore", divide="ignore"):
            return -np.sum(picked) / n

    def lower(self, logits, labels):
        from tvm import te, tirx

        n, c = self.operands[0].type.shape
        dtype, src = self.results[0].type.dtype.tvm, self.operands[0].type.dtype.tvm
        acc = _accumulator(src)
        if n == 0 or c == 0:  # the mean of nothing (a class axis of 0 has no valid label either)
            return te.compute((), lambda: tirx.const(np.nan, dtype), name="softmax_cross_entropy")

        def x(i, j):
            return logits[i, j].astype(acc) if acc != src else logits[i, j]

        # loss_i = log(sum_j e^(x_ij - m_i)) + m_i - x_i,label: the shift by the row maximum keeps e^ finite.
        j1, j2, r = te.reduce_axis((0, c), "j1"), te.reduce_axis((0, c), "j2"), te.reduce_axis((0, n), "r")
        m = te.compute((n,), lambda i: te.max(x(i, j1), axis=j1), name="sce_max")
        z = te.compute((n,), lambda i: te.sum(te.exp(x(i, j2) - m[i]), axis=j2), name="sce_sum")

        def label(i):
            # The interpreter rejects a label out of range; compiled code clamps it rather than read astray.
            return tirx.max(tirx.min(labels[i], c - 1), 0).astype("int32")

        total = te.compute((), lambda: te.sum(te.log(z[r]) + m[r] - x(r, label(r)), axis=r), name="sce_total")
        return te.compute((), lambda: (total() / tirx.const(n, acc)).astype(dtype), name="softmax_cross_entropy")

    def input_range(self, index: int) -> tuple[int, int] | None:
        """Valid integer values [lo, hi) for operand `index`: the class indices of the labels."""
        return (0, self.operands[0].type.shape[1]) if index == 1 else None

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """(softmax(logits) - onehot(labels)) * dy / N; the labels are class indices, with no gradient."""
        logits, labels, dy = self.logits, self.labels, dys[0]
        n, c = logits.type.shape
        classes = b.constant(np.arange(c).reshape(1, c), labels.type.dtype)
        onehot = b.cast(b.equal(reshaped(b, labels, (n, 1)), classes), dtype=logits.type.dtype)
        scale = cast_to(b, b.div(dy, numel(b, logits, [0], dy.type.dtype)), logits.type.dtype)
        return [b.mul(b.sub(b.softmax(logits, axis=1), onehot), scale), None]

    def flops(self) -> int:
        return self.operands[0].type.size


class MseLoss(Op, name="graph.mse_loss"):
    """mean((a - b)^2) over every element:  %l = graph.mse_loss(%x, %y) : tensor<f32>"""
    precision = "f32"

    # A reduction: the subtract-and-square is elementwise and fuses into the one full reduction after it.
    kind = "reduction"
    a = operand()
    b = operand()

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype = same_dtype(self, a, b)
        require_float(self, a)
        if shapes_differ(a.shape, b.shape):
            raise self.error(f"operand shapes differ: {a} vs {b}")
        return TensorType((), loss_dtype(dtype))

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = a.astype(np.float64) - b.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(d * d) / d.size

    def lower(self, a, b):
        from tvm import te, tirx

        t = self.operands[0].type
        dtype = self.results[0].type.dtype.tvm
        acc = _accumulator(t.dtype.tvm)
        if t.size == 0:  # the mean of nothing
            return te.compute((), lambda: tirx.const(np.nan, dtype), name="mse_loss")
        axes = [te.reduce_axis((0, d), f"k{i}") for i, d in enumerate(t.shape)]

        def square(idx):
            d = a(*idx).astype(acc) - b(*idx).astype(acc)
            return d * d

        total = te.compute((), lambda: te.sum(square(axes), axis=axes) if axes else square([]), name="mse_total")
        return te.compute((), lambda: (total() / tirx.const(t.size, acc)).astype(dtype), name="mse_loss")

    def flops(self) -> int:
        return self.operands[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """d/da = 2 (a - b) dy / n and d/db = -d/da."""
        dy = dys[0]
        scale = cast_to(b, b.div(b.mul(dy, scalar(b, 2, dy)), numel(b, self.a, None, dy.type.dtype)), self.a.type.dtype)
        da = b.mul(b.sub(self.a, self.b), scale)
        return [da, b.neg(da)]


def loss_dtype(dtype: DType) -> DType:
    return DType.f64 if dtype == DType.f64 else DType.f32


def _accumulator(dtype: str) -> str:
    """16-bit floats accumulate in f32, as the reference computes them."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


OPS = [SoftmaxCrossEntropy, MseLoss]
