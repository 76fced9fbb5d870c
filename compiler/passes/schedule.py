"""schedule: choose the execution order of a function's kernels to keep peak live memory low.

Any topological order computes the same values; they differ in how many intermediates are alive at
once (`compiler.memory.lower_bound`). Policies:
- `auto` (default): `exact` for functions of at most `exact-limit` kernels, `greedy` for larger ones.
- `greedy`: a list scheduler. Among the ready kernels it runs the one that grows live memory
  least (its outputs minus the inputs it is the last reader of), earliest in file order on ties; a
  kernel that frees more than it allocates goes first. The result is kept only if its peak beats
  file order's, so the pass never makes things worse.
- `exact`: a best-first search over the sets of kernels already run (a set fixes what is alive) finds
  an order of minimum peak; functions of more than `exact-limit` kernels fall back to `greedy`.
- `file`: keep the order as written (reports the peak only).

Constants move to the top (they are not steps). Kernel functions are not reordered inside.
Statistics: peak-bytes-file-order and peak-bytes-chosen, summed over functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Module
from compiler.memory import is_planned, peak_bytes
from compiler.memory.order import POLICIES, choose_order
from compiler.passes import Pass


@dataclass
class Schedule(Pass):
    name = "schedule"
    summary = "order kernels to keep peak live memory low (memory-aware list scheduling, or exact search)"
    policy: str = field(default="auto", metadata={"help": "auto | greedy | exact | file"})
    exact_limit: int = field(default=12, metadata={"help": "the most kernels `exact` searches; more fall back"})
    align: int = field(default=64, metadata={"help": "tensor sizes count in units of this many bytes (as planned)"})

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise GCError(f"pass 'schedule': unknown policy '{self.policy}' (policies: {', '.join(POLICIES)})")

    def run(self, module: Module) -> None:
        for f in module:
            if f.attrs.get("kernel") or is_planned(f):
                continue
            before = peak_bytes(f, align=self.align)
            order = choose_order(f, self.policy, self.exact_limit, self.align)
            after = peak_bytes(f, order, self.align)
            if after < before:
                consts = [op for op in f.ops if op.kind == "constant"]
                self.stats["ops-moved"] += sum(a is not b for a, b in zip(consts + order, f.ops))
                f.ops = consts + order
            else:
                after = before
            self.stats["peak-bytes-file-order"] += before
            self.stats["peak-bytes-chosen"] += after
