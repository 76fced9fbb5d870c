"""Rewriting IR: greedy patterns, and the compiler's one inliner and one outliner.

A pattern `def fold(op: graph.Transpose, b: Builder) -> Value | None` matches ops of its annotated
class, states its guards first and returns the replacement value(s) or None. The builder inserts new
ops before `op`, carrying `op`'s location. Replaced ops and ops left without users are erased.

`inline_calls` puts callees' bodies in place of their calls (autodiff, training, plan-memory);
`outline` moves ops into a kernel function and a call of it (fuse's groups, plan-memory's lone ops).
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Callable, Sequence, get_type_hints

from compiler.builder import Builder
from compiler.diagnostics import Location
from compiler.ir import Func, Module, Op, SymbolRef, Value

Pattern = Callable[[Op, Builder], "Value | Sequence[Value] | None"]
MAX_ITERATIONS = 64


def _matched_class(pattern: Pattern) -> type[Op]:
    first = next(iter(inspect.signature(pattern).parameters))
    return get_type_hints(pattern)[first]


def rewrite(module: Module, patterns: Sequence[Pattern], stats: Counter | None = None) -> bool:
    """Apply `patterns` everywhere until nothing changes; returns whether anything did."""
    table = [(_matched_class(p), p) for p in patterns]
    changed_any = False
    for f in module:
        for _ in range(MAX_ITERATIONS):
            if not _sweep(f, table, stats):
                break
            changed_any = True
        else:
            raise RuntimeError(f"rewrite did not converge on @{f.name} after {MAX_ITERATIONS} sweeps")
    return changed_any


def _sweep(f: Func, table, stats: Counter | None) -> bool:
    changed = False
    i = 0
    while i < len(f.ops):
        op = f.ops[i]
        for cls, pattern in table:
            if not isinstance(op, cls):
                continue
            b = Builder(f, i, op.loc)
            out = pattern(op, b)
            if out is None:
                assert b.index == i, f"pattern {pattern.__name__} built ops but returned None"
                continue
            new = [out] if isinstance(out, Value) else list(out)
            assert len(new) == len(op.results), f"pattern {pattern.__name__} returned {len(new)} values"
            for old, repl in zip(op.results, new):
                if repl.name is None and old.name and f.results.count(old):
                    repl.name = old.name  # a returned value keeps its user-visible name
                f.replace_all_uses(old, repl)
            f.ops.remove(op)
            if stats is not None:  # a pattern for every op (canonicalize's fold) names the op it rewrote
                key = getattr(pattern, "stats_key", None)
                stats[key(op) if key else pattern.__name__.replace("_", "-")] += 1
            changed = True
            i = b.index - 1  # revisit what the pattern built
            break
        i += 1
    if changed:
        erase_dead_ops(f)
    return changed


def erase_dead_ops(f: Func) -> int:
    """Erase pure ops none of whose results are used (as an operand, a result, or the value an attribute
    takes at run time); returns how many."""
    by_name = {v.name: v for v in f.values()} if any(op.runtime_attrs() for op in f.ops) else {}

    def reads(op: Op) -> list:
        return [*op.operands, *op.attribute_values(by_name)]

    uses = Counter(v for op in f.ops for v in reads(op))
    uses.update(f.results)
    keep: list[Op] = []
    for op in reversed(f.ops):
        if op.pure and op.results and not any(uses[r] for r in op.results):
            uses.subtract(reads(op))
            continue
        keep.append(op)
    erased = len(f.ops) - len(keep)
    f.ops = keep[::-1]
    return erased


def inline_calls(module: Module, f: Func, only: Callable[[Func], bool] | None = None) -> int:
    """Replace each graph.call in `f` of a callee that `only` accepts (any, by default) by a copy of the
    callee's body, callees of callees too; returns how many calls were inlined. The call's results keep
    their names on the values that replace them."""
    from dialects.graph.creation import Call

    count, i = 0, 0
    while i < len(f.ops):
        op = f.ops[i]
        if not isinstance(op, Call) or (only is not None and not only(op.lookup(module))):
            i += 1
            continue
        body = op.lookup(module).clone()
        outside = dict(zip(body.args, op.operands))
        for new in body.ops:
            new.operands = [outside.get(v, v) for v in new.operands]
        f.ops[i : i + 1] = body.ops  # i stays: the inlined ops may hold calls of their own
        for r, v in zip(op.results, body.results):
            v = outside.get(v, v)
            if v.owner in body.ops and r.name:
                v.name = r.name
            f.replace_all_uses(r, v)
        count += 1
    return count


def outline(body: list[Op], outputs: list[Value], name: str, taken: set[str]) -> tuple[Func, Op]:
    """A kernel function holding `body` (ops moved out of their function, in program order: what they
    read from outside becomes its arguments, in order of first use) and returning `outputs`, named
    `name` (or `name_1`, ...: the first not in `taken`); and the graph.call of it that takes the body's
    place, its results named as the outputs. The caller puts the call where the body was."""
    from dialects.graph.creation import Call

    inside = {r for op in body for r in op.results}
    inputs = list(dict.fromkeys(v for op in body for v in op.operands if v not in inside))
    args = {v: Value(v.type, v.name) for v in inputs}
    for op in body:
        op.operands = [args.get(v, v) for v in op.operands]
    loc = Location.merge([op.loc for op in body if op.kind != "constant"])
    kernel = Func(unique_name(name, taken), list(args.values()), [v.type for v in outputs], loc)
    kernel.attrs = {"kernel": True}
    kernel.ops = body
    kernel.results = list(outputs)
    kernel.return_loc = outputs[-1].owner.loc
    call = Call(inputs, {"callee": SymbolRef(kernel.name)}, [v.type for v in outputs], loc)
    for r, v in zip(call.results, outputs):
        r.name = v.name
    return kernel, call


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_1`, `name_2`, ...: the first not in `taken`, which it joins."""
    out, n = name, 0
    while out in taken:
        n += 1
        out = f"{name}_{n}"
    taken.add(out)
    return out
