"""graph.grid_sample and graph.affine_grid: shape rules, and the reference checked against onnx's own reference
implementation (onnx.reference.ReferenceEvaluator) and against values worked by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import infer_error, run_op
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.interpreter import run
from compiler.parser import parse

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

RNG = np.random.default_rng(0)


def onnx_grid_sample(x: np.ndarray, grid: np.ndarray, **attrs) -> np.ndarray:
    node = helper.make_node("GridSample", ["x", "g"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                                            helper.make_tensor_value_info("g", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return ReferenceEvaluator(model).run(None, {"x": x, "g": grid})[0]


def onnx_affine_grid(theta: np.ndarray, size: list[int], align_corners: int) -> np.ndarray:
    node = helper.make_node("AffineGrid", ["t", "s"], ["g"], align_corners=align_corners)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("t", TensorProto.FLOAT, None),
                                            helper.make_tensor_value_info("s", TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, None)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return ReferenceEvaluator(model).run(None, {"t": theta, "s": np.array(size, np.int64)})[0]


MODES = ["linear", "nearest", "cubic"]
PADDINGS = ["zeros", "border", "reflection"]


@pytest.mark.parametrize(("mode", "padding", "align"), list(itertools.product(MODES, PADDINGS, [False, True])))
def test_grid_sample_2d_matches_onnx_reference(mode: str, padding: str, align: bool) -> None:
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-2.5, 2.5, (2, 6, 7, 2)).astype(np.float32)  # well outside the image too
    grid[0, 0, :4] = [[-1, -1], [1, 1], [-0.5, 0.5], [0.0, 0.0]]
    got = run_op("grid_sample", x, grid, mode=mode, padding_mode=padding, align_corners=align)
    want = onnx_grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=int(align))
    assert got.shape == (2, 3, 6, 7) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("mode", "padding", "align"),
                         list(itertools.product(["linear", "nearest"], PADDINGS, [False, True])))  # fmt: skip
def test_grid_sample_3d_matches_onnx_reference(mode: str, padding: str, align: bool) -> None:
    x = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-1.8, 1.8, (1, 2, 3, 4, 3)).astype(np.float32)
    got = run_op("grid_sample", x, grid, mode=mode, padding_mode=padding, align_corners=align)
    want = onnx_grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=int(align))
    assert got.shape == (1, 2, 2, 3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grid_sample_3d_cubic_matches_onnx_reference() -> None:
    x = RNG.standard_normal((1, 1, 3, 4, 4)).astype(np.float32)
    grid = RNG.uniform(-1.3, 1.3, (1, 2, 2, 3, 3)).astype(np.float32)
    for padding in PADDINGS:
        got = run_op("grid_sample", x, grid, mode="cubic", padding_mode=padding)
        np.testing.assert_allclose(got, onnx_grid_sample(x, grid, mode="cubic", padding_mode=padding),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(MODES), st.sampled_from(PADDINGS), st.booleans(), st.integers(1, 4), st.integers(1, 4),
       st.integers(0, 2**31 - 1))  # fmt: skip
def test_grid_sample_any_size_matches_onnx_reference(mode, padding, align, h, w, seed) -> None:
    if align and padding == "reflection" and 1 in (h, w):
        return  # onnx's reference divides by the zero span of a 1-pixel axis there
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 2, h, w)).astype(np.float32)
    grid = (rng.integers(-12, 13, (1, 3, 2, 2)) / 4).astype(np.float32)  # quarter steps: ties for nearest
    got = run_op("grid_sample", x, grid, mode=mode, padding_mode=padding, align_corners=align)
    want = onnx_grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=int(align))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grid_sample_by_hand() -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)  # [[0, 1, 2], [3, 4, 5]]
    # align_corners: (-1, -1) is pixel (0, 0), (1, 1) pixel (1, 2), (0, 0) the centre (0.5, 1), x first
    grid = np.array([[[[-1, -1], [1, 1], [0, 0], [0, -1]]]], np.float32)
    got = run_op("grid_sample", x, grid, align_corners=True)
    np.testing.assert_allclose(got[0, 0, 0], [0, 5, 2.5, 1])
    # nearest rounds half to even: x = 0.5 (between pixels 0 and 1) takes 0, y = 0.5 takes 0
    near = run_op("grid_sample", x, np.array([[[[-0.5, 0.0]]]], np.float32), mode="nearest", align_corners=True)
    np.testing.assert_array_equal(near[0, 0, 0], [0])
    # zeros: half of the first pixel past the left edge; border: the edge pixel itself
    edge = np.array([[[[-1.5, -1]]]], np.float32)
    assert run_op("grid_sample", x, edge, align_corners=True)[0, 0, 0, 0] == 0
    assert run_op("grid_sample", x, np.array([[[[-2.0, 1.0]]]], np.float32), padding_mode="border",
                  align_corners=True)[0, 0, 0, 0] == 3  # fmt: skip
    # reflection off the left edge: x = -0.5 pixels folds to 0.5
    r = run_op("grid_sample", x, np.array([[[[-1.5, -1]]]], np.float32), padding_mode="reflection",
               align_corners=True)  # fmt: skip
    np.testing.assert_allclose(r[0, 0, 0, 0], 0.5)


def test_grid_sample_shape_rule_and_errors() -> None:
    assert "last axis must hold 2" in infer_error("grid_sample", "tensor<1x2x3x4xf32>", "tensor<1x5x5x3xf32>")
    assert "batch" in infer_error("grid_sample", "tensor<2x2x3x4xf32>", "tensor<1x5x5x2xf32>")
    assert "rank 4" in infer_error("grid_sample", "tensor<1x2x3x4xf32>", "tensor<1x5x2xf32>")
    assert "floating-point" in infer_error("grid_sample", "tensor<1x2x3x4xi32>", "tensor<1x5x5x2xi32>")
    assert "dtypes differ" in infer_error("grid_sample", "tensor<1x2x3x4xf32>", "tensor<1x5x5x2xf64>")
    bad = infer_error("grid_sample", "tensor<1x2x3x4xf32>", "tensor<1x5x5x2xf32>", mode="bilinear")
    assert 'must be one of "linear", "nearest", "cubic"' in bad  # ONNX's opset-16 names are the importer's


def test_grid_sample_keeps_dynamic_sizes() -> None:
    m = parse("func @main(%x: tensor<?x3x4x5xf32>, %g: tensor<?x?x6x2xf32>) -> tensor<?x3x?x6xf32> {\n"
              "  %y = graph.grid_sample(%x, %g) {mode = \"cubic\", padding_mode = \"border\"}\n  return %y\n}\n", "t.gir")  # fmt: skip
    assert str(m["main"].ops[0].results[0].type) == "tensor<?x3x?x6xf32>"
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = RNG.uniform(-1.2, 1.2, (2, 7, 6, 2)).astype(np.float32)
    np.testing.assert_allclose(run(m, [x, g])[0], onnx_grid_sample(x, g, mode="cubic", padding_mode="border"),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("size", [[2, 3, 4, 5], [1, 1, 3, 2, 4], [2, 1, 1, 3]])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_matches_onnx_reference(size: list[int], align: int) -> None:
    k = len(size) - 2
    theta = RNG.standard_normal((size[0], k, k + 1)).astype(np.float32)
    got = run_op("affine_grid", theta, size=size[2:], align_corners=bool(align))
    assert got.shape == (size[0], *size[2:], k)
    np.testing.assert_allclose(got, onnx_affine_grid(theta, size, align), rtol=1e-5, atol=1e-6)


def test_affine_grid_identity_is_the_pixel_centres() -> None:
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float64)
    g = run_op("affine_grid", theta, size=[2, 3], align_corners=True)
    np.testing.assert_allclose(g[0, :, :, 0], [[-1, 0, 1], [-1, 0, 1]])
    np.testing.assert_allclose(g[0, :, :, 1], [[-1, -1, -1], [1, 1, 1]])
    g = run_op("affine_grid", theta, size=[2, 2])
    np.testing.assert_allclose(g[0, 0], [[-0.5, -0.5], [0.5, -0.5]])
    # sampling an image at its own identity grid gives the image back
    x = RNG.standard_normal((1, 2, 2, 3))
    for align in (False, True):
        g = run_op("affine_grid", theta, size=[2, 3], align_corners=align)
        np.testing.assert_allclose(run_op("grid_sample", x, g, align_corners=align), x, rtol=1e-12, atol=1e-12)


def test_affine_grid_shape_rule_and_errors() -> None:
    assert "theta must be [N, 2, 3]" in infer_error("affine_grid", "tensor<1x3x4xf32>", size=[4, 5])
    assert "2 or 3 spatial sizes" in infer_error("affine_grid", "tensor<1x2x3xf32>", size=[4])
    m = parse(
        "func @main(%t: tensor<?x3x4xf32>) -> tensor<?x2x3x4x3xf32> {\n"
        "  %g = graph.affine_grid(%t) {size = [2, 3, 4]}\n  return %g\n}\n",
        "t.gir",
    )
    assert str(m["main"].ops[0].results[0].type) == "tensor<?x2x3x4x3xf32>"


def test_autodiff_through_grid_sample_is_a_diagnostic() -> None:
    from compiler.diagnostics import GCError
    from compiler.pipeline import run_pipeline

    m = parse(
        "func @main(%x: tensor<1x1x2x2xf32>, %g: tensor<1x1x1x2xf32>) -> tensor<f32> {\n"
        "  %y = graph.grid_sample(%x, %g)\n  %l = graph.reduce_sum(%y)\n  return %l\n}\n",
        "t.gir",
    )
    with pytest.raises(GCError, match="grid_sample has no gradient rule .*autodiff cannot differentiate"):
        run_pipeline(m, "autodiff")


def import_and_run(nodes: list, inputs: dict, opset: int, inits: dict | None = None, reference: bool = True):
    """ONNX's reference evaluator (unless not `reference`) and gc's interpreter on the imported model."""
    import compiler
    from compiler.importers.onnx import import_onnx

    info = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()]  # fmt: skip
    graph = helper.make_graph(nodes, "g", info, [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              initializer=[onnx.numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    imported = import_onnx(model)
    want = ReferenceEvaluator(model).run(None, inputs) if reference else None
    return want, compiler.run(imported.module, {**inputs, **imported.weights})


@pytest.mark.parametrize(("opset", "mode"), [(16, "bilinear"), (16, "bicubic"), (16, "nearest"), (20, "cubic"),
                                             (22, "linear")])  # fmt: skip
def test_grid_sample_imports_with_each_opsets_mode_names(opset: int, mode: str) -> None:
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    g = RNG.uniform(-1.3, 1.3, (1, 3, 2, 2)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode="reflection", align_corners=1)
    _, got = import_and_run([node], {"x": x, "g": g}, opset, reference=False)
    # onnx's reference knows only opset 20's names: bilinear and bicubic are its linear and cubic
    same = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    want = onnx_grid_sample(x, g, mode=same, padding_mode="reflection", align_corners=1)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_affine_grid_imports_with_a_constant_size_and_feeds_grid_sample() -> None:
    theta = RNG.standard_normal((2, 2, 3)).astype(np.float32) * 0.5
    x = RNG.standard_normal((2, 3, 5, 5)).astype(np.float32)
    nodes = [helper.make_node("AffineGrid", ["t", "s"], ["g"], align_corners=0),
             helper.make_node("GridSample", ["x", "g"], ["y"])]  # fmt: skip
    want, got = import_and_run(nodes, {"t": theta, "x": x}, 20, {"s": np.array([2, 3, 4, 6], np.int64)})
    assert got[0].shape == (2, 3, 4, 6)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
