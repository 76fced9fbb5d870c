"""subsample: a strided 1x1 conv reads a compact strided slice of its input with a stride-1 conv; its
values are the original's on every size and stride; what it must leave alone, it does."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_pass_leaves_alone
from hypothesis import given, settings
from hypothesis import strategies as st

import compiler
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.parser import parse
from compiler.pipeline import run_pipeline


def conv(c: int = 128, h: int = 9, w: int = 9, stride: tuple[int, int] = (2, 2), k: int = 1, pad: int = 0,
         groups: int = 1, bias: bool = True) -> str:
    oh, ow = (h + 2 * pad - k) // stride[0] + 1, (w + 2 * pad - k) // stride[1] + 1
    b = ", %b" if bias else ""
    return (f"func @main(%x: tensor<1x{c}x{h}x{w}xf32>, %w: tensor<16x{c // groups}x{k}x{k}xf32>, %b: tensor<16xf32>) "
            f"-> tensor<1x16x{oh}x{ow}xf32> {{\n  %r = graph.relu(%x)\n"
            f"  %y = graph.conv2d(%r, %w{b}) {{strides = [{stride[0]}, {stride[1]}], padding = [{pad}, {pad}, {pad}, {pad}], "
            f"groups = {groups}}}\n  return %y\n}}\n")


@settings(max_examples=12, deadline=None)
@given(h=st.integers(1, 12), w=st.integers(1, 12), sh=st.integers(1, 3), sw=st.integers(2, 3), bias=st.booleans())
def test_the_rewrite_keeps_every_value(h: int, w: int, sh: int, sw: int, bias: bool) -> None:
    text = conv(h=h, w=w, stride=(sh, sw), bias=bias)
    module = parse(text)
    inputs = random_inputs(module["main"], 0, module)
    want = run(module, inputs)[0]
    run_pipeline(module, "subsample")
    ops = [op.name for op in module["main"].ops]
    assert "graph.slice" in ops
    conv_op = next(op for op in module["main"].ops if op.name == "graph.conv2d")
    assert tuple(conv_op.strides) == (1, 1)
    np.testing.assert_allclose(run(module, inputs)[0], want, rtol=1e-6, atol=1e-6)


def test_compiled_it_reads_the_compact_slice_and_matches_the_interpreter() -> None:
    """ResNet's 1x1 downsample as the CPU build runs it: a strided copy, then the conv rule on a stride-1
    conv; the values are the interpreter's."""
    text = conv(c=256, h=14, w=14)
    module = parse(text)
    inputs = random_inputs(module["main"], 0, module)
    want = run(module, inputs)[0]
    model = compiler.compile(text, "llvm", params={"w": inputs["w"], "b": inputs["b"]}, cache=False)
    calls = [c for c in model.plan.steps if c.kernel]
    assert any("slice" in c.ops for c in calls)
    assert [c.schedule for c in calls if "conv2d" in c.ops] == ["conv2d"]
    np.testing.assert_allclose(model(inputs["x"])[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("text", [conv(stride=(1, 1)), conv(k=3, pad=1), conv(pad=1), conv(groups=2), conv(c=64)],
                         ids=["stride 1", "3x3", "padded", "grouped", "few channels"])
def test_what_it_cannot_or_need_not_compact_stays(text: str) -> None:
    assert_pass_leaves_alone(text, "subsample", "convs-subsampled")
