"""Reductions, argmax, matmul, losses, constant and call against independent NumPy and hand computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import compiler
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import DType, Op
from compiler.parser import parse
from helpers import infer_error, run_op

RNG = np.random.default_rng(0)


def reduce_loops(x: np.ndarray, axes, keepdims: bool, fn) -> np.ndarray:
    """Reduce x over `axes` by visiting every element: fn gets the Python list of reduced values."""
    rank = x.ndim
    axes = range(rank) if not axes else sorted(a % rank for a in axes)
    kept = [i for i in range(rank) if i not in axes]
    out_shape = [1 if i in axes else x.shape[i] for i in range(rank)] if keepdims else [x.shape[i] for i in kept]
    out = []
    for idx in itertools.product(*(range(x.shape[i]) for i in kept)):
        vals = []
        for red in itertools.product(*(range(x.shape[i]) for i in axes)):
            full = [0] * rank
            for i, v in zip(kept, idx):
                full[i] = v
            for i, v in zip(axes, red):
                full[i] = v
            vals.append(x[tuple(full)].item())
        out.append(fn(vals))
    return np.array(out).reshape(out_shape)


def first_op(text: str) -> Op:
    return parse(text, "t.gir")["main"].ops[0]


def parse_error(text: str) -> GCError:
    with pytest.raises(GCError) as e:
        parse(text, "t.gir")
    return e.value


# --- reductions ---------------------------------------------------------------------------------

REDUCERS = {
    "reduce_sum": sum,
    "reduce_mean": lambda v: sum(v) / len(v),
    "reduce_prod": math.prod,
    "reduce_max": max,
    "reduce_min": min,
}
AXES = [None, [], [1], [-1], [0, 2], [-3, -1], [2, 0, 1]]


@pytest.mark.parametrize("name", REDUCERS)
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_f32_matches_loops(name: str, axes, keepdims: bool) -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    attrs = {"keepdims": keepdims} if axes is None else {"axes": axes, "keepdims": keepdims}
    got = run_op(name, x, **attrs)
    want = reduce_loops(x, axes, keepdims, REDUCERS[name])
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", REDUCERS)
def test_reduce_f64_is_exact_to_double(name: str) -> None:
    x = RNG.standard_normal((3, 5))
    got = run_op(name, x, axes=[0])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, reduce_loops(x, [0], False, REDUCERS[name]), rtol=1e-13)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_prod", "reduce_max", "reduce_min"])
def test_reduce_ints(name: str, dtype) -> None:
    x = np.array([[3, -7, 2], [-1, 8, 0]], dtype=dtype)
    got = run_op(name, x, axes=[-1])
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, reduce_loops(x, [1], False, REDUCERS[name]))


def test_reduce_mean_of_ints_truncates_toward_zero() -> None:
    x = np.array([[-7, 0], [7, 0], [-6, 2]], dtype=np.int32)
    got = run_op("reduce_mean", x, axes=[1])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [-3, 3, -2])


def test_reduce_empty_axes_list_reduces_every_axis() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert run_op("reduce_sum", x, axes=[]).shape == ()
    assert run_op("reduce_sum", x, axes=[]) == 15.0
    assert run_op("reduce_sum", x, axes=[], keepdims=True).shape == (1, 1)


def test_reduce_keepdims_keeps_size_one_axes() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = run_op("reduce_max", x, axes=[1], keepdims=True)
    assert got.shape == (2, 1, 4)
    np.testing.assert_array_equal(got[:, 0, :], x[:, 2, :])


def test_reduce_of_a_scalar_is_the_scalar() -> None:
    x = np.array(2.5, dtype=np.float32)
    assert run_op("reduce_sum", x).shape == ()
    assert run_op("reduce_mean", x) == 2.5


def test_reduce_over_an_empty_axis_gives_the_identity() -> None:
    x = np.zeros((2, 0), dtype=np.float32)
    np.testing.assert_array_equal(run_op("reduce_sum", x, axes=[1]), [0.0, 0.0])
    np.testing.assert_array_equal(run_op("reduce_prod", x, axes=[1]), [1.0, 1.0])
    np.testing.assert_array_equal(run_op("reduce_max", x, axes=[1]), [-np.inf, -np.inf])
    np.testing.assert_array_equal(run_op("reduce_min", x, axes=[1]), [np.inf, np.inf])
    i = np.zeros((2, 0), dtype=np.int32)
    np.testing.assert_array_equal(run_op("reduce_max", i, axes=[1]), [-(2**31), -(2**31)])


def cumsum_loops(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX CumSum by visiting every element: y[..., i, ...] sums x[..., k, ...] over k <= i (k < i exclusive;
    k >= i, k > i reversed)."""
    axis %= x.ndim
    y = np.zeros_like(x)
    n = x.shape[axis]
    for idx in itertools.product(*(range(d) for d in x.shape)):
        i = idx[axis]
        ks = [k for k in range(n) if (k > i if exclusive else k >= i)] if reverse else \
             [k for k in range(n) if (k < i if exclusive else k <= i)]
        y[idx] = sum((x[idx[:axis] + (k,) + idx[axis + 1 :]] for k in ks), x.dtype.type(0))
    return y


@pytest.mark.parametrize(("exclusive", "reverse"), list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_cumsum_along_each_axis_with_each_flag(axis: int, exclusive: bool, reverse: bool) -> None:
    x = RNG.standard_normal((2, 3, 4))
    got = run_op("cumsum", x, axis=axis, exclusive=exclusive, reverse=reverse)
    assert got.dtype == np.float64 and got.shape == x.shape
    np.testing.assert_allclose(got, cumsum_loops(x, axis, exclusive, reverse), rtol=1e-13, atol=1e-15)


def test_cumsum_of_integers_and_its_flags_by_hand() -> None:
    x = np.array([1, 2, 3, 4, 5], dtype=np.int32)
    for flags, want in [({}, [1, 3, 6, 10, 15]), ({"exclusive": True}, [0, 1, 3, 6, 10]),
                        ({"reverse": True}, [15, 14, 12, 9, 5]),
                        ({"exclusive": True, "reverse": True}, [14, 12, 9, 5, 0])]:  # fmt: skip
        got = run_op("cumsum", x, **flags)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want, err_msg=str(flags))
    big = np.array([[2**31 - 1, 1], [5, -7]], dtype=np.int32)  # wraps as int32 arithmetic does
    np.testing.assert_array_equal(run_op("cumsum", big, axis=1), [[2**31 - 1, -(2**31)], [5, -2]])


def test_cumsum_of_an_empty_axis_and_its_errors() -> None:
    assert run_op("cumsum", np.zeros((2, 0), np.float32), axis=1, exclusive=True).shape == (2, 0)
    assert "out of range" in infer_error("cumsum", "tensor<2x3xf32>", axis=2)
    assert "rank >= 1" in infer_error("cumsum", "tensor<f32>")


def test_cumsum_keeps_a_dynamic_size() -> None:
    module = parse("func @main(%x: tensor<?x3xf32>) -> tensor<?x3xf32> {\n  %y = graph.cumsum(%x) {axis = 0}\n"
                   "  return %y\n}\n", "t.gir")
    assert str(module["main"].ops[0].results[0].type) == "tensor<?x3xf32>"
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(run(module, [x])[0], np.cumsum(x, axis=0), rtol=1e-6)


def test_reduce_max_propagates_nan() -> None:
    x = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    assert np.isnan(run_op("reduce_max", x))
    assert np.isnan(run_op("reduce_min", x))


def test_reduce_sum_of_f16_accumulates_wider() -> None:
    # 4096 halves of 1.0 overflow nothing but lose every increment past 2048 if summed in f16.
    x = np.ones(4096, dtype=np.float16)
    assert run_op("reduce_sum", x) == 4096.0


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"axes": [3]}, "axis 3 is out of range for rank 3"),
        ({"axes": [-4]}, "axis -4 is out of range for rank 3"),
        ({"axes": [0, -3]}, "axes [0, -3] repeat an axis"),
    ],
)
def test_reduce_rejects_bad_axes(attrs: dict, message: str) -> None:
    assert infer_error("reduce_sum", "tensor<2x3x4xf32>", **attrs) == f"graph.reduce_sum: {message}"


def test_reduce_of_a_scalar_has_no_axis_zero() -> None:
    assert "axis 0 is out of range for rank 0" in infer_error("reduce_min", "tensor<f32>", axes=[0])


def test_reduce_rejects_bool() -> None:
    assert "must be numeric" in infer_error("reduce_max", "tensor<4xi1>")


def test_reduce_axes_must_be_integers() -> None:
    assert "attribute 'axes' must be a list of integers" in infer_error("reduce_sum", "tensor<4xf32>", axes=[0.5])


# --- argmax -------------------------------------------------------------------------------------


def test_argmax_takes_the_first_of_tied_maxima() -> None:
    x = np.array([[1.0, 3.0, 3.0], [5.0, 5.0, 0.0], [2.0, 2.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(run_op("argmax", x, axis=1), [1, 0, 0])
    np.testing.assert_array_equal(run_op("argmax", x, axis=0), [1, 1, 0])


def test_argmax_defaults_to_axis_zero_and_returns_i64() -> None:
    x = np.array([[0.0, 9.0], [4.0, 1.0], [4.0, 3.0]], dtype=np.float32)
    got = run_op("argmax", x)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [1, 0])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_argmax_negative_axis_keepdims(dtype) -> None:
    x = RNG.integers(-5, 5, size=(2, 3, 4)).astype(dtype)
    got = run_op("argmax", x, axis=-2, keepdims=True)
    assert got.shape == (2, 1, 4) and got.dtype == np.int64
    for i, k in itertools.product(range(2), range(4)):
        col = [x[i, j, k] for j in range(3)]
        assert got[i, 0, k] == col.index(max(col))


@pytest.mark.parametrize(
    "ty, attrs, message",
    [
        ("tensor<2x3xf32>", {"axis": 2}, "axis 2 is out of range for rank 2"),
        ("tensor<f32>", {}, "operand must have rank >= 1, got tensor<f32>"),
        ("tensor<2x0xf32>", {"axis": 1}, "axis 1 of tensor<2x0xf32> is empty: there is no maximum"),
    ],
)
def test_argmax_rejects(ty: str, attrs: dict, message: str) -> None:
    assert infer_error("argmax", ty, **attrs) == f"graph.argmax: {message}"


# --- matmul -------------------------------------------------------------------------------------


def matmul_loops(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy matmul written out: 1-D operands become a row / a column, batch indices broadcast."""
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    ba, bb = a2.shape[:-2], b2.shape[:-2]
    rank = max(len(ba), len(bb))
    ba, bb = (1,) * (rank - len(ba)) + ba, (1,) * (rank - len(bb)) + bb
    a2, b2 = a2.reshape(ba + a2.shape[-2:]), b2.reshape(bb + b2.shape[-2:])
    batch = tuple(max(x, y) for x, y in zip(ba, bb))
    (m, k), n = a2.shape[-2:], b2.shape[-1]
    out = np.zeros(batch + (m, n), dtype=np.float64)
    for idx in itertools.product(*(range(d) for d in batch)):
        ia = tuple(i if d > 1 else 0 for i, d in zip(idx, ba))
        ib = tuple(i if d > 1 else 0 for i, d in zip(idx, bb))
        for i, j in itertools.product(range(m), range(n)):
            out[idx + (i, j)] = sum(float(a2[ia + (i, p)]) * float(b2[ib + (p, j)]) for p in range(k))
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    return out.reshape(shape)


MATMUL_SHAPES = [
    ((4,), (4,), ()),
    ((4,), (4, 3), (3,)),
    ((2, 4), (4,), (2,)),
    ((2, 4), (4, 3), (2, 3)),
    ((2, 1, 3, 4), (5, 4, 6), (2, 5, 3, 6)),
    ((3, 4), (2, 4, 5), (2, 3, 5)),
    ((4,), (2, 4, 5), (2, 5)),
    ((2, 3, 4), (4,), (2, 3)),
    ((3, 1, 2, 4), (1, 2, 4, 3), (3, 2, 2, 3)),
]


@pytest.mark.parametrize("sa, sb, want_shape", MATMUL_SHAPES, ids=str)
def test_matmul_matches_loops(sa, sb, want_shape) -> None:
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    got = run_op("matmul", a, b)
    assert got.shape == want_shape and got.dtype == np.float32
    np.testing.assert_allclose(got, matmul_loops(a, b), rtol=1e-5, atol=1e-5)


def test_matmul_f64() -> None:
    a, b = RNG.standard_normal((3, 5)), RNG.standard_normal((5, 2))
    got = run_op("matmul", a, b)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, matmul_loops(a, b), rtol=1e-13)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_matmul_ints(dtype) -> None:
    a = np.array([[1, -2, 3], [0, 4, -1]], dtype=dtype)
    b = np.array([[2, 1], [-3, 0], [1, 5]], dtype=dtype)
    got = run_op("matmul", a, b)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, [[11, 16], [-13, -5]])


@pytest.mark.parametrize(
    "ta, tb, message",
    [
        ("tensor<64x784xf32>", "tensor<785x10xf32>", "inner dimensions differ: 784 vs 785"),
        ("tensor<3xf32>", "tensor<4xf32>", "inner dimensions differ: 3 vs 4"),
        ("tensor<2x3xf32>", "tensor<4xf32>", "inner dimensions differ: 3 vs 4"),
        ("tensor<f32>", "tensor<4xf32>", "operand #0 must have rank >= 1, got tensor<f32>"),
        ("tensor<4xf32>", "tensor<f32>", "operand #1 must have rank >= 1, got tensor<f32>"),
        ("tensor<2x3xf32>", "tensor<3x2xf64>", "operand dtypes differ: f32 vs f64"),
        ("tensor<2x2x3xf32>", "tensor<3x3x2xf32>", "batch dimensions [2] and [3] do not broadcast"),
        ("tensor<2x3xi1>", "tensor<3x2xi1>", "operand must be numeric, got tensor<2x3xi1>"),
    ],
)
def test_matmul_rejects(ta: str, tb: str, message: str) -> None:
    assert infer_error("matmul", ta, tb) == f"graph.matmul: {message}"


def test_matmul_inner_dimension_error_names_file_line_col() -> None:
    text = (
        "func @main(%x: tensor<64x784xf32>, %w: tensor<785x10xf32>) -> tensor<64x10xf32> {\n"
        "  %y = graph.matmul(%x, %w)\n"
        "  return %y\n"
        "}\n"
    )
    assert str(parse_error(text)).startswith("t.gir:2:8: error: graph.matmul: inner dimensions differ: 784 vs 785")


@pytest.mark.parametrize(
    "ta, tb, flops",
    [
        ("tensor<64x784xf32>", "tensor<784x256xf32>", 2 * 64 * 256 * 784),
        ("tensor<2x1x3x4xf32>", "tensor<5x4x6xf32>", 2 * 10 * 3 * 6 * 4),
        ("tensor<7xf32>", "tensor<7xf32>", 2 * 7),
    ],
)
def test_matmul_flops(ta: str, tb: str, flops: int) -> None:
    op = first_op(f"func @main(%a: {ta}, %b: {tb}) -> {ta} {{\n  %r = graph.matmul(%a, %b)\n  return %a\n}}\n")
    assert op.flops() == flops


# --- losses -------------------------------------------------------------------------------------


def cross_entropy_by_hand(logits: np.ndarray, labels: np.ndarray) -> float:
    total = 0.0
    for row, label in zip(logits.tolist(), labels.tolist()):
        top = max(row)
        log_z = top + math.log(sum(math.exp(v - top) for v in row))
        total += log_z - row[label]
    return total / len(labels)


@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
def test_softmax_cross_entropy_matches_hand_computation(label_dtype) -> None:
    logits = RNG.standard_normal((5, 4)).astype(np.float32)
    labels = np.array([0, 3, 1, 1, 2], dtype=label_dtype)
    got = run_op("softmax_cross_entropy", logits, labels)
    assert got.shape == () and got.dtype == np.float32
    assert got == pytest.approx(cross_entropy_by_hand(logits, labels), rel=1e-6)


def test_softmax_cross_entropy_of_uniform_logits_is_log_c() -> None:
    got = run_op("softmax_cross_entropy", np.zeros((3, 10), np.float32), np.array([0, 4, 9], np.int64))
    assert got == pytest.approx(math.log(10), rel=1e-6)


def test_softmax_cross_entropy_is_stable_for_large_logits() -> None:
    logits = np.array([[1000.0, 0.0], [0.0, -1000.0]], dtype=np.float32)
    got = run_op("softmax_cross_entropy", logits, np.array([1, 1], np.int32))
    assert got == pytest.approx(1000.0, rel=1e-6)


def test_softmax_cross_entropy_f64_logits_give_an_f64_loss() -> None:
    logits, labels = RNG.standard_normal((4, 3)), np.array([2, 0, 1, 2], np.int64)
    got = run_op("softmax_cross_entropy", logits, labels)
    assert got.dtype == np.float64
    assert got == pytest.approx(cross_entropy_by_hand(logits, labels), rel=1e-12)


LOW_PRECISION_LOSSES = """
func @main(%x: tensor<4x5xDT>, %l: tensor<4xi64>, %a: tensor<3x2xDT>, %b: tensor<3x2xDT>)
    -> (tensor<f32>, tensor<f32>) {
  %ce = graph.softmax_cross_entropy(%x, %l)
  %mse = graph.mse_loss(%a, %b)
  return %ce, %mse
}
"""


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_16_bit_inputs_give_an_f32_loss_computed_in_f32(dt: str) -> None:
    """The contract types losses tensor<f32>: 16-bit inputs are summed in f32 and the loss stays f32,
    in the interpreter and compiled alike."""
    module = parse(LOW_PRECISION_LOSSES.replace("DT", dt))
    inputs = random_inputs(module["main"], 0, module)
    want_ce = cross_entropy_by_hand(inputs["x"].astype(np.float32), inputs["l"])
    want_mse = float(np.mean((inputs["a"].astype(np.float32) - inputs["b"].astype(np.float32)) ** 2))
    for got in (run(module, inputs), compiler.compile(module, "llvm")(**inputs)):
        assert [g.dtype for g in got] == [np.float32, np.float32]
        assert got[0] == pytest.approx(want_ce, rel=1e-5) and got[1] == pytest.approx(want_mse, rel=1e-5)


@pytest.mark.parametrize("bad", [-1, 4])
def test_softmax_cross_entropy_label_out_of_range_is_a_gc_error(bad: int) -> None:
    labels = np.array([0, bad, 1], np.int32)
    with pytest.raises(GCError, match=rf"label {bad} at position 1 is out of range \[0, 4\)"):
        run_op("softmax_cross_entropy", np.zeros((3, 4), np.float32), labels)


def test_softmax_cross_entropy_input_range_covers_the_classes() -> None:
    op = first_op(
        "func @main(%x: tensor<8x10xf32>, %y: tensor<8xi64>) -> tensor<f32> {\n"
        "  %l = graph.softmax_cross_entropy(%x, %y)\n"
        "  return %l\n"
        "}\n"
    )
    assert op.input_range(1) == (0, 10)
    assert op.input_range(0) is None
    assert op.flops() == 80


@pytest.mark.parametrize(
    "tx, ty, message",
    [
        ("tensor<4x3xf32>", "tensor<4xf32>", "labels must be i32 or i64 class indices, got tensor<4xf32>"),
        ("tensor<4x3xi32>", "tensor<4xi32>", "logits must be a floating-point tensor, got tensor<4x3xi32>"),
        ("tensor<12xf32>", "tensor<4xi32>", "logits must have rank 2, got tensor<12xf32>"),
        ("tensor<4x3xf32>", "tensor<4x1xi64>", "labels must have rank 1, got tensor<4x1xi64>"),
        ("tensor<4x3xf32>", "tensor<5xi64>", "batch sizes differ: 4 rows of logits vs 5 labels"),
    ],
)
def test_softmax_cross_entropy_rejects(tx: str, ty: str, message: str) -> None:
    assert infer_error("softmax_cross_entropy", tx, ty) == f"graph.softmax_cross_entropy: {message}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mse_loss_matches_hand_computation(dtype) -> None:
    a = np.array([[1.0, 2.0], [3.0, -4.0]], dtype=dtype)
    b = np.array([[0.5, 2.0], [1.0, 0.0]], dtype=dtype)
    got = run_op("mse_loss", a, b)
    assert got.shape == () and got.dtype == dtype
    assert got == pytest.approx((0.25 + 0.0 + 4.0 + 16.0) / 4)


@pytest.mark.parametrize(
    "ta, tb, message",
    [
        ("tensor<4xf32>", "tensor<1xf32>", "operand shapes differ: tensor<4xf32> vs tensor<1xf32>"),
        ("tensor<4xf32>", "tensor<4xf64>", "operand dtypes differ: f32 vs f64"),
        ("tensor<4xi32>", "tensor<4xi32>", "operand must be a floating-point tensor, got tensor<4xi32>"),
    ],
)
def test_mse_loss_rejects(ta: str, tb: str, message: str) -> None:
    assert infer_error("mse_loss", ta, tb) == f"graph.mse_loss: {message}"


# --- constant -----------------------------------------------------------------------------------


def run_text(text: str, *inputs: np.ndarray, entry: str = "main") -> list[np.ndarray]:
    module = parse(text, "t.gir")
    assert str(parse(str(module), "again.gir")) == str(module)
    return run(module, list(inputs), entry)


def test_constant_splat_fills_its_type() -> None:
    text = (
        "func @main() -> tensor<2x3xf32> {\n"
        "  %c = graph.constant {value = dense<1.5> : tensor<2x3xf32>}\n"
        "  return %c\n"
        "}\n"
    )
    (got,) = run_text(text)
    np.testing.assert_array_equal(got, np.full((2, 3), 1.5, np.float32))
    assert "%c = graph.constant {value = dense<1.5> : tensor<2x3xf32>} : tensor<2x3xf32>" in str(parse(text))


@pytest.mark.parametrize(
    "literal, ty, want",
    [
        ("[[1.0, 2.0], [3.0, 4.0]]", "tensor<2x2xf32>", np.array([[1, 2], [3, 4]], np.float32)),
        ("[[1, -2, 3]]", "tensor<1x3xi64>", np.array([[1, -2, 3]], np.int64)),
        ("[true, false]", "tensor<2xi1>", np.array([True, False])),
        ("[0.5, -0.25]", "tensor<2xf16>", np.array([0.5, -0.25], np.float16)),
    ],
)
def test_constant_nested_dense(literal: str, ty: str, want: np.ndarray) -> None:
    text = f"func @main() -> {ty} {{\n  %c = graph.constant {{value = dense<{literal}> : {ty}}}\n  return %c\n}}\n"
    (got,) = run_text(text)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_constant_scalar_has_rank_zero() -> None:
    text = "func @main() -> tensor<f32> {\n  %c = graph.constant {value = dense<3.0> : tensor<f32>}\n  return %c\n}\n"
    (got,) = run_text(text)
    assert got.shape == () and got == 3.0


def test_constant_feeds_other_ops() -> None:
    text = (
        "func @main(%x: tensor<2x2xf32>) -> tensor<2xf32> {\n"
        "  %w = graph.constant {value = dense<[[1.0, 0.0], [2.0, 1.0]]> : tensor<2x2xf32>}\n"
        "  %y = graph.matmul(%x, %w)\n"
        "  %s = graph.reduce_sum(%y) {axes = [0]}\n"
        "  return %s\n"
        "}\n"
    )
    (got,) = run_text(text, np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    np.testing.assert_array_equal(got, [(1 + 4) + (3 + 8), 2 + 4])
    assert first_op(text).flops() == 0


def test_constant_without_value_is_an_error() -> None:
    err = parse_error("func @main() -> tensor<f32> {\n  %c = graph.constant\n  return %c\n}\n")
    assert "missing required attribute 'value'" in str(err)


# --- call ---------------------------------------------------------------------------------------

LAYER = """
func @layer(%x: tensor<2x3xf32>, %w: tensor<3x3xf32>) -> tensor<2x3xf32> {
  %h = graph.matmul(%x, %w)
  %y = graph.relu(%h)
  return %y
}
"""


def test_call_runs_another_function() -> None:
    text = (
        "func @main(%x: tensor<2x3xf32>, %w: tensor<3x3xf32>) -> tensor<f32> {\n"
        "  %a = graph.call(%x, %w) {callee = @layer} : tensor<2x3xf32>\n"
        "  %b = graph.call(%a, %w) {callee = @layer} : tensor<2x3xf32>\n"
        "  %s = graph.reduce_sum(%b)\n"
        "  return %s\n"
        "}\n" + LAYER
    )
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 3)).astype(np.float32)
    relu = lambda v: np.where(v > 0, v, 0)  # noqa: E731
    want = relu(matmul_loops(relu(matmul_loops(x, w)), w)).sum()
    (got,) = run_text(text, x, w)
    assert got == pytest.approx(want, rel=1e-5)


def test_call_with_no_operands_and_two_results() -> None:
    text = (
        "func @main() -> tensor<2xi32> {\n"
        "  %p, %q = graph.call {callee = @pair} : (tensor<2xi32>, tensor<f32>)\n"
        "  return %p\n"
        "}\n"
        "func @pair() -> (tensor<2xi32>, tensor<f32>) {\n"
        "  %a = graph.constant {value = dense<[7, 8]> : tensor<2xi32>}\n"
        "  %b = graph.constant {value = dense<[1.0]> : tensor<1xf32>}\n"
        "  %c = graph.reduce_sum(%b)\n"
        "  return %a, %c\n"
        "}\n"
    )
    (got,) = run_text(text)
    np.testing.assert_array_equal(got, np.array([7, 8], np.int32))
    assert first_op(text).flops() == 0


def call_error(line: str, sig: str = "%x: tensor<2x3xf32>, %w: tensor<3x3xf32>") -> str:
    text = f"func @main({sig}) -> tensor<2x3xf32> {{\n  {line}\n  return %x\n}}\n" + LAYER
    return str(parse_error(text))


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "%a = graph.call(%x, %w) {callee = @layr} : tensor<2x3xf32>",
            "unknown function @layr; did you mean @layer?",
        ),
        (
            "%a = graph.call(%w, %w) {callee = @layer} : tensor<2x3xf32>",
            "operand #0 has type tensor<3x3xf32> but @layer expects tensor<2x3xf32> for %x",
        ),
        ("%a = graph.call(%x) {callee = @layer} : tensor<2x3xf32>", "@layer takes 2 argument(s), got 1"),
        (
            "%a = graph.call(%x, %w) {callee = @layer} : tensor<3x2xf32>",
            "result #0 has type tensor<3x2xf32> but @layer returns tensor<2x3xf32>",
        ),
        (
            "%a, %b = graph.call(%x, %w) {callee = @layer} : (tensor<2x3xf32>, tensor<2x3xf32>)",
            "@layer returns 1 value(s), got 2 result(s)",
        ),
        ("%a = graph.call(%x, %w) {callee = @layer}", "cannot infer the result types of a call; write them"),
    ],
)
def test_call_errors_name_file_line_col(line: str, message: str) -> None:
    col = 3 + line.index("graph.call")  # the op name's column, after the two-space indent
    assert call_error(line).startswith(f"t.gir:2:{col}: error: graph.call: {message}")


def test_call_wrong_operand_dtype() -> None:
    line = "%a = graph.call(%x, %w) {callee = @layer} : tensor<2x3xf32>"
    err = call_error(line, "%x: tensor<2x3xf64>, %w: tensor<3x3xf32>")
    assert "operand #0 has type tensor<2x3xf64> but @layer expects tensor<2x3xf32>" in err


def test_call_callee_must_be_a_symbol() -> None:
    err = call_error('%a = graph.call(%x, %w) {callee = "layer"} : tensor<2x3xf32>')
    assert "attribute 'callee' must be a symbol (@name)" in err


def test_recursive_call_is_an_error() -> None:
    text = (
        "func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %y = graph.call(%x) {callee = @f} : tensor<2xf32>\n"
        "  return %y\n"
        "}\n"
        "func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %y = graph.call(%x) {callee = @main} : tensor<2xf32>\n"
        "  return %y\n"
        "}\n"
    )
    assert "recursive call: @main -> @f -> @main" in str(parse_error(text))


# --- flops --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min", "argmax"])
def test_reduction_flops_count_the_input(name: str) -> None:
    op = first_op(f"func @main(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {{\n  %r = graph.{name}(%x)\n  return %x\n}}\n")
    assert op.flops() == 15


def test_mse_loss_flops_count_the_input() -> None:
    op = first_op(
        "func @main(%a: tensor<3x5xf32>, %b: tensor<3x5xf32>) -> tensor<f32> {\n"
        "  %r = graph.mse_loss(%a, %b)\n"
        "  return %r\n"
        "}\n"
    )
    assert op.flops() == 15


# --- numel --------------------------------------------------------------------------------------


@pytest.mark.parametrize("axes, dtype, shape, want", [
    (None, "f32", "2x3x4", 24), ("[0]", "i64", "2x3x4", 2), ("[0, -1]", "f64", "2x3x4", 8), (None, "i32", "0x5", 0),
    ("[1]", "f32", "?x7", 7),
])
def test_numel_counts_the_elements_over_its_axes(axes, dtype, shape, want) -> None:
    attrs = f"{{axes = {axes}, dtype = {dtype}}}" if axes else f"{{dtype = {dtype}}}"
    text = (f"func @main(%x: tensor<{shape}xf32>) -> tensor<{dtype}> {{\n"
            f"  %n = graph.numel(%x) {attrs}\n  return %n\n}}\n")
    x = np.full([3 if d == "?" else int(d) for d in shape.split("x")], np.nan, np.float32)  # values never matter
    (got,) = run_text(text, x)
    assert got.shape == () and got.dtype == DType(dtype).np and got == want


def test_numel_of_a_dynamic_size_is_the_size_at_the_call() -> None:
    module = parse("func @main(%x: tensor<?x4xf32>) -> tensor<i64> {\n"
                   "  %n = graph.numel(%x) {axes = [0], dtype = i64}\n  return %n\n}\n")
    for rows in (1, 6, 0):
        assert run(module, [np.zeros((rows, 4), np.float32)])[0] == rows


def test_numel_rejects_a_bool_result_and_a_bad_axis() -> None:
    for attrs, msg in (("{dtype = i1}", "not i1"), ("{axes = [2]}", "out of range")):
        with pytest.raises(GCError, match=msg):
            parse(f"func @main(%x: tensor<2x3xf32>) -> tensor<f32> {{\n  %n = graph.numel(%x) {attrs}\n  return %n\n}}\n")
