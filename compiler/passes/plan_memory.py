"""plan-memory: give every intermediate tensor an offset in one arena, and make the kernel calls explicit.

Input: a graph-level function, usually after `fuse` and `schedule` (its ops run in the order written).
Output: the same function in the `mem`/`exec` dialects:

    %arena = mem.arena {size = 524288} : tensor<524288xi8>
    %0 = mem.view(%arena) {offset = 0} : tensor<64x1024xf32>
    %h = exec.launch(%x, %w1, %b1, %0) {kernel = @fused_matmul_add_relu} : tensor<64x1024xf32>
    %1 = mem.alloc() : tensor<64x10xf32>
    %y = exec.launch(%h, %w2, %b2, %1) {kernel = @fused_matmul_add} : tensor<64x10xf32>
    return %y

- Every op that is not already a call of a `kernel` function is outlined into one (`@relu`), so every
  step is a launch; calls of ordinary functions are inlined first.
- Lifetimes run from the step that writes a tensor to the last step that reads it
  (`compiler.memory.lifetimes`); tensors whose lifetimes do not overlap share bytes. Offsets come from
  best-fit placement over several orders (`compiler.memory.place`), aligned to `align` bytes.
- In place: a kernel made only of elementwise/broadcast ops writes its output over an input of the same
  shape and size that dies at it (each output element reads only that input element, at its own index).
  With `in-place-epilogues` (on in the CPU build), so does a conv or matmul kernel over an input only its
  elementwise epilogue reads: a residual block's output over the block's input, which its `add` reads.
- `conv-borders` (on in the CPU build): a tensor that a kernel's padded conv2d reads as its input
  gets a buffer of its own outside the arena with a zero border as wide as that padding
  (`mem.alloc {pads = [0, 0, 1, 1, 0, 0, 1, 1]}`); its producer writes the interior, and the
  convolution reads the bordered whole in place instead of copying its input padded on every call.
  The border is never written, so it stays zero from one call to the next.
- `borders-in-arena` (on in the CPU build, with `conv-borders`): those tensors are views of the arena,
  placed with their borders like any other tensor (`mem.view {offset = .., pads = [..]}`), so their
  bytes serve other tensors at other times; the kernel that writes such a tensor writes its border's
  zeros as well (a few stores a row: what sharing the bytes costs).
- `concat-views` (on in the CPU build): where a concat's result is its operands laid end to end (one
  image, channels joined: `Op.operand_offsets`), each operand's producer writes straight into its place
  in the concat's bytes, and the concat's launch, left in the plan, copies each operand onto itself:
  the builder drops it (`compiler.memory.copies_nothing`). Every operand must be an intermediate a kernel
  writes, read by that concat alone, at an aligned offset; the concat's result an intermediate of the
  arena (not bordered, not returned).
- Arguments and constants stay where they are; each result gets a buffer of its own (`mem.alloc`) that
  the caller owns, written by the launch that computes it (or `exec.copy` for a returned argument,
  constant, or a value returned twice).
The plan is checked (`compiler.memory.check_plan`) before the pass returns.
Statistics: arena-bytes, naive-bytes (every intermediate its own buffer), lower-bound-bytes, in-place,
bordered-bytes (the zero-bordered buffers, outside the arena; part of arena-bytes), when there are any.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, SymbolRef, Value
from compiler.memory import (
    Block,
    check_plan,
    is_planned,
    lifetimes,
    lone_op,
    place,
    plan_stats,
    round_up,
    writes_in_place_over,
)
from compiler.passes import Pass
from compiler.passes.fuse import unique_name
from dialects.exec import Copy, Launch
from dialects.graph.creation import Call
from dialects.mem import Alloc, Arena, View, padded_bytes


@dataclass
class PlanMemory(Pass):
    name = "plan-memory"
    summary = "one arena for all intermediates (lifetimes, best-fit offsets, in-place); explicit mem/exec IR"
    align: int = field(default=64, metadata={"help": "offset alignment in bytes (64 for CPU, 256 for CUDA)"})
    in_place: bool = field(default=True, metadata={"help": "let elementwise kernels write over a dying input"})
    in_place_epilogues: bool = field(default=False, metadata={
        "help": "let a conv/matmul kernel write over a dying input that only its elementwise epilogue reads"})
    concurrent: bool = field(default=False, metadata={
        "help": "share bytes only between tensors ordered by data dependence, so that independent branches "
                "may run at once (for assign-streams)"})

    concat_views: bool = field(default=False, metadata={
        "help": "let the producers of a concat's operands write into the concat's bytes (no copy)"})
    conv_borders: bool = field(default=False, metadata={
        "help": "give the input of a padded conv2d a zero-bordered buffer of its own, read in place"})
    borders_in_arena: bool = field(default=False, metadata={
        "help": "with conv-borders: place the bordered tensors in the arena, their writers writing the border"})

    def __post_init__(self) -> None:
        if self.align < 1 or self.align & (self.align - 1):
            raise GCError(f"pass 'plan-memory': align must be a power of two, got {self.align}")

    def run(self, module: Module) -> None:
        taken = set(module.funcs)
        todo = [f for f in module if not f.attrs.get("kernel") and not is_planned(f)]
        for f in todo:  # every caller sees its callees as written, before any is planned
            _inline_calls(module, f)
        order: list[Func] = []
        for f in module:
            order.append(f)
            if f not in todo:
                continue
            kernels = _outline(module, f, taken)
            order += kernels
            borders = _borders(module, f) if self.conv_borders else {}
            in_place = _InPlace(self.in_place, self.in_place_epilogues)
            views = self.concat_views and not self.concurrent
            stats = _plan(module, f, self.align, in_place, self.concurrent, borders, views,
                          self.borders_in_arena and not self.concurrent)
            self.stats.update(stats)
        module.funcs = {f.name: f for f in order}
        for f in module:
            if is_planned(f):
                check_plan(module, f)


def _inline_calls(module: Module, f: Func) -> None:
    """Replace calls of ordinary (non-kernel) functions by copies of their bodies, innermost first."""
    while True:
        i = next((i for i, op in enumerate(f.ops) if isinstance(op, Call)
                  and not module[op.callee.name].attrs.get("kernel")), None)
        if i is None:
            return
        call = f.ops[i]
        body = module[call.callee.name].clone()
        env = dict(zip(body.args, call.operands))
        for op in body.ops:
            op.operands = [env.get(v, v) for v in op.operands]
        f.ops[i : i + 1] = body.ops
        for r, v in zip(call.results, body.results):
            f.replace_all_uses(r, env.get(v, v))


def _outline(module: Module, f: Func, taken: set[str]) -> list[Func]:
    """Every op that is not a constant or a kernel call becomes a call of a one-op kernel function. A
    constant only that op reads moves into the kernel, as fuse does for its groups: the schedule may then
    read it in a packed layout made once at build time (a lone matmul's bound weights)."""
    out = []
    uses = f.users()
    for op in list(f.ops):
        if op.kind == "constant" or isinstance(op, Call):
            continue
        # In operand order (a set's order is the values' ids: the kernel's constants, and so the artifact,
        # changed from one compile of the same model to the next).
        own = list(dict.fromkeys(v for v in op.operands if v.owner is not None and v.owner.kind == "constant"
                                 and len(uses.get(v, [])) == 1 and v not in f.results))
        inner = {v: type(v.owner)([], dict(v.owner.attrs), [v.type], v.owner.loc) for v in own}
        args = {v: Value(v.type, v.name) for v in op.operands if v not in own}
        name = unique_name(op.name.split(".", 1)[-1], taken)
        k = Func(name, list(args.values()), [r.type for r in op.results], op.loc)
        k.attrs = {"kernel": True}
        operands = [args[v] if v in args else inner[v].result for v in op.operands]
        moved = type(op)(operands, dict(op.attrs), [r.type for r in op.results], op.loc)
        k.ops = [*inner.values(), moved]
        k.results = list(moved.results)
        for r, m in zip(op.results, moved.results):
            m.name = r.name
        call = Call(list(args), {"callee": SymbolRef(name)}, [r.type for r in op.results], op.loc)
        for r, c in zip(op.results, call.results):
            c.name = r.name
        f.ops[f.ops.index(op)] = call
        f.ops = [o for o in f.ops if not (o.kind == "constant" and o.result in own)]
        for r, c in zip(op.results, call.results):
            f.replace_all_uses(r, c)
        module.add(k)
        out.append(k)
    return out


def _borders(module: Module, f: Func) -> dict[Value, tuple[int, ...]]:
    """The intermediates some kernel's padded conv2d reads as its input, each with that padding as `pads`
    of a mem.alloc (the first such conv's, when two pad it differently). Not a function result (the caller
    owns those buffers), and nothing written in place over it or over which it is written."""
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
class _InPlace:
    """Which kernels may write their output over a dying input (compiler.memory.writes_in_place_over)."""

    elementwise: bool
    epilogues: bool


def _plan(module: Module, f: Func, align: int, in_place: _InPlace, concurrent: bool,
          borders: dict[Value, tuple[int, ...]], concat_views: bool = False, in_arena: bool = False) -> dict[str, int]:
    steps = [op for op in f.ops if op.kind != "constant"]
    every = lifetimes(f, steps, align)
    donors = _border_donors(module, steps, borders, every, in_place) if borders and not concurrent else {}
    borders = dict(borders)
    for v, u in donors.items():  # in program order: a donor may itself have taken its input's buffer
        borders[v] = borders[u]
    if in_arena:  # bordered tensors in the arena, at their padded size
        lts = [replace(lt, size=round_up(padded_bytes(lt.value.type, borders[lt.value]), align))
               if lt.value in borders else lt for lt in every]
    else:
        lts = [lt for lt in every if lt.value not in borders]
    life = {lt.value: lt for lt in lts}
    order = _Order(steps) if concurrent else None
    parts = _concat_parts(module, f, steps, life, align, borders) if concat_views else {}
    # A concat's bytes are live from the first of its operands' writes (they write into them).
    place_of = {v: _place(v, parts) for v in parts}
    first = {}
    for v, (root, _) in place_of.items():
        first[root] = min(first.get(root, life[root].start), life[v].start)
    # Storage blocks: one per tensor, except that an in-place output joins its input's block, and a
    # concat's operands lie in the concat's.
    block_of: dict[Value, Block] = {}
    joined = 0
    for lt in lts:
        if lt.value in parts:
            continue
        if lt.value in first:
            block_of[lt.value] = Block(lt.size, first[lt.value], lt.end, members=[lt.value])
            continue
        donor = (_donor(module, lt.value.owner, life, block_of, order, in_place.epilogues, borders)
                 if in_place.elementwise else None)
        if donor is not None:
            b = block_of[donor]
            b.end = max(b.end, lt.end)
            b.members.append(lt.value)
            block_of[lt.value] = b
            joined += 1
        else:
            block_of[lt.value] = Block(lt.size, lt.start, lt.end, members=[lt.value])
    offset_in = {v: at for v, (_, at) in place_of.items()}  # a concat operand -> its byte offset in its block
    for v, (root, _) in place_of.items():
        block_of[v] = block_of[root]
        block_of[root].members.append(v)
    blocks = list(dict.fromkeys(block_of.values()))
    apart: dict[Block, set[Block]] = {}
    for step in steps:  # what one kernel writes, against all it touches (4K aliasing: compiler.memory.PAGE)
        outs = {block_of[v] for v in step.results if v in block_of}
        touched = outs | {block_of[v] for v in step.operands if v in block_of}
        for o in outs:
            for t in touched - {o}:
                apart.setdefault(o, set()).add(t)
                apart.setdefault(t, set()).add(o)
    size = place(blocks, align, conflict=order.conflict if order else None, apart=apart)
    # Bordered buffers are shared only by tensors of one shape and border; where they would make the plan
    # bigger than a buffer per tensor (a short chain of convs: little else to share), the convs copy
    # their input padded instead.
    shared = [] if in_arena else _share_borders(borders, every, donors)
    bordered = sum(padded_bytes(group[0].type, borders[group[0]]) for group in shared)
    if borders and size + bordered > sum(lt.value.type.nbytes for lt in every):
        return _plan(module, f, align, in_place, concurrent, {}, concat_views)
    _rewrite(f, steps, block_of, size, align, borders, shared, offset_in)
    figures = plan_stats(f)
    stats = {"arena-bytes": figures["arena_bytes"], "naive-bytes": figures["naive_bytes"],
             "lower-bound-bytes": figures["lower_bound_bytes"], "in-place": joined}
    if figures["bordered_bytes"]:
        stats["bordered-bytes"] = figures["bordered_bytes"]
    if parts:
        stats["concat-views"] = len(parts)
    return stats


def _concat_parts(module: Module, f: Func, steps: list[Op], life: dict, align: int,
                  borders: dict[Value, tuple[int, ...]]) -> dict[Value, tuple[Value, int]]:
    """Operand -> (the concat's result, its byte offset there) for every concat whose producers may write
    straight into its bytes: a lone op whose result is its operands end to end (`operand_offsets`), its
    result an arena intermediate without a border, each operand distinct, written by a kernel, read by
    this concat alone, without a border and at an aligned offset."""
    uses = f.users()
    returned = set(f.results) | set(borders)
    out: dict[Value, tuple[Value, int]] = {}
    for call in steps:
        if not isinstance(call, Call) or len(call.results) != 1 or call.result not in life or call.result in borders:
            continue
        op = lone_op(module[call.callee.name])  # (its operands are the kernel's arguments, in order)
        offsets = op.operand_offsets() if op is not None else None
        if offsets is None or len(set(call.operands)) != len(call.operands) or any(o % align for o in offsets):
            continue
        if all(u in life and u not in returned and isinstance(u.owner, Call) and len(uses.get(u, [])) == 1
               for u in call.operands):
            for u, o in zip(call.operands, offsets):
                out[u] = (call.result, o)
    return out


def _place(v: Value, parts: dict[Value, tuple[Value, int]]) -> tuple[Value, int]:
    """The outermost concat `v` lies in (a concat's result may itself be another's operand), and where."""
    at = 0
    while v in parts:
        v, o = parts[v]
        at += o
    return v, at


def _border_donors(module: Module, steps: list[Op], borders: dict[Value, tuple[int, ...]], lts,
                   in_place: _InPlace) -> dict[Value, Value]:
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


def _share_borders(borders: dict[Value, tuple[int, ...]], lts, donors: dict[Value, Value]) -> list[list[Value]]:
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


class _Order:
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


def _donor(module: Module, call: Op, life: dict, block_of: dict, order: _Order | None,
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


def _rewrite(f: Func, steps: list[Op], block_of: dict[Value, Block], size: int, align: int,
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

