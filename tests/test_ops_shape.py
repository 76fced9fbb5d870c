"""The shape ops against independent NumPy: each expected value is written out or built by explicit loops."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from compiler.builder import new_func
from compiler.diagnostics import GCError
from compiler.ir import DType, TensorType
from compiler.parser import parse
from dialects.graph import shape
from helpers import infer_error, run_op

INT64_MAX = 9223372036854775807
INT64_MIN = -9223372036854775808

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.int32, np.int64, np.bool_]


def arange(*shape: int, dtype=np.float32) -> np.ndarray:
    """Distinct values (booleans alternate), so a misplaced element shows."""
    n = int(np.prod(shape, dtype=np.int64))
    if dtype is np.bool_:
        return (np.arange(n) % 2 == 0).reshape(shape)
    return (np.arange(n) % 100 - 7).astype(dtype).reshape(shape)


def check(got: np.ndarray, want) -> None:
    want = np.asarray(want, dtype=got.dtype)
    assert got.shape == want.shape, f"{got.shape} vs {want.shape}"
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


# --- every op -----------------------------------------------------------------------------------

ONE_OF_EACH = [
    ("reshape", ["tensor<2x3xf32>"], {"shape": (3, 2)}),
    ("transpose", ["tensor<2x3xf32>"], {}),
    ("concat", ["tensor<2x3xf32>", "tensor<2x3xf32>"], {"axis": 0}),
    ("split", ["tensor<4x3xf32>"], {"sections": (1, 3)}),
    ("slice", ["tensor<4x3xf32>"], {"starts": (1,), "ends": (3,)}),
    ("broadcast_to", ["tensor<3xf32>"], {"shape": (2, 3)}),
    ("squeeze", ["tensor<1x3xf32>"], {}),
    ("unsqueeze", ["tensor<3xf32>"], {"axes": (0,)}),
    ("flatten", ["tensor<2x3x4xf32>"], {}),
    ("pad", ["tensor<2x3xf32>"], {"pads": (1, 1, 1, 1)}),
    ("gather", ["tensor<5x3xf32>", "tensor<2xi64>"], {}),
]


def _build(name: str, types: list[str], attrs: dict):
    parsed = [parse(f"func @f(%a: {t}) -> {t} {{\n  return %a\n}}\n").funcs["f"].args[0].type for t in types]
    f, b, vals = new_func("main", {f"a{i}": t for i, t in enumerate(parsed)})
    getattr(b, name)(*vals, **attrs)
    return f.ops[-1]


def test_every_shape_op_is_listed_once() -> None:
    assert sorted(cls.name for cls in shape.OPS) == sorted(f"graph.{n}" for n, _, _ in ONE_OF_EACH)


@pytest.mark.parametrize("name,types,attrs", ONE_OF_EACH, ids=[n for n, _, _ in ONE_OF_EACH])
def test_shape_ops_are_injective_and_cost_no_flops(name: str, types: list[str], attrs: dict) -> None:
    op = _build(name, types, attrs)
    assert op.kind == "injective"
    assert op.flops() == 0


@pytest.mark.parametrize("name,types,attrs", ONE_OF_EACH, ids=[n for n, _, _ in ONE_OF_EACH])
def test_shape_ops_have_a_one_line_gir_docstring(name: str, types: list[str], attrs: dict) -> None:
    op = _build(name, types, attrs)
    assert f"graph.{name}(" in type(op).__doc__


# --- reshape ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,target,want",
    [
        ((3, 4), (4, 3), (4, 3)),
        ((3, 4), (-1,), (12,)),
        ((2, 3, 4), (2, -1, 2), (2, 6, 2)),
        ((2, 3, 4), (0, -1), (2, 12)),
        ((2, 3, 4), (0, 0, 4), (2, 3, 4)),
        ((2, 3, 4), (-1, 0, 1), (8, 3, 1)),
        ((1, 1), (), ()),
        ((), (1, 1, 1), (1, 1, 1)),
        ((0, 3), (3, -1), (3, 0)),
        ((0, 3), (0, 5), (0, 5)),
    ],
)
def test_reshape_keeps_row_major_order(src, target, want) -> None:
    x = arange(*src)
    check(run_op("reshape", x, shape=target), x.flatten().reshape(want))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_preserves_dtype(dtype) -> None:
    x = arange(2, 3, dtype=dtype)
    got = run_op("reshape", x, shape=(3, 2))
    check(got, [[x[0, 0], x[0, 1]], [x[0, 2], x[1, 0]], [x[1, 1], x[1, 2]]])


@pytest.mark.parametrize(
    "src,target,message",
    [
        ("tensor<2x3xf32>", [-1, -1], "shape [-1, -1] has more than one -1"),
        ("tensor<2x3xf32>", [4, 2], "cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)"),
        ("tensor<2x3xf32>", [4, -1], "cannot reshape [2, 3] (6 elements) to [4, -1]: 6 is not divisible by 4"),
        ("tensor<2x3xf32>", [2, -2], "shape [2, -2] has a negative size -2"),
        ("tensor<6xf32>", [2, 0], "0 at position 1 copies an input size, but the input has rank 1"),
        ("tensor<0x3xf32>", [0, -1], "-1 is ambiguous when the other sizes multiply to 0"),
    ],
)
def test_reshape_rejects_bad_shapes(src: str, target: list[int], message: str) -> None:
    assert message in infer_error("reshape", src, shape=target)


def test_reshape_requires_shape() -> None:
    assert "missing required attribute 'shape'" in infer_error("reshape", "tensor<2x3xf32>")


# --- transpose ----------------------------------------------------------------------------------


def _permute(x: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    out = np.empty(tuple(x.shape[p] for p in perm), dtype=x.dtype)
    for idx in itertools.product(*(range(d) for d in out.shape)):
        src = [0] * x.ndim
        for out_axis, p in enumerate(perm):
            src[p] = idx[out_axis]
        out[idx] = x[tuple(src)]
    return out


@pytest.mark.parametrize(
    "shape_,perm,resolved",
    [
        ((2, 3, 4), None, (2, 1, 0)),
        ((2, 3, 4), (1, 0, 2), (1, 0, 2)),
        ((2, 3, 4), (2, 0, 1), (2, 0, 1)),
        ((2, 3, 4), (-1, 0, -2), (2, 0, 1)),
        ((5,), None, (0,)),
        ((), None, ()),
    ],
)
def test_transpose_permutes_axes(shape_, perm, resolved) -> None:
    x = arange(*shape_)
    attrs = {} if perm is None else {"perm": perm}
    check(run_op("transpose", x, **attrs), _permute(x, resolved))


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_preserves_dtype(dtype) -> None:
    x = arange(2, 3, dtype=dtype)
    check(run_op("transpose", x), [[x[0, 0], x[1, 0]], [x[0, 1], x[1, 1]], [x[0, 2], x[1, 2]]])


@pytest.mark.parametrize(
    "perm,message",
    [
        ([0, 0, 1], "perm [0, 0, 1] is not a permutation of 0..2"),
        ([0, 1], "perm [0, 1] has 2 entries but the operand has rank 3"),
        ([0, 1, 3], "perm entry 3 is out of range for rank 3"),
        ([0, -3, 1], "perm [0, -3, 1] is not a permutation of 0..2"),
    ],
)
def test_transpose_rejects_bad_perm(perm: list[int], message: str) -> None:
    assert message in infer_error("transpose", "tensor<2x3x4xf32>", perm=perm)


# --- concat -------------------------------------------------------------------------------------


def test_concat_two_along_rows() -> None:
    a = np.array([[1, 2, 3]], np.float32)
    b = np.array([[4, 5, 6], [7, 8, 9]], np.float32)
    check(run_op("concat", a, b, axis=0), [[1, 2, 3], [4, 5, 6], [7, 8, 9]])


def test_concat_three_along_negative_axis() -> None:
    a = np.array([[1], [2]], np.float64)
    b = np.array([[3, 4], [5, 6]], np.float64)
    c = np.array([[7], [8]], np.float64)
    check(run_op("concat", a, b, c, axis=-1), [[1, 3, 4, 7], [2, 5, 6, 8]])


def test_concat_of_one_operand_is_a_copy() -> None:
    x = arange(2, 3)
    check(run_op("concat", x, axis=1), x)


def test_concat_with_an_empty_operand() -> None:
    a = np.zeros((0, 2), np.int32)
    b = np.array([[1, 2]], np.int32)
    check(run_op("concat", a, b, axis=0), [[1, 2]])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.bool_, np.float16])
def test_concat_preserves_dtype(dtype) -> None:
    a = arange(2, dtype=dtype)
    b = arange(3, dtype=dtype)
    check(run_op("concat", a, b, axis=0), [a[0], a[1], b[0], b[1], b[2]])


@pytest.mark.parametrize(
    "types,axis,message",
    [
        (
            ["tensor<2x3xf32>", "tensor<2x4xf32>"],
            0,
            "operand #1 has shape [2, 4] but operand #0 has [2, 3]: dimension 1 differs (4 vs 3)",
        ),
        (["tensor<2x3xf32>", "tensor<2x3x1xf32>"], 0, "operand #1 has rank 3 but operand #0 has rank 2"),
        (["tensor<2x3xf32>", "tensor<2x3xf64>"], 0, "operand dtypes differ: f32 vs f64"),
        (["tensor<2x3xf32>", "tensor<2x3xf32>"], 2, "axis 2 is out of range for rank 2"),
        (["tensor<2x3xf32>", "tensor<2x3xf32>"], -3, "axis -3 is out of range for rank 2"),
        (["tensor<f32>", "tensor<f32>"], 0, "cannot concatenate scalars"),
    ],
)
def test_concat_rejects_mismatched_operands(types: list[str], axis: int, message: str) -> None:
    assert message in infer_error("concat", *types, axis=axis)


def test_concat_requires_an_operand() -> None:
    assert "expected at least 1 operands, got 0" in infer_error("concat", axis=0)


# --- split --------------------------------------------------------------------------------------


def test_split_rows_into_sections() -> None:
    x = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    a, b = run_op("split", x, axis=0, sections=(1, 2))
    check(a, [[1, 2]])
    check(b, [[3, 4], [5, 6]])


def test_split_along_a_negative_axis_with_an_empty_section() -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    a, b, c = run_op("split", x, axis=-1, sections=(1, 0, 2))
    check(a, [[1], [4]])
    check(b, np.zeros((2, 0)))
    check(c, [[2, 3], [5, 6]])


def test_split_default_axis_is_zero() -> None:
    x = np.array([True, False, True, True])
    a, b = run_op("split", x, sections=(3, 1))
    check(a, [True, False, True])
    check(b, [True])


def test_split_text_form_names_every_result() -> None:
    text = (
        "func @main(%x: tensor<5x2xf32>) -> (tensor<2x2xf32>, tensor<3x2xf32>) {\n"
        "  %a, %b = graph.split(%x) {sections = [2, 3]}\n"
        "  return %a, %b\n"
        "}\n"
    )
    m = parse(text)
    assert "%a, %b = graph.split(%x) {sections = [2, 3]} : (tensor<2x2xf32>, tensor<3x2xf32>)" in str(m)


def test_split_needs_one_result_name_per_section() -> None:
    text = (
        "func @main(%x: tensor<5x2xf32>) -> tensor<2x2xf32> {\n"
        "  %a, %b = graph.split(%x) {sections = [2, 2, 1]}\n"
        "  return %a\n"
        "}\n"
    )
    with pytest.raises(GCError, match="expected 3 result"):
        parse(text)


@pytest.mark.parametrize(
    "sections,axis,message",
    [
        ([2, 2], 0, "sections [2, 2] sum to 4 but axis 0 has size 5"),
        ([6, -1], 0, "sections [6, -1] has a negative size"),
        ([], 0, "sections is empty"),
        ([5], 2, "axis 2 is out of range for rank 2"),
    ],
)
def test_split_rejects_bad_sections(sections: list[int], axis: int, message: str) -> None:
    assert message in infer_error("split", "tensor<5x2xf32>", axis=axis, sections=sections)


def test_split_requires_sections() -> None:
    assert "missing required attribute 'sections'" in infer_error("split", "tensor<5x2xf32>")


# --- slice --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start,end,step,indices",
    [
        (1, 4, 1, [1, 2, 3]),
        (-2, 6, 1, [4, 5]),
        (0, INT64_MAX, 2, [0, 2, 4]),
        (-1, INT64_MIN, -1, [5, 4, 3, 2, 1, 0]),
        (4, 1, -1, [4, 3, 2]),
        (10, -10, -2, [5, 3, 1]),
        (-100, 100, 1, [0, 1, 2, 3, 4, 5]),
        (INT64_MIN, INT64_MAX, 4, [0, 4]),
        (INT64_MAX, INT64_MIN, -4, [5, 1]),
        (3, 3, 1, []),
        (5, 1, 1, []),
        (1, 4, -1, []),
        (0, -1, 1, [0, 1, 2, 3, 4]),
        (-1, 0, -1, [5, 4, 3, 2, 1]),
        (6, 9, 1, []),
        (-7, -6, 1, []),
        (2, 5, 7, [2]),
    ],
)
def test_slice_clamps_as_onnx(start: int, end: int, step: int, indices: list[int]) -> None:
    x = np.array([10, 11, 12, 13, 14, 15], np.float32)
    got = run_op("slice", x, starts=(start,), ends=(end,), steps=(step,))
    check(got, [10 + i for i in indices])


def test_slice_default_axes_are_the_leading_ones() -> None:
    x = arange(4, 5)
    got = run_op("slice", x, starts=(1,), ends=(3,))
    check(got, [[x[i, j] for j in range(5)] for i in (1, 2)])


def test_slice_several_axes_in_any_order() -> None:
    x = arange(4, 5, 6)
    got = run_op("slice", x, starts=(-1, 1), ends=(0, 5), axes=(-1, 0), steps=(-2, 2))
    want = [[[x[i, j, k] for k in (5, 3, 1)] for j in range(5)] for i in (1, 3)]
    check(got, want)


def test_slice_negative_step_on_an_empty_axis_is_empty() -> None:
    x = np.zeros((0, 3), np.float32)
    check(run_op("slice", x, starts=(-1,), ends=(INT64_MIN,), axes=(0,), steps=(-1,)), np.zeros((0, 3)))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.bool_, np.float64, ml_dtypes.bfloat16])
def test_slice_preserves_dtype(dtype) -> None:
    x = arange(5, dtype=dtype)
    check(run_op("slice", x, starts=(3,), ends=(0,), steps=(-2,)), [x[3], x[1]])


@pytest.mark.parametrize(
    "attrs,message",
    [
        ({"starts": [0], "ends": [2], "steps": [0]}, "step for axis 0 is 0"),
        ({"starts": [0, 0], "ends": [1, 1], "axes": [1, 1]}, "axes [1, 1] repeat an axis"),
        ({"starts": [0, 0], "ends": [1, 1], "axes": [0, -2]}, "axes [0, -2] repeat an axis"),
        ({"starts": [0, 0], "ends": [1]}, "starts has 2 entries but ends has 1"),
        ({"starts": [0], "ends": [1], "axes": [0, 1]}, "starts has 1 entries but axes has 2"),
        ({"starts": [0], "ends": [1], "steps": [1, 1]}, "starts has 1 entries but steps has 2"),
        ({"starts": [0], "ends": [1], "axes": [2]}, "axis 2 is out of range for rank 2"),
        ({"starts": [0, 0, 0], "ends": [1, 1, 1]}, "axis 2 is out of range for rank 2"),
    ],
)
def test_slice_rejects_bad_attributes(attrs: dict, message: str) -> None:
    assert message in infer_error("slice", "tensor<4x5xf32>", **attrs)


def test_slice_of_a_scalar_has_no_axis_zero() -> None:
    assert "axis 0 is out of range for rank 0" in infer_error("slice", "tensor<f32>", starts=[0], ends=[1])


def test_slice_with_no_axes_is_a_copy() -> None:
    x = arange(2, 3)
    check(run_op("slice", x, starts=(), ends=()), x)


# --- broadcast_to -------------------------------------------------------------------------------


def test_broadcast_to_adds_leading_axes() -> None:
    x = np.array([1, 2, 3], np.float32)
    check(run_op("broadcast_to", x, shape=(2, 3)), [[1, 2, 3], [1, 2, 3]])


def test_broadcast_to_stretches_size_one_axes() -> None:
    x = np.array([[1], [2]], np.int32)
    check(run_op("broadcast_to", x, shape=(2, 3)), [[1, 1, 1], [2, 2, 2]])


def test_broadcast_to_is_bidirectional_as_onnx_expand() -> None:
    x = np.array([[1], [2]], np.float32)
    check(run_op("broadcast_to", x, shape=(3,)), [[1, 1, 1], [2, 2, 2]])
    check(run_op("broadcast_to", np.array([1, 2, 3], np.float32), shape=(1, 1)), [[1, 2, 3]])


def test_broadcast_to_a_scalar_and_to_zero() -> None:
    check(run_op("broadcast_to", np.array(True), shape=(2, 2)), [[True, True], [True, True]])
    check(run_op("broadcast_to", np.array([7], np.int64), shape=(0,)), np.zeros((0,)))


@pytest.mark.parametrize(
    "src,target,message",
    [
        ("tensor<2x3xf32>", [4, 3], "shapes [2, 3] and [4, 3] do not broadcast"),
        ("tensor<3xf32>", [2, 2], "shapes [3] and [2, 2] do not broadcast"),
        ("tensor<3xf32>", [-1, 3], "shape [-1, 3] has a negative size"),
    ],
)
def test_broadcast_to_rejects_incompatible_shapes(src: str, target: list[int], message: str) -> None:
    assert message in infer_error("broadcast_to", src, shape=target)


# --- squeeze, unsqueeze -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,axes,want",
    [
        ((1, 3, 1, 2), None, (3, 2)),
        ((1, 3, 1, 2), (0,), (3, 1, 2)),
        ((1, 3, 1, 2), (-2,), (1, 3, 2)),
        ((1, 3, 1, 2), (2, 0), (3, 2)),
        ((3, 2), None, (3, 2)),
        ((1, 1), None, ()),
        ((1, 3), (), (1, 3)),
    ],
)
def test_squeeze_drops_size_one_axes(src, axes, want) -> None:
    x = arange(*src, dtype=np.int32)
    attrs = {} if axes is None else {"axes": axes}
    check(run_op("squeeze", x, **attrs), x.flatten().reshape(want))


@pytest.mark.parametrize(
    "axes,message",
    [
        ([1], "cannot squeeze axis 1 of size 3 (shape [1, 3, 1])"),
        ([3], "axis 3 is out of range for rank 3"),
        ([0, -3], "axes [0, -3] repeat an axis"),
    ],
)
def test_squeeze_rejects_bad_axes(axes: list[int], message: str) -> None:
    assert message in infer_error("squeeze", "tensor<1x3x1xf32>", axes=axes)


def test_squeeze_a_scalar_has_no_axis_zero() -> None:
    assert "axis 0 is out of range for rank 0" in infer_error("squeeze", "tensor<f32>", axes=[0])


@pytest.mark.parametrize(
    "src,axes,want",
    [
        ((2, 3), (0,), (1, 2, 3)),
        ((2, 3), (-1,), (2, 3, 1)),
        ((2, 3), (1,), (2, 1, 3)),
        ((2, 3), (0, 3), (1, 2, 3, 1)),
        ((2, 3), (3, 0), (1, 2, 3, 1)),
        ((2, 3), (-1, -4), (1, 2, 3, 1)),
        ((2, 3), (1, 2), (2, 1, 1, 3)),
        ((), (0,), (1,)),
        ((), (0, 1), (1, 1)),
    ],
)
def test_unsqueeze_axes_index_the_output(src, axes, want) -> None:
    x = arange(*src, dtype=np.float64)
    check(run_op("unsqueeze", x, axes=axes), x.flatten().reshape(want))


def test_unsqueeze_preserves_bool() -> None:
    check(run_op("unsqueeze", np.array([True, False]), axes=(0,)), [[True, False]])


@pytest.mark.parametrize(
    "axes,message",
    [
        ([3], "axis 3 is out of range for rank 3"),
        ([-4], "axis -4 is out of range for rank 3"),
        ([1, -3], "axes [1, -3] repeat an axis"),
    ],
)
def test_unsqueeze_rejects_bad_axes(axes: list[int], message: str) -> None:
    assert message in infer_error("unsqueeze", "tensor<2x3xf32>", axes=axes)


def test_unsqueeze_requires_axes() -> None:
    assert "missing required attribute 'axes'" in infer_error("unsqueeze", "tensor<2x3xf32>")


# --- flatten ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,axis,want",
    [
        ((2, 3, 4), None, (2, 12)),
        ((2, 3, 4), 0, (1, 24)),
        ((2, 3, 4), 2, (6, 4)),
        ((2, 3, 4), 3, (24, 1)),
        ((2, 3, 4), -1, (6, 4)),
        ((2, 3, 4), -3, (1, 24)),
        ((5,), None, (5, 1)),
        ((), 0, (1, 1)),
        ((2, 0, 3), 2, (0, 3)),
    ],
)
def test_flatten_gives_two_dims(src, axis, want) -> None:
    x = arange(*src, dtype=np.int64)
    attrs = {} if axis is None else {"axis": axis}
    check(run_op("flatten", x, **attrs), x.flatten().reshape(want))


@pytest.mark.parametrize("axis", [4, -4])
def test_flatten_rejects_axis_out_of_range(axis: int) -> None:
    assert f"axis {axis} is out of range for rank 3 (allowed -3..3)" in infer_error(
        "flatten", "tensor<2x3x4xf32>", axis=axis
    )


# --- pad ----------------------------------------------------------------------------------------


def test_pad_default_value_is_zero() -> None:
    x = np.array([[1, 2], [3, 4]], np.float32)
    check(run_op("pad", x, pads=(1, 0, 0, 1)), [[0, 0, 0], [1, 2, 0], [3, 4, 0]])


def test_pad_with_a_constant() -> None:
    x = np.array([1, 2], np.float64)
    check(run_op("pad", x, pads=(2, 1), value=-1.5), [-1.5, -1.5, 1, 2, -1.5])


def test_pad_negative_pads_crop() -> None:
    x = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.float32)
    check(run_op("pad", x, pads=(-1, 0, 0, -2)), [[4], [7]])


def test_pad_crops_one_side_and_pads_the_other() -> None:
    x = np.array([1, 2, 3, 4], np.int32)
    check(run_op("pad", x, pads=(-3, 2), value=9), [4, 9, 9])


def test_pad_can_crop_an_axis_to_nothing() -> None:
    x = np.array([1, 2], np.float32)
    check(run_op("pad", x, pads=(-1, -1)), np.zeros((0,)))


def test_pad_infinite_value() -> None:
    x = np.array([1], np.float32)
    check(run_op("pad", x, pads=(1, 0), value=float("-inf")), [-np.inf, 1])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.float16])
def test_pad_preserves_numeric_dtypes(dtype) -> None:
    x = np.array([1, 2], dtype)
    check(run_op("pad", x, pads=(0, 2), value=5), [1, 2, 5, 5])


def test_pad_bool_with_true() -> None:
    x = np.array([False])
    check(run_op("pad", x, pads=(1, 1), value=1.0), [True, False, True])


def test_pad_scalar_is_a_copy() -> None:
    check(run_op("pad", np.array(3.0, np.float32), pads=()), 3.0)


@pytest.mark.parametrize(
    "src,pads,value,message",
    [
        ("tensor<2x3xf32>", [1, 1], 0.0, "pads [1, 1] has 2 entries; rank 2 needs 4"),
        ("tensor<2x3xf32>", [-2, 0, -1, 0], 0.0, "pads [-2, 0, -1, 0] crop 3 elements from axis 0 of size 2"),
        ("tensor<1xf32>", [-2, 3], 0.0, "pads [-2, 3] crop 2 elements from axis 0 of size 1"),
        ("tensor<2xi32>", [1, 1], 0.5, "pad value 0.5 is not representable in i32"),
        ("tensor<2xi8>", [1, 1], 300.0, "pad value 300.0 is not representable in i8"),
        ("tensor<2xi64>", [1, 1], float("nan"), "pad value nan is not representable in i64"),
        ("tensor<2xi1>", [1, 1], 2.0, "pad value 2.0 is not a bool"),
    ],
)
def test_pad_rejects_bad_pads_and_values(src: str, pads: list[int], value: float, message: str) -> None:
    assert message in infer_error("pad", src, pads=pads, value=value)


def test_pad_requires_pads() -> None:
    assert "missing required attribute 'pads'" in infer_error("pad", "tensor<2x3xf32>")


# --- gather -------------------------------------------------------------------------------------


def _gather(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    """out[i..., j..., k...] = data[i..., indices[j...], k...], by explicit loops."""
    axis %= data.ndim
    pre, post = data.shape[:axis], data.shape[axis + 1 :]
    out = np.empty(pre + indices.shape + post, dtype=data.dtype)
    for i in itertools.product(*(range(d) for d in pre)):
        for j in itertools.product(*(range(d) for d in indices.shape)):
            row = int(indices[j])
            row = row + data.shape[axis] if row < 0 else row
            for k in itertools.product(*(range(d) for d in post)):
                out[i + j + k] = data[i + (row,) + k]
    return out


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_embedding_rows(index_dtype) -> None:
    table = arange(5, 3)
    ids = np.array([[4, 0], [2, 2]], index_dtype)
    check(run_op("gather", table, ids), _gather(table, ids, 0))


def test_gather_negative_indices_count_from_the_end() -> None:
    table = np.array([10, 11, 12, 13], np.float32)
    check(run_op("gather", table, np.array([-1, -4, 1], np.int64)), [13, 10, 11])


@pytest.mark.parametrize("axis", [1, -1, -2, 2])
def test_gather_along_other_axes(axis: int) -> None:
    data = arange(2, 4, 3, dtype=np.float64)
    ids = np.array([[2, 0, -1]], np.int64) if axis % 3 != 0 else np.array([1], np.int64)
    check(run_op("gather", data, ids, axis=axis), _gather(data, ids, axis))


def test_gather_with_a_scalar_index_drops_the_axis() -> None:
    data = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    check(run_op("gather", data, np.array(1, np.int64), axis=0), [3, 4])


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.bool_, np.float16])
def test_gather_preserves_data_dtype(dtype) -> None:
    data = arange(4, dtype=dtype)
    check(run_op("gather", data, np.array([3, 1], np.int32)), [data[3], data[1]])


@pytest.mark.parametrize("bad", [5, -6])
def test_gather_out_of_range_index_is_a_user_error(bad: int) -> None:
    data = arange(5, 2)
    with pytest.raises(GCError, match=f"index {bad} is out of range for axis 0 of size 5"):
        run_op("gather", data, np.array([0, bad], np.int64))


@pytest.mark.parametrize(
    "types,axis,message",
    [
        (["tensor<5x3xf32>", "tensor<2xf32>"], 0, "indices must be i32 or i64, got tensor<2xf32>"),
        (["tensor<5x3xf32>", "tensor<2xi8>"], 0, "indices must be i32 or i64, got tensor<2xi8>"),
        (["tensor<5x3xf32>", "tensor<2xi64>"], 2, "axis 2 is out of range for rank 2"),
        (["tensor<f32>", "tensor<2xi64>"], 0, "data must have rank >= 1"),
    ],
)
def test_gather_rejects_bad_operands(types: list[str], axis: int, message: str) -> None:
    assert message in infer_error("gather", *types, axis=axis)


def test_gather_needs_two_operands() -> None:
    assert "expected 2 operands, got 1" in infer_error("gather", "tensor<5x3xf32>")


# --- types --------------------------------------------------------------------------------------


def test_inferred_types_keep_the_dtype() -> None:
    f, b, (x,) = new_func("main", {"x": TensorType((2, 3), DType.i1)})
    parts = b.split(b.transpose(b.reshape(x, shape=(3, 2))), axis=1, sections=(1, 2))
    assert [p.type for p in parts] == [TensorType((2, 1), DType.i1), TensorType((2, 2), DType.i1)]
