"""Every op's gradient rule against central differences in float64 on the interpreter, and PyTorch's values
at kinks (relu at 0, ties of maximum, reduce_max and max_pool2d, clip at its bounds, ...).

A rule is checked through the pass: @main applies one op to its arguments and reduces each result to a
scalar with fixed random weights (so the incoming gradient is no multiple of ones), `autodiff` adds
@main_grad, and its gradients must match (L(x + h e_i) - L(x - h e_i)) / 2h for every element i.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import modules

from compiler.builder import Builder, finish, new_func
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import DType, Module, Op, TensorType
from compiler.parser import parse
from compiler.pipeline import run_pipeline
from compiler.printer import print_module
from dialects.graph import GRAPH

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tensor(text: str) -> TensorType:
    """Parse a type written like "3x4xf64" (a scalar is "f64")."""
    *dims, dtype = text.split("x")
    return TensorType(tuple(int(d) for d in dims), DType(dtype))


def op_loss(name: str, types: list[str], attrs: dict, seed: int = 0) -> Module:
    """@main(a0, a1, ...) = sum over the float results r of graph.<name>(a0, ...) of reduce_sum(r * w_r)."""
    f, b, args = new_func("main", {f"a{i}": tensor(t) for i, t in enumerate(types)})
    out = getattr(b, name)(*args, **attrs)
    rng = np.random.default_rng(seed + 1000)
    loss = None
    for r in out if isinstance(out, tuple) else (out,):
        if not r.type.dtype.is_float:
            continue
        part = b.reduce_sum(b.mul(r, b.constant(rng.standard_normal(r.type.shape), r.type.dtype)))
        loss = part if loss is None else b.add(loss, part)
    return Module([finish(f, loss)])


def central_differences(module: Module, inputs: dict[str, np.ndarray], name: str, h: float) -> np.ndarray:
    x = inputs[name]
    grad = np.zeros(x.shape)
    for i in np.ndindex(x.shape):
        moved = []
        for step in (h, -h):
            y = np.array(x, copy=True)
            y[i] += step
            moved.append(float(run(module, {**inputs, name: y})[0]))
        grad[i] = (moved[0] - moved[1]) / (2 * h)
    return grad


def assert_gradients_match(module: Module, inputs: dict[str, np.ndarray] | None = None, seed: int = 0) -> None:
    """@main_grad's loss equals @main's and each gradient matches central differences."""
    f = module["main"]
    inputs = inputs if inputs is not None else random_inputs(f, seed, module)
    floats = [a for a in f.args if a.type.dtype.is_float]
    run_pipeline(module, "autodiff")
    got = run(module, inputs, "main_grad")
    assert len(got) == 1 + len(floats)
    np.testing.assert_allclose(got[0], run(module, inputs)[0], rtol=1e-12)
    for a, g in zip(floats, got[1:]):
        exact = a.type.dtype is DType.f64
        want = central_differences(module, inputs, a.name, 1e-6 if exact else 1e-2)
        assert g.shape == a.type.shape and g.dtype == a.type.dtype.np
        np.testing.assert_allclose(g, want, rtol=1e-5 if exact else 1e-2, atol=1e-6 if exact else 1e-2, err_msg=a.name)


# One case per rule and per attribute that changes it: (op, operand types, attributes).
CASES = [
    ("neg", ["3x4xf64"], {}),
    ("abs", ["3x4xf64"], {}),
    ("exp", ["3x4xf64"], {}),
    ("log", ["3x4xf64"], {}),
    ("sqrt", ["3x4xf64"], {}),
    ("rsqrt", ["3x4xf64"], {}),
    ("reciprocal", ["3x4xf64"], {}),
    ("tanh", ["3x4xf64"], {}),
    ("sigmoid", ["3x4xf64"], {}),
    ("relu", ["3x4xf64"], {}),
    ("erf", ["3x4xf64"], {}),
    ("sin", ["3x4xf64"], {}),
    ("cos", ["3x4xf64"], {}),
    ("floor", ["3x4xf64"], {}),
    ("ceil", ["3x4xf64"], {}),
    ("softplus", ["3x4xf64"], {}),
    *((n, ["3x4xf64"], {}) for n in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")),
    ("gelu", ["3x4xf64"], {}),
    ("gelu", ["3x4xf64"], {"approximate": "tanh"}),
    ("leaky_relu", ["3x4xf64"], {"alpha": 0.2}),
    ("elu", ["3x4xf64"], {"alpha": 0.7}),
    ("clip", ["3x4xf64"], {"min": -0.5, "max": 0.8}),
    ("clip", ["3x4xf64"], {"max": 0.1}),
    ("cast", ["3x4xf64"], {"dtype": DType.f64}),
    ("cast", ["3x4xf32"], {"dtype": DType.f64}),
    ("add", ["3x4xf64", "4xf64"], {}),
    ("sub", ["3x1xf64", "1x4xf64"], {}),
    ("mul", ["2x3x4xf64", "3x1xf64"], {}),
    ("div", ["3x4xf64", "f64"], {}),
    ("pow", ["3x4xf64", "4xf64"], {}),
    ("maximum", ["3x4xf64", "4xf64"], {}),
    ("minimum", ["3x4xf64", "3x4xf64"], {}),
    ("reduce_sum", ["3x4x2xf64"], {"axes": [0, 2]}),
    ("reduce_mean", ["3x4x2xf64"], {"axes": [-1], "keepdims": True}),
    ("reduce_prod", ["3x4x2xf64"], {"axes": [1]}),
    ("reduce_max", ["3x4x2xf64"], {"axes": [1]}),
    ("reduce_min", ["3x4x2xf64"], {}),
    ("cumsum", ["3x4x2xf64"], {"axis": 1}),
    ("cumsum", ["3x4xf64"], {"axis": -1, "exclusive": True}),
    ("cumsum", ["3x4xf64"], {"axis": 0, "reverse": True}),
    ("cumsum", ["5xf64"], {"exclusive": True, "reverse": True}),
    ("affine_grid", ["2x2x3xf64"], {"size": [3, 4]}),
    ("affine_grid", ["1x3x4xf64"], {"size": [2, 3, 2], "align_corners": True}),
    ("matmul", ["3x4xf64", "4x5xf64"], {}),
    ("matmul", ["2x3x4xf64", "4x5xf64"], {}),
    ("matmul", ["3x4xf64", "2x4x5xf64"], {}),
    ("matmul", ["2x1x3x4xf64", "3x4x5xf64"], {}),
    ("matmul", ["4xf64", "2x4x5xf64"], {}),
    ("matmul", ["2x3x4xf64", "4xf64"], {}),
    ("matmul", ["4xf64", "4xf64"], {}),
    ("conv2d", ["2x3x6x7xf64", "4x3x3x2xf64"], {}),
    ("conv2d", ["2x4x7x7xf64", "6x2x3x3xf64", "6xf64"],
     {"strides": [2, 3], "padding": [1, 2, 0, 1], "dilations": [2, 1], "groups": 2}),
    ("conv2d", ["1x3x5x5xf64", "3x1x2x2xf64"], {"groups": 3, "padding": [3, 3, 3, 3]}),
    ("conv2d", ["2x2x9x8xf64", "3x2x1x1xf64", "3xf64"], {"strides": [3, 2]}),
    ("max_pool2d", ["2x2x6x7xf64"], {"kernel": [2, 2]}),
    ("max_pool2d", ["2x2x6x7xf64"], {"kernel": [3, 2], "strides": [1, 2], "padding": [1, 1, 1, 0], "ceil_mode": True}),
    ("max_pool2d", ["1x2x7x7xf64"], {"kernel": [2, 2], "strides": [3, 3], "padding": [1, 1, 1, 1]}),
    ("avg_pool2d", ["2x2x6x7xf64"], {"kernel": [2, 2]}),
    ("avg_pool2d", ["2x2x6x7xf64"], {"kernel": [3, 3], "strides": [2, 2], "padding": [1, 1, 1, 1], "ceil_mode": True}),
    ("avg_pool2d", ["2x2x6x7xf64"],
     {"kernel": [3, 3], "strides": [2, 2], "padding": [1, 1, 1, 1], "count_include_pad": True}),
    ("avg_pool2d", ["1x2x7x5xf64"], {"kernel": [2, 2], "padding": [1, 1, 1, 0], "ceil_mode": True}),
    ("global_avg_pool2d", ["2x3x4x5xf64"], {}),
    ("batch_norm", ["2x3x4x2xf64", "3xf64", "3xf64", "3xf64", "3xf64"], {"epsilon": 0.01}),
    ("batch_norm", ["4x3xf64", "3xf64", "3xf64", "3xf64", "3xf64"], {}),
    ("layer_norm", ["2x3x4xf64", "4xf64", "4xf64"], {}),
    ("layer_norm", ["2x3x4xf64", "3x4xf64", "3x4xf64"], {"axis": 1}),
    ("layer_norm", ["2x3x4xf64", "2x3x4xf64", "2x3x4xf64"], {"axis": 0}),
    ("lrn", ["2x5x3xf64"], {"size": 3, "alpha": 0.1, "beta": 0.6, "bias": 1.5}),
    ("lrn", ["2x6x2x2xf64"], {"size": 4, "alpha": 0.3}),
    ("softmax", ["3x4xf64"], {"axis": 0}),
    ("log_softmax", ["3x4xf64"], {}),
    ("dropout", ["3x4xf64"], {}),
    ("reshape", ["3x4xf64"], {"shape": [2, -1]}),
    ("transpose", ["2x3x4xf64"], {"perm": [2, 0, 1]}),
    ("concat", ["2x3xf64", "2x2xf64", "2x1xf64"], {"axis": -1}),
    ("split", ["5x2xf64"], {"sections": [2, 3]}),
    ("slice", ["6x5xf64"], {"starts": [1, -1], "ends": [6, 0], "steps": [2, -2]}),
    ("slice", ["4x5xf64"], {"starts": [1], "ends": [3], "axes": [1]}),
    ("broadcast_to", ["3x1xf64"], {"shape": [2, 3, 4]}),
    ("squeeze", ["3x1xf64"], {}),
    ("unsqueeze", ["3xf64"], {"axes": [0, 2]}),
    ("flatten", ["2x3x2xf64"], {"axis": 2}),
    ("pad", ["3x4xf64"], {"pads": [1, -1, 2, 0], "value": 1.5}),
    ("gather", ["5x3xf64", "2x4xi64"], {}),
    ("gather", ["2x5x3xf64", "4xi32"], {"axis": -2}),
    ("softmax_cross_entropy", ["4x5xf64", "4xi64"], {}),
    ("mse_loss", ["3x4xf64", "3x4xf64"], {}),
    # Winograd's transforms: tiles that overlap (input) and are cropped (both); a bias.
    ("winograd_input", ["1x2x5x6xf64"], {"tile": 2, "padding": [1, 0, 2, 1]}),
    ("winograd_input", ["2x1x4x4xf64"], {"tile": 3, "padding": [1, 1, 1, 1]}),
    ("winograd_output", ["16x8x3xf64", "3xf64"], {"tile": 2, "size": [3, 7]}),
    ("winograd_output", ["25x2x2xf64"], {"tile": 3, "size": [4, 3]}),
]  # fmt: skip


def _case_id(case: tuple) -> str:
    name, types, attrs = case
    return name + "".join(f"-{k}={v}" for k, v in attrs.items()) + f"-{'-'.join(types)}"


@pytest.mark.parametrize("name, types, attrs", CASES, ids=[_case_id(c) for c in CASES])
def test_rule_matches_central_differences(name: str, types: list[str], attrs: dict) -> None:
    module = op_loss(name, types, attrs)
    inputs = random_inputs(module["main"], 0, module)
    if name == "pow":  # a positive base, where a real power has a derivative in the exponent
        inputs["a0"] = np.random.default_rng(1).uniform(0.5, 2.0, inputs["a0"].shape)
    assert_gradients_match(module, inputs)


def test_reduce_prod_rule_where_rows_hold_zeros() -> None:
    # Rows with no zero, one zero and two zeros: the product of the others cannot be the product over
    # the row divided by the element there.
    module = op_loss("reduce_prod", ["4x3xf64"], {"axes": [1]})
    x = np.array([[1.5, -2.0, 0.5], [0.0, 3.0, -1.25], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert_gradients_match(module, {"a0": x})  # which adds @main_grad
    grad = run(module, {"a0": x}, "main_grad")[1]
    w = np.random.default_rng(1000).standard_normal(4)  # op_loss's weights of the 4 row products
    others = [[-1.0, 0.75, -3.0], [-3.75, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    np.testing.assert_allclose(grad, w[:, None] * np.array(others), rtol=1e-12)


def test_every_differentiable_op_is_checked_against_central_differences() -> None:
    # Comparisons and argmax have integer results: nothing flows back through them (tested below).
    # The bitwise ops and shifts take and give integers only; numel counts elements, shape gives sizes and
    # iota indices, whatever the values (iota: below).
    # grid_sample has no rule (it raises: its input's gradient would scatter-add into the image), nor has
    # cumprod (its product rule divides by elements that may be 0).
    unchecked = {"graph.call", "graph.constant", "graph.equal", "graph.less", "graph.greater", "graph.argmax",
                 "graph.where", "graph.bitwise_and", "graph.bitwise_or", "graph.bitwise_xor", "graph.bitwise_not",
                 "graph.shift_left", "graph.shift_right", "graph.numel", "graph.shape", "graph.iota",
                 "graph.grid_sample", "graph.cumprod"}  # fmt: skip
    checked = {f"graph.{name}" for name, _, _ in CASES}
    missing = sorted(op.name for op in GRAPH.ops if op.name not in checked | unchecked)
    assert not missing, f"no central-difference case for {missing}"


def test_every_op_but_call_has_its_own_rule() -> None:
    # A call is inlined before differentiating; every other op defines grad next to its definition.
    missing = sorted(op.name for op in GRAPH.ops if op.grad is Op.grad and op.name != "graph.call")
    assert not missing, f"ops without a gradient rule: {missing}"


# --- what carries no gradient ---------------------------------------------------------------------


def grad_of(text: str, inputs: dict[str, np.ndarray], pipeline: str = "autodiff") -> list[np.ndarray]:
    module = parse(text, "t.gir")
    run_pipeline(module, pipeline)
    return run(module, inputs, "main_grad")


def test_where_sends_each_element_to_the_branch_it_took_and_nothing_to_the_condition() -> None:
    text = """
func @main(%a: tensor<4xf64>, %b: tensor<4xf64>) -> tensor<f64> {
  %c = graph.greater(%a, %b)
  %w = graph.constant {value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf64>}
  %s = graph.where(%c, %a, %b)
  %m = graph.mul(%s, %w)
  %l = graph.reduce_sum(%m)
  return %l
}"""
    a, b = np.array([1.0, -1.0, 2.0, 0.0]), np.array([0.0, 3.0, 1.0, 5.0])
    _, da, db = grad_of(text, {"a": a, "b": b})
    np.testing.assert_array_equal(da, [1.0, 0.0, 3.0, 0.0])
    np.testing.assert_array_equal(db, [0.0, 2.0, 0.0, 4.0])


def test_where_broadcasting_branches_sum_back_to_their_shapes() -> None:
    assert_gradients_match(op_loss("where", ["3x1xi1", "4xf64", "3x4xf64"], {}))


def test_argmax_and_casts_to_integers_pass_no_gradient() -> None:
    text = """
func @main(%x: tensor<3x4xf64>) -> tensor<f64> {
  %i = graph.argmax(%x) {axis = 1}
  %f = graph.cast(%i) {dtype = f64}
  %n = graph.cast(%x) {dtype = i32}
  %g = graph.cast(%n) {dtype = f64}
  %s = graph.reduce_sum(%f)
  %t = graph.reduce_sum(%g)
  %l = graph.add(%s, %t)
  return %l
}"""
    _, dx = grad_of(text, {"x": np.arange(12.0).reshape(3, 4)})
    np.testing.assert_array_equal(dx, np.zeros((3, 4)))


def test_iota_passes_no_gradient_to_the_values_it_takes_its_shape_from() -> None:
    text = """
func @main(%x: tensor<3x4xf64>) -> tensor<f64> {
  %i = graph.iota(%x) {axis = 1}
  %m = graph.mul(%i, %x)
  %l = graph.reduce_sum(%m)
  return %l
}"""
    x = np.arange(12.0).reshape(3, 4)
    _, dx = grad_of(text, {"x": x})
    np.testing.assert_array_equal(dx, np.broadcast_to(np.arange(4.0), (3, 4)))  # d(i * x)/dx = i, nothing via i


def test_gather_adds_the_gradient_of_repeated_and_negative_indices() -> None:
    text = """
func @main(%table: tensor<4x2xf64>, %ids: tensor<5xi64>) -> tensor<f64> {
  %e = graph.gather(%table, %ids)
  %w = graph.constant {value = dense<[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]]> : tensor<5x2xf64>}
  %m = graph.mul(%e, %w)
  %l = graph.reduce_sum(%m)
  return %l
}"""
    _, dtable = grad_of(text, {"table": np.zeros((4, 2)), "ids": np.array([1, 3, 1, -1, 0])})
    np.testing.assert_array_equal(dtable, [[5.0, 50.0], [4.0, 40.0], [0.0, 0.0], [6.0, 60.0]])


def test_split_results_off_the_loss_contribute_zeros() -> None:
    text = """
func @main(%x: tensor<5xf64>) -> tensor<f64> {
  %a, %b = graph.split(%x) {sections = [2, 3]}
  %l = graph.reduce_sum(%b)
  return %l
}"""
    _, dx = grad_of(text, {"x": np.arange(5.0)})
    assert dx.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]


# --- kinks: the values PyTorch computes -----------------------------------------------------------


def unary_grad(op: str, x: list[float], attrs: str = "") -> np.ndarray:
    """d sum(op(x)) / dx at exactly the points x."""
    n = len(x)
    text = f"""
func @main(%x: tensor<{n}xf64>) -> tensor<f64> {{
  %y = graph.{op}(%x) {attrs}
  %l = graph.reduce_sum(%y)
  return %l
}}"""
    return grad_of(text, {"x": np.array(x)})[1]


def test_relu_abs_leaky_relu_and_elu_at_zero_are_pytorchs() -> None:
    assert unary_grad("relu", [-1.0, 0.0, 1.0]).tolist() == [0.0, 0.0, 1.0]
    assert unary_grad("abs", [-1.0, 0.0, 1.0]).tolist() == [-1.0, 0.0, 1.0]
    assert unary_grad("leaky_relu", [-1.0, 0.0, 1.0], "{alpha = 0.1}").tolist() == [0.1, 0.1, 1.0]
    np.testing.assert_allclose(unary_grad("elu", [-1.0, 0.0, 1.0], "{alpha = 2.0}"), [2 * math.exp(-1), 2.0, 1.0])


def test_relu_passes_the_gradient_of_a_nan_through_as_pytorch() -> None:
    assert unary_grad("relu", [math.nan]).tolist() == [1.0]


def test_clip_passes_the_gradient_at_its_bounds() -> None:
    got = unary_grad("clip", [-1.0, 0.0, 0.5, 1.0, 2.0], "{min = 0.0, max = 1.0}")
    assert got.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_sqrt_and_rsqrt_at_zero_are_infinite() -> None:
    assert unary_grad("sqrt", [0.0, 1.0]).tolist() == [math.inf, 0.5]
    assert unary_grad("rsqrt", [0.0, 1.0]).tolist() == [-math.inf, -0.5]


def test_floor_and_ceil_have_zero_gradient() -> None:
    assert unary_grad("floor", [0.5, 1.0]).tolist() == [0.0, 0.0]
    assert unary_grad("ceil", [0.5, 1.0]).tolist() == [0.0, 0.0]


def binary_grad(op: str, a: list[float], b: list[float]) -> tuple[np.ndarray, np.ndarray]:
    n = len(a)
    text = f"""
func @main(%a: tensor<{n}xf64>, %b: tensor<{n}xf64>) -> tensor<f64> {{
  %y = graph.{op}(%a, %b)
  %l = graph.reduce_sum(%y)
  return %l
}}"""
    _, da, db = grad_of(text, {"a": np.array(a), "b": np.array(b)})
    return da, db


def test_maximum_and_minimum_split_ties_evenly() -> None:
    da, db = binary_grad("maximum", [1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert da.tolist() == [0.5, 0.0, 1.0] and db.tolist() == [0.5, 1.0, 0.0]
    da, db = binary_grad("minimum", [1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert da.tolist() == [0.5, 1.0, 0.0] and db.tolist() == [0.5, 0.0, 1.0]


def test_pow_masks_zero_exponents_and_zero_bases_as_pytorch() -> None:
    da, db = binary_grad("pow", [0.0, 0.0, 2.0, 0.0], [0.0, 2.0, 0.0, -1.0])
    assert da.tolist() == [0.0, 0.0, 0.0, -math.inf]
    assert db[:2].tolist() == [0.0, 0.0] and db[2] == pytest.approx(math.log(2)) and db[3] == -math.inf


def test_reduce_max_and_min_split_the_gradient_among_ties() -> None:
    text = """
func @main(%x: tensor<2x3xf64>) -> tensor<f64> {
  %m = graph.reduce_max(%x) {axes = [1]}
  %n = graph.reduce_min(%x)
  %s = graph.reduce_sum(%m)
  %l = graph.add(%s, %n)
  return %l
}"""
    _, dx = grad_of(text, {"x": np.array([[1.0, 3.0, 3.0], [0.0, 0.0, -1.0]])})
    np.testing.assert_array_equal(dx, [[0.0, 0.5, 0.5], [0.5, 0.5, 1.0]])


def test_max_pool_gives_each_window_gradient_to_its_first_maximum() -> None:
    text = """
func @main(%x: tensor<1x1x2x3xf64>) -> tensor<f64> {
  %y = graph.max_pool2d(%x) {kernel = [2, 2], strides = [1, 1]}
  %l = graph.reduce_sum(%y)
  return %l
}"""
    _, dx = grad_of(text, {"x": np.ones((1, 1, 2, 3))})
    np.testing.assert_array_equal(dx[0, 0], [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    _, dx = grad_of(
        text.replace("strides = [1, 1]", "strides = [2, 2], ceil_mode = true"), {"x": np.ones((1, 1, 2, 3))}
    )
    np.testing.assert_array_equal(dx[0, 0], [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])


def test_kink_values_are_what_torch_computes() -> None:
    torch = pytest.importorskip("torch")

    def torch_grad(fn, *xs):
        ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
        fn(*ts).sum().backward()
        return [t.grad.numpy() for t in ts]

    x = [-1.0, 0.0, 0.0, 1.0, 2.0]
    np.testing.assert_array_equal(unary_grad("relu", x), *torch_grad(torch.relu, x))
    np.testing.assert_array_equal(unary_grad("abs", x), *torch_grad(torch.abs, x))
    np.testing.assert_array_equal(
        unary_grad("clip", x, "{min = 0.0, max = 1.0}"), *torch_grad(lambda t: torch.clamp(t, 0.0, 1.0), x)
    )
    np.testing.assert_array_equal(
        unary_grad("leaky_relu", x, "{alpha = 0.1}"), *torch_grad(lambda t: torch.nn.functional.leaky_relu(t, 0.1), x)
    )
    np.testing.assert_allclose(
        unary_grad("elu", x, "{alpha = 2.0}"), *torch_grad(lambda t: torch.nn.functional.elu(t, 2.0), x)
    )
    a, b = [1.0, 2.0, 3.0, 0.0], [1.0, 3.0, 2.0, 0.0]
    for name, fn in (("maximum", torch.maximum), ("minimum", torch.minimum)):
        for got, want in zip(binary_grad(name, a, b), torch_grad(fn, a, b)):
            np.testing.assert_array_equal(got, want)
    base, exponent = [0.0, 0.0, 2.0, 0.0], [0.0, 2.0, 0.0, -1.0]
    for got, want in zip(binary_grad("pow", base, exponent), torch_grad(torch.pow, base, exponent)):
        np.testing.assert_allclose(got, want)


# --- hypothesis over shapes and attributes --------------------------------------------------------


@st.composite
def broadcast_pair(draw) -> tuple[tuple[int, ...], tuple[int, ...]]:
    out = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    a = [d if draw(st.booleans()) else 1 for d in out][draw(st.integers(0, len(out))) :]
    b = [d if draw(st.booleans()) else 1 for d in out][draw(st.integers(0, len(out))) :]
    return tuple(a), tuple(b)


def typestr(shape: tuple[int, ...], dtype: str = "f64") -> str:
    return "x".join([*map(str, shape), dtype])


@SETTINGS
@given(shapes=broadcast_pair(), name=st.sampled_from(["add", "sub", "mul", "div", "maximum", "minimum", "pow"]))
def test_binary_rules_sum_broadcast_gradients_back(shapes, name: str) -> None:
    module = op_loss(name, [typestr(s) for s in shapes], {})
    inputs = random_inputs(module["main"], 0, module)
    if name in ("pow", "div"):  # away from 0: a real power of a positive base, no division blowing up
        inputs = {k: np.random.default_rng(2).uniform(0.5, 2.0, v.shape) for k, v in inputs.items()}
    assert_gradients_match(module, inputs)


@SETTINGS
@given(
    a=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    b=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    k=st.integers(1, 3),
)
def test_matmul_rule_over_ranks_and_broadcast_batches(a: list[int], b: list[int], k: int) -> None:
    # a is [..., M, K] (or [K]), b is [..., K, N] (or [K]); the batches broadcast by construction.
    shape_a = (k,) if len(a) == 1 else (*a[:-2], a[-1], k) if len(a) > 2 else (a[0], k)
    shape_b = (k,) if len(b) == 1 else (*[1] * (len(b) - 2), k, b[-1])
    assert_gradients_match(op_loss("matmul", [typestr(shape_a), typestr(shape_b)], {}))


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    name=st.sampled_from(["reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min"]),
    data=st.data(),
)
def test_reduce_rules_over_axes_and_keepdims(shape: list[int], name: str, data) -> None:
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda a: a % len(shape)))
    attrs = {"keepdims": data.draw(st.booleans())} | ({"axes": axes} if axes else {})
    assert_gradients_match(op_loss(name, [typestr(tuple(shape))], attrs))


@SETTINGS
@given(data=st.data())
def test_slice_rule_over_starts_ends_and_steps(data) -> None:
    shape = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=2))
    axes = data.draw(st.permutations(range(len(shape))))[: data.draw(st.integers(1, len(shape)))]
    starts = [data.draw(st.integers(-6, 6)) for _ in axes]
    ends = [data.draw(st.integers(-7, 7)) for _ in axes]
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    assert_gradients_match(
        op_loss("slice", [typestr(tuple(shape))], {"starts": starts, "ends": ends, "axes": list(axes), "steps": steps})
    )


@SETTINGS
@given(data=st.data())
def test_conv2d_rule_over_strides_padding_dilations_and_groups(data) -> None:
    groups = data.draw(st.sampled_from([1, 2]))
    cg, og = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    strides = [data.draw(st.integers(1, 3)) for _ in range(2)]
    dilations = [data.draw(st.integers(1, 2)) for _ in range(2)]
    padding = [data.draw(st.integers(0, 2)) for _ in range(4)]
    h = data.draw(st.integers(max(1, dilations[0] * (kh - 1) + 1 - padding[0] - padding[2]), 6))
    w = data.draw(st.integers(max(1, dilations[1] * (kw - 1) + 1 - padding[1] - padding[3]), 6))
    types = [typestr((1, cg * groups, h, w)), typestr((og * groups, cg, kh, kw))]
    if data.draw(st.booleans()):
        types.append(typestr((og * groups,)))
    attrs = {"strides": strides, "padding": padding, "dilations": dilations, "groups": groups}
    assert_gradients_match(op_loss("conv2d", types, attrs))


@SETTINGS
@given(data=st.data(), name=st.sampled_from(["max_pool2d", "avg_pool2d"]))
def test_pool_rules_over_windows_padding_and_ceil_mode(data, name: str) -> None:
    kernel = [data.draw(st.integers(1, 3)) for _ in range(2)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(2)]
    padding = [data.draw(st.integers(0, k - 1)) for k in kernel + kernel]
    h, w = (data.draw(st.integers(max(1, k - p - q), 6)) for k, p, q in zip(kernel, padding[:2], padding[2:]))
    attrs = {"kernel": kernel, "strides": strides, "padding": padding, "ceil_mode": data.draw(st.booleans())}
    if name == "avg_pool2d":
        attrs["count_include_pad"] = data.draw(st.booleans())
    assert_gradients_match(op_loss(name, [typestr((1, 2, h, w))], attrs))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(modules(8, continuous=True))
def test_random_modules_differentiate_like_central_differences(m: Module) -> None:
    # Over the smooth ops (strategies' `continuous`) in f64, each float result weighted into one scalar loss;
    # one random direction for all arguments at once (elementwise differences would cost two runs each).
    f64 = parse(print_module(m).replace("f32", "f64"), "random.gir")
    f = f64["main"]
    rng = np.random.default_rng(0)
    b = Builder(f)
    loss = None
    for r in f.results:
        if r.type.dtype.is_float:
            part = b.reduce_sum(b.mul(r, b.constant(rng.standard_normal(r.type.shape), r.type.dtype)))
            loss = part if loss is None else b.add(loss, part)
    assume(loss is not None)
    finish(f, loss)
    inputs = random_inputs(f, 0, f64)
    floats = [a.name for a in f.args if a.type.dtype.is_float]
    run_pipeline(f64, "autodiff")
    grads = run(f64, inputs, "main_grad")[1:]
    direction = {k: rng.standard_normal(inputs[k].shape) for k in floats}
    h = 1e-6
    moved = [run(f64, {k: v + s * h * direction[k] if k in direction else v for k, v in inputs.items()})[0]
             for s in (1, -1)]  # fmt: skip
    with np.errstate(all="ignore"):
        want = float(moved[0] - moved[1]) / (2 * h)
    got = sum(float(np.sum(g * direction[k])) for k, g in zip(floats, grads))
    assume(np.isfinite(want))
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
