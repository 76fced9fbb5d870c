"""canonicalize: algebraic identities and shape no-ops, rewritten away to a fixed point.

Each pattern is a plain function: its annotation names the op it matches, its docstring states when
it is exact, its guards come first. A pattern that forwards an existing value checks that the value
has the op's result type, so no rewrite ever changes a shape or a dtype. Where two ops become one,
the new op remembers both locations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.builder import Builder
from compiler.diagnostics import Location
from compiler.ir import DType, Module, Op, Value
from compiler.passes import Pass
from compiler.rewrite import rewrite
from dialects.graph import creation, elementwise, nn, shape

# The casts that keep every value of the source dtype, nan and inf included: i1 fits anywhere, an
# integer fits a wider integer and a float whose significand holds it, a float fits a wider float.
_EXACT_CASTS: dict[DType, set[DType]] = {
    DType.i1: {DType.i8, DType.i32, DType.i64, DType.f16, DType.bf16, DType.f32, DType.f64},
    DType.i8: {DType.i32, DType.i64, DType.f16, DType.bf16, DType.f32, DType.f64},
    DType.i32: {DType.i64, DType.f64},
    DType.i64: set(),
    DType.f16: {DType.f32, DType.f64},
    DType.bf16: {DType.f32, DType.f64},
    DType.f32: {DType.f64},
    DType.f64: set(),
}

_RESHAPE_LIKE = (shape.Reshape, shape.Squeeze, shape.Unsqueeze, shape.Flatten)


def _is_constant(v: Value, scalar: float) -> bool:
    """Whether `v` is a graph.constant whose every element equals `scalar` (splat or not)."""
    op = v.owner
    return isinstance(op, creation.Constant) and bool(np.all(op.value.array == scalar))


def _same_type(op: Op, v: Value) -> Value | None:
    """`v` if it can stand for op's result: same shape and dtype, so nothing downstream changes."""
    return v if v.type == op.result.type else None


def _fused(b: Builder, *ops: Op) -> Builder:
    """The builder, now giving what it makes every location of `ops`."""
    b.loc = Location.merge([op.loc for op in ops])
    return b


# --- arithmetic identities --------------------------------------------------------------------------


def _zero_with_sign(v: Value, negative: bool) -> bool:
    """An exact-zero constant; for floats, also of the given sign (integers have one zero)."""
    if not _is_constant(v, 0):
        return False
    arr = v.owner.value.array
    if not v.type.dtype.is_float:
        return True
    return bool(np.all(np.signbit(arr.astype(np.float32)) == negative))


def add_zero(op: elementwise.Add, b: Builder) -> Value | None:
    """x + 0 and 0 + x -> x. Only for constants that are exactly zero everywhere, and only when the result
    has x's type: a broadcasting 0 larger than x would change the shape. For floats only a -0.0 constant:
    -0.0 + (+0.0) is +0.0, so adding +0.0 is not the identity (1/x would flip from -inf to inf)."""
    if _zero_with_sign(op.b, True) and _same_type(op, op.a):
        return op.a
    if _zero_with_sign(op.a, True) and _same_type(op, op.b):
        return op.b
    return None


def sub_zero(op: elementwise.Sub, b: Builder) -> Value | None:
    """x - 0 -> x. Only for an exact-zero constant (for floats +0.0: x - (-0.0) turns -0.0 into +0.0), only
    when the result has x's type (no broadcasting)."""
    if not _zero_with_sign(op.b, False):
        return None
    return _same_type(op, op.a)


def mul_one(op: elementwise.Mul, b: Builder) -> Value | None:
    """x * 1 and 1 * x -> x. Only for constants exactly one everywhere, only when the result has x's type."""
    if _is_constant(op.b, 1) and _same_type(op, op.a):
        return op.a
    if _is_constant(op.a, 1) and _same_type(op, op.b):
        return op.b
    return None


def div_one(op: elementwise.Div, b: Builder) -> Value | None:
    """x / 1 -> x. Only for an exact-one constant, only when the result has x's type (no broadcasting)."""
    if not _is_constant(op.b, 1):
        return None
    return _same_type(op, op.a)


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


def drop_dropout(op: nn.Dropout, b: Builder) -> Value | None:
    """dropout(x) -> x: gc compiles and interprets for inference, where dropout is the identity."""
    return _same_type(op, op.x)


# --- casts ------------------------------------------------------------------------------------------


def cast_same_dtype(op: elementwise.Cast, b: Builder) -> Value | None:
    """cast(x: T, T) -> x: converting to the dtype x already has changes nothing."""
    return _same_type(op, op.x)


def cast_round_trip(op: elementwise.Cast, b: Builder) -> Value | None:
    """cast(cast(x: T, a), T) -> x, only when T -> a is exact (a widening: f16 -> f32, i8 -> i32, ...),
    so the way back recovers every value. A narrowing pair (f32 -> f16 -> f32) rounds and stays."""
    inner = op.x.owner
    if not isinstance(inner, elementwise.Cast):
        return None
    x = inner.x
    if inner.dtype not in _EXACT_CASTS[x.type.dtype]:
        return None
    return _same_type(op, x)


def cast_cast(op: elementwise.Cast, b: Builder) -> Value | None:
    """cast(cast(x, a), b) -> cast(x, b), only when x -> a is exact: then cast(x, a) holds x's very values,
    and converting those to b is what cast(x, b) does. After a narrowing first cast the rounding stays."""
    inner = op.x.owner
    if not isinstance(inner, elementwise.Cast):
        return None
    if inner.dtype not in _EXACT_CASTS[inner.x.type.dtype]:
        return None
    return _fused(b, inner, op).cast(inner.x, dtype=op.dtype)


# --- shape no-ops -----------------------------------------------------------------------------------


def reshape_same_shape(op: shape.Reshape, b: Builder) -> Value | None:
    """reshape(x) to x's own shape -> x: row-major order is kept, so the elements do not move."""
    return _same_type(op, op.x)


def reshape_reshape(op: shape.Reshape, b: Builder) -> Value | None:
    """reshape(reshape(x)) -> one reshape of x (or x itself), also when the inner op is a squeeze, unsqueeze
    or flatten: all keep row-major order. The new shape is the resolved result shape, because a 0 or -1 in
    the outer shape refers to the intermediate value's shape, not x's."""
    inner = op.x.owner
    if not isinstance(inner, _RESHAPE_LIKE):
        return None
    if _same_type(op, inner.x):
        return inner.x
    return _fused(b, inner, op).reshape(inner.x, shape=op.result.type.shape)


def transpose_identity(op: shape.Transpose, b: Builder) -> Value | None:
    """transpose(x) with the identity perm -> x. The perm is compared normalised (-1 is the last axis)."""
    rank = op.x.type.rank
    if op.resolved(rank) != tuple(range(rank)):
        return None
    return _same_type(op, op.x)


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
        return _same_type(op, inner.x)
    return _fused(b, inner, op).transpose(inner.x, perm=perm)


def broadcast_same_shape(op: shape.BroadcastTo, b: Builder) -> Value | None:
    """broadcast_to(x) whose result has x's shape -> x: nothing is repeated."""
    return _same_type(op, op.x)


def concat_single(op: shape.Concat, b: Builder) -> Value | None:
    """concat(x) of one operand -> x."""
    if len(op.operands) != 1:
        return None
    return _same_type(op, op.operands[0])


def flatten_2d(op: shape.Flatten, b: Builder) -> Value | None:
    """flatten(x) of a 2-D x whose result has x's shape (axis 1, or a leading 1) -> x."""
    return _same_type(op, op.x)


def squeeze_unsqueeze(op: shape.Squeeze, b: Builder) -> Value | None:
    """squeeze(unsqueeze(x)) -> x when the squeeze gives back x's shape: both only add or drop size-1 axes
    in row-major order, so equal shapes mean equal elements."""
    inner = op.x.owner
    if not isinstance(inner, shape.Unsqueeze):
        return None
    return _same_type(op, inner.x)


def unsqueeze_squeeze(op: shape.Unsqueeze, b: Builder) -> Value | None:
    """unsqueeze(squeeze(x)) -> x when the unsqueeze gives back x's shape (see squeeze_unsqueeze)."""
    inner = op.x.owner
    if not isinstance(inner, shape.Squeeze):
        return None
    return _same_type(op, inner.x)


def slice_whole(op: shape.Slice, b: Builder) -> Value | None:
    """slice(x) keeping every element in order -> x: every step 1 and the result has x's shape (with step 1,
    a kept length equal to the axis size means the range starts at 0). A reversing step -1 stays."""
    if op.steps is not None and any(s != 1 for s in op.steps):
        return None
    return _same_type(op, op.x)


def pad_zero(op: shape.Pad, b: Builder) -> Value | None:
    """pad(x) with every pad 0 -> x: nothing is added or cropped, whatever the pad value."""
    if any(op.pads):
        return None
    return _same_type(op, op.x)


PATTERNS = [
    add_zero, sub_zero, mul_one, div_one, sub_self, neg_neg, relu_relu, drop_dropout,
    cast_same_dtype, cast_round_trip, cast_cast,
    reshape_same_shape, reshape_reshape, transpose_identity, transpose_transpose, broadcast_same_shape,
    concat_single, flatten_2d, squeeze_unsqueeze, unsqueeze_squeeze, slice_whole, pad_zero,
]  # fmt: skip


@dataclass
class Canonicalize(Pass):
    name = "canonicalize"
    summary = "fold algebraic identities (x+0, x*1, -(-x), ...) and shape no-ops to a fixed point"

    def run(self, module: Module) -> None:
        rewrite(module, PATTERNS, self.stats)
