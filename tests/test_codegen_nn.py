"""Compiled graph.conv2d, pooling, normalization, softmax and dropout (llvm) against the interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import compiler
from compiler.builder import finish, new_func
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import DType, Module, TensorType
from test_ops_nn import CONV_CASES, POOL_CASES

RNG = np.random.default_rng(0)
F32 = {"rtol": 1e-4, "atol": 1e-5}
F64 = {"rtol": 1e-10, "atol": 1e-12}
CNN = str(Path(__file__).resolve().parent.parent / "examples" / "cnn.gir")


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def compiled_and_interpreted(*calls: tuple[str, list[np.ndarray], dict]) -> tuple[list, list]:
    """One function applying each (op name, operands, attrs) to arguments of its own, compiled alone
    (empty pipeline: every op is its own kernel) and interpreted; the results of both, one per call."""
    arrays = [a for _, operands, _ in calls for a in operands]
    types = {f"a{i}": TensorType(a.shape, DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)}
    f, b, args = new_func("main", types)
    it = iter(args)
    finish(f, *[getattr(b, name)(*[next(it) for _ in operands], **attrs) for name, operands, attrs in calls])
    module = Module([f])
    got = compiler.compile(module, "llvm", pipeline="")(*arrays)
    want = run(module, arrays)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
    return got, want


def assert_matches(*calls: tuple[str, list[np.ndarray], dict], tol: dict | None = None) -> None:
    """Compiled equals interpreted: integers exactly, floats to `tol` (by default F32 or F64 by dtype)."""
    got, want = compiled_and_interpreted(*calls)
    for (name, _, attrs), g, w in zip(calls, got, want):
        if tol is None and not np.issubdtype(w.dtype, np.floating):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} {attrs}")
            continue
        t = tol or (F64 if w.dtype == np.float64 else F32)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), **t, err_msg=f"{name} {attrs}")


# --- conv2d -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("xs, ws, attrs, out", CONV_CASES)
def test_conv2d_with_and_without_bias(xs, ws, attrs, out):
    x, w, bias = rand(*xs), rand(*ws), rand(ws[0])
    assert_matches(("conv2d", [x, w], attrs), ("conv2d", [x, w, bias], attrs))


def test_conv2d_depthwise_with_channel_multiplier():
    x, w = rand(2, 3, 7, 6), rand(6, 1, 3, 3)
    assert_matches(("conv2d", [x, w, rand(6)], {"groups": 3, "padding": [2, 1, 0, 1], "strides": [2, 1]}))


def test_conv2d_f64():
    x, w, bias = rand(2, 4, 6, 5, dtype=np.float64), rand(4, 2, 3, 2, dtype=np.float64), rand(4, dtype=np.float64)
    assert_matches(("conv2d", [x, w, bias], {"groups": 2, "strides": [2, 1], "padding": [1, 0, 1, 1]}))


@pytest.mark.parametrize("dtype", [np.int32, np.int8])
def test_conv2d_integers_are_exact_and_wrap_like_the_reference(dtype):
    x = RNG.integers(-20, 20, (1, 2, 4, 4)).astype(dtype)
    w = RNG.integers(-10, 10, (2, 2, 3, 3)).astype(dtype)
    bias = np.array([7, -7], dtype=dtype)
    assert_matches(("conv2d", [x, w, bias], {"padding": [1, 1, 1, 1]}))


def test_conv2d_f16_accumulates_in_f32():
    x, w = rand(1, 8, 5, 5, dtype=np.float16), rand(4, 8, 3, 3, dtype=np.float16)
    assert_matches(("conv2d", [x, w], {"padding": [1, 1, 1, 1]}), tol={"rtol": 1e-2, "atol": 1e-2})


# --- pooling ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("h, w, kernel, strides, padding, ceil_mode, out", POOL_CASES)
def test_pools_match_window_and_divisor_rules(h, w, kernel, strides, padding, ceil_mode, out):
    x = rand(2, 3, h, w)
    attrs = {"kernel": kernel, "padding": padding, "ceil_mode": ceil_mode}
    if strides is not None:
        attrs["strides"] = strides
    assert_matches(
        ("max_pool2d", [x], attrs),
        ("avg_pool2d", [x], {**attrs, "count_include_pad": False}),
        ("avg_pool2d", [x], {**attrs, "count_include_pad": True}),
    )


def test_max_pool2d_padding_never_wins_even_over_minus_infinity():
    x = np.full((1, 2, 3, 3), -np.inf, dtype=np.float32)
    x[0, 1] = -1e30
    attrs = {"kernel": [2, 2], "strides": [1, 1], "padding": [1, 1, 1, 1]}
    got, want = compiled_and_interpreted(("max_pool2d", [x], attrs))
    np.testing.assert_array_equal(got[0], want[0])
    assert (got[0][0, 0] == -np.inf).all()


def test_max_pool2d_int32_int8_and_f64():
    attrs = {"kernel": [3, 3], "strides": [2, 2], "padding": [1, 1, 1, 1], "ceil_mode": True}
    xi = RNG.integers(-100, -1, (1, 2, 4, 4)).astype(np.int32)
    xb = RNG.integers(-128, -100, (1, 2, 4, 4)).astype(np.int8)
    assert_matches(("max_pool2d", [xi], attrs), ("max_pool2d", [xb], attrs))
    assert_matches(("max_pool2d", [rand(1, 2, 5, 4, dtype=np.float64)], attrs))


def test_avg_pool2d_f64_and_f16():
    attrs = {"kernel": [3, 3], "strides": [2, 2], "padding": [1, 1, 1, 1], "ceil_mode": True, "count_include_pad": True}
    assert_matches(("avg_pool2d", [rand(1, 2, 6, 5, dtype=np.float64)], attrs))
    assert_matches(("avg_pool2d", [rand(1, 2, 6, 5, dtype=np.float16)], attrs), tol={"rtol": 1e-3, "atol": 1e-3})


def test_pool_strides_default_to_kernel():
    x = rand(1, 2, 7, 6)
    assert_matches(("max_pool2d", [x], {"kernel": [3, 2]}), ("avg_pool2d", [x], {"kernel": [3, 2], "ceil_mode": True}))


def test_global_avg_pool2d_f32_and_f64():
    assert_matches(
        ("global_avg_pool2d", [rand(2, 3, 4, 5) + 3], {}),
        ("global_avg_pool2d", [rand(2, 3, 7, 1, dtype=np.float64)], {}),
    )


# --- normalization ----------------------------------------------------------------------------------


def bn_operands(shape: tuple[int, ...], dtype=np.float32) -> list[np.ndarray]:
    c = shape[1]
    return [rand(*shape, dtype=dtype), rand(c, dtype=dtype), rand(c, dtype=dtype), rand(c, dtype=dtype),
            np.abs(rand(c, dtype=dtype)) + 0.1]


def test_batch_norm_per_channel_rank_2_to_4():
    shapes = [(4, 3), (2, 3, 5), (2, 3, 4, 4)]
    assert_matches(*[("batch_norm", bn_operands(shape), {"epsilon": 1e-3}) for shape in shapes])


def test_batch_norm_default_epsilon_f64():
    assert_matches(("batch_norm", bn_operands((3, 2, 2), np.float64), {}))


@pytest.mark.parametrize(
    "shape, axis", [((2, 5), -1), ((2, 5), 1), ((2, 3, 4), -2), ((2, 3, 4), 1), ((2, 3, 4), 0), ((6,), 0)]
)
def test_layer_norm_over_trailing_dims(shape, axis):
    dims = shape[axis % len(shape) :]
    assert_matches(("layer_norm", [rand(*shape) * 3 + 1, rand(*dims), rand(*dims)], {"axis": axis}))


def test_layer_norm_is_accurate_when_the_mean_dwarfs_the_spread():
    # One pass (E[x^2] - E[x]^2 = 1e4 - 1e4 in f32, ulp 1e-3) would lose the variance 1e-2 entirely.
    x = (rand(4, 64) * 0.1 + 100).astype(np.float32)
    scale, bias = np.ones(64, np.float32), np.zeros(64, np.float32)
    assert_matches(("layer_norm", [x, scale, bias], {}), tol={"rtol": 1e-3, "atol": 1e-3})


def test_layer_norm_epsilon_f64():
    assert_matches(("layer_norm", [rand(3, 4, dtype=np.float64), rand(4, dtype=np.float64), rand(4, dtype=np.float64)],
                    {"epsilon": 0.5}))


def test_lrn_window_odd_and_even():
    x = rand(2, 5, 3, 3)
    attrs = {"alpha": 0.5, "beta": 0.6, "bias": 2.0}
    assert_matches(*[("lrn", [x], {"size": size, **attrs}) for size in [1, 2, 3, 4, 5, 8]])


def test_lrn_defaults_rank3_f64():
    assert_matches(("lrn", [rand(2, 4, 3, dtype=np.float64) * 50], {"size": 3}))


@pytest.mark.parametrize("shape, axis", [((2, 5), -1), ((2, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -3), ((7,), 0)])
def test_softmax_and_log_softmax_along_one_axis(shape, axis):
    x = rand(*shape) * 4
    assert_matches(("softmax", [x], {"axis": axis}), ("log_softmax", [x], {"axis": axis}))


def test_softmax_and_log_softmax_f64():
    x = rand(2, 3, 4, dtype=np.float64) * 4
    assert_matches(("softmax", [x], {"axis": -2}), ("log_softmax", [x], {"axis": 1}))


def test_softmax_and_log_softmax_are_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, 0.0], [3e38, 3e38, 1e38]], dtype=np.float32)
    got, want = compiled_and_interpreted(("softmax", [x], {}), ("log_softmax", [x], {}))
    assert all(np.isfinite(g).all() for g in got)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **F32)


def test_normalizations_f16_compute_in_f32():
    h = np.float16
    assert_matches(
        ("batch_norm", bn_operands((2, 3, 2), h), {}),
        ("layer_norm", [rand(2, 8, dtype=h), rand(8, dtype=h), rand(8, dtype=h)], {}),
        ("lrn", [rand(1, 5, 2, 2, dtype=h)], {"size": 3}),
        ("softmax", [rand(2, 8, dtype=h) * 4], {"axis": 0}),
        ("log_softmax", [rand(2, 8, dtype=h) * 4], {}),
        ("global_avg_pool2d", [rand(1, 2, 5, 5, dtype=h)], {}),
        tol={"rtol": 2e-3, "atol": 2e-3},
    )


def test_dropout_is_identity():
    x = rand(3, 4)
    got, _ = compiled_and_interpreted(*[("dropout", [x], {"rate": rate}) for rate in [0.0, 0.5, 0.9]])
    for g in got:
        np.testing.assert_array_equal(g, x)


# --- a whole network -----------------------------------------------------------------------------------


def test_cnn_example_with_the_default_pipeline():
    model = compiler.compile(CNN, "llvm")
    module = compiler.parse_file(CNN)
    inputs = random_inputs(module["main"], 0, module)
    got, want = model(**inputs), run(module, inputs)
    np.testing.assert_allclose(got[0], want[0], **F32)


@pytest.mark.parametrize("padding", [[0, 0, 0, 0], [1, 1, 1, 1]])
def test_max_pool2d_bf16_is_exact_and_keeps_nan_and_inf(padding):
    """A bf16 max pool compiles (TVM has no bf16 isnan, and its bf16 legalization left a vectorized select
    unlowered: mixed-precision CNNs failed to build) and, a max picking one of its inputs, is exact."""
    import ml_dtypes

    x = RNG.standard_normal((1, 32, 8, 8)).astype(ml_dtypes.bfloat16)
    x[0, 0, 0, 0], x[0, 1, 2, 2], x[0, 2] = np.nan, np.inf, -np.inf
    attrs = {"kernel": [2, 2], "strides": [2, 2], "padding": padding}
    got, want = compiled_and_interpreted(("max_pool2d", [x], attrs))
    np.testing.assert_array_equal(got[0].astype(np.float32), want[0].astype(np.float32))
    assert np.isnan(got[0][0, 0, 0, 0]) and np.isinf(got[0][0, 2]).all()
