"""pool rule: max/avg pooling windows (and any reduction over a small window of an NCHW map).

The generic schedule ran a window's reduction one output at a time, parallel over every output. Here
the outer loop is (n, c, output row), in parallel; the taps come next, unrolled, and the output row is
innermost, as vectors: each tap one vector read (contiguous at stride 1; at stride 2 or 3 contiguous
reads and a shuffle, see codegen/llvm_pipeline.py) and one max/add into a row of accumulators. A
padded window reads through a select at the edges (the padding stage inlined, no copy); strided, its
column test is per lane and TVM's vectorizer scalarizes it, so that one stays scalar, the window
innermost. The taps are unrolled in every case (3x3/1 padded, 64 maps of 56x56: 670 -> 470 us). An
epilogue (avg's divide, a fused ReLU) runs on each row when it is finished.
2x2/2 max pool of 32 maps of 32x32: 8.2 -> 2.5 us; ResNet-18's 3x3/2 one (64 maps of 112x112): 578 -> 211
us; SqueezeNet's unpadded 3x3/2 ones, which were scalar: 256 maps of 27x27 121 -> 62 us, 64 of 111x111
118 -> 107 (LLVM had vectorized that one itself, with the same shuffles), Zen 4.
Pools to one pixel (global) are the rows rule's.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from compiler.codegen.cpu_rules.common import REDUCE, Context, blocks, lanes, static, try_vectorize
from compiler.codegen.llvm_pipeline import MAX_STRIDE
from compiler.codegen.sblocks import sub_expressions

# Below this many outputs the kernel runs on one core: waking the pool costs more than the work.
PARALLEL_OUTPUTS = 1 << 12
ROW_VECTORS = 4


def apply(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    order = blocks(sch)
    red = [b for b in order if any(iv.iter_type == REDUCE for iv in sch.get(b).iter_vars)]
    if len(red) != 1:
        return False
    blk = sch.get(red[0])
    kinds = [iv.iter_type == REDUCE for iv in blk.iter_vars]
    ext = [static(iv.dom.extent) for iv in blk.iter_vars]
    if kinds != [False] * 4 + [True] * 2 or None in ext or blk.init is None:
        return False
    if not isinstance(blk.body, tirx.BufferStore) or len(blk.body.indices) != 4:
        return False
    if ext[4] * ext[5] > 64 or ext[2] * ext[3] == 1:  # a global pool: the rows rule's
        return False
    name = blk.name_hint
    at = [sch.get(b).name_hint for b in order].index(name)
    for b in order[:at]:
        sch.compute_inline(b)  # the padding: a select in the taps, no copy
    pool = sch.get_sblock(name)
    after = order[at + 1 :]
    for b in after[:-1]:
        sch.compute_inline(b)
    n, c, i, j, rh, rw = sch.get_loops(pool)
    vl = lanes(str(blk.body.buffer.dtype))
    # A padded window's column test is a condition per lane, on which TVM's vectorizer gives up: a padded
    # strided pool stays scalar, its window innermost; so does one of a stride read as a gather.
    step = _column_step(sch.get(pool))
    vector = step == 1 or (at == 0 and step is not None and step <= MAX_STRIDE)
    if vector:
        sch.reorder(n, c, i, rh, rw, j)
    rows = sch.fuse(n, c, i)
    if ext[0] * ext[1] * ext[2] * ext[3] >= PARALLEL_OUTPUTS:
        sch.parallel(rows)
    if vector:
        # Rows of up to ROW_VECTORS vectors are one vector of the whole row (13 or 55 lanes: LLVM splits
        # it into registers), no scalar tail; the taps unrolled, each row of accumulators stays in registers.
        width = ext[3] if ext[3] <= ROW_VECTORS * vl else vl
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


def _column_step(blk) -> int | None:
    """How many input columns apart neighbouring outputs of a row read (the pool's stride along W), None
    where the column index is no `j * s + ...` of the row's iterator j."""
    j = blk.iter_vars[3].var
    loads = [x for x in sub_expressions(blk.body.value) if isinstance(x, TensorLoad) and len(x.indices) == 4]
    loads = [x for x in loads if not x.source.same_as(blk.body.buffer)]  # the input, not the accumulator
    if not loads:
        return None
    col = list(sub_expressions(loads[0].indices[3]))
    for x in col:
        if isinstance(x, tirx.Mul) and (x.a.same_as(j) or x.b.same_as(j)):
            k = x.b if x.a.same_as(j) else x.a
            return int(k) if isinstance(k, tirx.IntImm) else None
    return 1 if any(x.same_as(j) for x in col) else None
