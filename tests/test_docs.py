"""The docs stay true: docs/ops.md is what tools/gen_op_docs.py writes, both references name every op,
and every complete example of docs/ir.md parses."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest
from conftest import ROOT

import dialects  # noqa: F401  (registers every op)
from compiler.ir import OP_REGISTRY
from compiler.parser import parse

DOCS = ROOT / "docs"
# Ops a test file defines for itself live outside dialects/ and are no part of the language.
OPS = sorted(name for name, cls in OP_REGISTRY.items() if cls.__module__.startswith("dialects."))


def load_generator() -> ModuleType:
    """tools/gen_op_docs.py as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("gen_op_docs", ROOT / "tools" / "gen_op_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mentions(text: str, name: str) -> bool:
    """Whether `text` names the op `name` itself (graph.split, not graph.split_x)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", text) is not None


def test_ops_md_is_what_the_generator_writes() -> None:
    assert (DOCS / "ops.md").read_text() == load_generator().render(), (
        "docs/ops.md is stale: run python tools/gen_op_docs.py"
    )


@pytest.mark.parametrize("doc", ["ops.md", "ir.md"])
def test_every_op_is_documented(doc: str) -> None:
    text = (DOCS / doc).read_text()
    missing = [name for name in OPS if not mentions(text, name)]
    assert not missing, f"docs/{doc} does not mention {', '.join(missing)}"


def test_ir_md_table_row_of_each_op_names_its_operands_and_attributes() -> None:
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([\w.]+)` \|.*$", (DOCS / "ir.md").read_text(), re.M)}
    missing = []
    for name in OPS:
        cls = OP_REGISTRY[name]
        wanted = [rf"%{s.name}\b" for s in cls.operand_specs] + [rf"`{key}\b" for key in cls.attr_specs]
        missing += [f"{name}: {w}" for w in wanted if name in rows and not re.search(w, rows[name])]
    assert not missing, "docs/ir.md's op table leaves out: " + "; ".join(missing)


def test_ir_md_gir_examples_parse() -> None:
    text = (DOCS / "ir.md").read_text()
    blocks = list(re.finditer(r"^```gir\n(.*?)^```", text, re.M | re.S))
    assert blocks
    for m in blocks:
        # A GCError here names the example's true line in docs/ir.md and what is wrong with it.
        parse(m.group(1), "docs/ir.md", line_offset=text.count("\n", 0, m.start(1)))
