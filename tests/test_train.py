"""Training: the make-train-step pass (its contract, the update it computes, compiled vs interpreted),
the pieces of `gc train` (weights, synthetic data, the loop) and the command end to end."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

import compiler
from compiler.cli import main as gc_main
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.parser import parse, parse_file
from compiler.passes import InputError
from compiler.passes.make_train_step import data_args
from compiler.pipeline import run_pipeline
from compiler.training import Progress, init_params, prepare, step_function, synthetic_data, train

TRAIN_MLP = ROOT / "examples" / "train_mlp.gir"

# A small classifier: data %x, labels, two layers (f64 so that the update checks are exact).
NET = """
func @main(%x: tensor<8x6xf64>, %labels: tensor<8xi32>, %w1: tensor<6x16xf64>, %b1: tensor<16xf64>,
           %w2: tensor<16x4xf64>, %b2: tensor<4xf64>) -> tensor<f64> {
  %h = graph.matmul(%x, %w1)
  %z = graph.add(%h, %b1)
  %a = graph.relu(%z)
  %o = graph.matmul(%a, %w2)
  %logits = graph.add(%o, %b2)
  %loss = graph.softmax_cross_entropy(%logits, %labels)
  return %loss
}
"""
NET_F32 = NET.replace("f64", "f32")
WEIGHTS = ["w1", "b1", "w2", "b2"]

REGRESSION = """
func @main(%x: tensor<16x5xf32>, %w: tensor<5x8xf32>, %b: tensor<8xf32>, %v: tensor<8x3xf32>,
           %y: tensor<16x3xf32>) -> tensor<f32> {
  %h = graph.matmul(%x, %w)
  %z = graph.add(%h, %b)
  %a = graph.tanh(%z)
  %p = graph.matmul(%a, %v)
  %l = graph.mse_loss(%p, %y)
  return %l
}
"""


def stepped(text: str, pipeline: str = "make-train-step"):
    module = parse(text, "t.gir")
    run_pipeline(module, pipeline)
    return module


# --- the pass ---------------------------------------------------------------------------------------


def test_step_takes_the_same_arguments_and_returns_loss_then_new_weights_in_argument_order() -> None:
    m = stepped(NET)
    f, step = m["main"], m["train_step"]
    assert [(a.name, a.type) for a in step.args] == [(a.name, a.type) for a in f.args]
    assert step.result_types == [f.result_types[0], *(a.type for a in f.args[2:])]
    assert [v.name for v in step.results] == ["loss", *(f"{n}_new" for n in WEIGHTS)]


def test_update_is_w_minus_lr_times_the_gradient() -> None:
    m = stepped(NET, f"make-train-step{{lr=0.25}},autodiff{{wrt={','.join(WEIGHTS)}}}")
    inputs = random_inputs(m["main"], 3, m)
    loss, *new = run(m, inputs, entry="train_step")
    ref_loss, *grads = run(m, inputs, entry="main_grad")
    assert loss == ref_loss
    for name, w_new, g in zip(WEIGHTS, new, grads):
        np.testing.assert_array_equal(w_new, inputs[name] - 0.25 * g)


def test_update_matches_numpy_gradients_of_the_classifier() -> None:
    m = stepped(NET)
    inputs = random_inputs(m["main"], 1, m)
    x, y, w1, b1, w2, b2 = (inputs[k] for k in ("x", "labels", *WEIGHTS))
    z = x @ w1 + b1
    a = np.maximum(z, 0)
    logits = a @ w2 + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(8), y]).mean()
    dlogits = p.copy()
    dlogits[np.arange(8), y] -= 1
    dlogits /= 8
    dz = (dlogits @ w2.T) * (z > 0)
    expected = [w1 - 0.1 * x.T @ dz, b1 - 0.1 * dz.sum(0), w2 - 0.1 * a.T @ dlogits, b2 - 0.1 * dlogits.sum(0)]
    got = run(m, inputs, entry="train_step")
    np.testing.assert_allclose(got[0], loss, rtol=1e-12)
    for g, e in zip(got[1:], expected):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_params_option_trains_only_the_named_arguments() -> None:
    step = stepped(NET, "make-train-step{params=b2,w1}")["train_step"]
    assert [v.name for v in step.results] == ["loss", "w1_new", "b2_new"]


def test_default_data_is_the_first_argument_and_the_targets_the_loss_reads() -> None:
    m = stepped(REGRESSION)
    assert data_args(m["main"]) == ["x", "y"]
    assert [v.name for v in m["train_step"].results] == ["l", "w_new", "b_new", "v_new"]


def test_power_of_two_loss_scale_gives_the_same_step() -> None:
    plain = stepped(NET_F32)
    scaled = stepped(NET_F32, "make-train-step{loss-scale=65536}")
    inputs = random_inputs(plain["main"], 2, plain)
    for a, b in zip(run(plain, inputs, entry="train_step"), run(scaled, inputs, entry="train_step")):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_step_of_another_function_is_named_after_it() -> None:
    m = stepped(NET.replace("@main", "@net"), "make-train-step{func=net}")
    assert list(m.funcs) == ["net", "net_train_step"]


@pytest.mark.parametrize(
    "pipeline, message",
    [
        ("make-train-step{func=nope}", "no function @nope (functions: @main)"),
        ("make-train-step{params=wx}", "@main has no argument %wx"),
        ("make-train-step{params=labels}", "%labels is tensor<8xi32>: only floating-point arguments can be trained"),
        ("make-train-step{loss-scale=0}", "loss-scale must be a positive number, got 0.0"),
        ("make-train-step,make-train-step", "@train_step already exists"),
    ],
)
def test_pass_diagnostics(pipeline: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stepped(NET, pipeline)


def test_function_without_scalar_loss_is_a_diagnostic() -> None:
    with pytest.raises(InputError, match=r"returns tensor<64x10xf32>; it needs a floating-point scalar loss"):
        run_pipeline(parse_file(ROOT / "examples" / "mlp.gir"), "make-train-step")


def test_function_with_only_data_has_nothing_to_train() -> None:
    text = "func @main(%x: tensor<3xf32>) -> tensor<f32> {\n  %l = graph.reduce_sum(%x)\n  return %l\n}\n"
    with pytest.raises(InputError, match=r"no floating-point argument besides its data \(%x\) to train"):
        stepped(text)


def test_compiled_train_step_matches_the_interpreter() -> None:
    m = stepped(NET_F32)
    inputs = random_inputs(m["main"], 4, m)
    model = compiler.compile(m, "llvm", entry="train_step")
    for got, want in zip(model(**inputs), run(m, inputs, entry="train_step")):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


# --- the pieces of gc train --------------------------------------------------------------------------


def test_initial_weights_are_he_normal_with_zero_biases_and_unit_norm_scales() -> None:
    text = """func @main(%x: tensor<64x512xf32>, %w: tensor<512x256xf32>, %b: tensor<256xf32>,
                        %g: tensor<256xf32>, %c: tensor<256xf32>) -> tensor<f32> {
      %h = graph.matmul(%x, %w)
      %z = graph.add(%h, %b)
      %n = graph.layer_norm(%z, %g, %c)
      %l = graph.reduce_mean(%n)
      return %l
    }"""
    f = parse(text, "t.gir")["main"]
    w = init_params(f, ["w", "b", "g", "c"], 0)
    assert abs(w["w"].std() - np.sqrt(2 / 512)) < 0.002 and abs(w["w"].mean()) < 0.002
    assert w["w"].dtype == np.float32
    np.testing.assert_array_equal(w["b"], 0)
    np.testing.assert_array_equal(w["g"], 1)
    np.testing.assert_array_equal(w["c"], 0)


def test_classification_data_is_a_cluster_per_class() -> None:
    task = prepare(parse(NET_F32, "t.gir"))
    data, about = synthetic_data(task, 4000, seed=0)
    x, y = data["x"], data["labels"]
    assert x.shape == (4000, 6) and y.shape == (4000,) and y.dtype == np.int32
    assert set(np.unique(y)) == {0, 1, 2, 3}
    means = np.stack([x[y == c].mean(0) for c in range(4)])
    # Each class sits around its own prototype: nearest class mean recovers most labels.
    nearest = np.argmin(((x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (nearest == y).mean() > 0.6  # chance: 0.25
    assert "4 classes" in about


def test_regression_targets_are_a_teachers_outputs_the_net_can_fit_exactly() -> None:
    task = prepare(parse(REGRESSION, "t.gir"))
    data, about = synthetic_data(task, 32, seed=5)
    teacher = init_params(task.module["main"], task.params, 5 + 7919)
    batch = {k: v[:16] for k, v in data.items()}
    (loss,) = run(task.module, {**batch, **teacher}, entry="main")
    assert loss == 0.0
    assert "other random weights" in about


def test_batch_size_retypes_the_data_and_the_step() -> None:
    task = prepare(parse(NET, "t.gir"), batch_size=3)
    step = task.module[task.step]
    assert [a.type.shape for a in step.args[:2]] == [(3, 6), (3,)]
    assert task.batch == 3


def test_batch_size_spelled_in_a_reshape_is_a_diagnostic() -> None:
    text = """func @main(%x: tensor<4x6xf32>, %w: tensor<6x2xf32>) -> tensor<f32> {
      %r = graph.reshape(%x) {shape = [4, 6]}
      %h = graph.matmul(%r, %w)
      %l = graph.reduce_mean(%h)
      return %l
    }"""
    with pytest.raises(GCError, match="cannot train @main at batch size 2"):
        prepare(parse(text, "t.gir"), batch_size=2)


def test_compiled_training_follows_the_interpreted_one_step_for_step() -> None:
    task = prepare(parse(NET_F32, "t.gir"), lr=0.5)
    f = task.module["main"]
    weights = init_params(f, task.params, 0)
    data, _ = synthetic_data(task, 32, 0)
    ref_losses, ref = train(task, step_function(task, "interp"), weights, data, 6, seed=0)
    losses, got = train(task, step_function(task, "llvm"), weights, data, 6, seed=0)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    for k in task.params:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-5)
    assert ref_losses[-1] < ref_losses[0]


def test_progress_without_a_terminal_prints_a_line_every_tenth(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the plain line, whether or not tqdm is installed
    out = io.StringIO()
    p = Progress(20, out)
    for s in range(1, 21):
        p(s, 1.0 / s)
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("train [") and "step 20/20  loss 0.05" in lines[-1]


def test_train_mlp_loss_falls_below_a_tenth_of_its_start() -> None:
    task = prepare(parse_file(TRAIN_MLP))
    weights = init_params(task.module["main"], task.params, 0)
    data, _ = synthetic_data(task, 1024, 0)
    losses, trained = train(task, step_function(task, "llvm"), weights, data, 60, seed=0)
    assert losses[-1] < 0.1 * losses[0]
    assert sorted(trained) == sorted(task.params)


# --- the command --------------------------------------------------------------------------------------


@pytest.fixture
def net(tmp_path: Path) -> Path:
    p = tmp_path / "net.gir"
    p.write_text(NET_F32)
    return p


def test_gc_train_end_to_end_writes_weights_keyed_by_argument_name(net: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.npz"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "compiler",
            "train",
            str(net),
            "--steps",
            "30",
            "--target",
            "interp",
            "--lr",
            "0.5",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    first, last = (float(line.split()[2]) for line in r.stdout.splitlines()[:2])
    assert r.stdout.startswith("first loss ") and last < first
    assert "30/30" in r.stderr  # the progress line (or tqdm's bar)
    with np.load(out) as z:
        assert sorted(z.files) == sorted(WEIGHTS) and z["w1"].shape == (6, 16)


def test_gc_train_starts_from_given_params(net: Path, tmp_path: Path, capsys) -> None:
    args = [str(net), "--steps", "20", "--target", "interp", "--lr", "0.5"]
    assert gc_main(["train", *args, "-o", str(tmp_path / "a.npz")]) == 0
    first_run = capsys.readouterr().out
    assert gc_main(["train", *args, "--params", str(tmp_path / "a.npz"), "-o", str(tmp_path / "b.npz")]) == 0
    second_run = capsys.readouterr().out
    assert float(second_run.split()[2]) < float(first_run.split()[2])  # "first loss X"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--params", "bad.npz"], "cannot read bad.npz: not an .npz file"),
        (["--params", "nan.npz"], "nan.npz: %w1 holds NaN or infinity"),
        (["--examples", "0"], "--examples must be at least 1, got 0"),
        (["--params", "data.npz"], "%x is data, not a trained weight"),
        (["--params", "shape.npz"], "%w1 is [2] float32, @main takes tensor<6x16xf32>"),
        (["--train", "nope"], "@main has no argument %nope"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--entry", "other"], "no function @other"),
    ],
)
def test_gc_train_diagnostics(net: Path, tmp_path: Path, capsys, monkeypatch, extra: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.npz").write_text("not an npz")
    np.savez(tmp_path / "data.npz", x=np.zeros((8, 6), np.float32))
    np.savez(tmp_path / "shape.npz", w1=np.zeros(2, np.float32))
    np.savez(tmp_path / "nan.npz", w1=np.full((6, 16), np.nan, np.float32))
    assert gc_main(["train", str(net), "--target", "interp", "--steps", "2", *extra]) == 1
    assert message in capsys.readouterr().err


def test_gc_train_of_a_function_without_loss_or_a_missing_file_exits_1(tmp_path: Path, capsys) -> None:
    assert gc_main(["train", str(ROOT / "examples" / "mlp.gir"), "--steps", "2"]) == 1
    assert "it needs a floating-point scalar loss" in capsys.readouterr().err
    assert gc_main(["train", str(tmp_path / "missing.gir"), "--steps", "2"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_f16_training_step_with_a_loss_scale_stays_close_to_f32_and_trains() -> None:
    """Mixed precision on the training step: matmuls (forward and gradient) in f16, the loss and the
    master weights f32; a static loss scale keeps small gradients above f16's underflow."""
    src = (ROOT / "examples" / "train_mlp.gir").read_text()
    f32 = parse(src, "train_mlp.gir")
    run_pipeline(f32, "make-train-step{lr=0.1}")
    f16 = parse(src, "train_mlp.gir")
    run_pipeline(f16, "make-train-step{lr=0.1,loss-scale=1024},mixed-precision{dtype=f16},canonicalize")
    step = f16["train_step"]
    low = [op for op in step.ops if op.name == "graph.matmul" and str(op.result.type.dtype) == "f16"]
    assert len(low) >= 5  # three forward matmuls and the gradients' (the input gets none)
    assert [str(v.type.dtype) for v in step.results] == ["f32"] * len(step.results)
    inputs = random_inputs(f32["main"], 0, f32)
    want = run(f32, inputs, entry="train_step")
    got = compiler.compile(f16, "llvm", entry="train_step")(**inputs)
    assert abs(float(got[0]) - float(want[0])) < 1e-2 * abs(float(want[0]))
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=0, atol=5e-3 * float(np.abs(w).max()) + 1e-4)  # f16 gradients, times lr
