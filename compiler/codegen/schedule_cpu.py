"""CPU schedules, chosen per kernel by rules on its anchor op's kind and the shape of its blocks.

Each rule (compiler/codegen/cpu_rules/) recognises its kernel from the PrimFunc and schedules it, or
declines; a rule that declines or raises leaves no trace, since it worked on a schedule of its own.
The fallback here is safe for any PrimFunc: inline the intermediate injective stages, run the outer
spatial loops in parallel over all cores, vectorize the innermost spatial loop.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable, Collection, Mapping

import numpy as np
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from compiler.codegen.cpu_rules import conv2d, depthwise, matmul, pool, reduction, rewrite, winograd
from compiler.codegen.cpu_rules.common import Context, extent, lanes, symbolic
from compiler.codegen.layout import Blocked
from compiler.codegen.sblocks import (
    Schedule,
    blocks,
    inline_spatial,
    is_select,
    is_spatial,
    leading_spatial_loops,
    redeclare_params,
    sub_expressions,
    uses,
)
from compiler.diagnostics import GCError

VECTOR = 16  # f32 lanes of two AVX2 registers; LLVM splits wider vectors as needed

RULES = {
    "out-elementwise-fusable": [("winograd", winograd.apply_output), ("matmul", matmul.apply), ("conv2d", conv2d.apply), ("depthwise", depthwise.apply),
                                ("pool", pool.apply), ("planes", reduction.apply_planes), ("rows", reduction.apply)],
    "reduction": [("planes", reduction.apply_planes), ("rows", reduction.apply), ("columns", reduction.apply_columns)],
    "opaque": [("winograd", winograd.apply_input)],
}


def schedule(
    prim: tirx.PrimFunc, kind: str, constants: Collection[str] = (), unaligned: bool = False,
    blocked: Mapping[int, Blocked] | None = None,
) -> tirx.PrimFunc:
    """The first rule for `kind` that fits the kernel, else the generic schedule; the attribute
    `gc.schedule` names the one used.

    `constants` names the parameters whose values are known at build time (weights bound with
    params=...). A rule may then read one of them in a packed layout straight from the parameter;
    the result's attribute `gc.prepack` maps each such name to a layout tag, and the builder must
    pass `prepack(value, tag)` for that parameter instead of the value itself (the parameter's
    shape changes accordingly).

    `unaligned` declares the parameters aligned to their element size only, so that the kernel
    takes NumPy arrays as they come (malloc aligns to 16 bytes, TVM assumes 64); the attribute
    `gc.unaligned` says it was done.

    `blocked` maps parameter positions to the channel-blocked layout they are stored in (codegen/
    layout.py): those parameters become [N, C/c, H, W, c], strided as given. The attribute `gc.native`
    lists the positions the schedule reads or writes as blocks (the rest it reads right, but slowly).
    """
    relaxed = False
    try:
        prim = rewrite.rewrite(prim, unaligned=unaligned)  # exp, erf, tanh as vector polynomials in every kernel
        relaxed = unaligned
    except Exception:  # noqa: BLE001 (a kernel the rewrite cannot map stays as it was)
        pass
    blocked = dict(blocked or {})
    by_name = {str(prim.params[i].name): i for i in blocked}
    for name, rule in RULES.get(kind, []):
        sch = Schedule(prim)
        ctx = Context(frozenset(constants), blocked={n: blocked[i].c for n, i in by_name.items()})
        try:
            if rule(sch, ctx):
                sch = block_params(sch, blocked)
                done = _done(sch, name, relaxed, blocked, [by_name[n] for n in ctx.native], ctx.post)
                if ctx.views:  # by position: the signature's shape of a parameter read as a view
                    at = {str(q.name): i for i, q in enumerate(done.params)}
                    done = done.with_attr("gc.views", {at[n]: shape for n, shape in ctx.views.items()})
                return done.with_attr("gc.prepack", ctx.prepack) if ctx.prepack else done
        except Exception:  # noqa: BLE001 (a fast rule that does not fit must never fail the compile)
            if os.environ.get("GC_DEBUG_RULES"):
                traceback.print_exc()
    sch = Schedule(prim)
    try:
        sch = block_params(sch, blocked)
        sch = _choices_by_block(sch, blocked)
        native = _fallback(sch, blocked)
    except Exception:  # noqa: BLE001 (the loop nest as written still compiles, just slowly)
        sch = block_params(Schedule(prim), blocked)
        return _done(sch, "none", relaxed, blocked, [])
    return _done(sch, "generic", relaxed, blocked, native)


def _width_of(sch: s_tir.Schedule, blocked: Mapping[int, Blocked]):
    """buffer -> the block width of the blocked parameter it is, 0 for any other buffer."""
    params = sch.mod["main"].params
    widths = [(params[i], b.c) for i, b in blocked.items()]
    return lambda buf: next((c for p, c in widths if p.same_as(buf)), 0)


def _choices_by_block(sch: s_tir.Schedule, blocked: Mapping[int, Blocked]) -> s_tir.Schedule:
    """A block choosing its operand by channel (a concat, with what follows it fused) that writes a blocked
    tensor iterates it block by block, and its choices are simplified with the lane's bounds: with every
    operand a whole number of blocks, `co * c + ci < B` is `co < B / c`, made once a channel block, not
    once a lane (TVM evaluates a condition that varies within a vector lane by lane). Returns a schedule
    of the rewritten function (`sch` itself where there is no such block)."""
    import tvm_ffi
    from tvm.ir.expr import Call
    from tvm.sym import Analyzer

    if not blocked:
        return sch
    inline_spatial(sch, blocks(sch)[:-1], keep_costly=COSTLY)
    width_of = _width_of(sch, blocked)
    analyzer, done = Analyzer(), False
    for b in blocks(sch):
        blk = sch.get(b)
        value = getattr(blk.body, "value", None)
        c = width_of(blk.writes[0].source)
        if not c or value is None or len(sch.get_loops(b)) != 4 or not is_spatial(sch, b):
            continue
        if not any(is_select(x) for x in sub_expressions(value)):
            continue
        sch.transform_block_layout(b, blocks_of(c))
        for iv in sch.get(b).iter_vars:
            analyzer.bind(iv.var, iv.dom)
        done = True
    if not done:
        return sch

    def simplify(call):
        return tirx.if_then_else(analyzer.simplify(call.args[0]), *call.args[1:]) if is_select(call) else call

    return Schedule(tvm_ffi.structural_map(sch.mod["main"], [(Call, simplify)]))


def block_params(sch: s_tir.Schedule, blocked: Mapping[int, Blocked]) -> s_tir.Schedule:
    """A schedule of the function with the parameters at the given positions stored [N, C/c, H, W, c]: every
    load, store and block region of them rewritten in one structural map, the new indices simplified with
    the blocks' iterator domains as transform_layout does (which rewrote the whole function once a
    parameter: 2 ms each, a DenseNet concat of 30 operands 60 ms; DenseNet-121's 1.66 -> 0.37 s). The
    strides of a bordered interior are declared later (`_done`)."""
    import tvm_ffi
    from tvm.ir import Range
    from tvm.ir.expr import TensorRegion, Var
    from tvm.sym import Analyzer

    if not blocked:
        return sch
    func = sch.mod["main"]
    analyzer = Analyzer()
    for b in blocks(sch):
        for iv in sch.get(b).iter_vars:
            analyzer.bind(iv.var, iv.dom)
    simplify = analyzer.simplify
    new, width = {}, {}  # old parameter -> the 5-D one; either -> its block width
    for i, bl in blocked.items():
        p = func.params[i]
        n, ch, h, w = p.shape
        new[p] = tirx.decl_buffer((n, ch // bl.c, h, w, bl.c), p.dtype, p.name, data_alignment=p.data_alignment,
                                  scope=p.scope())
        width[p] = width[new[p]] = bl.c

    def index(idx, c: int) -> list:
        n, ch, h, w = idx
        return [simplify(n), simplify(tirx.floordiv(ch, c)), simplify(h), simplify(w), simplify(tirx.floormod(ch, c))]

    def four(what, src, n: int) -> bool:
        if src not in width:
            return False
        if n not in (4, 5):  # an NCHW access of another rank would read the blocked bytes wrongly, unnoticed
            raise ValueError(f"a {what} of blocked {src.name} with {n} indices")
        return n == 4  # 5: already the blocked buffer's (a rewritten node met again)

    def load(ld):
        src = ld.source
        return tirx.BufferLoad(new.get(src, src), index(ld.indices, width[src])) if four("load", src, len(ld.indices)) else ld

    def store(st):
        buf = st.buffer
        if not four("store", buf, len(st.indices)):
            return st
        return tirx.BufferStore(new.get(buf, buf), st.value, index(st.indices, width[buf]))

    def region(r):
        src = r.source
        if not four("region", src, len(r.region)):
            return r
        c = width[src]
        n, ch, h, w = r.region
        lo, hi = simplify(tirx.floordiv(ch.min, c)), simplify(tirx.floordiv(ch.min + ch.extent - 1, c))
        return tirx.BufferRegion(new.get(src, src), [n, Range.from_min_extent(lo, simplify(hi - lo + 1)), h, w,
                                                     Range.from_min_extent(0, c)])

    # Vars first (the parameters themselves), then what reads and writes them, whichever var they hold.
    return Schedule(tvm_ffi.structural_map(func, [(Var, lambda v: new.get(v, v)), (TensorLoad, load),
                                                  (tirx.BufferStore, store), (TensorRegion, region)]))


def blocks_of(c: int):
    """The index map NCHW -> NCHW[c]c."""
    return lambda n, ch, h, w: (n, ch // c, h, w, ch % c)


def _done(sch: s_tir.Schedule, rule: str, unaligned: bool, blocked: Mapping[int, Blocked],
          native: Collection[int], post: Collection[Callable[[tirx.PrimFunc], tirx.PrimFunc]] = ()) -> tirx.PrimFunc:
    func = rewrite.nan_kept_by_product(sch.mod["main"])
    for edit in post:
        func = edit(func)
    if blocked:
        func = redeclare_params(func, {i: b.strides or () for i, b in blocked.items()})
    if func.attrs is not None and "gc.borders" in func.attrs:
        func = write_borders(func, blocked)
    func = func.with_attr("tirx.is_scheduled", True).with_attr("gc.schedule", rule)
    if native:
        func = func.with_attr("gc.native", sorted(int(i) for i in native))
    return func.with_attr("gc.unaligned", True) if unaligned else func


def write_borders(func: tirx.PrimFunc, blocked: Mapping[int, Blocked]) -> tirx.PrimFunc:
    """`func` writing, after its own loops, the zero border of each output its `gc.borders` attribute
    names (parameter position -> pads): a bordered tensor in the arena, whose border bytes other tensors
    use at other times (plan-memory's borders-in-arena). The parameter is the interior, strided as the
    padded buffer, so the border lies just outside it, at flat offsets the stores use as they are.
    After the kernel's loops, and parallel over planes as they are, so the lines the border shares with
    the interior rows are still in the cache of the core that wrote them (before the loops, or on one
    core: ShuffleNetV2 1.05x the time of borders written never; so, 1.02x)."""
    from tvm.s_tir import stmt as ss

    from compiler.codegen.layout import blocked_pads

    stores = []
    for at, pads in func.attrs["gc.borders"].items():
        i = int(at)
        pads = [int(p) for p in pads]
        stores.append(_border_stores(func.params[i], blocked_pads(pads) if i in blocked else pads))
    root = func.body.block
    zero = ss.SBlockRealize([], True, ss.SBlock([], [], [], "write_border", _seq(stores)))
    body = ss.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt([root.body, zero]),
                     root.init, root.alloc_buffers, root.match_buffers, root.annotations)
    return func.with_body(ss.SBlockRealize(func.body.iter_values, func.body.predicate, body))


def _border_stores(buf, pads: list[int]) -> tirx.Stmt:
    """Zeros into the border of `buf` (a bordered interior) padded on two neighbouring dims at most (H and
    W, in NCHW or NCHW[c]c). In the padded buffer's bytes the border is a few runs a plane: the rows above
    and the first row's left, then right-of-one-row-and-left-of-the-next between interior rows (two
    elements for a 1-wide border, a vector each side for a channel block), then the last row's right and
    the rows below. Each run is stored at flat offsets from the interior's first element, indexed along
    the last dim (stride 1), so no index names a dim it does not belong to beyond the buffer's bytes."""
    rank = len(buf.shape)
    lo, hi = pads[:rank], pads[rank:]
    padded = [d for d in range(rank) if lo[d] or hi[d]]
    if padded == [0] or len(padded) > 2 or padded[-1] - padded[0] > 1:
        raise GCError(f"internal error: a border on dims {padded} (two neighbouring dims but the first at most); "
                      "please report it with the input file")
    hd, wd = padded[-1] - 1, padded[-1]  # (the rows' dim unpadded where only one dim is)
    # (Planes may be a size variable, a batch known at run time: lower.lower_kernel keeps the rest static.)
    shape = [int(d) if isinstance(d, tirx.IntImm) else d for d in buf.shape]
    inner = math.prod(shape[wd + 1 :])  # elements of one pixel: 1 (NCHW) or a channel block
    planes = math.prod(shape[:hd])
    top, bottom, left, right = lo[hd], hi[hd], lo[wd] * inner, hi[wd] * inner
    width = left + shape[wd] * inner + right  # one padded row
    plane = (top + shape[hd] + bottom) * width
    origin = top * width + left  # the interior's first element, from the padded buffer's start
    vector = inner if inner > 1 else lanes(str(buf.dtype))  # a channel block, or the host's vector
    q = tirx.Var("q", "int32")

    def run(start, length: int, name: str) -> list[tirx.Stmt]:
        """Zeros at flat offsets start .. start + length of the padded buffer, a vector at a time."""
        out = []
        for first, count, width_ in ((0, length // vector, vector), (length // vector * vector, 1, length % vector)):
            if not count or not width_:
                continue
            j, v = tirx.Var(f"{name}_j", "int32"), tirx.Var(f"{name}_v", "int32")
            at = start - origin + first + (j * width_ if count > 1 else 0) + v
            stmt = tirx.BufferStore(buf, tirx.const(0, buf.dtype), [*[0] * (rank - 1), at])
            stmt = tirx.For(v, 0, width_, tirx.ForKind.VECTORIZED if width_ > 1 else tirx.ForKind.SERIAL, stmt)
            out.append(tirx.For(j, 0, count, tirx.ForKind.SERIAL, stmt) if count > 1 else stmt)
        return out

    base = q * plane
    stmts = run(base, origin, "above") if origin else []
    if left + right and shape[hd] > 1:
        h = tirx.Var("h", "int32")
        gap = base + (top + h) * width + left + shape[wd] * inner
        stmts.append(tirx.For(h, 0, shape[hd] - 1, tirx.ForKind.SERIAL, _seq(run(gap, right + left, "sides"))))
    last = base + (top + shape[hd] - 1) * width + left + shape[wd] * inner
    if right + bottom * width:
        stmts += run(last, right + bottom * width, "below")
    return tirx.For(q, 0, planes, tirx.ForKind.PARALLEL, _seq(stmts))


def _seq(stmts: list) -> tirx.Stmt:
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def prepack(value: np.ndarray, tag: str) -> np.ndarray:
    """A constant in the layout a rule reads it in (see `schedule`'s `constants`)."""
    kind, *args = tag.split(":")
    if kind == "panels":  # B[.., K, N] (any dim order) -> [.., N/ni, K, ni]
        ni, j_dim, k_dim = (int(a) for a in args)
        rest = [d for d in range(value.ndim) if d not in (j_dim, k_dim)]
        x = value.transpose(*rest, j_dim, k_dim)  # [.., N, K]
        *lead, n, k = x.shape
        return np.ascontiguousarray(x.reshape(*lead, n // ni, ni, k).swapaxes(-1, -2))
    if kind == "conv":  # W[O, C, KH, KW] -> [O/ob, C/cb, KH, KW, cb, ob]
        ob, cb = (int(a) for a in args)
        o, c, kh, kw = value.shape
        x = value.reshape(o // ob, ob, c // cb, cb, kh, kw)
        return np.ascontiguousarray(x.transpose(0, 2, 4, 5, 3, 1))
    raise ValueError(f"unknown packed layout {tag}")


COSTLY = 48  # expression nodes from which a stage read several times by one consumer is stored, not inlined


def _fallback(sch: s_tir.Schedule, blocked: Mapping[int, Blocked]) -> list[int]:
    """The generic schedule; returns the blocked parameters it reads and writes as blocks: all of them where
    every block touching one writes a blocked parameter, iterated block by block (an elementwise kernel
    between convs), else none."""
    inline_spatial(sch, blocks(sch)[:-1], keep_costly=COSTLY)
    width_of = _width_of(sch, blocked)
    native = bool(blocked)
    for b in blocks(sch):
        loops = sch.get_loops(b)
        if not loops:
            continue
        blk = sch.get(b)
        if any(width_of(r.source) for r in (*blk.reads, *blk.writes)):
            c = width_of(blk.writes[0].source)
            if c and is_spatial(sch, b) and not _reads_unblocked(blk) and _blocked_loops(sch, b, c, loops):
                continue
            native = False
        if is_spatial(sch, b):
            j = _transposed_partner(sch, b, loops)
            if j is not None:
                _tile_transpose(sch, loops, j)
            elif not _split_at_conditions(sch, b, loops) and not _split_at_broadcast(sch, b, loops):
                _parallel_vectorize(sch, b, loops)
        else:
            _parallel_outer(sch, b, loops)
    return list(blocked) if native else []


def _reads_unblocked(blk) -> bool:
    """Whether the block reads a 4-D map (more than one pixel) that is not blocked: across its channels
    that is a gather."""
    return any(len(r.source.shape) == 4 and int(r.source.shape[2]) * int(r.source.shape[3]) > 1 for r in blk.reads)


def _blocked_loops(sch: s_tir.Schedule, b, c: int, loops) -> bool:
    """A block writing a blocked tensor iterates it block by block: (image, channel block, row) in parallel,
    a pixel's c channels as one vector. An elementwise block is iterated so here; a concat's was by
    `_choices_by_block`, and is taken only where its choices depend on the channel block alone. False
    where they do not (nothing changed)."""
    if len(loops) == 4:
        if any(is_select(x) for x in sub_expressions(sch.get(b).body.value)):
            return False
        sch.transform_block_layout(b, blocks_of(c))
    blk = sch.get(b)
    ivs = [iv.var for iv in blk.iter_vars]
    if len(ivs) != 5:
        return False
    conds = [x.args[0] for x in sub_expressions(blk.body.value) if is_select(x)]
    if any(uses(cond, v) for cond in conds for v in ivs[2:]):
        return False
    i_n, i_co, i_h, _, i_c = sch.get_loops(b)
    sch.parallel(sch.fuse(i_n, i_co, i_h))
    sch.vectorize(i_c)
    return True


TILE = 8  # a transposing copy moves 8x8 tiles: 8 rows read, 8 contiguous vectors written


def _transposed_partner(sch: s_tir.Schedule, b, loops) -> int | None:
    """For a copy that transposes (an input read with the innermost output index anywhere but last, the
    last input index made of another output index): that other index's loop position, else None. Its
    loads would be gathers down a column, one cache line per element; `_tile_transpose` fixes that."""
    blk = sch.get(b)
    ivs = [iv.var for iv in blk.iter_vars]
    if len(ivs) != len(loops) or len(ivs) < 2 or not isinstance(blk.body, tirx.BufferStore):
        return None
    exts = [extent(sch, lp) for lp in loops]
    # (The innermost extent may be known only at run time: its last tile is peeled, `_tile_transpose`.)
    if any(e is None for e in exts[:-1]) or (exts[-1] % TILE if exts[-1] is not None else not symbolic(sch)):
        return None
    last = ivs[-1]
    for ld in (x for x in sub_expressions(blk.body.value) if isinstance(x, TensorLoad)):
        idx = list(ld.indices)
        mentions = [uses(i, last) for i in idx]
        if not idx or mentions[-1] or not any(mentions):
            continue
        inner = [k for k, v in enumerate(ivs[:-1]) if uses(idx[-1], v)]
        if inner and exts[inner[-1]] % TILE == 0:
            return inner[-1]
    return None


def _tile_transpose(sch: s_tir.Schedule, loops, j: int) -> None:
    """TILE x TILE tiles over loop j and the innermost loop, tiles in parallel, each written a vector a
    row (the K transpose of the transformer block: 21.7 -> 5.0 us)."""
    jo, ji = sch.split(loops[j], [None, TILE])
    symbolic = extent(sch, loops[-1]) is None
    lo, li = sch.split(loops[-1], [None, TILE])
    if symbolic:
        sch.annotate(lo, "pragma_loop_partition_hint", 1)
    rest = [lp for k, lp in enumerate(loops[:-1]) if k != j]
    sch.reorder(*rest, jo, lo, ji, li)
    sch.parallel(sch.fuse(*rest, jo))
    sch.unroll(ji)
    sch.vectorize(li)


def _split_at_conditions(sch: s_tir.Schedule, b, loops) -> bool:
    """A block choosing what it reads by outer indices only (a concat along channels: which operand a plane
    comes from): the loops up to the last such index run in parallel, the rest as one vector loop, so the
    choice is made once a plane and the plane is a plain copy (DenseNet's concat + batch_norm + relu of 8
    operands of 32x28x28: 571 -> 25 us). False where there is no such choice."""
    blk = sch.get(b)
    ivs = [iv.var for iv in blk.iter_vars]
    if len(ivs) != len(loops) or len(ivs) < 2:
        return False
    conds = [x.args[0] for x in sub_expressions(blk.body.value) if is_select(x)]
    if not conds:
        return False
    used = [k for k, v in enumerate(ivs) if any(uses(c, v) for c in conds)]
    last = max(used)
    if last == len(ivs) - 1:
        return False  # the choice varies along the innermost loop: the generic schedule
    _parallel_then_vector(sch, loops, last + 1)
    return True


def _split_at_broadcast(sch: s_tir.Schedule, b, loops) -> bool:
    """An elementwise block with an operand broadcast along trailing dims (squeeze-and-excitation's scale,
    [N, C, 1, 1] times [N, C, H, W]): the innermost loops over which every operand is either the same
    element or contiguous run as one vector loop, the rest in parallel. Fused whole and cut into vectors,
    the broadcast operand's index changes within a vector as far as TVM knows, so each vector read it as
    a gather of 16 lanes, with a division per lane (144 x 56 x 56: 344 -> 24 us). False where every
    operand is contiguous throughout (the generic schedule is right) or nothing fits."""
    blk = sch.get(b)
    ivs = [iv.var for iv in blk.iter_vars]
    if len(ivs) != len(loops) or len(ivs) < 2 or not isinstance(blk.body, tirx.BufferStore):
        return False
    loads = [x for x in sub_expressions(blk.body.value) if isinstance(x, TensorLoad)]

    def fits(ld, suffix) -> bool:
        idx = list(ld.indices)
        used = [any(uses(i, v) for v in suffix) for i in idx]
        if not any(used):
            return True  # the same element throughout the suffix
        tail = idx[len(idx) - len(suffix):]
        return (len(idx) >= len(suffix) and not any(used[: len(idx) - len(suffix)])
                and all(i.same_as(v) for i, v in zip(tail, suffix)))

    cut = len(ivs)
    while cut > 0 and all(fits(ld, ivs[cut - 1 :]) for ld in loads):
        cut -= 1
    exts = [extent(sch, lp) for lp in loops]
    if cut == 0 or cut == len(ivs) or None in exts or int(np.prod(exts[cut:])) < VECTOR // 2:
        return False
    _parallel_then_vector(sch, loops, cut)
    return True


def _parallel_then_vector(sch: s_tir.Schedule, loops, cut: int) -> None:
    """loops[:cut] fused and in parallel, loops[cut:] fused into one vector loop: whole vectors where
    VECTOR divides it, else pieces of its widest divisor up to four vectors (the whole of a shorter one)."""
    outer = sch.fuse(*loops[:cut]) if cut > 1 else loops[0]
    inner = sch.fuse(*loops[cut:]) if cut < len(loops) - 1 else loops[-1]
    sch.parallel(outer)
    n = extent(sch, inner) or 0
    width = VECTOR if n % VECTOR == 0 else max(d for d in range(1, min(n, 4 * VECTOR) + 1) if n % d == 0)
    if width < n:
        inner = sch.split(inner, [None, width])[1]
    if n > 1:
        sch.vectorize(inner)


def _parallel_vectorize(sch: s_tir.Schedule, b, loops) -> None:
    exts = [extent(sch, lp) for lp in loops]
    if None in exts and symbolic(sch):  # sizes known at run time (codegen/symbolic.py): vectors over static inner loops
        k = len(loops)
        while k > 0 and exts[k - 1] is not None:
            k -= 1
        n = math.prod(exts[k:]) if k < len(loops) else 0
        if n >= VECTOR and n % VECTOR == 0:
            inner = sch.fuse(*loops[k:]) if len(loops) - k > 1 else loops[k]
            outer, vec = sch.split(inner, [None, VECTOR])
            sch.parallel(sch.fuse(*loops[:k], outer))
            try:
                sch.vectorize(vec)
            except Exception:  # noqa: BLE001
                pass
        else:
            sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    n = extent(sch, fused) or 0
    if n >= 2 * VECTOR and n % VECTOR == 0:
        outer, inner = sch.split(fused, [None, VECTOR])
        sch.parallel(outer)
        try:
            sch.vectorize(inner)
        except Exception:  # noqa: BLE001 (e.g. a gather whose index is data: leave it scalar)
            pass
    elif n > 1:
        sch.parallel(fused)


def _parallel_outer(sch: s_tir.Schedule, b, loops) -> None:
    """Reductions: run the leading spatial loops in parallel."""
    spatial = leading_spatial_loops(sch, b)
    if not spatial:
        return
    try:
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        sch.parallel(fused)
    except Exception:  # noqa: BLE001 (loops not in the block's iterator order: leave them serial)
        pass
