"""Helpers the CPU rules share: blocks and loops by role, static extents, vector width of the host; the conv
and depthwise rules' input copies and heavy epilogues."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tvm import s_tir, tirx

from compiler.codegen.sblocks import SPATIAL, blocks, count_nodes, inline_spatial, is_select, is_spatial  # noqa: F401  (the rules use them from here)
from compiler.codegen.target import cpu

REDUCE = 2  # IterVar.iter_type of a reduction iterator (CommReduce)


@dataclass
class Context:
    """What a rule may know beyond the PrimFunc, and what it reports back.

    constants: names of parameters whose values are fixed at build time (weights bound as params).
    prepack: filled by a rule that reads such a parameter in another layout; name -> layout tag
    (see schedule_cpu.prepack): the builder must store the constant transformed accordingly.
    blocked: names of the 4-D parameters stored channel-blocked ([N, C/c, H, W, c], codegen/layout.py),
    by their block width c. The rule schedules the function as NCHW; the parameters' layout is
    transformed after it (`schedule_cpu.block_params`), whatever the rule did.
    native: filled by the rule with the blocked parameters its schedule reads or writes as blocks (no
    gather along the channels, no pack, no transposing write-back).
    post: filled by the rule with rewrites of the scheduled function that no schedule primitive
    expresses (the matmul rule's padded rows reading A's last row again), applied in order after it.
    views: filled by a rule that reads a compact parameter as another shape of the same bytes (the matmul
    rule's batch dims merged into rows): name -> the shape the caller passes, which the signature keeps.
    """

    constants: frozenset[str] = frozenset()
    prepack: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, int] = field(default_factory=dict)
    native: set[str] = field(default_factory=set)
    post: list[Callable[[tirx.PrimFunc], tirx.PrimFunc]] = field(default_factory=list)
    views: dict[str, list[int]] = field(default_factory=dict)

    def block_of(self, sch: s_tir.Schedule, buf) -> int:
        """The block width of the parameter `buf` (a buffer of the function) if it is stored blocked, else 0."""
        name = param_name(sch, buf)
        return self.blocked.get(name, 0) if name is not None else 0


def param_name(sch: s_tir.Schedule, buf) -> str | None:
    """The name of the function parameter whose buffer is `buf`, or None for an intermediate buffer."""
    return next((str(p.name) for p in sch.mod["main"].params if p.same_as(buf)), None)


def single_reduction(sch: s_tir.Schedule, spatial: int, reduce: int, batch: bool = False):
    """(block, its iter_vars, their static extents) if the function's one reduction block has `spatial`
    spatial iterators then `reduce` reduction ones, every extent static, and an init; else None.
    `batch`: the first extent may be known only at run time (a size variable: codegen/symbolic.py), given
    as its expression."""
    reductions = [b for b in blocks(sch) if any(iv.iter_type == REDUCE for iv in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    blk = sch.get(reductions[0])
    ivs = list(blk.iter_vars)
    ext = [static(iv.dom.extent) for iv in ivs]
    if batch and ext and ext[0] is None:
        ext[0] = ivs[0].dom.extent
    if [iv.iter_type == REDUCE for iv in ivs] != [False] * spatial + [True] * reduce or None in ext or blk.init is None:
        return None
    return blk, ivs, ext


def coefficient(e, var) -> int | None:
    """d e / d var where e is linear in var with a constant coefficient (an input column's stride along
    the output column), else None."""
    from tvm.sym import detect_linear_equation

    coeffs = detect_linear_equation(e, [var])
    return static(coeffs[0]) if len(coeffs) == 2 else None


def read_index(sch: s_tir.Schedule, block, buf) -> int:
    """The position of `buf` among the block's reads (what cache_read and transform_layout address it by)."""
    return next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(buf))


def extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def static(e) -> int | None:
    return int(e) if isinstance(e, tirx.IntImm) else None


def symbolic(sch: s_tir.Schedule) -> bool:
    """Whether the kernel has extents known only at run time (size variables: codegen/symbolic.py)."""
    attrs = sch.mod["main"].attrs
    return attrs is not None and "gc.sizes" in attrs


def try_vectorize(sch: s_tir.Schedule, loop, lanes: int, tail: bool = False) -> None:
    """Vectorize `loop`, split to `lanes` first when it is longer; a loop TVM refuses stays scalar.
    Where `lanes` does not divide it, TVM's loop partitioning peels the last, predicated piece off (the
    hint), so the others are whole vectors: TVM scalarizes a vector loop under a predicate (softmax rows
    of 197 or 208 ran their exp one lane at a time). `tail`: the loop's body is predicated by a padding
    that its extent does not show (a padded matmul's last panel of columns), so it is split and hinted
    even where `lanes` divides it."""
    n = extent(sch, loop)
    if n is None and lanes > 1 and symbolic(sch):  # known at run time (codegen/symbolic.py): the tail peeled
        try:
            outer, inner = sch.split(loop, [None, lanes])
            sch.annotate(outer, "pragma_loop_partition_hint", 1)
            sch.vectorize(inner)
        except Exception:  # noqa: BLE001
            pass
        return
    if n is None or n < 2:
        return
    try:
        if n > lanes:
            outer, loop = sch.split(loop, [None, lanes])
            if n % lanes or tail:
                sch.annotate(outer, "pragma_loop_partition_hint", 1)
        sch.vectorize(loop)
    except Exception:  # noqa: BLE001 (gathers, data-dependent indices)
        pass


def lanes(dtype: str) -> int:
    """Elements of `dtype` in one vector register of the CPU kernels are built for."""
    return cpu().lanes(dtype)


MIN_LANES = 4  # an SSE register of f32: narrower vectors are not worth a vector schedule


def vector_dividing(n: int, dtype: str) -> int:
    """The widest vector (in elements: a whole register, or a half or quarter of one, down to MIN_LANES)
    that divides n, or 0. On AVX-512 a conv of 24 or 40 output channels takes 8-lane (AVX2-width)
    vectors rather than leaving the vector schedule."""
    w = lanes(dtype)
    while w > MIN_LANES and n % w:
        w //= 2
    return w if n % w == 0 else 0


# --- shared by the conv and depthwise rules ---------------------------------------------------------

# The input's copy (padded or packed) runs on one core below this many elements: waking the thread pool
# for a second parallel region costs more than the copy.
PARALLEL_COPY = 1 << 13
# Epilogues of more nodes than this run on whole vectors before the NCHW write-back (`epilogue_on_vectors`).
HEAVY_EPILOGUE = 64


def heavy_epilogue(sch: s_tir.Schedule, out) -> bool:
    """Whether the write-back computes more than a bias, a residual and an activation: SiLU's sigmoid and
    GELU's erf are polynomials of some hundred nodes once inlined."""
    value = getattr(sch.get(out).body, "value", None)
    return value is not None and count_nodes(value, HEAVY_EPILOGUE + 1) > HEAVY_EPILOGUE


def epilogue_on_vectors(sch: s_tir.Schedule, out, tile_loop, vl: int):
    """A heavy epilogue runs on the tile's accumulators as they lie, whole vectors of output channels a
    pixel, into a small buffer of the tile in pixel-major order; a copy then writes it to NCHW, the
    transpose the write-back does anyway. In the NCHW write-back the epilogue ran on vectors of the
    tile's 4 pixels, a quarter of a register (SiLU after 1x1 16->96 at 112x112: 956 -> 585 us; 40->240 at
    28x28: 216 -> 139 us, Zen 4 AVX-512; after a bias alone the extra pass costs 311 -> 494 us, hence
    only for heavy epilogues). Into a channel-blocked output too, with `vl` the tile's channels (two
    vectors): written block by block, the epilogue's ~20-deep chain of dependent operations ran one vector
    at a time, and the out-of-order window held about three such chains; two vectors an operation, LLVM
    interleaves them (EfficientNet-B0's SiLU convs as AVX2 code 0.91x, its calls 0.97x; AVX-512 1.00x;
    Zen 4). Returns the copy, the block that now writes the output."""
    copy = sch.cache_write(out, 0, "local")
    sch.reverse_compute_at(copy, tile_loop)
    sch.transform_layout(out, ("write", 0), lambda a, b, h, w: (a, h, w, b))
    channels, pixels = sch.get_loops(out)[-2:]
    sch.reorder(pixels, channels)
    try_vectorize(sch, channels, vl)
    sch.unroll(pixels)
    return copy


def blocked_write_back(sch: s_tir.Schedule, out, ctx: Context, c: int, channels: int, pixels: int | None) -> None:
    """The write-back of a tile into a channel-blocked output: pixel by pixel, each pixel's channels a
    vector of c (the epilogue on whole vectors too). Its last two loops must be the tile's `channels`
    then its pixels (`pixels` of them; None: the whole map, not unrolled); where they are, the output
    and the blocked tensors the epilogue reads (a residual) are `ctx.native`."""
    loops = sch.get_loops(out)
    if len(loops) < 2 or extent(sch, loops[-2]) != channels or (pixels and extent(sch, loops[-1]) != pixels):
        return
    ch, px = loops[-2:]
    sch.reorder(px, ch)
    if channels > c:
        ch = sch.split(ch, [None, c])[1]
        sch.unroll(sch.get_loops(out)[-2])
    sch.vectorize(ch)
    if pixels:
        sch.unroll(px)
    blk = sch.get(out)
    for r in (*blk.writes, *blk.reads):
        if ctx.block_of(sch, r.source) == c:
            ctx.native.add(param_name(sch, r.source))


def large_copy(sch: s_tir.Schedule, loops) -> bool:
    """Whether a copy over `loops` moves PARALLEL_COPY elements or more (an unknown extent counts as large)."""
    size = 1
    for loop in loops:
        size *= extent(sch, loop) or PARALLEL_COPY
    return size >= PARALLEL_COPY


def pack_loops(sch: s_tir.Schedule, b, cb: int, vl: int) -> None:
    """The NCHW -> NCHW[cb]c copy: parallel over (n, channel block, row), channels of a block innermost."""
    i_n, i_c, i_h, i_w = sch.get_loops(b)
    large = large_copy(sch, [i_n, i_c, i_h, i_w])
    co, cc = sch.split(i_c, [None, cb])
    sch.reorder(i_n, co, i_h, i_w, cc)
    rows = sch.fuse(i_n, co, i_h)
    if large:
        sch.parallel(rows)
    try_vectorize(sch, cc, vl)
