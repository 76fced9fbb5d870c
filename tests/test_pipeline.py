"""The pass manager: pipeline strings, options, verification, and every debugging aid of `gc opt`."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from helpers import gc

from compiler.diagnostics import GCError
from compiler.parser import parse
from compiler.passes import PASSES
from compiler.pipeline import Instrumentation, PipelineFailure, parse_pipeline, run_pipeline

PLUGIN = str(ROOT / "tests" / "plugins" / "buggy_passes.py")
NET = """func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = graph.constant {value = dense<1.0> : tensor<4xf32>}
  %a = graph.add(%x, %c)
  %dead = graph.neg(%a)
  %r = graph.relu(%a)
  return %r
}
"""


@pytest.fixture
def net(tmp_path: Path) -> Path:
    p = tmp_path / "net.gir"
    p.write_text(NET)
    return p


def test_pipeline_string_with_options() -> None:
    passes = parse_pipeline("dce, dce{prune-args=true}")
    assert [p.spelled() for p in passes] == ["dce", "dce{prune-args=true}"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("nope", "unknown pass 'nope'"),
        ("dce{prune-args=maybe}", "option 'prune-args' expects bool, got 'maybe'"),
        ("dce{color=red}", "pass 'dce' has no option 'color' (options: prune-args)"),
        ("dce{prune-args=true", "missing '}'"),
        ("dce,,dce", "a pass name is missing"),
    ],
)
def test_bad_pipelines_are_user_errors(text: str, message: str) -> None:
    with pytest.raises(GCError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_pipeline(text)


def test_records_say_which_pass_changed_the_module() -> None:
    module = parse(NET)
    records = run_pipeline(module, "dce,dce")
    assert [(r.name, r.changed) for r in records] == [("dce", True), ("dce", False)]


def test_list_passes_shows_options_and_named_pipelines() -> None:
    r = gc("opt", "--list-passes")
    assert r.returncode == 0
    assert "dce " in r.stdout and "prune-args=false" in r.stdout
    assert "-O0" in r.stdout and "-O1" in r.stdout and "-O2" in r.stdout
    assert "compile-llvm (gc compile --target llvm)  canonicalize," in r.stdout and "compile-cuda" in r.stdout


def test_print_ir_after_all_and_change(net: Path) -> None:
    r = gc("opt", str(net), "--load-pass-plugin", PLUGIN, "-p", "dce,test-nothing", "--print-ir-after-change")
    assert r.stderr.count("IR Dump After") == 1 and "IR Dump After dce //" in r.stderr
    r = gc("opt", str(net), "--load-pass-plugin", PLUGIN, "-p", "dce,test-nothing", "--print-ir-after-all")
    assert "IR Dump After dce //" in r.stderr and "IR Dump After test-nothing (no change)" in r.stderr


def test_print_ir_before_and_after_a_named_pass(net: Path) -> None:
    r = gc("opt", str(net), "-p", "dce", "--print-ir-before=dce", "--print-ir-after=dce")
    before, after = r.stderr.split("IR Dump After")
    assert "IR Dump Before dce" in before and "graph.neg" in before
    assert "graph.neg" not in after


def test_print_diff_shows_only_what_changed(net: Path) -> None:
    r = gc("opt", str(net), "-p", "dce", "--print-ir-after-all", "--print-diff")
    assert "-  %dead = graph.neg(%a) : tensor<4xf32>" in r.stderr
    assert "+" not in r.stderr.split("@@")[-1].replace("+++", "")


def test_timing_table_has_every_pass_and_total(net: Path) -> None:
    r = gc("opt", str(net), "-p", "dce,dce", "--timing")
    assert "Pass execution timing report" in r.stderr
    assert r.stderr.count("  dce\n") == 2 and "Total\n" in r.stderr


def test_pass_statistics(net: Path) -> None:
    r = gc("opt", str(net), "-p", "dce", "--pass-statistics")
    assert "(1) ops-erased" in r.stderr and "(0)" not in r.stderr


def test_dump_dir_files_are_numbered_and_reparse(net: Path, tmp_path: Path) -> None:
    d = tmp_path / "dumps"
    r = gc("opt", str(net), "-p", "dce,dce", "--dump-dir", str(d))
    assert r.returncode == 0
    names = sorted(p.name for p in d.iterdir())
    assert names == ["00-input.gir", "01-dce.gir", "02-dce.gir"]
    for p in d.iterdir():
        parse(p.read_text(), str(p))
    assert "graph.neg" not in (d / "01-dce.gir").read_text()


def test_crashing_pass_writes_a_reproducer_that_replays(net: Path) -> None:
    r = gc("opt", str(net), "--load-pass-plugin", PLUGIN, "-p", "dce,test-crash,dce")
    assert r.returncode == 3
    assert "pass 'test-crash' crashed: ZeroDivisionError: the pass divided by zero" in r.stderr
    repro = net.with_name("net.reproducer.gir")
    text = repro.read_text()
    assert "// pipeline from here: test-crash,dce" in text
    assert "graph.neg" not in text  # the IR before the crashing pass, after the first dce
    replay = gc("opt", str(repro), "--load-pass-plugin", PLUGIN, "-p", "test-crash,dce")
    assert replay.returncode == 3 and "the pass divided by zero" in replay.stderr


def test_pass_that_breaks_the_ir_is_named(net: Path) -> None:
    r = gc("opt", str(net), "--load-pass-plugin", PLUGIN, "-p", "test-break-types", "--print-ir-after-failure")
    assert r.returncode == 3
    assert "pass 'test-break-types' produced invalid IR" in r.stderr
    assert "does not match the inferred type" in r.stderr
    assert "IR Dump After test-break-types Failed" in r.stderr


def test_no_verify_each_lets_broken_ir_through(net: Path) -> None:
    r = gc("opt", str(net), "--load-pass-plugin", PLUGIN, "-p", "test-break-types", "--no-verify-each")
    assert r.returncode == 0


def test_bisect_limit_runs_only_the_first_n(net: Path) -> None:
    r = gc("opt", str(net), "--load-pass-plugin", PLUGIN, "-p", "test-nothing,dce", "--bisect-limit=1")
    assert "BISECT: running pass (1) test-nothing on module" in r.stderr
    assert "BISECT: NOT running pass (2) dce on module" in r.stderr
    assert "graph.neg" in r.stdout


def test_check_numerics_names_the_pass(net: Path) -> None:
    r = gc("opt", str(net), "--load-pass-plugin", PLUGIN, "-p", "dce,test-perturb", "--check-numerics")
    assert "check-numerics: pass (2) test-perturb changed @main result 0: max abs error 0.5" in r.stderr


def test_gc_bisect_finds_the_first_bad_pass(net: Path) -> None:
    r = gc("bisect", str(net), "--load-pass-plugin", PLUGIN, "-p", "dce,test-nothing,test-perturb{amount=0.25},dce")
    assert r.returncode == 1
    assert "first bad pass (3) test-perturb{amount=0.25} changed @main result 0: max abs error 0.25" in r.stdout
    ok = gc("bisect", str(net), "-p", "dce")
    assert ok.returncode == 0 and "no pass changed the outputs" in ok.stdout


def test_gc_bisect_counts_a_lost_function_or_result_as_a_change(tmp_path: Path) -> None:
    two = tmp_path / "two.gir"
    two.write_text("func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n  %a = graph.relu(%x)\n"
                   "  %b = graph.neg(%x)\n  return %a, %b\n}\n")
    r = gc("bisect", str(two), "--load-pass-plugin", PLUGIN, "-p", "dce,test-rename-main")
    assert r.returncode == 1 and "first bad pass (2) test-rename-main changed @main result 0" in r.stdout
    r = gc("bisect", str(two), "--load-pass-plugin", PLUGIN, "-p", "test-drop-result,dce")
    assert r.returncode == 1 and "first bad pass (1) test-drop-result changed @main result 1" in r.stdout


def test_debuginfo_prints_locations(net: Path) -> None:
    r = gc("opt", str(net), "--print-debuginfo")
    assert f'%r = graph.relu(%a) : tensor<4xf32> loc("{net}":5:8)' in r.stdout


def test_in_process_failure_carries_the_reproducer(tmp_path: Path) -> None:
    import runpy

    runpy.run_path(PLUGIN)
    module = parse(NET)
    out = tmp_path / "x.reproducer.gir"
    with pytest.raises(PipelineFailure) as e:
        run_pipeline(module, "test-crash", Instrumentation(reproducer=str(out)))
    assert e.value.reproducer == str(out) and out.exists()
    assert "test-crash" in PASSES


def test_docs_pipeline_table_is_the_code_s() -> None:
    from compiler.pipeline import PIPELINES

    doc = (Path(__file__).resolve().parent.parent / "docs" / "passes.md").read_text()
    for name in ("O1", "O2", "compile-llvm"):
        row = next(line for line in doc.splitlines() if line.startswith(f"| `-{name}`") or
                   line.startswith(f"| `{name}`"))
        assert row.rstrip(" |").endswith(f"`{PIPELINES[name]}`"), row
