"""Targets: the host CPU as LLVM sees it (TVM silently drops mcpu=native), and CUDA with an explicit arch."""

from __future__ import annotations

import os
from functools import lru_cache

DEFAULT_CUDA_ARCH = "sm_80"


def num_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@lru_cache(maxsize=1)
def host_cpu() -> str:
    """The host's LLVM CPU name (e.g. znver3, skylake-avx512), which turns on AVX2/AVX-512 as present."""
    import tvm

    try:
        return str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:  # noqa: BLE001 (an LLVM without the query: generic code still runs)
        return "generic"


def llvm_target(mcpu: str | None = None) -> dict:
    return {"kind": "llvm", "mcpu": mcpu or host_cpu(), "num-cores": num_cores()}


def cuda_arch() -> str:
    """The arch of GPU 0 if one is present, else sm_80."""
    import tvm

    try:
        dev = tvm.cuda(0)
        if dev.exist:
            return "sm_" + str(dev.compute_version).replace(".", "")
    except Exception:  # noqa: BLE001 (no CUDA runtime in this TVM build)
        pass
    return DEFAULT_CUDA_ARCH


# Static shared memory a block may use on every arch since sm_50; dlight's rules size their tiles to it
# (and warn on every kernel when the target does not say).
SHARED_MEMORY_PER_BLOCK = 49152


def cuda_target(arch: str | None = None) -> dict:
    return {"kind": "cuda", "arch": arch or cuda_arch(), "max_shared_memory_per_block": SHARED_MEMORY_PER_BLOCK,
            "host": llvm_target()}


def make_target(name: str, arch: str | None = None) -> dict:
    if name == "llvm":
        return llvm_target()
    if name == "cuda":
        return cuda_target(arch)
    raise ValueError(f"unknown target {name}")
