"""pad-channels: a conv of an odd number of output channels computes a padded vector block and writes the
real channels from its epilogue; what it must leave alone, it does."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_pass_leaves_alone

import compiler
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.parser import parse
from compiler.pipeline import parse_pipeline, run_pipeline


def conv(o: int, groups: int = 1, c: int | None = None) -> str:
    c = c or (6 if groups == 1 else o)
    return (f"func @main(%x: tensor<1x{c}x9x9xf32>, %w: tensor<{o}x{c // groups}x3x3xf32>, %b: tensor<{o}xf32>) "
            f"-> tensor<1x{o}x9x9xf32> {{\n  %y = graph.conv2d(%x, %w, %b) {{padding = [1, 1, 1, 1], groups = {groups}}}\n"
            "  %z = graph.relu(%y)\n  return %z\n}\n")


@pytest.mark.parametrize("o", [10, 58, 116])  # 116 = 4 x 29: 12 channels more make 8 whole registers
def test_a_conv_of_odd_channels_takes_the_vector_rule_and_writes_only_its_channels(o: int) -> None:
    text = conv(o)
    module = parse(text)
    inputs = random_inputs(module["main"], 0, module)
    want = run(module, inputs)[0]
    model = compiler.compile(text, "llvm", params={"w": inputs["w"], "b": inputs["b"]})
    calls = [c for c in model.plan.steps if c.kernel]
    assert [(c.ops, c.schedule) for c in calls] == [(("conv2d", "slice", "relu"), "conv2d")]
    np.testing.assert_allclose(model(inputs["x"])[0], want, rtol=1e-4, atol=1e-5)


@pytest.fixture(params=[False, True], ids=["halves-fma", "wide-fma"])
def wide(request, monkeypatch) -> bool:
    """The answer of target.wide_fma the pass sees: each rule tested on every host."""
    from compiler.codegen import target

    monkeypatch.setattr(target, "wide_fma", lambda: request.param)
    return request.param


@pytest.mark.parametrize("text", [conv(12), conv(24), conv(6), conv(8), conv(10, groups=10)],
                         ids=["multiple-of-4", "a third more", "few", "twice as many", "grouped"])
def test_what_needs_no_padding_or_cannot_take_it_stays(text: str, wide: bool) -> None:
    # (with 6 input channels each output sums 54 products: not FMA-bound, so a wide unit changes nothing)
    assert_pass_leaves_alone(text, "pad-channels", "convs-padded")


@pytest.mark.parametrize("o, c, padded", [(12, 8, 16), (24, 8, 32), (40, 8, 48), (116, 8, 128), (8, 8, None),
                                          (24, 3, None), (116, 3, 128)])
def test_a_cpu_with_wide_fmas_pads_to_whole_registers(monkeypatch, o: int, c: int, padded: int | None) -> None:
    """Where a 512-bit FMA runs as fast as a 256-bit one, a conv whose channels fill no whole register
    computes padded ones where that adds up to half of them (not 8 -> 16), if each output sums enough
    products to be bound by its FMAs (an RGB stem's 27 are not: only the usual eighth); the result is
    unchanged."""
    from compiler.codegen import target

    monkeypatch.setattr(target, "wide_fma", lambda: True)
    text = conv(o, c=c)
    module = parse(text)
    inputs = random_inputs(module["main"], 0, module)
    want = run(module, inputs)[0]
    module = parse(text)
    from compiler.builder import bind_arguments

    bind_arguments(module["main"], {"w": inputs["w"], "b": inputs["b"]})
    run_pipeline(module, parse_pipeline("pad-channels"))
    convs = [op for op in module["main"].ops if op.name == "graph.conv2d"]
    assert [c.result.type.shape[1] for c in convs] == [padded or o]
    np.testing.assert_allclose(run(module, {"x": inputs["x"]})[0], want, rtol=1e-5, atol=1e-6)


def test_wide_fma_is_measured_only_for_this_hosts_avx512(monkeypatch) -> None:
    from compiler.codegen import target

    assert isinstance(target.wide_fma(), bool)
    target.wide_fma.cache_clear()
    monkeypatch.setenv("GC_CPU", "znver3")
    try:
        assert target.wide_fma() is False  # code for another CPU: nothing to measure it on
    finally:
        target.wide_fma.cache_clear()


def test_weights_passed_per_call_stay() -> None:
    module = parse(conv(10))
    (p,) = parse_pipeline("pad-channels")
    run_pipeline(module, [p])
    assert not any(op.name == "graph.slice" for op in module["main"].ops)
