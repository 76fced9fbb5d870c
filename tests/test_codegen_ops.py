"""Compiled elementwise, shape, reduction, matmul and loss ops (llvm) against the interpreter, and the
examples through the default pipeline.

Each test builds one function that applies several ops to arguments of their own and compiles it with
the empty pipeline, so every op is a kernel of its own and a failure names the op that produced it.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import compiler
from compiler.builder import finish, new_func
from compiler.interpreter import run
from compiler.ir import DType, Module, TensorType
from compiler.parser import parse, parse_file
from test_ops_elementwise import BOOL_SAMPLE, BROADCASTS, DT, FLOAT_SAMPLE, INT_SAMPLE, UNARY, _op_name
from test_ops_reduce_linalg import AXES, MATMUL_SHAPES
from test_ops_shape import arange

RNG = np.random.default_rng(0)
BF16 = np.dtype(ml_dtypes.bfloat16)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
# Floats to the declared tolerance; the 16-bit floats to one ulp (both compute in f32 and round once, but
# TVM's f32 functions may differ from the reference's in the last bit, which can move the rounding).
TOL = {
    np.dtype(np.float32): {"rtol": 1e-4, "atol": 1e-5},
    np.dtype(np.float64): {"rtol": 1e-9, "atol": 1e-12},
    np.dtype(np.float16): {"rtol": 1e-3, "atol": 1e-4},
    BF16: {"rtol": 8e-3, "atol": 1e-3},
}
# Special values every float op sees (signed zeros, tiny and huge magnitudes, infinities, NaN), then ordinary
# ones up to 64 elements, so that the schedule vectorizes the loop as it does for real tensors.
SPECIAL = np.array([-1000, -100, -30, -2.5, -1, -0.3, -1e-3, -0.0, 0, 1e-3, 0.4, 1, 2.7, 3.5, 30, 100, 1000,
                    np.nan, np.inf, -np.inf])  # fmt: skip
SPECIAL = np.concatenate([SPECIAL, RNG.standard_normal(64 - SPECIAL.size) * 5])
POSITIVE = np.array([0.0, -0.0, 1e-30, 0.25, 0.5, 1.0, 9.0, 1e30, -1.0, np.inf, np.nan])
POSITIVE = np.concatenate([POSITIVE, RNG.uniform(0, 10, 64 - POSITIVE.size)])


def _passed(a: np.ndarray) -> np.ndarray:
    """What goes in for `a`: a rank-0 array as shape [1], reshaped inside the function, because the
    runtime's np.ascontiguousarray turns a rank-0 input into shape [1], which the kernel rejects."""
    return a.reshape(1) if a.ndim == 0 else a


def _operand(b, v, a: np.ndarray):
    """The value inside the function that has a's shape, made from the argument `v` that was passed."""
    return b.reshape(v, shape=()) if a.ndim == 0 else v


def compiled_and_interpreted(*calls: tuple[str, list[np.ndarray], dict]) -> tuple[list, list]:
    """One function applying each (op name, operands, attrs) to arguments of its own, compiled alone
    (empty pipeline: every op is its own kernel) and interpreted; the results of both, flattened."""
    arrays = [a for _, operands, _ in calls for a in operands]
    fed = [_passed(a) for a in arrays]
    f, b, args = new_func("main", {f"a{i}": TensorType(a.shape, DType.from_numpy(a.dtype)) for i, a in enumerate(fed)})
    values = iter([_operand(b, v, a) for v, a in zip(args, arrays)])
    results = []
    for name, operands, attrs in calls:
        out = getattr(b, name)(*[next(values) for _ in operands], **attrs)
        results += list(out) if isinstance(out, tuple) else [out]
    finish(f, *results)
    module = Module([f])
    got = compiler.compile(module, "llvm", pipeline="")(*fed)
    return got, run(module, fed)


def labels(calls) -> list[str]:
    """A name for each result: the op, its attributes and its operands' types."""
    out = []
    for name, operands, attrs in calls:
        sig = f"{name}{attrs or ''}(" + ", ".join(f"{a.dtype}{list(a.shape)}" for a in operands) + ")"
        n = len(attrs["sections"]) if name == "split" else 1
        out += [sig if n == 1 else f"{sig}#{i}" for i in range(n)]
    return out


def assert_matches(*calls: tuple[str, list[np.ndarray], dict], exact: bool = False) -> None:
    """Compiled equals interpreted: same shape and dtype; integers, bools (and floats if `exact`) bit for
    bit, other floats to TOL with NaN where the interpreter has NaN and infinities of the same sign."""
    got, want = compiled_and_interpreted(*calls)
    for label, g, w in zip(labels(calls), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{label}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        if not (w.dtype.kind == "f" or w.dtype == BF16):
            np.testing.assert_array_equal(g, w, err_msg=label)
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        if exact:
            np.testing.assert_array_equal(g64, w64, err_msg=label)
        else:
            np.testing.assert_allclose(g64, w64, **TOL[w.dtype], equal_nan=True, err_msg=label)
        assert (np.signbit(g64) == np.signbit(w64))[np.isinf(w64)].all(), f"{label}: an infinity has the wrong sign"


def rand(*shape: int, dtype=np.float32, positive: bool = False) -> np.ndarray:
    """Values in [0.5, 3] (positive) or [-3, 3] away from 0, so that division and pow are well defined."""
    mag = RNG.uniform(0.5, 3.0, size=shape)
    return np.asarray(mag if positive else mag * RNG.choice([-1.0, 1.0], size=shape)).astype(dtype)


FLOATS = [np.float32, np.float64, np.float16, BF16]
FLOAT_IDS = ["f32", "f64", "f16", "bf16"]
INTS = [np.int8, np.int32, np.int64]
INT_IDS = ["i8", "i32", "i64"]

# --- unary ------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_unary_float_ops_on_special_values(dtype) -> None:
    calls = []
    for case, (_, _, attrs) in UNARY.items():
        name = _op_name(case)
        x = POSITIVE if name in ("log", "sqrt", "rsqrt") else SPECIAL
        calls.append((name, [x.astype(dtype)], attrs))
    assert_matches(*calls)


def test_unary_ops_on_a_scalar_keep_rank_0() -> None:
    x = np.array(0.75, np.float32)
    assert_matches(*[(_op_name(c), [x], UNARY[c][2]) for c in ("neg", "exp", "tanh", "clip", "gelu_tanh", "erf")])


def test_unary_ops_on_a_long_row_of_odd_length() -> None:
    x = RNG.standard_normal(1001).astype(np.float32) * 10
    assert_matches(("exp", [x], {}), ("gelu", [x], {}), ("clip", [x], {"min": -1.0, "max": 2.0}))


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integer_unary_ops_and_clip(dtype) -> None:
    info = np.iinfo(dtype)
    x = np.array([info.min, info.min + 1, -100, -7, -2, -1, 0, 1, 2, 3, 6, 7, 100, info.max], dtype)
    clips = [{"min": 0.0, "max": 6.0}, {"min": -1.5, "max": 2.5}, {"min": -1000.0, "max": 1e10}, {}, {"max": -3.0},
             {"min": 2.0, "max": 1.0}, {"min": -1e30}]  # fmt: skip
    assert_matches(("neg", [x], {}), ("abs", [x], {}), ("relu", [x], {}), *[("clip", [x], c) for c in clips])


def test_clip_with_crossed_or_infinite_float_bounds() -> None:
    x = np.array([-np.inf, -3.0, -0.0, 0.0, 0.5, 5.0, np.inf, np.nan], np.float32)
    assert_matches(("clip", [x], {}), ("clip", [x], {"min": 2.0, "max": 1.0}), ("clip", [x], {"min": -np.inf}),
                   ("clip", [x], {"min": np.nan}), ("clip", [x], {"max": 0.0}))  # fmt: skip


def test_sigmoid_and_softplus_of_huge_magnitudes_are_exact() -> None:
    x = np.array([-1000.0, -100.0, 100.0, 1000.0], np.float32)
    assert_matches(("sigmoid", [x], {}), ("softplus", [x[1:3]], {}), ("elu", [x], {"alpha": 2.0}), exact=True)


# --- binary -----------------------------------------------------------------------------------------

BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "equal", "less", "greater"]


@pytest.mark.parametrize("shapes", [s for s in BROADCASTS if 0 not in s[0]], ids=lambda s: f"{s[0]}-{s[1]}")
def test_binary_ops_broadcast(shapes) -> None:
    # All of them share one broadcasting rule; one op of each kind (arithmetic, pow, comparison) stands for them.
    sa, sb, _ = shapes
    assert_matches(*[(n, [rand(*sa, positive=n == "pow"), rand(*sb)], {}) for n in ("sub", "pow", "less")])


@pytest.mark.parametrize("dtype", FLOATS[1:], ids=FLOAT_IDS[1:])
def test_binary_ops_in_other_float_dtypes(dtype) -> None:
    assert_matches(*[(n, [rand(2, 3, dtype=dtype, positive=n == "pow"), rand(3, dtype=dtype)], {}) for n in BINARY])


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_16_bit_float_arithmetic_is_rounded_once(dtype) -> None:
    # Exact in f32, so one rounding gives the correctly rounded result; 1 + 0.01171875 ties to even in bf16.
    a = np.array([1.0, 1.0, 3.0, 255.0, 0.1, 1000.0], dtype)
    b = np.array([0.01171875, 2.0**-11, 0.3, 1.5, 7.0, -0.7], dtype)
    assert_matches(("add", [a, b], {}), ("sub", [a, b], {}), ("mul", [a, b], {}), exact=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_binary_ops_on_special_values() -> None:
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 2.0, 0.0, -0.0, 1.0, -1.0, 0.0, np.inf], np.float32)
    b = np.array([0.0, np.nan, np.nan, 3.0, np.inf, -0.0, 0.0, 0.0, 0.0, 0.0, np.inf], np.float32)
    assert_matches(*[(n, [a, b], {}) for n in BINARY])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_pow_of_negative_bases_and_zero() -> None:
    a = np.array([-2.0, -2.0, -8.0, 0.0, 0.0, -0.0, 1.0, np.nan, 2.0], np.float64)
    b = np.array([3.0, -2.0, 0.5, 0.0, -1.0, 3.0, np.nan, 0.0, 1024.0], np.float64)
    assert_matches(("pow", [a, b], {}), ("pow", [a.astype(np.float32), b.astype(np.float32)], {}))


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integer_binary_ops_truncate_and_wrap_like_the_reference(dtype) -> None:
    info = np.iinfo(dtype)
    # Truncating division of every sign pair, x / 0 = 0, MIN / -1 (which traps in hardware), overflow.
    a = np.array([7, -7, 7, -7, 6, -6, 1, -1, 0, 100, info.min, info.min, info.max, 5, info.max, -100], dtype)
    b = np.array([2, 2, -2, -2, 3, 3, 5, 5, 4, -7, -1, 0, -1, 0, 2, 100], dtype)
    assert_matches(*[(n, [a, b], {}) for n in BINARY if n != "pow"])


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integer_pow_is_exact_and_wraps(dtype) -> None:
    a = np.array([2, -3, 5, 0, 1, -1, 3, -1, 1, 2, 0, 7, -1, 3, 2, -2, 3], dtype)
    b = np.array([6, 3, 0, 0, 7, 5, -1, -3, -2, -2, -1, 22, 120, 100, 64, 7, np.iinfo(dtype).max], dtype)
    assert_matches(("pow", [a, b], {}))


def test_i64_division_and_pow_beyond_2_to_the_53() -> None:
    a = np.array([2**53 + 1, -(2**62) - 3, 2**63 - 1], np.int64)
    p = np.array([3, -3, 7], np.int64)
    e = np.array([35, 39, 22], np.int64)
    assert_matches(("div", [a, np.array([1, 2, 10], np.int64)], {}), ("pow", [p, e], {}),
                   ("div", [np.array([[9, -9], [10, -10]], np.int64), np.array(4, np.int64)], {}))  # fmt: skip


def test_equal_on_i1_with_broadcasting() -> None:
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    assert_matches(("equal", [a, b], {}), ("equal", [a, np.array(True)], {}), ("equal", [a[:, None], b], {}))


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integer_comparisons(dtype) -> None:
    a = np.array([-2, -1, 0, 1, 2, 3], dtype)
    b = np.array([[1], [-1]], dtype)
    assert_matches(("equal", [a, b], {}), ("less", [a, b], {}), ("greater", [a, b], {}))


# --- where ------------------------------------------------------------------------------------------

WHERE_SHAPES = [((2, 3), (2, 3), (2, 3)), ((2, 1), (1, 3), ()), ((), (2, 3), (3,)), ((3,), (2, 1), (2, 1)),
                ((), (), ()), ((2, 1, 1), (4, 1), (3,))]  # fmt: skip


def test_where_broadcasts_all_three_operands() -> None:
    calls = []
    for sc, sa, sb in WHERE_SHAPES:
        cond = np.asarray(RNG.integers(0, 2, size=sc).astype(np.bool_))
        calls.append(("where", [cond, rand(*sa), rand(*sb)], {}))
    assert_matches(*calls, exact=True)


def test_where_keeps_the_dtype_of_its_branches() -> None:
    cond = np.array([True, False, True, False])
    dtypes = [np.float64, np.float16, BF16, np.int32, np.int8, np.int64, np.bool_]
    branches = [(np.array([1, 1, 0, 1], dt), np.array([0, 0, 1, 1], dt)) for dt in dtypes]
    special = (np.array([np.nan, 0.0, -0.0, 1.0], np.float32), np.array([1.0, -np.inf, 0.0, np.nan], np.float32))
    assert_matches(*[("where", [cond, a, b], {}) for a, b in [*branches, special]], exact=True)


# --- cast -------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("src", list(DT))
def test_cast_to_every_dtype(src: str) -> None:
    sample = BOOL_SAMPLE if src == "i1" else INT_SAMPLE if src.startswith("i") else FLOAT_SAMPLE
    x = np.array(sample).astype(DT[src])
    assert_matches(*[("cast", [x], {"dtype": DType(dst)}) for dst in DT], exact=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cast_edge_values() -> None:
    f32 = np.array([0.0, -0.0, 0.5, -0.25, 1e-30, np.nan, np.inf, -2.9, 2.5, -2.5], np.float32)
    f64 = np.array([1 / 3, 70000.0, -70000.0, 1e-8, 3.140625, 2.0**53, -(2.0**62), 12345678901.9])
    ints = np.array([0, -1, 2, 256, -256, 2**24 + 1, 2**24 + 3, -(2**31)], np.int32)
    assert_matches(("cast", [f32], {"dtype": DType.i1}), ("cast", [f32[7:]], {"dtype": DType.i32}),
                   ("cast", [f64[:5]], {"dtype": DType.f16}), ("cast", [f64[:5]], {"dtype": DType.bf16}),
                   ("cast", [f64[5:]], {"dtype": DType.i64}), ("cast", [ints], {"dtype": DType.i1}),
                   ("cast", [ints], {"dtype": DType.f32}), ("cast", [ints.astype(np.int64)], {"dtype": DType.i1}),
                   ("cast", [np.array(-3.75, np.float32)], {"dtype": DType.i8}), exact=True)  # fmt: skip


# --- shape ops --------------------------------------------------------------------------------------

ALL_DTYPES = [np.float16, BF16, np.float32, np.float64, np.int8, np.int32, np.int64, np.bool_]


def test_reshape_keeps_row_major_order() -> None:
    cases = [((3, 4), (4, 3)), ((3, 4), (-1,)), ((2, 3, 4), (2, -1, 2)), ((2, 3, 4), (0, -1)), ((2, 3, 4), (0, 0, 4)),
             ((2, 3, 4), (-1, 0, 1)), ((1, 1), ()), ((), (1, 1, 1))]  # fmt: skip
    assert_matches(*[("reshape", [arange(*src)], {"shape": target}) for src, target in cases])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_shape_ops_keep_every_dtype(dtype) -> None:
    x = arange(4, 3, dtype=dtype)
    assert_matches(
        ("reshape", [x], {"shape": (3, 4)}),
        ("transpose", [x], {}),
        ("concat", [x, x[:1]], {"axis": 0}),
        ("split", [x], {"sections": (1, 3)}),
        ("slice", [x], {"starts": (3,), "ends": (0,), "steps": (-2,)}),
        ("pad", [x], {"pads": (1, -1, 0, 2), "value": 1.0}),
        ("gather", [x, np.array([3, -1, 0], np.int32)], {}),
    )


def test_transpose_permutes_axes() -> None:
    cases = [((2, 3, 4), None), ((2, 3, 4), (1, 0, 2)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (-1, 0, -2)),
             ((5,), None), ((), None), ((2, 1, 3, 2), (3, 1, 0, 2))]  # fmt: skip
    assert_matches(*[("transpose", [arange(*s)], {} if p is None else {"perm": p}) for s, p in cases])


def test_concat_of_several_operands_along_any_axis() -> None:
    assert_matches(
        ("concat", [np.array([[1, 2, 3]], np.float32), arange(2, 3)], {"axis": 0}),
        ("concat", [arange(2, 1, dtype=np.float64), arange(2, 2, dtype=np.float64), arange(2, 1, dtype=np.float64)],
         {"axis": -1}),
        ("concat", [arange(2, 3)], {"axis": 1}),
    )  # fmt: skip


def test_split_into_sections() -> None:
    assert_matches(
        ("split", [np.array([[1, 2], [3, 4], [5, 6]], np.float32)], {"axis": 0, "sections": (1, 2)}),
        ("split", [np.array([True, False, True, True])], {"sections": (3, 1)}),
        ("split", [arange(2, 3, 4)], {"axis": -1, "sections": (1, 1, 2)}),
    )


def test_split_with_an_empty_section() -> None:
    assert_matches(("split", [np.array([[1, 2, 3], [4, 5, 6]], np.int64)], {"axis": -1, "sections": (1, 0, 2)}))


SLICES = [(1, 4, 1), (-2, 6, 1), (0, I64_MAX, 2), (-1, I64_MIN, -1), (4, 1, -1), (10, -10, -2), (-100, 100, 1),
          (I64_MIN, I64_MAX, 4), (I64_MAX, I64_MIN, -4), (3, 3, 1), (5, 1, 1), (1, 4, -1), (0, -1, 1), (-1, 0, -1),
          (6, 9, 1), (-7, -6, 1), (2, 5, 7)]  # fmt: skip


def test_slice_clamps_as_onnx() -> None:
    x = np.array([10, 11, 12, 13, 14, 15], np.float32)
    calls = [("slice", [x], {"starts": (s,), "ends": (e,), "steps": (k,)}) for s, e, k in SLICES]
    assert_matches(*calls)


def test_slice_several_axes() -> None:
    assert_matches(
        ("slice", [arange(4, 5)], {"starts": (1,), "ends": (3,)}),
        ("slice", [arange(4, 5, 6)], {"starts": (-1, 1), "ends": (0, 5), "axes": (-1, 0), "steps": (-2, 2)}),
        ("slice", [arange(2, 3)], {"starts": (), "ends": ()}),
    )  # fmt: skip


def test_broadcast_to_in_both_directions() -> None:
    assert_matches(
        ("broadcast_to", [np.array([1, 2, 3], np.float32)], {"shape": (2, 3)}),
        ("broadcast_to", [np.array([[1], [2]], np.int32)], {"shape": (2, 3)}),
        ("broadcast_to", [np.array([[1], [2]], np.float32)], {"shape": (3,)}),
        ("broadcast_to", [np.array([1, 2, 3], np.float32)], {"shape": (1, 1)}),
        ("broadcast_to", [np.array(True)], {"shape": (2, 2)}),
        ("broadcast_to", [np.array([7], np.int64)], {"shape": (0,)}),
    )


def test_squeeze_unsqueeze_and_flatten() -> None:
    squeezes = [((1, 3, 1, 2), None), ((1, 3, 1, 2), (0,)), ((1, 3, 1, 2), (-2,)), ((1, 3, 1, 2), (2, 0)),
                ((3, 2), None), ((1, 1), None), ((1, 3), ())]  # fmt: skip
    unsqueezes = [((2, 3), (0,)), ((2, 3), (-1,)), ((2, 3), (0, 3)), ((2, 3), (-1, -4)), ((2, 3), (1, 2)),
                  ((), (0,)), ((), (0, 1))]  # fmt: skip
    flattens = [((2, 3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), 3), ((2, 3, 4), -1), ((5,), None), ((), 0)]
    assert_matches(
        *[("squeeze", [arange(*s, dtype=np.int32)], {} if a is None else {"axes": a}) for s, a in squeezes],
        *[("unsqueeze", [arange(*s, dtype=np.float64)], {"axes": a}) for s, a in unsqueezes],
        *[("flatten", [arange(*s, dtype=np.int64)], {} if a is None else {"axis": a}) for s, a in flattens],
    )


def test_pad_pads_crops_and_fills() -> None:
    assert_matches(
        ("pad", [np.array([[1, 2], [3, 4]], np.float32)], {"pads": (1, 0, 0, 1)}),
        ("pad", [np.array([1, 2], np.float64)], {"pads": (2, 1), "value": -1.5}),
        ("pad", [arange(3, 3)], {"pads": (-1, 0, 0, -2)}),
        ("pad", [np.array([1, 2, 3, 4], np.int32)], {"pads": (-3, 2), "value": 9.0}),
        ("pad", [np.array([1, 2], np.float32)], {"pads": (-1, -1)}),
        ("pad", [np.array([1], np.float32)], {"pads": (1, 0), "value": float("-inf")}),
        ("pad", [np.array([1, 2], np.int8)], {"pads": (0, 2), "value": -128.0}),
        ("pad", [np.array([1, 2], np.float16)], {"pads": (0, 2), "value": 5.0}),
        ("pad", [np.array([False])], {"pads": (1, 1), "value": 1.0}),
        ("pad", [np.array(3.0, np.float32)], {"pads": ()}),
        ("pad", [arange(2, 3, 4)], {"pads": (0, 1, -1, 1, -1, 2)}),
    )


def test_gather_with_negative_indices_along_any_axis() -> None:
    data = arange(2, 4, 3, dtype=np.float64)
    ids = np.array([[2, 0, -1]], np.int64)
    assert_matches(
        ("gather", [arange(5, 3), np.array([[4, 0], [2, 2]], np.int32)], {}),
        ("gather", [arange(5, 3), np.array([[4, 0], [-2, 2]], np.int64)], {}),
        ("gather", [np.array([10, 11, 12, 13], np.float32), np.array([-1, -4, 1], np.int64)], {}),
        *[("gather", [data, ids], {"axis": axis}) for axis in (1, -1, -2, 2)],
        ("gather", [np.array([[1, 2], [3, 4], [5, 6]], np.int32), np.array(1, np.int64)], {}),
        ("gather", [np.array([1.0, 2.0, 3.0], np.float32), np.array(-1, np.int32)], {}),
    )  # fmt: skip


# --- reductions -------------------------------------------------------------------------------------

REDUCE = ["reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min"]


@pytest.mark.parametrize("name", REDUCE)
def test_reduce_f32_over_every_axes_choice(name: str) -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    calls = [(name, [x], {"keepdims": k} if axes is None else {"axes": axes, "keepdims": k})
             for axes in AXES for k in (False, True)]  # fmt: skip
    assert_matches(*calls)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, BF16, *INTS], ids=["f64", "f16", "bf16", *INT_IDS])
def test_reduce_in_other_dtypes(dtype) -> None:
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        x = np.array([[3, -7, 2, info.max], [-1, 8, 0, info.min], [-7, 0, 7, 0], [-6, 2, 100, 100]], dtype)
    else:
        x = RNG.standard_normal((4, 4)).astype(dtype)
    assert_matches(*[(n, [x], attrs) for n in REDUCE for attrs in ({"axes": [-1]}, {})])


def test_reduce_of_a_scalar_is_the_scalar() -> None:
    assert_matches(*[(n, [np.array(2.5, np.float32)], {}) for n in REDUCE])


def test_reduce_max_and_min_propagate_nan() -> None:
    x = np.array([[1.0, np.nan, 3.0], [np.nan, 1.0, 2.0], [-np.inf, 1.0, np.inf], [5.0, 4.0, np.nan]], np.float32)
    assert_matches(*[(n, [x], {"axes": [1]}) for n in REDUCE], *[(n, [x], {"axes": [0]}) for n in REDUCE])


def test_reduce_sum_of_f16_accumulates_wider() -> None:
    assert_matches(("reduce_sum", [np.ones(4096, np.float16)], {}), ("reduce_mean", [np.ones(4096, np.float16)], {}))


def test_argmax_takes_the_first_maximum_and_nan() -> None:
    x = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [1.0, np.nan, 3.0, np.nan],
                  [-np.inf, -np.inf, -np.inf, -np.inf], [1.0, 2.0, np.inf, np.inf]], np.float32)  # fmt: skip
    lowest = np.full((3,), np.iinfo(np.int64).min, np.int64)
    assert_matches(("argmax", [x], {"axis": 1}), ("argmax", [x], {}), ("argmax", [x], {"axis": -1, "keepdims": True}),
                   ("argmax", [lowest], {}), ("argmax", [np.array([5.0], np.float32)], {"keepdims": True}))  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float64, np.float16, BF16, *INTS], ids=["f64", "f16", "bf16", *INT_IDS])
def test_argmax_in_other_dtypes(dtype) -> None:
    x = RNG.integers(-5, 5, size=(2, 3, 4)).astype(dtype)
    assert_matches(("argmax", [x], {"axis": 0}), ("argmax", [x], {"axis": -2, "keepdims": True}),
                   ("argmax", [x], {"axis": 2}))  # fmt: skip


# --- matmul -----------------------------------------------------------------------------------------


def test_matmul_numpy_semantics() -> None:
    assert_matches(*[("matmul", [rand(*sa), rand(*sb)], {}) for sa, sb, _ in MATMUL_SHAPES])


@pytest.mark.parametrize("dtype", [np.float64, np.float16, BF16, *INTS], ids=["f64", "f16", "bf16", *INT_IDS])
def test_matmul_in_other_dtypes(dtype) -> None:
    if np.dtype(dtype).kind == "i":  # products that overflow i8 wrap as NumPy's do
        a, b = RNG.integers(-100, 100, (3, 5)).astype(dtype), RNG.integers(-100, 100, (2, 5, 2)).astype(dtype)
    else:
        a, b = rand(3, 5, dtype=dtype), rand(2, 5, 2, dtype=dtype)
    assert_matches(("matmul", [a, b], {}), ("matmul", [a[0], b[0]], {}))


def test_matmul_large_enough_to_be_tiled() -> None:
    """Summed in another order than NumPy's (the host's vector width decides it): each element within the
    two f32 sums' error bound, 2 K eps sum_k |a_ik b_kj|, which cancellation makes large against an element
    near 0 (a 129-term sum of terms up to 9 gave 0.007255 against 0.007240 on Zen 3)."""
    calls = (("matmul", [rand(67, 129), rand(129, 45)], {}), ("matmul", [rand(3, 64, 32), rand(32, 48)], {}))
    got, want = compiled_and_interpreted(*calls)
    for (_, (a, b), _), g, w in zip(calls, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype == np.float32
        bound = 2 * a.shape[-1] * np.finfo(np.float32).eps * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
        excess = np.abs(g.astype(np.float64) - w) - bound
        assert (excess <= 0).all(), f"{excess.max():.3g} beyond the bound at {np.unravel_index(excess.argmax(), excess.shape)}"


# --- losses -----------------------------------------------------------------------------------------


def test_softmax_cross_entropy() -> None:
    logits = RNG.standard_normal((5, 4)).astype(np.float32)
    assert_matches(
        ("softmax_cross_entropy", [logits, np.array([0, 3, 1, 1, 2], np.int32)], {}),
        ("softmax_cross_entropy", [logits, np.array([0, 3, 1, 1, 2], np.int64)], {}),
        ("softmax_cross_entropy", [np.zeros((3, 10), np.float32), np.array([0, 4, 9], np.int64)], {}),
        ("softmax_cross_entropy", [np.array([[1000.0, 0.0], [0.0, -1000.0]], np.float32), np.array([1, 1], np.int32)],
         {}),
        ("softmax_cross_entropy", [logits.astype(np.float64), np.array([0, 3, 1, 1, 2], np.int64)], {}),
        ("softmax_cross_entropy", [logits.astype(np.float16), np.array([0, 3, 1, 1, 2], np.int64)], {}),
        ("softmax_cross_entropy", [logits.astype(BF16), np.array([0, 3, 1, 1, 2], np.int32)], {}),
    )  # fmt: skip


def test_mse_loss() -> None:
    a, b = RNG.standard_normal((3, 4, 5)), RNG.standard_normal((3, 4, 5))
    assert_matches(
        ("mse_loss", [a.astype(np.float32), b.astype(np.float32)], {}),
        ("mse_loss", [a, b], {}),
        ("mse_loss", [a.astype(np.float16), b.astype(np.float16)], {}),
        ("mse_loss", [a.astype(BF16), b.astype(BF16)], {}),
        ("mse_loss", [np.array(2.0, np.float32), np.array(0.5, np.float32)], {}),
    )


def test_cumsum_along_each_axis_with_each_flag_and_dtype() -> None:
    # 37: rows of no multiple of the vector lanes (a padded, predicated last vector in the reduction's schedule)
    x = RNG.standard_normal((2, 3, 37)).astype(np.float32)
    calls = [("cumsum", [x], {"axis": a, "exclusive": e, "reverse": r})
             for a in (0, 1, -1) for e in (False, True) for r in (False, True)]  # fmt: skip
    ints = np.array([[3, -7, 2, 2**31 - 1], [-1, 8, 0, 5]], np.int32)  # wraps as the interpreter does
    calls += [("cumsum", [ints], {"axis": 1}), ("cumsum", [ints.astype(np.int64)], {"axis": 0, "reverse": True})]
    row = RNG.integers(-1000, 1000, (3, 70)).astype(np.int32)
    calls += [("cumsum", [row], {"axis": 1, "reverse": True}), ("cumsum", [row], {"axis": 1, "exclusive": True})]
    calls += [("cumsum", [x.astype(np.float16)], {"axis": 2, "exclusive": True}), ("cumsum", [E32], {"axis": 0})]
    assert_matches(*calls)


def test_iota_along_each_axis_and_dtype() -> None:
    x = RNG.standard_normal((2, 3, 37)).astype(np.float32)
    calls = [("iota", [x], {"axis": a}) for a in (0, 1, 2, -1)]
    calls += [("iota", [x.astype(np.float16)], {"axis": 2}), ("iota", [np.zeros((70,), np.int64)], {"axis": 0}),
              ("iota", [np.zeros((5, 9), np.int32)], {"axis": 0}), ("iota", [np.zeros((4, 0), np.float32)], {"axis": 1})]
    assert_matches(*calls)
    (got,), _ = compiled_and_interpreted(("iota", [np.full((2, 4), np.nan, np.float32)], {"axis": 1}))
    np.testing.assert_array_equal(got, [[0, 1, 2, 3], [0, 1, 2, 3]])  # the values, even NaN, are not read


def test_cumprod_along_each_axis_with_each_flag_and_dtype() -> None:
    x = (1 + 0.1 * RNG.standard_normal((2, 3, 20))).astype(np.float32)  # past 16 along the axis, near 1
    calls = [("cumprod", [x], {"axis": a, "exclusive": e, "reverse": r})
             for a in (0, 1, -1) for e in (False, True) for r in (False, True)]  # fmt: skip
    ints = np.array([[3, -7, 2, 0], [-1, 8, 1 << 20, 1 << 20]], np.int32)  # wraps as the interpreter does
    calls += [("cumprod", [ints], {"axis": 1}), ("cumprod", [ints.astype(np.int64)], {"axis": 1, "reverse": True})]
    calls += [("cumprod", [x.astype(np.float16)], {"axis": 1, "exclusive": True}), ("cumprod", [E32], {"axis": 0})]
    assert_matches(*calls)


def test_grid_sample_in_each_mode_padding_and_dtype() -> None:
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-2.5, 2.5, (2, 3, 6, 2)).astype(np.float32)
    grid[0, 0, :3] = [[-0.5, 0.5], [0.25, -0.75], [1.0, -1.0]]  # ties for nearest's half to even
    calls = [("grid_sample", [x, grid], {"mode": m, "padding_mode": p, "align_corners": a})
             for (m, a), p in zip([("linear", False), ("nearest", True), ("cubic", False), ("cubic", True),
                                   ("nearest", False), ("linear", True)], ["zeros", "border", "reflection"] * 2)]  # fmt: skip
    x3 = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    g3 = RNG.uniform(-1.8, 1.8, (1, 2, 3, 4, 3)).astype(np.float32)
    calls += [("grid_sample", [x3, g3], {"mode": m, "padding_mode": p})
              for m, p in [("linear", "reflection"), ("nearest", "zeros")]]  # fmt: skip
    calls += [("grid_sample", [x.astype(np.float64), grid.astype(np.float64)], {"mode": "cubic"}),
              ("grid_sample", [x.astype(np.float16), grid.astype(np.float16)], {"padding_mode": "border"})]
    assert_matches(*calls)


def test_affine_grid_2d_and_3d() -> None:
    assert_matches(("affine_grid", [RNG.standard_normal((2, 2, 3)).astype(np.float32)], {"size": [4, 5]}),
                   ("affine_grid", [RNG.standard_normal((2, 2, 3))], {"size": [1, 3], "align_corners": True}),
                   ("affine_grid", [RNG.standard_normal((1, 3, 4)).astype(np.float32)],
                    {"size": [2, 3, 4], "align_corners": True}))  # fmt: skip


# --- empty tensors ----------------------------------------------------------------------------------

E32 = np.zeros((0, 3), np.float32)
EMPTY_CASES = [
    ("exp", [E32], {}),
    ("add", [E32, rand(3)], {}),
    ("where", [np.zeros((0, 3), np.bool_), rand(3), rand(1)], {}),
    ("reshape", [E32], {"shape": (3, -1)}),
    ("flatten", [np.zeros((2, 0, 3), np.int64)], {"axis": 2}),
    ("concat", [np.zeros((2, 0), np.int32), np.array([[1], [2]], np.int32)], {"axis": 1}),
    ("slice", [E32], {"starts": (-1,), "ends": (I64_MIN,), "axes": (0,), "steps": (-1,)}),
    ("pad", [E32], {"pads": (1, 0, 0, 1), "value": 2.0}),
    ("gather", [E32, np.array([1], np.int64)], {"axis": 1}),
    ("reduce_sum", [E32], {"axes": [0]}),
    ("reduce_mean", [E32], {"axes": [0]}),
    ("reduce_prod", [E32], {"axes": [0]}),
    ("reduce_max", [E32], {"axes": [0]}),
    ("reduce_min", [np.zeros((3, 0), np.int32)], {"axes": [1]}),
    ("matmul", [np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32)], {}),
    ("softmax_cross_entropy", [E32, np.zeros((0,), np.int64)], {}),
    ("mse_loss", [E32, E32], {}),
]


# The runtime hands NumPy arrays to the kernels zero-copy, but an empty NumPy array has zero strides, which
# TVM rejects (unless the array happens to be misaligned and is copied first: hence not strict).
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("call", EMPTY_CASES, ids=[c[0] for c in EMPTY_CASES])
def test_op_on_an_empty_input(call) -> None:
    assert_matches(call)


# --- whole programs ---------------------------------------------------------------------------------

FUSED = """
func @main(%table: tensor<10x8xf32>, %ids: tensor<4x3xi64>, %w: tensor<8x5xf32>, %y: tensor<4x5xf32>) -> tensor<f32> {
  %e = graph.gather(%table, %ids) : tensor<4x3x8xf32>
  %t = graph.transpose(%e) {perm = [0, 2, 1]} : tensor<4x8x3xf32>
  %s = graph.reduce_mean(%t) {axes = [-1]} : tensor<4x8xf32>
  %p = graph.pad(%s) {pads = [0, 1, 0, -1]} : tensor<4x8xf32>
  %h = graph.matmul(%p, %w) : tensor<4x5xf32>
  %c = graph.clip(%h) {min = -1.0, max = 1.0}
  %l = graph.mse_loss(%c, %y) : tensor<f32>
  return %l
}
"""


def test_fused_kernels_of_shape_reduction_and_matmul_ops() -> None:
    module = parse(FUSED)
    inputs = {"table": rand(10, 8), "ids": RNG.integers(-10, 10, (4, 3)), "w": rand(8, 5), "y": rand(4, 5)}
    model = compiler.compile(module, "llvm")
    assert model.num_kernels < len(module["main"].ops)
    np.testing.assert_allclose(model(**inputs)[0], run(module, inputs)[0], rtol=1e-4, atol=1e-5)


def _example_inputs(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    out = {}
    for a in parse_file(str(path))["main"].args:
        if a.type.dtype.is_int:  # class labels
            out[a.name] = rng.integers(0, 10, a.type.shape).astype(a.type.dtype.np)
        else:
            out[a.name] = (rng.standard_normal(a.type.shape) * 0.1).astype(a.type.dtype.np)
    return out


@pytest.mark.parametrize("name", ["mlp", "transformer", "train_mlp"])
def test_example_compiled_with_the_default_pipeline(name: str) -> None:
    path = EXAMPLES / f"{name}.gir"
    inputs = _example_inputs(path)
    got = compiler.compile(str(path), "llvm")(**inputs)
    want = run(parse_file(str(path)), inputs)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
