"""Materialization: a planned order and placement written as mem/exec IR (an arena, a view for each
intermediate, a launch for each step, buffers of their own for results and bordered tensors kept
apart, copies for returned arguments)."""

from __future__ import annotations

from compiler.ir import Func, Op, SymbolRef, Value
from compiler.memory.placement import Block
from dialects.exec import Copy, Launch
from dialects.mem import Alloc, Arena, View


def materialize(f: Func, steps: list[Op], block_of: dict[Value, Block], size: int, align: int,
             borders: dict[Value, tuple[int, ...]], shared: list[list[Value]], offset_in: dict[Value, int]) -> None:
    loc = f.loc
    consts = [op for op in f.ops if op.kind == "constant"]
    arena = Arena([], {"size": size, "align": align}, None, loc)
    arena.result.name = "arena"
    ops: list[Op] = [*consts, arena]
    group_of = {v: g for g in shared for v in g}
    bordered: dict[Value, Alloc] = {}
    returned_first: dict[Value, int] = {}
    for i, v in enumerate(f.results):
        returned_first.setdefault(v, i)
    repl: dict[Value, Value] = {}
    for step in steps:
        dests: list[Value] = []
        for r in step.results:
            if r in block_of:
                at = block_of[r].offset + offset_in.get(r, 0)
                attrs = {"offset": at, "pads": list(borders[r])} if r in borders else {"offset": at}
                view = View([arena.result], attrs, [r.type], step.loc)
            elif r in borders:
                first = group_of[r][0]
                if first not in bordered:  # the buffer, made where its first tensor is written
                    bordered[first] = Alloc([], {"pads": list(borders[r])}, [r.type], step.loc)
                    ops.append(bordered[first])
                dests.append(bordered[first].result)
                continue
            else:
                view = Alloc([], {}, [r.type], step.loc)
            ops.append(view)
            dests.append(view.result)
        ins = [repl.get(v, v) for v in step.operands]
        launch = Launch([*ins, *dests], {"kernel": SymbolRef(step.callee.name)}, [r.type for r in step.results], step.loc)
        ops.append(launch)
        for r, new in zip(step.results, launch.results):
            new.name = r.name
            repl[r] = new
    f.ops = ops
    f.results = [repl.get(v, v) for v in f.results]
    produced = {r for op in ops if isinstance(op, Launch) for r in op.results}
    seen: set[Value] = set()
    results = []
    for v in f.results:
        if v in produced and v not in seen:
            seen.add(v)
            results.append(v)
            continue
        # A returned argument or constant, or a value returned twice: the caller gets a buffer of its own.
        buf = Alloc([], {}, [v.type], f.return_loc or loc)
        cp = Copy([v, buf.result], {}, None, f.return_loc or loc)
        f.ops += [buf, cp]
        results.append(cp.result)
    f.results = results
