"""Greedy pattern rewriting: patterns are plain functions, the walker applies them to a fixed point.

A pattern `def fold(op: graph.Transpose, b: Builder) -> Value | None` matches ops of its annotated
class, states its guards first and returns the replacement value(s) or None. The builder inserts new
ops before `op`, carrying `op`'s location. Replaced ops and ops left without users are erased.
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Callable, Sequence, get_type_hints

from compiler.builder import Builder
from compiler.ir import Func, Module, Op, Value

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
    """Erase pure ops none of whose results are used; returns how many."""
    uses = Counter(v for op in f.ops for v in op.operands)
    uses.update(f.results)
    keep: list[Op] = []
    for op in reversed(f.ops):
        if op.pure and op.results and not any(uses[r] for r in op.results):
            uses.subtract(op.operands)
            continue
        keep.append(op)
    erased = len(f.ops) - len(keep)
    f.ops = keep[::-1]
    return erased
