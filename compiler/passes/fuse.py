"""fuse: group ops into kernels by their fusion kind (TVM's FuseOps), each group outlined into a function.

Groups form in three phases, in TVM's order of priority, so that a matmul keeps its bias add even when
a reshape follows it:
1. an out-elementwise-fusable op (matmul, conv2d, pools) takes the chain of elementwise/broadcast ops
   after it: bias add, batch_norm, relu, a residual add;
2. a reduction (softmax, layer_norm, reduce_*) takes its elementwise/broadcast epilogue chain, then the
   elementwise/broadcast ops whose every user is in the group (its prologue);
3. the elementwise, broadcast and injective ops left over group greedily, from the last op backwards.

An op of several results (a split) can join no group, so where it offers one op per result
(`Op.per_result`: a split's sections as slices) those replace it first, each free to fuse with its reader.

Every group has one output, its last op; any other member joins only when all its users are members,
so no work is duplicated. That also keeps the graph acyclic once each group is one call:
a non-output member's users are members, so following users from any member reaches the output
without leaving the group, and the output is its latest member in program order. Values leave a group
only through its output, so a path that leaves group G1 and comes back runs o1 -> (a member of G2) ...
-> o2 -> ... -> a member of G1, and program order gives pos(o1) < pos(o2) < ... < pos(a member of G1)
<= pos(o1), which is impossible. Hence the call placed at the output's position sees all its inputs
defined (every member precedes the output) and the verifier's dominance check holds.

Each group of 2+ ops becomes `func @fused_<names>(inputs) -> T attributes {kernel = true}` right after
its caller, and `%r = graph.call(inputs) {callee = @fused_...}` whose location merges every fused
op's location. A constant whose users all sit in one kernel moves into it. Kernels are not fused
again, so the pass is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.builder import Builder
from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, Value, more_elements, prefix_chains
from compiler.passes import Pass
from compiler.rewrite import outline
from dialects.graph.shape import Transpose

ANCHOR = "out-elementwise-fusable"
FUSABLE = ("elementwise", "broadcast", "injective", "reduction", ANCHOR)
EPILOGUE = frozenset({"elementwise", "broadcast"})
NAME_OPS = 5  # kernel names list at most this many ops, then `_etc`


@dataclass(eq=False)
class Group:
    """Ops that become one kernel; `output` is the only member whose result may be used outside."""

    output: Op
    members: dict[Op, None]  # ordered, so that the grouping is deterministic
    open: bool  # phase-3 groups still take members; anchor and reduction groups are complete

    def add(self, op: Op, home: dict[Op, Group]) -> None:
        self.members[op] = None
        home[op] = self


def _per_result(f: Func) -> int:
    """Ops of several results replaced by one op per result where the op offers them (`Op.per_result`: a
    split's sections as slices), so that each result may fuse with its reader; how many were."""
    cut = 0
    for op in [op for op in f.ops if len(op.results) > 1]:
        at = f.ops.index(op)
        b = Builder(f, at, op.loc)
        parts = op.per_result(b)
        if parts is None:
            continue
        for old, new in zip(op.results, parts):
            if new.name is None and old.name and old in f.results:
                new.name = old.name
            f.replace_all_uses(old, new)
        f.ops.remove(op)
        cut += 1
    return cut


def _start(op: Op, home: dict[Op, Group], open: bool) -> Group:
    g = home[op] = Group(op, {op: None}, open)
    return g


@dataclass
class Fuse(Pass):
    """Operator fusion: each group of ops becomes a kernel function and one call of it."""

    name = "fuse"
    summary = "fuse ops into kernels by kind: matmul/conv + epilogue, reduction + prologue, elementwise chains"
    max_ops: int = field(default=16, metadata={"help": "the most ops one kernel holds (constants not counted)"})
    kinds: tuple[str, ...] = field(default=FUSABLE, metadata={"help": "the op kinds that may fuse (default: all)"})
    concat_chains: bool = field(default=False, metadata={
        "help": "leave unfused the ops whose result is their operands end to end (concats) that form a chain, "
                "each one's operands beginning the next one's: one buffer can then hold them all "
                "(plan-memory's concat-views; DenseNet's dense blocks)"})

    def __post_init__(self) -> None:
        self._chained: set[Op] = set()
        unknown = [k for k in self.kinds if k not in FUSABLE]
        if unknown:
            raise GCError(f"pass 'fuse': unknown kind '{unknown[0]}' (kinds: {', '.join(FUSABLE)})")
        if self.max_ops < 1:
            raise GCError(f"pass 'fuse': max-ops must be at least 1, got {self.max_ops}")

    def run(self, module: Module) -> None:
        funcs: list[Func] = []
        taken = set(module.funcs)
        for f in module:
            funcs.append(f)
            if f.attrs.get("kernel"):
                continue
            cut = _per_result(f)
            if cut:
                self.stats["ops-cut-per-result"] += cut
            groups = [g for g in self.groups(f) if len(g.members) > 1]
            funcs += _outline(f, groups, taken)
            self.stats["groups-fused"] += len(groups)
            self.stats["ops-fused"] += sum(len(g.members) for g in groups)
        module.funcs = {f.name: f for f in funcs}

    def kind(self, op: Op | None) -> str:
        """The op's kind if it may fuse; a multi-result op (split) is opaque: a kernel has one result."""
        if op is None or op.kind not in self.kinds or len(op.results) != 1 or op in self._chained:
            return "opaque"
        return op.kind

    def groups(self, f: Func) -> list[Group]:
        """Partition the fusable ops of `f` into groups, by the three phases above."""
        self._chained = chained_concats(f) if self.concat_chains else set()
        uses = f.users()
        home: dict[Op, Group] = {}
        pos = {op: i for i, op in enumerate(f.ops)}

        def joinable(op: Op | None, g: Group, kinds: frozenset[str]) -> bool:
            """Not grouped yet, of one of `kinds`, room left in `g`, and every user already in `g`."""
            if op in home or self.kind(op) not in kinds or len(g.members) >= self.max_ops:
                return False
            users = uses.get(op.result, [])
            return bool(users) and all(u in g.members for u, _ in users)

        for op in f.ops:  # phase 1: anchors, their epilogue chains, a transposed matmul operand
            if op not in home and self.kind(op) == ANCHOR:
                g = _start(op, home, open=False)
                self.extend_forward(g, uses, home, pos)
                for v in op.operands if op.reads_transposed_operands else ():
                    if _swaps_last_two(v.owner) and joinable(v.owner, g, frozenset({"injective"})):
                        g.add(v.owner, home)  # read in place by the matmul: never materialized
        for op in f.ops:  # phase 2: reductions, their epilogues, then their prologues
            if op in home or self.kind(op) != "reduction":
                continue
            g = _start(op, home, open=False)
            self.extend_forward(g, uses, home, pos)
            while True:  # one at a time: a producer may qualify only once another has joined
                p = next((p for p in _producers(g) if joinable(p, g, EPILOGUE)), None)
                if p is None:
                    break
                g.add(p, home)
        for op in reversed(f.ops):  # phase 3: what is left, from the last op backwards
            if op in home or self.kind(op) not in EPILOGUE | {"injective"}:
                continue
            first_user = next((u for u, _ in uses.get(op.result, [])), None)
            g = home.get(first_user)
            if g is not None and g.open and joinable(op, g, EPILOGUE | {"injective"}):
                g.add(op, home)
            else:
                _start(op, home, open=True)
        return list(dict.fromkeys(home.values()))

    def extend_forward(self, g: Group, uses: dict, home: dict[Op, Group], pos: dict[Op, int]) -> None:
        """Append elementwise/broadcast ops while the output has one user (an epilogue chain), or while
        several users meet again in one op: SiLU's x * sigmoid(x), hardswish's x * relu6(x + 3) / 6."""
        while len(g.members) < self.max_ops:
            users = {u for u, _ in uses.get(g.output.result, [])}
            u = users.pop() if len(users) == 1 else None
            if u is None:
                closing = self.diamond(g, uses, home, pos)
                if not closing:
                    return
                for op in closing:
                    g.add(op, home)
                g.output = closing[-1]
                continue
            if u in home or not self.epilogue(u) or self.expands(g, u):
                return
            g.add(u, home)
            g.output = u

    def epilogue(self, op: Op) -> bool:
        """Elementwise and broadcast ops, and the injective ops that say they read each element from one
        place (a slice)."""
        kind = self.kind(op)
        return kind in EPILOGUE or (kind == "injective" and getattr(op, "fuses_as_epilogue", False))

    def expands(self, g: Group, op: Op) -> bool:
        """Whether `op` would spread an anchor's result over a larger tensor (squeeze-and-excitation's
        x * sigmoid(conv(pool(x))): the conv's 1x1 map scales a 14x14 one). A conv or matmul schedule
        computes its result once per output element, so there it would be computed again for every element
        it is broadcast to (EfficientNet's: 800 us a kernel, 196 times the work). A reduction's rows
        schedule computes each row once, then its epilogue over the row: there spreading is the point."""
        anchor = next((m for m in g.members if m.kind == ANCHOR), None)
        return anchor is not None and more_elements(op.result.type.shape, anchor.results[0].type.shape)

    def diamond(self, g: Group, uses: dict, home: dict[Op, Group], pos: dict[Op, int]) -> list[Op]:
        """The shortest run of epilogue ops after the output, in program order, that closes on one op: every
        member but the last used only inside the group. [] if there is none within max_ops."""
        reach: set[Op] = set()
        todo = [g.output]
        while todo:  # the epilogue ops reachable from the output, within reach of max_ops
            for u, _ in uses.get(todo.pop().result, []):
                if u not in reach and u not in home and self.kind(u) in EPILOGUE and len(reach) < self.max_ops:
                    reach.add(u)
                    todo.append(u)
        ranked = [op for op in sorted(reach, key=pos.get) if not self.expands(g, op)]
        for end in range(1, min(len(ranked), self.max_ops - len(g.members)) + 1):
            run = ranked[:end]
            inside = set(g.members) | set(run)
            if all(all(u in inside for u, _ in uses.get(m.result, [])) for m in [*g.members, *run[:-1]]):
                return run
        return []


def chained_concats(f: Func) -> set[Op]:
    """The ops of `f` whose result is their operands end to end (`operand_offsets`: a concat of one image)
    that form a chain with others of the same class and attributes (`ir.prefix_chains`: each one's operands
    beginning the next one's; two chains sharing a prefix stay fused): a DenseNet block concatenates
    [x0, y1], then [x0, y1, y2], ... Left as ops of their own, all of them can
    lie in the last one's bytes, each a prefix, every operand written there by its producer, and none runs
    a kernel (compiler/memory/strategies.concat_parts); fused into their readers, each was a kernel
    choosing among all its operands per channel (DenseNet-121: 57 such, most of its LLVM time)."""
    joins = [op for op in f.ops if len(op.results) == 1 and len(op.operands) > 1 and op.operand_offsets() is not None]
    by_first: dict[tuple, list[Op]] = {}
    for op in joins:
        by_first.setdefault((type(op), repr(sorted(op.attrs.items())), op.operands[0]), []).append(op)
    return {op for ops in by_first.values() for root, members in prefix_chains(ops).items() if members
            for op in (root, *members)}


def _swaps_last_two(op: Op | None) -> bool:
    """A transpose that only swaps the last two axes (matmul(x, transpose(w)): ONNX Gemm with transB)."""
    if not isinstance(op, Transpose):
        return False
    rank = op.result.type.rank
    perm = [p % rank for p in op.perm] if op.perm is not None else list(reversed(range(rank)))
    return rank >= 2 and perm == [*range(rank - 2), rank - 1, rank - 2]


def _producers(g: Group) -> list[Op]:
    return [v.owner for m in g.members for v in m.operands if v.owner is not None]


def _outline(f: Func, groups: list[Group], taken: set[str]) -> list[Func]:
    """Replace each group in `f` by a call of a new kernel function; returns the kernels in order."""
    uses = f.users()
    where: dict[Op, Group] = {op: g for g in groups for op in g.members}
    _copy_scalar_constants(f, uses, where)
    for op in f.ops:
        homes = [where.get(u) for u, _ in uses.get(op.result, [])] if op.kind == "constant" else []
        if homes and homes[0] is not None and all(h is homes[0] for h in homes):
            where[op] = homes[0]  # a constant only this kernel reads moves into it
    bodies: dict[Group, list[Op]] = {}
    for op in f.ops:
        if op in where:
            bodies.setdefault(where[op], []).append(op)

    kernels: list[Func] = []
    repl: dict[Value, Value] = {}
    new_ops: list[Op] = []
    for op in f.ops:
        g = where.get(op)
        if g is None:
            op.operands = [repl.get(v, v) for v in op.operands]
            new_ops.append(op)
        elif op is g.output:
            kernel, call = _kernel(bodies[g], op, taken)
            call.operands = [repl.get(v, v) for v in call.operands]
            repl[op.result] = call.result
            new_ops.append(call)
            kernels.append(kernel)
    f.ops = new_ops
    f.results = [repl.get(v, v) for v in f.results]
    return kernels


def _copy_scalar_constants(f: Func, uses: dict, where: dict[Op, Group]) -> None:
    """A one-element constant that several kernels read gets a copy in each (`where` says so): inside, the
    lowering sees its value (GELU's exponent 3 becomes x*x*x where a parameter was a libm pow per element:
    GPT-2's 12 GELUs share one 3.0 after cse). The original stays for readers outside any kernel."""
    for op in list(f.ops):
        if op.kind != "constant" or op.result.type.size > 1:
            continue
        homes = {where.get(u) for u, _ in uses.get(op.result, [])}
        if len(homes - {None}) < 2 and not (None in homes and len(homes) > 1):
            continue  # one kernel's (moved whole below), or no kernel's
        at = f.ops.index(op)
        for g in homes - {None}:
            copy = type(op)([], dict(op.attrs), [op.result.type], op.loc)
            copy.result.name = op.result.name
            for m in g.members:
                m.operands = [copy.result if v is op.result else v for v in m.operands]
            f.ops.insert(at, copy)
            where[copy] = g
        if None not in homes:
            f.ops.remove(op)


def _kernel(body: list[Op], output: Op, taken: set[str]) -> tuple[Func, Op]:
    """The kernel function holding `body` (moved, in program order) and the call that replaces it."""
    return outline(body, [output.result], _kernel_name([op for op in body if op.kind != "constant"]), taken)


def _kernel_name(ops: list[Op]) -> str:
    names = [op.name.split(".", 1)[-1] for op in ops]
    return "fused_" + "_".join(names[:NAME_OPS]) + ("_etc" if len(names) > NAME_OPS else "")
