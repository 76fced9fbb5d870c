"""gc import for ONNX: every op the importer maps, checked against ONNX's own reference evaluator
(onnx.reference, independent of gc) on the interpreter; names, weights, comments and locations of the
written .gir; the diagnostics; the `gc import` command."""

from __future__ import annotations

import math
import os
import re
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.cli import main
from compiler.diagnostics import GCError
from compiler.importers.onnx import import_onnx
from compiler.importers.onnx_ops import CONVERTERS
from compiler.ir import DYN, Sym
from compiler.verifier import verify_module

RNG = np.random.default_rng(0)
F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def positive(*shape: int) -> np.ndarray:
    return RNG.uniform(0.5, 2.0, shape).astype(np.float32)


def ints(*values) -> np.ndarray:
    return np.array(values, np.int64)


def make_model(nodes, inputs: dict, outputs: list[str], opset: int = 17, inits: dict | None = None):
    """A model over `inputs` (name -> example array); outputs untyped, so gc's inferred types stand."""
    info = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        info,
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_both(model, feeds: dict) -> tuple[list, list]:
    """ONNX's reference evaluator and gc's interpreter on the imported module, same inputs."""
    expected = ReferenceEvaluator(model).run(None, feeds)
    imported = import_onnx(model)
    return expected, compiler.run(imported.module, {**feeds, **imported.weights})


def node(op: str, ins: list[str], outs: list[str] | None = None, **attrs):
    return helper.make_node(op, ins, outs or ["y"], **attrs)


def case(id: str, nodes, inputs: dict, opset: int = 17, inits: dict | None = None, outputs=("y",), expect=None):
    """One model; its expected outputs from ONNX's reference evaluator, or from `expect(**inputs, **inits)`
    where the evaluator is wrong (LRN, Softmax before opset 13) or lacks the case (groups in ConvTranspose)."""
    nodes = nodes if isinstance(nodes, list) else [nodes]
    return pytest.param(nodes, inputs, opset, inits or {}, list(outputs), expect, id=id)


def conv_transpose(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), out_pad=(0, 0), dil=(1, 1), group=1):
    """ConvTranspose by its definition: each input pixel scatters its kernel-weighted copy into the output."""
    n, c, h, wd = x.shape
    _, cog, kh, kw = w.shape
    full = (
        (h - 1) * strides[0] + (kh - 1) * dil[0] + 1 + out_pad[0],
        (wd - 1) * strides[1] + (kw - 1) * dil[1] + 1 + out_pad[1],
    )
    y = np.zeros((n, cog * group, *full))
    cg = c // group
    for ch in range(c):
        g = ch // cg
        for i in range(h):
            for j in range(wd):
                for p in range(kh):
                    for q in range(kw):
                        y[:, g * cog : (g + 1) * cog, i * strides[0] + p * dil[0], j * strides[1] + q * dil[1]] += (
                            x[:, ch, i, j][:, None] * w[ch, :, p, q][None, :]
                        )
    y = y[:, :, pads[0] : full[0] - pads[2], pads[1] : full[1] - pads[3]]
    return y + (b[None, :, None, None] if b is not None else 0)


def lrn(x, size, alpha, beta, bias):
    """ONNX LRN: channels floor((size-1)/2) before to ceil((size-1)/2) after, clipped at the edges."""
    c = x.shape[1]
    out = np.empty_like(x, dtype=np.float64)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c, ch + size // 2 + 1)
        square_sum = (x[:, lo:hi].astype(np.float64) ** 2).sum(axis=1)
        out[:, ch] = x[:, ch] / (bias + alpha / size * square_sum) ** beta
    return out


def lp_pool_2d(x, kernel, strides, pads, p, ceil=False):
    """LpPool by loops over the zero-padded input; a ceil-mode window past the end sums what it covers."""
    (kh, kw), (sh, sw) = kernel, strides
    z = np.pad(np.abs(x.astype(np.float64)) ** p, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    rnd = math.ceil if ceil else math.floor
    oh, ow = (rnd((z.shape[a] - k) / s) + 1 for a, k, s in ((2, kh, sh), (3, kw, sw)))
    y = np.array([[[[z[b, c, i * sh:i * sh + kh, j * sw:j * sw + kw].sum() for j in range(ow)] for i in range(oh)]
                   for c in range(x.shape[1])] for b in range(x.shape[0])])  # fmt: skip
    return [(y ** (1 / p)).astype(x.dtype)]


def softmax_rows(x, axis: int, log: bool = False):
    """Softmax before opset 13: x as [prod(shape[:axis]), prod(shape[axis:])], normalized along each row."""
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    z = rows - rows.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return (logp if log else np.exp(logp)).reshape(x.shape)


X = {"x": rand(2, 3, 4)}
IMG = {"x": rand(1, 4, 7, 6)}
SEQ = {"x": rand(1, 4, 9)}
VOL = {"x": rand(1, 4, 5, 6, 5)}

UNARY = [
    "Relu",
    "Sigmoid",
    "Tanh",
    "Softplus",
    "Erf",
    "Neg",
    "Abs",
    "Exp",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Sin",
    "Cos",
    "Softsign",
]

SPECIAL = np.array([[1.5, np.nan, np.inf], [-np.inf, 0.0, -0.0], [3.4e38, -1e-45, np.nan]], np.float32)

CASES = [
    *(case(op, node(op, ["x"]), X) for op in UNARY),
    case("Log", node("Log", ["x"]), {"x": positive(3, 4)}),
    case("Sqrt", node("Sqrt", ["x"]), {"x": positive(3, 4)}),
    case("LeakyRelu", node("LeakyRelu", ["x"], alpha=0.2), X),
    case("Elu", node("Elu", ["x"], alpha=0.5), X),
    case("Selu", node("Selu", ["x"]), X),
    case("Gelu", node("Gelu", ["x"]), X, opset=20),
    case("Gelu-tanh", node("Gelu", ["x"], approximate="tanh"), X, opset=20),
    case("HardSigmoid", node("HardSigmoid", ["x"], alpha=0.3, beta=0.4), X),
    case("HardSwish", node("HardSwish", ["x"]), {"x": rand(3, 4) * 4}),
    case("PRelu-channel", node("PRelu", ["x", "s"]), X, inits={"s": rand(3, 1)}),
    case("PRelu-opset6-per-channel", node("PRelu", ["x", "s"]), X, opset=6, inits={"s": rand(3)}),
    case("Clip-attributes-opset6", node("Clip", ["x"], min=-0.5, max=0.3), X, opset=6),
    case("Clip-inputs", node("Clip", ["x", "lo", "hi"]), X, inits={"lo": np.float32(-0.2), "hi": np.float32(0.4)}),
    case("Clip-max-only", node("Clip", ["x", "", "hi"]), X, inits={"hi": np.float32(0.1)}),
    *(case(op, node(op, ["x", "z"]), {"x": rand(2, 3, 4), "z": rand(3, 1)}) for op in ["Add", "Sub", "Mul", "Div"]),
    case("Pow", node("Pow", ["x", "z"]), {"x": positive(2, 3), "z": rand(3)}),
    case("Pow-int-exponent", node("Pow", ["x", "e"]), {"x": rand(2, 3)}, inits={"e": ints(2)}),
    *(case(op, node(op, ["x", "z"]), {"x": rand(3, 4), "z": rand(4)}) for op in ["Equal", "Less", "Greater"]),
    *(
        case(op, node(op, ["x", "z"]), {"x": np.array([1, np.nan, 3, 2], np.float32), "z": np.float32([1, 1, 4, 1])})
        for op in ["GreaterOrEqual", "LessOrEqual"]
    ),
    case("Not", node("Not", ["b"]), {"b": RNG.random(5) < 0.5}),
    case("GatherElements-axis0", node("GatherElements", ["x", "i"]), {"x": rand(3, 4)},
         inits={"i": ints(0, 2, 1, 0, 1, 1, 2, 0).reshape(2, 4)}),
    case("GatherElements-axis1-negative", node("GatherElements", ["x", "i"], axis=1), {"x": rand(3, 4)},
         inits={"i": ints(-1, 0, 3, -4, 2, 2).reshape(3, 2)}),
    case("GatherElements-3d-axis-1", node("GatherElements", ["x", "i"], axis=-1), {"x": rand(2, 3, 5)},
         inits={"i": np.int32(RNG.integers(-5, 5, (2, 3, 4)))},  # (the evaluator mishandles a negative axis)
         expect=lambda x, i: [np.take_along_axis(x, np.where(i < 0, i + 5, i), axis=-1)]),
    case("GatherND-k1", node("GatherND", ["x", "i"]), {"x": rand(4, 3, 2), "i": ints(3, -1, 0).reshape(3, 1)}),
    case("GatherND-k2-runtime-indices", node("GatherND", ["x", "i"]),
         {"x": rand(4, 3, 2), "i": ints(0, 2, -1, -3, 3, 1).reshape(3, 2)}),
    case("GatherND-batch-dims", node("GatherND", ["x", "i"], batch_dims=1),
         {"x": rand(2, 4, 3), "i": ints(1, 3, 0, -2).reshape(2, 2, 1)}),
    case("GatherND-one-index", node("GatherND", ["x", "i"]), {"x": rand(4, 3), "i": ints(2, -1)}),
    case("ScatterND-no-update", node("ScatterND", ["x", "i", "u"]), {"x": rand(3, 2), "u": rand(0, 2)},
         inits={"i": np.zeros((0, 1), np.int64)}),
    case("ScatterND-rows", node("ScatterND", ["x", "i", "u"]), {"x": rand(5, 3), "u": rand(2, 3)},
         inits={"i": ints(4, 1).reshape(2, 1)}),
    case("ScatterND-elements-negative", node("ScatterND", ["x", "i", "u"]), {"x": rand(3, 4), "u": rand(3)},
         inits={"i": ints(0, 3, -1, 0, 1, -2).reshape(3, 2)}),
    *(
        case(f"ScatterND-{r}-repeated", node("ScatterND", ["x", "i", "u"], reduction=r), {"x": rand(4, 2), "u": rand(4, 2)},
             inits={"i": ints(1, 3, 1, 1).reshape(4, 1)})
        for r in ["add", "mul", "max", "min"]
    ),
    case("ScatterElements-axis1", node("ScatterElements", ["x", "i", "u"], axis=1), {"x": rand(3, 5), "u": rand(3, 2)},
         inits={"i": ints(4, 0, -1, 2, 1, 3).reshape(3, 2)}),
    case("ScatterElements-add-repeated", node("ScatterElements", ["x", "i", "u"], reduction="add"),
         {"x": rand(3, 2), "u": rand(3, 2)}, inits={"i": ints(1, 1, 1, 0, 1, 1).reshape(3, 2)}),
    case("Clip-bounds-at-run-time", node("Clip", ["x", "lo", "hi"]),
         {"x": np.float32([-3, -1, 0, 1, 3, np.nan]), "lo": np.float32(-1.5), "hi": np.float32(2)}),
    case("Clip-max-only-at-run-time", node("Clip", ["x", "", "hi"]), {"x": rand(3, 4), "hi": np.float32(0.25)}),
    case("Trilu-k-at-run-time", node("Trilu", ["x", "k"]), {"x": rand(2, 4, 5), "k": np.int64(-1)}),
    case("Trilu-lower-k-at-run-time", node("Trilu", ["x", "k"], upper=0), {"x": rand(4, 3), "k": np.int64(1)}),
    case("Swish-alpha", node("Swish", ["x"], alpha=0.5), {"x": rand(3, 4) * 4}, opset=24,
         expect=lambda x: [x / (1 + np.exp(-0.5 * x))]),
    case("LpNormalization-l1-axis0", node("LpNormalization", ["x"], axis=0, p=1),
         {"x": np.float32([[1, 0, -2], [3, 0, 2]])},  # (the evaluator sums x, not |x|, for p = 1)
         expect=lambda x: [np.float32([[0.25, 0, -0.5], [0.75, 0, 0.5]])]),
    case("LpNormalization-l2", node("LpNormalization", ["x"]), {"x": rand(3, 5)}),
    case("IsNaN", node("IsNaN", ["x"]), {"x": SPECIAL}),
    case("IsInf", node("IsInf", ["x"]), {"x": SPECIAL}),
    case("IsInf-negative-only", node("IsInf", ["x"], detect_positive=0), {"x": SPECIAL}),
    case("IsInf-positive-only", node("IsInf", ["x"], detect_negative=0), {"x": SPECIAL}),
    case("IsInf-neither", node("IsInf", ["x"], detect_negative=0, detect_positive=0), {"x": SPECIAL}),
    *(
        case(op, node(op, ["b", "c"]), {"b": RNG.random(6) < 0.5, "c": RNG.random(6) < 0.5})
        for op in ["And", "Or", "Xor"]
    ),
    case("Where", node("Where", ["b", "x", "z"]), {"b": RNG.random((3, 4)) < 0.5, "x": rand(3, 4), "z": rand(4)}),
    *(
        case(op, node(op, ["x", "z", "w"]), {"x": rand(3, 4), "z": rand(4), "w": rand(3, 1)})
        for op in ["Sum", "Mean", "Max", "Min"]
    ),
    case("Max-five-pairwise", node("Max", ["a", "b", "c", "d", "e"]), {k: rand(2, 3) for k in "abcde"}),
    case("Cast-to-int32", node("Cast", ["x"], to=TensorProto.INT32), {"x": rand(3, 4) * 5}),
    case("Cast-to-bool", node("Cast", ["x"], to=TensorProto.BOOL), {"x": np.float32([0, 1, -2, 0])}),
    case("Cast-int64-to-float", node("Cast", ["i"], to=TensorProto.FLOAT), {"i": ints(1, -2, 3)}),
    case("CastLike", node("CastLike", ["x", "i"]), {"x": rand(4) * 3, "i": ints(1)}),
    # linear algebra
    case("MatMul-batched", node("MatMul", ["x", "w"]), {"x": rand(2, 3, 4), "w": rand(4, 5)}),
    case("MatMul-vector", node("MatMul", ["x", "w"]), {"x": rand(4), "w": rand(2, 4, 5)}),
    case(
        "Gemm-transB-alpha-beta",
        node("Gemm", ["a", "w", "c"], transB=1, alpha=0.5, beta=2.0),
        {"a": rand(3, 4)},
        inits={"w": rand(5, 4), "c": rand(5)},
    ),
    case("Gemm-transA-no-C", node("Gemm", ["a", "w"], transA=1), {"a": rand(4, 3), "w": rand(4, 2)}),
    # convolution
    case(
        "Conv-same-upper-strided",
        node("Conv", ["x", "w", "b"], auto_pad="SAME_UPPER", strides=[2, 2]),
        IMG,
        inits={"w": rand(3, 4, 3, 2), "b": rand(3)},
    ),
    case(
        "Conv-same-lower",
        node("Conv", ["x", "w"], auto_pad="SAME_LOWER", strides=[2, 1]),
        IMG,
        inits={"w": rand(3, 4, 2, 2)},
    ),
    case(
        "Conv-valid-groups-dilations",
        node("Conv", ["x", "w"], auto_pad="VALID", group=2, dilations=[2, 1]),
        IMG,
        inits={"w": rand(6, 2, 3, 3)},
    ),
    case("Conv-asymmetric-pads", node("Conv", ["x", "w"], pads=[0, 1, 2, 1]), IMG, inits={"w": rand(2, 4, 3, 3)}),
    case(
        "Conv1d",
        node("Conv", ["x", "w", "b"], pads=[1, 2], strides=[2], dilations=[2], group=2),
        SEQ,
        inits={"w": rand(6, 2, 3), "b": rand(6)},
    ),
    case(
        "Conv3d",
        node("Conv", ["x", "w", "b"], pads=[1, 0, 1, 0, 1, 1], strides=[2, 1, 2], dilations=[1, 2, 1], group=2),
        VOL,
        inits={"w": rand(4, 2, 2, 2, 3), "b": rand(4)},
    ),
    case(
        "ConvTranspose-strided-groups",
        node(
            "ConvTranspose",
            ["x", "w", "b"],
            strides=[2, 3],
            pads=[1, 0, 0, 2],
            output_padding=[1, 1],
            group=2,
            dilations=[1, 2],
        ),
        IMG,
        inits={"w": rand(4, 3, 3, 2), "b": rand(6)},
        expect=lambda x, w, b: [conv_transpose(x, w, b, (2, 3), (1, 0, 0, 2), (1, 1), (1, 2), 2)],
    ),
    case(
        "ConvTranspose-same-upper",
        node("ConvTranspose", ["x", "w"], strides=[2, 2], auto_pad="SAME_UPPER"),
        IMG,
        inits={"w": rand(4, 2, 3, 3)},
    ),
    # 7x6 at stride 2 spans 15x13; one row and column too many, taken at the start (total - total // 2).
    case(
        "ConvTranspose-output-shape",
        node("ConvTranspose", ["x", "w"], strides=[2, 2], output_shape=[14, 12]),
        IMG,
        inits={"w": rand(4, 2, 3, 3)},
        expect=lambda x, w: [conv_transpose(x, w, strides=(2, 2), pads=(1, 1, 0, 0))],
    ),
    case(
        "ConvTranspose1d", node("ConvTranspose", ["x", "w"], strides=[3], pads=[1, 1]), SEQ, inits={"w": rand(4, 2, 4)}
    ),
    # pooling
    case("MaxPool-pads-strides", node("MaxPool", ["x"], kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 2]), IMG),
    case("MaxPool-same-upper", node("MaxPool", ["x"], kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]), IMG),
    case("MaxPool-ceil", node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), IMG),
    case("AveragePool-exclude-pad", node("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), IMG),
    case(
        "AveragePool-include-pad",
        node("AveragePool", ["x"], kernel_shape=[3, 2], pads=[1, 1, 1, 0], count_include_pad=1, strides=[2, 1]),
        IMG,
    ),
    case("MaxPool1d", node("MaxPool", ["x"], kernel_shape=[3], strides=[2], pads=[1, 1]), SEQ),
    case(
        "AveragePool3d",
        node("AveragePool", ["x"], kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1]),
        VOL,
    ),
    case("MaxPool3d", node("MaxPool", ["x"], kernel_shape=[3, 2, 2], strides=[2, 2, 1], pads=[1, 0, 1, 1, 1, 0]), VOL),
    case("MaxPool-dilated", node("MaxPool", ["x"], kernel_shape=[2, 2], dilations=[2, 3], pads=[1, 1, 1, 2]), IMG),
    case(
        "AveragePool-dilated",
        node("AveragePool", ["x"], kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
        IMG,
        opset=19,
    ),
    case("LpPool-p1", node("LpPool", ["x"], kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 1], p=1), IMG),
    case("LpPool-p3", node("LpPool", ["x"], kernel_shape=[2, 2], strides=[2, 2], p=3), IMG, opset=18,
         expect=lambda x: lp_pool_2d(x, [2, 2], [2, 2], [0, 0, 0, 0], 3)),
    case("LpPool-ceil", node("LpPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), IMG, opset=18,
         expect=lambda x: lp_pool_2d(x, [3, 3], [2, 2], [0, 0, 0, 0], 2, ceil=True)),
    case("LpPool-dilated-1d", node("LpPool", ["x"], kernel_shape=[2], dilations=[3], pads=[1, 2]), SEQ, opset=18),
    case("GlobalAveragePool", node("GlobalAveragePool", ["x"]), IMG),
    # einsum: batched matmuls (with transposes, a letter only one operand has), products with broadcasting
    *(case(f"Einsum-{eq}", node("Einsum", [f"x{i}" for i in range(len(shapes))], equation=eq),
           {f"x{i}": rand(*s) for i, s in enumerate(shapes)}, opset=12)
      for eq, shapes in [("ij,jk", [(3, 4), (4, 5)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
                         ("ijk,jl->li", [(2, 3, 4), (3, 5)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
                         ("i,j->ij", [(3,), (4,)]), ("ij->", [(3, 4)]), ("kj,ji->ikj", [(2, 3), (3, 4)])]),
    case("GlobalAveragePool1d", node("GlobalAveragePool", ["x"]), SEQ),
    case("GlobalMaxPool", node("GlobalMaxPool", ["x"]), IMG),
    # normalization
    case(
        "BatchNormalization",
        node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-3),
        IMG,
        inits={"s": rand(4), "b": rand(4), "m": rand(4), "v": positive(4)},
    ),
    case(
        "InstanceNormalization", node("InstanceNormalization", ["x", "s", "b"]), IMG, inits={"s": rand(4), "b": rand(4)}
    ),
    case("LayerNormalization", node("LayerNormalization", ["x", "s", "b"]), X, inits={"s": rand(4), "b": rand(4)}),
    case(
        "LayerNormalization-axis1-no-bias",
        node("LayerNormalization", ["x", "s"], axis=1, epsilon=1e-3),
        X,
        inits={"s": rand(3, 4)},
    ),
    case(
        "LayerNormalization-mean-and-inverse-std",
        node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=-2),
        X,
        inits={"s": rand(3, 4), "b": rand(3, 4)},
        outputs=("y", "mean", "inv"),
    ),
    case("RMSNormalization", node("RMSNormalization", ["x", "s"], epsilon=1e-3), X, opset=23, inits={"s": rand(4)}),
    case("NegativeLogLikelihoodLoss-weighted-ignored-mean", node("NegativeLogLikelihoodLoss", ["x", "t", "w"],
                                                                ignore_index=2),
         {"x": rand(3, 4, 2), "t": np.array([[0, 2], [3, 1], [2, 2]], np.int64)}, opset=22, inits={"w": positive(4)}),
    case("NegativeLogLikelihoodLoss-ignored-class-of-minus-inf-is-no-nan",
         node("NegativeLogLikelihoodLoss", ["x", "t"], ignore_index=0),
         {"x": np.array([[-np.inf, -0.6931472, -0.6931472], [-1.609438, -1.2039728, -0.6931472]], np.float32),
          "t": np.array([0, 1], np.int64)},
         opset=22),
    case("NegativeLogLikelihoodLoss-none", node("NegativeLogLikelihoodLoss", ["x", "t"], reduction="none"),
         {"x": rand(3, 4), "t": np.array([0, 3, 1], np.int64)}, opset=22),
    case("SoftmaxCrossEntropyLoss-sum-with-log-prob",
         node("SoftmaxCrossEntropyLoss", ["x", "t"], ["y", "logp"], reduction="sum", ignore_index=-1),
         {"x": rand(2, 5, 3), "t": np.array([[4, -1, 0], [1, 1, 3]], np.int64)}, opset=22, outputs=("y", "logp")),
    case("Attention-4d-causal-bool-mask", node("Attention", ["q", "k", "v", "m"], is_causal=1),
         {"q": rand(2, 3, 4, 8), "k": rand(2, 3, 6, 8), "v": rand(2, 3, 6, 5),
          "m": np.array([[True, False, True, True, True]] * 4)}, opset=23),
    case("Attention-3d-gqa-past-present-softcap-probabilities",
         node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "ck", "cv", "p"], q_num_heads=4, kv_num_heads=2,
              softcap=2.0, qk_matmul_output_mode=3, scale=0.5),
         {"q": rand(1, 3, 16), "k": rand(1, 3, 8), "v": rand(1, 3, 6), "pk": rand(1, 2, 2, 4), "pv": rand(1, 2, 2, 3)},
         opset=23, outputs=("y", "ck", "cv", "p")),
    case("Attention-fully-masked-row-is-zero", node("Attention", ["q", "k", "v", "m"], ["y", "", "", "s"],
                                                    qk_matmul_output_mode=2),
         {"q": rand(1, 1, 3, 4), "k": rand(1, 1, 3, 4), "v": rand(1, 1, 3, 4),
          "m": np.array([[0.0, -np.inf, 0.5], [-np.inf] * 3, [1.0, 0.0, -np.inf]], np.float32)},
         opset=23, outputs=("y", "s")),
    case("RMSNormalization-axis0-broadcast-scale", node("RMSNormalization", ["x", "s"], axis=0), X, opset=23,
         inits={"s": rand(3, 1)}),
    case(
        "LRN",
        node("LRN", ["x"], size=3, alpha=0.01, beta=0.5, bias=2.0),
        IMG,
        expect=lambda x: [lrn(x, 3, 0.01, 0.5, 2.0)],
    ),
    case("LRN-even-size", node("LRN", ["x"], size=4), IMG, expect=lambda x: [lrn(x, 4, 1e-4, 0.75, 1.0)]),
    case("Softmax-opset11-coerced", node("Softmax", ["x"], axis=1), X, opset=11, expect=lambda x: [softmax_rows(x, 1)]),
    case("Softmax-opset13-axis", node("Softmax", ["x"], axis=1), X, opset=13),
    case(
        "LogSoftmax-opset11-axis0",
        node("LogSoftmax", ["x"], axis=0),
        X,
        opset=11,
        expect=lambda x: [softmax_rows(x, 0, log=True)],
    ),
    case("LogSoftmax-opset11-last", node("LogSoftmax", ["x"], axis=-1), X, opset=11),
    case("Dropout-opset12", node("Dropout", ["x", "r"]), X, opset=12, inits={"r": np.float32(0.3)}),
    case("Identity", node("Identity", ["x"]), X),
    # reductions
    case("ReduceSum-axes-input", node("ReduceSum", ["x", "a"], keepdims=0), X, opset=13, inits={"a": ints(0, -1)}),
    case(
        "ReduceSum-noop",
        node("ReduceSum", ["x", "a"], noop_with_empty_axes=1),
        X,
        opset=13,
        inits={"a": np.zeros(0, np.int64)},
    ),
    case("ReduceSum-all", node("ReduceSum", ["x"]), X, opset=13),
    case("ReduceMean-axes-attribute", node("ReduceMean", ["x"], axes=[1]), X, opset=11),
    case("ReduceMax-axes-input", node("ReduceMax", ["x", "a"]), X, opset=18, inits={"a": ints(1)}),
    case("ReduceMin-all", node("ReduceMin", ["x"], keepdims=0), X),
    *(
        case(op, node(op, ["x"], axes=[2]), {"x": positive(2, 3, 4)})
        for op in ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
    ),
    case("ArgMax", node("ArgMax", ["x"], axis=1, keepdims=0), X),
    case(
        "ArgMax-last",
        node("ArgMax", ["x"], axis=-1, select_last_index=1),
        {"x": np.float32([[1, 3, 3, 0], [2, 2, 1, 2]])},
    ),
    case("ArgMin", node("ArgMin", ["x"], axis=2), X),
    # shapes
    case(
        "GroupNormalization-opset18",
        node("GroupNormalization", ["x", "s", "b"], num_groups=2, epsilon=1e-3),
        IMG,
        opset=18,
        inits={"s": rand(2), "b": rand(2)},
    ),
    case(
        "GroupNormalization-opset21",
        node("GroupNormalization", ["x", "s", "b"], num_groups=2),
        IMG,
        opset=21,
        inits={"s": rand(4), "b": rand(4)},
    ),
    case("DepthToSpace-DCR", node("DepthToSpace", ["x"], blocksize=2), {"x": rand(1, 8, 2, 3)}),
    case("DepthToSpace-CRD", node("DepthToSpace", ["x"], blocksize=2, mode="CRD"), {"x": rand(1, 8, 2, 3)}),
    case("SpaceToDepth", node("SpaceToDepth", ["x"], blocksize=2), {"x": rand(1, 2, 4, 6)}),
    case(
        "Resize-nearest-asymmetric-floor",
        node("Resize", ["x", "", "s"], coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        IMG,
        inits={"s": np.float32([1, 1, 2, 3])},
    ),
    case("Resize-nearest-half-pixel-sizes", node("Resize", ["x", "", "", "z"]), IMG, inits={"z": ints(1, 4, 5, 9)}),
    case(
        "Resize-nearest-align-corners-down",
        node(
            "Resize", ["x", "", "s"], nearest_mode="round_prefer_ceil", coordinate_transformation_mode="align_corners"
        ),
        IMG,
        inits={"s": np.float32([1, 1, 0.6, 1.5])},
    ),
    case(
        "Resize-opset10-floor",
        node("Resize", ["x", "s"]),
        IMG,
        opset=10,
        inits={"s": np.float32([1, 1, 3, 2])},
        expect=lambda x, s: [x.repeat(3, axis=2).repeat(2, axis=3)],
    ),
    case("Upsample-opset9", node("Upsample", ["x", "s"]), IMG, opset=9, inits={"s": np.float32([1, 1, 2, 3])}),
    case("Flatten-axis0", node("Flatten", ["x"], axis=0), X),
    case("Flatten-axis2", node("Flatten", ["x"], axis=2), X),
    case("Reshape-zero-and-minus-one", node("Reshape", ["x", "s"]), X, inits={"s": ints(0, -1)}),
    case("Reshape-allowzero", node("Reshape", ["x", "s"], allowzero=1), X, opset=14, inits={"s": ints(4, 6)}),
    case(
        "Reshape-opset1-attribute", node("Reshape", ["x"], shape=[6, 4]), X, opset=1, expect=lambda x: [x.reshape(6, 4)]
    ),
    case("Expand", node("Expand", ["x", "s"]), {"x": rand(3, 1)}, inits={"s": ints(2, 1, 4)}),
    case("Tile", node("Tile", ["x", "r"]), {"x": rand(2, 3)}, inits={"r": ints(2, 3)}),
    case("Concat", node("Concat", ["x", "z"], axis=-1), {"x": rand(2, 3), "z": rand(2, 1)}),
    case("Split-attribute", node("Split", ["x"], ["y", "y2"], axis=2, split=[1, 3]), X, opset=11, outputs=["y", "y2"]),
    case(
        "Split-input",
        node("Split", ["x", "s"], ["y", "y2"], axis=1),
        X,
        opset=13,
        inits={"s": ints(2, 1)},
        outputs=["y", "y2"],
    ),
    case("Split-equal", node("Split", ["x"], ["y", "y2"], axis=-1), X, outputs=["y", "y2"]),
    case(
        "Split-num-outputs-uneven",
        node("Split", ["x"], ["y", "y2", "y3"], axis=1, num_outputs=3),
        {"x": rand(2, 7)},
        opset=18,
        outputs=["y", "y2", "y3"],
        expect=lambda x: np.split(x, [3, 6], axis=1),
    ),
    case(
        "Slice-inputs-negative-step",
        node("Slice", ["x", "s", "e", "a", "t"]),
        X,
        inits={"s": ints(-1, 1), "e": ints(-9223372036854775807, 3), "a": ints(2, 1), "t": ints(-2, 1)},
    ),
    case("Slice-opset1-attributes", node("Slice", ["x"], starts=[1], ends=[100], axes=[2]), X, opset=1),
    case("Transpose-default", node("Transpose", ["x"]), X),
    case("Transpose-perm", node("Transpose", ["x"], perm=[1, 2, 0]), X),
    case("Squeeze-opset11", node("Squeeze", ["x"], axes=[0]), {"x": rand(1, 3, 1)}, opset=11),
    case("Squeeze-all", node("Squeeze", ["x"]), {"x": rand(1, 3, 1)}),
    case("Unsqueeze-opset13", node("Unsqueeze", ["x", "a"]), {"x": rand(3, 2)}, inits={"a": ints(-1, 0)}),
    case("Gather-axis1-negative", node("Gather", ["x", "i"], axis=1), X, inits={"i": ints(-1, 0, 2)}),
    case("Gather-embedding", node("Gather", ["w", "i"]), {"i": ints(3, 0, 3)}, inits={"w": rand(5, 4)}),
    case(
        "Pad-constant-value-negative",
        node("Pad", ["x", "p", "v"]),
        X,
        inits={"p": ints(0, 1, 2, 1, 0, -1), "v": np.float32(1.5)},
        expect=lambda x, p, v: [np.pad(x[:, :, :3], ((0, 1), (1, 0), (2, 0)), constant_values=1.5)],
    ),
    case("Pad-opset2-attributes", node("Pad", ["x"], pads=[1, 0, 0, 0, 2, 1], value=-1.0), X, opset=2),
    case("Pad-axes", node("Pad", ["x", "p", "", "a"]), X, opset=18, inits={"p": ints(1, 2, 3, 0), "a": ints(-1, 0)}),
    *(
        case(f"Pad-{mode}", node("Pad", ["x", "p"], mode=mode), X, opset=19, inits={"p": ints(0, 2, 3, 1, 1, 2)})
        for mode in ["reflect", "edge", "wrap"]
    ),
    # Negative pads crop first; the reflection is of what is left.
    case(
        "Pad-reflect-crop",
        node("Pad", ["x", "p"], mode="reflect"),
        X,
        inits={"p": ints(0, -1, 2, 0, 1, -1)},
        expect=lambda x, p: [np.pad(x[:, 1:, :3], ((0, 0), (0, 1), (2, 0)), mode="reflect")],
    ),
    # values known at import time
    case(
        "Constant", [node("Constant", [], ["c"], value=numpy_helper.from_array(rand(3, 4))), node("Add", ["x", "c"])], X
    ),
    case("Constant-value-ints", [node("Constant", [], ["s"], value_ints=[4, 6]), node("Reshape", ["x", "s"])], X),
    case(
        "ConstantOfShape",
        [
            node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.float32([2]))),
            node("Mul", ["x", "c"]),
        ],
        X,
        inits={"s": ints(3, 4)},
    ),
    case(
        "Shape-Gather-Concat-Reshape",
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "zero"], ["batch"], axis=0),
            node("Unsqueeze", ["batch", "axes"], ["batch1"]),
            node("Concat", ["batch1", "minus1"], ["target"], axis=0),
            node("Reshape", ["x", "target"]),
        ],
        X,
        inits={"zero": np.int64(0), "axes": ints(0), "minus1": ints(-1)},
    ),
    # 0-d constants, as torch's TorchScript exporter writes them for Swin-T's window arithmetic: the result is
    # known at import time and must stay an array, used as data and returned.
    *(
        case(
            f"Mod-0d-{np.dtype(dt).name}-fmod{fmod}-{a}-{b}",
            [node("Mod", ["a", "b"], ["m"], fmod=fmod), node("Add", ["x", "m"])],
            {"x": np.arange(3).astype(dt)},
            inits={"a": np.array(a, dt), "b": np.array(b, dt)},
            outputs=("y", "m"),
        )
        for dt in (np.int64, np.float32)
        for fmod in (0, 1)
        for a, b in ((-7, 3), (7, -3))
    ),
    # the integer dtypes beyond the contract's (i16, u8..u64): wrapping arithmetic, unsigned division
    case("Add-uint8-wraps", node("Add", ["a", "b"]), {"a": np.uint8([250, 3, 255]), "b": np.uint8([10, 4, 1])}),
    case("Div-Mod-uint32", [node("Div", ["a", "b"], ["q"]), node("Mod", ["a", "b"], ["r"])],
         {"a": np.uint32([4294967295, 7, 9]), "b": np.uint32([2, 3, 4294967295])}, outputs=("q", "r")),
    case("Max-Less-uint64", [node("Max", ["a", "b"], ["m"]), node("Less", ["a", "b"], ["l"])],
         {"a": np.uint64([2**64 - 1, 0]), "b": np.uint64([1, 2**63])}, outputs=("m", "l")),
    case("Mod-int16-mixed-signs", node("Mod", ["a", "b"]), {"a": np.int16([-7, 7, -32768]), "b": np.int16([3, -3, 7])}),
    case("Cast-int16-to-uint16-and-back", [node("Cast", ["a"], ["u"], to=TensorProto.UINT16),
                                           node("Cast", ["u"], ["y"], to=TensorProto.INT16)],
         {"a": np.int16([-1, -32768, 5])}, outputs=("u", "y")),
    # running sums: the axis a constant (one graph.cumsum), or computed at run time (one per axis, the named picked)
    case("CumSum-axis-const", node("CumSum", ["x", "a"], exclusive=1), {"x": rand(2, 3, 4)}, opset=14,
         inits={"a": np.int32(-2)}),
    case("CumSum-int64-reverse", node("CumSum", ["x", "a"], reverse=1), {"x": ints(3, -1, 4, 1, 5)}, opset=14,
         inits={"a": np.int64(0)}),
    *(case(f"CumSum-axis-at-run-time-{a}", node("CumSum", ["x", "a"], reverse=1, exclusive=1),
           {"x": rand(2, 3, 4), "a": np.array(a, np.int64)}, opset=14) for a in (0, 1, 2, -1, -3)),
    # resizing by weights: linear and cubic (with its A and exclude_outside), antialiased, on chosen axes, f16
    case("Resize-linear-half-pixel", node("Resize", ["x", "", "s"], mode="linear"), IMG,
         inits={"s": np.float32([1, 1, 1.7, 0.6])}),
    case("Resize-cubic-sizes-axes", node("Resize", ["x", "", "", "z"], mode="cubic", axes=[3, 1], cubic_coeff_a=-0.5,
                                         exclude_outside=1), IMG, opset=18, inits={"z": ints(11, 3)}),
    case("Resize-linear-antialias-down", node("Resize", ["x", "", "s"], mode="linear", antialias=1), IMG, opset=18,
         inits={"s": np.float32([1, 1, 0.3, 0.5])}),
    case("Resize-cubic-antialias-pytorch", node("Resize", ["x", "", "s"], mode="cubic", antialias=1,
                                                coordinate_transformation_mode="pytorch_half_pixel"),
         IMG, opset=18, inits={"s": np.float32([1, 1, 0.45, 1.5])}),
    case("Resize-linear-f16-align",
         node("Resize", ["x", "", "s"], mode="linear", coordinate_transformation_mode="align_corners"),
         {"x": rand(1, 2, 5, 4).astype(np.float16)}, inits={"s": np.float32([1, 1, 2, 0.5])}),
    case("Upsample-linear", node("Upsample", ["x", "s"], mode="linear"), IMG, opset=9,
         inits={"s": np.float32([1, 1, 2, 3])},
         expect=lambda x, s: ReferenceEvaluator(make_model(  # Upsample is Resize with asymmetric coordinates
             [node("Resize", ["x", "", "s"], mode="linear", coordinate_transformation_mode="asymmetric")],
             {"x": x}, ["y"], 13, {"s": s})).run(None, {"x": x})),
    # first maximum wins (ties), along one axis (opset 13) or of the 2-D view from the axis (before)
    case("Hardmax", node("Hardmax", ["x"]), {"x": np.float32([[[1, 3, 3], [2, 2, 0]], [[0, 0, 0], [5, 1, 5]]])}),
    case("Hardmax-axis0", node("Hardmax", ["x"], axis=0), {"x": rand(3, 2, 4)}),
    case("Hardmax-opset11-2d-view", node("Hardmax", ["x"], axis=1), {"x": rand(2, 3, 4)}, opset=11,
         expect=lambda x: [np.eye(12, dtype=np.float32)[x.reshape(2, 12).argmax(1)].reshape(x.shape)]),
    case("BitShift-BitwiseXor-uint16", [node("BitShift", ["a", "b"], ["s"], direction="RIGHT"),
                                         node("BitwiseXor", ["s", "a"], ["y"])],
         {"a": np.uint16([65535, 1, 256]), "b": np.uint16([3, 0, 8])}, opset=18),
    case("Shape-start-end", [node("Shape", ["x"], ["s"], start=1, end=-1), node("Cast", ["s"], to=F)], X, opset=15),
    case("Size", [node("Size", ["x"], ["n"]), node("Cast", ["n"], to=F)], X),
    case(
        "Range",
        [node("Range", ["a", "b", "c"], ["r"]), node("Add", ["x", "r"])],
        {"x": rand(3, 5)},
        inits={"a": np.float32(1), "b": np.float32(3.5), "c": np.float32(0.5)},
    ),
]


@pytest.mark.parametrize(("nodes", "inputs", "opset", "inits", "outputs", "expect"), CASES)
def test_op_imports_as_onnx_reference_computes(nodes, inputs, opset, inits, outputs, expect) -> None:
    model = make_model(nodes, inputs, outputs, opset, inits)
    if expect is None:
        expected, got = run_both(model, inputs)
    else:
        imported = import_onnx(model)
        expected, got = expect(**inputs, **inits), compiler.run(imported.module, {**inputs, **imported.weights})
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        if e.dtype.kind in "biu":
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_isnan_and_isinf_compile_as_ieee_comparisons() -> None:
    """GPT-2 and DistilBERT exports mask with IsNaN: compiled, x != x must still find only NaNs."""
    x = np.tile(SPECIAL, (1, 8))  # whole vectors of lanes as well as the scalar tail
    model = make_model([node("IsNaN", ["x"], ["a"]), node("IsInf", ["x"], ["b"])], {"x": x}, ["a", "b"])
    imported = import_onnx(model)
    compiled = compiler.compile(imported.module, "llvm", cache=False)
    a, b = compiled(x=x)
    np.testing.assert_array_equal(a, np.isnan(x))
    np.testing.assert_array_equal(b, np.isinf(x))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_compiles_and_takes_along_the_axis(axis: int) -> None:
    x = rand(4, 6, 5)
    d = x.shape[axis]
    i = RNG.integers(-d, d, (4, 6, 5) if axis != 0 else (3, 6, 5))
    model = make_model([node("GatherElements", ["x", "i"], axis=axis)], {"x": x, "i": i}, ["y"])
    (got,) = compiler.compile(import_onnx(model).module, "llvm", cache=False)(x=x, i=i)
    np.testing.assert_array_equal(got, np.take_along_axis(x, np.where(i < 0, i + d, i), axis=axis))


def test_gather_nd_and_scatter_nd_compile() -> None:
    """Swin-T builds its attention masks with ScatterND; indices of GatherND may come at run time."""
    inputs = {"x": rand(4, 3, 2), "i": ints(0, 2, -1, -3, 3, 1).reshape(3, 2), "u": rand(3, 2)}
    model = make_model([node("GatherND", ["x", "i"], ["g"]), node("ScatterND", ["x", "j", "u"], ["s"], reduction="add")],
                       inputs, ["g", "s"], inits={"j": ints(1, 2, 1, 2, 0, 0).reshape(3, 2)})
    expected = ReferenceEvaluator(model).run(None, inputs)
    imported = import_onnx(model)
    got = compiler.compile(imported.module, "llvm", cache=False)(**inputs, **imported.weights)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_scatter_elements_with_indices_longer_than_data_is_a_diagnostic() -> None:
    model = make_model([node("ScatterElements", ["x", "i", "u"], axis=1)], {"x": rand(2, 3), "u": rand(3, 1)}, ["y"],
                       inits={"i": ints(0, 1, 2).reshape(3, 1)})
    with pytest.raises(GCError, match="longer than data"):
        import_onnx(model)


@pytest.mark.parametrize("op, reduction, indices", [
    ("ScatterND", "none", np.array([[0], [2], [0]], np.int64)),  # row 0 twice: the last update wins
    ("ScatterND", "add", np.array([[-1], [2], [-1]], np.int64)),
    ("ScatterND", "max", np.array([[1], [1], [0]], np.int64)),
    ("ScatterElements", "none", np.array([[1, 0], [0, -1], [2, 1]], np.int64)),
    ("ScatterElements", "mul", np.array([[1, 1], [0, 0], [2, 2]], np.int64)),
])
def test_scatter_indices_computed_at_run_time(op, reduction, indices) -> None:
    """The indices do not change the result's shape, so they may come at run time: matched against every row
    there. Interpreted and compiled, against onnx's reference."""
    x = rand(4, 2)
    u = rand(*indices.shape) if op == "ScatterElements" else rand(3, 2)  # an update a row, or an element
    extra = {"axis": 0} if op == "ScatterElements" else {}
    model = make_model([node(op, ["x", "i", "u"], reduction=reduction, **extra)], {"x": x, "i": indices, "u": u},
                       ["y"], opset=18)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x, "i": indices, "u": u})
    imported = import_onnx(model)
    (got,) = compiler.run(imported.module, {"x": x, "i": indices, "u": u})
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (compiled,) = compiler.compile(imported.module, "llvm")(x=x, i=indices, u=u)
    np.testing.assert_allclose(compiled, want, rtol=1e-6)


def test_lp_pool_of_p_below_one_is_a_diagnostic() -> None:
    model = make_model([node("LpPool", ["x"], kernel_shape=[2, 2], p=0)], IMG, ["y"])
    with pytest.raises(GCError, match=r"p = 0 is not a norm"):
        import_onnx(model)


@pytest.mark.parametrize(("eq", "message"), [("ijk->i", "names 3 axes"), ("i..j->i", "at most one ellipsis"),
                                             ("ij->ik", "distinct letters of the operands")])
def test_einsum_equations_gc_does_not_take_are_diagnostics(eq: str, message: str) -> None:
    model = make_model([node("Einsum", ["x"], equation=eq)], {"x": rand(3, 3)}, ["y"], opset=12)
    with pytest.raises(GCError, match=message):
        import_onnx(model)


def test_gather_elements_with_indices_of_another_rank_is_a_diagnostic() -> None:
    model = make_model([node("GatherElements", ["x", "i"])], {"x": rand(3, 4), "i": ints(0, 1)}, ["y"])
    with pytest.raises(GCError, match="must have the rank of data"):
        import_onnx(model)


def test_opset6_broadcast_axis_aligns_from_that_axis() -> None:
    x, z = rand(2, 3, 4), rand(3)
    model = make_model([node("Add", ["x", "z"], broadcast=1, axis=1)], {"x": x, "z": z}, ["y"], opset=6)
    (y,) = compiler.run(import_onnx(model).module, {"x": x, "z": z})
    np.testing.assert_allclose(y, x + z[None, :, None], rtol=1e-6)


# --- the written module -------------------------------------------------------------------------------------


def conv_net():
    """x -> Conv (weights) -> Relu -> Reshape (shape initializer) -> Gemm (transB), with torch-style names."""
    nodes = [
        helper.make_node(
            "Conv",
            ["input.1", "conv1.weight", "conv1.bias"],
            ["/conv1/Conv_output_0"],
            name="/conv1/Conv",
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["/conv1/Conv_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"),
        helper.make_node("Reshape", ["/relu/Relu_output_0", "onnx::Reshape_9"], ["/Reshape_output_0"], name="/Reshape"),
        helper.make_node("Gemm", ["/Reshape_output_0", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm", transB=1),
    ]
    inits = {
        "conv1.weight": rand(4, 3, 3, 3),
        "conv1.bias": rand(4),
        "onnx::Reshape_9": ints(1, -1),
        "fc.weight": rand(10, 4 * 5 * 5),
        "fc.bias": rand(10),
    }
    return make_model(nodes, {"input.1": rand(1, 3, 5, 5)}, ["logits"], 17, inits)


def test_weights_become_arguments_after_the_data_inputs() -> None:
    f = import_onnx(conv_net()).module["main"]
    assert [a.name for a in f.args] == ["input.1", "conv1.weight", "conv1.bias", "fc.weight", "fc.bias"]


def test_integer_initializers_are_constants_not_weights() -> None:
    imported = import_onnx(conv_net())
    assert "onnx__Reshape_9" not in imported.weights
    assert set(imported.weights) == {"conv1.weight", "conv1.bias", "fc.weight", "fc.bias"}


def test_names_are_sanitized_and_recognisable() -> None:
    text = import_onnx(conv_net()).text
    assert "%conv1_Conv_output_0 = graph.conv2d(%input.1, %conv1.weight, %conv1.bias)" in text
    assert "%logits" in text


def test_gemm_transb_is_matmul_of_a_transpose() -> None:
    text = import_onnx(conv_net()).text
    t = re.search(r"%(\S+) = graph.transpose\(%fc.weight\) \{perm = \[1, 0\]\}", text)
    assert t and f"graph.matmul(%Reshape_output_0, %{t.group(1)})" in text


def test_every_op_line_names_its_onnx_node() -> None:
    text = import_onnx(conv_net()).text
    op_lines = [line for line in text.splitlines() if " = graph." in line]
    assert op_lines and all(re.search(r"// node \d+ '[^']+' \(\w+\)$", line) for line in op_lines)


HOSTILE = [
    "r\n  %y = graph.neg(%x)  // ",  # a new line with an op of its own
    "r\r%y = graph.neg(%x)",  # a carriage return: a line break to str.splitlines
    "r\u2028%y = graph.neg(%x)\u2029",  # Unicode's line and paragraph separators
    "r\x1b[2J\x1b[31m",  # terminal escapes
    "r\x0b\x0c\x1c\x85",  # vertical tab, form feed, file separator, next line
]


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_node_name_cannot_change_the_module(name: str) -> None:
    """Names reach the written text only in comments, escaped: however a name tries to end its comment,
    the module is the model's (here one relu), each op on the line its location says."""
    x = rand(2, 3)
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name=name)], {"x": x}, ["y"])
    model.producer_name, model.producer_version = name, name
    imported = import_onnx(model, gir_name="net.gir")
    assert [op.name for op in imported.module["main"].ops] == ["graph.relu"]
    np.testing.assert_array_equal(compiler.run(imported.module, {"x": x})[0], np.maximum(x, 0))
    assert imported.text.isprintable() or set(imported.text) - set(string.printable) <= {"\n"}
    assert imported.text.splitlines() == imported.text.rstrip("\n").split("\n")  # no other line breaks
    assert repr(name[1:])[1:-1].replace("\\'", "'") in imported.text  # shown escaped, not dropped


def test_a_hostile_input_name_in_a_diagnostic_is_escaped() -> None:
    model = make_model([node("Relu", ["in\n\x1b[31m"])], {"in\n\x1b[31m": rand(2, 3).astype(np.float64)}, ["y"])
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.STRING
    rendered = import_error(model)
    assert "\x1b" not in rendered and "\\x1b" in rendered and rendered.count("\n") == rendered.strip().count("\n")


def test_op_locations_are_lines_of_the_written_text() -> None:
    imported = import_onnx(conv_net(), gir_name="net.gir")
    lines = imported.text.splitlines()
    for op in imported.module["main"].ops:
        assert op.loc.file == "net.gir"
        assert op.name in lines[op.loc.line - 1]


def test_imported_module_matches_onnx_reference() -> None:
    model = conv_net()
    x = rand(1, 3, 5, 5)
    expected, got = run_both(model, {"input.1": x})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)


def test_embed_weights_makes_constants() -> None:
    imported = import_onnx(conv_net(), embed_weights=True)
    assert imported.weights == {}
    assert [a.name for a in imported.module["main"].args] == ["input.1"]
    assert "dense<" in imported.text


def test_graph_output_known_at_import_is_a_constant() -> None:
    model = make_model([node("Shape", ["x"])], X, ["y"])
    (y,) = compiler.run(import_onnx(model).module, X)
    np.testing.assert_array_equal(y, [2, 3, 4])


def test_named_axes_stay_dynamic() -> None:
    """The contract's v2: a named (symbolic) axis is `?` unless --input-shape pins it, here a named size
    (`?(batch)`) that shape rules carry; the module runs at any size there."""
    w = rand(4, 5)
    model = make_model([node("Relu", ["x"], ["r"]), node("MatMul", ["r", "w"])], {**X, "w": w}, ["y"])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    imported = import_onnx(model)
    f = imported.module["main"]
    b, s = Sym.symbol("batch"), Sym.symbol("seq")
    assert f.args[0].type.shape == (b, s, 4) and f.results[0].type.shape == (b, s, 5)
    assert imported.note == ""
    x = rand(3, 7, 4)
    (y,) = compiler.run(imported.module, {"x": x, "w": w})
    np.testing.assert_allclose(y, np.maximum(x, 0) @ w, rtol=1e-6)


def test_inputs_that_share_an_axis_name_share_its_size() -> None:
    """ONNX's dim_param: one name is one size. Two inputs named "batch" at dimension 0 take the same size
    at each call (a mismatch is an error naming both), and an unnamed axis is a `?` of its own."""
    model = make_model([node("Add", ["x", "z"])], {**X, "z": rand(2, 3, 4)}, ["y"])
    for i in (0, 1):
        model.graph.input[i].type.tensor_type.shape.dim[0].dim_param = "batch size"  # not a GIR name: _
        model.graph.input[i].type.tensor_type.shape.dim[1].dim_param = ""
        model.graph.input[i].type.tensor_type.shape.dim[1].ClearField("dim_value")
    imported = import_onnx(model)
    f = imported.module["main"]
    assert [a.type.shape for a in f.args] == [(Sym.symbol("batch_size"), DYN, 4)] * 2
    assert f.results[0].type.shape[0] == Sym.symbol("batch_size")
    x, z = rand(3, 5, 4), rand(3, 5, 4)
    np.testing.assert_allclose(compiler.run(imported.module, {"x": x, "z": z})[0], x + z)
    with pytest.raises(GCError, match=r"%z has size 2 in dimension 0, which is \?\(batch_size\); but %x gives "
                                      r"batch_size = 3"):
        compiler.run(imported.module, {"x": x, "z": rand(2, 5, 4)})


def test_distinct_axis_names_stay_distinct_sizes() -> None:
    """"seq len" and "seq_len" are two ONNX names: as GIR names (spaces as _) they must not become one."""
    model = make_model([node("Relu", ["x"])], X, ["y"])
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param, dims[1].dim_param = "seq len", "seq_len"
    shape = import_onnx(model).module["main"].args[0].type.shape
    assert shape == (Sym.symbol("seq_len"), Sym.symbol("seq_len_2"), 4)


def test_a_named_axis_beside_an_unnamed_one_is_no_mismatch_at_import() -> None:
    """An op that needs two operands of one shape (SwiGLU) where one axis is named and the other's is not:
    nothing says they differ, so the import takes it and each call checks the sizes."""
    model = make_model([node("SwiGLU", ["a", "v"])], {"a": rand(2, 5), "v": rand(2, 5)}, ["y"], opset=28)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.input[1].type.tensor_type.shape.dim[0].ClearField("dim_value")
    imported = import_onnx(model)
    a, v = rand(3, 5), rand(3, 5)
    want = a / (1 + np.exp(-a)) * v
    np.testing.assert_allclose(compiler.run(imported.module, {"a": a, "v": v})[0], want, rtol=1e-5, atol=1e-6)


def rnn_over(named: int):
    """An RNN over x [seq, batch, 4] (2x3x4), axis `named` of x named: gc unrolls the sequence, so it must
    know its length at import."""
    model = make_model([node("RNN", ["x", "w", "r"], ["y"], hidden_size=5)], X, ["y"],
                       inits={"w": rand(1, 5, 4), "r": rand(1, 5, 5)})
    model.graph.input[0].type.tensor_type.shape.dim[named].dim_param = "n"
    return model


def test_a_size_the_import_must_know_keeps_the_named_axes_static_with_a_note() -> None:
    """A size the import itself must know (an RNN's sequence, unrolled): the import is made as before
    dynamic shapes (a leading axis at 1), and says why."""
    imported = import_onnx(rnn_over(0))
    assert imported.module["main"].args[0].type.shape == (1, 3, 4)
    assert "kept the named axes 'n' (x[0]) static" in imported.note and "RNN" in imported.note


# Sizes read at each call (Shape, Size) and what models compute from them: a Reshape's shape, an Expand's,
# a ConstantOfShape, a Range up to a length, GatherElements and GatherND over `?` axes, allowzero Reshapes.
SIZES = {"zero": np.array([0], np.int64), "one": np.array([1], np.int64), "minus1": np.array([-1], np.int64)}
DYNAMIC_CASES = [
    pytest.param([node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["b"]),
                  node("Concat", ["b", "minus1"], ["t"], axis=0), node("Reshape", ["x", "t"])], id="reshape-keeps-batch"),
    pytest.param([node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["b"]),
                  node("Concat", ["b", "minus1"], ["t"], axis=0), node("Reshape", ["x", "t"], allowzero=1)],
                 id="reshape-allowzero"),
    pytest.param([node("Shape", ["x"], ["s"]), node("ConstantOfShape", ["s"], ["c"],
                                                     value=numpy_helper.from_array(np.array([2.5], np.float32))),
                  node("Add", ["x", "c"])], id="constant-of-shape"),
    pytest.param([node("Shape", ["x"], ["s"], start=0, end=2), node("Concat", ["s", "one"], ["t"], axis=0),
                  node("ReduceSum", ["x", "one"], ["r"], keepdims=1), node("Expand", ["r", "t"])], id="expand"),
    pytest.param([node("Shape", ["x"], ["s"]), node("Gather", ["s", "one"], ["n"]), node("Squeeze", ["n"], ["k"]),
                  node("Range", ["start", "k", "step"], ["p"]), node("Cast", ["p"], ["pf"], to=1),
                  node("Unsqueeze", ["pf", "minus1"], ["u"]), node("Mul", ["x", "u"])], id="range"),
    pytest.param([node("Shape", ["x"], ["s"]), node("ConstantOfShape", ["s"], ["c"],
                                                     value=numpy_helper.from_array(np.array([1], np.int64))),
                  node("CumSum", ["c", "one1"], ["cs"], reverse=1), node("Sub", ["cs", "c"], ["i"]),
                  node("GatherElements", ["x", "i"], ["y"], axis=1)], id="gather-elements"),  # seq reversed
    pytest.param([node("Size", ["x"], ["n"]), node("Cast", ["n"], ["f"], to=1), node("Mul", ["x", "f"])], id="size"),
    pytest.param([node("Shape", ["x"], ["s"]), node("Gather", ["s", "one"], ["n"]), node("Cast", ["n"], ["f"], to=1),
                  node("Squeeze", ["f"], ["k"]), node("Range", ["fstart", "k", "fstep"], ["p"]),
                  node("Unsqueeze", ["p", "minus1"], ["u"]), node("Mul", ["x", "u"])], id="range-of-floats"),
    pytest.param([node("Shape", ["x"], ["s"]), node("Gather", ["s", "one"], ["n"]), node("Cast", ["n"], ["f"], to=1),
                  node("Squeeze", ["f"], ["k"]), node("Range", ["half", "k", "step3"])], id="range-count"),  # ceil
    pytest.param([node("Shape", ["x"], ["s"], start=0, end=2), node("Concat", ["s", "one"], ["t"], axis=0),
                  node("ConstantOfShape", ["t"], ["c"], value=numpy_helper.from_array(np.array([1], np.int64))),
                  node("CumSum", ["c", "zero1"], ["cs"]), node("Sub", ["cs", "c"], ["i"]),
                  node("GatherND", ["x", "i"])], id="gather-nd"),  # each position's whole batch row
    pytest.param([node("Trilu", ["x"], ["y"], upper=0)], id="trilu"),  # a causal mask over [seq, 4]
    pytest.param([node("Trilu", ["x", "kk"], ["y"])], id="trilu-k"),
]


@pytest.mark.parametrize("nodes", DYNAMIC_CASES)
def test_sizes_computed_at_each_call_keep_the_named_axes_dynamic(nodes) -> None:
    inits = {**SIZES, "start": np.array(0, np.int64), "step": np.array(1, np.int64), "one1": np.array(1, np.int64),
             "zero1": np.array(0, np.int64), "kk": np.array(1, np.int64),
             "fstart": np.array(0.25, np.float32), "fstep": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32), "step3": np.array(0.75, np.float32)}
    used = {i for n in nodes for i in n.input}
    model = make_model(nodes, X, ["y"], inits={k: v for k, v in inits.items() if k in used})
    for d, name in ((0, "batch"), (1, "seq")):
        model.graph.input[0].type.tensor_type.shape.dim[d].dim_param = name
    imported = import_onnx(model)
    assert imported.note == "" and imported.module["main"].args[0].type.shape == (Sym.symbol("batch"), Sym.symbol("seq"), 4)
    compiled = compiler.compile(imported.module, "llvm", params=imported.weights, cache=False)
    for shape in ((2, 3, 4), (5, 1, 4), (1, 7, 4)):
        x = rand(*shape)
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        (got,) = compiler.run(imported.module, {"x": x, **imported.weights})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(compiled(x)[0], want, rtol=1e-5, atol=1e-5)


def test_input_shape_gives_symbolic_dimensions() -> None:
    model = make_model([node("Relu", ["x"])], X, ["y"])
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    f = import_onnx(model, input_shapes={"x": (2, 7, 4)}).module["main"]
    assert f.args[0].type.shape == (2, 7, 4)


# --- diagnostics ----------------------------------------------------------------------------------------------


def import_error(model, **kw) -> str:
    with pytest.raises(GCError) as e:
        import_onnx(model, **kw)
    return e.value.render()


def test_unsupported_op_names_node_index_name_and_opset() -> None:
    nodes = [node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["y"], name="Det_3")]
    msg = import_error(make_model(nodes, {"x": rand(2, 3)}, ["y"]))
    assert msg == "<model>: error: node 1 'Det_3': unsupported op Det (opset 17)"


def test_unsupported_attribute_is_named() -> None:
    msg = import_error(make_model([node("MaxPool", ["x"], kernel_shape=[2, 2], foo=1)], IMG, ["y"]))
    assert "node 0: MaxPool (opset 17): unsupported attribute 'foo'" in msg


def test_a_shape_fed_as_an_input_is_an_attribute_taken_at_run_time() -> None:
    from compiler.interpreter import run

    imported = import_onnx(make_model([node("Reshape", ["x", "s"])], {"x": rand(2, 3), "s": ints(3, 2)}, ["y"]))
    assert "graph.reshape(%x) {shape = %s} : tensor<?x?xf32>" in imported.text
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for shape in ([3, 2], [6, -1], [0, 3]):
        np.testing.assert_array_equal(run(imported.module, {"x": x, "s": np.array(shape)})[0],
                                      x.reshape([2 if d == 0 else d for d in shape]))


def test_a_shape_computed_from_an_input_of_the_model_takes_its_value_at_each_call() -> None:
    nodes = [node("Abs", ["s"], ["t"]), node("Reshape", ["x", "t"])]
    model = make_model(nodes, {"x": rand(2, 3), "s": ints(3, 2)}, ["y"])
    imported = import_onnx(model)
    for s in (ints(3, 2), ints(-1, 6), ints(-6, -1)):
        x = rand(2, 3)
        np.testing.assert_array_equal(compiler.run(imported.module, {"x": x, "s": s})[0], x.reshape(np.abs(s)))


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_a_range_of_bounds_fed_as_inputs_counts_at_each_call(dtype) -> None:
    model = make_model([node("Range", ["a", "b", "d"])], {k: np.array(1, dtype) for k in "abd"}, ["y"])
    imported = import_onnx(model)
    compiled = compiler.compile(imported.module, "llvm", cache=False)
    for a, b, d in ((0, 5, 1), (10, 1, -3), (2, 2, 1), (1.5, 4, 0.75) if dtype == np.float32 else (-4, 9, 4)):
        feeds = {k: np.array(v, dtype) for k, v in zip("abd", (a, b, d))}
        want = np.arange(a, b, d).astype(dtype)
        np.testing.assert_array_equal(compiler.run(imported.module, feeds)[0], want)
        np.testing.assert_array_equal(compiled(**feeds)[0], want)


def test_a_shape_computed_from_the_data_is_an_error() -> None:
    nodes = [node("ReduceMax", ["x"], ["m"], keepdims=0), node("Cast", ["m"], ["c"], to=7),
             node("Unsqueeze", ["c", "zero"], ["t"]), node("Reshape", ["x", "t"])]
    msg = import_error(make_model(nodes, {"x": rand(2, 3)}, ["y"], inits={"zero": ints(0)}))
    assert "input #1 (shape) must be a constant, an input of the model or computed from sizes, but 't' is a " \
           "tensor<1xi64> computed at run time from the data 'x'" in msg


def test_graph_op_diagnostic_names_the_node() -> None:
    msg = import_error(make_model([node("MatMul", ["x", "z"])], {"x": rand(2, 3), "z": rand(4, 5)}, ["y"]))
    assert msg.startswith("<model>: error: node 0: MatMul (opset 17): graph.matmul: inner dimensions differ: 3 vs 4")


def test_symbolic_inner_dimension_kept_static_without_input_shape_is_an_error() -> None:
    model = rnn_over(0)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "seq"
    msg = import_error(model)
    assert "input 'x' has the symbolic dimension 'seq' at position 2: give its size with --input-shape x=1x3xN" in msg


def test_input_shape_that_contradicts_the_model_is_an_error() -> None:
    msg = import_error(make_model([node("Relu", ["x"])], X, ["y"]), input_shapes={"x": (2, 3, 5)})
    assert "--input-shape x=2x3x5 does not fit the model's shape [2, 3, 4]" in msg


def test_input_shape_for_an_unknown_input_is_an_error() -> None:
    msg = import_error(make_model([node("Relu", ["x"])], X, ["y"]), input_shapes={"nope": (1,)})
    assert "--input-shape names 'nope', but the inputs are 'x'" in msg


def test_unsupported_input_dtype_is_an_error() -> None:
    msg = import_error(make_model([node("Identity", ["u"])], {"u": np.zeros(3, np.complex64)}, ["y"]))
    assert "input 'u' has element type COMPLEX64, which GIR has no dtype for" in msg


def test_op_of_another_domain_is_unsupported() -> None:
    model = make_model([helper.make_node("FusedConv", ["x"], ["y"], domain="com.microsoft")], IMG, ["y"])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert "unsupported op com.microsoft.FusedConv (opset 1)" in import_error(model)


def test_used_second_output_that_gc_does_not_compute_is_an_error() -> None:
    nodes = [node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]), node("Cast", ["i"], ["z"], to=F)]
    assert "output #1 (Indices) is used, but gc does not compute it" in import_error(make_model(nodes, IMG, ["z"]))


def test_resize_modes_gc_does_not_take_are_errors() -> None:
    model = make_model([node("Resize", ["x", "", "s"], mode="area")], IMG, ["y"], 17, {"s": np.float32([1, 1, 2, 2])})
    assert "Resize (opset 17): mode 'area' is not supported (only nearest, linear, cubic)" in import_error(model)
    ints_in = {"x": np.arange(24, dtype=np.int32).reshape(1, 1, 4, 6)}
    model = make_model([node("Resize", ["x", "", "s"], mode="linear")], ints_in, ["y"], 17,
                       {"s": np.float32([1, 1, 2, 2])})  # fmt: skip
    assert "mode 'linear' of i32 is not supported (only floats)" in import_error(model)


def _resize_node_cases() -> tuple:
    """onnx's Resize node tests with scales, sizes and roi as initializers (the cases feed them at run time,
    which gc rejects: they decide the shape): every mode, coordinate transformation, antialias, axes."""
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "tools"))
    import onnx_node_tests as nodes

    out = []
    for c in nodes.cases():
        if not c.name.startswith("test_resize_"):
            continue
        model = type(c.model)()
        model.CopyFrom(c.model)
        g = model.graph
        rest = [numpy_helper.from_array(a, i.name) for i, a in zip(list(g.input)[1:], c.inputs[1:])]
        del g.input[1:]
        g.initializer.extend(rest)
        out.append(nodes.Case(c.name, model, c.inputs[:1], c.outputs, c.rtol, c.atol))
    return nodes, out


@pytest.mark.parametrize("target", ["interp", "llvm"])
def test_resize_node_cases_with_constant_scales_pass(target: str) -> None:
    nodes, cases = _resize_node_cases()
    assert len(cases) >= 39
    got = {c.name: nodes.run_case(c, target) for c in cases}
    assert {k: v for k, v in got.items() if v[0] != "pass"} == {}


# --- untrusted models: malformed in ways protobuf lets through ---------------------------------------------


def test_attribute_of_the_wrong_type_names_it_the_type_expected_and_found() -> None:
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="mp", kernel_shape=2)], IMG, ["y"])
    assert import_error(model) == (
        "<model>: error: node 0 'mp': MaxPool (opset 17): attribute 'kernel_shape' must be INTS (a list of "
        "integers), but is INT (one integer)"
    )


@pytest.mark.parametrize(
    ("op", "attrs", "inits", "message"),
    [
        ("LeakyRelu", {"alpha": "big"}, {}, "attribute 'alpha' must be FLOAT (one float), but is STRING (one string)"),
        ("Cast", {"to": "FLOAT"}, {}, "attribute 'to' must be INT (one integer), but is STRING (one string)"),
        ("Gemm", {"transB": 1.0}, {"w": rand(4, 3)}, "attribute 'transB' must be INT (one integer), but is FLOAT"),
        ("Transpose", {"perm": [1.0, 0.0]}, {}, "attribute 'perm' must be INTS (a list of integers), but is FLOATS"),
        ("Constant", {"value": 1.5}, {}, "attribute 'value' must be TENSOR (a tensor), but is FLOAT (one float)"),
    ],
    ids=["LeakyRelu-string-alpha", "Cast-string-to", "Gemm-float-transB", "Transpose-float-perm", "Constant-float"],
)
def test_every_attribute_read_is_checked_against_its_spec_type(op, attrs, inits, message) -> None:
    ins = [] if op == "Constant" else ["x", *inits]
    model = make_model([helper.make_node(op, ins, ["y"], name="n", **attrs)], {"x": rand(2, 4)}, ["y"], 17, inits)
    msg = import_error(model)
    assert msg.startswith(f"<model>: error: node 0 'n': {op} (opset 17): ") and message in msg


def test_attribute_that_holds_another_type_than_it_declares_is_an_error() -> None:
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="mp")], IMG, ["y"])
    model.graph.node[0].attribute.append(onnx.AttributeProto(name="kernel_shape", type=onnx.AttributeProto.INTS, i=2))
    assert import_error(model) == (
        "<model>: error: node 0 'mp': MaxPool (opset 17): attribute 'kernel_shape' is declared INTS (a list of "
        "integers), but holds INT (one integer)"
    )


def test_attribute_text_that_is_not_utf8_is_an_error() -> None:
    model = make_model([node("Pad", ["x", "p"], mode=b"\xff")], X, ["y"], inits={"p": ints(0, 0, 0, 0, 0, 0)})
    assert "Pad (opset 17): attribute 'mode' is not UTF-8 text" in import_error(model)


def _tensor_with_dims(values: np.ndarray, dims: list[int], raw: bool, name: str = "w"):
    t = numpy_helper.from_array(values, name)
    if not raw:  # the values in the typed field (float_data), not raw_data
        t = helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(values.dtype), values.shape, values.reshape(-1))
    del t.dims[:]
    t.dims.extend(dims)
    return t


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (False, "initializer 'w' has shape [2, 3] (6 elements), but 5 values in float_data"),
        (True, "initializer 'w' has shape [2, 3] (6 elements of 4 bytes), but 20 bytes of raw_data"),
    ],
    ids=["float_data", "raw_data"],
)
def test_initializer_whose_dims_disagree_with_its_data_is_an_error(raw: bool, message: str) -> None:
    model = make_model([node("Add", ["x", "w"])], {"x": rand(2, 3)}, ["y"])
    model.graph.initializer.append(_tensor_with_dims(rand(5), [2, 3], raw))
    assert import_error(model) == f"<model>: error: {message}"


def test_tensor_attribute_whose_dims_disagree_with_its_data_is_an_error() -> None:
    value = _tensor_with_dims(ints(1, 2, 3), [4], raw=True, name="v")
    model = make_model([helper.make_node("Constant", [], ["y"], name="c", value=value)], {}, ["y"])
    assert import_error(model) == (
        "<model>: error: node 0 'c': Constant (opset 17): attribute 'value' has shape [4] (4 elements of 8 bytes), "
        "but 24 bytes of raw_data"
    )


def test_initializer_given_twice_is_an_error() -> None:
    model = make_model([node("Add", ["x", "w"])], {"x": rand(3)}, ["y"], inits={"w": rand(3)})
    model.graph.initializer.append(numpy_helper.from_array(rand(3), "w"))
    assert import_error(model) == "<model>: error: initializer 'w' is given twice"


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        (
            [helper.make_node("Reshape", ["x"], ["y"], name="r")],
            "node 0 'r': Reshape (opset 17): takes 2 inputs, but has 1",
        ),
        (
            [helper.make_node("Relu", ["x", "x", "x"], ["y"], name="r")],
            "node 0 'r': Relu (opset 17): takes 1 input, but has 3",
        ),
        (
            [helper.make_node("Relu", ["x"], ["y", "z"], name="r")],
            "node 0 'r': Relu (opset 17): takes 1 output, but has 2",
        ),
        (
            [helper.make_node("Reshape", ["x", ""], ["y"], name="r")],
            "node 0 'r': Reshape (opset 17): input #1 (shape) is required, but the node leaves it empty",
        ),
        (
            [helper.make_node("Concat", [], ["y"], name="c", axis=0)],
            "node 0 'c': Concat (opset 17): takes at least 1 input, but has 0",
        ),
        (
            [helper.make_node("Relu", ["x"], ["x"], name="r")],
            "node 0 'r': Relu (opset 17): output #0 'x' is defined twice: ONNX names each value once",
        ),
        (
            [helper.make_node("Gelu", ["x"], ["y"], name="g")],
            "node 0 'g': Gelu (opset 17): Gelu is not an op of opset 17: it came in opset 20",
        ),
    ],
    ids=[
        "too-few-inputs",
        "too-many-inputs",
        "too-many-outputs",
        "required-input-empty",
        "variadic-none",
        "output-redefined",
        "op-of-a-later-opset",
    ],
)
def test_node_is_checked_against_its_schema(nodes, message: str) -> None:
    assert import_error(make_model(nodes, X, ["y"])) == f"<model>: error: {message}"


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (["y", "y"], "graph output 'y' is listed twice: give each output its own name"),
        (["y", "x"], "graph output 'x' is also a graph input: give the output its own name (through an Identity)"),
    ],
    ids=["twice", "also-an-input"],
)
def test_graph_output_names_must_be_unique(outputs: list[str], message: str) -> None:
    assert import_error(make_model([node("Relu", ["x"])], X, outputs)) == f"<model>: error: {message}"


@pytest.mark.parametrize(
    ("nodes", "inputs", "message"),
    [
        (
            [helper.make_node("HardSigmoid", ["i"], ["y"], name="h")],
            {"i": ints(1, 2)},
            "node 0 'h': HardSigmoid (opset 17): input #0 (X) has element type int64, but HardSigmoid takes ",
        ),
        (
            [helper.make_node("Add", ["x", "i"], ["y"], name="a")],
            {"x": rand(2), "i": ints(1, 2)},
            (
                "node 0 'a': Add (opset 17): input #1 (B) has element type int64, but input #0 has float: the two "
                "must agree"
            ),
        ),
    ],
    ids=["not-allowed", "type-parameter-disagrees"],
)
def test_input_element_types_are_checked_against_the_schema(nodes, inputs: dict, message: str) -> None:
    assert import_error(make_model(nodes, inputs, ["y"])).startswith(f"<model>: error: {message}")


def test_name_that_is_not_utf8_is_an_error() -> None:
    data = conv_net().SerializeToString().replace(b"/relu/Relu_output_0", b"/relu/Relu_outpu\xff_0", 1)
    msg = import_error(onnx.ModelProto.FromString(data))
    assert msg == "<model>: error: field graph.node[1].output[0] is not UTF-8 text"


# What the fuzzer below found, each a traceback before: sizes, counts and values that are only numbers.
@pytest.mark.parametrize(
    ("nodes", "inits", "opset", "message"),
    [
        (
            [node("Unsqueeze", ["x", "a"])],
            {"a": np.arange(4, 70)},
            17,
            "Unsqueeze (opset 17): a result has rank 70; GIR tensors have at most 64 dimensions",
        ),
        (
            [node("ConstantOfShape", ["s"])],
            {"s": ints(1 << 40, 0, 1 << 40)},
            17,
            (
                "ConstantOfShape (opset 17): the output would have the shape [1099511627776, 0, 1099511627776]; gc "
                "makes arrays at import time of at most 268435456 elements"
            ),
        ),
        (
            [node("Range", ["a", "b", "c"])],
            {"a": np.float32(0), "b": np.float32(np.nan), "c": np.float32(1)},
            17,
            "Range (opset 17): cannot count from 0.0 to nan in steps of 1.0",
        ),
        (
            [node("Split", ["x"], ["y", "z", "w"], axis=2, num_outputs=2)],
            {},
            18,
            "Split (opset 18): num_outputs 2 differs from the node's 3 outputs",
        ),
        (
            [node("Trilu", ["v"])],
            {"v": ints(1, 2, 3)},
            17,
            "Trilu (opset 17): input must have rank >= 2, got tensor<3xi64>",
        ),
        (
            [node("Cast", ["x"], to="NOPE")],
            {},
            1,
            "Cast (opset 1): to 'NOPE' names no ONNX element type",
        ),
        (
            [node("MaxPool", ["x"], kernel_shape=[0, 2], pads=[0, 0, 0, 0])],
            {},
            17,
            "MaxPool (opset 17): kernel_shape [0, 2] must be positive",
        ),
    ],
    ids=[
        "rank-70",
        "ConstantOfShape-huge",
        "Range-nan",
        "Split-num-outputs",
        "Trilu-vector",
        "Cast-unknown-type",
        "MaxPool-kernel-0",
    ],
)
def test_numbers_that_make_no_sense_are_diagnostics(nodes, inits: dict, opset: int, message: str) -> None:
    msg = import_error(make_model(nodes, IMG, ["y"], opset, inits))
    assert msg == f"<model>: error: node 0: {message}"


def test_input_of_a_size_no_tensor_has_is_an_error() -> None:
    model = make_model([node("Relu", ["x"])], X, ["y"])
    for d in model.graph.input[0].type.tensor_type.shape.dim[1:]:
        d.dim_value = 1 << 40
    assert import_error(model) == (
        "<model>: error: input 'x' is tensor<2x1099511627776x1099511627776xf32>, too large: a GIR tensor holds at "
        "most 2^63 - 1 bytes"
    )


def test_graph_input_listed_twice_is_an_error() -> None:
    model = make_model([node("Relu", ["x"])], X, ["y"])
    model.graph.input.append(model.graph.input[0])
    assert import_error(model) == "<model>: error: graph input 'x' is listed twice"


@pytest.mark.parametrize("opset", [999, 0, -3])
def test_opset_the_onnx_package_does_not_know_is_an_error(opset: int) -> None:
    top = onnx.defs.onnx_opset_version()
    msg = import_error(make_model([node("Relu", ["x"])], X, ["y"], opset=opset))
    if opset > top:
        assert msg == (
            f"<model>: error: opset {opset} of the default ONNX domain is newer than opset {top}, the highest the "
            f"installed onnx package ({onnx.__version__}) knows: upgrade onnx, or export the model for opset {top}"
        )
    else:
        assert (
            msg == f"<model>: error: opset {opset} of the default ONNX domain is not an opset: they run from 1 to {top}"
        )


def test_two_opsets_of_the_default_domain_are_an_error() -> None:
    model = make_model([node("Relu", ["x"])], X, ["y"])
    model.opset_import.append(helper.make_opsetid("ai.onnx", 13))
    assert import_error(model) == "<model>: error: the model names two opsets of the default ONNX domain: 13 and 17"


def test_gc_import_of_a_malformed_model_exits_1_with_one_line(tmp_path, capsys) -> None:
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="mp", kernel_shape=2)], IMG, ["y"])
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.gir")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{tmp_path / 'm.onnx'}: error: node 0 'mp': MaxPool (opset 17): attribute 'kernel_shape'")
    assert "\n" not in err and "Traceback" not in err


# Fuzzing: valid small models, mutated in their bytes and in their structure, may only ever import (as a
# module that verifies) or raise GCError. GC_FUZZ_EXAMPLES=3000 pytest -k fuzz runs it longer.


def _fuzz_seeds() -> list[bytes]:
    """A conv net, a matmul and add, a chain of shape arithmetic, a pooling net: serialized, as files hold them."""
    mlp = make_model(
        [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "b"], ["a"]), node("LeakyRelu", ["a"], alpha=0.1)],
        {"x": rand(2, 4)},
        ["y"],
        inits={"w": rand(4, 3), "b": rand(3)},
    )
    chain = make_model(
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "zero"], ["batch"], axis=0),
            node("Mod", ["batch", "two"], ["odd"]),
            node("Add", ["batch", "odd"], ["rows"]),
            node("Unsqueeze", ["rows", "axes"], ["rows1"]),
            node("Concat", ["rows1", "minus1"], ["target"], axis=0),
            node("Reshape", ["x", "target"], ["r"]),
            node("Transpose", ["r"], ["t"], perm=[1, 0]),
            node("Softmax", ["t"], axis=-1),
        ],
        X,
        ["y"],
        inits={"zero": np.int64(0), "two": np.int64(2), "axes": ints(0), "minus1": ints(-1)},
    )
    pool = make_model(
        [
            node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 1], pads=[0, 1, 0, 0]),
            node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32([0.5]))),
            node("Mul", ["p", "c"], ["m"]),
            node("Pad", ["m", "pads"], ["q"], mode="reflect"),
            node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.float32([1]))),
            node("Add", ["q", "ones"], ["a"]),
            node("ReduceMean", ["a"], ["y"], axes=[2, 3], keepdims=1),
        ],
        IMG,
        ["y"],
        opset=13,
        inits={"pads": ints(0, 0, 1, 1, 0, 0, 1, 1), "s": ints(1, 1, 1)},
    )
    return [m.SerializeToString() for m in (conv_net(), mlp, chain, pool)]


FUZZ_SEEDS = _fuzz_seeds()
ATTRIBUTE_VALUES = [0, 2, -1, 1 << 40, 2.5, "SAME_UPPER", b"\xff", [], [2, 2], [0, -1], [1.5], ["a"], rand(2)]


def _names(model) -> list[str]:
    g = model.graph
    return [*(i.name for i in g.input), *(i.name for i in g.initializer), *(o for n in g.node for o in n.output)]


@st.composite
def mutated_models(draw) -> bytes:
    """A seed model with a few structured mutations (what protobuf lets a malformed file say), then maybe a
    few byte mutations (what a damaged file holds)."""
    model = onnx.ModelProto.FromString(draw(st.sampled_from(FUZZ_SEEDS)))
    g = model.graph
    for _ in range(draw(st.integers(0, 3))):
        kinds = ["input", "attr_type", "attr", "dims", "dtype", "values", "shape", "rename", "opset", "op", "drop"]
        kind = draw(st.sampled_from(kinds))
        n = g.node[draw(st.integers(0, len(g.node) - 1))] if g.node else None
        if kind == "input" and n is not None and n.input:  # drop a node input, or leave it empty
            k = draw(st.integers(0, len(n.input) - 1))
            if draw(st.booleans()):
                del n.input[k]
            else:
                n.input[k] = ""
        elif kind == "attr_type" and n is not None and n.attribute:  # declare another type, keep the value
            n.attribute[draw(st.integers(0, len(n.attribute) - 1))].type = draw(st.integers(0, 14))
        elif kind == "attr" and n is not None:  # a value of any type, for an attribute of the node or not
            names = [a.name for a in n.attribute] + ["axis", "kernel_shape", "perm", "to", "value", "mode"]
            name, value = draw(st.sampled_from(names)), draw(st.sampled_from(ATTRIBUTE_VALUES))
            value = numpy_helper.from_array(value) if isinstance(value, np.ndarray) else value
            kept = [a for a in n.attribute if a.name != name]
            del n.attribute[:]
            empty = onnx.AttributeProto.INTS if isinstance(value, list) and not value else None  # no type to infer
            n.attribute.extend([*kept, helper.make_attribute(name, value, attr_type=empty)])
        elif kind == "dims" and g.initializer:
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            del t.dims[:]
            t.dims.extend(draw(st.lists(st.integers(-2, 7), max_size=4)))
        elif kind == "values" and g.initializer:  # the same dims, other numbers: shapes, axes, pads, NaN
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            if t.data_type in (F, I64) and all(0 <= d <= 64 for d in t.dims):
                ints_ = [0, 1, 2, -1, -2, 7, 1 << 40, -(1 << 62)]
                numbers = st.sampled_from(ints_ + [0.5, np.nan, np.inf] if t.data_type == F else ints_)
                values = draw(st.lists(numbers, min_size=math.prod(t.dims), max_size=math.prod(t.dims)))
                dtype = np.float32 if t.data_type == F else np.int64
                t.CopyFrom(numpy_helper.from_array(np.array(values, dtype).reshape(tuple(t.dims)), t.name))
        elif kind == "shape":  # a graph input's declared size: only a number
            dims = g.input[draw(st.integers(0, len(g.input) - 1))].type.tensor_type.shape.dim
            if dims:
                dims[draw(st.integers(0, len(dims) - 1))].dim_value = draw(st.sampled_from([0, 1, 7, -1, 1 << 40]))
        elif kind == "dtype" and g.initializer:
            g.initializer[draw(st.integers(0, len(g.initializer) - 1))].data_type = draw(st.integers(0, 26))
        elif kind == "rename":  # a node's or the graph's output renamed to a name already taken
            outputs = [o for n in g.node for o in n.output] if draw(st.booleans()) else None
            name = draw(st.sampled_from(_names(model)))
            if outputs:
                n = next(n for n in g.node if n.output)
                n.output[draw(st.integers(0, len(n.output) - 1))] = name
            else:
                g.output[draw(st.integers(0, len(g.output) - 1))].name = name
        elif kind == "opset":
            model.opset_import[0].version = draw(st.one_of(st.integers(1, 28), st.integers(-3, 1000)))
        elif kind == "op" and n is not None:
            n.op_type = draw(st.sampled_from(sorted(CONVERTERS)))
        elif kind == "drop" and n is not None:
            g.node.remove(n)
    data = bytearray(model.SerializeToString())
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):  # most byte mutations only break the protobuf
        i = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete"]))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[i : i + draw(st.integers(1, 8))]
    return bytes(data)


@settings(
    max_examples=int(os.environ.get("GC_FUZZ_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=mutated_models())
def test_fuzz_mutated_model_imports_or_raises_gc_error(tmp_path, data: bytes) -> None:
    path = tmp_path / "m.onnx"  # through a file, as `gc import` reads it
    path.write_bytes(data)
    try:
        imported = import_onnx(path)
    except GCError as e:
        assert e.message and e.render().startswith(f"{path}: error: ")
        return
    verify_module(imported.module)


def test_without_the_onnx_package_import_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.raises(GCError, match="gc import needs the onnx package: pip install onnx"):
        import_onnx("model.onnx")


# --- the command ----------------------------------------------------------------------------------------------


def test_gc_import_writes_gir_and_npz_that_gc_runs(tmp_path, capsys) -> None:
    model = conv_net()
    onnx.save(model, tmp_path / "net.onnx")
    assert main(["import", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "net.gir")]) == 0
    assert "wrote" in capsys.readouterr().err
    weights = dict(np.load(tmp_path / "net.npz"))
    assert set(weights) == {"conv1.weight", "conv1.bias", "fc.weight", "fc.bias"}
    x = rand(1, 3, 5, 5)
    np.savez(tmp_path / "in.npz", **weights, **{"input.1": x})
    assert (
        main(
            [
                "run",
                str(tmp_path / "net.gir"),
                "--inputs",
                str(tmp_path / "in.npz"),
                "--outputs",
                str(tmp_path / "out.npz"),
                "--quiet",
            ]
        )
        == 0
    )
    expected = ReferenceEvaluator(model).run(None, {"input.1": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["result0"], expected, rtol=1e-4, atol=1e-5)


def test_gc_import_unsupported_op_exits_1_without_traceback(tmp_path, capsys) -> None:
    model = make_model([helper.make_node("NonZero", ["x"], ["y"], name="nz")], X, ["y"])
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.gir")]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"{tmp_path / 'm.onnx'}: error: node 0 'nz': unsupported op NonZero (opset 17)"


def test_gc_import_of_a_file_that_is_not_onnx_exits_1(tmp_path, capsys) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"\xff\x00 not a model")
    assert main(["import", str(tmp_path / "bad.onnx")]) == 1
    assert "cannot read the model" in capsys.readouterr().err


def test_gc_import_bad_input_shape_is_a_usage_error(tmp_path, capsys) -> None:
    onnx.save(conv_net(), tmp_path / "net.onnx")
    assert main(["import", str(tmp_path / "net.onnx"), "--input-shape", "x=1by3"]) == 1
    assert "expected NAME=D1xD2x..." in capsys.readouterr().err


def test_gc_import_one_input_given_two_shapes_is_an_error(tmp_path, capsys) -> None:
    onnx.save(conv_net(), tmp_path / "net.onnx")
    args = ["import", str(tmp_path / "net.onnx"), "--input-shape", "x=1x3x8x8", "--input-shape", "x=2x3x8x8"]
    assert main([*args, "-o", str(tmp_path / "net.gir")]) == 1
    assert "--input-shape gives 'x' two shapes: 1x3x8x8 and 2x3x8x8" in capsys.readouterr().err


def test_gc_import_reads_a_model_from_standard_input(tmp_path) -> None:
    from helpers import gc

    model = make_model([node("Relu", ["x"])], {"x": rand(2, 3)}, ["y"])
    r = gc("import", "-", "-o", str(tmp_path / "m.gir"), stdin=model.SerializeToString())
    assert r.returncode == 0, r.stderr
    assert "graph.relu" in (tmp_path / "m.gir").read_text() and "from <stdin>" in (tmp_path / "m.gir").read_text()
    r = gc("import", "-", "-o", str(tmp_path / "x.gir"), stdin=b"\x08\x07garbage")
    assert r.returncode == 1 and r.stderr.startswith("<stdin>: error: cannot read the model")
    r = gc("import", "-", "-o", "/nonexistent/x.gir", stdin=model.SerializeToString())
    assert r.returncode == 1 and "cannot write /nonexistent/x.gir" in r.stderr



# --- activations, rounding, normalization, one-hot, running products, einsum's ellipses, rotary embeddings ---

ROT_X, ROT_COS, ROT_SIN = rand(2, 3, 4, 8), rand(6, 4), rand(6, 4)  # [batch, heads, seq, head], [positions, half]
MORE_CASES = [
    case("ThresholdedRelu", node("ThresholdedRelu", ["x"], alpha=0.3), X, opset=22),
    case("Celu", node("Celu", ["x"], alpha=0.7), X, opset=12),
    case("Shrink-soft", node("Shrink", ["x"], bias=0.2, lambd=0.4), X, opset=9),
    case("Shrink-int", node("Shrink", ["x"], bias=1.0, lambd=1.5), {"x": ints(-3, -2, -1, 0, 1, 2, 3)}, opset=9),
    case("Sign", node("Sign", ["x"]), {"x": np.float32([-2.5, -0.0, 0.0, 3.0, np.inf, -np.inf])}, opset=13),
    case("Sign-int", node("Sign", ["x"]), {"x": ints(-7, 0, 9)}, opset=13),
    # halves to even, on both sides of 0, past 2^23 (every float an integer) and the infinities
    case("Round", node("Round", ["x"]), {"x": np.float32([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.7, -2.7,
                                                          8388609.0, 1e30, -np.inf, np.inf])}, opset=22),
    case("Mish", node("Mish", ["x"]), X, opset=22),
    case("MeanVarianceNormalization", node("MeanVarianceNormalization", ["x"], axes=[0, 2]), X, opset=13),
    case("SwiGLU-alpha", node("SwiGLU", ["a", "b"], alpha=1.702), {"a": rand(2, 5), "b": rand(2, 5)}, opset=28),
    case("EyeLike-k-dtype", node("EyeLike", ["x"], k=-1, dtype=TensorProto.INT32), {"x": rand(3, 5)}, opset=22),
    case("OneHot-values-at-run-time", node("OneHot", ["i", "d", "v"], axis=1),
         {"i": ints(1, -1, 5, -6, 0).reshape(5, 1), "v": np.float32([-1, 3])}, opset=11, inits={"d": np.float32(5)}),
    case("OneHot-float-indices", node("OneHot", ["i", "d", "v"]), {"i": np.float32([[0, 2], [-1, 7]])}, opset=11,
         inits={"d": np.int64(4), "v": ints(0, 1)}),
    case("CumProd-axis-const", node("CumProd", ["x", "a"], exclusive=1, reverse=1), {"x": rand(2, 3, 4)}, opset=26,
         inits={"a": np.int32(-2)}),
    *(case(f"CumProd-axis-at-run-time-{a}", node("CumProd", ["x", "a"]),
           {"x": rand(2, 3, 4), "a": np.array(a, np.int64)}, opset=26) for a in (0, 2, -2)),
    case("Einsum-ellipsis-broadcast", node("Einsum", ["a", "b"], equation="...ij,...jk->...ik"),
         {"a": rand(2, 1, 3, 4), "b": rand(5, 4, 2)}, opset=12),
    case("Einsum-ellipsis-implicit-and-diagonal", node("Einsum", ["a"], equation="i...i"), {"a": rand(3, 2, 4, 3)},
         opset=12),
    case("Einsum-diagonal-trace", node("Einsum", ["a"], equation="ii->"), {"a": rand(4, 4)}, opset=12),
    case("RotaryEmbedding", node("RotaryEmbedding", ["x", "c", "s", "p"]),
         {"x": ROT_X, "c": ROT_COS, "s": ROT_SIN, "p": ints(0, 2, 4, 5, 1, 3, 3, 0).reshape(2, 4)}, opset=23),
    case("RotaryEmbedding-3d-interleaved-partial", node("RotaryEmbedding", ["x", "c", "s"], interleaved=1,
                                                        num_heads=2, rotary_embedding_dim=4),
         {"x": rand(2, 3, 12), "c": rand(2, 3, 2), "s": rand(2, 3, 2)}, opset=23),
]


@pytest.mark.parametrize(("nodes", "inputs", "opset", "inits", "outputs", "expect"), MORE_CASES)
def test_more_ops_import_as_onnx_reference_computes(nodes, inputs, opset, inits, outputs, expect) -> None:
    test_op_imports_as_onnx_reference_computes(nodes, inputs, opset, inits, outputs, expect)


def test_round_cumprod_one_hot_and_rotary_embedding_compile() -> None:
    x = np.float32([[0.5, 1.5, 2.5, -0.5, -2.5, 8388609.0], [0.7, -1.2, 3.0, 1.1, 0.9, -1.0]])
    feeds = {"x": x, "i": ints(2, -1, 9), "v": np.float32([0.25, 4]), "r": ROT_X,
             "p": ints(0, 5, 1, 2, 3, 4, 0, 1).reshape(2, 4)}
    model = make_model([node("Round", ["x"], ["a"]), node("CumProd", ["x", "ax"], ["b"], reverse=1),
                        node("OneHot", ["i", "d", "v"], ["c"], axis=0),
                        node("RotaryEmbedding", ["r", "cc", "sc", "p"], ["e"], interleaved=1)],
                       feeds, ["a", "b", "c", "e"], opset=26,
                       inits={"ax": np.int64(1), "d": np.int64(3), "cc": ROT_COS, "sc": ROT_SIN})
    want = ReferenceEvaluator(model).run(None, feeds)
    imported = import_onnx(model)
    got = compiler.compile(imported.module, "llvm", cache=False)(**feeds, **imported.weights)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("nodes", "inputs", "inits", "message"), [
    (node("OneHot", ["i", "d", "v"]), {"i": ints(1), "d": ints(3), "v": rand(2)}, {}, "depth.*must be a constant"),
    (node("OneHot", ["i", "d", "v"]), {"i": ints(1), "v": rand(3)}, {"d": ints(3)}, r"values must be \[off_value"),
    (node("OneHot", ["i", "d", "v"]), {"i": ints(1), "v": rand(2)}, {"d": ints(0)}, "depth must be a positive"),
    (node("RotaryEmbedding", ["x", "c", "s"]), {"x": rand(1, 2, 8), "c": rand(1, 2, 4), "s": rand(1, 2, 4)}, {},
     "num_heads > 0"),
    (node("RotaryEmbedding", ["x", "c", "s"], rotary_embedding_dim=3), {"x": rand(1, 2, 2, 8), "c": rand(1, 2, 1),
                                                                       "s": rand(1, 2, 1)}, {}, "must be even"),
    (node("RotaryEmbedding", ["x", "c", "s"]), {"x": rand(1, 2, 2, 8), "c": rand(1, 2, 3), "s": rand(1, 2, 3)}, {},
     "last size must be"),
    (node("SwiGLU", ["a", "b"]), {"a": rand(2, 3), "b": rand(3)}, {}, "must have one shape"),
    (node("EyeLike", ["x"]), {"x": rand(2, 2, 2)}, {}, "must be 2-D"),
    (node("Celu", ["x"], alpha=0.0), {"x": rand(3)}, {}, "nonzero finite"),
])
def test_more_ops_bad_models_are_one_diagnostic(nodes, inputs, inits, message) -> None:
    model = make_model([nodes], inputs, ["y"], opset=28, inits=inits)
    with pytest.raises(GCError, match=message):
        import_onnx(model)


def test_cumprod_has_no_gradient_rule_and_says_so() -> None:
    from compiler.parser import parse
    from compiler.pipeline import run_pipeline

    module = parse("func @main(%x: tensor<3x4xf32>) -> tensor<f32> {\n  %y = graph.cumprod(%x) {axis = 1}\n"
                   "  %s = graph.reduce_sum(%y)\n  return %s\n}\n", "t.gir")
    with pytest.raises(GCError, match="graph.cumprod has no gradient rule"):
        run_pipeline(module, "autodiff")


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceLogSumExp", "ReduceMax"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduction_axes_fed_as_an_input_are_taken_at_each_call(op: str, keepdims: int) -> None:
    """One import, called with other axes each time: on the interpreter and compiled (a model per value)."""
    import compiler
    from compiler.interpreter import run

    x = rand(2, 3, 4)
    model = make_model([node(op, ["x", "axes"], keepdims=keepdims)], {"x": x, "axes": ints(0, 2)}, ["y"], opset=18)
    imported = import_onnx(model)
    compiled = compiler.compile(imported.module, "llvm")
    ref = {"ReduceSum": np.sum, "ReduceMax": np.max,
           "ReduceLogSumExp": lambda a, axis, keepdims: np.log(np.sum(np.exp(a), axis=axis, keepdims=keepdims))}[op]
    for axes in ([0, 2], [1, -1], [2, 0]):
        want = ref(x, axis=tuple(axes), keepdims=bool(keepdims))
        np.testing.assert_allclose(run(imported.module, {"x": x, "axes": ints(*axes)})[0], want, rtol=1e-5)
        np.testing.assert_allclose(compiled(x, ints(*axes))[0], want, rtol=1e-5, atol=1e-6)
