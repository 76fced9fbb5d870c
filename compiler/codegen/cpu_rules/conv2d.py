"""conv2d rule: direct convolution in a channel-blocked layout, NCHW at the kernel's edges (TVM notes §10).

Inside the kernel the padded input is laid out [N, C/cb, H, W, cb] (inputs of at most 32 channels, and
inputs of small maps that need no padding copy, stay NCHW, read in place), the weights
[O/16, C/cb, KH, KW, cb, 16] and the accumulators [N, O/16, OH, OW, 16]; the register tile is 16 output
channels (two vectors) x 4 output pixels of a row, with the input channels, then the kernel window, then
the channels of a block as the reduction. Maps whose rows 4 does not divide (ResNet's 14x14 and 7x7) take
6-pixel tiles of the flattened map instead (`flat_tile`). The epilogue (bias, residual add, ReLU) runs on
the tile where it is written back to NCHW, four pixels a vector. A conv of at most 27 products an output
(a net's first, on RGB) takes a tile of pixel vectors instead (`_pixel_tile`).
3x3 32->32 @32x32: 121 us against ORT's 125 us in the notes.
Grouped and depthwise convolutions are not this rule's: their channel index is an expression.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from compiler.codegen.cpu_rules.common import (
    Context,
    blocked_write_back,
    blocks,
    coefficient,
    epilogue_on_vectors,
    extent,
    heavy_epilogue,
    lanes,
    large_copy,
    pack_loops,
    param_name,
    read_index,
    single_reduction,
    try_vectorize,
    vector_dividing,
)
from compiler.codegen.llvm_pipeline import MAX_STRIDE
from compiler.codegen.target import cpu

# Weights passed per call are repacked per call: in parallel only from this many elements on (waking
# the thread pool costs more than copying a small conv's weights on one core).
PARALLEL_PACK = 1 << 16
# Inputs of at most this many channels are read in place, NCHW (padded first if the conv pads), not packed
# into NCHW[cb]c: packing is a gather whose cost is not paid back by the few channels a tile reads
# (32->32 3x3 at 32x32: 123 -> 111 us; 16 channels at 64x64: 130 -> 120; 64 channels at 56x56 loses 7%).
NCHW_INPUT_CHANNELS = 32
# Any input is read in place, NCHW, when it needs no padding copy (an unpadded conv, or a zero-bordered
# input: plan-memory's conv-borders) and the output maps are this small: the pack costs more than the
# blocked reads save (3x3 64->64 at 16x16: 127 -> 116 us; 128 at 4x4: 40 -> 38); from 14x14 up it is
# even, and at 28x28 packing wins by 5%. A 1x1 conv with no padding reads its input in place at any size:
# its one tap per pixel and channel is a broadcast from wherever the pixel lies, and the pack was a
# gather of the whole input (SqueezeNet's 128 -> 16 at 55x55: 368 -> 86 us; 256 -> 32 at 27x27: 191 ->
# 86; ResNet-50's 256 -> 64 at 56x56: 627 -> 507, its stride-2 256 -> 512: 1.17 -> 1.05 ms; Zen 4).
NCHW_SMALL_MAP = 256
# Convs whose outputs sum at most this many products (input channels x window) use the pixel tile.
PIXEL_TILE_REDUCTION = 27
PIXEL_TILE_CHANNELS = 4
# Pixels of a tile of the flattened map (see `flat_tile`).
FLAT_TILE = 6
# Flat tiles with a short last tile sweep the map once per chunk of input channels whose weights for a
# tile's output channels take at most this much (half of L1): one 16-channel block of a 3x3 conv (9 KB),
# 16 of a 1x1 conv, whose short reduction would otherwise reload the accumulators too often.
CHUNK_WEIGHT_BYTES = 16 << 10
# ... as long as a map's accumulators for a tile's output channels (reloaded by every chunk) stay in L2.
CHUNK_ACC_BYTES = 128 << 10


@dataclass
class Conv:
    name: str
    x_buf: object  # the (padded) input as the conv block reads it
    w_buf: object
    ext: list[int]  # n, o, oh, ow, c, kh, kw
    dtype: str
    col_step: int | None = None  # d(input column) / d(output column): the stride along W, if linear


def match(sch: s_tir.Schedule) -> Conv | None:
    found = single_reduction(sch, 4, 3, batch=True)
    if found is None:
        return None
    blk, ivs, ext = found
    store = blk.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return None
    loads = _product(store.value.b) or _product(store.value.a)
    if loads is None:
        return None
    v = [iv.var for iv in ivs]
    x, w = loads if _is_weight(loads[1], v) else (loads[1], loads[0])
    if not _is_weight(w, v) or len(x.indices) != 4 or not x.indices[0].same_as(v[0]) or not x.indices[1].same_as(v[4]):
        return None
    col = x.indices[3]
    return Conv(blk.name_hint, x.source, w.source, ext, str(store.buffer.dtype), coefficient(col, v[3]))


def _product(e):
    while isinstance(e, tirx.Cast):
        e = e.value
    if not isinstance(e, tirx.Mul):
        return None
    a, b = e.a, e.b
    while isinstance(a, tirx.Cast):
        a = a.value
    while isinstance(b, tirx.Cast):
        b = b.value
    return (a, b) if isinstance(a, TensorLoad) and isinstance(b, TensorLoad) else None


def _is_weight(ld, v) -> bool:
    """w[o, c, kh, kw], each index the block's own iterator."""
    want = [v[1], v[4], v[5], v[6]]
    return len(ld.indices) == 4 and all(i.same_as(x) for i, x in zip(ld.indices, want))


def _divisor(n: int, choices: tuple[int, ...]) -> int:
    return next((d for d in choices if n % d == 0), 1)


def _divisor_le(n: int, most: int) -> int:
    """The largest divisor of n that is at most `most`."""
    return max(d for d in range(1, min(n, most) + 1) if n % d == 0)


def apply(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    ctx = ctx or Context()
    c = match(sch)
    if c is None:
        return False
    n, o, oh, ow, ci, kh, kw = c.ext
    pixel_vl = lanes(c.dtype)
    # The pixel tile: rows of whole vectors read at stride 1, or 2-4 (contiguous loads and a shuffle);
    # two vectors of a row where they divide it, else one for twice the channels.
    pixel_vectors = 2 if ow % (2 * pixel_vl) == 0 else 1
    # An output stored in channel blocks (codegen/layout.py) is written a vector of channels a pixel, no
    # transpose; the pixel tile, whose cost that transpose was, is not for it.
    yc = ctx.block_of(sch, sch.get(blocks(sch)[-1]).writes[0].source)
    pixels = (ci * kh * kw <= PIXEL_TILE_REDUCTION and c.col_step is not None and 1 <= c.col_step <= MAX_STRIDE
              and ow % pixel_vl == 0 and o % (PIXEL_TILE_CHANNELS * 2 // pixel_vectors) == 0 and not yc)
    # Output channels in vectors: whole registers where they divide the channels, else halves or quarters
    # (8 lanes for 24 channels on AVX-512); two vectors a tile where they fit.
    vl = vector_dividing(o, c.dtype)
    ob = 2 * vl if vl and o % (2 * vl) == 0 else vl
    if pixels:
        vl = pixel_vl
    elif ob == 0:
        return False  # output channels no multiple of 4: the generic schedule
    conv = sch.get_sblock(c.name)
    order = blocks(sch)
    names = [sch.get(b).name_hint for b in order]
    at = names.index(c.name)
    before, after = order[:at], order[at + 1 :]
    for b in after[:-1]:
        sch.compute_inline(b)
    out = after[-1] if after else sch.cache_write(conv, 0, "global")
    pad = next((b for b in before if sch.get(b).writes[0].source.same_as(c.x_buf)), None)
    if pixels:
        _pixel_tile(sch, conv, out, pad, vl, pixel_vectors)
        return True
    # An input stored in blocks of xc channels is read as it lies (those blocks are the reduction's).
    x_param = sch.get(pad).reads[0].source if pad is not None else c.x_buf
    xc = ctx.block_of(sch, x_param)
    cb = xc or _divisor(ci, (16, 32, 8, 24, 12, 4, 6, 3, 2))
    # One vector of channels (24 or 1000 channels on AVX-512: 8-lane vectors, one a block) takes twice the
    # pixels, for as many accumulators.
    # (A batch known only at run time is at least 2: codegen/symbolic.py builds sizes 0 and 1 apart.)
    images = n if isinstance(n, int) else 2
    px = flat_tile(images * (o // ob), oh * ow, flat_pixels(oh * ow, ob // vl)) if ow % 4 != 0 and ob in (vl, 2 * vl) else 0
    flat = px > 0
    tail = flat and (oh * ow) % px != 0
    if not flat:
        ob, px = tile(ow, ob, vl)

    # Layouts: the input (the pad stage's buffer, or a copy of x), the weights, the accumulators.
    nchw_input = not xc and (ci <= NCHW_INPUT_CHANNELS or (pad is None and (oh * ow <= NCHW_SMALL_MAP or kh == kw == 1)))
    if xc:
        ctx.native.add(param_name(sch, x_param))
    if pad is None and not nchw_input and not xc:
        pad = sch.cache_read(conv, read_index(sch, conv, c.x_buf), "global")
    if pad is not None and not nchw_input:
        sch.transform_layout(pad, ("write", 0), lambda a, b, h, w: (a, b // cb, h, w, b % cb))

    def blocked(a, b, h, w):
        return (a // ob, b // cb, h, w, b % cb, a % ob)

    w_name = param_name(sch, c.w_buf)
    if w_name in ctx.constants:  # weights fixed at build time: the builder stores them blocked
        sch.transform_layout(conv, ("read", read_index(sch, conv, c.w_buf)), blocked)
        ctx.prepack[w_name] = f"conv:{ob}:{cb}"
        wp = None
    else:
        wp = sch.cache_read(conv, read_index(sch, conv, c.w_buf), "global")
        sch.transform_layout(wp, ("write", 0), blocked)
    if flat:
        # The conv, its accumulators and the write-back all iterate one flat pixel index, so that a tile's
        # region is exact (as rows and columns, a tile spanning two rows is a box of both whole rows).
        sch.transform_layout(conv, ("write", 0), lambda a, b, h, w: (a, b // ob, h * ow + w, b % ob))
        sch.transform_block_layout(conv, lambda a, b, h, w, c, y, x: (a, b, h * ow + w, c, y, x))
        sch.transform_block_layout(out, lambda a, b, h, w: (a, b, h * ow + w))
        i_n, i_o, i_p, r_c, r_h, r_w = sch.get_loops(conv)
        rows, (wo, wi) = [], sch.split(i_p, [None, px])
    else:
        sch.transform_layout(conv, ("write", 0), lambda a, b, h, w: (a, b // ob, h, w, b % ob))
        i_n, i_o, i_h, i_w, r_c, r_h, r_w = sch.get_loops(conv)
        rows, (wo, wi) = [i_h], sch.split(i_w, [None, px])
        if ow % px:  # the row's short last tile peeled off, the others free of its predicate
            sch.annotate(wo, "pragma_loop_partition_hint", 1)
    oo, oi = sch.split(i_o, [None, ob])
    co, cc = sch.split(r_c, [None, cb])
    if tail:
        # The last tile is cut short by a predicate that TVM's loop partitioning peels off (the hint), so
        # the other tiles run without it. The input-channel blocks go around the tiles: a block's weights
        # (16 x 3 x 3 x 16 floats, 9 KB) stay in L1 while every tile of the map uses them, where the tile
        # order streamed all of a 512-channel conv's weights (295 KB) through L1 once per tile (512->512
        # at 7x7, one thread: 3754 -> 3171 us). The accumulators stay in memory between blocks; they are
        # written back once the map is done, as the channel blocks and the parallel loop are over (n, o).
        # One chunk where the map's accumulators would not stay in cache between chunks.
        per = ci // cb if oh * ow * ob * 4 > CHUNK_ACC_BYTES else CHUNK_WEIGHT_BYTES // (cb * kh * kw * ob * 4)
        co_o, co = sch.split(co, [None, _divisor_le(ci // cb, max(1, per))])
        sch.reorder(i_n, oo, co_o, wo, co, r_h, r_w, cc, wi, oi)
        par = sch.fuse(i_n, oo)
        sch.reverse_compute_at(out, par)
        sch.annotate(wo, "pragma_loop_partition_hint", 1)
    else:
        outer = [i_n, *rows, oo] if rows and rows_outer(c) else [i_n, oo, *(rows or [wo])]
        sch.reorder(*outer, *([wo] if rows else []), co, r_h, r_w, cc, wi, oi)
        sch.reverse_compute_at(out, wo)
        par = sch.fuse(*outer)  # rows in parallel; flat: every tile
    sch.parallel(par)
    sch.vectorize(oi)
    sch.unroll(wi)
    if (ob // vl) * px <= 8:
        # Unrolled taps share their input loads (a pixel's right neighbour is the next tap's pixel); with
        # the 12 accumulators of a 6-pixel tile, keeping those shared loads live spills registers.
        sch.unroll(r_w)
    init = sch.decompose_reduction(conv, co_o if tail else co)
    try_vectorize(sch, sch.get_loops(init)[-1], ob)
    # NCHW write-back at a tile: the tile's pixels are contiguous along W, so the last loop vectorizes; its
    # channels unrolled, so that the strided reads of the accumulators overlap (with a residual input:
    # 147 -> 135 us). With a short last tile it runs once the map is done, pixels innermost: contiguous
    # NCHW writes as they are.
    # A heavy epilogue on the accumulators first (flat tiles' regions are not exact boxes: TVM cannot copy
    # one): a vector at a time before an NCHW write-back, the tile's two vectors at once before a blocked one.
    if not tail and not flat and heavy_epilogue(sch, out):
        out = epilogue_on_vectors(sch, out, wo, ob if yc else vl)
    if yc:
        blocked_write_back(sch, out, ctx, yc, ob, None if tail else px)
    elif not tail:
        if flat:
            sch.unroll(sch.get_loops(out)[-1])  # a tile's pixels may span two rows: no vector store
        else:
            try_vectorize(sch, sch.get_loops(out)[-1], px)
        out_loops = sch.get_loops(out)
        if len(out_loops) >= 2 and (extent(sch, out_loops[-2]) or 0) == ob:
            sch.unroll(out_loops[-2])

    if pad is not None and nchw_input:
        _pad_loops(sch, pad)
    elif pad is not None:
        pack_loops(sch, pad, cb, vl)
    if wp is not None:
        _weightpack_loops(sch, wp, ob, cb, o * ci * kh * kw >= PARALLEL_PACK)
    return True


def rows_outer(c: Conv) -> bool:
    """Whether the parallel tasks take rows of the map outermost, each running every block of output
    channels over its row, rather than a block of output channels sweeping the whole map. Each order
    streams one operand once and reads the other again per task: the output-channel order reads the
    input again per block, from L3 or memory once it outgrows the L2; the row order reads the weights
    again per row, from L2 where they fit. Rows go outermost where the input is the larger and the
    weights fit in half the L2. Whole calls on Zen 3, in turns (two runs each): ResNet-50 0.90x, 0.93x;
    DenseNet-121 0.85x, 0.99x; EfficientNet-B0 0.92x, 0.98x; SqueezeNet 0.91x; MobileNetV2 0.99x; the
    most where the host's memory is busiest (DenseNet's 0.85x in a minute its calls took 52-62 ms, 0.99x
    at 40 ms)."""
    n, o, oh, ow, ci, kh, kw = c.ext
    itemsize = cpu().vector_bytes // lanes(c.dtype)
    inputs = ci * int(c.x_buf.shape[2]) * int(c.x_buf.shape[3]) * itemsize  # (NCHW here, padded or not)
    weights = o * ci * kh * kw * itemsize
    return inputs > weights and weights <= cpu().l2 // 2


def _pixel_tile(sch: s_tir.Schedule, conv, out, pad, vl: int, vectors: int) -> None:
    """Few input channels (a network's first conv: 3 x 3 x 3 products per output): the register tile is
    PIXEL_TILE_CHANNELS output channels x two vectors of pixels along W (twice the channels x one vector
    where two do not divide the row), read as vectors from the (zero-padded) NCHW input, contiguous, or
    at stride 2-4 contiguous loads and a shuffle (MobileNet's stem, 3->32 at 224 -> 112: 199 -> 173 us),
    weights broadcast. The reduction is too short to amortize the channel tile's NCHW write-back (a 16x4
    transpose through memory); here the accumulators are NCHW rows already and the epilogue stores them
    as they are (3->32 channels at 32x32: 20.2 -> 13.6 us; batch 16: 250 -> 170 us)."""
    i_n, i_o, i_h, i_w, r_c, r_h, r_w = sch.get_loops(conv)
    oo, oi = sch.split(i_o, [None, PIXEL_TILE_CHANNELS * 2 // vectors])
    wo, wi = sch.split(i_w, [None, vectors * vl])
    sch.reorder(i_n, oo, i_h, wo, r_c, r_h, r_w, oi, wi)
    sch.reverse_compute_at(out, wo)
    sch.parallel(sch.fuse(i_n, oo, i_h))
    sch.vectorize(wi)
    sch.unroll(oi)
    sch.unroll(r_w)
    init = sch.decompose_reduction(conv, r_c)
    try_vectorize(sch, sch.get_loops(init)[-1], vectors * vl)
    try_vectorize(sch, sch.get_loops(out)[-1], vectors * vl)
    if pad is not None:
        _pad_loops(sch, pad)


def flat_tile(chunks: int, pixels: int, per: int = FLAT_TILE) -> int:
    """Pixels a tile of the flattened map takes (rows that 4 does not divide: ResNet's 14x14 and 7x7), 0 for
    none. FLAT_TILE pixels x 16 channels make 12 accumulators, which keep both FMA pipes busy (8 leave
    them waiting on FMA latency): 256->256 at 14x14 2667 -> 2518 us, 512->512 at 7x7 3754 -> 3410 us on
    one thread. Where the map is no multiple of it, the tile of the last pixels is cut short, which
    the parallel loop must not cross: the convolution then needs `chunks` (images x output-channel
    blocks) to keep every core busy."""
    if pixels % per == 0 or chunks >= 2 * _cores():
        return per
    return 4 if pixels % 4 == 0 else 0


def flat_pixels(pixels: int, vectors: int) -> int:
    """Pixels of a flat tile of `vectors` vectors of output channels: FLAT_TILE pixels of two vectors (12
    accumulators, which AVX2's 16 registers hold with a weight vector and a broadcast), or more where the
    host's registers hold more accumulators (half of them: 16 of AVX-512's 32) and that many pixels
    divide the map, so no tile is cut short: 7 of ResNet-50's 14x14 and 7x7 maps (14 accumulators),
    ResNet-50 0.97x of 6-pixel tiles on Zen 4 (8: 0.99x, 14 pixels and 28 accumulators: 0.98x)."""
    base = FLAT_TILE * 2 // vectors
    most = max(base, cpu().registers // 2 // vectors)
    return next((p for p in range(base, most + 1) if pixels % p == 0), base)


def _cores() -> int:
    return os.cpu_count() or 1


def tile(ow: int, ob: int, vl: int) -> tuple[int, int]:
    """The register tile: `ob` output channels (one or two vectors) x `px` pixels of a row. Two vectors
    take 4 pixels (8 accumulators; 6 measured no faster), one vector 12 (as the flat tile: 4 pixels of
    one vector left FMA latency exposed: 144->24 1x1 at 56x56 on 8-lane vectors 262 -> 199 us; 8, which
    divides 56, 223 us), or a few pixels more, or fewer, where the row's last tile would be shorter than
    half a tile; that last tile is peeled off. (SqueezeNet's 13x13 rows took 1-pixel tiles, 13's
    divisors being 1 and 13: 512->64 1x1 152 -> 57 us with 5-pixel ones; a 4-pixel tile and a last one
    of 1: 65 us. Its 111-pixel stem rows took 3-pixel tiles: 390 -> 344 us with 4.) Rows of 7
    (ResNet's last stage, where `flat_tile` declines: too few output-channel blocks to share among the
    cores) take 7 pixels of one vector: two vectors would need 14 accumulators and spill with 16
    registers (62 -> 44 GFLOP/s on one thread), and the 1- or 2-pixel tiles reloaded each weight vector
    for every pixel (512->512 3x3 at 7x7: 48 -> 149 GFLOP/s on two threads)."""
    if ob == 2 * vl and ow % 4 and ow % 7 == 0:
        return vl, 7
    sizes = (4, 5, 6) if ob == 2 * vl else (12, 11, 10, 9, 8)
    if ow <= max(sizes):
        return ob, ow
    return ob, next((p for p in sizes if ow % p == 0 or 2 * (ow % p) >= p), None) or max(sizes, key=lambda p: ow % p)


def _weightpack_loops(sch: s_tir.Schedule, b, ob: int, cb: int, parallel: bool) -> None:
    """W[O, C, KH, KW] -> [O/ob, C/cb, KH, KW, cb, ob] in the order of the packed layout, output channels
    innermost: contiguous writes from strided reads is 3x faster than the source order's scattered writes
    (128x128x3x3: 56 -> 18 us)."""
    i_o, i_c, i_h, i_w = sch.get_loops(b)
    oo, oi = sch.split(i_o, [None, ob])
    co, cc = sch.split(i_c, [None, cb])
    sch.reorder(oo, co, cc, i_h, i_w, oi)
    if parallel:
        sch.parallel(sch.fuse(oo, co))
    try_vectorize(sch, oi, ob)


def _pad_loops(sch: s_tir.Schedule, b) -> None:
    """The zero-padded NCHW copy: rows in parallel (one core for a small copy), each a contiguous copy."""
    loops = sch.get_loops(b)
    large = large_copy(sch, loops)
    rows = sch.fuse(*loops[:3])
    if large:
        sch.parallel(rows)
