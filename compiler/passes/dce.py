"""dce (graph pruning): drop ops no returned value depends on; report unused arguments.

`dce{prune-args=true}` also drops unused arguments from functions that nothing calls.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from compiler.ir import Module
from compiler.passes import Pass
from compiler.rewrite import erase_dead_ops


@dataclass
class DeadCodeElimination(Pass):
    name = "dce"
    summary = "drop ops no returned value depends on; report (or prune) unused arguments"
    prune_args: bool = field(default=False, metadata={"help": "also remove unused arguments of uncalled functions"})

    def run(self, module: Module) -> None:
        for f in module:
            self.stats["ops-erased"] += erase_dead_ops(f)
        called = {op.called().name for f in module for op in f.ops if op.called() is not None}
        called |= {op.kernel.name for f in module for op in f.ops if op.name == "exec.launch"}
        for f in module:
            used = {v for op in f.ops for v in op.operands} | set(f.results)
            unused = [a for a in f.args if a not in used]
            if not unused:
                continue
            self.stats["unused-args"] += len(unused)
            if self.prune_args and f.name not in called:
                f.args = [a for a in f.args if a in used]
                self.stats["args-pruned"] += len(unused)
            elif unused := [a for a in unused if a.name not in f.attrs.get("values_bound", ())]:
                why = "it is called" if self.prune_args else "dce{prune-args=true} removes them"
                names = ", ".join("%" + (a.name or "?") for a in unused)
                print(f"dce: @{f.name} does not use {names} ({why})", file=sys.stderr)
