"""The planner: one function's kernels outlined, their lifetimes, the strategies that let tensors
share bytes, placement, and the result materialized as mem/exec IR (the `plan-memory` pass)."""

from __future__ import annotations

from dataclasses import replace

from compiler.ir import Func, Module, Value
from compiler.memory.figures import plan_stats
from compiler.memory.liveness import lifetimes, round_up
from compiler.memory.materialize import materialize
from compiler.memory.placement import Block, place
from compiler.memory.strategies import (
    DependenceOrder,
    InPlace,
    border_donors,
    concat_parts,
    concat_place,
    in_place_donor,
    share_borders,
)
from compiler.rewrite import outline
from dialects.graph.creation import Call
from dialects.mem import padded_bytes


def outline_kernels(module: Module, f: Func, taken: set[str]) -> list[Func]:
    """Every op that is not a constant or a kernel call becomes a call of a one-op kernel function. A
    constant only that op reads moves into the kernel, as fuse does for its groups: the schedule may then
    read it in a packed layout made once at build time (a lone matmul's bound weights)."""
    out = []
    uses = f.users()
    for op in list(f.ops):
        if op.kind == "constant" or isinstance(op, Call):
            continue
        # In operand order (a set's order is the values' ids: the kernel's constants, and so the artifact,
        # changed from one compile of the same model to the next).
        own = list(dict.fromkeys(v.owner for v in op.operands if v.owner is not None and v.owner.kind == "constant"
                                 and len(uses.get(v, [])) == 1 and v not in f.results))
        kernel, call = outline([*own, op], list(op.results), op.name.split(".", 1)[-1], taken)
        f.ops = [call if o is op else o for o in f.ops if o not in own]
        for r, c in zip(kernel.results, call.results):
            f.replace_all_uses(r, c)
        module.add(kernel)
        out.append(kernel)
    return out


def plan_function(module: Module, f: Func, align: int, in_place: InPlace, concurrent: bool,
          borders: dict[Value, tuple[int, ...]], concat_views: bool = False, in_arena: bool = False) -> dict[str, int]:
    steps = [op for op in f.ops if op.kind != "constant"]
    every = lifetimes(f, steps, align)
    donors = border_donors(module, steps, borders, every, in_place) if borders and not concurrent else {}
    borders = dict(borders)
    for v, u in donors.items():  # in program order: a donor may itself have taken its input's buffer
        borders[v] = borders[u]
    if in_arena:  # bordered tensors in the arena, at their padded size
        lts = [replace(lt, size=round_up(padded_bytes(lt.value.type, borders[lt.value]), align))
               if lt.value in borders else lt for lt in every]
    else:
        lts = [lt for lt in every if lt.value not in borders]
    life = {lt.value: lt for lt in lts}
    order = DependenceOrder(steps) if concurrent else None
    parts = concat_parts(module, f, steps, life, align, borders) if concat_views else {}
    # A concat's bytes are live from the first of its operands' writes (they write into them).
    place_of = {v: concat_place(v, parts) for v in parts}
    first, last = {}, {}
    for v, (root, _) in place_of.items():
        first[root] = min(first.get(root, life[root].start), life[v].start)
        last[root] = max(last.get(root, life[root].end), life[v].end)  # (a chain's prefixes and shared operands)
    # Storage blocks: one per tensor, except that an in-place output joins its input's block, and a
    # concat's operands lie in the concat's.
    block_of: dict[Value, Block] = {}
    joined = 0
    for lt in lts:
        if lt.value in parts:
            continue
        if lt.value in first:
            block_of[lt.value] = Block(lt.size, first[lt.value], last[lt.value], members=[lt.value])
            continue
        donor = (in_place_donor(module, lt.value.owner, life, block_of, order, in_place.epilogues, borders)
                 if in_place.elementwise else None)
        if donor is not None:
            b = block_of[donor]
            b.end = max(b.end, lt.end)
            b.members.append(lt.value)
            block_of[lt.value] = b
            joined += 1
        else:
            block_of[lt.value] = Block(lt.size, lt.start, lt.end, members=[lt.value])
    offset_in = {v: at for v, (_, at) in place_of.items()}  # a concat operand -> its byte offset in its block
    for v, (root, _) in place_of.items():
        block_of[v] = block_of[root]
        block_of[root].members.append(v)
    blocks = list(dict.fromkeys(block_of.values()))
    apart: dict[Block, set[Block]] = {}
    for step in steps:  # what one kernel writes, against all it touches (4K aliasing: compiler.memory.PAGE)
        outs = {block_of[v] for v in step.results if v in block_of}
        touched = outs | {block_of[v] for v in step.operands if v in block_of}
        for o in outs:
            for t in touched - {o}:
                apart.setdefault(o, set()).add(t)
                apart.setdefault(t, set()).add(o)
    size = place(blocks, align, conflict=order.conflict if order else None, apart=apart)
    # Bordered buffers are shared only by tensors of one shape and border; where they would make the plan
    # bigger than a buffer per tensor (a short chain of convs: little else to share), the convs copy
    # their input padded instead.
    shared = [] if in_arena else share_borders(borders, every, donors)
    bordered = sum(padded_bytes(group[0].type, borders[group[0]]) for group in shared)
    if borders and size + bordered > sum(lt.value.type.nbytes for lt in every):
        return plan_function(module, f, align, in_place, concurrent, {}, concat_views)
    materialize(f, steps, block_of, size, align, borders, shared, offset_in)
    figures = plan_stats(f)
    stats = {"arena-bytes": figures["arena_bytes"], "naive-bytes": figures["naive_bytes"],
             "lower-bound-bytes": figures["lower_bound_bytes"], "in-place": joined}
    if figures["bordered_bytes"]:
        stats["bordered-bytes"] = figures["bordered_bytes"]
    if parts:
        stats["concat-views"] = len(parts)
    return stats
