"""Graph -> kernels -> TE -> PrimFuncs. A fused group (a `kernel` function called with graph.call)
becomes one PrimFunc with every stage in it; any other op is a kernel of its own.

Each op's TE lives next to its definition (`op.lower(*tensors)`); this file only wires them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, Value


@dataclass
class Kernel:
    """One compiled function: reads `inputs`, writes `outputs` (values of the entry function)."""

    name: str
    ops: list[Op]
    inputs: list[Value]
    outputs: list[Value]
    # Values of the ops above, by the entry function's value they stand for (callee args -> call operands).
    params: list[Value] = field(default_factory=list)
    prim_func: object = None
    kind: str = "opaque"  # the anchor's fusion kind: decides the schedule rule


def kernels_of(module: Module, entry: str) -> list[Kernel]:
    """The entry function's kernels, in execution order: in a planned function each `exec.launch`; in a
    graph-level one each call of a `kernel` function and each other op (constants are not kernels)."""
    f = module[entry]
    out: list[Kernel] = []
    names: dict[str, int] = {}
    for op in f.ops:
        if op.name == "graph.constant" or op.name.startswith("mem.") or op.name in ("exec.copy", "exec.signal",
                                                                                    "exec.wait"):
            continue
        if op.name in ("graph.call", "exec.launch"):
            callee = module[op.callee.name if op.name == "graph.call" else op.kernel.name]
            if not callee.attrs.get("kernel"):
                raise GCError(f"graph.call of @{callee.name}: codegen needs calls inlined or marked kernel", op.loc)
            inputs = op.inputs if op.name == "exec.launch" else list(op.operands)
            k = Kernel(_unique(callee.name, names), list(callee.ops), list(inputs), list(op.results))
            k.params = list(callee.args)
            k.callee = callee  # type: ignore[attr-defined]
        else:
            k = Kernel(_unique(op.name.split(".")[-1], names), [op], list(op.operands), list(op.results))
            k.params = list(op.operands)
        k.kind = _anchor_kind(k.ops)
        out.append(k)
    return out


def _unique(base: str, names: dict[str, int]) -> str:
    n = names.get(base, 0)
    names[base] = n + 1
    return base if n == 0 else f"{base}_{n}"


_RANK = {"out-elementwise-fusable": 0, "reduction": 1, "opaque": 2, "injective": 3, "broadcast": 4, "elementwise": 5}


def _anchor_kind(ops: list[Op]) -> str:
    kinds = [op.kind for op in ops if op.kind != "constant"]
    return min(kinds, key=lambda k: _RANK.get(k, 9)) if kinds else "elementwise"


def lower_kernel(k: Kernel, func: Func | None = None):
    """TE for the kernel's ops, then one PrimFunc named after the kernel."""
    from tvm import te

    env: dict[Value, object] = {}
    placeholders = []
    for i, v in enumerate(k.params):
        t = te.placeholder(v.type.shape, v.type.dtype.tvm, name=f"p{i}")
        env[v] = t
        placeholders.append(t)
    consts = []
    for op in k.ops:
        if op.name == "graph.constant":
            t = te.placeholder(op.result.type.shape, op.result.type.dtype.tvm, name=f"c{len(consts)}")
            env[op.result] = t
            consts.append((op, t))
            continue
        lower = getattr(op, "lower", None)
        if lower is None:
            raise GCError(f"{op.name} has no lowering to TVM yet", op.loc)
        outs = lower(*op._group([env[v] for v in op.operands]))
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        for r, t in zip(op.results, outs):
            env[r] = t
    results = _kernel_results(k, func)
    outs = [_materialize(env[v], i, placeholders + [t for _, t in consts]) for i, v in enumerate(results)]
    k.const_ops = [op for op, _ in consts]  # type: ignore[attr-defined]
    prim = te.create_prim_func([*placeholders, *[t for _, t in consts], *outs])
    k.prim_func = prim.with_attr("global_symbol", k.name)
    return k.prim_func


def _kernel_results(k: Kernel, func: Func | None) -> list[Value]:
    callee = getattr(k, "callee", None)
    return list(callee.results) if callee is not None else list(k.ops[-1].results)


def _materialize(t, i: int, inputs: list):
    """A kernel output must be a computed stage: an op lowered to its input (dropout) gets a copy."""
    from tvm import te

    if any(t.same_as(p) for p in inputs) or isinstance(t.op, te.PlaceholderOp):
        return te.compute(t.shape, lambda *idx: t(*idx), name=f"copy{i}")
    return t
