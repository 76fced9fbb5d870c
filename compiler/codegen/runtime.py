"""The compiled model: kernels called in order on buffers allocated once.

Per call there is no Python loop that allocates: inputs are passed zero-copy (DLPack), intermediate
buffers were allocated at load time, and only the returned arrays are new.
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from compiler.diagnostics import GCError
from compiler.ir import DType

FORMAT = "gcpkg-1"
ALIGN = 64
_BF16 = np.dtype(DType.bf16.np)


class CompiledModel:
    """Call it with NumPy arrays (positional or by argument name); it returns a list of NumPy arrays."""

    def __init__(self, lib, plan: dict, consts: dict[str, np.ndarray], target: dict):
        import tvm

        self.lib = lib
        self.source: str | None = None  # the GIR it was compiled from (for random inputs that fit it)
        self.plan = plan
        self.target = target
        self.consts = consts
        self.device = tvm.cuda(0) if target["kind"] == "cuda" else tvm.cpu(0)
        # A cuda model builds anywhere but runs only beside a GPU: without one, calls raise this.
        self.unavailable = _no_cuda_device(target) if target["kind"] == "cuda" else None
        self.arg_names = [a["name"] for a in plan["args"]]
        self.arg_types = [(tuple(a["shape"]), np.dtype(DType(a["dtype"]).np)) for a in plan["args"]]
        self._bufs: list = [None] * len(plan["buffers"])
        self._arg_slots: list[int] = []
        for i, b in enumerate(plan["buffers"]):
            if self.unavailable:
                continue
            dtype = DType(b["dtype"]).tvm
            if b["kind"] == "const":
                self._bufs[i] = tvm.runtime.tensor(consts[b["name"]], self.device)
            elif b["kind"] == "temp":
                self._bufs[i] = tvm.runtime.empty(tuple(b["shape"]), dtype, self.device)
        self._arg_slots = [next(i for i, b in enumerate(plan["buffers"]) if b["kind"] == "arg" and b["index"] == k)
                           if any(b["kind"] == "arg" and b["index"] == k for b in plan["buffers"]) else -1
                           for k in range(len(plan["args"]))]
        # TVM kernels assume 64-byte aligned buffers (vector loads); a misaligned input is copied here.
        self._staging = [tvm.runtime.empty(shape, DType.from_numpy(dt).tvm, self.device)
                         for shape, dt in self.arg_types] if not self.unavailable else []
        self._calls = [(lib[c["kernel"]], c["buffers"]) for c in plan["calls"]]
        self._unaligned_ok = bool(plan.get("unaligned_inputs"))
        # Inputs that always go through staging: on a GPU; NumPy bf16 (no DLPack form); empty arrays (zero
        # strides, which TVM rejects).
        on_gpu = target["kind"] == "cuda"
        self._always_stage = [on_gpu or dt == _BF16 or 0 in shape for shape, dt in self.arg_types]
        self._result_views = [self._view(r) for r in plan["results"]]
        self._results = plan["results"]

    def _view(self, slot: int):
        """A NumPy view of a buffer allocated at load time, or None (arguments, GPU memory)."""
        b = self._bufs[slot]
        if b is None or self.target["kind"] == "cuda" or self.plan["buffers"][slot]["dtype"] == "bf16":
            return None
        try:
            return np.from_dlpack(b)
        except (TypeError, BufferError, RuntimeError):
            return None

    @property
    def num_kernels(self) -> int:
        return len(self._calls)

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        if self.unavailable:
            raise GCError(self.unavailable)
        inputs = self._bind(args, kwargs)
        bufs = list(self._bufs)
        check_alignment = not self._unaligned_ok
        for slot, x, staging, stage in zip(self._arg_slots, inputs, self._staging, self._always_stage):
            if slot < 0:
                continue
            if stage or (check_alignment and x.__array_interface__["data"][0] % ALIGN):
                staging.copyfrom(x)
                bufs[slot] = staging
            else:
                bufs[slot] = x
        for fn, idx in self._calls:
            fn(*[bufs[i] for i in idx])
        # Results come back through NumPy views of the (allocated once) TVM buffers: one copy, no round trip.
        return [view.copy() if view is not None else _to_numpy(bufs[r]) for r, view in zip(self._results, self._result_views)]

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
            x = np.asarray(x)
            if x.shape != shape:
                raise GCError(f"input '{name}' has shape {list(x.shape)}, expected {list(shape)}")
            if x.dtype != dtype:
                if not np.can_cast(x.dtype, dtype, casting="same_kind"):
                    raise GCError(f"input '{name}' has dtype {x.dtype}, expected {dtype}")
                x = x.astype(dtype)
            out.append(np.ascontiguousarray(x).reshape(shape))  # ascontiguousarray makes rank 0 rank 1
        return out

    # -- the artifact: one zip with the library, the plan and the constants --

    def save(self, path: str | Path) -> None:
        import tvm

        head = {"format": FORMAT, "target": self.target}
        if self.target["kind"] == "cuda" and not tvm.runtime.enabled("cuda"):
            # Built without a driver, the library holds the kernels' CUDA C only, not a GPU binary.
            head["cuda_source_only"] = True
        with tempfile.TemporaryDirectory() as d:
            lib = Path(d) / "lib.so"
            self.lib.export_library(str(lib))
            consts = io.BytesIO()
            np.savez(consts, **self.consts)
            with zipfile.ZipFile(path, "w") as z:
                z.writestr("plan.json", json.dumps({**head, **self.plan}, indent=1))
                z.write(lib, "lib.so")
                z.writestr("consts.npz", consts.getvalue())
                if self.source is not None:
                    z.writestr("source.gir", self.source)

    @staticmethod
    def load(path: str | Path) -> CompiledModel:
        import tvm

        try:
            z = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as e:
            raise GCError(f"cannot read compiled model {path}: {e}") from None
        with z, tempfile.TemporaryDirectory() as d:
            plan = json.loads(z.read("plan.json"))
            if plan.get("format") != FORMAT:
                raise GCError(f"{path} is not a gc compiled model ({FORMAT})")
            z.extract("lib.so", d)
            if plan["target"]["kind"] == "cuda" and _no_cuda_device(plan["target"]):
                # TVM cannot even load a CUDA library without the driver.
                raise GCError(f"cannot load {path}: {_no_cuda_device(plan['target'])}")
            if plan.pop("cuda_source_only", False):
                raise GCError(f"cannot load {path}: it was compiled where no CUDA driver was, so it holds the "
                              "kernels' CUDA C source but no GPU binary; compile it again on this machine")
            lib = tvm.runtime.load_module(str(Path(d) / "lib.so"))
            with np.load(io.BytesIO(z.read("consts.npz"))) as c:
                consts = {k: c[k] for k in c.files}
            source = z.read("source.gir").decode() if "source.gir" in z.namelist() else None
        target = plan.pop("target")
        plan.pop("format")
        model = CompiledModel(lib, plan, consts, target)
        model.source = source
        return model


def _to_numpy(b) -> np.ndarray:
    return np.array(b, copy=True) if isinstance(b, np.ndarray) else b.numpy()


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
