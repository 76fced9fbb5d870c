"""winograd: 3x3 stride-1 convs of bound weights run as two transforms around a batched matmul on the CPU;
compiled, they compute what the interpreter does (f32 within Winograd's rounding), each kernel on its rule
(no generic fallback), whether their input and output are NCHW, channel-blocked or bordered; what the pass
must leave alone, it does."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_pass_leaves_alone, calls_on_nan_arena

import compiler
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.parser import parse
from compiler.pipeline import parse_pipeline, run_pipeline


def conv(n: int, c: int, o: int, h: int, w: int | None = None, pad: int = 1, epilogue: str = "relu",
         attrs: str = "", k: int = 3, stride: int = 1, dilation: int = 1) -> str:
    """conv2d + epilogue of a function's argument into its result (both NCHW)."""
    w = w or h
    oh, ow = ((d + 2 * pad - dilation * (k - 1) - 1) // stride + 1 for d in (h, w))
    attrs += f", strides = [{stride}, {stride}]" if stride > 1 else ""
    attrs += f", dilations = [{dilation}, {dilation}]" if dilation > 1 else ""
    y = f"tensor<{n}x{o}x{oh}x{ow}xf32>"
    tail = {"relu": f"  %z = graph.relu(%y) : {y}\n",
            "residual": f"  %a = graph.add(%y, %r) : {y}\n  %z = graph.relu(%a) : {y}\n",
            "silu": f"  %s = graph.sigmoid(%y) : {y}\n  %z = graph.mul(%y, %s) : {y}\n"}[epilogue]
    extra = f", %r: {y}" if epilogue == "residual" else ""
    return (f"func @main(%x: tensor<{n}x{c}x{h}x{w}xf32>, %w: tensor<{o}x{c}x{k}x{k}xf32>, %b: tensor<{o}xf32>{extra}) "
            f"-> {y} {{\n  %y = graph.conv2d(%x, %w, %b) {{padding = [{pad}, {pad}, {pad}, {pad}]{attrs}}} : {y}\n"
            f"{tail}  return %z\n}}\n")


def between_convs(n: int, c: int, o: int, h: int) -> str:
    """The 3x3 conv between two 1x1 convs: its input and output are kernels' tensors, blocked where every
    kernel takes them so, and its input bordered for it."""
    t = lambda ch: f"tensor<{n}x{ch}x{h}x{h}xf32>"  # noqa: E731
    return (f"func @main(%x: {t(c)}, %w0: tensor<{c}x{c}x1x1xf32>, %w: tensor<{o}x{c}x3x3xf32>, %b: tensor<{o}xf32>, "
            f"%w2: tensor<{o}x{o}x1x1xf32>) -> {t(o)} {{\n"
            f"  %x0 = graph.conv2d(%x, %w0) : {t(c)}\n  %x1 = graph.relu(%x0) : {t(c)}\n"
            f"  %y = graph.conv2d(%x1, %w, %b) {{padding = [1, 1, 1, 1]}} : {t(o)}\n  %z = graph.relu(%y) : {t(o)}\n"
            f"  %q = graph.conv2d(%z, %w2) : {t(o)}\n  return %q\n}}\n")


def compiled(text: str, weights=("w", "b"), pipeline: str | None = None):
    module = parse(text)
    inputs = random_inputs(module["main"], 0, module)
    want = run(module, inputs)[0]
    model = compiler.compile(text, "llvm", params={k: inputs[k] for k in weights}, pipeline=pipeline, cache=False)
    args = {k: v for k, v in inputs.items() if k not in weights}
    return model, args, want


def check(model, args, want) -> None:
    """Right on every call, also on an arena of NaN bytes (a border or tile left unwritten would show);
    f32 within Winograd's rounding of the outputs' scale."""
    calls_on_nan_arena(model, args, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


WINOGRAD = [("winograd_input",), ("matmul",)]


@pytest.mark.parametrize("text", [
    conv(1, 32, 32, 14),  # 14x14: tiles of 4 past the map's edge
    conv(2, 24, 40, 13, 11, epilogue="residual"),  # vectors of 8 channels on AVX-512; odd, unequal sides
    conv(1, 16, 16, 16, pad=0),  # a valid conv
    conv(1, 16, 48, 13, epilogue="silu"),  # an epilogue that reads the conv twice
    conv(4, 64, 16, 7),  # 7x7 maps, a batch of 4: enough tiles
])  # fmt: skip
def test_nchw_convs_run_as_winograd_on_its_rules(text: str) -> None:
    model, args, want = compiled(text)
    steps = [(s.ops, s.schedule) for s in model.plan.steps if s.kernel]
    assert [ops for ops, _ in steps[:2]] == WINOGRAD and steps[2][0][0] == "winograd_output"
    assert [rule for _, rule in steps] == ["winograd", "matmul", "winograd"]
    check(model, args, want)


@pytest.mark.parametrize("n, c, o, h", [(1, 32, 32, 16), (2, 64, 32, 10)])
def test_between_convs_the_transforms_take_blocked_and_bordered_tensors_as_they_lie(n, c, o, h) -> None:
    model, args, want = compiled(between_convs(n, c, o, h), ("w0", "w", "b", "w2"))
    rules = {s.ops[0]: s.schedule for s in model.plan.steps if s.kernel}
    assert rules["winograd_input"] == rules["winograd_output"] == "winograd" and rules["matmul"] == "matmul"
    buffers = model.plan.buffers
    read = next(s for s in model.plan.steps if s.kernel and s.ops[0] == "winograd_input").buffers[0]
    written = next(s for s in model.plan.steps if s.kernel and s.ops[0] == "winograd_output").buffers[-1]
    assert buffers[read].kind == "whole"  # the 1x1 conv wrote the border the transform reads through
    # ... down to the last tile's edge (10x10 at m = 4: 3 tiles reading rows -1 to 12): no load is guarded
    t = -(-h // 4)
    pads = buffers[buffers[read].of].pads  # (begin of each dim, then end; NCHW or NCHW[c]c)
    assert pads[len(pads) // 2 :][2:4] == (4 * t + 1 - h, 4 * t + 1 - h)
    assert "if_then_else" not in model.scheduled["winograd_input"].script()
    assert buffers[buffers[read].of].layout.startswith("NCHW") and buffers[written].layout.startswith("NCHW")
    check(model, args, want)


@pytest.mark.parametrize("tile", [2, 3, 5, 6])
def test_every_tile_size_compiles_on_the_rules(tile: int) -> None:
    from compiler.pipeline import PIPELINES

    pipeline = PIPELINES["compile-llvm"].replace(",winograd", f",winograd{{tile={tile},min-tiles=1}}")
    model, args, want = compiled(conv(2, 16, 32, 11, 13, epilogue="residual"), pipeline=pipeline)
    assert [s.schedule for s in model.plan.steps if s.kernel] == ["winograd", "matmul", "winograd"]
    check(model, args, want)


@pytest.mark.parametrize("text", [
    conv(1, 18, 32, 14),  # input channels no vector divides: one lane at a time, still on the rule
    conv(1, 32, 58, 14),  # pad-channels widened the conv to 64: the output writes 58 through a slice
])  # fmt: skip
def test_channels_no_vector_divides(text: str) -> None:
    model, args, want = compiled(text)
    assert [s.schedule for s in model.plan.steps if s.kernel] == ["winograd", "matmul", "winograd"]
    check(model, args, want)


def test_a_tile_size_without_points_is_refused() -> None:
    from compiler.diagnostics import GCError

    with pytest.raises(GCError, match="tile must be one of"):
        run_pipeline(parse(conv(1, 16, 16, 16)), "winograd{tile=7}")


@pytest.mark.parametrize("text", [
    conv(1, 16, 16, 32, stride=2),
    conv(1, 16, 16, 16, dilation=2, pad=2),
    conv(1, 16, 16, 16, attrs=", groups = 2").replace("tensor<16x16x3x3", "tensor<16x8x3x3"),
    conv(1, 16, 16, 16, k=1, pad=0),
    conv(1, 3, 32, 32),  # few input channels: the transforms would cost what the matmul saves
    conv(1, 64, 64, 7),  # 4 tiles: the transformed weights outweigh what they save
    conv(1, 16, 16, 16).replace("f32", "f64"),
], ids=["strided", "dilated", "grouped", "1x1", "rgb", "7x7", "f64"])  # fmt: skip
def test_what_would_not_pay_or_cannot_be_converted_stays(text: str) -> None:
    assert_pass_leaves_alone(text, "winograd", "convs-converted")


def test_weights_passed_per_call_stay() -> None:
    module = parse(conv(1, 32, 32, 16))
    (p,) = parse_pipeline("winograd")
    run_pipeline(module, [p])
    assert p.stats["convs-converted"] == 0
    model, args, want = compiled(conv(1, 32, 32, 16), weights=())
    assert [s.schedule for s in model.plan.steps if s.kernel] == ["conv2d"]
