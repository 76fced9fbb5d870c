"""Elementwise ops: unary math, activations, cast, binary arithmetic, comparisons, where.

Ops that differ only in their function share a base class; each op is one line of the table.
"""

from __future__ import annotations

import math
import types

import numpy as np

from compiler.ir import DType, Op, TensorType, attribute, operand
from dialects.graph.common import broadcast_shapes, require_float, require_numeric, same_dtype

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def _topi(path: str):
    """A lowering that calls tvm.topi.<path>; TVM is imported only when code is generated."""

    def lower(self, *xs):
        import tvm.topi as topi

        f = topi
        for part in path.split("."):
            f = getattr(f, part)
        return f(*xs)

    return lower


def _te(expr):
    """A unary lowering from a scalar TE expression builder: expr(x_element) -> element."""

    def lower(self, x):
        from tvm import te

        return te.compute(x.shape, lambda *i: expr(x(*i)), name=self.name.split(".")[-1])

    return lower


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

    def infer(self, x: TensorType) -> TensorType:
        (require_float if self.floats_only else require_numeric)(self, x)
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        return self.fn(x)

    def flops(self) -> int:
        return self.result.type.size

    def input_range(self, index: int) -> tuple[float, float] | None:
        """Random inputs for log/sqrt/rsqrt stay inside their domain."""
        return (0.5, 2.0) if self.positive_domain else None


def unary(name: str, fn, doc: str, floats_only: bool = True, positive: bool = False, lower=None) -> type[Op]:
    extra = {"lower": lower} if lower is not None else {}
    return _define(Unary, name, fn, doc, floats_only=floats_only, positive_domain=positive, **extra)


def _sigmoid(x):
    return np.exp(-np.logaddexp(0, -x))


Neg = unary("graph.neg", np.negative, "-x:  %y = graph.neg(%x) : tensor<4xf32>", False, lower=_topi("negative"))
Abs = unary("graph.abs", np.abs, "|x|:  %y = graph.abs(%x) : tensor<4xf32>", False, lower=_topi("abs"))
Exp = unary("graph.exp", np.exp, "e^x:  %y = graph.exp(%x) : tensor<4xf32>", lower=_topi("exp"))
Log = unary("graph.log", np.log, "natural log:  %y = graph.log(%x) : tensor<4xf32>", positive=True, lower=_topi("log"))
Sqrt = unary("graph.sqrt", np.sqrt, "square root:  %y = graph.sqrt(%x) : tensor<4xf32>", positive=True,
             lower=_topi("sqrt"))
Rsqrt = unary("graph.rsqrt", lambda x: 1 / np.sqrt(x), "1/sqrt(x):  %y = graph.rsqrt(%x) : tensor<4xf32>",
              positive=True, lower=_topi("rsqrt"))
Reciprocal = unary("graph.reciprocal", lambda x: 1 / x, "1/x:  %y = graph.reciprocal(%x) : tensor<4xf32>",
                   lower=_te(lambda x: 1 / x))
Tanh = unary("graph.tanh", np.tanh, "tanh:  %y = graph.tanh(%x) : tensor<4xf32>", lower=_topi("tanh"))
Sigmoid = unary("graph.sigmoid", _sigmoid, "1/(1+e^-x):  %y = graph.sigmoid(%x) : tensor<4xf32>",
                lower=_topi("sigmoid"))
Relu = unary("graph.relu", lambda x: np.maximum(x, 0), "max(x, 0):  %y = graph.relu(%x) : tensor<4xf32>", False,
             lower=_topi("nn.relu"))
Erf = unary("graph.erf", erf, "the error function:  %y = graph.erf(%x) : tensor<4xf32>", lower=_topi("erf"))
Sin = unary("graph.sin", np.sin, "sine:  %y = graph.sin(%x) : tensor<4xf32>", lower=_topi("sin"))
Cos = unary("graph.cos", np.cos, "cosine:  %y = graph.cos(%x) : tensor<4xf32>", lower=_topi("cos"))
Floor = unary("graph.floor", np.floor, "round down:  %y = graph.floor(%x) : tensor<4xf32>", lower=_topi("floor"))
Ceil = unary("graph.ceil", np.ceil, "round up:  %y = graph.ceil(%x) : tensor<4xf32>", lower=_topi("ceil"))
Softplus = unary("graph.softplus", lambda x: np.logaddexp(0, x), "log(1+e^x):  %y = graph.softplus(%x) : tensor<4xf32>")


class Gelu(Unary, name="graph.gelu"):
    """x·Φ(x), exact or tanh form:  %y = graph.gelu(%x) {approximate = "tanh"} : tensor<4xf32>"""

    approximate = attribute(str, "none", choices=("none", "tanh"))

    def reference(self, x: np.ndarray) -> np.ndarray:
        if self.approximate == "tanh":
            return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))


class LeakyRelu(Unary, name="graph.leaky_relu"):
    """x if x >= 0 else alpha·x:  %y = graph.leaky_relu(%x) {alpha = 0.1} : tensor<4xf32>"""

    alpha = attribute(float, 0.01)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, self.alpha * x)


class Elu(Unary, name="graph.elu"):
    """x if x > 0 else alpha·(e^x - 1):  %y = graph.elu(%x) {alpha = 1.0} : tensor<4xf32>"""

    alpha = attribute(float, 1.0)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.where(x > 0, x, self.alpha * np.expm1(np.minimum(x, 0)))


class Clip(Unary, name="graph.clip"):
    """min(max(x, min), max):  %y = graph.clip(%x) {min = 0.0, max = 6.0} : tensor<4xf32>"""

    floats_only = False
    min = attribute(float, -math.inf)
    max = attribute(float, math.inf)

    def reference(self, x: np.ndarray) -> np.ndarray:
        lo, hi = self.min, self.max
        if not np.issubdtype(x.dtype, np.floating):
            info = np.iinfo(x.dtype)
            lo, hi = (int(max(lo, info.min)), int(min(hi, info.max)))
        return np.minimum(np.maximum(x, lo), hi)


class Cast(Op, name="graph.cast"):
    """Convert the element type:  %y = graph.cast(%x) {dtype = f16} : tensor<4xf16>"""

    kind = "elementwise"
    x = operand()
    dtype = attribute(DType)

    def infer(self, x: TensorType) -> TensorType:
        return x.with_dtype(self.dtype)

    def flops(self) -> int:
        return 0

    def reference(self, x: np.ndarray) -> np.ndarray:
        if self.dtype is DType.i1:
            return x != 0
        if self.dtype.is_int and np.issubdtype(x.dtype, np.floating):
            x = np.trunc(x)
        return x.astype(self.dtype.np)


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

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.fn(a, b)

    def flops(self) -> int:
        return self.result.type.size


def binary(name: str, fn, doc: str, result_bool: bool = False, lower=None) -> type[Op]:
    extra = {"lower": lower} if lower is not None else {}
    return _define(Binary, name, fn, doc, result_bool=result_bool, **extra)


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        # C-style division truncates toward zero, as compiled code does; x/0 is 0 rather than a trap.
        # Exact integer arithmetic: a float64 detour loses i64 values above 2**53.
        safe = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe)
        q = np.where((a < 0) != (safe < 0), -q, q)
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


Add = binary("graph.add", np.add, "a + b:  %z = graph.add(%x, %y) : tensor<4xf32>", lower=_topi("add"))
Sub = binary("graph.sub", np.subtract, "a - b:  %z = graph.sub(%x, %y) : tensor<4xf32>", lower=_topi("subtract"))
Mul = binary("graph.mul", np.multiply, "a * b:  %z = graph.mul(%x, %y) : tensor<4xf32>", lower=_topi("multiply"))
Div = binary("graph.div", _div, "a / b (integers truncate):  %z = graph.div(%x, %y) : tensor<4xf32>")
Pow = binary("graph.pow", _pow, "a ** b:  %z = graph.pow(%x, %y) : tensor<4xf32>")
Maximum = binary("graph.maximum", np.maximum, "max(a, b):  %z = graph.maximum(%x, %y) : tensor<4xf32>", lower=_topi("maximum"))
Minimum = binary("graph.minimum", np.minimum, "min(a, b):  %z = graph.minimum(%x, %y) : tensor<4xf32>", lower=_topi("minimum"))
Equal = binary("graph.equal", np.equal, "a == b:  %z = graph.equal(%x, %y) : tensor<4xi1>", True, lower=_topi("equal"))
Less = binary("graph.less", np.less, "a < b:  %z = graph.less(%x, %y) : tensor<4xi1>", True, lower=_topi("less"))
Greater = binary("graph.greater", np.greater, "a > b:  %z = graph.greater(%x, %y) : tensor<4xi1>", True, lower=_topi("greater"))


class Where(Op, name="graph.where"):
    """cond ? a : b, broadcasting all three:  %z = graph.where(%c, %x, %y) : tensor<4xf32>"""

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

    def flops(self) -> int:
        return 0


OPS = [
    Neg, Abs, Exp, Log, Sqrt, Rsqrt, Reciprocal, Tanh, Sigmoid, Relu, Erf, Sin, Cos, Floor, Ceil, Softplus,
    Gelu, LeakyRelu, Elu, Clip, Cast,
    Add, Sub, Mul, Div, Pow, Maximum, Minimum, Equal, Less, Greater, Where,
]  # fmt: skip
