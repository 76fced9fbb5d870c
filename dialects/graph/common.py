"""Shape helpers shared by the graph ops' type rules, and the building blocks of their gradient rules."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import DYN, DType, Op, Sym, TensorType, Value, known, static

if TYPE_CHECKING:
    from compiler.builder import Builder


def normalize_axis(op: Op, axis: int, rank: int, what: str = "axis") -> int:
    """A negative axis counts from the end; out of range (any axis of a scalar) is the op's error."""
    if not -rank <= axis < rank:
        raise op.error(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def normalize_axes(op: Op, axes, rank: int, what: str = "axes") -> tuple[int, ...]:
    one = "axis" if what == "axes" else what.removesuffix("s")
    out = tuple(normalize_axis(op, a, rank, one) for a in axes)
    if len(set(out)) != len(out):
        raise op.error(f"{what} {list(axes)} repeat an axis")
    return out


def broadcast_shapes(op: Op, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting, with the op's error on a mismatch."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        sizes = {d for d in dims if known(d) and d != 1}
        if len(sizes) > 1:
            pretty = " and ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
            raise op.error(f"shapes {pretty} do not broadcast")
        # A `?` beside a size is that size or 1 (checked at run time); beside only 1s and `?`s it stays `?`,
        # but one named size beside 1s and itself is that size.
        named = {d for d in dims if isinstance(d, Sym)}
        if sizes:
            out.append(sizes.pop())
        elif static(dims):
            out.append(1)
        else:
            out.append(named.pop() if len(named) == 1 and DYN not in dims else DYN)
    return tuple(out)


def same_dtype(op: Op, *types: TensorType) -> DType:
    dts = [t.dtype for t in types]
    if any(d != dts[0] for d in dts):
        raise op.error("operand dtypes differ: " + " vs ".join(str(d) for d in dts))
    return dts[0]


def require_float(op: Op, t: TensorType, what: str = "operand") -> None:
    if not t.dtype.is_float:
        raise op.error(f"{what} must be a floating-point tensor, got {t}")


def require_numeric(op: Op, t: TensorType, what: str = "operand") -> None:
    if t.dtype.is_bool:
        raise op.error(f"{what} must be numeric, got {t}")


def along_axis(op: Op, x: TensorType) -> TensorType:
    """The shape rule of an op that walks `op.axis` of a numeric x and gives x's type (cumsum, iota)."""
    require_numeric(op, x)
    if x.rank == 0:
        raise op.error(f"operand must have rank >= 1, got {x}")
    normalize_axis(op, op.axis, x.rank)
    return x


def require_int(op: Op, t: TensorType, what: str = "operand") -> None:
    if not t.dtype.is_int:
        raise op.error(f"{what} must be an integer tensor, got {t}")


def require_rank(op: Op, t: TensorType, rank: int, what: str = "operand") -> None:
    if t.rank != rank:
        raise op.error(f"{what} must have rank {rank}, got {t}")


# --- helpers of the gradient rules (`grad` methods emit graph ops through a Builder) ------------------


def unbroadcast(b: Builder, dy: Value, shape: tuple[int, ...]) -> Value:
    """The adjoint of NumPy broadcasting: `dy` (of the broadcast result's shape) summed back to `shape`,
    over the leading axes `shape` lacks and the axes where it has size 1."""
    have, shape = dy.type.shape, tuple(shape)
    if have == shape:
        return dy
    lead = len(have) - len(shape)
    axes = [*range(lead), *(lead + i for i, d in enumerate(shape) if d == 1 and have[lead + i] != 1)]
    if axes:  # never an empty list: reduce_sum reads `axes = []` as every axis
        dy = b.reduce_sum(dy, axes=axes)
    return reshaped(b, dy, shape)


def numel(b: Builder, x: Value, axes=None, dtype: DType | None = None) -> Value:
    """The element count of x over `axes` as a scalar of `dtype` (x's): a constant where those sizes are
    known, else a graph.numel computed at run time."""
    dtype = dtype or x.type.dtype
    shape = x.type.shape
    sizes = [shape[a % len(shape)] for a in (range(len(shape)) if axes is None else axes)]
    if static(sizes):
        return b.constant(np.array(math.prod(sizes)), dtype)
    return b.numel(x, **({"axes": list(axes)} if axes is not None else {}), dtype=dtype)


def broadcast_like(b: Builder, y: Value, x: Value) -> Value:
    """y broadcast to x's shape (y itself where it has it). With `?` sizes, which a broadcast_to's shape
    cannot name, a where on x's shape picks y either way."""
    if y.type.shape == x.type.shape:
        return y
    if x.type.is_static:
        return b.broadcast_to(y, shape=x.type.shape)
    return b.where(b.equal(x, x), y, y)


def cast_to(b: Builder, x: Value, dtype: DType) -> Value:
    """x as `dtype` (x itself when it has that dtype already: no identity cast to clean up)."""
    return x if x.type.dtype == dtype else b.cast(x, dtype=dtype)


def reshaped(b: Builder, x: Value, shape: tuple[int, ...]) -> Value:
    """x under `shape` (x itself when it has that shape already: no identity reshape to clean up)."""
    shape = tuple(shape)
    if x.type.shape == shape:
        return x
    if 0 in shape:  # empty: reshape would read a 0 as "keep the input's size here" (ONNX)
        return zeros(b, x.type.with_shape(shape))
    return b.reshape(x, shape=_spelled(x.type.shape, shape))


def _spelled(have: tuple, shape: tuple) -> list[int]:
    """A reshape's `shape` attribute for a target with `?` sizes: the one `?` as -1; of several, those
    whose leading dims are x's own (a batch kept) as 0, copying x's size, and one more as -1."""
    if static(shape):
        return list(shape)
    out = [d if known(d) else None for d in shape]
    unknown = [i for i, d in enumerate(out) if d is None]
    if len(unknown) > 1:
        for i in unknown:
            if i < len(have) and not known(have[i]) and tuple(have[:i]) == tuple(shape[:i]):
                out[i] = 0
    rest = [i for i, d in enumerate(out) if d is None]
    if len(rest) > 1:
        raise AssertionError(f"a reshape of {have} to {shape} cannot be written with one -1")
    return [-1 if d is None else d for d in out]


def dilate(b: Builder, x: Value, steps: dict[int, int]) -> Value:
    """x with `step - 1` zeros after each element along each axis of `steps` (axis -> step): an axis of n
    becomes n * step long, element k at k * step. The adjoint of a strided read (slice, conv, pool)."""
    steps = {a: s for a, s in steps.items() if s > 1}
    if not steps:
        return x
    shape = x.type.shape
    # A size-1 axis after each dilated one, padded to the step, then merged back into it.
    split, ends = [], []
    for a, d in enumerate(shape):
        split.append(d)
        ends.append(0)
        if a in steps:
            split.append(1)
            ends.append(steps[a] - 1)
    padded = b.pad(reshaped(b, x, split), pads=[0] * len(split) + ends)
    return reshaped(b, padded, [d * steps.get(a, 1) for a, d in enumerate(shape)])


def pad_or_crop(b: Builder, x: Value, pads: list[int]) -> Value:
    """graph.pad with pads of either sign ([begin per dim..., end per dim...]); x itself if all are 0.
    Padding goes first, so that a crop of more than x holds (but not more than the padded x) is valid."""
    grow = [max(p, 0) for p in pads]
    shrink = [min(p, 0) for p in pads]
    if any(grow):
        x = b.pad(x, pads=grow)
    return b.pad(x, pads=shrink) if any(shrink) else x


def scalar(b: Builder, value: float, like: Value) -> Value:
    """A scalar constant of `like`'s dtype, which broadcasts against it."""
    return b.constant(np.array(value), like.type.dtype)


def zeros(b: Builder, t: TensorType) -> Value:
    """A zero tensor of type `t` (printed as a splat)."""
    return b.constant(np.zeros(t.shape), t.dtype)


def size_value(d, dtype: str):
    """A size from `kernel_shape` as a TVM value of `dtype`: a number, or a size variable of a kernel for
    every size (codegen/symbolic.py)."""
    from tvm import tirx

    return tirx.const(d, dtype) if isinstance(d, int) else tirx.Cast(dtype, d)


def isnan(x):
    """TIR's isnan, for bf16 too (TVM has none for it: a bf16 max pool failed to compile, its value is
    tested in f32, where it is exact)."""
    from tvm import tirx

    dtype = str(getattr(x, "dtype", None) or x.ty.dtype)
    return tirx.isnan(tirx.Cast("float32", x) if dtype.startswith("bfloat") else x)


def extreme_reducer(dtype: str, largest: bool = True):
    """The TE reducer for max (or min) with PyTorch's NaN semantics: a NaN anywhere in the window or row
    is the result. TIR's max(a, b) is `a > b ? a : b`, which drops a NaN in a; te.max also starts from
    the lowest finite value, which would win over a row of -inf."""
    from tvm import te, tirx

    if "float" not in dtype:
        return te.max if largest else te.min
    better = (lambda a, b: a > b) if largest else (lambda a, b: a < b)
    # v wins if it is NaN or better; a NaN accumulator is never beaten (a comparison with NaN is false).
    # The test of v is off the accumulator's dependency chain: testing acc for NaN there made a strided
    # 3x3 max pool 4.6x slower (64x112x112: 183 -> 850 us).
    return te.comm_reducer(
        lambda acc, v: tirx.Select(isnan(v) | better(v, acc), v, acc),
        lambda t: tirx.const(float("-inf") if largest else float("inf"), t),
        name="nanmax" if largest else "nanmin",
    )


# --- identity folds (Op.fold) ------------------------------------------------------------------------------


def same_type(op: Op, v: Value) -> Value | None:
    """`v` if it can stand for op's result: same shape and dtype, so nothing downstream changes."""
    return v if v.type == op.result.type else None


def is_constant(v: Value, scalar: float) -> bool:
    """Whether `v` is a constant whose every element equals `scalar` (splat or not)."""
    op = v.owner
    return op is not None and op.kind == "constant" and bool(np.all(op.value.array == scalar))


def zero_with_sign(v: Value, negative: bool) -> bool:
    """An exact-zero constant; for floats, also of the given sign (integers have one zero)."""
    if not is_constant(v, 0):
        return False
    if not v.type.dtype.is_float:
        return True
    return bool(np.all(np.signbit(v.owner.value.array.astype(np.float32)) == negative))
