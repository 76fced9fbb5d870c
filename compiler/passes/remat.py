"""remat: gradient checkpointing. A gradient function keeps fewer forward activations alive for the backward
pass and recomputes the others there, right before the backward op that first reads them.

The input is a function made by `autodiff` (@NAME_grad) or `make-train-step` (@train_step): forward ops, the
ancestors of the loss (the first result), and backward ops that read forward values ("saved" values). A plan
keeps some saved values (checkpoints) and drops the others. A dropped value is recomputed from kept values and
arguments: its forward op is cloned (`%a3.remat`), and so is every forward op the clone needs whose result is
not kept, recursively. Each forward op is cloned at most once and its clone serves every backward reader, so
the extra work is at most one forward pass; the clones sit right before the first backward op that needs them,
so a recomputed segment is alive only while the backward pass is in it (Chen et al., "Training Deep Nets with
Sublinear Memory Cost", 2016).

- `policy=sqrt` (the default without a budget): Chen's plan. The forward is cut into units at its articulation
  points: saved values that are, at the step that makes them, the only forward value later forward ops read
  (arguments aside), such as a chain's layer outputs or a residual block's output. Every k-th unit counted
  back from the last, k = round(sqrt(n)) of n units, is kept and everything else is recomputed, a segment at a
  time: O(sqrt n) activations for at most one extra forward pass. A plan that lowers no peak is not applied.
- `budget=BYTES`: the plan of fewest recomputed FLOPs found whose peak fits. Candidates: Chen's plans for every
  segment length and a greedy descent from keeping everything, which drops, each time, the kept value alive at
  the peak that lowers it most per recomputed FLOP. The cheapest that fits is trimmed (dropped values kept
  again while it still fits). A budget no plan meets is an error stating the least peak found.

Memory is counted as `schedule` and `plan-memory` count it: the liveness peak of the intermediates, sizes in
units of `align` bytes, in the order written (remat's, which `schedule` replaces only by an order of lower
peak). A budget is then checked against the arena of `schedule,plan-memory` run on a copy, and the search
reruns under a lower target if placement needs more. Order: after `cse` (which would merge each clone back
into the op it copies) and `fuse`, before `schedule,plan-memory` (`schedule`'s list scheduler moves the
backward's cheap readers of activations, such as relu masks, into the forward pass, where remat can no
longer help; its guard keeps remat's order, which it cannot beat).
Statistics: checkpoints, recomputed (saved values dropped), cloned-ops, extra-flops, forward-flops,
peak-bytes-before and peak-bytes-after (liveness peaks), arena-bytes (with a budget).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, Value, nominal
from compiler.memory import Block, is_planned, lower_bound, plan_stats
from compiler.passes import InputError, Pass
from compiler.passes.plan_memory import PlanMemory
from compiler.passes.schedule import Schedule

POLICIES = ("auto", "sqrt", "budget")


@dataclass
class Remat(Pass):
    """Gradient checkpointing: recompute forward activations in the backward pass to lower the peak."""

    name = "remat"
    summary = "recompute forward activations in the backward pass instead of keeping them (gradient checkpointing)"
    budget: int = field(default=0, metadata={"help": "bytes the planned arena of intermediates must fit in (0: none)"})
    policy: str = field(
        default="auto",
        metadata={
            "help": "sqrt: a checkpoint every sqrt(n) layers | budget: the fewest recomputations that fit `budget` | "
            "auto: budget if one is given, else sqrt"
        },
    )
    func: str = field(default="", metadata={"help": "the function (default: every @NAME_grad and @train_step)"})
    align: int = field(default=64, metadata={"help": "tensor sizes count in units of this many bytes (as planned)"})

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise GCError(f"pass 'remat': unknown policy '{self.policy}' (policies: {', '.join(POLICIES)})")
        if self.policy == "sqrt" and self.budget:
            raise GCError("pass 'remat': policy=sqrt takes no budget (give either budget=BYTES or policy=sqrt)")
        if self.policy == "budget" and self.budget <= 0:
            raise GCError("pass 'remat': policy=budget needs budget=BYTES, a positive number of bytes")
        if self.budget < 0:
            raise GCError(f"pass 'remat': budget must be a positive number of bytes, got {self.budget}")
        if self.align < 1 or self.align & (self.align - 1):
            raise GCError(f"pass 'remat': align must be a power of two, got {self.align}")

    def run(self, module: Module) -> None:
        for f in self.targets(module):
            if self.budget and not all(nominal(r.type) == r.type for r in f.values()):
                raise InputError(f"remat: a budget is in bytes, and @{f.name} has sizes known only at run time (?): "
                                 "use policy=sqrt", f.loc)
            g = Grad(module, f, self.align)
            before = g.evaluate(frozenset(g.saved))
            if self.budget:
                plan, arena = fit(module, g, self.budget, self.align)
                self.stats["arena-bytes"] += arena
            else:
                plan = g.evaluate(g.chen(g.sqrt_k()))
                if plan.peak >= before.peak:  # recomputing would cost FLOPs and save nothing
                    plan = before
            self.stats["cloned-ops"] += g.apply(plan.keep)
            self.stats["checkpoints"] += len(plan.keep)
            self.stats["recomputed"] += len(g.saved) - len(plan.keep)
            self.stats["extra-flops"] += plan.flops
            self.stats["forward-flops"] += g.forward_flops
            self.stats["peak-bytes-before"] += before.peak
            self.stats["peak-bytes-after"] += plan.peak

    def targets(self, module: Module) -> list[Func]:
        if not self.func:
            return [f for f in module if f.name.endswith(("_grad", "train_step")) and not _skip(f)]
        if self.func not in module:
            names = ", ".join("@" + n for n in module.funcs) or "none"
            raise InputError(f"remat: no function @{self.func} (functions: {names})")
        return [] if _skip(module[self.func]) else [module[self.func]]


def _skip(f: Func) -> bool:
    """Kernels and planned functions are past remat's stage."""
    return bool(f.attrs.get("kernel")) or is_planned(f)


@dataclass(frozen=True)
class Plan:
    """A choice of saved values to keep, and what it costs."""

    keep: frozenset[Value]
    peak: int  # the liveness peak, bytes
    flops: int  # recomputed
    area: int  # bytes x steps alive: among plans of one peak, the one that holds memory least
    hot: tuple[Value, ...]  # kept saved values alive at a step of the peak: dropping another cannot lower it


class Grad:
    """A gradient function split into forward ops (the loss's ancestors) and backward ops, with the plans'
    layouts, their liveness (as `compiler.memory.lifetimes` counts it) and the rewrite."""

    def __init__(self, module: Module, f: Func, align: int):
        loss = f.results[0] if f.results else None
        if loss is None or loss.type.rank != 0 or not loss.type.dtype.is_float:
            raise InputError(
                f"remat: @{f.name} does not return a scalar loss first; it needs a function made by "
                "autodiff (the loss, then the gradients)",
                f.loc,
            )
        self.f = f
        self.forward: set[Op] = set()
        wanted = {loss}
        for op in reversed(f.ops):
            if op.kind != "constant" and any(r in wanted for r in op.results):
                self.forward.add(op)
                wanted.update(op.operands)
        returned = set(f.results)
        # Sizes known only at run time weigh as NOMINAL: the plan's choices hold where they scale alike.
        self.size = {
            r: -(-nominal(r.type).nbytes // align) * align
            for op in f.ops
            for r in op.results
            if r not in returned and nominal(r.type).nbytes > 0 and op.kind != "constant"
        }
        read_later = {v for op in f.ops if op not in self.forward for v in op.operands}
        fwd = [op for op in f.ops if op in self.forward]
        self.saved = tuple(r for op in fwd for r in op.results if r in read_later and r in self.size)
        self.units = _articulation_points(fwd, self.saved)
        at = _nominal_ops(module, f)
        self.flops = {op: op_flops(module, at.get(op, op)) for op in fwd}
        self.forward_flops = sum(self.flops.values())

    def dropped(self, v: Value, keep: frozenset[Value]) -> bool:
        return v.owner in self.forward and v in self.size and v not in keep

    def layout(self, keep: frozenset[Value]) -> list[tuple[Op, bool]]:
        """f's ops with the clones (op, True) that `keep` needs, each right before its first backward reader."""
        out: list[tuple[Op, bool]] = []
        cloned: set[Op] = set()
        for op in self.f.ops:
            if op not in self.forward:
                for v in op.operands:
                    out += [(c, True) for c in self._recompute(v, keep, cloned)]
            out.append((op, False))
        return out

    def _recompute(self, v: Value, keep: frozenset[Value], cloned: set[Op]) -> list[Op]:
        """The forward ops not cloned yet that recompute `v` from kept values, operands first."""
        out: list[Op] = []
        stack = [(v, False)]
        while stack:
            u, ready = stack.pop()
            if not self.dropped(u, keep) or u.owner in cloned:
                continue
            if ready:
                cloned.add(u.owner)
                out.append(u.owner)
                continue
            stack.append((u, True))
            stack += [(w, False) for w in reversed(u.owner.operands)]
        return out

    def evaluate(self, keep: frozenset[Value]) -> Plan:
        """What keeping `keep` costs: the lifetimes of `layout(keep)` as `compiler.memory.lifetimes` counts them
        (a clone's result is a tensor of its own), their peak, and the FLOPs of the clones."""
        lay = self.layout(keep)
        start: dict[tuple[Value, bool], int] = {}
        end: dict[tuple[Value, bool], int] = {}
        flops = 0
        steps = [(op, c) for op, c in lay if op.kind != "constant"]
        for i, (op, clone) in enumerate(steps):
            late = clone or op not in self.forward
            for u in op.operands:
                key = (u, late and self.dropped(u, keep))
                if key in start:
                    end[key] = i
            for r in op.results:
                if r in self.size:
                    start[(r, clone)] = end[(r, clone)] = i
            flops += self.flops[op] if clone else 0
        blocks = {k: Block(self.size[k[0]], s, end[k]) for k, s in start.items()}
        peak = lower_bound(list(blocks.values()))
        at_peak = _peak_steps(list(blocks.values()), peak)
        hot = tuple(v for v in self.saved if v in keep and _alive_at(blocks[(v, False)], at_peak))
        area = sum(b.size * (b.end - b.start + 1) for b in blocks.values())
        return Plan(keep, peak, flops, area, hot)

    def apply(self, keep: frozenset[Value]) -> int:
        """Rewrite f under `keep`: clones in place, backward readers of dropped values rewired; the clone count."""
        clone_of: dict[Value, Value] = {}
        ops: list[Op] = []
        for op, clone in self.layout(keep):
            late = clone or op not in self.forward
            operands = [clone_of[u] if late and self.dropped(u, keep) else u for u in op.operands]
            if not clone:
                op.operands = operands
                ops.append(op)
                continue
            new = object.__new__(type(op))
            new.__dict__.update(op.__dict__)
            new.operands, new.attrs = operands, dict(op.attrs)
            new.results = [Value(r.type, f"{r.name}.remat" if r.name else None, new, r.index) for r in op.results]
            clone_of.update(zip(op.results, new.results))
            ops.append(new)
        self.f.ops = ops
        return len({v.owner for v in clone_of.values()})

    def chen(self, k: int) -> frozenset[Value]:
        """Chen's plan: every k-th unit counted back from the last is kept, everything else recomputed."""
        n = len(self.units)
        return frozenset(u for i, u in enumerate(self.units, 1) if (n - i) % k == 0)

    def sqrt_k(self) -> int:
        return max(1, round(math.sqrt(len(self.units))))


def fit(module: Module, g: Grad, budget: int, align: int) -> tuple[Plan, int]:
    """The cheapest plan found whose arena, as `schedule,plan-memory` lay it out, fits `budget`, and that arena.
    Plans are compared by their liveness peak; where the arena needs more, the search reruns below it."""
    target = budget
    for _ in range(8):  # placement rarely needs more than the liveness peak; the target drops by the excess
        plan, least = search(g, target)
        if plan is None:
            break
        arena = planned_arena(module, g, plan.keep, align)
        if arena <= budget:
            return plan, arena
        target -= arena - budget
    none = g.evaluate(frozenset(g.saved)).peak
    placed = ", but its arena needs more" if least <= budget else ""
    raise InputError(
        f"remat: @{g.f.name} cannot fit in {budget:,} bytes: the least peak remat reaches is {least:,} bytes"
        f"{placed} ({none:,} without remat; remat recomputes each forward op at most once)",
        g.f.loc,
    )


def search(g: Grad, target: int) -> tuple[Plan | None, int]:
    """The plan of fewest recomputed FLOPs whose peak is at most `target` (None if none is), among Chen's plans
    for every segment length and the greedy descent's, trimmed; and the least peak seen."""
    none = g.evaluate(frozenset(g.saved))
    if none.peak <= target:
        return none, none.peak
    seen = [none, *(g.evaluate(g.chen(k)) for k in range(1, len(g.units) + 1)), *descend(g, none, target)]
    least = min(p.peak for p in seen)
    fits = [p for p in seen if p.peak <= target]
    if not fits:
        return None, least
    return trim(g, min(fits, key=lambda p: (p.flops, p.peak)), target), least


def descend(g: Grad, plan: Plan, target: int) -> list[Plan]:
    """Greedy: drop the kept value, alive at the peak, that lowers the peak most per recomputed FLOP (among
    equals the plan holding memory least), until the peak is at most `target` or no drop lowers it."""
    out = []
    while plan.peak > target:
        options = [g.evaluate(plan.keep - {v}) for v in plan.hot]
        lower = [q for q in options if q.peak < plan.peak]
        if not lower:
            break
        plan = max(lower, key=lambda q: ((plan.peak - q.peak) / (q.flops - plan.flops + 1), -q.area))
        out.append(plan)
    return out


def trim(g: Grad, plan: Plan, target: int) -> Plan:
    """Keep dropped values again, the costliest recomputation first, while the peak stays within `target`."""
    for v in sorted((v for v in g.saved if v not in plan.keep), key=lambda v: -g.flops[v.owner]):
        q = g.evaluate(plan.keep | {v})
        if q.peak <= target and q.flops < plan.flops:
            plan = q
    return plan


def planned_arena(module: Module, g: Grad, keep: frozenset[Value], align: int) -> int:
    """The arena `schedule,plan-memory` give g's function rewritten under `keep` (planned on a copy)."""
    h = g.f.clone()
    copy = Module([h, *(k.clone() for k in module if k.attrs.get("kernel"))])
    twin = dict(zip(g.f.values(), h.values()))
    Grad(copy, h, align).apply(frozenset(twin[v] for v in keep))
    Schedule(align=align).run(copy)
    PlanMemory(align=align).run(copy)
    return plan_stats(h)["arena_bytes"]


def _articulation_points(fwd: list[Op], saved: tuple[Value, ...]) -> list[Value]:
    """Saved values that are, at the step that makes them, the only forward value (arguments and constants
    aside) that later forward ops still read: the boundaries of a chain's layers and of residual blocks."""
    wanted = set(saved)
    last: dict[Value, int] = {}
    for i, op in enumerate(fwd):
        for v in op.operands:
            last[v] = i
    live: set[Value] = set()
    out = []
    for i, op in enumerate(fwd):
        live -= {v for v in op.operands if last[v] == i}
        live |= {r for r in op.results if last.get(r, -1) > i}
        if len(op.results) == 1 and live == {op.result} and op.result in wanted:
            out.append(op.result)
    return out


def _peak_steps(blocks: list[Block], peak: int) -> list[int]:
    """The steps at which the bytes alive reach `peak`, sorted."""
    delta: dict[int, int] = {}
    for b in blocks:
        delta[b.start] = delta.get(b.start, 0) + b.size
        delta[b.end + 1] = delta.get(b.end + 1, 0) - b.size
    out, alive, times = [], 0, sorted(delta)
    for t, nxt in zip(times, times[1:] + [times[-1] + 1] if times else []):
        alive += delta[t]
        if alive == peak and peak:
            out += range(t, nxt)
    return out


def _alive_at(b: Block, steps: list[int]) -> bool:
    i = bisect.bisect_left(steps, b.start)
    return i < len(steps) and steps[i] <= b.end


def _nominal_ops(module: Module, f: Func) -> dict[Op, Op]:
    """f's ops -> the same ops of f specialized to NOMINAL sizes (empty when f is static), whose FLOPs count."""
    from compiler.specialize import is_dynamic, specialize

    if not is_dynamic(f):
        return {}
    spec = specialize(module, f, [nominal(a.type).shape for a in f.args])
    return dict(zip(f.ops, spec.ops))


def op_flops(module: Module, op: Op) -> int:
    """FLOPs of one op as `gc stats` counts them: its own `flops()`, a callee's ops, else one per element."""
    if op.called() is not None and op.called().name in module:
        return sum(op_flops(module, o) for o in module[op.called().name].ops)
    flops = getattr(op, "flops", None)
    return int(flops()) if flops is not None else sum(r.type.size for r in op.results)
