"""remat: gradient checkpointing keeps the gradients, lowers the planned peak to O(sqrt n) activations for
at most one extra forward pass, meets byte budgets, and says so when one cannot be met."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import modules

from compiler.builder import Builder, finish
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Module
from compiler.memory import peak_bytes, plan_stats
from compiler.memory.order import choose_order
from compiler.parser import parse
from compiler.passes import load_all
from compiler.passes.remat import Grad
from compiler.pipeline import PIPELINES, parse_pipeline, run_pipeline
from compiler.printer import print_module
from compiler.stats import module_stats
from compiler.verifier import verify_module

BATCH, WIDTH = 8, 64
ACT = BATCH * WIDTH * 4  # one activation of the test chains, bytes (a multiple of the 64-byte alignment)


def chain(n: int, width: int = WIDTH, dtype: str = "f32") -> str:
    """An n-layer relu perceptron with an mse loss: the chain Chen et al.'s analysis is about."""
    args = [f"%x: tensor<{BATCH}x{width}x{dtype}>", f"%y: tensor<{BATCH}x{width}x{dtype}>"]
    body, prev = [], "x"
    for i in range(1, n + 1):
        args.append(f"%w{i}: tensor<{width}x{width}x{dtype}>")
        body += [f"  %h{i} = graph.matmul(%{prev}, %w{i})", f"  %a{i} = graph.relu(%h{i})"]
        prev = f"a{i}"
    body.append(f"  %loss = graph.mse_loss(%{prev}, %y)")
    return f"func @main({', '.join(args)}) -> tensor<{dtype}> {{\n" + "\n".join(body) + "\n  return %loss\n}\n"


def residual(n: int, dtype: str = "f64") -> str:
    """n residual blocks r = r_prev + relu(r_prev @ w): only the block outputs cut the forward in two."""
    args = [f"%x: tensor<{BATCH}x16x{dtype}>", f"%y: tensor<{BATCH}x16x{dtype}>"]
    body, prev = [], "x"
    for i in range(1, n + 1):
        args.append(f"%w{i}: tensor<16x16x{dtype}>")
        body += [
            f"  %t{i} = graph.matmul(%{prev}, %w{i})",
            f"  %u{i} = graph.relu(%t{i})",
            f"  %r{i} = graph.add(%{prev}, %u{i})",
        ]
        prev = f"r{i}"
    body.append(f"  %loss = graph.mse_loss(%{prev}, %y)")
    return f"func @main({', '.join(args)}) -> tensor<{dtype}> {{\n" + "\n".join(body) + "\n  return %loss\n}\n"


def example(name: str, dtype: str = "f32") -> Module:
    path = ROOT / "examples" / f"{name}.gir"
    return parse(path.read_text().replace("f32", dtype), str(path))


def grad_module(text_or_module, pipeline: str = "autodiff") -> Module:
    m = parse(text_or_module) if isinstance(text_or_module, str) else text_or_module
    run_pipeline(m, pipeline)
    return m


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert len(a) == len(b)
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0)) for x, y in zip(a, b))


def arena(m: Module, name: str = "main_grad") -> int:
    planned = m.clone()
    run_pipeline(planned, "schedule,plan-memory")
    return plan_stats(planned[name])["arena_bytes"]


def remat(m: Module, options: str = "") -> Counter:
    """Run remat{options} over `m`; its statistics."""
    passes = parse_pipeline(f"remat{{{options}}}" if options else "remat")
    run_pipeline(m, passes)
    return passes[0].stats


# --- the gradients stay the same ------------------------------------------------------------------

PLANS = {
    "sqrt": lambda g: g.chen(g.sqrt_k()),
    "keep-nothing": lambda g: frozenset(),
    "every-other": lambda g: frozenset(g.saved[::2]),
}


def deep_or_example(name: str) -> Module:
    """An example, or "deep": a 16-layer chain 64 wide (deep_mlp.gir's depth, quick on the interpreter), in f64."""
    return parse(chain(16, dtype="f64")) if name == "deep" else example(name, "f64")


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("name", ["train_mlp", "deep"])
def test_checkpointed_gradients_equal_plain_ones_in_f64(name: str, plan: str) -> None:
    m = grad_module(deep_or_example(name))
    inputs = random_inputs(m["main"], 0, m)
    plain = run(m, inputs, "main_grad")
    g = Grad(m, m["main_grad"], 64)
    keep = PLANS[plan](g)
    assert g.apply(keep) > 0, "the plan recomputes something"
    verify_module(m)
    assert max_diff(plain, run(m, inputs, "main_grad")) <= 1e-6


@pytest.mark.parametrize("name, options", [("deep_mlp", "policy=sqrt"), ("deep", "budget=0.7"), ("deep", "budget=0.5")])
def test_pass_keeps_the_deep_nets_gradients_after_fusion(name: str, options: str) -> None:
    m = grad_module(deep_or_example(name), "autodiff," + PIPELINES["compile-cuda"])
    if options.startswith("budget"):  # a fraction of the arena without remat
        options = f"budget={int(arena(m) * float(options.split('=')[1]))}"
    inputs = random_inputs(m["main"], 0, m)
    plain = run(m, inputs, "main_grad")
    remat(m, options)
    assert ".remat" in print_module(m)
    assert max_diff(plain, run(m, inputs, "main_grad")) <= 1e-6


def test_residual_blocks_are_the_units_and_keep_their_gradients() -> None:
    m = grad_module(residual(6))
    g = Grad(m, m["main_grad"], 64)
    # Block 1 reads the argument %x, which is always at hand: its relu output already cuts the forward.
    assert [u.name for u in g.units] == ["u1", "r1", "r2", "r3", "r4", "r5", "r6"]
    inputs = random_inputs(m["main"], 0, m)
    plain = run(m, inputs, "main_grad")
    remat(m, "policy=sqrt")
    assert max_diff(plain, run(m, inputs, "main_grad")) <= 1e-6


# --- memory and FLOPs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [4, 9, 16, 25, 36, 64])
def test_sqrt_policy_keeps_O_sqrt_n_activations(n: int) -> None:
    m = grad_module(chain(n), "autodiff," + PIPELINES["compile-cuda"])
    f = m["main_grad"]
    before = peak_bytes(f, align=64)
    remat(m, "policy=sqrt")
    after = peak_bytes(f, align=64)
    assert before >= n * ACT  # every activation is alive when the backward pass starts
    assert after <= (2 * math.sqrt(n) + 2) * ACT  # n/k checkpoints + one segment of k, k = sqrt(n)
    assert arena(m) <= after  # in place, an elementwise kernel may even write over its dying input


def test_sqrt_policy_recomputes_at_most_one_forward_pass() -> None:
    m = grad_module(example("deep_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    forward = module_stats(m, "main")["flops"]
    before = module_stats(m, "main_grad")["flops"]
    s = remat(m, "policy=sqrt")
    extra = module_stats(m, "main_grad")["flops"] - before
    assert 0 < extra == s["extra-flops"] <= forward
    assert s["forward-flops"] <= forward
    # Chen's 16 layers: every 4th output kept, 12 recomputed, 3/4 of the layers run twice.
    assert (s["checkpoints"], s["recomputed"]) == (4, 12)
    assert s["peak-bytes-after"] < s["peak-bytes-before"] / 2


DEEP_BUDGETS = [1_800_000, 1_500_000, 1_200_000, 1_000_000, 850_000]


def test_budget_is_met_by_the_planned_arena_with_fewer_flops_when_looser() -> None:
    base = grad_module(example("deep_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    none = arena(base)
    flops = []
    for budget in DEEP_BUDGETS:
        m = base.clone()
        s = remat(m, f"budget={budget}")
        assert arena(m) <= budget < none
        assert s["arena-bytes"] == arena(m)
        flops.append(s["extra-flops"])
    assert flops == sorted(flops) and flops[0] > 0


def test_budget_already_met_changes_nothing() -> None:
    m = grad_module(example("deep_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    text = print_module(m)
    s = remat(m, f"budget={arena(m)}")
    assert print_module(m) == text and s["extra-flops"] == 0


def test_unreachable_budget_is_an_error_stating_the_least_peak() -> None:
    m = grad_module(example("deep_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    with pytest.raises(
        GCError,
        match=r"@main_grad cannot fit in 500,000 bytes: the least peak remat reaches is "
        r"819,200 bytes \(2,001,408 without remat",
    ):
        run_pipeline(m, "remat{budget=500000}")


def test_plan_that_lowers_no_peak_is_not_applied() -> None:
    # train_mlp's backward working set (two 64x1024 gradients and a relu mask) is its peak, not activations.
    m = grad_module(example("train_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    text = print_module(m)
    s = remat(m, "policy=sqrt")
    assert print_module(m) == text and s["cloned-ops"] == 0


# --- remat and schedule -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["auto", "greedy"])
def test_schedule_after_remat_keeps_the_recomputation_late(policy: str) -> None:
    m = grad_module(example("deep_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    remat(m, "policy=sqrt")
    f = m["main_grad"]
    peak, ops = peak_bytes(f, align=64), list(f.ops)
    run_pipeline(m, f"schedule{{policy={policy}}}")
    assert peak_bytes(f, align=64) <= peak
    assert f.ops == ops  # the list scheduler finds no lower peak, so remat's order stays
    loss = f.ops.index(f.results[0].owner)
    assert all(i > loss for i, op in enumerate(f.ops) if any(".remat" in (r.name or "") for r in op.results))


def test_schedule_on_its_own_would_run_the_recomputation_early() -> None:
    """Why remat's order must survive `schedule`: its list scheduler, taken alone, runs clones as soon as their
    checkpoint exists and raises the peak; `schedule` keeps an order only if its peak is lower."""
    m = grad_module(example("deep_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    remat(m, "policy=sqrt")
    f = m["main_grad"]
    assert peak_bytes(f, choose_order(f, "greedy"), 64) > peak_bytes(f, align=64)


def test_schedule_before_remat_gives_the_same_peak_for_a_gradient() -> None:
    a = grad_module(example("deep_mlp"), "autodiff," + PIPELINES["compile-cuda"])
    b = a.clone()
    run_pipeline(a, "remat{policy=sqrt},schedule,plan-memory")
    run_pipeline(b, "schedule,remat{policy=sqrt},plan-memory")
    assert plan_stats(a["main_grad"])["arena_bytes"] == plan_stats(b["main_grad"])["arena_bytes"] == 822_272


# --- the plan's bookkeeping is what the planner measures ---------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 8), fused=st.booleans(), data=st.data())
def test_evaluated_peak_and_flops_are_those_of_the_rewritten_function(n: int, fused: bool, data) -> None:
    m = grad_module(chain(n, 16), "autodiff," + PIPELINES["compile-cuda"] if fused else "autodiff")
    g = Grad(m, m["main_grad"], 64)
    keep = frozenset(data.draw(st.lists(st.sampled_from(g.saved), unique=True)) if g.saved else [])
    plan = g.evaluate(keep)
    before = module_stats(m, "main_grad")["flops"]
    g.apply(keep)
    verify_module(m)
    assert plan.peak == peak_bytes(m["main_grad"], align=64)
    assert plan.flops == module_stats(m, "main_grad")["flops"] - before


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 10), fraction=st.floats(0.3, 1.0))
def test_any_budget_is_met_or_refused_with_the_least_peak(n: int, fraction: float) -> None:
    m = grad_module(chain(n, 16, "f64"))
    inputs = random_inputs(m["main"], 0, m)
    plain = run(m, inputs, "main_grad")
    budget = int(arena(m) * fraction)
    try:
        remat(m, f"budget={budget}")
    except GCError as e:
        least = int(re.search(r"least peak remat reaches is ([\d,]+)", str(e)).group(1).replace(",", ""))
        assert least > budget or "its arena needs more" in str(e)
        return
    assert arena(m) <= budget
    assert max_diff(plain, run(m, inputs, "main_grad")) <= 1e-6


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(module=modules(max_ops=10), data=st.data())
def test_random_gradients_survive_any_plan_bit_for_bit(module: Module, data) -> None:
    """Random modules of tests/strategies.py, summed into a loss and differentiated: whatever remat keeps, the
    function verifies, prints back the same, and computes the same bits."""
    f = module["main"]
    y = next((v for v in f.results if v.type.dtype.is_float), None)
    assume(y is not None)
    finish(f, Builder(f).reduce_sum(y))
    try:
        run_pipeline(module, "autodiff")
    except GCError:
        assume(False)  # an op without a gradient rule
    inputs = random_inputs(f, 0, module)
    plain = run(module, inputs, "main_grad")
    g = Grad(module, module["main_grad"], 64)
    g.apply(frozenset(data.draw(st.lists(st.sampled_from(g.saved), unique=True)) if g.saved else []))
    verify_module(module)
    assert print_module(parse(print_module(module))) == print_module(module)
    for a, b in zip(plain, run(module, inputs, "main_grad")):
        np.testing.assert_array_equal(a, b)


# --- what remat works on, and its diagnostics -----------------------------------------------------------


def test_only_gradient_functions_are_targets_by_default() -> None:
    m = grad_module(chain(9))
    main = print_module(Module([m["main"]]))
    stats = remat(m)
    assert stats["recomputed"] > 0
    assert print_module(Module([m["main"]])) == main


def test_function_without_a_scalar_loss_first_is_an_error() -> None:
    m = parse("func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = graph.exp(%x)\n  return %y\n}\n")
    with pytest.raises(GCError, match="@f does not return a scalar loss first"):
        run_pipeline(m, "remat{func=f}")


@pytest.mark.parametrize(
    "options, message",
    [
        ("policy=fast", "unknown policy 'fast'"),
        ("policy=sqrt,budget=1000", "policy=sqrt takes no budget"),
        ("policy=budget", "policy=budget needs budget=BYTES"),
        ("func=nope", "no function @nope"),
    ],
)
def test_bad_options_are_errors(options: str, message: str) -> None:
    with pytest.raises(GCError, match=re.escape(message)):
        run_pipeline(grad_module(chain(2)), f"remat{{{options}}}")


def test_train_step_keeps_its_updates_under_any_plan() -> None:
    if "make-train-step" not in load_all():
        pytest.skip("make-train-step is not registered")
    m = grad_module(deep_or_example("deep"), "make-train-step")
    inputs = random_inputs(m["main"], 0, m)
    plain = run(m, inputs, "train_step")
    g = Grad(m, m["train_step"], 64)
    assert len(g.units) == 16
    g.apply(g.chen(g.sqrt_k()))
    assert max_diff(plain, run(m, inputs, "train_step")) <= 1e-6


def test_remat_report_is_current() -> None:
    tool = str(ROOT / "tools" / "remat_report.py")
    r = subprocess.run([sys.executable, tool, "--check"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
