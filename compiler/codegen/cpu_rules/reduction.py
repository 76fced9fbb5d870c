"""Reductions: rows (softmax, log_softmax, layer_norm, reduce_* over the trailing axes), columns
(reduce_* over leading axes: a bias gradient's sum over the batch) and whole tensors.

Rows, as measured in the TVM notes (§10): every stage of a row computed together, under a parallel
loop over chunks of rows, while the row is in L1; each reduction split into vector lanes with rfactor
(a [rows, lanes] partial buffer, reduced to one value at the end); the normalising stage vectorized.
softmax 512x128 goes from 227 us (unscheduled) to 24 us; layer_norm 128x256 from 63 us to 7 us.
Columns: the innermost output dim, contiguous in the input, becomes a vector of accumulators and
the reduce loops run outside it. A whole-tensor reduction runs on one core, in vector lanes.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from compiler.codegen.cpu_rules.common import (
    REDUCE,
    Context,
    blocks,
    extent,
    inline_spatial,
    is_spatial,
    lanes,
    param_name,
    symbolic,
    try_vectorize,
    vector_dividing,
)
from compiler.codegen.sblocks import is_select, register_infinite_reducers, sub_expressions, uses
from compiler.codegen.target import num_cores

COSTLY = 24  # expression nodes from which a stage read twice is stored rather than recomputed
ROW_WORK = 4096  # elements per parallel task, at least: the pool's wake-up costs about a microsecond


def apply_planes(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    """A reduction over the map of a channel-blocked input (the global average pool of a
    squeeze-and-excitation block, reduce_mean over H and W): (image, channel block) in parallel, the
    block's channels the vector lanes of the accumulators, the pixels reduced in storage order. Only
    for a blocked input (codegen/layout.py); NCHW maps are rows to the `rows` rule."""
    if ctx is None or not ctx.blocked:
        return False
    reductions = [b for b in blocks(sch) if not is_spatial(sch, b)]
    if len(reductions) != 1:
        return False
    red = reductions[0]
    blk = sch.get(red)
    ivs = [iv.var for iv in blk.iter_vars]
    kinds = [iv.iter_type == REDUCE for iv in blk.iter_vars]
    if kinds != [False] * 4 + [True] * 2 or len(blk.reads) < 1:
        return False
    x = next((r.source for r in blk.reads if ctx.block_of(sch, r.source)), None)
    if x is None:
        return False
    c = ctx.block_of(sch, x)
    load = next(e for e in sub_expressions(blk.body.value) if getattr(e, "source", None) is not None
                and e.source.same_as(x))
    want = [ivs[0], ivs[1], ivs[4], ivs[5]]
    if len(load.indices) != 4 or not all(i.same_as(v) for i, v in zip(load.indices, want)):
        return False
    after = [b for b in blocks(sch) if is_spatial(sch, b)]
    i_n, i_c, i_h, i_w, r_h, r_w = sch.get_loops(red)
    if (extent(sch, i_c) or 0) % c or extent(sch, i_h) != 1 or extent(sch, i_w) != 1:
        return False
    co, ci = sch.split(i_c, [None, c])
    sch.reorder(i_n, co, i_h, i_w, r_h, r_w, ci)
    par = sch.fuse(i_n, co)
    sch.parallel(par)
    sch.vectorize(ci)  # (before the init splits off: a block without one is no longer a reduction)
    init = sch.decompose_reduction(red, r_h)
    sch.vectorize(sch.get_loops(init)[-1])
    for b in after:
        sch.reverse_compute_at(b, par)
        try_vectorize(sch, sch.get_loops(b)[-1], c)
    ctx.native.add(param_name(sch, x))
    return True


def apply(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    register_infinite_reducers()
    bl = blocks(sch)
    reductions = [b for b in bl if not is_spatial(sch, b)]
    if not reductions or not all(_trailing(sch, r) for r in reductions):
        return False
    rows = _row_dims(sch, reductions[0])
    if any(_row_dims(sch, r) != rows for r in reductions):
        return False
    if rows == 0:
        return _whole(sch, reductions)
    # A costly stage read twice (exp(x - max) feeding both the sum and the quotient) is computed once
    # per row instead, into a row buffer; everything else folds into its consumers. Over a row of a length
    # known only at run time (a sequence's) every stage folds, the exp computed twice: such a row buffer's
    # region, inferred from the partial reduction's padded vectors, reaches past the row (the softmax at
    # 384 as it is: 144 us against 108-155 for its static schedule, which keeps the buffer; Zen 4).
    static_row = all(extent(sch, lp) is not None for r in reductions for lp in sch.get_loops(r)[rows:])
    cheap = [b for b in bl[:-1]
             if not static_row or len(sch.get_consumers(b)) < 2 or _size(sch.get(b).body.value) < COSTLY]
    inline_spatial(sch, cheap)
    out = blocks(sch)[-1]
    if len(sch.get_loops(out)) < rows:
        return False
    width = max(_reduced(sch, r) for r in reductions)
    dtype = str(sch.get(out).writes[0].source.dtype)
    vl = lanes(dtype)
    # rfactor before any compute_at: it wants the reduction block first under its outermost loop.
    partials = [_rfactor(sch, r, rows, vl) for r in reductions if not _same(sch, r, out)]
    if not is_spatial(sch, out):
        partials.append(_rfactor(sch, out, rows, vl))
    loops = sch.get_loops(out)
    dims = [extent(sch, lp) or 1 for lp in loops[:rows]]
    row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
    n_rows = extent(sch, row) or 1
    per = max(1, min(n_rows, -(-ROW_WORK // width)))
    per = min(per, max(1, n_rows // (2 * num_cores())))  # keep two tasks per core when rows allow
    ro, ri = sch.split(row, [None, _whole_chunk(dims, per)])
    sch.parallel(ro)
    for b in reversed(blocks(sch)[:-1]):
        sch.compute_at(b, ri)
    for rf, n in partials:
        if rf is not None:
            _restore_predicate(sch, rf, n)
            _vectorize_partial(sch, rf, vl)
    for b in blocks(sch)[:-1]:  # stages kept as row buffers
        if is_spatial(sch, b) and len(sch.get_loops(b)) > 2:
            try_vectorize(sch, sch.get_loops(b)[-1], 2 * vl)
    inner = sch.get_loops(out)[2:]
    if is_spatial(sch, out) and inner:
        try_vectorize(sch, sch.fuse(*inner) if len(inner) > 1 else inner[0], 2 * vl)
    return True


def _whole_chunk(dims: list[int], most: int) -> int:
    """The most rows, up to `most`, a task can take without a chunk crossing the edge of any row dim: a
    divisor of the innermost dim, or all of it times a divisor of the next, and so on. Across an edge the
    partial blocks' bindings are no longer affine: the rule failed (Swin-T's [4, 12, 49] rows in chunks
    of 84: the generic schedule, 2-5x slower) or, worse, the partials lost their bound and read past the
    tensor (ViT's [1, 12, 197] in chunks of 21: a segfault)."""
    best, inner = 1, 1
    for d in reversed(dims):
        best = max([best, *(inner * k for k in range(1, d + 1) if d % k == 0 and inner * k <= most)])
        inner *= d
        if inner > most:
            break
    return best


def _whole(sch: s_tir.Schedule, reductions: list) -> bool:
    """One reduction to a scalar (and its epilogue): vector lanes on one core."""
    if len(reductions) != 1:
        return False
    bl = blocks(sch)
    inline_spatial(sch, bl[:-1])
    r = reductions[0]
    rf, _ = _rfactor(sch, r, 0, lanes(str(sch.get(r).writes[0].source.dtype)))
    if rf is None:
        return False
    sch.vectorize(sch.get_loops(rf)[-1])
    return True


def apply_columns(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    """A single reduction whose innermost output dim indexes the innermost input dim (sum over axis 0)."""
    bl = blocks(sch)
    reductions = [b for b in bl if not is_spatial(sch, b)]
    if len(reductions) != 1:
        return False
    r = reductions[0]
    ivs = list(sch.get(r).iter_vars)
    n_spatial = sum(iv.iter_type != REDUCE for iv in ivs)
    if n_spatial == 0 or any(iv.iter_type == REDUCE for iv in ivs[:n_spatial]):
        return False
    last = ivs[n_spatial - 1].var
    if not any(ld.indices and ld.indices[-1].same_as(last) for ld in _loads(sch.get(r).body.value)):
        return False
    at = [sch.get(b).name_hint for b in bl].index(sch.get(r).name_hint)
    inline_spatial(sch, bl[:at])
    after = blocks(sch)
    after = after[[sch.get(b).name_hint for b in after].index(sch.get(r).name_hint) + 1 :]
    for b in after[:-1]:
        sch.compute_inline(b)
    loops = sch.get_loops(r)
    outer, inner, red = loops[: n_spatial - 1], loops[n_spatial - 1], loops[n_spatial:]
    dtype = str(sch.get(r).writes[0].source.dtype)
    n = extent(sch, inner) or 0
    vl = vector_dividing(n, dtype) if n else 0
    if vl == lanes(dtype) and n % (2 * vl) == 0:
        vl *= 2
    width = vl if vl > 1 else 0
    if width == 0 or not red:
        return False
    # Up to 4 vectors of accumulators side by side: each input row is read 4 vectors at a time.
    strips = next(m for m in (4, 2, 1) if n % (m * width) == 0)
    so, sm, si = sch.split(inner, [None, strips, width])
    sch.reorder(*outer, so, *red, sm, si)
    sch.unroll(sm)
    par = sch.fuse(*outer, so) if outer else so
    sch.parallel(par)
    if after:
        sch.reverse_compute_at(after[-1], par)
        try_vectorize(sch, sch.get_loops(after[-1])[-1], width)
    # The init stays in the block: a decomposed update block is no longer a reduction block, and
    # vectorize refuses a spatial loop under reduce loops unless it is one.
    sch.vectorize(si)
    return True


def _same(sch: s_tir.Schedule, a, b) -> bool:
    return sch.get(a).name_hint == sch.get(b).name_hint


def _trailing(sch: s_tir.Schedule, b) -> bool:
    """The block's reduce iterators come last and index the innermost dims of what it reads."""
    ivs = list(sch.get(b).iter_vars)
    kinds = [iv.iter_type == REDUCE for iv in ivs]
    first = kinds.index(True)
    if not all(kinds[first:]) or len(sch.get_loops(b)) != len(ivs):
        return False
    last = ivs[-1].var
    body = sch.get(b).body
    loads = _loads(body.value)
    return any(ld.indices and ld.indices[-1].same_as(last) for ld in loads)


def _nodes(e) -> list:
    return list(sub_expressions(e))


def _loads(e) -> list:
    from tvm.ir.expr import TensorLoad

    return [x for x in _nodes(e) if isinstance(x, TensorLoad)]


def _size(e) -> int:
    return len(_nodes(e))


def _row_dims(sch: s_tir.Schedule, b) -> int:
    return sum(iv.iter_type != REDUCE for iv in sch.get(b).iter_vars)


def _reduced(sch: s_tir.Schedule, b) -> int:
    """How many elements one output of the reduction block reads."""
    n = 1
    for iv in sch.get(b).iter_vars:
        if iv.iter_type == REDUCE:
            n *= int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else 1
    return n


def _rfactor(sch: s_tir.Schedule, r, rows: int, vl: int):
    """Split the (fused) reduce loops into vector lanes and factor them out: a [rows.., lanes] partial.
    Returns (the partial block or None, the row's length: an int, or an expression of the kernel's size
    variables for a row known only at run time, a sequence's)."""
    loops = sch.get_loops(r)
    red = loops[rows:]
    k = sch.fuse(*red) if len(red) > 1 else red[0]
    n = extent(sch, k)
    if n is None:
        if not symbolic(sch):
            return None, 0
        # A row of a length known at run time: whole vectors and a predicated last one, as below.
        ki, n = vl, sch.get(k).extent
    else:
        # One vector of partials: 2 or 4 (independent add chains) measured no faster on softmax rows.
        ki = next((d for d in range(vl, 1, -1) if n % d == 0 and n >= 2 * d), None)
    if ki is None or ki < vl // 2:
        # No vector (or half of one) divides the row (softmax rows of 197: one element at a time, 4x
        # slower): whole vectors and a predicated last one. compute_at drops the partial block's
        # predicate; `_restore_predicate` puts it back once the block sits under its row.
        if n < 2 * vl:
            return None, n
        ki = vl
    ko, kin = sch.split(k, [None, ki])
    try:
        rf = sch.rfactor(kin, rows)
    except Exception:  # noqa: BLE001 (a reducer rfactor does not know, e.g. an argmax pair)
        return None, n
    # rfactor orders the partial's iterators (lane, rows.., ko); compute_at makes loops in that
    # order, and the lane loop must come innermost to be vectorized.
    m = len(sch.get(rf).iter_vars)
    sch.reorder_block_iter_var(rf, [*range(1, m), 0])
    return rf, n


def _restore_predicate(sch: s_tir.Schedule, rf, n) -> None:
    """A partial block over a padded row (the reduction's extent no multiple of its lanes) gets its bound
    back, `chunk * lanes + lane < n`, in the loop variables compute_at gave it: compute_at rebuilds the
    block's realize from its iteration domain and drops the predicate rfactor had kept, so the last
    vector would read past the row. The chunk loop is marked for partitioning, so only the last chunk is
    predicated (and scalar); the others stay whole vectors."""
    loops = sch.get_loops(rf)
    inner = sch.get(loops[-1])
    realize = inner.body
    if not isinstance(realize, s_tir.SBlockRealize):  # never leave it unbounded: the rule declines instead
        raise ValueError(f"the partial block of a {n}-wide row is not alone under its lanes loop")
    blk = realize.block
    ivs = list(blk.iter_vars)
    lane, chunk = len(ivs) - 1, next(n for n, iv in enumerate(ivs) if iv.iter_type == REDUCE)
    vl, chunks = int(ivs[lane].dom.extent), ivs[chunk].dom.extent
    if isinstance(n, int) and n >= vl * int(chunks):
        return
    values = realize.iter_values
    bound = values[chunk] * vl + values[lane] < n
    new = tirx.For(inner.loop_var, inner.min, inner.extent, inner.kind, s_tir.SBlockRealize(values, bound, blk),
                   inner.thread_binding, inner.annotations)
    sch.state.replace(sch.get_sref(loops[-1]), new, {blk: blk})
    # TVM's loop partitioning, given a choice in the body whose condition bounds the chunk from below by
    # another iterator (`k >= i`: a reversed running sum), splits on that too and loses this bound in a
    # piece (wrong sums for rows of 37 and 53, right for 21 and 70): then every chunk keeps the bound.
    reduced = [iv.var for iv in (ivs[chunk], ivs[lane])]
    others = [iv.var for n, iv in enumerate(ivs) if n not in (chunk, lane)]

    def hazard(e) -> bool:
        if not (isinstance(e, tirx.Select) or is_select(e)):
            return False
        cond = _condition(e)
        return any(uses(cond, v) for v in reduced) and any(uses(cond, v) for v in others)

    value = getattr(blk.body, "value", None)
    if value is None or not any(hazard(e) for e in sub_expressions(value)):
        sch.annotate(loops[-2], "pragma_loop_partition_hint", 1)


def _condition(e):
    """The condition of a Select or an if_then_else call."""
    return e.condition if isinstance(e, tirx.Select) else e.args[0]


def _vectorize_partial(sch: s_tir.Schedule, rf, vl: int) -> None:
    """The partial block's lanes loop (innermost after the split) vectorized; over a row of a run-time
    length its init is split off too."""
    ko, ki = sch.get_loops(rf)[-2:]
    sch.vectorize(ki)
    if extent(sch, ko) is None:
        # The init split off (after vectorizing: a decomposed update is no reduction block to vectorize):
        # left in, its `ko == 0` test is a second condition that loop partitioning peels by, and it then
        # peels one whole chunk and runs every other chunk of a row of a run-time length predicated, one
        # lane at a time (the transformer's softmax at 384: 300 us against 108 for its static schedule).
        init = sch.decompose_reduction(rf, ko)
        sch.vectorize(sch.get_loops(init)[-1])


