"""Small PyTorch nets exported to ONNX (torch.onnx.export, the TorchScript exporter: the default dynamo
exporter needs onnxscript), imported by gc, compiled for llvm with the weights bound, and compared with
what torch computes. Skipped where torch is not installed (it is not in the test extra)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
import torch.nn.functional as F
from torch import nn

import compiler
from compiler.importers.onnx import import_onnx
from compiler.ir import Sym


class ConvBN(nn.Module):
    """Conv, BatchNorm, ReLU, max pool; a grouped strided conv, BatchNorm, ReLU6; global pool, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, 10),
        )

    def forward(self, x):
        return self.body(x)


class MLP(nn.Module):
    """Linear, GELU, dropout, Linear, LayerNorm, tanh, Linear, log-softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(32, 64),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(64, 64),
            nn.LayerNorm(64),
            nn.Tanh(),
            nn.Linear(64, 5),
            nn.LogSoftmax(-1),
        )

    def forward(self, x):
        return self.body(x)


class Attention(nn.Module):
    """A pre-norm transformer block: nn.MultiheadAttention, then an MLP, each with a residual."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class CausalAttention(nn.Module):
    """Causal self-attention through F.scaled_dot_product_attention (a Trilu mask, Where, Split)."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


NETS = {
    "conv-bn": (ConvBN, (2, 3, 16, 16)),
    "mlp": (MLP, (4, 32)),
    "attention": (Attention, (1, 6, 16)),
    "causal-attention": (CausalAttention, (2, 5, 16)),
}


def export(net: nn.Module, x, dynamic_axes: dict | None = None) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated in favour of dynamo
        torch.onnx.export(net, (x,), f, dynamo=False, input_names=["x"], output_names=["y"], dynamic_axes=dynamic_axes)
    return f.getvalue()


@pytest.mark.parametrize("name", ["conv-bn", "mlp"])
def test_a_dynamic_batch_imports_as_a_question_mark_and_runs_at_every_batch(name: str) -> None:
    """Exported with a named batch axis: gc keeps it `?` (the contract's v2), and one compile runs every batch
    as torch does."""
    torch.manual_seed(0)
    cls, shape = NETS[name]
    net = cls().eval()
    imported = import_onnx(onnx.load_from_string(export(net, torch.randn(*shape), {"x": {0: "batch"}, "y": {0: "batch"}})))
    assert imported.note == ""
    assert not imported.module["main"].args[0].type.is_static
    model = compiler.compile(imported.module, "llvm", params=imported.weights)
    for batch in (1, 3, shape[0]):
        x = torch.randn(batch, *shape[1:])
        with torch.no_grad():
            expected = net(x).numpy()
        np.testing.assert_allclose(model(x=x.numpy())[0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["causal-attention"])
def test_a_dynamic_batch_and_sequence_run_at_every_size(name: str) -> None:
    """Attention reads its input's sizes to split heads (Shape -> Gather -> Concat -> Reshape) and to mask
    (Trilu): with the batch and the sequence named, they are expressions of the names, and the module stays
    dynamic. (nn.MultiheadAttention's TorchScript export bakes the traced sequence length into a shape.)"""
    torch.manual_seed(0)
    cls, shape = NETS[name]
    net = cls().eval()
    axes = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}}
    imported = import_onnx(onnx.load_from_string(export(net, torch.randn(*shape), axes)))
    assert imported.note == "" and imported.module["main"].args[0].type.shape[:2] == (Sym.symbol("batch"), Sym.symbol("seq"))
    model = compiler.compile(imported.module, "llvm", params=imported.weights, cache=False)
    for size in ((1, 3), (2, 9), (3, 1), (1, 3), (3, 6)):
        x = torch.randn(*size, shape[-1])
        with torch.no_grad():
            expected = net(x).numpy()
        np.testing.assert_allclose(model(x=x.numpy())[0], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(compiler.run(imported.module, {"x": x.numpy(), **imported.weights})[0], expected,
                                   rtol=1e-4, atol=1e-5)
    assert len(model._models) == 4  # a memory plan per size
    # The sizes' arithmetic is evaluated on the names (codegen/symbolic.py): the products are one kernel for
    # every batch and sequence from 2 up (the softmax over the sequence is built per length).
    assert model.symbolic is not None
    at = [model.model_for([(*size, shape[-1])]).plan.steps for size in ((2, 9), (3, 6))]
    assert [s.kernel for s in at[0] if s.schedule == "matmul"] == [s.kernel for s in at[1] if s.schedule == "matmul"]


@pytest.mark.parametrize("name", NETS)
def test_torch_export_compiled_by_gc_matches_torch(name: str) -> None:
    torch.manual_seed(0)
    cls, shape = NETS[name]
    net = cls().eval()
    with torch.no_grad():
        for p in net.parameters():  # random, so that the exporter cannot merge equal initializers
            p.normal_(0, 0.5)
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
        x = torch.randn(*shape)
        expected = net(x).numpy()
    imported = import_onnx(onnx.load_from_string(export(net, x)))
    model = compiler.compile(imported.module, "llvm", params=imported.weights)
    np.testing.assert_allclose(model(x=x.numpy())[0], expected, rtol=1e-4, atol=1e-5)
    interpreted = compiler.run(imported.module, {"x": x.numpy(), **imported.weights})[0]
    np.testing.assert_allclose(interpreted, expected, rtol=1e-4, atol=1e-5)
