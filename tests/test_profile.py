"""The per-kernel profile of a compiled model (`CompiledModel.profile`, `gc run --profile`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import gc

import compiler
from compiler.diagnostics import GCError

NET = """func @main(%x: tensor<8x32xf32>, %w: tensor<32x16xf32>, %b: tensor<16xf32>) -> tensor<8x16xf32> {
  %h = graph.matmul(%x, %w) : tensor<8x16xf32>
  %z = graph.add(%h, %b) : tensor<8x16xf32>
  %y = graph.relu(%z) : tensor<8x16xf32>
  %s = graph.softmax(%y) {axis = 1} : tensor<8x16xf32>
  return %s
}
"""
RNG = np.random.default_rng(0)
X, W, B = (RNG.standard_normal(s).astype(np.float32) for s in ((8, 32), (32, 16), (16,)))


@pytest.fixture(scope="module")
def model():
    return compiler.compile(NET, "llvm")


def test_one_row_per_kernel_with_its_ops_cost_and_source_line(model) -> None:
    p = model.profile(X, W, B, repeat=5, warmup=1)
    assert [r.name for r in p.rows] == [c.kernel for c in model.plan.steps]
    mm, soft = p.rows
    assert mm.ops == ["matmul", "add", "relu"] and mm.schedule == "matmul" and mm.loc == "<text>:2"
    # 2 flops per multiply-add, one per element for the bias add and the relu (as `gc stats` counts them).
    assert mm.flops == 2 * 8 * 32 * 16 + 2 * 8 * 16
    assert mm.bytes == 4 * (8 * 32 + 32 * 16 + 16 + 8 * 16)
    assert soft.ops == ["softmax"] and soft.loc == "<text>:5"
    assert all(r.us > 0 for r in p.rows) and p.call_us > 0
    assert p.kernels_us == pytest.approx(sum(r.us for r in p.rows))


def test_profiling_leaves_the_model_correct(model) -> None:
    want = model(X, W, B)[0]
    model.profile(x=X, w=W, b=B, repeat=3, warmup=1)
    np.testing.assert_array_equal(model(X, W, B)[0], want)


def test_render_is_a_table_with_every_kernel(model) -> None:
    text = model.profile(X, W, B, repeat=3, warmup=1).render(sort=True)
    lines = text.splitlines()
    assert lines[0].startswith("profile: 2 steps on llvm, median of 3 runs")
    assert lines[1].split()[:5] == ["#", "kernel", "ops", "schedule", "us"]
    assert sum("fused_matmul_add_relu" in line for line in lines) == 1 and "softmax" in text
    assert lines[-1].startswith("kernels ") and "whole call" in lines[-1]


@pytest.mark.parametrize("in_call", [False, True])
def test_steps_are_timed_alone_or_inside_whole_calls(model, monkeypatch, in_call: bool) -> None:
    """Isolated: each step runs its warmup and repeats back to back (warm caches). In a call: the steps
    run in plan order, `repeat` times over, as a call leaves the caches (like ONNX Runtime's profiler)."""
    order: list[int] = []
    plain = model._plain_calls()

    def logged():
        def wrap(i, fn):
            return lambda *a: (order.append(i), fn(*a))
        return [(wrap(i, fn), idx) for i, (fn, idx) in enumerate(plain)]

    monkeypatch.setattr(model, "_plain_calls", logged)
    p = model.profile(X, W, B, repeat=3, warmup=2, in_call=in_call)
    assert order == ([0, 1] * 3 if in_call else [0] * 5 + [1] * 5)
    assert p.in_call == in_call and all(r.us > 0 for r in p.rows)
    how = "timed inside 3 whole calls" if in_call else "median of 3 runs each"
    assert p.render().splitlines()[0].endswith(f"{how} (microseconds)")


def test_bad_repeat_and_bad_inputs_are_clear_errors(model) -> None:
    with pytest.raises(GCError, match="repeat must be at least 1"):
        model.profile(X, W, B, repeat=0)
    with pytest.raises(GCError, match="input 'x' has shape"):
        model.profile(W, W, B, repeat=1)


def test_copies_of_returned_arguments_are_profiled_too() -> None:
    m = compiler.compile("func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
                         "  %y = graph.relu(%x) : tensor<4xf32>\n  return %x, %y\n}\n", "llvm")
    p = m.profile(np.ones(4, np.float32), repeat=2, warmup=1)
    assert sorted(r.name for r in p.rows) == ["copy", "relu"]
    assert next(r for r in p.rows if r.name == "copy").bytes == 2 * 16


def test_gc_run_profile(tmp_path: Path) -> None:
    src = tmp_path / "net.gir"
    src.write_text(NET)
    r = gc("run", str(src), "--random-inputs", "0", "--profile", "3", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "fused_matmul_add_relu" in r.stdout and "net.gir:2" in r.stdout and "GFLOP/s" in r.stdout
    art = tmp_path / "net.gcpkg"
    assert gc("compile", str(src), "-o", str(art)).returncode == 0
    r = gc("run", str(art), "--random-inputs", "0", "--profile", "2")
    assert r.returncode == 0 and "result0" in r.stdout and "net.gir:5" in r.stdout, r.stderr
    r = gc("run", str(src), "--random-inputs", "0", "--profile", "--target", "interp")
    assert r.returncode == 1 and "--target llvm or cuda" in r.stderr
    r = gc("run", str(src), "--random-inputs", "0", "--profile", "2", "--in-call", "--quiet")
    assert r.returncode == 0 and "timed inside 2 whole calls" in r.stdout, r.stderr
    r = gc("run", str(src), "--random-inputs", "0", "--in-call")
    assert r.returncode == 1 and "give --profile too" in r.stderr
