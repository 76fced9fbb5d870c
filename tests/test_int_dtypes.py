"""The integer dtypes that extend the contract's list: i16 and the unsigned u8, u16, u32, u64. Parsed and
printed, interpreted as NumPy computes them (wrapping), compiled (llvm) as interpreted, imported from ONNX."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import infer_error, run_op
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_codegen_ops import assert_matches

from compiler.diagnostics import GCError
from compiler.ir import DType
from compiler.parser import parse
from compiler.printer import print_module

NEW = [np.uint8, np.uint16, np.uint32, np.uint64, np.int16]
IDS = ["u8", "u16", "u32", "u64", "i16"]


def test_the_dtypes_name_numpy_and_tvm_types() -> None:
    for dt, name in zip(NEW, IDS):
        d = DType(name)
        assert d.np == np.dtype(dt) and DType.from_numpy(np.dtype(dt)) is d
        assert d.is_int and not d.is_float and not d.is_bool
        assert d.is_unsigned == name.startswith("u")
        assert d.tvm == np.dtype(dt).name
    assert not DType.i1.is_int and not DType.i1.is_unsigned


@pytest.mark.parametrize("dt", IDS)
def test_types_and_extreme_constants_round_trip(dt: str) -> None:
    info = np.iinfo(DType(dt).np)
    src = (f"func @main(%x: tensor<2x{dt}>) -> (tensor<2x{dt}>, tensor<2xf32>) {{\n"
           f"  %c = graph.constant {{value = dense<[{info.min}, {info.max}]> : tensor<2x{dt}>}}\n"
           f"  %y = graph.add(%x, %c)\n"
           f"  %z = graph.cast(%y) {{dtype = f32}}\n"
           f"  return %y, %z\n}}\n")
    text = print_module(parse(src, "t.gir"))
    assert f"dense<[{info.min}, {info.max}]> : tensor<2x{dt}>" in text
    assert print_module(parse(text, "t.gir")) == text
    const = parse(text, "t.gir")["main"].ops[0].value.array
    assert const.dtype == np.dtype(DType(dt).np) and const.tolist() == [info.min, info.max]


@pytest.mark.parametrize(("literal", "message"), [
    ("dense<-1> : tensor<u8>", "dense value out of range for u8"),
    ("dense<256> : tensor<u8>", "dense value out of range for u8"),
    ("dense<65536> : tensor<u16>", "dense value out of range for u16"),
    ("dense<32768> : tensor<i16>", "dense value out of range for i16"),
    ("dense<18446744073709551616> : tensor<u64>", "does not fit in 64 bits"),
    ("dense<1.5> : tensor<u32>", "must be integers"),
])
def test_constants_out_of_the_dtypes_range_are_errors(literal: str, message: str) -> None:
    src = f"func @main() -> tensor<f32> {{\n  %c = graph.constant {{value = {literal}}}\n  return %c\n}}\n"
    with pytest.raises(GCError, match=message):
        parse(src, "t.gir")


def test_integer_attributes_stay_signed_64_bit() -> None:
    """Only a dense u64 element may pass 2^63 - 1: an attribute (an axis, a slice end) may not."""
    src = ("func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
           "  %y = graph.slice(%x) {starts = [0], ends = [18446744073709551615]}\n  return %y\n}\n")
    with pytest.raises(GCError, match="does not fit in 64 bits"):
        parse(src, "t.gir")


# --- the interpreter against NumPy ---------------------------------------------------------------------


def _pair(dt):
    return st.integers(1, 6).flatmap(lambda n: st.tuples(*[hnp.arrays(dt, n) for _ in range(2)]))


@pytest.mark.parametrize("dt", NEW, ids=IDS)
def test_arithmetic_wraps_as_numpy(dt) -> None:
    @settings(max_examples=30, deadline=None)
    @given(_pair(dt))
    def check(ab) -> None:
        a, b = ab
        with np.errstate(over="ignore"):
            for name, fn in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                             ("maximum", np.maximum), ("minimum", np.minimum), ("neg", None)]:
                got = run_op(name, a) if fn is None else run_op(name, a, b)
                want = np.negative(a) if fn is None else fn(a, b)
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want, err_msg=name)
        for name, fn in [("equal", np.equal), ("less", np.less), ("greater", np.greater)]:
            np.testing.assert_array_equal(run_op(name, a, b), fn(a, b), err_msg=name)

    check()


@pytest.mark.parametrize("dt", [np.uint8, np.uint16, np.uint32, np.uint64], ids=IDS[:4])
def test_unsigned_division_and_comparison_are_unsigned(dt) -> None:
    top = np.iinfo(dt).max
    a = np.array([top, top, 7, 7, 0, top - 1], dt)
    b = np.array([2, 1, 0, 3, 5, top], dt)
    np.testing.assert_array_equal(run_op("div", a, b), [top // 2, top, 0, 2, 0, 0])
    np.testing.assert_array_equal(run_op("less", a, b), [False, False, False, False, True, True])
    # A mean of values near the top: a signed accumulator would wrap negative (a u64 sum still may wrap).
    big = np.array([top, top - 2], dt) if dt != np.uint64 else np.array([2**63 + 2, 2**62], dt)
    assert run_op("reduce_mean", big).item() == (int(big[0]) + int(big[1])) // 2
    with np.errstate(over="ignore"):
        assert run_op("reduce_sum", np.full(4, top, dt)).item() == top - 3  # wraps around


@pytest.mark.parametrize("dt", [np.uint8, np.uint16, np.uint32, np.uint64], ids=IDS[:4])
def test_a_negative_float_cast_to_unsigned_wraps(dt) -> None:
    x = np.array([-1.0, -2.7, 0.9, 3.5, -0.0], np.float32)
    top = int(np.iinfo(dt).max)
    np.testing.assert_array_equal(run_op("cast", x, dtype=DType.from_numpy(np.dtype(dt))), [top, top - 1, 0, 3, 0])


def test_a_float_above_2_63_cast_to_u64_keeps_its_value() -> None:
    x = np.array([2.0**63, 2.0**64 - 2048, 2.0**62], np.float64)
    np.testing.assert_array_equal(run_op("cast", x, dtype=DType.u64), [2**63, 2**64 - 2048, 2**62])


# --- compiled against the interpreter ------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dt", NEW, ids=IDS)
def test_ops_compile_as_interpreted(dt) -> None:
    info = np.iinfo(dt)
    x = np.array([info.min, info.min + 1, 0, 1, 2, 3, 6, 7, 100, info.max - 1, info.max], dt)
    y = np.array([1, 3, 0, info.max, 2, 7, 6, 1, 9, 2, info.max], dt)
    m = np.random.default_rng(0).integers(0, min(int(info.max), 1000), (3, 5)).astype(dt)
    top = np.full(4, info.max, dt)
    names = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "equal", "less", "greater"]
    calls = [(n, [x, y], {}) for n in names]
    calls += [(n, [x], {}) for n in ("neg", "abs", "relu")]
    calls += [("clip", [x], {"min": 2.0, "max": 100.0}), ("clip", [x], {"min": -5.0}), ("clip", [x], {"max": 1e30})]
    calls += [(n, [m], {"axes": [1]}) for n in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")]
    calls += [("reduce_mean", [top], {}), ("reduce_sum", [top], {}), ("argmax", [m], {"axis": 1})]
    calls += [("cast", [x], {"dtype": DType(d)}) for d in ("f32", "f64", "f16", "i1", "i8", "i64", "u8", "u64", "i16")]
    floats = np.array([-3.7, -1, -0.0, 0.5, 2.9, 255, 65535, 70000.5], np.float32)
    calls += [("cast", [floats], {"dtype": DType.from_numpy(np.dtype(dt))})]
    calls += [("where", [x > 5, x, y], {}), ("transpose", [m], {"perm": [1, 0]}),
              ("gather", [m, np.array([2, 0], np.int64)], {"axis": 0}), ("concat", [m, m], {"axis": 0}),
              ("pad", [m], {"pads": [1, 0, 0, 2], "value": 7.0})]
    assert_matches(*calls)


def test_a_float_beyond_2_63_casts_to_u64_compiled_as_interpreted() -> None:
    assert_matches(("cast", [np.array([2.0**63, 2.0**64 - 2048, -1.0, 1.5], np.float64)], {"dtype": DType.u64}))
    # From 2^64 on the value is undefined (docs/ir.md); both sides give 0 (LLVM's conversion gave 2^64 - 1).
    assert_matches(("cast", [np.array([2.0**64, 1e30, np.inf], np.float64)], {"dtype": DType.u64}))
    assert_matches(("cast", [np.array([2.0**64, 3e38], np.float32)], {"dtype": DType.u64}))


# --- bitwise ops and shifts ---------------------------------------------------------------------------

ALL_INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
ALL_IDS = ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]


def _shift_amounts(dt) -> np.ndarray:
    """Every amount from below 0 (signed) to past the width, where ONNX says 0 (or -1 for x < 0 shifted right)."""
    bits = np.iinfo(dt).bits
    lo = 0 if np.iinfo(dt).min == 0 else -3
    return np.arange(lo, bits + 4).astype(dt)


@pytest.mark.parametrize("dt", ALL_INTS, ids=ALL_IDS)
def test_shifts_follow_onnx_out_of_range_rule(dt) -> None:
    info = np.iinfo(dt)
    y = _shift_amounts(dt)
    for x0 in {info.min, -5 if info.min else 5, 1, info.max}:
        x = np.full(y.shape, x0, dt)
        left, right = run_op("shift_left", x, y), run_op("shift_right", x, y)
        for i, k in enumerate(y.tolist()):
            inside = 0 <= k < info.bits
            mask = (1 << info.bits) - 1
            want_left = ((x0 << k) & mask) if inside else 0
            if info.min and want_left > info.max:
                want_left -= 1 << info.bits
            want_right = (x0 >> k) if inside else (-1 if x0 < 0 else 0)
            assert left[i] == want_left and right[i] == want_right, (x0, k)


@pytest.mark.parametrize("dt", ALL_INTS, ids=ALL_IDS)
def test_bitwise_ops_are_numpys(dt) -> None:
    @settings(max_examples=20, deadline=None)
    @given(_pair(dt))
    def check(ab) -> None:
        a, b = ab
        for name, fn in [("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
                         ("bitwise_xor", np.bitwise_xor)]:
            np.testing.assert_array_equal(run_op(name, a, b), fn(a, b), err_msg=name)
        np.testing.assert_array_equal(run_op("bitwise_not", a), np.invert(a))

    check()


@pytest.mark.parametrize("dt", ALL_INTS, ids=ALL_IDS)
def test_bitwise_ops_and_shifts_compile_as_interpreted(dt) -> None:
    info = np.iinfo(dt)
    y = _shift_amounts(dt)
    x = np.resize(np.array([info.min, info.max, 1, 6, 0, info.max // 3], dt), y.shape)
    names = ["bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right"]
    # A broadcast operand too: one shift amount for a row.
    assert_matches(*[(n, [x, y], {}) for n in names], ("bitwise_not", [x], {}),
                   ("shift_left", [x.reshape(-1, 1), y[:3]], {}), ("shift_right", [x.reshape(-1, 1), y[:3]], {}))


@pytest.mark.parametrize("name", ["bitwise_and", "shift_left", "shift_right"])
def test_bitwise_ops_take_integers_only(name: str) -> None:
    assert infer_error(name, "tensor<4xf32>", "tensor<4xf32>").endswith("operand must be an integer tensor, got tensor<4xf32>")
    assert infer_error(name, "tensor<4xi1>", "tensor<4xi1>").endswith("operand must be an integer tensor, got tensor<4xi1>")
    assert infer_error(name, "tensor<4xu8>", "tensor<4xi8>").endswith("operand dtypes differ: u8 vs i8")
    assert infer_error("bitwise_not", "tensor<4xf16>").endswith("operand must be an integer tensor, got tensor<4xf16>")
