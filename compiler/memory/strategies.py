"""The planner's strategies, each a way for tensors to share bytes beyond disjoint lifetimes:

- in place: a kernel writes its output over a dying input it reads element for element (`InPlace`,
  `in_place_donor`; the rule is `rules.writes_in_place_over`);
- conv borders: a padded conv's input stored inside a zero border (`conv_borders`; a residual output
  written over its bordered input takes the border too, `border_donors`; bordered tensors of one shape
  share a buffer of their own, `share_borders`, unless they lie in the arena);
- concat views: a concat's operands written straight into its bytes (`concat_parts`, `concat_place`).
`DependenceOrder` tells which steps data dependence orders, for plans whose branches may run at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Func, Module, Op, Value, prefix_chains
from compiler.memory.placement import Block
from compiler.memory.rules import lone_op, writes_in_place_over
from dialects.graph.creation import Call


def conv_borders(module: Module, f: Func) -> dict[Value, tuple[int, ...]]:
    """The intermediates some kernel's padded conv2d reads as its input, each with that padding as `pads`
    of a mem.alloc (the first such conv's, when two pad it differently). Not a function result (the caller
    owns those buffers). A tensor written in place over one of them takes its border too (`border_donors`)."""
    returned = set(f.results)
    out: dict[Value, tuple[int, ...]] = {}
    for call in f.ops:
        if not isinstance(call, Call):
            continue
        callee = module[call.callee.name]
        for arg, v in zip(callee.args, call.operands):
            if v in out or v in returned or not isinstance(v.owner, Call) or v.type.rank != 4:
                continue
            pad = next((p for op in callee.ops for i, u in enumerate(op.operands)
                        if u is arg and (p := op.padded_operand(i)) is not None and any(p)), None)
            if pad is not None:
                top, left, bottom, right = pad
                out[v] = (0, 0, top, left, 0, 0, bottom, right)
    return out


@dataclass(frozen=True)
class InPlace:
    """Which kernels may write their output over a dying input (compiler.memory.writes_in_place_over)."""

    elementwise: bool
    epilogues: bool


def concat_parts(module: Module, f: Func, steps: list[Op], life: dict, align: int,
                  borders: dict[Value, tuple[int, ...]]) -> dict[Value, tuple[Value, int]]:
    """Value -> (the concat's result whose bytes it lies in, its byte offset there), for every concat whose
    producers may write straight into its bytes: a lone op whose result is its operands end to end
    (`operand_offsets`), its result an arena intermediate without a border, each operand distinct,
    written by a kernel, without a border and at an aligned offset, and read by this concat alone.

    A chain of concats each of whose operands begin the next one's (DenseNet's dense blocks: [x0, y1],
    [x0, y1, y2], ...; fuse's `concat-chains` leaves them unfused) lies in the last one's bytes: every
    operand at its offset there, every earlier concat a prefix at offset 0. None of them runs a kernel.
    Their operands may have other readers (they read it there), and their bytes stay live until the last
    of their members' reads (`planner`)."""
    uses = f.users()
    returned = set(f.results) | set(borders)
    joins: dict[Op, list[int]] = {}
    for call in steps:
        if not isinstance(call, Call) or len(call.results) != 1 or call.result not in life or call.result in returned:
            continue
        op = lone_op(module[call.callee.name])  # (its operands are the kernel's arguments, in order)
        offsets = op.operand_offsets() if op is not None else None
        if offsets is None or len(set(call.operands)) != len(call.operands) or any(o % align for o in offsets):
            continue
        joins[call] = offsets
    out: dict[Value, tuple[Value, int]] = {}
    for root, members in prefix_chains(list(joins)).items():
        if all(u in life and u not in returned and isinstance(u.owner, Call)
               and (members or len(uses.get(u, [])) == 1) for u in root.operands):
            for u, o in zip(root.operands, joins[root]):
                out[u] = (root.result, o)
            for c in members:
                out[c.result] = (root.result, 0)
    return out


def concat_place(v: Value, parts: dict[Value, tuple[Value, int]]) -> tuple[Value, int]:
    """The outermost concat `v` lies in (a concat's result may itself be another's operand), and where."""
    at = 0
    while v in parts:
        v, o = parts[v]
        at += o
    return v, at


def border_donors(module: Module, steps: list[Op], borders: dict[Value, tuple[int, ...]], lts,
                   in_place: InPlace) -> dict[Value, Value]:
    """Tensor -> the bordered input of its kernel it may be written over (same type; dies there; read
    once, element for element): a residual block's output over the block's input. The output takes the
    input's buffer, border and all, though no conv of its own may need the border (b1 over the stem in
    examples/cnn.gir): its readers take the interior."""
    if not in_place.elementwise:
        return {}
    life = {lt.value: lt for lt in lts}
    has = dict(borders)
    out = {}
    for call in steps:
        if len(call.results) != 1 or call.result not in life:
            continue
        v, kernel = call.result, module[call.callee.name]
        for i, u in enumerate(call.operands):
            if (u in has and has.get(v, has[u]) == has[u] and u.type == v.type and life[u].end == life[v].start
                    and _overwritable(call, kernel, i, in_place.epilogues)):
                out[v] = u
                has[v] = has[u]
                break
    return out


def share_borders(borders: dict[Value, tuple[int, ...]], lts, donors: dict[Value, Value]) -> list[list[Value]]:
    """Bordered tensors grouped into buffers: tensors of one shape, dtype and border whose lifetimes do
    not touch share a buffer (each writes the whole interior, and the border is never written, so it
    stays zero for all of them), and a tensor written in place over its donor joins the donor's.
    Greedy by start, into the buffer free longest (ResNet-18's stages hold many maps of one shape, few
    alive at once)."""
    life = {lt.value: lt for lt in lts}
    groups: list[list[Value]] = []
    by_key: dict[tuple, list[list[Value]]] = {}
    for v in sorted(borders, key=lambda v: life[v].start):
        key = (v.type.shape, str(v.type.dtype), borders[v])
        done = [g for g in by_key.get(key, []) if g[-1] is donors.get(v)]
        done = done or [g for g in by_key.get(key, []) if life[g[-1]].end < life[v].start]
        if done:
            g = min(done, key=lambda g: life[g[-1]].end)
            g.append(v)
        else:
            g = [v]
            groups.append(g)
            by_key.setdefault(key, []).append(g)
    return groups


class DependenceOrder:
    """The partial order of steps by data dependence: what must finish before what, whatever the streams."""

    def __init__(self, steps: list[Op]):
        index = {op: i for i, op in enumerate(steps)}
        self.step = index
        self.ancestors: list[int] = []  # bitsets of steps
        for op in steps:
            bits = 0
            for v in op.operands:
                j = index.get(v.owner)
                if j is not None:
                    bits |= self.ancestors[j] | 1 << j
            self.ancestors.append(bits)
        self.readers: dict[Value, list[int]] = {}
        for i, op in enumerate(steps):
            for v in op.operands:
                self.readers.setdefault(v, []).append(i)

    def done_before(self, v: Value, step: int, but: int | None = None) -> bool:
        """Every step that writes or reads `v` (but step `but`) finishes before `step` starts, in every run."""
        return all(j == but or self.ancestors[step] >> j & 1 for j in [self.step[v.owner], *self.readers.get(v, [])])

    def conflict(self, a: Block, b: Block) -> bool:
        return not (all(self.done_before(u, self.step[v.owner]) for u in a.members for v in b.members)
                    or all(self.done_before(v, self.step[u.owner]) for u in a.members for v in b.members))


def in_place_donor(module: Module, call: Op, life: dict, block_of: dict, order: DependenceOrder | None,
           epilogues: bool, borders: dict[Value, tuple[int, ...]]) -> Value | None:
    """The input the kernel may write its output over: same shape, bytes and border, read element for
    element (`writes_in_place_over`), dies here."""
    kernel = module[call.callee.name]
    if len(call.results) != 1:
        return None
    out = call.result
    step = life[out].start
    for i, v in enumerate(call.operands):
        lt = life.get(v)
        # Read once (a second read could see the new value), and nothing else in its block lives on.
        if (lt is not None and v in block_of and lt.end == step and block_of[v].end == step
                and v.type.shape == out.type.shape and v.type.nbytes == out.type.nbytes
                and borders.get(v) == borders.get(out)
                and (order is None or all(order.done_before(w, step, but=step) for w in block_of[v].members))
                and _overwritable(call, kernel, i, epilogues)):
            return v
    return None


def _overwritable(call: Op, kernel: Func, i: int, epilogues: bool) -> bool:
    """The call's operand `i` is read once (a second read could see the new value) and element for
    element, so the kernel may write its result over it."""
    return sum(1 for x in call.operands if x is call.operands[i]) == 1 and writes_in_place_over(kernel, i, epilogues)
