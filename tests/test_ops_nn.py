"""graph.conv2d, pooling, normalization, softmax and dropout against loop-by-loop NumPy oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compiler.builder import new_func
from compiler.ir import DType, TensorType, lookup_op
from helpers import infer_error, run_op

RNG = np.random.default_rng(0)


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def build(name: str, *types: TensorType, **attrs):
    """The op `graph.<name>` applied to fresh arguments of the given types."""
    f, b, vals = new_func("main", {f"a{i}": t for i, t in enumerate(types)})
    return getattr(b, name)(*vals, **attrs).owner


def t(*shape: int, dtype: DType = DType.f32) -> TensorType:
    return TensorType(shape, dtype)


# --- oracles: one output element at a time -----------------------------------------------------------


def conv_loops(x, w, b=None, strides=(1, 1), padding=(0, 0, 0, 0), dilations=(1, 1), groups=1, out_hw=None):
    n_, c_, h_, w_ = x.shape
    o_, cg, kh, kw = w.shape
    sh, sw = strides
    pt, pl, _, _ = padding
    dh, dw = dilations
    ho, wo = out_hw
    og = o_ // groups
    y = np.zeros((n_, o_, ho, wo), dtype=np.float64)
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for oh in range(ho):
                for ow in range(wo):
                    acc = 0.0
                    for c in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                ih, iw = oh * sh - pt + i * dh, ow * sw - pl + j * dw
                                if 0 <= ih < h_ and 0 <= iw < w_:
                                    acc += float(x[n, g * cg + c, ih, iw]) * float(w[o, c, i, j])
                    y[n, o, oh, ow] = acc + (float(b[o]) if b is not None else 0.0)
    return y


def pool_loops(x, kind, kernel, strides, padding, out_hw, count_include_pad=False):
    """PyTorch's pooling loop: windows clipped to the padded input, then to the input."""
    n_, c_, h_, w_ = x.shape
    kh, kw = kernel
    sh, sw = strides
    pt, pl, pb, pr = padding
    ho, wo = out_hw
    y = np.zeros((n_, c_, ho, wo), dtype=np.float64)
    for oh in range(ho):
        for ow in range(wo):
            hs, ws = oh * sh - pt, ow * sw - pl
            he, we = min(hs + kh, h_ + pb), min(ws + kw, w_ + pr)
            padded_size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h_), min(we, w_)
            win = x[:, :, hs:he, ws:we].astype(np.float64)
            if kind == "max":
                y[:, :, oh, ow] = win.max(axis=(2, 3))
            else:
                div = padded_size if count_include_pad else (he - hs) * (we - ws)
                y[:, :, oh, ow] = win.sum(axis=(2, 3)) / div
    return y


def softmax_rows(x, axis):
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.empty_like(moved)
    for idx in np.ndindex(moved.shape[:-1]):
        row = moved[idx]
        e = [math.exp(v - max(row)) for v in row]
        out[idx] = [v / sum(e) for v in e]
    return np.moveaxis(out, -1, axis)


# --- conv2d -----------------------------------------------------------------------------------------

CONV_CASES = [
    # x shape, w shape, attrs, expected output shape
    ((1, 3, 5, 5), (4, 3, 3, 3), {}, (1, 4, 3, 3)),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"padding": [1, 1, 1, 1]}, (2, 4, 5, 5)),
    ((1, 2, 7, 6), (3, 2, 3, 2), {"strides": [2, 3]}, (1, 3, 3, 2)),
    ((1, 2, 7, 7), (2, 2, 3, 3), {"dilations": [2, 3]}, (1, 2, 3, 1)),
    ((1, 2, 5, 6), (3, 2, 3, 3), {"padding": [1, 0, 2, 1], "strides": [2, 2]}, (1, 3, 3, 3)),
    ((1, 4, 5, 5), (6, 2, 3, 3), {"groups": 2, "padding": [1, 1, 1, 1]}, (1, 6, 5, 5)),
    ((2, 4, 6, 6), (4, 1, 3, 3), {"groups": 4, "strides": [2, 2], "padding": [1, 1, 1, 1]}, (2, 4, 3, 3)),
    ((1, 3, 6, 6), (6, 1, 2, 2), {"groups": 3, "dilations": [2, 2]}, (1, 6, 4, 4)),
    ((1, 3, 4, 4), (2, 3, 1, 1), {"strides": [3, 3]}, (1, 2, 2, 2)),
]


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("xs, ws, attrs, out", CONV_CASES)
def test_conv2d_matches_loops(xs, ws, attrs, out, bias):
    x, w = rand(*xs), rand(*ws)
    args = (x, w, rand(ws[0])) if bias else (x, w)
    y = run_op("conv2d", *args, **attrs)
    assert y.shape == out and y.dtype == np.float32
    np.testing.assert_allclose(y, conv_loops(*args, **attrs, out_hw=out[2:]), rtol=1e-5, atol=1e-5)


def test_conv2d_depthwise_is_one_filter_per_channel():
    x, w = rand(1, 3, 4, 4), rand(3, 1, 3, 3)
    y = run_op("conv2d", x, w, groups=3, padding=[1, 1, 1, 1])
    for c in range(3):
        alone = run_op("conv2d", x[:, c : c + 1], w[c : c + 1], padding=[1, 1, 1, 1])
        np.testing.assert_allclose(y[:, c : c + 1], alone, rtol=1e-6)


def test_conv2d_f64_and_int32():
    x, w = rand(1, 2, 4, 4, dtype=np.float64), rand(3, 2, 2, 2, dtype=np.float64)
    y = run_op("conv2d", x, w, strides=[2, 2])
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, conv_loops(x, w, strides=(2, 2), out_hw=(2, 2)), rtol=1e-12)
    xi = RNG.integers(-5, 5, (1, 2, 4, 4)).astype(np.int32)
    wi = RNG.integers(-3, 3, (2, 2, 3, 3)).astype(np.int32)
    bi = np.array([7, -7], dtype=np.int32)
    yi = run_op("conv2d", xi, wi, bi, padding=[1, 1, 1, 1])
    assert yi.dtype == np.int32
    np.testing.assert_array_equal(yi, conv_loops(xi, wi, bi, padding=(1, 1, 1, 1), out_hw=(4, 4)).astype(np.int32))


def test_conv2d_f16_keeps_its_dtype():
    x, w = rand(1, 2, 4, 4, dtype=np.float16), rand(2, 2, 3, 3, dtype=np.float16)
    y = run_op("conv2d", x, w)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, conv_loops(x, w, out_hw=(2, 2)), rtol=1e-2, atol=1e-2)


# --- pooling ----------------------------------------------------------------------------------------

POOL_CASES = [
    # x H, W, kernel, strides (None: the kernel), padding, ceil_mode, expected (Ho, Wo)
    (6, 6, [2, 2], None, [0, 0, 0, 0], False, (3, 3)),
    (5, 5, [2, 2], None, [0, 0, 0, 0], False, (2, 2)),
    (5, 5, [2, 2], None, [0, 0, 0, 0], True, (3, 3)),
    (5, 7, [3, 3], [2, 2], [1, 1, 1, 1], False, (3, 4)),
    (4, 4, [3, 3], [2, 2], [1, 1, 1, 1], False, (2, 2)),
    # the last window runs past the padded edge: clipped divisor with count_include_pad
    (4, 4, [3, 3], [2, 2], [1, 1, 1, 1], True, (3, 3)),
    # ceil mode would start a window in the bottom padding; PyTorch drops it
    (5, 5, [2, 2], [2, 2], [1, 1, 1, 1], True, (3, 3)),
    (5, 6, [3, 3], [2, 2], [1, 0, 2, 1], False, (3, 3)),
    (5, 6, [3, 2], [2, 3], [2, 1, 0, 0], True, (3, 3)),
    (6, 5, [2, 3], [1, 2], [0, 0, 1, 2], False, (6, 3)),
]


@pytest.mark.parametrize("h, w, kernel, strides, padding, ceil_mode, out", POOL_CASES)
def test_max_pool2d_matches_loops(h, w, kernel, strides, padding, ceil_mode, out):
    x = rand(2, 3, h, w)
    attrs = {"kernel": kernel, "padding": padding, "ceil_mode": ceil_mode}
    if strides is not None:
        attrs["strides"] = strides
    y = run_op("max_pool2d", x, **attrs)
    assert y.shape == (2, 3, *out)
    np.testing.assert_array_equal(y, pool_loops(x, "max", kernel, strides or kernel, padding, out))


@pytest.mark.parametrize("count_include_pad", [False, True], ids=["exclude_pad", "include_pad"])
@pytest.mark.parametrize("h, w, kernel, strides, padding, ceil_mode, out", POOL_CASES)
def test_avg_pool2d_matches_loops(h, w, kernel, strides, padding, ceil_mode, out, count_include_pad):
    x = rand(2, 3, h, w)
    attrs = {"kernel": kernel, "padding": padding, "ceil_mode": ceil_mode, "count_include_pad": count_include_pad}
    if strides is not None:
        attrs["strides"] = strides
    y = run_op("avg_pool2d", x, **attrs)
    assert y.shape == (2, 3, *out)
    want = pool_loops(x, "avg", kernel, strides or kernel, padding, out, count_include_pad)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_max_pool2d_padding_never_wins_on_negative_input():
    x = -np.abs(rand(1, 1, 3, 3)) - 1
    y = run_op("max_pool2d", x, kernel=[2, 2], strides=[1, 1], padding=[1, 1, 1, 1])
    assert y.shape == (1, 1, 4, 4) and (y < 0).all()
    assert y[0, 0, 0, 0] == x[0, 0, 0, 0]


def test_max_pool2d_int32_and_f64():
    xi = RNG.integers(-100, -1, (1, 2, 4, 4)).astype(np.int32)
    yi = run_op("max_pool2d", xi, kernel=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], ceil_mode=True)
    assert yi.dtype == np.int32
    np.testing.assert_array_equal(yi, pool_loops(xi, "max", (3, 3), (2, 2), (1, 1, 1, 1), (3, 3)))
    xd = rand(1, 2, 4, 4, dtype=np.float64)
    yd = run_op("max_pool2d", xd, kernel=[2, 2])
    assert yd.dtype == np.float64
    np.testing.assert_array_equal(yd, pool_loops(xd, "max", (2, 2), (2, 2), (0, 0, 0, 0), (2, 2)))


def test_avg_pool2d_count_include_pad_divides_by_full_window():
    x = np.ones((1, 1, 2, 2), dtype=np.float32)
    kw = dict(kernel=[2, 2], strides=[1, 1], padding=[1, 1, 1, 1])
    np.testing.assert_allclose(run_op("avg_pool2d", x, **kw), np.ones((1, 1, 3, 3)))
    want = np.array([[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]])
    np.testing.assert_allclose(run_op("avg_pool2d", x, **kw, count_include_pad=True)[0, 0], want)


def test_avg_pool2d_f64():
    x = rand(1, 2, 5, 5, dtype=np.float64)
    y = run_op("avg_pool2d", x, kernel=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], count_include_pad=True)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, pool_loops(x, "avg", (3, 3), (2, 2), (1, 1, 1, 1), (3, 3), True), rtol=1e-12)


def test_pool_strides_default_to_kernel_and_stay_absent_in_text():
    op = build("max_pool2d", t(1, 1, 6, 6), kernel=[3, 2])
    assert op.strides is None and op.window_strides == (3, 2)
    assert op.result.type.shape == (1, 1, 2, 3)
    assert "strides" not in repr(op)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_avg_pool2d_keeps_1x1(dtype):
    x = rand(2, 3, 4, 5, dtype=dtype)
    y = run_op("global_avg_pool2d", x)
    assert y.shape == (2, 3, 1, 1) and y.dtype == dtype
    for n in range(2):
        for c in range(3):
            assert y[n, c, 0, 0] == pytest.approx(sum(float(v) for v in x[n, c].ravel()) / 20, rel=1e-6)


# --- normalization ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4)])
def test_batch_norm_normalizes_each_channel(shape):
    x = rand(*shape)
    c = shape[1]
    scale, bias, mean = rand(c), rand(c), rand(c)
    var = np.abs(rand(c)) + 0.1
    y = run_op("batch_norm", x, scale, bias, mean, var, epsilon=1e-3)
    want = np.empty(shape, dtype=np.float64)
    for ch in range(c):
        want[:, ch] = (x[:, ch] - mean[ch]) / math.sqrt(var[ch] + 1e-3) * scale[ch] + bias[ch]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_batch_norm_default_epsilon_f64():
    x = rand(3, 2, dtype=np.float64)
    ones, zeros = np.ones(2), np.zeros(2)
    y = run_op("batch_norm", x, ones, zeros, zeros, ones * 4)
    np.testing.assert_allclose(y, x / math.sqrt(4 + 1e-5), rtol=1e-12)


def layer_norm_rows(x, scale, bias, ndims, eps):
    lead = x.shape[: x.ndim - ndims]
    rows = x.reshape(int(np.prod(lead)), -1).astype(np.float64)
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        mu = sum(row) / len(row)
        var = sum((v - mu) ** 2 for v in row) / len(row)
        out[r] = (row - mu) / math.sqrt(var + eps)
    return out.reshape(x.shape) * scale + bias


@pytest.mark.parametrize(
    "shape, axis, ndims",
    [((2, 5), -1, 1), ((2, 5), 1, 1), ((2, 3, 4), -2, 2), ((2, 3, 4), 1, 2), ((2, 3, 4), 0, 3), ((6,), 0, 1)],
)
def test_layer_norm_over_trailing_dims(shape, axis, ndims):
    x = rand(*shape) * 3 + 1
    scale, bias = rand(*shape[-ndims:]), rand(*shape[-ndims:])
    y = run_op("layer_norm", x, scale, bias, axis=axis)
    np.testing.assert_allclose(y, layer_norm_rows(x, scale, bias, ndims, 1e-5), rtol=1e-5, atol=1e-5)


def test_layer_norm_epsilon_and_f64():
    x = rand(3, 4, dtype=np.float64)
    scale, bias = np.ones(4), np.zeros(4)
    y = run_op("layer_norm", x, scale, bias, epsilon=0.5)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, layer_norm_rows(x, scale, bias, 1, 0.5), rtol=1e-12)


def lrn_loops(x, size, alpha, beta, bias):
    c_ = x.shape[1]
    y = np.empty(x.shape, dtype=np.float64)
    for c in range(c_):
        lo, hi = max(0, c - (size - 1) // 2), min(c_ - 1, c + math.ceil((size - 1) / 2))
        sq = sum(x[:, k].astype(np.float64) ** 2 for k in range(lo, hi + 1))
        y[:, c] = x[:, c] / (bias + alpha / size * sq) ** beta
    return y


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_lrn_window_odd_and_even(size):
    x = rand(2, 5, 3, 3)
    y = run_op("lrn", x, size=size, alpha=0.5, beta=0.6, bias=2.0)
    np.testing.assert_allclose(y, lrn_loops(x, size, 0.5, 0.6, 2.0), rtol=1e-5)


def test_lrn_defaults_f64():
    x = rand(1, 4, 2, 2, dtype=np.float64) * 50
    y = run_op("lrn", x, size=3)
    np.testing.assert_allclose(y, lrn_loops(x, 3, 1e-4, 0.75, 1.0), rtol=1e-12)


@pytest.mark.parametrize("shape, axis", [((2, 5), -1), ((2, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -3), ((7,), 0)])
def test_softmax_along_one_axis(shape, axis):
    x = rand(*shape) * 4
    y = run_op("softmax", x, axis=axis)
    np.testing.assert_allclose(y, softmax_rows(x, axis), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-5)


@pytest.mark.parametrize("shape, axis", [((2, 5), -1), ((2, 3, 4), 1), ((2, 3, 4), -2)])
def test_log_softmax_along_one_axis(shape, axis):
    x = rand(*shape, dtype=np.float64) * 4
    y = run_op("log_softmax", x, axis=axis)
    np.testing.assert_allclose(y, np.log(softmax_rows(x, axis)), rtol=1e-10)


def test_softmax_and_log_softmax_are_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, 0.0]], dtype=np.float32)
    y = run_op("softmax", x)
    e = np.exp([-2.0, -1.0, 0.0])
    np.testing.assert_allclose(y[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(y[1], [0.0, 0.0, 1.0], atol=1e-30)
    ly = run_op("log_softmax", x)
    assert np.isfinite(ly).all()
    np.testing.assert_allclose(ly[0], [-2.0, -1.0, 0.0] - np.log(e.sum()), rtol=1e-6)
    np.testing.assert_allclose(ly[1], [-1000.0, -1000.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("rate", [0.0, 0.5, 0.9])
def test_dropout_is_identity(rate):
    x = rand(3, 4)
    np.testing.assert_array_equal(run_op("dropout", x, rate=rate), x)


# --- kinds and flops --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kind",
    [
        ("conv2d", "out-elementwise-fusable"),
        ("softmax", "reduction"),
        ("log_softmax", "reduction"),
        ("layer_norm", "reduction"),
        ("dropout", "elementwise"),
    ],
)
def test_kind(name, kind):
    assert lookup_op(f"graph.{name}").kind == kind


def test_conv2d_flops_count_two_per_mac_plus_bias():
    x, w = t(2, 4, 8, 8), t(6, 2, 3, 3)
    op = build("conv2d", x, w, groups=2, padding=[1, 1, 1, 1])
    macs = 2 * 6 * 8 * 8 * (2 * 3 * 3)
    assert op.flops() == 2 * macs
    assert build("conv2d", x, w, t(6), groups=2, padding=[1, 1, 1, 1]).flops() == 2 * macs + 2 * 6 * 8 * 8


@pytest.mark.parametrize(
    "name, types, attrs",
    [
        ("max_pool2d", [t(1, 2, 4, 4)], {"kernel": [2, 2]}),
        ("avg_pool2d", [t(1, 2, 4, 4)], {"kernel": [2, 2]}),
        ("global_avg_pool2d", [t(1, 2, 4, 4)], {}),
        ("batch_norm", [t(2, 3), t(3), t(3), t(3), t(3)], {}),
        ("layer_norm", [t(2, 3), t(3), t(3)], {}),
        ("lrn", [t(1, 3, 2, 2)], {"size": 3}),
        ("softmax", [t(2, 3)], {}),
        ("log_softmax", [t(2, 3)], {}),
    ],
)
def test_flops_is_positive_and_grows_with_input(name, types, attrs):
    small = build(name, *types, **attrs).flops()
    bigger = [TensorType((4 * types[0].shape[0], *types[0].shape[1:]), types[0].dtype), *types[1:]]
    assert 0 < small < build(name, *bigger, **attrs).flops()


def test_dropout_costs_nothing():
    assert build("dropout", t(4, 4)).flops() == 0


# --- diagnostics ------------------------------------------------------------------------------------

X = "tensor<1x4x6x6xf32>"

DIAGNOSTICS = [
    ("conv2d", ["tensor<4x6x6xf32>", "tensor<2x4x3x3xf32>"], {}, "x must be a 4-D NCHW tensor"),
    ("conv2d", [X, "tensor<2x4x3xf32>"], {}, "w must be a 4-D OIHW tensor"),
    ("conv2d", [X, "tensor<2x3x3x3xf32>"], {}, "x has 4 channels but w expects 3 x groups 1 = 3"),
    ("conv2d", [X, "tensor<3x2x3x3xf32>"], {"groups": 2}, "output channels are not divisible by groups 2"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>", "tensor<3xf32>"], {}, "bias must have shape [2]"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>", "tensor<2x1xf32>"], {}, "bias must have shape [2]"),
    ("conv2d", [X, "tensor<2x4x3x3xf64>"], {}, "operand dtypes differ: f32 vs f64"),
    ("conv2d", [X, "tensor<2x4x7x3xf32>"], {}, "output size 0x4 is not positive"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>"], {"dilations": [3, 1]}, "output size 0x4 is not positive"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>"], {"strides": [1]}, "strides must have 2 entries, got 1"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>"], {"strides": [0, 1]}, "strides must be positive"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>"], {"padding": [1, 1]}, "padding must have 4 entries, got 2"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>"], {"padding": [1, -1, 1, 1]}, "padding must be non-negative"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>"], {"dilations": [0, 1]}, "dilations must be positive"),
    ("conv2d", [X, "tensor<2x4x3x3xf32>"], {"groups": 0}, "groups must be positive, got 0"),
    ("conv2d", ["tensor<1x4x6x6xi1>", "tensor<2x4x3x3xi1>"], {}, "x must be numeric"),
    ("max_pool2d", ["tensor<4x6x6xf32>"], {"kernel": [2, 2]}, "x must be a 4-D NCHW tensor"),
    ("max_pool2d", [X], {}, "missing required attribute 'kernel'"),
    ("max_pool2d", [X], {"kernel": [2]}, "kernel must have 2 entries, got 1"),
    ("max_pool2d", [X], {"kernel": [0, 2]}, "kernel must be positive"),
    ("max_pool2d", [X], {"kernel": [2, 2], "strides": [1, 0]}, "strides must be positive"),
    ("max_pool2d", [X], {"kernel": [2, 2], "padding": [0, 0, 2, 0]}, "must be smaller than the kernel 2x2"),
    ("max_pool2d", [X], {"kernel": [7, 2]}, "the 7x2 kernel is larger than the padded 6x6 input"),
    ("max_pool2d", ["tensor<1x4x6x6xi1>"], {"kernel": [2, 2]}, "x must be numeric"),
    ("avg_pool2d", ["tensor<1x4x6x6xi32>"], {"kernel": [2, 2]}, "x must be a floating-point tensor"),
    ("avg_pool2d", [X], {"kernel": [2, 2], "padding": [0, 0, 0]}, "padding must have 4 entries, got 3"),
    ("avg_pool2d", [X], {"kernel": [2, 2], "count_include_pad": 1}, "'count_include_pad' must be a bool"),
    ("global_avg_pool2d", ["tensor<4x6xf32>"], {}, "x must be a 4-D NCHW tensor"),
    ("global_avg_pool2d", ["tensor<1x4x6x6xi64>"], {}, "x must be a floating-point tensor"),
    ("batch_norm", ["tensor<4xf32>"] + ["tensor<4xf32>"] * 4, {}, "x must have rank >= 2"),
    ("batch_norm", [X, "tensor<3xf32>"] + ["tensor<4xf32>"] * 3, {}, "scale must have shape [4]"),
    ("batch_norm", [X] + ["tensor<4xf32>"] * 3 + ["tensor<1x4xf32>"], {}, "var must have shape [4]"),
    ("batch_norm", [X] + ["tensor<4xf32>"] * 2 + ["tensor<4xf64>", "tensor<4xf32>"], {}, "operand dtypes differ"),
    ("batch_norm", ["tensor<2x4xi32>"] + ["tensor<4xi32>"] * 4, {}, "x must be a floating-point tensor"),
    ("batch_norm", [X] + ["tensor<4xf32>"] * 3, {}, "expected 5 operands, got 4"),
    ("layer_norm", ["tensor<2x3xf32>", "tensor<2xf32>", "tensor<2xf32>"], {}, "scale must have shape [3]"),
    ("layer_norm", ["tensor<2x3xf32>", "tensor<3xf32>", "tensor<3xf32>"], {"axis": 0}, "must have shape [2, 3]"),
    ("layer_norm", ["tensor<2x3xf32>", "tensor<3xf32>", "tensor<2x3xf32>"], {}, "bias must have shape [3]"),
    ("layer_norm", ["tensor<2x3xf32>"] + ["tensor<3xf32>"] * 2, {"axis": 2}, "axis 2 is out of range for rank 2"),
    ("layer_norm", ["tensor<2x3xf32>"] + ["tensor<3xf32>"] * 2, {"axis": -3}, "axis -3 is out of range for rank 2"),
    ("layer_norm", ["tensor<2x3xf32>", "tensor<3xf16>", "tensor<3xf32>"], {}, "operand dtypes differ"),
    ("layer_norm", ["tensor<f32>"] * 3, {}, "x must have rank >= 1"),
    ("lrn", [X], {}, "missing required attribute 'size'"),
    ("lrn", [X], {"size": 0}, "size must be positive, got 0"),
    ("lrn", ["tensor<4xf32>"], {"size": 3}, "x must have rank >= 2"),
    ("lrn", ["tensor<1x4x2x2xi32>"], {"size": 3}, "x must be a floating-point tensor"),
    ("softmax", ["tensor<2x3xf32>"], {"axis": 2}, "axis 2 is out of range for rank 2"),
    ("softmax", ["tensor<2x3xf32>"], {"axis": -3}, "axis -3 is out of range for rank 2"),
    ("softmax", ["tensor<2x3xi32>"], {}, "x must be a floating-point tensor"),
    ("softmax", ["tensor<f32>"], {}, "x must have rank >= 1"),
    ("log_softmax", ["tensor<2x3xf32>"], {"axis": 5}, "axis 5 is out of range for rank 2"),
    ("log_softmax", ["tensor<2x3xi64>"], {}, "x must be a floating-point tensor"),
    ("dropout", ["tensor<2x3xf32>"], {"rate": 1.0}, "rate must be in [0, 1), got 1.0"),
    ("dropout", ["tensor<2x3xf32>"], {"rate": -0.1}, "rate must be in [0, 1), got -0.1"),
    ("dropout", ["tensor<2x3xi32>"], {}, "x must be a floating-point tensor"),
]


@pytest.mark.parametrize("name, types, attrs, message", DIAGNOSTICS)
def test_diagnostic(name, types, attrs, message):
    got = infer_error(name, *types, **attrs)
    assert got.startswith(f"graph.{name}: ")
    assert message in got
