"""CUDA codegen: every kernel bound to the GPU grid, one CUDA C kernel per graph kernel, PTX from nvcc,
and, where a GPU is present, the same numbers as the interpreter.

Building for cuda needs no GPU; the tests that run kernels skip cleanly without one.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import compiler
from compiler.builder import finish, new_func
from compiler.codegen import schedule_cuda
from compiler.codegen.emit import compile_ptx, cuda_source, kernel_names
from compiler.codegen.target import cuda_target
from compiler.inputs import random_inputs
from compiler.ir import OP_REGISTRY, Module, Op
from compiler.parser import parse, parse_file
from conftest import ROOT

ARCH = "sm_80"
EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))
# Every graph op appears in ops.gir with operands of valid types: each one becomes a one-op module.
OPS_GIR = ROOT / "tests" / "gir" / "graph" / "ops.gir"
NOT_KERNELS = {"graph.constant", "graph.call"}
# A few modules that cover the dlight rules (matmul, reduction, general reduction, transpose, fallback)
# and the f16/bf16 headers; nvcc takes seconds per module, so only these go all the way to PTX.
PTX_OPS = ["graph.matmul", "graph.softmax", "graph.layer_norm", "graph.conv2d", "graph.reduce_sum",
           "graph.transpose", "graph.cast", "graph.max_pool2d"]

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def has_gpu() -> bool:
    import tvm

    return bool(tvm.runtime.enabled("cuda") and tvm.cuda(0).exist)


needs_gpu = pytest.mark.skipif("not has_gpu()", reason="no CUDA device")
needs_no_gpu = pytest.mark.skipif("has_gpu()", reason="a CUDA device is present")


def _first_instances() -> dict[str, Op]:
    out: dict[str, Op] = {}
    for f in parse_file(OPS_GIR):
        for op in f.ops:
            out.setdefault(op.name, op)
    return out


FIRST = _first_instances()
# The graph dialect's ops; mem and exec ops describe a plan, they are no kernels of their own.
KERNEL_OPS = sorted(name for name in OP_REGISTRY if name.startswith("graph.") and name not in NOT_KERNELS)


def single_op_module(name: str) -> Module:
    """`func @main` applying op `name` (as first written in ops.gir) to arguments of its operands' types."""
    op = FIRST[name]
    f, b, args = new_func("main", {f"a{i}": v.type for i, v in enumerate(op.operands)})
    new = b.create(type(op), args, dict(op.attrs))
    finish(f, *new.results)
    return Module([f])


def lowering_missing(module: Module) -> str | None:
    """The first op of the module without a TVM lowering yet (the test grows as lowerings land)."""
    for f in module:
        for op in f.ops:
            if op.name not in NOT_KERNELS and getattr(op, "lower", None) is None:
                return op.name
    return None


def build_or_skip(module: Module, pipeline: str | None = None, arch: str | None = ARCH):
    """The module compiled for cuda, or a skip while one of its ops has no lowering."""
    missing = lowering_missing(module)
    if missing:
        pytest.skip(f"{missing} has no lowering yet")
    return compiler.compile(module, "cuda", pipeline=pipeline, arch=arch)


def assert_one_cuda_kernel_per_graph_kernel(model, source: str) -> None:
    """Each graph kernel becomes <name>_kernel (dlight may split it: <name>_kernel_1, ...), and nothing else."""
    graph_kernels = {c.kernel for c in model.plan.steps if c.kernel}
    names = kernel_names(source)
    owners = {re.sub(r"_kernel(_\d+)?$", "", n) for n in names}
    assert owners == graph_kernels, f"CUDA kernels {names} for graph kernels {sorted(graph_kernels)}"
    assert all(n.endswith("_kernel") or re.search(r"_kernel_\d+$", n) for n in names)


# -- CUDA C source, no GPU needed --


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_compiles_to_one_cuda_kernel_per_graph_kernel(path: Path) -> None:
    model = build_or_skip(parse_file(path))
    assert model.num_kernels > 0
    assert_one_cuda_kernel_per_graph_kernel(model, cuda_source(model.lib))


@pytest.mark.parametrize("name", KERNEL_OPS)
def test_single_op_compiles_to_cuda_kernels(name: str) -> None:
    if getattr(OP_REGISTRY[name], "lower", None) is None:
        pytest.skip(f"{name} has no lowering yet")
    model = build_or_skip(single_op_module(name), pipeline="")
    if model.num_kernels == 0:
        pytest.skip(f"{name} in ops.gir makes no kernel (an empty result)")
    source = cuda_source(model.lib)
    assert "__global__" in source
    assert_one_cuda_kernel_per_graph_kernel(model, source)


def test_f16_matmul_takes_the_tensor_core_path() -> None:
    text = ("func @main(%a: tensor<128x128xf16>, %b: tensor<128x256xf16>) -> tensor<128x256xf16> {\n"
            "  %c = graph.matmul(%a, %b) : tensor<128x256xf16>\n  return %c\n}\n")
    model = compiler.compile(parse(text, "<f16>"), "cuda", pipeline="", arch=ARCH)
    assert "wmma" in cuda_source(model.lib)


# -- PTX through nvcc --


@needs_nvcc
@pytest.mark.parametrize("path", EXAMPLES[:2], ids=lambda p: p.stem)
def test_example_cuda_source_compiles_to_ptx(path: Path) -> None:
    model = build_or_skip(parse_file(path))
    source = cuda_source(model.lib)
    ptx = compile_ptx(source, ARCH).decode()
    entries = re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M)
    assert sorted(entries) == sorted(kernel_names(source))


@needs_nvcc
@pytest.mark.parametrize("name", PTX_OPS)
def test_single_op_cuda_source_compiles_to_ptx(name: str) -> None:
    model = build_or_skip(single_op_module(name), pipeline="")
    source = cuda_source(model.lib)
    ptx = compile_ptx(source, ARCH).decode()
    assert len(re.findall(r"^\.visible \.entry ", ptx, re.M)) == len(kernel_names(source))


@needs_nvcc
def test_f16_tensor_core_matmul_compiles_to_mma_ptx() -> None:
    text = ("func @main(%a: tensor<128x128xf16>, %b: tensor<128x256xf16>) -> tensor<128x256xf16> {\n"
            "  %c = graph.matmul(%a, %b) : tensor<128x256xf16>\n  return %c\n}\n")
    model = compiler.compile(parse(text, "<f16>"), "cuda", pipeline="", arch=ARCH)
    assert "mma.sync" in compile_ptx(cuda_source(model.lib), ARCH).decode()



@needs_nvcc
@pytest.mark.parametrize("case", ["clip", "maximum"])
def test_a_vectorized_nan_propagating_epilogue_compiles_to_ptx(case: str) -> None:
    """The Matmul rule computes its epilogue in float2: CUDA C has no `!=` for float2, which TVM's own
    lowering of isnan wrote (MobileNetV2's conv + ReLU6 did not compile); one isnan per lane does."""
    from test_nan import epilogue_module

    model = compiler.compile(epilogue_module(case), "cuda", arch=ARCH)
    source = cuda_source(model.lib)
    assert re.search(r"\.x = isnan\(", source) and re.search(r"\.y = isnan\(", source)
    compile_ptx(source, ARCH)

def _ptxas_report(source: str, arch: str) -> dict[str, dict[str, int]]:
    """Each kernel's registers, static shared memory and spill bytes, as ptxas reports them on assembling."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cu = Path(d) / "kernels.cu"
        cu.write_text(source)
        run = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(Path(d) / "k.cubin"),
                              str(cu)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out: dict[str, dict[str, int]] = {}
    for name, body in re.findall(r"Compiling entry function '(\w+)'.*?\n(.*?)(?=Compiling entry|\Z)",
                                 run.stderr, re.S):
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", body)
        registers = re.search(r"Used (\d+) registers", body)
        smem = re.search(r"(\d+) bytes smem", body)
        out[name] = {"registers": int(registers.group(1)), "smem": int(smem.group(1)) if smem else 0,
                     "spills": int(spill.group(1)) + int(spill.group(2)) if spill else 0}
    return out


@needs_nvcc
@pytest.mark.parametrize("path", [ROOT / "examples" / "cnn.gir", ROOT / "examples" / "transformer.gir"],
                         ids=lambda p: p.stem)
def test_example_kernels_assemble_within_the_gpus_limits(path: Path, caplog) -> None:
    """What a launch would reject, ptxas and the source tell without a GPU: a block over 1024 threads, over
    48 KB of static shared memory, or registers spilled to local memory."""
    with caplog.at_level("WARNING"):
        model = build_or_skip(parse_file(path))
    assert "max_shared_memory_per_block" not in caplog.text  # the target tells dlight the limit
    source = cuda_source(model.lib)
    bounds = [int(b) for b in re.findall(r"__launch_bounds__\((\d+)\)", source)]
    assert bounds and max(bounds) <= 1024
    report = _ptxas_report(source, ARCH)
    assert sorted(report) == sorted(kernel_names(source))
    for name, use in report.items():
        assert use["spills"] == 0 and use["registers"] <= 255 and use["smem"] <= 48 * 1024, (name, use)


# -- the schedule's own guarantees --


def _te_func(kind: str):
    from tvm import te, topi

    x = te.placeholder((6, 10), "float32", name="x")
    out = {"softmax": topi.nn.softmax(x, -1), "sum": topi.sum(x, axis=1), "scalar": topi.sum(x),
           "exp": te.compute(x.shape, lambda i, j: te.exp(x[i, j]), name="y"),
           "cumsum": topi.cumsum(x, axis=1)}[kind]
    return te.create_prim_func([x, out]).with_attr("global_symbol", kind)


def _cuda_kernels(prim, name: str) -> list[str]:
    import tvm

    lib = tvm.compile(tvm.IRModule({name: prim.with_attr("global_symbol", name)}), target=cuda_target(ARCH))
    return kernel_names(cuda_source(lib))


def test_matmul_takes_dlights_matmul_rule() -> None:
    model = build_or_skip(single_op_module("graph.matmul"), pipeline="")
    assert [str(f.attrs["gc.schedule"]) for f in model.scheduled.functions.values()] == ["Matmul"]


@pytest.mark.parametrize("op", ["graph.softmax", "graph.log_softmax"])
def test_softmax_takes_a_cross_thread_reduction_rule_with_its_row_max_from_minus_infinity(op: str) -> None:
    """The row max starts from -inf (NaN- and mask-safe); TVM's GPU reductions know that reducer only once
    gc registers it, else the kernel fell back to one thread per row (82 of 344 us in the transformer)."""
    model = build_or_skip(single_op_module(op), pipeline="")
    assert [str(f.attrs["gc.schedule"]) for f in model.scheduled.functions.values()] == ["GeneralReduction"]


def test_a_rule_whose_schedule_does_not_lower_gives_way_to_the_next() -> None:
    from tvm import te, tirx

    # A max starting from -inf: dlight's cross-thread reduction takes it, but TVM's lowering does not
    # recognize the reducer; the schedule must fall through to a rule that lowers.
    x = te.placeholder((6, 300), "float32", name="x")
    k = te.reduce_axis((0, 300), name="k")
    fmax = te.comm_reducer(lambda a, b: tirx.max(a, b), lambda t: tirx.const(float("-inf"), t), name="max")
    top = te.compute((6,), lambda i: fmax(x[i, k], axis=k), name="top")
    y = te.compute((6, 300), lambda i, j: x[i, j] - top[i], name="y")
    prim = schedule_cuda.schedule(te.create_prim_func([x, y]), "reduction", cuda_target(ARCH))
    # Whichever rule won (the CPU rules register this reducer with TVM once they are imported, and then
    # the reduction rules lower too), the kernel lowers and is bound to the grid.
    assert _cuda_kernels(prim, "rowmax")


def test_a_stages_private_second_result_moves_to_thread_local_memory() -> None:
    from tvm import te, tirx

    # argmax as one tuple reduction: the running max is a buffer of its own that no other stage reads,
    # which a kernel cannot allocate in global memory.
    x = te.placeholder((6, 10), "float32", name="x")
    red = te.comm_reducer(
        lambda a, b: (tirx.Select(a[1] >= b[1], a[0], b[0]), tirx.Select(a[1] >= b[1], a[1], b[1])),
        lambda t0, t1: (tirx.const(-1, t0), tirx.const(float("-inf"), t1)), name="argmax")
    k = te.reduce_axis((0, 10), name="k")
    idx, _ = te.compute((6,), lambda i: red((k, x[i, k]), axis=k), name="am")
    prim = schedule_cuda.schedule(te.create_prim_func([x, idx]), "reduction", cuda_target(ARCH))
    assert str(prim.attrs["gc.schedule"]) == "Fallback+local"
    assert _cuda_kernels(prim, "argmax") == ["argmax_kernel"]


def test_an_unscheduled_function_has_unbound_blocks() -> None:
    assert schedule_cuda.unbound_blocks(_te_func("exp")) == ["y"]


@pytest.mark.parametrize("kind", ["softmax", "sum", "scalar", "exp", "cumsum"])
def test_dlight_schedules_bind_every_stage(kind: str) -> None:
    prim = schedule_cuda.schedule(_te_func(kind), "opaque", cuda_target(ARCH))
    assert schedule_cuda.unbound_blocks(prim) == []
    assert _cuda_kernels(prim, kind)


@pytest.mark.parametrize("kind", ["softmax", "sum", "scalar", "exp", "cumsum"])
def test_plain_grid_binds_every_stage_where_dlight_does_not_apply(kind: str, monkeypatch) -> None:
    monkeypatch.setattr(schedule_cuda, "_try_rule", lambda rule, prim, tgt: None)
    prim = schedule_cuda.schedule(_te_func(kind), "opaque", cuda_target(ARCH))
    assert str(prim.attrs["gc.schedule"]) == "grid"
    assert schedule_cuda.unbound_blocks(prim) == []
    assert _cuda_kernels(prim, kind)


def test_a_stage_left_on_the_host_is_an_internal_error(monkeypatch) -> None:
    monkeypatch.setattr(schedule_cuda, "_try_rule", lambda rule, prim, tgt: None)
    monkeypatch.setattr(schedule_cuda, "_grid", lambda prim: prim)
    with pytest.raises(RuntimeError, match="internal error.*kernel exp left y outside blockIdx/threadIdx"):
        schedule_cuda.schedule(_te_func("exp"), "elementwise", cuda_target(ARCH))


# -- without a GPU: builds, but running says why not --

ADD = "func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {\n  %z = graph.add(%x, %y)\n  return %z\n}\n"


@needs_no_gpu
def test_calling_a_cuda_model_without_a_gpu_raises_no_cuda_device() -> None:
    model = compiler.compile(ADD, "cuda", arch=ARCH)
    with pytest.raises(compiler.GCError, match="no CUDA device: the model was compiled for cuda \\(sm_80\\)"):
        model(np.ones(4, np.float32), np.ones(4, np.float32))


@needs_no_gpu
def test_profiling_a_cuda_model_without_a_gpu_raises_no_cuda_device() -> None:
    model = compiler.compile(ADD, "cuda", arch=ARCH)
    with pytest.raises(compiler.GCError, match="no CUDA device"):
        model.profile(np.ones(4, np.float32), np.ones(4, np.float32), repeat=1)


@needs_no_gpu
def test_a_saved_cuda_model_loads_only_beside_a_gpu(tmp_path: Path) -> None:
    compiler.compile(ADD, "cuda", arch=ARCH).save(tmp_path / "add.gcpkg")
    with pytest.raises(compiler.GCError, match="cannot load .*add.gcpkg: no CUDA device"):
        compiler.load(tmp_path / "add.gcpkg")


@needs_no_gpu
def test_a_cuda_model_saved_without_a_driver_is_marked_source_only(tmp_path: Path) -> None:
    import json
    import zipfile

    compiler.compile(ADD, "cuda", arch=ARCH).save(tmp_path / "add.gcpkg")
    with zipfile.ZipFile(tmp_path / "add.gcpkg") as z:
        assert json.loads(z.read("plan.json"))["cuda_source_only"] is True


# -- with a GPU: the numbers --


TOLERANCE = {"float16": (1e-2, 1e-3), "bfloat16": (2e-2, 1e-2)}


def assert_matches_interpreter(module: Module, model, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    f = module["main"]
    inputs = random_inputs(f, 0, module)
    expected = compiler.run(module, [inputs[a.name] for a in f.args])
    got = model(**inputs)
    for e, g in zip(expected, got):
        e = np.asarray(e)
        if e.dtype.kind in "biu":
            np.testing.assert_array_equal(g, e)
            continue
        r, a = TOLERANCE.get(e.dtype.name, (rtol, atol))
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=r, atol=a)


# The GPU tests build for the GPU that is there (arch=None): an sm_80 cubin does not run on sm_90.


@needs_gpu
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_on_the_gpu_matches_the_interpreter(path: Path) -> None:
    module = parse_file(path)
    # Whole networks: long dot products summed in another order than NumPy's.
    assert_matches_interpreter(module, build_or_skip(module, arch=None), rtol=1e-3, atol=1e-4)


@needs_gpu
@pytest.mark.parametrize("name", KERNEL_OPS)
def test_single_op_on_the_gpu_matches_the_interpreter(name: str) -> None:
    module = single_op_module(name)
    assert_matches_interpreter(module, build_or_skip(module, pipeline="", arch=None))


@needs_gpu
def test_a_saved_cuda_model_runs_after_loading(tmp_path: Path) -> None:
    compiler.compile(ADD, "cuda").save(tmp_path / "add.gcpkg")
    again = compiler.load(tmp_path / "add.gcpkg")
    np.testing.assert_array_equal(again(np.ones(4, np.float32), np.full(4, 2, np.float32))[0], np.full(4, 3))


@needs_gpu
def test_profile_on_the_gpu_times_every_kernel_of_the_streams() -> None:
    module = parse_file(ROOT / "examples" / "inception.gir")
    model = build_or_skip(module, arch=None)
    inputs = random_inputs(module["main"], 0, module)
    p = model.profile(**inputs, repeat=3, warmup=1)
    assert [r.name for r in p.rows if r.name != "copy"] == [c.kernel for c in model.plan.steps if c.kernel]
    assert all(r.us > 0 for r in p.rows) and p.target == "cuda"


# -- a plan with zero-bordered conv inputs (the CPU's default) builds for cuda as well --

BORDERED = ("canonicalize,fold-constants,cse,dce,fuse,schedule,plan-memory{align=256,conv-borders=true},"
            "assign-streams")


def test_a_plan_with_bordered_conv_inputs_compiles_to_cuda() -> None:
    model = compiler.compile(parse_file(ROOT / "examples/cnn.gir"), "cuda", pipeline=BORDERED, arch=ARCH)
    assert [b.kind for b in model.plan.buffers].count("bordered") == 6
    assert_one_cuda_kernel_per_graph_kernel(model, cuda_source(model.lib))


def test_borders_in_the_arena_are_refused_for_cuda_whose_kernels_do_not_write_them() -> None:
    pipeline = BORDERED.replace("conv-borders=true", "conv-borders=true,borders-in-arena=true")
    with pytest.raises(compiler.GCError, match="builds for llvm only, not cuda"):
        compiler.compile(parse_file(ROOT / "examples/cnn.gir"), "cuda", pipeline=pipeline, arch=ARCH)


@needs_gpu
def test_a_plan_with_bordered_conv_inputs_runs_on_the_gpu() -> None:
    module = parse_file(ROOT / "examples/cnn.gir")
    model = compiler.compile(module, "cuda", pipeline=BORDERED, arch=None)
    for _ in range(2):  # the borders are still zero at the second call
        assert_matches_interpreter(module, model, rtol=1e-3, atol=1e-4)


@needs_gpu
@pytest.mark.parametrize("name", ["mlp", "inception"])
def test_threads_calling_one_cuda_model_get_their_own_results(name: str) -> None:
    """A workspace per call in flight on the GPU too: buffers, staging and (inception) the streams and events."""
    from test_runtime import hammer

    module = parse_file(ROOT / "examples" / f"{name}.gir")
    model = build_or_skip(module, arch=None)
    sets = [random_inputs(module["main"], seed, module) for seed in range(4)]
    want = [model(**x)[0] for x in sets]
    for x, w in zip(sets, want):
        np.testing.assert_allclose(w, compiler.run(module, x)[0], rtol=1e-3, atol=1e-4)
    assert hammer(model, sets, want, calls=20) == []


# -- dynamic sizes and in-place epilogues on the GPU --


@needs_gpu
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_a_dynamic_example_on_the_gpu_matches_the_interpreter_at_every_size(name: str) -> None:
    """One `?` model called at each size (its kernels built at the first size, for every size) against the
    static interpreter; a call whose sizes disagree is refused before any kernel runs."""
    from test_dynamic_shapes import EXAMPLES as DYNAMIC
    from test_dynamic_shapes import _inputs

    at, sizes = DYNAMIC[name]
    model = compiler.compile(at("?"), "cuda", arch=None)
    for n in sizes + sizes[:1]:  # the first size again: from the model's per-size table
        x = _inputs(at(n))
        for g, w in zip(model(**x), compiler.run(parse(at(n)), x), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_a_dynamic_example_builds_its_cuda_kernels_once_for_every_size(name: str) -> None:
    """Without a GPU: the kernels of the first size take the sizes as parameters (dlight's rules schedule
    them), so later sizes build nothing; 1 is its own specialization (a GEMV on the GPU too)."""
    from test_dynamic_shapes import EXAMPLES as DYNAMIC

    at, _ = DYNAMIC[name]
    model = compiler.compile(at("?"), "cuda", arch=ARCH)
    assert model.symbolic is not None

    def sized(n):
        return model.model_for([tuple(a.type.shape) for a in parse(at(n))["main"].args])

    first = sized(2)
    assert first.built_functions > 0 and sized(3).built_functions == 0 and sized(17).built_functions == 0
    assert [s.kernel for s in sized(17).plan.steps] == [s.kernel for s in first.plan.steps]
    assert sized(1).built_functions > 0
    source = cuda_source(model.kernels.libraries[0][0])
    signatures = re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?\w+\(([^)]*)\)", source)
    assert signatures and any(re.search(r"\bint \w+", s) for s in signatures)  # a size, bound at each call


@needs_nvcc
def test_symbolic_cuda_kernels_assemble_to_ptx() -> None:
    from test_dynamic_shapes import EXAMPLES as DYNAMIC

    at, _ = DYNAMIC["transformer"]
    model = compiler.compile(at("?"), "cuda", arch=ARCH)
    model.model_for([tuple(a.type.shape) for a in parse(at(5))["main"].args])
    ptx = compile_ptx(cuda_source(model.kernels.libraries[0][0]), ARCH).decode()
    assert ".entry" in ptx and ".param .u32" in ptx


def test_a_dynamic_cuda_model_saves_the_sizes_it_built_across_libraries(tmp_path) -> None:
    """Sizes 2 and 1 build two libraries; each size's .gcpkg gets one library of the kernels it calls."""
    import zipfile

    from test_dynamic_shapes import EXAMPLES as DYNAMIC

    at, _ = DYNAMIC["mlp"]
    model = compiler.compile(at("?"), "cuda", arch=ARCH)
    for n in (2, 1, 6):
        model.model_for([tuple(a.type.shape) for a in parse(at(n))["main"].args])
    assert len(model.kernels.libraries) == 2
    model.save(tmp_path / "m.gcpkg")
    with zipfile.ZipFile(tmp_path / "m.gcpkg") as z:
        names = set(z.namelist())
        assert {"size-0.gcpkg", "size-1.gcpkg", "size-2.gcpkg"} <= names and "kernels.json" not in names
        for i in range(3):
            (tmp_path / f"{i}.gcpkg").write_bytes(z.read(f"size-{i}.gcpkg"))
    for i in range(3):
        with zipfile.ZipFile(tmp_path / f"{i}.gcpkg") as z:
            assert len(z.read("lib.so")) > 0


def _in_place(pipeline_flag: str) -> str:
    return (f"canonicalize,fold-constants,cse,dce,fuse,schedule,plan-memory{{align=256,"
            f"in-place-epilogues={pipeline_flag}}},assign-streams")


RESIDUAL_CUDA = """func @main(%x: tensor<1x16x8x8xf32>, %w: tensor<16x16x3x3xf32>, %v: tensor<16x16x3x3xf32>,
                 %m: tensor<64x64xf32>, %n: tensor<64x64xf32>, %k: tensor<64x64xf32>) -> (tensor<1x16xf32>, tensor<64xf32>) {
  %a = graph.exp(%x) : tensor<1x16x8x8xf32>
  %h = graph.conv2d(%a, %w) {padding = [1, 1, 1, 1]} : tensor<1x16x8x8xf32>
  %r = graph.relu(%h) : tensor<1x16x8x8xf32>
  %c = graph.conv2d(%r, %v) {padding = [1, 1, 1, 1]} : tensor<1x16x8x8xf32>
  %s = graph.add(%c, %a) : tensor<1x16x8x8xf32>
  %o = graph.relu(%s) : tensor<1x16x8x8xf32>
  %g = graph.reduce_max(%o) {axes = [2, 3]} : tensor<1x16xf32>
  %e = graph.exp(%k) : tensor<64x64xf32>
  %p = graph.matmul(%m, %n) : tensor<64x64xf32>
  %q = graph.add(%p, %e) : tensor<64x64xf32>
  %t = graph.reduce_max(%q) {axes = [1]} : tensor<64xf32>
  return %g, %t
}
"""


def test_cuda_plans_with_in_place_epilogues_write_a_result_over_its_epilogue_operand() -> None:
    """Without a GPU: the plan the GPU test below runs really writes results in place (smaller arena)."""
    on = compiler.compile(RESIDUAL_CUDA, "cuda", pipeline=_in_place("true"), arch=ARCH)
    off = compiler.compile(RESIDUAL_CUDA, "cuda", pipeline=_in_place("false"), arch=ARCH)
    assert on.plan.memory["arena_bytes"] < off.plan.memory["arena_bytes"]


@needs_gpu
@pytest.mark.parametrize("path", [*EXAMPLES, "residual"], ids=lambda p: getattr(p, "stem", p))
def test_in_place_epilogues_on_the_gpu_match_the_interpreter(path) -> None:
    """The CUDA schedules (dlight's Matmul and reduction rules) read an epilogue operand where they write the
    result, thread by thread, so the result may take the operand's bytes, as on the CPU."""
    module = parse(RESIDUAL_CUDA) if path == "residual" else parse_file(path)
    model = compiler.compile(module, "cuda", pipeline=_in_place("true"), arch=None)
    for _ in range(2):
        assert_matches_interpreter(module, model, rtol=1e-3, atol=1e-4)


@needs_gpu
def test_an_attribute_taken_at_run_time_on_the_gpu_is_bound_per_call() -> None:
    """`{axes = %axes}`: a model per distinct value, each built for the GPU at its first call."""
    from test_runtime_attrs import REDUCE, X

    model = compiler.compile(REDUCE, "cuda", arch=None)
    for axes in ([0, 1], [2, 0], [0, 1]):
        np.testing.assert_allclose(model(X, np.array(axes))[0],
                                   np.maximum(X.sum(axis=tuple(axes), keepdims=True), 0), rtol=1e-5, atol=1e-5)
    assert len(model._models) == 2
