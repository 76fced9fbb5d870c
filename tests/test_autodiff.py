"""The autodiff pass: the contract of @NAME_grad (arguments, results and their order, `wrt`, integer and
unused arguments, the original kept), calls differentiated through, diagnostics for what cannot be
differentiated, the backward ops as ordinary GIR for later passes, and the reusable core."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from helpers import gc

from compiler.builder import Builder
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Op, TensorType, operand
from compiler.parser import parse, parse_file
from compiler.passes import InputError
from compiler.passes.autodiff import Autodiff, append_backward, build_grad
from compiler.pipeline import parse_pipeline, run_pipeline
from compiler.printer import print_module
from compiler.rewrite import inline_calls

TRAIN_MLP = ROOT / "examples" / "train_mlp.gir"

NET = """
func @main(%x: tensor<4x3xf64>, %labels: tensor<4xi32>, %w: tensor<3x5xf64>, %b: tensor<5xf64>,
           %unused: tensor<2xf64>) -> tensor<f64> {
  %h = graph.matmul(%x, %w)
  %z = graph.add(%h, %b)
  %a = graph.tanh(%z)
  %loss = graph.softmax_cross_entropy(%a, %labels)
  return %loss
}
"""


def differentiated(text: str, pipeline: str = "autodiff"):
    module = parse(text, "t.gir")
    run_pipeline(module, pipeline)
    return module


def expected_net_gradients(x, labels, w, b):
    """The gradients of NET written out in NumPy: softmax cross-entropy over tanh(x @ w + b)."""
    a = np.tanh(x @ w + b)
    p = np.exp(a - a.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(labels)), labels] -= 1
    dz = p / len(labels) * (1 - a * a)
    return dz @ w.T, x.T @ dz, dz.sum(0)


# --- the contract of @NAME_grad ---------------------------------------------------------------------


def test_grad_function_takes_the_same_arguments_and_returns_loss_then_float_gradients_in_order() -> None:
    m = differentiated(NET)
    f, g = m["main"], m["main_grad"]
    assert [(a.name, a.type) for a in g.args] == [(a.name, a.type) for a in f.args]
    floats = [a.type for a in f.args if a.type.dtype.is_float]
    assert g.result_types == [TensorType((), f.result_types[0].dtype), *floats]
    inputs = random_inputs(f, 0, m)
    loss, dx, dw, db, dunused = run(m, inputs, "main_grad")
    assert loss == run(m, inputs)[0]
    for got, want in zip((dx, dw, db), expected_net_gradients(*(inputs[k] for k in ("x", "labels", "w", "b")))):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(dunused, np.zeros(2))


def test_original_function_stays_as_it_was() -> None:
    m = parse(NET, "t.gir")
    before = print_module(m)
    run_pipeline(m, "autodiff")
    assert print_module(m).startswith(before)
    assert list(m.funcs) == ["main", "main_grad"]


@pytest.mark.parametrize("wrt", ["b,w", "%b,%w"])
def test_wrt_restricts_the_gradients_and_keeps_argument_order(wrt: str) -> None:
    m = differentiated(NET, f"autodiff{{wrt={wrt}}}")
    g = m["main_grad"]
    assert [t.shape for t in g.result_types] == [(), (3, 5), (5,)]
    inputs = random_inputs(m["main"], 0, m)
    _, dw, db = run(m, inputs, "main_grad")
    _, want_dw, want_db = expected_net_gradients(*(inputs[k] for k in ("x", "labels", "w", "b")))
    np.testing.assert_allclose(dw, want_dw, rtol=1e-10)
    np.testing.assert_allclose(db, want_db, rtol=1e-10)


def test_gradients_are_named_after_their_arguments() -> None:
    text = print_module(differentiated(NET))
    assert "return %loss, %x_grad, %w_grad, %b_grad, %unused_grad" in text
    assert "%unused_grad = graph.constant {value = dense<0.0> : tensor<2xf64>}" in text


def test_grad_module_prints_and_parses_back() -> None:
    text = print_module(differentiated(NET))
    assert print_module(parse(text, "again.gir")) == text


def test_gradient_of_a_loss_that_is_an_argument_is_one() -> None:
    m = differentiated("func @main(%l: tensor<f32>, %x: tensor<3xf32>) -> tensor<f32> {\n  return %l\n}\n")
    loss, dl, dx = run(m, {"l": np.float32(2.5), "x": np.ones(3, np.float32)}, "main_grad")
    assert (loss, dl) == (2.5, 1.0) and dx.tolist() == [0.0, 0.0, 0.0]


def test_values_used_twice_accumulate_their_gradients() -> None:
    text = """
func @main(%x: tensor<3xf64>) -> tensor<f64> {
  %s = graph.mul(%x, %x)
  %e = graph.exp(%x)
  %t = graph.add(%s, %e)
  %l = graph.reduce_sum(%t)
  return %l
}"""
    x = np.array([0.5, -1.0, 2.0])
    _, dx = run(differentiated(text), {"x": x}, "main_grad")
    np.testing.assert_allclose(dx, 2 * x + np.exp(x), rtol=1e-14)


def test_low_precision_losses_get_gradients_of_their_own_dtypes() -> None:
    text = """
func @main(%x: tensor<4xf16>, %w: tensor<4xbf16>) -> tensor<f16> {
  %c = graph.cast(%w) {dtype = f16}
  %p = graph.mul(%x, %c)
  %l = graph.reduce_sum(%p)
  return %l
}"""
    m = differentiated(text)
    assert [str(t) for t in m["main_grad"].result_types] == ["tensor<f16>", "tensor<4xf16>", "tensor<4xbf16>"]
    x, w = np.arange(4, dtype=np.float16), np.ones(4, dtype=np.float32)
    _, dx, dw = run(m, {"x": x, "w": w}, "main_grad")
    assert dx.tolist() == [1.0] * 4 and dw.astype(np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_an_f32_loss_of_16_bit_logits_gives_16_bit_gradients() -> None:
    text = """
func @main(%x: tensor<2x3xf16>, %l: tensor<2xi32>, %a: tensor<3xbf16>, %b: tensor<3xbf16>) -> tensor<f32> {
  %ce = graph.softmax_cross_entropy(%x, %l)
  %mse = graph.mse_loss(%a, %b)
  %s = graph.add(%ce, %mse)
  return %s
}"""
    m = differentiated(text)
    assert [str(t) for t in m["main_grad"].result_types] == [
        "tensor<f32>", "tensor<2x3xf16>", "tensor<3xbf16>", "tensor<3xbf16>"]
    x = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]], np.float16)
    a, b = np.array([1.0, 2.0, 3.0], np.float32), np.array([0.0, 2.0, 5.0], np.float32)
    _, dx, da, db = run(m, {"x": x, "l": np.array([2, 0], np.int32), "a": a, "b": b}, "main_grad")
    p = np.exp(x.astype(np.float64)) / np.exp(x.astype(np.float64)).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(dx.astype(np.float64), (p - np.eye(3)[[2, 0]]) / 2, atol=1e-3)
    assert da.astype(np.float32).tolist() == pytest.approx([2 / 3, 0.0, -4 / 3], rel=1e-2)
    assert db.astype(np.float32).tolist() == pytest.approx([-2 / 3, 0.0, 4 / 3], rel=1e-2)

# --- calls ------------------------------------------------------------------------------------------

LAYERED = """
func @layer(%x: tensor<4x3xf64>, %w: tensor<3x3xf64>) -> tensor<4x3xf64> {
  %h = graph.matmul(%x, %w)
  %y = graph.tanh(%h)
  return %y
}

func @main(%x: tensor<4x3xf64>, %w1: tensor<3x3xf64>, %w2: tensor<3x3xf64>, %t: tensor<4x3xf64>) -> tensor<f64> {
  %a = graph.call(%x, %w1) {callee = @layer} : tensor<4x3xf64>
  %b = graph.call(%a, %w2) {callee = @layer} : tensor<4x3xf64>
  %l = graph.mse_loss(%b, %t)
  return %l
}
"""


def test_calls_are_differentiated_through_their_callees() -> None:
    m = differentiated(LAYERED)
    g = m["main_grad"]
    assert not any(op.name == "graph.call" for op in g.ops)
    inputs = random_inputs(m["main"], 0, m)
    _, dx, dw1, dw2, dt = run(m, inputs, "main_grad")
    x, w1, w2, t = (inputs[k] for k in ("x", "w1", "w2", "t"))
    a = np.tanh(x @ w1)
    b = np.tanh(a @ w2)
    db = 2 * (b - t) / b.size
    dh2 = db * (1 - b * b)
    dh1 = dh2 @ w2.T * (1 - a * a)
    for got, want in ((dx, dh1 @ w1.T), (dw1, x.T @ dh1), (dw2, a.T @ dh2), (dt, -db)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)


def test_fused_kernels_are_differentiated_like_the_ops_they_hold() -> None:
    plain = parse_file(TRAIN_MLP)
    fused = parse_file(TRAIN_MLP)
    run_pipeline(plain, "autodiff")
    run_pipeline(fused, "fuse,autodiff")
    assert any(f.attrs.get("kernel") for f in fused)
    inputs = random_inputs(plain["main"], 0, plain)
    for a, b in zip(run(plain, inputs, "main_grad"), run(fused, inputs, "main_grad")):
        np.testing.assert_array_equal(a, b)


def test_inlined_calls_keep_the_callers_names() -> None:
    m = parse(LAYERED, "t.gir")
    f = m["main"]
    assert inline_calls(m, f) == 2
    assert [op.results[0].name for op in f.ops] == ["h", "a", "h", "b", "l"]


# --- diagnostics ------------------------------------------------------------------------------------


def autodiff_error(text: str, pipeline: str = "autodiff") -> GCError:
    with pytest.raises(InputError) as e:
        differentiated(text, pipeline)
    return e.value


def test_non_scalar_result_is_an_error_at_the_return() -> None:
    text = "func @main(%x: tensor<3xf32>) -> tensor<3xf32> {\n  %y = graph.exp(%x)\n  return %y\n}\n"
    e = autodiff_error(text)
    assert e.message.startswith("autodiff: @main returns tensor<3xf32>; it needs a floating-point scalar loss")
    assert str(e.diagnostics[0].loc) == "t.gir:3:3"


def test_several_results_and_integer_losses_are_errors() -> None:
    two = "func @main(%x: tensor<f32>) -> (tensor<f32>, tensor<f32>) {\n  return %x, %x\n}\n"
    assert autodiff_error(two).message == "autodiff: @main returns 2 values; it needs one scalar loss"
    ints = "func @main(%x: tensor<i32>) -> tensor<i32> {\n  return %x\n}\n"
    assert "returns tensor<i32>; it needs a floating-point scalar loss" in autodiff_error(ints).message


def test_unknown_wrt_argument_is_an_error() -> None:
    assert autodiff_error(NET, "autodiff{wrt=w,v}").message == (
        "autodiff: @main has no argument %v (arguments: %x, %labels, %w, %b, %unused)"
    )


def test_integer_wrt_argument_is_skipped_with_a_note(capsys: pytest.CaptureFixture) -> None:
    m = differentiated(NET, "autodiff{wrt=labels,b}")
    assert [t.shape for t in m["main_grad"].result_types] == [(), (5,)]
    assert "autodiff: %labels is tensor<4xi32>: integer arguments have no gradient (skipped)" in capsys.readouterr().err


def test_unknown_function_and_existing_grad_are_errors() -> None:
    assert autodiff_error(NET, "autodiff{func=loss}").message == "autodiff: no function @loss (functions: @main)"
    twice = autodiff_error(NET, "autodiff,autodiff{func=main}")
    assert twice.message.startswith("autodiff: @main_grad already exists")


class Mystery(Op, name="test.mystery"):
    """An op of this test with no gradient rule:  %y = test.mystery(%x) : tensor<3xf32>"""

    x = operand()

    def infer(self, x: TensorType) -> TensorType:
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x


MYSTERY = """func @main(%x: tensor<3xf32>) -> tensor<f32> {
  %y = test.mystery(%x)
  %l = graph.reduce_sum(%y)
  return %l
}
"""


def test_op_without_a_rule_is_named_with_its_location() -> None:
    e = autodiff_error(MYSTERY)
    assert e.message == "test.mystery has no gradient rule: autodiff cannot differentiate through it"
    assert str(e.diagnostics[0].loc) == "t.gir:2:8"


def test_op_without_a_rule_off_the_differentiated_path_is_fine() -> None:
    m = differentiated(MYSTERY.replace("%l = graph.reduce_sum(%y)", "%l = graph.reduce_sum(%x)"))
    assert run(m, {"x": np.ones(3, np.float32)}, "main_grad")[1].tolist() == [1.0, 1.0, 1.0]


def test_gc_opt_autodiff_prints_the_grad_function() -> None:
    r = gc("opt", "examples/train_mlp.gir", "-p", "autodiff")
    assert r.returncode == 0, r.stderr
    assert "func @main_grad(" in r.stdout
    assert "return %loss, %x_grad, %w1_grad, %b1_grad, %w2_grad, %b2_grad, %w3_grad, %b3_grad" in r.stdout


def test_gc_opt_autodiff_of_a_non_scalar_function_is_a_user_error() -> None:
    r = gc("opt", "examples/mlp.gir", "-p", "autodiff")
    assert r.returncode == 1
    assert "examples/mlp.gir" in r.stderr and "error: autodiff: @main returns tensor<64x10xf32>" in r.stderr
    assert "internal" not in r.stderr


# --- which functions, statistics ---------------------------------------------------------------------


def test_without_main_every_uncalled_function_is_differentiated() -> None:
    m = differentiated(LAYERED.replace("@main", "@loss"))
    assert list(m.funcs) == ["layer", "loss", "loss_grad"]
    with pytest.raises(InputError, match="@loss_grad already exists"):
        run_pipeline(m, "autodiff")  # the gradient is not taken for a loss of its own


def test_func_option_picks_the_function() -> None:
    text = NET + "\nfunc @other(%y: tensor<2xf32>) -> tensor<f32> {\n  %s = graph.reduce_sum(%y)\n  return %s\n}\n"
    m = differentiated(text, "autodiff{func=other}")
    assert list(m.funcs) == ["main", "other", "other_grad"]


def test_statistics_count_functions_and_gradients() -> None:
    m = parse(NET, "t.gir")
    (p,) = parse_pipeline("autodiff")
    run_pipeline(m, [p])
    assert dict(p.stats) == {"functions": 1, "gradients": 4}


# --- the backward pass is ordinary GIR ---------------------------------------------------------------


def test_optimizing_passes_keep_the_gradients() -> None:
    m = parse_file(TRAIN_MLP)
    run_pipeline(m, "autodiff")
    inputs = random_inputs(m["main"], 0, m)
    before = run(m, inputs, "main_grad")
    n = len(m["main_grad"].ops)
    run_pipeline(m, "canonicalize,cse,dce,fuse")
    assert len(m["main_grad"].ops) < n
    for a, b in zip(before, run(m, inputs, "main_grad")):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_backward_reads_forward_values_rather_than_recomputing_them() -> None:
    m = differentiated(NET)
    g = m["main_grad"]
    (tanh,) = [op for op in g.ops if op.name == "graph.tanh"]
    readers = [op.name for op in g.ops if tanh.result in op.operands]
    assert "graph.softmax_cross_entropy" in readers and len(readers) > 1  # the backward uses tanh's result


# --- the core, for passes that build on it ------------------------------------------------------------


def test_build_grad_returns_the_function_without_adding_it() -> None:
    m = parse(NET, "t.gir")
    g = build_grad(m, m["main"], ["w"])
    assert g.name == "main_grad" and "main_grad" not in m
    assert [t.shape for t in g.result_types] == [(), (3, 5)]


def test_append_backward_adds_gradients_of_any_scalar_to_a_function() -> None:
    m = parse(NET, "t.gir")
    f = m["main"]
    loss, w = f.results[0], f.args[2]
    twice = Builder(f).add(loss, loss)
    (dw,) = append_backward(f, twice, [w])
    f.results, f.result_types = [twice, dw], [twice.type, dw.type]
    inputs = random_inputs(f, 0, m)
    _, got = run(m, inputs)
    _, want, _ = expected_net_gradients(*(inputs[k] for k in ("x", "labels", "w", "b")))
    np.testing.assert_allclose(got, 2 * want, rtol=1e-10)


def test_pass_is_registered_with_its_options() -> None:
    (p,) = parse_pipeline("autodiff{func=main,wrt=w1,b1}")
    assert isinstance(p, Autodiff) and p.func == "main" and p.wrt == ("w1", "b1")
    assert p.spelled() == "autodiff{func=main,wrt=w1,b1}"


def test_default_target_is_the_uncalled_function_that_returns_a_loss() -> None:
    """@main returns logits; @loss calls it and returns the scalar: autodiff differentiates @loss."""
    src = """func @main(%x: tensor<4x3xf64>, %w: tensor<3x2xf64>) -> tensor<4x2xf64> {
  %y = graph.matmul(%x, %w) : tensor<4x2xf64>
  return %y
}
func @loss(%x: tensor<4x3xf64>, %w: tensor<3x2xf64>, %t: tensor<4x2xf64>) -> tensor<f64> {
  %y = graph.call(%x, %w) {callee = @main} : tensor<4x2xf64>
  %l = graph.mse_loss(%y, %t) : tensor<f64>
  return %l
}
"""
    from compiler.parser import parse
    from compiler.pipeline import run_pipeline

    m = parse(src, "loss.gir")
    run_pipeline(m, "autodiff")
    assert list(m.funcs) == ["main", "loss", "loss_grad"]
    assert [str(t) for t in m["loss_grad"].result_types] == ["tensor<f64>", "tensor<4x3xf64>", "tensor<3x2xf64>",
                                                             "tensor<4x2xf64>"]
