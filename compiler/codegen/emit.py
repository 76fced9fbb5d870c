"""What a built library holds, as text or as device code: the CUDA C source and its PTX.

Both work without a GPU: TVM keeps the CUDA C source of the kernels when no driver is present, and
nvcc compiles it for any arch.
"""

from __future__ import annotations

import re

from compiler.codegen.target import DEFAULT_CUDA_ARCH


def cuda_source(lib) -> str:
    """The .cu source of a library built for cuda (a tvm Executable or runtime Module); "" for no library
    (a model without kernels)."""
    if lib is None:
        return ""
    mod = getattr(lib, "mod", lib)
    device = [m for m in mod.imports if m.kind == "cuda"]
    # No device module means the kernels became host code: schedule_cuda exists to prevent that.
    assert device, f"the library has no CUDA module (imports: {[m.kind for m in mod.imports]})"
    return str(device[0].inspect_source())


def kernel_names(source: str) -> list[str]:
    """The `__global__` functions a CUDA source defines, in order (TVM names them <kernel>_kernel[_N])."""
    names = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\(\d+\)\s+)?(\w+)\s*\(", source)
    return list(dict.fromkeys(names))  # each kernel is declared, then defined


def compile_ptx(source: str, arch: str = DEFAULT_CUDA_ARCH) -> bytes:
    """PTX for `arch` (e.g. "sm_80"), compiled with nvcc; a compile error raises RuntimeError with its log."""
    from tvm.support import nvcc
    from tvm.target import Target

    # compile_cuda consults Target.current() even when arch is given.
    with Target({"kind": "cuda", "arch": arch}):
        return bytes(nvcc.compile_cuda(source, target_format="ptx", arch=arch, compiler="nvcc"))
