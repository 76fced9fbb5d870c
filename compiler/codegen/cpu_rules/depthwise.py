"""depthwise rule: convolutions whose every output channel reads one input channel (groups = channels,
MobileNet's and EfficientNet's 3x3 and 5x5, stride 1 or 2), NCHW in and out.

A depthwise conv does 9 or 25 multiply-adds per output: too few to pay for a blocked layout, so it stays
NCHW and vectorizes along a row. The register tile is one output row segment of `vw` pixels (the widest
piece of the row that fits two vector registers); the taps are unrolled around it, each a vector load of
the input row (contiguous at stride 1; at stride 2 two loads and a shuffle) times a broadcast weight.
Planes (image, channel) run in parallel.
A padding stage is computed per plane, just before the plane's rows, so the padded copy stays in cache;
the epilogue (bias, clip, ReLU) runs on each segment as it is finished. The generic schedule reduced
the taps one output at a time (144 channels of 56x56: 1130 us, 8 GFLOP/s on Zen 4). Rows that fill no
whole vectors (7, 14, 28 pixels) take the channels in the lanes instead (`_blocked`).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from compiler.codegen.cpu_rules.common import (
    Context,
    blocked_write_back,
    blocks,
    coefficient,
    epilogue_on_vectors,
    heavy_epilogue,
    lanes,
    pack_loops,
    param_name,
    read_index,
    single_reduction,
    try_vectorize,
)
from compiler.codegen.sblocks import is_sum, sub_expressions, uses


def match(sch: s_tir.Schedule):
    """(conv block name, extents, column stride, input buffer) if the single reduction is a depthwise
    convolution: n, o, oh, ow spatial, then rc (of extent 1), ry, rx; the weight read w[o, rc, ry, rx];
    the input's channel an expression of o alone (o + rc, o // m), its column ow * stride + rx * dilation."""
    found = single_reduction(sch, 4, 3)
    if found is None or found[2][4] != 1:
        return None
    blk, ivs, ext = found
    if not isinstance(blk.body, tirx.BufferStore) or len(blk.body.indices) != 4:
        return None
    v = [iv.var for iv in ivs]
    loads = [x for x in sub_expressions(blk.body.value) if isinstance(x, TensorLoad)]
    loads = [x for x in loads if not x.source.same_as(blk.body.buffer)]
    if len(loads) != 2:
        return None
    is_w = lambda ld: len(ld.indices) == 4 and all(i.same_as(y) for i, y in zip(ld.indices, (v[1], v[4], v[5], v[6])))  # noqa: E731
    w = next((ld for ld in loads if is_w(ld)), None)
    x = next((ld for ld in loads if ld is not w), None)
    if w is None or x is None or len(x.indices) != 4 or not x.indices[0].same_as(v[0]):
        return None

    if not uses(x.indices[1], v[1]) or any(uses(x.indices[1], var) for var in (v[2], v[3], v[5], v[6])):
        return None
    stride = coefficient(x.indices[3], v[3])
    if stride is None or stride < 1:
        return None
    return blk.name_hint, ext, stride, x.source


def apply(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    found = match(sch)
    if found is None:
        return False
    name, (_, o, _, ow, _, _, _), stride, x_buf = found
    conv = sch.get_sblock(name)
    order = blocks(sch)
    at = [sch.get(b).name_hint for b in order].index(name)
    before, after = order[:at], order[at + 1 :]
    for b in after[:-1]:
        sch.compute_inline(b)
    dtype = str(sch.get(conv).writes[0].source.dtype)
    vl = lanes(dtype)
    vw = segment(ow, vl)
    pad = next((b for b in before if sch.get(b).writes[0].source.same_as(x_buf)), None)
    ctx = ctx or Context()
    # Channel-blocked neighbours (codegen/layout.py): an input stored in blocks of vl channels needs no
    # blocked copy (a padding copy at most), an output stored so is written as the accumulators lie.
    x_param = sch.get(pad).reads[0].source if pad is not None else x_buf
    xc = ctx.block_of(sch, x_param) == vl
    yc = ctx.block_of(sch, sch.get(after[-1] if after else conv).writes[0].source) == vl
    # Channels in the lanes where a row fills no whole vectors; at stride 2 only on small maps, where
    # copying the input (4x the output) costs little (144 channels 56 -> 28: 88 -> 181 us blocked).
    blocked = (ow % vl != 0 and (stride == 1 or ow < vl)) or xc or yc
    if blocked and o % vl == 0 and len(before) == (pad is not None) and _one_to_one(sch, conv, x_buf):
        if pad is None and not xc:  # a zero-bordered input (plan-memory's conv-borders): copied blocked as it is
            pad = sch.cache_read(conv, read_index(sch, conv, x_buf), "global")
        _blocked(sch, conv, pad, x_buf, after[-1] if after else None, ow, vl, ctx, yc)
        if xc:
            ctx.native.add(param_name(sch, x_param))
        return True
    # At stride 2 a tap reads every other column: contiguous loads and a shuffle (codegen/llvm_pipeline.py).
    # The input copied with even and odd columns apart, so that each tap read one contiguous vector, was
    # slower: a scalar gather of the whole input (96 channels 112 -> 56: 334 -> 208 us without it).
    # The segment's accumulators live in a local buffer (registers), copied out once; an epilogue reads
    # them straight from there.
    acc = sch.cache_write(conv, 0, "local")
    out = acc
    if after:
        sch.compute_inline(acc)
        out = after[-1]
    i_n, i_o, i_h, i_w, r_c, r_h, r_w = sch.get_loops(conv)
    plane = sch.fuse(i_n, i_o)
    wo, wi = sch.split(i_w, [None, vw])
    sch.reorder(plane, i_h, wo, r_c, r_h, r_w, wi)
    sch.parallel(plane)
    sch.unroll(r_h)
    sch.unroll(r_w)
    sch.vectorize(wi)
    init = sch.decompose_reduction(conv, r_c)
    try_vectorize(sch, sch.get_loops(init)[-1], vw)
    sch.reverse_compute_at(out, wo)
    try_vectorize(sch, sch.get_loops(out)[-1], vw)
    for b in ([pad] if pad is not None else []) + [b for b in before if b is not pad]:
        # the zero-padded input, a plane at a time, right before the plane's rows read it (in cache)
        sch.compute_at(b, plane)
        try_vectorize(sch, sch.get_loops(b)[-1], vl)
    return True


def _one_to_one(sch: s_tir.Schedule, conv, x_buf) -> bool:
    """Whether output channel o reads input channel o (a channel multiplier of 1)."""
    blk = sch.get(conv)
    o, rc = blk.iter_vars[1].var, blk.iter_vars[4].var
    x = next(x for x in sub_expressions(blk.body.value) if isinstance(x, TensorLoad) and x.source.same_as(x_buf))
    return x.indices[1].same_as(o) or is_sum(x.indices[1], o, rc)


def _blocked(sch: s_tir.Schedule, conv, pad, x_buf, out, ow: int, vl: int, ctx: Context,
             blocked_out: bool = False) -> None:
    """Rows narrower than a vector, or no multiple of one (7x7, 14x14, 28x28: LLVM splits a 7-lane vector
    into 4 + 2 + 1), take channels in the vector lanes instead: the padded input copied to
    [N, C/vl, H, W, vl] (one parallel pass), weights [C/vl, KH, KW, vl], accumulators of a tile of
    `px` pixels of a row x vl channels, every tap one vector load at any stride; the epilogue then
    runs on whole vectors of channels (a heavy one, SiLU, into a tile buffer before the NCHW
    write-back; a light one in the write-back). EfficientNet's 5x5 with SiLU, Zen 4 AVX-512, best of
    three: 1152 channels of 7x7 143 -> 62 us, 240 of 28x28 209 -> 122, 480 of 14x14 72 -> 51, 672 of
    14x14 to 7x7 (stride 2) 103 -> 76."""
    c_buf = sch.get(conv).writes[0].source
    x_read = sch.get(pad).writes[0].source if pad is not None else x_buf
    w_buf = next(r.source for r in sch.get(conv).reads if not r.source.same_as(c_buf) and not r.source.same_as(x_read))
    if pad is not None:
        sch.transform_layout(pad, ("write", 0), lambda a, b, h, w: (a, b // vl, h, w, b % vl))
    w_name = param_name(sch, w_buf)
    blocked_w = lambda a, b, h, w: (a // vl, b, h, w, b, a % vl)  # noqa: E731  (the conv tag's layout: b is 0)
    if w_name in ctx.constants:
        sch.transform_layout(conv, ("read", read_index(sch, conv, w_buf)), blocked_w)
        ctx.prepack[w_name] = f"conv:{vl}:1"
        wp = None
    else:
        wp = sch.cache_read(conv, read_index(sch, conv, w_buf), "global")
        sch.transform_layout(wp, ("write", 0), blocked_w)
    if out is None:
        out = sch.cache_write(conv, 0, "global")
    sch.transform_layout(conv, ("write", 0), lambda a, b, h, w: (a, b // vl, h, w, b % vl))
    i_n, i_o, i_h, i_w, r_c, r_h, r_w = sch.get_loops(conv)
    px = max(d for d in range(1, 9) if ow % d == 0)
    oo, oi = sch.split(i_o, [None, vl])
    wo, wi = sch.split(i_w, [None, px])
    sch.reorder(i_n, oo, i_h, wo, r_c, r_h, r_w, wi, oi)
    par = sch.fuse(i_n, oo, i_h)
    sch.parallel(par)
    sch.unroll(wi)
    sch.vectorize(oi)
    init = sch.decompose_reduction(conv, r_c)
    try_vectorize(sch, sch.get_loops(init)[-1], vl)
    sch.reverse_compute_at(out, wo)
    if blocked_out:  # stored channel-blocked (codegen/layout.py): written as the accumulators lie
        blocked_write_back(sch, out, ctx, vl, vl, px)
    else:
        if heavy_epilogue(sch, out):
            out = epilogue_on_vectors(sch, out, wo, vl)
        try_vectorize(sch, sch.get_loops(out)[-1], px)
        sch.unroll(sch.get_loops(out)[-2])
    if pad is not None:
        pack_loops(sch, pad, vl, vl)
    if wp is not None:  # weights passed per call: packed per call, channels of a block innermost
        i_o, *rest = sch.get_loops(wp)
        w_oo, w_oi = sch.split(i_o, [None, vl])
        sch.reorder(w_oo, *rest, w_oi)
        sch.vectorize(w_oi)


def segment(ow: int, vl: int) -> int:
    """Pixels of a row a tile computes: the whole row if it fits two vectors, else the widest divisor of
    the row that does, a multiple of the vector where one divides (112 -> 16 or 32; 56 -> 28: LLVM splits
    a 28-lane vector into 16 + 8 + 4)."""
    if ow <= 2 * vl:
        return ow
    divisors = [d for d in range(1, 2 * vl + 1) if ow % d == 0]
    return max(divisors, key=lambda d: (d % vl == 0, d))
