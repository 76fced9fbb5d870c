"""CPU schedules, chosen per kernel by rules on its anchor op's kind.

The fallback here is safe for any PrimFunc: inline the intermediate injective stages, run the outer
spatial loops in parallel over all cores, vectorize the innermost spatial loop.
"""

from __future__ import annotations

from tvm import s_tir, tirx

VECTOR = 16  # f32 lanes of two AVX2 registers; LLVM splits wider vectors as needed


def schedule(prim: tirx.PrimFunc, kind: str) -> tirx.PrimFunc:
    sch = s_tir.Schedule(prim)
    _fallback(sch)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _blocks(sch: s_tir.Schedule) -> list:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def _is_spatial(sch: s_tir.Schedule, b) -> bool:
    return all(iv.iter_type == 0 for iv in sch.get(b).iter_vars)


def _fallback(sch: s_tir.Schedule) -> None:
    blocks = _blocks(sch)
    for b in blocks[:-1]:
        if _is_spatial(sch, b):
            try:
                sch.compute_inline(b)
            except Exception:  # noqa: BLE001 (a stage that cannot inline stays a loop nest of its own)
                pass
    for b in _blocks(sch):
        loops = sch.get_loops(b)
        if not loops:
            continue
        if _is_spatial(sch, b):
            _parallel_vectorize(sch, b, loops)
        else:
            _parallel_outer(sch, b, loops)


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _parallel_vectorize(sch: s_tir.Schedule, b, loops) -> None:
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    n = _extent(sch, fused) or 0
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
    ivs = sch.get(b).iter_vars
    spatial = []
    for loop in loops:
        # A loop is spatial when it binds only data-parallel block iterators.
        if len(spatial) < len(ivs) and ivs[len(spatial)].iter_type == 0:
            spatial.append(loop)
        else:
            break
    if not spatial:
        return
    try:
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        sch.parallel(fused)
    except Exception:  # noqa: BLE001 (loops not in the block's iterator order: leave them serial)
        pass
