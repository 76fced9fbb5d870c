"""fold-constants: an op whose operands are all graph.constant results becomes constant(s) of its value, as
does one that reads only its operands' sizes (graph.shape, graph.numel) once they are known.

The value comes from the op's own `reference`, the interpreter's oracle, so folding cannot change what
the module computes. Not folded: ops without operands (constants themselves, a call of a function
taking none), calls (their value is the callee's: inline first), ops with no reference, results above
`size-limit` bytes in all (they would bloat the IR), and ops whose reference reports an error (a gather
out of range fails at run time; folding must not fail sooner, so the op stays). Statistics: ops-folded,
not-folded-size, not-folded-error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler.diagnostics import GCError, Location
from compiler.ir import Dense, Func, Module, Op, Value, stand_in
from compiler.passes import Pass
from dialects.graph.creation import Call, Constant


@dataclass
class FoldConstants(Pass):
    name = "fold-constants"
    summary = "evaluate ops whose operands are all constants and replace them by constants"
    size_limit: int = field(default=1 << 20, metadata={"help": "fold only results of at most this many bytes"})

    def run(self, module: Module) -> None:
        for f in module:
            self._fold(f)

    def _fold(self, f: Func) -> None:
        """One forward sweep reaches the fixed point: an op's operands are folded before it is looked at."""
        out: list[Op] = []
        replaced: dict[Value, Value] = {}
        made: set[Op] = set()  # constants folding read or made: erased below unless something reads them
        for op in f.ops:
            op.operands = [replaced.get(v, v) for v in op.operands]
            new = self._try(op)
            if new is None:
                out.append(op)
                continue
            made.update(v.owner for v in op.operands if isinstance(v.owner, Constant))
            made.update(new)
            for r, c in zip(op.results, new):
                c.result.name = r.name
                replaced[r] = c.result
            out.extend(new)
            self.stats["ops-folded"] += 1
        f.results = [replaced.get(v, v) for v in f.results]
        used = {v for op in out for v in op.operands} | set(f.results)
        f.ops = [op for op in out if op not in made or op.result in used]

    def _try(self, op: Op) -> list[Op] | None:
        """The constants that replace `op`, one per result, or None if it does not fold."""
        if not can_fold(op):
            return None
        if sum(r.type.nbytes for r in op.results) > self.size_limit:
            self.stats["not-folded-size"] += 1
            return None
        try:
            with np.errstate(all="ignore"):  # inf and nan are values like any other, as at run time
                values = op.evaluate([stand_in(v.type) if op.reads_sizes_only else np.array(v.owner.value.array)
                                      for v in op.operands])
        except GCError:
            self.stats["not-folded-error"] += 1
            return None
        loc = Location.merge([op.loc, *(v.owner.loc for v in op.operands if isinstance(v.owner, Constant))])
        return [Constant([], {"value": Dense.of(a, r.type.dtype)}, None, loc) for a, r in zip(values, op.results)]


def can_fold(op: Op) -> bool:
    """Whether `op` is a computation (not a call, not a constant) over constants only, or over operands of
    known sizes where it reads nothing else (graph.shape)."""
    if not op.operands or isinstance(op, Call) or type(op).reference is Op.reference:
        return False
    if not all(r.type.is_static for r in op.results):  # (a constant broadcast to sizes known at run time)
        return False
    if op.reads_sizes_only:
        return all(v.type.is_static for v in op.operands)
    return all(isinstance(v.owner, Constant) for v in op.operands)
