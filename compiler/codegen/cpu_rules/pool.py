"""pool rule: max/avg pooling windows (and any reduction over a small window of an NCHW map).

The generic schedule ran a window's reduction one output at a time, parallel over every output. Here
the outer loop is (n, c, output row), in parallel; the taps come next, unrolled, and the output row is
innermost, as vectors: each tap one vector read (contiguous at stride 1; at stride 2-4 contiguous reads
and a shuffle, see codegen/llvm_pipeline.py) and one max/add into a row of accumulators. A padded pool
computes its padding a plane at a time, right before the plane's rows (read through a select in the
taps, the column test per lane made TVM scalarize the whole row). A stride read as a gather (over 4)
stays scalar, the window innermost. An epilogue (avg's divide, a fused ReLU) runs on each row when it
is finished. Zen 4, AVX-512: 2x2/2 max pool of 32 maps of 32x32: 8.2 -> 2.5 us; ResNet's 3x3/2 padded
one (64 maps of 112x112): 578 -> 211 us, 322 -> 160 with the plane's padding; 3x3/1 padded on 64 maps
of 56x56: 435 -> 83 us with it; SqueezeNet's unpadded 3x3/2 ones, which were scalar: 256 maps of 27x27
121 -> 62 us, 64 of 111x111 118 -> 107 (LLVM had vectorized that one itself, with the same shuffles).
Pools to one pixel (global) are the rows rule's.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from compiler.codegen.cpu_rules.common import (
    REDUCE,
    Context,
    blocks,
    coefficient,
    lanes,
    param_name,
    static,
    try_vectorize,
)
from compiler.codegen.llvm_pipeline import MAX_STRIDE
from compiler.codegen.sblocks import is_select, sub_expressions
from compiler.codegen.target import cpu

# Below this many outputs the kernel runs on one core: waking the pool costs more than the work.
PARALLEL_OUTPUTS = 1 << 12


def row_vectors() -> int:
    """Rows up to this many vectors long are vectorized whole, their accumulators in registers across
    the taps: half the host's vector registers (8 with AVX2's 16, 16 with AVX-512's 32). A longer row
    goes a vector at a time under each tap, its accumulators stored and loaded again per tap: with
    AVX2's 8 lanes a 55-pixel row was 7 of them, and ShuffleNet's 3x3/2 max pool of 24 maps of
    112x112 took 400 us (ORT 120); whole, 81-119 us (64 maps 1045 -> 200-242; Zen 3)."""
    return cpu().registers // 2


def apply(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    order = blocks(sch)
    red = [b for b in order if any(iv.iter_type == REDUCE for iv in sch.get(b).iter_vars)]
    if len(red) != 1:
        return False
    blk = sch.get(red[0])
    kinds = [iv.iter_type == REDUCE for iv in blk.iter_vars]
    ext = [static(iv.dom.extent) for iv in blk.iter_vars]
    if ext and ext[0] is None:  # a batch known only at run time (codegen/symbolic.py): at least 2
        ext[0] = 2
    if kinds != [False] * 4 + [True] * 2 or None in ext or blk.init is None:
        return False
    if not isinstance(blk.body, tirx.BufferStore) or len(blk.body.indices) != 4:
        return False
    if ext[4] * ext[5] > 64 or ext[2] * ext[3] == 1:  # a global pool: the rows rule's
        return False
    name = blk.name_hint
    at = [sch.get(b).name_hint for b in order].index(name)
    ctx = ctx or Context()
    if ctx.blocked and _blocked(sch, ctx, order, at, ext):
        return True
    step = _column_step(blk)
    vector = step is not None and 1 <= step <= MAX_STRIDE
    # A padded window read through the padding's select tests its column per lane, on which TVM's
    # vectorizer gives up: the padding is instead computed a plane at a time into a small buffer (in cache)
    # right before the plane's rows read it, its interior in vectors (the border peeled off).
    plane_copy = vector and at > 0 and _is_padding(sch.get(order[at - 1]))
    for b in order[: at - 1 if plane_copy else at]:
        sch.compute_inline(b)  # producers (and unmaterialized padding): read in the taps, no copy
    pool = sch.get_sblock(name)
    after = order[at + 1 :]
    for b in after[:-1]:
        sch.compute_inline(b)
    n, c, i, j, rh, rw = sch.get_loops(pool)
    vl = lanes(str(blk.body.buffer.dtype))
    large = ext[0] * ext[1] * ext[2] * ext[3] >= PARALLEL_OUTPUTS
    if vector:
        sch.reorder(n, c, i, rh, rw, j)
    if plane_copy:
        plane, rows = sch.fuse(n, c), i
        if large:
            sch.parallel(plane)
        pad = sch.get_sblock(sch.get(order[at - 1]).name_hint)
        sch.compute_at(pad, plane)
        wo, wi = sch.split(sch.get_loops(pad)[-1], [None, vl])
        sch.annotate(wo, "pragma_loop_partition_hint", 1)  # the border's pieces peeled, the rest unconditional
        sch.vectorize(wi)
    else:
        rows = sch.fuse(n, c, i)
        if large:
            sch.parallel(rows)
    if vector:
        # Rows of up to row_vectors() vectors are one vector of the whole row (with 16 lanes, SqueezeNet's
        # 13 or 55: LLVM splits it into registers), no scalar tail; the taps unrolled, each row of
        # accumulators stays in registers.
        width = ext[3] if ext[3] <= row_vectors() * vl else vl
        try_vectorize(sch, j, width)  # before the init splits off: a block without one is no longer a reduction
        init = sch.decompose_reduction(pool, rh)
        try_vectorize(sch, sch.get_loops(init)[-1], width)
    sch.unroll(rh)
    sch.unroll(rw)
    if after:
        out = sch.get_sblock(sch.get(after[-1]).name_hint)
        sch.reverse_compute_at(out, rows)
        loops = sch.get_loops(out)
        # Only a loop of the epilogue's own: vectorizing `rows` would take the window's loops with it.
        if len(loops) > 1 and not sch.get(loops[-1]).same_as(sch.get(rows)):
            try_vectorize(sch, loops[-1], vl)
    return True


def _blocked(sch: s_tir.Schedule, ctx: Context, order, at: int, ext: list[int]) -> bool:
    """Input and output stored channel-blocked (codegen/layout.py): (image, channel block, output row) in
    parallel, then the row's pixels, the taps unrolled, and the block's channels as one vector, so every
    tap is one contiguous vector at any stride, and a padded window's test is made once a tap, not a lane.
    False (nothing changed) unless both are blocked with one width."""
    x = next((r.source for r in sch.get(order[0]).reads if ctx.block_of(sch, r.source)), None)
    y = sch.get(order[-1]).writes[0].source
    c = ctx.block_of(sch, y)
    if x is None or ctx.block_of(sch, x) != c or ext[1] % c:
        return False
    for b in order[:at]:
        sch.compute_inline(b)  # the padding too: its test depends on the pixel, not the channel
    pool = sch.get_sblock(sch.get(order[at]).name_hint)
    for b in order[at + 1 : -1]:
        sch.compute_inline(b)
    if at + 1 < len(order):  # the accumulators blocked too (an average's sums before the divide)
        sch.transform_layout(pool, ("write", 0), lambda a, b, h, w: (a, b // c, h, w, b % c))
    n, ch, i, j, rh, rw = sch.get_loops(pool)
    co, ci = sch.split(ch, [None, c])
    sch.reorder(n, co, i, j, rh, rw, ci)
    rows = sch.fuse(n, co, i)
    if ext[0] * ext[1] * ext[2] * ext[3] >= PARALLEL_OUTPUTS:
        sch.parallel(rows)
    sch.vectorize(ci)  # before the init splits off: a block without one is no longer a reduction
    init = sch.decompose_reduction(pool, rh)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(rh)
    sch.unroll(rw)
    if at + 1 < len(order):
        out = sch.get_sblock(sch.get(order[-1]).name_hint)
        sch.reverse_compute_at(out, rows)
        o_c, o_j = sch.get_loops(out)[-2:]  # the block's channels, then the row's pixels
        sch.reorder(o_j, o_c)
        sch.vectorize(o_c)
    ctx.native.update({param_name(sch, x), param_name(sch, y)})
    return True


def _column_step(blk) -> int | None:
    """How many input columns apart neighbouring outputs of a row read (the pool's stride along W), None
    where the column index is no `j * s + ...` of the row's iterator j."""
    j = blk.iter_vars[3].var
    loads = [x for x in sub_expressions(blk.body.value) if isinstance(x, TensorLoad) and len(x.indices) == 4]
    loads = [x for x in loads if not x.source.same_as(blk.body.buffer)]  # the input, not the accumulator
    return coefficient(loads[0].indices[3], j) if loads else None


def _is_padding(blk) -> bool:
    """Whether a block is a padding stage: a select between its input and the pad value."""
    return is_select(getattr(blk.body, "value", None))
