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
    ("%y0", "", "names an argument of the function"),                      # an op's result
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
