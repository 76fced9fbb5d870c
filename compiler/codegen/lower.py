"""Graph -> kernels -> TE -> PrimFuncs. A fused group (a `kernel` function called with graph.call)
becomes one PrimFunc with every stage in it; any other op is a kernel of its own.

Each op's TE lives next to its definition (`op.lower(*tensors)`); this file only wires them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, Value
from dialects.mem import padded_shape, padded_strides


@dataclass
class Kernel:
    """One compiled function: reads `inputs`, writes `outputs` (values of the entry function)."""

    name: str
    ops: list[Op]
    inputs: list[Value]
    outputs: list[Value]
    # Values of the ops above, by the entry function's value they stand for (callee args -> call operands).
    params: list[Value] = field(default_factory=list)
    # The kernel function a call runs (its results are the kernel's, whatever op computes them last);
    # None for a single op compiled as a kernel of its own.
    callee: Func | None = None
    kind: str = "opaque"  # the anchor's fusion kind: decides the schedule rule
    # The zero border (mem.alloc pads) around each input's and output's storage, or None (compact).
    in_pads: list = field(default_factory=list)
    out_pads: list = field(default_factory=list)
    # Whether the kernel writes each output's border's zeros too (a bordered view of the arena, whose bytes
    # other tensors use at other times; a bordered buffer of its own is zeroed once, when it is made).
    out_borders: list = field(default_factory=list)
    # How the PrimFunc takes each bordered input: "whole" (a conv reads the padded buffer in place) or
    # "interior" (a strided view of the tensor itself); None for compact inputs.
    in_views: list = field(default_factory=list)
    # The constants the kernel reads, in the order of its PrimFunc's c0, c1, ... parameters.
    const_ops: list = field(default_factory=list)

    def __post_init__(self) -> None:
        # Both follow from the ops and the borders: known once the kernel is, before anything is lowered.
        self.const_ops = [op for op in self.ops if op.kind == "constant"]
        pads = self.in_pads + [None] * (len(self.params) - len(self.in_pads))
        self.in_views = [None if p is None else "whole" if _reads_padded(self.ops, v, p) else "interior"
                         for v, p in zip(self.params, pads)]


@dataclass
class Planned:
    """A function read once for code generation: its kernels in execution order (`kernel_of` a launch or
    op), and in a planned function what the memory plan says of their tensors' bytes: where a value lies
    in the arena (`place`: arena, first byte, end byte, its border included), its zero border (`pads`), and
    the values that must share a layout because they share bytes (`groups`: a buffer's tensors, an output
    written over an input). Lowering, the layout choice and the runtime plan read this, not the IR again."""

    f: Func
    kernels: list[Kernel] = field(default_factory=list)
    kernel_of: dict[Op, Kernel] = field(default_factory=dict)
    launches: list[Op] = field(default_factory=list)
    place: dict[Value, tuple[Value, int, int]] = field(default_factory=dict)
    pads: dict[Value, tuple[int, ...]] = field(default_factory=dict)
    groups: dict[Value, list[Value]] = field(default_factory=dict)
    # Values that ops other than launches read (a copy's source, a result handed back): their layout is NCHW.
    read_elsewhere: set[Value] = field(default_factory=set)


def read(module: Module, entry: str) -> Planned:
    """The entry function's kernels: in a planned function each `exec.launch` that runs code (not one
    whose results are empty, nor a concat whose operands already lie in its bytes); in a graph-level one
    each call of a `kernel` function and each other op (constants are not kernels)."""
    from compiler.memory import launch_copies_nothing
    from dialects.exec import Launch
    from dialects.mem import Alloc, View

    f = module[entry]
    out = Planned(f)
    names: dict[str, int] = {}
    shared: set[Value] = set()  # bordered values in the arena: their writers write the border
    parent: dict[Value, Value] = {}  # union-find over values sharing bytes
    last_in: dict[Value, Value] = {}  # an allocation -> the last value written into it

    def find(v: Value) -> Value:
        while parent.get(v, v) is not v:
            v = parent[v]
        return v

    def union(a: Value, b: Value) -> None:
        ra, rb = find(a), find(b)
        if ra is not rb:
            parent[ra] = rb

    for op in f.ops:
        if not isinstance(op, Launch):
            out.read_elsewhere.update(op.operands)
        if op.kind == "constant":
            continue
        if isinstance(op, View):
            out.place[op.result] = (op.operands[0], op.offset, op.offset + op.padded_bytes)
            if op.pads:
                out.pads[op.result] = tuple(op.pads)
                shared.add(op.result)
            continue
        if isinstance(op, Alloc) and op.pads:
            out.pads[op.result] = tuple(op.pads)
        if op.name.startswith("mem.") or op.name in ("exec.copy", "exec.signal", "exec.wait"):
            continue
        if isinstance(op, Launch):
            out.launches.append(op)
            for d, r in zip(op.destinations, op.results):
                for table in (out.place, out.pads):
                    if d in table:
                        table[r] = table[d]
                if d in shared:
                    shared.add(r)
                if isinstance(d.owner, Alloc):
                    if d in last_in:
                        union(r, last_in[d])
                    last_in[d] = r
            for r in op.results:
                if r in out.place:
                    arena, lo, hi = out.place[r]
                    for u in op.inputs:
                        if u in out.place and out.place[u][0] is arena and out.place[u][1] < hi and lo < out.place[u][2]:
                            union(r, u)
        if op.called() is not None:
            callee = module[op.called().name]
            if not callee.attrs.get("kernel"):
                raise GCError(f"graph.call of @{callee.name}: codegen needs calls inlined or marked kernel", op.loc)
            inputs = op.inputs if isinstance(op, Launch) else list(op.operands)
            k = Kernel(_unique(callee.name, names), list(callee.ops), list(inputs), list(op.results),
                       params=list(callee.args), callee=callee, kind=_anchor_kind(callee.ops),
                       in_pads=[out.pads.get(v) for v in inputs], out_pads=[out.pads.get(v) for v in op.results],
                       out_borders=[v in shared for v in op.results])
        else:
            k = Kernel(_unique(op.name.split(".")[-1], names), [op], list(op.operands), list(op.results),
                       params=list(op.operands), kind=_anchor_kind([op]))
        if not any(v.type.size > 0 for v in k.outputs):
            continue  # nothing to write
        if isinstance(op, Launch) and launch_copies_nothing(module, op, out.place):
            continue  # its inputs already lie where it would copy them (concat views)
        out.kernels.append(k)
        out.kernel_of[op] = k
    members: dict[Value, list[Value]] = {}
    for v in {*parent, *(find(v) for v in parent)}:
        members.setdefault(find(v), []).append(v)
    out.groups = {v: group for group in members.values() if len(group) > 1 for v in group}
    return out


def kernels_of(module: Module, entry: str) -> list[Kernel]:
    """The entry function's kernels, in execution order (see `read`)."""
    return read(module, entry).kernels


def _unique(base: str, names: dict[str, int]) -> str:
    n = names.get(base, 0)
    names[base] = n + 1
    return base if n == 0 else f"{base}_{n}"


_RANK = {"out-elementwise-fusable": 0, "reduction": 1, "opaque": 2, "injective": 3, "broadcast": 4, "elementwise": 5}


def _anchor_kind(ops: list[Op]) -> str:
    kinds = [op.kind for op in ops if op.kind != "constant"]
    return min(kinds, key=lambda k: _RANK.get(k, 9)) if kinds else "elementwise"


def lower_kernel(k: Kernel, func: Func | None = None, symbolic: bool = False):
    """TE for the kernel's ops, then one PrimFunc named after the kernel. `symbolic`: its sizes that are
    `Bound` (a symbolic function at one size: codegen/symbolic.py) as expressions of size variables."""
    from compiler.ir import _KERNEL_SIZES, Bound

    def sized_border(v, pads) -> bool:  # a border around a size known at run time: stores need its number
        return pads is not None and any(isinstance(d, Bound) for d in v.type.shape[2:])

    results = _kernel_results(k, func)
    if not symbolic or any(sized_border(v, p) for v, p in [*zip(k.params, k.in_pads), *zip(results, k.out_pads)]):
        return _lower_kernel(k, func)
    from compiler.codegen.symbolic import KernelSizes

    sizes = KernelSizes([v.type.shape for v in (*k.params, *results)])
    token = _KERNEL_SIZES.set(sizes.convert)
    try:
        prim = _lower_kernel(k, func)
    except (TypeError, ValueError, AttributeError):  # an op's lowering that computes with sizes as numbers:
        prim = None  # a kernel of this size's, as any that reads a size as a number
    finally:
        _KERNEL_SIZES.reset(token)
    if prim is None:
        return _lower_kernel(k, func)
    return prim.with_attr("gc.sizes", sizes.exprs()) if sizes.direct else prim


def _lower_kernel(k: Kernel, func: Func | None):
    from tvm import te

    from compiler.ir import kernel_shape

    env: dict[Value, object] = {}
    placeholders = []
    whole: set[Value] = set()  # params that arrive padded, as the convs reading them want
    strides: dict[int, tuple[int, ...]] = {}
    for i, (v, view) in enumerate(zip(k.params, k.in_views)):
        pads = k.in_pads[i] if i < len(k.in_pads) else None
        shape = kernel_shape(v.type.shape)
        if view == "whole":
            shape = padded_shape(shape, pads)
            whole.add(v)
        elif view == "interior":
            strides[i] = padded_strides(shape, pads)
        t = te.placeholder(shape, v.type.dtype.tvm, name=f"p{i}")
        env[v] = t
        placeholders.append(t)
    consts = []
    for op in k.ops:
        if op.kind == "constant":
            t = te.placeholder(op.result.type.shape, op.result.type.dtype.tvm, name=f"c{len(consts)}")
            env[op.result] = t
            consts.append((op, t))
            continue
        lower = getattr(op, "lower", None)
        if lower is None:
            raise GCError(f"{op.name} has no lowering to TVM yet", op.loc)
        # An input the op pads itself, taken from a zero-bordered buffer whole: the op pads nothing.
        extra = {"padded": True} if op.padded_operand(0) is not None and op.operands[0] in whole else {}
        outs = lower(*op._group([env[v] for v in op.operands]), **extra)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        for r, t in zip(op.results, outs):
            env[r] = t
    results = _kernel_results(k, func)
    outs = [_materialize(env[v], i, placeholders + [t for _, t in consts]) for i, v in enumerate(results)]
    first_out = len(placeholders) + len(consts)
    borders = {}
    for j, v in enumerate(results):
        pads = k.out_pads[j] if j < len(k.out_pads) else None
        if pads is not None:
            strides[first_out + j] = padded_strides(kernel_shape(v.type.shape), pads)
            if j < len(k.out_borders) and k.out_borders[j]:
                borders[str(first_out + j)] = [int(p) for p in pads]
    # Indices are int32 unless a tensor of the kernel has 2^31 elements or more (a flat index would wrap).
    large = any(v.type.size >= 2**31 - 1 for op in k.ops for v in (*op.operands, *op.results))
    prim = te.create_prim_func([*placeholders, *[t for _, t in consts], *outs],
                               index_dtype_override="int64" if large else None)
    if strides:
        prim = declare_strides(prim, strides)
    if borders:  # written after scheduling (schedule_cpu.write_borders); part of what makes kernels alike
        prim = prim.with_attr("gc.borders", borders)
    return prim.with_attr("global_symbol", k.name)


def _reads_padded(ops: list[Op], v: Value, pads: tuple[int, ...]) -> bool:
    """Whether every op of the kernel that reads `v` reads it once, as an operand it pads (a conv2d's input)
    with exactly the spatial padding of `v`'s border (batch and channels unpadded): then the kernel takes
    the bordered buffer whole and the ops pad nothing."""
    users = [op for op in ops if any(u is v for u in op.operands)]
    n, c, top, left, n2, c2, bottom, right = pads

    def reads_through_border(op: Op) -> bool:
        at = [i for i, u in enumerate(op.operands) if u is v]
        return len(at) == 1 and op.padded_operand(at[0]) == (top, left, bottom, right)

    return bool(users) and not (n or c or n2 or c2) and all(reads_through_border(op) for op in users)


def declare_strides(prim, strides: dict[int, tuple[int, ...]]):
    """`prim` with the parameters at the given positions declared strided (the interior of a bordered
    buffer, passed as a view with those strides) and aligned to their element size only."""
    from compiler.codegen.sblocks import redeclare_params

    return redeclare_params(prim, strides)


def _kernel_results(k: Kernel, func: Func | None) -> list[Value]:
    return list(k.callee.results) if k.callee is not None else list(k.ops[-1].results)


def _materialize(t, i: int, inputs: list):
    """A kernel output must be a computed stage: an op lowered to its input (dropout) gets a copy."""
    from tvm import te

    if any(t.same_as(p) for p in inputs) or isinstance(t.op, te.PlaceholderOp):
        return te.compute(t.shape, lambda *idx: t(*idx), name=f"copy{i}")
    return t
