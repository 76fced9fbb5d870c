"""Per-op policies live on the op's class (compiler/ir.py's Op): passes ask the op, never a list of names.
A new op that states a policy gets every pass's treatment without a pass changing."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from compiler.ir import OP_REGISTRY, lookup_op
from compiler.parser import parse
from compiler.pipeline import run_pipeline
from dialects.graph.elementwise import binary

ROOT = Path(__file__).resolve().parent.parent


def graph_op_names() -> set[str]:
    lookup_op("graph.add")  # registers the dialects
    return {n for n in OP_REGISTRY if n.startswith("graph.")}


def test_no_file_under_compiler_names_a_graph_op() -> None:
    """No string in compiler/ is a graph op's name (docstrings aside; a message may say "graph.mse_loss"
    inside a sentence): what a pass needs to know of an op, the op says."""
    names = graph_op_names()
    found = []
    for path in sorted((ROOT / "compiler").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{path.relative_to(ROOT)}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  and n.value in names]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_name_where_one_is_written(tmp_path: Path) -> None:
    """The check above is no check that cannot fail: the same scan finds a name in code like the old."""
    code = 'COMMUTATIVE = frozenset({"graph.add", "graph.mul"})\n'
    tree = ast.parse(code)
    assert {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)} & graph_op_names() == {
        "graph.add", "graph.mul"}


@pytest.fixture
def hypot():
    """A new op, defined outside gc, that says it is commutative and cheap enough to follow its operands'
    precision; removed from the registry afterwards."""
    op = binary("test.hypot", np.hypot, "sqrt(a^2 + b^2)", commutative=True, precision="follow")
    yield op
    del OP_REGISTRY["test.hypot"]


def test_cse_merges_a_new_commutative_op_with_its_operands_swapped(hypot) -> None:
    m = parse("func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {\n"
              "  %a = test.hypot(%x, %y)\n  %b = test.hypot(%y, %x)\n  %c = graph.add(%a, %b)\n  return %c\n}\n")
    run_pipeline(m, "cse,dce")
    assert [op.name for op in m["main"].ops] == ["test.hypot", "graph.add"]


def test_mixed_precision_lets_a_new_follow_op_run_low(hypot) -> None:
    m = parse("func @main(%x: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {\n"
              "  %a = graph.matmul(%x, %w)\n  %b = test.hypot(%a, %a)\n  %c = graph.matmul(%b, %w)\n"
              "  return %c\n}\n")
    run_pipeline(m, "mixed-precision{dtype=f16}")
    (h,) = [op for op in m["main"].ops if op.name == "test.hypot"]
    assert str(h.result.type.dtype) == "f16"
