"""plan-memory{conv-borders=true}: a padded conv's input lives in a zero-bordered buffer that its producer
writes the interior of and the conv reads whole, in place (docs/memory.md); with borders-in-arena (the CPU
build) that buffer is a view of the arena whose writer writes the border too. Checked on the plan (IR,
interpreter, figures) and on compiled CPU code against the interpreter, over repeated calls on an arena
filled with NaN between them, so that a border its writer left out is read as NaN."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import calls_on_nan_arena
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import compiler
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.memory import plan_stats
from compiler.parser import parse
from compiler.pipeline import run_pipeline
from compiler.printer import print_module

# %r: read whole by a conv padded as its border, and as the strided interior by a 1x1 conv;
# %t: read by an asymmetrically padded conv and by an add in the same kernel (so the interior there).
NET = """func @main(%x: tensor<1x4x32x32xf32>, %w1: tensor<8x4x3x3xf32>, %w2: tensor<8x8x3x3xf32>,
                 %w3: tensor<8x8x1x1xf32>, %w4: tensor<8x8x3x3xf32>) -> tensor<1x8x16x16xf32> {
  %a = graph.conv2d(%x, %w1) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>
  %r = graph.relu(%a) : tensor<1x8x32x32xf32>
  %c = graph.conv2d(%r, %w3) : tensor<1x8x32x32xf32>
  %b = graph.conv2d(%r, %w2) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>
  %s = graph.add(%b, %c) : tensor<1x8x32x32xf32>
  %t = graph.relu(%s) : tensor<1x8x32x32xf32>
  %d = graph.conv2d(%t, %w4) {padding = [0, 1, 2, 1]} : tensor<1x8x32x32xf32>
  %e = graph.add(%d, %t) : tensor<1x8x32x32xf32>
  %m = graph.max_pool2d(%e) {kernel = [2, 2]} : tensor<1x8x16x16xf32>
  return %m
}
"""


def _planned(text: str, borders: bool = True, arena: bool = False):
    m = parse(text)
    flag = "true" if borders else "false"
    run_pipeline(m, f"fuse,schedule,plan-memory{{conv-borders={flag},borders-in-arena={'true' if arena else 'false'}}}")
    return m


def test_plan_gives_conv_inputs_zero_borders_and_still_computes_the_same() -> None:
    m = _planned(NET)
    text = print_module(m)
    assert text.count("mem.alloc {pads = [0, 0, 1, 1, 0, 0, 1, 1]} : tensor<1x8x32x32xf32>") == 1  # %r
    assert text.count("mem.alloc {pads = [0, 0, 0, 1, 0, 0, 2, 1]} : tensor<1x8x32x32xf32>") == 1  # %t
    assert print_module(parse(text)) == text  # the planned stage prints and parses back
    src = parse(NET)
    inputs = random_inputs(src["main"], 0, src)
    np.testing.assert_allclose(run(m, inputs)[0], run(src, inputs)[0], rtol=1e-5, atol=1e-5)
    s = plan_stats(m["main"])
    assert s["bordered_bytes"] == 8 * 34 * 34 * 4 + 8 * 34 * 34 * 4
    arena = next(op.size for op in m["main"].ops if op.name == "mem.arena")
    assert s["arena_bytes"] == arena + s["bordered_bytes"] <= s["naive_bytes"]


def test_borders_are_dropped_where_they_would_cost_more_than_a_buffer_per_tensor() -> None:
    # Without the pool, the bordered buffers would outweigh the three intermediates they replace.
    short = NET.replace("  %m = graph.max_pool2d(%e) {kernel = [2, 2]} : tensor<1x8x16x16xf32>\n  return %m",
                        "  return %e").replace("-> tensor<1x8x16x16xf32>", "-> tensor<1x8x32x32xf32>")
    m = _planned(short)
    assert "pads" not in print_module(m)
    s = plan_stats(m["main"])
    assert s["bordered_bytes"] == 0 and s["arena_bytes"] <= s["naive_bytes"]


def test_no_borders_unless_asked() -> None:
    assert "pads" not in print_module(_planned(NET, borders=False))
    assert "pads" not in print_module(_planned(NET, borders=False, arena=True))


def test_borders_in_the_arena_share_bytes_with_other_tensors_and_plan_at_the_bound() -> None:
    m = _planned(NET, arena=True)
    text = print_module(m)
    assert "mem.alloc {pads" not in text
    assert text.count("pads = [0, 0, 1, 1, 0, 0, 1, 1]} : tensor<1x8x32x32xf32>") == 1  # %r
    assert text.count("pads = [0, 0, 0, 1, 0, 0, 2, 1]} : tensor<1x8x32x32xf32>") == 1  # %t
    assert print_module(parse(text)) == text
    src = parse(NET)
    inputs = random_inputs(src["main"], 0, src)
    np.testing.assert_allclose(run(m, inputs)[0], run(src, inputs)[0], rtol=1e-5, atol=1e-5)
    s = plan_stats(m["main"], 64)
    assert s["bordered_bytes"] == 0  # nothing outside the arena
    # The bound counts %r and %t with their borders; the tensors' own sizes give the smaller one.
    assert s["tensor_bound_bytes"] < s["lower_bound_bytes"] <= s["arena_bytes"] <= 1.05 * s["lower_bound_bytes"]
    views = {op.result: op for op in m["main"].ops if op.name == "mem.view"}
    spans = [(v.offset, v.offset + v.padded_bytes) for v in views.values()]
    bordered = [(v.offset, v.offset + v.padded_bytes) for v in views.values() if v.pads]
    # Some other tensor uses bytes of a border at another time (so its writer must write it).
    assert any(a < d and c < b for a, b in bordered for c, d in spans if (c, d) != (a, b))


@pytest.mark.parametrize("params", [False, True], ids=["weights-as-args", "weights-bound"])
def test_compiled_cpu_code_reads_bordered_inputs_whole_or_strided(params: bool, tmp_path) -> None:
    src = parse(NET)
    inputs = random_inputs(src["main"], 1, src)
    want = run(src, inputs)[0]
    bound = {k: v for k, v in inputs.items() if k != "x"} if params else None
    model = compiler.compile(NET, "llvm", params=bound)
    kinds = [b.kind for b in model.plan.buffers]
    assert kinds.count("bordered") == kinds.count("whole") == 2
    assert all(b.in_arena for b in model.plan.buffers if b.kind == "bordered")
    views = {c.kernel: [model.plan.buffers[i].kind for i in c.buffers] for c in model.plan.steps}
    assert any("whole" in v for v in views.values())  # conv %b pads nothing: it reads %r's buffer whole
    assert sum("bordered" in v for v in views.values()) >= 3  # the producers and the other readers: interiors
    args = [inputs["x"]] if params else [inputs[a.name] for a in src["main"].args]
    calls_on_nan_arena(model, args, want)  # every call writes the borders it reads
    path = tmp_path / "net.gcpkg"
    model.save(path)
    np.testing.assert_allclose(compiler.load(path)(*args)[0], want, rtol=1e-4, atol=1e-5)


def test_same_shaped_bordered_tensors_share_a_buffer_when_their_lifetimes_do_not_touch() -> None:
    # Three 3x3 convs in a chain, each input bordered: %a and %c never live at once, so they share.
    chain = """func @main(%x: tensor<1x8x32x32xf32>, %w: tensor<8x8x3x3xf32>) -> tensor<1x8x16x16xf32> {
  %a = graph.conv2d(%x, %w) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>
  %ra = graph.tanh(%a) : tensor<1x8x32x32xf32>
  %b = graph.conv2d(%ra, %w) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>
  %rb = graph.tanh(%b) : tensor<1x8x32x32xf32>
  %c = graph.conv2d(%rb, %w) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>
  %rc = graph.tanh(%c) : tensor<1x8x32x32xf32>
  %d = graph.conv2d(%rc, %w) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>
  %e = graph.exp(%d) : tensor<1x8x32x32xf32>
  %f = graph.sqrt(%e) : tensor<1x8x32x32xf32>
  %g = graph.max_pool2d(%f) {kernel = [2, 2]} : tensor<1x8x16x16xf32>
  %h = graph.avg_pool2d(%f) {kernel = [2, 2]} : tensor<1x8x16x16xf32>
  %y = graph.sub(%g, %h) : tensor<1x8x16x16xf32>
  return %y
}
"""
    m = _planned(chain)
    text = print_module(m)
    assert text.count("mem.alloc {pads") == 2  # three bordered tensors, two buffers
    s = plan_stats(m["main"])
    assert s["bordered_bytes"] == 2 * 8 * 34 * 34 * 4
    src = parse(chain)
    inputs = random_inputs(src["main"], 2, src)
    np.testing.assert_allclose(run(m, inputs)[0], run(src, inputs)[0], rtol=1e-5, atol=1e-5)
    # In the arena, the bordered tensors' bytes serve the rest of the chain too (115 -> 74 KB, at the bound).
    shared = plan_stats(_planned(chain, arena=True)["main"], 64)
    assert shared["arena_bytes"] <= 1.05 * shared["lower_bound_bytes"]
    assert shared["arena_bytes"] < s["arena_bytes"]
    calls_on_nan_arena(compiler.compile(chain, "llvm"), inputs, run(src, inputs)[0])


def test_the_plan_checker_sees_a_bordered_buffer_written_while_its_tensor_is_read() -> None:
    from compiler.diagnostics import GCError
    from compiler.memory import check_plan

    text = print_module(_planned(NET))
    assert "%t = exec.launch(%r, %w3, %b, %2)" in text
    check_plan(m := parse(text), m["main"])
    bad = parse(text.replace("%t = exec.launch(%r, %w3, %b, %2)", "%t = exec.launch(%r, %w3, %b, %0)"))
    with pytest.raises(GCError, match="over its own input %r"):
        check_plan(bad, bad["main"])


@st.composite
def conv_nets(draw) -> str:
    """A chain of 2-3 convs (random padding per side, 1x1 or 3x3, stride 1 or 2, 8-40 channels), each
    read by the next and by a max pool, all pools summed: every conv input is a bordering candidate."""
    c = draw(st.sampled_from([8, 16, 40]))
    h, w = draw(st.integers(6, 12)), draw(st.integers(6, 12))
    lines, args = [], [f"%x: tensor<1x{c}x{h}x{w}xf32>"]
    # Two softmaxes first: intermediates the arena reuses later, so the borders fit in a buffer per tensor.
    t0 = f"tensor<1x{c}x{h}x{w}xf32>"
    lines += [f"  %x0 = graph.softmax(%x) {{axis = 1}} : {t0}", f"  %x1 = graph.softmax(%x0) {{axis = 3}} : {t0}",
              f"  %x2 = graph.softmax(%x1) {{axis = 2}} : {t0}"]
    cur, ch, pools = "%x2", c, []
    for i in range(draw(st.integers(2, 3))):
        k = draw(st.sampled_from([1, 3])) if h > 2 and w > 2 else 1  # a 3x3 needs a map it fits in
        pads = [draw(st.integers(0, 2)) for _ in range(4)] if k == 3 else [0, 0, 0, 0]
        s = draw(st.sampled_from([1, 2])) if h > 6 and w > 6 else 1
        oh, ow = (h + pads[0] + pads[2] - k) // s + 1, (w + pads[1] + pads[3] - k) // s + 1
        o = draw(st.sampled_from([8, 16]))
        args.append(f"%w{i}: tensor<{o}x{ch}x{k}x{k}xf32>")
        t = f"tensor<1x{o}x{oh}x{ow}xf32>"
        lines.append(f"  %c{i} = graph.conv2d({cur}, %w{i}) {{strides = [{s}, {s}], padding = {pads}}} : {t}")
        lines.append(f"  %r{i} = graph.relu(%c{i}) : {t}")
        lines.append(f"  %p{i} = graph.global_avg_pool2d(%r{i}) : tensor<1x{o}x1x1xf32>")
        lines.append(f"  %q{i} = graph.reduce_sum(%p{i}) {{axes = [1, 2, 3]}} : tensor<1xf32>")
        pools.append(f"%q{i}")
        cur, ch, h, w = f"%r{i}", o, oh, ow
    total = pools[0]
    for j, p in enumerate(pools[1:]):
        lines.append(f"  %s{j} = graph.add({total}, {p}) : tensor<1xf32>")
        total = f"%s{j}"
    return f"func @main({', '.join(args)}) -> tensor<1xf32> {{\n" + "\n".join(lines) + f"\n  return {total}\n}}\n"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_nets())
def test_random_conv_chains_compute_the_same_with_borders(text: str) -> None:
    """Planned both ways: buffers of their own (about a third of these nets keep their borders, the others
    would outgrow a buffer per tensor: `pytest --hypothesis-show-statistics` counts them) and in the arena,
    as the CPU build plans them."""
    src = parse(text)
    inputs = random_inputs(src["main"], 0, src)
    want = run(src, inputs)[0]
    for arena in (False, True):
        planned = _planned(text, arena=arena)
        event(f"{'in the arena' if arena else 'own buffers'}: "
              f"{'bordered' if 'pads' in print_module(planned) else 'borders dropped'}")
        np.testing.assert_allclose(run(planned, inputs)[0], want, rtol=1e-4, atol=1e-4)
    calls_on_nan_arena(compiler.compile(text, "llvm"), inputs, want, rtol=1e-3, atol=1e-3)


# A residual block: %o = relu(conv(relu(conv(%a))) + %a) may take %a's bordered buffer, border and all,
# whether or not a padded conv reads %o too (then %o needs that border anyway).
BLOCK = """func @main(%x: tensor<1x8x16x16xf32>, %w: tensor<8x8x3x3xf32>, %v: tensor<8x8x3x3xf32>,
                 %u: tensor<8x8x3x3xf32>) -> tensor<1x8x8x8xf32> {
  %a = graph.exp(%x) : tensor<1x8x16x16xf32>
  %h = graph.conv2d(%a, %w) {padding = [1, 1, 1, 1]} : tensor<1x8x16x16xf32>
  %r = graph.relu(%h) : tensor<1x8x16x16xf32>
  %c = graph.conv2d(%r, %v) {padding = [1, 1, 1, 1]} : tensor<1x8x16x16xf32>
  %s = graph.add(%c, %a) : tensor<1x8x16x16xf32>
  %o = graph.relu(%s) : tensor<1x8x16x16xf32>
  %n = NEXT
  %m = graph.max_pool2d(%n) {kernel = [2, 2]} : tensor<1x8x8x8xf32>
  return %m
}
"""


@pytest.mark.parametrize("nxt", ["graph.conv2d(%o, %u) {padding = [1, 1, 1, 1]} : tensor<1x8x16x16xf32>",
                                 "graph.tanh(%o) : tensor<1x8x16x16xf32>"], ids=["conv-reads-it", "tanh-reads-it"])
def test_a_residual_blocks_output_takes_its_inputs_bordered_buffer(nxt: str) -> None:
    text = BLOCK.replace("NEXT", nxt)
    src = parse(text)
    inputs = random_inputs(src["main"], 2, src)
    want = run(src, inputs)[0]
    model = compiler.compile(text, "llvm")
    bufs = model.plan.buffers
    dest = {c.kernel: bufs[c.buffers[-1]] for c in model.plan.steps if c.kernel}
    writer_of_a = next(k for k in dest if k.startswith("exp"))
    writer_of_o = next(k for k in dest if k.startswith("fused_conv2d_add_relu"))
    assert dest[writer_of_o].kind == dest[writer_of_a].kind == "bordered"
    assert (dest[writer_of_a].offset, dest[writer_of_a].pads) == (dest[writer_of_o].offset,
                                                                        dest[writer_of_o].pads)
    calls_on_nan_arena(model, inputs, want)  # %o's kernel writes the border too (zeros over zeros)
