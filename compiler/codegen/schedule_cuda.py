"""CUDA schedules: TVM's dlight GPU rules, the first that binds every stage wins; else a plain grid.

A PrimFunc compiled for cuda without thread bindings does not fail: it silently becomes host code
that dereferences device pointers. So every result is checked here, and a kernel that still has a
stage outside blockIdx/threadIdx is an internal error, never a library that crashes when called.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import linecache
import os
import shutil
import sys

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from compiler.codegen.sblocks import Schedule, blocks, inline_spatial, leading_spatial_loops, register_infinite_reducers


def _kernel_compiler() -> None:
    """Beside a GPU, tvm.compile turns the CUDA C into a binary at once, with NVRTC by default; NVRTC
    comes with the cuda-bindings package. Where that is missing and nvcc is not, use nvcc."""
    try:
        has_nvrtc = importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:
        has_nvrtc = False
    if not has_nvrtc and shutil.which("nvcc"):
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")


_kernel_compiler()


def _isnan_lane_by_lane(call):
    """TVM lowers `isnan(x)` to `x != x`, which CUDA C has no operator for on float2/float4 (a vectorized
    epilogue's NaN-propagating clip or max: gc-llvm marks isnan lane-wise for the whole process). As a
    call of CUDA's own isnan, the codegen emits one call per lane. (TIR's isnan casts 16-bit floats to
    f32 first: the argument is f32 or f64.)"""
    return tirx.call_pure_extern(call.ty.dtype, "isnan", call.args[0])


tirx.op.register_intrin_lowering("tirx.isnan", target="cuda", f=_isnan_lane_by_lane, level=99)

THREADS = 256  # threads per block of the plain grid: enough to hide latency, fits every GPU's limit


def _rules() -> list:
    # Order matters: the specific rules first (each returns None when the kernel is not its pattern),
    # dlight's own Fallback last.
    gpu = dl.gpu
    return [gpu.Matmul(), gpu.GEMV(), gpu.LowBatchGEMV(), gpu.Reduction(), gpu.GeneralReduction(),
            gpu.Transpose(), gpu.Fallback()]


def schedule(prim: tirx.PrimFunc, kind: str, target: dict) -> tirx.PrimFunc:
    """A PrimFunc whose every stage runs on the GPU: dlight's rules, else one thread per output element.

    `kind` (the anchor op's fusion kind) goes unused: the rules recognize their patterns in the TIR."""
    tgt = Target(target)
    name = str(prim.attrs["global_symbol"]) if prim.attrs and "global_symbol" in prim.attrs else "?"
    if any(str(p.dtype) in ("float16", "int8") for p in prim.params):
        _load_tensor_intrinsics()  # the tensor-core matmul path needs them
    register_infinite_reducers()  # max from -inf (softmax's row max) as a cross-thread reduction
    with tgt:
        for rule in _rules():
            func = _try_rule(rule, prim, tgt)
            # A rule can return a schedule that TVM then fails to lower (a cross-thread reduction whose
            # reducer TVM does not recognize, such as max starting from -inf): the next rule gets a turn.
            if func is not None and not unbound_blocks(func) and _lowers(func, tgt) is None:
                return _done(func, type(rule).__name__)
        # A stage that keeps a second result to itself (argmax's running max) has it in global memory,
        # which a kernel cannot allocate. With one thread per output point it can live in the thread.
        local = _localize(prim)
        func = _try_rule(dl.gpu.Fallback(), local, tgt)
        if func is not None and not unbound_blocks(func) and _lowers(func, tgt) is None:
            return _done(func, "Fallback+local")
        func = _grid(local)
    left = unbound_blocks(func)
    if left:
        raise RuntimeError(f"internal error: the CUDA schedule of kernel {name} left {', '.join(left)} "
                           "outside blockIdx/threadIdx (it would run as host code)")
    problem = _lowers(func, tgt)
    if problem:
        raise RuntimeError(f"internal error: the CUDA schedule of kernel {name} does not compile: {problem}")
    return _done(func, "grid")


@functools.cache
def _load_tensor_intrinsics() -> None:
    """Import tvm.s_tir.tensor_intrin in ~4 s instead of one to three minutes.

    It parses ~250 TVMScript functions, each calling inspect.stack(); during an import every frozen
    importlib frame on the stack sends inspect.getmodule through all of sys.modules (~2000 here).
    The parser only reads each frame's locals and source line, which a plain walk gives as well."""
    original = inspect.stack
    inspect.stack = _plain_stack
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = original


def _plain_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """inspect.stack() without the module lookup: each frame with its current source line."""
    out = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno, frame.f_globals)
        out.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                     [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return out


def _done(func: tirx.PrimFunc, rule: str) -> tirx.PrimFunc:
    # gc.schedule names the rule that won, for `--emit tir` readers and tests.
    return func.with_attr("tirx.is_scheduled", True).with_attr("gc.schedule", rule)


def _try_rule(rule, prim: tirx.PrimFunc, tgt: Target) -> tirx.PrimFunc | None:
    """The rule's schedule, or None where it does not apply. Rules schedule a copy, never `prim`."""
    try:
        sch = rule.apply(prim, tgt, False)
    except Exception:  # noqa: BLE001 (a rule that trips over a pattern it half-matches: try the next)
        return None
    if sch is None:
        return None
    if isinstance(sch, list):
        sch = sch[0]
    return sch.mod["main"]


def _lowers(func: tirx.PrimFunc, tgt: Target) -> str | None:
    """None if TVM's TIR pipeline lowers the scheduled function for the target, else its complaint.

    This is tvm.compile up to the code generator: where a driver is present, code generation runs
    nvrtc/nvcc, seconds per candidate, and the schedule's own mistakes all show before it."""
    from tvm.tirx.build import split_host_device_mods

    try:
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        mod = tirx.transform.BindTarget(tgt)(mod)
        pipeline, _, finalize_device = tirx.get_default_tir_pipeline(tgt)
        _, devices = split_host_device_mods(pipeline(mod))
        for device in devices.values():
            for kernel in finalize_device()(device).functions.values():
                _no_global_allocations(kernel)
    except Exception as e:  # noqa: BLE001 (TVM raises several error types; all mean "not this schedule")
        return _message(e)
    return None


def _no_global_allocations(kernel: tirx.PrimFunc) -> None:
    """The CUDA code generator's own check, which would come only after nvcc has been run."""
    import tvm_ffi

    def visit(node: tirx.AllocBuffer) -> None:
        if node.buffer.scope() == "global":
            raise ValueError(f"a kernel allocates the global buffer {node.buffer.name}")

    tvm_ffi.structural_walk(kernel.body, [(tirx.AllocBuffer, visit)], order="post")


def _message(e: Exception) -> str:
    """The first line of a TVM exception (the rest is a traceback and the IR)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def unbound_blocks(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks (stages) that no blockIdx/threadIdx loop encloses: they would run on the host."""
    out: list[str] = []
    _walk(func.body, False, out)
    return out


def _walk(stmt, bound: bool, out: list[str]) -> None:
    if stmt is None:
        return
    if isinstance(stmt, tirx.For):
        bound = bound or stmt.kind == tirx.ForKind.THREAD_BINDING
        _walk(stmt.body, bound, out)
    elif isinstance(stmt, tirx.AttrStmt):
        _walk(stmt.body, bound or stmt.attr_key == "thread_extent", out)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _walk(s, bound, out)
    elif isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        if block.name_hint != "root" and not bound:
            out.append(block.name_hint)
            return
        _walk(block.init, bound, out)
        _walk(block.body, bound, out)
    elif isinstance(stmt, tirx.IfThenElse):
        _walk(stmt.then_case, bound, out)
        _walk(stmt.else_case, bound, out)
    elif hasattr(stmt, "body"):  # LetStmt, allocations, asserts: transparent
        _walk(stmt.body, bound, out)


def _grid(prim: tirx.PrimFunc) -> tirx.PrimFunc:
    """Inline what inlines, then give each remaining stage one thread per point of its leading spatial
    loops (reduction loops stay serial inside the thread); a stage that resists gets one thread."""
    if prim.body.block.name_hint != "root":  # one opaque stage (an extern such as cumsum): no loops to bind
        return _one_thread(prim)
    sch = Schedule(prim)
    inline_spatial(sch, blocks(sch)[:-1])
    for b in blocks(sch):
        try:
            _bind_spatial(sch, b)
        except Exception:  # noqa: BLE001 (odd loop nests: correct and serial rather than not at all)
            _bind_one_thread(sch, b)
    return sch.mod["main"]


def _localize(prim: tirx.PrimFunc) -> tirx.PrimFunc:
    """Intermediate buffers that one stage alone reads and writes move to thread-local memory.

    Right only for schedules that run each output point of that stage in one thread, start to end."""
    if prim.body.block.name_hint != "root":
        return prim
    sch = Schedule(prim)
    bs = blocks(sch)
    users: dict[str, set[int]] = {}
    for i, b in enumerate(bs):
        stmt = sch.get(b)
        for region in [*stmt.reads, *stmt.writes]:
            users.setdefault(region.source.name, set()).add(i)
    for buf in prim.body.block.alloc_buffers:
        owners = users.get(buf.name, set())
        if len(owners) != 1:
            continue
        b = bs[owners.pop()]
        writes = [r.source.name for r in sch.get(b).writes]
        if buf.name in writes:
            sch.set_scope(b, writes.index(buf.name), "local")
    return sch.mod["main"]


def _one_thread(prim: tirx.PrimFunc) -> tirx.PrimFunc:
    """The whole body as one GPU thread; its parallel loops run serially there."""
    from tvm import ir

    body = prim.body
    for tag in ("threadIdx.x", "blockIdx.x"):
        v = tirx.Var(tag.replace(".", "_"), "int32")
        body = tirx.For(v, 0, 1, tirx.ForKind.THREAD_BINDING, body,
                        thread_binding=tirx.IterVar(ir.Range(0, 1), v, 1, tag))
    return prim.with_body(body)


def _bind_spatial(sch: s_tir.Schedule, b) -> None:
    spatial = leading_spatial_loops(sch, b)
    if not spatial:
        _bind_one_thread(sch, b)
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _bind_one_thread(sch: s_tir.Schedule, b) -> None:
    loops = sch.get_loops(b)
    outer = loops[0] if loops else sch.add_unit_loop(b)
    sch.bind(sch.add_unit_loop(outer), "blockIdx.x")
    sch.bind(sch.add_unit_loop(outer), "threadIdx.x")  # lands between the blockIdx loop and `outer`
