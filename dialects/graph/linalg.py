"""Linear algebra: matmul with NumPy's semantics (1-D operands, broadcast batch dimensions)."""

from __future__ import annotations

import numpy as np

from compiler.diagnostics import GCError
from compiler.ir import Op, TensorType, operand
from dialects.graph.common import broadcast_shapes, require_numeric, same_dtype


class MatMul(Op, name="graph.matmul"):
    """a @ b, batch dimensions broadcast:  %z = graph.matmul(%x, %w) : tensor<64x256xf32>"""

    kind = "out-elementwise-fusable"
    a = operand()
    b = operand()

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        for i, t in enumerate((a, b)):
            if t.rank == 0:
                raise self.error(f"operand #{i} must have rank >= 1, got {t}")
        dtype = same_dtype(self, a, b)
        require_numeric(self, a)
        # NumPy: a 1-D a is a row [1, K] and a 1-D b a column [K, 1]; the added dimension is dropped again.
        k_a = a.shape[-1]
        k_b = b.shape[-2] if b.rank >= 2 else b.shape[0]
        if k_a != k_b:
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


OPS = [MatMul]


def _lower_matmul(self, a, b):
    """TE matmul: NumPy semantics, 2-D only for now (batched forms come with the codegen issue)."""
    from tvm import topi

    return topi.matmul(a, b)


MatMul.lower = _lower_matmul
