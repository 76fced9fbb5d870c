"""The random-module strategy (tests/strategies.py): valid modules that round trip, run, and cover the op set."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from strategies import all_op_names, modules, op_names

from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import DType, Module
from compiler.parser import parse
from compiler.printer import print_module
from compiler.verifier import verify_module

RANDOM = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JUMPY = {"graph.floor", "graph.ceil", "graph.equal", "graph.less", "graph.greater", "graph.where", "graph.argmax"}


def sample(n: int, **kwargs) -> list[Module]:
    """The same `n` modules of the strategy with these options every run (generation only, derandomized),
    so that assertions about what they hold are stable."""
    out: list[Module] = []

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate], deadline=None)
    @given(modules(**kwargs))
    def collect(m: Module) -> None:
        out.append(m)

    collect()
    return out


@pytest.fixture(scope="module")
def modules_sample() -> list[Module]:
    return sample(400)  # (as the op set grows, more modules to see most of it)


@RANDOM
@given(modules())
def test_generated_modules_verify_and_round_trip(m: Module) -> None:
    verify_module(m)
    text = print_module(m)
    assert print_module(parse(text, "random.gir")) == text


@RANDOM
@given(modules())
def test_generated_modules_run_with_declared_types(m: Module) -> None:
    f = m["main"]
    with np.errstate(all="ignore"):
        outs = run(m, random_inputs(f, 0))
    assert [(o.shape, o.dtype) for o in outs] == [(t.shape, t.dtype.np) for t in f.result_types]


def test_strategy_covers_most_of_the_op_set(modules_sample: list[Module]) -> None:
    seen = set().union(*(op_names(m) for m in modules_sample))
    ops = all_op_names()
    missing = sorted(ops - seen)
    assert len(ops & seen) >= 0.9 * len(ops), f"never generated: {missing}"


def test_modules_return_one_to_three_values(modules_sample: list[Module]) -> None:
    counts = Counter(len(m["main"].results) for m in modules_sample)
    assert set(counts) == {1, 2, 3}


def test_modules_hold_what_passes_look_for(modules_sample: list[Module]) -> None:
    def has(m: Module, pred) -> bool:
        return any(pred(op, m["main"]) for op in m["main"].ops)

    def exact(value: float):
        return lambda op, f: op.name == "graph.constant" and bool(np.all(op.value.array == value))

    def repeated(op, f) -> bool:
        same = (o for o in f.ops if o is not op and o.name == op.name)
        return any(o.operands == op.operands and o.attrs == op.attrs for o in same)

    def conv_then_batch_norm(op, f) -> bool:
        return op.name == "graph.batch_norm" and getattr(op.operands[0].owner, "name", "") == "graph.conv2d"

    found = {
        "zero": sum(has(m, exact(0)) for m in modules_sample),
        "one": sum(has(m, exact(1)) for m in modules_sample),
        "repeat": sum(has(m, repeated) for m in modules_sample),
        "conv+bn": sum(has(m, conv_then_batch_norm) for m in modules_sample),
    }
    assert all(n >= 3 for n in found.values()), found


def test_dtypes_are_mostly_f32_with_some_f64_and_integers(modules_sample: list[Module]) -> None:
    dtypes = Counter(a.type.dtype for m in modules_sample for a in m["main"].args)
    assert dtypes[DType.f32] > sum(dtypes.values()) / 2
    assert dtypes[DType.f64] and (dtypes[DType.i32] or dtypes[DType.i64])


def test_continuous_modules_leave_out_ops_that_jump() -> None:
    for m in sample(100, continuous=True):
        assert not op_names(m) & JUMPY, print_module(m)
        computed = [op for op in m["main"].ops if op.name != "graph.constant"]  # int constants: gather indices
        assert all(r.type.dtype.is_float for op in computed for r in op.results), print_module(m)


def test_empty_integer_constants_round_trip() -> None:
    text = (
        "func @main() -> tensor<0x1xi64> {\n"
        "  %c = graph.constant {value = dense<0> : tensor<0x1xi64>} : tensor<0x1xi64>\n"
        "  return %c\n"
        "}\n"
    )
    assert print_module(parse(text)) == text  # the strategy makes such constants (a concat of nothing, ...)
