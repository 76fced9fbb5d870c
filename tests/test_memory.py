"""Scheduling and memory planning: execution order, the arena plan, the plan checker, streams.

The oracle is the reference interpreter running the planned module inside one NumPy arena (views
alias it; the arena starts filled with NaN bytes), so a plan that lets two live tensors overlap, or
reads a tensor before it is written, changes the numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_outputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import modules

import compiler
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Func, Module
from compiler.memory import (
    SKEW,
    Block,
    check_plan,
    copies_nothing,
    lower_bound,
    peak_bytes,
    place,
    plan_stats,
    writes_in_place_over,
)
from compiler.memory.order import choose_order
from compiler.parser import parse, parse_file
from compiler.pipeline import run_pipeline
from compiler.printer import print_module
from dialects.mem import padded_shape

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))
GRAPH = "canonicalize,cse,dce,fuse"


def planned(module: Module, pipeline: str) -> Module:
    """`module` through `pipeline`, printed and parsed back (the planned stage is textual IR too)."""
    run_pipeline(module, pipeline)
    text = print_module(module)
    again = parse(text, "planned.gir")
    assert print_module(again) == text
    return again


def same_outputs(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert_outputs(b, a)


def close(a: np.ndarray, b: np.ndarray) -> None:
    """Equal up to the last bit or two: NumPy's float reductions round differently at different pointer
    alignments, and arena views are 64-byte aligned where the plain interpreter's arrays are not."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.kind == "f" or a.dtype.itemsize == 2 and a.dtype.kind == "V":
        np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=1e-5, atol=1e-6, equal_nan=True)
    else:
        np.testing.assert_array_equal(a, b)


# --- every example: sound plans, the same numbers, the targets -----------------------------------


def example(path: Path, fused: bool) -> tuple[Module, dict, list[np.ndarray]]:
    """An example (through the graph passes if `fused`), random inputs, and the interpreter's outputs."""
    m = parse_file(path)
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    graph = parse_file(path)
    if fused:
        run_pipeline(graph, GRAPH)
    return graph, inputs, expected


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_planned_example_runs_in_one_arena_and_matches_the_interpreter(path: Path, fused: bool) -> None:
    graph, inputs, expected = example(path, fused)
    file_order = peak_bytes(graph["main"], align=64)
    p = planned(graph, "schedule,plan-memory")
    check_plan(p, p["main"])
    same_outputs(expected, run(p, inputs))
    stats = plan_stats(p["main"])
    assert stats["lower_bound_bytes"] <= file_order
    assert stats["arena_bytes"] <= 1.05 * stats["lower_bound_bytes"]
    assert stats["arena_bytes"] <= stats["naive_bytes"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_the_cpu_builds_plan_is_sound_and_computes_the_same(path: Path, fused: bool) -> None:
    """The plan the CPU build makes (zero-bordered conv inputs, in-place epilogues), which `gc stats`
    reports too: unfused, a residual add and its ReLU each wrote over the bordered buffer the one before
    took over, and planning failed on the chain (a KeyError in plan-memory)."""
    graph, inputs, expected = example(path, fused)
    p = planned(graph, "schedule,plan-memory{align=64,conv-borders=true,in-place-epilogues=true}")
    check_plan(p, p["main"])
    for want, got in zip(expected, run(p, inputs)):
        close(want, got)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_streams_keep_the_plan_sound_and_the_numbers(path: Path) -> None:
    m = parse_file(path)
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    p = planned(parse_file(path), GRAPH + ",schedule,plan-memory{concurrent=true},assign-streams")
    check_plan(p, p["main"])
    same_outputs(expected, run(p, inputs))


def test_inception_towers_run_on_four_streams_and_never_share_bytes() -> None:
    p = planned(parse_file(ROOT / "examples/inception.gir"), GRAPH + ",schedule,plan-memory{concurrent=true},assign-streams")
    launches = [op for op in p["main"].ops if op.name == "exec.launch"]
    assert {op.stream for op in launches} == {0, 1, 2, 3}
    # Each tower is one stream; the concat waits for the other three.
    concat = next(op for op in launches if op.kernel.name == "concat")
    ops = p["main"].ops
    waits = [op for op in ops[: ops.index(concat)] if op.name == "exec.wait" and op.stream == concat.stream]
    assert len(waits) >= 3
    # Tensors written on different streams (different towers) never share bytes of the arena.
    views = {op.result: (op.offset, op.offset + op.result.type.nbytes) for op in ops if op.name == "mem.view"}
    spans = [(op.stream, views[d]) for op in launches for d in op.destinations if d in views]
    assert len({s for s, _ in spans}) == 4
    for i, (s1, (a0, a1)) in enumerate(spans):
        for s2, (b0, b1) in spans[i + 1 :]:
            assert s1 == s2 or a1 <= b0 or b1 <= a0


def test_serial_plan_of_inception_reuses_bytes_the_concurrent_one_cannot() -> None:
    serial = planned(parse_file(ROOT / "examples/inception.gir"), GRAPH + ",schedule,plan-memory")
    conc = planned(parse_file(ROOT / "examples/inception.gir"), GRAPH + ",schedule,plan-memory{concurrent=true}")
    s, c = plan_stats(serial["main"]), plan_stats(conc["main"])
    assert s["arena_bytes"] < c["arena_bytes"] <= c["naive_bytes"]


# --- random DAGs ----------------------------------------------------------------------------------

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


@SETTINGS
@given(modules(max_ops=14, max_args=3), st.booleans(), st.sampled_from(["auto", "greedy", "exact", "file"]),
       st.booleans())
def test_random_dags_plan_soundly_within_5_percent_of_the_lower_bound(m: Module, fuse: bool, policy: str,
                                                                      epilogues: bool) -> None:
    inputs = random_inputs(m["main"], 1, m)
    with np.errstate(all="ignore"):
        expected = run(m, inputs)
    if fuse:
        run_pipeline(m, "fuse")
    file_order = peak_bytes(m["main"], align=64)
    flag = str(epilogues).lower()  # concat views ride along: both change which bytes a kernel may write
    p = planned(m, f"schedule{{policy={policy}}},plan-memory{{in-place-epilogues={flag},concat-views={flag}}}")
    check_plan(p, p["main"])
    stats = plan_stats(p["main"], 64)  # in the units the arena allocates: tiny tensors take 64 bytes
    assert stats["lower_bound_bytes"] <= file_order
    assert stats["lower_bound_bytes"] <= stats["arena_bytes"] <= 1.05 * stats["lower_bound_bytes"]
    with np.errstate(all="ignore"):
        got = run(p, inputs)
    for a, b in zip(expected, got):
        close(a, b)


@SETTINGS
@given(modules(max_ops=12, max_args=3))
def test_random_dags_on_streams_stay_sound(m: Module) -> None:
    inputs = random_inputs(m["main"], 2, m)
    with np.errstate(all="ignore"):
        expected = run(m, inputs)
    p = planned(m, "schedule,plan-memory{concurrent=true},assign-streams{max-streams=3}")
    check_plan(p, p["main"])
    with np.errstate(all="ignore"):
        got = run(p, inputs)
    for a, b in zip(expected, got):
        close(a, b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modules(max_ops=10, max_args=2))
def test_exact_order_is_never_worse_than_greedy_or_file_order(m: Module) -> None:
    f = m["main"]
    exact = peak_bytes(f, choose_order(f, "exact", 16, 1))
    assert exact <= peak_bytes(f, choose_order(f, "greedy", align=1))
    assert exact <= peak_bytes(f)


# --- the scheduler on a graph where file order is bad ---------------------------------------------

# Two branches from %x; written so that both big intermediates are alive at once. Running the first
# branch to its (small) end before starting the second halves the peak.
BRANCHES = """func @main(%x: tensor<256x256xf32>) -> tensor<f32> {
  %a1 = graph.exp(%x) : tensor<256x256xf32>
  %b1 = graph.tanh(%x) : tensor<256x256xf32>
  %a2 = graph.reduce_sum(%a1) : tensor<f32>
  %b2 = graph.reduce_sum(%b1) : tensor<f32>
  %y = graph.add(%a2, %b2) : tensor<f32>
  return %y
}
"""


@pytest.mark.parametrize("policy", ["auto", "greedy", "exact"])
def test_schedule_finishes_a_branch_before_starting_the_next(policy: str) -> None:
    m = parse(BRANCHES, "b.gir")
    before = peak_bytes(m["main"], align=64)
    run_pipeline(m, f"schedule{{policy={policy}}}")
    after = peak_bytes(m["main"], align=64)
    assert (before, after) == (2 * 256 * 256 * 4 + 64, 256 * 256 * 4 + 64 + 64)
    assert [op.name for op in m["main"].ops][:2] in (["graph.exp", "graph.reduce_sum"], ["graph.tanh", "graph.reduce_sum"])


def test_schedule_policy_file_keeps_the_order() -> None:
    m = parse(BRANCHES, "b.gir")
    run_pipeline(m, "schedule{policy=file}")
    assert print_module(m) == print_module(parse(BRANCHES, "b.gir"))


def test_unknown_schedule_policy_is_an_error() -> None:
    with pytest.raises(GCError, match="unknown policy 'fastest'"):
        run_pipeline(parse(BRANCHES, "b.gir"), "schedule{policy=fastest}")


# --- placement ------------------------------------------------------------------------------------


def test_place_shares_bytes_between_blocks_never_alive_together() -> None:
    blocks = [Block(1000, 0, 1), Block(1000, 1, 2), Block(1000, 2, 3), Block(64, 0, 3)]
    size = place(blocks, 64)
    assert size == lower_bound([Block(1024, b.start, b.end) for b in blocks[:3]] + [blocks[3]])
    for i, a in enumerate(blocks):
        for b in blocks[i + 1 :]:
            if a.start <= b.end and b.start <= a.end:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
    assert all(b.offset % 64 == 0 for b in blocks)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 6)), min_size=1, max_size=30),
       st.sampled_from([1, 64, 256]))
def test_place_never_overlaps_live_blocks_and_stays_aligned(spec, align: int) -> None:
    blocks = [Block(size, start, start + length) for size, start, length in spec]
    arena = place(blocks, align)
    for i, a in enumerate(blocks):
        assert a.offset % align == 0 and a.offset + a.size <= arena
        for b in blocks[i + 1 :]:
            if a.start <= b.end and b.start <= a.end:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
    assert arena >= lower_bound(blocks)


# --- in place -------------------------------------------------------------------------------------


def test_elementwise_kernel_writes_over_its_dying_input() -> None:
    src = """func @main(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<f32> {
  %h = graph.matmul(%x, %w) : tensor<64x64xf32>
  %e = graph.exp(%h) : tensor<64x64xf32>
  %t = graph.tanh(%e) : tensor<64x64xf32>
  %s = graph.reduce_sum(%t) : tensor<f32>
  return %s
}
"""
    m = parse(src, "x.gir")
    inputs = random_inputs(m["main"], 0, m)
    p = planned(m, "plan-memory")
    views = [op for op in p["main"].ops if op.name == "mem.view"]
    assert [v.offset for v in views] == [0, 0, 0]  # h, e, t: one block, each written over the last
    assert plan_stats(p["main"])["arena_bytes"] == 64 * 64 * 4
    np.testing.assert_array_equal(run(p, inputs)[0], run(parse(src, "x.gir"), inputs)[0])
    off = planned(parse(src, "x.gir"), "plan-memory{in-place=false}")
    # Two 16 KiB buffers taking turns, the second SKEW bytes further on: each kernel reads one while it
    # writes the other (4K aliasing), and the arena stays below a buffer per tensor (3 x 16 KiB).
    assert plan_stats(off["main"])["arena_bytes"] == 2 * 64 * 64 * 4 + SKEW


def test_the_aliasing_skew_never_costs_more_than_a_buffer_per_tensor() -> None:
    """Two 16 KiB tensors alive together, one read while the other is written: apart modulo 4 KiB they
    would need 32 KiB + 256 bytes, more than their own two buffers; the plan keeps them side by side."""
    src = """func @main(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<f32> {
  %h = graph.matmul(%x, %w) : tensor<64x64xf32>
  %g = graph.matmul(%h, %w) : tensor<64x64xf32>
  %s = graph.reduce_sum(%g) : tensor<f32>
  return %s
}
"""
    p = planned(parse(src, "x.gir"), "plan-memory")
    stats = plan_stats(p["main"])
    assert stats["arena_bytes"] == stats["naive_bytes"] == 2 * 64 * 64 * 4


def test_no_in_place_over_an_input_read_later() -> None:
    src = """func @main(%x: tensor<64xf32>) -> tensor<64xf32> {
  %a = graph.exp(%x) : tensor<64xf32>
  %b = graph.tanh(%a) : tensor<64xf32>
  %c = graph.add(%a, %b) : tensor<64xf32>
  return %c
}
"""
    p = planned(parse(src, "x.gir"), "plan-memory")
    views = {op.result.name: op.offset for op in p["main"].ops if op.name == "mem.view"}
    assert len(set(views.values())) == 2  # %a lives on past tanh: tanh cannot write over it


RESIDUAL = """func @main(%x: tensor<1x8x8x8xf32>, %w: tensor<8x8x3x3xf32>, %v: tensor<8x8x3x3xf32>) -> tensor<1x8xf32> {
  %a = graph.exp(%x) : tensor<1x8x8x8xf32>
  %h = graph.conv2d(%a, %w) {padding = [1, 1, 1, 1]} : tensor<1x8x8x8xf32>
  %r = graph.relu(%h) : tensor<1x8x8x8xf32>
  %c = graph.conv2d(%r, %v) {padding = [1, 1, 1, 1]} : tensor<1x8x8x8xf32>
  %s = graph.add(%c, %a) : tensor<1x8x8x8xf32>
  %o = graph.relu(%s) : tensor<1x8x8x8xf32>
  %g = graph.reduce_max(%o) {axes = [2, 3]} : tensor<1x8xf32>
  return %g
}
"""


def _kernel(text: str, name: str) -> Func:
    m = parse(text, "k.gir")
    run_pipeline(m, "fuse")
    return next(f for f in m if f.attrs.get("kernel") and f.name.startswith(name))


def test_an_epilogue_operand_may_be_written_over_but_not_a_conv_input() -> None:
    k = _kernel(RESIDUAL, "fused_conv2d_add_relu")
    names = [a.name for a in k.args]
    assert writes_in_place_over(k, names.index("a"))  # read by the add only, at the index written
    assert not writes_in_place_over(k, names.index("a"), epilogues=False)
    assert not writes_in_place_over(k, names.index("r"))  # the conv reads its neighbours
    # The same operand also feeding the conv: no longer element for element.
    both = RESIDUAL.replace("graph.conv2d(%r, %v)", "graph.conv2d(%a, %v)")
    k = _kernel(both, "fused_conv2d_add_relu")
    assert not writes_in_place_over(k, [a.name for a in k.args].index("a"))
    # Broadcast into the result (a bias of another shape) is not the result's index either.
    bias = """func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %m = graph.matmul(%x, %w) : tensor<4x8xf32>
  %y = graph.add(%m, %b) : tensor<4x8xf32>
  return %y
}
"""
    k = _kernel(bias, "fused_matmul_add")
    assert not writes_in_place_over(k, [a.name for a in k.args].index("b"))


def test_a_residual_blocks_output_takes_its_inputs_bytes_and_computes_the_same() -> None:
    src = parse(RESIDUAL, "r.gir")
    inputs = random_inputs(src["main"], 0, src)
    want = run(src, inputs)[0]
    on = planned(parse(RESIDUAL, "r.gir"), "fuse,schedule,plan-memory{in-place-epilogues=true}")
    off = planned(parse(RESIDUAL, "r.gir"), "fuse,schedule,plan-memory")
    views = {op.result.name: op.offset for op in on["main"].ops if op.name == "mem.view"}
    launches = {op.result.name: op for op in on["main"].ops if op.name == "exec.launch"}
    a_view, o_view = (launches[n].operands[-1].owner.offset for n in ("a", "o"))
    assert a_view == o_view, views  # %o written over %a, which dies at that kernel
    assert plan_stats(on["main"])["arena_bytes"] < plan_stats(off["main"])["arena_bytes"]
    np.testing.assert_array_equal(run(on, inputs)[0], want)
    model = compiler.compile(RESIDUAL, "llvm")  # the CPU build writes epilogues in place
    for _ in range(2):
        np.testing.assert_allclose(model(**inputs)[0], want, rtol=1e-4, atol=1e-5)


# --- results, arguments, constants ----------------------------------------------------------------


def test_results_get_buffers_of_their_own_and_returned_arguments_are_copied() -> None:
    src = """func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<2xf32>) {
  %c = graph.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>} : tensor<2xf32>
  %y = graph.relu(%x) : tensor<4xf32>
  return %y, %y, %x, %c
}
"""
    m = parse(src, "x.gir")
    p = planned(m, "plan-memory")
    names = [op.name for op in p["main"].ops]
    assert names.count("mem.alloc") == 4 and names.count("exec.copy") == 3 and "mem.view" not in names
    x = np.array([-1, 2, -3, 4], np.float32)
    out = run(p, [x])
    same_outputs(run(parse(src, "x.gir"), [x]), out)
    assert len({id(o) for o in out}) == 4


# --- the plan checker catches broken plans --------------------------------------------------------

KERNELS = """
func @ex(%a: tensor<16xf32>) -> tensor<16xf32> attributes {kernel = true} {
  %r = graph.exp(%a) : tensor<16xf32>
  return %r
}
func @sum(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<16xf32> attributes {kernel = true} {
  %r = graph.add(%a, %b) : tensor<16xf32>
  return %r
}
func @cat(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<32xf32> attributes {kernel = true} {
  %r = graph.concat(%a, %b) {axis = 0} : tensor<32xf32>
  return %r
}
func @half(%a: tensor<32xf32>) -> tensor<16xf32> attributes {kernel = true} {
  %r = graph.slice(%a) {starts = [0], ends = [16]} : tensor<16xf32>
  return %r
}
func @rev(%a: tensor<16xf32>) -> tensor<16xf32> attributes {kernel = true} {
  %r = graph.slice(%a) {starts = [15], ends = [-17], steps = [-1]} : tensor<16xf32>
  return %r
}
"""


def broken(body: str, size: int = 256, align: int = 64) -> str:
    return KERNELS + f"""func @main(%x: tensor<16xf32>) -> tensor<16xf32> {{
  %arena = mem.arena {{size = {size}, align = {align}}} : tensor<{size}xi8>
{body}
}}
"""


@pytest.mark.parametrize(
    "body, message",
    [
        # %a and %b alive together at the same bytes: b's launch writes over a, which sum reads later.
        ("""  %0 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %a = exec.launch(%x, %0) {kernel = @ex} : tensor<16xf32>
  %1 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %b = exec.launch(%x, %1) {kernel = @ex} : tensor<16xf32>
  %2 = mem.alloc() : tensor<16xf32>
  %c = exec.launch(%a, %b, %2) {kernel = @sum} : tensor<16xf32>
  return %c""", "reads %a, but launch of @ex"),
        # Read of a view nothing wrote.
        ("""  %0 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %1 = mem.alloc() : tensor<16xf32>
  %c = exec.launch(%0, %1) {kernel = @ex} : tensor<16xf32>
  return %c""", "reads %0 before anything wrote it"),
        # Writing over its own input is only for elementwise kernels, element for element.
        ("""  %0 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %a = exec.launch(%x, %0) {kernel = @ex} : tensor<16xf32>
  %1 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %b = exec.launch(%a, %1) {kernel = @rev} : tensor<16xf32>
  %2 = mem.alloc() : tensor<16xf32>
  %c = exec.launch(%b, %2) {kernel = @ex} : tensor<16xf32>
  return %c""", "writes bytes [0, 64) over its own input %a"),
        # Two streams touch the same bytes with no event between them.
        ("""  %0 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %a = exec.launch(%x, %0) {kernel = @ex} : tensor<16xf32>
  %2 = mem.alloc() : tensor<16xf32>
  %c = exec.launch(%a, %2) {kernel = @ex, stream = 1} : tensor<16xf32>
  return %c""", "with no event after launch of @ex"),
        # A concat may find its operands already in its bytes, but each at its own place only.
        ("""  %0 = mem.view(%arena) {offset = 64} : tensor<16xf32>
  %a = exec.launch(%x, %0) {kernel = @ex} : tensor<16xf32>
  %1 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %b = exec.launch(%x, %1) {kernel = @ex} : tensor<16xf32>
  %2 = mem.view(%arena) {offset = 0} : tensor<32xf32>
  %c = exec.launch(%a, %b, %2) {kernel = @cat} : tensor<32xf32>
  %3 = mem.alloc() : tensor<16xf32>
  %d = exec.launch(%c, %3) {kernel = @half} : tensor<16xf32>
  return %d""", "writes bytes [0, 128) over its own input %a"),
    ],
    ids=["overlap", "read-before-write", "not-elementwise-in-place", "stream-race", "concat-operands-swapped"],
)
def test_plan_checker_reports_unsound_plans(body: str, message: str) -> None:
    m = parse(broken(body), "broken.gir")
    with pytest.raises(GCError, match="unsound plan") as e:
        check_plan(m, m["main"])
    assert message in str(e.value)


def test_plan_checker_accepts_the_same_plan_with_an_event() -> None:
    m = parse(broken("""  %0 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %a = exec.launch(%x, %0) {kernel = @ex} : tensor<16xf32>
  exec.signal {event = 0, stream = 0}
  exec.wait {event = 0, stream = 1}
  %2 = mem.alloc() : tensor<16xf32>
  %c = exec.launch(%a, %2) {kernel = @ex, stream = 1} : tensor<16xf32>
  return %c"""), "ok.gir")
    check_plan(m, m["main"])


def test_plan_checker_accepts_concat_operands_at_their_places_and_the_interpreter_agrees() -> None:
    m = parse(broken("""  %0 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %a = exec.launch(%x, %0) {kernel = @ex} : tensor<16xf32>
  %1 = mem.view(%arena) {offset = 64} : tensor<16xf32>
  %b = exec.launch(%a, %1) {kernel = @ex} : tensor<16xf32>
  %2 = mem.view(%arena) {offset = 0} : tensor<32xf32>
  %c = exec.launch(%a, %b, %2) {kernel = @cat} : tensor<32xf32>
  %3 = mem.alloc() : tensor<16xf32>
  %d = exec.launch(%c, %3) {kernel = @half} : tensor<16xf32>
  return %d"""), "ok.gir")
    check_plan(m, m["main"])
    assert [op.kernel.name for op in copies_nothing(m, m["main"])] == ["cat"]
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    np.testing.assert_allclose(run(m, {"x": x})[0], np.exp(x), rtol=1e-6)


FIRE = """
// SqueezeNet's fire module: squeeze, two expands, their concat, and a conv reading it.
func @main(%x: tensor<BATCHx32x13x13xf32>, %ws: tensor<16x32x1x1xf32>, %w1: tensor<32x16x1x1xf32>,
           %w3: tensor<32x16x3x3xf32>, %wn: tensor<16x64x1x1xf32>) -> tensor<BATCHx16x13x13xf32> {
  %s = graph.conv2d(%x, %ws)
  %sr = graph.relu(%s)
  %a = graph.conv2d(%sr, %w1)
  %ar = graph.relu(%a)
  %b = graph.conv2d(%sr, %w3) {padding = [1, 1, 1, 1]}
  %br = graph.relu(%b)
  %c = graph.concat(%ar, %br) {axis = 1}
  %y = graph.conv2d(%c, %wn)
  return %y
}
"""


def _fire_plan(text: str, views: bool = True) -> tuple[Module, list[np.ndarray], list[np.ndarray]]:
    m = parse(text, "fire.gir")
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    flag = str(views).lower()
    p = planned(parse(text, "fire.gir"), GRAPH + f",schedule,plan-memory{{align=64,conv-borders=true,"
                f"in-place-epilogues=true,concat-views={flag}}}")
    check_plan(p, p["main"])
    return p, inputs, expected


def test_concat_operands_are_written_into_the_concat_and_the_concat_copies_nothing() -> None:
    p, inputs, expected = _fire_plan(FIRE.replace("BATCH", "1"))
    f = p["main"]
    views = {op.results[0].name: op.operands[-1].owner.offset for op in f.ops
             if op.name == "exec.launch" and op.operands[-1].owner.name == "mem.view"}
    cat = next(op for op in f.ops if op.name == "exec.launch" and op.kernel.name.startswith("concat"))
    a, b = cat.operands[:2]
    assert views[a.name] == views[cat.results[0].name] and views[b.name] == views[a.name] + a.type.nbytes
    assert copies_nothing(p, f) == {cat}
    for want, got in zip(expected, run(p, inputs)):
        close(want, got)
    stats, copied = plan_stats(f), plan_stats(_fire_plan(FIRE.replace("BATCH", "1"), views=False)[0]["main"])
    assert stats["lower_bound_bytes"] <= stats["arena_bytes"] <= copied["arena_bytes"]
    assert stats["naive_bytes"] == copied["naive_bytes"]
    # Compiled: no step runs the concat, and the values are the interpreter's.
    text = FIRE.replace("BATCH", "1")
    model = compiler.compile(text, "llvm", cache=False)
    assert not any(c.kernel.startswith("concat") for c in model.plan.steps)
    assert_outputs(model(**inputs), expected, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in expected))


@pytest.mark.parametrize("change", ["batch 2", "operand returned", "operand read twice", "result returned",
                                    "operand an argument", "unaligned"])
def test_concats_whose_operands_cannot_lie_in_place_still_copy(change: str) -> None:
    text = FIRE.replace("BATCH", "2" if change == "batch 2" else "1")
    if change == "operand returned":
        text = text.replace("-> tensor<1x16x13x13xf32>", "-> (tensor<1x16x13x13xf32>, tensor<1x32x13x13xf32>)")
        text = text.replace("return %y", "return %y, %ar")
    elif change == "operand read twice":
        text = text.replace("  %y = graph.conv2d(%c, %wn)", "  %y0 = graph.conv2d(%c, %wn)\n"
                            "  %t = graph.slice(%ar) {starts = [0], ends = [16], axes = [1]}\n"
                            "  %y = graph.add(%y0, %t)")
    elif change == "result returned":
        text = text.replace("-> tensor<1x16x13x13xf32>", "-> (tensor<1x16x13x13xf32>, tensor<1x64x13x13xf32>)")
        text = text.replace("return %y", "return %y, %c")
    elif change == "operand an argument":
        text = text.replace("%x: tensor<1x32x13x13xf32>,", "%x: tensor<1x32x13x13xf32>, %z: tensor<1x32x13x13xf32>,")
        text = text.replace("graph.concat(%ar, %br)", "graph.concat(%z, %br)")
    elif change == "unaligned":  # 3 x 5 x 5 floats: 300 bytes, no multiple of 64
        text = FIRE.replace("BATCH", "1").replace("13x13", "5x5").replace("32x16x1x1", "3x16x1x1")
        text = text.replace("tensor<16x64x1x1xf32>", "tensor<16x35x1x1xf32>")
    p, inputs, expected = _fire_plan(text)
    cat = [op for op in p["main"].ops if op.name == "exec.launch" and op.kernel.name.startswith("concat")]
    assert len(cat) == 1 and not copies_nothing(p, p["main"])
    for want, got in zip(expected, run(p, inputs)):
        close(want, got)


GPT2_MLP = """
// GPT-2's MLP as TorchScript exports it: rows flattened for the product, unflattened after it.
func @main(%x: tensor<1x8x16xf32>, %g: tensor<16xf32>, %bt: tensor<16xf32>, %w1: tensor<16x32xf32>,
           %w2: tensor<32x16xf32>) -> tensor<1x8x16xf32> {
  %n = graph.layer_norm(%x, %g, %bt) {axis = -1}
  %f = graph.reshape(%n) {shape = [8, 16]}
  %h = graph.matmul(%f, %w1) : tensor<8x32xf32>
  %u = graph.reshape(%h) {shape = [1, 8, 32]}
  %a = graph.tanh(%u)
  %f2 = graph.reshape(%a) {shape = [8, 32]}
  %o = graph.matmul(%f2, %w2) : tensor<8x16xf32>
  %y = graph.reshape(%o) {shape = [1, 8, 16]}
  %r = graph.add(%y, %x)
  return %r
}
"""


def test_a_reshape_is_a_view_of_its_operand_and_copies_nothing() -> None:
    """Each lone reshape's result lies at its operand's bytes (its producer writes them there) and its
    launch copies nothing; compiled, no step runs it, and the values are the interpreter's."""
    m = parse(GPT2_MLP, "mlp.gir")
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    p = planned(parse(GPT2_MLP, "mlp.gir"), "schedule,plan-memory{align=64,in-place-epilogues=true,concat-views=true}")
    f = p["main"]
    check_plan(p, f)
    reshapes = [op for op in f.ops if op.name == "exec.launch" and op.kernel.name.startswith("reshape")]
    assert len(reshapes) == 4 and copies_nothing(p, f) == set(reshapes)
    for op in reshapes:
        assert op.operands[0].owner.operands[-1].owner.offset == op.operands[-1].owner.offset
    for want, got in zip(expected, run(p, inputs)):
        close(want, got)
    model = compiler.compile(GPT2_MLP, "llvm", cache=False)
    assert not any(c.kernel.startswith("reshape") for c in model.plan.steps)
    assert_outputs(model(**inputs), expected, rtol=2e-5, atol=2e-5)


def test_a_reshape_of_a_value_read_elsewhere_or_returned_copies() -> None:
    """A reshape whose operand another op reads too, or whose result is returned, keeps its copy."""
    text = GPT2_MLP.replace("-> tensor<1x8x16xf32>", "-> (tensor<1x8x16xf32>, tensor<8x32xf32>)")
    text = text.replace("return %r", "return %r, %h")
    p = planned(parse(text, "mlp.gir"), "schedule,plan-memory{align=64,in-place-epilogues=true,concat-views=true}")
    check_plan(p, p["main"])
    kept = {op.kernel.name for op in p["main"].ops if op.name == "exec.launch" and op.kernel.name.startswith("reshape")}
    copied = {op.kernel.name for op in p["main"].ops if op.name == "exec.launch"} - {
        op.kernel.name for op in copies_nothing(p, p["main"])}
    assert "reshape_1" in kept & copied  # %u reads %h, which is returned
    m = parse(text, "mlp.gir")
    inputs = random_inputs(m["main"], 0, m)
    for want, got in zip(run(m, inputs), run(p, inputs)):
        close(want, got)


@pytest.mark.parametrize("shape", [(1, 16, 16, 8), (1, 64, 4, 8), (1, 8, 16, 16)])
def test_a_reshape_view_between_convs_keeps_its_operands_bytes_in_nchw(shape) -> None:
    """A reshape that regroups a conv's map is a view of the conv's bytes in NCHW only: channel-blocked,
    [1, 32, 8, 8] and [1, 16, 16, 8] lie in other orders, so the two stay NCHW (their storage group is
    not blocked) and the values are the interpreter's."""
    c, h, w = shape[1:]
    text = f"""func @main(%x: tensor<1x16x8x8xf32>, %w1: tensor<32x16x3x3xf32>, %w2: tensor<16x{c}x3x3xf32>) -> tensor<1x16x{h}x{w}xf32> {{
  %a = graph.conv2d(%x, %w1) {{padding = [1, 1, 1, 1]}}
  %r = graph.relu(%a)
  %v = graph.reshape(%r) {{shape = [1, {c}, {h}, {w}]}}
  %y = graph.conv2d(%v, %w2) {{padding = [1, 1, 1, 1]}}
  return %y
}}"""
    m = parse(text, "regroup.gir")
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    model = compiler.compile(text, "llvm", cache=False)
    assert not any(s.kernel.startswith("reshape") for s in model.plan.steps)
    assert_outputs(model(**inputs), expected, rtol=2e-5, atol=2e-5 * max(float(np.abs(e).max()) for e in expected))


@st.composite
def concat_nets(draw) -> str:
    """Random nets of concats over 4x4 maps (64 bytes a channel, so offsets align): operands from
    elementwise ops, 1x1 and 3x3 convs, arguments, other concats (nested), reshapes (views of their
    operands where those are read by them alone), some read twice; concats along
    channels, rows or the batch, of one or two images; results that are concats or their operands."""
    n = draw(st.sampled_from([1, 1, 2]))
    c0 = draw(st.integers(1, 3))
    lines, types = [], {"x": c0}
    args = [f"%x: tensor<{n}x{c0}x4x4xf32>"]
    names = ["x"]

    def t(c: int, h: int = 4) -> str:
        return f"tensor<{n}x{c}x{h}x4xf32>"

    for i in range(draw(st.integers(2, 7))):
        kind = draw(st.sampled_from(["relu", "exp", "conv1", "conv3", "concat", "concat", "concat", "flat"]))
        src = draw(st.sampled_from(names))
        c = types[src]
        if kind == "flat":  # flattened, an elementwise op on the rows, and back: two reshapes that may be views
            lines.append(f"  %f{i} = graph.reshape(%{src}) {{shape = [{n}, {c * 16}]}}")
            lines.append(f"  %g{i} = graph.relu(%f{i})")
            lines.append(f"  %v{i} = graph.reshape(%g{i}) {{shape = [{n}, {c}, 4, 4]}}")
            types[f"v{i}"] = c
        elif kind in ("relu", "exp"):
            lines.append(f"  %v{i} = graph.{'relu' if kind == 'relu' else 'tanh'}(%{src})")
            types[f"v{i}"] = c
        elif kind.startswith("conv"):
            o, k = draw(st.integers(1, 3)), 1 if kind == "conv1" else 3
            args.append(f"%w{i}: tensor<{o}x{c}x{k}x{k}xf32>")
            pad = " {padding = [1, 1, 1, 1]}" if k == 3 else ""
            lines.append(f"  %v{i} = graph.conv2d(%{src}, %w{i}){pad}")
            types[f"v{i}"] = o
        else:
            parts = draw(st.lists(st.sampled_from(names), min_size=2, max_size=3))
            lines.append(f"  %v{i} = graph.concat({', '.join('%' + p for p in parts)}) {{axis = 1}}")
            types[f"v{i}"] = sum(types[p] for p in parts)
        names.append(f"v{i}")
    outs = list(dict.fromkeys([names[-1], *draw(st.lists(st.sampled_from(names[1:]), max_size=1))]))
    rets = ", ".join(t(types[o]) for o in outs)
    body = "\n".join(lines)
    return (f"func @main({', '.join(args)}) -> ({rets}) {{\n{body}\n  return {', '.join('%' + o for o in outs)}\n}}\n")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(concat_nets())
def test_random_concat_and_reshape_nets_plan_soundly_with_views(text: str) -> None:
    m = parse(text, "cat.gir")
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    for fused in (False, True):
        p = planned(parse(text, "cat.gir"), ("fuse," if fused else "") + "schedule,plan-memory{align=64,"
                    "conv-borders=true,in-place-epilogues=true,concat-views=true}")
        check_plan(p, p["main"])
        stats = plan_stats(p["main"])
        assert stats["lower_bound_bytes"] <= stats["arena_bytes"]
        for want, got in zip(expected, run(p, inputs)):
            close(want, got)


@pytest.mark.parametrize("seed", range(4))
def test_random_concat_nets_compile_and_match_the_interpreter(seed: int) -> None:
    text = _concat_net_for(seed)
    m = parse(text, "cat.gir")
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    model = compiler.compile(text, "llvm", cache=False)
    calls = [c.kernel for c in model.plan.steps]
    # The returned concat copies; the other lies in place (read by a padded conv, it does where the plan
    # keeps no bordered buffer for it: a net this small is planned without borders).
    copies = sum(k.startswith("concat") for k in calls)
    assert copies == 1 if seed % 2 == 0 else 1 <= copies <= 2
    scale = max(float(np.abs(w).max()) for w in expected) or 1.0
    assert_outputs(model(**inputs), expected, rtol=2e-5, atol=2e-5 * scale)


def _concat_net_for(seed: int) -> str:
    """A concat of three convs (elementwise operands, and a concat of a concat, fuse into one kernel with
    it), read by a conv unpadded or padded, and a returned concat of it and that conv (which copies)."""
    c, k = 2 + seed % 2, 1 + 2 * (seed % 2)
    return f"""func @main(%x: tensor<1x{c}x4x4xf32>, %w1: tensor<3x{c}x1x1xf32>, %w2: tensor<2x{c}x3x3xf32>,
           %w4: tensor<2x{c}x1x1xf32>, %w3: tensor<4x7x{k}x{k}xf32>) -> (tensor<1x4x4x4xf32>, tensor<1x11x4x4xf32>) {{
  %a = graph.conv2d(%x, %w1)
  %b = graph.conv2d(%x, %w2) {{padding = [1, 1, 1, 1]}}
  %e = graph.conv2d(%x, %w4)
  %abe = graph.concat(%a, %b, %e) {{axis = 1}}
  %y = graph.conv2d(%abe, %w3) {{padding = [{seed % 2}, {seed % 2}, {seed % 2}, {seed % 2}]}}
  %out = graph.concat(%abe, %y) {{axis = 1}}
  return %y, %out
}}
"""


def test_overlapping_plan_computes_wrong_numbers_on_the_interpreter_too() -> None:
    """The interpreter is a faithful oracle for plans: aliasing views really alias."""
    m = parse(broken("""  %0 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %a = exec.launch(%x, %0) {kernel = @ex} : tensor<16xf32>
  %1 = mem.view(%arena) {offset = 0} : tensor<16xf32>
  %b = exec.launch(%a, %1) {kernel = @ex} : tensor<16xf32>
  %2 = mem.alloc() : tensor<16xf32>
  %c = exec.launch(%a, %b, %2) {kernel = @sum} : tensor<16xf32>
  return %c"""), "x.gir")
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    got = run(m, [x])[0]
    right = np.exp(x) + np.exp(np.exp(x))
    assert not np.allclose(got, right)
    np.testing.assert_allclose(got, 2 * np.exp(np.exp(x)), rtol=1e-6)


LAUNCH = "  %0 = mem.view(%arena) {{offset = 0}} : tensor<16xf32>\n  %a = exec.launch(%x, %0) {{kernel = @{kernel}}} : tensor<16xf32>\n  return %a"


@pytest.mark.parametrize(
    "body, message",
    [
        ("  %0 = mem.view(%arena) {offset = 32} : tensor<16xf32>\n  return %x", "offset 32 is not a multiple of"),
        ("  %0 = mem.view(%arena) {offset = 256} : tensor<16xf32>\n  return %x", "lie outside the 256-byte arena"),
        (LAUNCH.format(kernel="sum"), "@sum takes 2 input(s), got 1"),
        (LAUNCH.format(kernel="nope"), "unknown kernel @nope"),
        ("  %0 = mem.view(%arena) {offset = 0}\n  return %x", "write the result type"),
    ],
    ids=["misaligned", "out-of-bounds", "arity", "unknown-kernel", "untyped-view"],
)
def test_mem_exec_user_mistakes_are_diagnostics(body: str, message: str) -> None:
    with pytest.raises(GCError) as e:
        parse(broken(body), "bad.gir")
    assert message in str(e.value) and "bad.gir:" in str(e.value)


# --- the command line and the compiled model ------------------------------------------------------


def test_gc_compile_stats_report_the_plan_and_gc_stats_prints_them(tmp_path: Path, capsys) -> None:
    import json

    from compiler.cli import main

    stats = tmp_path / "s.json"
    assert main(["compile", str(ROOT / "examples/transformer.gir"), "-o", str(tmp_path / "t.gcpkg"), "--stats", str(stats)]) == 0
    s = json.loads(stats.read_text())
    assert s["lower_bound_bytes"] <= s["arena_bytes"] <= 1.05 * s["lower_bound_bytes"] < s["naive_bytes"]
    assert s["lower_bound_bytes"] <= s["file_order_lower_bound_bytes"]
    capsys.readouterr()
    assert main(["stats", str(stats)]) == 0
    out = capsys.readouterr().out
    assert f"{s['arena_bytes']:,}" in out and "arena / lower bound" in out and "kernels, in order:" in out
    assert main(["stats", str(ROOT / "examples/transformer.gir"), "-O2"]) == 0
    assert f"{s['arena_bytes']:,}" in capsys.readouterr().out  # the same plan without compiling


def test_compiled_model_runs_every_intermediate_inside_one_arena() -> None:
    import compiler

    m = compiler.compile(ROOT / "examples/cnn.gir", "llvm")
    kinds = [b.kind for b in m.plan.buffers]
    assert kinds.count("arena") == 1 and "view" in kinds
    arena = next(b for b in m.plan.buffers if b.kind == "arena")
    views = [b for b in m.plan.buffers if b.kind == "view"]
    bordered = [b for b in m.plan.buffers if b.kind == "bordered"]
    # The inputs of the six padded convs that are not the net's input (stem, b1a, p1, b2a, p2, b3a) and
    # the residual output written in place over the stem, each the interior of zero-bordered bytes of
    # the arena (4-D pads, or 5-D for a tensor stored channel-blocked: codegen/layout.py).
    assert len(bordered) == kinds.count("whole") == 7 and all(
        list(b.pads) in ([0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0, 0, 1, 1, 0]) for b in bordered)
    wholes = {i for i, b in enumerate(m.plan.buffers) if b.kind == "whole"}
    assert sum(bool(wholes & set(c.buffers)) for c in m.plan.steps if c.kernel) == 6
    for b in views + bordered:
        size = int(np.prod(padded_shape(b.shape, b.pads))) * 4
        assert b.offset % 64 == 0 and b.offset + size <= arena.size
    figures = m.plan.memory
    assert figures["bordered_bytes"] == 0 and arena.size == figures["arena_bytes"] <= figures["naive_bytes"]
    assert figures["tensor_bound_bytes"] <= figures["lower_bound_bytes"] <= arena.size
    assert arena.size <= 1.05 * figures["lower_bound_bytes"]
    assert kinds.count("temp") == len(m.plan.results)  # the results' own buffers, nothing else
    src = parse_file(ROOT / "examples/cnn.gir")
    inputs = random_inputs(src["main"], 3, src)
    expected = run(src, inputs)
    for _ in range(2):  # a second call reuses the arena: nothing of the first call may leak into it
        np.testing.assert_allclose(m(**inputs)[0], expected[0], rtol=1e-4, atol=1e-5)


def test_docs_memory_md_table_is_current() -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "tools/memory_report.py"), "--check"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr


def test_results_are_written_where_the_caller_wants_them() -> None:
    import compiler

    m = compiler.compile(ROOT / "examples/mlp.gir", "llvm")
    src = parse_file(ROOT / "examples/mlp.gir")
    inputs = random_inputs(src["main"], 4, src)
    out = np.full((64, 10), np.nan, np.float32)
    got = m.run_into([out], **inputs)
    assert got[0] is out
    np.testing.assert_allclose(out, run(src, inputs)[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(GCError, match=r"output 0 must be a writeable float32\[64, 10\]"):
        m.run_into([np.zeros((64, 9), np.float32)], **inputs)


def test_read_only_inputs_are_accepted() -> None:
    """onnx.numpy_helper and np.load(mmap_mode="r") hand out read-only arrays, which have no DLPack export."""
    import compiler

    m = compiler.compile(ROOT / "examples/mlp.gir", "llvm")
    src = parse_file(ROOT / "examples/mlp.gir")
    inputs = random_inputs(src["main"], 5, src)
    want = m(**inputs)[0]
    for x in inputs.values():
        x.flags.writeable = False
    np.testing.assert_array_equal(m(**inputs)[0], want)


def test_figures_are_bytes_and_the_lower_bound_never_exceeds_the_arena() -> None:
    """naive is the plain sum of the intermediates' sizes (60-byte tensors count 60); an output written in
    place over its dying input shares its buffer, so the lower bound counts the pair once."""
    src = """func @main(%x: tensor<3x5xf32>, %w: tensor<5x5xf32>) -> tensor<f32> {
  %h = graph.matmul(%x, %w) : tensor<3x5xf32>
  %e = graph.exp(%h) : tensor<3x5xf32>
  %t = graph.tanh(%e) : tensor<3x5xf32>
  %s = graph.reduce_sum(%t) : tensor<f32>
  return %s
}
"""
    p = planned(parse(src, "x.gir"), "plan-memory")
    s = plan_stats(p["main"])
    assert s["naive_bytes"] == 3 * 60
    assert s["lower_bound_bytes"] == 60 <= s["arena_bytes"] == 64  # one buffer, written over twice
    assert plan_stats(p["main"], 64)["lower_bound_bytes"] == 64


def test_a_lone_ops_constants_enter_its_kernel_in_operand_order() -> None:
    """plan-memory outlines an op no fused group took, with the constants only it reads; they enter the
    kernel in the op's operand order (a set's order, the values' ids, made the artifact of one model differ
    from one compile to the next)."""
    text = """func @main(%x: tensor<1x8x6x6xf32>) -> tensor<1x4x6x6xf32> {
  %w = graph.constant() {value = dense<0.5> : tensor<4x8x1x1xf32>}
  %b = graph.constant() {value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>}
  %y = graph.conv2d(%x, %w, %b)
  return %y
}
"""
    for _ in range(5):
        p = planned(parse(text), "schedule,plan-memory")
        kernel = next(f for f in p.funcs.values() if f.attrs.get("kernel"))
        consts = [op.result.type.shape for op in kernel.ops if op.kind == "constant"]
        assert consts == [(4, 8, 1, 1), (4,)], consts


CHAIN = """
// A dense block: each concat's operands begin the next one's (the test's _chain varies the third
// concat's operands and what reads the first).
func @main(%x: tensor<1x16x8x8xf32>, %w1: tensor<16x16x1x1xf32>, %w2: tensor<16x32x1x1xf32>,
           %w3: tensor<16x48x1x1xf32>) -> tensor<1x16x8x8xf32> {
  %x0 = graph.relu(%x)
  %y1 = graph.conv2d(%x0, %w1)
  %c1 = graph.concat(%x0, %y1) {axis = 1}
  %r1 = graph.relu(%c1)
  %y2 = graph.conv2d(%r1, %w2)
  %c2 = graph.concat(%x0, %y1, %y2) {axis = 1}
  %r2 = graph.relu(%c2)
  %y3 = graph.conv2d(%r2, %w3)
  %c3 = graph.concat(%x0, %y1, THIRD) {axis = 1}
  %r3 = graph.sigmoid(%c3)
  %z = graph.reduce_mean(%r3) {axes = [1], keepdims = true}
  %y = graph.mul(%y3, %z)
  LATE
  return %out
}
"""


def _chain(third: str = "%y2, %y3", late: bool = False) -> str:
    text = CHAIN.replace("THIRD", third)
    if late:  # the first concat read again after the last one
        return text.replace("LATE", "%m = graph.reduce_max(%c1) {axes = [1], keepdims = true}\n  %out = graph.add(%y, %m)")
    return text.replace("LATE", "%out = graph.relu(%y)")


@pytest.mark.parametrize("late", [False, True])
def test_a_chain_of_concats_lies_in_one_buffer_and_runs_no_kernel(late: bool) -> None:
    """fuse{concat-chains} leaves [x0, y1], [x0, y1, y2], [x0, y1, y2, y3] unfused; plan-memory puts every
    operand at its offset in the last one's bytes and each concat at offset 0 of them, none runs, the
    checker accepts the first concat read after the last (no byte changed), and values are the
    interpreter's, planned and compiled."""
    text = _chain(late=late)
    m = parse(text)
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    p = parse(text)
    run_pipeline(p, "fuse{concat-chains=true},plan-memory{concat-views=true}")
    f = p["main"]
    at = {op.results[0].name: (op.operands[-1].owner.offset, op.results[0].type.nbytes) for op in f.ops
          if op.name == "exec.launch" and op.operands[-1].owner.name == "mem.view"}
    c1, c2, c3 = at["c1"], at["c2"], at["c3"]
    assert c1[0] == c2[0] == c3[0] == at["x0"][0] and c1[1] < c2[1] < c3[1]
    assert [at[v][0] - c3[0] for v in ("x0", "y1", "y2", "y3")] == [0, 4096, 8192, 12288]
    assert sorted(op.kernel.name for op in copies_nothing(p, f)) == ["concat", "concat_1", "concat_2"]
    check_plan(p, f)
    for want, got in zip(expected, run(p, inputs)):
        close(want, got)
    stats = plan_stats(f)
    assert stats["arena_bytes"] <= 1.05 * stats["lower_bound_bytes"]
    model = compiler.compile(text, "llvm", cache=False)
    assert not any("concat" in c.ops for c in model.plan.steps if c.kernel)
    assert_outputs(model(**inputs), expected, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in expected))


def test_concats_extending_one_prefix_two_ways_share_no_buffer() -> None:
    """[x0, y1] begins both [x0, y1, y2] and [x0, y1, y3]: no one buffer holds both, so neither chain is
    laid out (each concat copies), and the values are the interpreter's."""
    text = _chain(third="%y3")
    m = parse(text)
    inputs = random_inputs(m["main"], 0, m)
    expected = run(m, inputs)
    p = parse(text)
    run_pipeline(p, "fuse{concat-chains=true},plan-memory{concat-views=true}")
    check_plan(p, p["main"])
    assert not copies_nothing(p, p["main"])
    for want, got in zip(expected, run(p, inputs)):
        close(want, got)
    model = compiler.compile(text, "llvm", cache=False)
    assert_outputs(model(**inputs), expected, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in expected))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(growths=st.lists(st.sampled_from([16, 32, 48]), min_size=1, max_size=4), c0=st.sampled_from([16, 32]),
       late=st.booleans(), seed=st.integers(0, 2**16))
def test_concat_chains_keep_every_value(growths: list[int], c0: int, late: bool, seed: int) -> None:
    """Dense blocks of any length and growth: the plan lays the chain in one buffer, the checker accepts it,
    every concat copies nothing, and the planned IR computes the interpreter's values, also with the first
    concat read again at the end."""
    lines, prev = [], "x0"
    channels = c0
    args = [f"%x: tensor<1x{c0}x4x4xf32>"]
    lines.append("  %x0 = graph.relu(%x)")
    operands = ["%x0"]
    for i, g in enumerate(growths):
        args.append(f"%w{i}: tensor<{g}x{channels}x1x1xf32>")
        lines.append(f"  %y{i} = graph.conv2d(%{prev}, %w{i})")
        operands.append(f"%y{i}")
        channels += g
        lines.append(f"  %c{i} = graph.concat({', '.join(operands)}) {{axis = 1}}")
        lines.append(f"  %r{i} = graph.relu(%c{i})")
        prev = f"r{i}"
    last = f"%r{len(growths) - 1}"
    lines.append(f"  %s = graph.reduce_sum({last}) {{axes = [1], keepdims = true}}")
    if late:
        lines.append("  %m = graph.reduce_max(%c0) {axes = [1], keepdims = true}")
        lines.append("  %out = graph.add(%s, %m)")
    else:
        lines.append("  %out = graph.relu(%s)")
    text = (f"func @main({', '.join(args)}) -> tensor<1x1x4x4xf32> {{\n" + "\n".join(lines) + "\n  return %out\n}\n")
    m = parse(text)
    inputs = random_inputs(m["main"], seed, m)
    expected = run(m, inputs)
    p = parse(text)
    run_pipeline(p, "fuse{concat-chains=true},plan-memory{concat-views=true}")
    f = p["main"]
    check_plan(p, f)
    if len(growths) > 1:
        assert len(copies_nothing(p, f)) == len(growths)
    for want, got in zip(expected, run(p, inputs)):
        close(want, got)
    stats = plan_stats(f)
    assert stats["arena_bytes"] <= 1.05 * stats["lower_bound_bytes"] + 64
