"""Benchmark gc against PyTorch eager, ONNX Runtime and NumPy on this machine's CPU.

    python tools/bench.py [--quick] [--only mlp,cnn,transformer,resnet,matmul,overhead,train] [--threads 2] [--json out.json]

Four measurements (docs/benchmarks.md explains each number):
  nets      median latency of the example nets and of a ResNet-18 exported from torch and imported with
            `gc import` (gc with weights as arguments and bound at compile time, torch eager, ONNX Runtime),
            every output first checked against gc's reference interpreter
  matmul    GFLOP/s of gc's matmul kernel vs NumPy's BLAS
  overhead  the fixed cost of one call: relu on tensor<16xf32> through each runtime
  train     the MLP's training step (examples/train_mlp.gir): forward and loss, then with every weight's
            gradient, then with the SGD update too, gc (@main, @main_grad, @train_step) vs torch eager
            (loss.backward()); backward = (with gradients) - (forward), against the forward it follows

Each framework runs in its own process (this script with --worker), one after the other, because the
thread pools of TVM, torch, ORT and OpenBLAS spin and fight over the cores when they share a process.
A shared machine drifts by tens of percent within minutes (the same conv kernel: 120 us, then 160 us),
so every benchmark runs in --rounds rounds, each framework once per round in a rotating order, right
after one another; a number is the median over the rounds of each round's median.
The torch and ONNX models are translated from the same GIR module, so all see the same graph, weights
and inputs; a framework that is not installed shows "n/a".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GC_CACHE", "off")  # compile seconds are cold compiles, and builds keep their TIR
sys.path.insert(0, str(ROOT))

RTOL = 1e-3
# Sums of thousands of products cancel to values near zero, where only an absolute bound is meaningful:
# atol is RTOL times the largest magnitude of the reference output.
ATOL_SCALE = 1e-3
ALIGN = 64
MATMUL_SHAPES = [(1024, 1024, 1024), (64, 784, 1024), (64, 1024, 1024), (64, 1024, 10)]
GROUPS = ["mlp", "cnn", "transformer", "resnet", "matmul", "overhead", "train"]
# The kinds of benchmark each worker (framework) takes part in.
WORKERS = {"gc": {"net", "matmul", "overhead", "train"}, "torch": {"net", "overhead", "train"}, "ort": {"net", "overhead"},
           "numpy": {"matmul"}}
NET_COLUMNS = [("gc", "gc args"), ("gc-params", "gc params"), ("torch", "torch eager"), ("ort", "onnxruntime")]

RELU_GIR = """func @main(%x: tensor<16xf32>) -> tensor<16xf32> {
  %y = graph.relu(%x) : tensor<16xf32>
  return %y
}
"""


# --- what to run ------------------------------------------------------------------------------------------


def with_batch(text: str, n: int) -> str:
    """The CNN at batch n: every activation type starts with the batch dimension 1, no weight type does."""
    return re.sub(r"tensor<1x", f"tensor<{n}x", text)


def matmul_gir(m: int, k: int, n: int) -> str:
    return (f"func @main(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32> {{\n"
            f"  %c = graph.matmul(%a, %b) : tensor<{m}x{n}xf32>\n  return %c\n}}\n")


def benches() -> list[dict]:
    """Every benchmark: name, group, kind (net, matmul, overhead), GIR text and the data arguments."""
    mlp, cnn, transformer = ((ROOT / "examples" / f).read_text() for f in ("mlp.gir", "cnn.gir", "transformer.gir"))
    out = [
        {"name": "mlp-b64", "group": "mlp", "kind": "net", "gir": mlp},
        {"name": "cnn-b1", "group": "cnn", "kind": "net", "gir": cnn},
        {"name": "cnn-b16", "group": "cnn", "kind": "net", "gir": with_batch(cnn, 16)},
        {"name": "transformer", "group": "transformer", "kind": "net", "gir": transformer},
        # Exported from torch and imported with `gc import` when selected (make_inputs), so torch is needed.
        {"name": "resnet18-onnx-b1", "group": "resnet", "kind": "net", "gir": None, "onnx": "resnet18"},
    ]
    for m, k, n in MATMUL_SHAPES:
        out.append({"name": f"matmul-{m}x{k}x{n}", "group": "matmul", "kind": "matmul", "gir": matmul_gir(m, k, n),
                    "flop": 2 * m * k * n})
    out.append({"name": "relu-16", "group": "overhead", "kind": "overhead", "gir": RELU_GIR})
    out.append({"name": "train-mlp-b64", "group": "train", "kind": "train",
                "gir": (ROOT / "examples" / "train_mlp.gir").read_text()})
    for b in out:
        b["data"] = {"matmul": ["a", "b"], "train": ["x", "labels"]}.get(b["kind"], ["x"])
    return out


RESNET_HW = 224


def resnet18_onnx(seed: int) -> tuple[str, dict[str, np.ndarray]]:
    """A ResNet-18 (torchvision's layout; random weights and batch-norm statistics) at batch 1, exported with
    torch.onnx (which folds batch norm into the convolutions) and imported with gc import: GIR and weights."""
    import io
    import warnings

    import onnx
    import torch
    from torch import nn

    from compiler.importers.onnx import import_onnx

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.down(x))

    torch.manual_seed(seed)
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    for cin, cout, stride in [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]:
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                for t, lo, hi in ((m.weight, 0.5, 1.5), (m.bias, -0.1, 0.1), (m.running_mean, -0.1, 0.1),
                                  (m.running_var, 0.5, 1.5)):
                    t.uniform_(lo, hi)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated; dynamo's needs onnxscript
        torch.onnx.export(net, (torch.zeros(1, 3, RESNET_HW, RESNET_HW),), f, dynamo=False, input_names=["x"],
                          output_names=["y"])
    imported = import_onnx(onnx.load_from_string(f.getvalue()), gir_name="resnet18.gir")
    return imported.text, imported.weights


def make_inputs(b: dict, tmp: Path, seed: int) -> None:
    """Inputs (seeded; weights scaled by fan-in) and the reference interpreter's output, saved for the workers."""
    import compiler
    from compiler.inputs import random_inputs

    weights = {}
    if b.get("onnx") == "resnet18":
        b["gir"], weights = resnet18_onnx(seed)
    module = compiler.parse(b["gir"], b["name"])
    inputs = {**random_inputs(module["main"], seed, module), **weights}
    stem = tmp / re.sub(r"\W", "_", b["name"])
    np.savez(f"{stem}.inputs.npz", **inputs)
    b["inputs"] = f"{stem}.inputs.npz"
    if b["kind"] == "train":
        b["expected"] = f"{stem}.expected.npz"
        np.savez(b["expected"], **train_expected(module, inputs, b["data"]))
        return
    np.save(f"{stem}.expected.npy", compiler.run(module, inputs)[0])
    b["expected"] = f"{stem}.expected.npy"


TRAIN_LR = 0.1


def train_functions(module, data: list[str]) -> list[str]:
    """Add @main_grad (loss, every weight's gradient) and @train_step (loss, the weights after one SGD step)
    to the loss function @main; the weights' names."""
    from compiler.pipeline import run_pipeline

    weights = [a.name for a in module["main"].args if a.name not in data]
    run_pipeline(module, f"make-train-step{{lr={TRAIN_LR}}},autodiff{{wrt={','.join(weights)}}}")
    return weights


def train_expected(module, inputs: dict[str, np.ndarray], data: list[str]) -> dict[str, np.ndarray]:
    """The reference interpreter's loss, gradients (grad_NAME) and updated weights (new_NAME)."""
    import compiler

    weights = train_functions(module, data)
    loss, *grads = compiler.run(module, inputs, entry="main_grad")
    _, *new = compiler.run(module, inputs, entry="train_step")
    return {"loss": loss, **{f"grad_{k}": g for k, g in zip(weights, grads)},
            **{f"new_{k}": w for k, w in zip(weights, new)}}


# --- timing -----------------------------------------------------------------------------------------------


def measure(fn: Callable[[], object], quick: bool) -> dict:
    """Median seconds per call after a warm-up; tiny calls are timed in batches so the clock's cost vanishes."""
    budget, min_reps, max_reps = (0.3, 3, 100) if quick else (2.0, 10, 1000)
    t0 = time.perf_counter()
    calls = 0
    while calls < 1 or (time.perf_counter() - t0 < budget / 10) or (calls < 3 and time.perf_counter() - t0 < budget):
        fn()
        calls += 1
    per_call = (time.perf_counter() - t0) / calls
    inner = max(1, int(1e-3 / per_call))  # each sample at least ~1 ms
    # Calls slower than the whole budget get 3 repeats: a median still, without minutes per number.
    reps = int(min(max(budget / (per_call * inner), min_reps), max_reps)) if per_call < budget else 3
    samples = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t) / inner / 1e9)
    return {"seconds": statistics.median(samples), "reps": reps, "calls_per_rep": inner,
            "min_seconds": min(samples)}


def aligned(a: np.ndarray) -> np.ndarray:
    """A 64-byte aligned copy: gc passes aligned inputs zero-copy and copies others, which is not what we time."""
    buf = np.empty(a.nbytes + ALIGN, np.uint8)
    off = -buf.ctypes.data % ALIGN
    out = buf[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def check(got: np.ndarray, expected: np.ndarray) -> float:
    """The largest error relative to the output's scale; raises if beyond rtol/atol."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        raise ValueError(f"wrong result shape {list(got.shape)}, expected {list(expected.shape)}")
    scale = float(np.abs(expected).max()) or 1.0
    err = float(np.abs(got.astype(np.float64) - expected).max()) / scale
    if not np.allclose(got, expected, rtol=RTOL, atol=ATOL_SCALE * scale):
        raise ValueError(f"wrong result: max error {err:.2e} of the output's scale {scale:.3g} (rtol {RTOL})")
    return err


# --- GIR -> torch function and ONNX graph ------------------------------------------------------------------


class Unsupported(Exception):
    pass


def _ident(v, names: dict, prefix: str = "v") -> str:
    """A fresh identifier per value (GIR names need not be Python's)."""
    return names.setdefault(v, f"{prefix}{len(names)}")


def _pads2(op) -> tuple[int, int]:
    top, left, bottom, right = op.attrs.get("padding", (0, 0, 0, 0))
    if (top, left) != (bottom, right):
        raise Unsupported(f"{op.name} with asymmetric padding {[top, left, bottom, right]}")
    return top, left


_TORCH_UNARY = {"relu": "torch.relu", "exp": "torch.exp", "log": "torch.log", "tanh": "torch.tanh",
                "sigmoid": "torch.sigmoid", "sqrt": "torch.sqrt", "neg": "torch.neg", "abs": "torch.abs",
                "erf": "torch.erf", "rsqrt": "torch.rsqrt", "reciprocal": "torch.reciprocal"}
_TORCH_BINARY = {"add": "torch.add", "sub": "torch.sub", "mul": "torch.mul", "div": "torch.div",
                 "maximum": "torch.maximum", "minimum": "torch.minimum", "pow": "torch.pow",
                 "matmul": "torch.matmul"}


def torch_expr(op, xs: list[str], const: Callable[[np.ndarray], str]) -> str:
    """One gc op as a torch expression over the operand names `xs` (ONNX semantics, as gc's)."""
    kind, a = op.name.removeprefix("graph."), op.attrs
    if kind in _TORCH_UNARY:
        return f"{_TORCH_UNARY[kind]}({xs[0]})"
    if kind in _TORCH_BINARY:
        return f"{_TORCH_BINARY[kind]}({xs[0]}, {xs[1]})"
    if kind == "constant":
        return const(a["value"].array)
    if kind == "softmax_cross_entropy":
        return f"F.cross_entropy({xs[0]}, {xs[1]}.long())"
    if kind == "mse_loss":
        return f"F.mse_loss({xs[0]}, {xs[1]})"
    if kind == "gelu":
        return f"F.gelu({xs[0]}, approximate={a['approximate']!r})"
    if kind in ("softmax", "log_softmax"):
        return f"torch.{kind}({xs[0]}, {a['axis']})"
    if kind in ("reshape", "flatten"):
        return f"torch.reshape({xs[0]}, {tuple(op.results[0].type.shape)})"
    if kind == "transpose":
        perm = a.get("perm") or tuple(reversed(range(op.operands[0].type.rank)))
        return f"{xs[0]}.permute({tuple(perm)})"
    if kind == "layer_norm":
        shape = op.operands[0].type.shape[a["axis"] :]
        return f"F.layer_norm({xs[0]}, {tuple(shape)}, {xs[1]}, {xs[2]}, {a['epsilon']})"
    if kind == "batch_norm":
        return f"F.batch_norm({xs[0]}, {xs[3]}, {xs[4]}, {xs[1]}, {xs[2]}, False, 0.0, {a['epsilon']})"
    if kind == "conv2d":
        bias = xs[2] if len(xs) > 2 else None
        return (f"F.conv2d({xs[0]}, {xs[1]}, {bias}, {tuple(a['strides'])}, {_pads2(op)}, "
                f"{tuple(a['dilations'])}, {a['groups']})")
    if kind in ("max_pool2d", "avg_pool2d"):
        k = tuple(a["kernel"])
        s = tuple(a.get("strides") or k)
        if kind == "max_pool2d":
            return f"F.max_pool2d({xs[0]}, {k}, {s}, {_pads2(op)}, 1, {a['ceil_mode']})"
        return f"F.avg_pool2d({xs[0]}, {k}, {s}, {_pads2(op)}, {a['ceil_mode']}, {a['count_include_pad']})"
    if kind == "global_avg_pool2d":
        return f"F.adaptive_avg_pool2d({xs[0]}, 1)"
    if kind == "concat":
        return f"torch.cat([{', '.join(xs)}], {a['axis']})"
    raise Unsupported(f"no torch translation for {op.name}")


def to_torch(module, weights: dict, data: list[str]) -> Callable:
    """@main as straight-line torch code (generated source, so no interpreter loop is timed); weights captured."""
    import torch
    import torch.nn.functional as F

    f = module["main"]
    if len(f.results) != 1:
        raise Unsupported(f"@main has {len(f.results)} results; the benchmark compares one")
    names: dict = {}
    consts: list = []

    def const(arr: np.ndarray) -> str:
        consts.append(torch.from_numpy(np.array(arr)))
        return f"C[{len(consts) - 1}]"

    lines = []
    for arg in f.args:
        if arg.name not in data:
            lines.append(f"    {_ident(arg, names)} = W[{arg.name!r}]")
    for op in f.ops:
        if len(op.results) != 1:
            raise Unsupported(f"no torch translation for {op.name} with {len(op.results)} results")
        expr = torch_expr(op, [_ident(v, names) for v in op.operands], const)
        lines.append(f"    {_ident(op.results[0], names)} = {expr}")
    params = ", ".join(_ident(a, names) for a in f.args if a.name in data)
    source = f"def net({params}):\n" + "\n".join(lines) + f"\n    return {_ident(f.results[0], names)}\n"
    # Weights may come as tensors already (the training benchmark's require gradients).
    w = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(v) for k, v in weights.items()}
    scope = {"torch": torch, "F": F, "C": consts, "W": w}
    exec(compile(source, "<gir->torch>", "exec"), scope)
    return scope["net"]


_ONNX_SIMPLE = {"relu": "Relu", "exp": "Exp", "log": "Log", "tanh": "Tanh", "sigmoid": "Sigmoid", "sqrt": "Sqrt",
                "neg": "Neg", "abs": "Abs", "erf": "Erf", "reciprocal": "Reciprocal", "add": "Add", "sub": "Sub",
                "mul": "Mul", "div": "Div", "pow": "Pow", "maximum": "Max", "minimum": "Min", "matmul": "MatMul",
                "global_avg_pool2d": "GlobalAveragePool"}
ONNX_OPSET = 20  # Gelu is an ONNX op from opset 20
ONNX_IR_VERSION = 9


def onnx_nodes(op, xs: list[str], y: str, inits: list) -> list:
    """One gc op as ONNX nodes (gc's ops have ONNX's semantics, so this is mostly renaming)."""
    from onnx import helper, numpy_helper

    kind, a = op.name.removeprefix("graph."), op.attrs
    node = lambda name, ins, **attrs: [helper.make_node(name, ins, [y], **attrs)]  # noqa: E731
    if kind in _ONNX_SIMPLE:
        return node(_ONNX_SIMPLE[kind], xs)
    if kind == "constant":
        inits.append(numpy_helper.from_array(np.array(a["value"].array), y))
        return []
    if kind == "gelu":
        return node("Gelu", xs, approximate=a["approximate"])
    if kind in ("softmax", "log_softmax"):
        return node("Softmax" if kind == "softmax" else "LogSoftmax", xs, axis=a["axis"])
    if kind in ("reshape", "flatten"):
        inits.append(numpy_helper.from_array(np.array(op.results[0].type.shape, np.int64), y + "_shape"))
        return node("Reshape", [xs[0], y + "_shape"])
    if kind == "transpose":
        perm = a.get("perm") or tuple(reversed(range(op.operands[0].type.rank)))
        return node("Transpose", xs, perm=list(perm))
    if kind == "layer_norm":
        return node("LayerNormalization", xs, axis=a["axis"], epsilon=a["epsilon"])
    if kind == "batch_norm":
        return node("BatchNormalization", xs, epsilon=a["epsilon"])
    if kind == "conv2d":
        return node("Conv", xs, kernel_shape=list(op.operands[1].type.shape[2:]), strides=list(a["strides"]),
                    pads=list(a["padding"]), dilations=list(a["dilations"]), group=a["groups"])
    if kind in ("max_pool2d", "avg_pool2d"):
        k = list(a["kernel"])
        attrs = {"kernel_shape": k, "strides": list(a.get("strides") or k), "pads": list(a["padding"]),
                 "ceil_mode": int(a["ceil_mode"])}
        if kind == "avg_pool2d":
            return node("AveragePool", xs, count_include_pad=int(a["count_include_pad"]), **attrs)
        return node("MaxPool", xs, **attrs)
    raise Unsupported(f"no ONNX translation for {op.name}")


def to_onnx(module, weights: dict[str, np.ndarray], data: list[str]) -> bytes:
    """@main as an ONNX model: data arguments are graph inputs, weights are initializers (ORT's usual form)."""
    import onnx
    from onnx import helper, numpy_helper

    f = module["main"]
    names: dict = {a: a.name for a in f.args}  # the session is fed by argument name
    inits = [numpy_helper.from_array(weights[a.name], a.name) for a in f.args if a.name not in data]

    def info(v) -> object:
        elem = helper.np_dtype_to_tensor_dtype(v.type.dtype.np)
        return helper.make_tensor_value_info(names[v], elem, list(v.type.shape))

    nodes = []
    for op in f.ops:
        if len(op.results) != 1:
            raise Unsupported(f"no ONNX translation for {op.name} with {len(op.results)} results")
        nodes += onnx_nodes(op, [names[v] for v in op.operands], _ident(op.results[0], names, "gc:"), inits)
    graph = helper.make_graph(nodes, "main", [info(a) for a in f.args if a.name in data],
                              [info(v) for v in f.results], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    onnx.checker.check_model(model)
    return model.SerializeToString()


# --- workers: one framework each, in its own process --------------------------------------------------------


def load_bench(b: dict) -> tuple[object, dict[str, np.ndarray], np.ndarray]:
    """The module, its inputs, and the expected output (for training, a dict of every expected array)."""
    import compiler

    with np.load(b["inputs"]) as z:
        inputs = {k: z[k] for k in z.files}
    expected = np.load(b["expected"])
    if isinstance(expected, np.lib.npyio.NpzFile):
        with expected as z:
            expected = {k: z[k] for k in z.files}
    return compiler.parse(b["gir"], b["name"]), inputs, expected


def timed(fn: Callable[[], object], first: object, expected: np.ndarray, quick: bool, **extra) -> dict:
    """Check the first result, then time: a wrong answer is reported, never timed."""
    err = check(first, expected)
    return {**measure(fn, quick), "max_err": err, **extra}


def run_gc(b: dict, quick: bool) -> dict:
    """gc with the weights as arguments and, for the nets, bound at compile time; each variant on its own."""
    if b["kind"] == "train":
        return gc_train(b, quick)
    module, inputs, expected = load_bench(b)
    if b["kind"] == "matmul":
        return {"gc": gc_kernel_only(b, [aligned(inputs[a.name]) for a in module["main"].args], expected, quick)}
    out = {"gc": attempt(lambda: gc_model(b, inputs, expected, quick, None))}
    if b["kind"] == "net":
        weights = {k: v for k, v in inputs.items() if k not in b["data"]}
        out["gc-params"] = attempt(lambda: gc_model(b, inputs, expected, quick, weights))
    return out


def brief(e: Exception) -> str:
    """An exception on one line, short enough for a report (the traceback went to stderr)."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= 240 else text[:237] + "..."


def attempt(fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (one variant failing must not hide the other)
        traceback.print_exc()
        return {"error": brief(e)}


def gc_model(b: dict, inputs: dict[str, np.ndarray], expected: np.ndarray, quick: bool, params) -> dict:
    """Compile (binding `params` if given) and time calls of the CompiledModel on aligned inputs."""
    import compiler

    t = time.perf_counter()
    model = compiler.compile(b["gir"], "llvm", params=params)
    compile_s = time.perf_counter() - t
    args = [aligned(inputs[k]) for k in model.arg_names]
    return timed(lambda: model(*args), model(*args)[0], expected, quick, compile_s=compile_s,
                 kernels=model.num_kernels)


def gc_kernel_only(b: dict, args: list[np.ndarray], expected: np.ndarray, quick: bool) -> dict:
    """The compiled kernels called directly on preallocated TVM tensors, without CompiledModel's per-call
    Python; through CompiledModel if the plan's layout is not the one this understands."""
    import compiler

    model = compiler.compile(b["gir"], "llvm")
    try:
        run, result = _direct_calls(model, args)
        run()
        return timed(run, result.numpy(), expected, quick, kernels=model.num_kernels, path="kernels")
    except Exception:  # noqa: BLE001 (a wrong result the model also gives is reported below)
        traceback.print_exc()
    return timed(lambda: model(*args), model(*args)[0], expected, quick, kernels=model.num_kernels,
                 path="CompiledModel")


def _direct_calls(model, args: list[np.ndarray]) -> tuple[Callable[[], None], object]:
    """A function running every kernel of the plan on its own buffers, and the result's buffer."""
    import tvm

    from compiler.ir import DType

    plan, dev = model.plan, tvm.cpu(0)
    bufs = []
    for buf in plan.buffers:
        if buf.kind == "arg":
            bufs.append(tvm.runtime.tensor(args[buf.index], dev))
        elif buf.kind == "const":
            bufs.append(tvm.runtime.tensor(model.consts[buf.name], dev))
        else:
            bufs.append(tvm.runtime.empty(buf.shape, DType(buf.dtype).tvm, dev))
    calls = [(model.lib[c.kernel], [bufs[i] for i in c.buffers]) for c in plan.kernel_steps]

    def run() -> None:
        for fn, xs in calls:
            fn(*xs)

    return run, bufs[plan.results[0]]


# The three functions of the training benchmark: what each computes, and the expected arrays it returns.
TRAIN_VARIANTS = [("forward", "main", ["loss"]), ("grad", "main_grad", ["loss", "grad_"]),
                  ("step", "train_step", ["loss", "new_"])]


def _train_keys(prefixes: list[str], weights: list[str]) -> list[str]:
    return [k for p in prefixes for k in ([p] if not p.endswith("_") else [p + w for w in weights])]


def timed_all(fn: Callable[[], object], got: list, expected: list[np.ndarray], quick: bool, **extra) -> dict:
    """timed() for functions with several results: all are checked first."""
    err = max(check(g, e) for g, e in zip(got, expected))
    return {**measure(fn, quick), "max_err": err, **extra}


def gc_train(b: dict, quick: bool) -> dict:
    """@main (forward and loss), @main_grad (and every gradient), @train_step (and the SGD update), each
    compiled on its own and called with preallocated results (as a training loop would: no allocation)."""
    import compiler

    module, inputs, expected = load_bench(b)
    weights = train_functions(module, b["data"])

    def variant(entry: str, keys: list[str]) -> dict:
        t = time.perf_counter()
        model = compiler.compile(module, "llvm", entry=entry)
        compile_s = time.perf_counter() - t
        args = [aligned(inputs[k]) for k in model.arg_names]
        outs = [aligned(np.empty_like(expected[k])) for k in keys]
        return timed_all(lambda: model.run_into(outs, *args), model(*args), [expected[k] for k in keys], quick,
                         compile_s=compile_s, kernels=model.num_kernels)

    return {f"gc-{name}": attempt(partial(variant, entry, _train_keys(keys, weights)))
            for name, entry, keys in TRAIN_VARIANTS}


def torch_train(b: dict, quick: bool) -> dict:
    """The same three computations in torch eager: forward under no_grad, loss.backward(), and an in-place
    SGD update of the weights (which then drift from step to step: the timing does not depend on them)."""
    import torch

    module, inputs, expected = load_bench(b)
    names = [a.name for a in module["main"].args if a.name not in b["data"]]
    weights = {k: torch.from_numpy(inputs[k].copy()).requires_grad_() for k in names}
    net = to_torch(module, weights, b["data"])
    xs = [torch.from_numpy(inputs[k]) for k in b["data"]]
    ws = list(weights.values())

    def forward() -> list:
        with torch.no_grad():
            return [net(*xs)]

    def grad() -> list:
        for w in ws:
            w.grad = None
        loss = net(*xs)
        loss.backward()
        return [loss.detach(), *(w.grad for w in ws)]

    def step() -> list:
        loss = grad()[0]
        with torch.no_grad():
            for w in ws:
                w.add_(w.grad, alpha=-TRAIN_LR)
        return [loss, *(w.detach() for w in ws)]

    def variant(fn: Callable[[], list], keys: list[str]) -> dict:
        want = [expected[k] for k in _train_keys(keys, names)]
        return timed_all(fn, [t.numpy().copy() for t in fn()], want, quick)

    return {f"torch-{name}": attempt(partial(variant, fn, keys))
            for (name, _, keys), fn in zip(TRAIN_VARIANTS, (forward, grad, step))}


def run_torch(b: dict, quick: bool) -> dict:
    import torch

    if b["kind"] == "train":
        return torch_train(b, quick)
    module, inputs, expected = load_bench(b)
    weights = {k: v for k, v in inputs.items() if k not in b["data"]}
    net = to_torch(module, weights, b["data"])
    xs = [inputs[k] for k in b["data"]]

    call = lambda: net(*[torch.from_numpy(x) for x in xs]).numpy()  # noqa: E731
    with torch.inference_mode():  # entered once: its own cost is not the model's
        return {"torch": timed(call, call(), expected, quick)}


def run_ort(b: dict, quick: bool, threads: int) -> dict:
    import onnxruntime as ort

    module, inputs, expected = load_bench(b)
    weights = {k: v for k, v in inputs.items() if k not in b["data"]}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(to_onnx(module, weights, b["data"]), opts, providers=["CPUExecutionProvider"])
    feeds = {k: inputs[k] for k in b["data"]}
    call = lambda: sess.run(None, feeds)[0]  # noqa: E731
    return {"ort": timed(call, call(), expected, quick)}


def run_numpy(b: dict, quick: bool) -> dict:
    _, inputs, expected = load_bench(b)
    a, w = inputs["a"], inputs["b"]
    c = np.empty(expected.shape, np.float32)
    call = lambda: np.matmul(a, w, out=c)  # noqa: E731
    return {"numpy": timed(call, call(), expected, quick)}


def versions(worker: str) -> dict[str, str]:
    if worker == "gc":
        import tvm

        from compiler.codegen.target import host_cpu

        return {"tvm": tvm.__version__, "llvm_cpu": host_cpu(), "tvm_threads": str(tvm.runtime.num_threads())}
    if worker == "torch":
        import torch

        return {"torch": torch.__version__, "torch_threads": str(torch.get_num_threads())}
    if worker == "ort":
        import onnx
        import onnxruntime

        return {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__}
    return {"numpy": np.__version__}


def worker_main(worker: str, tmp: Path, bench: str, round_: int) -> None:
    """Run this worker's part of one benchmark, and save the result."""
    job = json.loads((tmp / "job.json").read_text())
    result_path = tmp / f"result-{worker}-{bench}-{round_}.json"
    result: dict = {"versions": {}, "benches": {}}
    try:
        if worker == "torch":
            import torch

            torch.set_num_threads(job["threads"])
        result["versions"] = versions(worker)
    except ImportError as e:
        result["unavailable"] = f"{e.name or e} is not installed"
        result_path.write_text(json.dumps(result))
        return
    run: Callable[[dict], dict] = {
        "gc": lambda b: run_gc(b, job["quick"]),
        "torch": lambda b: run_torch(b, job["quick"]),
        "ort": lambda b: run_ort(b, job["quick"], job["threads"]),
        "numpy": lambda b: run_numpy(b, job["quick"]),
    }[worker]
    for b in (b for b in job["benches"] if b["name"] == bench):
        try:
            result["benches"][b["name"]] = run(b)
        except Unsupported as e:
            result["benches"][b["name"]] = {"n/a": str(e)}
        except Exception as e:  # noqa: BLE001 (one failing benchmark must not hide the others)
            traceback.print_exc()
            result["benches"][b["name"]] = {"error": brief(e)}
        result_path.write_text(json.dumps(result))


# --- the parent: run the workers, print the tables -----------------------------------------------------------


def run_workers(job: dict, tmp: Path) -> dict[str, dict]:
    """Per benchmark and round, each framework in a process of its own with the thread counts pinned, one
    after the other (the order rotating from round to round); the rounds' results merged per framework."""
    n = str(job["threads"])
    env = {**os.environ, "TVM_NUM_THREADS": n, "OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
           "MKL_NUM_THREADS": n}
    results: dict[str, dict] = {}
    rounds: dict[tuple[str, str], list] = {}
    for b in (b for b in job["benches"] if "setup_error" not in b):
        workers = [w for w, takes in WORKERS.items() if b["kind"] in takes]
        for r in range(job["rounds"]):
            for w in workers[r % len(workers):] + workers[: r % len(workers)]:
                if "unavailable" in results.get(w, {}):
                    continue
                print(f"  {w}: {b['name']} (round {r + 1} of {job['rounds']})", file=sys.stderr, flush=True)
                proc = subprocess.run([sys.executable, __file__, "--worker", w, "--dir", str(tmp), "--bench", b["name"],
                                       "--round", str(r)], env=env)
                path = tmp / f"result-{w}-{b['name']}-{r}.json"
                got = json.loads(path.read_text()) if path.exists() else {"benches": {}}
                res = results.setdefault(w, {"versions": got.get("versions", {}), "benches": {}})
                if "unavailable" in got:
                    res["unavailable"] = got["unavailable"]
                elif proc.returncode != 0:
                    res["crashed"] = f"the {w} worker exited with status {proc.returncode}"
                elif b["name"] in got["benches"]:
                    rounds.setdefault((w, b["name"]), []).append(got["benches"][b["name"]])
    for (w, name), entries in rounds.items():
        results[w]["benches"][name] = merge_rounds(entries)
    return results


def merge_rounds(entries: list):
    """One result from several rounds': each timing the median of the rounds' medians (the best sample and
    every round's median kept beside it); anything else as the first round had it."""
    first = entries[0]
    if not isinstance(first, dict):
        return first
    if "seconds" in first:
        secs = [e["seconds"] for e in entries if isinstance(e, dict) and "seconds" in e]
        mins = [e.get("min_seconds", e["seconds"]) for e in entries if isinstance(e, dict) and "seconds" in e]
        return {**first, "seconds": statistics.median(secs), "min_seconds": min(mins), "round_seconds": secs}
    return {k: merge_rounds([e.get(k, v) if isinstance(e, dict) else v for e in entries]) for k, v in first.items()}


def cell(b: dict, variant: str, results: dict) -> dict:
    """One framework's entry for one benchmark: timings, or n/a / error with the reason."""
    if "setup_error" in b:
        return {"error": b["setup_error"]}
    worker = variant.split("-")[0]  # gc-params, torch-grad: the worker that measured it
    r = results.get(worker, {})
    if "unavailable" in r:
        return {"n/a": r["unavailable"]}
    entry = r.get("benches", {}).get(b["name"])
    if entry is None:
        return {"error": r.get("crashed", "not run")}
    if "n/a" in entry or "error" in entry:
        return entry
    return entry.get(variant, {"n/a": "not measured"})


def fmt(v: float) -> str:
    return f"{v:#.3g}" if v < 100 else f"{v:.0f}"


def show(c: dict, scale: float) -> str:
    """A cell: seconds times `scale` (1e3 for ms, 1e6 for µs), or why there is no number."""
    if "seconds" in c:
        return fmt(c["seconds"] * scale)
    return "n/a" if "n/a" in c else "error"


def ratio(c: dict, others: list[dict]) -> str:
    best = min((o["seconds"] for o in others if "seconds" in o), default=None)
    if "seconds" not in c or not best:
        return "-"
    r = c["seconds"] / best
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def report(job: dict, results: dict) -> tuple[str, list[dict], list[str]]:
    """The three tables, the records for --json, and the problems (errors, wrong results) found."""
    records, problems, parts = [], [], []
    by_kind = {k: [b for b in job["benches"] if b["kind"] == k] for k in ("net", "matmul", "overhead", "train")}
    for b in job["benches"]:
        variants = {"net": [v for v, _ in NET_COLUMNS], "matmul": ["gc", "numpy"], "overhead": ["gc", "torch", "ort"],
                    "train": [f"{w}-{n}" for w in ("gc", "torch") for n, _, _ in TRAIN_VARIANTS]}
        cells = {v: cell(b, v, results) for v in variants[b["kind"]]}
        records.append({"name": b["name"], "group": b["group"], "kind": b["kind"], "results": cells})
        b["cells"] = cells
        for v, c in cells.items():
            if "error" in c:
                problems.append(f"{b['name']}, {v}: {c['error']}")
    if by_kind["net"]:
        rows = []
        for b in by_kind["net"]:
            c = b["cells"]
            others = [c["torch"], c["ort"]]
            rows.append([b["name"], *(show(c[v], 1e3) for v, _ in NET_COLUMNS), ratio(c["gc"], others),
                         ratio(c["gc-params"], others)])
        head = ["net", *(f"{t} ms" for _, t in NET_COLUMNS), "gc args / best", "gc params / best"]
        parts.append("Latency (median ms per call; ratio = gc / best of torch and onnxruntime, > 1: gc slower)\n"
                     + table(head, rows))
    if by_kind["matmul"]:
        rows = []
        for b in by_kind["matmul"]:
            c = b["cells"]
            gf = lambda x: fmt(b["flop"] / x["seconds"] / 1e9) if "seconds" in x else show(x, 1)  # noqa: E731
            rows.append([b["name"].removeprefix("matmul-"), f"{b['flop'] / 1e9:.3g}", gf(c["gc"]), gf(c["numpy"]),
                         ratio(c["gc"], [c["numpy"]])])
            for x in c.values():
                if "seconds" in x:
                    x["gflops"] = b["flop"] / x["seconds"] / 1e9
        parts.append("Matmul kernel (f32, GFLOP/s; ratio = gc time / numpy time)\n"
                     + table(["MxKxN", "GFLOP", "gc GFLOP/s", "numpy GFLOP/s", "gc / numpy"], rows))
    if by_kind["overhead"]:
        rows = []
        for b in by_kind["overhead"]:
            c = b["cells"]
            rows.append([b["name"], show(c["gc"], 1e6), show(c["torch"], 1e6), show(c["ort"], 1e6),
                         ratio(c["gc"], [c["torch"], c["ort"]])])
        parts.append("Per-call overhead (median µs for a 1-op model; ratio = gc / best of others)\n"
                     + table(["model", "gc µs", "torch eager µs", "onnxruntime µs", "gc / best"], rows))
    if by_kind["train"]:
        parts.append(train_table(by_kind["train"]))
    notes = [f"{w}: {r['unavailable']}" for w, r in results.items() if "unavailable" in r]
    notes += [f"{b['name']}, {v}: {c['n/a']}" for b in job["benches"] for v, c in b["cells"].items()
              if "n/a" in c and "not installed" not in c["n/a"]]
    compile_s = [f"{b['name']} {v} {b['cells'][v]['compile_s']:.1f} s" for b in by_kind["net"]
                 for v in ("gc", "gc-params") if "compile_s" in b["cells"][v]]
    if compile_s:
        notes.append("gc compile time: " + ", ".join(compile_s))
    return "\n\n".join(parts) + ("\n\n" + "\n".join(notes) if notes else ""), records, problems


def train_table(benches: list[dict]) -> str:
    """Forward and loss, with every gradient, with the SGD update too; the backward pass is the difference
    of the first two, and its ratio to the forward pass is what a training compiler is judged by."""
    rows = []
    for b in benches:
        c = b["cells"]
        backs = {}
        for w, label in (("gc", "gc"), ("torch", "torch eager")):
            fwd, grad, step = (c[f"{w}-{n}"] for n, _, _ in TRAIN_VARIANTS)
            back = {"seconds": grad["seconds"] - fwd["seconds"]} if "seconds" in fwd and "seconds" in grad else {}
            backs[w] = back
            per_fwd = f"{back['seconds'] / fwd['seconds']:.2f}" if back else "-"
            rows.append([b["name"], label, show(fwd, 1e3), show(grad, 1e3), show(step, 1e3),
                         show(back, 1e3) if back else "-", per_fwd])
        rows.append([b["name"], "gc / torch", *(ratio(c[f"gc-{n}"], [c[f"torch-{n}"]]) for n, _, _ in TRAIN_VARIANTS),
                     ratio(backs["gc"], [backs["torch"]]), ""])
    head = ["net", "", "forward+loss ms", "+gradients ms", "+SGD update ms", "backward ms", "backward / forward"]
    return ("Training step (median ms; backward = (+gradients) - (forward+loss); ratio rows = gc / torch)\n"
            + table(head, rows))


def machine(threads: int, results: dict) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "threads": threads, "python": platform.python_version(), "os": platform.platform()}
    for r in results.values():
        info.update(r.get("versions", {}))
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="few repeats (about 0.3 s per measurement)")
    p.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups or names ({', '.join(GROUPS)})")
    p.add_argument("--threads", type=int, default=2, help="threads for every framework (default 2)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of every framework in turn, per benchmark (default 3; 1 with --quick)")
    p.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--bench", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main(args.worker, Path(args.dir), args.bench, args.round)
        return 0
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        p.error("--rounds must be at least 1")
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    selected = [b for b in benches() if b["group"] in wanted or b["name"] in wanted]
    unknown = wanted - {b["group"] for b in benches()} - {b["name"] for b in benches()}
    if unknown or not selected:
        names = ", ".join(dict.fromkeys(GROUPS + [b["name"] for b in benches()]))
        p.error(f"--only: unknown benchmark {sorted(unknown)[0] if unknown else ''!r}; choose from {names}")
    # Read before our workers start: their own threads would add to it.
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gc-bench-") as d:
        tmp = Path(d)
        for b in selected:
            try:
                make_inputs(b, tmp, args.seed)
            except Exception as e:  # noqa: BLE001 (a broken example must not stop the other benchmarks)
                b["setup_error"] = "preparing inputs: " + brief(e)
        job = {"benches": selected, "quick": args.quick, "threads": args.threads, "rounds": rounds}
        (tmp / "job.json").write_text(json.dumps(job))
        results = run_workers(job, tmp)
    text, records, problems = report(job, results)
    info = machine(args.threads, results)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"gc benchmarks, {date}: {info['cpu']}, {info['cores']} cores, {args.threads} threads per framework, "
          f"{rounds} round{'s' if rounds > 1 else ''}, load average {load:.1f} before"
          f"{', quick' if args.quick else ''}\n")
    print(text, flush=True)
    if load > info["cores"] / 2:
        print(f"warning: load average {load:.1f} on {info['cores']} cores before the run: other processes compete "
              "for the CPU, so these timings are unreliable", file=sys.stderr)
    for prob in problems:
        print(f"problem: {prob}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"date": date, "machine": info, "quick": args.quick, "rounds": rounds,
                                               "load_average": load, "rtol": RTOL, "results": records}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
