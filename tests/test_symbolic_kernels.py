"""One kernel for every size (compiler/codegen/symbolic.py): a function with `?` sizes compiled for the CPU
builds its kernels once, with extents that are expressions of the sizes, and a later size builds only
what is not symbolic. Every size is checked against the NumPy reference interpreter."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import rewrite
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compiler
from compiler.codegen.symbolic import KernelSizes, instantiate, symbolize
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.ir import Bound, Sym
from compiler.parser import parse

MLP = """
func @main(%x: tensor<?x24xf32>, %w1: tensor<24x40xf32>, %b1: tensor<40xf32>, %w2: tensor<40x8xf32>,
           %b2: tensor<8xf32>) -> tensor<?x8xf32> {
  %h = graph.matmul(%x, %w1) : tensor<?x40xf32>
  %z = graph.add(%h, %b1) : tensor<?x40xf32>
  %a = graph.relu(%z) : tensor<?x40xf32>
  %o = graph.matmul(%a, %w2) : tensor<?x8xf32>
  %y = graph.add(%o, %b2) : tensor<?x8xf32>
  return %y
}
"""

CNN = """
func @main(%x: tensor<?(batch)x8x12x12xf32>, %w: tensor<16x8x3x3xf32>, %b: tensor<16xf32>,
           %w2: tensor<16x16x1x1xf32>) -> tensor<?(batch)x16x6x6xf32> {
  %c = graph.conv2d(%x, %w, %b) {padding = [1, 1, 1, 1]} : tensor<?(batch)x16x12x12xf32>
  %r = graph.relu(%c) : tensor<?(batch)x16x12x12xf32>
  %p = graph.max_pool2d(%r) {kernel = [2, 2], strides = [2, 2]} : tensor<?(batch)x16x6x6xf32>
  %d = graph.conv2d(%p, %w2) : tensor<?(batch)x16x6x6xf32>
  %y = graph.add(%d, %p) : tensor<?(batch)x16x6x6xf32>
  return %y
}
"""

ATTENTION = """
func @main(%x: tensor<?(seq)x32xf32>, %wq: tensor<32x32xf32>, %wk: tensor<32x32xf32>) -> tensor<?(seq)x?(seq)xf32> {
  %q = graph.matmul(%x, %wq) : tensor<?(seq)x32xf32>
  %k = graph.matmul(%x, %wk) : tensor<?(seq)x32xf32>
  %kt = graph.transpose(%k) {perm = [1, 0]} : tensor<32x?(seq)xf32>
  %s = graph.matmul(%q, %kt) : tensor<?(seq)x?(seq)xf32>
  %p = graph.softmax(%s) {axis = -1} : tensor<?(seq)x?(seq)xf32>
  return %p
}
"""


def _weights(text: str, data: str, shape: dict) -> dict[str, np.ndarray]:
    f = parse(text)["main"]
    return {k: v for k, v in random_inputs(f, 0, shapes=shape).items() if k != data}


def _check(model, text: str, params: dict, x: np.ndarray, data: str = "x") -> None:
    want = compiler.run(parse(text), {data: x, **params})
    got = model(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        scale = float(np.abs(w).max()) if w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * max(1.0, scale))


@pytest.fixture(scope="module")
def mlp():
    params = _weights(MLP, "x", {"x": (4, 24)})
    return compiler.compile(MLP, "llvm", params=params), params


def test_mlp_builds_its_kernels_once_for_every_size(mlp):
    model, params = mlp
    assert model.symbolic is not None
    rng = np.random.default_rng(0)
    built = []
    for n in (5, 16, 2, 33, 64):
        x = rng.standard_normal((n, 24)).astype(np.float32)
        _check(model, MLP, params, x)
        sized = model.model_for([x.shape])
        built.append(sized.built_functions)
        # The matmul rule schedules rows known only at run time (no generic fallback).
        assert {s.schedule for s in sized.plan.steps} == {"matmul"}
    assert built[0] > 0 and built[1:] == [0, 0, 0, 0]
    kernels = [tuple(s.kernel for s in model.model_for([(n, 24)]).plan.steps) for n in (5, 16, 2, 33, 64)]
    assert len(set(kernels)) == 1  # the same library functions at every size


def test_a_batch_of_one_is_its_own_specialization(mlp):
    model, params = mlp
    x = np.random.default_rng(1).standard_normal((1, 24)).astype(np.float32)
    _check(model, MLP, params, x)
    one = model.model_for([x.shape])
    other = model.model_for([(7, 24)])
    assert one.built_functions > 0  # a GEMV: sizes of 1 are not symbolic (as torch.compile's 0/1 rule)
    assert {s.kernel for s in one.plan.steps}.isdisjoint({s.kernel for s in other.plan.steps})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 48))
def test_mlp_matches_the_interpreter_at_any_size(mlp, n):
    model, params = mlp
    x = np.random.default_rng(n).standard_normal((n, 24)).astype(np.float32)
    _check(model, MLP, params, x)


def test_a_size_that_does_not_fit_is_an_error_naming_the_argument(mlp):
    model, _ = mlp
    with pytest.raises(GCError, match="x"):
        model(np.zeros((3, 23), np.float32))


def test_convolutions_share_kernels_across_batches():
    params = _weights(CNN, "x", {"x": (2, 8, 12, 12)})
    model = compiler.compile(CNN, "llvm", params=params)
    assert model.symbolic is not None
    rng = np.random.default_rng(2)
    built = {}
    for n in (2, 3, 5):
        x = rng.standard_normal((n, 8, 12, 12)).astype(np.float32)
        _check(model, CNN, params, x)
        built[n] = model.model_for([x.shape]).built_functions
    # Convs, pools and the epilogues take a batch known at run time: nothing is built again.
    assert built[2] > 0 and built[3] == built[5] == 0
    rules = {s.schedule for s in model.model_for([(5, 8, 12, 12)]).plan.steps}
    assert {"conv2d", "pool"} <= rules and "generic" not in rules


LATE_MAP = """
func @main(%x: tensor<?(batch)x16x4x4xf32>, %w: tensor<16x16x3x3xf32>, %b: tensor<16xf32>) -> tensor<?(batch)x16x4x4xf32> {
  %c = graph.conv2d(%x, %w, %b) {padding = [1, 1, 1, 1]} : tensor<?(batch)x16x4x4xf32>
  %y = graph.relu(%c) : tensor<?(batch)x16x4x4xf32>
  return %y
}
"""


def test_a_choice_by_batch_gets_a_graph_for_each_side():
    # A 4x4 map is one Winograd tile an image: the winograd pass wants 16 tiles, so a batch of 2 stays
    # direct and one of 16 takes Winograd, as their static compiles do; each side is one symbolic graph.
    params = _weights(LATE_MAP, "x", {"x": (2, 16, 4, 4)})
    model = compiler.compile(LATE_MAP, "llvm", params=params)
    rng = np.random.default_rng(5)
    rules, built = {}, {}
    for n in (2, 16, 3, 21):
        _check(model, LATE_MAP, params, rng.standard_normal((n, 16, 4, 4)).astype(np.float32))
        sized = model.model_for([(n, 16, 4, 4)])
        rules[n], built[n] = {s.schedule for s in sized.plan.steps}, sized.built_functions
    assert "winograd" not in rules[2] and rules[2] == rules[3]
    assert {"winograd", "matmul"} <= rules[16] and rules[16] == rules[21]
    assert built[16] > 0 and built[3] == built[21] == 0


def test_a_loaded_artifact_makes_the_graph_a_new_size_chooses(tmp_path):
    params = _weights(LATE_MAP, "x", {"x": (2, 16, 4, 4)})
    compiler.compile(LATE_MAP, "llvm", params=params).save(tmp_path / "m.gcpkg")  # kernels of batch 2
    loaded = compiler.load(tmp_path / "m.gcpkg")
    x = np.random.default_rng(6).standard_normal((17, 16, 4, 4)).astype(np.float32)
    _check(loaded, LATE_MAP, params, x)
    assert "winograd" in {s.schedule for s in loaded.model_for([x.shape]).plan.steps}


# Sizes computed from the arguments' sizes for attributes (ONNX's Shape -> Gather -> Concat -> Reshape, and
# positions sliced to the sequence's length from a table of 16: BERT's position ids [0, min(seq, 512))).
HEADS = """func @main(%x: tensor<?(b)x?(s)x8xf32>, %w: tensor<8x8xf32>, %pos: tensor<1x16x8xf32>) -> tensor<?x2x?x4xf32> {
  %sh = graph.shape(%x) : tensor<3xi64>
  %bs = graph.slice(%sh) {starts = [0], ends = [2]} : tensor<2xi64>
  %len = graph.slice(%sh) {starts = [1], ends = [2]} : tensor<1xi64>
  %p = graph.slice(%pos) {starts = [0], ends = %len, axes = [1]} : tensor<1x?x8xf32>
  %h = graph.matmul(%x, %w) : tensor<?(b)x?(s)x8xf32>
  %hp = graph.add(%h, %p) : tensor<?(b)x?(s)x8xf32>
  %tail = graph.constant {value = dense<[2, 4]> : tensor<2xi64>} : tensor<2xi64>
  %shape = graph.concat(%bs, %tail) {axis = 0} : tensor<4xi64>
  %r = graph.reshape(%hp) {shape = %shape} : tensor<?x?x2x4xf32>
  %t = graph.transpose(%r) {perm = [0, 2, 1, 3]} : tensor<?x2x?x4xf32>
  return %t
}
"""


def test_sizes_computed_for_attributes_stay_expressions_of_the_names():
    params = _weights(HEADS, "x", {"x": (2, 5, 8)})
    model = compiler.compile(HEADS, "llvm", params=params)
    assert model.symbolic is not None  # (the shape arithmetic evaluated on the names, not per size)
    rng = np.random.default_rng(7)
    built = {}
    for size in ((2, 5), (3, 9), (4, 15), (2, 3), (3, 16)):
        x = rng.standard_normal((*size, 8)).astype(np.float32)
        _check(model, HEADS, params, x)
        built[size] = model.model_for([x.shape]).built_functions
    assert built[(2, 5)] > 0 and built[(3, 9)] == built[(4, 15)] == built[(2, 3)] == 0
    # The slice of 16 positions to the sequence's length took min(s, 16) = s: a guard, so from 16 on a
    # sequence gets a graph of its own, where the slice keeps 16 (its kernels built for it): at 17 the
    # add's sizes disagree, the interpreter's error.
    x = rng.standard_normal((2, 17, 8)).astype(np.float32)
    with pytest.raises(GCError) as interpreted:
        compiler.run(parse(HEADS), {"x": x, **params})
    with pytest.raises(GCError) as compiled:
        model(x)
    # (the same line and column of the text as given: <text> is compile()'s name for it, <input> parse()'s)
    assert str(compiled.value).splitlines()[0].split(":", 1)[1] == str(interpreted.value).splitlines()[0].split(":", 1)[1]


def test_a_size_choice_is_a_guard():
    from compiler.ir import SizeChoices, at_least, choosing, size_max, size_min

    s = Sym.symbol("s")
    with choosing(SizeChoices({"s": 3})) as choices:
        assert size_min(s, 16) == s and size_max(s - 5, 0) == 0 and at_least(4 * s, 12)
    assert [(e.expr(), b, o) for e, b, o in choices.guards] == [("s - 16", 0, False), ("s - 5", 0, False),
                                                                ("4 * s", 12, True)]
    assert choices.holds({"s": 4}) and not choices.holds({"s": 2}) and not choices.holds({"s": 16})


def test_a_reshape_maps_runs_of_dims_and_divides_by_no_size_outside_its_run():
    from dialects.graph.shape import _groups

    b, s = Sym.symbol("b"), Sym.symbol("s")
    assert _groups((6, 4), (2, 3, 4)) == [(range(0, 1), range(0, 2)), (range(1, 2), range(2, 3))]
    # [b * s, 8] -> [b, s, 2, 4]: the rows split into b and s (no division by s), the 8 into 2 x 4.
    assert _groups((Bound(12, b * s), 8), (Bound(3, b), Bound(4, s), 2, 4)) == [
        (range(0, 1), range(0, 2)), (range(1, 2), range(2, 4))]
    # Equal numbers at this size but different sizes by name are no run: [s, 4] -> [4, s] is one.
    assert _groups((Bound(4, s), 4), (4, Bound(4, s))) == [(range(0, 2), range(0, 2))]
    assert _groups((1, 6), (6,)) == [(range(0, 2), range(0, 1))] and _groups((), ()) is None


def test_attention_over_a_sequence_known_at_run_time():
    params = _weights(ATTENTION, "x", {"x": (6, 32)})
    model = compiler.compile(ATTENTION, "llvm", params=params)
    rng = np.random.default_rng(3)
    built = {}
    for n in (6, 9, 40, 2):
        _check(model, ATTENTION, params, rng.standard_normal((n, 32)).astype(np.float32))
        built[n] = model.model_for([(n, 32)]).built_functions
    # Every kernel is one for every sequence: the products (Q K^T's columns and K are the sequence too)
    # and the softmax over rows of the sequence's length (vector lanes along a row of any length, the last
    # vector predicated: rows of 9, 40 and 2 here); a later length builds nothing.
    assert built[6] > 0 and built[9] == built[40] == built[2] == 0
    at9, at40 = (model.model_for([(n, 32)]).plan.steps for n in (9, 40))
    assert [s.kernel for s in at9] == [s.kernel for s in at40]
    assert "rows" in {s.schedule for s in at40} and "generic" not in {s.schedule for s in at40}


# GPT-2's MLP as exported: the rows flattened for the products, unflattened to [batch, seq, 256] (a shape
# computed from the input's) for the GELU, flattened again.
MLP_BLOCK = """
func @main(%x: tensor<?(b)x?(s)x16xf32>, %w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>) -> tensor<?x16xf32> {
  %f = graph.reshape(%x) {shape = [-1, 16]} : tensor<?x16xf32>
  %h = graph.matmul(%f, %w1) : tensor<?x32xf32>
  %xs = graph.shape(%x) : tensor<3xi64>
  %bs = graph.slice(%xs) {starts = [0], ends = [2], axes = [0]} : tensor<2xi64>
  %n = graph.constant {value = dense<[32]> : tensor<1xi64>} : tensor<1xi64>
  %shape = graph.concat(%bs, %n) {axis = 0} : tensor<3xi64>
  %r = graph.reshape(%h) {shape = %shape} : tensor<?x?x32xf32>
  %c = graph.constant {value = dense<3.0> : tensor<f32>} : tensor<f32>
  %p = graph.pow(%r, %c) : tensor<?x?x32xf32>
  %t = graph.tanh(%r) : tensor<?x?x32xf32>
  %g = graph.mul(%p, %t) : tensor<?x?x32xf32>
  %back = graph.reshape(%g) {shape = [-1, 32]} : tensor<?x32xf32>
  %y = graph.matmul(%back, %w2) : tensor<?x16xf32>
  return %y
}
"""


def test_an_unflattening_between_products_is_no_size_per_call():
    """[b * s, 32] unflattened to [b, s, 32]: canonicalize's matmul-unflattened moves the unflattening
    before the product, whose operand then has b and s apart (each bound by it), so the elementwise ops
    after it fuse into it and no kernel has a size that no operand binds (once the GELU's kernel between
    the reshapes was built for each (b, s))."""
    params = _weights(MLP_BLOCK, "x", {"x": (2, 3, 16)})
    model = compiler.compile(MLP_BLOCK, "llvm", params=params)
    assert model.symbolic is not None
    rng = np.random.default_rng(11)
    built = {}
    for size in ((2, 3), (3, 5), (4, 9), (2, 17)):
        x = rng.standard_normal((*size, 16)).astype(np.float32)
        _check(model, MLP_BLOCK, params, x)
        built[size] = model.model_for([x.shape]).built_functions
    assert built[(2, 3)] > 0 and built[(3, 5)] == built[(4, 9)] == built[(2, 17)] == 0
    steps = model.model_for([(4, 9, 16)]).plan.steps
    assert any({"matmul", "tanh"} <= set(s.ops) for s in steps)  # the GELU in the product's epilogue


# A causal mask's offsets (column less row) at sizes known only at each call, as the importer's run-time
# Trilu computes them.
OFFSETS = """
func @main(%x: tensor<?(r)x?(c)xf32>) -> tensor<?(r)x?(c)xf32> {
  %col = graph.iota(%x) {axis = 1} : tensor<?(r)x?(c)xf32>
  %row = graph.iota(%x) {axis = 0} : tensor<?(r)x?(c)xf32>
  %d = graph.sub(%col, %row) : tensor<?(r)x?(c)xf32>
  %y = graph.add(%x, %d) : tensor<?(r)x?(c)xf32>
  return %y
}
"""


def test_coordinates_are_one_kernel_for_every_size():
    model = compiler.compile(OFFSETS, "llvm")
    rng = np.random.default_rng(5)
    built = {}
    for size in ((3, 4), (5, 33), (17, 2), (2, 70)):
        x = rng.standard_normal(size).astype(np.float32)
        _check(model, OFFSETS, {}, x)
        built[size] = model.model_for([x.shape]).built_functions
    assert built[(3, 4)] > 0 and built[(5, 33)] == built[(17, 2)] == built[(2, 70)] == 0


def test_instantiate_keeps_each_size_expression():
    module = parse(MLP)
    sym = symbolize(module, "main")
    assert sym is not None
    (s0,) = sym["main"].args[0].type.shape[:1]
    assert isinstance(s0, Sym)
    at = instantiate(sym, {s0.name: 12})
    d = at["main"].args[0].type.shape[0]
    assert isinstance(d, Bound) and d == 12 and d.sym == s0
    one = instantiate(sym, {s0.name: 1})["main"].args[0].type.shape[0]
    assert type(one) is int and one == 1


def test_a_size_found_only_in_an_expression_is_its_own_variable():
    n = Sym.symbol("n")
    sizes = KernelSizes([(Bound(3 * 128 + 1, 128 * n + 1), 64)])
    v = sizes.convert(Bound(3 * 128 + 1, 128 * n + 1))
    assert sizes.values() == {str(v): 3 * 128 + 1}
    assert sizes.exprs() == {str(v): "128 * n + 1"}
    # n itself is that variable's (v - 1) // 128, so other sizes of n follow from it.
    assert str(sizes.convert(Bound(3, n))) == f"({v} - 1) // 128"


def test_a_loaded_artifact_builds_new_sizes_symbolically(tmp_path):
    params = _weights(MLP, "x", {"x": (4, 24)})
    model = compiler.compile(MLP, "llvm", params=params)
    x = np.random.default_rng(4).standard_normal((6, 24)).astype(np.float32)
    model(x)
    model.save(tmp_path / "m.gcpkg")
    loaded = compiler.load(tmp_path / "m.gcpkg")
    np.testing.assert_array_equal(loaded(x)[0], model(x)[0])  # a size it was saved with: no build
    assert loaded.symbolic is not None
    built = []
    for n in (11, 29):
        y = np.random.default_rng(n).standard_normal((n, 24)).astype(np.float32)
        _check(loaded, MLP, params, y)
        built.append(loaded.model_for([y.shape]).built_functions)
    assert built == [0, 0]  # the saved kernels (kernels.json, objects-<i>.o) serve the new sizes
    loaded.save(tmp_path / "again.gcpkg")  # and travel on
    again = compiler.load(tmp_path / "again.gcpkg")
    _check(again, MLP, params, np.ones((17, 24), np.float32))
    assert again.model_for([(17, 24)]).built_functions == 0


def test_a_saved_model_keeps_each_array_once_whatever_its_sizes(tmp_path):
    """The weights and every size's constants lie once in the artifact's pool (consts.npz): a size that
    shares its prepacked weights with another adds only its plan and library, not the weights again (the
    artifact grew by all of them a size: MobileNetV2's 14 MB). Each size's consts.json names its keys; a
    size taken out of the artifact is refused on its own."""
    import zipfile

    w = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)  # 512 KB of weights
    text = """
func @main(%x: tensor<?x256xf32>, %w: tensor<256x512xf32>) -> tensor<?x512xf32> {
  %y = graph.matmul(%x, %w) : tensor<?x512xf32>
  return %y
}
"""
    model = compiler.compile(text, "llvm", params={"w": w})
    bytes_at = []
    for n in (5, 9, 33):
        x = np.random.default_rng(n).standard_normal((n, 256)).astype(np.float32)
        model(x)
        model.save(tmp_path / "m.gcpkg")
        bytes_at.append((tmp_path / "m.gcpkg").stat().st_size)
    # two sizes more: far less than one more copy of the weights (prepacked or as given)
    assert bytes_at[2] - bytes_at[0] < w.nbytes // 4
    loaded = compiler.load(tmp_path / "m.gcpkg")
    for n in (5, 9, 33, 12):
        x = np.random.default_rng(n).standard_normal((n, 256)).astype(np.float32)
        np.testing.assert_allclose(loaded(x)[0], x @ w, rtol=1e-4, atol=1e-4)
    with zipfile.ZipFile(tmp_path / "m.gcpkg") as z:
        (tmp_path / "size.gcpkg").write_bytes(z.read("size-0.gcpkg"))
        assert "consts.json" in zipfile.ZipFile(tmp_path / "size.gcpkg").namelist()
    with pytest.raises(GCError, match="kept by the dynamic artifact"):
        compiler.load(tmp_path / "size.gcpkg")


def test_every_size_shares_the_weights(mlp):
    model, _ = mlp
    a, b = (model.model_for([(n, 24)]) for n in (5, 16))
    for x in (a, b):
        x(np.zeros((int(x.plan.args[0].shape[0]), 24), np.float32))
    assert sorted(map(id, a.consts.values())) == sorted(map(id, b.consts.values()))  # prepacked once
    assert [id(t) for t in a._device_consts() if t is not None] == [id(t) for t in b._device_consts() if t is not None]


def _saved_mlp(tmp_path):
    model = compiler.compile(MLP, "llvm", params=_weights(MLP, "x", {"x": (4, 24)}))
    model(np.ones((3, 24), np.float32))
    model.save(tmp_path / "m.gcpkg")
    return tmp_path / "m.gcpkg"


def test_a_damaged_kernel_table_is_refused(tmp_path):
    def missing_function(m):
        table = json.loads(m["kernels.json"])
        table["entries"][0]["built"][0] = "no_such_kernel"
        m["kernels.json"] = json.dumps(table).encode()

    with pytest.raises(GCError, match="kernels.json"):
        compiler.load(rewrite(_saved_mlp(tmp_path), tmp_path / "bad.gcpkg", missing_function))


def test_object_files_that_do_not_link_are_refused(tmp_path):
    bad = rewrite(_saved_mlp(tmp_path), tmp_path / "bad.gcpkg", lambda m: m.update({"objects-0.o": b"not an object"}))
    with pytest.raises(GCError, match="do not link"):
        compiler.load(bad)


def test_a_lowering_that_needs_its_sizes_as_numbers_builds_per_size(monkeypatch):
    """An op whose `lower` computes with a size as a number (here int() of it) still lowers, at each size."""
    from dialects.graph.elementwise import Relu

    lower = Relu.lower

    def by_numbers(self, x):
        [int(d) for d in x.shape]  # raises TypeError on a size variable
        return lower(self, x)

    monkeypatch.setattr(Relu, "lower", by_numbers)
    params = _weights(MLP, "x", {"x": (4, 24)})
    model = compiler.compile(MLP, "llvm", params=params)
    rng = np.random.default_rng(5)
    built = {}
    for n in (3, 6):
        _check(model, MLP, params, rng.standard_normal((n, 24)).astype(np.float32))
        built[n] = model.model_for([(n, 24)]).built_functions
    assert built[6] == 1  # the kernel with the relu, again; the last layer's is shared


ROWS = """
func @main(%x: tensor<3x?(n)xf32>) -> (tensor<3x?(n)xf32>, tensor<3x?(n)xf32>, tensor<3xf32>) {
  %s = graph.softmax(%x) {axis = -1} : tensor<3x?(n)xf32>
  %l = graph.log_softmax(%x) {axis = -1} : tensor<3x?(n)xf32>
  %m = graph.reduce_max(%x) {axes = [1]} : tensor<3xf32>
  return %s, %l, %m
}
"""


@pytest.fixture(scope="module")
def rows_model():
    model = compiler.compile(ROWS, "llvm")
    model(np.zeros((3, 100), np.float32))  # (its kernels built at a size the test does not draw)
    return model


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 70), seed=st.integers(0, 2**16))
def test_reductions_over_a_row_of_a_run_time_length(rows_model, n: int, seed: int) -> None:
    """The rows rule over a row whose length is a size variable: vector lanes along the row, the last
    vector predicated (and peeled off: rows of 16 and 64 have none, 17 one lane), one kernel for every n."""
    x = np.random.default_rng(seed).standard_normal((3, n)).astype(np.float32) * 4
    _check(rows_model, ROWS, {}, x)
    at = rows_model.model_for([x.shape])
    assert at.built_functions == 0
    assert {s.schedule for s in at.plan.steps} == {"rows"}
