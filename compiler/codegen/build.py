"""build(): plan memory, lower each kernel, schedule it, build one library, and the runtime plan (the last
stage of compiler/driver.py's compile)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.codegen import layout
from compiler.codegen.lower import Kernel, Planned, lower_kernel, read
from compiler.codegen.plan import Arg, Buffer, Plan, Step
from compiler.codegen.runtime import CompiledModel
from compiler.codegen.target import make_target, num_cores
from compiler.diagnostics import GCError
from compiler.ir import DType, Module, Value
from compiler.memory import is_planned, peak_bytes, plan_stats
from compiler.stats import op_flops
from dialects.exec import Copy, Launch, Signal, Wait
from dialects.mem import Alloc, Arena, View, padded_shape

ALIGN = {"llvm": 64, "cuda": 256}  # vector loads on the CPU; CUDA's allocation granularity


def plan_module(module: Module, target: str = "llvm", entry: str = "main", *, concurrent: bool = False) -> int | None:
    """Schedule and plan memory (and streams, for cuda) unless `module` is planned already; returns the
    lower bound of the entry's file order, the figure the chosen order is measured against.

    `concurrent` (cuda): share arena bytes only between tensors ordered by data dependence, so that
    independent branches never wait on each other's memory; the arena grows (inception: 401 -> 778 KB).
    By default the plan is the serial one, and streams wait where two tensors share bytes."""
    from compiler.pipeline import run_pipeline

    f = module[entry]
    if is_planned(f):
        return None
    file_order_bound = peak_bytes(f)
    streams = ",assign-streams" if target == "cuda" else ""
    flag = "true" if concurrent and target == "cuda" else "false"
    # On the CPU a conv reads its input in place from arena bytes with a zero border, which the kernel
    # writing the input writes (see plan-memory); the CUDA schedules stage inputs through shared memory.
    # Both targets' schedules write a conv or matmul result tile by tile (thread by thread on the GPU),
    # reading an epilogue operand just where they write, so the result may go over it (tested against
    # the interpreter, on an H100 for cuda: tests/test_codegen_cuda.py).
    # Concats' operands written in place: on the CPU (assign-streams would have to order a concat's
    # readers after every operand's producer).
    cpu = "true" if target == "llvm" else "false"
    run_pipeline(module, f"schedule,plan-memory{{align={ALIGN[target]},concurrent={flag},conv-borders={cpu},"
                         f"borders-in-arena={cpu},in-place-epilogues=true,concat-views={cpu}}}{streams}")
    return file_order_bound


def build(module: Module, target: str = "llvm", *, entry: str = "main", arch: str | None = None,
          concurrent: bool = False, kernels: KernelStore | None = None) -> CompiledModel:
    """Plan memory (unless the module is planned already), then lower, schedule and compile the entry
    function's kernels into one library. `kernels` (a symbolic function at one size: codegen/symbolic.py):
    lower the kernels with their `Bound` sizes as expressions, take each from the store where an earlier
    size built it, and add the rest to it."""

    tgt = make_target(target, arch)
    file_order_bound = plan_module(module, target, entry, concurrent=concurrent)
    if target != "llvm" and any(isinstance(op, View) and op.pads for op in module[entry].ops):
        # Only the CPU schedules write a bordered view's border (schedule_cpu.write_borders).
        raise GCError(f"a plan with bordered views of the arena (plan-memory's borders-in-arena) builds for "
                      f"llvm only, not {target}: plan it without borders-in-arena")
    planned = read(module, entry)  # the planned function's kernels and where their tensors lie, read once
    symbolic = kernels is not None
    if kernels is None:
        kernels = KernelStore(target, tgt)
    prims: dict[int, object] = {}
    sched = kernels.scheduler(prims)
    for k in planned.kernels:
        prims[id(k)] = lower_kernel(k, symbolic=symbolic)
        if symbolic and "gc.sizes" in prims[id(k)].attrs:
            e, static = sched._entry(k, {}), None
            if "symbolic" not in e:  # decided at the first size that lowers it (a later one only looks it up)
                static = lower_kernel(k)
                e["symbolic"] = not _falls_off(sched, k, static)
            if not e["symbolic"]:
                prims[id(k)] = static or lower_kernel(k)
                sched.hashes.pop(id(k), None)
    blocked = {}
    if target == "llvm" and layout.ENABLED:
        blocked = layout.assign(planned, lambda k, proposal: sched(k, proposal)[1])
    funcs = {}
    built: dict[int, Built] = {}  # id(kernel) ->
    used: dict[str, object] = {}  # symbol -> the scheduled function
    for k in planned.kernels:
        proposal = layout.proposal_of(k, blocked) if blocked else {}
        prim, _, done = sched(k, proposal)
        if done is None:
            # (A repeated block, ResNet's bottlenecks or a transformer's layers, is the same code on its own
            # weights: built once; so is a kernel an earlier size of a symbolic function built.)
            name = kernels.unique(k.name)
            prim = prim.with_attr("global_symbol", name)
            tags = prim.attrs.get("gc.prepack") if prim.attrs is not None else None
            # Weights the kernel reads in a packed layout are packed here, once, and the artifact carries them.
            done = Built(name, str(prim.attrs["gc.schedule"]) if prim.attrs and "gc.schedule" in prim.attrs
                         else "none", {int(str(n)[1:]): str(t) for n, t in tags.items()} if tags else {})
            sched.done(k, proposal, done)
            funcs[name] = prim
        built[id(k)] = done
        used[done.symbol] = prim
    lib = kernels.add(funcs, num_cores(), used) if funcs or kernels.libraries else None
    plan, consts = _plan(planned, blocked, built, kernels.packed if symbolic else None)
    sizes = {built[id(k)].symbol: kernel_sizes(k) for k in planned.kernels} if symbolic else {}
    plan.signatures = {name: signature(prim, sizes.get(name)) for name, prim in used.items()}
    _check(plan, tgt)
    if file_order_bound is not None:
        plan.memory["file_order_lower_bound_bytes"] = file_order_bound
    plan.unaligned_inputs = bool(used) and all(_attr(p, "gc.unaligned") for p in used.values())
    model = CompiledModel(lib, plan, consts, tgt)
    if symbolic:  # every size's model holds the same weights, on the device too
        model.shared_consts = kernels.device_consts
    else:
        model.lib_bytes = kernels.lib_bytes  # built as a shared library already: saved as it is
        model.sources = kernels.sources
    import tvm

    model.scheduled = tvm.IRModule(used)
    model.planned = module
    return model


# Rules whose schedules take extents known only at run time as such: row tiles over rows, columns or K of
# any number (matmul), a batch in the parallel loop (conv2d, pool, winograd), vectors over the static
# inner loops or peeled transpose tiles (generic), vector lanes along a row of any length with the last
# vector predicated and peeled (rows: softmax, log_softmax, reduce_* over a sequence). Any other rule is
# kept for a symbolic kernel only where no size variable is the innermost extent of a tensor (the
# columns and planes rules take their lanes across rows that must be whole vectors).
SYMBOLIC_RULES = frozenset({"matmul", "conv2d", "pool", "winograd", "generic", "rows"})


def _falls_off(sched: _Scheduler, k: Kernel, static) -> bool:
    """Whether the kernel, lowered with sizes as expressions, should be built for each size instead: it
    takes another schedule rule than with its sizes as numbers (a rule that needs static extents), or a
    rule that handles sizes as expressions only in outer loops while some are inner. Such a kernel is
    built for each size, at the speed of its rule."""
    rule = sched(k, {})[0].attrs["gc.schedule"]
    # (On the GPU dlight's rules take extents known at run time anywhere: made for Relax's dynamic shapes.)
    if sched.store.target == "llvm" and rule not in SYMBOLIC_RULES and not _outer_sizes_only(k):
        return True
    return sched.store.scheduler({id(k): static})(k, {})[0].attrs["gc.schedule"] != rule


def _outer_sizes_only(k: Kernel) -> bool:
    """Whether no size known only at run time (a Bound) is the last dim of a tensor: the rows a reduction
    rule takes its lanes along (a layer norm over [batch, seq, 768] keeps them, a softmax over [.., seq]
    would not)."""
    from compiler.ir import Bound

    values = [*k.params, *k.outputs] + [r for op in k.ops for r in op.results]
    return not any(v.type.shape and isinstance(v.type.shape[-1], Bound) for v in values)


class KernelStore:
    """The scheduled kernels and the library functions built so far: one build's, or every size's of a
    symbolic function (codegen/symbolic.py), whose later sizes take the functions of structurally equal
    kernels instead of building them again."""

    def __init__(self, target: str, tgt, symbolic: bool = False):
        self.target, self.tgt, self.symbolic = target, tgt, symbolic
        self.entries: dict[int, list[dict]] = {}  # structural hash -> scheduled entries
        self.libraries: list = []  # (loaded library, its object files or None)
        self.names: set[str] = set()
        self.lib_bytes: bytes | None = None  # the one library of a single build, as built
        self.sources: list | None = None
        self.built_functions = 0
        # A symbolic function's sizes share their weights: prepacked once (by id of the array, layout tag)
        # and on the device once (by id of the array the plan holds: CompiledModel.shared_consts).
        self.packed: dict[tuple[int, str], tuple] = {}
        self.device_consts: dict[int, tuple] = {}

    def scheduler(self, prims: dict[int, object]) -> _Scheduler:
        return _Scheduler(self, prims)

    # -- saved with a dynamic artifact (codegen/dynamic.py), so that its new sizes build nothing again --

    def to_json(self) -> dict | None:
        """The kernels built (and each kernel's symbolic-or-not decision) by structural hash, kind and layout,
        for an artifact; None where a library has no object files to save (not a symbolic store)."""
        if not self.symbolic or not self.libraries or any(objects is None for _, objects in self.libraries):
            return None
        entries = []
        for h, same in self.entries.items():
            for e in same:
                b = e["built"]
                if b is None and "symbolic" not in e:
                    continue
                entries.append({"hash": h, "kind": e["kind"], "key": repr(e["key"]) if e["anon"] is not None else e["key_repr"],
                                "symbolic": e.get("symbolic"), "built": None if b is None else
                                [b.symbol, b.schedule, {str(i): t for i, t in b.prepack.items()}]})
        return {"entries": entries}

    def restore(self, data: dict, objects: list[bytes]) -> None:
        """The entries and the library of `to_json` and its object files (checked by the caller's artifact
        reader; a malformed table raises KeyError, TypeError or ValueError). A restored entry matches a kernel
        of equal structural hash, kind and layout; the kernel is scheduled again (no code generation) and
        calls the saved function."""
        import tempfile

        import tvm

        from compiler.codegen import llvm_pipeline

        if not objects:
            raise ValueError("no object files")
        with tempfile.TemporaryDirectory() as d:
            try:
                llvm_pipeline.link_objects(objects, f"{d}/lib.so")
            except RuntimeError as e:  # (the linker's complaint about the objects)
                raise ValueError(f"its object files do not link ({str(e).splitlines()[0]})") from None
            lib = tvm.runtime.load_module(f"{d}/lib.so")
        self.libraries = [(lib, list(objects))]
        for item in data["entries"]:
            built = item["built"]
            if built is not None:
                symbol, schedule, prepack = str(built[0]), str(built[1]), {int(i): str(t) for i, t in built[2].items()}
                if not lib.implements_function(symbol):
                    raise ValueError(f"no function {symbol!r} in the saved objects")
                built = Built(symbol, schedule, prepack)
                self.names.add(symbol)
            entry = {"anon": None, "kind": str(item["kind"]), "key": None, "key_repr": str(item["key"]),
                     "prim": None, "native": frozenset(), "built": built}
            if item["symbolic"] is not None:
                entry["symbolic"] = bool(item["symbolic"])
            self.entries.setdefault(int(item["hash"]), []).append(entry)

    def unique(self, name: str) -> str:
        """A library symbol of its own (a symbolic function's sizes each name their kernels from 0)."""
        out, n = name, 0
        while out in self.names:
            n += 1
            out = f"{name}_v{n}"
        self.names.add(out)
        return out

    def add(self, funcs: dict[str, object], cores: int, used: dict[str, object] | None = None):
        """Build these functions into a library of their own; the store's functions, as one library
        (`used`: the scheduled functions of a symbolic function's size, by symbol: what its library holds
        where the parts cannot be linked, CUDA's)."""
        import tvm

        from compiler.codegen import llvm_pipeline

        self.built_functions += len(funcs)
        if funcs:
            scheduled = tvm.IRModule(funcs)
            objects = None
            if self.target == "llvm" and (self.symbolic or len(funcs) >= llvm_pipeline.PARALLEL_FUNCTIONS and cores > 1):
                lib, lib_bytes, sources, objects = llvm_pipeline.build_library(scheduled, self.tgt, max(1, min(cores, 8)))
                if not self.libraries:
                    self.lib_bytes, self.sources = lib_bytes, sources
            elif self.target == "llvm":
                lib = llvm_pipeline.compile_cpu(scheduled, self.tgt)  # TVM's lowering, then strided loads as shuffles
            else:
                lib = tvm.compile(scheduled, target=self.tgt)
            self.libraries.append((lib, objects))
        return Libraries(self, used) if self.symbolic else self.libraries[0][0]


class Libraries:
    """Functions by symbol from every library a store has built (a symbolic function's sizes)."""

    def __init__(self, store: KernelStore, used: dict[str, object] | None = None):
        self.libs = [lib for lib, _ in store.libraries]
        self.store, self.used = store, used

    def __getitem__(self, symbol: str):
        for lib in self.libs:
            if lib.implements_function(symbol, query_imports=True):
                return lib[symbol]
        raise KeyError(symbol)

    def export_library(self, path: str) -> None:
        """One shared library of every function: linked from the object files of the parts (the CPU's); on
        the GPU the one part, or the functions this size calls compiled again into one (a CUDA library
        carries its device code, which no linker joins)."""
        import tvm

        from compiler.codegen import llvm_pipeline

        parts = self.store.libraries
        if all(objects is not None for _, objects in parts):
            llvm_pipeline.link_objects([o for _, objects in parts for o in objects], path)
        elif len(parts) == 1:
            parts[0][0].export_library(path)
        else:
            funcs = {name: prim.with_attr("global_symbol", name) for name, prim in self.used.items()}
            tvm.compile(tvm.IRModule(funcs), target=self.store.tgt).export_library(path)


def kernel_sizes(k: Kernel) -> dict[str, int]:
    """The kernel's size variables (codegen/symbolic.py) by name, at the sizes of its types."""
    from compiler.codegen.lower import _kernel_results
    from compiler.codegen.symbolic import KernelSizes

    return KernelSizes([v.type.shape for v in (*k.params, *_kernel_results(k, None))]).values()


@dataclass(frozen=True)
class Built:
    """What the build made of a kernel: the library function its calls run (a structurally equal kernel's,
    when one was built), the schedule rule used, and the layout tag of each constant read prepacked."""

    symbol: str
    schedule: str
    prepack: dict[int, str]


class _Scheduler:
    """Schedules the kernels, each once per layout of its parameters; structurally equal kernels (ResNet's
    repeated bottlenecks, and in a symbolic function the same kernel at another size) share one schedule
    and one library function (the `Built` of the first)."""

    def __init__(self, store: KernelStore, prims: dict[int, object]):
        self.store, self.prims = store, prims
        self.hashes: dict[int, int] = {}

    def _entry(self, k: Kernel, proposal: dict) -> dict:
        import tvm_ffi

        anon = self.prims[id(k)].without_attr("global_symbol")
        if id(k) not in self.hashes:
            self.hashes[id(k)] = tvm_ffi.structural_hash(anon)
        key = tuple(sorted(proposal.items()))
        same = self.store.entries.setdefault(self.hashes[id(k)], [])
        for e in same:
            if e["anon"] is None and e["kind"] == k.kind and e["key_repr"] == repr(key):
                e["anon"], e["key"] = anon, key  # restored from an artifact (KernelStore.restore)
            if e["kind"] == k.kind and e["key"] == key and tvm_ffi.structural_equal(e["anon"], anon):
                return e
        same.append({"anon": anon, "kind": k.kind, "key": key, "prim": None, "native": frozenset(), "built": None})
        return same[-1]

    def __call__(self, k: Kernel, proposal: dict):
        """(the scheduled PrimFunc, the parameter positions its rule took blocked natively, the `Built` of
        its library function if one was built)."""
        e = self._entry(k, proposal)
        if e["prim"] is None:
            prim = self.prims[id(k)]
            if self.store.target == "llvm":
                from compiler.codegen import schedule_cpu

                # unaligned: kernels take NumPy arrays as malloc aligns them (16 bytes), so calls copy nothing.
                consts = {f"c{i}" for i in range(len(k.const_ops))}
                prim = schedule_cpu.schedule(prim, k.kind, constants=consts, unaligned=True, blocked=proposal)
                native = prim.attrs.get("gc.native") if prim.attrs is not None else None
                e["native"] = frozenset(int(i) for i in native) if native is not None else frozenset()
            else:
                from compiler.codegen import schedule_cuda

                prim = schedule_cuda.schedule(prim, k.kind, self.store.tgt)
            e["prim"] = prim
        return e["prim"], e["native"], e["built"]

    def done(self, k: Kernel, proposal: dict, built: Built) -> None:
        self._entry(k, proposal)["built"] = built


def _check(plan: Plan, target: dict) -> None:
    """The plan as the loader checks it (every call's buffers what its kernel takes, ...): a model compiled
    in this process runs its kernels unchecked too, so a planning bug is an error here, not bad memory."""
    from compiler.codegen.artifact import check_plan, plan_head

    def error(message: str) -> GCError:
        return GCError(f"internal error: the plan gc made does not check: {message}; please report it with the "
                       "input file")

    check_plan({**plan_head(target), **plan.to_json()}, error)


def signature(prim, sizes: dict[str, int] | None = None) -> list[list]:
    """[shape, dtype, strides or None] of each parameter of a scheduled PrimFunc, as the plan's buffers write
    them: what the loader checks every call against, once (CPU kernels carry no checks of their own:
    llvm_pipeline). Strides are those of a bordered buffer's interior, in elements; a parameter whose
    border the kernel writes (schedule_cpu.write_borders) has its pads as a fourth entry, since the stores'
    offsets are compiled in and strides alone do not tell [1, 1] from [0, 2]. `sizes`: the values of a
    symbolic kernel's size variables, by name, at the sizes of this plan."""
    ev = _evaluator(sizes) if sizes else int  # (each extent an expression of the size variables)
    borders = prim.attrs.get("gc.borders") if prim.attrs is not None else None
    written = {int(k): [int(v) for v in pads] for k, pads in borders.items()} if borders else {}
    # A compact parameter the kernel reads as another shape of the same bytes is passed as it is.
    views = prim.attrs.get("gc.views") if prim.attrs is not None else None
    shapes = {int(k): [int(d) for d in shape] for k, shape in views.items()} if views else {}
    out = []
    for i, p in enumerate(prim.params):
        entry = [shapes.get(i, [ev(d) for d in p.shape]), next(str(d) for d in DType if d.tvm == str(p.dtype)),
                 [ev(s) for s in p.strides] or None]
        if i in written:
            entry.append(layout.blocked_pads(written[i]) if len(p.shape) == 5 else written[i])
        out.append(entry)
    return out


def _evaluator(sizes: dict[str, int]):
    """int() of an extent that is an expression of size variables, at these values."""
    import builtins

    import tvm
    from tvm import tirx

    def evaluate(e) -> int:
        if isinstance(e, (builtins.int, tirx.IntImm)):
            return builtins.int(e)
        ana = tvm.sym.Analyzer()
        for v in tirx.analysis.undefined_vars(e):
            ana.bind(v, tirx.const(sizes[v.name], "int32"))
        return builtins.int(ana.simplify(e))

    return evaluate


def _plan(planned: Planned, blocked: dict[Value, int], built: dict[int, Built],
          packed: dict | None = None) -> tuple[Plan, dict[str, np.ndarray]]:
    """The planned entry function as the runtime's plan: buffers (arguments, constants, the arena and its
    views, result buffers) and the steps (kernel calls, copies, stream events) in order. A buffer holding
    channel-blocked tensors (`blocked`: value -> block width) has their 5-D shape, and pads. `packed`:
    weights prepacked for earlier plans, by (id of the weights' array, layout tag), shared by this one."""
    f = planned.f
    # Destinations (views, allocations) by the block width of the tensors written into them.
    stored = {d: blocked[r] for op in planned.launches for d, r in zip(op.destinations, op.results) if r in blocked}
    buffers: list[Buffer] = []
    slot: dict[Value, int] = {}
    whole: dict[Value, int] = {}  # a bordered value -> the slot of its whole padded buffer
    consts: dict[str, np.ndarray] = {}

    def add(v: Value, kind: str, shape=None, **extra) -> int:
        slot[v] = len(buffers)
        if shape is None:
            shape = layout.blocked_shape(v.type.shape, stored[v]) if v in stored else v.type.shape
        blocks = f"NCHW{stored[v]}c" if v in stored else ""
        buffers.append(Buffer(kind, tuple(int(d) for d in shape), str(v.type.dtype), layout=blocks, **extra))
        return slot[v]

    def const(op, tag: str | None = None) -> int:
        name = f"c{len(consts)}"
        arr = op.value.array  # (as it is where it can be: the same object for every size of a symbolic function)
        value = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr).reshape(arr.shape)  # keeps rank 0
        if tag is not None:
            from compiler.codegen.schedule_cpu import prepack

            key = (id(op.value.array), tag)
            if packed is None or key not in packed:
                done = prepack(value, tag)
                if packed is None:
                    value = done
                else:  # (the source array kept with it, so that its id stays its own)
                    packed[key] = (op.value.array, done)
            value = packed[key][1] if packed is not None else value
        consts[name] = value
        return add(op.result, "const", shape=value.shape, name=name)

    def bordered(v: Value, pads, **where) -> None:
        pads = tuple(layout.blocked_pads(pads) if v in stored else pads)
        i = add(v, "bordered", pads=pads, **where)  # the interior: a strided view
        whole[v] = len(buffers)  # the padded buffer itself, for convs that read it whole
        buffers.append(Buffer("whole", padded_shape(buffers[i].shape, pads), str(v.type.dtype), of=i))

    for i, a in enumerate(f.args):
        add(a, "arg", index=i, name=a.name)
    steps: list[Step] = []
    for op in f.ops:
        if op.kind == "constant":
            const(op)
        elif isinstance(op, Arena):
            add(op.result, "arena", size=op.size, align=op.align)
        elif isinstance(op, View) and op.pads:  # in the arena, its writer writing the border
            bordered(op.result, op.pads, arena=slot[op.operands[0]], offset=op.offset)
        elif isinstance(op, View):
            if op.result.type.nbytes == 0:  # nothing to point at: an empty buffer of its own
                add(op.result, "temp")
            else:
                add(op.result, "view", arena=slot[op.operands[0]], offset=op.offset)
        elif isinstance(op, Alloc) and op.pads:  # a buffer of its own, zeroed once
            bordered(op.result, op.pads)
        elif isinstance(op, Alloc):
            add(op.result, "temp")
        elif isinstance(op, Launch):
            for d, r in zip(op.destinations, op.results):
                slot[r] = slot[d]
                if d in whole:
                    whole[r] = whole[d]
            k = planned.kernel_of.get(op)
            if k is None:
                continue  # every output is empty, or every input lies where it would copy it: nothing to run
            b = built[id(k)]
            inner = [const(c, b.prepack.get(i)) for i, c in enumerate(k.const_ops)]
            ins = [whole[v] if view == "whole" else slot[v] for v, view in zip(op.inputs, k.in_views)]
            steps.append(Step(op.stream, b.symbol, (*ins, *inner, *(slot[v] for v in op.destinations)),
                              **_describe(k, b.schedule)))
        elif isinstance(op, Copy):
            slot[op.result] = slot[op.dest]
            steps.append(Step(op.stream, copy=(slot[op.source], slot[op.dest])))
        elif isinstance(op, Signal):
            steps.append(Step(op.stream, signal=op.event))
        elif isinstance(op, Wait):
            steps.append(Step(op.stream, wait=op.event))
        else:
            raise GCError(f"{op.name}: not expected in a planned function (a bug in gc)", op.loc)
    args = [Arg(a.name, tuple(int(d) for d in a.type.shape), str(a.type.dtype)) for a in f.args]
    plan = Plan(f.name, args, buffers, steps, [slot[v] for v in f.results], [str(v.type) for v in f.results],
                plan_stats(f))
    return plan, consts


def _describe(k: Kernel, schedule: str) -> dict:
    """What a profile shows of a kernel: its ops, the schedule rule that won, its cost and where it came from."""
    ops = [op for op in k.ops if op.kind != "constant"]
    loc = next((op.loc for op in ops if op.loc is not None), None)
    return {
        "ops": tuple(op.name.split(".", 1)[-1] for op in ops),
        "schedule": schedule,
        "flops": sum(op_flops(op) for op in ops),
        "bytes": sum(v.type.nbytes for v in (*k.inputs, *k.outputs))
        + sum(c.result.type.nbytes for c in k.const_ops),
        "loc": f"{Path(loc.file).name}:{loc.line}" if loc is not None else "",
    }


def _attr(prim, key: str) -> bool:
    attrs = prim.attrs
    return attrs is not None and key in attrs and bool(attrs[key])
