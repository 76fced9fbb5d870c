"""Matmul rule: any block computing C[b.., i, j] += A[..] * B[..] (batched, transposed, with casts).

The schedule is the one measured in the TVM notes (§4): a register tile of rows x two vector registers
of columns (6 rows with AVX2's 16 registers, 8 with AVX-512's 32: `accumulators`), k split in chunks,
B packed into [N/16, K, 16] panels so that the inner loop reads it contiguously, accumulators written
back under the tile where the epilogue (bias, ReLU, GELU) runs on them while they are hot. Sizes that
do not divide are padded (pad_einsum) rather than predicated: a predicate inside the inner loop costs 3x.

Two loop orders: with many rows (M >= 256) B is packed once at the root and reused by every row tile
(k innermost, "kin"); with few rows (the MLP's batch of 64) packing all of B costs as much as the
product, so each [KT, NT] block of B is packed where it is used and k runs outside the row tiles
("kout"). A single row (M = 1) reads B as it lies, a strip of 4 panels at a time (a GEMV); with B
stored [N, K] it is N dot products, which the row-reduction rule schedules. An A stored [K, M] (x^T
in a weight gradient, its transpose fused) is packed once into [M/4, K, 4] row panels. Batch dims that a
shared B does not index are rows (`_merge_rows`: Swin-T's [1, 7, 7, 768] @ [768, 3072] is 49 rows).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import Call, TensorLoad

from compiler.codegen.cpu_rules.common import (
    MIN_LANES,
    REDUCE,
    SPATIAL,
    Context,
    blocks,
    inline_spatial,
    is_select,
    lanes,
    param_name,
    read_index,
    static,
    try_vectorize,
)
from compiler.codegen.target import cpu, num_cores


# Accumulator registers of the tile: 12 with AVX2's 16 registers (6 rows of two vectors; B's two vectors
# and A's broadcast take three of the other four): 8 would keep both FMA pipes busy only if no load ever
# stalled them (4-cycle latency x 2 pipes): GPT-2's [128, 768] @ [768, 3072] 7-9% faster in 6-row tiles
# (Zen 3), the 6-row kernel of ONNX Runtime's FMA3 SGEMM. 16 with AVX-512's 32 (8 rows of two vectors:
# ViT-B/16 0.98x, the MLP example 0.96x, the transformer 0.98x of 8, Zen 4).
def accumulators() -> int:
    return max(12, cpu().registers // 2)


def row_tile(m: int, most: int) -> int:
    """Rows of the register tile: `most`, or fewer where M's padding to whole tiles costs more than the
    smaller tile does. Padded rows are computed and dropped; each k step of a tile of r rows loads B's
    vectors once for all r, so a row costs about 1 + 1/r (128 rows: 6-row tiles over 132, not 4-row ones;
    Winograd's 196 tiles: 7 rows, not 8 over 200)."""
    if m <= most:
        return m
    return min(range(most, (most + 1) // 2 - 1, -1), key=lambda r: -(-m // r) * r * (r + 1) / r)


LARGE_M = 256  # from here on, packing all of B once is cheap next to the product
KOUT_NT = 4  # panels of B a task of the "kout" order takes


def kout_chunk(ni: int, itemsize: int = 4) -> int:
    """K rows of B a "kout" task takes at a time: its block of KOUT_NT panels in half the L2. B streams
    from L2 into the register tile either way (a 32 KiB block of 128 rows already filled Zen 3's L1);
    each chunk reloads and stores the C tile and restarts the loop nest, so fewer is faster: GPT-2 on Zen 3
    0.98x with 256 rows, 0.96x with 384, 0.94x with 768 against 128 (whole calls, in turns)."""
    return max(128, cpu().l2 // 2 // (KOUT_NT * ni * itemsize))


@dataclass
class Einsum:
    """The roles of a matmul block's iterators (positions in its iter_vars) and its B operand."""

    name: str
    batch: list[int]
    i: int | None
    j: int
    k: int
    ext: list[int]
    b_buf: object  # the buffer read as B (its columns are j)
    b_dims: list[int | None]  # for each dim of B, the iterator it is indexed by (None: a constant)
    dtype: str
    a_buf: object = None  # the buffer read as A (its rows are i)
    a_dims: tuple[int | None, ...] = ()  # like b_dims


def match(sch: s_tir.Schedule) -> Einsum | None:
    """The single reduction block if it is C = sum(A * B) with plain iterator indices, else None."""
    reductions = [b for b in blocks(sch) if any(iv.iter_type != SPATIAL for iv in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    blk = sch.get(reductions[0])
    ivs = list(blk.iter_vars)
    ext = [static(iv.dom.extent) for iv in ivs]
    red = [n for n, iv in enumerate(ivs) if iv.iter_type == REDUCE]
    if len(red) != 1 or len(red) + sum(iv.iter_type == SPATIAL for iv in ivs) != len(ivs):
        return None
    store = blk.body
    if not isinstance(store, tirx.BufferStore) or blk.init is None:
        return None
    loads = _product_loads(store)
    out = _positions(store.indices, ivs)
    if loads is None or out is None or None in out or len(out) + 1 != len(ivs):
        return None
    (x, xi), (y, yi) = [(ld, _positions(ld.indices, ivs)) for ld in loads]
    if xi is None or yi is None:
        return None
    k = red[0]
    if k not in xi or k not in yi or not out:
        return None
    j = out[-1]
    if j in xi and j not in yi:
        (x, xi), (y, yi) = (y, yi), (x, xi)
    if j in xi or j not in yi:
        return None
    i = out[-2] if len(out) >= 2 and out[-2] in xi and out[-2] not in yi else None
    # Sizes known only at run time (a kernel for every size: codegen/symbolic.py): rows, columns, K, batch.
    for q in range(len(ivs)):
        if ext[q] is None:
            ext[q] = ivs[q].dom.extent
    if None in ext or (i is None and not isinstance(ext[j], int)):
        return None
    batch = [p for p in out if p not in (i, j)]
    if (i is None or ext[i] == 1) and batch and batch[-1] in xi and not any(p in yi for p in batch):
        # One row per batch element against a B they all share (ViT's [197, 1, 768] @ [768, 2304], as
        # torch exports its sequence-first attention): the batch is the rows. As 197 GEMVs each streamed
        # all of B (7 MB) again: 78 against 200 GFLOP/s on two Zen 4 cores.
        i, batch = batch[-1], batch[:-1] + ([i] if i is not None else [])
    return Einsum(blk.name_hint, batch, i, j, k, ext, y.source, yi, str(store.buffer.dtype), x.source, tuple(xi))


def _strip(e):
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


def _product_loads(store) -> tuple | None:
    """(A, B) loads of `C[..] = C[..] + A[..] * B[..]`, looking through casts."""
    v = store.value
    if not isinstance(v, tirx.Add):
        return None
    for acc, prod in ((v.a, v.b), (v.b, v.a)):
        if isinstance(acc, TensorLoad) and acc.source.same_as(store.buffer):
            prod = _strip(prod)
            if isinstance(prod, tirx.Mul):
                a, b = _strip(prod.a), _strip(prod.b)
                if isinstance(a, TensorLoad) and isinstance(b, TensorLoad):
                    return a, b
    return None


def _positions(indices, ivs) -> list[int | None] | None:
    """Each index as the position of the iterator it is, None for a constant; None if any is an expression."""
    out: list[int | None] = []
    for e in indices:
        if isinstance(e, tirx.IntImm):
            out.append(None)
            continue
        n = next((n for n, iv in enumerate(ivs) if iv.var.same_as(e)), -1)
        if n < 0:
            return None
        out.append(n)
    return out


@dataclass
class Plan:
    """Padded extents and tile sizes: M -> [Mp/MT, MT/mi, mi], N -> [Np/NT, NT/ni, ni], K -> [Kp/KT, KT]."""

    mp: int
    mt: int
    mi: int
    np_: int
    nt: int
    ni: int
    kp: int
    kt: int
    order: str  # "kin", "kout" or "gemv"
    pack: bool


def symbolic_rows(e: Einsum) -> bool:
    """Whether rows, columns, K or a batch dim are known only at run time: the "rows" order of
    `_symbolic_plan`."""
    return any(not isinstance(e.ext[q], int) for q in (e.i, e.j, e.k, *e.batch) if q is not None)


def plan(e: Einsum) -> Plan:
    m = e.ext[e.i] if e.i is not None else 1
    n, k = e.ext[e.j], e.ext[e.k]
    if symbolic_rows(e):
        return _symbolic_plan(e, m, n, k)
    vl = lanes(e.dtype)
    # Panels of two vectors of columns, or of one where that divides N and two do not (48 columns on
    # AVX-512): padding to whole panels would add a third to the work, and a padded constant B is not
    # prepacked.
    nv = 1 if n % (2 * vl) and n % vl == 0 else 2
    ni = nv * vl
    if m == 1:
        nt_want, order = 4 * ni, "gemv"
    elif m >= LARGE_M:
        nt_want, order = 8 * ni, "kin"
    else:
        nt_want, order = KOUT_NT * ni, "kout"
    # B stored [K, N] with one panel's columns is read as it lies, row by row; stored [N, K] (a Gemm's
    # transB) it is packed, or each vector of it would be a gather.
    pack = order != "gemv" and _b_is_packable(e) and (n > ni or e.b_dims[-1] != e.j)
    if n <= ni:  # one panel, padded to whole vectors
        ni = -(-n // vl) * vl
        nt_want = ni
        order = "kin" if order == "kout" else order
    # Rows of the register tile: accumulators() vectors in all (AVX2: 6 rows of two vectors, or 12 of one),
    # or fewer where padding M to whole tiles costs more (padded rows of A are read again in place,
    # `_clamp_rows`, where a copy of A allocated per call made Winograd's [36, 196, 64] @ [36, 64, 64]
    # 777 us in 8-row tiles over 200 rows against 330 in 7-row ones, Zen 4).
    mi = row_tile(m, accumulators() // (ni // vl))
    mt_want = 64 if order == "kout" else 32
    batch = math.prod(e.ext[p] for p in e.batch)
    if order == "gemv" and n > ni:
        # A GEMV pads nothing where N has a divisor of whole 4-lane pieces up to three vectors (1000
        # classes: 40 columns a panel on AVX-512, 20 on AVX2): padding B copied all of it every call (a
        # classifier's 5-8 MB), where the product reads it once.
        fit = [d for d in range(MIN_LANES, 3 * vl + 1, MIN_LANES) if n % d == 0]
        ni = ni if n % ni == 0 or not fit else max(fit)
        if n % ni == 0:  # strips of whole panels that divide N, up to 4
            nt_want = ni * max(d for d in range(1, 5) if (n // ni) % d == 0)
    np_, nt = _split(n, ni, nt_want)
    mp, mt = _split(m, mi, mt_want)
    # Enough tasks for every core: narrower tiles for small products (two per core balance better).
    while batch * (mp // mt) * (np_ // nt) < 2 * num_cores() and (nt > ni or mt > mi):
        if nt > ni:
            np_, nt = _split(n, ni, max(ni, nt // 2))
        else:
            mp, mt = _split(m, mi, max(mi, mt // 2))
    kp, kt = _k_chunk(k, kout_chunk(ni, cpu().vector_bytes // vl) if order == "kout" else 256)
    return Plan(mp, mt, mi, np_, nt, ni, kp, kt, order, pack)


def _symbolic_plan(e: Einsum, m, n: int, k: int) -> Plan:
    """Rows, columns or K known only at run time (codegen/symbolic.py): whole register tiles of rows (M
    padded to the tile, its padded rows reading A's last row again: `_clamp_rows`), columns in panels
    (padded), each column block of B (of each batch) a task, and each row tile too where K is one chunk
    (`_tile_rows`), K in chunks around the row tiles where it is known and long (B's block stays in L2 for
    all rows): no task boundary cuts a register tile and no predicate enters the loops."""
    vl = lanes(e.dtype)
    if not isinstance(n, int):  # columns known at run time: panels of two vectors, one a task
        ni = 2 * vl
        np_, nt = n, ni
    else:
        nv = 1 if n % (2 * vl) and n % vl == 0 else 2
        ni = nv * vl
        if n <= ni:
            ni = -(-n // vl) * vl
        # Column blocks enough, with the batch, for two tasks a core (A is read again for each block; a
        # batch known at run time counts as one).
        batch = math.prod(e.ext[q] for q in e.batch if isinstance(e.ext[q], int))
        blocks = max(1, -(-2 * num_cores() // batch))
        nt = ni * max(1, min(8, -(-n // ni) // blocks))
        np_, nt = _split(n, ni, nt)
    mi = accumulators() // (ni // vl)
    pack = _b_is_packable(e) and (not isinstance(n, int) or n > ni or e.b_dims[-1] != e.j)
    # K known at run time: one chunk.
    kp, kt = _k_chunk(k, kout_chunk(ni, cpu().vector_bytes // vl)) if isinstance(k, int) else (k, k)
    mp = m if not isinstance(m, int) else -(-m // mi) * mi
    return Plan(mp, mi, mi, np_, nt, ni, kp, kt, "rows", pack)


def _b_is_packable(e: Einsum) -> bool:
    return e.j in e.b_dims and e.k in e.b_dims


def _split(n: int, inner: int, want: int) -> tuple[int, int]:
    """(padded n, tile): tile a multiple of `inner` near `want`, padded n a multiple of the tile, little waste:
    of the chunk counts from the nearest to `want` on (up to one inner tile a chunk), the fewest that pad
    fewest inner tiles (ViT's 197 rows: 5 chunks of 40 rows, 200 rows, not 4 of 52, 208: 5.6% more work;
    its attention's 197 columns: 7 panels of 32, 224 columns, not 2 chunks of 128, 256: Q K^T 604 -> 559 us).
    A chunk may exceed `want` by less than one inner tile: 128 rows in 6-row tiles are 2 chunks of 66, not
    11 of 12, which the "kout" order would pack B for 11 times (BERT's [128, 768] @ [768, 768] 23% slower)."""
    tiles = -(-n // inner)
    base = -(-tiles // max(1, -(-want // inner)))
    chunks = min(range(base, max(2 * base, tiles) + 1), key=lambda c: (-(-tiles // c) * c - tiles, c))
    per = -(-tiles // chunks)
    return inner * per * chunks, inner * per


def _k_chunk(k: int, want: int) -> tuple[int, int]:
    """(padded K, chunk): a divisor of K near `want` when there is one, else K padded a little."""
    if k <= 2 * want:
        return k, k
    divisors = [d for d in range(want // 2, 2 * want + 1) if k % d == 0]
    if divisors:
        return k, min(divisors, key=lambda d: abs(d - want))
    return _split(k, 1, want)


def apply(sch: s_tir.Schedule, ctx: Context | None = None) -> bool:
    ctx = ctx or Context()
    e = match(sch)
    if e is None:
        return False
    names = [sch.get(b).name_hint for b in blocks(sch)]
    inline_spatial(sch, [b for b in blocks(sch)[: names.index(e.name)]])
    e = match(sch)  # the reads changed with the inlined producers
    if e is None:
        return False
    if _merge_rows(sch, e, ctx):
        e = match(sch)
        if e is None:  # (the schedule is this rule's own: the next rule starts from the function again)
            return False
    if (e.i is None or (not symbolic_rows(e) and e.ext[e.i] == 1)) and e.b_dims[-1] == e.k:
        return False  # one row against B stored [N, K]: N dot products, the row-reduction rule's
    if symbolic_rows(e) and _a_is_transposed(e):
        return False
    p, m = plan(e), e.ext[e.i] if e.i is not None else 1
    ragged = isinstance(e.ext[e.j], int) and p.np_ != e.ext[e.j]  # columns padded to whole panels
    _pad(sch, e, p)
    e = match(sch)
    assert e is not None
    # A GEMV reads a constant B in panels too: each task then streams one contiguous block of it.
    prepacked = (p.pack or p.order == "gemv") and _b_is_packable(e) and _prepack(sch, e, p, ctx)
    if e.i is not None and (p.order == "rows" or p.mp != m) and not (_a_is_transposed(e) and p.order != "rows" and p.np_ > p.ni):
        _clamp_rows(sch, e, m, ctx)
    if p.order == "rows":
        _tile_rows(sch, e, p, prepacked)
    else:
        _tile(sch, e, p, prepacked, ragged)
    return True


def _merge_rows(sch: s_tir.Schedule, e: Einsum, ctx: Context) -> bool:
    """Batch dimensions that B does not index, next to the rows in A and in C, become rows: Swin-T's
    [1, 7, 7, 768] @ [768, 3072] is 49 rows, not 7 batches of 7 rows that each stream all of B (9.4 MB
    a layer, cold in a call: 4.4 ms at 52 GFLOP/s on Zen 3) and pad their 7 rows to whole tiles. Each
    buffer indexed by those iterators side by side is viewed with them as one dim (the same bytes), and
    every block iterates the merged dim; parameters keep their shapes in the kernel's signature
    (`Context.views`). Only where the matmul is the first block and every other block an elementwise
    epilogue over C's dims writing a merged buffer (any other access stays right, through div and mod)."""
    if e.i is None or e.ext[e.k] == 1 or symbolic_rows(e):  # (a unit k would not survive the new iterators)
        return False
    run = [e.i]
    for q in reversed(e.batch):  # the batch iterators just before the rows, none of them B's
        if q in e.b_dims or q != run[0] - 1 or e.ext[q] == 1:  # (A reads a unit dim at 0: not side by side)
            break
        run.insert(0, q)
    if len(run) == 1:
        return False
    order = blocks(sch)
    rank = len(e.ext) - 1  # C's dims, then k
    if sch.get(order[0]).name_hint != e.name:
        return False
    views: list = []  # (buffer, position of the run's first dim in it)
    for b in order:
        blk = sch.get(b)
        ivs = list(blk.iter_vars)
        if len(ivs) != (rank + 1 if b is order[0] else rank) or any(
                static(ivs[q].dom.extent) != e.ext[q] or ivs[q].iter_type != SPATIAL for q in run):
            return False
        span = [ivs[q].var for q in run]
        for region in list(blk.reads) + list(blk.writes):
            at = _span_at(region.region, span)
            known = next((a for buf, a in views if buf.same_as(region.source)), None)
            if at is not None and known is None:
                views.append((region.source, at))
            elif at != known and known is not None:
                return False
    merged_bufs = [buf for buf, _ in views]
    if not any(buf.same_as(e.a_buf) for buf in merged_bufs) or not any(
            buf.same_as(sch.get(order[-1]).writes[0].source) for buf in merged_bufs):
        return False
    originals: dict[str, list[int]] = {}
    for buf in merged_bufs:
        name = param_name(sch, buf)
        if name is not None:
            if name in ctx.blocked or list(buf.strides) or name in ctx.constants:
                return False
            originals[name] = [int(d) for d in buf.shape]
    n = len(run)

    def flat(parts, sizes):  # row-major: the merged index of `parts` in dims of `sizes`
        head = parts[0]
        for x, d in zip(parts[1:], sizes[1:]):
            head = head * d + x
        return head

    def view(at: int, shape: list[int]):
        return lambda *idx: (*idx[:at], flat(idx[at : at + n], shape[at : at + n]), *idx[at + n :])

    def iters(*ivs):
        head = flat([ivs[q] for q in run], [e.ext[q] for q in run])
        return tuple(head if p == run[-1] else ivs[p] for p in range(len(ivs)) if p not in run[:-1])

    for buf, at in views:
        for b in blocks(sch):  # the first block that accesses it, by its position there
            blk = sch.get(b)
            hit = next((("write", i) for i, r in enumerate(blk.writes) if r.source.same_as(buf)), None) or next(
                (("read", i) for i, r in enumerate(blk.reads) if r.source.same_as(buf)), None)
            if hit is not None:
                sch.transform_layout(b, hit, view(at, [int(d) for d in buf.shape]))
                break
    for b in blocks(sch):
        ivs = sch.get(b).iter_vars
        sch.transform_block_layout(b, tirx.IndexMap.from_func(iters, ndim=len(ivs), index_dtype=str(ivs[0].var.ty.dtype)))
    ctx.views.update(originals)
    return True


def _span_at(region, span) -> int | None:
    """The dim at which the iterators `span` index a buffer side by side, one point each, or None."""
    for at in range(len(region) - len(span) + 1):
        if all(r.min.same_as(v) and static(r.extent) == 1 for r, v in zip(region[at : at + len(span)], span)):
            return at
    return None


def _clamp_rows(sch: s_tir.Schedule, e: Einsum, m: int, ctx: Context) -> None:
    """Rows padded to whole register tiles read A's last row again, in place, instead of a copy of A with
    zero rows made every call: a padded row of C depends on that row of A alone and is never written
    out. (ViT-B/16's 197 rows in tiles of 8: [197, 3072] @ [3072, 768] 6% slower a row than 200 rows
    with the copy, Zen 4.) Only where A is padded along its rows alone; no schedule primitive writes
    the index, so it is a rewrite of the scheduled function (`Context.post`)."""
    pad = next((b for b in blocks(sch) if sch.get(b).writes[0].source.same_as(e.a_buf)), None)
    if pad is None or e.i not in e.a_dims:
        return
    v = sch.get(pad).body.value
    if not (is_select(v) and isinstance(v.args[0], tirx.LT) and isinstance(v.args[1], TensorLoad)
            and isinstance(v.args[2], tirx.FloatImm | tirx.IntImm) and v.args[2].value == 0):
        return
    sch.compute_inline(pad)
    ctx.post.append(functools.partial(_clamp, v.args[1].source, e.a_dims.index(e.i), m))


def _clamp(a, dim: int, m: int, func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with every `if_then_else(r < m, a[.., r, ..], 0)` (r at `dim`) read as `a[.., min(r, m - 1), ..]`."""

    def clamp(call):
        if not is_select(call):
            return call
        cond, load, _ = call.args
        if not (isinstance(load, TensorLoad) and load.source.same_as(a) and isinstance(cond, tirx.LT)
                and (isinstance(cond.b, tirx.IntImm) and cond.b.value == m
                     or not isinstance(m, int) and tvm_ffi.structural_equal(cond.b, m))
                and tvm_ffi.structural_equal(cond.a, load.indices[dim])):
            return call
        idx = list(load.indices)
        last = tirx.const(m - 1, str(idx[dim].ty.dtype)) if isinstance(m, int) else m - 1
        idx[dim] = tirx.min(idx[dim], last)
        return tirx.BufferLoad(a, idx)

    return tvm_ffi.structural_map(func, [(Call, clamp)])


def _param_name(sch: s_tir.Schedule, buf) -> str | None:
    func = sch.mod["main"]
    return next((str(prm.name) for prm in func.params if prm.same_as(buf)), None)


def _prepack(sch: s_tir.Schedule, e: Einsum, p: Plan, ctx: Context) -> bool:
    """A constant B that needs no padding is read in panel layout straight from its parameter; the
    builder stores it packed once (tag "panels:<ni>:<j dim>:<k dim>") instead of every call packing it."""
    name = _param_name(sch, e.b_buf)
    if name is None or name not in ctx.constants or p.np_ != e.ext[e.j] or p.kp != e.ext[e.k]:
        return False
    c = sch.get_sblock(e.name)
    sch.transform_layout(c, ("read", read_index(sch, c, e.b_buf)), _panels(e, p.ni))
    ctx.prepack[name] = f"panels:{p.ni}:{e.b_dims.index(e.j)}:{e.b_dims.index(e.k)}"
    return True


def _panels(e: Einsum, ni: int):
    """B's index map into [.., N/ni, K, ni] panels (its other dims, batch, first)."""
    j_dim, k_dim = e.b_dims.index(e.j), e.b_dims.index(e.k)

    def panels(*idx):
        rest = [x for d, x in enumerate(idx) if d not in (j_dim, k_dim)]
        return (*rest, idx[j_dim] // ni, idx[k_dim], idx[j_dim] % ni)

    return panels


def _pad(sch: s_tir.Schedule, e: Einsum, p: Plan) -> None:
    want = {e.j: p.np_, e.k: p.kp}
    if e.i is not None:
        want[e.i] = p.mp
    if p.order == "rows":  # whole register tiles of rows; panels of columns known at run time
        def factor(q, tile):
            x = e.ext[q]
            return tile if not isinstance(x, int) else want[q] if want[q] != x else 1

        factors = [1] * len(e.ext)
        if e.i is not None:
            factors[e.i] = p.mi
        factors[e.j] = factor(e.j, p.ni)
        factors[e.k] = factor(e.k, 1)
        if any(f > 1 for f in factors):
            sch.pad_einsum(sch.get_sblock(e.name), factors)
        return
    factors = [want.get(n, 1) if want.get(n, 1) != x else 1 for n, x in enumerate(e.ext)]
    if any(f > 1 for f in factors):
        sch.pad_einsum(sch.get_sblock(e.name), factors)


def _around(sch: s_tir.Schedule, e: Einsum) -> tuple:
    """(the matmul block, the blocks before it: pads, the block that writes its result, every epilogue
    inlined into it)."""
    c = sch.get_sblock(e.name)
    order = list(blocks(sch))
    at = [sch.get(b).name_hint for b in order].index(e.name)
    before, after = order[:at], order[at + 1 :]
    for b in after[:-1]:
        sch.compute_inline(b)
    out = after[-1] if after else sch.cache_write(c, 0, "global")
    return c, before, out


def _tile(sch: s_tir.Schedule, e: Einsum, p: Plan, prepacked: bool = False, ragged: bool = False) -> None:
    c, before, out = _around(sch, e)

    loops = sch.get_loops(c)
    i = loops[e.i] if e.i is not None else sch.add_unit_loop(c)
    j, k = loops[e.j], loops[e.k]
    bl = [loops[n] for n in e.batch]
    sch.reorder(*bl, i, j, k)
    i0, i1, i2 = sch.split(i, [None, p.mt // p.mi, p.mi])
    j0, j1, j2 = sch.split(j, [None, p.nt // p.ni, p.ni])
    k0, k1 = sch.split(k, [None, p.kt])
    mid = {"kin": [i1, j1, k0, k1], "kout": [k0, i1, j1, k1], "gemv": [k0, i1, k1, j1]}[p.order]
    # Column blocks outermost: the tasks of one block of B run one after the other on a core, so B (a
    # layer's weights, cold in a call) comes from memory once and then from L2 for every row block
    # (ViT-B/16 0.96x the row-block-outer order, on Zen 4).
    sch.reorder(*bl, j0, i0, *mid, i2, j2)

    vl = lanes(e.dtype)
    if p.pack and not prepacked:
        _pack(sch, c, e, p, k0 if p.order == "kout" else None, before, vl, ragged)
    if _a_is_transposed(e) and p.np_ > p.ni:  # A is read once per panel of B: with one, packing only costs
        _pack_a(sch, c, e, p, before, vl)
    sch.reverse_compute_at(out, j1 if p.order == "kin" else i0)
    sch.parallel(sch.fuse(*bl, j0, i0))
    sch.unroll(i2)
    if p.order == "gemv":
        sch.unroll(j1)
    sch.vectorize(j2)
    init = sch.decompose_reduction(c, k0)
    try_vectorize(sch, sch.get_loops(init)[-1], p.ni)
    # Columns padded to whole panels: the write-back's predicate cuts only the last vector of the last
    # panel, which loop partitioning peels; under it every vector went a lane at a time (ViT's Q K^T,
    # 197 columns: 1.5x the time of the same product over 224).
    try_vectorize(sch, sch.get_loops(out)[-1], vl if ragged else p.ni, tail=ragged)
    for b in before:  # the pads of A (and of B when it was not packed) stay loop nests of their own
        _parallel_copy(sch, b, vl)


def _tile_rows(sch: s_tir.Schedule, e: Einsum, p: Plan, prepacked: bool) -> None:
    """The "rows" order of `_symbolic_plan`: tasks are column blocks (of each batch), and with K one
    chunk and B not packed per task, each row tile of a block too (as the static orders' row chunks);
    a tile computes one panel at a time, written back (its epilogue applied) while hot. With K in
    chunks, every row tile per chunk and the write-back once the block's last chunk is done. (Row tiles
    a task, their panels' accumulators zeroed for all panels first and written back after the last, ran
    Winograd's [36, 256, 64] @ [36, 64, 64] at 1.10-1.20x its static schedule's time, Zen 3; now 1.00-1.04.)"""
    c, before, out = _around(sch, e)
    loops = sch.get_loops(c)
    i, j, k = loops[e.i], loops[e.j], loops[e.k]
    bl = [loops[n] for n in e.batch]
    sch.reorder(*bl, i, j, k)
    i1, i2 = sch.split(i, [None, p.mi])
    j0, j1, j2 = sch.split(j, [None, p.nt // p.ni, p.ni])
    # K in one chunk: each panel of a row tile starts from zero and is written back (its epilogue applied)
    # while hot. In chunks: every row tile per chunk, B's chunk in L2 for all rows, written back after the last.
    one = not isinstance(p.kp, int) or p.kp == p.kt
    k0, k1 = sch.split(k, [1, None] if one else [None, p.kt])
    sch.reorder(*bl, j0, *((i1, j1, k0) if one else (k0, i1, j1)), k1, i2, j2)
    vl = lanes(e.dtype)
    if p.pack and not prepacked:  # the task's block of B, once per task (per chunk)
        _pack(sch, c, e, p, j0 if one else k0, before, vl)
    sch.reverse_compute_at(out, j1 if one else j0)
    sch.parallel(sch.fuse(*bl, j0, *([i1] if one and not (p.pack and not prepacked) else [])))
    sch.unroll(i2)
    sch.vectorize(j2)
    init = sch.decompose_reduction(c, k0)
    try_vectorize(sch, sch.get_loops(init)[-1], p.ni)
    try_vectorize(sch, sch.get_loops(out)[-1], p.ni)
    for b in before:
        _parallel_copy(sch, b, vl)


def _pack(sch: s_tir.Schedule, c, e: Einsum, p: Plan, at, before: list, vl: int, ragged: bool = False) -> None:
    """B -> [.., N/ni, K, ni] panels: packed once at the root, or per [KT, NT] block under `at`."""
    n = read_index(sch, c, e.b_buf)
    bp = sch.cache_read(c, n, "global")
    dims = e.b_dims
    j_dim = dims.index(e.j)
    sch.transform_layout(c, ("read", read_index(sch, c, sch.get(bp).writes[0].source)), _panels(e, p.ni))
    for b in before:  # B's zero padding goes into the pack
        if sch.get(b).writes[0].source.same_as(e.b_buf):
            sch.compute_inline(b)
            before.remove(b)
            break
    if at is not None:
        sch.compute_at(bp, at)
        loops = sch.get_loops(bp)
        at_sref = sch.get_sref(at)
        depth = next(n for n, lp in enumerate(sch.get_loops(c)) if sch.get_sref(lp).same_as(at_sref)) + 1
        inner = loops[depth:]
    else:
        inner = sch.get_loops(bp)
        sch.parallel(inner[0])
    # The packed block's loops follow B's dims (under `at`, those the batch loops outside do not fix: a
    # batched B^T, Swin-T's Q K^T); the j dim carries the contiguous panel rows.
    if at is not None and len(inner) < len(dims):
        dims = [d for d in dims if d not in e.batch]
        j_dim = dims.index(e.j)
    if j_dim == len(dims) - 1 or j_dim < len(inner):
        # (B's zero padding, inlined above, predicates the last panel's loads: peeled as the write-back's)
        try_vectorize(sch, inner[-1] if j_dim == len(dims) - 1 else inner[j_dim], vl, tail=ragged)


def _a_is_transposed(e: Einsum) -> bool:
    """A stored [.., K, M] (rows i innermost): x^T of a weight gradient, fused with its transpose."""
    return e.i is not None and len(e.a_dims) >= 2 and e.a_dims[-1] == e.i and e.k in e.a_dims


def _pack_a(sch: s_tir.Schedule, c, e: Einsum, p: Plan, before: list, vl: int) -> None:
    """A stored [.., K, M] -> [.., M/mi, K, mi] panels, once at the root. Read in place, each k of a row
    tile would load mi values a whole row of A apart; with rows of 4 KiB (M = 1024) all K of them fall
    in the same L1 sets and evict each other (a1^T @ dy ran at 63% of the speed of a @ dy)."""
    i_dim, k_dim = e.a_dims.index(e.i), e.a_dims.index(e.k)
    mi = p.mi

    def panels(*idx):
        rest = [x for d, x in enumerate(idx) if d not in (i_dim, k_dim)]
        return (*rest, idx[i_dim] // mi, idx[k_dim], idx[i_dim] % mi)

    ap = sch.cache_read(c, read_index(sch, c, e.a_buf), "global")
    sch.transform_layout(c, ("read", read_index(sch, c, sch.get(ap).writes[0].source)), panels)
    for b in before:  # A's zero padding goes into the pack
        if sch.get(b).writes[0].source.same_as(e.a_buf):
            sch.compute_inline(b)
            before.remove(b)
            break
    loops = sch.get_loops(ap)
    sch.parallel(loops[0])
    try_vectorize(sch, loops[-1], vl)


def _parallel_copy(sch: s_tir.Schedule, b, vl: int) -> None:
    loops = sch.get_loops(b)
    if not loops:
        return
    if len(loops) > 1:
        sch.parallel(sch.fuse(*loops[:-1]))
    try_vectorize(sch, loops[-1], vl)
