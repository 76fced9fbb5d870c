"""The gc-llvm TIR pipeline: strided vector loads as contiguous loads and a shuffle, NaN tests vectorized."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

tvm = pytest.importorskip("tvm")
from tvm import te, tirx

from compiler.codegen import llvm_pipeline
from compiler.codegen.target import llvm_target


@settings(max_examples=60, deadline=None)
@given(stride=st.integers(2, llvm_pipeline.MAX_STRIDE), lanes=st.integers(2, 32), base=st.integers(0, 50))
def test_a_strided_load_becomes_loads_of_its_span_and_a_shuffle_of_its_lanes(stride, lanes, base) -> None:
    buf = tirx.decl_buffer((base + stride * lanes + 8,), "float32", name="a")
    load = tirx.BufferLoad(buf, [tirx.Ramp(tirx.const(base, "int32"), stride, lanes)])
    got = llvm_pipeline.deinterleave(load)
    assert isinstance(got, tirx.Shuffle)
    starts = [int(v.indices[0].base) for v in got.vectors]
    for v in got.vectors:
        assert int(v.indices[0].stride) == 1 and int(v.indices[0].lanes) == lanes
    # Nothing outside the strided load's own span is read.
    assert min(starts) == base and max(starts) + lanes - 1 <= base + stride * (lanes - 1)
    picked = [starts[int(i) // lanes] + int(i) % lanes for i in got.indices]
    assert picked == [base + stride * k for k in range(lanes)]


def test_unit_stride_wide_stride_and_scalar_loads_stay_as_they_are() -> None:
    buf = tirx.decl_buffer((256,), "float32", name="a")
    for index in (tirx.Ramp(0, 1, 16), tirx.Ramp(0, llvm_pipeline.MAX_STRIDE + 1, 16), tirx.const(3, "int32")):
        load = tirx.BufferLoad(buf, [index])
        assert llvm_pipeline.deinterleave(load).same_as(load)


@pytest.mark.parametrize("stride,n", [(2, 16), (2, 13), (3, 16), (4, 7), (2, 55)])
def test_strided_vector_loads_compute_the_right_values(monkeypatch, stride: int, n: int) -> None:
    """A vectorized loop reading every `stride`-th element, its last read the buffer's last element."""
    shuffles = []

    def counted(load):
        new = original(load)
        shuffles.extend([new] if isinstance(new, tirx.Shuffle) else [])
        return new

    original = llvm_pipeline.deinterleave
    monkeypatch.setattr(llvm_pipeline, "deinterleave", counted)
    size = stride * (n - 1) + 2
    a = te.placeholder((size,), name="a")
    b = te.compute((n,), lambda i: a[i * stride] * 2.0 + a[i * stride + 1], name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    sch.vectorize(sch.get_loops(sch.get_sblock("b"))[0])
    fn = llvm_pipeline.compile_cpu(sch.mod, llvm_target())["main"]
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    fn(tvm.runtime.tensor(x), out)
    np.testing.assert_allclose(out.numpy(), x[: stride * n : stride] * 2 + x[1 : stride * n + 1 : stride], rtol=1e-6)
    assert len(shuffles) == 2  # both loads


def capture_lowered(monkeypatch) -> list[str]:
    """The text of every kernel as the gc-llvm pipeline lowers it (TVM's lowering done, vectorized loops
    expanded: a loop TVM scalarized instead is named `<var>_s`)."""
    seen: list[str] = []
    original = llvm_pipeline.deinterleave_strided_loads

    @tirx.transform.prim_func_pass(opt_level=0)
    def spy(func, mod, ctx):
        seen.append(func.script())
        return func

    monkeypatch.setattr(llvm_pipeline, "deinterleave_strided_loads", tvm.transform.Sequential([original, spy]))
    return seen


def test_nan_tests_vectorize_and_keep_their_meaning(monkeypatch) -> None:
    """TVM scalarized every loop calling isnan (a NaN-propagating max: every max pool); it is lane-wise."""
    assert tvm.ir.Op.get("tirx.isnan").get_attr("TVectorizable")
    seen = capture_lowered(monkeypatch)
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: tirx.Select(tirx.isnan(a[i]), tirx.const(7.0, "float32"), a[i]), name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    sch.vectorize(sch.get_loops(sch.get_sblock("b"))[0])
    fn = llvm_pipeline.compile_cpu(sch.mod, llvm_target())["main"]
    x = np.arange(64, dtype=np.float32)
    x[[3, 17, 63]] = np.nan
    out = tvm.runtime.tensor(np.zeros(64, np.float32))
    fn(tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), np.where(np.isnan(x), 7.0, x))
    assert "_s in range" not in seen[0] and "T.isnan(a_1[T.Ramp(0, 1, 64)])" in seen[0]


@pytest.mark.parametrize("attrs,shape,out,strided", [
    ("kernel = [3, 3], strides = [2, 2], ceil_mode = true", (1, 4, 27, 27), (1, 4, 13, 13), True),
    ("kernel = [3, 3], strides = [2, 2], padding = [1, 1, 1, 1]", (1, 4, 40, 40), (1, 4, 20, 20), True),
    ("kernel = [3, 3], strides = [1, 1], padding = [1, 1, 1, 1]", (1, 4, 24, 24), (1, 4, 24, 24), False),
])
def test_max_pools_run_in_vectors(monkeypatch, attrs, shape, out, strided) -> None:
    """The pool rule's rows stay vectors through TVM's lowering: NaN-propagating max, a padded window (its
    padding computed a plane at a time), strided reads (a shuffle of contiguous loads)."""
    import compiler
    from compiler.interpreter import run as interpret
    from compiler.parser import parse

    seen = capture_lowered(monkeypatch)
    t_in, t_out = "x".join(map(str, shape)), "x".join(map(str, out))
    text = (f"func @main(%x: tensor<{t_in}xf32>) -> tensor<{t_out}xf32> {{\n"
            f"  %p = graph.max_pool2d(%x) {{{attrs}}} : tensor<{t_out}xf32>\n  return %p\n}}\n")
    model = compiler.compile(text, "llvm")
    assert [c.schedule for c in model.plan.steps] == ["pool"]
    pool = next(t for t in seen if "max_pool2d" in t)
    body = pool[pool.index("compute_scope"):]
    assert ("T.Shuffle" in body) == strided
    assert not any(line.strip().startswith("for") and "_s in range" in line and "ax" not in line
                   for line in body.splitlines())  # the pool's own loops (a padding's border may be scalar)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x[0, 1, 3, 4] = np.nan
    np.testing.assert_array_equal(model(x)[0], interpret(parse(text), {"x": x})[0])
