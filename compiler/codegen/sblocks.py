"""Block and loop queries every schedule rule needs, CPU or CUDA."""

from __future__ import annotations

from tvm import s_tir

SPATIAL = 0  # IterVar.iter_type of a data-parallel block iterator


def blocks(sch: s_tir.Schedule) -> list:
    """The top-level blocks of the function, in order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_spatial(sch: s_tir.Schedule, b) -> bool:
    return all(iv.iter_type == SPATIAL for iv in sch.get(b).iter_vars)


def leading_spatial_loops(sch: s_tir.Schedule, b) -> list:
    """The outer loops of `b` that bind its leading data-parallel iterators (the ones safe to split
    across threads or GPU blocks)."""
    ivs = sch.get(b).iter_vars
    spatial = []
    for loop in sch.get_loops(b):
        if len(spatial) < len(ivs) and ivs[len(spatial)].iter_type == SPATIAL:
            spatial.append(loop)
        else:
            break
    return spatial


def inline_spatial(sch: s_tir.Schedule, bs: list) -> None:
    """Inline the spatial blocks of `bs` into their consumers where TVM allows it."""
    for b in bs:
        if is_spatial(sch, b):
            try:
                sch.compute_inline(b)
            except Exception:  # noqa: BLE001 (e.g. an output block: it stays a loop nest of its own)
                pass
