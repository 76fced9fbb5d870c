"""gc import of ONNX's attention-family ops: Attention's sliding window and nonpad_kv_seqlen, LinearAttention and
CausalConvWithState (opset 27), each checked against ONNX's reference evaluator on the interpreter and compiled;
and the diagnostics for what gc does not take."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.diagnostics import GCError
from compiler.importers.onnx import import_onnx

RNG = np.random.default_rng(7)


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def model(op: str, ins: list[str], outs: list[str], inputs: dict, opset: int = 27, **attrs):
    info = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()
    ]
    outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs if o]
    graph = helper.make_graph([helper.make_node(op, ins, outs, **attrs)], "g", info, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(m, feeds: dict, target: str = "interp", rtol: float = 1e-5, atol: float = 1e-5) -> None:
    expected = ReferenceEvaluator(m).run(None, feeds)
    module = import_onnx(m).module
    got = compiler.run(module, feeds) if target == "interp" else compiler.compile(module, "llvm", cache=False)(**feeds)
    got = got if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = np.asarray(g)
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


# --- Attention: left_window_size / right_window_size, nonpad_kv_seqlen ----------------------------------------

ATTENTION = [
    pytest.param(
        ["q", "k", "v"],
        {"q": rand(2, 3, 5, 4), "k": rand(2, 3, 5, 4), "v": rand(2, 3, 5, 4)},
        {"left_window_size": 1, "right_window_size": 0},
        id="left1-right0-not-causal",
    ),
    pytest.param(
        ["q", "k", "v"],
        {"q": rand(1, 2, 6, 4), "k": rand(1, 2, 6, 4), "v": rand(1, 2, 6, 3)},
        {"left_window_size": 0, "right_window_size": 2},
        id="right-only",
    ),
    pytest.param(
        ["q", "k", "v", "", "pk", "pv"],
        {
            "q": rand(2, 2, 3, 4),
            "k": rand(2, 2, 3, 4),
            "v": rand(2, 2, 3, 4),
            "pk": rand(2, 2, 5, 4),
            "pv": rand(2, 2, 5, 4),
        },
        {"is_causal": 1, "left_window_size": 3},
        id="causal-window-after-past",
    ),
    pytest.param(
        ["q", "k", "v", "m"],
        {"q": rand(2, 3, 16), "k": rand(2, 5, 8), "v": rand(2, 5, 6), "m": RNG.random((3, 5)) > 0.3},
        {"q_num_heads": 4, "kv_num_heads": 2, "left_window_size": 1, "right_window_size": 1},
        id="3d-gqa-bool-mask",
    ),
    pytest.param(
        ["q", "k", "v", "m", "", "", "n"],
        {
            "q": rand(3, 2, 2, 4),
            "k": rand(3, 2, 7, 4),
            "v": rand(3, 2, 7, 4),
            "m": rand(1, 7),
            "n": np.array([7, 4, 2], np.int64),
        },
        {"is_causal": 1, "left_window_size": 2},
        id="nonpad-causal-window",
    ),
    pytest.param(
        ["q", "k", "v", "", "", "", "n"],
        {"q": rand(2, 1, 3, 4), "k": rand(2, 1, 6, 4), "v": rand(2, 1, 6, 4), "n": np.array([6, 3], np.int64)},
        {},
        id="nonpad-padding-only",
    ),
]


@pytest.mark.parametrize("target", ["interp", "llvm"])
@pytest.mark.parametrize(("ins", "feeds", "attrs"), ATTENTION)
def test_attention_window_and_nonpad(ins, feeds, attrs, target) -> None:
    m = model("Attention", ins, ["y", "pk_out", "pv_out", "s"], feeds, opset=25, qk_matmul_output_mode=3, **attrs)
    check(m, feeds, target)


# --- LinearAttention -------------------------------------------------------------------------------------------


def _linear(
    rule: str,
    b=2,
    t=5,
    hq=4,
    hkv=2,
    dk=3,
    dv=4,
    past=True,
    per_head_decay=False,
    beta_one=False,
    dtype=np.float32,
    **attrs,
):
    feeds = {
        "q": rand(b, t, hq * dk, dtype=dtype),
        "k": rand(b, t, hkv * dk, dtype=dtype) * 0.5,
        "v": rand(b, t, hkv * dv, dtype=dtype),
    }
    ins = ["q", "k", "v", "s" if past else "", "", ""]
    if past:
        feeds["s"] = rand(b, hkv, dk, dv, dtype=dtype)
    if rule in ("gated", "gated_delta"):
        feeds["g"] = (-RNG.random((b, t, hkv if per_head_decay else hkv * dk))).astype(dtype)
        ins[4] = "g"
    if rule in ("delta", "gated_delta"):
        feeds["beta"] = RNG.random((b, t, 1 if beta_one else hkv)).astype(dtype)
        ins[5] = "beta"
    while not ins[-1]:
        ins.pop()
    return model(
        "LinearAttention", ins, ["y", "state"], feeds, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule, **attrs
    ), feeds


LINEAR = [
    pytest.param({"rule": "linear"}, id="linear"),
    pytest.param({"rule": "linear", "t": 1, "past": False, "hq": 2, "hkv": 2}, id="linear-decode-no-past"),
    pytest.param({"rule": "gated"}, id="gated-per-key"),
    pytest.param({"rule": "gated", "per_head_decay": True, "scale": 0.7}, id="gated-per-head-scale"),
    pytest.param({"rule": "delta", "past": False}, id="delta-no-past"),
    pytest.param({"rule": "gated_delta", "hkv": 1, "beta_one": True}, id="gated-delta-mqa-beta1"),
    pytest.param({"rule": "gated_delta", "per_head_decay": True, "chunk_size": 2}, id="gated-delta-per-head"),
]


@pytest.mark.parametrize("target", ["interp", "llvm"])
@pytest.mark.parametrize("kw", LINEAR)
def test_linear_attention(kw, target) -> None:
    kw = dict(kw)
    m, feeds = _linear(kw.pop("rule"), **kw)
    check(m, feeds, target, rtol=1e-4, atol=1e-5)


def test_linear_attention_fp16_keeps_the_types() -> None:
    m, feeds = _linear("gated_delta", dtype=np.float16)
    check(m, feeds, rtol=2e-3, atol=2e-3)


# --- CausalConvWithState ------------------------------------------------------------------------------------


CONV = [
    pytest.param({"k": 4}, id="no-past"),
    pytest.param({"k": 3, "past": True, "bias": True}, id="past-bias"),
    pytest.param({"k": 4, "past": True, "activation": "silu"}, id="past-silu"),
    pytest.param({"k": 2, "length": 1, "past": True, "activation": "swish"}, id="decode-swish"),
    pytest.param({"k": 5, "length": 2}, id="shorter-than-kernel"),
    pytest.param({"k": 1, "bias": True}, id="kernel-one"),
]


def _conv(k, length=6, past=False, bias=False, dtype=np.float32, **attrs):
    b, c = 2, 3
    feeds = {"x": rand(b, c, length, dtype=dtype), "w": rand(c, 1, k, dtype=dtype)}
    ins = ["x", "w", "", ""]
    if bias:
        feeds["bias"], ins[2] = rand(c, dtype=dtype), "bias"
    if past:
        feeds["p"], ins[3] = rand(b, c, k - 1, dtype=dtype), "p"
    while not ins[-1]:
        ins.pop()
    return model("CausalConvWithState", ins, ["y", "state"], feeds, **attrs), feeds


@pytest.mark.parametrize("target", ["interp", "llvm"])
@pytest.mark.parametrize("kw", CONV)
def test_causal_conv_with_state(kw, target) -> None:
    m, feeds = _conv(**kw)
    check(m, feeds, target)


# --- diagnostics --------------------------------------------------------------------------------------------


def _raises(m, match: str) -> None:
    with pytest.raises(GCError, match=match) as e:
        import_onnx(m)
    assert "Traceback" not in str(e.value)


def test_diagnostics() -> None:
    f = {"q": rand(1, 1, 2, 4), "k": rand(1, 1, 2, 4), "v": rand(1, 1, 2, 4)}
    _raises(
        model("Attention", ["q", "k", "v"], ["y"], f, opset=25, left_window_size=-2),
        r"left_window_size must be -1 \(unbounded\) or at least 0, got -2",
    )
    _raises(
        model("Attention", ["q", "k", "v"], ["y"], f, opset=24, left_window_size=1),
        "attribute 'left_window_size' came in opset 25",
    )
    f = {
        "q": rand(1, 1, 2, 4),
        "k": rand(1, 1, 2, 4),
        "v": rand(1, 1, 2, 4),
        "pk": rand(1, 1, 1, 4),
        "pv": rand(1, 1, 1, 4),
        "n": np.array([2], np.int64),
    }
    _raises(
        model("Attention", ["q", "k", "v", "", "pk", "pv", "n"], ["y"], f, opset=25),
        "nonpad_kv_seqlen cannot be combined with past_key",
    )
    m, _ = _linear("linear")
    m.graph.node[0].attribute[-1].s = b"rwkv"
    _raises(m, "update_rule 'rwkv' is not one of linear, gated, delta, gated_delta")
    m, _ = _linear("gated")
    m.graph.node[0].attribute[-1].s = b"linear"
    _raises(m, r"update_rule 'linear' takes no input #4 \(decay\)")
    m, _ = _linear("linear", hq=3, hkv=2)
    _raises(m, r"q_num_heads \(3\) must be a positive multiple of kv_num_heads \(2\)")
    m, _ = _conv(k=3, activation="relu")
    _raises(m, "activation 'relu' is not one of none, silu, swish")
    f = {"x": rand(1, 2, 4), "w": rand(3, 1, 2)}
    _raises(model("CausalConvWithState", ["x", "w"], ["y", "s"], f), r"weight must be \[2, 1, k\]")
