"""CUDA schedules: TVM's dlight GPU rules, the first that binds every stage wins; else a plain grid.

A PrimFunc compiled for cuda without thread bindings does not fail: it silently becomes host code
that dereferences device pointers. So every result is checked here, and a kernel that still has a
stage outside blockIdx/threadIdx is an internal error, never a library that crashes when called.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

THREADS = 256  # threads per block of the plain grid: enough to hide latency, fits every GPU's limit


def _rules() -> list:
    # Order matters: the specific rules first (each returns None when the kernel is not its pattern),
    # dlight's own Fallback last.
    gpu = dl.gpu
    return [gpu.Matmul(), gpu.GEMV(), gpu.LowBatchGEMV(), gpu.Reduction(), gpu.GeneralReduction(),
            gpu.Transpose(), gpu.Fallback()]


def schedule(prim: tirx.PrimFunc, kind: str, target: dict) -> tirx.PrimFunc:
    """A PrimFunc whose every stage runs on the GPU: dlight's rules, else one thread per output element."""
    tgt = Target(target)
    with tgt:
        for rule in _rules():
            func = _try_rule(rule, prim, tgt)
            if func is not None and not unbound_blocks(func):
                return func.with_attr("tirx.is_scheduled", True)
        func = _grid(prim)
    left = unbound_blocks(func)
    if left:
        name = prim.attrs["global_symbol"] if prim.attrs and "global_symbol" in prim.attrs else "?"
        raise RuntimeError(f"internal error: the CUDA schedule of kernel {name} left {', '.join(left)} "
                           "outside blockIdx/threadIdx (it would run as host code)")
    return func.with_attr("tirx.is_scheduled", True)


def _try_rule(rule, prim: tirx.PrimFunc, tgt: Target) -> tirx.PrimFunc | None:
    """The rule's schedule, or None where it does not apply. Rules schedule a copy, never `prim`."""
    try:
        sch = rule.apply(prim, tgt, False)
    except Exception:  # noqa: BLE001 (a rule that trips over a pattern it half-matches: try the next)
        return None
    if sch is None:
        return None
    if isinstance(sch, list):
        sch = sch[0]
    return sch.mod["main"]


def unbound_blocks(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks (stages) that no blockIdx/threadIdx loop encloses: they would run on the host."""
    out: list[str] = []
    _walk(func.body, False, out)
    return out


def _walk(stmt, bound: bool, out: list[str]) -> None:
    if stmt is None:
        return
    if isinstance(stmt, tirx.For):
        bound = bound or stmt.kind == tirx.ForKind.THREAD_BINDING
        _walk(stmt.body, bound, out)
    elif isinstance(stmt, tirx.AttrStmt):
        _walk(stmt.body, bound or stmt.attr_key == "thread_extent", out)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _walk(s, bound, out)
    elif isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        if block.name_hint != "root" and not bound:
            out.append(block.name_hint)
            return
        _walk(block.init, bound, out)
        _walk(block.body, bound, out)
    elif isinstance(stmt, tirx.IfThenElse):
        _walk(stmt.then_case, bound, out)
        _walk(stmt.else_case, bound, out)
    elif hasattr(stmt, "body"):  # LetStmt, allocations, asserts: transparent
        _walk(stmt.body, bound, out)


def _grid(prim: tirx.PrimFunc) -> tirx.PrimFunc:
    """Inline what inlines, then give each remaining stage one thread per point of its leading spatial
    loops (reduction loops stay serial inside the thread); a stage that resists gets one thread."""
    sch = s_tir.Schedule(prim)
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    for b in blocks[:-1]:
        if _is_spatial(sch, b):
            try:
                sch.compute_inline(b)
            except Exception:  # noqa: BLE001 (a stage that cannot inline becomes a kernel of its own)
                pass
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        try:
            _bind_spatial(sch, b)
        except Exception:  # noqa: BLE001 (odd loop nests: correct and serial rather than not at all)
            _bind_one_thread(sch, b)
    return sch.mod["main"]


def _is_spatial(sch: s_tir.Schedule, b) -> bool:
    return all(iv.iter_type == 0 for iv in sch.get(b).iter_vars)


def _bind_spatial(sch: s_tir.Schedule, b) -> None:
    loops = sch.get_loops(b)
    ivs = sch.get(b).iter_vars
    spatial = []
    for loop in loops:
        if len(spatial) < len(ivs) and ivs[len(spatial)].iter_type == 0:
            spatial.append(loop)
        else:
            break
    if not spatial:
        _bind_one_thread(sch, b)
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _bind_one_thread(sch: s_tir.Schedule, b) -> None:
    loops = sch.get_loops(b)
    outer = loops[0] if loops else sch.add_unit_loop(b)
    sch.bind(sch.add_unit_loop(outer), "blockIdx.x")
    sch.bind(sch.add_unit_loop(outer), "threadIdx.x")  # lands between the blockIdx loop and `outer`
