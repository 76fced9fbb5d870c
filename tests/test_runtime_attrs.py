"""Attributes taken at run time from an argument (`{axes = %axes}`): parsed, printed, checked, and each call's
values bound by specialization on the interpreter and in compiled models (one compile per distinct value),
with diagnostics for a misuse in the text and for a value that does not fit at the call."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import gc
from hypothesis import given, settings
from hypothesis import strategies as st

import compiler
from compiler.diagnostics import GCError
from compiler.parser import parse
from compiler.pipeline import run_pipeline
from compiler.specialize import runtime_args

REDUCE = """func @main(%x: tensor<2x3x4xf32>, %axes: tensor<2xi64>) -> tensor<?x?x?xf32> {
  %y = graph.reduce_sum(%x) {axes = %axes, keepdims = true} : tensor<?x?x?xf32>
  %z = graph.relu(%y) : tensor<?x?x?xf32>
  return %z
}
"""

RESHAPE = """func @main(%x: tensor<2x3x4xf32>, %shape: tensor<3xi64>, %n: tensor<i64>) -> tensor<?x?x?xf32> {
  %y = graph.reshape(%x) {shape = %shape} : tensor<?x?x?xf32>
  %c = graph.cumsum(%y) {axis = %n} : tensor<?x?x?xf32>
  return %c
}
"""

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 11


def _error(text: str) -> str:
    with pytest.raises(GCError) as e:
        parse(text, "t.gir")
    return str(e.value)


def test_a_runtime_attribute_round_trips_through_text() -> None:
    assert str(parse(REDUCE)) == REDUCE
    assert str(parse(RESHAPE)) == RESHAPE


@pytest.mark.parametrize("attr, arg, message", [
    ("%y", "", "or an earlier op's result"),                                # its own result
    ("%w", ", %w: tensor<2xf32>", "of integers"),                           # floats for ints
    ("%w", ", %w: tensor<1x2xi64>", "rank 0 or 1"),                         # a matrix
    ("%w", ", %w: tensor<?xi64>", "a static tensor"),                       # sizes unknown
    ("[%w]", ", %w: tensor<2xi64>", "a whole argument, not a list element"),
    ("%nope", "", "names an argument of the function"),
])
def test_a_misused_runtime_attribute_is_one_diagnostic(attr: str, arg: str, message: str) -> None:
    text = (f"func @main(%x: tensor<2x3xf32>{arg}) -> tensor<?x?xf32> {{\n  %y0 = graph.relu(%x) : tensor<2x3xf32>\n"
            f"  %y = graph.reduce_sum(%y0) {{axes = {attr}, keepdims = true}} : tensor<?x?xf32>\n  return %y\n}}\n")
    msg = _error(text)
    assert message in msg and "t.gir:3:" in msg


def test_the_results_of_an_op_with_a_runtime_attribute_are_written() -> None:
    text = REDUCE.replace(" : tensor<?x?x?xf32>\n  %z", "\n  %z")
    assert "the result types must be written" in _error(text)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-3, 2), min_size=2, max_size=2, unique_by=lambda a: a % 3))
def test_the_interpreter_takes_each_calls_axes(axes: list[int]) -> None:
    m = parse(REDUCE)
    (got,) = compiler.run(m, {"x": X, "axes": np.array(axes)})
    np.testing.assert_array_equal(got, np.maximum(X.sum(axis=tuple(axes), keepdims=True), 0))


def test_a_value_that_does_not_fit_is_the_ops_error_with_the_value_in_a_note() -> None:
    with pytest.raises(GCError) as e:
        compiler.run(parse(REDUCE, "r.gir"), {"x": X, "axes": np.array([0, 7])})
    text = str(e.value)
    assert "r.gir:2:" in text and "axis 7 is out of range" in text and "this call gives it [0, 7]" in text


def test_a_compiled_model_is_made_once_per_distinct_value_and_saved_with_them(tmp_path) -> None:
    model = compiler.compile(REDUCE, "llvm")
    for axes in ([0, 1], [1, 2], [0, 1], [-1, 0]):
        (got,) = model(X, np.array(axes))
        np.testing.assert_allclose(got, np.maximum(X.sum(axis=tuple(axes), keepdims=True), 0), rtol=1e-6)
    assert len(model._models) == 3  # [0, 1] again is the same model
    model.save(tmp_path / "r.gcpkg")
    again = compiler.load(tmp_path / "r.gcpkg")
    assert len(again._models) == 3
    np.testing.assert_allclose(again(X, np.array([1, 2]))[0], np.maximum(X.sum(axis=(1, 2), keepdims=True), 0))
    assert len(again._models) == 3  # loaded, not compiled again


def test_several_runtime_attributes_and_a_scalar_one() -> None:
    m = parse(RESHAPE)
    model = compiler.compile(RESHAPE, "llvm")
    for shape, n in itertools.product(([4, 3, 2], [0, -1, 2], [1, 24, 1]), (0, 1, -1)):
        want = np.cumsum(X.reshape([X.shape[i] if d == 0 else d for i, d in enumerate(shape)]), axis=n)
        inputs = {"x": X, "shape": np.array(shape), "n": np.array(n)}
        np.testing.assert_allclose(compiler.run(m, inputs)[0], want, rtol=1e-6)
        np.testing.assert_allclose(model(**inputs)[0], want, rtol=1e-5, atol=1e-5)


def test_binding_the_argument_as_a_weight_fixes_the_attribute() -> None:
    model = compiler.compile(REDUCE, "llvm", params={"axes": np.array([2, 0])})
    np.testing.assert_allclose(model(X)[0], np.maximum(X.sum(axis=(0, 2), keepdims=True), 0))


def test_the_cli_runs_it_with_given_values_and_says_why_passes_and_random_inputs_cannot(tmp_path) -> None:
    src = tmp_path / "r.gir"
    src.write_text(REDUCE)
    np.savez(tmp_path / "in.npz", x=X, axes=np.array([0, 2]))
    for target in ("interp", "llvm"):
        r = gc("run", str(src), "--inputs", str(tmp_path / "in.npz"), "--target", target, "--outputs",
               str(tmp_path / "out.npz"))
        assert r.returncode == 0, r.stderr
        np.testing.assert_allclose(np.load(tmp_path / "out.npz")["result0"],
                                   np.maximum(X.sum(axis=(0, 2), keepdims=True), 0), rtol=1e-6)
    r = gc("run", str(src), "--random-inputs", "0")
    assert r.returncode == 1 and "give it with --inputs" in r.stderr and "Traceback" not in r.stderr
    r = gc("opt", str(src), "-p", "canonicalize")
    assert r.returncode == 1 and "is taken at run time" in r.stderr and "r.gir:2:" in r.stderr


# --- values computed at each call: from sizes (graph.shape), constants and small arguments ------------------

BATCH_KEPT = """func @main(%x: tensor<?x4x8xf32>) -> tensor<?x32xf32> {
  %s = graph.shape(%x) : tensor<3xi64>
  %n = graph.slice(%s) {starts = [0], ends = [1], axes = [0]} : tensor<1xi64>
  %c = graph.constant {value = dense<32> : tensor<1xi64>} : tensor<1xi64>
  %t = graph.concat(%n, %c) {axis = 0} : tensor<2xi64>
  %y = graph.reshape(%x) {shape = %t} : tensor<?x32xf32>
  %z = graph.relu(%y) : tensor<?x32xf32>
  return %z
}
"""

FROM_AN_ARGUMENT = """func @main(%x: tensor<2x3x4xf32>, %k: tensor<i64>) -> tensor<?x?xf32> {
  %one = graph.constant {value = dense<1> : tensor<i64>} : tensor<i64>
  %a = graph.add(%k, %one) : tensor<i64>
  %u = graph.unsqueeze(%a) {axes = [0]} : tensor<1xi64>
  %m = graph.constant {value = dense<-1> : tensor<1xi64>} : tensor<1xi64>
  %t = graph.concat(%u, %m) {axis = 0} : tensor<2xi64>
  %y = graph.reshape(%x) {shape = %t} : tensor<?x?xf32>
  return %y
}
"""


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 9))
def test_an_attribute_computed_from_the_sizes_takes_each_calls(batch: int) -> None:
    m = parse(BATCH_KEPT)
    assert str(m) == BATCH_KEPT and runtime_args(m["main"]) == []  # (sizes alone: no argument's value)
    x = np.random.default_rng(batch).standard_normal((batch, 4, 8)).astype(np.float32)
    (got,) = compiler.run(m, {"x": x})
    np.testing.assert_array_equal(got, np.maximum(x.reshape(batch, 32), 0))


def test_a_compiled_model_computes_it_at_compile_time_of_each_size() -> None:
    model = compiler.compile(BATCH_KEPT, "llvm", cache=False)
    for batch in (2, 5, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 8)).astype(np.float32)
        np.testing.assert_array_equal(model(x)[0], np.maximum(x.reshape(batch, 32), 0))
    assert len(model._models) == 2
    # The sizes' arithmetic folded away: each size runs the reshape and relu, one kernel.
    assert [s.ops for s in model.model_for([(5, 4, 8)], {}).plan.steps if s.kernel] == [("reshape", "relu")]


def test_an_attribute_computed_from_an_argument_takes_its_value() -> None:
    m = parse(FROM_AN_ARGUMENT)
    assert runtime_args(m["main"]) == ["k"]  # read through add, unsqueeze and concat
    model = compiler.compile(FROM_AN_ARGUMENT, "llvm", cache=False)
    for k in (1, 5, 2, 1):
        want = X.reshape(k + 1, -1)
        np.testing.assert_array_equal(compiler.run(m, {"x": X, "k": np.array(k)})[0], want)
        np.testing.assert_array_equal(model(X, np.array(k))[0], want)
    assert len(model._models) == 3
    with pytest.raises(GCError, match="cannot reshape|does not divide|24 elements"):
        compiler.run(m, {"x": X, "k": np.array(4)})  # [5, -1] of 24 elements


@pytest.mark.parametrize("change, message", [
    # computed from the data itself: no specialization could key on it
    (("%a = graph.add(%k, %one)", "%r = graph.reduce_sum(%x) : tensor<f32>\n  %ri = graph.cast(%r) {dtype = i64} : "
      "tensor<i64>\n  %a = graph.add(%ri, %one)"), "is computed from %x, a tensor<2x3x4xf32>"),
    (("{shape = %t}", "{shape = %later}"), "or an earlier op's result"),
])  # fmt: skip
def test_a_value_computed_from_data_or_not_yet_defined_is_one_diagnostic(change, message) -> None:
    msg = _error(FROM_AN_ARGUMENT.replace(*change))
    assert message in msg and msg.count("error:") == 1


def test_graph_shape_folds_to_a_constant_once_the_sizes_are_known() -> None:
    text = """func @main(%x: tensor<2x3xf32>) -> tensor<2xi32> {
  %s = graph.shape(%x) {dtype = i32} : tensor<2xi32>
  return %s
}
"""
    m = parse(text)
    run_pipeline(m, "fold-constants")
    assert [op.name for op in m["main"].ops] == ["graph.constant"]
    np.testing.assert_array_equal(compiler.run(m, {"x": np.zeros((2, 3), np.float32)})[0], np.array([2, 3], np.int32))
    np.testing.assert_array_equal(compiler.compile(text, "llvm", pipeline="", cache=False)(np.zeros((2, 3), np.float32))[0],
                                  [2, 3])  # (unfolded, its own kernel)
