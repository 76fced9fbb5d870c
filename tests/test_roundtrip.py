"""print ∘ parse is the identity: on every .gir in the repo, and on the examples to the character."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, gir_files, split_chunks

from compiler.diagnostics import GCError
from compiler.parser import parse
from compiler.printer import print_module

FILES = gir_files()


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_print_parse_is_a_fixed_point(path: Path) -> None:
    parsed = 0
    for chunk, offset in split_chunks(path.read_text()):
        try:
            module = parse(chunk, str(path), line_offset=offset)
        except GCError:
            continue  # the chunks of invalid.gir files are meant to fail
        text = print_module(module)
        again = print_module(parse(text, "<printed>"))
        assert again == text
        with_locs = print_module(module, debuginfo=True)
        assert print_module(parse(with_locs, "<printed>"), debuginfo=True) == with_locs
        parsed += 1
    if "invalid" not in path.name:
        assert parsed, f"{path} holds no valid module"


EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_examples_are_printed_exactly_as_written(path: Path) -> None:
    text = path.read_text()
    uncommented = "".join(line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("//"))
    assert print_module(parse(text, str(path))) == uncommented


def test_debuginfo_locations_survive_a_round_trip() -> None:
    text = "func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = graph.relu(%x)\n  return %y\n}\n"
    printed = print_module(parse(text, "net.gir"), debuginfo=True)
    assert '%y = graph.relu(%x) : tensor<4xf32> loc("net.gir":2:8)' in printed
    again = parse(printed, "other.gir")
    assert str(again["main"].ops[0].loc) == "net.gir:2:8"


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_debuginfo_printing_is_a_fixed_point_after_the_passes_too(path: Path) -> None:
    """Passes make functions whose arguments have no location of their own (fuse's kernels): printed with
    their function's, they read back to the same text."""
    from compiler.pipeline import run_pipeline

    module = parse(path.read_text(), str(path))
    run_pipeline(module, "canonicalize,fold-constants,cse,dce,fuse")
    printed = print_module(module, debuginfo=True)
    assert print_module(parse(printed, "<printed>"), debuginfo=True) == printed


def test_a_constant_of_zeros_of_both_signs_prints_each() -> None:
    """0.0 and -0.0 compare equal but divide differently: the printer writes no splat for them (the compile
    cache keys a Module by its printed text)."""
    from compiler.parser import parse
    from compiler.printer import print_module

    text = ("func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
            "  %c = graph.constant {value = dense<[0.0, -0.0]> : tensor<2xf32>}\n"
            "  %y = graph.div(%x, %c)\n  return %y\n}\n")
    printed = print_module(parse(text))
    assert "dense<[0.0, -0.0]>" in printed
    assert print_module(parse(printed)) == printed
