"""ONNX op types -> graph ops: one converter per op type (or family of alike ones).

A converter takes a `Node` (inputs as GIR values, or as content known at import time; attributes; the
model's opset) and returns one entry per ONNX output: a GIR value, an array for an output known at
import time (Shape, Constant), or None for an optional output it does not compute. It emits graph ops
with `n.b`; each op's `infer` checks the shapes. Semantics that changed between opsets (Softmax's 2-D
coercion before 13, Clip's bounds as attributes before 11, axes as attributes or inputs, old-style
broadcasting before 7) are resolved here against the model's opset. An ONNX op with no graph op of its
own is written with several (Gemm's alpha and beta, 1-D and 3-D convolution and pooling through
conv2d/pool2d, ConvTranspose as a convolution of the zero-stuffed input, Tile, reflect padding, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import DYN, ArgValue, DType, TensorType, Value, known, shapes_differ, static
from dialects.graph.common import cast_to
from dialects.graph.nn import pool_out
from dialects.graph.shape import Concat

if TYPE_CHECKING:
    from compiler.importers.onnx import Node


@dataclass(frozen=True)
class Converter:
    fn: Callable[[Node], list]
    attrs: frozenset[str]


CONVERTERS: dict[str, Converter] = {}


def converts(*op_types: str, attrs: str = "") -> Callable:
    """Register a converter for these op types, which understands the attributes named in `attrs`."""

    def register(fn: Callable[[Node], list]) -> Callable[[Node], list]:
        for t in op_types:
            CONVERTERS[t] = Converter(fn, frozenset(attrs.split()))
        return fn

    return register


def _axis(n: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise n.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# --- elementwise ----------------------------------------------------------------------------------------

_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softplus": "softplus", "Erf": "erf", "Neg": "neg",
          "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Floor": "floor",
          "Ceil": "ceil", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
          "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh"}  # fmt: skip


@converts(*_UNARY, attrs="consumed_inputs")  # consumed_inputs: opsets 1-5, meaningless since
def unary(n: Node) -> list:
    return [getattr(n.b, _UNARY[n.op_type])(n.x(0))]


@converts("LeakyRelu", "Elu", attrs="alpha consumed_inputs")
def alpha_unary(n: Node) -> list:
    if n.op_type == "LeakyRelu":
        return [n.b.leaky_relu(n.x(0), alpha=float(n.attr("alpha", 0.01)))]
    return [n.b.elu(n.x(0), alpha=float(n.attr("alpha", 1.0)))]


@converts("Selu", attrs="alpha gamma consumed_inputs")
def selu(n: Node) -> list:
    x = n.x(0)
    y = n.b.elu(x, alpha=float(n.attr("alpha", 1.67326319217681884765625)))
    return [n.b.mul(y, n.scalar(n.attr("gamma", 1.05070102214813232421875), x))]


@converts("Gelu", attrs="approximate")
def gelu(n: Node) -> list:
    return [n.b.gelu(n.x(0), approximate=n.attr("approximate", "none"))]


@converts("HardSigmoid", "HardSwish", attrs="alpha beta")
def hard_sigmoid(n: Node) -> list:
    x = n.x(0)
    alpha, beta = (0.2, 0.5) if n.op_type == "HardSigmoid" else (1 / 6, 0.5)
    alpha, beta = float(n.attr("alpha", alpha)), float(n.attr("beta", beta))
    y = n.b.clip(n.b.add(n.b.mul(x, n.scalar(alpha, x)), n.scalar(beta, x)), min=0.0, max=1.0)
    return [y if n.op_type == "HardSigmoid" else n.b.mul(x, y)]


@converts("Swish", attrs="alpha")
def swish(n: Node) -> list:
    """x * sigmoid(alpha * x) (opset 24)."""
    x = n.x(0)
    alpha = float(n.attr("alpha", 1.0))
    return [n.b.mul(x, n.b.sigmoid(x if alpha == 1.0 else n.b.mul(x, n.scalar(alpha, x))))]


@converts("LpNormalization", attrs="axis p")
def lp_normalization(n: Node) -> list:
    """x over its L1 or L2 norm along the axis, 0 where the norm is 0 (as ONNX's reference)."""
    x = n.x(0)
    axis, p = _axis(n, n.attr("axis", -1), x.type.rank), n.attr("p", 2)
    if p not in (1, 2):
        raise n.error(f"p must be 1 or 2, got {p}")
    norm = (n.b.reduce_sum(n.b.abs(x), axes=(axis,), keepdims=True) if p == 1
            else n.b.sqrt(n.b.reduce_sum(n.b.mul(x, x), axes=(axis,), keepdims=True)))
    zero = n.scalar(0, x)
    return [n.b.where(n.b.equal(norm, zero), zero, n.b.div(x, norm))]


@converts("Softsign")
def softsign(n: Node) -> list:
    x = n.x(0)
    return [n.b.div(x, n.b.add(n.scalar(1, x), n.b.abs(x)))]


@converts("ThresholdedRelu", attrs="alpha")
def thresholded_relu(n: Node) -> list:
    """x where x > alpha, else 0."""
    x = n.x(0)
    return [n.b.where(n.b.greater(x, n.scalar(float(n.attr("alpha", 1.0)), x)), x, n.scalar(0, x))]


@converts("Celu", attrs="alpha")
def celu(n: Node) -> list:
    """alpha * elu(x / alpha): x for x > 0, alpha * (exp(x / alpha) - 1) otherwise."""
    x = n.x(0)
    alpha = float(n.attr("alpha", 1.0))
    if alpha == 0 or not math.isfinite(alpha):
        raise n.error(f"alpha must be a nonzero finite number, got {alpha}")
    if alpha == 1.0:
        return [n.b.elu(x, alpha=1.0)]
    return [n.b.mul(n.b.elu(n.b.div(x, n.scalar(alpha, x)), alpha=1.0), n.scalar(alpha, x))]


@converts("Shrink", attrs="bias lambd")
def shrink(n: Node) -> list:
    """x + bias below -lambd, x - bias above lambd, 0 between (integers: bias and lambd as the reference casts)."""
    x = n.x(0)
    bias, lambd = float(n.attr("bias", 0.0)), float(n.attr("lambd", 0.5))
    if not (math.isfinite(bias) and math.isfinite(lambd)):
        raise n.error(f"bias and lambd must be finite, got {bias} and {lambd}")
    zero = n.scalar(0, x)
    if not x.type.dtype.is_float:
        # Compare in f64 (an integer type may not hold -lambd), shift by the bias cast to x's type.
        xf, b = n.b.cast(x, dtype=DType.f64), int(bias)
        lo, hi = n.b.less(xf, n.constant(np.array(-lambd), DType.f64)), n.b.greater(xf, n.constant(np.array(lambd), DType.f64))
        if b == 0:
            return [n.b.where(lo, x, n.b.where(hi, x, zero))]
        bv = n.b.constant(np.array(b).astype(x.type.dtype.np), x.type.dtype)
        return [n.b.where(lo, n.b.add(x, bv), n.b.where(hi, n.b.sub(x, bv), zero))]
    lo, hi = n.b.less(x, n.scalar(-lambd, x)), n.b.greater(x, n.scalar(lambd, x))
    return [n.b.where(lo, n.b.add(x, n.scalar(bias, x)), n.b.where(hi, n.b.sub(x, n.scalar(bias, x)), zero))]


@converts("Sign")
def sign(n: Node) -> list:
    """1 where x > 0, -1 where x < 0, x itself otherwise (0, and a NaN stays NaN)."""
    x = n.x(0)
    y = n.b.where(n.b.greater(x, n.scalar(0, x)), n.scalar(1, x), x)
    return [y if x.type.dtype.is_unsigned else n.b.where(n.b.less(x, n.scalar(0, x)), n.scalar(-1, x), y)]


@converts("Round")
def round_half_even(n: Node) -> list:
    """Round half to even, exactly: f = floor(x) and the fraction x - f (exact in binary floating point); f + 1
    above one half, f below, and at one half whichever of f and f + 1 is even (f + f mod 2). Infinities and NaN
    pass through (their fraction is NaN)."""
    x = n.x(0)
    f = n.b.floor(x)
    frac = n.b.sub(x, f)
    half, one = n.scalar(0.5, x), n.scalar(1, x)
    odd = n.b.sub(f, n.b.mul(n.scalar(2, x), n.b.floor(n.b.mul(f, half))))  # f mod 2: 0 or 1
    y = n.b.where(n.b.greater(frac, half), n.b.add(f, one),
                  n.b.where(n.b.less(frac, half), f, n.b.add(f, odd)))  # fmt: skip
    return [n.b.where(n.b.equal(frac, frac), y, x)]


@converts("Mish")
def mish(n: Node) -> list:
    """x * tanh(softplus(x))."""
    x = n.x(0)
    return [n.b.mul(x, n.b.tanh(n.b.softplus(x)))]


@converts("SwiGLU", attrs="alpha")
def swiglu(n: Node) -> list:
    """Swish_alpha(A) * B = A * sigmoid(alpha * A) * B (opset 28); A and B of one shape."""
    a, v = n.x(0), n.x(1)
    if shapes_differ(a.type.shape, v.type.shape):
        raise n.error(f"A and B must have one shape (SwiGLU does not broadcast), got {a.type} and {v.type}")
    alpha = float(n.attr("alpha", 1.0))
    gate = n.b.mul(a, n.b.sigmoid(a if alpha == 1.0 else n.b.mul(a, n.scalar(alpha, a))))
    return [n.b.mul(gate, v)]


@converts("MeanVarianceNormalization", attrs="axes")
def mean_variance_normalization(n: Node) -> list:
    """(x - mean) / (sqrt(variance) + 1e-9) over the axes (default [0, 2, 3]), as ONNX's function body."""
    x = n.x(0)
    axes = n.attr("axes", [0, 2, 3])
    axes = tuple(sorted({_axis(n, a, x.type.rank) for a in axes}))
    mean = n.b.reduce_mean(x, axes=axes, keepdims=True)
    d = n.b.sub(x, mean)
    std = n.b.sqrt(n.b.reduce_mean(n.b.mul(d, d), axes=axes, keepdims=True))
    return [n.b.div(d, n.b.add(std, n.scalar(1e-9, std)))]


@converts("PRelu", attrs="consumed_inputs")
def prelu(n: Node) -> list:
    x, slope = n.x(0), n.x(1)
    if n.opset < 7 and slope.type.size != 1 and x.type.rank >= 2:
        # Before opset 7 the slope is per channel (axis 1), not broadcast from the right.
        slope = n.b.reshape(slope, shape=(-1,) + (1,) * (x.type.rank - 2))
    return [n.b.where(n.b.less(x, n.scalar(0, x)), n.b.mul(x, slope), x)]


@converts("Clip", attrs="min max consumed_inputs")
def clip(n: Node) -> list:
    x = n.x(0)
    if n.opset < 11:
        lo, hi = n.attr("min", -math.inf), n.attr("max", math.inf)
    elif all(n.known(i) is not None for i in (1, 2) if n.has(i)):
        bounds = [n.const(i, what) for i, what in ((1, "min"), (2, "max"))]
        lo, hi = (
            b.reshape(-1)[0].item() if b is not None and b.size else d for b, d in zip(bounds, (-math.inf, math.inf))
        )
    else:  # bounds given at run time (they do not change the shape): min(max(x, lo), hi), as ONNX defines it
        for i in (1, 2):
            if n.has(i) and n.type(i).size != 1:
                raise n.error(f"input #{i} ({('min', 'max')[i - 1]}) must hold one value, got {n.type(i)}")
        y = n.b.maximum(x, n.b.reshape(n.x(1), shape=())) if n.has(1) else x
        return [n.b.minimum(y, n.b.reshape(n.x(2), shape=())) if n.has(2) else y]
    return [n.b.clip(x, min=float(lo), max=float(hi))]


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Equal": "equal",
           "Less": "less", "Greater": "greater"}  # fmt: skip


def _legacy_broadcast(n: Node, a: Value, b: Value) -> Value:
    """Before opset 7, `broadcast = 1, axis = k` aligns b's dims with a's from axis k rather than from the right."""
    axis = n.attr("axis", None)
    if n.opset >= 7 or not n.attr("broadcast", 0) or axis is None or b.type.rank >= a.type.rank:
        return b
    tail = a.type.rank - _axis(n, axis, a.type.rank) - b.type.rank
    if tail < 0:
        raise n.error(f"b of rank {b.type.rank} does not fit into a's rank {a.type.rank} from axis {axis}")
    return n.b.reshape(b, shape=b.type.shape + (1,) * tail) if tail else b


@converts(*_BINARY, attrs="broadcast axis consumed_inputs")
def binary(n: Node) -> list:
    a, b = n.x(0), n.x(1)
    b = _legacy_broadcast(n, a, b)
    if n.op_type == "Pow":  # the exponent may have its own type
        b = cast_to(n.b, b, a.type.dtype)
    return [getattr(n.b, _BINARY[n.op_type])(a, b)]


@converts("GreaterOrEqual", "LessOrEqual")
def compare_or_equal(n: Node) -> list:
    a, b = n.x(0), n.x(1)
    strict = n.b.greater(a, b) if n.op_type == "GreaterOrEqual" else n.b.less(a, b)
    # where(a > b, true, a == b), not "not a < b", which a NaN would make true.
    return [n.b.where(strict, n.constant(np.array(True), DType.i1), n.b.equal(a, b))]


@converts("Not", "And", "Or", "Xor")
def logical(n: Node) -> list:
    true, false = n.constant(np.array(True), DType.i1), n.constant(np.array(False), DType.i1)
    if n.op_type == "Not":
        return [n.b.equal(n.x(0), false)]
    a, b = n.x(0), n.x(1)
    if n.op_type == "And":
        return [n.b.where(a, b, false)]
    if n.op_type == "Or":
        return [n.b.where(a, true, b)]
    return [n.b.equal(n.b.equal(a, b), false)]


@converts("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")
def bitwise(n: Node) -> list:
    if n.op_type == "BitwiseNot":
        return [n.b.bitwise_not(n.x(0))]
    fn = {"BitwiseAnd": n.b.bitwise_and, "BitwiseOr": n.b.bitwise_or, "BitwiseXor": n.b.bitwise_xor}[n.op_type]
    return [fn(n.x(0), n.x(1))]


@converts("BitShift", attrs="direction")
def bit_shift(n: Node) -> list:
    direction = n.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise n.error(f"direction must be \"LEFT\" or \"RIGHT\", got {direction!r}")
    return [(n.b.shift_left if direction == "LEFT" else n.b.shift_right)(n.x(0), n.x(1))]


def _all_false(n: Node, like: Value) -> Value:
    false = n.constant(np.array(False), DType.i1)
    return n.b.broadcast_to(false, shape=list(like.type.shape)) if like.type.rank else false


@converts("IsNaN")
def isnan(n: Node) -> list:
    """x != x, which only a NaN is: equal(x, x) is false there (the interpreter and the kernels compare
    IEEE floats, no fast-math)."""
    x = n.x(0)
    if not x.type.dtype.is_float:
        return [_all_false(n, x)]
    return [n.b.equal(n.b.equal(x, x), n.constant(np.array(False), DType.i1))]


@converts("IsInf", attrs="detect_negative detect_positive")
def isinf(n: Node) -> list:
    x = n.x(0)
    signs = [s for s, on in ((1.0, n.attr("detect_positive", 1)), (-1.0, n.attr("detect_negative", 1))) if on]
    if not x.type.dtype.is_float or not signs:
        return [_all_false(n, x)]
    hits = [n.b.equal(x, n.scalar(s * np.inf, x)) for s in signs]
    return [hits[0] if len(hits) == 1 else n.b.where(hits[0], n.constant(np.array(True), DType.i1), hits[1])]


@converts("Sum", "Mean", "Max", "Min", attrs="consumed_inputs")
def variadic(n: Node) -> list:
    xs = n.xs()
    fn = getattr(n.b, {"Sum": "add", "Mean": "add", "Max": "maximum", "Min": "minimum"}[n.op_type])
    if n.op_type in ("Max", "Min"):
        # Pairwise, as a balanced tree: a fused chain of maximums compiles in time exponential in its depth.
        while len(xs) > 1:
            xs = [fn(a, b) for a, b in zip(xs[::2], xs[1::2])] + xs[len(xs) // 2 * 2 :]
        return [xs[0]]
    y = xs[0]
    for x in xs[1:]:
        y = fn(y, x)
    if n.op_type == "Mean" and len(xs) > 1:
        y = n.b.div(y, n.scalar(len(xs), y))
    return [y]


@converts("Mod", attrs="fmod")
def mod(n: Node) -> list:
    fmod = bool(n.attr("fmod", 0))
    known = n.constants()
    if known is not None:  # shape arithmetic, as exporters emit it
        with np.errstate(all="ignore"):  # x mod 0 is 0 for integers, nan for floats, as ONNX's reference
            r = (np.fmod if fmod else np.mod)(*known)
        # A ufunc of 0-d arrays returns a numpy scalar, which is no value: keep an array.
        return [np.asarray(r)]
    a, b = n.x(0), n.x(1)
    # Truncated first (the result a's sign): integer division truncates; floats as _float_fmod.
    r = _float_fmod(n, a, b) if a.type.dtype.is_float else n.b.sub(a, n.b.mul(b, n.b.div(a, b)))
    if fmod:
        return [r]
    zero, false = n.scalar(0, r), n.constant(np.array(False), DType.i1)
    # Floored: a nonzero remainder of the other sign than b moves by b (mod(-3, inf) = inf).
    differ = n.b.equal(n.b.equal(n.b.less(r, zero), n.b.less(b, zero)), false)
    r = n.b.where(n.b.where(n.b.equal(r, zero), false, differ), n.b.add(r, b), r)
    if a.type.dtype.is_float:  # a zero remainder takes b's sign, as NumPy's
        r = n.b.where(n.b.equal(r, zero), n.b.where(n.b.less(b, zero), n.scalar(-0.0, a), zero), r)
    return [r]


def _float_fmod(n: Node, a: Value, b: Value) -> Value:
    """fmod of floats (the quotient truncated), IEEE's edge cases as NumPy's: a finite over an infinite b is
    a itself (a - b * 0 would be NaN), and a zero result keeps a's sign (a - b * t rounds -0 to +0)."""
    zero, false = n.scalar(0, a), n.constant(np.array(False), DType.i1)
    q = n.b.div(a, b)
    r = n.b.sub(a, n.b.mul(b, n.b.where(n.b.less(q, zero), n.b.ceil(q), n.b.floor(q))))
    inf = n.scalar(np.inf, a)
    finite_a = n.b.equal(n.b.equal(n.b.abs(a), inf), false)
    r = n.b.where(n.b.where(n.b.equal(n.b.abs(b), inf), finite_a, false), a, r)
    return n.b.where(n.b.equal(r, zero), n.b.mul(a, zero), r)  # a's sign: -3 * 0 = -0


@converts("Where")
def where(n: Node) -> list:
    return [n.b.where(n.x(0), n.x(1), n.x(2))]


@converts("Cast", attrs="to saturate round_mode")
def cast(n: Node) -> list:
    to = n.attr("to")
    if isinstance(to, str):  # opset 1 named the type
        names = dict(n.imp.onnx.TensorProto.DataType.items())
        if to not in names:
            raise n.error(f"to '{to}' names no ONNX element type")
        to = names[to]
    return [cast_to(n.b, n.x(0), n.dense_dtype(to))]


@converts("CastLike", attrs="saturate round_mode")
def cast_like(n: Node) -> list:
    return [cast_to(n.b, n.x(0), n.type(1).dtype)]


# --- linear algebra, convolution, pooling -----------------------------------------------------------------


@converts("MatMul")
def matmul(n: Node) -> list:
    return [n.b.matmul(n.x(0), n.x(1))]


@converts("Gemm", attrs="alpha beta transA transB broadcast")
def gemm(n: Node) -> list:
    a, w = n.x(0), n.x(1)
    if a.type.rank != 2 or w.type.rank != 2:
        raise n.error(f"A and B must be matrices, got {a.type} and {w.type}")
    if n.attr("transA", 0):
        a = n.b.transpose(a, perm=(1, 0))
    if n.attr("transB", 0):
        w = n.b.transpose(w, perm=(1, 0))  # matmul(x, transpose(w)): fuse reads w in place
    y = n.b.matmul(a, w)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    if alpha != 1.0:
        y = n.b.mul(y, n.scalar(alpha, y))
    if n.has(2) and beta != 0.0:
        c = n.x(2)
        y = n.b.add(y, c if beta == 1.0 else n.b.mul(c, n.scalar(beta, c)))
    return [y]


def _pads(n: Node, sizes: tuple[int, ...], kernel, strides, dilations) -> list[int]:
    """ONNX pads [begin..., end...] from `pads` or `auto_pad`."""
    k = len(sizes)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(n.attr("pads", [0] * 2 * k))
        if len(pads) != 2 * k:
            raise n.error(f"pads {pads} must have {2 * k} entries for {k} spatial axes")
        return pads
    if auto == "VALID":
        return [0] * 2 * k
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise n.error(f"auto_pad '{auto}' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    begins, ends = [], []
    for size, kk, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (kk - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def _per_axis(n: Node, what: str, values, k: int, least: int) -> list[int]:
    """A window attribute: one entry per spatial axis, each at least `least` (a stride of 0 has no meaning)."""
    values = list(values)
    if len(values) != k:
        raise n.error(f"{what} {values} has {len(values)} entries for {k} spatial axes")
    if any(v < least for v in values):
        raise n.error(f"{what} {values} must be {'positive' if least else 'non-negative'}")
    return values


def _window_attrs(n: Node, x: Value, kernel: list[int]) -> tuple[list[int], list[int], list[int]]:
    """strides, dilations and pads of a conv or pool over x's spatial axes."""
    k = x.type.rank - 2
    _per_axis(n, "kernel_shape", kernel, k, 1)
    strides = _per_axis(n, "strides", n.attr("strides", [1] * k), k, 1)
    dilations = _per_axis(n, "dilations", n.attr("dilations", [1] * k), k, 1)
    pads = _pads(n, x.type.shape[2:], kernel, strides, dilations)
    if any(p < 0 for p in pads):
        raise n.error(f"pads {pads} must not be negative")
    return strides, dilations, pads


def _spatial_rank(n: Node, x: Value, most: int = 3) -> int:
    k = x.type.rank - 2
    if not 1 <= k <= most:
        raise n.error(
            f"input {x.type} has {k} spatial axes; gc maps {'1 to 3' if most == 3 else '1 or 2'} onto its 2-D graph ops"
        )
    return k


@converts("Conv", attrs="auto_pad dilations group kernel_shape pads strides")
def conv(n: Node) -> list:
    x, w = n.x(0), n.x(1)
    bias = [n.x(2)] if n.has(2) else []
    k = _spatial_rank(n, x)
    if w.type.rank != x.type.rank:
        raise n.error(f"W {w.type} must have the rank of X {x.type}")
    kernel = list(n.attr("kernel_shape", w.type.shape[2:]))
    if tuple(kernel) != w.type.shape[2:]:
        raise n.error(f"kernel_shape {kernel} differs from W's spatial shape {list(w.type.shape[2:])}")
    strides, dil, pads = _window_attrs(n, x, kernel)
    group = n.attr("group", 1)
    if k == 2:
        return [n.b.conv2d(x, w, *bias, strides=strides, padding=pads, dilations=dil, groups=group)]
    if k == 1:
        y = n.b.conv2d(
            n.b.unsqueeze(x, axes=(2,)),
            n.b.unsqueeze(w, axes=(2,)),
            *bias,
            strides=(1, strides[0]),
            padding=(0, pads[0], 0, pads[1]),
            dilations=(1, dil[0]),
            groups=group,
        )
        return [n.b.squeeze(y, axes=(2,))]
    return [_conv3d(n, x, w, bias, strides, dil, pads, group)]


def _depth_taps(n: Node, x: Value, count: int, taps: int, stride: int, dilation: int) -> Value:
    """[N, C, taps, count, H, W]: for each tap t, x[:, :, t*dilation + o*stride] for o < count."""
    parts = []
    for t in range(taps):
        s = n.b.slice(
            x, starts=(t * dilation,), ends=(t * dilation + (count - 1) * stride + 1,), axes=(2,), steps=(stride,)
        )
        parts.append(n.b.unsqueeze(s, axes=(2,)))
    return parts[0] if taps == 1 else n.b.concat(*parts, axis=2)


def _conv3d(n: Node, x: Value, w: Value, bias: list, strides, dil, pads, group: int) -> Value:
    """A 3-D convolution as one conv2d: the depth taps of the kernel join the input channels, the output
    depths the batch. Channel c*kd + t of the 2-D input is tap t of channel c, group-contiguous as w's
    [M, C/g * kd, kh, kw] reshape is."""
    nb, c, d, h, wd = x.type.shape
    m, cg, kd, kh, kw = w.type.shape
    if pads[0] or pads[3]:
        x = n.b.pad(x, pads=(0, 0, pads[0], 0, 0, 0, 0, pads[3], 0, 0))
    depth = (d + pads[0] + pads[3] - dil[0] * (kd - 1) - 1) // strides[0] + 1
    if depth < 1:
        raise n.error(f"the dilated kernel depth {dil[0] * (kd - 1) + 1} is larger than the padded input depth")
    taps = _depth_taps(n, x, depth, kd, strides[0], dil[0])  # [N, C, kd, Do, H, W]
    x2 = n.b.reshape(n.b.transpose(taps, perm=(0, 3, 1, 2, 4, 5)), shape=(nb * depth, c * kd, h, wd))
    w2 = n.b.reshape(w, shape=(m, cg * kd, kh, kw))
    y = n.b.conv2d(
        x2,
        w2,
        *bias,
        strides=strides[1:],
        padding=(pads[1], pads[2], pads[4], pads[5]),
        dilations=dil[1:],
        groups=group,
    )
    _, _, ho, wo = y.type.shape
    return n.b.transpose(n.b.reshape(y, shape=(nb, depth, m, ho, wo)), perm=(0, 2, 1, 3, 4))


@converts("ConvTranspose", attrs="auto_pad dilations group kernel_shape output_padding output_shape pads strides")
def conv_transpose(n: Node) -> list:
    """The gradient of a convolution, as a convolution: the input with stride-1 zeros between its pixels,
    padded by (k-1)*d - pad (a negative amount crops), convolved with the flipped kernel whose in and
    out channels are swapped within each group."""
    x, w = n.x(0), n.x(1)
    bias = [n.x(2)] if n.has(2) else []
    k = _spatial_rank(n, x, most=2)
    if w.type.rank != x.type.rank:
        raise n.error(f"W {w.type} must have the rank of X {x.type}")
    g = n.attr("group", 1)
    if g < 1 or w.type.shape[0] % g:
        raise n.error(f"group {g} must be positive and divide W's {w.type.shape[0]} input channels")
    kernel = list(w.type.shape[2:])
    if list(n.attr("kernel_shape", kernel)) != kernel:
        raise n.error(f"kernel_shape {list(n.attr('kernel_shape'))} differs from W's spatial shape {kernel}")
    _per_axis(n, "kernel_shape", kernel, k, 1)
    strides = _per_axis(n, "strides", n.attr("strides", [1] * k), k, 1)
    dil = _per_axis(n, "dilations", n.attr("dilations", [1] * k), k, 1)
    out_pad = _per_axis(n, "output_padding", n.attr("output_padding", [0] * k), k, 0)
    sizes = x.type.shape[2:]
    full = [s * (i - 1) + op + (kk - 1) * d + 1 for s, i, op, kk, d in zip(strides, sizes, out_pad, kernel, dil)]
    auto = n.attr("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise n.error(f"auto_pad '{auto}' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    out_shape = n.attr("output_shape", None)
    if out_shape is not None and len(out_shape) < k:
        raise n.error(f"output_shape {out_shape} has fewer entries than the {k} spatial axes")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = list(out_shape)[-k:] if out_shape is not None else [i * s for i, s in zip(sizes, strides)]
        totals = [f - o for f, o in zip(full, want)]
        upper = auto == "SAME_UPPER"
        pads = [t // 2 if upper else t - t // 2 for t in totals] + [t - t // 2 if upper else t // 2 for t in totals]
    elif auto == "VALID":
        pads = [0] * 2 * k
    else:
        pads = list(n.attr("pads", [0] * 2 * k))
        if len(pads) != 2 * k:
            raise n.error(f"pads {pads} must have {2 * k} entries for {k} spatial axes")
    if k == 1:  # as 2-D with a unit height
        x, w = n.b.unsqueeze(x, axes=(2,)), n.b.unsqueeze(w, axes=(2,))
        strides, dil, out_pad, kernel = [1, *strides], [1, *dil], [0, *out_pad], [1, *kernel]
        pads = [0, pads[0], 0, pads[1]]
    nb, c, h, wd = x.type.shape
    if strides != [1, 1]:
        x6 = n.b.pad(
            n.b.reshape(x, shape=(nb, c, h, 1, wd, 1)),
            pads=(0, 0, 0, 0, 0, 0, 0, 0, 0, strides[0] - 1, 0, strides[1] - 1),
        )
        x = n.b.reshape(x6, shape=(nb, c, h * strides[0], wd * strides[1]))
    # The zero-stuffed input ends with stride-1 zeros too many: the end padding takes them off.
    lo = [(kk - 1) * d - p for kk, d, p in zip(kernel, dil, pads[:2])]
    hi = [(kk - 1) * d - p + op - (s - 1) for kk, d, p, op, s in zip(kernel, dil, pads[2:], out_pad, strides)]
    if any(lo) or any(hi):
        x = n.b.pad(x, pads=(0, 0, *lo, 0, 0, *hi))
    cin, cout_g, kh, kw = w.type.shape
    if g == 1:
        w = n.b.transpose(w, perm=(1, 0, 2, 3))
    else:
        w5 = n.b.reshape(w, shape=(g, cin // g, cout_g, kh, kw))
        w = n.b.reshape(n.b.transpose(w5, perm=(0, 2, 1, 3, 4)), shape=(g * cout_g, cin // g, kh, kw))
    w = n.b.slice(w, starts=(-1, -1), ends=(-kh - 1, -kw - 1), axes=(2, 3), steps=(-1, -1))
    y = n.b.conv2d(x, w, *bias, dilations=dil, groups=g)
    return [n.b.squeeze(y, axes=(2,)) if k == 1 else y]


@converts("MaxPool", attrs="auto_pad ceil_mode dilations kernel_shape pads storage_order strides")
@converts("AveragePool", attrs="auto_pad ceil_mode count_include_pad dilations kernel_shape pads strides")
def pool(n: Node) -> list:
    x = n.x(0)
    k = _spatial_rank(n, x)
    kernel = list(n.attr("kernel_shape"))
    strides, dil, pads = _window_attrs(n, x, kernel)
    if n.op_type == "MaxPool" and n.output_used(1):
        raise n.error("output #1 (Indices) is used, but gc does not compute it")
    attrs = {"ceil_mode": bool(n.attr("ceil_mode", 0))}
    if n.op_type == "AveragePool":
        attrs["count_include_pad"] = bool(n.attr("count_include_pad", 0))
    if any(d != 1 for d in dil):
        return [_pool_by_axes(n, x, kernel, strides, dil, pads, attrs)]
    fn = n.b.max_pool2d if n.op_type == "MaxPool" else n.b.avg_pool2d
    if k == 2:
        return [fn(x, kernel=kernel, strides=strides, padding=pads, **attrs)]
    if k == 1:
        y = fn(
            n.b.unsqueeze(x, axes=(2,)),
            kernel=(1, kernel[0]),
            strides=(1, strides[0]),
            padding=(0, pads[0], 0, pads[1]),
            **attrs,
        )
        return [n.b.squeeze(y, axes=(2,))]
    return [_pool3d(n, x, fn, kernel, strides, pads, attrs)]


def _pool3d(n: Node, x: Value, fn: Callable, kernel, strides, pads, attrs: dict) -> Value:
    """A 3-D pool as a reduction over the depth taps, then the 2-D pool over H and W (both max and the
    window sum are separable; an average divides by the depth count as well, a box's count being the
    product of its axes' counts)."""
    nb, c, d, h, wd = x.type.shape
    kd, sd, (d0, d1) = kernel[0], strides[0], (pads[0], pads[3])
    depth = pool_out(d, kd, sd, d0, d1, attrs["ceil_mode"])
    if depth < 1:
        raise n.error(f"the kernel depth {kd} is larger than the padded input depth {d + d0 + d1}")
    n.check_size((kd, depth), "the depth taps")
    end = max(d1, (depth - 1) * sd + kd - (d + d0))  # a ceil-mode window may run past the end padding
    is_max = n.op_type == "MaxPool"
    if d0 or end:
        x = n.b.pad(x, pads=(0, 0, d0, 0, 0, 0, 0, end, 0, 0), value=_pool_fill(n, x.type.dtype))
    taps = _depth_taps(n, x, depth, kd, sd, 1)
    r = (n.b.reduce_max if is_max else n.b.reduce_sum)(taps, axes=(2,))
    y = fn(
        n.b.reshape(r, shape=(nb, c * depth, h, wd)),
        kernel=kernel[1:],
        strides=strides[1:],
        padding=(pads[1], pads[2], pads[4], pads[5]),
        **attrs,
    )
    y = n.b.reshape(y, shape=(nb, c, depth, *y.type.shape[2:]))
    if is_max:
        return y
    lo, hi = (-d0, d + d1) if attrs["count_include_pad"] else (0, d)
    starts = np.arange(depth) * sd - d0
    counts = np.minimum(starts + kd, hi) - np.maximum(starts, lo)
    return n.b.mul(y, n.constant(1 / counts.astype(np.float64).reshape(depth, 1, 1), y.type.dtype))


def _pool_fill(n: Node, dtype: DType) -> float:
    """What padding reads: nothing a max would pick, or zero for a sum."""
    if n.op_type != "MaxPool":
        return 0.0
    return -math.inf if dtype.is_float else float(np.iinfo(dtype.np).min)


def _pool_by_axes(n: Node, x: Value, kernel, strides, dil, pads, attrs: dict, total: bool = False) -> Value:
    """Pooling with dilations (graph's pools have none), one spatial axis at a time: the max or sum over
    the kernel's taps along the axis of the padded input. A box's max and sum are those of its axes in
    turn, and so is an average's count of the cells it covers. `total`: the window sums themselves."""
    k, r = len(kernel), x.type.rank
    is_max = n.op_type == "MaxPool"
    for i, (kk, s, d) in enumerate(zip(kernel, strides, dil)):
        a, size, (lo, hi) = i + 2, x.type.shape[i + 2], (pads[i], pads[k + i])
        span = (kk - 1) * d + 1
        out = pool_out(size, span, s, lo, hi, attrs["ceil_mode"])
        if out < 1:
            raise n.error(f"the dilated kernel {span} is larger than axis {a}'s padded size {size + lo + hi}")
        n.check_size((kk, out), "the window index")
        end = max(hi, (out - 1) * s + span - (size + lo))  # a ceil-mode window may run past the end padding
        if lo or end:
            widths = [0] * 2 * r
            widths[a], widths[r + a] = lo, end
            x = n.b.pad(x, pads=tuple(widths), value=_pool_fill(n, x.type.dtype))
        # One gather reads every window along the axis as [taps, out]; the taps axis is then reduced. The
        # index is the sum of two small constants, which gc folds at compile time, not a big one in the text.
        index = n.b.add(
            n.constant(np.arange(kk)[:, None] * d, DType.i64), n.constant(np.arange(out)[None, :] * s, DType.i64)
        )
        windows = n.b.gather(x, index, axis=a)
        y = (n.b.reduce_max if is_max else n.b.reduce_sum)(windows, axes=(a,))
        if not is_max and not total:
            first, last = (-lo, size + hi) if attrs["count_include_pad"] else (0, size)
            cells = np.arange(out)[None, :] * s - lo + np.arange(kk)[:, None] * d  # [taps, out]
            counts = ((first <= cells) & (cells < last)).sum(axis=0)
            inverse = (1 / counts.astype(np.float64)).reshape((out,) + (1,) * (r - a - 1))
            y = n.b.mul(y, n.constant(inverse, y.type.dtype))
        x = y
    return x


@converts("LpPool", attrs="auto_pad ceil_mode dilations kernel_shape p pads strides")
def lp_pool(n: Node) -> list:
    """The p-norm of each window, (sum of |x|^p)^(1/p), padding reading zero: the window sums of |x|^p
    (x^2 for p = 2, |x| for 1), then the p-th root (sqrt for 2)."""
    x = n.x(0)
    if not x.type.dtype.is_float:
        raise n.error(f"X must be a float tensor, got {x.type}")
    _spatial_rank(n, x)
    kernel = list(n.attr("kernel_shape"))
    strides, dil, pads = _window_attrs(n, x, kernel)
    p = n.attr("p", 2)
    if p < 1:
        raise n.error(f"p = {p} is not a norm: gc takes p >= 1")
    a = n.b.abs(x) if p == 1 else n.b.mul(x, x) if p == 2 else n.b.pow(n.b.abs(x), n.scalar(p, x))
    ceil = bool(n.attr("ceil_mode", 0))
    if len(kernel) == 2 and dil == [1, 1] and not ceil:
        # Without ceil mode every window lies in the padded input: the average counting the padding is
        # the sum over kh * kw cells.
        mean = n.b.avg_pool2d(a, kernel=kernel, strides=strides, padding=pads, count_include_pad=True)
        s = n.b.mul(mean, n.scalar(kernel[0] * kernel[1], x))
    else:
        s = _pool_by_axes(n, a, kernel, strides, dil, pads, {"ceil_mode": ceil, "count_include_pad": True}, total=True)
    return [s if p == 1 else n.b.sqrt(s) if p == 2 else n.b.pow(s, n.scalar(1 / p, x))]


@converts("GlobalAveragePool", "GlobalMaxPool")
def global_pool(n: Node) -> list:
    x = n.x(0)
    if x.type.rank < 3:
        raise n.error(f"X must have rank >= 3 (N, C, spatial...), got {x.type}")
    if x.type.rank == 4 and n.op_type == "GlobalAveragePool":
        return [n.b.global_avg_pool2d(x)]
    fn = n.b.reduce_mean if n.op_type == "GlobalAveragePool" else n.b.reduce_max
    return [fn(x, axes=tuple(range(2, x.type.rank)), keepdims=True)]


# --- normalization ----------------------------------------------------------------------------------------


@converts("BatchNormalization", attrs="epsilon momentum spatial is_test consumed_inputs training_mode")
def batch_norm(n: Node) -> list:
    if n.attr("training_mode", 0):
        raise n.error("training_mode = 1 normalizes with batch statistics; gc imports inference graphs")
    if not n.attr("spatial", 1):
        raise n.error("spatial = 0 (statistics per activation, not per channel) has no graph op")
    x, scale, bias, mean, var = (n.x(i) for i in range(5))
    return [n.b.batch_norm(x, scale, bias, mean, var, epsilon=float(n.attr("epsilon", 1e-5)))]


@converts("InstanceNormalization", attrs="epsilon")
def instance_norm(n: Node) -> list:
    x, scale, bias = n.x(0), n.x(1), n.x(2)
    if x.type.rank < 3:
        raise n.error(f"input must have rank >= 3 (N, C, spatial...), got {x.type}")
    dt, spatial = x.type.dtype, x.type.shape[2:]
    # layer_norm over the spatial axes, then the per-channel scale and bias.
    y = n.b.layer_norm(
        x,
        n.constant(n.full(spatial, 1, dt.np, "the unit scale"), dt),
        n.constant(n.full(spatial, 0, dt.np, "the zero bias"), dt),
        axis=2,
        epsilon=float(n.attr("epsilon", 1e-5)),
    )
    channel = (-1,) + (1,) * (x.type.rank - 2)
    return [n.b.add(n.b.mul(y, n.b.reshape(scale, shape=channel)), n.b.reshape(bias, shape=channel))]


@converts("GroupNormalization", attrs="epsilon num_groups stash_type")
def group_norm(n: Node) -> list:
    x, scale, bias = n.x(0), n.x(1), n.x(2)
    g = n.attr("num_groups")
    if g < 1 or x.type.rank < 3 or x.type.shape[1] % g:
        raise n.error(f"input {x.type} must have rank >= 3 and channels divisible by num_groups {g}")
    shape, dt = x.type.shape, x.type.dtype
    c = shape[1]
    rest = math.prod(shape[2:]) * (c // g)
    # layer_norm over each group's channels and pixels, then the per-channel scale and bias.
    ones, zeros = (n.constant(n.full((rest,), v, dt.np, "the group's scale"), dt) for v in (1, 0))
    y = n.b.layer_norm(n.b.reshape(x, shape=(shape[0], g, rest)), ones, zeros, epsilon=float(n.attr("epsilon", 1e-5)))
    y = n.b.reshape(y, shape=shape)
    if n.opset < 21:  # scale and bias per group until opset 21, per channel since
        scale, bias = (n.b.reshape(n.b.broadcast_to(n.b.reshape(t, shape=(g, 1)), shape=(g, c // g)), shape=(c,))
                       for t in (scale, bias))  # fmt: skip
    channel = (c,) + (1,) * (x.type.rank - 2)
    return [n.b.add(n.b.mul(y, n.b.reshape(scale, shape=channel)), n.b.reshape(bias, shape=channel))]


@converts("LayerNormalization", attrs="axis epsilon stash_type")
def layer_norm(n: Node) -> list:
    x, scale = n.x(0), n.x(1)
    axis = _axis(n, n.attr("axis", -1), x.type.rank)
    dims = x.type.shape[axis:]
    if scale.type.shape != dims:
        scale = n.b.broadcast_to(scale, shape=dims)
    bias = n.x(2) if n.has(2) else n.constant(n.full(dims, 0, x.type.dtype.np, "the zero bias"), x.type.dtype)
    if bias.type.shape != dims:
        bias = n.b.broadcast_to(bias, shape=dims)
    eps = float(n.attr("epsilon", 1e-5))
    y = n.b.layer_norm(x, scale, bias, axis=axis, epsilon=eps)
    if not (n.output_used(1) or n.output_used(2)):
        return [y]
    # The statistics, where a later node reads them (a training graph's backward pass): computed apart,
    # in the stash type, which is their type (the schema's U; onnx's Python reference alone gives X's).
    xs, axes = _stashed(n, x), tuple(range(axis, x.type.rank))
    mean = n.b.reduce_mean(xs, axes=axes, keepdims=True)
    d = n.b.sub(xs, mean)
    inv = n.b.rsqrt(n.b.add(n.b.reduce_mean(n.b.mul(d, d), axes=axes, keepdims=True), n.scalar(eps, d)))
    return [y, mean, inv]


def _stashed(n: Node, x: Value) -> Value:
    """x in the precision a normalization's statistics are computed in (stash_type 1: float32; a float64
    x keeps its own, as onnx's reference does)."""
    if n.attr("stash_type", 1) != 1:
        raise n.error(f"stash_type {n.attr('stash_type')} is not supported (only 1: float32)")
    return x if x.type.dtype == DType.f64 else _as(n, x, DType.f32)


def _as(n: Node, v: Value, dtype: DType) -> Value:
    """v cast to `dtype`, unless it has it already."""
    return v if v.type.dtype == dtype else n.b.cast(v, dtype=dtype)


@converts("RMSNormalization", attrs="axis epsilon stash_type")
def rms_norm(n: Node) -> list:
    """x / sqrt(mean(x^2 over axis..) + epsilon) * scale (opset 23), the scale broadcast as NumPy does."""
    x = n.x(0)
    axis = _axis(n, n.attr("axis", -1), x.type.rank)
    xs = _stashed(n, x)
    ms = n.b.reduce_mean(n.b.mul(xs, xs), axes=tuple(range(axis, x.type.rank)), keepdims=True)
    y = n.b.mul(xs, n.b.rsqrt(n.b.add(ms, n.scalar(float(n.attr("epsilon", 1e-5)), ms))))
    return [n.b.mul(_as(n, y, x.type.dtype), n.x(1))]


@converts("LRN", attrs="size alpha beta bias")
def lrn(n: Node) -> list:
    return [
        n.b.lrn(
            n.x(0),
            size=n.attr("size"),
            alpha=float(n.attr("alpha", 1e-4)),
            beta=float(n.attr("beta", 0.75)),
            bias=float(n.attr("bias", 1.0)),
        )
    ]


@converts("Softmax", "LogSoftmax", attrs="axis")
def softmax(n: Node) -> list:
    x = n.x(0)
    fn = n.b.softmax if n.op_type == "Softmax" else n.b.log_softmax
    if n.opset >= 13:
        return [fn(x, axis=n.attr("axis", -1))]
    # Before opset 13: x as a 2-D matrix split at axis, normalized along its rows.
    shape = x.type.shape
    axis = _axis(n, n.attr("axis", 1), x.type.rank)
    if axis == x.type.rank - 1:
        return [fn(x, axis=-1)]
    rows = n.b.reshape(x, shape=(math.prod(shape[:axis]), math.prod(shape[axis:])))
    return [n.b.reshape(fn(rows, axis=-1), shape=shape)]


@converts("Dropout", attrs="is_test ratio seed consumed_inputs")
def dropout(n: Node) -> list:
    if n.has(2) and n.ints(2, "training_mode") != (0,):
        raise n.error("training_mode = true drops at random; gc imports inference graphs")
    mask = n.full(n.type(0).shape, True, bool, "the mask") if n.output_used(1) else None
    return [n.passthrough(0), mask]


@converts("Identity")
def identity(n: Node) -> list:
    return [n.passthrough(0)]


# --- reductions -------------------------------------------------------------------------------------------

_REDUCE = ["ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
           "ReduceLogSum", "ReduceLogSumExp"]  # fmt: skip


@converts(*_REDUCE, attrs="axes keepdims noop_with_empty_axes")
def reduce(n: Node) -> list:
    x = n.x(0)
    since = 13 if n.op_type == "ReduceSum" else 18  # the opset from which axes are an input
    runtime = n.opset >= since and n.has(1) and n.known(1) is None and n.type(1).size > 0
    if runtime:  # axes fed when the model is called: an attribute taken at run time, {axes = %axes}
        axes = n.runtime(1, "axes")
    elif n.opset >= since and n.has(1) and n.known(1) is None:
        axes = ()  # fed at run time, but empty: its type says so
    else:
        axes = (n.ints(1, "axes") if n.has(1) else None) if n.opset >= since else n.attr("axes", None)
    if not axes and n.attr("noop_with_empty_axes", 0):
        return [x]
    attrs = {"keepdims": bool(n.attr("keepdims", 1))}
    if axes:
        attrs["axes"] = axes if runtime else tuple(axes)
    b, op = n.b, n.op_type

    def red(kind: str, v: Value, keep: bool = attrs["keepdims"]) -> Value:
        at = {**attrs, "keepdims": keep}
        if not runtime:
            return getattr(b, "reduce_" + kind)(v, **at)
        # Which axes go is known at the call: every size that is not 1 may become 1 (or go).
        shape = tuple(d if d == 1 else DYN for d in v.type.shape) if keep else (DYN,) * (v.type.rank - n.type(1).size)
        return getattr(b, "reduce_" + kind)(v, result_types=[TensorType(shape, v.type.dtype)], **at)

    if op in ("ReduceMax", "ReduceMin") and x.type.dtype.is_bool:  # any / all, in u8 (0 over no elements for max, 255 for min)
        return [b.cast(red(op[6:].lower(), b.cast(x, dtype=DType.u8)), dtype=DType.i1)]
    if op in ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin"):
        return [red(op[6:].lower(), x)]
    if op == "ReduceL1":
        return [red("sum", b.abs(x))]
    if op in ("ReduceL2", "ReduceSumSquare"):
        y = red("sum", b.mul(x, x))
        return [b.sqrt(y) if op == "ReduceL2" else y]
    if op == "ReduceLogSum":
        return [b.log(red("sum", x))]
    # log(sum(exp(x - max))) + max, which cannot overflow.
    top = red("max", x, True)
    y = b.log(red("sum", b.exp(b.sub(x, top))))
    return [b.add(y, top if attrs["keepdims"] else red("max", x))]


@converts("ArgMax", "ArgMin", attrs="axis keepdims select_last_index")
def argmax(n: Node) -> list:
    x = n.x(0)
    if n.op_type == "ArgMin":
        x = n.b.neg(x)
    axis, keep = n.attr("axis", 0), bool(n.attr("keepdims", 1))
    if not n.attr("select_last_index", 0):
        return [n.b.argmax(x, axis=axis, keepdims=keep)]
    # The last maximum is the first of the reversed axis, counted from the end.
    a = _axis(n, axis, x.type.rank)
    d = x.type.shape[a]
    rev = n.b.slice(x, starts=(-1,), ends=(-d - 1,), axes=(a,), steps=(-1,))
    return [n.b.sub(n.constant(np.array(d - 1), DType.i64), n.b.argmax(rev, axis=a, keepdims=keep))]


@converts("CumSum", "CumProd", attrs="exclusive reverse")
def cumulative(n: Node) -> list:
    """graph.cumsum (graph.cumprod) along the axis, a constant at import; an axis computed at run time (the node
    tests feed it so) takes the running sum (product) along each axis the rank allows and picks the one named
    (one for a 1-D x)."""
    x = n.x(0)
    r = x.type.rank
    run = getattr(n.b, n.op_type.lower())
    if r == 0:
        raise n.error(f"cannot take a running {'sum' if n.op_type == 'CumSum' else 'product'} of the scalar {x.type}")
    flags = {"exclusive": bool(n.attr("exclusive", 0)), "reverse": bool(n.attr("reverse", 0))}
    if n.type(1).size != 1 or n.type(1).dtype not in (DType.i32, DType.i64):
        raise n.error(f"the axis must be one i32 or i64, got {n.type(1)}")
    if n.known(1) is not None:
        return [run(x, axis=_axis(n, n.ints(1, "axis")[0], r), **flags)]
    if r == 1:  # 0 and -1 are the only axes there are
        return [run(x, axis=0, **flags)]
    axis = n.b.reshape(n.b.cast(n.x(1), dtype=DType.i64), shape=())
    axis = n.b.where(n.b.less(axis, n.constant(np.array(0), DType.i64)),
                     n.b.add(axis, n.constant(np.array(r), DType.i64)), axis)  # fmt: skip
    y = run(x, axis=r - 1, **flags)  # an axis out of range gets the last one's
    for a in reversed(range(r - 1)):
        y = n.b.where(n.b.equal(axis, n.constant(np.array(a), DType.i64)), run(x, axis=a, **flags), y)
    return [y]


@converts("EyeLike", attrs="dtype k")
def eye_like(n: Node) -> list:
    """A constant: ones on the k-th diagonal of the input's (static, 2-D) shape, of `dtype` or the input's type."""
    t = n.type(0)
    if t.rank != 2 or not static(t.shape):
        raise n.error(f"the input must be 2-D with static sizes, got {t}")
    dtype = n.dense_dtype(n.attr("dtype")) if "dtype" in n.attrs else t.dtype
    n.check_size(t.shape, "the output")
    return [n.constant(np.eye(t.shape[0], t.shape[1], k=int(n.attr("k", 0))), dtype)]


@converts("OneHot", attrs="axis")
def one_hot(n: Node) -> list:
    """values[1] where an index (negative ones wrapped once by depth) equals the position along the new axis,
    values[0] elsewhere (out of range: everywhere): `equal` with the positions 0..depth-1, then `where`. The
    depth must be known at import time; indices and values may come at run time."""
    idx = n.x(0)
    depth_arr = n.const(1, "depth")
    if depth_arr.size != 1:
        raise n.error(f"depth must hold one number, got shape {list(depth_arr.shape)}")
    depth_f = float(depth_arr.reshape(-1)[0])
    if not math.isfinite(depth_f) or depth_f < 1:
        raise n.error(f"depth must be a positive number, got {depth_arr.reshape(-1)[0]}")
    depth = int(depth_f)
    if n.type(2).shape != (2,):
        raise n.error(f"values must be [off_value, on_value] (2 elements), got {n.type(2)}")
    rank = idx.type.rank
    axis = _axis(n, n.attr("axis", -1), rank + 1)
    shape = list(idx.type.shape)
    shape.insert(axis, depth)
    n.check_size([d if isinstance(d, int) else 1 for d in shape], "the output")
    dt = idx.type.dtype
    if not dt.is_unsigned:  # wrap -depth..-1
        if not dt.is_float and depth > np.iinfo(dt.np).max:
            idx = n.b.cast(idx, dtype=DType.i64)
            dt = DType.i64
        idx = n.b.where(n.b.less(idx, n.scalar(0, idx)), n.b.add(idx, n.constant(np.array(depth), dt)), idx)
    positions = np.arange(depth).reshape([depth if i == axis else 1 for i in range(rank + 1)])
    if not dt.is_float and depth - 1 > np.iinfo(dt.np).max:
        idx, dt = n.b.cast(idx, dtype=DType.i64), DType.i64
    hot = n.b.equal(n.b.unsqueeze(idx, axes=(axis,)), n.constant(positions, dt))
    values = n.x(2)
    off = n.b.reshape(n.b.slice(values, starts=(0,), ends=(1,), axes=(0,)), shape=())
    on = n.b.reshape(n.b.slice(values, starts=(1,), ends=(2,), axes=(0,)), shape=())
    return [n.b.where(hot, on, off)]


@converts("Hardmax", attrs="axis")
def hardmax(n: Node) -> list:
    """1 at the first maximum along the axis, 0 elsewhere: argmax compared with the axis's positions. Before
    opset 13 the input is seen as 2-D, [dims before axis, dims from axis] (default axis 1)."""
    x = n.x(0)
    rank = x.type.rank
    axis = _axis(n, n.attr("axis", -1 if n.opset >= 13 else 1), rank)
    y = x if n.opset >= 13 else n.b.flatten(x, axis=axis)
    a = axis if n.opset >= 13 else 1
    d = y.type.shape[a]
    positions = n.constant(np.arange(d).reshape([d if i == a else 1 for i in range(y.type.rank)]), DType.i64)
    hot = n.b.cast(n.b.equal(n.b.argmax(y, axis=a, keepdims=True), positions), dtype=x.type.dtype)
    return [hot if n.opset >= 13 else n.b.reshape(hot, shape=x.type.shape)]


@converts("Einsum", attrs="equation")
def einsum(n: Node) -> list:
    """Each operand's letters that appear nowhere else are summed first; two operands that share a summed
    letter are a batched `matmul` ([batch, m, k] @ [batch, k, n] after transposes and reshapes); otherwise the
    operands, transposed and given size-1 axes for the letters they lack, are multiplied with broadcasting
    and the remaining letters summed. An ellipsis stands for axes of its own (right-aligned across the operands,
    broadcast where one has size 1); a letter repeated in one operand takes that operand's diagonal first (a
    `gather` of the flattened pair of axes)."""
    xs = list(n.xs())
    terms, out = _einsum_terms(n, str(n.attr("equation")), [x.type.rank for x in xs])
    size: dict[str, int] = {}
    for i, (t, x) in enumerate(zip(terms, xs)):
        xs[i], t = _einsum_diagonal(n, x, t)
        terms[i] = t
        for c, d in zip(t, xs[i].type.shape):
            if c in _ELLIPSIS and size.get(c, 1) == 1:
                size[c] = d
            elif size.setdefault(c, d) != d and not (c in _ELLIPSIS and d == 1):
                raise n.error(f"{'an axis of the ellipsis' if c in _ELLIPSIS else f'letter {c!r}'} stands for sizes "
                              f"{size[c]} and {d}")
    for i, (t, x) in enumerate(zip(terms, xs)):  # an ellipsis axis of size 1 beside a larger one: broadcast it
        want = tuple(size[c] for c in t)
        if want != tuple(x.type.shape):
            xs[i] = n.b.broadcast_to(x, shape=list(want))
    for i, t in enumerate(terms):  # letters only this operand has and the output lacks: sum them now
        own = [a for a, c in enumerate(t) if c not in out and all(c not in u for j, u in enumerate(terms) if j != i)]
        if own:
            xs[i] = n.b.reduce_sum(xs[i], axes=tuple(own))
            terms[i] = "".join(c for c in t if c not in [t[a] for a in own])
    summed = [c for c in dict.fromkeys("".join(terms)) if c not in out]
    if len(xs) == 2 and summed:
        return [_einsum_matmul(n, xs, terms, out, summed, size)]
    order = out + "".join(summed)
    y = None
    for x, t in zip(xs, terms):
        mine = [c for c in order if c in t]
        if mine != list(t):
            x = n.b.transpose(x, perm=tuple(t.index(c) for c in mine))
        if len(mine) != len(order):
            x = n.b.reshape(x, shape=tuple(size[c] if c in t else 1 for c in order))
        y = x if y is None else n.b.mul(y, x)
    # Every output letter is some operand's, so the broadcast product has the output's sizes.
    return [n.b.reduce_sum(y, axes=tuple(range(len(out), len(order)))) if summed else y]


_ELLIPSIS = "".join(chr(0x3B1 + i) for i in range(25))  # internal letters for an ellipsis' axes (Greek)


def _einsum_terms(n: Node, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' terms and the output's, each ellipsis written as letters of _ELLIPSIS: the last axes of
    the longest ellipsis, right-aligned as broadcasting aligns them."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise n.error(f"equation '{equation}' names {len(terms)} operands, the node has {len(ranks)}")
    for t in [*terms, out]:
        if not all(c.isascii() and c.isalpha() for c in t.replace("...", "", 1)):
            raise n.error(f"equation '{equation}': terms are letters (a-z, A-Z) and at most one ellipsis ('...')")
    spans = []
    for t, r in zip(terms, ranks):
        named = len(t.replace("...", ""))
        if "..." not in t and named != r or named > r:
            raise n.error(f"the equation's term '{t}' names {named} axes, but its operand has rank {r}")
        spans.append(r - named if "..." in t else 0)
    most = max(spans, default=0)
    if most > len(_ELLIPSIS):
        raise n.error(f"equation '{equation}': an ellipsis of {most} axes; gc takes at most {len(_ELLIPSIS)}")
    terms = [t.replace("...", _ELLIPSIS[most - k : most]) for t, k in zip(terms, spans)]
    letters = "".join(terms)
    if not arrow:  # implicit output: the ellipsis' axes, then the letters seen once, in alphabetical order
        out = _ELLIPSIS[:most] + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in _ELLIPSIS))
    out = out.replace("...", _ELLIPSIS[:most])
    if len(set(out)) != len(out) or any(c not in letters for c in out):
        raise n.error(f"equation '{equation}': the output '{out}' must name distinct letters of the operands")
    return terms, out


def _einsum_diagonal(n: Node, x: Value, t: str) -> tuple[Value, str]:
    """x with each letter repeated in its term t reduced to one axis, the diagonal: the two axes moved last,
    flattened, and the elements at i * (d + 1) gathered. Returns the new operand and its term."""
    while len(set(t)) != len(t):
        c = next(c for c in t if t.count(c) > 1)
        i = t.index(c)
        j = t.index(c, i + 1)
        d, e = x.type.shape[i], x.type.shape[j]
        if d != e or not isinstance(d, int):
            raise n.error(f"letter '{c}' repeated in one term (a diagonal) stands for sizes {d} and {e}")
        rest = [a for a in range(len(t)) if a not in (i, j)]
        if rest + [i, j] != list(range(len(t))):
            x = n.b.transpose(x, perm=tuple(rest + [i, j]))
        x = n.b.reshape(x, shape=tuple(x.type.shape[: len(rest)]) + (d * d,))
        x = n.b.gather(x, n.constant(np.arange(d) * (d + 1), DType.i64), axis=len(rest))
        t = "".join(t[a] for a in rest) + c
    return x, t


def _einsum_matmul(n: Node, xs: list[Value], terms: list[str], out: str, summed: list[str], size: dict) -> Value:
    """Two operands as [batch, m, k] @ [batch, k, n]: batch letters are in both and the output, m only in the
    first, n only in the second, k (summed) in both."""
    (a, ta), (b, tb) = zip(xs, terms)
    batch = [c for c in out if c in ta and c in tb]
    m, nn = [c for c in out if c not in tb], [c for c in out if c not in ta]
    k = summed

    def arranged(x: Value, t: str, groups: list[list[str]]) -> Value:
        mine = [c for g in groups for c in g]
        if mine != list(t):
            x = n.b.transpose(x, perm=tuple(t.index(c) for c in mine))
        return n.b.reshape(x, shape=tuple(int(np.prod([size[c] for c in g], dtype=np.int64)) for g in groups))

    y = n.b.matmul(arranged(a, ta, [batch, m, k]), arranged(b, tb, [batch, k, nn]))
    have = batch + m + nn
    y = n.b.reshape(y, shape=tuple(size[c] for c in have))
    return y if have == list(out) else n.b.transpose(y, perm=tuple(have.index(c) for c in out))


# --- shapes -----------------------------------------------------------------------------------------------


@converts("Flatten", attrs="axis")
def flatten(n: Node) -> list:
    return [n.b.flatten(n.x(0), axis=n.attr("axis", 1))]


def _reshape_target(n: Node, shape: tuple[int, ...], want: tuple[int, ...], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's shape resolved to sizes: 0 copies the input's size there (unless allowzero), -1 is
    what is left."""
    out = []
    for i, d in enumerate(want):
        if d == 0 and not allowzero:
            if i >= len(shape):
                raise n.error(
                    f"shape {list(want)}: 0 at position {i} copies a size, but the input has rank {len(shape)}"
                )
            d = shape[i]
        elif d < -1:
            raise n.error(f"shape {list(want)} has a negative size {d}")
        out.append(d)
    total = math.prod(shape)
    if out.count(-1) > 1:
        raise n.error(f"shape {list(want)} has more than one -1")
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or total % rest:
            raise n.error(f"cannot reshape {list(shape)} ({total} elements) to {list(want)}")
        out[out.index(-1)] = total // rest
    if math.prod(out) != total:
        raise n.error(f"cannot reshape {list(shape)} ({total} elements) to {list(want)} ({math.prod(out)} elements)")
    return tuple(out)


def _entries(n: Node, v: Value) -> list:
    """The elements of a rank-1 integer value computed at run time, each an int where the import knows it
    (a Concat of sizes read at each call and constant pieces, as exporters build a Reshape's shape), else
    `?`: what stays static in the types of an op that takes the value at run time."""
    folded = n.imp.folded.get(v)
    if folded is not None:
        return [int(e) for e in folded.reshape(-1)]
    op = v.owner
    if isinstance(op, Concat) and all(u.type.rank == 1 and u.type.is_static for u in op.operands):
        return [e for u in op.operands for e in _entries(n, u)]
    return [DYN] * v.type.size


def _named(n: Node, v: Value, what: str) -> ArgValue:
    """`v` named, for an attribute that takes it at run time."""
    v.name = n.imp.name(f"{n.proto.output[0]}_{what}")
    return ArgValue(v.name)


def _ones(n: Node, sizes: ArgValue, shape: tuple, dtype: DType) -> Value:
    """Ones of the shape that the value `sizes` holds at each call (typed `shape`): what the run-time forms
    count coordinates with."""
    return _runtime_op(n, "broadcast_to", [n.constant(np.array(1), dtype)], {"shape": sizes}, [shape], dtype)


def _coordinates(n: Node, ones: Value, axis: int) -> Value:
    """Each element's index along `axis` (0, 1, 2, ...), in the shape and dtype of `ones`."""
    return n.b.iota(ones, axis=axis)


def _runtime_op(n: Node, short: str, operands: list, attrs: dict, shapes: list, dtype: DType, many: bool = False):
    """graph.<short> with an attribute taken at run time from an input of the model (`{shape = %shape}`): its
    results typed here, `?` where the value decides the size; the function is specialized to each call's values."""
    out = getattr(n.b, short)(*operands, result_types=[TensorType(tuple(s), dtype) for s in shapes], **attrs)
    return list(out) if many else out


@converts("Reshape", attrs="shape allowzero consumed_inputs")
def reshape(n: Node) -> list:
    x = n.x(0)
    if n.opset >= 5 and n.known(1) is None and (not n.attr("allowzero", 0) or n.x(1).owner is not None):
        # The shape fed when the model is called: graph.reshape reads 0 and -1 as ONNX does (allowzero = 0).
        shape = n.runtime(1, "shape")
        if n.attr("allowzero", 0):
            # allowzero = 1 (torch's exporter): a 0 is an empty axis, which graph.reshape would read as "keep
            # the input's size". A shape computed from sizes holds a 0 only for an empty tensor: such a call is
            # an error (a size of -2), never a different result. (A shape fed as an input: not taken.)
            s = n.x(1)
            shape = _named(n, n.b.where(n.b.equal(s, n.constant(np.array(0), s.type.dtype)),
                                        n.constant(np.array(-2), s.type.dtype), s), "shape")
        dims = [DYN if d in (-1, 0) else d for d in _entries(n, n.x(1))]  # (0 keeps a size: which, at each call)
        return [_runtime_op(n, "reshape", [x], {"shape": shape}, [dims], x.type.dtype)]
    want = tuple(n.attr("shape")) if n.opset < 5 else n.ints(1, "shape")
    if not x.type.is_static and not (n.attr("allowzero", 0) and 0 in want):
        return [n.b.reshape(x, shape=want)]  # (graph.reshape's rule carries the `?` sizes: 0 keeps, -1 infers)
    target = _reshape_target(n, x.type.shape, want, bool(n.attr("allowzero", 0)))
    if 0 in target:  # empty: graph.reshape would read a 0 as "keep the input's size"
        return [n.constant(n.full(target, 0, x.type.dtype.np, "the empty result"), x.type.dtype)]
    return [x if target == x.type.shape else n.b.reshape(x, shape=target)]


@converts("Expand")
def expand(n: Node) -> list:
    x = n.x(0)
    if n.known(1) is None:  # a shape computed at run time (from a Shape): the sizes known stay known
        rank = max(x.type.rank, n.type(1).size)
        mine = [1] * (rank - x.type.rank) + list(x.type.shape)
        theirs = [1] * (rank - n.type(1).size) + _entries(n, n.x(1))

        def size(d, e):  # ONNX's bidirectional broadcast of x's size d and the shape's entry e
            if known(e) and e >= 0:
                return d if e == 1 else e
            return d if known(d) and d != 1 else DYN

        dims = [size(d, e) for d, e in zip(mine, theirs)]
        return [_runtime_op(n, "broadcast_to", [x], {"shape": n.runtime(1, "shape")}, [dims], x.type.dtype)]
    y = n.b.broadcast_to(x, shape=n.ints(1, "shape"))
    return [x if y.type.shape == x.type.shape else y]


@converts("Tile")
def tile(n: Node) -> list:
    x = n.x(0)
    reps = n.ints(1, "repeats")
    shape = x.type.shape
    if len(reps) != len(shape):
        raise n.error(f"repeats {list(reps)} must have one entry per axis of {x.type}")
    if all(r == 1 for r in reps):
        return [x]
    # [d0, d1] -> [1, d0, 1, d1] -> [r0, d0, r1, d1] -> [r0*d0, r1*d1]: each axis repeated whole.
    spread = n.b.reshape(x, shape=tuple(v for d in shape for v in (1, d)))
    big = n.b.broadcast_to(spread, shape=tuple(v for r, d in zip(reps, shape) for v in (r, d)))
    return [n.b.reshape(big, shape=tuple(r * d for r, d in zip(reps, shape)))]


@converts("DepthToSpace", "SpaceToDepth", attrs="blocksize mode")
def depth_to_space(n: Node) -> list:
    x = n.x(0)
    b = n.attr("blocksize")
    if b < 1:
        raise n.error(f"blocksize must be positive, got {b}")
    if x.type.rank != 4:
        raise n.error(f"input must be 4-D NCHW, got {x.type}")
    nb, c, h, w = x.type.shape
    if n.op_type == "SpaceToDepth":
        if h % b or w % b:
            raise n.error(f"height {h} and width {w} must be divisible by blocksize {b}")
        # DCR (the default): the block position is the outer part of the new channel; CRD: the inner.
        perm = (0, 3, 5, 1, 2, 4) if n.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
        y = n.b.transpose(n.b.reshape(x, shape=(nb, c, h // b, b, w // b, b)), perm=perm)
        return [n.b.reshape(y, shape=(nb, c * b * b, h // b, w // b))]
    if c % (b * b):
        raise n.error(f"channels {c} must be divisible by blocksize^2 = {b * b}")
    if n.attr("mode", "DCR") == "DCR":  # depth, column, row: the block index is the outer part of the channel
        y = n.b.transpose(n.b.reshape(x, shape=(nb, b, b, c // (b * b), h, w)), perm=(0, 3, 4, 1, 5, 2))
    else:
        y = n.b.transpose(n.b.reshape(x, shape=(nb, c // (b * b), b, b, h, w)), perm=(0, 1, 4, 2, 5, 3))
    return [n.b.reshape(y, shape=(nb, c // (b * b), h * b, w * b))]


def _nearest_index(n: Node, size: int, out: int, scale: float, mode: str, rounding: str) -> np.ndarray:
    """The input index that each of `out` positions reads, ONNX Resize's nearest-neighbour rule."""
    j = np.arange(out, dtype=np.float64)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and out > 1):
        x = (j + 0.5) / scale - 0.5
    elif mode == "pytorch_half_pixel":
        x = np.zeros(out)
    elif mode == "align_corners":
        x = j * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    elif mode == "asymmetric":
        x = j / scale
    elif mode == "tf_half_pixel_for_nn":
        x = (j + 0.5) / scale
    else:
        raise n.error(f"coordinate_transformation_mode '{mode}' is not supported")
    frac = x - np.floor(x)
    if rounding == "floor":
        i = np.floor(x)
    elif rounding == "ceil":
        i = np.ceil(x)
    elif rounding in ("round_prefer_floor", "round_prefer_ceil"):
        tie_up = rounding == "round_prefer_ceil"
        i = np.where(frac == 0.5, np.floor(x) + tie_up, np.floor(x + 0.5))
    else:
        raise n.error(f"nearest_mode '{rounding}' is not supported")
    return np.clip(i, 0, size - 1).astype(np.int64)


def _source_coordinates(
    n: Node, mode: str, size: int, out: int, scale: float, roi
) -> tuple[np.ndarray, np.ndarray | None]:
    """Where in the input (a float index) each of `out` positions lies, ONNX Resize's coordinate transformation
    (the reference's `_compute_x_ori`), and for tf_crop_and_resize which positions fall outside the input."""
    y, width = np.arange(out, dtype=np.float64), scale * size
    outside = None
    if mode == "align_corners":
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        start, end = roi
        x = np.full(out, (end - start) * (size - 1) / 2) if width == 1 else y * (end - start) * (size - 1) / (width - 1)
        x = x + start * (size - 1)
        outside = (x < 0) | (x > size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        x = size / 2 * (1 - out / width) + (y + 0.5) / scale - 0.5
    else:
        raise n.error(f"coordinate_transformation_mode '{mode}' is not supported")
    return x, outside


def _linear_taps(ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
    if not antialias:
        return np.array([1 - ratio, ratio])
    scale = min(scale, 1.0)  # antialiasing widens the filter only when downsampling
    start = int(np.floor(-1 / scale) + 1)
    c = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * scale), 0, 1)
    return c / c.sum()


def _cubic_taps(ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
    def kernel(t: float) -> float:
        t = abs(t)
        if t <= 1:
            return (a + 2) * t**3 - (a + 3) * t**2 + 1
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a if t < 2 else 0.0

    if not antialias:  # the reference's own expressions, term for term
        r, q = ratio, 1 - ratio
        return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                         ((a + 2) * r - (a + 3)) * r * r + 1, ((a + 2) * q - (a + 3)) * q * q + 1,
                         ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a])  # fmt: skip
    scale = min(scale, 1.0)
    start = int(np.floor(-2 / scale) + 1)
    c = np.array([kernel(scale * (i - ratio)) for i in range(start, 2 - start)])
    return c / c.sum()


def _interpolation(n: Node, size: int, out: int, scale: float, coords: str, roi, taps, exclude_outside: bool):
    """For one resized axis: the input indices [out, taps] each output position weighs, their weights (float64,
    as ONNX's reference computes them: `_interpolate_1d_along_axis`) and the positions outside the crop."""
    x, outside = _source_coordinates(n, coords, size, out, scale, roi)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)  # in (0, 1]: the neighbour on the left is preferred
    coeffs = np.stack([taps(float(r), scale) for r in ratios]) if out else np.zeros((0, 2))
    k = coeffs.shape[1]
    pad = int(np.ceil(k / 2))
    padded = x + pad
    p = np.floor(padded)
    frac = padded - p
    if k % 2 == 0:
        offset = np.where(frac == 0, -(k // 2), -(k // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((k - 1) // 2), -((k - 1) // 2) + 1)
    index = (p + offset).astype(np.int64)[:, None] + np.arange(k)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((index < 0) | (index >= size), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, size - 1), coeffs, outside


def _interpolate_axis(n: Node, x: Value, axis: int, index: np.ndarray, coeffs: np.ndarray) -> Value:
    """x resized along `axis`: each output row the weighted sum of the input rows `index` names. Up to four taps
    (linear, cubic) as a gather and a multiply per tap; more (antialiasing) as a matmul with the [in, out]
    matrix of the weights."""
    r, dt = x.type.rank, x.type.dtype
    size, (out, k) = x.type.shape[axis], coeffs.shape
    if k > 4:
        w = np.zeros((size, out))
        np.add.at(w, (index, np.arange(out)[:, None]), coeffs)
        perm = tuple(a for a in range(r) if a != axis) + (axis,)
        y = x if axis == r - 1 else n.b.transpose(x, perm=perm)
        y = n.b.matmul(y, n.constant(w, dt))
        return y if axis == r - 1 else n.b.transpose(y, perm=tuple(int(i) for i in np.argsort(perm)))
    along = (out,) + (1,) * (r - axis - 1)  # the weights broadcast along the axis
    y = None
    for t in range(k):
        term = n.b.mul(n.b.gather(x, n.constant(index[:, t], DType.i64), axis=axis),
                       n.constant(coeffs[:, t].reshape(along), dt))  # fmt: skip
        y = term if y is None else n.b.add(y, term)
    return y


@converts("Resize", "Upsample", attrs="mode coordinate_transformation_mode nearest_mode cubic_coeff_a "
          "exclude_outside extrapolation_value scales axes antialias keep_aspect_ratio_policy")  # fmt: skip
def resize(n: Node) -> list:
    """Resizing per resized axis: nearest as a gather of the source rows; linear and cubic as the weighted sum
    of 2 or 4 gathered rows (weights and indices computed at import in float64, as ONNX's reference), or with
    antialias a matmul with the weight matrix."""
    x = n.x(0)
    r, shape = x.type.rank, x.type.shape
    mode = n.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise n.error(f"mode '{mode}' is not supported (only nearest, linear, cubic)")
    policy = "stretch"
    if n.op_type == "Upsample":
        scales = n.attr("scales", None) if n.opset < 9 else n.const(1, "scales")
        sizes, coords, rounding = None, "asymmetric", "floor"
    else:
        scale_input, size_input = (2, 3) if n.opset >= 11 else (1, None)
        scales = n.const(scale_input, "scales") if n.has(scale_input) else None
        sizes = n.ints(size_input, "sizes") if size_input and n.has(size_input) else None
        # Opset 10's Resize is opset 9's Upsample: no coordinate or rounding modes yet.
        coords = n.attr("coordinate_transformation_mode", "half_pixel" if n.opset >= 11 else "asymmetric")
        rounding = n.attr("nearest_mode", "round_prefer_floor" if n.opset >= 11 else "floor")
        policy = n.attr("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise n.error(f"keep_aspect_ratio_policy '{policy}' is not supported")
    if mode != "nearest" and not x.type.dtype.is_float:
        raise n.error(f"mode '{mode}' of {x.type.dtype} is not supported (only floats)")
    antialias = bool(n.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise n.error("antialias needs mode linear or cubic")
    axes = [_axis(n, a, r) for a in n.attr("axes", range(r))]
    if len(set(axes)) != len(axes):
        raise n.error(f"axes {axes} name an axis twice")
    given = sizes if sizes is not None else scales if scales is not None and np.size(scales) else None
    if given is None:
        raise n.error("needs scales or sizes")
    given, what = [float(v) for v in np.reshape(given, -1)], "sizes" if sizes is not None else "scales"
    if len(given) != len(axes):
        raise n.error(f"{what} {given} must have one entry per resized axis, {len(axes)}")
    if not all(math.isfinite(v) and v > 0 for v in given):
        raise n.error(f"{what} {given} must be positive")
    if any(shape[a] == 0 for a in axes):
        raise n.error(f"cannot resize the empty axes of {x.type}")
    if sizes is not None:
        outs = dict(zip(axes, sizes))
        factors = {a: outs[a] / shape[a] for a in axes}
        if policy != "stretch":  # one scale for every axis, the sizes rounded half up from it
            one = (min if policy == "not_larger" else max)(factors.values())
            factors = dict.fromkeys(axes, one)
            outs = {a: int(one * shape[a] + 0.5) for a in axes}
    else:
        factors = dict(zip(axes, given))
        outs = {a: math.floor(shape[a] * f) for a, f in factors.items()}
    if any(outs[a] < 1 for a in axes):
        raise n.error(f"output sizes {[outs[a] for a in axes]} must be positive")
    for a in axes:
        n.check_size((outs[a],), f"the index of axis {a}")
    rois = dict.fromkeys(axes)
    if mode != "nearest" and coords == "tf_crop_and_resize":
        roi = n.const(1, "roi") if n.has(1) else None
        if roi is None or np.size(roi) != 2 * len(axes):
            raise n.error(f"tf_crop_and_resize needs a roi of {2 * len(axes)} values, a start and an end per axis")
        roi = np.reshape(roi, -1).astype(np.float64)
        rois = {a: (roi[i], roi[len(axes) + i]) for i, a in enumerate(axes)}
    if mode == "nearest":
        for a in axes:
            if outs[a] == shape[a] and factors[a] == 1.0:
                continue
            index = _nearest_index(n, shape[a], outs[a], factors[a], coords, rounding)
            x = n.b.gather(x, n.constant(index, DType.i64), axis=a)
        return [x]
    cubic_a, exclude = float(n.attr("cubic_coeff_a", -0.75)), bool(n.attr("exclude_outside", 0))
    fn = _linear_taps if mode == "linear" else _cubic_taps

    def taps(ratio: float, scale: float) -> np.ndarray:
        return fn(ratio, scale, cubic_a, antialias)

    dt = x.type.dtype
    wide = dt in (DType.f16, DType.bf16)  # weighed in f32, rounded once at the end
    y = n.b.cast(x, dtype=DType.f32) if wide else x
    for a in axes:
        roi = rois[a]
        trivial_roi = roi is None or (math.isclose(roi[0], 0.0) and math.isclose(roi[1], 1.0))
        if math.isclose(factors[a], 1.0) and outs[a] == shape[a] and trivial_roi:
            continue
        index, coeffs, outside = _interpolation(n, shape[a], outs[a], factors[a], coords, roi, taps, exclude)
        y = _interpolate_axis(n, y, a, index, coeffs)
        if outside is not None and outside.any():
            mask = n.constant(outside.reshape((outs[a],) + (1,) * (r - a - 1)), DType.i1)
            fill = n.b.constant(np.array(float(n.attr("extrapolation_value", 0.0)), y.type.dtype.np), y.type.dtype)
            y = n.b.where(mask, fill, y)  # before the next axis weighs it, as the reference
    return [n.b.cast(y, dtype=dt) if wide else y]


@converts("Concat", attrs="axis")
def concat(n: Node) -> list:
    xs = n.xs()
    axis = n.attr("axis", 1 if n.opset < 4 else None)
    if axis is None:
        raise n.error("missing required attribute 'axis'")
    return [xs[0] if len(xs) == 1 else n.b.concat(*xs, axis=axis)]


@converts("Split", attrs="axis split num_outputs")
def split(n: Node) -> list:
    x = n.x(0)
    a = _axis(n, n.attr("axis", 0), x.type.rank)
    d, count = x.type.shape[a], len(n.proto.output)
    if n.opset >= 13 and n.has(1) and n.known(1) is None:  # the parts' sizes fed when the model is called
        if n.type(1).size != count:
            raise n.error(f"split {n.type(1)} has {n.type(1).size} parts for the node's {count} outputs")
        shape = tuple(DYN if i == a else s for i, s in enumerate(x.type.shape))
        return _runtime_op(n, "split", [x], {"axis": a, "sections": n.runtime(1, "split")}, [shape] * count,
                           x.type.dtype, many=True)
    sizes = (n.ints(1, "split") if n.has(1) else None) if n.opset >= 13 else n.attr("split", None)
    if sizes is None and "num_outputs" in n.attrs:
        if n.attr("num_outputs") != count:
            raise n.error(f"num_outputs {n.attr('num_outputs')} differs from the node's {count} outputs")
        chunk = -(-d // count)  # opset 18: the last chunk is smaller if d does not divide
        sizes = [chunk] * (count - 1) + [d - chunk * (count - 1)]
    elif sizes is None:
        if d % count:
            raise n.error(f"axis {a} of size {d} does not split into {count} equal parts")
        sizes = [d // count] * count
    if len(sizes) != count:  # an output without its part, or a part without its output
        raise n.error(f"split {list(sizes)} has {len(sizes)} parts for the node's {count} outputs")
    ys = n.b.split(x, axis=a, sections=tuple(sizes))
    return list(ys) if isinstance(ys, tuple) else [ys]


@converts("Slice", attrs="starts ends axes")
def slice_(n: Node) -> list:
    x = n.x(0)
    if n.opset < 10:
        starts, ends, axes, steps = n.attr("starts"), n.attr("ends"), n.attr("axes", None), None
    elif any(n.has(i) and n.known(i) is None for i in range(1, 5)):  # some fed when the model is called
        attrs = {}
        for i, key in enumerate(("starts", "ends", "axes", "steps"), 1):
            if n.has(i):
                attrs[key] = n.runtime(i, key) if n.known(i) is None else n.ints(i, key)
        axes = attrs.get("axes", tuple(range(n.type(1).size)))
        sliced = set(range(x.type.rank)) if isinstance(axes, ArgValue) else {a % max(x.type.rank, 1) for a in axes}
        shape = tuple(DYN if i in sliced else d for i, d in enumerate(x.type.shape))
        return [_runtime_op(n, "slice", [x], attrs, [shape], x.type.dtype)]
    else:
        starts, ends = n.ints(1, "starts"), n.ints(2, "ends")
        axes = n.ints(3, "axes") if n.has(3) else None
        steps = n.ints(4, "steps") if n.has(4) else None
    attrs = {"starts": tuple(starts), "ends": tuple(ends)}
    if axes is not None:
        attrs["axes"] = tuple(axes)
    if steps is not None:
        attrs["steps"] = tuple(steps)
    return [n.b.slice(x, **attrs)]


@converts("Transpose", attrs="perm")
def transpose(n: Node) -> list:
    perm = n.attr("perm", None)
    return [n.b.transpose(n.x(0)) if perm is None else n.b.transpose(n.x(0), perm=tuple(perm))]


@converts("Squeeze", "Unsqueeze", attrs="axes")
def squeeze(n: Node) -> list:
    x = n.x(0)
    if n.opset >= 13 and n.has(1) and n.known(1) is None and n.type(1).size:  # axes fed at the call
        k = n.type(1).size
        rank = x.type.rank + k if n.op_type == "Unsqueeze" else x.type.rank - k
        if rank < 0:
            raise n.error(f"cannot squeeze {k} axes of {x.type}")
        return [_runtime_op(n, n.op_type.lower(), [x], {"axes": n.runtime(1, "axes")}, [(DYN,) * rank],
                            x.type.dtype)]
    axes = (n.ints(1, "axes") if n.has(1) else None) if n.opset >= 13 else n.attr("axes", None)
    if n.op_type == "Unsqueeze":
        if axes is None:
            raise n.error("missing axes")
        return [n.b.unsqueeze(x, axes=tuple(axes))]
    return [n.b.squeeze(x) if axes is None else n.b.squeeze(x, axes=tuple(axes))]


@converts("Gather", attrs="axis")
def gather(n: Node) -> list:
    return [n.b.gather(n.x(0), n.x(1), axis=n.attr("axis", 0))]


@converts("GatherElements", attrs="axis")
def gather_elements(n: Node) -> list:
    """out[i] = data[i with i[axis] replaced by indices[i]] (NumPy's take_along_axis), as a graph.gather
    from the flattened data: each element's flat index is its index along the axis times that axis'
    stride, plus a constant offset of its other coordinates. (BERT's exports use it.)"""
    data, idx = n.x(0), n.x(1)
    r = data.type.rank
    axis = _axis(n, n.attr("axis", 0), r)
    if idx.type.rank != r:
        raise n.error(f"indices {idx.type} must have the rank of data {data.type}")
    if idx.type.dtype not in (DType.i32, DType.i64):
        raise n.error(f"indices must be i32 or i64, got {idx.type}")
    bad = [k for k in range(r) if k != axis and known(idx.type.shape[k]) and known(data.type.shape[k])
           and idx.type.shape[k] > data.type.shape[k]]
    if bad:
        raise n.error(f"indices {idx.type} is longer than data {data.type} along axis {bad[0]}")
    n.check_size(idx.type.shape, "indices")
    if not (idx.type.is_static and data.type.is_static):
        return [_gather_elements_dynamic(n, data, idx, axis)]
    strides = [int(np.prod(data.type.shape[k + 1 :])) for k in range(r)]
    offsets = np.zeros(idx.type.shape, np.int64)
    for k in range(r):
        if k != axis:
            shape = [1] * r
            shape[k] = idx.type.shape[k]
            offsets = offsets + (np.arange(idx.type.shape[k], dtype=np.int64) * strides[k]).reshape(shape)
    i64 = _as(n, idx, DType.i64)
    size = n.constant(np.array(data.type.shape[axis]), DType.i64)
    i64 = n.b.where(n.b.less(i64, n.constant(np.array(0), DType.i64)), n.b.add(i64, size), i64)
    flat = n.b.add(n.b.mul(i64, n.constant(np.array(strides[axis]), DType.i64)), n.constant(offsets, DType.i64))
    return [n.b.gather(n.b.reshape(data, shape=(-1,)), flat, axis=0)]


def _gather_elements_dynamic(n: Node, data: Value, idx: Value, axis: int) -> Value:
    """gather_elements where a size is `?` (BERT's token types gathered at the position ids [batch, seq]):
    the same flat indices, with the strides and each coordinate computed at each call from the sizes (a
    coordinate along axis k: a cumulative sum of ones over k, less one)."""
    b, i64 = n.b, DType.i64
    r = data.type.rank
    sizes = b.shape(data)

    def size_of(k: int) -> Value:  # data's size along k, a rank-0 i64
        d = data.type.shape[k]
        if known(d):
            return n.constant(np.array(d), i64)
        return b.reshape(b.slice(sizes, starts=[k], ends=[k + 1], axes=[0]), shape=())

    def stride(k: int) -> Value:
        out = n.constant(np.array(1), i64)
        for j in range(k + 1, r):
            out = b.mul(out, size_of(j))
        return out

    at = _as(n, idx, i64)
    at = b.where(b.less(at, n.constant(np.array(0), i64)), b.add(at, size_of(axis)), at)
    flat = b.mul(at, stride(axis))
    ones = _ones(n, _named(n, b.shape(idx), "sizes"), idx.type.shape, i64)
    for k in range(r):
        if k != axis:
            flat = b.add(flat, b.mul(_coordinates(n, ones, k), stride(k)))
    return b.gather(b.reshape(data, shape=(-1,)), flat, axis=0)


@converts("GatherND", attrs="batch_dims")
def gather_nd(n: Node) -> list:
    """out[b..., i...] = data[b..., indices[b..., i..., :]] (the last axis of indices holds k coordinates into
    data's axes after the b batch axes), as a graph.gather from data flattened to [B * P, R] (B batches, P the
    indexed positions, R the rest) at each index's flat row: its coordinates times their strides, plus its
    batch's offset. The indices may be computed at run time."""
    data, idx = n.x(0), n.x(1)
    r, q = data.type.rank, idx.type.rank
    b = n.attr("batch_dims", 0)
    if q < 1 or not 0 <= b < min(q, r):
        raise n.error(f"batch_dims {b} must be below the ranks of data {data.type} and indices {idx.type}")
    if idx.type.dtype not in (DType.i32, DType.i64):
        raise n.error(f"indices must be i32 or i64, got {idx.type}")
    k = idx.type.shape[-1]
    if not known(k):
        raise n.error(f"indices {idx.type}: the length of their last axis (the coordinates of each) must be known")
    if not 1 <= k <= r - b or shapes_differ(tuple(idx.type.shape[:b]), tuple(data.type.shape[:b])):
        raise n.error(f"indices {idx.type} do not index data {data.type} with batch_dims {b}")
    lead = tuple(idx.type.shape[:-1])
    n.check_size(lead, "indices")
    if not (idx.type.is_static and data.type.is_static):
        if b:
            raise n.error(f"batch_dims {b} with sizes known only at run time ({data.type}, {idx.type}): gc takes 0")
        return [_gather_nd_dynamic(n, data, idx, k)]
    positions = data.type.shape[b : b + k]
    rest = data.type.shape[b + k :]
    per_batch, row = math.prod(positions), math.prod(rest)
    i64 = _as(n, idx, DType.i64)
    sizes = n.constant(np.array(positions), DType.i64)
    i64 = n.b.where(n.b.less(i64, n.constant(np.array(0), DType.i64)), n.b.add(i64, sizes), i64)
    strides = np.array([math.prod(positions[j + 1 :]) for j in range(k)], np.int64)
    flat = n.b.reduce_sum(n.b.mul(i64, n.constant(strides, DType.i64)), axes=[q - 1])
    batches = np.arange(math.prod(lead[:b]), dtype=np.int64).reshape((*lead[:b], *[1] * (len(lead) - b)))
    flat = n.b.add(flat, n.constant(np.broadcast_to(batches * per_batch, lead).copy(), DType.i64))
    rows = n.b.reshape(data, shape=(math.prod(data.type.shape[:b]) * per_batch, row))
    return [n.b.reshape(n.b.gather(rows, flat, axis=0), shape=(*lead, *rest))]


def _gather_nd_dynamic(n: Node, data: Value, idx: Value, k: int) -> Value:
    """gather_nd (batch_dims 0) where a size is `?` (GPT-2's causal mask as torch 2.13 exports it): the same
    flat rows, the strides of the k indexed axes and the result's shape computed at each call."""
    b, i64 = n.b, DType.i64
    r, q = data.type.rank, idx.type.rank
    sizes = b.shape(data)
    at = _as(n, idx, i64)
    lengths = b.slice(sizes, starts=[0], ends=[k], axes=[0])  # of the indexed axes, [k]
    at = b.where(b.less(at, n.constant(np.array(0), i64)), b.add(at, lengths), at)
    strides = b.cumprod(lengths, axis=0, exclusive=True, reverse=True)  # the product of the lengths after each
    flat = b.reduce_sum(b.mul(at, strides), axes=[q - 1])
    rest = data.type.shape[k:]
    if static(rest):
        rows = b.reshape(data, shape=(-1, math.prod(rest)))
    else:
        row = b.reduce_prod(b.slice(sizes, starts=[k], ends=[r], axes=[0]), axes=[0], keepdims=True)
        want = _named(n, b.concat(n.constant(np.array([-1]), i64), row, axis=0), "rows")
        rows = _runtime_op(n, "reshape", [data], {"shape": want}, [(DYN, DYN)], data.type.dtype)
    out = b.gather(rows, flat, axis=0)
    shape = (*idx.type.shape[:-1], *rest)
    if static(shape):
        return b.reshape(out, shape=shape)
    parts = [b.slice(b.shape(idx), starts=[0], ends=[q - 1], axes=[0]), b.slice(sizes, starts=[k], ends=[r], axes=[0])]
    want = _named(n, b.concat(*parts, axis=0), "sizes")
    return _runtime_op(n, "reshape", [out], {"shape": want}, [shape], data.type.dtype)


_SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter(n: Node, rows: Value, updates: Value, targets: np.ndarray, reduction: str) -> Value:
    """`rows` ([P, R]) with row targets[j] combined with row j of `updates` ([N, R]) by `reduction` ("none":
    replaced, the last update of a row winning). The targets are known at import time, so which update
    each output row takes is a constant: one where(mask, gather(updates, source), rows) per update a row
    receives (one pass unless rows repeat)."""
    if reduction not in _SCATTER_REDUCTIONS:
        raise n.error(f"reduction '{reduction}' is not one of {', '.join(_SCATTER_REDUCTIONS)}")
    count = rows.type.shape[0]
    if targets.size == 0:  # no update: the data as it is
        return rows
    if reduction == "none":  # the last write of a row wins
        last = np.full(count, -1, np.int64)
        last[targets] = np.arange(targets.size)
        passes = [last]
    else:  # the t-th update of each row in pass t
        order = np.argsort(targets, kind="stable")
        ranked = targets[order]
        first = np.searchsorted(ranked, ranked)
        nth = np.arange(ranked.size) - first
        passes = []
        n.check_size((int(nth.max()) + 1, count), "the scatter's per-repeat masks")  # (one pass per repeat)
        for t in range(int(nth.max()) + 1):
            src = np.full(count, -1, np.int64)
            src[ranked[nth == t]] = order[nth == t]
            passes.append(src)
    combine = {"none": None, "add": n.b.add, "mul": n.b.mul, "max": n.b.maximum, "min": n.b.minimum}[reduction]
    out = rows
    for src in passes:
        mask = n.constant((src >= 0).reshape(count, 1), DType.i1)
        taken = n.b.gather(updates, n.constant(np.maximum(src, 0), DType.i64), axis=0)
        out = n.b.where(mask, taken if combine is None else combine(out, taken), out)
    return out


def _scatter_at_run_time(n: Node, rows: Value, updates: Value, targets: Value, reduction: str) -> Value:
    """`_scatter` with the row targets computed at run time ([N] i64): each output row matched against
    every target, so O(rows x updates) compares (fine for the index tensors models feed at run time; the
    known ones take `_scatter`). A target outside the rows matches none (ONNX leaves it undefined)."""
    if reduction not in _SCATTER_REDUCTIONS:
        raise n.error(f"reduction '{reduction}' is not one of {', '.join(_SCATTER_REDUCTIONS)}")
    b, (count, width), m = n.b, rows.type.shape, updates.type.shape[0]
    dtype = rows.type.dtype
    match = b.equal(b.reshape(targets, shape=(1, m)), n.constant(np.arange(count).reshape(count, 1), DType.i64))
    if reduction == "none":  # the last matching update wins: the largest of j + 1 over the matches
        score = b.where(match, n.constant(np.arange(1, m + 1).reshape(1, m), DType.i64), n.constant(np.array(0), DType.i64))
        hit = b.greater(b.reduce_max(score, axes=[1], keepdims=True), n.constant(np.array(0), DType.i64))
        return b.where(hit, b.gather(updates, b.argmax(score, axis=1), axis=0), rows)
    if reduction == "add" and dtype.is_float:
        return b.add(rows, b.matmul(b.cast(match, dtype=dtype), updates))
    # mul, max, min (and add of integers): each row's matching updates reduced, those matching none left alone
    identity = {"add": 0, "mul": 1, "max": -np.inf if dtype.is_float else np.iinfo(dtype.np).min,
                "min": np.inf if dtype.is_float else np.iinfo(dtype.np).max}[reduction]
    spread = b.where(b.reshape(match, shape=(count, m, 1)), b.reshape(updates, shape=(1, m, width)),
                     n.constant(np.array(identity), dtype))
    reduced = {"add": b.reduce_sum, "mul": b.reduce_prod, "max": b.reduce_max, "min": b.reduce_min}[reduction](spread, axes=[1])
    combined = {"add": b.add, "mul": b.mul, "max": b.maximum, "min": b.minimum}[reduction](rows, reduced)
    hit = b.reshape(b.greater(b.reduce_sum(b.cast(match, dtype=DType.i64), axes=[1]), n.constant(np.array(0), DType.i64)),
                    shape=(count, 1))
    return b.where(hit, combined, rows)


def _wrapped(n: Node, idx: Value, size) -> Value:
    """Indices as i64, a negative one counting from the end (`size`: a scalar or an array that broadcasts)."""
    idx = n.b.cast(idx, dtype=DType.i64) if idx.type.dtype != DType.i64 else idx
    bound = n.constant(np.asarray(size, np.int64), DType.i64)
    return n.b.where(n.b.less(idx, n.constant(np.array(0), DType.i64)), n.b.add(idx, bound), idx)


@converts("ScatterND", attrs="reduction")
def scatter_nd(n: Node) -> list:
    """data with data[indices[i..., :]] = updates[i...] (or combined by `reduction`): data as [P, R] rows, each
    update a row; indices known at import time (Swin-T's attention masks) pick the rows then (`_scatter`),
    others at run time (`_scatter_at_run_time`)."""
    data, updates = n.x(0), n.x(2)
    if n.known(1) is None:
        idx = n.x(1)
        if not idx.type.dtype.is_int or idx.type.rank < 1:
            raise n.error(f"indices must be integers with a last axis of coordinates, got {idx.type}")
        k, shape = idx.type.shape[-1], data.type.shape
        lead = tuple(idx.type.shape[:-1])
        if not 1 <= k <= data.type.rank or shapes_differ(tuple(updates.type.shape), (*lead, *shape[k:])):
            raise n.error(f"updates {updates.type} must be indices' {list(lead)} then data's {list(shape[k:])}")
        count, row = math.prod(shape[:k]), math.prod(shape[k:])
        coords = _wrapped(n, n.b.reshape(idx, shape=(math.prod(lead), k)), np.array(shape[:k]).reshape(1, k))
        strides = np.array([math.prod(shape[j + 1 : k]) for j in range(k)], np.int64).reshape(k, 1)
        targets = n.b.reshape(n.b.matmul(coords, n.constant(strides, DType.i64)), shape=(math.prod(lead),))
        out = _scatter_at_run_time(n, n.b.reshape(data, shape=(count, row)),
                                   n.b.reshape(updates, shape=(math.prod(lead), row)), targets, n.attr("reduction", "none"))
        return [n.b.reshape(out, shape=tuple(shape))]
    idx = n.const(1, "indices")
    if idx.dtype.kind not in "iu" or idx.ndim < 1:
        raise n.error(f"indices must be integers with a last axis of coordinates, got {idx.dtype}{list(idx.shape)}")
    k, r = idx.shape[-1], data.type.rank
    lead = tuple(idx.shape[:-1])
    if not 1 <= k <= r or shapes_differ(tuple(updates.type.shape), (*lead, *data.type.shape[k:])):
        raise n.error(f"updates {updates.type} must be indices' {list(lead)} then data's {list(data.type.shape[k:])}")
    positions = np.array(data.type.shape[:k], np.int64)
    coords = idx.reshape(-1, k).astype(np.int64)
    if ((coords < -positions) | (coords >= positions)).any():
        raise n.error(f"an index lies outside data {data.type}")
    coords = np.where(coords < 0, coords + positions, coords)
    strides = np.array([math.prod(positions[j + 1 :]) for j in range(k)], np.int64)
    row = math.prod(data.type.shape[k:])
    rows = n.b.reshape(data, shape=(int(np.prod(positions)), row))
    out = _scatter(n, rows, n.b.reshape(updates, shape=(len(coords), row)), coords @ strides,
                   n.attr("reduction", "none"))
    return [n.b.reshape(out, shape=tuple(data.type.shape))]


@converts("ScatterElements", "Scatter", attrs="axis reduction")
def scatter_elements(n: Node) -> list:
    """data with data[i with i[axis] replaced by indices[i]] = updates[i] (or combined by `reduction`), for
    indices known at import time: each element an update of one row of the flattened data (`_scatter`)."""
    data, updates = n.x(0), n.x(2)
    r = data.type.rank
    axis = _axis(n, n.attr("axis", 0), r)
    if n.known(1) is None:  # indices at run time: each element's flat target computed from them
        idx = n.x(1)
        shape = tuple(idx.type.shape)
        if not idx.type.dtype.is_int or shape != tuple(updates.type.shape) or len(shape) != r:
            raise n.error(f"indices {idx.type} must be integers shaped as updates {updates.type}")
        if any(i > d for a, (i, d) in enumerate(zip(shape, data.type.shape)) if a != axis):
            raise n.error(f"indices {list(shape)} are longer than data {data.type} along an axis other than {axis}")
        at = np.indices(shape).astype(np.int64)
        strides = np.array([math.prod(data.type.shape[a + 1 :]) for a in range(r)], np.int64)
        base = np.tensordot(strides, at, axes=1) - at[axis] * strides[axis]  # every coordinate but the axis'
        wrapped = _wrapped(n, idx, data.type.shape[axis])
        flat = n.b.add(n.constant(base, DType.i64), n.b.mul(wrapped, n.constant(np.array(strides[axis]), DType.i64)))
        size = math.prod(shape)
        out = _scatter_at_run_time(n, n.b.reshape(data, shape=(data.type.size, 1)), n.b.reshape(updates, shape=(size, 1)),
                                   n.b.reshape(flat, shape=(size,)), n.attr("reduction", "none"))
        return [n.b.reshape(out, shape=tuple(data.type.shape))]
    idx = n.const(1, "indices")
    if idx.dtype.kind not in "iu" or idx.shape != tuple(updates.type.shape) or idx.ndim != r:
        raise n.error(f"indices {idx.dtype}{list(idx.shape)} must be integers shaped as updates {updates.type}")
    size = data.type.shape[axis]
    if any(i > d for a, (i, d) in enumerate(zip(idx.shape, data.type.shape)) if a != axis):
        raise n.error(f"indices {list(idx.shape)} are longer than data {data.type} along an axis other than {axis}")
    if ((idx < -size) | (idx >= size)).any():
        raise n.error(f"an index lies outside axis {axis} of data {data.type}")
    at = np.indices(idx.shape).astype(np.int64)
    at[axis] = np.where(idx < 0, idx + size, idx)
    targets = np.ravel_multi_index(tuple(at.reshape(r, -1)), data.type.shape) if idx.size else np.zeros(0, np.int64)
    rows = n.b.reshape(data, shape=(data.type.size, 1))
    out = _scatter(n, rows, n.b.reshape(updates, shape=(idx.size, 1)), np.asarray(targets, np.int64),
                   n.attr("reduction", "none"))
    return [n.b.reshape(out, shape=tuple(data.type.shape))]


@converts("Pad", attrs="mode pads paddings value")
def pad(n: Node) -> list:
    x = n.x(0)
    r = x.type.rank
    mode = n.attr("mode", "constant")
    if n.opset < 11:
        pads, value = list(n.attr("pads", None) or n.attr("paddings")), float(n.attr("value", 0.0))
    else:
        pads = list(n.ints(1, "pads"))
        v = n.const(2, "constant_value")
        value = float(v.reshape(-1)[0]) if v is not None and v.size else 0.0
        if n.has(3):  # opset 18: pads for these axes only
            axes = [_axis(n, a, r) for a in n.ints(3, "axes")]
            if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
                raise n.error(f"pads {pads} must have 2 entries for each of the distinct axes {axes}")
            full = [0] * 2 * r
            for i, a in enumerate(axes):
                full[a], full[r + a] = pads[i], pads[len(axes) + i]
            pads = full
    if len(pads) != 2 * r:
        raise n.error(f"pads {pads} must have {2 * r} entries for {x.type}")
    if mode == "constant":
        return [n.b.pad(x, pads=tuple(pads), value=value)]
    if mode not in ("reflect", "edge", "wrap"):
        raise n.error(f"mode '{mode}' is not constant, reflect, edge or wrap")
    return [_pad_from_edges(n, x, pads, mode)]


def _pad_from_edges(n: Node, x: Value, pads: list[int], mode: str) -> Value:
    """reflect, edge and wrap padding as slices of x concatenated around it, one axis at a time."""
    r = x.type.rank
    crop = [max(-p, 0) for p in pads]
    if any(crop):
        x = n.b.pad(x, pads=tuple(-c for c in crop))
    for a in range(r):
        lo, hi = max(pads[a], 0), max(pads[r + a], 0)
        if not lo and not hi:
            continue
        d = x.type.shape[a]
        if max(lo, hi) > (d - 1 if mode == "reflect" else d) or d == 0:
            raise n.error(f"{mode} padding of {max(lo, hi)} on axis {a} of size {d} needs a larger axis")
        parts = [_edge(n, x, a, lo, mode, before=True)] if lo else []
        parts.append(x)
        if hi:
            parts.append(_edge(n, x, a, hi, mode, before=False))
        x = n.b.concat(*parts, axis=a)
    return x


def _edge(n: Node, x: Value, axis: int, width: int, mode: str, before: bool) -> Value:
    """The `width` elements that pad x's axis before (or after) it."""
    d = x.type.shape[axis]

    def cut(start: int, end: int, step: int = 1) -> Value:
        return n.b.slice(x, starts=(start,), ends=(end,), axes=(axis,), steps=(step,))

    if mode == "wrap":
        return cut(d - width, d) if before else cut(0, width)
    if mode == "edge":
        shape = list(x.type.shape)
        shape[axis] = width
        return n.b.broadcast_to(cut(0, 1) if before else cut(d - 1, d), shape=tuple(shape))
    if before:  # reflect: x[width], ..., x[1]
        return cut(width, 0, -1)
    end = d - 2 - width
    return cut(d - 2, end if end >= 0 else -d - 1, -1)  # x[d-2], ..., x[d-1-width]; -d-1 is "before x[0]"


@converts("Trilu", attrs="upper")
def trilu(n: Node) -> list:
    if len(n.type(0).shape) < 2:  # numpy would take a vector for a row of a matrix
        raise n.error(f"input must have rank >= 2, got {n.type(0)}")
    if n.has(1) and n.known(1) is None:  # k given at run time (it does not change the shape)
        return [_trilu_at_run_time(n)]
    k = n.ints(1, "k") if n.has(1) else (0,)
    if len(k) != 1:
        raise n.error(f"k must be one integer, got {list(k)}")
    k = k[0]
    keep = np.triu if n.attr("upper", 1) else np.tril
    known = n.constants()
    if known is not None:  # a causal mask, as exporters build it
        return [keep(known[0], k)]
    x = n.x(0)
    if not static(x.type.shape[-2:]):
        return [_trilu_at_run_time(n, k)]
    mask = keep(n.full(x.type.shape[-2:], True, bool, "the mask"), k)
    return [n.b.where(n.constant(mask, DType.i1), x, n.scalar(0, x))]


def _trilu_at_run_time(n: Node, k: int | None = None) -> Value:
    """x where its diagonal offset j - i is at least k (upper) or at most k (lower), for a k known only at
    run time (k None: input #1) or a matrix whose sizes are: the offsets a constant, or computed at each
    call (the coordinates as graph.iota), compared with k."""
    x, b = n.x(0), n.b
    rows, cols = x.type.shape[-2:]
    if static((rows, cols)):
        offsets = np.arange(cols, dtype=np.int64)[None, :] - np.arange(rows, dtype=np.int64)[:, None]
        d = n.constant(offsets, DType.i64)
    else:
        r = x.type.rank
        sizes = _named(n, b.slice(b.shape(x), starts=[r - 2], ends=[r], axes=[0]), "sizes")
        ones = _ones(n, sizes, (rows, cols), DType.i64)
        d = b.sub(_coordinates(n, ones, 1), _coordinates(n, ones, 0))  # column less row
    if k is None:
        k = n.x(1)
        if k.type.size != 1 or k.type.dtype not in (DType.i32, DType.i64):
            raise n.error(f"k must be one integer, got {k.type}")
        k = b.reshape(_as(n, k, DType.i64), shape=())
    else:
        k = n.constant(np.array(k), DType.i64)
    false = n.constant(np.array(False), DType.i1)
    keep = b.equal(b.less(d, k), false) if n.attr("upper", 1) else b.equal(b.greater(d, k), false)
    return b.where(keep, x, n.scalar(0, x))


# --- values known at import time -------------------------------------------------------------------------


@converts("Constant", attrs="value value_float value_floats value_int value_ints value_string value_strings "
          "sparse_value")  # fmt: skip
def constant(n: Node) -> list:
    if len(n.attrs) != 1:
        raise n.error(f"needs exactly one value attribute, got {', '.join(n.attrs) or 'none'}")
    key = next(iter(n.attrs))
    v = n.attr(key)
    if key == "value":  # n.attr checked its element type and its dims
        return [v]
    if key in ("value_float", "value_floats"):
        return [np.array(v, np.float32)]
    if key in ("value_int", "value_ints"):
        return [np.array(v, np.int64)]
    raise n.error(f"{key}: GIR has no {'sparse' if key == 'sparse_value' else 'string'} tensors")


@converts("ConstantOfShape", attrs="value")
def constant_of_shape(n: Node) -> list:
    v = n.attr("value", np.zeros(1, np.float32))
    if v.size != 1:
        raise n.error(f"value must have one element, got {v.size}")
    if n.known(0) is None:  # a shape computed at run time: the value broadcast to it at each call
        dtype = n.imp.numpy_dtype(v, "value")
        scalar = n.constant(v.reshape(()), dtype)
        dims = [e if known(e) and e >= 0 else DYN for e in _entries(n, n.x(0))]
        return [_runtime_op(n, "broadcast_to", [scalar], {"shape": n.runtime(0, "shape")}, [dims], dtype)]
    shape = n.ints(0, "shape")
    return [n.full(shape, v.reshape(-1)[0], v.dtype, "the output")]


@converts("Shape", attrs="start end")
def shape(n: Node) -> list:
    rank = n.type(0).rank
    start, end = (max(0, min(rank, p + rank if p < 0 else p)) for p in (n.attr("start", 0), n.attr("end", rank)))
    dims = n.type(0).shape[start:end]
    if static(dims):
        return [np.array(dims, np.int64)]
    # A `?` size: read at each call (graph.shape), where what is computed from it (a Gather, a Concat) may
    # feed an attribute taken at run time (a Reshape's shape).
    s = n.b.shape(n.x(0))
    return [s if (start, end) == (0, rank) else n.b.slice(s, starts=[start], ends=[end], axes=[0])]


@converts("Size")
def size(n: Node) -> list:
    if static(n.type(0).shape):
        return [np.array(math.prod(n.type(0).shape), np.int64)]
    return [n.b.numel(n.x(0), dtype=DType.i64)]


@converts("Range")
def range_(n: Node) -> list:
    if any(n.known(i) is None for i in range(3)):
        return [_range_at_run_time(n)]
    start, limit, delta = (n.const(i, w) for i, w in ((0, "start"), (1, "limit"), (2, "delta")))
    for what, v in (("start", start), ("limit", limit), ("delta", delta)):
        if v.size != 1:
            raise n.error(f"{what} must be a scalar, got shape {list(v.shape)}")
    dtype, (start, limit, delta) = start.dtype, (start.item(), limit.item(), delta.item())
    if delta == 0 or not all(map(math.isfinite, (start, limit, delta))):
        raise n.error(f"cannot count from {start} to {limit} in steps of {delta}")
    n.check_size([max(math.ceil((limit - start) / delta), 0)], "the output")
    return [np.arange(start, limit, delta).astype(dtype)]


def _range_at_run_time(n: Node) -> Value:
    """Range(start, limit, delta) with a bound computed at run time (an exporter's arange up to the sequence
    length, a window function's, or bounds fed as inputs): its count max(ceil((limit - start) / delta), 0)
    computed at each call, ones broadcast to it, then start + (their cumulative sum - 1) * delta."""
    b = n.b
    xs = [n.x(i) for i in range(3)]
    dtype = xs[1].type.dtype
    if any(v.type.size != 1 for v in xs):
        raise n.error(f"start, limit and delta must be scalars, got {', '.join(str(v.type) for v in xs)}")
    if any(v.type.dtype != dtype for v in xs) or not (dtype.is_int or dtype.is_float):
        raise n.error(f"start, limit and delta must be numbers of one type, got {', '.join(str(v.type) for v in xs)}")
    start, limit, delta = (b.reshape(v, shape=()) for v in xs)
    s, d = (n.known(i) for i in (0, 2))
    if s is not None and d is not None and (d == 0 or not np.all(np.isfinite(s)) or not np.all(np.isfinite(d))):
        raise n.error(f"cannot count from {s.item()} in steps of {d.item()}")

    def const(v) -> Value:
        return n.constant(np.array(v), dtype)

    if dtype.is_int and s is not None and d is not None:
        # ceil((limit - s) / d) exactly: a floor division of a non-negative numerator (d's sign folded in)
        d = d.item()
        span = b.maximum(b.sub(limit, start) if d > 0 else b.sub(start, limit), const(0))
        count = b.div(b.add(span, const(abs(d) - 1)), const(abs(d)))
    else:  # in floats: the quotient's integer part, plus one where a fraction is left
        real = dtype if dtype in (DType.f32, DType.f64) else DType.f64 if dtype.is_int else DType.f32
        q = b.div(b.sub(cast_to(b, limit, real), cast_to(b, start, real)), cast_to(b, delta, real))
        q = b.maximum(q, n.constant(np.array(0), real))
        whole = b.cast(q, dtype=DType.i64)
        count = b.add(whole, b.cast(b.greater(q, b.cast(whole, dtype=real)), dtype=DType.i64))
    steps = _coordinates(n, _ones(n, _named(n, b.reshape(count, shape=(1,)), "count"), (DYN,), dtype), 0)
    return b.add(b.mul(steps, delta), start)


# --- attention ----------------------------------------------------------------------------------------


@converts("Attention", attrs="is_causal kv_num_heads left_window_size q_num_heads qk_matmul_output_mode right_window_size "
         "scale softcap softmax_precision")
def attention(n: Node) -> list:
    """Scaled dot-product attention (opset 23) as graph ops, as onnx's reference computes it: Q and K each
    scaled by sqrt(scale), the past keys and values before the new ones, K and V heads repeated for
    grouped-query attention, softcap before the additive bias (attn_mask: boolean or float, padded
    to the keys with masked entries; is_causal: bottom-right aligned after the past), a softmax whose
    fully masked rows are zero, then P V. Outputs: Y, the present keys and values, and the scores
    (qk_matmul_output_mode 0/1: after softcap, 2: with the bias, 3: the probabilities)."""
    q, k, v = n.x(0), n.x(1), n.x(2)
    rank = q.type.rank
    if rank not in (3, 4) or k.type.rank != rank or v.type.rank != rank:
        raise n.error(f"Q, K and V must all be 3-D or all 4-D, not {q.type}, {k.type}, {v.type}")
    if n.has(6) and n.has(4):
        raise n.error("nonpad_kv_seqlen cannot be combined with past_key and past_value")
    if n.has(4) != n.has(5):
        raise n.error("past_key and past_value must be given together")
    dt = q.type.dtype
    if rank == 3:
        heads = (n.attr("q_num_heads"), n.attr("kv_num_heads"), n.attr("kv_num_heads"))
        q, k, v = (_heads(n, t, h) for t, h in zip((q, k, v), heads))
    b, hq, lq, dq = q.type.shape
    scale = n.attr("scale", None)
    scale = 1.0 / math.sqrt(dq) if scale is None else float(scale)
    if n.has(4):
        k, v = n.b.concat(n.x(4), k, axis=2), n.b.concat(n.x(5), v, axis=2)
    present_k, present_v = k, v
    root = n.scalar(float(np.asarray(math.sqrt(scale), dt.np)), q)  # rounded to Q's type, as onnx's is
    q, k = n.b.mul(q, root), n.b.mul(k, root)
    hk, lk = k.type.shape[1], k.type.shape[2]
    if hk != hq:
        if hq % hk:
            raise n.error(f"{hq} query heads cannot share {hk} key and value heads")
        k, v = (_repeat_heads(n, t, hq // hk) for t in (k, v))
    s = n.b.matmul(q, n.b.transpose(k, perm=(0, 1, 3, 2)))
    softcap = n.attr("softcap", None)
    if softcap is not None and softcap > 0:
        c = n.scalar(float(softcap), s)
        s = n.b.mul(n.b.tanh(n.b.div(s, c)), c)
    capped = s
    bias = _attention_bias(n, dt, lq, lk, n.x(4).type.shape[2] if n.has(4) else 0)
    if bias is not None:
        s = n.b.add(s, bias)
    mode = n.attr("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise n.error(f"qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3")
    scores = s if mode == 2 else capped
    precision = n.attr("softmax_precision", None)
    wide = n.imp.dtype(precision, "softmax_precision") if precision is not None else dt
    x = _as(n, s, wide)
    if bias is None:
        p = n.b.softmax(x, axis=-1)
    else:
        p = _masked_softmax(n, x, bias)
    p = _as(n, p, dt)
    if mode == 3:
        scores = p
    y = n.b.matmul(p, v)
    if rank == 3:
        y = n.b.reshape(n.b.transpose(y, perm=(0, 2, 1, 3)), shape=(b, lq, hq * y.type.shape[3]))
    return [y, present_k, present_v, scores]


def _heads(n: Node, t: Value, heads: int) -> Value:
    """[B, L, H * D] as [B, H, L, D]."""
    bt, length, hidden = t.type.shape
    if heads < 1 or hidden % heads:
        raise n.error(f"a hidden size of {hidden} does not split into {heads} heads")
    return n.b.transpose(n.b.reshape(t, shape=(bt, length, heads, hidden // heads)), perm=(0, 2, 1, 3))


def _repeat_heads(n: Node, t: Value, reps: int) -> Value:
    """Each head `reps` times in a row ([h0, h0, h1, h1, ...]), as grouped-query attention shares them."""
    bt, h, length, d = t.type.shape
    wide = n.b.broadcast_to(n.b.reshape(t, shape=(bt, h, 1, length, d)), shape=(bt, h, reps, length, d))
    return n.b.reshape(wide, shape=(bt, h * reps, length, d))


def _attention_bias(n: Node, dt: DType, lq: int, lk: int, past: int) -> Value | None:
    """The additive bias over the scores, or None: attn_mask (True or 0 attends; padded to the keys with
    masked entries) plus, with is_causal, -inf where key j > query i + the past's length."""
    mask = n.x(3) if n.has(3) else None
    ninf = float("-inf")
    if mask is not None:
        short = lk - mask.type.shape[-1]
        if short < 0:
            raise n.error(f"attn_mask has {mask.type.shape[-1]} keys, more than the {lk} there are")
        if mask.type.dtype == DType.i1:
            mask = n.b.where(mask, n.constant(np.array(0), dt), n.constant(np.array(ninf), dt))
        else:
            mask = _as(n, mask, dt)
        if short:
            fill = np.full((*mask.type.shape[:-1], short), ninf, dt.np)
            mask = n.b.concat(mask, n.constant(fill, dt), axis=-1)
    from compiler.importers.onnx_attention import position_bias  # is_causal, the window, nonpad_kv_seqlen

    rules = position_bias(n, dt, lq, lk, past, n.x(6) if n.has(6) else None)
    return rules if mask is None else mask if rules is None else n.b.add(mask, rules)


def _masked_softmax(n: Node, x: Value, bias: Value) -> Value:
    """softmax over the last axis whose rows of -inf (every key masked) give 0, not NaN; a row is also 0
    wherever its bias is -inf throughout (onnx's guard: the scores there may be anything, NaN included)."""
    ninf = n.scalar(float("-inf"), x)
    m = n.b.reduce_max(x, axes=(x.type.rank - 1,), keepdims=True)
    m = n.b.where(n.b.equal(m, ninf), n.scalar(0.0, x), m)
    e = n.b.exp(n.b.sub(x, m))
    z = n.b.reduce_sum(e, axes=(x.type.rank - 1,), keepdims=True)
    p = n.b.div(e, n.b.where(n.b.equal(z, n.scalar(0.0, z)), n.scalar(1.0, z), z))
    dead = n.b.equal(n.b.reduce_max(bias, axes=(bias.type.rank - 1,), keepdims=True), n.scalar(float("-inf"), bias))
    return n.b.where(dead, n.scalar(0.0, p), p)


# --- losses --------------------------------------------------------------------------------------------


@converts("RotaryEmbedding", attrs="interleaved num_heads rotary_embedding_dim")
def rotary_embedding(n: Node) -> list:
    """Rotary position embedding (opset 23), decomposed: x as [batch, seq, heads, head_size] (4-D transposed,
    3-D split into num_heads), cos and sin gathered at position_ids (or given per batch and position); the first
    rotary_embedding_dim of each head rotated as pairs (x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2), pairs
    being the two halves or, interleaved, the even and odd elements; the rest passed through."""
    x, cos, sin = n.x(0), n.x(1), n.x(2)
    t = x.type
    if t.rank not in (3, 4):
        raise n.error(f"the input must be 3-D or 4-D, got {t}")
    heads = int(n.attr("num_heads", 0))
    if t.rank == 4:
        x = n.b.transpose(x, perm=(0, 2, 1, 3))
    else:
        if heads <= 0:
            raise n.error(f"a 3-D input needs num_heads > 0, got {heads}")
        if not static(t.shape):
            raise n.error(f"a 3-D input must have static sizes, got {t}")
        if t.shape[2] % heads:
            raise n.error(f"the hidden size {t.shape[2]} is not a multiple of num_heads {heads}")
        x = n.b.reshape(x, shape=(t.shape[0], t.shape[1], heads, t.shape[2] // heads))
    d = x.type.shape[3]
    rot = int(n.attr("rotary_embedding_dim", 0)) or d
    if not isinstance(d, int) or rot < 0 or rot > d or rot % 2:
        raise n.error(f"rotary_embedding_dim must be even and at most the head size {d}, got {rot}")
    half = rot // 2
    if n.has(3):
        if cos.type.rank != 2 or sin.type.rank != 2:
            raise n.error(f"with position_ids the caches must be 2-D [max_position, {half}], got {cos.type} and "
                          f"{sin.type}")
        pos = n.x(3)
        cos, sin = n.b.gather(cos, pos, axis=0), n.b.gather(sin, pos, axis=0)
    elif cos.type.rank != 3 or sin.type.rank != 3:
        raise n.error(f"without position_ids the caches must be 3-D [batch, sequence, {half}], got {cos.type} and "
                      f"{sin.type}")
    for c in (cos, sin):
        if c.type.shape[-1] != half:
            raise n.error(f"the caches' last size must be rotary_embedding_dim / 2 = {half}, got {c.type}")
    cos, sin = n.b.unsqueeze(cos, axes=(2,)), n.b.unsqueeze(sin, axes=(2,))
    xr = x if rot == d else n.b.slice(x, starts=(0,), ends=(rot,), axes=(3,))
    if n.attr("interleaved", 0):
        x1 = n.b.slice(xr, starts=(0,), ends=(rot,), axes=(3,), steps=(2,))
        x2 = n.b.slice(xr, starts=(1,), ends=(rot,), axes=(3,), steps=(2,))
    else:
        x1 = n.b.slice(xr, starts=(0,), ends=(half,), axes=(3,))
        x2 = n.b.slice(xr, starts=(half,), ends=(rot,), axes=(3,))
    real = n.b.sub(n.b.mul(cos, x1), n.b.mul(sin, x2))
    imag = n.b.add(n.b.mul(sin, x1), n.b.mul(cos, x2))
    if n.attr("interleaved", 0):
        y = n.b.concat(n.b.unsqueeze(real, axes=(4,)), n.b.unsqueeze(imag, axes=(4,)), axis=4)
        y = n.b.reshape(y, shape=tuple(xr.type.shape))
    else:
        y = n.b.concat(real, imag, axis=3)
    if rot != d:
        y = n.b.concat(y, n.b.slice(x, starts=(rot,), ends=(d,), axes=(3,)), axis=3)
    return [n.b.transpose(y, perm=(0, 2, 1, 3)) if t.rank == 4 else n.b.reshape(y, shape=tuple(t.shape))]


@converts("NegativeLogLikelihoodLoss", attrs="ignore_index reduction")
def nll_loss(n: Node) -> list:
    """-input[n, target[n, d...], d...] times the target's weight; a target equal to ignore_index weighs 0.
    The picked element and its weight come from a one-hot mask of the target over the classes (no gather:
    a target out of range picks nothing and weighs 0)."""
    weight = n.x(2) if n.has(2) else None
    return [_nll(n, n.x(0), n.x(1), weight)]


@converts("SoftmaxCrossEntropyLoss", attrs="ignore_index reduction")
def softmax_cross_entropy(n: Node) -> list:
    """NegativeLogLikelihoodLoss of log_softmax(scores) over the classes (axis 1); the log-probabilities
    are the second output."""
    logp = n.b.log_softmax(n.x(0), axis=1)
    weight = n.x(2) if n.has(2) else None
    return [_nll(n, logp, n.x(1), weight), logp]


def _nll(n: Node, x: Value, target: Value, weight: Value | None) -> Value:
    xs, ts = x.type.shape, target.type.shape
    if x.type.rank < 2 or ts != (xs[0], *xs[2:]):
        raise n.error(f"target {target.type} does not match input {x.type}: it must be [N, d1, ...] of [N, C, d1, ...]")
    c, dt = xs[1], x.type.dtype
    reduction = n.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise n.error(f"reduction '{reduction}' is not one of none, sum, mean")
    classes = np.arange(c, dtype=target.type.dtype.np).reshape((1, c) + (1,) * (x.type.rank - 2))
    hot = n.b.equal(n.b.reshape(target, shape=(ts[0], 1, *ts[1:])), n.constant(classes, target.type.dtype))
    zero = n.scalar(0.0, x)
    picked = n.b.reduce_sum(n.b.where(hot, x, zero), axes=(1,))
    if weight is None:
        w = n.b.reduce_sum(n.b.cast(hot, dtype=dt), axes=(1,))
    else:
        wide = n.b.broadcast_to(n.b.reshape(weight, shape=classes.shape), shape=xs)
        w = n.b.reduce_sum(n.b.where(hot, wide, zero), axes=(1,))
    ignore = n.attr("ignore_index", None)
    if ignore is not None and 0 <= ignore < c:  # (out of range, the one-hot mask picks nothing already)
        # Nothing picked there either: an ignored -inf log-probability (a masked pad class) is no NaN.
        ignored = n.b.equal(target, n.constant(np.array(ignore), target.type.dtype))
        picked, w = (n.b.where(ignored, n.scalar(0.0, t), t) for t in (picked, w))
    loss = n.b.neg(n.b.mul(picked, w))
    if reduction == "none":
        return loss
    every = tuple(range(loss.type.rank))
    total = n.b.reduce_sum(loss, axes=every)
    return total if reduction == "sum" else n.b.div(total, n.b.reduce_sum(w, axes=every))


@converts("GridSample", attrs="mode padding_mode align_corners")
def grid_sample(n: Node) -> list:
    """graph.grid_sample; opset 16's `bilinear` and `bicubic` are 20's `linear` and `cubic`. A grid of another
    float dtype than X is cast to X's."""
    x, grid = n.x(0), n.x(1)
    mode = n.attr("mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = n.attr("padding_mode", "zeros")
    if mode not in ("linear", "nearest", "cubic"):
        raise n.error(f"mode '{mode}' is not one of linear (bilinear), nearest, cubic (bicubic)")
    if padding not in ("zeros", "border", "reflection"):
        raise n.error(f"padding_mode '{padding}' is not one of zeros, border, reflection")
    if grid.type.dtype != x.type.dtype and x.type.dtype.is_float and grid.type.dtype.is_float:
        grid = n.b.cast(grid, dtype=x.type.dtype)
    return [n.b.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=bool(n.attr("align_corners", 0)))]


@converts("AffineGrid", attrs="align_corners")
def affine_grid(n: Node) -> list:
    """graph.affine_grid of theta, the size [N, C, H, W] or [N, C, D, H, W] a constant at import (its spatial
    sizes become the op's `size`)."""
    theta, size = n.x(0), n.ints(1, "size")
    if len(size) not in (4, 5):
        raise n.error(f"size must be [N, C, H, W] or [N, C, D, H, W], got {list(size)}")
    n.check_size(size, "the grid")
    batch = theta.type.shape[0] if theta.type.rank else None
    if isinstance(batch, int) and batch != size[0]:
        raise n.error(f"size's batch {size[0]} differs from theta's {batch} ({theta.type})")
    return [n.b.affine_grid(theta, size=size[2:], align_corners=bool(n.attr("align_corners", 0)))]
