"""The Python API's edge: a wrong argument raises GCError saying what the function takes, never a raw
TypeError or AttributeError from inside gc; inputs are cast within a kind only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import compiler
from compiler.diagnostics import GCError
from conftest import ROOT

MLP = ROOT / "examples" / "mlp.gir"
RELU = "func @main(%x: tensor<3xf32>) -> tensor<3xf32> {\n  %y = graph.relu(%x)\n  return %y\n}\n"


@pytest.mark.parametrize("call, message", [
    (lambda: compiler.compile(None), "compile() takes a .gir path, GIR text or a Module, not None"),
    (lambda: compiler.compile(42), "compile() takes a .gir path, GIR text or a Module, not an int"),
    (lambda: compiler.compile("net"), "compile(): no such file: net"),
    (lambda: compiler.compile(str(MLP), params=[1, 2]), "params is a dict of arrays by argument name, not a list"),
    (lambda: compiler.compile(str(MLP), "x86"), "unknown target 'x86'; targets: llvm, cuda"),
    (lambda: compiler.compile(str(MLP), entry=3), "compile(): entry is a string, not an int"),
    (lambda: compiler.load(42), "load() takes a path, not an int"),
    (lambda: compiler.load("nowhere.gcpkg"), "load(): no such file: nowhere.gcpkg"),
    (lambda: compiler.run(None, []), "run() takes a Module (from parse or parse_file), not None"),
    (lambda: compiler.run(compiler.parse(RELU), None), "run() takes the inputs as a dict by argument name"),
    (lambda: compiler.parse(None), "parse() takes GIR text (str or UTF-8 bytes), not None"),
    (lambda: compiler.parse(b"\xff"), "<bytes>:1:1: error: invalid UTF-8 (byte ff)"),
    (lambda: compiler.parse_file(3), "parse_file() takes a path, not an int"),
], ids=range(13))
def test_a_wrong_argument_is_a_gc_error(call, message: str) -> None:
    with pytest.raises(GCError) as e:
        call()
    assert message in e.value.render()


def test_sources_as_text_bytes_paths_and_modules() -> None:
    x = np.array([-1, 0, 2], np.float32)
    for source in (RELU, RELU.encode(), compiler.parse(RELU)):
        np.testing.assert_array_equal(compiler.compile(source)(x)[0], [0, 0, 2])
    assert compiler.compile(MLP).num_kernels == compiler.compile(str(MLP)).num_kernels == 3


@pytest.mark.parametrize("runner", ["interp", "llvm"])
def test_inputs_cast_within_a_kind_only(runner: str) -> None:
    call = (lambda x: compiler.run(compiler.parse(RELU), [x])[0]) if runner == "interp" else compiler.compile(RELU)
    one = (lambda x: call(x)) if runner == "interp" else (lambda x: call(x)[0])
    np.testing.assert_array_equal(one(np.array([-1.0, 0.5, 2.0])), [0, 0.5, 2])  # f64 -> f32
    for bad in (np.array([1, 2, 3], np.int32), np.array([True, False, True])):
        with pytest.raises(GCError, match=f"input 'x' has dtype {bad.dtype}"):
            one(bad)


def test_the_api_docstring_says_artifacts_must_be_trusted() -> None:
    assert "only artifacts from a source you trust" in " ".join(compiler.load.__doc__.split())
    assert Path(compiler.__file__).parent.name == "compiler"
