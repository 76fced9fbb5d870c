"""fold-constants: values folded against independent NumPy, what must not fold, locations, statistics,
and outputs kept on the examples and on random modules."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

from compiler.builder import Builder
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Module
from compiler.parser import parse
from test_pass_cse import EXAMPLES, assert_same_outputs, random_module, run_pass


def fold(text: str, pipeline: str = "fold-constants") -> tuple[Module, dict]:
    m = parse(text, "t.gir")
    (p,) = run_pass(m, pipeline)
    return m, dict(+p.stats)  # + drops the counters left at zero


def constant(name: str, array: np.ndarray, dtype: str) -> str:
    body = np.array2string(np.asarray(array), separator=", ", threshold=10**6, floatmode="unique").replace("\n", "")
    shape = "".join(f"{d}x" for d in np.shape(array))
    return f"  %{name} = graph.constant {{value = dense<{body}> : tensor<{shape}{dtype}>}}\n"


def only_constants(m: Module, name: str = "main") -> list[np.ndarray]:
    """The returned values of @name, asserting every op left is a constant."""
    f = m[name]
    assert all(op.name == "graph.constant" for op in f.ops), [op.name for op in f.ops]
    return [v.owner.value.array for v in f.results]


def test_binary_op_of_constants_folds_to_its_value() -> None:
    a = np.array([[1.5, -2.0, 3.25], [0.0, 4.0, -1.0]], np.float32)
    m, stats = fold(
        "func @main() -> tensor<2x3xf32> {\n" + constant("a", a, "f32") + constant("b", np.float32(0.5), "f32")
        + "  %c = graph.mul(%a, %b)\n  return %c\n}\n"
    )
    (got,) = only_constants(m)
    np.testing.assert_array_equal(got, a * np.float32(0.5))
    assert stats == {"ops-folded": 1}
    assert len(m["main"].ops) == 1  # the operands went with the op


def test_chain_folds_in_one_run_and_keeps_the_returned_name() -> None:
    x = np.array([[1.0, 4.0], [9.0, 16.0]], np.float32)
    m, stats = fold(
        "func @main() -> tensor<2x2xf32> {\n" + constant("x", x, "f32")
        + "  %s = graph.sqrt(%x)\n  %n = graph.neg(%s)\n  %t = graph.transpose(%n)\n  return %t\n}\n"
    )
    (got,) = only_constants(m)
    np.testing.assert_array_equal(got, np.array([[-1.0, -3.0], [-2.0, -4.0]], np.float32))
    assert stats == {"ops-folded": 3} and m["main"].results[0].name == "t"


def test_split_folds_into_one_constant_per_result() -> None:
    x = np.arange(10, dtype=np.int64).reshape(2, 5)
    m, stats = fold(
        "func @main() -> (tensor<2x2xi64>, tensor<2x3xi64>) {\n" + constant("x", x, "i64")
        + "  %p, %q = graph.split(%x) {axis = 1, sections = [2, 3]}\n  return %p, %q\n}\n"
    )
    p, q = only_constants(m)
    np.testing.assert_array_equal(p, [[0, 1], [5, 6]])
    np.testing.assert_array_equal(q, [[2, 3, 4], [7, 8, 9]])
    assert stats == {"ops-folded": 1}


@pytest.mark.parametrize(
    "op, dtype, a, b, want",
    [
        ("div", "i32", [-7, 7, 5], [2, -2, 0], np.array([-3, -3, 0], np.int32)),  # truncation; x/0 is 0
        ("sub", "i8", [100, -100, 0], [-100, 100, 1], np.array([-56, 56, -1], np.int8)),  # wraps
        ("less", "f64", [1.0, 2.0, 3.0], [2.0, 2.0, 2.0], np.array([True, False, False])),
        ("maximum", "f32", [1.0, np.nan, -0.0], [0.0, 1.0, 0.5], np.array([1.0, np.nan, 0.5], np.float32)),
        ("div", "f32", [1.0, -1.0, 0.0], [0.0, 0.0, 0.0], np.array([np.inf, -np.inf, np.nan], np.float32)),
    ],
    ids=["int-div", "int8-wrap", "compare-f64", "nan-max", "div-by-zero"],
)
def test_folded_value_matches_numpy(op: str, dtype: str, a: list, b: list, want: np.ndarray) -> None:
    np_dtype = np.dtype({"i32": np.int32, "i8": np.int8, "f64": np.float64, "f32": np.float32}[dtype])
    rtype = "i1" if want.dtype == np.bool_ else dtype
    m, stats = fold(
        f"func @main() -> tensor<3x{rtype}> {{\n"
        + constant("a", np.array(a, np_dtype), dtype) + constant("b", np.array(b, np_dtype), dtype)
        + f"  %c = graph.{op}(%a, %b)\n  return %c\n}}\n"
    )
    (got,) = only_constants(m)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype, np_dtype", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_low_precision_folds_in_f32_and_rounds_once(dtype: str, np_dtype) -> None:
    a = np.array([1.0, 1000.0, 0.1], np_dtype)
    b = np.array([0.0009765625, 0.3, 0.2], np_dtype)
    m, _ = fold(
        f"func @main() -> tensor<3x{dtype}> {{\n" + constant("a", a.astype(np.float64), dtype)
        + constant("b", b.astype(np.float64), dtype) + "  %c = graph.mul(%a, %b)\n  return %c\n}\n"
    )
    (got,) = only_constants(m)
    want = (a.astype(np.float32) * b.astype(np.float32)).astype(np_dtype)
    assert got.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_ops_reading_an_argument_do_not_fold() -> None:
    m, stats = fold(
        "func @main(%x: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {\n"
        + constant("c", np.array([1.0, 2.0], np.float32), "f32")
        + "  %y = graph.add(%x, %c)\n  %z = graph.exp(%c)\n  return %y, %z\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.constant", "graph.add", "graph.constant"]
    assert stats == {"ops-folded": 1}  # %c stays: %y still reads it


def test_calls_and_constants_do_not_fold() -> None:
    m, stats = fold(
        "func @one() -> tensor<2xf32> {\n" + constant("c", np.ones(2, np.float32), "f32") + "  return %c\n}\n"
        "func @double(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = graph.add(%x, %x)\n  return %y\n}\n"
        "func @main() -> tensor<2xf32> {\n  %a = graph.call() {callee = @one} : tensor<2xf32>\n"
        + constant("k", np.ones(2, np.float32), "f32")
        + "  %b = graph.call(%k) {callee = @double} : tensor<2xf32>\n  %c = graph.add(%a, %b)\n  return %c\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.call", "graph.constant", "graph.call", "graph.add"]
    assert stats == {}


def test_ops_it_does_not_fold_are_left_in_place_even_if_dead() -> None:
    m, stats = fold(
        "func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n" + constant("c", np.ones(2, np.float32), "f32")
        + "  %d = graph.neg(%x)\n  return %x\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.constant", "graph.neg"]
    assert stats == {}


def test_results_over_the_size_limit_are_not_folded() -> None:
    # 512 x 512 f32 is exactly the default limit of 1 MiB; one more column is over it.
    m, stats = fold(
        "func @main() -> (tensor<512x512xf32>, tensor<512x513xf32>) {\n"
        "  %c = graph.constant {value = dense<2.0> : tensor<f32>}\n"
        "  %a = graph.broadcast_to(%c) {shape = [512, 512]}\n  %b = graph.broadcast_to(%c) {shape = [512, 513]}\n"
        "  return %a, %b\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.constant", "graph.constant", "graph.broadcast_to"]
    assert stats == {"ops-folded": 1, "not-folded-size": 1}


def test_size_limit_option_counts_bytes_of_all_results() -> None:
    text = (
        "func @main() -> (tensor<2xf32>, tensor<1xf32>) {\n" + constant("x", np.arange(3, dtype=np.float32), "f32")
        + "  %p, %q = graph.split(%x) {sections = [2, 1]}\n  return %p, %q\n}\n"
    )
    _, small = fold(text, "fold-constants{size-limit=8}")
    _, enough = fold(text, "fold-constants{size-limit=12}")
    assert small == {"not-folded-size": 1} and enough == {"ops-folded": 1}


def test_reference_error_leaves_the_op_to_fail_at_run_time() -> None:
    text = (
        "func @main() -> tensor<1xf32> {\n" + constant("d", np.array([1.0, 2.0], np.float32), "f32")
        + "  %i = graph.constant {value = dense<[5]> : tensor<1xi64>}\n  %g = graph.gather(%d, %i)\n  return %g\n}\n"
    )
    m, stats = fold(text)
    assert stats == {"not-folded-error": 1}
    assert [op.name for op in m["main"].ops][-1] == "graph.gather"
    with pytest.raises(GCError, match="index 5 is out of range"):
        run(m, {})


def test_folded_constant_location_fuses_op_and_operands() -> None:
    m, _ = fold(
        "func @main() -> tensor<2xf32> {\n" + constant("a", np.ones(2, np.float32), "f32")
        + constant("b", np.ones(2, np.float32), "f32") + "  %c = graph.add(%a, %b)\n  return %c\n}\n"
    )
    (op,) = m["main"].ops
    assert [(x.line, x.col) for x in op.loc.all()] == [(4, 8), (2, 8), (3, 8)]


def _inputs_as_constants(m: Module) -> dict[str, np.ndarray]:
    """Turn every argument of @main into a constant of its seeded random input; return the inputs."""
    f = m["main"]
    inputs = random_inputs(f, seed=0)
    b = Builder(f, 0)
    for a in f.args:
        f.replace_all_uses(a, b.constant(inputs[a.name], a.type.dtype))
    f.args = []
    return inputs


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_with_constant_inputs_folds_to_its_outputs(path: Path) -> None:
    m = parse(path.read_text(), str(path))
    with np.errstate(all="ignore"):
        want = run(m, _inputs_as_constants(m.clone()))
    folded = m.clone()
    _inputs_as_constants(folded)
    run_pass(folded, "fold-constants")
    for got, w in zip(only_constants(folded), want):
        np.testing.assert_array_equal(got, w)


@settings(max_examples=60, deadline=None)
@given(random_module())
def test_random_modules_keep_their_outputs(module: Module) -> None:
    after = module.clone()
    run_pass(after, "fold-constants")
    assert_same_outputs(module, after)
    (again,) = run_pass(after, "fold-constants")  # one run reaches the fixed point
    assert again.stats["ops-folded"] == 0


@settings(max_examples=60, deadline=None)
@given(random_module())
def test_random_modules_keep_their_outputs_through_fold_cse_dce(module: Module) -> None:
    after = module.clone()
    run_pass(after, "fold-constants,cse,dce")
    assert_same_outputs(module, after)
