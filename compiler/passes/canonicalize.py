"""canonicalize: algebraic identities and shape no-ops, rewritten away to a fixed point.

An identity one op knows by itself (x * 1 -> x) is that op's `fold` (compiler/ir.py's Op), which the
`fold` pattern asks every op for; the patterns here look at two ops at once (-(-x), a cast round trip).
Each pattern is a plain function: its annotation names the op it matches, its docstring states when
it is exact, its guards come first. A pattern that forwards an existing value checks that the value
has the op's result type, so no rewrite ever changes a shape or a dtype. Where two ops become one,
the new op remembers both locations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.builder import Builder
from compiler.diagnostics import Location
from compiler.ir import DType, Module, Op, Value, agree
from compiler.passes import Pass
from compiler.rewrite import rewrite
from dialects.graph import elementwise, linalg, shape
from dialects.graph.common import same_type


def _exact(src: DType, dst: DType) -> bool:
    """Whether every value of `src`, nan and inf included, survives a cast to `dst`: i1 fits anywhere, an
    integer fits a wider integer and a float whose significand holds it, a float fits a wider float. That
    is NumPy's "safe" casting, but for 64-bit integers, which it calls safe to f64 (2^53 + 1 is not)."""
    return src != dst and bool(np.can_cast(src.np, dst.np, "safe")) and not (
        src.is_int and src.itemsize == 8 and dst.is_float)


_RESHAPE_LIKE = (shape.Reshape, shape.Squeeze, shape.Unsqueeze, shape.Flatten)


def _fused(b: Builder, *ops: Op) -> Builder:
    """The builder, now giving what it makes every location of `ops`."""
    b.loc = Location.merge([op.loc for op in ops])
    return b


# --- arithmetic identities --------------------------------------------------------------------------


def sub_self(op: elementwise.Sub, b: Builder) -> Value | None:
    """x - x -> zeros. Integers only: for floats, inf - inf and nan - nan are nan, not 0."""
    if op.a is not op.b or not op.result.type.dtype.is_int:
        return None
    t = op.result.type
    return b.constant(np.zeros(t.shape, t.dtype.np), t.dtype)


def neg_neg(op: elementwise.Neg, b: Builder) -> Value | None:
    """-(-x) -> x. Exact for every dtype: integer negation wraps, so even -(-min) is min."""
    inner = op.x.owner
    return inner.x if isinstance(inner, elementwise.Neg) else None


def relu_relu(op: elementwise.Relu, b: Builder) -> Value | None:
    """relu(relu(x)) -> relu(x): relu is idempotent (nan stays nan)."""
    inner = op.x.owner
    return op.x if isinstance(inner, elementwise.Relu) else None


# --- casts ------------------------------------------------------------------------------------------


def cast_round_trip(op: elementwise.Cast, b: Builder) -> Value | None:
    """cast(cast(x: T, a), T) -> x, only when T -> a is exact (a widening: f16 -> f32, i8 -> i32, ...),
    so the way back recovers every value. A narrowing pair (f32 -> f16 -> f32) rounds and stays."""
    inner = op.x.owner
    if not isinstance(inner, elementwise.Cast):
        return None
    x = inner.x
    if not _exact(x.type.dtype, inner.dtype):
        return None
    return same_type(op, x)


def cast_cast(op: elementwise.Cast, b: Builder) -> Value | None:
    """cast(cast(x, a), b) -> cast(x, b), only when x -> a is exact: then cast(x, a) holds x's very values,
    and converting those to b is what cast(x, b) does. After a narrowing first cast the rounding stays."""
    inner = op.x.owner
    if not isinstance(inner, elementwise.Cast):
        return None
    if not _exact(inner.x.type.dtype, inner.dtype):
        return None
    return _fused(b, inner, op).cast(inner.x, dtype=op.dtype)


# --- shape no-ops -----------------------------------------------------------------------------------


def reshape_reshape(op: shape.Reshape, b: Builder) -> Value | None:
    """reshape(reshape(x)) -> one reshape of x (or x itself), also when the inner op is a squeeze, unsqueeze
    or flatten: all keep row-major order. The new shape is the resolved result shape, because a 0 or -1 in
    the outer shape refers to the intermediate value's shape, not x's."""
    inner = op.x.owner
    if not isinstance(inner, _RESHAPE_LIKE):
        return None
    if same_type(op, inner.x):
        return inner.x
    return _fused(b, inner, op).reshape(inner.x, shape=op.result.type.shape)


def matmul_unflattened(op: shape.Reshape, b: Builder) -> Value | None:
    """reshape(matmul(a, w), [.., N]) -> matmul(reshape(a, [.., K]), w): an [M, K] @ [K, N] product whose
    rows are unflattened to [.., N] is the product of the rows unflattened first, as matmul broadcasts it
    (GPT-2's Conv1D: view, addmm, view; the inner reshape then folds away or stays a view). Exact: the
    same sums in the same order. Only where the product has no other reader, which would otherwise
    compute it twice; the epilogue after it (bias, GELU, a residual add) then fuses with it. Sizes known
    only at run time qualify where they are expressions of named sizes that agree (`[batch * seq, 256]`
    as `[batch, seq, 256]`): a kernel of the dynamic model then sees batch and seq apart, each bound by
    an operand, instead of an unflattening between its operands that no size variable spans."""
    mm = op.x.owner
    if not isinstance(mm, linalg.MatMul) or mm.a.type.rank != 2 or mm.b.type.rank != 2:
        return None
    (m, k), out = mm.a.type.shape, op.result.type.shape
    if len(out) < 3 or not agree(out[-1], mm.b.type.shape[-1]) or not agree(math.prod(out[:-1]), m):
        return None
    if len(b.func.users().get(mm.result, [])) != 1:
        return None
    b = _fused(b, mm, op)
    return b.matmul(b.reshape(mm.a, shape=(*out[:-1], k)), mm.b)


def transpose_transpose(op: shape.Transpose, b: Builder) -> Value | None:
    """transpose(transpose(x, p), q) -> transpose(x, [p[i] for i in q]), or x when that is the identity.
    Both perms are normalised first (negative entries, absent perm = reversed)."""
    inner = op.x.owner
    if not isinstance(inner, shape.Transpose):
        return None
    rank = op.x.type.rank
    p, q = inner.resolved(rank), op.resolved(rank)
    perm = tuple(p[i] for i in q)
    if perm == tuple(range(rank)):
        return same_type(op, inner.x)
    return _fused(b, inner, op).transpose(inner.x, perm=perm)


def squeeze_unsqueeze(op: shape.Squeeze, b: Builder) -> Value | None:
    """squeeze(unsqueeze(x)) -> x when the squeeze gives back x's shape: both only add or drop size-1 axes
    in row-major order, so equal shapes mean equal elements."""
    inner = op.x.owner
    if not isinstance(inner, shape.Unsqueeze):
        return None
    return same_type(op, inner.x)


def unsqueeze_squeeze(op: shape.Unsqueeze, b: Builder) -> Value | None:
    """unsqueeze(squeeze(x)) -> x when the unsqueeze gives back x's shape (see squeeze_unsqueeze)."""
    inner = op.x.owner
    if not isinstance(inner, shape.Squeeze):
        return None
    return same_type(op, inner.x)


def fold(op: Op, b: Builder) -> Value | None:
    """op(x, ...) -> x where the op itself knows the identity (Op.fold: x + -0.0, x * 1, x / 1, x - 0,
    dropout, a cast to x's dtype, reshape/flatten/broadcast to x's shape, an identity transpose, a
    one-operand concat, a whole slice, a zero pad): an existing value of the result's type."""
    return op.fold()


fold.stats_key = lambda op: f"fold-{op.name.split('.', 1)[-1].replace('_', '-')}"  # type: ignore[attr-defined]

PATTERNS = [
    fold, sub_self, neg_neg, relu_relu, cast_round_trip, cast_cast, reshape_reshape, matmul_unflattened,
    transpose_transpose, squeeze_unsqueeze, unsqueeze_squeeze,
]  # fmt: skip


@dataclass
class Canonicalize(Pass):
    name = "canonicalize"
    summary = "fold algebraic identities (x+0, x*1, -(-x), ...) and shape no-ops to a fixed point"

    def run(self, module: Module) -> None:
        rewrite(module, PATTERNS, self.stats)
