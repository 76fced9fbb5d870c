"""fuse: outputs kept on every example and on random DAGs, groups per example, kernel shape rules, idempotence."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_outputs
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.builder import finish, new_func
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import DType, Func, Module, SymbolRef, TensorType
from compiler.parser import parse, parse_file
from compiler.pipeline import parse_pipeline, run_pipeline
from dialects.graph import creation

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))
ANCHOR = "out-elementwise-fusable"


def fuse(module: Module, pipeline: str = "fuse") -> Counter:
    """Run the pass (verified by the pipeline) and return its statistics."""
    (p,) = parse_pipeline(pipeline)
    run_pipeline(module, [p])
    return p.stats


def kernels(module: Module) -> list[Func]:
    return [f for f in module if f.attrs.get("kernel")]


def op_names(module: Module) -> Counter:
    """Every op of the module but the calls fuse made: fusion moves ops, it never copies or drops one."""
    return Counter(op.name for f in module for op in f.ops if not _is_kernel_call(module, op))


def op_names_once_cut(module: Module) -> Counter:
    """op_names as fusion leaves them: a split cut into one slice per section (`Op.per_result`)."""
    names = op_names(module)
    for op in (op for f in module for op in f.ops if op.name == "graph.split"):
        names["graph.split"] -= 1
        names["graph.slice"] += len(op.results)
    return +names


def _is_kernel_call(module: Module, op) -> bool:
    return op.name == "graph.call" and module[op.callee.name].attrs.get("kernel") is True


def inputs(module: Module) -> dict[str, np.ndarray]:
    """Inputs drawn from the unfused module: random_inputs scales weights by how matmul and conv2d use them."""
    return random_inputs(module["main"], 0)


def assert_same(before: list[np.ndarray], after: list[np.ndarray]) -> None:
    # The same reference ops run in the same order, so bit for bit (NaNs included, bf16 too).
    assert_outputs(after, before, bits=True)


def assert_kernel_rules(module: Module, max_ops: int = 16) -> None:
    """At most one anchor (matmul, conv2d, pool) per kernel, and first (after the transposes of its operands
    that it reads in place); at most one reduction; size bound."""
    for k in kernels(module):
        compute = [op for op in k.ops if op.kind != "constant"]
        while compute and compute[0].name == "graph.transpose" and any(o.name == "graph.matmul" for o in compute):
            compute = compute[1:]
        kinds = [op.kind for op in compute]
        assert 2 <= len(k.ops) and len(compute) <= max_ops, k.name
        assert kinds.count(ANCHOR) <= 1 and (ANCHOR not in kinds or kinds[0] == ANCHOR), k.name
        assert kinds.count("reduction") <= 1, k.name
        assert "opaque" not in kinds, k.name


# --- examples --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, groups, ops",
    [("mlp", 3, 8), ("train_mlp", 3, 8), ("cnn", 10, 30), ("transformer", 11, 25)],
)
def test_groups_per_example(name: str, groups: int, ops: int) -> None:
    module = parse_file(ROOT / "examples" / f"{name}.gir")
    stats = fuse(module)
    assert (stats["groups-fused"], stats["ops-fused"]) == (groups, ops)
    assert len(kernels(module)) == groups


def test_mlp_becomes_three_matmul_kernels() -> None:
    module = parse_file(ROOT / "examples" / "mlp.gir")
    fuse(module)
    assert list(module.funcs) == ["main", "fused_matmul_add_relu", "fused_matmul_add_relu_1", "fused_matmul_add"]
    assert [op.name for op in module["main"].ops] == ["graph.call"] * 3


def test_transformer_keeps_bias_adds_with_their_matmuls() -> None:
    module = parse_file(ROOT / "examples" / "transformer.gir")
    fuse(module)
    names = Counter(k.name.rstrip("_0123456789") for k in kernels(module))
    assert names == {
        "fused_matmul_add": 3,
        "fused_reshape_transpose": 3,
        "fused_matmul_mul": 1,
        "fused_transpose_reshape": 1,
        "fused_matmul_add_add": 2,
        "fused_matmul_add_gelu": 1,
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_obey_the_kernel_rules_and_lose_no_op(path: Path) -> None:
    module = parse_file(path)
    names = op_names(module)
    fuse(module)
    assert op_names(module) == names
    assert_kernel_rules(module)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_fusing_twice_changes_nothing(path: Path) -> None:
    module = parse_file(path)
    fuse(module)
    once = str(module)
    stats = fuse(module)
    assert str(module) == once
    assert stats["groups-fused"] == 0


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_fused_module_round_trips(path: Path) -> None:
    module = parse_file(path)
    fuse(module)
    text = str(module)
    assert str(parse(text)) == text


@pytest.mark.parametrize("max_ops", [1, 2, 3, 4])
def test_max_ops_bounds_every_kernel(max_ops: int) -> None:
    module = parse_file(ROOT / "examples" / "cnn.gir")
    args = inputs(module)
    before = run(module, args)
    fuse(module, f"fuse{{max-ops={max_ops}}}")
    assert all(len(k.ops) <= max_ops for k in kernels(module))
    assert (max_ops == 1) == (not kernels(module))
    assert_same(before, run(module, args))


def test_kinds_restriction_keeps_matmuls_out() -> None:
    module = parse_file(ROOT / "examples" / "mlp.gir")
    fuse(module, "fuse{kinds=elementwise,broadcast}")
    assert [k.name for k in kernels(module)] == ["fused_add_relu", "fused_add_relu_1"]
    assert Counter(op.name for op in module["main"].ops) == {"graph.matmul": 3, "graph.call": 2, "graph.add": 1}


def test_kernel_names_avoid_existing_functions() -> None:
    module = parse("""
func @fused_exp_relu(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x
}
func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = graph.exp(%x)
  %r = graph.relu(%e)
  return %r
}
""")
    fuse(module)
    assert list(module.funcs) == ["fused_exp_relu", "main", "fused_exp_relu_1"]
    assert module["main"].ops[0].callee == SymbolRef("fused_exp_relu_1")


@pytest.mark.parametrize(
    "pipeline, message",
    [
        ("fuse{kinds=elementwise,opaque}", "unknown kind 'opaque'"),
        ("fuse{max-ops=0}", "max-ops must be at least 1, got 0"),
        ("fuse{max-ops=many}", "option 'max-ops' expects int, got 'many'"),
    ],
)
def test_bad_options_are_user_errors(pipeline: str, message: str) -> None:
    with pytest.raises(GCError, match=message):
        parse_pipeline(pipeline)


# --- random DAGs -----------------------------------------------------------------------------------

SQ = TensorType((4, 4), DType.f32)
VEC = TensorType((4,), DType.f32)
UNARY = ["relu", "tanh", "neg", "sigmoid", "abs", "gelu"]
BINARY = ["add", "mul", "sub", "maximum"]


def _helper() -> Func:
    """An ordinary function main calls: its call is opaque to fusion."""
    f, b, (x,) = new_func("helper", {"x": SQ})
    return finish(f, b.relu(b.neg(x)))


@st.composite
def random_dag(draw) -> Module:
    """@main over 4x4 tensors: a random DAG mixing every fusion kind, values used several times, several
    results. Every op keeps the 4x4 shape, so any value can feed any op."""
    f, b, (x, y, g, beta) = new_func("main", {"x": SQ, "y": SQ, "g": VEC, "beta": VEC})
    pool = [x, y]
    pick = lambda: draw(st.sampled_from(pool))  # noqa: E731
    for _ in range(draw(st.integers(1, 14))):
        step = draw(st.sampled_from(["unary", "binary", "const", "injective", "split", "reduce", "softmax",
                                     "layer_norm", "matmul", "lrn", "call"]))  # fmt: skip
        if step == "unary":
            v = getattr(b, draw(st.sampled_from(UNARY)))(pick())
        elif step == "binary":
            v = getattr(b, draw(st.sampled_from(BINARY)))(pick(), pick())
        elif step == "const":
            c = b.constant(draw(st.sampled_from([np.float32(0.5), np.arange(4, dtype=np.float32)])))
            v = b.mul(pick(), c) if draw(st.booleans()) else b.add(c, pick())
        elif step == "injective":
            v = b.transpose(pick()) if draw(st.booleans()) else b.reshape(b.reshape(pick(), shape=(2, 8)), shape=(4, 4))
        elif step == "split":
            top, bottom = b.split(pick(), sections=(1, 3))
            v = b.concat(bottom, top, axis=0)
        elif step == "reduce":
            v = b.add(pick(), b.reduce_sum(pick(), axes=(1,), keepdims=True))
        elif step == "softmax":
            v = b.softmax(pick(), axis=draw(st.sampled_from([0, 1])))
        elif step == "layer_norm":
            v = b.layer_norm(pick(), g, beta)
        elif step == "matmul":
            v = b.matmul(pick(), pick())
        elif step == "lrn":
            v = b.lrn(pick(), size=3)
        else:
            call = creation.Call([pick()], {"callee": SymbolRef("helper")}, [SQ])
            f.ops.append(call)
            v = call.result
        pool.append(v)
    extra = draw(st.lists(st.sampled_from(pool), max_size=2))
    return Module([finish(f, pool[-1], *extra), _helper()])


@settings(max_examples=60, deadline=None)
@given(random_dag(), st.integers(2, 6))
def test_fusion_keeps_outputs_and_makes_no_cycle(module: Module, max_ops: int) -> None:
    args = inputs(module)
    before = run(module, args)
    names = op_names_once_cut(module)
    fuse(module, f"fuse{{max-ops={max_ops}}}")  # the pipeline verifies: dominance, call types, no recursion
    assert_same(before, run(module, args))
    assert op_names(module) == names
    assert_kernel_rules(module, max_ops)
    text = str(module)
    assert str(parse(text)) == text
    fuse(module, f"fuse{{max-ops={max_ops}}}")
    assert str(module) == text


DIAMONDS = {
    # SiLU: the product reads the matmul's result and its sigmoid; hardswish: x * clip(x + 3, 0, 6) / 6.
    "silu": "  %g = graph.sigmoid(%y)\n  %z = graph.mul(%y, %g)\n  return %z\n",
    "hardswish": ("  %t = graph.add(%y, %three)\n  %r = graph.clip(%t) {min = 0.0, max = 6.0}\n"
                  "  %q = graph.div(%r, %six)\n  %z = graph.mul(%y, %q)\n  return %z\n"),
}


@pytest.mark.parametrize("name", list(DIAMONDS))
def test_an_epilogue_whose_branches_meet_again_fuses_into_the_anchor(name: str) -> None:
    text = ("func @main(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) -> tensor<4x16xf32> {\n"
            "  %three = graph.constant {value = dense<3.0> : tensor<f32>}\n"
            "  %six = graph.constant {value = dense<6.0> : tensor<f32>}\n"
            "  %y = graph.matmul(%x, %w)\n" + DIAMONDS[name] + "}\n")
    module = parse(text)
    want = run(module, inputs(module))
    fuse(module)
    (k,) = kernels(module)
    assert [op.name.split(".")[1] for op in k.ops if op.name != "graph.constant"][0] == "matmul"
    assert [op.name for op in module["main"].ops if op.name != "graph.constant"] == ["graph.call"]  # all in it
    np.testing.assert_allclose(run(module, inputs(parse(text)))[0], want[0], rtol=1e-6)


def test_a_diamond_that_does_not_close_is_left_alone() -> None:
    """%y also leaves the function: the branches do not close on one op, so the anchor keeps no epilogue
    it would have to recompute."""
    text = ("func @main(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {\n"
            "  %y = graph.matmul(%x, %w)\n  %g = graph.sigmoid(%y)\n  %z = graph.mul(%y, %g)\n"
            "  return %z, %y\n}\n")
    module = parse(text)
    fuse(module)
    assert all([op.name for op in k.ops] != ["graph.matmul", "graph.sigmoid", "graph.mul"] for k in kernels(module))
    assert not any(op.name == "graph.matmul" for k in kernels(module) for op in k.ops)


def test_an_anchor_result_spread_over_a_larger_tensor_stays_out_of_its_kernel() -> None:
    """Squeeze-and-excitation: the conv's 1x1 map scales the 8x8 one. Fused, the conv would be computed
    again for each of the 64 pixels it scales; its sigmoid (same shape) still joins it."""
    text = ("func @main(%x: tensor<1x16x8x8xf32>, %w: tensor<16x16x1x1xf32>) -> tensor<1x16x8x8xf32> {\n"
            "  %p = graph.reduce_mean(%x) {axes = [2, 3], keepdims = true}\n"
            "  %c = graph.conv2d(%p, %w)\n  %s = graph.sigmoid(%c)\n  %y = graph.mul(%x, %s)\n  return %y\n}\n")
    module = parse(text)
    want = run(module, inputs(module))
    fuse(module)
    groups = [[op.name.split(".")[1] for op in k.ops] for k in kernels(module)]
    assert ["conv2d", "sigmoid"] in groups and not any("conv2d" in g and "mul" in g for g in groups)
    np.testing.assert_allclose(run(module, inputs(parse(text)))[0], want[0], rtol=1e-6)


# Two GELU-tanh MLPs sharing one 3.0 (as cse leaves GPT-2's twelve): each fused epilogue gets a copy.
SHARED_SCALAR = """func @main(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>, %v: tensor<16x16xf32>) -> tensor<8x16xf32> {
  %three = graph.constant {value = dense<3.0> : tensor<f32>} : tensor<f32>
  %a = graph.matmul(%x, %w) : tensor<8x16xf32>
  %p = graph.pow(%a, %three) : tensor<8x16xf32>
  %t = graph.tanh(%p) : tensor<8x16xf32>
  %b = graph.matmul(%t, %v) : tensor<8x16xf32>
  %q = graph.pow(%b, %three) : tensor<8x16xf32>
  %y = graph.add(%q, %three) : tensor<8x16xf32>
  return %y
}
"""


def test_a_scalar_constant_read_by_several_kernels_is_copied_into_each() -> None:
    import compiler

    m = parse(SHARED_SCALAR)
    xs = inputs(m)
    before = run(m, xs)
    fuse(m)
    ks = kernels(m)
    assert len(ks) == 2 and all(sum(op.kind == "constant" for op in k.ops) == 1 for k in ks)
    assert all(len(k.args) == 2 for k in ks)  # the input and the weights; 3.0 is no argument
    assert "graph.constant" not in "".join(str(op.name) for op in m["main"].ops)
    assert_same(before, run(m, xs))
    # Inside, pow(x, 3) lowers to x * x * x: no libm pow per element, the same values within rounding.
    model = compiler.compile(SHARED_SCALAR, "llvm", cache=False)
    assert "T.pow(" not in "".join(f.script() for f in model.scheduled.functions.values())
    np.testing.assert_allclose(model(**xs)[0], before[0], rtol=1e-5, atol=1e-5)


def test_concat_chains_stay_unfused_and_other_concats_fuse() -> None:
    """fuse{concat-chains=true}: concats whose operands begin another's (or begin with its) join no group;
    a concat sharing no prefix still fuses with its reader; without the option, all fuse."""
    text = """func @main(%a: tensor<1x8x4x4xf32>, %b: tensor<1x8x4x4xf32>, %c: tensor<1x8x4x4xf32>)
    -> (tensor<1x16x4x4xf32>, tensor<1x24x4x4xf32>, tensor<1x16x4x4xf32>) {
  %x = graph.relu(%a)
  %y = graph.relu(%b)
  %z = graph.relu(%c)
  %c1 = graph.concat(%x, %y) {axis = 1}
  %r1 = graph.sigmoid(%c1)
  %c2 = graph.concat(%x, %y, %z) {axis = 1}
  %r2 = graph.sigmoid(%c2)
  %lone = graph.concat(%z, %x) {axis = 1}
  %r3 = graph.tanh(%lone)
  return %r1, %r2, %r3
}"""
    m = parse(text)
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    for chains, unfused in ((True, 2), (False, 0)):
        p = parse(text)
        run_pipeline(p, f"fuse{{concat-chains={str(chains).lower()}}}")
        assert sum(op.name == "graph.concat" for op in p["main"].ops) == unfused
        inside = [op for f in p if f.attrs.get("kernel") for op in f.ops if op.name == "graph.concat"]
        assert len(inside) == 3 - unfused
        assert_outputs(run(p, inputs), expected, rtol=1e-6, atol=1e-6)
