"""The compiled model: kernels called in order on buffers allocated once.

Per call there is no Python loop that allocates: inputs are passed zero-copy (DLPack), intermediate
buffers live in a workspace allocated by the first call and reused (one per call in flight), and only
the returned arrays are new.
"""

from __future__ import annotations

import ctypes
import math
import operator
import threading
from pathlib import Path

import numpy as np

from compiler.codegen.plan import Plan, Step
from compiler.diagnostics import GCError
from compiler.inputs import castable, narrowed
from compiler.ir import DType, is_bf16
from dialects.mem import padded_shape, padded_strides

ALIGN = 64


class CompiledModel:
    """Call it with NumPy arrays (positional or by argument name); it returns a list of NumPy arrays.

    Many threads may call one model at once: each call in flight takes a workspace of its own (the arena
    and its views, zero-bordered buffers, staging for inputs, CUDA streams) from a pool, and gives it
    back when it returns; the constants are shared. The pool grows to the number of calls ever in flight
    together, so a single-threaded caller allocates once, at its first call."""

    def __init__(self, lib, plan: Plan, consts: dict[str, np.ndarray], target: dict):
        import tvm

        self.lib = lib
        self.source: str | None = None  # the GIR it was compiled from (for random inputs that fit it)
        self.lib_bytes: bytes | None = None  # the shared library as loaded or built, saved as it is
        self.sources: list | None = None  # the LLVM modules of a library built in parts (--emit llvm/asm)
        # What a compile in this process leaves beside the library (a loaded model has none of them): the
        # scheduled TIR, the planned GIR, the seconds the compile took.
        self.scheduled = None
        self.planned = None
        self.compile_seconds: float | None = None
        self.from_cache = False  # loaded from the compile cache (compiler/cache.py) instead of compiled
        self.plan = plan
        self.target = target
        self.consts = consts
        self.device = tvm.cuda(0) if target["kind"] == "cuda" else tvm.cpu(0)
        # A cuda model builds anywhere but runs only beside a GPU, and CPU code only on a CPU with the
        # instructions it uses: elsewhere calls raise this.
        self.unavailable = _no_cuda_device(target) if target["kind"] == "cuda" else _no_cpu_features(target)
        self.arg_names = [a.name for a in plan.args]
        self.arg_types = [(a.shape, np.dtype(DType(a.dtype).np)) for a in plan.args]
        self._consts: list | None = None  # on the device, shared by every workspace: see _device_consts
        self.shared_consts: dict | None = None  # on the device, shared with other models (_device_const)
        self._consts_lock = threading.Lock()
        slots = {b.index: i for i, b in reversed(list(enumerate(plan.buffers))) if b.kind == "arg"}
        self._arg_slots = [slots.get(k, -1) for k in range(len(plan.args))]
        self._nstreams = 1 + max((c.stream for c in plan.steps), default=0)
        self._unaligned_ok = plan.unaligned_inputs
        # Inputs that always go through staging: on a GPU; NumPy bf16 (no DLPack form); empty arrays (zero
        # strides, which TVM rejects).
        on_gpu = target["kind"] == "cuda"
        self._always_stage = [on_gpu or is_bf16(np.dtype(dt)) or 0 in shape for shape, dt in self.arg_types]
        self._results = plan.results
        # Idle workspaces; list.pop and list.append are atomic, so taking one needs no lock. The first is
        # made by the first call: compiling or saving a model allocates no arena.
        self._idle: list[_Workspace] = []

    def _take(self) -> _Workspace:
        try:
            return self._idle.pop()
        except IndexError:  # the first call, or every workspace is in a call on another thread
            pass
        self._device_consts()  # outside the try: a failed copy is TVM's error, as it was at construction
        try:
            return _Workspace(self)
        except Exception as e:  # noqa: BLE001 (TVM reports a failed allocation as its own error)
            if not isinstance(e, MemoryError) and "alloc" not in str(e).lower():
                raise
            raise GCError(f"cannot allocate the {self.workspace_bytes():,} bytes a call of this model needs on "
                          f"{self.device}: {' '.join(str(e).split())[:200] or 'out of memory'}") from None

    def _device_consts(self) -> list:
        """The constants on the device, by buffer slot, copied at the first call rather than at construction:
        a model compiled to be saved copies none (ResNet-50's 144 MB: 0.13 s of `gc compile -o`, Zen 3)."""

        with self._consts_lock:  # first calls on many threads at once copy them once
            if self._consts is None:
                self._consts = [self._device_const(self.consts[b.name]) if b.kind == "const" else None
                                for b in self.plan.buffers]
            return self._consts

    def _device_const(self, value: np.ndarray):
        """`value` on the device; one copy for every model sharing `shared_consts` (a symbolic function's
        sizes: codegen/symbolic.py), by the array's id (the entry keeps the array, so the id stays its own)."""
        import tvm

        pool = self.shared_consts
        if pool is None:
            return tvm.runtime.tensor(value, self.device)
        if id(value) not in pool:
            pool[id(value)] = (value, tvm.runtime.tensor(value, self.device))
        return pool[id(value)][1]

    def workspace_bytes(self) -> int:
        """Device memory a call in flight takes: arenas, buffers of their own, zero-bordered copies, staging."""
        total = 0
        for b in self.plan.buffers:
            own = b.kind == "whole" and not self.plan.buffers[b.of].in_arena
            total += {"arena": b.size, "temp": b.nbytes, "whole": b.nbytes if own else 0}.get(b.kind, 0)
        return total + sum(math.prod(shape) * dt.itemsize for shape, dt in self.arg_types)

    def _step(self, c: Step, st: _CudaStreams | None):
        """A step of the plan as (function, buffer slots): a kernel, or a copy. Stream events order kernels
        on a GPU's streams; run one after the other (on the CPU, or one stream) they are already ordered."""
        if c.kernel:
            fn = self.lib[c.kernel]
            return (st.on(c.stream, fn) if st else fn), list(c.buffers)
        if c.copy is not None:
            return (st.on(c.stream, _copy) if st else _copy), list(c.copy)
        if st and c.signal is not None:
            return (lambda e=c.signal, s=c.stream: st.signal(e, s)), []
        if st and c.wait is not None:
            return (lambda e=c.wait, s=c.stream: st.wait(e, s)), []
        return None

    @property
    def num_kernels(self) -> int:
        return len(self.plan.kernel_steps)

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        return self._run(None, args, kwargs)

    def run_into(self, outputs: list[np.ndarray], *args, **kwargs) -> list[np.ndarray]:
        """Like calling the model, but the results are written into `outputs` (NumPy arrays of the result
        types), in place of new arrays: on the CPU the last kernels write there directly, no copy."""
        return self._run(outputs, args, kwargs)

    def _run(self, outputs: list[np.ndarray] | None, args, kwargs) -> list[np.ndarray]:
        if self.unavailable:
            raise GCError(self.unavailable)
        inputs = self._bind(args, kwargs)
        ws = self._take()
        try:
            bufs = self._buffers_for(ws, inputs)
            direct = self._bind_outputs(outputs, bufs) if outputs is not None else []
            for fn, get in ws.calls:
                fn(*get(bufs))
            if ws.streams is not None:
                ws.streams.finish()
            if outputs is not None:
                for o, r, d, view in zip(outputs, self._results, direct, ws.result_views):
                    if not d:
                        np.copyto(o, view if view is not None else _to_numpy(bufs[r]))
                return list(outputs)
            # Results come back through NumPy views of the workspace's buffers: one copy, no round trip.
            return [view.copy() if view is not None else _to_numpy(bufs[r])
                    for r, view in zip(self._results, ws.result_views)]
        finally:
            self._idle.append(ws)

    def _buffers_for(self, ws: _Workspace, inputs: list[np.ndarray]) -> list:
        """Every buffer slot of the plan in workspace `ws`, the arguments bound to these (checked) inputs,
        zero-copy where possible."""
        bufs = list(ws.bufs)
        check_alignment = not self._unaligned_ok
        for slot, x, staging, stage in zip(self._arg_slots, inputs, ws.staging, self._always_stage):
            if slot < 0:
                continue
            # Read-only arrays (np.load with mmap, onnx.numpy_helper) have no DLPack export: staged too.
            if stage or not x.flags.writeable or (check_alignment and x.__array_interface__["data"][0] % ALIGN):
                staging.copyfrom(x)
                bufs[slot] = staging
            else:
                bufs[slot] = x
        return bufs

    def _plain_calls(self) -> list:
        """The plan's kernels and copies as (function, buffer slots), off the streams (for profiling)."""
        return [(self.lib[c.kernel], list(c.buffers)) if c.kernel else (_copy, list(c.copy))
                for c in self.plan.steps if c.kernel or c.copy is not None]

    def profile(self, *args, repeat: int = 100, warmup: int = 10, in_call: bool = False, **kwargs):
        """Time every kernel of a call on these inputs (see compiler.codegen.profile); `print(p.render())`.
        `in_call`: time each kernel inside whole calls rather than on its own, repeatedly."""
        from compiler.codegen.profile import profile

        return profile(self, args, kwargs, repeat=repeat, warmup=warmup, in_call=in_call)

    def _bind_outputs(self, outputs: list[np.ndarray], bufs: list) -> list[bool]:
        """Check the caller's result arrays; those the kernels can write into directly replace the result
        buffers in `bufs` (on the CPU, C-contiguous, aligned as the kernels need, not bf16 or empty)."""
        types = [(b.shape, np.dtype(DType(b.dtype).np)) for b in (self.plan.buffers[r] for r in self._results)]
        if len(outputs) != len(types):
            raise GCError(f"the model has {len(types)} result(s), got {len(outputs)} output array(s)")
        direct = []
        for i, (o, (shape, dtype)) in enumerate(zip(outputs, types)):
            if not isinstance(o, np.ndarray) or o.shape != shape or o.dtype != dtype or not o.flags.writeable:
                got = f"{o.dtype}{list(o.shape)}" if isinstance(o, np.ndarray) else type(o).__name__
                raise GCError(f"output {i} must be a writeable {dtype}{list(shape)} NumPy array, got {got}")
            # Only into a compact result (never a bordered buffer's strided interior, which no plan gc makes
            # returns, but a plan is checked, not trusted).
            compact = self.plan.buffers[self._results[i]].kind in ("temp", "view")
            ok = (compact and self.target["kind"] != "cuda" and o.flags.c_contiguous and not is_bf16(np.dtype(dtype)) and o.size > 0
                  and (self._unaligned_ok or o.__array_interface__["data"][0] % ALIGN == 0)
                  and sum(1 for r in self._results if r == self._results[i]) == 1)
            if ok:
                bufs[self._results[i]] = o
            direct.append(ok)
        return direct

    def _bind(self, args, kwargs) -> list[np.ndarray]:
        if args and kwargs:
            raise GCError("pass the inputs either by position or by name, not both")
        if kwargs:
            extra = [k for k in kwargs if k not in self.arg_names]
            if extra:
                raise GCError(f"unknown input '{extra[0]}': the model takes " + ", ".join(self.arg_names))
            missing = [n for n in self.arg_names if n not in kwargs]
            if missing:
                raise GCError(f"missing input '{missing[0]}'")
            args = tuple(kwargs[n] for n in self.arg_names)
        if len(args) != len(self.arg_names):
            raise GCError(f"the model takes {len(self.arg_names)} input(s) ({', '.join(self.arg_names)}), got {len(args)}")
        out = []
        for name, (shape, dtype), x in zip(self.arg_names, self.arg_types, args):
            if type(x) is np.ndarray and x.dtype == dtype and x.shape == shape and x.flags.c_contiguous:
                out.append(x)  # the common case, with no new array object (48 arguments: 26 -> 13 us a call)
                continue
            x = np.asarray(x)
            if x.shape != shape:
                raise GCError(f"input '{name}' has shape {list(x.shape)}, expected {list(shape)}")
            if x.dtype != dtype:
                if not castable(x.dtype, dtype):
                    raise GCError(f"input '{name}' has dtype {x.dtype}, expected {dtype}")
                x = narrowed(name, x, dtype)
            out.append(np.ascontiguousarray(x).reshape(shape))  # ascontiguousarray makes rank 0 rank 1
        return out

    # -- the artifact (compiler/codegen/artifact.py) --

    def save(self, path: str | Path) -> None:
        """Write the model as a .gcpkg artifact at `path`, atomically."""
        from compiler.codegen import artifact

        artifact.save(self, path)

    @staticmethod
    def read_plan(path: str | Path) -> dict:
        """The checked plan.json of a saved model (its target, entry, signature...) without loading its kernels."""
        from compiler.codegen import artifact

        return artifact.read_plan(path)

    @staticmethod
    def load(path: str | Path) -> CompiledModel:
        """A saved model, after checking the file is whole and fits this machine (see artifact.py): only load
        artifacts from a source you trust, since loading runs the native code they hold."""
        from compiler.codegen import artifact

        return artifact.load(path)


class _Workspace:
    """What one call in flight writes: the plan's arenas and their views, zero-bordered buffers (zeroed
    once: kernels write only their interior), staging buffers for inputs, and the CUDA streams and events
    of a multi-stream plan. The constants are the model's."""

    def __init__(self, model: CompiledModel):
        import tvm

        plan, dev = model.plan, model.device
        self.bufs: list = list(model._consts)  # copied to the device by model._take
        self.keep: list = []  # what keeps the arena's views valid (DLPack structs)
        self.whole: dict[int, object] = {}  # zero-bordered buffers, by the slot of their interior
        for i, b in enumerate(plan.buffers):
            dtype = DType(b.dtype).tvm
            if b.kind == "temp":
                self.bufs[i] = tvm.runtime.empty(b.shape, dtype, dev)
            elif b.kind == "arena":
                self.bufs[i] = tvm.runtime.empty((max(b.size, 1),), "uint8", dev)
            elif b.kind == "view":
                self.bufs[i] = _view(self.bufs[b.arena], b.offset, b.shape, dtype, self.keep)
            elif b.kind == "bordered":
                if b.in_arena:  # arena bytes, the border written by the kernel that writes the tensor
                    base, at = self.bufs[b.arena], b.offset
                    buf = _view(base, at, padded_shape(b.shape, b.pads), dtype, self.keep)
                else:  # a buffer of its own, zeroed here once: nothing else writes its border
                    buf = tvm.runtime.tensor(np.zeros(padded_shape(b.shape, b.pads), DType(b.dtype).np), dev)
                    base, at = buf, 0
                self.whole[i] = buf
                strides = padded_strides(b.shape, b.pads)
                offset = sum(lo * st for lo, st in zip(b.pads[: len(b.shape)], strides)) * DType(b.dtype).itemsize
                self.bufs[i] = _view(base, at + offset, b.shape, dtype, self.keep, list(strides))
            elif b.kind == "whole":
                self.bufs[i] = self.whole[b.of]
        # TVM kernels assume 64-byte aligned buffers (vector loads); a misaligned input is copied here.
        self.staging = [tvm.runtime.empty(shape, DType.from_numpy(dt).tvm, dev) for shape, dt in model.arg_types]
        # Streams: on a GPU, launches go to the CUDA streams assign-streams chose, ordered by events. On
        # the CPU every kernel already spreads over all cores, so the plan runs in its printed order,
        # which is a valid serial order of the streams.
        self.streams = None
        if model.target["kind"] == "cuda" and model._nstreams > 1:
            nevents = 1 + max((c.signal for c in plan.steps if c.signal is not None), default=-1)
            self.streams = _CudaStreams.create(dev, model._nstreams, nevents)
        # (function, getter of its buffers from the slot list): itemgetter picks them in C, which saves a
        # list per kernel per call.
        steps = (model._step(c, self.streams) for c in plan.steps)
        self.calls = [(fn, _getter(idx)) for fn, idx in filter(None, steps)]
        self.result_views = [self._view(model, r) for r in plan.results]

    def _view(self, model: CompiledModel, slot: int):
        """A NumPy view of a buffer allocated here, or None (arguments, constants, GPU memory)."""
        b = self.bufs[slot]
        if b is None or model.target["kind"] == "cuda" or model.plan.buffers[slot].dtype == "bf16":
            return None
        try:
            return np.from_dlpack(b)
        except (TypeError, BufferError, RuntimeError):
            return None


class _CudaStreams:
    """CUDA streams and events for a plan with several streams, through the driver API (libcuda), which
    TVM's Python API does not expose events of. Kernels launch on TVM's current stream, set per launch."""

    def __init__(self, device, nstreams: int, nevents: int):
        from tvm_ffi import core

        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.set_stream = core._env_set_current_stream
        self.where = (device.dlpack_device_type(), device.index)
        self.streams = [ctypes.c_void_p(_handle(device.create_raw_stream())) for _ in range(nstreams)]
        self.events = []
        for _ in range(nevents):
            ev = ctypes.c_void_p()
            self._check(self.cuda.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")  # 2: no timing
            self.events.append(ev)

    @staticmethod
    def create(device, nstreams: int, nevents: int) -> _CudaStreams | None:
        try:
            return _CudaStreams(device, nstreams, nevents)
        except (OSError, GCError, AttributeError) as e:
            import warnings

            warnings.warn(f"gc: running the plan's {nstreams} streams one after the other: {e}", stacklevel=3)
            return None

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise GCError(f"{what} failed with CUDA driver error {status}")

    def on(self, s: int, fn):
        stream, (kind, dev) = self.streams[s].value or 0, self.where

        def launch(*bufs) -> None:
            self.set_stream(kind, dev, stream)
            fn(*bufs)

        return launch

    def signal(self, event: int, s: int) -> None:
        self._check(self.cuda.cuEventRecord(self.events[event], self.streams[s]), "cuEventRecord")

    def wait(self, event: int, s: int) -> None:
        self._check(self.cuda.cuStreamWaitEvent(self.streams[s], self.events[event], 0), "cuStreamWaitEvent")

    def finish(self) -> None:
        self.set_stream(*self.where, 0)
        for st in self.streams:
            self._check(self.cuda.cuStreamSynchronize(st), "cuStreamSynchronize")


def _getter(idx: list[int]):
    """A function of a list returning its items at `idx`, as a tuple (also for one or no index)."""
    if len(idx) == 1:
        return lambda bufs, i=idx[0]: (bufs[i],)
    return operator.itemgetter(*idx) if idx else (lambda bufs: ())


def _handle(h) -> int:
    return int(h.value or 0) if isinstance(h, ctypes.c_void_p) else int(h)


def _copy(src, dst) -> None:
    dst.copyfrom(src) if not isinstance(dst, np.ndarray) else np.copyto(dst, src)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _view(base, offset: int, shape: tuple[int, ...], dtype: str, keep: list, strides: list[int] | None = None):
    """A TVM tensor over `base`'s bytes from `offset` (on any device), compact or with `strides` (in
    elements: the interior of a bordered buffer). TVM's own views set DLPack's byte_offset, which compiled
    kernels reject; this one moves the data pointer instead. The DLPack structs have no deleter: `keep`
    (the model) holds them, and the arena, for the views' lifetime."""
    import tvm
    import tvm_ffi
    from tvm_ffi.core import DataType

    dt = DataType(dtype)
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    m = _DLManagedTensor()
    m.dl_tensor.data = base.data_ptr() + offset
    m.dl_tensor.device = _DLDevice(base.device.dlpack_device_type(), base.device.index)
    m.dl_tensor.ndim = len(shape)
    m.dl_tensor.dtype = _DLDataType(dt.type_code, dt.bits, dt.lanes)
    m.dl_tensor.shape = dims
    m.dl_tensor.byte_offset = 0
    if strides is None:
        keep.append((m, dims, base))
        return tvm.runtime.from_dlpack(_capsule(ctypes.addressof(m), b"dltensor", None))
    steps = (ctypes.c_int64 * max(len(shape), 1))(*strides)
    m.dl_tensor.strides = steps
    keep.append((m, dims, steps, base))
    # Not 64-byte aligned and not contiguous, as the kernels that take it declare (lower.declare_strides).
    return tvm_ffi.from_dlpack(_capsule(ctypes.addressof(m), b"dltensor", None), require_alignment=0,
                               require_contiguous=False)


def _to_numpy(b) -> np.ndarray:
    return np.array(b, copy=True) if isinstance(b, np.ndarray) else b.numpy()


def _no_cpu_features(target: dict) -> str | None:
    from compiler.codegen.target import no_cpu_features

    why = no_cpu_features(target)
    return f"cannot run this model here: {why}" if why else None


def _no_cuda_device(target: dict) -> str | None:
    """Why a model compiled for cuda cannot run here, or None when a GPU is present."""
    import tvm

    if not tvm.runtime.enabled("cuda"):
        why = "TVM's CUDA runtime is not available (no NVIDIA driver, libcuda.so.1, on this machine)"
    elif not tvm.cuda(0).exist:
        why = "no GPU is visible to the CUDA driver"
    else:
        return None
    return (f"no CUDA device: the model was compiled for cuda ({target.get('arch', '?')}) and needs an NVIDIA GPU "
            f"to run, but {why}; `gc compile --target cuda --emit cuda` shows its kernels")
