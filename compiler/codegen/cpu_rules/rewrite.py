"""exp, erf, tanh -> vectorizable polynomials (TVM's topi.fast_exp/fast_erf/fast_tanh) where it pays.

LLVM has no vector exp: `T.exp` in a vectorized loop becomes one libm call per lane, which makes a
softmax 4x slower (TVM notes §10: 98 us with exp, 24 us with fast_exp), and a matmul with a GELU
epilogue 3.5x slower (erf). fast_exp is a degree-7
polynomial times 2^n with a relative error below 4e-6 over the float range (denormals aside), exact at 0,
-inf -> 0, inf -> inf, nan -> nan, overflowing where exp does.

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

_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def fast_exp(x):
    """topi.fast_exp's polynomial on one float32 expression, over the whole float range; exp itself for any
    other dtype. 2^n is applied as two factors 2^(n>>1) and 2^(n-(n>>1)), each a normal float, so that
    results near overflow (up to 3.4e38) and down into the denormals come out right, where one factor
    2^n clamped x to [-88.38, 88.38]: exp(88.5) was inf and exp(-88) 0. (Binding the repeated subterms
    with Let makes the text 2x smaller but the kernel 1.5x slower.)"""
    dtype = str(getattr(x, "dtype", None) or x.ty.dtype)
    if dtype != "float32":
        return tirx.exp(x)

    def c(v: float):
        return tirx.const(v, "float32")

    # Above 88.73 every result is inf (it overflows in the last product); below -104, 0.
    clamped = tirx.max(tirx.min(x, c(88.73)), c(-104.0))
    n = tirx.floor(clamped * c(1.44269504088896341) + c(0.5))
    r = clamped - n * c(0.6931471805599453)
    y = c(_P[0])
    for p in _P[1:]:
        y = y * r + c(p)
    y = y * r * r + r + c(1.0)
    ni = tirx.Cast("int32", n)
    half = ni >> 1
    scale = [tirx.reinterpret("float32", (k + tirx.const(127, "int32")) << 23) for k in (half, ni - half)]
    return tirx.max(scale[0] * (scale[1] * y), x)  # x itself where it wins: +inf, nan


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


FAST = {"exp": fast_exp, "erf": fast_erf, "tanh": fast_tanh}
_FAST_OPS = {f"tirx.{name}": f for name, f in FAST.items()}


def rewrite(prim: tirx.PrimFunc, fast_math: bool = True, unaligned: bool = False) -> tirx.PrimFunc:
    """`prim` with float32 exp/erf/tanh replaced by their fast forms (`fast_math`) and its parameters
    declared aligned to their element size only (`unaligned`).

    TVM assumes 64-byte aligned parameters and emits aligned vector loads, so a NumPy array (malloc
    aligns to 16) must otherwise be copied first; declared element-aligned, the same kernel runs
    on any array at the same speed (unaligned vector loads cost nothing extra on aligned data).
    """

    def fast(call):
        f = _FAST_OPS.get(str(getattr(call.op, "name", "")))
        return f(call.args[0]) if f is not None and str(call.ty.dtype) == "float32" else call

    if fast_math:
        prim = tvm_ffi.structural_map(prim, [(Call, fast)])
    if unaligned:
        prim = redeclare_params(prim, {i: None for i, p in enumerate(prim.params) if isinstance(p.ty, BufferType)})
    return prim
