"""pool rule: max/avg pooling windows (and any reduction over a small window of an NCHW map).

The generic schedule ran a window's reduction one output at a time, parallel over every output. Here
the outer loop is (n, c, output row), in parallel; when the pool steps one column at a time, the taps
come next and the output row is innermost, as vectors (each tap one contiguous vector read and one
max/add into a row of accumulators); when it strides, a vector read would be a gather, so the row
stays scalar with the window unrolled innermost. A padding stage is inlined into the taps (a select at
the edges); an epilogue (avg's divide, a fused ReLU) runs on each row when it is finished.
2x2/2 max pool of 32 maps of 32x32: 8.2 -> 2.5 us; ResNet-18's 3x3/2 one (64 maps of 112x112): 578 -> 211 us.
Pools to one pixel (global) are the rows rule's.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from compiler.codegen.cpu_rules.common import REDUCE, Context, blocks, lanes, static, try_vectorize
from compiler.codegen.sblocks import sub_expressions

# Below this many outputs the kernel runs on one core: waking the pool costs more than the work.
PARALLEL_OUTPUTS = 1 << 12


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
    unit = _unit_column_step(sch.get(pool))
    if unit:
        sch.reorder(n, c, i, rh, rw, j)
    rows = sch.fuse(n, c, i)
    if ext[0] * ext[1] * ext[2] * ext[3] >= PARALLEL_OUTPUTS:
        sch.parallel(rows)
    if unit:
        try_vectorize(sch, j, vl)  # before the init splits off: a block without one is no longer a reduction
        init = sch.decompose_reduction(pool, rh)
        try_vectorize(sch, sch.get_loops(init)[-1], vl)
    else:
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


def _unit_column_step(blk) -> bool:
    """Whether neighbouring outputs of a row read neighbouring input columns (the pool steps by 1 along W),
    so that a row of outputs is one contiguous vector read per tap. Strided windows would read gathers,
    slower than scalar code (2x2/2 max pool at 32x32: 8.5 -> 13.6 us vectorized): they stay scalar, the
    window innermost."""
    j = blk.iter_vars[3].var
    loads = [x for x in sub_expressions(blk.body.value) if isinstance(x, TensorLoad) and len(x.indices) == 4]
    loads = [x for x in loads if not x.source.same_as(blk.body.buffer)]  # the input, not the accumulator
    if not loads:
        return False
    col = list(sub_expressions(loads[0].indices[3]))
    scaled = any(isinstance(x, tirx.Mul) and (x.a.same_as(j) or x.b.same_as(j)) for x in col)
    return not scaled and any(x.same_as(j) for x in col)
