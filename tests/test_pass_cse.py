"""cse: merged ops, what must not merge, locations, statistics, and outputs kept on examples and random modules.

`random_module` (a hypothesis strategy of small modules full of duplicates) and `assert_same_outputs` are
shared with the fold-constants and dce tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_outputs
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.builder import finish, new_func
from compiler.diagnostics import Location
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import DType, Module, TensorType
from compiler.parser import parse
from compiler.pipeline import parse_pipeline, run_pipeline

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))

# --- shared with test_pass_fold_constants.py and test_pass_dce.py ------------------------------

UNARY = ["neg", "abs", "relu", "tanh", "exp", "sqrt"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]
# Few distinct values, so that equal constants and equal ops come up often; -0.0 and 0.0 must stay apart.
CONSTANTS = [
    np.array([1.0, -2.0, 0.5], np.float32),
    np.array([[0.0, -0.0, 3.0], [1.0, 1.0, -1.5]], np.float32),
    np.array(2.0, np.float32),
    np.array([-0.0, -0.0, -0.0], np.float32),
]
ARG_TYPES = [TensorType((2, 3), DType.f32), TensorType((3,), DType.f32)]


@st.composite
def random_module(draw) -> Module:
    """@main over 0-2 arguments and a few constants: a random chain of elementwise ops and column sums,
    where ops often repeat an earlier one (operands swapped or not), and whose results are partly dead."""
    nargs = draw(st.integers(0, 2))
    f, b, args = new_func("main", {f"a{i}": ARG_TYPES[i] for i in range(nargs)})
    pool = list(args)  # `args` is f.args itself
    for k in draw(st.lists(st.integers(0, len(CONSTANTS) - 1), min_size=1 if nargs == 0 else 0, max_size=4)):
        pool.append(b.constant(CONSTANTS[k]))
    made: list[tuple[str, tuple[int, ...]]] = []
    for _ in range(draw(st.integers(1, 10))):
        if made and draw(st.booleans()):
            name, picks = draw(st.sampled_from(made))
            picks = picks[::-1] if draw(st.booleans()) else picks
        else:
            name = draw(st.sampled_from(UNARY + BINARY + ["reduce_sum"]))
            arity = 2 if name in BINARY else 1
            picks = tuple(draw(st.integers(0, len(pool) - 1)) for _ in range(arity))
        made.append((name, picks))
        operands = [pool[i] for i in picks]
        if name == "reduce_sum":  # a column sum: (2, 3) -> (1, 3), (3,) -> (), () -> ()
            rank = operands[0].type.rank
            pool.append(b.reduce_sum(*operands, axes=(0,), keepdims=rank > 1) if rank else b.reduce_sum(*operands))
        else:
            pool.append(getattr(b, name)(*operands))
    outs = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=3))
    return Module([finish(f, *(pool[i] for i in outs))])


def assert_same_outputs(before: Module, after: Module, entry: str = "main") -> None:
    """`after` computes exactly what `before` does on seeded inputs, in memory and after print -> parse."""
    f = before[entry]
    inputs = random_inputs(f, seed=0)
    kept = {a.name for a in after[entry].args}
    with np.errstate(all="ignore"):
        want = run(before, inputs, entry)
        for m in (after, parse(str(after), "<after>")):
            got = run(m, {k: v for k, v in inputs.items() if k in kept}, entry)
            assert_outputs(got, want)  # NaN matches NaN; exact otherwise


def run_pass(module: Module, pipeline: str):
    """Run `pipeline` (verifying after each pass) and return its passes, for their statistics."""
    passes = parse_pipeline(pipeline)
    run_pipeline(module, passes)
    return passes


# --- cse ----------------------------------------------------------------------------------------


def cse(text: str) -> tuple[Module, dict]:
    m = parse(text, "t.gir")
    (p,) = run_pass(m, "cse")
    return m, dict(+p.stats)  # + drops the counters left at zero


def test_identical_ops_merge_into_the_first() -> None:
    m, stats = cse(
        "func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
        "  %a = graph.relu(%x)\n  %b = graph.relu(%x)\n  return %a, %b\n}\n"
    )
    f = m["main"]
    assert [op.name for op in f.ops] == ["graph.relu"]
    assert f.results == [f.ops[0].result, f.ops[0].result] and f.ops[0].result.name == "a"
    assert stats == {"ops-merged": 1}


@pytest.mark.parametrize("op", ["add", "mul", "maximum", "minimum", "equal"])
def test_commutative_ops_merge_with_operands_swapped(op: str) -> None:
    m, stats = cse(
        "func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {\n"
        f"  %a = graph.{op}(%x, %y)\n  %b = graph.{op}(%y, %x)\n"
        "  %c = graph.cast(%a) {dtype = f32}\n  %d = graph.cast(%b) {dtype = f32}\n"
        "  %e = graph.broadcast_to(%c) {shape = [4, 4]}\n  %g = graph.broadcast_to(%d) {shape = [4, 4]}\n"
        "  return %e, %g\n}\n"
    )
    assert [op.name for op in m["main"].ops] == [f"graph.{op}", "graph.cast", "graph.broadcast_to"]
    assert stats == {"ops-merged": 3}


@pytest.mark.parametrize("op", ["sub", "div", "pow", "less", "greater"])
def test_non_commutative_ops_keep_swapped_operands_apart(op: str) -> None:
    m, stats = cse(
        "func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
        f"  %a = graph.{op}(%x, %y)\n  %b = graph.{op}(%y, %x)\n"
        "  %c = graph.cast(%a) {dtype = f32}\n  %d = graph.cast(%b) {dtype = f32}\n  return %c, %d\n}\n"
    )
    assert len(m["main"].ops) == 4 and stats == {}


@pytest.mark.parametrize(
    "first, second, result",
    [
        ("graph.leaky_relu(%x) {alpha = 0.1}", "graph.leaky_relu(%x) {alpha = 0.2}", "tensor<4xf32>"),
        ("graph.pad(%x) {pads = [1, 1]}", "graph.pad(%x) {pads = [1, 1], value = -0.0}", "tensor<6xf32>"),
        ("graph.clip(%x) {min = nan}", "graph.clip(%x) {min = 0.0}", "tensor<4xf32>"),
        ("graph.reshape(%x) {shape = [2, 2]}", "graph.reshape(%x) {shape = [1, 4]}", None),
        ("graph.relu(%x)", "graph.relu(%y)", "tensor<4xf32>"),
        ("graph.relu(%x)", "graph.abs(%x)", "tensor<4xf32>"),
    ],
    ids=["float-attr", "signed-zero-attr", "nan-vs-number", "list-attr", "operands", "op-name"],
)
def test_ops_that_differ_do_not_merge(first: str, second: str, result: str | None) -> None:
    types = f"{result}, {result}" if result else "tensor<2x2xf32>, tensor<1x4xf32>"
    m, stats = cse(
        f"func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> ({types}) {{\n"
        f"  %a = {first}\n  %b = {second}\n  return %a, %b\n}}\n"
    )
    assert len(m["main"].ops) == 2 and stats == {}


def test_attributes_equal_to_their_defaults_merge() -> None:
    m, stats = cse(
        "func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {\n"
        "  %a = graph.leaky_relu(%x)\n  %b = graph.leaky_relu(%x) {alpha = 0.01}\n"
        "  %c = graph.clip(%x) {min = nan}\n  %d = graph.clip(%x) {min = nan}\n"
        "  %e = graph.add(%c, %d)\n  return %a, %b, %e\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.leaky_relu", "graph.clip", "graph.add"]
    assert stats == {"ops-merged": 2}


def test_constants_merge_by_value_dtype_and_sign_of_zero() -> None:
    m, stats = cse(
        "func @main() -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf64>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {\n"
        "  %a = graph.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>}\n"
        "  %b = graph.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>}\n"
        "  %c = graph.constant {value = dense<[1.0, 2.0]> : tensor<2xf64>}\n"
        "  %z = graph.constant {value = dense<0.0> : tensor<2xf32>}\n"
        "  %n = graph.constant {value = dense<-0.0> : tensor<2xf32>}\n"
        "  %q = graph.constant {value = dense<nan> : tensor<2xf32>}\n"
        "  %r = graph.constant {value = dense<nan> : tensor<2xf32>}\n"
        "  %s = graph.add(%q, %r)\n"
        "  return %a, %b, %c, %z, %n, %s\n}\n"
    )
    values = [op.value.array.tolist() for op in m["main"].ops if op.name == "graph.constant"]
    assert len(values) == 5 and stats == {"ops-merged": 2}
    signs = [np.signbit(op.value.array).tolist() for op in m["main"].ops if op.name == "graph.constant"]
    assert [False, False] in signs and [True, True] in signs


def test_merging_cascades_through_users_in_one_run() -> None:
    m, stats = cse(
        "func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
        "  %a = graph.exp(%x)\n  %b = graph.exp(%x)\n  %c = graph.neg(%a)\n  %d = graph.neg(%b)\n"
        "  %e = graph.mul(%c, %x)\n  %g = graph.mul(%x, %d)\n  return %e, %g\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.exp", "graph.neg", "graph.mul"]
    assert stats == {"ops-merged": 3}


def test_multi_result_ops_merge_every_result() -> None:
    m, _ = cse(
        "func @main(%x: tensor<4xf32>) -> (tensor<1xf32>, tensor<3xf32>, tensor<1xf32>, tensor<3xf32>) {\n"
        "  %a, %b = graph.split(%x) {sections = [1, 3]}\n  %c, %d = graph.split(%x) {sections = [1, 3]}\n"
        "  return %a, %b, %c, %d\n}\n"
    )
    (split,) = m["main"].ops
    assert m["main"].results == [*split.results, *split.results]


def test_calls_with_equal_operands_merge() -> None:
    m, stats = cse(
        "func @sq(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = graph.mul(%x, %x)\n  return %y\n}\n"
        "func @main(%x: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {\n"
        "  %a = graph.call(%x) {callee = @sq} : tensor<2xf32>\n  %b = graph.call(%x) {callee = @sq} : tensor<2xf32>\n"
        "  return %a, %b\n}\n"
    )
    assert len(m["main"].ops) == 1 and stats == {"ops-merged": 1}


def test_ops_in_different_functions_do_not_merge() -> None:
    text = "func @{n}(%x: tensor<2xf32>) -> tensor<2xf32> {{\n  %y = graph.relu(%x)\n  return %y\n}}\n"
    m, stats = cse(text.format(n="f") + text.format(n="main"))
    assert len(m["f"].ops) == 1 and len(m["main"].ops) == 1 and stats == {}


def test_survivor_location_fuses_both_ops() -> None:
    m, _ = cse(
        "func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {\n"
        "  %a = graph.relu(%x)\n  %b = graph.relu(%x)\n  %c = graph.relu(%x)\n  return %a, %b, %c\n}\n"
    )
    loc = m["main"].ops[0].loc
    assert isinstance(loc, Location)
    assert [(x.line, x.col) for x in loc.all()] == [(2, 8), (3, 8), (4, 8)]


@settings(max_examples=60, deadline=None)
@given(random_module())
def test_random_modules_keep_their_outputs(module: Module) -> None:
    after = module.clone()
    (p,) = run_pass(after, "cse")
    assert len(module["main"].ops) - len(after["main"].ops) == p.stats["ops-merged"]
    assert_same_outputs(module, after)


@settings(max_examples=30, deadline=None)
@given(random_module())
def test_cse_is_idempotent(module: Module) -> None:
    run_pass(module, "cse")
    (p,) = run_pass(module, "cse")
    assert p.stats["ops-merged"] == 0
