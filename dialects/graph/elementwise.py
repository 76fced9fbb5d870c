"""Elementwise ops: unary math, activations, cast, binary arithmetic, comparisons, where.

Ops that differ only in their function share a base class; each op is one line of the table.
"""

from __future__ import annotations

import math
import types
from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import (
    DType,
    Op,
    TensorType,
    Value,
    attribute,
    broadcast,
    kernel_shape,
    operand,
    size_div,
    size_max,
    size_min,
)
from dialects.graph.common import (
    broadcast_shapes,
    is_constant,
    isnan,
    require_float,
    require_int,
    require_numeric,
    same_dtype,
    same_type,
    scalar,
    unbroadcast,
    zero_with_sign,
)

if TYPE_CHECKING:
    from compiler.builder import Builder

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(np.asarray(x, dtype=np.float64)), dtype=np.float64)


# --- lowering helpers (TVM is imported inside lowerings only, so that `gc run` starts fast) -----------


def _dtype(e) -> str:
    """The dtype of a TE tensor or a scalar expression, as a string ("float32")."""
    return str(e.dtype) if hasattr(e, "dtype") else str(e.ty)


def _arith(dtype: str) -> str:
    """16-bit floats compute in f32 and round once at the end, as the reference does."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def _load(x, shape: tuple[int, ...], idx: tuple, out: tuple[int, ...] = ()):
    """The element of `x` (of `shape`) that NumPy broadcasting reads for the output index `idx` (into a
    result of shape `out`)."""
    tail = idx[len(idx) - len(shape) :] if shape else ()
    outs = out[len(out) - len(shape) :] if shape and out else (None,) * len(shape)
    elem = x(*[0 if broadcast(d, o) else i for d, o, i in zip(shape, outs, tail)])
    dtype = _dtype(x)
    return elem.astype(_arith(dtype)) if _arith(dtype) != dtype else elem


def _compute(op: Op, xs: list, expr):
    """One te.compute over the broadcast of `xs`: expr(*elements) in the arithmetic type, cast to the result's."""
    from tvm import te

    out = op.results[0].type
    shapes = [v.type.shape for v in op.operands]

    def body(*idx):
        y = expr(*[_load(x, s, idx, out.shape) for x, s in zip(xs, shapes)])
        return y.astype(out.dtype.tvm) if _dtype(y) != out.dtype.tvm else y

    return te.compute(kernel_shape(out.shape), body, name=op.name.split(".")[-1])


def _lower(expr):
    """A lowering from a scalar TE expression builder, for ops whose operands broadcast elementwise."""

    def lower(self, *xs):
        return _compute(self, list(xs), expr)

    return lower


def _const(value, like):
    import tvm

    return tvm.tirx.const(value, _dtype(like))


def _is_float(e) -> bool:
    return _dtype(e).startswith(("float", "bfloat"))


def _is_unsigned(e) -> bool:
    return _dtype(e).startswith("uint")


def _fmax(a, b):
    """max that propagates NaN from either side, as np.maximum (a bare TIR max drops a NaN on its left)."""
    import tvm

    if not _is_float(a):
        return tvm.tirx.max(a, b)
    return tvm.tirx.Select(isnan(a) | (a > b), a, b)


def _fmin(a, b):
    import tvm

    if not _is_float(a):
        return tvm.tirx.min(a, b)
    return tvm.tirx.Select(isnan(a) | (a < b), a, b)


def _expm1(x):
    """e^x - 1 without the cancellation near 0 (Kahan's trick: the rounding error of e^x cancels)."""
    import tvm
    from tvm import te

    u = te.exp(x)
    one = _const(1, x)
    return tvm.tirx.Select(u == one, x, tvm.tirx.Select(u - one == -one, -one, (u - one) * x / te.log(u)))


def _define(base: type[Op], name: str, fn, doc: str, **extra) -> type[Op]:
    """Make `graph.<name>` as a subclass of `base` that computes `fn`."""
    cls_name = "".join(p.capitalize() for p in name.split(".")[-1].split("_"))
    ns = {"fn": staticmethod(fn), "__doc__": doc, "__module__": __name__, **extra}
    return types.new_class(cls_name, (base,), {"name": name}, lambda d: d.update(ns))


# --- unary ----------------------------------------------------------------------------------------


class Unary(Op):
    """Base of the unary elementwise ops; `floats_only` ops reject integer tensors."""

    kind = "elementwise"
    x = operand()
    floats_only = True
    positive_domain = False
    domain: tuple[float, float] | None = None  # where random inputs are drawn, if not everywhere

    def infer(self, x: TensorType) -> TensorType:
        (require_float if self.floats_only else require_numeric)(self, x)
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        return self.fn(x)

    def flops(self) -> int:
        return self.result.type.size

    def input_range(self, index: int) -> tuple[float, float] | None:
        """Random inputs for log/sqrt/rsqrt (asin, acosh, ...) stay inside their domain."""
        return self.domain or ((0.5, 2.0) if self.positive_domain else None)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [self.vjp(b, self.x, self.result, dys[0])]


def unary(name: str, fn, doc: str, floats_only: bool = True, positive: bool = False, lower=None, vjp=None,
          domain: tuple[float, float] | None = None, **policies) -> type[Op]:
    """`vjp(b, x, y, dy)` is the gradient rule: the gradient with respect to x (None: zero). `policies`:
    class attributes passes ask the op for (`precision`, ...; see compiler/ir.py's Op)."""
    extra = {"lower": lower} if lower is not None else {}
    return _define(Unary, name, fn, doc, floats_only=floats_only, positive_domain=positive, vjp=staticmethod(vjp),
                   domain=domain, **extra, **policies)


# --- gradient rules of the unary ops: vjp(b, x, y, dy) with y the op's result; PyTorch's values at kinks ----


def _sign(b: Builder, x: Value) -> Value:
    """-1, 0 or 1 as x's dtype: sign(0) = 0, so |x|' is 0 at 0 as in PyTorch."""
    zero = scalar(b, 0, x)
    pos, neg = (b.cast(c, dtype=x.type.dtype) for c in (b.greater(x, zero), b.less(x, zero)))
    return b.sub(pos, neg)


def _d_relu(b: Builder, x: Value, y: Value, dy: Value) -> Value:
    # PyTorch masks where the result is <= 0, that is == 0 here: relu'(0) = 0 and a NaN passes dy through.
    zero = scalar(b, 0, dy)
    return b.where(b.equal(y, zero), zero, dy)


def _d_erf(b: Builder, x: Value, y: Value, dy: Value) -> Value:
    return b.mul(dy, b.mul(scalar(b, 2 / math.sqrt(math.pi), x), b.exp(b.neg(b.mul(x, x)))))


def _sigmoid(x):
    return np.exp(-np.logaddexp(0, -x))


def _te(fn: str):
    """A unary lowering that applies tvm.te.<fn> to each element."""

    def expr(x):
        from tvm import te

        return getattr(te, fn)(x)

    return _lower(expr)


def _relu(x):
    import tvm

    # x < 0 is false for NaN, so a NaN passes through as np.maximum(x, 0) lets it.
    return tvm.tirx.Select(x < _const(0, x), _const(0, x), x)


def _sigmoid_te(x):
    import tvm
    from tvm import te

    # With e = e^-|x| <= 1 nothing overflows, and a large negative x gives e^x itself rather than 1/inf = 0:
    # 1 / (1 + e) for x >= 0, e / (1 + e) below (one division, no product: a SiLU epilogue is bound by its
    # vector operations). min(., 0) changes no value; it tells the CPU build that e^. needs no overflow
    # handling (rewrite.fast_exp), which is then no longer NaN's keeper: the last select is.
    e = te.exp(tvm.tirx.min(-tvm.tirx.abs(x), _const(0, x)))
    s = tvm.tirx.Select(x >= _const(0, x), _const(1, x), e) / (_const(1, x) + e)
    return tvm.tirx.Select(tvm.tirx.isnan(x), x, s)


def _softplus(x):
    import tvm
    from tvm import te

    # max(x, 0) + log(1 + e^-|x|): e^-|x| <= 1 cannot overflow, and log1p keeps e^-100 from becoming 0.
    zero = _const(0, x)
    return tvm.tirx.Select(x > zero, x, zero) + tvm.tirx.log1p(te.exp(-tvm.tirx.abs(x)))


def _neg(x):
    # Two's complement for unsigned types: TVM writes -x as x * -1, and has no -1 of an unsigned type; its
    # simplifier also takes 0 - x of u32/u64 as 0 (no underflow assumed).
    return ~x + _const(1, x) if _is_unsigned(x) else -x


Neg = unary("graph.neg", np.negative, "-x:  %y = graph.neg(%x) : tensor<4xf32>", False, lower=_lower(_neg),
            vjp=lambda b, x, y, dy: b.neg(dy), precision="follow")
Abs = unary("graph.abs", np.abs, "|x|:  %y = graph.abs(%x) : tensor<4xf32>", False, lower=_te("abs"),
            vjp=lambda b, x, y, dy: b.mul(dy, _sign(b, x)), precision="follow")
Exp = unary("graph.exp", np.exp, "e^x:  %y = graph.exp(%x) : tensor<4xf32>", lower=_te("exp"),
            vjp=lambda b, x, y, dy: b.mul(dy, y), precision="f32")
Log = unary("graph.log", np.log, "natural log:  %y = graph.log(%x) : tensor<4xf32>", positive=True, lower=_te("log"),
            vjp=lambda b, x, y, dy: b.div(dy, x), precision="f32")
# sqrt's gradient is inf at 0, as PyTorch's.
Sqrt = unary("graph.sqrt", np.sqrt, "square root:  %y = graph.sqrt(%x) : tensor<4xf32>", positive=True,
             lower=_te("sqrt"), vjp=lambda b, x, y, dy: b.div(dy, b.mul(y, scalar(b, 2, y))), precision="f32")
Rsqrt = unary("graph.rsqrt", lambda x: 1 / np.sqrt(x), "1/sqrt(x):  %y = graph.rsqrt(%x) : tensor<4xf32>",
              positive=True, lower=_te("rsqrt"),
              vjp=lambda b, x, y, dy: b.mul(b.mul(dy, scalar(b, -0.5, y)), b.mul(y, b.mul(y, y))), precision="f32")
Reciprocal = unary("graph.reciprocal", lambda x: 1 / x, "1/x:  %y = graph.reciprocal(%x) : tensor<4xf32>",
                   lower=_lower(lambda x: _const(1, x) / x), vjp=lambda b, x, y, dy: b.neg(b.mul(dy, b.mul(y, y))),
                   precision="f32")
Tanh = unary("graph.tanh", np.tanh, "tanh:  %y = graph.tanh(%x) : tensor<4xf32>", lower=_te("tanh"),
             vjp=lambda b, x, y, dy: b.mul(dy, b.sub(scalar(b, 1, y), b.mul(y, y))), precision="follow")
Sigmoid = unary("graph.sigmoid", _sigmoid, "1/(1+e^-x):  %y = graph.sigmoid(%x) : tensor<4xf32>",
                lower=_lower(_sigmoid_te), vjp=lambda b, x, y, dy: b.mul(dy, b.mul(y, b.sub(scalar(b, 1, y), y))),
                precision="follow")
Relu = unary("graph.relu", lambda x: np.maximum(x, 0), "max(x, 0):  %y = graph.relu(%x) : tensor<4xf32>", False,
             lower=_lower(_relu), vjp=_d_relu, precision="follow")
Erf = unary("graph.erf", erf, "the error function:  %y = graph.erf(%x) : tensor<4xf32>", lower=_te("erf"),
            vjp=_d_erf, precision="f32")
Sin = unary("graph.sin", np.sin, "sine:  %y = graph.sin(%x) : tensor<4xf32>", lower=_te("sin"),
            vjp=lambda b, x, y, dy: b.mul(dy, b.cos(x)), precision="f32")
Cos = unary("graph.cos", np.cos, "cosine:  %y = graph.cos(%x) : tensor<4xf32>", lower=_te("cos"),
            vjp=lambda b, x, y, dy: b.neg(b.mul(dy, b.sin(x))), precision="f32")
# floor and ceil are piecewise constant: zero gradient (PyTorch's too).
Floor = unary("graph.floor", np.floor, "round down:  %y = graph.floor(%x) : tensor<4xf32>", lower=_te("floor"),
              vjp=lambda b, x, y, dy: None, precision="follow")
Ceil = unary("graph.ceil", np.ceil, "round up:  %y = graph.ceil(%x) : tensor<4xf32>", lower=_te("ceil"),
             vjp=lambda b, x, y, dy: None, precision="follow")
Softplus = unary("graph.softplus", lambda x: np.logaddexp(0, x), "log(1+e^x):  %y = graph.softplus(%x) : tensor<4xf32>",
                 lower=_lower(_softplus), vjp=lambda b, x, y, dy: b.mul(dy, b.sigmoid(x)), precision="f32")


# Inverse trigonometric and hyperbolic functions: TVM's own (libm's on the CPU), gradients as PyTorch's.
def _rsqrt_of(b: Builder, x: Value, sign: float) -> Value:
    """1 / sqrt(1 + sign * x^2) for sign = -1 (asin, acos) or 1 (asinh)."""
    return b.rsqrt(b.add(scalar(b, 1, x), b.mul(scalar(b, sign, x), b.mul(x, x))))


Tan = unary("graph.tan", np.tan, "tangent:  %y = graph.tan(%x) : tensor<4xf32>", lower=_te("tan"),
            vjp=lambda b, x, y, dy: b.mul(dy, b.add(scalar(b, 1, y), b.mul(y, y))), domain=(-1.2, 1.2),
            precision="f32")
Asin = unary("graph.asin", np.arcsin, "arcsine:  %y = graph.asin(%x) : tensor<4xf32>", lower=_te("asin"),
             vjp=lambda b, x, y, dy: b.mul(dy, _rsqrt_of(b, x, -1)), domain=(-0.9, 0.9), precision="f32")
Acos = unary("graph.acos", np.arccos, "arccosine:  %y = graph.acos(%x) : tensor<4xf32>", lower=_te("acos"),
             vjp=lambda b, x, y, dy: b.neg(b.mul(dy, _rsqrt_of(b, x, -1))), domain=(-0.9, 0.9), precision="f32")
Atan = unary("graph.atan", np.arctan, "arctangent:  %y = graph.atan(%x) : tensor<4xf32>", lower=_te("atan"),
             vjp=lambda b, x, y, dy: b.div(dy, b.add(scalar(b, 1, x), b.mul(x, x))), precision="f32")
def _half_exp(a):
    """e^a / 2 for a large a, as (e^(a/2) / 2) * e^(a/2): finite wherever the result is (e^a alone overflows
    first), and no rounded ln 2 subtracted from a."""
    from tvm import te

    h = te.exp(a * _const(0.5, a))
    return (h * _const(0.5, a)) * h


def _sinh(x):
    import tvm
    from tvm import te

    # TVM's LLVM codegen has no vector sinh/cosh. Near 0, E + E/(E + 1) with E = e^x - 1 (no cancellation, and
    # -0.0 stays -0.0); past 20, e^-|x| is below the last bit of e^|x|.
    a = tvm.tirx.abs(x)
    e = _expm1(x)
    u = te.exp(a)
    one, half = _const(1, x), _const(0.5, x)
    r = tvm.tirx.Select(a < _const(20, x), half * (u - one / u), _half_exp(a))
    return tvm.tirx.Select(a < one, half * (e + e / (e + one)), tvm.tirx.Select(x < _const(0, x), -r, r))


def _cosh(x):
    import tvm
    from tvm import te

    a = tvm.tirx.abs(x)
    u = te.exp(a)
    return tvm.tirx.Select(a < _const(20, x), _const(0.5, x) * (u + _const(1, x) / u), _half_exp(a))


Sinh = unary("graph.sinh", np.sinh, "hyperbolic sine:  %y = graph.sinh(%x) : tensor<4xf32>", lower=_lower(_sinh),
             vjp=lambda b, x, y, dy: b.mul(dy, b.cosh(x)), precision="f32")
Cosh = unary("graph.cosh", np.cosh, "hyperbolic cosine:  %y = graph.cosh(%x) : tensor<4xf32>", lower=_lower(_cosh),
             vjp=lambda b, x, y, dy: b.mul(dy, b.sinh(x)), precision="f32")
Asinh = unary("graph.asinh", np.arcsinh, "inverse hyperbolic sine:  %y = graph.asinh(%x) : tensor<4xf32>",
              lower=_te("asinh"), vjp=lambda b, x, y, dy: b.mul(dy, _rsqrt_of(b, x, 1)), precision="f32")
Acosh = unary("graph.acosh", np.arccosh, "inverse hyperbolic cosine:  %y = graph.acosh(%x) : tensor<4xf32>",
              lower=_te("acosh"), domain=(1.1, 3.0), precision="f32",
              vjp=lambda b, x, y, dy: b.mul(dy, b.rsqrt(b.sub(b.mul(x, x), scalar(b, 1, x)))))
Atanh = unary("graph.atanh", np.arctanh, "inverse hyperbolic tangent:  %y = graph.atanh(%x) : tensor<4xf32>",
              lower=_te("atanh"), domain=(-0.9, 0.9), precision="f32",
              vjp=lambda b, x, y, dy: b.div(dy, b.sub(scalar(b, 1, x), b.mul(x, x))))


class Gelu(Unary, name="graph.gelu"):
    """x·Φ(x), exact or tanh form:  %y = graph.gelu(%x) {approximate = "tanh"} : tensor<4xf32>"""
    precision = "follow"

    approximate = attribute(str, "none", choices=("none", "tanh"))

    def reference(self, x: np.ndarray) -> np.ndarray:
        if self.approximate == "tanh":
            return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))

    def lower(self, x):
        from tvm import te

        def expr(v):
            half, one = _const(0.5, v), _const(1, v)
            if self.approximate == "tanh":
                inner = _const(math.sqrt(2 / math.pi), v) * (v + _const(0.044715, v) * v * v * v)
                return half * v * (one + te.tanh(inner))
            return half * v * (one + te.erf(v * _const(1 / math.sqrt(2), v)))

        return _compute(self, [x], expr)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        x, c = self.x, lambda v: scalar(b, v, self.x)
        if self.approximate == "tanh":
            # With u = k(x + 0.044715 x^3): 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) k (1 + 3 * 0.044715 x^2).
            x2 = b.mul(x, x)
            k = math.sqrt(2 / math.pi)
            t = b.tanh(b.mul(c(k), b.add(x, b.mul(c(0.044715), b.mul(x2, x)))))
            du = b.mul(c(k), b.add(c(1), b.mul(c(3 * 0.044715), x2)))
            d = b.add(b.mul(c(0.5), b.add(c(1), t)), b.mul(b.mul(c(0.5), x), b.mul(b.sub(c(1), b.mul(t, t)), du)))
        else:
            # Phi(x) + x phi(x)
            cdf = b.mul(c(0.5), b.add(c(1), b.erf(b.mul(x, c(1 / math.sqrt(2))))))
            pdf = b.mul(c(1 / math.sqrt(2 * math.pi)), b.exp(b.mul(b.mul(x, x), c(-0.5))))
            d = b.add(cdf, b.mul(x, pdf))
        return [b.mul(dys[0], d)]


class LeakyRelu(Unary, name="graph.leaky_relu"):
    """x if x >= 0 else alpha·x:  %y = graph.leaky_relu(%x) {alpha = 0.1} : tensor<4xf32>"""
    precision = "follow"

    alpha = attribute(float, 0.01)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, self.alpha * x)

    def lower(self, x):
        import tvm

        # x >= 0 is false for NaN, which then goes through alpha * NaN = NaN, as the reference.
        return _compute(self, [x], lambda v: tvm.tirx.Select(v >= _const(0, v), v, _const(self.alpha, v) * v))

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        # alpha at 0, as PyTorch (which tests x > 0).
        dy = dys[0]
        return [b.where(b.greater(self.x, scalar(b, 0, dy)), dy, b.mul(dy, scalar(b, self.alpha, dy)))]


class Elu(Unary, name="graph.elu"):
    """x if x > 0 else alpha·(e^x - 1):  %y = graph.elu(%x) {alpha = 1.0} : tensor<4xf32>"""
    precision = "follow"

    alpha = attribute(float, 1.0)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.where(x > 0, x, self.alpha * np.expm1(np.minimum(x, 0)))

    def lower(self, x):
        import tvm

        # No min(x, 0) inside: TIR's min drops a NaN, and e^x of a large x is discarded by the select anyway.
        return _compute(self, [x], lambda v: tvm.tirx.Select(v > _const(0, v), v, _const(self.alpha, v) * _expm1(v)))

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        # alpha * e^x for x <= 0 (so alpha at 0, as PyTorch); e^x of a large x is computed but never selected.
        dy, x = dys[0], self.x
        neg = b.mul(dy, b.mul(scalar(b, self.alpha, x), b.exp(x)))
        return [b.where(b.greater(x, scalar(b, 0, x)), dy, neg)]


class Clip(Unary, name="graph.clip"):
    """min(max(x, min), max):  %y = graph.clip(%x) {min = 0.0, max = 6.0} : tensor<4xf32>"""
    precision = "follow"

    floats_only = False
    min = attribute(float, -math.inf)
    max = attribute(float, math.inf)

    def reference(self, x: np.ndarray) -> np.ndarray:
        lo, hi = self.min, self.max
        if not np.issubdtype(x.dtype, np.floating):
            # Bounds outside the integer type (or NaN: no bound) clamp to its range instead of overflowing.
            info = np.iinfo(x.dtype)
            lo = info.min if math.isnan(lo) else int(min(max(lo, info.min), info.max))
            hi = info.max if math.isnan(hi) else int(min(max(hi, info.min), info.max))
            return np.minimum(np.maximum(x, x.dtype.type(lo)), x.dtype.type(hi))
        return np.minimum(np.maximum(x, lo), hi)

    def lower(self, x):
        lo, hi = self.min, self.max
        dtype = self.results[0].type.dtype
        if dtype.is_int:
            # As the reference: fractional bounds truncate toward zero, bounds beyond the dtype's range drop out.
            info = np.iinfo(dtype.np)
            lo, hi = int(min(max(lo, info.min), info.max)), int(max(min(hi, info.max), info.min))

        def expr(v):
            if not lo == -math.inf:  # an absent bound costs nothing; a NaN bound makes every element NaN
                v = _fmax(v, _const(lo, v))
            if not hi == math.inf:
                v = _fmin(v, _const(hi, v))
            return v

        return _compute(self, [x], expr)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        # dy where min <= x <= max, bounds included (PyTorch's clamp); an absent bound masks nothing.
        dy, x = dys[0], self.x
        zero = scalar(b, 0, dy)
        if self.min != -math.inf:
            dy = b.where(b.less(x, scalar(b, self.min, x)), zero, dy)
        if self.max != math.inf:
            dy = b.where(b.greater(x, scalar(b, self.max, x)), zero, dy)
        return [dy]


class Cast(Op, name="graph.cast"):
    """Convert the element type:  %y = graph.cast(%x) {dtype = f16} : tensor<4xf16>"""

    kind = "elementwise"
    x = operand()
    dtype = attribute(DType)

    def fold(self) -> Value | None:
        """cast(x: T, T) -> x: converting to the dtype x already has changes nothing."""
        return same_type(self, self.x)

    def infer(self, x: TensorType) -> TensorType:
        return x.with_dtype(self.dtype)

    def flops(self) -> int:
        return 0

    def reference(self, x: np.ndarray) -> np.ndarray:
        if self.dtype is DType.i1:
            return x != 0
        if self.dtype.is_unsigned and not np.issubdtype(x.dtype, np.integer) and x.dtype != np.bool_:
            return _float_to_unsigned(x, self.dtype.np)
        if self.dtype.is_int and np.issubdtype(x.dtype, np.floating):
            x = np.trunc(x)
            if self.dtype in (DType.i8, DType.i16, DType.i32):  # out of range wraps, through i64 (see lower)
                return x.astype(np.int64).astype(self.dtype.np)
        return x.astype(self.dtype.np)

    def lower(self, x):
        import tvm

        def expr(v):
            if _dtype(v) == self.dtype.tvm:
                return v
            if self.dtype is DType.i1 and not _is_float(v):
                return tvm.tirx.NE(v, _const(0, v))  # a bare cast to bool would keep only the lowest bit
            if self.dtype.is_unsigned and _is_float(v):
                # As the reference: through i64, so that a negative value wraps (LLVM's fptoui of one is poison).
                w = v.astype("float64")
                low = w.astype("int64").astype(self.dtype.tvm)
                if self.dtype is not DType.u64:
                    return low
                # From 2^64 on (and +inf) 0, as the reference says: LLVM's conversion there is undefined.
                big = tvm.tirx.Select(w >= tvm.tirx.const(2.0**64, "float64"), tvm.tirx.const(0, "uint64"),
                                      w.astype("uint64"))
                return tvm.tirx.Select(w >= tvm.tirx.const(2.0**63, "float64"), big, low)
            if self.dtype in (DType.i8, DType.i16, DType.i32) and _is_float(v):
                # As the reference: through i64, so that a value out of the type's range wraps on every CPU
                # (LLVM's fptosi of one is poison: AVX-512 code wrapped, AVX2 code saturated).
                return v.astype("int64").astype(self.dtype.tvm)
            # Float -> bool tests for nonzero (NaN is true); float -> int truncates toward zero.
            return v.astype(self.dtype.tvm)

        return _compute(self, [x], expr)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        # Between float types the gradient converts back; through an integer or bool there is none.
        t = self.x.type
        if not (t.dtype.is_float and self.dtype.is_float):
            return [None]
        return [b.cast(dys[0], dtype=t.dtype)]


def _float_to_unsigned(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Truncated toward zero and wrapped modulo 2^bits, as C's conversion through a 64-bit integer: -1.0 as
    u8 is 255, as NumPy gives on x86 (a direct float -> unsigned conversion of a negative is undefined in C)."""
    t = np.trunc(x.astype(np.float64))
    with np.errstate(invalid="ignore"):
        low = t.astype(np.int64).astype(dtype)
        if dtype != np.uint64:
            return low
        high = np.where(t >= 2.0**64, np.uint64(0), t.astype(np.uint64))  # (NumPy's own result there is undefined)
        return np.where(t >= 2.0**63, high, low)


# --- binary ---------------------------------------------------------------------------------------


class Binary(Op):
    """Base of the binary ops: equal dtypes, NumPy broadcasting."""

    kind = "broadcast"
    a = operand()
    b = operand()
    result_bool = False

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype = same_dtype(self, a, b)
        if not self.result_bool or self.name != "graph.equal":
            require_numeric(self, a)
        shape = broadcast_shapes(self, a.shape, b.shape)
        return TensorType(shape, DType.i1 if self.result_bool else dtype)

    on_sizes = None  # fn on sizes that are expressions of names, where fn itself would compare them

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.dtype == object or b.dtype == object:  # sizes computed from named ones (specialize.py)
            return np.frompyfunc(self.on_sizes or self.fn, 2, 1)(a, b)
        return self.fn(a, b)

    def flops(self) -> int:
        return self.result.type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        if self.vjp is None:  # comparisons: piecewise constant, and their i1 result carries no gradient
            return [None, None]
        grads = self.vjp(b, self.a, self.b, self.result, dys[0])
        return [unbroadcast(b, g, v.type.shape) for g, v in zip(grads, self.operands)]


def binary(name: str, fn, doc: str, result_bool: bool = False, lower=None, vjp=None, **policies) -> type[Op]:
    """`vjp(b, a, c, y, dy)` is the gradient rule: the gradients with respect to a and c at the result's
    shape (the base class sums them back over broadcast axes). `policies`: as unary's."""
    extra = {"lower": lower} if lower is not None else {}
    return _define(Binary, name, fn, doc, result_bool=result_bool, vjp=staticmethod(vjp) if vjp else None, **extra,
                   **policies)


# --- identity folds of the binary ops (Op.fold) ----------------------------------------------------------


def _fold_add(op: Op) -> Value | None:
    """x + 0 and 0 + x -> x. Only for constants that are exactly zero everywhere, and only when the result
    has x's type: a broadcasting 0 larger than x would change the shape. For floats only a -0.0 constant:
    -0.0 + (+0.0) is +0.0, so adding +0.0 is not the identity (1/x would flip from -inf to inf)."""
    if zero_with_sign(op.b, True) and same_type(op, op.a):
        return op.a
    if zero_with_sign(op.a, True) and same_type(op, op.b):
        return op.b
    return None


def _fold_sub(op: Op) -> Value | None:
    """x - 0 -> x. Only for an exact-zero constant (for floats +0.0: x - (-0.0) turns -0.0 into +0.0), only
    when the result has x's type (no broadcasting)."""
    return same_type(op, op.a) if zero_with_sign(op.b, False) else None


def _fold_mul(op: Op) -> Value | None:
    """x * 1 and 1 * x -> x. Only for constants exactly one everywhere, only when the result has x's type."""
    if is_constant(op.b, 1) and same_type(op, op.a):
        return op.a
    if is_constant(op.a, 1) and same_type(op, op.b):
        return op.b
    return None


def _fold_div(op: Op) -> Value | None:
    """x / 1 -> x. Only for an exact-one constant, only when the result has x's type (no broadcasting)."""
    return same_type(op, op.a) if is_constant(op.b, 1) else None


# --- gradient rules of the binary ops: vjp(b, a, c, y, dy) with y the result ---------------------------------


def _d_div(b: Builder, a: Value, c: Value, y: Value, dy: Value) -> tuple[Value, Value]:
    # d/dc = -a / c^2, written -(y / c) as PyTorch does.
    return b.div(dy, c), b.neg(b.mul(dy, b.div(y, c)))


def _d_pow(b: Builder, a: Value, e: Value, y: Value, dy: Value) -> tuple[Value, Value]:
    # PyTorch's masks: d/da is 0 where e == 0 (even at a == 0); d/de is 0 where a == 0 and e >= 0.
    zero, one = scalar(b, 0, a), scalar(b, 1, a)
    da = b.where(b.equal(e, zero), zero, b.mul(dy, b.mul(e, b.pow(a, b.sub(e, one)))))
    de = b.mul(dy, b.mul(y, b.log(a)))
    de = b.where(b.equal(a, zero), b.where(b.less(e, zero), de, zero), de)
    return da, de


def _d_extremum(pick) -> object:
    """maximum (pick = greater) or minimum (pick = less): the picked operand takes dy, a tie halves it
    between both, as PyTorch does."""

    def vjp(b: Builder, a: Value, c: Value, y: Value, dy: Value) -> tuple[Value, Value]:
        zero = scalar(b, 0, dy)
        half = b.where(b.equal(a, c), b.mul(dy, scalar(b, 0.5, dy)), zero)
        return b.where(pick(b)(a, c), dy, half), b.where(pick(b)(c, a), dy, half)

    return vjp


def _div_te(a, b):
    import tvm

    if _is_float(a):
        return a / b
    zero, one = _const(0, a), _const(1, a)
    if _is_unsigned(a):  # no INT_MIN / -1 to avoid; x / 0 still traps
        return tvm.tirx.Select(b == zero, zero, tvm.tirx.truncdiv(a, tvm.tirx.Select(b == zero, one, b)))
    # Neither x / 0 nor INT_MIN / -1 may reach the hardware divide, which traps on both.
    safe = tvm.tirx.Select((b == zero) | (b == -one), one, b)
    q = tvm.tirx.truncdiv(a, safe)
    return tvm.tirx.Select(b == zero, zero, tvm.tirx.Select(b == -one, zero - a, q))


def _lower_pow(self, a, b):
    """Floats: te.power, or products of the base where the exponent is a constant 2, 3 or 4 (GELU's x^3: LLVM
    calls the scalar libm pow per element, 1.5 ms for GPT-2's 128 x 3072, and never vectorizes it).
    Integers: exact, wrapping as NumPy does, by 8-bit windows of the exponent."""
    from tvm import te, tirx

    if self.results[0].type.dtype.is_float:
        k = next((k for k in (2, 3, 4) if is_constant(self.operands[1], k)), None)
        if k is not None:  # (x*x)*(x*x) for 4: two roundings, as (x*x)*x for 3
            return _compute(self, [a, b], lambda x, _: (x * x) * (x * x) if k == 4 else x * x * x if k == 3 else x * x)
        return _compute(self, [a, b], te.power)
    # a^e = prod_w (a^(256^w))^(digit w of e). Every power is a product reduction of one earlier stage,
    # never a nested expression: TIR's simplifier expands a chain of squarings to 2^steps terms.
    out = self.results[0].type
    dtype = out.dtype.tvm
    shape_a, shape_b = (v.type.shape for v in self.operands)
    one, zero = tirx.const(1, dtype), tirx.const(0, dtype)
    prod = te.comm_reducer(lambda x, y: x * y, lambda t: tirx.const(1, t), name="prod")
    window = 8

    def exponent(idx):
        return _load(b, shape_b, idx)

    def digit_power(base, w: int):
        """base^(digit w of the exponent), as a product over the digit's range."""
        size = min(1 << window, int(np.iinfo(out.dtype.np).max) + 1)  # i8 exponents have 7 bits
        k = te.reduce_axis((0, size), name=f"k{w}")
        shift = tirx.const(window * w, dtype)
        mask = tirx.const(size - 1, dtype)
        return te.compute(
            out.shape,
            # A select rather than `where=`: te.create_prim_func drops a reduction's condition (TVM 0.27).
            lambda *i: prod(
                tirx.Select(k.var < ((exponent(i) >> shift) & mask).astype(k.var.ty), base(*i), one), axis=k
            ),
            name=f"pow_digit{w}",
        )

    def power_up(prev, w: int):
        """prev^256, the base of the next window."""
        j = te.reduce_axis((0, 1 << window), name=f"j{w}")
        return te.compute(out.shape, lambda *i: prod(prev(*i), axis=j), name=f"pow_base{w}")

    base = te.compute(out.shape, lambda *i: _load(a, shape_a, i), name="pow_base0")
    digits = []
    for w in range(-(-(np.iinfo(out.dtype.np).bits - 1) // window)):
        base = power_up(base, w) if w else base
        digits.append(digit_power(base, w))

    def body(*i):
        x, e = _load(a, shape_a, i), exponent(i)
        power = one
        for d in digits:
            power = power * d(*i)
        if out.dtype.is_unsigned:  # no negative exponents
            return power
        # A negative exponent: 1 / a^|e| truncates to 0 unless |a| is 1.
        inv = tirx.Select((x == one) | (x == -one), tirx.Select((e & one) == one, x, one), zero)
        return tirx.Select(e < zero, inv, power)

    return te.compute(out.shape, body, name="pow")


def _same_float(a, b) -> bool:
    """Both operands one read of one float tensor element (graph.sub(%x, %x), or one value reaching both
    in a fused kernel): TVM's simplifier folds x - x to 0 and x == x to true, which IEEE floats make NaN
    and false where x is NaN (and x - x NaN where x is infinite)."""
    return _is_float(a) and _same_read(a, b)


def _same_read(a, b) -> bool:
    """te.tensor_load of the same tensor at structurally equal indices, under the same casts if any.
    (tvm_ffi.structural_equal has no rule for the tensor inside a load; anything else counts as different.)"""
    import tvm_ffi
    from tvm import tirx
    from tvm.ir.expr import Call

    a, b = (e.asobject() if hasattr(e, "asobject") else e for e in (a, b))
    if isinstance(a, tirx.Cast) and isinstance(b, tirx.Cast):
        return _dtype(a) == _dtype(b) and _same_read(a.value, b.value)
    if not (isinstance(a, Call) and isinstance(b, Call)) or str(a.op.name) != "te.tensor_load" or not a.op.same_as(b.op):
        return False
    return (a.args[0].same_as(b.args[0]) and len(a.args) == len(b.args)
            and all(tvm_ffi.structural_equal(x, y) for x, y in zip(a.args[1:], b.args[1:])))


def _finite(a):
    import tvm

    f = a.astype("float32") if _dtype(a).startswith("bfloat") else a
    return tvm.tirx.isfinite(f)


def _sub(a, b):
    import tvm

    if _same_float(a, b):  # 0 where x is finite, NaN where it is not
        return tvm.tirx.Select(_finite(a), _const(0.0, a), _const(float("nan"), a))
    return a - b


def _compare(node: str):
    """A comparison by its TIR node (EQ, LT, GT); i1 operands compare as i8, which TVM's LLVM codegen needs."""

    def expr(a, b):
        import tvm

        if _dtype(a) == "bool":
            a, b = a.astype("int8"), b.astype("int8")
        if node == "EQ" and _same_float(a, b):  # x == x: false only where x is NaN
            return tvm.tirx.Not(isnan(a))
        return getattr(tvm.tirx, node)(a, b)

    return _lower(expr)


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        # C-style division truncates toward zero, as compiled code does; x/0 is 0 rather than a trap.
        # Exact integer arithmetic: a float64 detour loses i64 values above 2**53.
        # Floored quotient moved up by one where the signs differ and it is inexact (not |a| // |b|: the
        # |INT_MIN| of a two's complement type is INT_MIN again); INT_MIN / -1 wraps to INT_MIN, as -a.
        a, b = np.broadcast_arrays(a, b)
        minus_one = np.zeros(b.shape, bool) if b.dtype.kind == "u" else b == -1
        safe = np.where((b == 0) | minus_one, 1, b).astype(b.dtype)
        q = a // safe
        q = np.where(((a - q * safe) != 0) & ((a < 0) != (safe < 0)), q + 1, q).astype(a.dtype)
        q = np.where(minus_one, np.negative(a), q)
        return np.where(b == 0, 0, q).astype(a.dtype)
    return a / b


def _pow(a, b):
    if np.issubdtype(a.dtype, np.integer):
        # Exact for non-negative exponents (wrapping like C on overflow); a negative one gives 1/a**|b|
        # truncated toward zero, as ONNX Pow on integers does.
        a, b = np.broadcast_arrays(a, b)
        neg = b < 0
        out = np.power(a, np.where(neg, 0, b))
        inv = np.where(np.abs(a) == 1, np.where(np.abs(b) % 2 == 1, a, 1), 0)
        return np.where(neg, inv, out).astype(a.dtype)
    return np.power(a, b)


Add = binary("graph.add", np.add, "a + b:  %z = graph.add(%x, %y) : tensor<4xf32>", lower=_lower(lambda a, b: a + b),
             vjp=lambda b, a, c, y, dy: (dy, dy), fold=_fold_add, precision="follow", commutative=True)
Sub = binary("graph.sub", np.subtract, "a - b:  %z = graph.sub(%x, %y) : tensor<4xf32>",
             lower=_lower(_sub), vjp=lambda b, a, c, y, dy: (dy, b.neg(dy)), fold=_fold_sub,
             precision="follow")
Mul = binary("graph.mul", np.multiply, "a * b:  %z = graph.mul(%x, %y) : tensor<4xf32>",
             lower=_lower(lambda a, b: a * b), vjp=lambda b, a, c, y, dy: (b.mul(dy, c), b.mul(dy, a)),
             fold=_fold_mul, precision="follow", commutative=True)
Div = binary("graph.div", _div, "a / b (integers truncate):  %z = graph.div(%x, %y) : tensor<4xf32>",
             lower=_lower(_div_te), vjp=_d_div, fold=_fold_div, precision="f32", on_sizes=staticmethod(size_div))
Pow = binary("graph.pow", _pow, "a ** b:  %z = graph.pow(%x, %y) : tensor<4xf32>", lower=_lower_pow, vjp=_d_pow,
             precision="f32")
Maximum = binary("graph.maximum", np.maximum, "max(a, b):  %z = graph.maximum(%x, %y) : tensor<4xf32>",
                 lower=_lower(_fmax), vjp=_d_extremum(lambda b: b.greater), precision="follow", commutative=True,
                 on_sizes=staticmethod(size_max))
Minimum = binary("graph.minimum", np.minimum, "min(a, b):  %z = graph.minimum(%x, %y) : tensor<4xf32>",
                 lower=_lower(_fmin), vjp=_d_extremum(lambda b: b.less), precision="follow", commutative=True,
                 on_sizes=staticmethod(size_min))
Equal = binary("graph.equal", np.equal, "a == b:  %z = graph.equal(%x, %y) : tensor<4xi1>", True,
               lower=_compare("EQ"), precision="follow", commutative=True)
Less = binary("graph.less", np.less, "a < b:  %z = graph.less(%x, %y) : tensor<4xi1>", True,
              lower=_compare("LT"), precision="follow")
Greater = binary("graph.greater", np.greater, "a > b:  %z = graph.greater(%x, %y) : tensor<4xi1>", True,
                 lower=_compare("GT"), precision="follow")


# --- bitwise ops and shifts: integers only, no gradient -------------------------------------------------


class IntBinary(Binary):
    """Base of the bitwise binary ops and the shifts: two integer operands of one dtype."""

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype = same_dtype(self, a, b)
        require_int(self, a)
        return TensorType(broadcast_shapes(self, a.shape, b.shape), dtype)


def _bitwise(name: str, fn, doc: str, expr, commutative: bool = True) -> type[Op]:
    return _define(IntBinary, name, fn, doc, vjp=None, lower=_lower(expr), precision="follow",
                   commutative=commutative)


def _shift_in_range(x, y):
    """0 <= y < the width of x's type. The width is 2^k: y >> k == 0 holds for exactly those y of an unsigned
    y (TVM's simplifier turns `y < 32` of a u32 into a subtraction that underflows, and fails)."""
    import tvm

    bits = int(tvm.DataType(_dtype(x)).bits)
    if _is_unsigned(y):
        return (y >> _const(bits.bit_length() - 1, y)) == _const(0, y)
    return (y >= _const(0, y)) & (y < _const(bits, y))


def _shift_left(x, y):
    import tvm

    # A shift by a negative amount or by the width or more is 0, as NumPy's and ONNX's (LLVM's shl is poison
    # there): the amount is made safe before the shift, the result chosen after it.
    ok = _shift_in_range(x, y)
    return tvm.tirx.Select(ok, x << tvm.tirx.Select(ok, y, _const(0, y)), _const(0, x))


def _shift_right(x, y):
    import tvm

    # Arithmetic for signed types (TIR's >> on a signed int is LLVM's ashr). Out of range: the sign alone,
    # -1 for a negative x and 0 otherwise.
    ok = _shift_in_range(x, y)
    fill = _const(0, x) if _is_unsigned(x) else tvm.tirx.Select(x < _const(0, x), _const(-1, x), _const(0, x))
    return tvm.tirx.Select(ok, x >> tvm.tirx.Select(ok, y, _const(0, y)), fill)


BitwiseAnd = _bitwise("graph.bitwise_and", np.bitwise_and, "a & b:  %z = graph.bitwise_and(%x, %y) : tensor<4xi32>",
                      lambda a, b: a & b)
BitwiseOr = _bitwise("graph.bitwise_or", np.bitwise_or, "a | b:  %z = graph.bitwise_or(%x, %y) : tensor<4xi32>",
                     lambda a, b: a | b)
BitwiseXor = _bitwise("graph.bitwise_xor", np.bitwise_xor, "a ^ b:  %z = graph.bitwise_xor(%x, %y) : tensor<4xi32>",
                      lambda a, b: a ^ b)
# NumPy's shifts already give 0 (or -1) for amounts out of [0, width): that is the semantics.
ShiftLeft = _bitwise("graph.shift_left", np.left_shift,
                     "a << b, 0 where b < 0 or b >= the width:  %z = graph.shift_left(%x, %y) : tensor<4xu8>",
                     _shift_left, commutative=False)
ShiftRight = _bitwise("graph.shift_right", np.right_shift,
                      "a >> b (arithmetic for signed types):  %z = graph.shift_right(%x, %y) : tensor<4xu8>",
                      _shift_right, commutative=False)


class BitwiseNot(Unary, name="graph.bitwise_not"):
    """~x, every bit flipped:  %y = graph.bitwise_not(%x) : tensor<4xi32>"""

    precision = "follow"
    floats_only = False

    def infer(self, x: TensorType) -> TensorType:
        require_int(self, x)
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.invert(x)

    def lower(self, x):
        return _compute(self, [x], lambda v: ~v)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [None]


class Where(Op, name="graph.where"):
    """cond ? a : b, broadcasting all three:  %z = graph.where(%c, %x, %y) : tensor<4xf32>"""
    precision = "follow"

    kind = "broadcast"
    cond = operand()
    a = operand()
    b = operand()

    def infer(self, cond: TensorType, a: TensorType, b: TensorType) -> TensorType:
        if cond.dtype is not DType.i1:
            raise self.error(f"condition must be i1, got {cond}")
        dtype = same_dtype(self, a, b)
        return TensorType(broadcast_shapes(self, cond.shape, a.shape, b.shape), dtype)

    def reference(self, cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(cond, a, b)

    def lower(self, cond, a, b):
        import tvm

        return _compute(self, [cond, a, b], lambda c, x, y: tvm.tirx.Select(c, x, y))

    def flops(self) -> int:
        return 0

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        # The condition is boolean: no gradient. Each branch gets dy where it was picked.
        dy, zero = dys[0], scalar(b, 0, dys[0])
        da, db = b.where(self.cond, dy, zero), b.where(self.cond, zero, dy)
        return [None, unbroadcast(b, da, self.a.type.shape), unbroadcast(b, db, self.b.type.shape)]


OPS = [
    Neg, Abs, Exp, Log, Sqrt, Rsqrt, Reciprocal, Tanh, Sigmoid, Relu, Erf, Sin, Cos, Floor, Ceil, Softplus,
    Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh,
    Gelu, LeakyRelu, Elu, Clip, Cast,
    Add, Sub, Mul, Div, Pow, Maximum, Minimum, Equal, Less, Greater, Where,
    BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot, ShiftLeft, ShiftRight,
]  # fmt: skip
