"""exp, erf, tanh -> vectorizable polynomials (TVM's topi.fast_exp/fast_erf/fast_tanh) where it pays.

LLVM has no vector exp: `T.exp` in a vectorized loop becomes one libm call per lane, which makes a
softmax 4x slower (TVM notes §10: 98 us with exp, 24 us with fast_exp), and a matmul with a GELU
epilogue 3.5x slower (erf). fast_exp is a degree-5 polynomial times 2^n, within 2 ulp over the float
range; `exp(min(x, c))` with a constant c <= 0 (sigmoid's e^-|x|) takes a shorter form without overflow.

The rewrite maps the PrimFunc with tvm_ffi's structural_map (about 0.5 ms a kernel; printing it as
TVMScript and parsing it back with the calls replaced took 10-100 ms, most of a large model's compile
time), which also relaxes the parameters' alignment (see `rewrite`).
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx
from tvm.ir.expr import Call
from tvm.tirx.buffer import BufferType

from compiler.codegen.sblocks import redeclare_params
from compiler.codegen.target import cpu

# e^r = 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3) on |r| <= ln2 / 2, near-minimax in relative error (a
# Lawson-weighted fit): with ln2 in two parts, within 2 ulp of the rounded exp over the float range.
_P = (8.312525049471088e-3, 4.189011343158349e-2, 1.666711446423517e-1, 4.999923178892121e-1)
_LOG2E = 1.4426950408889634
_LN2 = (0.693145751953125, 1.428606765330187e-06)  # hi (its last 11 bits zero: n * hi is exact) and lo
_ROUND = 12582912.0  # 1.5 * 2^23: x + _ROUND is x rounded to an integer, which the low mantissa bits hold


def fast_exp(x, at_most_zero: bool = False, scalef: bool = False):
    """e^x on one float32 expression (exp itself for any other dtype), within 2 ulp over the float range
    and exact at 0, -inf -> 0, inf -> inf, nan -> nan, overflowing where exp does, denormals right.

    x = n ln2 + r with n = round(x / ln2) taken by adding 1.5 * 2^23, whose low mantissa bits then hold
    n + b: shifted into the exponent field and added to the polynomial's bits they scale it by 2^(n + b),
    and a multiply by 2^-b rounds once, into the denormals too (b = 32 below zero, -1 above, so that
    2^(n + b) stays a normal float). `at_most_zero`: the caller knows x <= 0 or does not care what a NaN
    gives (sigmoid's e^-|x| keeps NaN itself): no overflow to handle, 15 vector operations instead of 19.
    `scalef` (AVX-512): the polynomial scaled by 2^n with llvm.ldexp, one vscalefps that rounds into the
    denormals and overflows to inf by itself: 12 operations, or 13 with the overflow (a SiLU epilogue is
    bound by its vector operations: EfficientNet-B0's 16 -> 96 1x1 conv at 112x112, Zen 4)."""
    dtype = str(getattr(x, "dtype", None) or x.ty.dtype)
    if dtype != "float32":
        return tirx.exp(x)

    def c(v: float):
        return tirx.const(v, "float32")

    if scalef:
        # (the clamps keep n within the rounding trick's range; e^-104 rounds to 0, e^88.73 to inf)
        clamped = tirx.max(x if at_most_zero else tirx.min(x, c(88.73)), c(-104.0))
        bias = c(_ROUND)  # (no unbias: vscalefps rounds into the denormals itself)
    elif at_most_zero:
        clamped = tirx.max(x, c(-104.0))  # below, every result is 0
        bias, unbias = c(_ROUND + 32), c(2.0**-32)
    else:
        # Above 88.73 every result is inf (it overflows in the last product); below -104, 0.
        clamped = tirx.max(tirx.min(x, c(88.73)), c(-104.0))
        below = clamped < c(0.0)
        bias, unbias = tirx.Select(below, c(_ROUND + 32), c(_ROUND - 1)), tirx.Select(below, c(2.0**-32), c(2.0))
    t = clamped * c(_LOG2E) + bias
    # n from the bits: TVM's simplifier folds the float (a + b) - b to a, which is not a rounding.
    n_int = tirx.reinterpret("int32", t) - tirx.reinterpret("int32", bias)
    n = tirx.Cast("float32", n_int)
    r = clamped - n * c(_LN2[0])
    r = r - n * c(_LN2[1])
    y = c(_P[0])
    for p in _P[1:]:
        y = y * r + c(p)
    y = (y * r + c(1.0)) * r + c(1.0)
    if scalef:
        e = tirx.call_llvm_pure_intrin("float32", "llvm.ldexp", y, n_int)
        return e if at_most_zero else tirx.max(e, x)
    scaled = tirx.reinterpret("int32", y) + (tirx.reinterpret("int32", t) << 23)
    e = tirx.reinterpret("float32", scaled) * unbias
    return e if at_most_zero else tirx.max(e, x)  # x itself where it wins: +inf, nan


# x * P(x^2) / Q(x^2) on a clamped x: Eigen's float approximations, as topi.fast_erf / fast_tanh.
_ERF = (4.0, (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
              -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02),
        (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
         -1.42647390514189e-02))
_TANH = (9.0, (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
               1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03),
         (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03))


def _odd_rational(x, spec, exact):
    dtype = str(getattr(x, "dtype", None) or x.ty.dtype)
    if dtype != "float32":
        return exact(x)
    bound, num, den = spec
    c = [tirx.const(v, "float32") for v in (bound, -bound)]
    nan = x
    x = tirx.max(tirx.min(x, c[0]), c[1])
    x2 = x * x
    p = tirx.const(num[0], "float32")
    for v in num[1:]:
        p = x2 * p + tirx.const(v, "float32")
    q = tirx.const(den[0], "float32")
    for v in den[1:]:
        q = x2 * q + tirx.const(v, "float32")
    return tirx.Select(tirx.isnan(nan), nan, x * p / q)  # the clamp would make a NaN +-1


def fast_erf(x):
    """topi.fast_erf: absolute error below 1e-6; NaN stays NaN."""
    return _odd_rational(x, _ERF, tirx.erf)


def fast_tanh(x):
    """topi.fast_tanh: absolute error below 1e-6."""
    return _odd_rational(x, _TANH, tirx.tanh)


def _at_most_zero(e):
    """The argument to take e^. of in the short form (`fast_exp`'s at_most_zero) where `e` is min(a, c) with a
    constant c <= 0, else None: -|x| itself for min(-|x|, 0), equal but for a NaN (sigmoid's e^-|x|, whose
    NaN its select or SiLU's product keeps: its e^. no one reads), else the min."""
    if not (isinstance(e, tirx.Min) and isinstance(e.b, tirx.FloatImm) and e.b.value <= 0):
        return None
    a = e.a
    negated_abs = (isinstance(a, tirx.Mul) and isinstance(a.b, tirx.FloatImm) and a.b.value < 0
                   and isinstance(a.a, Call) and a.a.op.name == "tirx.fabs")
    return a if negated_abs and e.b.value == 0 else e


FAST = {"exp": fast_exp, "erf": fast_erf, "tanh": fast_tanh}
_FAST_OPS = {f"tirx.{name}": f for name, f in FAST.items()}


def nan_kept_by_product(prim: tirx.PrimFunc) -> tirx.PrimFunc:
    """`prim` with x * select(isnan(x), x, b) as x * b: the product is NaN where x is, so the select that
    keeps a NaN is not needed (SiLU's x * sigmoid(x) once the schedule has inlined the sigmoid: two of its
    epilogue's 22 vector operations)."""
    structural_equal = tvm_ffi.structural_equal

    def kept(s, x) -> bool:
        return (isinstance(s, tirx.Select) and isinstance(s.condition, Call) and s.condition.op.name == "tirx.isnan"
                and structural_equal(s.condition.args[0], x) and structural_equal(s.true_value, x))

    def product(m):
        if kept(m.b, m.a):
            return tirx.Mul(m.a, m.b.false_value)
        if kept(m.a, m.b):
            return tirx.Mul(m.a.false_value, m.b)
        return m

    return tvm_ffi.structural_map(prim, [(tirx.Mul, product)])


def rewrite(prim: tirx.PrimFunc, fast_math: bool = True, unaligned: bool = False,
            scalef: bool | None = None) -> tirx.PrimFunc:
    """`prim` with float32 exp/erf/tanh replaced by their fast forms (`fast_math`) and its parameters
    declared aligned to their element size only (`unaligned`). `scalef`: exp scales by vscalefps
    (default: where the CPU built for has AVX-512; elsewhere LLVM would call ldexpf once per lane).

    TVM assumes 64-byte aligned parameters and emits aligned vector loads, so a NumPy array (malloc
    aligns to 16) must otherwise be copied first; declared element-aligned, the same kernel runs
    on any array at the same speed (unaligned vector loads cost nothing extra on aligned data).
    """

    if scalef is None:
        scalef = cpu().vector_bytes >= 64

    def fast(call):
        f = _FAST_OPS.get(str(getattr(call.op, "name", "")))
        if f is None or str(call.ty.dtype) != "float32":
            return call
        arg = call.args[0]
        if f is not fast_exp:
            return f(arg)
        short = _at_most_zero(arg)
        return fast_exp(arg, scalef=scalef) if short is None else fast_exp(short, at_most_zero=True, scalef=scalef)

    if fast_math:
        prim = tvm_ffi.structural_map(prim, [(Call, fast)])
    if unaligned:
        prim = redeclare_params(prim, {i: None for i, p in enumerate(prim.params) if isinstance(p.ty, BufferType)})
    return prim
