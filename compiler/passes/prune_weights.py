"""prune-weights: magnitude pruning of the constant weights of matmul and conv2d.

`mode=unstructured` zeroes the `sparsity` fraction of each weight's entries with the smallest |w|
(round(sparsity * size) of them, ties in flat order), keeping the shapes; a weight read through a
transpose (an imported Gemm) is pruned before it. `mode=channel` (which does not look through
transposes yet) removes the `sparsity` fraction of a layer's output channels with the smallest L1
norm (conv2d: axis 0 of OIHW; matmul: the columns of w) and shrinks everything those channels
reach: the conv bias, a constant bias add, a batch_norm's parameters, the elementwise ops and
pooling in between, a flatten of [N, C, 1, 1], and the next conv2d's input channels (axis 1) or
matmul's rows. A layer whose channels reach something that cannot shrink with them (a returned
value, a reshape mixing channels, concat, an add with another branch, an argument) is left whole, so
the module's signature never changes. Channel pruning equals zeroing the removed channels where the
next layer reads them; it is lossy, as pruning is.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from compiler.diagnostics import GCError
from compiler.ir import Dense, Func, Module, Op, Value
from compiler.passes import Pass
from dialects.graph import creation, elementwise, linalg, nn, shape

MODES = ("unstructured", "channel")
CONSUMED = -1  # the channels end in this op: it is the next layer, reading them as its inputs


def _constant(v: Value | None) -> np.ndarray | None:
    """The value of a float graph.constant, else None."""
    if v is None or not isinstance(v.owner, creation.Constant) or not v.type.dtype.is_float:
        return None
    return v.owner.value.array


class _Constants:
    """Makes the constants that replace weight operands: one per (source, how it changed), inserted right
    after the source constant so every op that read it may read the new one. The new constant keeps the
    source's name and location (compiler/prune.py maps arguments through them)."""

    def __init__(self, f: Func):
        self.f = f
        self.made: dict[tuple, Value] = {}
        self.replaced: list[Op] = []

    def replace(self, op: Op, index: int, key: tuple, make) -> np.ndarray:
        src = op.operands[index]
        full = (src, *key)
        if full not in self.made:
            old = src.owner
            new = creation.Constant([], {"value": Dense.of(make(old.value.array), src.type.dtype)}, None, old.loc)
            new.result.name = src.name
            self.f.ops.insert(self.f.ops.index(old) + 1, new)
            self.made[full] = new.result
            self.replaced.append(old)
        op.operands[index] = self.made[full]
        return self.made[full].owner.value.array

    def erase_unread(self) -> None:
        """Erase the replaced constants nothing reads any more (and nothing else: the rest is dce's job)."""
        read = {v for op in self.f.ops for v in op.operands} | set(self.f.results)
        unread = {op for op in self.replaced if op.result not in read}
        self.f.ops = [op for op in self.f.ops if op not in unread]


# --- unstructured ---------------------------------------------------------------------------------


def magnitude_mask(w: np.ndarray, sparsity: float) -> np.ndarray:
    """w with its round(sparsity * size) smallest-|w| entries set to 0 (ties: the earlier entry first)."""
    k = int(round(sparsity * w.size))
    flat = np.array(w).reshape(-1)
    flat[np.argsort(np.abs(flat.astype(np.float64)), kind="stable")[:k]] = 0
    return flat.reshape(w.shape)


def _weight_slots(f: Func) -> list[tuple[Op, int]]:
    """(op, operand index) of every matmul/conv2d weight that is a float constant, read directly or
    through a transpose (ONNX's Gemm with transB imports as matmul(x, transpose(w))): a magnitude mask
    is elementwise, so masking w masks its transpose alike."""
    slots = []
    for op in f.ops:
        if not isinstance(op, (linalg.MatMul, nn.Conv2d)):
            continue
        w = op.operands[1]
        if _constant(w) is not None:
            slots.append((op, 1))
        elif isinstance(w.owner, shape.Transpose) and _constant(w.owner.operands[0]) is not None:
            slots.append((w.owner, 0))
    return slots


# --- channel: which ops the channels of a layer reach ---------------------------------------------


def _layer_channels(op: Op) -> tuple[int, np.ndarray] | None:
    """For a prunable layer: its weight's output-channel axis and each channel's L1 norm."""
    if isinstance(op, nn.Conv2d) and op.groups == 1:
        w = _constant(op.w)
        if w is None or (op.b is not None and _constant(op.b) is None):
            return None
        return 0, np.abs(w.astype(np.float64)).sum(axis=(1, 2, 3))
    if isinstance(op, linalg.MatMul) and op.b.type.rank == 2:
        w = _constant(op.b)
        return None if w is None else (1, np.abs(w.astype(np.float64)).sum(axis=0))
    return None


def _aligned(v: Value, result_rank: int, axis: int, channels: int) -> int | None:
    """The axis of a broadcast operand `v` lined up with the result's `axis`, if it holds one entry per
    channel there (size 1 or no such axis: it broadcasts, and stays)."""
    j = axis - (result_rank - v.type.rank)
    return j if j >= 0 and v.type.shape[j] == channels and channels != 1 else None


def _flow(op: Op, region: dict[Value, int], channels: int) -> tuple[int, dict[int, int]] | None:
    """How the channels go through `op`, which reads a value of `region` (value -> channel axis): the axis
    they have in op's result (or CONSUMED), and for each constant operand to shrink, its axis. None when
    they cannot follow."""
    ins = [region.get(v) for v in op.operands]
    axis = next(a for a in ins if a is not None)
    y = op.results[0] if len(op.results) == 1 else None
    if isinstance(op, (elementwise.Unary, elementwise.Cast, nn.Dropout)):
        return axis, {}
    if isinstance(op, elementwise.Binary):
        cuts = {}
        for i, (v, a) in enumerate(zip(op.operands, ins)):
            if a is not None and (a != axis or v.type.shape != y.type.shape):
                return None
            if a is None and _constant(v) is None:
                return None  # another branch or an argument: its channels cannot shrink with ours
            j = _aligned(v, y.type.rank, axis, channels) if a is None else None
            if j is not None:
                cuts[i] = j
        return axis, cuts
    if isinstance(op, nn.BatchNorm):
        if ins[0] != 1 or any(a is not None or _constant(v) is None for v, a in zip(op.operands[1:], ins[1:])):
            return None
        return 1, {i: 0 for i in range(1, 5)}
    if isinstance(op, (nn.Pool2d, nn.GlobalAvgPool2d)):
        return (1, {}) if axis == 1 else None
    if isinstance(op, (shape.Flatten, shape.Reshape, shape.Squeeze)):
        x = op.operands[0].type
        simple = axis == 1 and x.rank >= 2 and set(x.shape[2:]) <= {1} and y.type.shape == x.shape[:2]
        explicit = not isinstance(op, shape.Squeeze) or op.axes is not None  # squeeze-all may take N or C too
        return (1, {}) if simple and explicit else None
    if isinstance(op, nn.Conv2d) and ins == [1, None, None][: len(ins)] and op.groups == 1:
        return (CONSUMED, {1: 1}) if _constant(op.w) is not None else None
    if isinstance(op, linalg.MatMul) and ins == [op.a.type.rank - 1, None] and op.b.type.rank >= 2:
        return (CONSUMED, {1: op.b.type.rank - 2}) if _constant(op.b) is not None else None
    return None


def _reach(f: Func, layer: Op, axis: int, channels: int) -> list[tuple[Op, dict[int, int]]] | None:
    """Every op the layer's channels reach, in order, with the constant operands to shrink; None if they
    reach something that cannot shrink. Program order sees every operand of an op before the op."""
    region = {layer.result: axis}
    reached = []
    for op in f.ops[f.ops.index(layer) + 1 :]:
        if not any(v in region for v in op.operands):
            continue
        flow = _flow(op, region, channels)
        if flow is None:
            return None
        out, cuts = flow
        reached.append((op, cuts))
        if out != CONSUMED:
            region[op.result] = out
    return None if any(v in region for v in f.results) else reached


@dataclass
class _Plan:
    layer: Op
    channels: int
    keep: np.ndarray
    reached: list[tuple[Op, dict[int, int]]]


def _plan(f: Func, layer: Op, sparsity: float) -> _Plan | None:
    found = _layer_channels(layer)
    if found is None:
        return None
    w_axis, norms = found
    k = min(int(round(sparsity * norms.size)), norms.size - 1)  # a layer keeps at least one channel
    if k <= 0:
        return None
    out_axis = 1 if isinstance(layer, nn.Conv2d) else layer.result.type.rank - 1
    reached = _reach(f, layer, out_axis, norms.size)
    if reached is None:
        return None
    keep = np.sort(np.argsort(norms, kind="stable")[k:])
    own = {1: w_axis} if len(layer.operands) == 2 else {1: w_axis, 2: 0}  # the weight, and a conv's bias
    return _Plan(layer, norms.size, keep, [(layer, own), *reached])


def _apply(plan: _Plan, consts: _Constants) -> None:
    """Shrink every constant the plan names, then re-infer the types of the ops it reaches, in order."""
    for op, cuts in plan.reached:
        for i, axis in cuts.items():
            key = ("take", axis, plan.keep.tobytes())
            consts.replace(op, i, key, lambda a, axis=axis: np.take(a, plan.keep, axis=axis))
        if isinstance(op, shape.Reshape):
            n = op.operands[0].type.shape[0]
            op.attrs["shape"] = (n, len(plan.keep))
        for r, t in zip(op.results, op.infer_types()):
            r.type = t


@dataclass
class PruneWeights(Pass):
    name = "prune-weights"
    summary = "magnitude pruning of constant matmul/conv2d weights: zero entries or remove whole channels"
    sparsity: float = field(default=0.5, metadata={"help": "the fraction of entries (or channels) to remove"})
    mode: str = field(default="unstructured", metadata={"help": "unstructured (zero entries) or channel"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity <= 1.0:
            raise GCError(f"pass 'prune-weights': sparsity must be in [0, 1], got {self.sparsity}")
        if self.mode not in MODES:
            raise GCError(f"pass 'prune-weights': mode must be unstructured or channel, got '{self.mode}'")

    def run(self, module: Module) -> None:
        for f in module:
            consts = _Constants(f)
            if self.mode == "unstructured":
                self._unstructured(f, consts)
            else:
                self._channels(f, consts)
            consts.erase_unread()
        if self.mode == "unstructured":
            total, zero = self.stats["weights-total"], self.stats["weights-zeroed"]
            share = 100.0 * zero / total if total else 0.0
            print(f"prune-weights: {share:.1f}% of {total} weights are zero", file=sys.stderr)
        else:
            removed, layers, whole = (self.stats[k] for k in ("channels-removed", "layers-pruned", "layers-kept-whole"))
            layers_text = f"{layers} layer" + ("" if layers == 1 else "s")
            message = f"removed {removed} channels from {layers_text} ({whole} kept whole)"
            print(f"prune-weights: {message}", file=sys.stderr)

    def _unstructured(self, f: Func, consts: _Constants) -> None:
        for op, i in _weight_slots(f):
            fresh = (op.operands[i], "prune") not in consts.made
            w = consts.replace(op, i, ("prune",), lambda a: magnitude_mask(a, self.sparsity))
            if fresh:
                self.stats["weights-total"] += w.size
                self.stats["weights-zeroed"] += int(np.count_nonzero(w == 0))

    def _channels(self, f: Func, consts: _Constants) -> None:
        # Every layer is planned on the weights as given, before any is pruned: a layer's ranking does not
        # depend on which input channels the layer before it lost.
        candidates = [op for op in f.ops if _layer_channels(op) is not None]
        plans = [_plan(f, op, self.sparsity) for op in candidates]
        for plan in plans:
            if plan is None:
                continue
            _apply(plan, consts)
            self.stats["layers-pruned"] += 1
            self.stats["channels-removed"] += plan.channels - plan.keep.size
        self.stats["layers-kept-whole"] += sum(p is None for p in plans)
