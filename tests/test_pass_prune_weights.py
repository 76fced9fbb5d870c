"""prune-weights and gc prune: unstructured sparsity reached exactly and on the smallest weights; channel
pruning gives a smaller verified net whose outputs equal the original net's with the removed channels
zeroed where the next layer reads them; layers that cannot shrink stay whole; the .npz route."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.builder import bind_arguments
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Dense, Module, format_dense
from compiler.parser import parse, parse_file
from compiler.passes import make_pass
from compiler.passes.prune_weights import PruneWeights
from compiler.pipeline import run_pipeline
from compiler.prune import cmd_prune, count_flops, prune_npz
from compiler.verifier import verify_module
from dialects.graph.creation import Constant

ROOT = Path(__file__).resolve().parent.parent


def bind_constants(module: Module, values: dict[str, np.ndarray], entry: str = "main") -> Module:
    """The module with the chosen arguments of @entry turned into graph.constant ops of the given values."""
    bind_arguments(module[entry], values)
    return module


def prune(module: Module, **options) -> dict[str, int]:
    p = PruneWeights(**options)
    run_pipeline(module, [p])
    return dict(+p.stats)


def constants(module: Module, entry: str = "main") -> dict[str, np.ndarray]:
    return {op.result.name: op.value.array for op in module[entry].ops if isinstance(op, Constant)}


def set_constant(module: Module, name: str, array: np.ndarray) -> None:
    op = next(op for op in module["main"].ops if isinstance(op, Constant) and op.result.name == name)
    op.attrs["value"] = Dense.of(array, op.value.type.dtype)


def smallest_l1(w: np.ndarray, axis: int, sparsity: float) -> list[int]:
    """The channels (along `axis`) to remove: round(sparsity * C) of the smallest L1 norms, at least one kept."""
    c = w.shape[axis]
    norms = [float(np.sum(np.abs(np.take(w, i, axis=axis).astype(np.float64)))) for i in range(c)]
    k = min(round(sparsity * c), c - 1)
    return sorted(sorted(range(c), key=lambda i: (norms[i], i))[:k])


MLP = """func @main(%x: tensor<8x12xf32>, %w1: tensor<12x10xf32>, %b1: tensor<10xf32>, %w2: tensor<10x6xf32>,
                 %b2: tensor<6xf32>, %w3: tensor<6x4xf32>, %b3: tensor<4xf32>) -> tensor<8x4xf32> {
  %h1 = graph.matmul(%x, %w1)
  %z1 = graph.add(%h1, %b1)
  %a1 = graph.relu(%z1)
  %h2 = graph.matmul(%a1, %w2)
  %z2 = graph.add(%h2, %b2)
  %a2 = graph.tanh(%z2)
  %h3 = graph.matmul(%a2, %w3)
  %y = graph.add(%h3, %b3)
  return %y
}
"""

CNN = """func @main(%x: tensor<2x3x8x8xf32>, %w1: tensor<8x3x3x3xf32>, %c1: tensor<8xf32>, %g: tensor<8xf32>,
                 %be: tensor<8xf32>, %m: tensor<8xf32>, %v: tensor<8xf32>, %w2: tensor<6x8x3x3xf32>,
                 %s2: tensor<1x6x1x1xf32>, %fw: tensor<6x5xf32>, %fb: tensor<5xf32>) -> tensor<2x5xf32> {
  %a = graph.conv2d(%x, %w1, %c1) {padding = [1, 1, 1, 1]}
  %n = graph.batch_norm(%a, %g, %be, %m, %v)
  %r = graph.relu(%n)
  %p = graph.max_pool2d(%r) {kernel = [2, 2]}
  %b = graph.conv2d(%p, %w2) {strides = [2, 2]}
  %s = graph.mul(%b, %s2)
  %q = graph.leaky_relu(%s)
  %gp = graph.global_avg_pool2d(%q)
  %f = graph.reshape(%gp) {shape = [2, 6]}
  %h = graph.matmul(%f, %fw)
  %y = graph.add(%h, %fb)
  return %y
}
"""


def bound(text: str, seed: int) -> tuple[Module, Module, dict[str, np.ndarray]]:
    """(the module with argument weights, the module with them bound as constants, the inputs)."""
    m = parse(text)
    inputs = random_inputs(m["main"], seed)
    return m, bind_constants(parse(text), {k: v for k, v in inputs.items() if k != "x"}), inputs


# --- unstructured -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.25, 0.5, 0.73, 0.9, 1.0])
def test_unstructured_reaches_requested_sparsity_exactly_per_weight(sparsity: float) -> None:
    _, m, inputs = bound(MLP, 0)
    prune(m, sparsity=sparsity)
    got = constants(m)
    for name in ("w1", "w2", "w3"):
        w, orig = got[name], inputs[name]
        assert w.shape == orig.shape
        assert np.count_nonzero(w == 0) == round(sparsity * orig.size)
        kept = w != 0
        np.testing.assert_array_equal(w[kept], orig[kept])  # survivors keep their values
        if 0 < kept.sum() < w.size:
            assert np.abs(orig[~kept]).max() <= np.abs(orig[kept]).min()
    for name in ("b1", "b2", "b3"):
        np.testing.assert_array_equal(got[name], inputs[name])  # biases are not weights


def test_unstructured_breaks_ties_in_flat_order() -> None:
    m = parse("""func @main(%x: tensor<1x4xf32>) -> tensor<1x2xf32> {
  %w = graph.constant {value = dense<[[1.0, -1.0], [2.0, 1.0], [-1.0, 3.0], [1.0, 0.5]]> : tensor<4x2xf32>}
  %y = graph.matmul(%x, %w)
  return %y
}
""")
    prune(m, sparsity=0.5)
    # |w| in flat order: 1 1 2 1 1 3 1 0.5; the 0.5 and the first three 1s go.
    np.testing.assert_array_equal(constants(m)["w"], [[0, 0], [2, 0], [-1, 3], [1, 0]])


def test_unstructured_statistics_and_message(capsys) -> None:
    _, m, _ = bound(MLP, 1)
    assert prune(m, sparsity=0.5) == {"weights-total": 12 * 10 + 10 * 6 + 6 * 4, "weights-zeroed": 60 + 30 + 12}
    assert "prune-weights: 50.0% of 204 weights are zero" in capsys.readouterr().err


def test_unstructured_prunes_a_shared_weight_once() -> None:
    m = parse("""func @main(%x: tensor<3x3xf32>) -> (tensor<3x3xf32>, tensor<3x3xf32>) {
  %w = graph.constant {value = dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]> : tensor<3x3xf32>}
  %y = graph.matmul(%x, %w)
  %z = graph.matmul(%y, %w)
  %u = graph.add(%z, %w)
  return %y, %u
}
""")
    stats = prune(m, sparsity=1 / 3)
    assert stats == {"weights-total": 9, "weights-zeroed": 3}
    ops = m["main"].ops
    mm = [op for op in ops if op.name == "graph.matmul"]
    assert mm[0].operands[1] is mm[1].operands[1]
    np.testing.assert_array_equal(mm[0].operands[1].owner.value.array, [[0, 0, 0], [4, 5, 6], [7, 8, 9]])
    add = next(op for op in ops if op.name == "graph.add")
    np.testing.assert_array_equal(add.operands[1].owner.value.array, np.arange(1, 10).reshape(3, 3))


@pytest.mark.parametrize("mode", ["unstructured", "channel"])
def test_only_the_replaced_constants_go(mode: str) -> None:
    _, m, _ = bound(MLP.replace("  return %y", "  %dead = graph.exp(%y)\n  return %y"), 7)
    prune(m, sparsity=0.5, mode=mode)
    assert [op.name for op in m["main"].ops if op.name != "graph.constant"][-2:] == ["graph.add", "graph.exp"]
    assert sorted(constants(m)) == ["b1", "b2", "b3", "w1", "w2", "w3"]


def test_argument_weights_are_left_to_gc_prune() -> None:
    m = parse(MLP)
    before = str(m)
    assert prune(m, sparsity=0.5) == {}
    assert prune(m, sparsity=0.5, mode="channel") == {}
    assert str(m) == before


@pytest.mark.parametrize(
    "options, message",
    [
        ({"sparsity": "1.5"}, "sparsity must be in [0, 1], got 1.5"),
        ({"sparsity": "-0.1"}, "sparsity must be in [0, 1], got -0.1"),
        ({"mode": "rows"}, "mode must be unstructured or channel, got 'rows'"),
        ({"sparsity": "half"}, "option 'sparsity' expects float, got 'half'"),
    ],
)
def test_bad_options_are_user_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(GCError) as e:
        make_pass("prune-weights", options)
    assert message in str(e.value.diagnostics[0].message)


# --- channel ---------------------------------------------------------------------------------------------


def assert_equals_zeroed_original(
    original: Module, pruned: Module, inputs: dict[str, np.ndarray], zero: dict[str, tuple[int, list[int]]]
) -> None:
    """The pruned module computes what the original does with weight[name] zeroed at `indices` along `axis`,
    for each name in `zero`: the removed channels' contributions to the next layer."""
    oracle = original.clone()
    for name, (axis, indices) in zero.items():
        w = np.array(constants(oracle)[name])
        idx = [slice(None)] * w.ndim
        idx[axis] = indices
        w[tuple(idx)] = 0
        set_constant(oracle, name, w)
    x = {"x": inputs["x"]}
    for want, got in zip(run(oracle, x), run(pruned, x)):
        assert want.shape == got.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sparsity", [0.2, 0.5, 0.8, 1.0])
def test_channel_mlp_equals_zeroing_the_removed_channels(sparsity: float) -> None:
    _, m, inputs = bound(MLP, 2)
    original = m.clone()
    stats = prune(m, sparsity=sparsity, mode="channel")
    verify_module(m)
    r1, r2 = smallest_l1(inputs["w1"], 1, sparsity), smallest_l1(inputs["w2"], 1, sparsity)
    assert stats == {"layers-pruned": 2, "channels-removed": len(r1) + len(r2), "layers-kept-whole": 1}
    got = constants(m)
    k1, k2 = [i for i in range(10) if i not in r1], [i for i in range(6) if i not in r2]
    np.testing.assert_array_equal(got["w1"], inputs["w1"][:, k1])
    np.testing.assert_array_equal(got["b1"], inputs["b1"][k1])
    np.testing.assert_array_equal(got["w2"], inputs["w2"][np.ix_(k1, k2)])
    np.testing.assert_array_equal(got["b2"], inputs["b2"][k2])
    np.testing.assert_array_equal(got["w3"], inputs["w3"][k2])
    assert_equals_zeroed_original(original, m, inputs, {"w2": (0, r1), "w3": (0, r2)})


def test_channel_cnn_shrinks_bias_batch_norm_scale_and_next_layers() -> None:
    _, m, inputs = bound(CNN, 3)
    original = m.clone()
    assert prune(m, sparsity=0.5, mode="channel") == {"layers-pruned": 2, "channels-removed": 7, "layers-kept-whole": 1}
    verify_module(m)
    shapes = {k: v.shape for k, v in constants(m).items()}
    assert shapes == {"w1": (4, 3, 3, 3), "c1": (4,), "g": (4,), "be": (4,), "m": (4,), "v": (4,),
                      "w2": (3, 4, 3, 3), "s2": (1, 3, 1, 1), "fw": (3, 5), "fb": (5,)}  # fmt: skip
    types = {op.result.name: op.result.type.shape for op in m["main"].ops}
    assert types["p"] == (2, 4, 4, 4) and types["f"] == (2, 3) and types["y"] == (2, 5)
    r1, r2 = smallest_l1(inputs["w1"], 0, 0.5), smallest_l1(inputs["w2"], 0, 0.5)
    assert_equals_zeroed_original(original, m, inputs, {"w2": (1, r1), "fw": (0, r2)})


def test_channel_pruning_makes_the_net_cheaper() -> None:
    _, m, _ = bound(CNN, 4)
    before_params = sum(a.size for a in constants(m).values())
    before_flops = count_flops(m["main"])
    prune(m, sparsity=0.5, mode="channel")
    assert sum(a.size for a in constants(m).values()) < 0.6 * before_params
    assert count_flops(m["main"]) < 0.6 * before_flops


GROUPED = format_dense(Dense.of(np.arange(8, dtype=np.float32).reshape(4, 2, 1, 1)))
KEPT_WHOLE = {
    "returned": "%y = graph.conv2d(%x, %w)",
    "residual-add": "%c = graph.conv2d(%x, %w)\n  %r = graph.relu(%c)\n  %s = graph.add(%r, %x)\n"
    "  %y = graph.conv2d(%s, %w)",
    "concat": "%c = graph.conv2d(%x, %w)\n  %k = graph.concat(%c, %c) {axis = 1}\n"
    "  %s = graph.slice(%k) {starts = [0], ends = [4], axes = [1]}\n  %y = graph.conv2d(%s, %w)",
    "reshape": "%c = graph.conv2d(%x, %w)\n  %t = graph.reshape(%c) {shape = [1, 4, 9]}\n"
    "  %u = graph.reshape(%t) {shape = [1, 4, 3, 3]}\n  %y = graph.conv2d(%u, %w)",
    "argument-bias": "%c = graph.conv2d(%x, %w, %p)\n  %y = graph.conv2d(%c, %w)",
    "argument-batch-norm": "%c = graph.conv2d(%x, %w)\n  %n = graph.batch_norm(%c, %p, %p, %p, %p)\n"
    "  %y = graph.conv2d(%n, %w)",
    "next-layer-argument-weight": "%c = graph.conv2d(%x, %w)\n  %y = graph.conv2d(%c, %v)",
    "grouped-next-layer": f"%g = graph.constant {{value = {GROUPED}}}\n  %c = graph.conv2d(%x, %w)\n"
    "  %y = graph.conv2d(%c, %g) {groups = 2}",
    "channel-axis-moved": "%c = graph.conv2d(%x, %w)\n  %t = graph.transpose(%c) {perm = [0, 1, 3, 2]}\n"
    "  %y = graph.conv2d(%t, %w)",
}


@pytest.mark.parametrize("body", KEPT_WHOLE.values(), ids=KEPT_WHOLE.keys())
def test_channels_that_reach_what_cannot_shrink_keep_the_layer_whole(body: str) -> None:
    w = np.arange(16, dtype=np.float32).reshape(4, 4, 1, 1)
    text = (
        "func @main(%x: tensor<1x4x3x3xf32>, %p: tensor<4xf32>, %v: tensor<4x4x1x1xf32>) -> tensor<1x4x3x3xf32> {\n"
        f"  %w = graph.constant {{value = {format_dense(Dense.of(w))}}}\n"
        f"  {body}\n  return %y\n}}\n"
    )
    m = parse(text)
    before = str(m)
    stats = prune(m, sparsity=0.5, mode="channel")
    assert "layers-pruned" not in stats
    assert str(m) == before


def test_every_layer_keeps_at_least_one_channel() -> None:
    _, m, _ = bound(MLP, 5)
    prune(m, sparsity=1.0, mode="channel")
    assert constants(m)["w1"].shape == (12, 1) and constants(m)["w2"].shape == (1, 1)


@settings(max_examples=25, deadline=None)
@given(
    widths=st.lists(st.integers(1, 6), min_size=2, max_size=5),
    sparsity=st.floats(0, 1),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_mlps_equal_zeroing_the_removed_channels(widths, sparsity, bias, seed) -> None:
    rng = np.random.default_rng(seed)
    args = [f"%x: tensor<3x{widths[0]}xf32>"]
    lines, h = [], "%x"
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        args.append(f"%w{i}: tensor<{a}x{b}xf32>")
        lines.append(f"  %m{i} = graph.matmul({h}, %w{i})")
        h = f"%m{i}"
        if bias:
            args.append(f"%b{i}: tensor<{b}xf32>")
            lines.append(f"  %z{i} = graph.add({h}, %b{i})")
            h = f"%z{i}"
        lines.append(f"  %r{i} = graph.relu({h})")
        h = f"%r{i}"
    body = "\n".join(lines)
    text = f"func @main({', '.join(args)}) -> tensor<3x{widths[-1]}xf32> {{\n{body}\n  return {h}\n}}\n"
    m = parse(text)
    inputs = {a.name: rng.standard_normal(a.type.shape).astype(np.float32) for a in m["main"].args}
    bind_constants(m, {k: v for k, v in inputs.items() if k != "x"})
    original = m.clone()
    prune(m, sparsity=sparsity, mode="channel")
    verify_module(m)
    zero = {}
    for i in range(len(widths) - 2):  # the last layer is returned
        removed = smallest_l1(inputs[f"w{i}"], 1, sparsity)
        assert constants(m)[f"w{i}"].shape[1] == widths[i + 1] - len(removed)
        zero[f"w{i + 1}"] = (0, removed)
    assert_equals_zeroed_original(original, m, inputs, zero)


@settings(max_examples=25, deadline=None)
@given(
    channels=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    between=st.lists(st.sampled_from(["bias", "scale", "bn", "relu", "pool", "sigmoid"]), max_size=3),
    sparsity=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_random_conv_chains_equal_zeroing_the_removed_channels(channels, between, sparsity, seed) -> None:
    """conv layers with per-channel ops between, then global pooling, flatten and a returned matmul."""
    rng = np.random.default_rng(seed)
    c_in, h, lines, values = 2, "%x", [], {}
    for i, c in enumerate(channels):
        values[f"w{i}"] = rng.standard_normal((c, c_in, 3, 3)).astype(np.float32)
        lines.append(f"  %c{i} = graph.conv2d({h}, %w{i}) {{padding = [1, 1, 1, 1]}}")
        h = f"%c{i}"
        for j, kind in enumerate(between):
            name = f"%o{i}_{j}"
            if kind == "bias":
                values[f"k{i}_{j}"] = rng.standard_normal((c, 1, 1)).astype(np.float32)
                lines.append(f"  {name} = graph.add({h}, %k{i}_{j})")
            elif kind == "scale":
                values[f"k{i}_{j}"] = rng.standard_normal((1, 1, 1)).astype(np.float32)  # broadcasts: stays
                lines.append(f"  {name} = graph.mul(%k{i}_{j}, {h})")
            elif kind == "bn":
                for p in "gbm":
                    values[f"{p}{i}_{j}"] = rng.standard_normal(c).astype(np.float32)
                values[f"v{i}_{j}"] = rng.uniform(0.5, 2, c).astype(np.float32)
                lines.append(f"  {name} = graph.batch_norm({h}, %g{i}_{j}, %b{i}_{j}, %m{i}_{j}, %v{i}_{j})")
            elif kind == "pool":
                window = "kernel = [3, 3], strides = [1, 1], padding = [1, 1, 1, 1]"
                lines.append(f"  {name} = graph.max_pool2d({h}) {{{window}}}")
            else:
                lines.append(f"  {name} = graph.{kind}({h})")
            h = name
        c_in = c
    values["fw"] = rng.standard_normal((c_in, 3)).astype(np.float32)
    lines += [f"  %gp = graph.global_avg_pool2d({h})", "  %f = graph.flatten(%gp)", "  %y = graph.matmul(%f, %fw)"]
    args = ", ".join(f"%{k}: tensor<{'x'.join(map(str, v.shape))}xf32>" for k, v in values.items())
    body = "\n".join(lines)
    text = f"func @main(%x: tensor<2x2x5x5xf32>, {args}) -> tensor<2x3xf32> {{\n{body}\n  return %y\n}}\n"
    m = bind_constants(parse(text), values)
    inputs = {"x": rng.standard_normal((2, 2, 5, 5)).astype(np.float32), **values}
    original = m.clone()
    prune(m, sparsity=sparsity, mode="channel")
    verify_module(m)
    nexts = [*(f"w{i + 1}" for i in range(len(channels) - 1)), "fw"]
    zero = {}
    for i, nxt in enumerate(nexts):
        removed = smallest_l1(values[f"w{i}"], 0, sparsity)
        assert constants(m)[f"w{i}"].shape[0] == channels[i] - len(removed)
        zero[nxt] = (1 if nxt != "fw" else 0, removed)
    assert_equals_zeroed_original(original, m, inputs, zero)


# --- gc prune: weights from an .npz ----------------------------------------------------------------------


def test_prune_npz_unstructured_keeps_the_signature() -> None:
    m = parse_file(ROOT / "examples" / "mlp.gir")
    inputs = random_inputs(m["main"], 0)
    params = {k: v for k, v in inputs.items() if k != "x"}
    pruned, new = prune_npz(m, params, 0.75, "unstructured")
    assert [(a.name, a.type) for a in pruned["main"].args] == [(a.name, a.type) for a in m["main"].args]
    assert set(new) == set(params)
    for name in ("w1", "w2", "w3"):
        assert np.count_nonzero(new[name] == 0) == round(0.75 * params[name].size)
    np.testing.assert_array_equal(new["b1"], params["b1"])
    assert str(m) == str(parse_file(ROOT / "examples" / "mlp.gir"))  # the input module is untouched


def test_prune_npz_channel_shrinks_argument_types_on_the_cnn_example() -> None:
    m = parse_file(ROOT / "examples" / "cnn.gir")
    inputs = random_inputs(m["main"], 1)
    params = {k: v for k, v in inputs.items() if k != "x"}
    pruned, new = prune_npz(m, params, 0.5, "channel")
    verify_module(pruned)
    assert [a.name for a in pruned["main"].args] == [a.name for a in m["main"].args]
    shrunk = {a.name: a.type.shape for a in pruned["main"].args if a.type.shape != inputs[a.name].shape}
    # The first conv of each residual block is free: its channels end in the block's second conv.
    assert shrunk == {
        **{f"b1a_{p}": (16,) for p in "gbmv"}, "b1a_w": (16, 32, 3, 3), "b1b_w": (32, 16, 3, 3),
        **{f"b2a_{p}": (32,) for p in "gbmv"}, "b2a_w": (32, 32, 3, 3), "b2b_w": (64, 32, 3, 3),
        **{f"b3a_{p}": (64,) for p in "gbmv"}, "b3a_w": (64, 64, 3, 3), "b3b_w": (128, 64, 3, 3),
    }  # fmt: skip
    zeroed = dict(params)
    for block in ("b1", "b2", "b3"):
        removed = smallest_l1(params[f"{block}a_w"], 0, 0.5)
        w = np.array(params[f"{block}b_w"])
        w[:, removed] = 0
        zeroed[f"{block}b_w"] = w
    want = run(m, {"x": inputs["x"], **zeroed})[0]
    got = run(pruned, {"x": inputs["x"], **new})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"w9": np.zeros(3, np.float32)}, "parameter 'w9' is not an argument of @main"),
        ({"w1": np.zeros((3, 3), np.float32)}, "parameter 'w1' has shape [3, 3] but %w1 is tensor<784x1024xf32>"),
    ],
)
def test_prune_npz_bad_parameters_are_user_errors(params: dict, message: str) -> None:
    with pytest.raises(GCError) as e:
        prune_npz(parse_file(ROOT / "examples" / "mlp.gir"), params, 0.5, "channel")
    assert message in e.value.diagnostics[0].message


def test_cmd_prune_writes_module_and_parameters(tmp_path: Path, capsys) -> None:
    m = parse(MLP)
    inputs = random_inputs(m["main"], 6)
    np.savez(tmp_path / "w.npz", **{k: v for k, v in inputs.items() if k != "x"})
    args = argparse.Namespace(
        file=str(tmp_path / "net.gir"), params=str(tmp_path / "w.npz"), sparsity=0.5, mode="channel",
        output=str(tmp_path / "pruned.gir"), params_out=str(tmp_path / "pruned.npz"),
    )  # fmt: skip
    (tmp_path / "net.gir").write_text(MLP)
    assert cmd_prune(args) == 0
    out = capsys.readouterr().out
    assert "parameters: 224 -> 99 (-55.8%)" in out
    assert "FLOPs:      3552 -> 1552 (-56.3%)" in out  # 2*K*N per matmul, one per add/relu/tanh element
    pruned = parse_file(tmp_path / "pruned.gir")
    with np.load(tmp_path / "pruned.npz") as data:
        params = {k: data[k] for k in data.files}
    assert params["w1"].shape == (12, 5) and params["w2"].shape == (5, 3) and params["w3"].shape == (3, 4)
    assert run(pruned, {"x": inputs["x"], **params})[0].shape == (8, 4)


def _prune_args(tmp_path: Path, params: str | None, text: str = MLP) -> argparse.Namespace:
    (tmp_path / "net.gir").write_text(text)
    return argparse.Namespace(file=str(tmp_path / "net.gir"), params=params, sparsity=0.5, mode="unstructured",
                              output=str(tmp_path / "pruned.gir"), params_out=str(tmp_path / "pruned.npz"))


def test_cmd_prune_needs_every_weight_it_is_to_prune(tmp_path: Path) -> None:
    """Pruning the layers whose weights came and passing one through would leave a half-pruned net."""
    m = parse(MLP)
    weights = {k: v for k, v in random_inputs(m["main"], 6).items() if k != "x"}
    layer_weights = [op.operands[1].name for op in m["main"].ops if op.name == "graph.matmul"]
    with pytest.raises(GCError, match="takes its weights .* as arguments: give them with --params W.npz"):
        cmd_prune(_prune_args(tmp_path, None))
    np.savez(tmp_path / "miss.npz", **{k: v for k, v in weights.items() if k != layer_weights[-1]})
    with pytest.raises(GCError, match=f"miss.npz has no '{layer_weights[-1]}', the weight of a layer of @main"):
        cmd_prune(_prune_args(tmp_path, str(tmp_path / "miss.npz")))


TRANSPOSED = ("func @main(%x: tensor<4x8xf32>, %w: tensor<6x8xf32>) -> tensor<4x6xf32> {\n"
              "  %t = graph.OP(%w)\n  %y = graph.matmul(%x, %t)\n  return %y\n}\n")


def test_a_weight_read_through_a_transpose_is_pruned_as_an_imported_gemm_reads_it(tmp_path: Path, capsys) -> None:
    w = np.arange(1, 49, dtype=np.float32).reshape(6, 8) * np.where(np.arange(48) % 2, 1, -1).reshape(6, 8)
    np.savez(tmp_path / "w.npz", w=w)
    assert cmd_prune(_prune_args(tmp_path, str(tmp_path / "w.npz"), TRANSPOSED.replace("OP", "transpose"))) == 0
    pruned = np.load(tmp_path / "pruned.npz")["w"]
    np.testing.assert_array_equal(pruned, np.where(np.abs(w) > 24, w, 0))  # the 24 smallest |w| zeroed
    assert "nothing was pruned" not in capsys.readouterr().err


def test_cmd_prune_says_when_nothing_was_pruned(tmp_path: Path, capsys) -> None:
    text = TRANSPOSED.replace("graph.OP(%w)", "graph.reshape(%w) {shape = [8, 6]}")
    np.savez(tmp_path / "w.npz", w=np.ones((6, 8), np.float32))
    assert cmd_prune(_prune_args(tmp_path, str(tmp_path / "w.npz"), text)) == 0
    assert "gc prune: nothing was pruned: no matmul or conv2d of @main reads a weight directly" \
        in capsys.readouterr().err
