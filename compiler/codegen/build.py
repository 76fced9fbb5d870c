"""compile(): parse, bind weights, optimize, lower each kernel, schedule it, build one library, plan buffers."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from compiler.codegen.lower import Kernel, kernels_of, lower_kernel
from compiler.codegen.runtime import CompiledModel
from compiler.codegen.target import make_target
from compiler.diagnostics import GCError
from compiler.ir import DType, Module, Value
from compiler.parser import parse, parse_file

# Weights bound at compile time are constants: fold whatever is computed from them alone (transposes,
# batch_norm scales), however big, so that no call repeats it. The artifact carries the result.
_FOLD = "fold-constants{size-limit=4294967296}"
PIPELINE = f"canonicalize,{_FOLD},cse,fold-batch-norm{{weight-args=false}},canonicalize,{_FOLD},cse,dce,fuse"


def load_module(source) -> Module:
    """A Module from a Module, a path to a .gir file, or GIR text."""
    if isinstance(source, Module):
        return source.clone()
    if isinstance(source, Path) or (isinstance(source, str) and source.endswith(".gir") and "\n" not in source):
        return parse_file(source)
    return parse(source, "<text>")


def bind_params(module: Module, entry: str, params: dict[str, np.ndarray]) -> None:
    """Arguments named in `params` become constants: weights fixed at compile time, which passes fold."""
    from compiler.builder import bind_arguments
    from compiler.interpreter import bind_inputs

    f = module[entry]
    names = [a.name for a in f.args]
    unknown = [k for k in params if k not in names]
    if unknown:
        raise GCError(f"--params: @{entry} has no argument %{unknown[0]}")
    checked = bind_inputs(f, {a.name: params.get(a.name, _zeros(a)) for a in f.args})  # shapes, dtypes
    bind_arguments(f, {n: x for n, x in zip(names, checked) if n in params})


def _zeros(a: Value) -> np.ndarray:
    return np.zeros(a.type.shape, a.type.dtype.np)


def compile(source, target: str = "llvm", *, params: dict[str, np.ndarray] | None = None, entry: str = "main",
            pipeline: str | None = None, arch: str | None = None) -> CompiledModel:
    """Compile a module (path, text or Module) for llvm or cuda; returns a callable CompiledModel."""
    from compiler.pipeline import run_pipeline

    from compiler.printer import print_module

    t0 = time.perf_counter()
    module = load_module(source)
    if entry not in module:
        raise GCError(f"no function @{entry} in the module")
    text = print_module(module)
    if params:
        bind_params(module, entry, params)
    run_pipeline(module, PIPELINE if pipeline is None else pipeline)
    model = build(module, target, entry=entry, arch=arch)
    model.compile_seconds = time.perf_counter() - t0
    model.source = text
    return model


def build(module: Module, target: str = "llvm", *, entry: str = "main", arch: str | None = None) -> CompiledModel:
    """Lower, schedule and compile the entry function's kernels into one library."""
    import tvm

    from compiler.codegen import schedule_cpu

    tgt = make_target(target, arch)
    kernels = [k for k in kernels_of(module, entry) if any(v.type.size > 0 for v in k.outputs)]
    funcs = {}
    for k in kernels:
        prim = lower_kernel(k)
        if target == "llvm":
            # unaligned: kernels take NumPy arrays as malloc aligns them (16 bytes), so calls copy nothing.
            consts = {f"c{i}" for i in range(len(getattr(k, "const_ops", [])))}
            prim = schedule_cpu.schedule(prim, k.kind, constants=consts, unaligned=True)
            prim = prim.with_attr("global_symbol", k.name)
            tags = prim.attrs.get("gc.prepack") if prim.attrs is not None else None
            # Weights the kernel reads in a packed layout are packed here, once, and the artifact carries them.
            k.prepack = {int(str(n)[1:]): str(t) for n, t in tags.items()} if tags else {}  # type: ignore[attr-defined]
        else:
            from compiler.codegen import schedule_cuda

            prim = schedule_cuda.schedule(prim, k.kind, tgt).with_attr("global_symbol", k.name)
        funcs[k.name] = prim
    scheduled = tvm.IRModule(funcs)
    lib = tvm.compile(scheduled, target=tgt) if funcs else None
    plan, consts = _plan(module, entry, kernels)
    plan["unaligned_inputs"] = bool(funcs) and all(_attr(p, "gc.unaligned") for p in funcs.values())
    model = CompiledModel(lib, plan, consts, tgt)
    model.scheduled = scheduled
    return model


def _plan(module: Module, entry: str, kernels: list[Kernel]) -> tuple[dict, dict[str, np.ndarray]]:
    """Buffers (arguments, constants, one per intermediate: allocated once) and the kernel calls."""
    f = module[entry]
    buffers: list[dict] = []
    slot: dict[Value, int] = {}
    consts: dict[str, np.ndarray] = {}

    def add(v: Value, kind: str, **extra) -> int:
        slot[v] = len(buffers)
        buffers.append({"kind": kind, "shape": list(v.type.shape), "dtype": str(v.type.dtype), **extra})
        return slot[v]

    def const(op, tag: str | None = None) -> int:
        name = f"c{len(consts)}"
        value = np.ascontiguousarray(op.value.array).reshape(op.value.array.shape)  # keeps rank 0
        if tag is not None:
            from compiler.codegen.schedule_cpu import prepack

            value = prepack(value, tag)
        consts[name] = value
        i = add(op.result, "const", name=name)
        buffers[i]["shape"] = list(value.shape)
        return i

    for i, a in enumerate(f.args):
        add(a, "arg", index=i, name=a.name)
    for op in f.ops:
        if op.name == "graph.constant":
            const(op)
    kernel_outputs = {v for k in kernels for v in k.outputs}
    for op in f.ops:  # zero-size results of dropped kernels: an empty constant stands in
        for r in op.results:
            if r not in slot and r not in kernel_outputs and op.name != "graph.constant":
                name = f"c{len(consts)}"
                consts[name] = np.zeros(r.type.shape, r.type.dtype.np)
                add(r, "const", name=name)
    calls = []
    for k in kernels:
        for v in k.outputs:
            add(v, "temp")
        tags = getattr(k, "prepack", {})
        inner = [const(op, tags.get(i)) for i, op in enumerate(getattr(k, "const_ops", []))]
        calls.append({"kernel": k.name, "buffers": [slot[v] for v in k.inputs] + inner + [slot[v] for v in k.outputs]})
    plan = {
        "entry": entry,
        "memory": _memory(buffers, calls, [slot[v] for v in f.results]),
        "args": [{"name": a.name, "shape": list(a.type.shape), "dtype": str(a.type.dtype)} for a in f.args],
        "buffers": buffers,
        "calls": calls,
        "results": [slot[v] for v in f.results],
        "result_types": [str(v.type) for v in f.results],
    }
    return plan, consts


def _memory(buffers: list[dict], calls: list[dict], results: list[int]) -> dict:
    """Bytes of the intermediates: allocated (one buffer each until memory planning), their sum, and the
    most alive at once in execution order (a buffer lives from the kernel that writes it to its last reader)."""
    def nbytes(i: int) -> int:
        b = buffers[i]
        return int(np.prod(b["shape"], dtype=np.int64)) * DType(b["dtype"]).itemsize

    temps = [i for i, b in enumerate(buffers) if b["kind"] == "temp"]
    first = {}
    last = {}
    for t, c in enumerate(calls):
        for i in c["buffers"]:
            if buffers[i]["kind"] == "temp":
                first.setdefault(i, t)
                last[i] = t
    for i in results:
        last[i] = len(calls)
    peak = 0
    for t in range(len(calls) + 1):
        peak = max(peak, sum(nbytes(i) for i in temps if first.get(i, 0) <= t <= last.get(i, -1)))
    total = sum(nbytes(i) for i in temps)
    return {"arena_bytes": total, "naive_bytes": total, "lower_bound_bytes": peak}


def _attr(prim, key: str) -> bool:
    attrs = prim.attrs
    return attrs is not None and key in attrs and bool(attrs[key])
