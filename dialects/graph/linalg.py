"""Linear algebra: matmul with NumPy's semantics (1-D operands, broadcast batch dimensions)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.diagnostics import GCError
from compiler.ir import Op, TensorType, Value, broadcast, differ, kernel_shape, operand
from dialects.graph.common import broadcast_shapes, require_numeric, reshaped, same_dtype, unbroadcast

if TYPE_CHECKING:
    from compiler.builder import Builder


class MatMul(Op, name="graph.matmul"):
    """a @ b, batch dimensions broadcast:  %z = graph.matmul(%x, %w) : tensor<64x256xf32>"""
    precision = "low"
    weight_operands = (1,)
    reads_transposed_operands = True

    kind = "out-elementwise-fusable"
    a = operand()
    b = operand()

    def fan_in(self, index: int, shape: tuple[int, ...]) -> int | None:
        """K: the rows of a [.., K, N] weight b, the columns of an [.., M, K] operand a."""
        if len(shape) < 2 or index not in (0, 1):
            return None
        return max(shape[-2] if index == 1 else shape[-1], 1)

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        for i, t in enumerate((a, b)):
            if t.rank == 0:
                raise self.error(f"operand #{i} must have rank >= 1, got {t}")
        dtype = same_dtype(self, a, b)
        require_numeric(self, a)
        # NumPy: a 1-D a is a row [1, K] and a 1-D b a column [K, 1]; the added dimension is dropped again.
        k_a = a.shape[-1]
        k_b = b.shape[-2] if b.rank >= 2 else b.shape[0]
        if differ(k_a, k_b):
            raise self.error(f"inner dimensions differ: {k_a} vs {k_b}")
        batch_a, batch_b = a.shape[:-2], b.shape[:-2]
        try:
            batch = broadcast_shapes(self, batch_a, batch_b)
        except GCError:
            raise self.error(f"batch dimensions {list(batch_a)} and {list(batch_b)} do not broadcast") from None
        rows = a.shape[-2:-1]
        cols = b.shape[-1:] if b.rank >= 2 else ()
        return TensorType((*batch, *rows, *cols), dtype)

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.matmul(a, b)

    def flops(self) -> int:
        # One multiply and one add per (output element, k).
        return 2 * self.operands[0].type.shape[-1] * self.results[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """da = dy @ b^T and db = a^T @ dy, with 1-D operands made matrices as NumPy does (a row [1, K], a
        column [K, 1]) and the gradients summed back over broadcast batch dimensions."""
        a, w, dy = self.a, self.b, dys[0]
        a2 = a if a.type.rank >= 2 else reshaped(b, a, (1, *a.type.shape))
        w2 = w if w.type.rank >= 2 else reshaped(b, w, (*w.type.shape, 1))
        rows, cols = a2.type.shape[-2], w2.type.shape[-1]
        batch = dy.type.shape[: dy.type.rank - (a.type.rank >= 2) - (w.type.rank >= 2)]
        dy2 = reshaped(b, dy, (*batch, rows, cols))
        da = b.matmul(dy2, _swap_last(b, w2))
        if w2.type.rank == 2 and dy2.type.rank > 2:
            # A weight shared by the batch: one [K, batch*M] x [batch*M, N] product, not a batch of them summed.
            flat = math.prod(dy2.type.shape[:-1])
            dw = b.matmul(_swap_last(b, reshaped(b, a2, (flat, a2.type.shape[-1]))), reshaped(b, dy2, (flat, cols)))
        else:
            dw = b.matmul(_swap_last(b, a2), dy2)
        da = reshaped(b, unbroadcast(b, da, a2.type.shape), a.type.shape)
        dw = reshaped(b, unbroadcast(b, dw, w2.type.shape), w.type.shape)
        return [da, dw]


def _swap_last(b: Builder, x: Value) -> Value:
    """x with its last two axes swapped (a matrix transpose, batched)."""
    perm = list(range(x.type.rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return b.transpose(x, perm=perm)


OPS = [MatMul]


def _lower_matmul(self, a, b):
    """One TE reduction with NumPy's semantics; [M, K] x [K, N] is the plain `matmul` block schedules look for."""
    from tvm import te, tirx

    ta, tb, out = self.operands[0].type, self.operands[1].type, self.results[0].type
    k_size = kernel_shape(ta.shape)[-1]
    shape = kernel_shape(out.shape)
    # 16-bit floats accumulate in f32 and round once, as the reference does.
    acc = "float32" if out.dtype.tvm in ("float16", "bfloat16") else out.dtype.tvm
    if ta.shape[-1] == 0:  # an empty sum; TVM would skip the init of a reduction over an empty loop
        return te.compute(shape, lambda *i: tirx.const(0, out.dtype.tvm), name="matmul")
    batch_a, batch_b = ta.shape[:-2], tb.shape[:-2]
    nbatch = out.rank - (ta.rank >= 2) - (tb.rank >= 2)
    k = te.reduce_axis((0, k_size), name="k")

    def batch_index(shape: tuple[int, ...], idx: tuple) -> list:
        tail = idx[len(idx) - len(shape) :] if shape else ()
        outs = out.shape[nbatch - len(shape) : nbatch] if shape else ()
        return [0 if broadcast(d, o) else i for d, o, i in zip(shape, outs, tail)]

    def load(x, idx: list):
        elem = x(*idx)
        return elem.astype(acc) if acc != out.dtype.tvm else elem

    def body(*idx):
        outer, rest = idx[:nbatch], idx[nbatch:]
        row = [rest[0]] if ta.rank >= 2 else []
        col = [rest[-1]] if tb.rank >= 2 else []
        lhs = load(a, batch_index(batch_a, outer) + row + [k])
        rhs = load(b, batch_index(batch_b, outer) + [k] + col)
        return te.sum(lhs * rhs, axis=k)

    c = te.compute(shape, body, name="matmul")
    if acc == out.dtype.tvm:
        return c
    return te.compute(shape, lambda *i: c(*i).astype(out.dtype.tvm), name="matmul_round")


MatMul.lower = _lower_matmul
