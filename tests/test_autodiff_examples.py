"""The examples' training losses, differentiated: against central differences in float64 on the interpreter,
against torch.autograd (when torch is importable) and compiled for llvm against the interpreter.

train_mlp.gir returns its loss; cnn.gir and transformer.gir get one here, the mean squared error of their
output against a target given as one more argument.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

import compiler
from compiler.builder import Builder, finish
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Module, Value
from compiler.parser import parse
from compiler.pipeline import run_pipeline

EXAMPLES = ["train_mlp", "cnn", "transformer"]


def training_loss(name: str, dtype: str = "f32") -> Module:
    """The example as a function of its weights returning a scalar loss (mse against %target if needed)."""
    path = ROOT / "examples" / f"{name}.gir"
    module = parse(path.read_text().replace("f32", dtype), str(path))
    f = module["main"]
    y = f.results[0]
    if y.type.rank:
        target = Value(y.type, "target")
        f.args.append(target)
        finish(f, Builder(f).mse_loss(y, target))
    return module


def directional_derivative(module: Module, inputs: dict[str, np.ndarray], direction: dict[str, np.ndarray]) -> float:
    h = 1e-6
    plus = {k: v + h * direction[k] if k in direction else v for k, v in inputs.items()}
    minus = {k: v - h * direction[k] if k in direction else v for k, v in inputs.items()}
    return float(run(module, plus)[0] - run(module, minus)[0]) / (2 * h)


# Arguments whose gradients are checked one by one (each costs two runs); all are checked together too.
SPOT_CHECKS = {
    "train_mlp": ["w1", "b3"],
    "cnn": ["x", "stem_w", "stem_v", "b1b_m", "b2s_w", "b3a_g", "fc_w", "target"],
    "transformer": ["ln1_g", "wq", "w1"],
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_gradients_match_central_differences_in_f64(name: str) -> None:
    module = training_loss(name, "f64")
    run_pipeline(module, "autodiff")
    f = module["main"]
    inputs = random_inputs(f, 0, module)
    floats = [a.name for a in f.args if a.type.dtype.is_float]
    grads = dict(zip(floats, run(module, inputs, "main_grad")[1:]))
    rng = np.random.default_rng(0)
    # Each direction has unit norm per argument, so every gradient counts about as much in the sum.
    unit = {k: rng.standard_normal(inputs[k].shape) / np.sqrt(inputs[k].size) for k in floats}
    checks = [unit] + [{k: unit[k]} for k in SPOT_CHECKS[name]]
    for direction in checks:
        want = directional_derivative(module, inputs, direction)
        got = sum(float(np.sum(grads[k] * d)) for k, d in direction.items())
        assert got == pytest.approx(want, rel=1e-5, abs=1e-8), sorted(direction)


# --- torch.autograd on the same graph ----------------------------------------------------------------


def torch_ops():
    """graph op -> its torch function (op, operands) for the ops of the examples, written from the GIR spec."""
    torch = pytest.importorskip("torch")
    fn = torch.nn.functional

    def conv2d(op, x, w, b=None):
        pt, pl, pb, pr = op.padding
        return fn.conv2d(fn.pad(x, (pl, pr, pt, pb)), w, b, op.strides, 0, op.dilations, op.groups)

    def batch_norm(op, x, scale, bias, mean, var):
        c = lambda v: v.reshape(1, -1, *[1] * (x.dim() - 2))
        return (x - c(mean)) / torch.sqrt(c(var) + op.epsilon) * c(scale) + c(bias)

    def pool(kind):
        def apply(op, x):
            assert not any(op.padding), "the examples pool without padding"
            kw = {} if kind == "max" else {"count_include_pad": op.count_include_pad}
            f = fn.max_pool2d if kind == "max" else fn.avg_pool2d
            return f(x, op.kernel, op.window_strides, ceil_mode=op.ceil_mode, **kw)

        return apply

    return {
        "graph.matmul": lambda op, a, b: torch.matmul(a, b),
        "graph.add": lambda op, a, b: a + b,
        "graph.mul": lambda op, a, b: a * b,
        "graph.relu": lambda op, x: torch.relu(x),
        "graph.gelu": lambda op, x: fn.gelu(x, approximate=op.approximate),
        "graph.softmax": lambda op, x: torch.softmax(x, op.axis),
        "graph.layer_norm": lambda op, x, g, b: fn.layer_norm(x, x.shape[op.axis % x.dim() :], g, b, op.epsilon),
        "graph.reshape": lambda op, x: x.reshape(op.results[0].type.shape),
        "graph.transpose": lambda op, x: x.permute(*op.perm),
        "graph.flatten": lambda op, x: torch.flatten(x, op.axis),
        "graph.conv2d": conv2d,
        "graph.batch_norm": batch_norm,
        "graph.max_pool2d": pool("max"),
        "graph.avg_pool2d": pool("avg"),
        "graph.global_avg_pool2d": lambda op, x: x.mean((2, 3), keepdim=True),
        "graph.softmax_cross_entropy": lambda op, x, labels: fn.cross_entropy(x, labels),
        "graph.mse_loss": lambda op, a, b: fn.mse_loss(a, b),
    }


def torch_gradients(module: Module, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """d loss / d each float argument of @main, by torch.autograd in float64."""
    import torch

    ops = torch_ops()
    f = module["main"]
    env: dict[Value, object] = {}
    for a in f.args:
        t = torch.tensor(np.asarray(inputs[a.name]))
        env[a] = t.double().requires_grad_() if a.type.dtype.is_float else t
    for op in f.ops:
        if op.name == "graph.constant":
            env[op.result] = torch.tensor(np.asarray(op.value.array, np.float64))
            continue
        env[op.result] = ops[op.name](op, *(env[v] for v in op.operands))
    env[f.results[0]].backward()
    return [env[a].grad.numpy() for a in f.args if a.type.dtype.is_float]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_gradients_match_torch_autograd(name: str) -> None:
    pytest.importorskip("torch")
    module = training_loss(name)
    run_pipeline(module, "autodiff")
    inputs = random_inputs(module["main"], 0, module)
    got = run(module, inputs, "main_grad")[1:]
    wants = torch_gradients(module, inputs)
    # A gradient that is 0 in exact arithmetic (the key bias: softmax ignores a shift per row) is rounding
    # noise in f32, so the absolute tolerance follows the largest gradient of all.
    scale = max(np.abs(w).max() for w in wants)
    for a, g, want in zip((a for a in module["main"].args if a.type.dtype.is_float), got, wants):
        np.testing.assert_allclose(g, want, rtol=1e-3, atol=1e-5 * scale, err_msg=a.name)


# --- compiled --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_grad_function_compiles_for_llvm_and_matches_the_interpreter(name: str) -> None:
    module = training_loss(name)
    run_pipeline(module, "autodiff")
    inputs = random_inputs(module["main"], 0, module)
    want = run(module, inputs, "main_grad")
    model = compiler.compile(module, "llvm", entry="main_grad")
    got = model(*(inputs[a.name] for a in module["main_grad"].args))
    scale = max(np.abs(w).max() for w in want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5 * scale)
