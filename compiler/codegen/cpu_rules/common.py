"""Helpers the CPU rules share: blocks and loops by role, static extents, vector width of the host."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import s_tir, tirx

from compiler.codegen.sblocks import SPATIAL, blocks, inline_spatial, is_spatial  # noqa: F401  (the rules use them from here)
from compiler.codegen.target import cpu

REDUCE = 2  # IterVar.iter_type of a reduction iterator (CommReduce)


@dataclass
class Context:
    """What a rule may know beyond the PrimFunc, and what it reports back.

    constants: names of parameters whose values are fixed at build time (weights bound as params).
    prepack: filled by a rule that reads such a parameter in another layout; name -> layout tag
    (see schedule_cpu.prepack): the builder must store the constant transformed accordingly.
    """

    constants: frozenset[str] = frozenset()
    prepack: dict[str, str] = field(default_factory=dict)


def single_reduction(sch: s_tir.Schedule, spatial: int, reduce: int):
    """(block, its iter_vars, their static extents) if the function's one reduction block has `spatial`
    spatial iterators then `reduce` reduction ones, every extent static, and an init; else None."""
    reductions = [b for b in blocks(sch) if any(iv.iter_type == REDUCE for iv in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    blk = sch.get(reductions[0])
    ivs = list(blk.iter_vars)
    ext = [static(iv.dom.extent) for iv in ivs]
    if [iv.iter_type == REDUCE for iv in ivs] != [False] * spatial + [True] * reduce or None in ext or blk.init is None:
        return None
    return blk, ivs, ext


def read_index(sch: s_tir.Schedule, block, buf) -> int:
    """The position of `buf` among the block's reads (what cache_read and transform_layout address it by)."""
    return next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(buf))


def extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def static(e) -> int | None:
    return int(e) if isinstance(e, tirx.IntImm) else None


def try_vectorize(sch: s_tir.Schedule, loop, lanes: int) -> None:
    """Vectorize `loop`, split to `lanes` first when it is longer; a loop TVM refuses stays scalar.
    Where `lanes` does not divide it, TVM's loop partitioning peels the last, predicated piece off (the
    hint), so the others are whole vectors: TVM scalarizes a vector loop under a predicate (softmax rows
    of 197 or 208 ran their exp one lane at a time)."""
    n = extent(sch, loop)
    if n is None or n < 2:
        return
    try:
        if n > lanes:
            outer, loop = sch.split(loop, [None, lanes])
            if n % lanes:
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
