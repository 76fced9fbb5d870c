"""The integer dtypes that extend the contract's list: i16 and the unsigned u8, u16, u32, u64. Parsed and
printed, interpreted as NumPy computes them (wrapping), compiled (llvm) as interpreted, imported from ONNX."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import run_op
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
