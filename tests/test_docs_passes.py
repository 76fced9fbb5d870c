"""docs/passes.md shows each pass with a before/after example: this test reruns every one of them.

An example is a ```gir block whose first line is `// gc opt -p PIPELINE` (the input), followed by
the next ```gir block (the output gc prints). Every registered pass must have an example.
"""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from compiler.parser import parse
from compiler.passes import load_all
from compiler.pipeline import run_pipeline
from compiler.printer import print_module

DOC = ROOT / "docs" / "passes.md"


def examples() -> list[tuple[str, str, str]]:
    blocks = re.findall(r"```gir\n(.*?)```", DOC.read_text(), re.S)
    out = []
    for i, block in enumerate(blocks):
        m = re.match(r"// gc opt -p (\S+)\n", block)
        if m:
            out.append((m.group(1), block[m.end() :], blocks[i + 1]))
    return out


EXAMPLES = examples()


@pytest.mark.parametrize("pipeline, before, after", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_documented_example_is_what_gc_prints(pipeline: str, before: str, after: str) -> None:
    module = parse(before, "passes.md")
    run_pipeline(module, pipeline)
    assert print_module(module) == after


def test_every_pass_is_documented_with_an_example() -> None:
    documented = {p.split("{")[0] for pipeline, _, _ in EXAMPLES for p in pipeline.split(",")}
    missing = sorted(n for n in load_all() if not n.startswith("test-") and n not in documented)
    assert not missing, f"docs/passes.md has no example for: {', '.join(missing)}"
