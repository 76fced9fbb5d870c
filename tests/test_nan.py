"""One NaN and infinity semantics, PyTorch's, in the interpreter and every compiled kernel: a NaN in a
max or min (elementwise, reduced, pooled) is the result, argmax points at the first NaN, clip keeps
NaN, a softmax row holding NaN or +inf is NaN throughout, and x - x and x == x are IEEE's (NaN, false)."""

from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler.parser import parse

nan, inf = np.nan, np.inf
TARGETS = ["interp", "llvm", "cuda"]


def rows() -> np.ndarray:
    """Rows with NaN, +-inf, both, only -inf, and a plain one: 8 rows of 8 (a vector of f32 on AVX2)."""
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    x[0, 3] = nan
    x[1, 0] = inf
    x[2, 7] = -inf
    x[3, [1, 5]] = [nan, inf]
    x[4, :] = -inf
    x[5, [0, 7]] = nan
    x[6, 2] = inf
    x[6, 6] = -inf
    return x


def maps() -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    x[0, 0, 1, 1] = nan
    x[0, 0, 6, 3] = nan
    x[0, 1, 4, 4] = inf
    x[0, 1, 0, 7] = -inf
    x[0, 2, 2:4, 2:4] = -inf
    x[0, 2, 7, 7] = nan
    return x


def softmax(x: np.ndarray, log: bool = False) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
        s = np.exp(z).sum(axis=-1, keepdims=True)
        return z - np.log(s) if log else np.exp(z) / s


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x.astype(np.float64)))


def pool(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    """Max over windows, NaN winning, padding never."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-inf)
    oh = (xp.shape[2] - k) // stride + 1
    out = np.empty(x.shape[:2] + (oh, oh), x.dtype)
    for i in range(oh):
        for j in range(oh):
            out[:, :, i, j] = xp[:, :, i * stride : i * stride + k, j * stride : j * stride + k].max(axis=(2, 3))
    return out


# op text, result type, inputs, PyTorch's answer (written with NumPy, whose max/argmax/clip agree with it)
CASES = {
    "maximum": ("graph.maximum(%x, %y)", "tensor<8x8xf32>", lambda x: (x, x[::-1].copy()),
                lambda x, y: np.maximum(x, y)),
    "minimum": ("graph.minimum(%x, %y)", "tensor<8x8xf32>", lambda x: (x, x[::-1].copy()),
                lambda x, y: np.minimum(x, y)),
    "reduce_max": ("graph.reduce_max(%x) {axes = [1]}", "tensor<8xf32>", lambda x: (x,), lambda x: x.max(axis=1)),
    "reduce_min": ("graph.reduce_min(%x) {axes = [1]}", "tensor<8xf32>", lambda x: (x,), lambda x: x.min(axis=1)),
    "reduce_max columns": ("graph.reduce_max(%x) {axes = [0]}", "tensor<8xf32>", lambda x: (x,),
                           lambda x: x.max(axis=0)),
    "argmax": ("graph.argmax(%x) {axis = 1}", "tensor<8xi64>", lambda x: (x,), lambda x: x.argmax(axis=1)),
    "clip": ("graph.clip(%x) {min = -1.0, max = 1.0}", "tensor<8x8xf32>", lambda x: (x,), lambda x: np.clip(x, -1, 1)),
    "relu": ("graph.relu(%x)", "tensor<8x8xf32>", lambda x: (x,), lambda x: np.where(np.isnan(x), x, np.maximum(x, 0))),
    # One operand twice: TVM's simplifier folds x - x to 0 and x == x to true (NaN, inf - inf: not so).
    "sub of itself": ("graph.sub(%x, %x)", "tensor<8x8xf32>", lambda x: (x,),
                      lambda x: np.where(np.isfinite(x), 0.0, nan)),
    "equal to itself": ("graph.equal(%x, %x)", "tensor<8x8xi1>", lambda x: (x,), lambda x: x == x),
    "sigmoid": ("graph.sigmoid(%x)", "tensor<8x8xf32>", lambda x: (x,), lambda x: sigmoid(x)),
    "softmax": ("graph.softmax(%x) {axis = -1}", "tensor<8x8xf32>", lambda x: (x,), softmax),
    "log_softmax": ("graph.log_softmax(%x) {axis = -1}", "tensor<8x8xf32>", lambda x: (x,),
                    lambda x: softmax(x, log=True)),
}
POOLS = {
    "max_pool2d 2x2/2": ("{kernel = [2, 2]}", 2, 2, 0),  # rows as vectors of stride-2 reads
    "max_pool2d 3x3/1 padded": ("{kernel = [3, 3], strides = [1, 1], padding = [1, 1, 1, 1]}", 3, 1, 1),
    "max_pool2d 3x3/2 padded": ("{kernel = [3, 3], strides = [2, 2], padding = [1, 1, 1, 1]}", 3, 2, 1),
}


def run_on(target: str, text: str, inputs: tuple) -> np.ndarray:
    if target == "interp":
        return np.asarray(compiler.run(parse(text, "nan.gir"), list(inputs))[0])
    if target == "cuda":
        from test_codegen_cuda import has_gpu

        if not has_gpu():
            pytest.skip("no CUDA device")
        return compiler.compile(text, "cuda")(*inputs)[0]
    return compiler.compile(text, target)(*inputs)[0]


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """NaN where PyTorch gives NaN, the same infinities, the finite values within rounding."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_ops_with_nan_and_inf(case: str, target: str) -> None:
    expr, result, make, expect = CASES[case]
    inputs = make(rows())
    args = ", ".join(f"%{n}: tensor<8x8xf32>" for n in "xy"[: len(inputs)])
    text = f"func @main({args}) -> {result} {{\n  %r = {expr}\n  return %r\n}}\n"
    assert_same(run_on(target, text, inputs), expect(*inputs))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(POOLS))
def test_max_pools_propagate_nan(case: str, target: str) -> None:
    attrs, k, stride, pad = POOLS[case]
    x = maps()
    want = pool(x, k, stride, pad)
    text = (f"func @main(%x: tensor<1x3x8x8xf32>) -> tensor<1x3x{want.shape[2]}x{want.shape[3]}xf32> {{\n"
            f"  %r = graph.max_pool2d(%x) {attrs}\n  return %r\n}}\n")
    assert np.isnan(want).sum() >= 3  # the windows that hold a NaN
    assert_same(run_on(target, text, (x,)), want)


EPILOGUES = {  # fused after a matmul, where the GPU's Matmul rule and the CPU's tiles compute them in vectors
    "clip": ("graph.clip(%c) {min = 0.0, max = 6.0}", lambda c, a: np.clip(c, 0, 6)),
    "maximum": ("graph.maximum(%c, %a)", lambda c, a: np.maximum(c, a)),
}


def epilogue_module(case: str) -> str:
    return (f"func @main(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {{\n"
            f"  %c = graph.matmul(%a, %b)\n  %d = {EPILOGUES[case][0]}\n  return %d\n}}\n")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(EPILOGUES))
def test_vectorized_epilogues_keep_nan(case: str, target: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    a[5, 7] = nan  # row 5 of the product is NaN throughout
    b[3, 40] = nan  # and column 40
    a[9, :] = inf  # row 9: +-inf, and NaN where the product meets the NaN column
    with np.errstate(invalid="ignore"):  # inf * 0 and NaN in the product: what the test is about
        want = EPILOGUES[case][1](a.astype(np.float64) @ b, a)
    assert np.isnan(want).sum() >= 64 + 63
    assert_same(run_on(target, epilogue_module(case), (a, b)), want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("conv", [True, False], ids=["after a conv", "alone"])
def test_silu_keeps_nan_and_infinities(conv: bool, target: str) -> None:
    """x * sigmoid(x): NaN where x is NaN, +inf at +inf, NaN at -inf (-inf * 0, as PyTorch's SiLU). The CPU
    build drops the sigmoid's own NaN select there (rewrite.nan_kept_by_product): the product keeps it."""
    x = maps()
    w = np.random.default_rng(3).standard_normal((16, 3, 1, 1)).astype(np.float32)
    if conv:
        with np.errstate(invalid="ignore"):
            c = np.einsum("nchw,oc->nohw", x.astype(np.float64), w[:, :, 0, 0])
        args, inputs, shape = "%x: tensor<1x3x8x8xf32>, %w: tensor<16x3x1x1xf32>", (x, w), "1x16x8x8"
        body = f"%c = graph.conv2d(%x, %w) : tensor<{shape}xf32>"
    else:
        c = x.astype(np.float64)
        args, inputs, shape = "%x: tensor<1x3x8x8xf32>", (x,), "1x3x8x8"
        body = "%c = graph.add(%x, %x) : tensor<1x3x8x8xf32>"
        c = c + c
    text = (f"func @main({args}) -> tensor<{shape}xf32> {{\n  {body}\n"
            f"  %s = graph.sigmoid(%c) : tensor<{shape}xf32>\n  %r = graph.mul(%c, %s) : tensor<{shape}xf32>\n"
            "  return %r\n}\n")
    with np.errstate(invalid="ignore"):
        want = c * sigmoid(c)
    assert np.isnan(want).sum() >= 3 and np.isposinf(want).any()
    assert_same(run_on(target, text, inputs), want)
