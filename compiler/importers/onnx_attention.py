"""ONNX attention-family ops as graph ops: LinearAttention and CausalConvWithState (opset 27), and the
position masks of Attention (causal, sliding window, nonpad_kv_seqlen) that onnx_ops' converter adds.

Each is written with existing graph ops, as onnx's reference implementation computes it; the sequence
lengths are static, so LinearAttention's recurrence over time is unrolled, one state update per token.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.importers.onnx_ops import converts
from compiler.ir import DType, Value, static
from dialects.graph.common import cast_to

if TYPE_CHECKING:
    from compiler.importers.onnx import Node

MAX_STEPS = 4096  # LinearAttention unrolls one state update per token: a longer sequence is refused


def _static(n: Node, *values: Value) -> None:
    for v in values:
        if not static(v.type.shape):
            raise n.error(f"needs static shapes, but an input is {v.type}: give the sizes with --input-shape")


# --- Attention's position masks --------------------------------------------------------------------------


def window_sizes(n: Node) -> tuple[int, int]:
    """Attention's left_window_size and right_window_size (opset 25): -1 (unbounded) or a count of keys."""
    sizes = []
    for name in ("left_window_size", "right_window_size"):
        if name in n.attrs and n.schema is not None and name not in n.schema.attributes:
            raise n.error(f"attribute '{name}' came in opset 25")
        w = n.attr(name, -1)
        if w < -1:
            raise n.error(f"{name} must be -1 (unbounded) or at least 0, got {w}")
        sizes.append(w)
    return sizes[0], sizes[1]


def position_bias(n: Node, dt: DType, lq: int, lk: int, past: int, nonpad: Value | None) -> Value | None:
    """The additive bias (0 or -inf) of Attention's position rules, or None if there are none. A query at
    in-block index i sits at p = i + offset, offset the past's length (or nonpad_kv_seqlen[b] - lq per
    batch); it attends key j iff j <= p (is_causal), p - left <= j (left_window_size >= 0), j <= p + right
    (right_window_size >= 0), and j < nonpad_kv_seqlen[b]. [lq, lk], or [B, 1, lq, lk] with nonpad."""
    causal = bool(n.attr("is_causal", 0))
    left, right = window_sizes(n)
    if nonpad is None and not causal and left < 0 and right < 0:
        return None
    diff = np.arange(lq)[:, None] - np.arange(lk)[None, :]  # p - j, less the offset
    ninf = np.array(float("-inf"), dt.np)
    if nonpad is None:
        d = diff + past
        allowed = np.ones((lq, lk), bool)
        if causal:
            allowed &= d >= 0
        if left >= 0:
            allowed &= d <= left
        if right >= 0:
            allowed &= -d <= right
        return n.constant(np.where(allowed, np.array(0, dt.np), ninf), dt)
    if nonpad.type.rank != 1 or nonpad.type.dtype != DType.i64:
        raise n.error(f"nonpad_kv_seqlen must be a 1-D tensor of int64, not {nonpad.type}")
    b = nonpad.type.shape[0]
    lengths = n.b.reshape(nonpad, shape=(b, 1, 1, 1))
    i64 = DType.i64
    d = n.b.add(n.constant((diff - lq)[None, None], i64), lengths)  # [B, 1, lq, lk]: p - j

    def bound(op: str, limit: int) -> Value:
        return getattr(n.b, op)(d, n.constant(np.array(limit), i64))

    allowed = n.b.less(n.constant(np.arange(lk).reshape(1, 1, 1, lk), i64), lengths)  # not padding
    for keep, cond in (
        (causal, ("greater", -1)),
        (left >= 0, ("less", left + 1)),
        (right >= 0, ("greater", -right - 1)),
    ):
        if keep:
            allowed = n.b.where(allowed, bound(*cond), n.constant(np.array(False), DType.i1))
    return n.b.where(allowed, n.constant(np.array(0), dt), n.constant(ninf, dt))


# --- LinearAttention ------------------------------------------------------------------------------------

_RULES = ("linear", "gated", "delta", "gated_delta")


@converts("LinearAttention", attrs="chunk_size kv_num_heads q_num_heads scale update_rule")
def linear_attention(n: Node) -> list:
    """The linear-attention recurrence (opset 27) unrolled over the tokens, in float32 as onnx's reference
    computes it: per token t, the state S [B, H_kv, d_k, d_v] decays by exp(g_t) (gated rules), the value
    becomes beta_t (v_t - S^T k_t) (delta rules), S += k_t v_t^T, and o_t = scale q_t^T S, each KV head's
    state read by its group of query heads. Outputs: [B, T, H_q d_v] in the query's type, and the final
    state in past_state's type (the query's without one)."""
    rule = n.attr("update_rule", "gated_delta")
    if rule not in _RULES:
        raise n.error(f"update_rule '{rule}' is not one of {', '.join(_RULES)}")
    hq, hkv = n.attr("q_num_heads"), n.attr("kv_num_heads")
    if hq < 1 or hkv < 1 or hq % hkv:
        raise n.error(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    for i, name, needed in ((4, "decay", gated), (5, "beta", delta)):
        if n.has(i) != needed:
            raise n.error(f"update_rule '{rule}' {'requires' if needed else 'takes no'} input #{i} ({name})")
    q, k, v = n.x(0), n.x(1), n.x(2)
    _static(n, q, k, v)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.type.rank != 3:
            raise n.error(f"{name} must be 3-D [B, T, H * D], not {t.type}")
    b, steps, qh = q.type.shape
    if k.type.shape[:2] != (b, steps) or v.type.shape[:2] != (b, steps):
        raise n.error(f"query {q.type}, key {k.type} and value {v.type} must share B and T")
    if qh % hq or v.type.shape[2] % hkv:
        raise n.error(f"query {q.type} and value {v.type} do not split into {hq} and {hkv} heads")
    dk, dv = qh // hq, v.type.shape[2] // hkv
    if k.type.shape[2] != hkv * dk:
        raise n.error(f"key {k.type} must have {hkv} heads of the query's head size {dk}")
    if steps > MAX_STEPS:
        raise n.error(f"a sequence of {steps} tokens is too long: gc unrolls the recurrence up to {MAX_STEPS}")
    f32 = DType.f32

    def heads(t: Value, h: int) -> Value:  # [B, T, h * D] -> [B, h, T, D] in float32
        t = n.b.reshape(cast_to(n.b, t, f32), shape=(b, steps, h, t.type.shape[2] // h))
        return n.b.transpose(t, perm=(0, 2, 1, 3))

    q4, k4, v4 = heads(q, hq), heads(k, hkv), heads(v, hkv)
    gate = beta = None
    if gated:
        g = n.x(4)
        if g.type.rank != 3 or g.type.shape[:2] != (b, steps) or g.type.shape[2] not in (hkv, hkv * dk):
            raise n.error(f"decay must be [{b}, {steps}, {hkv}] or [{b}, {steps}, {hkv * dk}], not {g.type}")
        gate = n.b.exp(heads(g, hkv))  # [B, H_kv, T, 1 or d_k]
    if delta:
        be = n.x(5)
        if be.type.rank != 3 or be.type.shape[:2] != (b, steps) or be.type.shape[2] not in (hkv, 1):
            raise n.error(f"beta must be [{b}, {steps}, {hkv}] or [{b}, {steps}, 1], not {be.type}")
        beta = heads(be, be.type.shape[2])  # [B, H_kv or 1, T, 1]
    state_type = q.type.dtype
    if n.has(3):
        s = n.x(3)
        if s.type.shape != (b, hkv, dk, dv):
            raise n.error(f"past_state must be [{b}, {hkv}, {dk}, {dv}], not {s.type}")
        state_type = s.type.dtype
        s = cast_to(n.b, s, f32)
    else:
        s = n.constant(np.zeros((b, hkv, dk, dv), np.float32), f32)
    scale = n.attr("scale", 0.0)
    scale = 1.0 / math.sqrt(dk) if scale == 0.0 else float(scale)
    scale_v = n.constant(np.array(scale, np.float32), f32)

    def at(t: Value, i: int) -> Value:  # token i of [B, H, T, D]: [B, H, 1, D]
        return n.b.slice(t, starts=(i,), ends=(i + 1,), axes=(2,))

    outs = []
    for i in range(steps):
        if gate is not None:
            gi = at(gate, i)
            s = n.b.mul(s, n.b.reshape(gi, shape=(b, hkv, gi.type.shape[3], 1)))
        ki, vi = at(k4, i), at(v4, i)
        if beta is not None:
            vi = n.b.mul(at(beta, i), n.b.sub(vi, n.b.matmul(ki, s)))
        s = n.b.add(s, n.b.mul(n.b.reshape(ki, shape=(b, hkv, dk, 1)), vi))
        qi = n.b.reshape(at(q4, i), shape=(b, hkv, hq // hkv, dk))  # query head h reads KV head h // group
        outs.append(n.b.reshape(n.b.mul(n.b.matmul(qi, s), scale_v), shape=(b, hq, 1, dv)))
    o = outs[0] if steps == 1 else n.b.concat(*outs, axis=2)
    y = n.b.reshape(n.b.transpose(o, perm=(0, 2, 1, 3)), shape=(b, steps, hq * dv))
    return [cast_to(n.b, y, q.type.dtype), cast_to(n.b, s, state_type)]


# --- CausalConvWithState --------------------------------------------------------------------------------


@converts("CausalConvWithState", attrs="activation")
def causal_conv_with_state(n: Node) -> list:
    """A causal depthwise 1-D convolution (opset 27): past_state (zeros without one) before the input, a
    valid convolution with groups = channels through conv2d, then SiLU if asked (in float32, as onnx's
    reference); the new state is the last k - 1 positions of the padded sequence."""
    act = n.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise n.error(f"activation '{act}' is not one of none, silu, swish")
    x, w = n.x(0), n.x(1)
    _static(n, x, w)
    if x.type.rank != 3:
        raise n.error(f"input must be 3-D [batch, channels, length], not {x.type}")
    bt, c, _ = x.type.shape
    if w.type.rank != 3 or w.type.shape[:2] != (c, 1) or w.type.shape[2] < 1:
        raise n.error(f"weight must be [{c}, 1, k] for the {c} channels of the input, not {w.type}")
    k = w.type.shape[2]
    bias = []
    if n.has(2):
        bias = [n.x(2)]
        if bias[0].type.shape != (c,):
            raise n.error(f"bias must be [{c}], not {bias[0].type}")
    if n.has(3):
        past = n.x(3)
        if past.type.shape != (bt, c, k - 1):
            raise n.error(f"past_state must be [{bt}, {c}, {k - 1}], not {past.type}")
    else:
        past = n.constant(np.zeros((bt, c, k - 1), x.type.dtype.np), x.type.dtype)
    padded = n.b.concat(past, x, axis=2) if k > 1 else x
    y = n.b.conv2d(n.b.unsqueeze(padded, axes=(2,)), n.b.unsqueeze(w, axes=(2,)), *bias, groups=c)
    y = n.b.squeeze(y, axes=(2,))
    if act != "none":
        wide = cast_to(n.b, y, DType.f32)
        y = cast_to(n.b, n.b.mul(wide, n.b.sigmoid(wide)), y.type.dtype)
    total = padded.type.shape[2]
    state = past if k == 1 else n.b.slice(padded, starts=(total - (k - 1),), ends=(total,), axes=(2,))
    return [y, state]
