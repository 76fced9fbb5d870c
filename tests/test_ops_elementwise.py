"""The elementwise ops against independent oracles: each expected value comes from `math` on Python floats,
explicit formulas and Python loops (broadcasting included), then is rounded once to the declared dtype."""

from __future__ import annotations

import itertools
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from helpers import infer_error, run_op

from compiler.ir import DType, lookup_op
from dialects.graph import elementwise

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.float32, np.float64, np.float16, BF16]
INTS = [np.int8, np.int32, np.int64]
# Relative tolerance per dtype: a few ulps of f32/f64 (the op may compute in the operand's precision), one ulp of
# the 16-bit floats (computed in f32, rounded once, which may differ from rounding the exact value by one ulp).
RTOL = {np.dtype(np.float32): 4e-6, np.dtype(np.float64): 1e-12, np.dtype(np.float16): 1e-3, BF16: 8e-3}
ATOL = {np.dtype(np.float32): 1e-7, np.dtype(np.float64): 1e-15, np.dtype(np.float16): 1e-4, BF16: 1e-3}


def check(got: np.ndarray, want, dtype, exact: bool = False) -> None:
    """`got` has the declared dtype and want's shape, and matches `want` (NaN where want is NaN)."""
    dtype = np.dtype(dtype)
    want = np.asarray(want, dtype=np.float64 if dtype.kind == "f" or dtype == BF16 else dtype).astype(dtype)
    assert got.dtype == dtype, f"dtype {got.dtype}, expected {dtype}"
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    # Compared in f64: NumPy's testing helpers do not see a bf16 NaN as equal to another.
    g, w = got.astype(np.float64), want.astype(np.float64)
    if exact:
        np.testing.assert_array_equal(g, w)
        return
    np.testing.assert_allclose(g, w, rtol=RTOL[dtype], atol=ATOL[dtype], equal_nan=True)
    assert (np.signbit(g) == np.signbit(w))[np.isinf(w)].all(), "an infinity has the wrong sign"


def apply1(fn, x: np.ndarray) -> np.ndarray:
    """fn on every element, as Python floats (or ints), in float64."""
    out = [fn(v) for v in x.astype(np.float64).reshape(-1).tolist()]
    return np.array(out, dtype=np.float64).reshape(x.shape)


def index_into(shape: tuple[int, ...], out_index: tuple[int, ...]) -> tuple[int, ...]:
    """The element of an operand of `shape` that broadcasting reads for `out_index` (right-aligned, 1 repeats)."""
    tail = out_index[len(out_index) - len(shape) :] if shape else ()
    return tuple(0 if d == 1 else i for d, i in zip(shape, tail))


def apply_n(fn, out_shape: tuple[int, ...], *xs: np.ndarray, dtype=np.float64) -> np.ndarray:
    """fn over the broadcast of xs, one output element at a time; operands are read as Python scalars."""
    out = np.zeros(out_shape, dtype=dtype)
    for idx in itertools.product(*(range(d) for d in out_shape)):
        out[idx] = fn(*(x[index_into(x.shape, idx)].item() for x in xs))
    return out


def _exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _log(v: float) -> float:
    if v == 0:
        return -math.inf
    return math.log(v) if v > 0 else math.nan


def _sigmoid(v: float) -> float:
    # e^-v overflows only for v < -709, where the answer is 0 anyway.
    return 1.0 / (1.0 + _exp(-v))


def _softplus(v: float) -> float:
    # log(1 + e^v) = v + log(1 + e^-v): the second form cannot overflow for large v.
    return v + math.log1p(math.exp(-v)) if v > 0 else math.log1p(math.exp(v))


def _gelu(v: float) -> float:
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


# --- every op: registry, kind, docstring ------------------------------------------------------------

UNARY_NAMES = [
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "erf", "sin", "cos",
    "floor", "ceil", "softplus", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "gelu",
    "leaky_relu", "elu", "clip",
]  # fmt: skip
BINARY_NAMES = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
COMPARE_NAMES = ["equal", "less", "greater"]
# Integers only (tests/test_int_dtypes.py has their values).
BITWISE_NAMES = ["bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right"]


def test_elementwise_module_lists_exactly_these_ops() -> None:
    want = [*UNARY_NAMES, "cast", *BINARY_NAMES, *COMPARE_NAMES, "where", *BITWISE_NAMES, "bitwise_not"]
    assert sorted(op.name for op in elementwise.OPS) == sorted(f"graph.{n}" for n in want)


@pytest.mark.parametrize("name", [*UNARY_NAMES, "cast"])
def test_unary_ops_and_cast_are_elementwise(name: str) -> None:
    assert lookup_op(f"graph.{name}").kind == "elementwise"


@pytest.mark.parametrize("name", [*BINARY_NAMES, *COMPARE_NAMES, "where", *BITWISE_NAMES])
def test_binary_compare_and_where_are_broadcast(name: str) -> None:
    assert lookup_op(f"graph.{name}").kind == "broadcast"


@pytest.mark.parametrize("name", [*UNARY_NAMES, "cast", *BINARY_NAMES, *COMPARE_NAMES, "where", *BITWISE_NAMES,
                                  "bitwise_not"])
def test_each_op_has_a_one_line_gir_docstring(name: str) -> None:
    doc = lookup_op(f"graph.{name}").__doc__
    assert f"graph.{name}(" in doc and " : tensor<" in doc


# --- unary float ops: values in every float dtype ----------------------------------------------------

GENERAL = np.array([[-2.5, -1.0, -0.3, 0.0], [0.4, 1.0, 2.7, 3.5]])
POSITIVE = np.array([[0.25, 0.5, 1.0], [2.0, 3.0, 9.0]])
NONZERO = np.array([[-4.0, -0.5, 0.25], [1.0, 3.0, 8.0]])
# The domains of asin, acos, atanh (ends and outside: inf or NaN) and acosh (below 1: NaN).
UNIT = np.array([[-1.5, -1.0, -0.7, -0.0], [0.2, 0.9, 1.0, 2.0]])
ABOVE_ONE = np.array([[0.5, 1.0, 1.25], [2.0, 10.0, 1e4]])


def _nan_outside(fn, lo: float, hi: float):
    """fn inside [lo, hi] (math raises outside, where NumPy and the kernels give NaN)."""
    return lambda v: fn(v) if lo <= v <= hi else math.nan


def _atanh(v: float) -> float:
    if abs(v) == 1:
        return math.copysign(math.inf, v)
    return math.atanh(v) if abs(v) < 1 else math.nan


def _overflowing(fn):
    def f(v: float) -> float:
        try:
            return fn(v)
        except OverflowError:
            return math.copysign(math.inf, v) if fn is math.sinh else math.inf

    return f

UNARY = {
    "neg": (lambda v: -v, GENERAL, {}),
    "abs": (abs, GENERAL, {}),
    "exp": (math.exp, GENERAL, {}),
    "log": (math.log, POSITIVE, {}),
    "sqrt": (math.sqrt, POSITIVE, {}),
    "rsqrt": (lambda v: 1.0 / math.sqrt(v), POSITIVE, {}),
    "reciprocal": (lambda v: 1.0 / v, NONZERO, {}),
    "tanh": (math.tanh, GENERAL, {}),
    "sigmoid": (_sigmoid, GENERAL, {}),
    "relu": (lambda v: v if v > 0 else 0.0, GENERAL, {}),
    "erf": (math.erf, GENERAL, {}),
    "sin": (math.sin, GENERAL, {}),
    "cos": (math.cos, GENERAL, {}),
    "floor": (math.floor, GENERAL, {}),
    "ceil": (math.ceil, GENERAL, {}),
    "softplus": (_softplus, GENERAL, {}),
    "tan": (math.tan, GENERAL, {}),
    "asin": (_nan_outside(math.asin, -1, 1), UNIT, {}),
    "acos": (_nan_outside(math.acos, -1, 1), UNIT, {}),
    "atan": (math.atan, NONZERO, {}),
    "sinh": (_overflowing(math.sinh), GENERAL, {}),
    "cosh": (_overflowing(math.cosh), GENERAL, {}),
    "asinh": (math.asinh, NONZERO, {}),
    "acosh": (_nan_outside(math.acosh, 1, math.inf), ABOVE_ONE, {}),
    "atanh": (_atanh, UNIT, {}),
    "gelu": (_gelu, GENERAL, {}),
    "gelu_tanh": (_gelu_tanh, GENERAL, {"approximate": "tanh"}),
    "leaky_relu": (lambda v: v if v >= 0 else 0.01 * v, GENERAL, {}),
    "leaky_relu_alpha": (lambda v: v if v >= 0 else 0.2 * v, GENERAL, {"alpha": 0.2}),
    "elu": (lambda v: v if v > 0 else math.exp(v) - 1.0, GENERAL, {}),
    "elu_alpha": (lambda v: v if v > 0 else 0.5 * (math.exp(v) - 1.0), GENERAL, {"alpha": 0.5}),
    "clip": (lambda v: min(max(v, -1.0), 1.5), GENERAL, {"min": -1.0, "max": 1.5}),
    "clip_min_only": (lambda v: max(v, 0.0), GENERAL, {"min": 0.0}),
    "clip_max_only": (lambda v: min(v, 0.5), GENERAL, {"max": 0.5}),
}


def _op_name(case: str) -> str:
    return next(n for n in sorted(UNARY_NAMES, key=len, reverse=True) if case == n or case.startswith(n + "_"))


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("case", list(UNARY))
def test_unary_op_matches_math_in_every_float_dtype(case: str, dtype) -> None:
    fn, values, attrs = UNARY[case]
    x = values.astype(dtype)
    # The oracle reads the operand as it was rounded to its dtype, so only the op's own rounding differs.
    check(run_op(_op_name(case), x, **attrs), apply1(fn, x), dtype)


def test_every_unary_op_has_a_value_case() -> None:
    assert {_op_name(c) for c in UNARY} == set(UNARY_NAMES)


@pytest.mark.parametrize(
    "name",
    ["neg", "exp", "tanh", "clip", "gelu_tanh", "erf", "gelu"],
)  # fmt: skip
def test_unary_op_on_a_scalar_keeps_rank_0(name: str) -> None:
    fn, _, attrs = UNARY[name]
    x = np.array(0.75, dtype=np.float32)
    got = run_op(_op_name(name), x, **attrs)
    check(got, fn(0.75), np.float32)
    assert got.shape == ()


def test_unary_op_on_an_empty_tensor_gives_an_empty_tensor() -> None:
    got = run_op("exp", np.zeros((0, 3), dtype=np.float32))
    check(got, np.zeros((0, 3)), np.float32)


def test_floor_and_ceil_round_halves_down_and_up() -> None:
    x = np.array([-1.5, -0.5, 0.5, 1.5], dtype=np.float32)
    check(run_op("floor", x), [-2.0, -1.0, 0.0, 1.0], np.float32, exact=True)
    check(run_op("ceil", x), [-1.0, -0.0, 1.0, 2.0], np.float32, exact=True)


def test_gelu_forms_differ_slightly_between_exact_and_tanh() -> None:
    x = np.array([1.0], dtype=np.float64)
    exact, approx = run_op("gelu", x)[0], run_op("gelu", x, approximate="tanh")[0]
    assert exact == pytest.approx(0.8413447460685429, rel=1e-12)  # 1 * Phi(1)
    assert approx == pytest.approx(0.8411919906082768, rel=1e-12)
    assert exact != approx


# --- unary ops on integers --------------------------------------------------------------------------

INT_VALUES = np.array([-7, -2, -1, 0, 1, 3, 100])


@pytest.mark.parametrize("dtype", INTS, ids=["i8", "i32", "i64"])
@pytest.mark.parametrize(
    "name,fn",
    [("neg", lambda v: -v), ("abs", abs), ("relu", lambda v: max(v, 0))],
    ids=["neg", "abs", "relu"],
)
def test_integer_unary_op_stays_integer(name: str, fn, dtype) -> None:
    x = INT_VALUES.astype(dtype)
    want = np.array([fn(int(v)) for v in x], dtype=dtype)
    check(run_op(name, x), want, dtype)


@pytest.mark.parametrize("dtype", INTS, ids=["i8", "i32", "i64"])
def test_clip_on_integers_with_integral_float_bounds(dtype) -> None:
    x = INT_VALUES.astype(dtype)
    want = [min(max(int(v), 0), 6) for v in x]  # relu6
    check(run_op("clip", x, min=0.0, max=6.0), want, dtype)


def test_clip_on_integers_with_fractional_bounds_truncates_the_clipped_value_toward_zero() -> None:
    # As computing in real numbers and then converting to the declared integer type: clip(-7, -1.5) = -1.5 -> -1.
    x = np.array([-7, -2, -1, 0, 1, 2, 3, 100], dtype=np.int32)
    want = [math.trunc(min(max(float(v), -1.5), 2.5)) for v in x]
    check(run_op("clip", x, min=-1.5, max=2.5), want, np.int32)
    assert want == [-1, -1, -1, 0, 1, 2, 2, 2]


def test_clip_on_i8_with_bounds_beyond_its_range_leaves_values_alone() -> None:
    x = np.array([-128, -5, 0, 127], dtype=np.int8)
    check(run_op("clip", x, min=-1000.0, max=1e10), [-128, -5, 0, 127], np.int8)
    check(run_op("clip", x), [-128, -5, 0, 127], np.int8)


def test_clip_with_infinite_bounds_is_the_identity_on_floats() -> None:
    x = np.array([-math.inf, -3.0, 0.0, 5.0, math.inf], dtype=np.float32)
    check(run_op("clip", x), x, np.float32, exact=True)


# --- extreme values -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,fn", [("sigmoid", _sigmoid), ("softplus", _softplus)])
def test_sigmoid_and_softplus_of_large_magnitudes_are_finite_and_right(name: str, fn, dtype) -> None:
    x = np.array([-1000.0, -100.0, -30.0, 30.0, 100.0, 1000.0], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow on the way must not happen, let alone become a NaN
        got = run_op(name, x)
    check(got, apply1(fn, x), dtype)
    assert np.isfinite(got).all()


def test_sigmoid_saturates_to_exactly_zero_and_one() -> None:
    got = run_op("sigmoid", np.array([-1000.0, 1000.0], dtype=np.float32))
    check(got, [0.0, 1.0], np.float32, exact=True)


def test_softplus_of_minus_100_is_e_to_the_minus_100_not_zero() -> None:
    got = run_op("softplus", np.array([-100.0], dtype=np.float64))
    assert got[0] == pytest.approx(math.exp(-100.0), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_sigmoid_and_softplus_of_large_magnitudes_in_16_bit_floats(dtype) -> None:
    x = np.array([-100.0, 100.0], dtype=dtype)
    check(run_op("sigmoid", x), [0.0, 1.0], dtype, exact=True)
    check(run_op("softplus", x), [0.0, 100.0], dtype, exact=True)


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64", "f16", "bf16"])
def test_exp_overflows_to_inf_and_underflows_to_zero(dtype) -> None:
    big = 1000.0 if np.dtype(dtype) == np.float64 else 100.0
    got = run_op("exp", np.array([-1000.0, big], dtype=dtype))
    check(got, [0.0, math.inf], dtype, exact=True)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_exp_past_f16_range_is_inf() -> None:
    # e^12 = 162755 > 65504, the largest f16: finite in f32 but rounds to inf in f16.
    check(run_op("exp", np.array([12.0], dtype=np.float16)), [math.inf], np.float16, exact=True)


@pytest.mark.filterwarnings("ignore:divide by zero", "ignore:invalid value")
@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64", "f16", "bf16"])
def test_log_of_zero_is_minus_inf_and_of_a_negative_is_nan(dtype) -> None:
    got = run_op("log", np.array([0.0, -0.0, -1.0, math.inf], dtype=dtype))
    check(got, [-math.inf, -math.inf, math.nan, math.inf], dtype, exact=True)


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_reciprocal_and_rsqrt_of_zero_are_signed_inf() -> None:
    x = np.array([0.0, -0.0], dtype=np.float32)
    check(run_op("reciprocal", x), [math.inf, -math.inf], np.float32, exact=True)
    check(run_op("rsqrt", np.array([0.0], dtype=np.float32)), [math.inf], np.float32, exact=True)


def test_saturating_activations_at_plus_minus_100() -> None:
    x = np.array([-100.0, 100.0], dtype=np.float32)
    check(run_op("tanh", x), [-1.0, 1.0], np.float32, exact=True)
    check(run_op("erf", x), [-1.0, 1.0], np.float32, exact=True)
    check(run_op("elu", x, alpha=2.0), [-2.0, 100.0], np.float32, exact=True)
    check(run_op("gelu", x), [0.0, 100.0], np.float32, exact=True)
    check(run_op("gelu", x, approximate="tanh"), [0.0, 100.0], np.float32, exact=True)


@pytest.mark.parametrize("name,attrs", [("relu", {}), ("clip", {"min": 0.0, "max": 6.0}), ("leaky_relu", {})])
def test_activation_of_nan_is_nan(name: str, attrs: dict) -> None:
    got = run_op(name, np.array([math.nan, 1.0], dtype=np.float32), **attrs)
    assert math.isnan(got[0]) and got[1] == 1.0


# --- binary ops: values, broadcasting, dtypes -----------------------------------------------------------


def _max(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def _min(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else min(a, b)


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": math.pow,
    "maximum": _max,
    "minimum": _min,
}

# (shape of a, shape of b, result shape), written out rather than computed.
BROADCASTS = [
    ((2, 3), (2, 3), (2, 3)),
    ((), (2, 3), (2, 3)),
    ((2, 3), (), (2, 3)),
    ((3,), (2, 3), (2, 3)),
    ((2, 1), (1, 3), (2, 3)),
    ((4, 1, 3), (2, 1), (4, 2, 3)),
    ((), (), ()),
    ((1,), (), (1,)),
    ((0, 3), (3,), (0, 3)),
]


def values(shape: tuple[int, ...], seed: int, dtype, positive: bool = False) -> np.ndarray:
    """Real-looking values in [0.5, 3] (positive) or [-3, 3], away from 0 so that division is safe."""
    rng = np.random.default_rng(seed)
    mag = rng.uniform(0.5, 3.0, size=shape)
    sign = 1.0 if positive else rng.choice([-1.0, 1.0], size=shape)
    return np.asarray(mag * sign).astype(dtype)


@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("name", BINARY_NAMES)
def test_binary_op_broadcasts_like_numpy(name: str, shapes) -> None:
    sa, sb, out = shapes
    a = values(sa, 1, np.float32, positive=name == "pow")
    b = values(sb, 2, np.float32)
    check(run_op(name, a, b), apply_n(BINARY[name], out, a, b), np.float32)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("name", BINARY_NAMES)
def test_binary_op_matches_math_in_every_float_dtype(name: str, dtype) -> None:
    a = values((2, 3), 3, dtype, positive=name == "pow")
    b = values((3,), 4, dtype)
    check(run_op(name, a, b), apply_n(BINARY[name], (2, 3), a, b), dtype)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", ["add", "sub", "mul"])
def test_16_bit_float_arithmetic_is_rounded_once_to_the_declared_dtype(name: str, dtype) -> None:
    # Sums and products of 16-bit floats are exact in f32, so one rounding gives the correctly rounded
    # result bit for bit; the cases include halfway points (round to even) and results needing more bits.
    a = np.array([1.0, 1.0, 3.0, 255.0, 0.1, 1000.0], dtype=dtype)
    b = np.array([0.01171875, 2.0**-11, 0.3, 1.5, 7.0, -0.7], dtype=dtype)
    want = apply_n(BINARY[name], (6,), a, b).astype(dtype)
    check(run_op(name, a, b), want, dtype, exact=True)


def test_bf16_add_rounds_a_tie_to_even() -> None:
    # 1 + 1.5 * 2^-7 lies halfway between the bf16 neighbours 1 + 2^-7 and 1 + 2^-6: the even one wins.
    a = np.array([1.0], dtype=BF16)
    b = np.array([0.01171875], dtype=BF16)
    check(run_op("add", a, b), [1.015625], BF16, exact=True)


def test_pow_of_a_negative_base() -> None:
    a = np.array([-2.0, -2.0, -8.0, 0.0], dtype=np.float64)
    b = np.array([3.0, -2.0, 0.5, 0.0], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        got = run_op("pow", a, b)
    check(got, [-8.0, 0.25, math.nan, 1.0], np.float64, exact=True)


@pytest.mark.filterwarnings("ignore:divide by zero", "ignore:invalid value")
def test_float_division_by_zero_follows_ieee() -> None:
    a = np.array([1.0, -1.0, 0.0, 1.0], dtype=np.float32)
    b = np.array([0.0, 0.0, 0.0, -0.0], dtype=np.float32)
    check(run_op("div", a, b), [math.inf, -math.inf, math.nan, -math.inf], np.float32, exact=True)


@pytest.mark.parametrize("name,fn", [("maximum", _max), ("minimum", _min)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=["f32", "f64", "f16"])
def test_maximum_and_minimum_propagate_nan_from_either_side(name: str, fn, dtype) -> None:
    a = np.array([math.nan, 1.0, math.nan, -math.inf, 2.0], dtype=dtype)
    b = np.array([0.0, math.nan, math.nan, 3.0, math.inf], dtype=dtype)
    got = run_op(name, a, b)
    check(got, apply_n(fn, (5,), a, b), dtype, exact=True)
    assert np.isnan(got[:3]).all()


def test_maximum_and_minimum_of_signed_zeros_are_zero() -> None:
    a = np.array([0.0, -0.0], dtype=np.float32)
    b = np.array([-0.0, 0.0], dtype=np.float32)
    assert (run_op("maximum", a, b) == 0).all()
    assert (run_op("minimum", a, b) == 0).all()


# --- binary ops on integers -----------------------------------------------------------------------------


def _trunc_div(a: int, b: int) -> int:
    """C division: the quotient rounds toward zero; x / 0 is 0 (the op's choice, instead of a trap)."""
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


INT_A = np.array([7, -7, 7, -7, 6, -6, 1, -1, 0, 100])
INT_B = np.array([2, 2, -2, -2, 3, 3, 5, 5, 4, -7])


@pytest.mark.parametrize("dtype", INTS, ids=["i8", "i32", "i64"])
def test_integer_division_truncates_toward_zero_including_negative_operands(dtype) -> None:
    a, b = INT_A.astype(dtype), INT_B.astype(dtype)
    want = [_trunc_div(int(x), int(y)) for x, y in zip(a, b)]
    check(run_op("div", a, b), want, dtype)
    assert want[:4] == [3, -3, -3, 3]


def test_integer_division_by_zero_is_zero() -> None:
    a = np.array([5, -5, 0], dtype=np.int32)
    b = np.zeros(3, dtype=np.int32)
    check(run_op("div", a, b), [0, 0, 0], np.int32)


def test_integer_division_broadcasts_a_scalar_divisor() -> None:
    a = np.array([[9, -9], [10, -10]], dtype=np.int64)
    b = np.array(4, dtype=np.int64)
    check(run_op("div", a, b), apply_n(_trunc_div, (2, 2), a, b, dtype=np.int64), np.int64)


def test_i64_division_is_exact_beyond_2_to_the_53() -> None:
    a = np.array([2**53 + 1, -(2**62) - 3, 2**63 - 1], dtype=np.int64)
    b = np.array([1, 2, 10], dtype=np.int64)
    want = [_trunc_div(int(x), int(y)) for x, y in zip(a, b)]
    check(run_op("div", a, b), want, np.int64)


@pytest.mark.parametrize("dtype", INTS, ids=["i8", "i32", "i64"])
@pytest.mark.parametrize("name,fn", [("add", int.__add__), ("sub", int.__sub__), ("mul", int.__mul__)])
def test_integer_arithmetic_is_exact(name: str, fn, dtype) -> None:
    a = np.array([[3, -4, 0], [9, -10, 11]], dtype=dtype)
    b = np.array([5, 6, -7], dtype=dtype)
    check(run_op(name, a, b), apply_n(fn, (2, 3), a, b, dtype=np.int64), dtype)


@pytest.mark.parametrize("dtype", INTS, ids=["i8", "i32", "i64"])
@pytest.mark.parametrize("name,fn", [("maximum", max), ("minimum", min)])
def test_maximum_and_minimum_on_integers(name: str, fn, dtype) -> None:
    info = np.iinfo(dtype)
    a = np.array([info.min, -3, 0, 5, info.max], dtype=dtype)
    b = np.array([[info.max], [-4]], dtype=dtype)
    check(run_op(name, a, b), apply_n(fn, (2, 5), a, b, dtype=np.int64), dtype)


def test_integer_pow_with_non_negative_exponents() -> None:
    a = np.array([2, -3, 5, 0, 1, -1], dtype=np.int32)
    b = np.array([10, 3, 0, 0, 7, 5], dtype=np.int32)
    check(run_op("pow", a, b), [int(x) ** int(y) for x, y in zip(a, b)], np.int32)


def test_i64_pow_is_exact_beyond_2_to_the_53() -> None:
    a = np.array([3, -3, 7], dtype=np.int64)
    b = np.array([35, 39, 22], dtype=np.int64)
    check(run_op("pow", a, b), [int(x) ** int(y) for x, y in zip(a, b)], np.int64)


# --- comparisons ------------------------------------------------------------------------------------


COMPARE = {"equal": lambda a, b: a == b, "less": lambda a, b: a < b, "greater": lambda a, b: a > b}


@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("name", COMPARE_NAMES)
def test_comparison_broadcasts_and_gives_i1(name: str, shapes) -> None:
    sa, sb, out = shapes
    # Rounded values make ties (the interesting case for equal) frequent.
    a = np.round(values(sa, 5, np.float32))
    b = np.round(values(sb, 6, np.float32))
    check(run_op(name, a, b), apply_n(COMPARE[name], out, a, b, dtype=np.bool_), np.bool_)


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS], ids=["f32", "f64", "f16", "bf16", "i8", "i32", "i64"])
@pytest.mark.parametrize("name", COMPARE_NAMES)
def test_comparison_in_every_numeric_dtype(name: str, dtype) -> None:
    a = np.array([-2, -1, 0, 1, 2, 3], dtype=dtype)
    b = np.array([[1], [-1]], dtype=dtype)
    check(run_op(name, a, b), apply_n(COMPARE[name], (2, 6), a, b, dtype=np.bool_), np.bool_)


@pytest.mark.parametrize("name", COMPARE_NAMES)
def test_comparison_with_nan_is_false(name: str) -> None:
    a = np.array([math.nan, 1.0, math.nan], dtype=np.float32)
    b = np.array([1.0, math.nan, math.nan], dtype=np.float32)
    check(run_op(name, a, b), [False, False, False], np.bool_)


def test_equal_on_i1() -> None:
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    check(run_op("equal", a, b), [True, False, False, True], np.bool_)


def test_equal_of_signed_zeros_and_infinities() -> None:
    a = np.array([0.0, math.inf, -math.inf], dtype=np.float64)
    b = np.array([-0.0, math.inf, math.inf], dtype=np.float64)
    check(run_op("equal", a, b), [True, True, False], np.bool_)


# --- where ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sc,sa,sb,out",
    [
        ((2, 3), (2, 3), (2, 3), (2, 3)),
        ((2, 1), (1, 3), (), (2, 3)),
        ((), (2, 3), (3,), (2, 3)),
        ((3,), (2, 1), (2, 1), (2, 3)),
        ((), (), (), ()),
        ((2, 1, 1), (4, 1), (3,), (2, 4, 3)),
    ],
    ids=lambda s: str(s),
)
def test_where_broadcasts_all_three_operands(sc, sa, sb, out) -> None:
    rng = np.random.default_rng(7)
    cond = np.asarray(rng.integers(0, 2, size=sc).astype(np.bool_))
    a = values(sa, 8, np.float32)
    b = values(sb, 9, np.float32)
    want = apply_n(lambda c, x, y: x if c else y, out, cond, a, b)
    check(run_op("where", cond, a, b), want, np.float32, exact=True)


@pytest.mark.parametrize(
    "dtype", [np.float64, BF16, np.int32, np.int8, np.bool_], ids=["f64", "bf16", "i32", "i8", "i1"]
)
def test_where_keeps_the_dtype_of_its_branches(dtype) -> None:
    cond = np.array([True, False, True, False])
    a = np.array([1, 1, 0, 1], dtype=dtype)
    b = np.array([0, 0, 1, 1], dtype=dtype)
    check(run_op("where", cond, a, b), [1, 0, 0, 1], dtype, exact=True)


def test_where_picks_nan_and_inf_untouched() -> None:
    cond = np.array([True, False])
    a = np.array([math.nan, 0.0], dtype=np.float32)
    b = np.array([1.0, -math.inf], dtype=np.float32)
    got = run_op("where", cond, a, b)
    assert math.isnan(got[0]) and got[1] == -math.inf


# --- cast -----------------------------------------------------------------------------------------------

DT = {
    "f16": np.float16, "bf16": BF16, "f32": np.float32, "f64": np.float64,
    "i1": np.bool_, "i8": np.int8, "i32": np.int32, "i64": np.int64,
}  # fmt: skip
FLOAT_SAMPLE = [-100.75, -2.7, -1.5, -0.5, -0.0, 0.0, 0.25, 0.5, 1.0, 2.7, 99.99]
INT_SAMPLE = [-100, -3, -1, 0, 1, 2, 7, 100]
BOOL_SAMPLE = [True, False, False, True]


def _cast_oracle(v, to: str):
    """One value converted by the rules: ints truncate toward zero, i1 is `v != 0`, floats round to nearest."""
    if to == "i1":
        return v != 0
    if to in ("i8", "i32", "i64"):
        return math.trunc(v)
    return float(v)


@pytest.mark.parametrize("dst", list(DT))
@pytest.mark.parametrize("src", list(DT))
def test_cast_between_every_pair_of_dtypes(src: str, dst: str) -> None:
    sample = BOOL_SAMPLE if src == "i1" else INT_SAMPLE if src.startswith("i") else FLOAT_SAMPLE
    x = np.array(sample, dtype=np.float64).astype(DT[src])
    if src == "i1":
        x = np.array(sample)
    want = [_cast_oracle(v, dst) for v in x.tolist()]
    got = run_op("cast", x, dtype=DType(dst))
    # The oracle's float is the exact value; rounding it once to the target dtype is the right answer.
    check(got, np.array(want, dtype=np.float64 if dst[0] in "fb" else DT[dst]), DT[dst], exact=True)


def test_float_to_int_cast_truncates_toward_zero() -> None:
    x = np.array([-2.9, -2.5, -2.1, -0.9, 0.9, 2.1, 2.5, 2.9], dtype=np.float32)
    check(run_op("cast", x, dtype=DType.i32), [-2, -2, -2, 0, 0, 2, 2, 2], np.int32)


def test_cast_to_i1_is_nonzero_so_fractions_and_nan_are_true() -> None:
    x = np.array([0.0, -0.0, 0.5, -0.25, 1e-30, math.nan, math.inf], dtype=np.float32)
    check(run_op("cast", x, dtype=DType.i1), [False, False, True, True, True, True, True], np.bool_)
    ints = np.array([0, -1, 2, 256], dtype=np.int64)
    check(run_op("cast", ints, dtype=DType.i1), [False, True, True, True], np.bool_)


def test_cast_i1_to_f32_gives_zero_and_one() -> None:
    check(run_op("cast", np.array([True, False]), dtype=DType.f32), [1.0, 0.0], np.float32, exact=True)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_cast_to_16_bit_floats_rounds_to_nearest_and_overflows_to_inf() -> None:
    x = np.array([1 / 3, 70000.0, -70000.0, 1e-8, 3.140625], dtype=np.float64)
    # f16: 1/3 -> 0.333251953125; 70000 > 65504 -> inf; 1e-8 underflows below the smallest subnormal (6e-8)
    f16 = [0.333251953125, math.inf, -math.inf, 0.0, 3.140625]
    check(run_op("cast", x, dtype=DType.f16), f16, np.float16, exact=True)
    # bf16 keeps f32's range with 8 significant bits: 1/3 -> 0.333984375, 70000 -> 70144, 3.140625 -> 3.140625
    check(run_op("cast", x, dtype=DType.bf16), [0.333984375, 70144.0, -70144.0, 1e-8, 3.140625], BF16, exact=True)


def test_cast_int_to_f32_rounds_beyond_2_to_the_24() -> None:
    x = np.array([2**24, 2**24 + 1, 2**24 + 3, -(2**31)], dtype=np.int32)
    check(run_op("cast", x, dtype=DType.f32), [2.0**24, 2.0**24, 2.0**24 + 4, -(2.0**31)], np.float32, exact=True)


def test_cast_f64_to_i64_of_a_large_value_is_exact() -> None:
    x = np.array([2.0**53, -(2.0**62), 12345678901.9], dtype=np.float64)
    check(run_op("cast", x, dtype=DType.i64), [2**53, -(2**62), 12345678901], np.int64)


def test_cast_keeps_the_shape_of_a_scalar() -> None:
    got = run_op("cast", np.array(-3.75, dtype=np.float32), dtype=DType.i8)
    check(got, -3, np.int8)
    assert got.shape == ()


# --- diagnostics ----------------------------------------------------------------------------------------

FLOAT_ONLY = [n for n in UNARY_NAMES if n not in ("neg", "abs", "relu", "clip")]


@pytest.mark.parametrize("dtype", ["i32", "i8", "i64"])
@pytest.mark.parametrize("name", FLOAT_ONLY)
def test_float_only_op_on_integers_is_an_error(name: str, dtype: str) -> None:
    msg = infer_error(name, f"tensor<4x{dtype}>")
    assert msg == f"graph.{name}: operand must be a floating-point tensor, got tensor<4x{dtype}>"


@pytest.mark.parametrize("name", [*UNARY_NAMES, *BINARY_NAMES, "less", "greater"])
def test_arithmetic_on_i1_is_an_error(name: str) -> None:
    types = ["tensor<4xi1>"] * (2 if name in BINARY_NAMES or name in COMPARE_NAMES else 1)
    msg = infer_error(name, *types)
    assert msg.startswith(f"graph.{name}: operand must be ")
    assert msg.endswith("got tensor<4xi1>")


@pytest.mark.parametrize("name", [*BINARY_NAMES, *COMPARE_NAMES])
def test_binary_op_with_different_dtypes_is_an_error(name: str) -> None:
    msg = infer_error(name, "tensor<4xf32>", "tensor<4xf16>")
    assert msg == f"graph.{name}: operand dtypes differ: f32 vs f16"


@pytest.mark.parametrize("name", [*BINARY_NAMES, *COMPARE_NAMES])
@pytest.mark.parametrize(
    "sa,sb",
    [("2x3", "3x2"), ("4", "5"), ("2x3", "2"), ("3x1x4", "2x5x4")],
)
def test_binary_op_with_shapes_that_do_not_broadcast_is_an_error(name: str, sa: str, sb: str) -> None:
    msg = infer_error(name, f"tensor<{sa}xf32>", f"tensor<{sb}xf32>")
    pretty = lambda s: "[" + ", ".join(s.split("x")) + "]"  # noqa: E731
    assert msg == f"graph.{name}: shapes {pretty(sa)} and {pretty(sb)} do not broadcast"


@pytest.mark.parametrize("cond", ["tensor<4xf32>", "tensor<4xi32>", "tensor<4xi8>"])
def test_where_with_a_non_i1_condition_is_an_error(cond: str) -> None:
    msg = infer_error("where", cond, "tensor<4xf32>", "tensor<4xf32>")
    assert msg == f"graph.where: condition must be i1, got {cond}"


def test_where_with_branches_of_different_dtypes_is_an_error() -> None:
    msg = infer_error("where", "tensor<4xi1>", "tensor<4xf32>", "tensor<4xf64>")
    assert msg == "graph.where: operand dtypes differ: f32 vs f64"


def test_where_with_shapes_that_do_not_broadcast_is_an_error() -> None:
    msg = infer_error("where", "tensor<3xi1>", "tensor<2x3xf32>", "tensor<2x2xf32>")
    assert msg == "graph.where: shapes [3] and [2, 3] and [2, 2] do not broadcast"


def test_gelu_with_an_unknown_approximation_is_an_error() -> None:
    msg = infer_error("gelu", "tensor<4xf32>", approximate="fast")
    assert msg == "graph.gelu: attribute 'approximate' must be one of \"none\", \"tanh\", got \"fast\""


def test_cast_without_a_dtype_is_an_error() -> None:
    assert infer_error("cast", "tensor<4xf32>") == "graph.cast: missing required attribute 'dtype' (a dtype)"


def test_leaky_relu_with_a_string_alpha_is_an_error() -> None:
    msg = infer_error("leaky_relu", "tensor<4xf32>", alpha="big")
    assert msg == "graph.leaky_relu: attribute 'alpha' must be a float, got \"big\""
