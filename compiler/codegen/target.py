"""Targets: the host CPU as LLVM sees it (TVM silently drops mcpu=native), and CUDA with an explicit arch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from compiler.diagnostics import GCError

DEFAULT_CUDA_ARCH = "sm_80"


def num_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@lru_cache(maxsize=1)
def host_cpu() -> str:
    """The LLVM CPU name kernels are built for (e.g. znver3, sapphirerapids), which turns on AVX2/AVX-512 as
    present: the host's, or GC_CPU's where set (code for an older CPU of the family runs on a newer one, so
    GC_CPU=znver3 builds and runs AVX2 code on an AVX-512 host)."""
    import tvm

    name = os.environ.get("GC_CPU")
    if name and not tvm.target.codegen.llvm_is_valid_cpu(name, tvm.target.codegen.llvm_get_system_triple()):
        raise GCError(f"GC_CPU={name} is no CPU LLVM knows (e.g. znver3, skylake-avx512, sapphirerapids)")
    return name or _system_cpu()


def llvm_target(mcpu: str | None = None) -> dict:
    """An LLVM target for `mcpu` (default: `host_cpu()`). For the host's own CPU, the features its name
    implies but this machine lacks are turned off: a VM may hide some (AVX-512, say) from a CPU that has
    them, and code using them would die with SIGILL."""
    name = mcpu or host_cpu()
    target = {"kind": "llvm", "mcpu": name, "num-cores": num_cores()}
    if name == _system_cpu() and not os.environ.get("GC_CPU"):
        lacking = [f for f in _cpu_features(name) if host_features().get(f) is False]
        if lacking:
            target["mattr"] = [f"-{f}" for f in sorted(lacking)]
    return target


@lru_cache(maxsize=1)
def _system_cpu() -> str:
    import tvm

    try:
        return str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:  # noqa: BLE001
        return "generic"


@lru_cache(maxsize=1)
def host_features() -> dict[str, bool]:
    """This machine's CPU features by LLVM's names (avx2, avx512f, fma, ...): True where the CPU has them
    and the OS enables them, as llvmlite reads them from cpuid; {} where that cannot be read."""
    try:
        import llvmlite.binding as llvm

        return {str(k): bool(v) for k, v in llvm.get_host_cpu_features().items()}
    except Exception:  # noqa: BLE001 (no llvmlite, or an LLVM without the query)
        return {}


@lru_cache(maxsize=None)
def _cpu_features(mcpu: str) -> frozenset[str]:
    import tvm

    try:
        t = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
        return frozenset(str(f) for f in tvm.target.codegen.llvm_get_cpu_features(t))
    except Exception:  # noqa: BLE001
        return frozenset()


# Instruction-set extensions LLVM may use for ordinary code (vector and scalar arithmetic, bit tricks);
# system instructions (mwaitx, pku, wbnoinvd, ...) a CPU's name also implies are never emitted unasked,
# and a VM often hides them: they do not decide where an artifact runs.
CODEGEN_FEATURES = ("sse", "ssse3", "avx", "fma", "f16c", "bmi", "popcnt", "lzcnt", "movbe", "adx", "aes",
                    "pclmul", "sha", "vaes", "vpclmulqdq", "gfni", "amx", "cx8", "cx16", "cmov", "mmx", "x87",
                    "crc32", "sahf", "prfchw", "tbm", "xop", "fma4")


def target_features(target: dict) -> list[str]:
    """The instruction-set extensions code built for an llvm `target` may use (its CPU's, less `mattr`'s
    -feature, plus its +feature): hardware features cpuid reports, of the kinds in CODEGEN_FEATURES."""
    feats = set(_cpu_features(target.get("mcpu", "generic")))
    for a in target.get("mattr", []):
        (feats.discard if a.startswith("-") else feats.add)(a[1:])
    known = host_features()
    feats = {f for f in feats if f.startswith(CODEGEN_FEATURES)}
    return sorted(f for f in feats if f in known) if known else sorted(feats)


def missing_features(features: list[str]) -> list[str]:
    """Those of `features` this machine's CPU lacks (none where its features cannot be read)."""
    known = host_features()
    return [f for f in features if known.get(f) is False]


def no_cpu_features(target: dict, features: list[str] | None = None) -> str | None:
    """Why code for an llvm `target` cannot run here (instructions this CPU lacks), or None. `features`:
    what the code may use as recorded in an artifact (default: what the target implies)."""
    missing = missing_features(target_features(target) if features is None else features)
    if not missing:
        return None
    return (f"it was compiled for the CPU '{target.get('mcpu')}' and uses instructions this CPU lacks: "
            f"{', '.join(missing)}; compile it again on this machine (this CPU is '{_system_cpu()}'; GC_CPU names "
            "an older one to build for)")


@dataclass(frozen=True)
class Cpu:
    """What the CPU rules derive their tiles from: the vector unit of the CPU code is built for, and the
    host's caches and cores. AVX2: 16 registers of 8 f32; AVX-512: 32 registers of 16 f32."""

    name: str
    vector_bytes: int  # 64 with AVX-512, 32 with AVX2 (or AVX), 16 otherwise
    registers: int  # vector registers: 32 with AVX-512, 16 otherwise
    l1d: int  # bytes of L1 data cache a core has
    l2: int  # bytes of L2 a core has
    cores: int

    def lanes(self, dtype: str) -> int:
        """Elements of `dtype` in one vector register."""
        digits = "".join(c for c in str(dtype) if c.isdigit())
        size = max(1, (int(digits) if digits else 32) // 8)
        return max(1, self.vector_bytes // size)


@lru_cache(maxsize=None)
def cpu(mcpu: str | None = None) -> Cpu:
    """The model of the CPU named `mcpu` (default: the one kernels are built for, `host_cpu()`)."""
    import tvm

    name = mcpu or host_cpu()
    vector, registers = 16, 16
    try:
        t = tvm.target.Target(llvm_target(name))
        has = tvm.target.codegen.llvm_cpu_has_features
        if has(["avx512f"], t):
            vector, registers = 64, 32
        elif has(["avx2"], t) or has(["avx"], t):
            vector = 32
    except Exception:  # noqa: BLE001 (an LLVM without the query: assume SSE)
        pass
    return Cpu(name, vector, registers, _cache_bytes(1, 32 << 10), _cache_bytes(2, 512 << 10), num_cores())


def _cache_bytes(level: int, default: int) -> int:
    """The size of the host's data (or unified) cache of this level, from sysfs; `default` where unknown."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            d = os.path.join(base, entry)
            with open(os.path.join(d, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(d, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        pass
    return default


def fma_loop(lanes: int, chains: int):
    """A function of (iterations, x) running `chains` independent chains of `lanes`-wide f32 FMAs,
    JIT-compiled for this CPU by llvmlite (ctypes calls release the GIL, so threads run it at once); None
    without llvmlite. What the FMA peak (tools/zoo.py) and `wide_fma` measure with."""
    try:
        import ctypes

        import llvmlite.binding as llvm
    except ImportError:
        return None
    v = f"<{lanes} x float>"
    phis = "\n".join(f"  %a{c} = phi {v} [ %init, %entry ], [ %n{c}, %loop ]" for c in range(chains))
    fmas = "\n".join(f"  %n{c} = call {v} @llvm.fma.v{lanes}f32({v} %a{c}, {v} %m, {v} %k)" for c in range(chains))
    sums = "\n".join(f"  %s{c} = fadd {v} %s{c - 1}, %n{c}" for c in range(1, chains))
    ir = f"""declare {v} @llvm.fma.v{lanes}f32({v}, {v}, {v})
define float @spin(i64 %iters, float %x) {{
entry:
  %x0 = insertelement {v} undef, float %x, i32 0
  %init = shufflevector {v} %x0, {v} undef, <{lanes} x i32> zeroinitializer
  %m = fadd {v} %init, %init
  %k = fsub {v} %init, %init
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
{phis}
{fmas}
  %i1 = add i64 %i, 1
  %done = icmp eq i64 %i1, %iters
  br i1 %done, label %exit, label %loop
exit:
  %s0 = fadd {v} %n0, %k
{sums}
  %r = extractelement {v} %s{chains - 1}, i32 0
  ret float %r
}}
"""
    try:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        machine = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(ir), machine)
        engine.finalize_object()
    except Exception:  # noqa: BLE001 (an LLVM that cannot JIT here)
        return None
    spin = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float)(engine.get_function_address("spin"))
    spin._engine = engine  # the code lives as long as the engine
    return spin


@lru_cache(maxsize=1)
def wide_fma() -> bool:
    """Whether this CPU runs a 512-bit FMA at the rate of a 256-bit one (its FP units 512 bits wide: Zen 5
    desktop and server, Intel's Xeons), rather than as two 256-bit halves (Zen 4, Zen 5 mobile): then a
    half-register vector does half the work a whole one would, and padding channels to whole registers
    pays where it would not on a double-pumped unit. Measured, not looked up (the same LLVM CPU name
    covers both kinds): the same count of 16- and 8-lane FMAs, fastest of five turns each; False where
    kernels are not built for this host's AVX-512 (GC_CPU) or it cannot be measured."""
    import time

    if cpu().vector_bytes < 64 or os.environ.get("GC_CPU"):
        return False
    wide, half = fma_loop(16, 24), fma_loop(8, 24)
    if wide is None or half is None:
        return False
    best = {16: float("inf"), 8: float("inf")}
    for _ in range(5):  # in turns: a host whose speed drifts slows both alike
        for lanes, f in ((16, wide), (8, half)):
            t = time.perf_counter()
            f(100_000, 0.5)
            best[lanes] = min(best[lanes], time.perf_counter() - t)
    return best[16] < 1.5 * best[8]


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
