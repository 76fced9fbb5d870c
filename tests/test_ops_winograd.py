"""Winograd's transforms (dialects/graph/winograd.py): around a batched matmul by the transformed weights they
are the 3x3 stride-1 convolution, at every tile size, padding and map size; their shape rules' diagnostics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.builder import new_func
from compiler.diagnostics import GCError
from compiler.ir import DType, TensorType
from dialects.graph import winograd as wg
from dialects.graph.nn import Conv2d


def chain(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, m: int, padding: list[int]) -> np.ndarray:
    """winograd_output(matmul(winograd_input(x), U), b) by the ops' references."""
    f, bld, (xv,) = new_func("main", {"x": TensorType(x.shape, DType.f64)})
    v = bld.winograd_input(xv, tile=m, padding=padding)
    n, _, h, wd = x.shape
    oh, ow = h + padding[0] + padding[2] - 2, wd + padding[1] + padding[3] - 2
    mt = np.matmul(v.owner.reference(x), wg.weights(w, m))
    mv = bld.constant(mt, DType.f64)
    y = bld.winograd_output(mv, *([bld.constant(b, DType.f64)] if b is not None else []), tile=m, size=[oh, ow])
    return y.owner.reference(mt, b)


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, padding: list[int]) -> np.ndarray:
    f, bld, vals = new_func("main", {"x": TensorType(x.shape, DType.f64), "w": TensorType(w.shape, DType.f64)})
    op = bld.conv2d(*vals, padding=padding).owner
    y = op.reference(x, w, None)
    return y + b[None, :, None, None] if b is not None else y


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 4), o=st.integers(1, 4), h=st.integers(1, 11), w=st.integers(1, 11),
       m=st.sampled_from(wg.TILES), pads=st.lists(st.integers(0, 2), min_size=4, max_size=4), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_transforms_around_the_matmul_are_the_convolution(n, c, o, h, w, m, pads, bias, seed) -> None:
    if h + pads[0] + pads[2] < 3 or w + pads[1] + pads[3] < 3:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w))
    k = rng.standard_normal((o, c, 3, 3))
    b = rng.standard_normal(o) if bias else None
    want = conv(x, k, b, pads)
    np.testing.assert_allclose(chain(x, k, b, m, pads), want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_the_transformed_weights_keep_the_dtype_and_f32_results_stay_near_the_convolution() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
    k = (rng.standard_normal((32, 64, 3, 3)) / 24).astype(np.float32)
    u = wg.weights(k, 4)
    assert u.dtype == np.float32 and u.shape == (36, 64, 32)
    want = conv(x.astype(np.float64), k.astype(np.float64), None, [1, 1, 1, 1])
    f, bld, (xv,) = new_func("main", {"x": TensorType(x.shape, DType.f32)})
    v = bld.winograd_input(xv, tile=4, padding=[1, 1, 1, 1]).owner.reference(x).astype(np.float32)
    got = bld.winograd_output(bld.constant(np.zeros((36, 16, 32), np.float32), DType.f32), tile=4,
                              size=[16, 16]).owner.reference(np.matmul(v, u), None)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("op, types, attrs, message", [
    ("winograd_input", ["1x2x4x4xf32"], {"tile": 7}, "tile must be one of"),
    ("winograd_input", ["2x4x4xf32"], {}, "4-D NCHW"),
    ("winograd_input", ["1x2x4x4xi32"], {}, "floating-point"),
    ("winograd_input", ["1x2x2x2xf32"], {"padding": [0, 0, 0, 0]}, "smaller than the 3x3 window"),
    ("winograd_output", ["16x4x3xf32"], {"tile": 4, "size": [4, 4]}, "must be [36, tiles, channels]"),
    ("winograd_output", ["16x3x3xf32"], {"tile": 2, "size": [4, 4]}, "no whole number of 4x4 maps"),
    ("winograd_output", ["16x4x3xf32", "4xf32"], {"tile": 2, "size": [4, 4]}, "bias must be tensor<3xf32>"),
])  # fmt: skip
def test_shape_rules_say_what_is_wrong(op: str, types: list[str], attrs: dict, message: str) -> None:
    def tensor(text: str) -> TensorType:
        *dims, dtype = text.split("x")
        return TensorType(tuple(int(d) for d in dims), DType(dtype))

    f, bld, vals = new_func("main", {f"a{i}": tensor(t) for i, t in enumerate(types)})
    with pytest.raises(GCError, match=message.replace("[", r"\[")):
        getattr(bld, op)(*vals, **attrs)


def test_the_input_transform_reads_its_input_through_the_padding_in_place() -> None:
    f, bld, (xv,) = new_func("main", {"x": TensorType((1, 16, 8, 8), DType.f32)})
    v = bld.winograd_input(xv, tile=4, padding=[1, 2, 1, 1])
    # 8x9 outputs: 2 x 3 tiles of 4, reading 10 rows and 14 columns: the padding, then zeros to the tiles' edge
    assert v.owner.padded_operand(0) == (1, 2, 10 - 8 - 1, 14 - 8 - 2) and v.owner.padded_operand(1) is None
    assert v.type.shape == (36, 2 * 3, 16)
    assert v.owner.flops() > 0 and Conv2d.kind == bld.winograd_output(
        bld.matmul(v, bld.constant(np.zeros((36, 16, 8), np.float32), DType.f32)), tile=4, size=[8, 9]).owner.kind
