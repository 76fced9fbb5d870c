"""`gc` as a user drives it: exit codes, diagnostics on stderr, inputs and outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from helpers import gc

import compiler

MLP = """func @main(%x: tensor<2x3xf32>, %w: tensor<3x2xf32>, %b: tensor<2xf32>) -> tensor<2x2xf32> {
  %h = graph.matmul(%x, %w)
  %y = graph.add(%h, %b)
  return %y
}
"""


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    p = tmp_path / "net.gir"
    p.write_text(MLP)
    return p


@pytest.mark.parametrize("target", ["interp", "llvm"])
def test_bf16_inputs_and_outputs_go_through_npz_files(tmp_path: Path, target: str) -> None:
    """NumPy saves bf16 arrays as raw 2-byte voids: gc reads them as bf16 and writes bf16 results as f32."""
    import ml_dtypes

    src = tmp_path / "bf.gir"
    src.write_text(MLP.replace("f32", "bf16"))
    x = np.arange(6).reshape(2, 3).astype(ml_dtypes.bfloat16)
    np.savez(tmp_path / "in.npz", x=x, w=np.ones((3, 2), ml_dtypes.bfloat16), b=np.array([1, -1], ml_dtypes.bfloat16))
    r = gc("run", str(src), "--target", target, "--inputs", str(tmp_path / "in.npz"),
           "--outputs", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")["result0"]
    assert out.dtype == np.float32 and out.tolist() == [[4.0, 2.0], [13.0, 11.0]]


def test_run_with_inputs_writes_outputs(mlp: Path, tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.ones((3, 2), np.float32)
    b = np.array([1, -1], np.float32)
    np.savez(tmp_path / "in.npz", x=x, w=w, b=b)
    r = gc("run", str(mlp), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("result0: tensor<2x2xf32>  min 2  max 13  mean 7.5  [4, 2, 13, 11]")
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(out["result0"], x @ w + b)


def test_random_inputs_are_deterministic(mlp: Path) -> None:
    a, b = gc("run", str(mlp), "--random-inputs", "3"), gc("run", str(mlp), "--random-inputs", "3")
    assert a.returncode == 0 and a.stdout == b.stdout
    assert gc("run", str(mlp), "--random-inputs", "4").stdout != a.stdout


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"x": np.zeros((2, 3)), "w": np.zeros((3, 2))}, "missing input 'b'"),
        ({"x": np.zeros((2, 4)), "w": np.zeros((3, 2)), "b": np.zeros(2)}, "input 'x' has shape [2, 4] but %x is tensor<2x3xf32>"),
        ({"x": np.zeros((2, 3)), "w": np.zeros((3, 2)), "b": np.zeros(2), "z": np.zeros(1)}, "unknown input 'z'"),
    ],
)
def test_bad_inputs_are_named(mlp: Path, tmp_path: Path, inputs: dict, message: str) -> None:
    np.savez(tmp_path / "in.npz", **inputs)
    r = gc("run", str(mlp), "--inputs", str(tmp_path / "in.npz"))
    assert r.returncode == 1
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_input_points_at_the_argument(mlp: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 3)), w=np.zeros((3, 2)))
    r = gc("run", str(mlp), "--inputs", str(tmp_path / "in.npz"))
    assert f"{mlp}:1:54: error: missing input 'b'" in r.stderr


def test_run_without_inputs_says_how(mlp: Path) -> None:
    r = gc("run", str(mlp))
    assert r.returncode == 1 and "--random-inputs" in r.stderr


def test_opt_prints_canonical_module(mlp: Path) -> None:
    r = gc("opt", str(mlp))
    assert r.returncode == 0
    assert "%h = graph.matmul(%x, %w) : tensor<2x2xf32>" in r.stdout


def test_opt_reads_stdin() -> None:
    r = gc("opt", "-", stdin=MLP)
    assert r.returncode == 0 and "graph.add(%h, %b)" in r.stdout


def test_user_error_exits_1_with_diagnostic(tmp_path: Path) -> None:
    p = tmp_path / "bad.gir"
    p.write_text(MLP.replace("%w)", "%q)"))
    r = gc("opt", str(p))
    assert r.returncode == 1
    assert r.stderr.startswith(f"{p}:2:25: error: use of undefined value %q")
    assert "Traceback" not in r.stderr


def test_bad_usage_exits_1_like_any_other_mistake(mlp: Path) -> None:
    for args in [("run",), ("frobnicate",), (), ("opt", str(mlp), "-O3"), ("run", str(mlp), "--target", "tpu"),
                 ("opt", str(mlp), "-O1", "-p", "cse"), ("opt", str(mlp), "-p")]:
        r = gc(*args)
        assert r.returncode == 1 and ("error" in r.stderr if args else "usage: gc" in r.stderr), args
        assert "Traceback" not in r.stderr


def test_unreadable_file_is_a_user_error() -> None:
    r = gc("opt", "no/such/file.gir")
    assert r.returncode == 1 and "cannot read no/such/file.gir" in r.stderr


def test_unknown_entry_lists_functions(mlp: Path) -> None:
    r = gc("run", str(mlp), "--random-inputs", "0", "--entry", "nope")
    assert r.returncode == 1 and "no function @nope" in r.stderr and "@main" in r.stderr


def test_help_for_every_subcommand() -> None:
    for sub in ("run", "opt"):
        r = gc(sub, "--help")
        assert r.returncode == 0 and "usage: gc " + sub in r.stdout


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.gir")), ids=lambda p: p.name)
def test_every_example_runs(example: Path) -> None:
    r = gc("run", str(example), "--random-inputs", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("result0: ")
    assert "nan" not in r.stdout and "non-finite" not in r.stdout


def test_prune_rewrites_gir_and_npz_consistently(tmp_path: Path) -> None:
    from compiler.inputs import random_inputs
    from compiler.interpreter import run
    from compiler.parser import parse_file

    net = ROOT / "examples" / "mlp.gir"
    weights = random_inputs(parse_file(net)["main"], 0)
    x = weights.pop("x")
    np.savez(tmp_path / "w.npz", **weights)
    r = gc("prune", str(net), "--params", str(tmp_path / "w.npz"), "--sparsity", "0.25", "--mode", "channel",
           "-o", str(tmp_path / "p.gir"), "--params-out", str(tmp_path / "p.npz"))
    assert r.returncode == 0, r.stderr
    assert "parameters: 1863690 -> " in r.stdout and "FLOPs:" in r.stdout
    pruned = parse_file(tmp_path / "p.gir")
    new = dict(np.load(tmp_path / "p.npz"))
    assert new["w1"].shape == (784, 768) and pruned["main"].args[1].type.shape == (784, 768)
    (out,) = run(pruned, {"x": x, **new})
    assert out.shape == (64, 10) and np.isfinite(out).all()


def test_prune_rejects_bad_sparsity() -> None:
    r = gc("prune", str(ROOT / "examples" / "mlp.gir"), "--sparsity", "1.5")
    assert r.returncode == 1 and "--sparsity must be in [0, 1)" in r.stderr


def test_random_inputs_look_through_fused_kernels() -> None:
    from compiler.inputs import random_inputs
    from compiler.parser import parse_file
    from compiler.pipeline import run_pipeline

    module = parse_file(ROOT / "examples" / "cnn.gir")
    before = random_inputs(module["main"], 0, module)
    run_pipeline(module, "fuse")
    after = random_inputs(module["main"], 0, module)
    assert all((before[k] == after[k]).all() for k in before)


def test_random_inputs_for_uses_whose_ranges_do_not_meet_take_the_first() -> None:
    """An input read by asin ([-0.9, 0.9]) and acosh ([1.1, 3]): values in asin's range (acosh then gives
    NaN, as it would), not a crash of the random generator (hypothesis found it in the differential test)."""
    from compiler.inputs import random_inputs
    from compiler.parser import parse

    module = parse("func @main(%x: tensor<64xf32>) -> tensor<64xf32> {\n  %a = graph.asin(%x)\n"
                   "  %b = graph.acosh(%x)\n  %y = graph.add(%a, %b)\n  return %y\n}\n")
    x = random_inputs(module["main"], 0, module)["x"]
    assert x.shape == (64,) and -0.9 <= x.min() and x.max() <= 0.9


def test_an_input_too_large_for_memory_is_a_diagnostic_not_a_traceback(tmp_path: Path) -> None:
    src = tmp_path / "big.gir"
    src.write_text("func @main(%x: tensor<100000x100000x100000xf32>) -> tensor<100000x100000x100000xf32> {\n"
                   "  %y = graph.relu(%x)\n  return %y\n}\n")
    r = gc("run", str(src), "--random-inputs", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "big.gir:1:12: error: cannot make a random input for %x: tensor<100000x100000x100000xf32> " \
           "(4,000,000,000,000,000 bytes) does not fit in memory" in r.stderr


@pytest.mark.parametrize("kind", ["outputs", "opt -o", "compile -o", "stats"])
def test_a_path_that_cannot_be_written_is_a_diagnostic(mlp: Path, tmp_path: Path, kind: str) -> None:
    nowhere = str(tmp_path / "no" / "such" / "dir" / "f")
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32), w=np.ones((3, 2), np.float32),
             b=np.ones(2, np.float32))
    args = {"outputs": ("run", str(mlp), "--inputs", str(tmp_path / "in.npz"), "--outputs", nowhere),
            "opt -o": ("opt", str(mlp), "-o", nowhere),
            "compile -o": ("compile", str(mlp), "-o", nowhere),
            "stats": ("compile", str(mlp), "-o", str(tmp_path / "m.gcpkg"), "--stats", nowhere)}[kind]
    r = gc(*args)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"error: cannot write {nowhere}: No such file or directory" in r.stderr


def test_an_npy_for_inputs_and_an_npz_for_a_model_are_diagnostics(mlp: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    np.savez(tmp_path / "x.npz", x=np.ones((2, 3), np.float32))
    r = gc("run", str(mlp), "--inputs", str(tmp_path / "x.npy"))
    assert r.returncode == 1 and "holds one unnamed array (an .npy file); give an .npz keyed by argument" in r.stderr
    r = gc("run", str(tmp_path / "x.npz"), "--inputs", str(tmp_path / "x.npz"))
    assert r.returncode == 1 and "no manifest.json: not a gc compiled model" in r.stderr


def test_print_ir_flags_name_passes(mlp: Path) -> None:
    r = gc("opt", str(mlp), "-O1", "--print-ir-after=bogus")
    assert r.returncode == 1 and "--print-ir-after: unknown pass 'bogus'" in r.stderr
    r = gc("opt", str(mlp), "-O1", "--print-ir-before=fuse{max-ops=2}")
    assert r.returncode == 1 and "takes pass names (e.g. fuse), without options: got 'fuse{max-ops=2}'" in r.stderr
    r = gc("opt", str(mlp), "-O1", "--print-ir-after=fuse")  # O1 runs no fuse: nothing would print, silently
    assert r.returncode == 0 and "note: --print-ir-after=fuse: the pipeline does not run fuse" in r.stderr
    r = gc("opt", str(mlp), "-O2", "--print-ir-after=fuse")
    assert r.returncode == 0 and "IR Dump After fuse" in r.stderr and "note" not in r.stderr


def test_an_artifact_says_what_it_was_compiled_for(mlp: Path, tmp_path: Path) -> None:
    pkg = str(tmp_path / "net.gcpkg")
    assert gc("compile", str(mlp), "-o", pkg).returncode == 0
    r = gc("run", pkg, "--entry", "other", "--random-inputs", "0")
    assert r.returncode == 1 and "was compiled from @main, not @other" in r.stderr
    r = gc("run", pkg, "--target", "cuda", "--random-inputs", "0")
    assert r.returncode == 1 and "net.gcpkg was compiled for llvm, not cuda" in r.stderr
    assert gc("run", pkg, "--entry", "main", "--target", "llvm", "--random-inputs", "0").returncode == 0


def test_compiling_one_function_leaves_the_others_alone(tmp_path: Path) -> None:
    """A sibling of the entry is not compiled, so the passes say nothing about it (dce noted its unused
    argument on every gc run --target llvm)."""
    src = tmp_path / "two.gir"
    src.write_text("func @other(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {\n  %y = graph.relu(%b)\n"
                   "  return %y\n}\n" + MLP)
    r = gc("run", str(src), "--target", "llvm", "--random-inputs", "0")
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("result0: tensor<2x2xf32>")


@pytest.mark.parametrize("args, message", [
    (("bisect", "MLP", "-O2", "--seed", "-1"), "argument --seed: a seed is a non-negative integer, got -1"),
    (("run", "MLP", "--random-inputs", "x"), "argument --random-inputs: invalid seed value: 'x'"),
    (("bisect", "MLP", "-O2", "--rtol", "nan"), "argument --rtol: --rtol must be a finite number >= 0, got nan"),
    (("bisect", "MLP", "-O2", "--atol", "inf"), "--atol must be a finite number >= 0, got inf"),
    (("train", "MLP", "--lr", "-1"), "--lr must be a finite number >= 0, got -1"),
])
def test_out_of_range_options_are_usage_errors(mlp: Path, args: tuple, message: str) -> None:
    r = gc(*(str(mlp) if a == "MLP" else a for a in args))
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_npz_files_numpy_cannot_read_as_numbers_are_diagnostics(mlp: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "obj.npz", x=np.array([np.ones(3)], dtype=object))
    (tmp_path / "junk.npz").write_bytes(b"garbage")
    r = gc("run", str(mlp), "--inputs", str(tmp_path / "obj.npz"))
    assert r.returncode == 1 and "obj.npz: 'x' is an array of Python objects, not numbers" in r.stderr
    r = gc("run", str(mlp), "--inputs", str(tmp_path / "junk.npz"))
    assert r.returncode == 1 and "junk.npz: not an .npz file" in r.stderr
    (tmp_path / "empty.npz").write_bytes(b"")
    r = gc("compile", str(mlp), "--params", str(tmp_path / "empty.npz"))
    assert r.returncode == 1 and "cannot read " in r.stderr and "the file is empty" in r.stderr
    assert "internal compiler error" not in r.stderr


@pytest.mark.parametrize("compressed", [False, True])
def test_damaged_npz_files_are_diagnostics_wherever_they_break(tmp_path: Path, compressed: bool) -> None:
    """An .npz cut short or with flipped bytes at any offset: one GCError, never NumPy's or zlib's exception."""
    from compiler.diagnostics import GCError
    from compiler.inputs import load_npz

    good = tmp_path / "good.npz"
    (np.savez_compressed if compressed else np.savez)(good, x=np.arange(300, dtype=np.float32), y=np.ones((4, 5)))
    data = good.read_bytes()
    bad = tmp_path / "bad.npz"
    for cut in range(0, len(data), max(1, len(data) // 40)):
        for damaged in (data[:cut], data[:cut] + bytes(b ^ 0xFF for b in data[cut:cut + 8]) + data[cut + 8:]):
            bad.write_bytes(damaged)
            try:
                arrays = load_npz(str(bad))
            except GCError:
                continue
            assert set(arrays) <= {"x", "y"}  # flipped bytes the format does not check read as other numbers


def test_a_plugin_with_a_syntax_error_is_a_diagnostic_at_its_line(mlp: Path, tmp_path: Path) -> None:
    plugin = tmp_path / "syn.py"
    plugin.write_text("x = (\n")
    r = gc("opt", str(mlp), "--load-pass-plugin", str(plugin), "-O1")
    assert r.returncode == 1 and f"{plugin}:1:5: error: pass plugin: '(' was never closed" in r.stderr


def test_stats_of_a_json_that_is_not_gc_compile_stats(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1, 2]")
    r = gc("stats", str(tmp_path / "list.json"))
    assert r.returncode == 1 and "not a statistics file written by `gc compile --stats` (it has no arena_bytes" \
        in r.stderr


def test_npz_outputs_go_to_exactly_the_path_given(mlp: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.bin"
    assert gc("run", str(mlp), "--random-inputs", "0", "--outputs", str(out)).returncode == 0
    assert out.is_file() and not (tmp_path / "result.bin.npz").exists()
    assert np.load(out)["result0"].shape == (2, 2)
    r = gc("run", str(mlp), "--random-inputs", "0", "--outputs", str(tmp_path))
    assert r.returncode == 1 and f"cannot write {tmp_path}: Is a directory" in r.stderr


# --- the process's edges: Ctrl-C, a full disk, memory that is not there --------------------------------


def test_ctrl_c_during_a_compile_exits_130_without_a_traceback(tmp_path: Path) -> None:
    import signal
    import time

    for delay in (0.4, 1.0, 1.6):
        p = subprocess.Popen([sys.executable, "-m", "compiler", "compile", str(ROOT / "examples" / "cnn.gir"), "-o",
                              str(tmp_path / "c.gcpkg")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert p.returncode in (0, 130, -signal.SIGINT) and "Traceback" not in err, err  # 0: it had finished


def test_an_interrupt_tvm_hands_back_as_another_exception_is_still_an_interrupt(monkeypatch, capsys) -> None:
    from compiler import cli

    def interrupted(args):
        try:
            cli._on_sigint(2, None)
        except KeyboardInterrupt:
            raise RuntimeError from None  # what TVM's FFI makes of it, raised in a Python callback

    monkeypatch.setattr(cli, "_interrupted", [])
    monkeypatch.setattr(cli, "cmd_opt", interrupted)  # the parser built by main() dispatches to it
    assert cli.main(["opt", str(ROOT / "examples" / "mlp.gir")]) == 130
    assert capsys.readouterr().err == "gc: interrupted\n"


def test_an_interrupt_while_the_parser_is_built_is_an_interrupt(monkeypatch, capsys) -> None:
    """Ctrl-C lands where the process is: on a slow machine, 0.4 s in, that was building the parser."""
    from compiler import cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", interrupted)
    assert cli.main(["opt", str(ROOT / "examples" / "mlp.gir")]) == 130
    assert capsys.readouterr().err == "gc: interrupted\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_standard_output_on_a_full_disk_is_a_diagnostic(mlp: Path) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "compiler", "opt", str(mlp)], stdout=full, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT)
    assert r.returncode == 1 and r.stderr == "gc: error: cannot write standard output: No space left on device\n"


def test_output_paths_are_checked_before_the_compile(tmp_path: Path) -> None:
    import time

    for args in (("compile", "examples/cnn.gir", "-o", "/nonexistent/x.gcpkg"),
                 ("compile", "examples/cnn.gir", "-o", str(tmp_path / "c.gcpkg"), "--stats", "/nonexistent/s.json"),
                 ("train", "examples/train_mlp.gir", "-o", "/nonexistent/t.npz")):
        t = time.perf_counter()
        r = gc(*args)
        assert r.returncode == 1 and "cannot write /nonexistent/" in r.stderr and "wrote" not in r.stderr
        assert time.perf_counter() - t < 15
    assert not (tmp_path / "c.gcpkg").exists()


BIG = """func @main(%x: tensor<10xf32>) -> tensor<10xf32> {
  %b = graph.broadcast_to(%x) {shape = [100000, 100000, 10]}
  %e = graph.exp(%b)
  %s = graph.reduce_sum(%e) {axes = [0, 1]}
  return %s
}
"""


def test_a_model_too_large_for_memory_compiles_and_says_so_when_called(tmp_path: Path) -> None:
    """400 GB of intermediates: the kernels index in int64 (2^31 elements would wrap an int32), the artifact
    is written (compiling allocates nothing), and a call is a diagnostic naming the bytes it needs."""
    (tmp_path / "big.gir").write_text(BIG)
    model = compiler.compile(str(tmp_path / "big.gir"), "llvm")
    assert "int64" in model.scheduled.script()
    model.save(tmp_path / "big.gcpkg")
    r = gc("run", str(tmp_path / "big.gcpkg"), "--random-inputs", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "error: cannot allocate the 400,000,000,080 bytes a call of this model needs on cpu" in r.stderr
