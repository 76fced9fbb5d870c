"""The CPU schedule rules keep results equal to NumPy on odd shapes, and pick the rule they should.

Kernels are written in TE here (as the op lowerings write them), scheduled by schedule_cpu.schedule,
compiled for the host and compared with an independent NumPy computation.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

tvm = pytest.importorskip("tvm")

from tvm import te, tirx, topi  # noqa: E402

from compiler.codegen import llvm_pipeline, schedule_cpu  # noqa: E402
from compiler.codegen.build import signature  # noqa: E402
from compiler.codegen.cpu_rules import matmul, rewrite  # noqa: E402
from compiler.codegen.cpu_rules.common import lanes  # noqa: E402
from compiler.codegen.target import cpu, llvm_target  # noqa: E402

ANCHOR = "out-elementwise-fusable"
RNG = np.random.default_rng(0)


def aligned(x: np.ndarray) -> np.ndarray:
    """A 64-byte aligned copy: TVM kernels assume aligned buffers (the runtime stages others)."""
    raw = np.empty(x.nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    y = raw[off : off + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


def run(tensors: list, kind: str, *arrays: np.ndarray, constants: tuple = ()) -> tuple[np.ndarray, str]:
    """Schedule and compile the TE kernel `tensors` (inputs then one output), run it on `arrays`;
    the inputs named in `constants` are passed prepacked as the schedule asks."""
    prim = te.create_prim_func(tensors)
    scheduled = schedule_cpu.schedule(prim, kind, constants)
    fn = llvm_pipeline.compile_cpu(scheduled, llvm_target())["main"]
    packed = dict(scheduled.attrs.get("gc.prepack", {}))
    names = [str(t.op.name) for t in tensors[:-1]]
    arrays = tuple(schedule_cpu.prepack(a, str(packed[n])) if n in packed else a for n, a in zip(names, arrays))
    for (shape, *_), a in zip(signature(scheduled), arrays):  # what the loader checks callers against
        assert tuple(shape) == a.shape
    out_t = tensors[-1]
    out = aligned(np.zeros([int(d) for d in out_t.shape], str(out_t.dtype)))
    fn(*[aligned(a) for a in arrays], out)
    return out, str(scheduled.attrs["gc.schedule"])


def rand(shape, dtype="float32") -> np.ndarray:
    if dtype.startswith("int"):
        return RNG.integers(-5, 6, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


# --- matmul ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "m,k,n",
    [(1, 1, 1), (1, 7, 1), (1, 128, 10), (1, 300, 1000), (3, 5, 7), (13, 17, 19), (64, 1024, 10),
     (4, 1031, 33), (64, 784, 1024), (257, 31, 45), (300, 600, 40)],
)
def test_matmul_matches_numpy_on_odd_shapes(m: int, k: int, n: int) -> None:
    a, b = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="b")
    x, y = rand((m, k)), rand((k, n))
    got, rule = run([a, b, topi.matmul(a, b)], ANCHOR, x, y)
    assert rule == "matmul"
    np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(64, 96, 48), (5, 9, 21), (1, 64, 30)])
def test_matmul_bias_relu_epilogue_fuses_under_the_tile(m: int, k: int, n: int) -> None:
    a, b, c = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="b"), te.placeholder((n,), name="c")
    out = topi.nn.relu(topi.add(topi.matmul(a, b), c))
    x, y, z = rand((m, k)), rand((k, n)), rand((n,))
    got, rule = run([a, b, c, out], ANCHOR, x, y, z)
    assert rule == "matmul"
    np.testing.assert_allclose(got, np.maximum(x @ y + z, 0), rtol=1e-4, atol=1e-4)


def test_matmul_with_gelu_epilogue_keeps_values() -> None:
    a, b = te.placeholder((8, 40), name="a"), te.placeholder((40, 24), name="b")
    h = topi.matmul(a, b)
    out = te.compute(h.shape, lambda i, j: h[i, j] * 0.5 * (1 + te.erf(h[i, j] * 0.70710678)), name="gelu")
    x, y = rand((8, 40)), rand((40, 24))
    got, rule = run([a, b, out], ANCHOR, x, y)
    from math import erf

    want = np.vectorize(lambda v: v * 0.5 * (1 + erf(v / np.sqrt(2))))(x.astype(np.float64) @ y)
    assert rule == "matmul"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch_a,batch_b", [((2,), (2,)), ((3,), ()), ((), (4,)), ((2, 3), (3,))])
def test_batched_matmul_broadcasts_batch_dims(batch_a: tuple, batch_b: tuple) -> None:
    m, k, n = 5, 12, 20
    a = te.placeholder((*batch_a, m, k), name="a")
    b = te.placeholder((*batch_b, k, n), name="b")
    batch = np.broadcast_shapes(batch_a, batch_b)
    r = te.reduce_axis((0, k), name="r")

    def at(t, idx, shape):
        lead = idx[len(idx) - len(shape) :] if shape else ()
        return [x if s != 1 else 0 for x, s in zip(lead, shape)]

    def body(*i):
        bi, (row, col) = i[:-2], i[-2:]
        return te.sum(a[(*at(a, bi, batch_a), row, r)] * b[(*at(b, bi, batch_b), r, col)], axis=r)

    out = te.compute((*batch, m, n), body, name="bmm")
    x, y = rand((*batch_a, m, k)), rand((*batch_b, k, n))
    got, rule = run([a, b, out], ANCHOR, x, y)
    assert rule == "matmul"
    np.testing.assert_allclose(got, np.matmul(x, y), rtol=1e-4, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(batch=st.lists(st.integers(1, 9), min_size=1, max_size=3), m=st.integers(1, 13), k=st.integers(1, 70),
       n=st.integers(1, 40), residual=st.booleans())
def test_batch_dims_beside_the_rows_of_a_shared_weight_become_rows(batch, m, k, n, residual) -> None:
    """[.., M, K] @ [K, N] (Swin-T's [1, 7, 7, 768] @ [768, 3072]) is one matmul of prod(..) * M rows: the
    kernel reads A, C and the residual as views of the same bytes, and its signature keeps their shapes."""
    a, w, c = te.placeholder((*batch, m, k), name="a"), te.placeholder((k, n), name="w"), te.placeholder((n,), name="c")
    r = te.reduce_axis((0, k), name="r")
    mm = te.compute((*batch, m, n), lambda *i: te.sum(a[(*[0 if d == 1 else x for x, d in zip(i[:-2], batch)],
                                                         i[-2], r)] * w[r, i[-1]], axis=r), name="matmul")
    out = topi.add(mm, c)
    x, y, z = rand((*batch, m, k)), rand((k, n)), rand((n,))
    args, want = [a, w, c], x @ y + z
    if residual:
        res = te.placeholder((*batch, m, n), name="res")
        out, args = topi.add(out, res), [*args, res]
        v = rand((*batch, m, n))
        want = want + v
    prim = schedule_cpu.schedule(te.create_prim_func([*args, out]), ANCHOR, {"w"})
    if m > 1:  # (one row per batch element: the last batch dim is the rows already, ViT's case)
        # The batch dims just before the rows, all but unit ones (A reads those at 0: no longer side by side);
        # k = 1, an outer product, stays as it is.
        lead = len(batch)
        while lead and batch[lead - 1] > 1 and k > 1:
            lead -= 1
        assert [int(d) for d in prim.params[0].shape] == [*batch[:lead], math.prod(batch[lead:]) * m, k]
    got, rule = run([*args, out], ANCHOR, x, y, z, *([v] if residual else []), constants=("w",))
    assert rule == "matmul"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_batch_dims_a_shared_weight_indexes_stay_batches() -> None:
    """[2, 3, M, K] @ [3, K, N]: B differs along the second batch dim, so neither batch dim becomes rows."""
    a, w = te.placeholder((2, 3, 5, 8), name="a"), te.placeholder((3, 8, 6), name="w")
    r = te.reduce_axis((0, 8), name="r")
    out = te.compute((2, 3, 5, 6), lambda p, q, i, j: te.sum(a[p, q, i, r] * w[q, r, j], axis=r), name="bmm")
    prim = schedule_cpu.schedule(te.create_prim_func([a, w, out]), ANCHOR)
    assert [int(d) for d in prim.params[0].shape] == [2, 3, 5, 8] and "gc.views" not in prim.attrs
    x, y = rand((2, 3, 5, 8)), rand((3, 8, 6))
    got, rule = run([a, w, out], ANCHOR, x, y)
    assert rule == "matmul"
    np.testing.assert_allclose(got, np.matmul(x, y), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("vector_bytes, registers, l2", [(32, 16, 512 << 10), (64, 32, 1 << 20), (64, 32, 2 << 20)],
                         ids=["zen3", "zen4", "sapphire-rapids"])
def test_kout_tasks_take_k_in_chunks_whose_block_of_b_fits_half_the_l2(monkeypatch, vector_bytes, registers, l2) -> None:
    """Fewer k chunks are faster (each reloads the C tile and restarts the nest), up to what half the
    host's L2 holds of a task's panels of B: derived from the host, not one machine's constant."""
    from compiler.codegen.cpu_rules import common
    from compiler.codegen.target import Cpu

    host = Cpu("test", vector_bytes, registers, 32 << 10, l2, 2)
    monkeypatch.setattr(matmul, "cpu", lambda: host)
    monkeypatch.setattr(common, "cpu", lambda: host)
    for m, k, n in [(128, 768, 2304), (128, 3072, 768), (49, 768, 3072), (64, 784, 1024), (100, 9000, 64)]:
        e = matmul.Einsum("c", [], 0, 1, 2, [m, n, k], None, [2, 1], "float32")
        p = matmul.plan(e)
        assert p.order == "kout" and k <= p.kp < k + p.kt and p.kp % p.kt == 0
        block = p.kt * matmul.KOUT_NT * p.ni * 4
        assert block <= l2, (m, k, n, p)  # the whole block in L2
        if k * matmul.KOUT_NT * p.ni * 4 <= l2 // 2:
            assert p.kt == k  # one chunk where all of K fits
        assert p.kt >= min(k, 128)


def test_one_row_against_transposed_weights_is_dot_products() -> None:
    a, w, c = te.placeholder((1, 96), name="a"), te.placeholder((40, 96), name="w"), te.placeholder((40,), name="c")
    x, y, z = rand((1, 96)), rand((40, 96)), rand((40,))
    got, rule = run([a, w, c, topi.nn.relu(topi.add(topi.nn.dense(a, w), c))], ANCHOR, x, y, z)
    assert rule == "rows"
    np.testing.assert_allclose(got, np.maximum(x @ y.T + z, 0), rtol=1e-4, atol=1e-4)


def test_dense_with_transposed_weights_packs_them() -> None:
    a, w = te.placeholder((6, 50), name="a"), te.placeholder((70, 50), name="w")
    x, y = rand((6, 50)), rand((70, 50))
    got, rule = run([a, w, topi.nn.dense(a, w)], ANCHOR, x, y)
    assert rule == "matmul"
    np.testing.assert_allclose(got, x @ y.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,m,n", [(64, 1024, 1024), (7, 257, 45), (13, 30, 10), (3, 5, 70)])
def test_transposed_a_of_a_weight_gradient_with_its_update(k: int, m: int, n: int) -> None:
    """w - lr * (x^T @ dy), x stored [K, M]: the rule packs x into row panels (or reads it in place when
    B is one panel wide) and keeps the update as the epilogue."""
    a, b, w = te.placeholder((k, m), name="a"), te.placeholder((k, n), name="b"), te.placeholder((m, n), name="w")
    r = te.reduce_axis((0, k), name="r")
    g = te.compute((m, n), lambda i, j: te.sum(a[r, i] * b[r, j], axis=r), name="g")
    out = te.compute((m, n), lambda i, j: w[i, j] - 0.1 * g[i, j], name="update")
    x, y, z = rand((k, m)), rand((k, n)), rand((m, n))
    got, rule = run([a, b, w, out], ANCHOR, x, y, z)
    assert rule == "matmul"
    np.testing.assert_allclose(got, z - 0.1 * (x.T @ y), rtol=1e-4, atol=1e-4)


def test_matmul_over_a_vector_is_a_gemv() -> None:
    v, b = te.placeholder((33,), name="v"), te.placeholder((33, 70), name="b")
    r = te.reduce_axis((0, 33), name="r")
    out = te.compute((70,), lambda j: te.sum(v[r] * b[r, j], axis=r), name="vm")
    x, y = rand((33,)), rand((33, 70))
    got, rule = run([v, b, out], ANCHOR, x, y)
    assert rule == "matmul"
    np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,n", [(1280, 1000), (64, 1000), (96, 40), (256, 1024)])
def test_a_gemv_against_constant_weights_copies_nothing_per_call(k: int, n: int) -> None:
    """A classifier's one row against [K, 1000] weights: panels whose width divides N (no padding), the
    weights packed into them once at build time; no block of the kernel copies them per call."""
    a, w, c = te.placeholder((1, k), name="a"), te.placeholder((k, n), name="w"), te.placeholder((n,), name="c")
    out = topi.add(topi.matmul(a, w), c)
    prim = schedule_cpu.schedule(te.create_prim_func([a, w, c, out]), ANCHOR, {"w"})
    assert re.search(r'T\.sblock\("w_', prim.script()) is None
    assert str(prim.attrs["gc.prepack"]["w"]).startswith("panels:")
    x, y, z = rand((1, k)), rand((k, n)), rand((n,))
    got, rule = run([a, w, c, out], ANCHOR, x, y, z, constants=("w",))
    assert rule == "matmul"
    np.testing.assert_allclose(got, x @ y + z, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_matmul_in_other_dtypes(dtype: str) -> None:
    a, b = te.placeholder((9, 23), dtype, name="a"), te.placeholder((23, 37), dtype, name="b")
    x, y = rand((9, 23), dtype), rand((23, 37), dtype)
    got, rule = run([a, b, topi.matmul(a, b)], ANCHOR, x, y)
    assert rule == "matmul"
    np.testing.assert_allclose(got, x @ y, rtol=1e-9 if dtype == "float64" else 0)


def test_int8_matmul_accumulating_in_int32_matches() -> None:
    a, b = te.placeholder((7, 40), "int8", name="a"), te.placeholder((40, 18), "int8", name="b")
    r = te.reduce_axis((0, 40), name="r")
    out = te.compute((7, 18), lambda i, j: te.sum(a[i, r].astype("int32") * b[r, j].astype("int32"), axis=r))
    x, y = rand((7, 40), "int8"), rand((40, 18), "int8")
    got, rule = run([a, b, out], ANCHOR, x, y)
    assert rule == "matmul"
    np.testing.assert_array_equal(got, x.astype(np.int32) @ y.astype(np.int32))


@pytest.mark.parametrize("m,k,n", [(64, 96, 48), (300, 64, 32), (5, 33, 20)])
def test_constant_weights_are_read_prepacked(m: int, k: int, n: int) -> None:
    a, w, c = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="w"), te.placeholder((n,), name="c")
    out = topi.nn.relu(topi.add(topi.matmul(a, w), c))
    x, y, z = rand((m, k)), rand((k, n)), rand((n,))
    prim = schedule_cpu.schedule(te.create_prim_func([a, w, c, out]), ANCHOR, {"w"})
    # With N a multiple of the vector no call copies the weights: packed once at build time, or (one
    # panel of [K, N] rows) read as they lie. Otherwise they are padded per call, and not prepacked.
    copied = re.search(r'T\.sblock\("w_', prim.script()) is not None
    if n % lanes("float32") == 0:
        assert not copied and ("w" in prim.attrs.get("gc.prepack", {}) or n <= 2 * lanes("float32"))
    else:
        assert copied and "w" not in prim.attrs.get("gc.prepack", {})
    got, rule = run([a, w, c, out], ANCHOR, x, y, z, constants=("w",))
    assert rule == "matmul"
    np.testing.assert_allclose(got, np.maximum(x @ y + z, 0), rtol=1e-4, atol=1e-4)


def test_constant_transposed_weights_are_read_prepacked() -> None:
    a, w = te.placeholder((10, 40), name="a"), te.placeholder((32, 40), name="w")
    x, y = rand((10, 40)), rand((32, 40))
    prim = schedule_cpu.schedule(te.create_prim_func([a, w, topi.nn.dense(a, w)]), ANCHOR, {"w"})
    assert "w" in prim.attrs["gc.prepack"]
    got, _ = run([a, w, topi.nn.dense(a, w)], ANCHOR, x, y, constants=("w",))
    np.testing.assert_allclose(got, x @ y.T, rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(panels=st.integers(1, 6), extra=st.integers(1, 31), m=st.integers(9, 40))
def test_matmul_columns_padded_to_whole_panels_write_back_whole_vectors(panels, extra, m) -> None:
    """Columns that no panel divides (ViT's Q K^T over 197 tokens): the product runs over whole panels, and
    the write-back and the pack of a B known only at the call, which the padding predicates, are split in
    vectors whose last alone loop partitioning peels (under the predicate TVM ran every vector a lane at a
    time: 197 columns took 1.5x the time of 224)."""
    vl = lanes("float32")
    n = panels * 2 * vl + extra
    if n % vl == 0:  # one-vector panels divide it: nothing padded
        return
    a, b, r = (te.placeholder(s, name=x) for s, x in (((3, m, 16), "a"), ((3, 16, n), "b"), ((3, m, n), "r")))
    mm = topi.nn.batch_matmul(a, b, transpose_b=False)
    out = topi.add(mm, r)
    x, y, z = rand((3, m, 16)), rand((3, 16, n)), rand((3, m, n))
    got, rule = run([a, b, r, out], ANCHOR, x, y, z)
    assert rule == "matmul"
    np.testing.assert_allclose(got, x @ y + z, rtol=1e-4, atol=1e-4)
    script = schedule_cpu.schedule(te.create_prim_func([a, b, r, out]), ANCHOR, ()).script()
    # the pack of B and the write-back: each in vectors of the lanes, their loop hinted for the peel
    assert script.count("pragma_loop_partition_hint") >= 2
    assert f"T.vectorized({vl})" in script


def test_matmul_plan_pads_instead_of_predicating() -> None:
    a, b = te.placeholder((63, 1031), name="a"), te.placeholder((1031, 10), name="b")
    from tvm import s_tir

    e = matmul.match(s_tir.Schedule(te.create_prim_func([a, b, topi.matmul(a, b)])))
    p = matmul.plan(e)
    assert p.mp % p.mt == 0 and p.mt % p.mi == 0 and p.mp >= 63
    assert p.np_ % p.nt == 0 and p.nt % p.ni == 0 and p.np_ >= 10
    assert p.kp % p.kt == 0 and p.kp >= 1031


@pytest.mark.parametrize("m", [196, 49, 200, 197, 128])
def test_matmul_rows_take_the_tile_that_costs_least_with_its_padding(m: int) -> None:
    """Winograd's 196 and 49 tiles, ViT's 197 rows, GPT-2's 128: the register tile's rows are the host's
    full count or fewer where padding M to the full count costs more; the result is right either way."""
    from tvm import s_tir

    a, b = te.placeholder((36, m, 64), name="a"), te.placeholder((36, 64, 64), name="b")
    e = matmul.match(s_tir.Schedule(te.create_prim_func([a, b, topi.nn.batch_matmul(a, b, transpose_b=False)])))
    p = matmul.plan(e)
    full = matmul.accumulators() // (p.ni // lanes("float32"))
    assert p.mi == matmul.row_tile(m, full) and (full + 1) // 2 <= p.mi <= full
    assert p.mp % p.mi == 0 and m <= p.mp < m + p.mt
    x, y = rand((36, m, 64)), rand((36, 64, 64))
    got, _ = run([a, b, topi.nn.batch_matmul(a, b, transpose_b=False)], ANCHOR, x, y, constants=("b",))
    np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-4)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4096), st.integers(2, 16))
def test_row_tile_pads_no_more_than_it_saves(m: int, most: int) -> None:
    """The row count chosen costs no more (padded rows x (1 + 1/r)) than the full tile, stays within
    [most/2, most], and never exceeds M."""
    r = matmul.row_tile(m, most)
    cost = lambda r: -(-m // r) * r * (r + 1) / r  # noqa: E731
    if m <= most:
        assert r == m
    else:
        assert (most + 1) // 2 <= r <= most and cost(r) <= cost(most)


def test_row_tile_measured_cases() -> None:
    """The cases the rule was measured on: 6-row tiles over 132 rows beat 4-row ones over 128 (GPT-2,
    Zen 3); 7-row tiles over 196 beat 8-row ones over 200 (Winograd, Zen 4)."""
    assert matmul.row_tile(128, 6) == 6 and matmul.row_tile(196, 8) == 7 and matmul.row_tile(197, 8) == 8


@pytest.mark.parametrize("lead, m, k, n", [((), 197, 768, 96), ((2,), 61, 64, 64), ((), 13, 40, 20), ((), 13, 1031, 20)])
def test_matmul_padded_rows_read_a_in_place(lead, m, k, n) -> None:
    """Rows padded to whole register tiles read A's last row again instead of a zero-padded copy of A
    made every call (ViT's 197 rows); only C's padded rows see them, and those are never written out:
    a NaN in A's last row stays in C's last row. An A padded along K too (1031) is still copied."""
    from tvm import s_tir

    a = te.placeholder((*lead, m, k), name="a")
    b = te.placeholder((*lead, k, n), name="b")
    out = topi.add(topi.nn.batch_matmul(a, b, transpose_b=False) if lead else topi.matmul(a, b), 1.0)
    x, y = rand((*lead, m, k)), rand((*lead, k, n))
    x[..., -1, 0] = np.nan
    prim = schedule_cpu.schedule(te.create_prim_func([a, b, out]), ANCHOR, {"b"})
    assert prim.attrs["gc.schedule"] == "matmul"
    copied = re.search(r'T\.sblock\("a_pad', prim.script()) is not None
    p = matmul.plan(matmul.match(s_tir.Schedule(te.create_prim_func([a, b, out]))))
    assert copied == (p.mp != m and p.kp != k)
    got, _ = run([a, b, out], ANCHOR, x, y, constants=("b",))
    np.testing.assert_allclose(got, x @ y + 1, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert np.isnan(got[..., -1, :]).all() and not np.isnan(got[..., :-1, :]).any()


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5000), inner=st.sampled_from([1, 4, 8, 16, 32]), want=st.sampled_from([32, 64, 128, 256]))
def test_matmul_split_pads_no_more_inner_tiles_than_one_chunk_count_near_want(n, inner, want) -> None:
    padded, tile = matmul._split(n, inner, want)
    assert padded >= n and padded % tile == 0 and tile % inner == 0
    tiles = -(-n // inner)
    near = -(-tiles // max(1, want // inner))  # the chunk count nearest `want`, as before the search
    assert padded // inner - tiles <= -(-tiles // near) * near - tiles


def test_matmul_split_of_vits_197_rows_and_columns() -> None:
    assert matmul._split(197, 4, 64) == (200, 40)  # 5 chunks of 40 rows, not 4 of 52 (208)
    assert matmul._split(197, 32, 128) == (224, 32)  # 7 panels of 32 columns, not 2 chunks of 128 (256)


# --- conv2d ------------------------------------------------------------------------------------------


def conv_te(n, c, h, w, o, kh, kw, stride, pad, bias: bool):
    """conv2d as graph.conv2d lowers it: a pad stage, the reduction, a bias epilogue."""
    x = te.placeholder((n, c, h, w), name="x")
    wt = te.placeholder((o, c, kh, kw), name="w")
    xp = topi.nn.pad(x, (0, 0, pad, pad), (0, 0, pad, pad), name="pad") if pad else x
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    rc, ry, rx = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    y = te.compute(
        (n, o, oh, ow),
        lambda i, f, yy, xx: te.sum(
            xp[i, rc, yy * stride + ry, xx * stride + rx] * wt[f, rc, ry, rx], axis=[rc, ry, rx]
        ),
        name="conv2d",
    )
    ins = [x, wt]
    if bias:
        b = te.placeholder((o,), name="b")
        y = topi.nn.relu(te.compute(y.shape, lambda i, f, yy, xx: y[i, f, yy, xx] + b[f], name="conv2d_out"))
        ins.append(b)
    return ins, y


def conv_loops(x, w, stride, pad) -> np.ndarray:
    """The definition, one output pixel at a time (float64)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride : i * stride + kh, j * stride : j * stride + kw]
            y[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return y


@pytest.mark.parametrize(
    "n,c,h,w,o,k,stride,pad,bias,rule",
    [
        (1, 32, 8, 8, 32, 3, 1, 1, True, "conv2d"),
        (2, 3, 9, 7, 16, 3, 2, 1, False, "conv2d"),
        (1, 16, 6, 10, 8, 1, 1, 0, True, "conv2d"),
        (1, 5, 7, 7, 24, 5, 1, 2, False, "conv2d"),
        (1, 64, 7, 7, 32, 3, 1, 1, True, "conv2d"),  # rows of 7: a 7-pixel tile of one vector
        (1, 16, 14, 14, 16, 3, 1, 1, False, "conv2d"),  # 14x14, one channel block: 4-pixel flat tiles
        (2, 8, 12, 6, 16, 3, 1, 1, True, "conv2d"),  # rows of 6, 72 pixels a map: 6-pixel flat tiles
        (1, 48, 28, 28, 32, 3, 2, 1, True, "conv2d"),  # stride 2 to 14x14, packed input: flat
        (1, 40, 10, 10, 16, 1, 1, 0, False, "conv2d"),  # 1x1 on a small unpadded map: NCHW in place, flat
        # 27 products or fewer per output, rows of whole vectors: the pixel tile.
        (1, 3, 8, 16, 8, 3, 1, 1, True, "conv2d"),
        (2, 2, 5, 18, 4, 3, 1, 0, False, "conv2d"),
        # Over 32 input channels the input is packed NCHW16c: from the pad stage, or copied when none pads.
        (1, 48, 6, 6, 16, 1, 1, 0, True, "conv2d"),
        (2, 64, 9, 9, 16, 3, 2, 1, False, "conv2d"),
        (1, 16, 13, 13, 40, 1, 1, 0, True, "conv2d"),  # 40 channels: one (half) vector a block, 12-pixel flat tiles
        (1, 8, 11, 11, 24, 3, 1, 1, False, "conv2d"),  # 24 channels on a prime row
        (1, 4, 5, 5, 6, 3, 1, 0, False, "rows"),  # 6 output channels: no vector block; dot products
    ],
)
def test_conv2d_matches_loops(n, c, h, w, o, k, stride, pad, bias, rule) -> None:
    ins, out = conv_te(n, c, h, w, o, k, k, stride, pad, bias)
    x, wt = rand((n, c, h, w)), rand((o, c, k, k))
    arrays = [x, wt] + ([rand((o,))] if bias else [])
    got, used = run([*ins, out], ANCHOR, *arrays)
    want = conv_loops(x, wt, stride, pad)
    if bias:
        want = np.maximum(want + arrays[2][None, :, None, None], 0)
    assert used == rule
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("w,stride,o", [(64, 2, 8), (96, 2, 16), (64, 1, 8), (40, 1, 8)])
def test_rgb_stems_take_the_pixel_tile_at_stride_1_and_2(monkeypatch, w, stride, o) -> None:
    """27 products an output (3 channels, 3x3): vectors of pixels along a row, read contiguously or, at
    stride 2, as contiguous loads and a shuffle; two vectors a tile where they divide the row, else one."""
    from compiler.codegen.cpu_rules import conv2d

    used = []
    original = conv2d._pixel_tile
    monkeypatch.setattr(conv2d, "_pixel_tile", lambda *a: used.append(a[-1]) or original(*a))
    ins, out = conv_te(1, 3, 6, w, o, 3, 3, stride, 1, True)
    x, wt, b = rand((1, 3, 6, w)), rand((o, 3, 3, 3)), rand((o,))
    got, rule = run([*ins, out], ANCHOR, x, wt, b)
    ow = (w + 2 - 3) // stride + 1
    vl = lanes("float32")
    assert rule == "conv2d" and used == ([1 if ow % (2 * vl) else 2] if ow % vl == 0 else [])
    want = np.maximum(conv_loops(x, wt, stride, 1) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# Output channels in blocks of a flat tile: two vectors of the host (16 channels with AVX2, 32 with AVX-512).
BLOCK = 2 * lanes("float32")


@pytest.mark.parametrize(
    "n,c,h,blocks,k,stride,pad",
    [
        # (Pixel counts no tile of 6-8 pixels divides: AVX-512's registers take 7-pixel tiles where 7 does.)
        (1, 32, 11, 2, 3, 1, 1),  # 121 pixels: 20 tiles of 6 and one of 1; two chunks of 16 input channels
        (2, 16, 10, 1, 1, 1, 0),  # 1x1, 100 pixels: a last tile of 4; all input channels in one chunk
        (1, 48, 26, 2, 3, 2, 1),  # stride 2 to 13x13, the input packed NCHW16c
        (1, 64, 13, 3, 3, 1, 0),  # 11x11 from an unpadded 13x13 map, read NCHW in place; 3 channel blocks
        (1, 32, 50, 2, 3, 1, 1),  # 2500 pixels: accumulators past CHUNK_ACC_BYTES, one chunk
    ],
)
def test_conv2d_flat_tiles_with_a_short_last_tile(monkeypatch, n, c, h, blocks, k, stride, pad) -> None:
    """Rows that 4 does not divide: 6-pixel tiles of the flattened map, the last one cut short by a
    predicate that loop partitioning peels off; the tiles sweep the map once per chunk of input channels.
    With one core, two (images x output-channel blocks) are enough parallel work for it."""
    from compiler.codegen.cpu_rules import conv2d

    monkeypatch.setattr(conv2d, "_cores", lambda: 1)
    o = blocks * BLOCK
    ins, out = conv_te(n, c, h, h, o, k, k, stride, pad, True)
    script = schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR).script()
    assert "pragma_loop_partition_hint" in script and " < " in script  # the predicate of the last tile
    x, wt, b = rand((n, c, h, h)), rand((o, c, k, k)), rand((o,))
    got, rule = run([*ins, out], ANCHOR, x, wt, b)
    assert rule == "conv2d"
    want = np.maximum(conv_loops(x, wt, stride, pad) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("registers, vectors, pixels, want", [
    (16, 2, 196, 6), (32, 2, 196, 7), (32, 2, 49, 7), (32, 2, 169, 6), (16, 1, 196, 12), (32, 1, 196, 14),
])
def test_flat_tiles_take_the_pixels_the_hosts_registers_hold_where_they_divide_the_map(
        monkeypatch, registers: int, vectors: int, pixels: int, want: int) -> None:
    """Accumulators up to half the vector registers (16 of AVX-512's 32; AVX2 keeps the 12 of 6 pixels x
    two vectors) where that many pixels divide the map: ResNet-50's 14x14 and 7x7 maps in 7-pixel tiles."""
    from compiler.codegen.cpu_rules import conv2d
    from compiler.codegen.target import Cpu

    monkeypatch.setattr(conv2d, "cpu", lambda: Cpu("test", 64 if registers == 32 else 32, registers, 1, 1, 2))
    assert conv2d.flat_pixels(pixels, vectors) == want


@pytest.mark.parametrize("h, k, blocks", [(14, 3, 2), (7, 3, 2), (14, 1, 1), (7, 1, 4)])
def test_conv2d_on_resnets_14x14_and_7x7_maps_matches_loops(h: int, k: int, blocks: int) -> None:
    o = blocks * BLOCK
    ins, out = conv_te(1, 32, h, h, o, k, k, 1, k // 2, True)
    x, wt, b = rand((1, 32, h, h)), rand((o, 32, k, k)), rand((o,))
    got, rule = run([*ins, out], ANCHOR, x, wt, b)
    assert rule == "conv2d"
    want = np.maximum(conv_loops(x, wt, 1, k // 2) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "c,h,o,k,stride",
    [
        (48, 13, BLOCK, 1, 1),  # two vectors: 5-pixel tiles, a last one of 3 (1 and 13 divide 13)
        (32, 17, BLOCK // 2, 1, 1),  # one vector: 11-pixel tiles, a last one of 6
        (3, 23, BLOCK, 3, 2),  # a stride-2 RGB stem to 11x11: 4-pixel tiles, a last one of 3
    ],
)
def test_conv2d_row_tiles_with_a_short_last_tile(monkeypatch, c, h, o, k, stride) -> None:
    """Rows that no tile of 4-6 pixels (two vectors) or 8-12 (one) divides, where flat tiles decline (one
    output-channel block for two cores): the row's last tile is cut short and peeled off, not every tile
    shrunk to a divisor of the row (1 pixel for 13)."""
    from compiler.codegen.cpu_rules import conv2d

    monkeypatch.setattr(conv2d, "_cores", lambda: 2)
    ins, out = conv_te(1, c, h, h, o, k, k, stride, 0, True)
    script = schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR).script()
    assert "pragma_loop_partition_hint" in script
    x, wt, b = rand((1, c, h, h)), rand((o, c, k, k)), rand((o,))
    got, rule = run([*ins, out], ANCHOR, x, wt, b)
    assert rule == "conv2d"
    want = np.maximum(conv_loops(x, wt, stride, 0) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_row_tile_sizes() -> None:
    """The rule's arithmetic, host-free: the preferred size unless the row's last tile would be shorter
    than half a tile, then the next; whole rows when short; rows of 7 one vector wide."""
    from compiler.codegen.cpu_rules.conv2d import tile

    assert tile(56, 32, 16) == (32, 4) and tile(55, 32, 16) == (32, 4) and tile(13, 32, 16) == (32, 5)
    assert tile(111, 16, 8) == (16, 4) and tile(7, 32, 16) == (16, 7) and tile(6, 16, 8) == (16, 6)
    assert tile(13, 16, 16) == (16, 8) and tile(56, 8, 8) == (8, 12) and tile(60, 8, 8) == (8, 12)
    assert tile(28, 16, 16) == (16, 11) and tile(8, 16, 16) == (16, 8)
    assert tile(11, 8, 8) == (8, 11) and tile(9, 16, 16) == (16, 9) and tile(3, 32, 16) == (32, 3)


def test_conv2d_rows_go_outermost_where_the_input_outweighs_the_weights() -> None:
    """Row tiles: rows outermost (every output-channel block over a row) where the input is the larger
    operand and the weights fit in half the L2; output-channel blocks outermost where the weights are the
    larger or do not fit. Host-free: the shapes are far from either bound on any L2 of 64 KiB to 8 MiB."""
    from tvm import tirx

    from compiler.codegen.cpu_rules.conv2d import Conv, rows_outer

    def conv(c, h, o, k):
        x = tirx.decl_buffer((1, c, h, h), "float32")
        w = tirx.decl_buffer((o, c, k, k), "float32")
        return Conv("conv", x, w, [1, o, h, h, c, k, k], "float32")

    assert rows_outer(conv(16, 58, 32, 3))  # 215 KB of input, 18 KB of weights: MobileNet-like
    assert not rows_outer(conv(1024, 14, 2048, 1))  # 8 MB of weights
    assert not rows_outer(conv(32, 8, 512, 3))  # 8 KB of input, 590 KB of weights


def test_conv2d_flat_tiles_need_parallel_work_for_every_core(monkeypatch) -> None:
    """A short last tile keeps the parallel loop to (images, output-channel blocks): with fewer than two
    of those a core, maps of 4k pixels take whole 4-pixel tiles, in parallel over every tile."""
    from compiler.codegen.cpu_rules import conv2d

    ins, out = conv_te(1, 32, 10, 10, 2 * BLOCK, 3, 3, 1, 1, False)  # 100 pixels: 6-8 pixels divide none
    monkeypatch.setattr(conv2d, "_cores", lambda: 8)
    assert "pragma_loop_partition_hint" not in schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR).script()
    monkeypatch.setattr(conv2d, "_cores", lambda: 1)
    assert "pragma_loop_partition_hint" in schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR).script()


@pytest.mark.parametrize("c, blocked", [(32, False), (48, True)])
def test_conv2d_packs_only_inputs_of_many_channels(c: int, blocked: bool) -> None:
    """Up to 32 input channels the conv reads the (padded) input NCHW in place; beyond, a packed copy."""
    ins, out = conv_te(1, c, 8, 8, 16, 3, 3, 1, 1, False)
    prim = schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR)
    shapes = re.findall(r'pad = T.sblock_alloc_buffer\(\(([\d, ]+)\)', prim.script())
    assert shapes == (["1, 3, 10, 10, 16"] if blocked else [f"1, {c}, 10, 10"])


@pytest.mark.parametrize("hw, k, stride, packed", [(8, 3, 1, False), (18, 3, 1, False), (32, 3, 1, True),
                                                   (32, 1, 1, False), (40, 1, 2, False)])
def test_conv2d_reads_small_unpadded_maps_of_many_channels_in_place(hw: int, k: int, stride: int, packed: bool) -> None:
    """An input that needs no padding copy (an unpadded conv, or a zero-bordered buffer) is read NCHW in
    place when the output maps have at most NCHW_SMALL_MAP pixels, or the window is 1x1; bigger maps
    of a wider window are packed."""
    ins, out = conv_te(1, 64, hw, hw, 16, k, k, stride, 0, False)
    script = schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR).script()
    assert ("x_global = T.sblock_alloc_buffer" in script) == packed
    x, w = rand((1, 64, hw, hw)), rand((16, 64, k, k))
    got, rule = run([*ins, out], ANCHOR, x, w)
    assert rule == "conv2d"
    np.testing.assert_allclose(got, conv_loops(x, w, stride, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c, k, stride, pixels", [(3, 3, 1, True), (4, 3, 1, False), (3, 3, 2, False), (3, 1, 1, True)])
def test_conv2d_pixel_tile_for_short_reductions(c: int, k: int, stride: int, pixels: bool) -> None:
    """A first conv (3 channels x 3x3 = 27 products an output) accumulates NCHW rows of pixels; longer
    reductions, and strided ones, keep the channel-blocked accumulators."""
    ins, out = conv_te(1, c, 16, 32 * stride, 16, k, k, stride, k // 2, True)
    script = schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR).script()
    acc = re.search(r"conv2d = T.sblock_alloc_buffer\(\(([\d, ]+)\)", script)
    assert acc is not None
    assert (acc.group(1) == "1, 16, 16, 32") == pixels, acc.group(1)


def test_conv2d_constant_weights_are_read_prepacked() -> None:
    ins, out = conv_te(1, 8, 6, 6, 16, 3, 3, 1, 1, True)
    x, wt, b = rand((1, 8, 6, 6)), rand((16, 8, 3, 3)), rand((16,))
    prim = schedule_cpu.schedule(te.create_prim_func([*ins, out]), ANCHOR, {"w"})
    assert "w" in prim.attrs["gc.prepack"]
    got, rule = run([*ins, out], ANCHOR, x, wt, b, constants=("w",))
    assert rule == "conv2d"
    want = np.maximum(conv_loops(x, wt, 1, 1) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --- row reductions ----------------------------------------------------------------------------------


def max_inf(expr, axis):
    """max with identity -inf, as the lowerings write it (TE's te.max starts from the lowest finite)."""
    reducer = te.comm_reducer(lambda a, b: te.max(a, b), lambda t: tvm.tirx.const(float("-inf"), t), name="max")
    return reducer(expr, axis=axis)


def softmax_te(rows: int, cols: int):
    """softmax as graph.softmax lowers it: max (identity -inf), shift, sum of exp, exp / sum."""
    x = te.placeholder((rows, cols), name="x")
    k1, k2 = te.reduce_axis((0, cols), "k1"), te.reduce_axis((0, cols), "k2")
    top = te.compute((rows,), lambda i: max_inf(x[i, k1], axis=k1), name="max")
    z = te.compute((rows, cols), lambda i, j: x[i, j] - top[i], name="shifted")
    s = te.compute((rows,), lambda i: te.sum(te.exp(z[i, k2]), axis=k2), name="sum")
    return x, te.compute((rows, cols), lambda i, j: te.exp(z[i, j]) / s[i], name="softmax")


@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 9), (7, 13), (512, 128), (3, 1000), (16, 24)])
def test_softmax_rows_match_numpy(rows: int, cols: int) -> None:
    x, out = softmax_te(rows, cols)
    v = rand((rows, cols)) * 5
    got, rule = run([x, out], "reduction", v)
    e = np.exp(v.astype(np.float64) - v.max(axis=1, keepdims=True))
    assert rule == "rows"
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), extra=st.integers(1, 15), chunks=st.integers(2, 13))
def test_rows_no_vector_divides_reduce_in_vectors_without_reading_past_the_row(rows, extra, chunks) -> None:
    """Rows of whole vectors and a short last piece (ViT's softmax rows of 197): the partials run in vector
    lanes (a `_rf` block) and never read the next row, which here holds values that would win the max."""
    vl = lanes("float32")
    cols = chunks * vl + extra
    x, out = softmax_te(rows, cols)
    v = rand((rows, cols))
    v[1::2] += 50.0  # every other row far larger: an overread of the row before changes its max and sum
    prim = te.create_prim_func([x, out])
    assert "max_rf" in schedule_cpu.schedule(prim, "reduction", ()).script()
    got, rule = run([x, out], "reduction", v)
    e = np.exp(v.astype(np.float64) - v.max(axis=1, keepdims=True))
    assert rule == "rows"
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)
    for reduce_te, reduce_np in ((topi.sum, np.sum), (topi.max, np.max)):
        got, _ = run([x, reduce_te(x, axis=1)], "reduction", v)
        np.testing.assert_allclose(got, reduce_np(v, axis=1), rtol=1e-4, atol=1e-3)


def _compiled_softmax_matches(shape: tuple[int, ...]) -> None:
    """The last axis' softmax compiled on the rows rule, every other row 50 larger: an overread of the
    row before would change its max and sum."""
    import compiler

    t = f"tensor<{'x'.join(map(str, shape))}xf32>"
    text = f"func @main(%x: {t}) -> {t} {{\n  %s = graph.softmax(%x) : {t}\n  return %s\n}}\n"
    v = rand(shape)
    v.reshape(-1, shape[-1])[1::2] += 50.0
    model = compiler.compile(text, "llvm", cache=False)
    assert [c.schedule for c in model.plan.steps] == ["rows"]
    e = np.exp(v.astype(np.float64) - v.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(model(v)[0], e / e.sum(axis=-1, keepdims=True), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("n", [21, 37, 53, 70])
@pytest.mark.parametrize("cond", ["k >= i", "k <= i", "k < 30", "k != i"])
def test_rows_with_a_choice_on_the_reduced_index_sum_right(n, cond) -> None:
    """Running sums and masks written as sum_k select(cond(k, i), x[k], 0) over rows no vector divides: TVM's
    loop partitioning, splitting on `k >= i` as well as on the last chunk's bound, lost that bound in a
    piece (rows of 37 and 53 summed past their end); such kernels keep the bound on every chunk."""
    x = te.placeholder((4, n), name="x")
    k = te.reduce_axis((0, n), name="k")
    conds = {"k >= i": lambda k, i: k >= i, "k <= i": lambda k, i: k <= i, "k < 30": lambda k, i: k < 30,
             "k != i": lambda k, i: k != i}
    out = te.compute((4, n), lambda r, i: te.sum(tirx.Select(conds[cond](k, i), x[r, k], tirx.const(0.0, "float32")),
                                                 axis=k), name="masked")
    xv = rand((4, n))
    got, rule = run([x, out], "reduction", xv)
    kk, ii = np.arange(n)[None, :], np.arange(n)[:, None]
    mask = np.broadcast_to(eval(cond, {}, {"k": kk, "i": ii}), (n, n))  # noqa: S307
    assert rule == "rows"
    np.testing.assert_allclose(got, xv @ mask.T.astype(np.float32), rtol=1e-5, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(lead=st.tuples(st.integers(1, 5), st.integers(1, 13)), last=st.integers(3, 60), extra=st.integers(1, 15))
def test_softmax_over_rows_of_several_dims_stays_inside_each_row(lead, last, extra) -> None:
    """A task's rows are a multiple or a divisor of the last row dim: in chunks across its edge (ViT's
    [1, 12, 197] rows of 197 in chunks of 21) the partials lost their bound and read past the tensor (a
    segfault), or the rule failed (Swin-T's [4, 12, 49]: the generic schedule, 2-5x slower)."""
    _compiled_softmax_matches((*lead, last, 2 * lanes("float32") + extra))


@pytest.mark.parametrize("shape", [(1, 12, 197, 197), (4, 12, 49, 49)], ids=["vit", "swin"])
def test_attention_softmax_rows(shape) -> None:
    _compiled_softmax_matches(shape)


def test_softmax_keeps_infinities_and_nan_rows() -> None:
    x, out = softmax_te(3, 16)
    v = rand((3, 16))
    v[0, 3] = -np.inf
    v[1, :] = -np.inf
    v[2, 5] = np.inf
    got, _ = run([x, out], "reduction", v)
    with np.errstate(invalid="ignore"):
        e = np.exp(v.astype(np.float64) - v.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("rows,cols", [(128, 256), (1, 1), (5, 3), (9, 40)])
def test_layer_norm_two_pass_matches_numpy(rows: int, cols: int) -> None:
    x = te.placeholder((rows, cols), name="x")
    g, b = te.placeholder((cols,), name="g"), te.placeholder((cols,), name="b")
    k1, k2 = te.reduce_axis((0, cols), "k1"), te.reduce_axis((0, cols), "k2")
    total = te.compute((rows,), lambda i: te.sum(x[i, k1], axis=k1), name="sum")
    def sq(i):
        d = x[i, k2] - total[i] / cols
        return te.sum(d * d, axis=k2)

    dev = te.compute((rows,), sq, name="devs")
    out = te.compute(
        (rows, cols),
        lambda i, j: (x[i, j] - total[i] / cols) / te.sqrt(dev[i] / cols + 1e-5) * g[j] + b[j],
        name="layer_norm",
    )
    v, gv, bv = rand((rows, cols)) + 3, rand((cols,)), rand((cols,))
    got, rule = run([x, g, b, out], "reduction", v, gv, bv)
    v64 = v.astype(np.float64)
    want = (v64 - v64.mean(1, keepdims=True)) / np.sqrt(v64.var(1, keepdims=True) + 1e-5) * gv + bv
    assert rule == "rows"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(6, 4, 40), (1, 64), (3, 5)])
def test_reduce_sum_and_max_over_trailing_axes(shape: tuple) -> None:
    x = te.placeholder(shape, name="x")
    for reduce_te, reduce_np in ((topi.sum, np.sum), (topi.max, np.max)):
        out = reduce_te(x, axis=len(shape) - 1)
        v = rand(shape)
        got, rule = run([x, out], "reduction", v)
        assert rule == "rows"
        np.testing.assert_allclose(got, reduce_np(v, axis=-1), rtol=1e-4, atol=1e-4)


def test_max_of_an_all_minus_inf_row_stays_minus_inf() -> None:
    x = te.placeholder((2, 32), name="x")
    k = te.reduce_axis((0, 32), "k")
    out = te.compute((2,), lambda i: max_inf(x[i, k], axis=k))
    v = rand((2, 32))
    v[1] = -np.inf
    got, _ = run([x, out], "reduction", v)
    np.testing.assert_array_equal(got, v.max(axis=1))


@pytest.mark.parametrize("shape,axis", [((37, 20), 0), ((64, 1024), 0), ((5, 6, 32), (0, 1)), ((9, 3), 0)])
def test_column_reduction_vectorizes_the_output_dim(shape: tuple, axis) -> None:
    x = te.placeholder(shape, name="x")
    v = rand(shape)
    got, rule = run([x, topi.sum(x, axis=axis)], "reduction", v)
    assert rule == ("columns" if shape[-1] % 4 == 0 else "generic")
    np.testing.assert_allclose(got, v.sum(axis=axis), rtol=1e-4, atol=1e-4)


def test_column_mean_keeps_its_epilogue() -> None:
    x = te.placeholder((12, 48), name="x")
    out = topi.divide(topi.sum(x, axis=0), 12.0)
    v = rand((12, 48))
    got, rule = run([x, out], "reduction", v)
    assert rule == "columns"
    np.testing.assert_allclose(got, v.mean(axis=0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 64, 1000, 65536])
def test_whole_tensor_sum(n: int) -> None:
    x = te.placeholder((n,), name="x")
    v = rand((n,))
    got, _ = run([x, topi.sum(x)], "reduction", v)
    np.testing.assert_allclose(got, v.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)


# --- rule machinery ----------------------------------------------------------------------------------


def test_a_rule_that_raises_falls_back_to_the_generic_schedule(monkeypatch) -> None:
    def broken(sch, ctx):
        raise RuntimeError("no fit")

    monkeypatch.setitem(schedule_cpu.RULES, ANCHOR, [("broken", broken)])
    a, b = te.placeholder((5, 6), name="a"), te.placeholder((6, 7), name="b")
    x, y = rand((5, 6)), rand((6, 7))
    got, rule = run([a, b, topi.matmul(a, b)], ANCHOR, x, y)
    assert rule == "generic"
    np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-4)


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between float32 arrays of one sign."""
    return np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))


@pytest.mark.parametrize("scalef", [False, True], ids=["bits", "scalef"])
@pytest.mark.parametrize("form", ["any", "min-0", "min-1"])
def test_fast_exp_is_within_2_ulp_and_keeps_special_values(form: str, scalef: bool) -> None:
    """Over the whole float range (denormal results included) within 2 ulp of the correctly rounded e^x;
    overflow exactly where exp overflows. `exp(min(x, c))` with a constant c <= 0 takes the short form,
    which never overflows, and is still e^min(x, c) for any x (above c too). Both ways of scaling by 2^n:
    the exponent's bits (any CPU) and AVX-512's vscalefps (llvm.ldexp)."""
    if scalef and cpu().vector_bytes < 64:
        pytest.skip("llvm.ldexp is one instruction only with AVX-512 (elsewhere a call per lane)")
    n = 1 << 16
    x = te.placeholder((n,), name="x")
    c = {"any": None, "min-0": 0.0, "min-1": -1.0}[form]
    if c is None:
        out = topi.exp(x)
    else:
        out = te.compute((n,), lambda i: te.exp(tvm.tirx.min(x[i], tvm.tirx.const(c, "float32"))))
    prim = rewrite.rewrite(te.create_prim_func([x, out]), scalef=scalef)
    assert "T.exp(" not in prim.script()
    assert ("call_llvm_pure_intrin" in prim.script()) == scalef
    assert ("12582911" in prim.script()) == (c is None and not scalef)  # the short form has no overflow branch
    fn = tvm.compile(prim, target=llvm_target())["main"]
    edges = [0, -np.inf, -200, -87.5, -95, -103.5, -103.9, -110, -1e-30, 1, 88.72, 88.7228, 88.723, 89, np.inf]
    if c is None:
        edges.append(np.nan)
    v = np.concatenate([np.linspace(-104, 88.72, n - len(edges)), edges]).astype(np.float32)
    got = aligned(np.zeros(n, np.float32))
    fn(aligned(v), got)
    arg = v if c is None else np.minimum(v, np.float32(c))
    with np.errstate(over="ignore"):
        want = np.exp(arg.astype(np.float64)).astype(np.float32)
    finite = np.isfinite(want) & ~np.isnan(v)
    assert _ulps(got[finite], want[finite]).max() <= 2, v[finite][np.argmax(_ulps(got[finite], want[finite]))]
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    special = dict(zip(edges, got[-len(edges):].tolist()))
    assert special[-np.inf] == 0 and special[-110] == 0
    if c is None:
        assert special[0] == 1 and special[np.inf] == np.inf and np.isnan(got[-1])
    else:
        # above c, e^c (within 2 ulp, above) whatever x is: nothing overflows
        assert special[1] == special[89] == special[np.inf] and (c != 0 or special[1] == 1)


def test_a_product_keeps_a_nan_without_the_select_that_kept_it() -> None:
    """x * select(isnan(x), x, b) is x * b (SiLU's x * sigmoid(x)); a select over another value stays."""
    x, y = te.placeholder((64,), name="x"), te.placeholder((64,), name="y")

    def kept(a, b):
        return tvm.tirx.Select(tvm.tirx.isnan(a), a, b * 3.0)

    out = te.compute((64,), lambda i: x[i] * kept(x[i], y[i]) + kept(x[i], y[i]) * y[i])
    prim = rewrite.nan_kept_by_product(te.create_prim_func([x, y, out]))
    assert prim.script().count("T.isnan") == 1  # the second product's select is over x, not y
    fn = tvm.compile(prim, target=llvm_target())["main"]
    rng = np.random.default_rng(7)
    v, w = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    v[[3, 9]], w[[5, 9]] = np.nan, np.nan
    got = aligned(np.zeros(64, np.float32))
    fn(aligned(v), aligned(w), got)
    want = v * np.where(np.isnan(v), v, w * 3) + np.where(np.isnan(v), v, w * 3) * w
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # (fused multiply-adds round once)


@pytest.mark.parametrize("name", ["erf", "tanh"])
def test_fast_erf_and_tanh_are_within_1e_6(name: str) -> None:
    x = te.placeholder((4096,), name="x")
    prim = rewrite.rewrite(te.create_prim_func([x, getattr(topi, name)(x)]))
    assert f"T.{name}(" not in prim.script()
    fn = tvm.compile(prim, target=llvm_target())["main"]
    v = np.concatenate([np.linspace(-12, 12, 4093), [0, -np.inf, np.inf]]).astype(np.float32)
    out = aligned(np.zeros(4096, np.float32))
    fn(aligned(v), out)
    from math import erf

    want = np.vectorize(erf)(v.astype(np.float64)) if name == "erf" else np.tanh(v.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)


def misaligned(x: np.ndarray) -> np.ndarray:
    """A copy whose data starts one element past a 64-byte boundary."""
    raw = np.empty(x.nbytes + 128, np.uint8)
    off = -raw.ctypes.data % 64 + x.itemsize
    y = raw[off : off + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


@pytest.mark.parametrize("case", ["matmul", "conv2d", "softmax", "columns", "elementwise"])
def test_kernels_accept_arrays_aligned_to_their_element_only(case: str) -> None:
    if case == "matmul":
        a, b = te.placeholder((64, 96), name="a"), te.placeholder((96, 48), name="b")
        tensors, kind, arrays, want = [a, b, topi.matmul(a, b)], ANCHOR, [rand((64, 96)), rand((96, 48))], None
        want = arrays[0] @ arrays[1]
    elif case == "conv2d":
        ins, out = conv_te(1, 16, 8, 8, 16, 3, 3, 1, 1, False)
        arrays = [rand((1, 16, 8, 8)), rand((16, 16, 3, 3))]
        tensors, kind, want = [*ins, out], ANCHOR, conv_loops(arrays[0], arrays[1], 1, 1)
    elif case == "softmax":
        x, out = softmax_te(32, 64)
        arrays = [rand((32, 64))]
        e = np.exp(arrays[0] - arrays[0].max(axis=1, keepdims=True))
        tensors, kind, want = [x, out], "reduction", e / e.sum(axis=1, keepdims=True)
    elif case == "columns":
        x = te.placeholder((40, 64), name="x")
        arrays = [rand((40, 64))]
        tensors, kind, want = [x, topi.sum(x, axis=0)], "reduction", arrays[0].sum(axis=0)
    else:
        x = te.placeholder((1000,), name="x")
        arrays = [rand((1000,))]
        tensors, kind, want = [x, topi.nn.relu(x)], "elementwise", np.maximum(arrays[0], 0)
    prim = schedule_cpu.schedule(te.create_prim_func(tensors), kind, unaligned=True)
    assert all(int(p.data_alignment) == 4 for p in prim.params) and prim.attrs["gc.unaligned"]
    fn = tvm.compile(prim, target=llvm_target())["main"]
    out = misaligned(np.zeros(want.shape, np.float32))
    fn(*[misaligned(a) for a in arrays], out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_a_chain_of_maximums_compiles_in_seconds_not_minutes() -> None:
    """maximum reads each operand three times (NaN-propagating select): inlined down a chain, the
    kernel's expression would triple at every op. A costly stage read twice stays a stage."""
    import time

    import compiler

    n = 10
    args = ", ".join(f"%x{i}: tensor<8x8xf32>" for i in range(n + 1))
    body = ["  %m0 = graph.maximum(%x0, %x1) : tensor<8x8xf32>"]
    body += [f"  %m{i} = graph.maximum(%m{i - 1}, %x{i + 1}) : tensor<8x8xf32>" for i in range(1, n)]
    src = f"func @main({args}) -> tensor<8x8xf32> {{\n" + "\n".join(body) + f"\n  return %m{n - 1}\n}}\n"
    t0 = time.perf_counter()
    m = compiler.compile(src, "llvm")
    assert time.perf_counter() - t0 < 20  # before: 8 ops ~30 s, 10 ops out of reach
    xs = [rand((8, 8)) for _ in range(n + 1)]
    xs[4][2, 3] = np.nan
    np.testing.assert_array_equal(m(*xs)[0], np.maximum.reduce(xs))


# --- transposing copies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, perm, tiled",
    [
        ((128, 4, 64), (1, 2, 0), True),  # the transformer's K^T per head: [s, h, d] -> [h, d, s]
        ((2, 16, 5, 24), (0, 2, 3, 1), True),  # NCHW -> NHWC
        ((128, 4, 64), (1, 0, 2), False),  # rows move, each stays contiguous
        ((12, 20), (1, 0), False),  # 12 rows: not a whole number of tiles
    ],
)
def test_transposing_copy_moves_tiles(shape: tuple, perm: tuple, tiled: bool) -> None:
    """A copy whose innermost output index walks down a column of the input is done in 8x8 tiles: the
    generic schedule's gathers down whole columns were 4x slower."""
    x = te.placeholder(shape, name="x")
    y = topi.transpose(topi.reshape(x, shape), perm)
    prim = schedule_cpu.schedule(te.create_prim_func([x, y]), "injective")
    assert ("T.unroll(8)" in prim.script()) == tiled
    a = rand(shape)
    got, rule = run([x, y], "injective", a)
    assert rule == "generic"
    np.testing.assert_array_equal(got, a.transpose(perm))



# --- pooling -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("op,attrs,shape,out", [
    ("max_pool2d", "kernel = [3, 3], strides = [2, 2], padding = [1, 1, 1, 1]", (2, 8, 17, 19), (2, 8, 9, 10)),
    ("max_pool2d", "kernel = [2, 2]", (1, 32, 32, 32), (1, 32, 16, 16)),
    ("avg_pool2d", "kernel = [3, 3], strides = [1, 1], padding = [1, 0, 2, 1], count_include_pad = true",
     (1, 5, 9, 30), (1, 5, 10, 29)),
    ("avg_pool2d", "kernel = [2, 3], ceil_mode = true", (3, 4, 7, 11), (3, 4, 4, 4)),
    ("avg_pool2d", "kernel = [2, 2]", (1, 3, 2, 8), (1, 3, 1, 4)),  # one output row
    ("max_pool2d", "kernel = [3, 1], strides = [1, 1]", (2, 3, 5, 1), (2, 3, 3, 1)),  # one output column
    # Strided, unpadded: rows as vectors of stride-2 (-3) reads, whole rows up to four vectors, else split.
    ("max_pool2d", "kernel = [3, 3], strides = [2, 2], ceil_mode = true", (1, 4, 27, 27), (1, 4, 13, 13)),
    ("max_pool2d", "kernel = [3, 3], strides = [2, 2]", (1, 2, 5, 111), (1, 2, 2, 55)),
    ("max_pool2d", "kernel = [3, 3], strides = [3, 3]", (1, 3, 9, 400), (1, 3, 3, 133)),
])
def test_pools_get_the_pool_rule_with_a_fused_relu(op: str, attrs: str, shape: tuple, out: tuple) -> None:
    import compiler
    from compiler.interpreter import run as interpret
    from compiler.parser import parse

    t_in, t_out = "x".join(map(str, shape)), "x".join(map(str, out))
    text = (f"func @main(%x: tensor<{t_in}xf32>) -> tensor<{t_out}xf32> {{\n"
            f"  %p = graph.{op}(%x) {{{attrs}}} : tensor<{t_out}xf32>\n"
            f"  %r = graph.relu(%p) : tensor<{t_out}xf32>\n  return %r\n}}\n")
    model = compiler.compile(text, "llvm")
    assert [c.schedule for c in model.plan.steps] == ["pool"]
    x = rand(shape)
    np.testing.assert_allclose(model(x)[0], interpret(parse(text), {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_a_pool_to_one_pixel_is_left_to_the_rows_rule() -> None:
    """Its epilogue's only loop would be the rows loop itself: vectorizing that one took the window's
    reduction with it, and TVM compiled it into wrong sums (a bug found in the cnn's global pool)."""
    import compiler
    from compiler.interpreter import run as interpret
    from compiler.parser import parse

    text = ("func @main(%x: tensor<1x128x4x4xf32>) -> tensor<1x128x1x1xf32> {\n"
            "  %g = graph.avg_pool2d(%x) {kernel = [4, 4]} : tensor<1x128x1x1xf32>\n  return %g\n}\n")
    model = compiler.compile(text, "llvm")
    assert [c.schedule for c in model.plan.steps] != ["pool"]
    x = rand((1, 128, 4, 4))
    np.testing.assert_allclose(model(x)[0], interpret(parse(text), {"x": x})[0], rtol=1e-5, atol=1e-6)


# --- depthwise convolution (MobileNet, EfficientNet) ---------------------------------------------------


def compile_gir(text: str, weights: tuple[str, ...] = (), pipeline: str | None = None):
    """A GIR module compiled for the CPU (weights named in `weights` bound; the graph passes `pipeline`, by
    default the CPU build's), its result on random inputs, the interpreter's, and the schedule rule of every
    kernel."""
    import compiler
    from compiler.inputs import random_inputs

    module = compiler.parse(text)
    inputs = random_inputs(module["main"], 0, module)
    want = compiler.run(module, inputs)
    model = compiler.compile(text, "llvm", params={k: inputs[k] for k in weights}, pipeline=pipeline)
    got = model(**{k: v for k, v in inputs.items() if k not in weights})
    return got, want, [c.schedule for c in model.plan.steps if c.kernel]


def depthwise_gir(c: int, h: int, w: int, k: int, s: int, mult: int = 1, epilogue: str = "clip", dil: int = 1) -> str:
    p = dil * (k // 2)
    oh, ow = ((n + 2 * p - dil * (k - 1) - 1) // s + 1 for n in (h, w))
    o = c * mult
    y = f"graph.conv2d(%x, %w, %b) {{strides = [{s}, {s}], padding = [{p}, {p}, {p}, {p}], dilations = [{dil}, {dil}], groups = {c}}}"
    tail = {"clip": "  %z = graph.clip(%y) {min = 0.0, max = 6.0}\n  return %z\n",
            "none": "  return %y\n",
            "silu": "  %g = graph.sigmoid(%y)\n  %z = graph.mul(%y, %g)\n  return %z\n"}[epilogue]
    return (f"func @main(%x: tensor<1x{c}x{h}x{w}xf32>, %w: tensor<{o}x1x{k}x{k}xf32>, %b: tensor<{o}xf32>) "
            f"-> tensor<1x{o}x{oh}x{ow}xf32> {{\n  %y = {y}\n{tail}}}\n")


@pytest.mark.parametrize("c,h,w,k,s,mult,epilogue,dil", [
    (16, 12, 12, 3, 1, 1, "clip", 1),  # MobileNetV2's 3x3, ReLU6 fused
    (8, 13, 13, 3, 2, 1, "clip", 1),  # stride 2 on an odd map: two loads and a shuffle a vector
    (12, 14, 14, 5, 1, 1, "silu", 1),  # EfficientNet's 5x5, SiLU fused
    (12, 28, 28, 5, 2, 1, "none", 1),
    (24, 7, 7, 3, 1, 1, "clip", 1),  # a 7-pixel row: one short vector
    (8, 40, 40, 3, 1, 1, "none", 1),  # a row in segments
    (4, 9, 9, 3, 1, 2, "clip", 1),  # a channel multiplier of 2
    (8, 12, 12, 3, 1, 1, "none", 2),  # dilation 2
])
def test_depthwise_convolutions_take_the_depthwise_rule(c, h, w, k, s, mult, epilogue, dil) -> None:
    got, want, rules = compile_gir(depthwise_gir(c, h, w, k, s, mult, epilogue, dil), ("w", "b"))
    assert rules == ["depthwise"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


# --- heavy epilogues, broadcasts, reductions named out of order --------------------------------------


def conv_silu_gir(c: int, h: int, o: int, k: int) -> str:
    p = k // 2
    return (f"func @main(%x: tensor<1x{c}x{h}x{h}xf32>, %w: tensor<{o}x{c}x{k}x{k}xf32>, %b: tensor<{o}xf32>) "
            f"-> tensor<1x{o}x{h}x{h}xf32> {{\n"
            f"  %y = graph.conv2d(%x, %w, %b) {{padding = [{p}, {p}, {p}, {p}]}}\n"
            f"  %s = graph.sigmoid(%y)\n  %z = graph.mul(%y, %s)\n  return %z\n}}\n")


@pytest.mark.parametrize("c,h,o,k,tiles", [
    (16, 20, 96, 1, True),  # EfficientNet's expand conv: rows of 4-pixel tiles (20: not the pixel tile on any host)
    (24, 12, 64, 3, True),
    (24, 14, 64, 3, False),  # 14x14: flat tiles (the NCHW write-back computes the epilogue)
    (8, 7, 48, 1, None),  # 7x7: rows of 7 or flat tiles, by the host
])
def test_conv2d_heavy_epilogue_runs_on_whole_vectors(c, h, o, k, tiles) -> None:
    """SiLU after a conv: where the write-back runs at each tile of a row, the sigmoid runs on vectors of output
    channels as the accumulators hold them, into a local tile buffer, before the NCHW write-back (whose
    vectors are the tile's few pixels wide). Weights bound or not, the conv rule."""
    import compiler
    from compiler.pipeline import PIPELINES

    text = conv_silu_gir(c, h, o, k)
    direct = PIPELINES["compile-llvm"].replace(",winograd", "")  # (a 3x3 conv of bound weights: Winograd's)
    for weights in [("w", "b"), ()]:
        got, want, rules = compile_gir(text, weights, direct)
        assert rules == ["conv2d"]
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    if tiles is not None:
        script = next(iter(compiler.compile(text, "llvm").scheduled.functions.values())).script()
        assert ("_local" in script) == tiles


@pytest.mark.parametrize("a_shape,b_shape,outer", [
    ((1, 48, 20, 20), (1, 48, 1, 1), 48),  # squeeze-and-excitation's scale: (n, c) in parallel
    ((2, 8, 6, 40), (2, 8, 6, 1), 96),  # along the last axis only
    ((40, 24), (24,), 40),  # a bias over rows
])
def test_broadcast_operands_are_read_once_a_vector(a_shape, b_shape, outer) -> None:
    """An operand broadcast along the trailing axes splits the loops there: the inner ones one vector
    loop over contiguous elements, the outer ones in parallel (no gather of the broadcast operand)."""
    import compiler

    t = lambda s: "x".join(map(str, s))
    text = (f"func @main(%a: tensor<{t(a_shape)}xf32>, %b: tensor<{t(b_shape)}xf32>) -> tensor<{t(a_shape)}xf32> {{\n"
            f"  %y = graph.mul(%b, %a)\n  return %y\n}}\n")
    got, want, rules = compile_gir(text)
    assert rules == ["generic"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    script = next(iter(compiler.compile(text, "llvm").scheduled.functions.values())).script()
    assert f"T.parallel({outer})" in script


def test_reduce_mean_over_axes_named_last_first_takes_the_rows_rule() -> None:
    """torch's x.mean((-1, -2)): the reduction runs in memory order whatever order the axes are named in
    (it read down the columns on the generic schedule: 168 -> 12 us for 32 maps of 112x112)."""
    text = ("func @main(%x: tensor<1x32x20x24xf32>) -> tensor<1x32x1x1xf32> {\n"
            "  %m = graph.reduce_mean(%x) {axes = [-1, -2], keepdims = true}\n  return %m\n}\n")
    got, want, rules = compile_gir(text)
    assert rules == ["rows"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("c,h,k,s,epilogue,weights", [
    (48, 7, 5, 1, "silu", ("w", "b")),  # EfficientNet's last stage: 5x5 on 7x7
    (48, 14, 3, 1, "clip", ("w", "b")),
    (32, 14, 3, 2, "silu", ()),  # stride 2 to 7x7, weights per call (packed per call)
    (16, 12, 3, 1, "none", ()),
])
def test_depthwise_rows_short_of_whole_vectors_take_channels_in_lanes(c, h, k, s, epilogue, weights) -> None:
    """Rows of 7, 12 or 14 pixels fill no whole vectors (8 or 16 lanes): the channels go in the lanes,
    the input copied to [N, C/vl, H, W, vl] and the accumulators blocked alike (5-D buffers)."""
    import re

    import compiler

    text = depthwise_gir(c, h, h, k, s, 1, epilogue)
    got, want, rules = compile_gir(text, weights)
    assert rules == ["depthwise"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    script = next(iter(compiler.compile(text, "llvm").scheduled.functions.values())).script()
    assert re.search(r"pad\w* = T.sblock_alloc_buffer\(\(\d+, \d+, \d+, \d+, \d+\)", script)


# --- channel-blocked parameters (codegen/layout.py) ---------------------------------------------------


def _blocks(x: np.ndarray, c: int) -> np.ndarray:
    n, ch, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, ch // c, c, h, w).transpose(0, 1, 3, 4, 2))


def _unblocks(x: np.ndarray) -> np.ndarray:
    n, cb, h, w, c = x.shape
    return x.transpose(0, 1, 4, 2, 3).reshape(n, cb * c, h, w)


BLOCKED_OPS = {  # one op each, lowered as gc lowers it, on x: [2, 32, 9, 9]: (op, weight shape, result shape)
    "conv": ("graph.conv2d(%x, %w) {padding = [1, 1, 1, 1]}", (32, 32, 3, 3), (2, 32, 9, 9)),
    "depthwise": ("graph.conv2d(%x, %w) {strides = [2, 2], padding = [1, 1, 1, 1], groups = 32}", (32, 1, 3, 3),
                  (2, 32, 5, 5)),
    "pool": ("graph.max_pool2d(%x) {kernel = [3, 3], strides = [2, 2], padding = [1, 1, 1, 1]}", None, (2, 32, 5, 5)),
    "add": ("graph.add(%x, %w)", (2, 32, 9, 9), (2, 32, 9, 9)),
}


def _lowered(case: str):
    """(the op's PrimFunc as gc lowers it, its kind, its inputs, the interpreter's result)."""
    from compiler.codegen.lower import kernels_of, lower_kernel
    from compiler.interpreter import run as interp
    from compiler.parser import parse

    op, w_shape, y_shape = BLOCKED_OPS[case]
    args = "%x: tensor<2x32x9x9xf32>" + (f", %w: tensor<{'x'.join(map(str, w_shape))}xf32>" if w_shape else "")
    text = f"func @main({args}) -> tensor<{'x'.join(map(str, y_shape))}xf32> {{\n  %y = {op}\n  return %y\n}}\n"
    module = parse(text, "k.gir")
    arrays = [rand([int(d) for d in a.type.shape]) for a in module["main"].args]
    (k,) = kernels_of(module, "main")
    return lower_kernel(k), k.kind, arrays, interp(module, arrays)[0]


@pytest.mark.parametrize("case", ["conv", "depthwise", "pool", "add"])
@pytest.mark.parametrize("which", ["input", "output", "both"])
def test_any_blocked_parameters_compute_right_natively_or_not(case: str, which: str) -> None:
    """`schedule(blocked=...)` stores the given parameters [N, C/c, H, W, c] whatever the rule does: a rule
    that reads them as blocks says so (`gc.native`), one that does not still computes right (one blocked
    side of a pool, which takes both or neither, goes through the NCHW schedule)."""
    from compiler.codegen.layout import Blocked

    prim, kind, arrays, want = _lowered(case)
    c = lanes("float32")  # the block width the layout gives f32 tensors on this host (8 or 16: 32 channels)
    ins = ([0, 1] if case == "add" else [0]) if which in ("input", "both") else []
    outs = [len(prim.params) - 1] if which in ("output", "both") else []
    scheduled = schedule_cpu.schedule(prim, kind, blocked={i: Blocked(c) for i in ins + outs})
    fn = llvm_pipeline.compile_cpu(scheduled, llvm_target())[str(prim.attrs["global_symbol"])]
    args = [aligned(_blocks(a, c) if i in ins else a) for i, a in enumerate(arrays)]
    out = aligned(np.zeros([int(d) for d in scheduled.params[-1].shape], "float32"))
    fn(*args, out)
    got = _unblocks(out) if outs else out
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    native = {int(i) for i in scheduled.attrs.get("gc.native", [])}
    if which == "both":
        assert native == set(ins + outs), (scheduled.attrs["gc.schedule"], native)
