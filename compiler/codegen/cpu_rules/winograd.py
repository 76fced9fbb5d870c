"""winograd rules: the two transforms of a Winograd convolution (dialects/graph/winograd.py); the batched
matmul between them is the matmul rule's.

Both work a tile at a time with a vector of channels in the lanes, so a channel-blocked tensor
(codegen/layout.py) is read or written a whole vector a pixel: the input transform loads the tile's
(m + 2)^2 pixels, runs its rows pass into a small buffer and its columns pass into the T rows of V; the
output transform runs its columns pass per tile and channel vector, then writes the tile's m x m pixels
with the conv's epilogue (bias, residual, activation). Tiles are parallel by rows of tiles.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from compiler.codegen.cpu_rules.common import (
    Context,
    blocks,
    extent,
    pack_loops,
    param_name,
    read_index,
    try_vectorize,
    vector_dividing,
)


def _named(sch: s_tir.Schedule) -> dict[str, object]:
    return {sch.get(b).name_hint: b for b in blocks(sch)}


def _grid(sch: s_tir.Schedule, block) -> list[int]:
    """The block's extents (a batch known only at run time as its expression)."""
    return [int(e) if isinstance(e, tirx.IntImm) else e for e in (iv.dom.extent for iv in sch.get(block).iter_vars)]


def _native(sch: s_tir.Schedule, block, ctx: Context, vl: int) -> None:
    """The block's blocked parameters whose channels it walks a vector of vl at a time."""
    blk = sch.get(block)
    for r in (*blk.reads, *blk.writes):
        if ctx.block_of(sch, r.source) == vl:
            ctx.native.add(param_name(sch, r.source))


def _local(sch: s_tir.Schedule, block, at, lanes_loop: int) -> None:
    """A per-tile stage computed under loop `at`: its loops unrolled but the channels' (vectorized). Its
    unit loops are kept, so that its last three loops are its own (without, a channel loop of one lane
    vanished and the whole channel loop above it was unrolled: 18 channels compiled in 11 s)."""
    sch.compute_at(block, at, preserve_unit_loops=True)
    sch.set_scope(block, 0, "local")
    loops = sch.get_loops(block)[-3:]
    for loop in loops[:-1]:
        sch.unroll(loop)
    if lanes_loop > 1:
        sch.vectorize(loops[-1])


def apply_input(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    ctx = ctx or Context()
    named = _named(sch)
    v, s = named.get("winograd_input"), named.get("winograd_rows")
    if v is None or s is None or set(named) - {"winograd_input", "winograd_rows", "pad"}:
        return False
    n, th, tw, _, _, c = _grid(sch, s)
    vl = vector_dividing(c, str(sch.get(v).writes[0].source.dtype)) or 1
    pad = named.get("pad")
    x = sch.get(pad).reads[0].source if pad is not None else sch.get(s).reads[0].source
    if vl > 1 and not ctx.block_of(sch, x):
        # An NCHW input is copied into channel blocks first (padded, if it pads): the tiles' channel
        # vectors would otherwise be gathers, a plane apart (64 -> 64 channels at 56x56: 1.3 ms -> 0.1 ms).
        if pad is None:
            pad = sch.cache_read(s, read_index(sch, s, x), "global")
        sch.transform_layout(pad, ("write", 0), lambda a, b, h, w: (a, b // vl, h, w, b % vl))
        pack_loops(sch, pad, vl, vl)
    elif pad is not None:  # (a bordered input, the usual case between convs, has no pad stage)
        sch.compute_inline(pad)
    t, p, ch = sch.get_loops(v)
    pn, py, px = sch.split(p, [n if isinstance(n, int) else None, th, tw])
    co, cl = sch.split(ch, [None, vl])
    sch.reorder(pn, py, px, co, t, cl)
    _local(sch, s, co, vl)
    sch.unroll(t)
    if vl > 1:
        sch.vectorize(cl)
    sch.parallel(sch.fuse(pn, py))
    _native(sch, s, ctx, vl)
    return True


def apply_output(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    ctx = ctx or Context()
    named = _named(sch)
    y, r = named.get("winograd_output"), named.get("winograd_cols")
    if y is None or r is None:
        return False
    order = blocks(sch)
    after = order[[sch.get(b).name_hint for b in order].index("winograd_output") + 1 :]
    for b in after[:-1]:
        sch.compute_inline(b)
    out = y
    if after:
        sch.compute_inline(y)
        out = after[-1]
    loops = sch.get_loops(out)
    if len(loops) != 4:
        return False
    _, th, tw, _, m, o = _grid(sch, r)
    i_n, i_o, i_h, i_w = loops
    # Fewer channels than the transform's where a slice follows (pad-channels widened the conv: 58 of 64).
    o = extent(sch, i_o) or 0
    if not 0 < o <= _grid(sch, r)[-1]:
        return False
    vl = vector_dividing(o, str(sch.get(out).writes[0].source.dtype)) or 1
    copy = None
    if vl > 1 and not ctx.block_of(sch, sch.get(out).writes[0].source):
        # An NCHW output is written in channel blocks, then copied out a row at a time: scattered a
        # plane apart, each vector of channels was 16 stores.
        copy = sch.cache_write(out, 0, "global")
        sch.transform_layout(out, ("write", 0), lambda a, b, h, w: (a, b // vl, h, w, b % vl))
    ho, hi = sch.split(i_h, [th, m])
    wo, wi = sch.split(i_w, [tw, m])
    oo, ol = sch.split(i_o, [None, vl])
    sch.reorder(i_n, ho, wo, oo, hi, wi, ol)
    _local(sch, r, oo, vl)
    sch.unroll(hi)
    sch.unroll(wi)
    if vl > 1:
        sch.vectorize(ol)
    sch.parallel(sch.fuse(i_n, ho))
    _native(sch, out, ctx, vl)
    if copy is not None:
        c_n, c_o, c_h, c_w = sch.get_loops(copy)
        sch.parallel(sch.fuse(c_n, c_o))
        try_vectorize(sch, c_w, vl)
    return True
