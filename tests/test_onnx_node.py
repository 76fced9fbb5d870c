"""The ONNX backend node tests (tools/onnx_node_tests.py) against tests/onnx_node_expected.txt: a case the list
does not name must pass, a case it names must end as the list says (so a case that starts passing is
taken off the list, and a new way of failing is seen); no case may crash gc. Every case runs on the
interpreter (seconds), every fourth compiled; GC_ONNX_NODE=all compiles every case (about a minute). The
list is written for one onnx version (its header says which): with another, the cases differ and the
module is skipped."""

from __future__ import annotations

import os
import sys
from functools import cache

import pytest
from conftest import ROOT

pytest.importorskip("onnx")
sys.path.insert(0, str(ROOT / "tools"))

import onnx_node_tests as nodes  # noqa: E402

ALL = os.environ.get("GC_ONNX_NODE", "") == "all"
if nodes.written_for() != nodes.onnx_version():
    pytest.skip(f"tests/onnx_node_expected.txt was written for onnx {nodes.written_for()}, this is "
                f"{nodes.onnx_version()}: its cases and data differ", allow_module_level=True)


@cache
def _cases() -> dict:
    return {c.name: c for c in nodes.cases()}


def _names(every: int) -> list[str]:
    try:
        names = sorted(_cases())
    except Exception:  # noqa: BLE001 (an onnx without the node cases: nothing to parametrize)
        return []
    return names if ALL else names[::every]


@cache
def _expected() -> dict:
    return nodes.read_expected()


@pytest.mark.parametrize("name", _names(1))
def test_node_case_on_the_interpreter(name: str) -> None:
    outcome, reason = nodes.run_case(_cases()[name], "interp")
    assert outcome != "crash", f"{name}: gc crashed: {reason}"
    want, why = _expected().get(name, ("pass", ""))
    assert (outcome, reason) == (want, why), (
        f"{name}: {outcome} ({reason or 'all outputs right'}), the list says {want} ({why or 'pass'}): fix gc, or "
        "rewrite the list with python tools/onnx_node_tests.py --write-expected")


@pytest.mark.parametrize("name", _names(4))
def test_node_case_compiled(name: str) -> None:
    """What the interpreter passes, the compiled code passes too."""
    if name in _expected():
        pytest.skip(f"not passing on the interpreter: {_expected()[name][0]}")
    outcome, reason = nodes.run_case(_cases()[name], "llvm")
    assert outcome == "pass", f"{name} compiled: {outcome} ({reason})"


def test_the_list_names_only_cases_that_exist_and_gives_a_reason_for_each() -> None:
    expected = _expected()
    assert expected, "tests/onnx_node_expected.txt is missing or empty"
    missing = sorted(set(expected) - set(_cases()))
    assert not missing, f"the list names cases onnx does not have: {missing[:5]}"
    assert all(o in nodes.OUTCOMES and o not in ("pass", "crash") and r for o, r in expected.values())
