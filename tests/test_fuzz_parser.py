"""Mutate valid .gir files at random: the parser, verifier and interpreter may only ever raise GCError.

GC_FUZZ_EXAMPLES=100000 pytest tests/test_fuzz_parser.py runs it for as long as you like.
"""

from __future__ import annotations

import os

import numpy as np
from conftest import gir_files, split_chunks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run_func
from compiler.parser import parse
from compiler.printer import print_module


def _valid_sources() -> list[str]:
    out = []
    for path in gir_files():
        for chunk, _ in split_chunks(path.read_text()):
            try:
                parse(chunk)
            except GCError:
                continue
            out.append(chunk)
    return out


SOURCES = _valid_sources()
TOKENS = [
    "%x", "%0", "%undefined", "@main", "graph.add", "graph.matmul", "graph.reshape", "graph.split", "matmul",
    "(", ")", "{", "}", "[", "]", "<", ">", ",", ":", "=", "->", "-1", "0", "3", "1e-5", "inf", "nan", "true",
    '"tanh"', "f16", "i64", "tensor<4xf32>", "tensor<f32>", "tensor<2x0xi1>", "dense<1.0>", "return", "func",
    "axis = -1", "perm = [1, 0]", "// c\n", "\n", " ", "9223372036854775808", "loc(\"a.gir\":1:2)",
]  # fmt: skip


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "swap_lines", "digit"]))
        if kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 12)) :]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif kind == "replace":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i + draw(st.integers(1, 8)) :]
        elif kind == "digit":
            digits = [k for k, c in enumerate(text) if c.isdigit()]
            if digits:
                k = draw(st.sampled_from(digits))
                text = text[:k] + draw(st.sampled_from("0123456789")) + text[k + 1 :]
        else:
            lines = text.split("\n")
            a, b = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
    return text


def _small(module) -> bool:
    return all(v.type.nbytes < 1 << 20 for f in module for v in f.values())


@settings(
    max_examples=int(os.environ.get("GC_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated())
def test_mutated_input_only_ever_raises_diagnostics(text: str) -> None:
    try:
        module = parse(text, "fuzz.gir")
    except GCError as e:
        assert e.diagnostics and all(d.message for d in e.diagnostics)
        return
    printed = print_module(module)
    assert print_module(parse(printed)) == printed
    if not _small(module):
        return
    for f in module:
        try:
            with np.errstate(all="ignore"):
                run_func(module, f, [random_inputs(f, 0)[a.name] for a in f.args])
        except GCError:
            pass
