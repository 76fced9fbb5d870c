"""The rules the planner's strategies follow and the checker accepts, written once for both: which
kernel may write its result over an input (in place), and which launch copies nothing (a concat whose
operands already lie in its bytes)."""

from __future__ import annotations

from compiler.ir import Func, Module, Op, Value

IN_PLACE_KINDS = frozenset({"elementwise", "broadcast", "constant"})


def writes_in_place_over(kernel: Func, index: int, epilogues: bool = True) -> bool:
    """Whether `kernel` may write its one result over its argument `index`, of the result's shape: every
    element of the result reads that argument at its own index only, before it is written. So in a kernel
    made only of elementwise ops; and (`epilogues`) in one whose other ops (a conv, a matmul) never read
    the argument, which flows only through elementwise ops of the result's shape into the result: the
    residual `add` in a conv's epilogue reads x[i] as it writes y[i]."""
    if len(kernel.results) != 1 or kernel.args[index].type.shape != kernel.results[0].type.shape:
        return False
    if all(op.kind in IN_PLACE_KINDS for op in kernel.ops):
        return True
    if not epilogues:
        return False
    shape, uses = kernel.results[0].type.shape, kernel.users()
    todo, seen = [kernel.args[index]], set()
    while todo:
        v = todo.pop()
        for op, _ in uses.get(v, []):
            if op is None or op in seen:  # the result itself, or an op checked already
                continue
            if op.kind not in ("elementwise", "broadcast") or any(r.type.shape != shape for r in op.results):
                return False
            seen.add(op)
            todo += op.results
    return True


def lone_op(kernel: Func) -> Op | None:
    """The one op of a kernel function, its operands the kernel's arguments in order and its results the
    kernel's, else None (an operand read twice is one argument: not in order, so None)."""
    ops = [o for o in kernel.ops if o.kind != "constant"]
    if len(ops) != 1 or ops[0].operands != kernel.args or kernel.results != ops[0].results:
        return None
    return ops[0]


def launched_op(module: Module, op: Op) -> Op | None:
    if op.name != "exec.launch" or op.kernel.name not in module:
        return None
    return lone_op(module[op.kernel.name])


def copies_nothing(module: Module, f: Func) -> set[Op]:
    """The launches of planned `f` whose every input already lies where the kernel puts it in its one
    result, in the same arena (a concat whose operands' producers wrote into its bytes): nothing to run."""
    where: dict[Value, tuple[Value, int]] = {}  # value -> (arena, offset)
    out = set()
    for op in f.ops:
        if op.name == "mem.view":
            where[op.result] = (op.operands[0], op.offset)
        elif op.name == "exec.launch":
            for d, r in zip(op.destinations, op.results):
                if d in where:
                    where[r] = where[d]
            if launch_copies_nothing(module, op, where):
                out.add(op)
    return out


def launch_copies_nothing(module: Module, op: Op, where: dict[Value, tuple]) -> bool:
    """Whether launch `op` copies nothing, `where` giving the arena and offset of the values in the arena
    (the first two entries of each tuple: `lower.Planned.place` adds the end)."""
    lone = launched_op(module, op)
    offsets = lone.operand_offsets() if lone is not None and len(op.results) == 1 else None
    ins = op.inputs
    if offsets is None or op.destinations[0] not in where or not ins:
        return False
    arena, base = where[op.destinations[0]][:2]
    return all(v in where and where[v][:2] == (arena, base + o) for v, o in zip(ins, offsets))
