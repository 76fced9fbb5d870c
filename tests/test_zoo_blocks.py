"""Each zoo architecture's characteristic block, at reduced size, compiled for the CPU against the interpreter:
so CI covers every schedule rule the big models take (tools/zoo.py times the models themselves).

Channel counts are multiples of 16 (a vector of f32 on AVX-512, two on AVX2) where the real nets have
them, and odd where those do (ShuffleNet's 58), so both the channel-blocked layout between kernels
(codegen/layout.py) and NCHW neighbours are exercised on any host. What is asserted holds on every host:
the values, the rule each conv takes, and that tensors between convs are stored blocked where every
kernel touching them reads blocks natively.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_outputs

import compiler
from compiler.inputs import random_inputs
from compiler.parser import parse
from dialects.mem import padded_shape

INVERTED_RESIDUAL = """
// MobileNetV2: 1x1 expand + relu6, 3x3 depthwise + relu6, 1x1 project, residual add.
func @main(%x: tensor<1x16x14x14xf32>, %w1: tensor<64x16x1x1xf32>, %b1: tensor<64xf32>,
           %w2: tensor<64x1x3x3xf32>, %b2: tensor<64xf32>, %w3: tensor<16x64x1x1xf32>, %b3: tensor<16xf32>)
    -> tensor<1x16x14x14xf32> {
  %e = graph.conv2d(%x, %w1, %b1)
  %er = graph.clip(%e) {min = 0.0, max = 6.0}
  %d = graph.conv2d(%er, %w2, %b2) {padding = [1, 1, 1, 1], groups = 64}
  %dr = graph.clip(%d) {min = 0.0, max = 6.0}
  %p = graph.conv2d(%dr, %w3, %b3)
  %y = graph.add(%p, %x)
  return %y
}
"""

SQUEEZE_EXCITATION = """
// EfficientNet-B0: 1x1 expand + SiLU, 5x5 stride-2 depthwise + SiLU, squeeze-and-excitation
// (global mean, 1x1 reduce + SiLU, 1x1 expand, sigmoid, channel scale), 1x1 project.
func @main(%x: tensor<1x32x16x16xf32>, %w1: tensor<96x32x1x1xf32>, %b1: tensor<96xf32>,
           %w2: tensor<96x1x5x5xf32>, %b2: tensor<96xf32>, %ws1: tensor<8x96x1x1xf32>, %bs1: tensor<8xf32>,
           %ws2: tensor<96x8x1x1xf32>, %bs2: tensor<96xf32>, %w3: tensor<32x96x1x1xf32>, %b3: tensor<32xf32>)
    -> tensor<1x32x8x8xf32> {
  %e = graph.conv2d(%x, %w1, %b1)
  %es = graph.sigmoid(%e)
  %ea = graph.mul(%e, %es)
  %d = graph.conv2d(%ea, %w2, %b2) {strides = [2, 2], padding = [2, 2, 2, 2], groups = 96}
  %ds = graph.sigmoid(%d)
  %da = graph.mul(%d, %ds)
  %m = graph.reduce_mean(%da) {axes = [-1, -2], keepdims = true}
  %s1 = graph.conv2d(%m, %ws1, %bs1)
  %s1s = graph.sigmoid(%s1)
  %s1a = graph.mul(%s1, %s1s)
  %s2 = graph.conv2d(%s1a, %ws2, %bs2)
  %g = graph.sigmoid(%s2)
  %sc = graph.mul(%g, %da)
  %y = graph.conv2d(%sc, %w3, %b3)
  return %y
}
"""

SHUFFLE = """
// ShuffleNetV2: two branches (depthwise stride 2 + 1x1; 1x1, depthwise stride 2, 1x1) of 58 channels,
// concatenated and shuffled, then split.
func @main(%x: tensor<1x24x16x16xf32>, %wa: tensor<24x1x3x3xf32>, %ba: tensor<24xf32>,
           %wb: tensor<58x24x1x1xf32>, %bb: tensor<58xf32>, %wc: tensor<58x24x1x1xf32>, %bc: tensor<58xf32>,
           %wd: tensor<58x1x3x3xf32>, %bd: tensor<58xf32>, %we: tensor<58x58x1x1xf32>, %be: tensor<58xf32>)
    -> (tensor<1x58x8x8xf32>, tensor<1x58x8x8xf32>) {
  %a = graph.conv2d(%x, %wa, %ba) {strides = [2, 2], padding = [1, 1, 1, 1], groups = 24}
  %b = graph.conv2d(%a, %wb, %bb)
  %br = graph.relu(%b)
  %c = graph.conv2d(%x, %wc, %bc)
  %cr = graph.relu(%c)
  %d = graph.conv2d(%cr, %wd, %bd) {strides = [2, 2], padding = [1, 1, 1, 1], groups = 58}
  %e = graph.conv2d(%d, %we, %be)
  %er = graph.relu(%e)
  %cat = graph.concat(%br, %er) {axis = 1}
  %v = graph.reshape(%cat) {shape = [1, 2, 58, 8, 8]}
  %t = graph.transpose(%v) {perm = [0, 2, 1, 3, 4]}
  %u = graph.reshape(%t) {shape = [1, 116, 8, 8]}
  %s0, %s1 = graph.split(%u) {axis = 1, sections = [58, 58]}
  return %s0, %s1
}
"""

DENSE = """
// DenseNet-121: a 1x1 conv standing for what comes before, then two dense layers (batch_norm + relu, 1x1 to
// 4 x growth, batch_norm + relu, 3x3 to the growth of 16), each concatenated to what came before, then a
// transition (batch_norm + relu, 1x1, 2x2 average).
func @main(%x: tensor<1x32x8x8xf32>, %w0: tensor<32x32x1x1xf32>,
           %g1: tensor<32xf32>, %h1: tensor<32xf32>, %m1: tensor<32xf32>, %v1: tensor<32xf32>, %w1: tensor<64x32x1x1xf32>,
           %g2: tensor<64xf32>, %h2: tensor<64xf32>, %m2: tensor<64xf32>, %v2: tensor<64xf32>, %w2: tensor<16x64x3x3xf32>,
           %g3: tensor<48xf32>, %h3: tensor<48xf32>, %m3: tensor<48xf32>, %v3: tensor<48xf32>, %w3: tensor<64x48x1x1xf32>,
           %g4: tensor<64xf32>, %h4: tensor<64xf32>, %m4: tensor<64xf32>, %v4: tensor<64xf32>, %w4: tensor<16x64x3x3xf32>,
           %g5: tensor<64xf32>, %h5: tensor<64xf32>, %m5: tensor<64xf32>, %v5: tensor<64xf32>, %w5: tensor<32x64x1x1xf32>)
    -> tensor<1x32x4x4xf32> {
  %x0 = graph.conv2d(%x, %w0)
  %n1 = graph.batch_norm(%x0, %g1, %h1, %m1, %v1)
  %r1 = graph.relu(%n1)
  %c1 = graph.conv2d(%r1, %w1)
  %n2 = graph.batch_norm(%c1, %g2, %h2, %m2, %v2)
  %r2 = graph.relu(%n2)
  %c2 = graph.conv2d(%r2, %w2) {padding = [1, 1, 1, 1]}
  %k1 = graph.concat(%x0, %c2) {axis = 1}
  %n3 = graph.batch_norm(%k1, %g3, %h3, %m3, %v3)
  %r3 = graph.relu(%n3)
  %c3 = graph.conv2d(%r3, %w3)
  %n4 = graph.batch_norm(%c3, %g4, %h4, %m4, %v4)
  %r4 = graph.relu(%n4)
  %c4 = graph.conv2d(%r4, %w4) {padding = [1, 1, 1, 1]}
  %k2 = graph.concat(%x0, %c2, %c4) {axis = 1}
  %n5 = graph.batch_norm(%k2, %g5, %h5, %m5, %v5)
  %r5 = graph.relu(%n5)
  %c5 = graph.conv2d(%r5, %w5)
  %y = graph.avg_pool2d(%c5) {kernel = [2, 2], strides = [2, 2]}
  return %y
}
"""

FIRE = """
// SqueezeNet's fire module twice: a 1x1 squeeze, then 1x1 and 3x3 expands whose results the concat joins
// (each expand writes into the concat's bytes: the concat runs no kernel), then a max pool and a 1x1 conv.
func @main(%x: tensor<1x64x14x14xf32>, %s1: tensor<16x64x1x1xf32>, %e1: tensor<32x16x1x1xf32>,
           %f1: tensor<32x16x3x3xf32>, %s2: tensor<16x64x1x1xf32>, %e2: tensor<32x16x1x1xf32>,
           %f2: tensor<32x16x3x3xf32>, %w: tensor<16x64x1x1xf32>) -> tensor<1x16x6x6xf32> {
  %q1 = graph.conv2d(%x, %s1)
  %r1 = graph.relu(%q1)
  %a1 = graph.conv2d(%r1, %e1)
  %b1 = graph.relu(%a1)
  %c1 = graph.conv2d(%r1, %f1) {padding = [1, 1, 1, 1]}
  %d1 = graph.relu(%c1)
  %k1 = graph.concat(%b1, %d1) {axis = 1}
  %q2 = graph.conv2d(%k1, %s2)
  %r2 = graph.relu(%q2)
  %a2 = graph.conv2d(%r2, %e2)
  %b2 = graph.relu(%a2)
  %c2 = graph.conv2d(%r2, %f2) {padding = [1, 1, 1, 1]}
  %d2 = graph.relu(%c2)
  %k2 = graph.concat(%b2, %d2) {axis = 1}
  %p = graph.max_pool2d(%k2) {kernel = [3, 3], strides = [2, 2]}
  %y = graph.conv2d(%p, %w)
  return %y
}
"""

RESIDUAL = """
// ResNet-50: a bottleneck (1x1 reduce, 3x3, 1x1 expand, each batch_norm-free with bias and relu) with its
// identity shortcut, after a stride-2 3x3 stem conv and a max pool.
func @main(%x: tensor<1x3x32x32xf32>, %ws: tensor<64x3x3x3xf32>, %bs: tensor<64xf32>,
           %w1: tensor<16x64x1x1xf32>, %b1: tensor<16xf32>, %w2: tensor<16x16x3x3xf32>, %b2: tensor<16xf32>,
           %w3: tensor<64x16x1x1xf32>, %b3: tensor<64xf32>) -> tensor<1x64x8x8xf32> {
  %s = graph.conv2d(%x, %ws, %bs) {strides = [2, 2], padding = [1, 1, 1, 1]}
  %sr = graph.relu(%s)
  %p = graph.max_pool2d(%sr) {kernel = [3, 3], strides = [2, 2], padding = [1, 1, 1, 1]}
  %a = graph.conv2d(%p, %w1, %b1)
  %ar = graph.relu(%a)
  %b = graph.conv2d(%ar, %w2, %b2) {padding = [1, 1, 1, 1]}
  %br = graph.relu(%b)
  %c = graph.conv2d(%br, %w3, %b3)
  %y0 = graph.add(%c, %p)
  %y = graph.relu(%y0)
  return %y
}
"""

ATTENTION = """
// ViT-B/16: a 4x4 patch embedding conv, flattened to tokens, then a pre-norm attention block (one head of
// 32) and a GELU feed-forward, each with its residual.
func @main(%x: tensor<1x3x16x16xf32>, %wp: tensor<32x3x4x4xf32>, %bp: tensor<32xf32>,
           %lg: tensor<32xf32>, %lb: tensor<32xf32>, %wq: tensor<32x32xf32>, %wk: tensor<32x32xf32>,
           %wv: tensor<32x32xf32>, %wo: tensor<32x32xf32>, %w1: tensor<32x64xf32>, %b1: tensor<64xf32>,
           %w2: tensor<64x32xf32>, %b2: tensor<32xf32>) -> tensor<1x16x32xf32> {
  %p = graph.conv2d(%x, %wp, %bp) {strides = [4, 4]}
  %f = graph.reshape(%p) {shape = [1, 32, 16]}
  %t = graph.transpose(%f) {perm = [0, 2, 1]}
  %n = graph.layer_norm(%t, %lg, %lb) {axis = 2}
  %q = graph.matmul(%n, %wq)
  %k = graph.matmul(%n, %wk)
  %v = graph.matmul(%n, %wv)
  %kt = graph.transpose(%k) {perm = [0, 2, 1]}
  %s = graph.matmul(%q, %kt)
  %scale = graph.constant() {value = dense<0.17677669> : tensor<f32>}
  %ss = graph.mul(%s, %scale)
  %a = graph.softmax(%ss)
  %o = graph.matmul(%a, %v)
  %oo = graph.matmul(%o, %wo)
  %h = graph.add(%t, %oo)
  %n2 = graph.layer_norm(%h, %lg, %lb) {axis = 2}
  %u = graph.matmul(%n2, %w1)
  %ub = graph.add(%u, %b1)
  %g = graph.gelu(%ub)
  %d = graph.matmul(%g, %w2)
  %db = graph.add(%d, %b2)
  %y = graph.add(%h, %db)
  return %y
}
"""

# Swin-T's window attention at reduced size: 8 windows of 49 tokens, 3 heads of 32, a relative position
# bias per head; its Q K^T is a matmul with two batch dims and B transposed.
WINDOW_ATTENTION = """
func @main(%x: tensor<8x3x49x32xf32>, %wq: tensor<32x32xf32>, %wk: tensor<32x32xf32>, %bias: tensor<3x49x49xf32>,
           %wo: tensor<32x32xf32>) -> tensor<8x3x49x32xf32> {
  %q = graph.matmul(%x, %wq)
  %k = graph.matmul(%x, %wk)
  %kt = graph.transpose(%k) {perm = [0, 1, 3, 2]}
  %s = graph.matmul(%q, %kt)
  %sb = graph.add(%s, %bias)
  %a = graph.softmax(%sb)
  %o = graph.matmul(%a, %x)
  %y = graph.matmul(%o, %wo)
  return %y
}
"""

# block -> (its text, rules its conv and matmul kernels take, whether some tensor between kernels is stored blocked)
BLOCKS = {
    "inverted_residual": (INVERTED_RESIDUAL, {"conv2d", "depthwise"}, True),
    "squeeze_excitation": (SQUEEZE_EXCITATION, {"conv2d", "depthwise"}, True),
    "shuffle": (SHUFFLE, {"conv2d", "depthwise"}, False),
    "dense": (DENSE, {"conv2d"}, True),
    "fire": (FIRE, {"conv2d"}, True),
    "residual": (RESIDUAL, {"conv2d"}, True),
    "attention": (ATTENTION, {"conv2d", "matmul"}, False),
    "window_attention": (WINDOW_ATTENTION, {"matmul"}, False),
}


def _compile(text: str, bound: bool):
    module = parse(text, "block.gir")
    f = module["main"]
    values = random_inputs(f, 0, module)
    params = {a.name: values[a.name] for a in f.args[1:]} if bound else None
    model = compiler.compile(text, "llvm", params=params, cache=False)
    want = compiler.run(parse(text, "block.gir"), values)
    got = model(values[f.args[0].name]) if bound else model(**values)
    return model, got, want


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("bound", [True, False], ids=["weights-bound", "weights-passed"])
def test_block_matches_the_interpreter(name: str, bound: bool) -> None:
    text, rules, blocked = BLOCKS[name]
    model, got, want = _compile(text, bound)
    assert_outputs(got, want, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in want))
    if not bound:
        return  # (weights passed per call: 58 output channels are not padded to a multiple of 4, see pad-channels)
    calls = [c for c in model.plan.steps if c.kernel]
    conv_rules = {c.schedule for c in calls if "conv2d" in c.ops or "matmul" in c.ops}
    # Every rule the block's kind needs is taken, and no conv or matmul falls back to the generic schedule
    # (the SE block's convs of one pixel are rows: dot products).
    assert rules <= conv_rules and not conv_rules & {"generic", "none"}, conv_rules
    if "conv2d" not in rules:  # matmuls only: every one on the matmul rule (Swin's Q K^T fell to rows: 3.2x)
        assert conv_rules == {"matmul"}, conv_rules
    layouts = [b for b in model.plan.buffers if b.layout]
    assert bool(layouts) == blocked, [b.shape for b in layouts]


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_blocked_layout_changes_no_value(monkeypatch, name: str) -> None:
    """The same block with every tensor NCHW (GC_LAYOUT=nchw) computes the same values, bit for bit where
    the kernels sum in the same order (they may not: a blocked conv's reduction is the same, its tiles not)."""
    from compiler.codegen import layout

    text = BLOCKS[name][0]
    _, blocked, want = _compile(text, True)
    monkeypatch.setattr(layout, "ENABLED", False)
    model, nchw, _ = _compile(text, True)
    assert not any(b.layout for b in model.plan.buffers)
    assert_outputs(blocked, nchw, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in want))


IN_PLACE = """
// A residual block between convs (ResNet's bottleneck): the add, in the last conv's epilogue, is written
// over the block's input, which dies there.
func @main(%x: tensor<1x32x12x12xf32>, %w0: tensor<32x32x1x1xf32>, %w1: tensor<32x32x3x3xf32>,
           %w2: tensor<32x32x1x1xf32>, %w3: tensor<32x32x1x1xf32>) -> tensor<1x32x12x12xf32> {
  %a = graph.conv2d(%x, %w0)
  %ar = graph.relu(%a)
  %b = graph.conv2d(%ar, %w1) {padding = [1, 1, 1, 1]}
  %br = graph.relu(%b)
  %c = graph.conv2d(%br, %w2)
  %s = graph.add(%c, %ar)
  %sr = graph.relu(%s)
  %y = graph.conv2d(%sr, %w3)
  return %y
}
"""


@pytest.mark.parametrize("name", ["in_place", "inverted_residual", "residual", "dense"])
def test_tensors_sharing_bytes_share_a_layout(name: str) -> None:
    """An output written in place over an input (a residual add in a conv's epilogue), and the tensors of
    one bordered buffer, are stored alike: blocked bytes read as NCHW (or the other way) would be wrong."""
    text = IN_PLACE if name == "in_place" else BLOCKS[name][0]
    model, got, want = _compile(text, True)
    assert_outputs(got, want, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in want))
    bufs = model.plan.buffers

    def span(i: int):
        b = bufs[i]
        size = int(np.prod(padded_shape(b.shape, b.pads))) * 4  # a bordered view: its border too
        return (b.arena, b.offset, b.offset + size) if b.in_arena else None

    shared = 0
    for call in (c for c in model.plan.steps if c.kernel):
        ids = call.buffers
        for i in ids[:-1]:
            a, b = span(ids[-1]), span(i)
            # The same buffer, or overlapping views of the arena (an output over its input, bordered or not).
            if i == ids[-1] or (a and b and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]):
                shared += 1
                assert bufs[ids[-1]].layout == bufs[i].layout, (call.kernel, bufs[ids[-1]], bufs[i])
    if name == "in_place":
        # the adds are written in place, and blocked: the check checked something
        assert shared > 0 and any(b.layout for b in bufs)


def test_dense_block_concats_are_prefixes_of_one_buffer() -> None:
    """DenseNet's concats form a chain, [x0, c2] then [x0, c2, c4]: fuse leaves them ops of their own
    (`concat-chains`) and plan-memory lays both in one buffer, each conv writing its channels at their
    offset there, the first concat a prefix of the second. No concat runs a kernel (each was a kernel
    choosing among its operands per channel: most of DenseNet-121's LLVM time); the batch_norm + relu
    after each reads its prefix in place, in channel blocks like the convs'; values are the interpreter's."""
    model, got, want = _compile(DENSE, True)
    assert_outputs(got, want, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in want))
    bufs = model.plan.buffers
    steps = [c for c in model.plan.steps if c.kernel]
    assert not any("concat" in c.ops for c in steps)
    # The batch norms of the concats: a 48- and a 64-channel prefix of one 64-channel buffer at 8x8.
    norms = [c for c in steps if c.ops[0] == "mul" and bufs[c.buffers[0]].kind == "view"
             and bufs[c.buffers[0]].nbytes in (48 * 64 * 4, 64 * 64 * 4)]
    assert len(norms) == 2, [(c.ops, bufs[c.buffers[0]]) for c in steps]
    first, second = (bufs[c.buffers[0]] for c in norms)
    assert (first.arena, first.offset) == (second.arena, second.offset) and first.nbytes < second.nbytes
    assert first.layout and second.layout  # stored blocked, as the convs writing into them write
    writers = [c for c in steps if c.ops[0] == "conv2d" and bufs[c.buffers[-1]].arena == first.arena
               and first.offset < bufs[c.buffers[-1]].offset < first.offset + second.nbytes]
    assert len(writers) == 2  # c2 and c4 write into the shared buffer, past x0
    memory = model.plan.memory
    assert memory["arena_bytes"] <= 1.05 * memory["lower_bound_bytes"]


def test_concats_that_run_no_kernel_are_stored_blocked_with_their_operands() -> None:
    """A fire module's concat runs no kernel (its expands write into its bytes), yet its tensor is stored
    blocked like theirs, so the next squeeze conv and the pool read blocks: left NCHW, SqueezeNet 1.1 ran
    1.08x slower (its squeeze convs 29 -> 47 us, its pools 28 -> 45 us)."""
    model, got, want = _compile(FIRE, True)
    assert_outputs(got, want, rtol=2e-5, atol=2e-5 * max(float(np.abs(w).max()) for w in want))
    bufs = model.plan.buffers
    steps = [c for c in model.plan.steps if c.kernel]
    assert not any("concat" in c.ops for c in steps)  # the concats copy nothing, so they run nothing

    def concat_whole(i: int) -> bool:  # a concat's tensor: 64 channels at 14 x 14, NCHW or blocked
        shape = bufs[i].shape
        return bufs[i].kind == "view" and shape[1] * (shape[4] if len(shape) == 5 else 1) == 64 and shape[2] == 14

    readers = [c for c in steps if concat_whole(c.buffers[0])]
    assert [c.ops[0] for c in readers] == ["conv2d", "max_pool2d"], [(c.kernel, c.ops) for c in steps]
    for c in readers:
        assert bufs[c.buffers[0]].layout, (c.kernel, bufs[c.buffers[0]])


def test_the_planned_function_is_read_once_into_kernels_places_and_groups() -> None:
    """`lower.read` of a planned fire module: the concats run no kernel; each shares a storage group with
    the operands written into its bytes; each result lies where its destination does; the squeeze convs'
    outputs are bordered views of the arena whose writers write the border."""
    from compiler.codegen.lower import read
    from dialects.exec import Launch

    model, _, _ = _compile(FIRE, True)
    planned = read(model.planned, "main")
    launches = [op for op in model.planned["main"].ops if isinstance(op, Launch)]
    assert planned.launches == launches
    concats = [op for op in launches if "concat" in op.kernel.name]
    assert len(concats) == 2 and not any(op in planned.kernel_of for op in concats)
    assert len(planned.kernels) == len(launches) - 2 == len(model.plan.steps)
    for op in concats:
        group = planned.groups[op.results[0]]
        assert set(op.inputs) <= set(group)
        arena, lo, hi = planned.place[op.results[0]]
        for v in op.inputs:
            assert planned.place[v][0] is arena and lo <= planned.place[v][1] < planned.place[v][2] <= hi
    for op in launches:
        for d, r in zip(op.destinations, op.results):
            assert planned.place.get(r) == planned.place.get(d)
    bordered = [k for k in planned.kernels if any(k.out_borders)]
    assert len(bordered) == 2 and all(planned.pads[k.outputs[0]] for k in bordered)  # the squeeze convs
