"""The memory stage: from a graph-level function whose ops are kernels to a planned one (mem/exec IR),
in the order the compile runs it:

| module | what |
|---|---|
| `order` | the kernels' execution order, keeping peak live memory low (the `schedule` pass) |
| `liveness` | lifetimes of the intermediates in that order, and the lower bound they give |
| `strategies` | ways for tensors to share bytes beyond disjoint lifetimes: in place, conv borders, concat views |
| `placement` | offsets in one arena (best fit over several orders; 4K-aliasing skew) |
| `materialize` | the plan written as mem/exec IR: arena, views, launches, result buffers |
| `planner` | the above for one function (the `plan-memory` pass), kernels outlined first |
| `rules` | what the strategies may do and the checker accepts, written once for both |
| `checker` | a planned function is sound: every read sees its value, views in bounds, streams ordered |
| `figures` | the plan's figures (`gc compile --stats`): arena, naive size, lower bounds |

The passes (`compiler/passes/schedule.py`, `plan_memory.py`, `assign_streams.py`) are the stage's
entry points in a pipeline; docs/memory.md says what the plans look like and what they give.
"""

from compiler.memory.checker import check_plan
from compiler.memory.figures import plan_stats
from compiler.memory.liveness import (
                                      Lifetime,
                                      is_planned,
                                      lifetimes,
                                      lower_bound,
                                      peak_bytes,
                                      round_up,
                                      steps_of,
                                      view_spans,
)
from compiler.memory.placement import PAGE, SKEW, Block, place
from compiler.memory.rules import IN_PLACE_KINDS, copies_nothing, launch_copies_nothing, lone_op, writes_in_place_over

__all__ = ["IN_PLACE_KINDS", "PAGE", "SKEW", "Block", "Lifetime", "check_plan", "copies_nothing", "is_planned",
           "launch_copies_nothing",
           "lifetimes", "lone_op", "lower_bound", "peak_bytes", "place", "plan_stats", "round_up", "steps_of",
           "view_spans", "writes_in_place_over"]
