"""Corrupt a saved artifact at random: loading may only ever raise GCError, and a model that still loads
(a byte of zip padding, say) computes what it did. GC_FUZZ_EXAMPLES=5000 runs it as long as you like."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compiler
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.parser import parse_file
from conftest import ROOT

CNN = ROOT / "examples" / "cnn.gir"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[bytes, dict, np.ndarray]:
    path = tmp_path_factory.mktemp("fuzz") / "cnn.gcpkg"
    module = parse_file(CNN)
    inputs = random_inputs(module["main"], 0, module)
    model = compiler.compile(str(CNN), "llvm", params={k: v for k, v in inputs.items() if k != "x"})
    model.save(path)
    return path.read_bytes(), {"x": inputs["x"]}, model(x=inputs["x"])[0]


@st.composite
def corruption(draw, size: int) -> list[tuple[str, int, int]]:
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "zero"]))
        edits.append((kind, draw(st.integers(0, size - 1)), draw(st.integers(1, 255))))
    return edits


def corrupt(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, at, value in edits:
        at = min(at, max(len(out) - 1, 0))
        if kind == "flip" and out:
            out[at] ^= value
        elif kind == "truncate":
            del out[at:]
        elif kind == "insert":
            out[at:at] = bytes([value]) * (value % 7 + 1)
        elif kind == "delete":
            del out[at : at + value]
        elif kind == "zero":
            out[at : at + value] = bytes(len(out[at : at + value]))
    return bytes(out)


@settings(max_examples=int(os.environ.get("GC_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_corrupted_artifact_is_a_diagnostic_or_still_right(good, tmp_path_factory, data) -> None:
    raw, inputs, want = good
    bad = corrupt(raw, data.draw(corruption(len(raw))))
    path: Path = tmp_path_factory.mktemp("c") / "bad.gcpkg"
    path.write_bytes(bad)
    try:
        model = compiler.load(path)
    except GCError as e:
        assert e.render().startswith(f"error: cannot load {path}: ")
        return
    np.testing.assert_array_equal(model(**inputs)[0], want)
