"""`gc viz`: the dataflow graph as Graphviz source, kernels as clusters, and the output formats."""

from __future__ import annotations

import re
import shutil
import stat
from pathlib import Path

import pytest
from conftest import ROOT
from helpers import gc_here

from compiler.cli import main
from compiler.diagnostics import GCError
from compiler.parser import parse, parse_file
from compiler.viz import to_dot, write

MLP = ROOT / "examples" / "mlp.gir"

# What `fuse` makes: @main calls a function marked as a kernel. @pass_through returns an argument
# unchanged, so its result's edge must come from the producer outside the kernel.
KERNEL = """
func @fused_0(%a: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> attributes {kernel = true} {
  %s = graph.add(%a, %b) : tensor<4x8xf32>
  %r = graph.relu(%s) : tensor<4x8xf32>
  return %r
}
func @pass_through(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kernel = true} {
  return %a
}
func @layer(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %n = graph.neg(%a) : tensor<4x8xf32>
  return %n
}
func @main(%x: tensor<4x3xf32>, %w: tensor<3x8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %h = graph.matmul(%x, %w) : tensor<4x8xf32>
  %y = graph.call(%h, %b) {callee = @fused_0} : tensor<4x8xf32>
  %p = graph.call(%h) {callee = @pass_through} : tensor<4x8xf32>
  %l = graph.call(%y) {callee = @layer} : tensor<4x8xf32>
  return %l, %p
}
"""


def nodes(source: str) -> dict[str, str]:
    """Node id -> label, from dot source (the graphviz package quotes a label only where it must)."""
    found = re.findall(r'^\s*(\w+) \[label=(?:"([^"]*)"|(\w+))', source, flags=re.M)
    return {node: quoted or bare for node, quoted, bare in found}


def edges(source: str) -> set[tuple[str, str, str]]:
    """(tail label, head label, edge label), from dot source."""
    names = nodes(source)
    found = re.findall(r'^\s*(\w+) -> (\w+) \[label="([^"]*)"\]', source, flags=re.M)
    return {(names[a], names[b], t) for a, b, t in found}


def cluster(source: str) -> tuple[str, str]:
    """The first cluster's header line and body."""
    m = re.search(r"subgraph (cluster\w*) \{\n(.*?)\n\t\}", source, flags=re.S)
    assert m, "no cluster in the graph"
    return m.group(1), m.group(2)


@pytest.fixture(scope="module")
def mlp_dot() -> str:
    return to_dot(parse_file(MLP)).source


@pytest.fixture(scope="module")
def kernel_dot() -> str:
    return to_dot(parse(KERNEL)).source


def test_each_op_is_a_node_labelled_with_its_name_and_result_type(mlp_dot: str) -> None:
    labels = sorted(label for node, label in nodes(mlp_dot).items() if node.startswith("op"))
    assert labels == sorted(["matmul\\n64x1024xf32", "add\\n64x1024xf32", "relu\\n64x1024xf32"] * 2
                            + ["matmul\\n64x10xf32", "add\\n64x10xf32"])


def test_arguments_and_return_are_nodes(mlp_dot: str) -> None:
    labels = nodes(mlp_dot)
    assert labels["arg0"] == "%x\\n64x784xf32" and labels["arg6"] == "%b3\\n10xf32"
    assert labels["return"] == "return"


def test_edges_follow_the_dataflow_labelled_with_tensor_types(mlp_dot: str) -> None:
    found = edges(mlp_dot)
    assert ("%x\\n64x784xf32", "matmul\\n64x1024xf32", "tensor<64x784xf32>") in found
    assert ("matmul\\n64x10xf32", "add\\n64x10xf32", "tensor<64x10xf32>") in found
    assert ("add\\n64x10xf32", "return", "tensor<64x10xf32>") in found
    assert len(re.findall(" -> ", mlp_dot)) == 6 * 2 + 2 + 1  # matmuls and adds read two, relus one, return


def test_kernel_call_is_a_cluster_holding_the_callee_ops(kernel_dot: str) -> None:
    name, body = cluster(kernel_dot)
    assert name.startswith("cluster") and "fused_0" in name
    assert 'label="@fused_0"' in body
    assert sorted(nodes(body).values()) == ["add\\n4x8xf32", "relu\\n4x8xf32"]
    assert "matmul" not in body and " -> " not in body  # an edge inside would pull its ends into the box


def test_edges_cross_the_kernel_boundary_from_producers_to_inner_ops(kernel_dot: str) -> None:
    found = edges(kernel_dot)
    assert ("matmul\\n4x8xf32", "add\\n4x8xf32", "tensor<4x8xf32>") in found
    assert ("%b\\n8xf32", "add\\n4x8xf32", "tensor<8xf32>") in found
    assert ("add\\n4x8xf32", "relu\\n4x8xf32", "tensor<4x8xf32>") in found
    assert ("relu\\n4x8xf32", "neg\\n4x8xf32", "tensor<4x8xf32>") not in found  # @layer is one call node
    assert ("relu\\n4x8xf32", "call @layer\\n4x8xf32", "tensor<4x8xf32>") in found


def test_kernel_returning_an_argument_passes_the_outer_producer_through(kernel_dot: str) -> None:
    assert ("matmul\\n4x8xf32", "return", "tensor<4x8xf32>") in edges(kernel_dot)
    assert "@pass_through" in kernel_dot


def test_unknown_entry_is_an_error() -> None:
    with pytest.raises(GCError, match="no function @nope in the module"):
        to_dot(parse(KERNEL), "nope")


# --- files and the command line ---------------------------------------------------------------------


@pytest.fixture
def kernel_file(tmp_path: Path) -> Path:
    p = tmp_path / "fused.gir"
    p.write_text(KERNEL)
    return p


def test_cli_writes_dot_source(capsys: pytest.CaptureFixture, kernel_file: Path, tmp_path: Path) -> None:
    rc, _, err = gc_here(capsys, "viz", kernel_file, "-o", tmp_path / "g.dot")
    assert rc == 0, err
    assert (tmp_path / "g.dot").read_text() == to_dot(parse_file(kernel_file)).source


def test_cli_without_output_prints_dot_source(capsys: pytest.CaptureFixture, kernel_file: Path) -> None:
    rc, out, _ = gc_here(capsys, "viz", kernel_file)
    assert rc == 0 and out.startswith("digraph main {") and "subgraph cluster" in out


def test_cli_runs_the_pipeline_first(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    p = tmp_path / "dead.gir"
    p.write_text("func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %d = graph.exp(%x)\n  %r = graph.relu(%x)\n"
                 "  return %r\n}\n")
    assert "exp" in gc_here(capsys, "viz", p)[1]
    assert "exp" not in gc_here(capsys, "viz", p, "-p", "dce")[1]


def test_unknown_extension_is_an_error_naming_the_formats(capsys: pytest.CaptureFixture, kernel_file: Path,
                                                         tmp_path: Path) -> None:
    rc, _, err = gc_here(capsys, "viz", kernel_file, "-o", tmp_path / "g.jpeg")
    assert rc == 1
    assert "unknown extension '.jpeg'" in err and ".dot" in err and ".svg" in err and ".html" in err
    assert not (tmp_path / "g.jpeg").exists()


@pytest.mark.parametrize("ext", [".svg", ".png", ".html"])
def test_rendering_without_dot_says_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ext: str) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(GCError, match=r"needs the Graphviz 'dot' program.*install Graphviz.*\.dot source"):
        write(to_dot(parse(KERNEL)), str(tmp_path / f"g{ext}"))


def test_html_page_embeds_the_svg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture,
                                  kernel_file: Path) -> None:
    # A stand-in for dot, so the page is tested whether or not Graphviz is installed.
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    svg = '<?xml version="1.0"?>\\n<!DOCTYPE svg>\\n<svg id="g"></svg>\\n'
    fake.write_text(f"#!/bin/sh\ncat > /dev/null\nprintf '{svg}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    rc, _, err = gc_here(capsys, "viz", kernel_file, "-o", tmp_path / "g.html")
    assert rc == 0, err
    page = (tmp_path / "g.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '<svg id="g"></svg>' in page
    assert "<?xml" not in page  # the prologue does not belong inside HTML
    assert "@main in" in page and "kernels" in page  # the title and the stats table


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_svg_renders_with_dot(capsys: pytest.CaptureFixture, kernel_file: Path, tmp_path: Path) -> None:
    rc, _, err = gc_here(capsys, "viz", kernel_file, "-o", tmp_path / "g.svg")
    assert rc == 0, err
    svg = (tmp_path / "g.svg").read_text()
    assert "<svg" in svg and "@fused_0" in svg and "matmul" in svg


def test_cli_help_describes_viz(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["viz", "--help"])
    out = capsys.readouterr().out
    assert ".dot" in out and ".svg" in out and ".html" in out and "kernel" in out
