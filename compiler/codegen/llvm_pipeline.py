"""The `gc-llvm` TIR pipeline: TVM's own lowering, with NaN tests that vectorize and strided vector loads
as contiguous loads and a shuffle.

TVM's vectorizer scalarizes a whole loop that calls an op it does not know to be lane-wise; `isnan` is
one, so every NaN-propagating max or min (a max pool's reducer, `maximum`) ran one lane at a time; it is
lane-wise, and marked so here (a max pool 3x3/2 on 256 maps of 27x27: see cpu_rules/pool.py). The mark
is TVM's op registry's, for the whole process: CUDA builds vectorize such loops too, and lower isnan one
call per lane (schedule_cuda: CUDA C has no `!=` on float2).

TVM lowers a vector load whose lanes step by a constant s > 1 (`x[ramp(b, 2, 16)]`: a stride-2 pool,
conv or depthwise conv reading every other column) to one scalar load per lane, a gather. The same
lanes lie in the s*(n-1)+1 contiguous elements from b: here such a load becomes a few contiguous
n-lane loads covering exactly that span (the last one shifted back so that nothing past the span is
read) and one shuffle picking the lanes, which LLVM emits as permutes (vpermt2ps on AVX-512). The
rewrite runs after TVM's own lowering (vectorization included), on every kernel the CPU build compiles;
a schedule may then vectorize a strided axis where the gather used to make it slower than scalar code.
(TVM 0.27's tirx has no Python StmtExprMutator; tvm_ffi's structural_map walks and rebuilds TIR all the
same.)
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.pipeline import default_s_tir_pipeline

PIPELINE = "gc-llvm"
tvm.ir.register_op_attr("tirx.isnan", "TVectorizable", True)
MAX_STRIDE = 4  # wider steps read more vectors than the lanes they keep: a gather is no worse


def deinterleave(load):
    """`load` as contiguous loads and a shuffle, or itself where it is no constant-stride vector load of a
    flattened buffer of scalars. (Masked loads are calls, not loads: they stay as they are.)"""
    if len(load.indices) != 1 or not isinstance(load.indices[0], tirx.Ramp) or load.source.dtype.lanes != 1:
        return load
    ramp = load.indices[0]
    stride, lanes = ramp.stride, ramp.lanes
    if not isinstance(stride, tirx.IntImm) or not isinstance(lanes, tirx.IntImm):
        return load
    s, n = int(stride), int(lanes)
    if not 2 <= s <= MAX_STRIDE or n < 2:
        return load
    span = s * (n - 1) + 1
    starts = [min(t * n, span - n) for t in range(-(-span // n))]
    base = ramp.base
    vectors = [tirx.BufferLoad(load.source, [tirx.Ramp(base + st, 1, n)]) for st in starts]
    picks = []
    for k in range(n):
        e = s * k
        t = next(t for t, st in enumerate(starts) if st <= e < st + n)
        picks.append(t * n + e - starts[t])
    return tirx.Shuffle(vectors, [tirx.const(i, "int32") for i in picks])


@tirx.transform.prim_func_pass(opt_level=0, name="gc.DeinterleaveStridedLoads")
def deinterleave_strided_loads(func, _mod, _ctx):
    body = tvm_ffi.structural_map(func.body, [(TensorLoad, deinterleave)])
    return func if body.same_as(func.body) else func.with_body(body)


def _pipeline():
    lower, finalize_host, finalize_device = default_s_tir_pipeline()
    return tvm.transform.Sequential([lower, deinterleave_strided_loads]), finalize_host, finalize_device


tvm.tirx.register_tir_pipeline(PIPELINE, _pipeline)


def compile_cpu(mod, target):
    """tvm.compile for the CPU through the `gc-llvm` pipeline (what the builder and the tests use).

    Without TVM's checks of every argument at every call (its type, shape, strides, dtype, alignment and
    device, each with its message): the runtime passes only buffers it made from the plan, and the loader
    checks once that every call's buffers are what its kernel takes (artifact.check_plan, the plan's
    `signatures`). The checks were most of the code of a kernel with many inputs: DenseNet-121's 58 concat
    kernels 6.0 MB of object code with them, 1.0 MB without, and LLVM's time for them 15 -> 8 s. (The
    config is per thread: build_library's threads each compile through here.)"""
    with tvm.transform.PassContext(config={"tirx.disable_assert": True}):
        return tvm.compile(mod, target=target, tir_pipeline=PIPELINE)


# From this many functions a build is split among the cores (below it, linking a library costs more).
PARALLEL_FUNCTIONS = 16
FUNCTIONS_PER_PART = 8
PARTS_PER_CORE = 8


def build_library(mod, target, cores: int):
    """The functions of `mod` compiled into one shared library: (the loaded library, its bytes, the
    compiled LLVM modules, whose source `gc compile --emit llvm/asm` prints, the object files' bytes).

    LLVM compiles a module on one core, and TVM releases the interpreter lock while it does, so the
    functions are split into parts, each compiled and written as an object file in a thread, `cores`
    threads taking the next part as they finish, and the objects linked once. Parts of about
    FUNCTIONS_PER_PART functions, up to PARTS_PER_CORE a core: kernels differ widely in cost (a DenseNet
    concat of 32 operands is LLVM's work of twenty convs), and one part a core left a core idle while
    the other finished the costly ones: DenseNet-121's 135 functions 17 s with 2 parts on 2 cores, 12 s
    with 16 (Zen 4); one core, one part: 24 s."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from tvm.support import cc

    names = [gv.name_hint for gv in mod.functions]
    n_parts = max(cores, min(PARTS_PER_CORE * cores, len(names) // FUNCTIONS_PER_PART))
    groups = [names[i::n_parts] for i in range(n_parts) if names[i::n_parts]]
    with tempfile.TemporaryDirectory() as d:
        def one(i: int):
            ex = compile_cpu(tvm.IRModule({n: mod[n] for n in groups[i]}), target)
            ex.mod.write_to_file(f"{d}/part{i}.o")
            return ex.mod

        with ThreadPoolExecutor(min(cores, len(groups))) as pool:
            parts = list(pool.map(one, range(len(groups))))
        so = Path(d) / "lib.so"
        cc.create_shared(str(so), [f"{d}/part{i}.o" for i in range(len(groups))])
        objects = [Path(f"{d}/part{i}.o").read_bytes() for i in range(len(groups))]
        return tvm.runtime.load_module(str(so)), so.read_bytes(), parts, objects


def link_objects(objects: list[bytes], path: str) -> None:
    """One shared library at `path` from object files' bytes (a symbolic function's parts, built size by size)."""
    import tempfile

    from tvm.support import cc

    with tempfile.TemporaryDirectory() as d:
        names = [f"{d}/part{i}.o" for i in range(len(objects))]
        for name, data in zip(names, objects):
            with open(name, "wb") as out:
                out.write(data)
        cc.create_shared(path, names)
