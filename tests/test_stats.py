"""`gc stats`: op, kernel, FLOP, parameter and memory counts, as a library and on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT
from helpers import gc_here

from compiler.cli import main
from compiler.diagnostics import GCError
from compiler.parser import parse, parse_file
from compiler.stats import format_compare, format_stats, module_stats

MLP = ROOT / "examples" / "mlp.gir"
MLP_PARAMS = 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10
MLP_MATMUL_FLOPS = 2 * 64 * (784 * 1024 + 1024 * 1024 + 1024 * 10)
# Three bias adds (two 64x1024, one 64x10) and two relus (64x1024), one operation per result element.
MLP_ELEMENTWISE_FLOPS = 2 * 64 * 1024 + 64 * 10 + 2 * 64 * 1024

# What `fuse` makes: a function marked as a kernel, called from @main. @fused_0 is called twice and
# holds a constant, which is stored once however often the kernel runs.
KERNELS = """
func @fused_0(%a: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> attributes {kernel = true} {
  %c = graph.constant {value = dense<2.0> : tensor<8xf32>} : tensor<8xf32>
  %s = graph.add(%a, %b) : tensor<4x8xf32>
  %m = graph.mul(%s, %c) : tensor<4x8xf32>
  %r = graph.relu(%m) : tensor<4x8xf32>
  return %r
}
func @main(%x: tensor<4x3xf32>, %w: tensor<3x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %h = graph.matmul(%x, %w) : tensor<4x8xf32>
  %y = graph.call(%h, %b) {callee = @fused_0} : tensor<4x8xf32>
  %z = graph.call(%y, %b) {callee = @fused_0} : tensor<4x8xf32>
  return %z
}
"""

# A plain (not kernel) call: its ops count as if written in place.
LAYER = """
func @layer(%a: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %s = graph.add(%a, %b) : tensor<4x8xf32>
  %r = graph.relu(%s) : tensor<4x8xf32>
  return %r
}
func @main(%x: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %y = graph.call(%x, %b) {callee = @layer} : tensor<4x8xf32>
  return %y
}
"""

DEAD = """func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %h = graph.matmul(%x, %w) : tensor<4x8xf32>
  %dead = graph.exp(%h) : tensor<4x8xf32>
  %r = graph.relu(%h) : tensor<4x8xf32>
  return %r
}
"""


@pytest.fixture(scope="module")
def mlp() -> dict:
    return module_stats(parse_file(MLP))


def test_mlp_parameters_are_the_weights_and_biases(mlp: dict) -> None:
    assert mlp["params"] == MLP_PARAMS
    assert mlp["param_bytes"] == 4 * MLP_PARAMS
    assert mlp["param_args"] == ["w1", "b1", "w2", "b2", "w3", "b3"]
    assert mlp["inputs"] == ["x"] and mlp["input_bytes"] == 4 * 64 * 784


def test_mlp_flops_are_the_matmuls_plus_the_elementwise_ops(mlp: dict) -> None:
    assert mlp["flops"] == MLP_MATMUL_FLOPS + MLP_ELEMENTWISE_FLOPS


def test_mlp_ops_counted_by_name_and_by_kind(mlp: dict) -> None:
    assert mlp["num_ops"] == 8
    assert mlp["ops_by_name"] == {"graph.add": 3, "graph.matmul": 3, "graph.relu": 2}
    assert mlp["ops_by_kind"] == {"broadcast": 3, "elementwise": 2, "out-elementwise-fusable": 3}


def test_mlp_every_op_is_a_kernel_and_every_result_an_intermediate(mlp: dict) -> None:
    assert mlp["num_kernels"] == 8
    assert mlp["intermediate_bytes"] == 4 * (6 * 64 * 1024 + 2 * 64 * 10)
    assert mlp["output_bytes"] == 4 * 64 * 10


def test_integer_arguments_are_inputs_not_parameters() -> None:
    stats = module_stats(parse_file(ROOT / "examples" / "train_mlp.gir"))
    assert stats["inputs"] == ["x", "labels"]
    assert stats["params"] == MLP_PARAMS
    assert stats["input_bytes"] == 4 * 64 * 784 + 8 * 64


def test_data_args_name_the_inputs_instead_of_the_first_argument() -> None:
    stats = module_stats(parse_file(MLP), data_args=["x", "b3"])
    assert stats["inputs"] == ["x", "b3"]
    assert stats["params"] == MLP_PARAMS - 10


def test_unknown_data_arg_is_an_error_listing_the_arguments() -> None:
    with pytest.raises(GCError, match=r"@main has no argument %q \(arguments: %x, %w1"):
        module_stats(parse_file(MLP), data_args=["q"])


def test_unknown_entry_is_an_error_listing_the_functions() -> None:
    with pytest.raises(GCError, match=r"no function @nope in the module \(functions: @layer, @main\)"):
        module_stats(parse(LAYER), "nope")


def test_kernel_call_is_one_kernel_whose_flops_count_through_the_callee() -> None:
    stats = module_stats(parse(KERNELS))
    assert stats["num_kernels"] == 3  # the matmul and two calls of @fused_0
    assert stats["kernel_calls"] == {"fused_0": 2}
    assert stats["flops"] == 2 * 3 * 32 + 2 * 3 * 32  # the matmul, then add, mul and relu twice
    assert stats["ops_by_name"] == {"graph.add": 2, "graph.constant": 2, "graph.matmul": 1, "graph.mul": 2,
                                    "graph.relu": 2}


def test_kernel_inner_values_are_not_intermediates() -> None:
    stats = module_stats(parse(KERNELS))
    assert stats["intermediate_bytes"] == 3 * 4 * 32  # %h, %y, %z; not %s, %m, %r inside the kernel


def test_constants_are_parameters_stored_once_per_function() -> None:
    stats = module_stats(parse(KERNELS))
    assert stats["params"] == 3 * 8 + 8 + 8  # %w, %b and the constant, though @fused_0 runs twice
    assert stats["constant_params"] == 8 and stats["num_constants"] == 1
    assert stats["param_bytes"] == 4 * stats["params"]


def test_plain_call_counts_as_if_inlined() -> None:
    stats = module_stats(parse(LAYER))
    assert stats["num_calls"] == 1
    assert stats["num_kernels"] == 2
    assert stats["ops_by_name"] == {"graph.add": 1, "graph.relu": 1}
    assert stats["intermediate_bytes"] == 2 * 4 * 32


def test_format_stats_is_a_table_with_thousands_separators(mlp: dict) -> None:
    text = format_stats(mlp)
    assert text.startswith("@main\n")
    assert f"{MLP_PARAMS:,}" in text and "(7.11 MiB)" in text
    assert "  graph.matmul" in text and "ops by kind:" in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_format_compare_shows_each_number_before_after_and_its_change() -> None:
    before = module_stats(parse(DEAD))
    after = dict(before, num_ops=2, ops_by_name={"graph.matmul": 1, "graph.relu": 1})
    row = next(line for line in format_compare(before, after).splitlines() if line.startswith("ops "))
    assert row.split() == ["ops", "3", "2", "-1", "(-33.3%)"]
    assert "graph.exp" in format_compare(before, after)


# --- the command line -------------------------------------------------------------------------------


@pytest.fixture
def dead(tmp_path: Path) -> Path:
    p = tmp_path / "dead.gir"
    p.write_text(DEAD)
    return p


def test_cli_prints_the_table(capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = gc_here(capsys, "stats", MLP)
    assert rc == 0
    assert out == format_stats(module_stats(parse_file(MLP)))


def test_cli_json_is_the_library_dict(capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = gc_here(capsys, "stats", MLP, "--json")
    assert rc == 0
    stats = json.loads(out)
    assert stats == module_stats(parse_file(MLP))
    assert stats["params"] == MLP_PARAMS and stats["flops"] == MLP_MATMUL_FLOPS + MLP_ELEMENTWISE_FLOPS


def test_cli_pipeline_changes_the_counts(capsys: pytest.CaptureFixture, dead: Path) -> None:
    _, out, _ = gc_here(capsys, "stats", dead, "--json")
    _, pruned, _ = gc_here(capsys, "stats", dead, "-p", "dce", "--json")
    assert json.loads(out)["ops_by_name"] == {"graph.exp": 1, "graph.matmul": 1, "graph.relu": 1}
    assert json.loads(pruned)["ops_by_name"] == {"graph.matmul": 1, "graph.relu": 1}
    assert json.loads(pruned)["flops"] == json.loads(out)["flops"] - 32


def test_cli_compare_prints_before_and_after(capsys: pytest.CaptureFixture, dead: Path) -> None:
    rc, out, _ = gc_here(capsys, "stats", dead, "-p", "dce", "--compare")
    assert rc == 0
    assert out.splitlines()[0].split() == ["@main", "before", "after", "change"]
    exp = next(line for line in out.splitlines() if "graph.exp" in line)
    assert exp.split() == ["graph.exp", "1", "0", "-1", "(-100.0%)"]


def test_cli_compare_json_has_both_sides(capsys: pytest.CaptureFixture, dead: Path) -> None:
    _, out, _ = gc_here(capsys, "stats", dead, "-p", "dce", "--compare", "--json")
    both = json.loads(out)
    assert (both["before"]["num_ops"], both["after"]["num_ops"]) == (3, 2)


def test_cli_compare_without_a_pipeline_is_a_usage_error(capsys: pytest.CaptureFixture, dead: Path) -> None:
    rc, _, err = gc_here(capsys, "stats", dead, "--compare")
    assert rc == 1 and "--compare needs a pipeline" in err


def test_cli_data_args_and_entry(capsys: pytest.CaptureFixture) -> None:
    _, out, _ = gc_here(capsys, "stats", MLP, "--data-args", "x, b3", "--json")
    assert json.loads(out)["inputs"] == ["x", "b3"]
    rc, _, err = gc_here(capsys, "stats", MLP, "--entry", "nope")
    assert rc == 1 and "no function @nope" in err


def test_cli_help_describes_stats(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["stats", "--help"])
    out = capsys.readouterr().out
    assert "--compare" in out and "--json" in out and "kernel" in out
