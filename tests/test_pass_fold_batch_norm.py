"""fold-batch-norm: outputs kept (conv + bn + relu nets, examples/cnn.gir with bound or argument weights,
matmul + bn), folded weights against NumPy, what must not fold, locations, statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_outputs
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.builder import bind_arguments
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Module
from compiler.parser import parse, parse_file

ROOT_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
from compiler.passes.fold_batch_norm import FoldBatchNorm
from compiler.pipeline import run_pipeline

ROOT = Path(__file__).resolve().parent.parent


def bind_constants(module: Module, values: dict[str, np.ndarray], entry: str = "main") -> Module:
    """The module with the chosen arguments of @entry turned into graph.constant ops of the given values."""
    bind_arguments(module[entry], values)
    return module


def fold(module: Module) -> dict[str, int]:
    p = FoldBatchNorm()
    run_pipeline(module, [p])
    return dict(+p.stats)


def op_names(module: Module, entry: str = "main") -> list[str]:
    return [op.name for op in module[entry].ops]


def assert_same_outputs(before: Module, after: Module, inputs: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    names = {a.name for a in after["main"].args}
    assert_outputs(run(after, {k: v for k, v in inputs.items() if k in names}), run(before, inputs), rtol=tol, atol=tol)


CONV_NET = """func @main(%x: tensor<2x4x9x9xf32>, %w: tensor<6x{cg}x3x3xf32>, %cb: tensor<6xf32>, %g: tensor<6xf32>,
                 %be: tensor<6xf32>, %m: tensor<6xf32>, %v: tensor<6xf32>) -> tensor<2x6x{ho}x{wo}xf32> {{
  %c = graph.conv2d(%x, %w{bias}) {{strides = [{s}, {s}], padding = [1, 0, 1, 0], groups = {groups}}}
  %n = graph.batch_norm(%c, %g, %be, %m, %v) {{epsilon = 0.001}}
  %r = graph.relu(%n)
  return %r
}}
"""


def conv_net(groups: int = 1, stride: int = 1, bias: bool = True) -> Module:
    """conv2d (padding top and bottom only) + batch_norm + relu on a 2x4x9x9 input, 6 output channels."""
    ho, wo = (9 + 2 - 3) // stride + 1, (9 - 3) // stride + 1
    bias_text = ", %cb" if bias else ""
    return parse(CONV_NET.format(cg=4 // groups, groups=groups, s=stride, bias=bias_text, ho=ho, wo=wo), "net.gir")


def bn_params(rng: np.random.Generator, c: int) -> dict[str, np.ndarray]:
    return {
        "g": rng.uniform(-2, 2, c).astype(np.float32),
        "be": rng.standard_normal(c).astype(np.float32),
        "m": rng.standard_normal(c).astype(np.float32),
        "v": rng.uniform(0.1, 3, c).astype(np.float32),
    }


def independent_fold(w, cb, g, be, m, v, eps):
    """w * s and (cb - m) * s + be, s = g / sqrt(v + eps), one output channel at a time."""
    w2, b2 = np.zeros(w.shape), np.zeros(len(g))
    for o in range(len(g)):
        s = float(g[o]) / np.sqrt(float(v[o]) + eps)
        w2[o] = w[o].astype(np.float64) * s
        b2[o] = (float(cb[o]) - float(m[o])) * s + float(be[o])
    return w2, b2


# --- constant weights -----------------------------------------------------------------------------------


@pytest.mark.parametrize("groups, stride, bias", [(1, 1, True), (1, 2, False), (2, 1, True), (2, 2, False)])
def test_conv_bn_relu_net_keeps_outputs(groups: int, stride: int, bias: bool) -> None:
    rng = np.random.default_rng(groups * 10 + stride)
    before = conv_net(groups, stride, bias)
    inputs = random_inputs(before["main"], 1)
    inputs.update(bn_params(rng, 6))
    after = bind_constants(conv_net(groups, stride, bias), {k: v for k, v in inputs.items() if k != "x"})
    assert fold(after) == {"batch-norms-folded": 1}
    assert op_names(after) == ["graph.constant", "graph.constant", "graph.conv2d", "graph.relu"]
    assert_same_outputs(before, after, inputs)


def test_folded_constants_are_the_scaled_weights_and_shifted_bias() -> None:
    rng = np.random.default_rng(0)
    inputs = random_inputs(conv_net()["main"], 0)
    inputs.update(bn_params(rng, 6))
    m = bind_constants(conv_net(), {k: v for k, v in inputs.items() if k != "x"})
    fold(m)
    conv = next(op for op in m["main"].ops if op.name == "graph.conv2d")
    w, b = conv.w.owner.value.array, conv.b.owner.value.array
    want_w, want_b = independent_fold(*(inputs[k] for k in ("w", "cb", "g", "be", "m", "v")), 1e-3)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)
    np.testing.assert_allclose(b, want_b, rtol=1e-6, atol=1e-6)
    assert conv.strides == (1, 1) and conv.padding == (1, 0, 1, 0)


def test_cnn_example_with_bound_parameters_keeps_outputs() -> None:
    before = parse_file(ROOT / "examples" / "cnn.gir")
    inputs = random_inputs(before["main"], 3)
    after = bind_constants(parse_file(ROOT / "examples" / "cnn.gir"), {k: v for k, v in inputs.items() if k != "x"})
    assert fold(after) == {"batch-norms-folded": 9}
    assert "graph.batch_norm" not in op_names(after)
    assert_same_outputs(before, after, inputs)


def test_cnn_example_with_argument_weights_folds_as_ops_then_constants() -> None:
    before = parse_file(ROOT / "examples" / "cnn.gir")
    inputs = random_inputs(before["main"], 4)
    after = parse_file(ROOT / "examples" / "cnn.gir")
    assert fold(after) == {"batch-norms-folded": 9}
    assert "graph.batch_norm" not in op_names(after)
    assert [a.name for a in after["main"].args] == [a.name for a in before["main"].args]
    assert_same_outputs(before, after, inputs)
    # Once the weights are bound, fold-constants leaves the folded weights as constants.
    bind_constants(after, {k: v for k, v in inputs.items() if k != "x"})
    run_pipeline(after, "fold-constants")
    left = set(op_names(after)) - {"graph.constant"}
    assert left == {"graph.conv2d", "graph.relu", "graph.add", "graph.max_pool2d", "graph.avg_pool2d",
                    "graph.global_avg_pool2d", "graph.flatten", "graph.matmul"}  # fmt: skip
    assert op_names(after).count("graph.conv2d") == 9
    assert_same_outputs(before, after, inputs)


MATMUL_NET = """func @main(%x: tensor<5x7xf64>, %w: tensor<7x3xf64>, %cb: tensor<3xf64>, %g: tensor<3xf64>,
                 %be: tensor<3xf64>, %m: tensor<3xf64>, %v: tensor<3xf64>) -> tensor<5x3xf64> {
  %h = graph.matmul(%x, %w)
  BODY
  return %n
}
"""


@pytest.mark.parametrize(
    "body",
    [
        "%z = graph.add(%h, %cb)\n  %n = graph.batch_norm(%z, %g, %be, %m, %v)",
        "%z = graph.add(%cb, %h)\n  %n = graph.batch_norm(%z, %g, %be, %m, %v)",
        "%n = graph.batch_norm(%h, %g, %be, %m, %v)",
    ],
    ids=["bias", "bias-first", "no-bias"],
)
@pytest.mark.parametrize("bound", [True, False], ids=["constants", "arguments"])
def test_matmul_bn_keeps_outputs(body: str, bound: bool) -> None:
    text = MATMUL_NET.replace("BODY", body)
    before = parse(text)
    inputs = random_inputs(before["main"], 5)
    after = parse(text)
    if bound:
        bind_constants(after, {k: v for k, v in inputs.items() if k != "x"})
    assert fold(after) == {"batch-norms-folded": 1}
    assert "graph.batch_norm" not in op_names(after)
    assert op_names(after)[-2:] == ["graph.matmul", "graph.add"]
    assert_same_outputs(before, after, inputs, tol=1e-12)


# --- what stays -----------------------------------------------------------------------------------------


STAYS = {
    "conv-result-also-returned": "%c = graph.conv2d(%x, %w)\n  %n = graph.batch_norm(%c, %p, %p, %p, %p)\n"
    "  %y = graph.add(%n, %c)",
    "conv-result-read-twice": "%c = graph.conv2d(%x, %w)\n  %n = graph.batch_norm(%c, %p, %p, %p, %p)\n"
    "  %e = graph.exp(%c)\n  %y = graph.add(%n, %e)",
    "computed-weights": "%wr = graph.relu(%w)\n  %c = graph.conv2d(%x, %wr)\n"
    "  %y = graph.batch_norm(%c, %p, %p, %p, %p)",
    "computed-parameter": "%c = graph.conv2d(%x, %w)\n  %q = graph.abs(%p)\n"
    "  %y = graph.batch_norm(%c, %q, %p, %p, %p)",
    "not-after-a-layer": "%r = graph.relu(%x)\n  %y = graph.batch_norm(%r, %p, %p, %p, %p)",
}


@pytest.mark.parametrize("body", STAYS.values(), ids=STAYS.keys())
def test_batch_norm_stays_where_it_cannot_fold(body: str) -> None:
    text = (
        "func @main(%x: tensor<1x2x3x3xf32>, %w: tensor<2x2x1x1xf32>, %p: tensor<2xf32>) -> tensor<1x2x3x3xf32> {\n"
        f"  {body}\n  return %y\n}}\n"
    )
    m = parse(text)
    before = str(m)
    assert fold(m) == {}
    assert str(m) == before


def test_low_precision_stays() -> None:
    text = """func @main(%x: tensor<1x2x3x3xf16>, %w: tensor<2x2x1x1xf16>, %p: tensor<2xf16>) -> tensor<1x2x3x3xf16> {
  %c = graph.conv2d(%x, %w)
  %n = graph.batch_norm(%c, %p, %p, %p, %p)
  return %n
}
"""
    m = parse(text)
    assert fold(m) == {}


def test_matmul_with_batch_dims_stays() -> None:
    text = """func @main(%x: tensor<2x4x3xf32>, %w: tensor<3x4xf32>, %p: tensor<4xf32>) -> tensor<2x4x4xf32> {
  %h = graph.matmul(%x, %w)
  %n = graph.batch_norm(%h, %p, %p, %p, %p)
  return %n
}
"""
    m = parse(text)
    assert fold(m) == {}


# --- locations ------------------------------------------------------------------------------------------


def test_folded_conv_remembers_both_lines() -> None:
    m = conv_net()
    fold(m)
    conv = next(op for op in m["main"].ops if op.name == "graph.conv2d")
    assert [(loc.file, loc.line) for loc in conv.loc.all()] == [("net.gir", 3), ("net.gir", 4)]
    assert conv.result.name == "n"  # the value keeps the batch_norm's name


# --- property -------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    c_out=st.integers(1, 5),
    k=st.integers(1, 3),
    stride=st.integers(1, 2),
    pad=st.integers(0, 1),
    bias=st.booleans(),
    bound=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_random_conv_bn_folds_exactly(c_out, k, stride, pad, bias, bound, eps, seed) -> None:
    ho = (6 + 2 * pad - k) // stride + 1
    attrs = f"strides = [{stride}, {stride}], padding = [{pad}, {pad}, {pad}, {pad}]"
    text = f"""func @main(%x: tensor<2x3x6x6xf32>, %w: tensor<{c_out}x3x{k}x{k}xf32>, %cb: tensor<{c_out}xf32>,
               %g: tensor<{c_out}xf32>, %be: tensor<{c_out}xf32>, %m: tensor<{c_out}xf32>, %v: tensor<{c_out}xf32>)
               -> tensor<2x{c_out}x{ho}x{ho}xf32> {{
  %c = graph.conv2d(%x, %w{", %cb" if bias else ""}) {{{attrs}}}
  %n = graph.batch_norm(%c, %g, %be, %m, %v) {{epsilon = {eps}}}
  return %n
}}
"""
    before = parse(text)
    inputs = random_inputs(before["main"], seed)
    inputs.update(bn_params(np.random.default_rng(seed), c_out))
    after = parse(text)
    if bound:
        bind_constants(after, {k: v for k, v in inputs.items() if k != "x"})
    assert fold(after) == {"batch-norms-folded": 1}
    assert_same_outputs(before, after, inputs)


def test_weight_args_false_folds_only_constant_weights() -> None:
    from compiler.parser import parse
    from compiler.pipeline import run_pipeline

    text = (ROOT_EXAMPLES / "cnn.gir").read_text()
    module = parse(text)
    run_pipeline(module, "fold-batch-norm{weight-args=false}")
    assert sum(op.name == "graph.batch_norm" for op in module["main"].ops) == 9
    module = parse(text)
    run_pipeline(module, "fold-batch-norm")
    assert sum(op.name == "graph.batch_norm" for op in module["main"].ops) == 0


def test_a_batch_norm_of_constants_after_no_layer_becomes_one_multiply_add() -> None:
    """DenseNet's pre-activation batch_norm after a concat: bound, it is x * s + t with s and t constants,
    not a division by a square root per element."""
    text = ("func @main(%x: tensor<1x3x4x4xf32>, %s: tensor<3xf32>, %b: tensor<3xf32>, %m: tensor<3xf32>, "
            "%v: tensor<3xf32>) -> tensor<1x3x4x4xf32> {\n"
            "  %r = graph.relu(%x)\n  %y = graph.batch_norm(%r, %s, %b, %m, %v) {epsilon = 0.001}\n  return %y\n}\n")
    m = parse(text)
    inputs = random_inputs(m["main"], 0)
    want = run(m, inputs)[0]
    bind_arguments(m["main"], {k: inputs[k] for k in "sbmv"})
    assert fold(m)
    assert [op.name for op in m["main"].ops if op.name != "graph.constant"] == ["graph.relu", "graph.mul", "graph.add"]
    np.testing.assert_allclose(run(m, {"x": inputs["x"]})[0], want, rtol=1e-6, atol=1e-6)
