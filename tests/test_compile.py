"""compiler.compile and `gc compile`: the artifact, its API, binding weights, stats and emitted stages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from helpers import gc

import compiler
from compiler.diagnostics import GCError
from compiler.interpreter import run
from compiler.ir import DType
from compiler.parser import parse

NET = """func @main(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %b: tensor<16xf32>) -> tensor<4x16xf32> {
  %h = graph.matmul(%x, %w)
  %z = graph.add(%h, %b)
  %y = graph.relu(%z)
  return %y
}
"""
RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 8)).astype(np.float32)
W = RNG.standard_normal((8, 16)).astype(np.float32)
B = RNG.standard_normal(16).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    return compiler.compile(NET, "llvm")


def test_compiled_model_matches_the_interpreter(model) -> None:
    (want,) = run(parse(NET), [X, W, B])
    np.testing.assert_allclose(model(X, W, B)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model(x=X, w=W, b=B)[0], want, rtol=1e-5, atol=1e-6)


def test_fusion_makes_one_kernel(model) -> None:
    assert model.num_kernels == 1


def test_misaligned_and_strided_inputs_are_fine(model) -> None:
    buf = np.zeros(4 * 8 + 1, np.float32)[1:].reshape(4, 8)  # 4 bytes off any 64-byte boundary
    buf[...] = X
    wt = np.asfortranarray(W)
    np.testing.assert_allclose(model(buf, wt, B)[0], model(X, W, B)[0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m(X, W), "the model takes 3 input(s) (x, w, b), got 2"),
        (lambda m: m(x=X, w=W), "missing input 'b'"),
        (lambda m: m(x=X, w=W, b=B, z=B), "unknown input 'z'"),
        (lambda m: m(X.T, W, B), "input 'x' has shape [8, 4], expected [4, 8]"),
    ],
)
def test_bad_calls_are_clear_errors(model, call, message: str) -> None:
    with pytest.raises(GCError, match=re.escape(message)):
        call(model)


def test_save_and_load(model, tmp_path: Path) -> None:
    path = tmp_path / "net.gcpkg"
    model.save(path)
    again = compiler.load(path)
    np.testing.assert_array_equal(again(X, W, B)[0], model(X, W, B)[0])


def test_bound_params_become_constants_the_artifact_carries(tmp_path: Path) -> None:
    m = compiler.compile(NET, "llvm", params={"w": W, "b": B})
    assert m.arg_names == ["x"]
    np.testing.assert_allclose(m(X)[0], np.maximum(X @ W + B, 0), rtol=1e-5, atol=1e-6)
    m.save(tmp_path / "bound.gcpkg")
    np.testing.assert_allclose(compiler.load(tmp_path / "bound.gcpkg")(X)[0], m(X)[0])


def test_bound_bf16_params_survive_save_and_load(tmp_path: Path) -> None:
    """An .npz keeps bf16 as raw 2-byte voids; the artifact's constants come back as bf16."""
    bf16 = np.dtype(DType.bf16.np)
    text = NET.replace("f32", "bf16")
    w, b = W.astype(bf16), B.astype(bf16)
    m = compiler.compile(text, "llvm", params={"w": w, "b": b})
    m.save(tmp_path / "bf16.gcpkg")
    again = compiler.load(tmp_path / "bf16.gcpkg")
    got = again(X.astype(bf16))[0]
    assert got.dtype == bf16
    np.testing.assert_array_equal(got.astype(np.float32), m(X.astype(bf16))[0].astype(np.float32))


def test_unknown_param_is_an_error() -> None:
    with pytest.raises(GCError, match="has no argument %nope"):
        compiler.compile(NET, "llvm", params={"nope": W})


def test_gc_compile_writes_artifact_and_stats(tmp_path: Path) -> None:
    src = tmp_path / "net.gir"
    src.write_text(NET)
    r = gc("compile", str(src), "--target", "llvm", "-o", str(tmp_path / "net.gcpkg"), "--stats", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    stats = json.loads((tmp_path / "s.json").read_text())
    for key in ("arena_bytes", "naive_bytes", "lower_bound_bytes", "num_kernels", "compile_seconds"):
        assert key in stats
    # One fused kernel writes the result, which the caller owns: no intermediate is left for the arena.
    assert stats["num_kernels"] == 1 and stats["naive_bytes"] == stats["arena_bytes"] == 0
    a = gc("run", str(tmp_path / "net.gcpkg"), "--random-inputs", "0")
    b = gc("run", str(src), "--random-inputs", "0")
    assert a.returncode == 0 and a.stdout.split("[")[0] == b.stdout.split("[")[0]


def test_gc_run_target_llvm_matches_interp(tmp_path: Path) -> None:
    src = tmp_path / "net.gir"
    src.write_text(NET)
    np.savez(tmp_path / "in.npz", x=X, w=W, b=B)
    for target, out in (("llvm", "a.npz"), ("interp", "b.npz")):
        r = gc("run", str(src), "--target", target, "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / out))
        assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "a.npz")["result0"], np.load(tmp_path / "b.npz")["result0"], rtol=1e-5)


@pytest.mark.parametrize("stage, needle", [("tir", "@T.prim_func"), ("llvm", "define"), ("asm", ".text"), ("gir", "graph.call")])
def test_emit_each_stage(tmp_path: Path, stage: str, needle: str) -> None:
    src = tmp_path / "net.gir"
    src.write_text(NET)
    r = gc("compile", str(src), "--emit", stage)
    assert r.returncode == 0, r.stderr
    assert needle in r.stdout


def test_emit_cuda_needs_the_cuda_target(tmp_path: Path) -> None:
    src = tmp_path / "net.gir"
    src.write_text(NET)
    assert gc("compile", str(src), "--emit", "cuda").returncode == 1


def test_not_an_artifact_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "x.gcpkg"
    p.write_bytes(b"PK\x03\x04garbage")
    r = gc("run", str(p), "--random-inputs", "0")
    assert r.returncode == 1 and f"cannot load {p}: not a readable zip file" in r.stderr


def test_transposed_bound_weight_is_folded_once_at_compile_time() -> None:
    text = """func @main(%x: tensor<4x1024xf32>, %w: tensor<1024x1024xf32>) -> tensor<4x1024xf32> {
  %t = graph.transpose(%w)
  %y = graph.matmul(%x, %t)
  return %y
}
"""
    w = RNG.standard_normal((1024, 1024)).astype(np.float32)
    x = RNG.standard_normal((4, 1024)).astype(np.float32)
    m = compiler.compile(text, "llvm", params={"w": w})
    assert m.num_kernels == 1 and [c.kernel for c in m.plan.steps] == ["matmul"]
    np.testing.assert_allclose(m(x)[0], x @ w.T, rtol=1e-4, atol=1e-4)


def test_transposed_argument_weight_is_read_in_place_by_the_matmul() -> None:
    text = """func @main(%x: tensor<8x96xf32>, %w: tensor<40x96xf32>, %b: tensor<40xf32>) -> tensor<8x40xf32> {
  %t = graph.transpose(%w) {perm = [1, 0]}
  %y = graph.matmul(%x, %t)
  %z = graph.add(%y, %b)
  return %z
}
"""
    m = compiler.compile(text, "llvm")
    assert [c.kernel for c in m.plan.steps] == ["fused_transpose_matmul_add"]
    w = RNG.standard_normal((40, 96)).astype(np.float32)
    x = RNG.standard_normal((8, 96)).astype(np.float32)
    b = RNG.standard_normal(40).astype(np.float32)
    np.testing.assert_allclose(m(x, w, b)[0], x @ w.T + b, rtol=1e-4, atol=1e-4)


def test_bound_matmul_weights_are_packed_once_at_compile_time(tmp_path: Path) -> None:
    from compiler.codegen.cpu_rules.common import lanes
    from compiler.inputs import random_inputs
    from compiler.parser import parse_file

    path = ROOT / "examples" / "mlp.gir"
    inputs = random_inputs(parse_file(path)["main"], 0)
    (want,) = run(parse_file(path), inputs)
    weights = {k: v for k, v in inputs.items() if k != "x"}
    m = compiler.compile(str(path), "llvm", params=weights)
    ni = 2 * lanes("float32")  # panels of two vectors of columns: 16 with AVX2, 32 with AVX-512
    assert (1024 // ni, 784, ni) in [c.shape for c in m.consts.values()]  # w1 packed into panels
    np.testing.assert_allclose(m(inputs["x"])[0], want, rtol=1e-4, atol=1e-4)
    m.save(tmp_path / "mlp.gcpkg")
    np.testing.assert_allclose(compiler.load(tmp_path / "mlp.gcpkg")(inputs["x"])[0], want, rtol=1e-4, atol=1e-4)


def test_integer_inputs_that_do_not_fit_the_argument_are_errors_not_wrapped() -> None:
    """i64 data for an i32 argument is narrowed, but 2**40 would wrap to 0: an error, in both runners."""
    text = "func @main(%n: tensor<2xi32>) -> tensor<2xi32> {\n  %y = graph.neg(%n)\n  return %y\n}\n"
    m = compiler.compile(text, "llvm")
    assert m(np.array([-5, 1]))[0].tolist() == [5, -1]
    assert run(parse(text), [np.array([-5, 1])])[0].tolist() == [5, -1]
    for call in (lambda: m(np.array([2**40, 1])), lambda: run(parse(text), [np.array([2**40, 1])])):
        with pytest.raises(GCError, match="input 'n' holds 1099511627776, which int32 cannot represent"):
            call()


# The middle two convs read and write alike (a zero-bordered input whole, a bordered output whose border
# they write); the first reads the argument, the last writes a tensor without a border.
TWINS = """func @main(%x: tensor<1x16x12x12xf32>, %w0: tensor<16x16x3x3xf32>, %w1: tensor<16x16x3x3xf32>,
           %w2: tensor<16x16x3x3xf32>, %w4: tensor<16x16x3x3xf32>, %w3: tensor<32x16x1x1xf32>)
           -> tensor<1x32x12x12xf32> {
  %a0 = graph.conv2d(%x, %w0) {padding = [1, 1, 1, 1]} : tensor<1x16x12x12xf32>
  %b0 = graph.relu(%a0) : tensor<1x16x12x12xf32>
  %a = graph.conv2d(%b0, %w1) {padding = [1, 1, 1, 1]} : tensor<1x16x12x12xf32>
  %b = graph.relu(%a) : tensor<1x16x12x12xf32>
  %c = graph.conv2d(%b, %w2) {padding = [1, 1, 1, 1]} : tensor<1x16x12x12xf32>
  %d = graph.relu(%c) : tensor<1x16x12x12xf32>
  %f = graph.conv2d(%d, %w4) {padding = [1, 1, 1, 1]} : tensor<1x16x12x12xf32>
  %g = graph.relu(%f) : tensor<1x16x12x12xf32>
  %e = graph.conv2d(%g, %w3) : tensor<1x32x12x12xf32>
  return %e
}
"""


@pytest.mark.parametrize("bound", [False, True])
def test_repeated_kernels_are_built_once_and_run_on_their_own_weights(bound: bool) -> None:
    """Two convs of the same shapes and the same layouts of their tensors (a repeated block) share one
    compiled function; each call still reads its own weights, bound at compile time or passed per call; a
    conv of other shapes gets its own. (The first conv reads the NCHW argument, the twins a tensor between
    kernels, which may be stored channel-blocked: codegen/layout.py.)"""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    ws = {f"w{i}": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2 for i in (0, 1, 2, 4)}
    ws["w3"] = rng.standard_normal((32, 16, 1, 1)).astype(np.float32) * 0.2
    model = compiler.compile(TWINS, "llvm", params=ws if bound else None)
    symbols = [c.kernel for c in model.plan.steps if c.kernel]
    assert len(symbols) == 5 and symbols[1] == symbols[2] and symbols[4] not in symbols[:4]
    assert len(model.scheduled.functions) == len(set(symbols))
    got = model(x)[0] if bound else model(x, *ws.values())[0]
    want = run(parse(TWINS), {"x": x, **ws})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_library_built_in_parts_on_every_core_runs_saves_and_prints(monkeypatch, tmp_path) -> None:
    """From PARALLEL_FUNCTIONS kernels on, the functions compile in a group per core (threads), linked
    into one shared library: the model runs, saves the library as built, loads back, and --emit asm
    prints every part."""
    from compiler.codegen import build as build_mod
    from compiler.codegen import llvm_pipeline

    monkeypatch.setattr(llvm_pipeline, "PARALLEL_FUNCTIONS", 2)
    monkeypatch.setattr(build_mod, "num_cores", lambda: 2)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    ws = {f"w{i}": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2 for i in (0, 1, 2, 4)}
    ws["w3"] = rng.standard_normal((32, 16, 1, 1)).astype(np.float32) * 0.2
    model = compiler.compile(TWINS, "llvm", params=ws)
    assert model.lib_bytes is not None and len(model.sources) == 2
    want = run(parse(TWINS), {"x": x, **ws})[0]
    np.testing.assert_allclose(model(x)[0], want, rtol=1e-4, atol=1e-4)
    model.save(tmp_path / "m.gcpkg")
    np.testing.assert_allclose(compiler.load(tmp_path / "m.gcpkg")(x)[0], want, rtol=1e-4, atol=1e-4)
    from compiler.cli import _emit

    asm = _emit(model, "asm")
    assert all(s in asm for s in {c.kernel for c in model.plan.steps if c.kernel})


KERNEL_RESULTS = """
func @k(%a: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>) attributes {kernel = true} {
  %r = graph.relu(%a) : tensor<16xf32>
  %n = graph.neg(%a) : tensor<16xf32>
  %e = graph.exp(%a) : tensor<16xf32>
  return %r, %n
}
func @main(%x: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>) {
  %y, %z = graph.call(%x) {callee = @k} : (tensor<16xf32>, tensor<16xf32>)
  return %y, %z
}
"""


def test_a_kernel_function_returns_what_it_returns_not_its_last_op(tmp_path: Path) -> None:
    """A hand-written kernel whose results are neither its last op's nor one result: each result is the
    value `return` names (two results, the last op dead), in this process and after save and load."""
    x = np.linspace(-1, 1, 16).astype(np.float32)
    model = compiler.compile(KERNEL_RESULTS, "llvm", pipeline="", cache=False)
    for m in (model, (model.save(tmp_path / "k.gcpkg"), compiler.load(tmp_path / "k.gcpkg"))[1]):
        relu, neg = m(x)
        np.testing.assert_array_equal(relu, np.maximum(x, 0))
        np.testing.assert_array_equal(neg, -x)
