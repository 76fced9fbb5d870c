"""Shape helpers shared by the graph ops' type rules."""

from __future__ import annotations

from compiler.ir import DType, Op, TensorType


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
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            pretty = " and ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
            raise op.error(f"shapes {pretty} do not broadcast")
        out.append(dims.pop() if dims else 1)
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


def require_rank(op: Op, t: TensorType, rank: int, what: str = "operand") -> None:
    if t.rank != rank:
        raise op.error(f"{what} must have rank {rank}, got {t}")
