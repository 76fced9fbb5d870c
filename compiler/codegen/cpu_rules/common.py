"""Helpers the CPU rules share: blocks and loops by role, static extents, vector width of the host."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from tvm import s_tir, tirx

from compiler.codegen.sblocks import SPATIAL, blocks, inline_spatial, is_spatial  # noqa: F401  (the rules use them from here)

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


def extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def static(e) -> int | None:
    return int(e) if isinstance(e, tirx.IntImm) else None


def try_vectorize(sch: s_tir.Schedule, loop, lanes: int) -> None:
    """Vectorize `loop`, split to `lanes` first when it is longer; a loop TVM refuses stays scalar."""
    n = extent(sch, loop)
    if n is None or n < 2:
        return
    try:
        if n > lanes:
            loop = sch.split(loop, [None, lanes])[1]
        sch.vectorize(loop)
    except Exception:  # noqa: BLE001 (gathers, data-dependent indices)
        pass


@lru_cache(maxsize=1)
def vector_bytes() -> int:
    """Width of the host's vector registers: 64 with AVX-512, 32 with AVX2, 16 otherwise."""
    import tvm

    from compiler.codegen.target import llvm_target

    try:
        t = tvm.target.Target(llvm_target())
        has = tvm.target.codegen.llvm_cpu_has_features
        if has(["avx512f"], t):
            return 64
        if has(["avx2"], t) or has(["avx"], t):
            return 32
    except Exception:  # noqa: BLE001 (an LLVM without the query: assume SSE)
        pass
    return 16


def lanes(dtype: str) -> int:
    """Elements of `dtype` in one vector register."""
    size = max(1, _bits(dtype) // 8)
    return max(1, vector_bytes() // size)


def _bits(dtype: str) -> int:
    digits = "".join(c for c in str(dtype) if c.isdigit())
    return int(digits) if digits else 32
