"""ONNX RNN, GRU and LSTM -> graph ops, unrolled over the sequence (static in gc).

Per direction, the input projection of every step is one `matmul` of X with W^T (plus the biases that
can be summed ahead, Wb + Rb); each step then adds its hidden state times R^T, splits the gates, and
applies the activations. Y stacks the steps' hidden states (`unsqueeze`, `concat`), Y_h and Y_c the last
ones. sequence_lens shorter than the sequence (or given at run time) masks each step with `where`: a
batch entry past its length keeps its state and writes zeros into Y, as ONNX defines (the reverse
direction then starts from its initial state at the entry's last valid step). Weights layouts: W
[num_directions, gates*hidden, input], R [num_directions, gates*hidden, hidden], B [num_directions,
2*gates*hidden] (Wb then Rb); gate orders LSTM i,o,f,c (peepholes P: i,o,f), GRU z,r,h.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.importers.onnx import SizeNeeded
from compiler.importers.onnx_ops import converts
from compiler.ir import DType, Value, differ, known

if TYPE_CHECKING:
    from compiler.importers.onnx import Node

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
# Activation -> (takes alpha, takes beta, default alpha, default beta); alphas and betas given in the
# attributes are consumed in order by the activations that take them (as ONNX Runtime reads them).
_ACTIVATIONS = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}
_NAMES = "Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus"
_MAX_STEPS = 4096  # steps unrolled per direction: a model's sizes are just numbers
_ATTRS = "activation_alpha activation_beta activations clip direction hidden_size layout"


class _Act:
    """One activation function of the node, with its alpha and beta, and the clip before it."""

    def __init__(self, n: Node, name: str, alpha: float, beta: float, clip: float | None):
        self.n, self.name, self.alpha, self.beta, self.clip = n, name, alpha, beta, clip

    def __call__(self, x: Value, clip: bool = True) -> Value:
        b, n, a, c = self.n.b, self.n, self.alpha, self.beta
        if self.clip is not None and clip:  # not before LSTM's h(Ct), as ONNX Runtime
            x = b.clip(x, min=-self.clip, max=self.clip)
        name = self.name
        if name in ("relu", "tanh", "sigmoid", "softplus"):
            return getattr(b, name)(x)
        if name == "affine":
            return b.add(b.mul(x, n.scalar(a, x)), n.scalar(c, x))
        if name == "leakyrelu":
            return b.leaky_relu(x, alpha=a)
        if name == "thresholdedrelu":
            return b.where(b.greater(x, n.scalar(a, x)), x, n.scalar(0, x))
        if name == "scaledtanh":
            return b.mul(b.tanh(b.mul(x, n.scalar(c, x))), n.scalar(a, x))
        if name == "hardsigmoid":
            return b.clip(b.add(b.mul(x, n.scalar(a, x)), n.scalar(c, x)), min=0.0, max=1.0)
        if name == "elu":
            return b.elu(x, alpha=a)
        return b.div(x, b.add(b.abs(x), n.scalar(1, x)))  # softsign


def _activations(n: Node, count: int, directions: int, clip: float | None) -> list[list[_Act]]:
    """The activation functions of each direction: `count` per direction, in the node's order."""
    names = n.attr("activations", None)
    if names is None:
        names = _DEFAULT_ACTIVATIONS[n.op_type] * directions
    elif len(names) == count and directions == 2:
        names = list(names) * 2  # one direction's list for both, as ONNX Runtime takes it
    if len(names) != count * directions:
        raise n.error(
            f"activations has {len(names)} entries, but a {n.op_type} with {directions} direction(s) takes "
            f"{count * directions} ({count} per direction)"
        )
    alphas, betas = list(n.attr("activation_alpha", [])), list(n.attr("activation_beta", []))
    acts = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise n.error(f"unsupported activation '{name}'; gc takes {_NAMES}")
        takes_a, takes_b, alpha, beta = _ACTIVATIONS[key]
        if takes_a and alphas:
            alpha = alphas.pop(0)
        if takes_b and betas:
            beta = betas.pop(0)
        if not (math.isfinite(alpha) and math.isfinite(beta)):
            raise n.error(f"activation '{name}' has alpha {alpha} and beta {beta}: they must be finite")
        acts.append(_Act(n, key, float(alpha), float(beta), clip))
    return [acts[d * count : (d + 1) * count] for d in range(directions)]


def _shape_of(n: Node, i: int, what: str, want: tuple, rank_names: str) -> None:
    """Input #i must have the shape `want` (None: any size there; a `?` size is checked at run time)."""
    shape = n.type(i).shape
    if len(shape) != len(want) or any(w is not None and differ(s, w) for s, w in zip(shape, want)):
        expect = "x".join("?" if w is None else str(w) for w in want)
        got = "x".join(str(s) if known(s) else "?" for s in shape) or "a scalar"
        raise n.error(f"input #{i} ({what}) must have the shape [{rank_names}] = {expect}, but has {got}")


def _pick(n: Node, v: Value, d: int) -> Value:
    """v[d] of a [num_directions, ...] value."""
    return n.b.squeeze(n.b.slice(v, starts=[d], ends=[d + 1], axes=[0]), axes=[0])


def _cols(n: Node, v: Value, start: int, stop: int) -> Value:
    """v[..., start:stop]."""
    return n.b.slice(v, starts=[start], ends=[stop], axes=[-1])


def _add(n: Node, a: Value | None, b: Value | None) -> Value | None:
    return b if a is None else a if b is None else n.b.add(a, b)


@converts("RNN", "GRU", "LSTM", attrs=_ATTRS + " linear_before_reset input_forget")
def recurrent(n: Node) -> list:
    kind, b = n.op_type, n.b
    if n.opset < 7:
        raise n.error("gc imports RNN, GRU and LSTM from opset 7 on (opset 1's output_sequence is not taken)")
    gates = _GATES[kind]
    direction = n.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise n.error(f"direction must be forward, reverse or bidirectional, got '{direction}'")
    nd = 2 if direction == "bidirectional" else 1
    layout = n.attr("layout", 0)
    if layout not in (0, 1):
        raise n.error(f"layout must be 0 or 1, got {layout}")
    clip = n.attr("clip", None)
    if clip is not None and not (clip > 0 and math.isfinite(clip)):
        raise n.error(f"clip must be a positive finite number, got {clip}")
    lbr = n.attr("linear_before_reset", 0) if kind == "GRU" else 0
    input_forget = n.attr("input_forget", 0) if kind == "LSTM" else 0
    if lbr not in (0, 1) or input_forget not in (0, 1):
        raise n.error(f"{'linear_before_reset' if kind == 'GRU' else 'input_forget'} must be 0 or 1")

    # Shapes: X [seq, batch, input] (layout 1: [batch, seq, input]); the hidden size from R.
    if n.type(0).rank != 3:
        raise n.error(f"input #0 (X) must have rank 3, but has shape {list(n.type(0).shape)}")
    r_shape = n.type(2).shape
    if len(r_shape) != 3 or not known(r_shape[2]):
        raise n.error(f"input #2 (R) must have the static shape [num_directions, {gates}*hidden_size, hidden_size]")
    hidden = int(r_shape[2])
    if n.attr("hidden_size", hidden) != hidden:
        raise n.error(f"hidden_size is {n.attr('hidden_size')}, but R {list(r_shape)} has hidden size {hidden}")
    if hidden < 1:
        raise n.error("the hidden size must be at least 1")
    x = n.x(0)
    if layout == 1:
        x = b.transpose(x, perm=(1, 0, 2))
    seq, batch, size = x.type.shape
    if not known(seq):
        raise SizeNeeded(f"{n.label} ({n.op_type}) unrolls its sequence, whose length (X's axis {layout}) it must know")
    if seq < 1:
        raise n.error("the sequence is empty")
    if seq > _MAX_STEPS:
        raise n.error(f"the sequence has {seq} steps; gc unrolls at most {_MAX_STEPS}")
    g = gates * hidden
    _shape_of(n, 1, "W", (nd, g, size), "num_directions, gates*hidden_size, input_size")
    _shape_of(n, 2, "R", (nd, g, hidden), "num_directions, gates*hidden_size, hidden_size")
    if n.has(3):
        _shape_of(n, 3, "B", (nd, 2 * g), "num_directions, 2*gates*hidden_size")
    state_shape = (nd, batch, hidden) if layout == 0 else (batch, nd, hidden)
    state_names = (
        "num_directions, batch_size, hidden_size" if layout == 0 else "batch_size, num_directions, hidden_size"
    )
    for i, what in ((5, "initial_h"), (6, "initial_c")) if kind == "LSTM" else ((5, "initial_h"),):
        if n.has(i):
            _shape_of(n, i, what, state_shape, state_names)
    if kind == "LSTM" and n.has(7):
        _shape_of(n, 7, "P", (nd, 3 * hidden), "num_directions, 3*hidden_size")

    # sequence_lens: no mask where every entry has the whole sequence; constant masks if known.
    masks: list[Value] | None = None
    if n.has(4):
        _shape_of(n, 4, "sequence_lens", (batch,), "batch_size")
        lens = n.known(4)
        if lens is not None:
            lens = lens.astype(np.int64)
            if ((lens < 0) | (lens > seq)).any():
                raise n.error(f"sequence_lens {lens.tolist()} must lie between 0 and the sequence length {seq}")
            if (lens != seq).any():
                masks = [b.constant((t < lens)[:, None], DType.i1) for t in range(seq)]
        else:
            lv = n.x(4)
            masks = [
                b.unsqueeze(b.less(b.constant(np.array(t, lv.type.dtype.np), lv.type.dtype), lv), axes=[1])
                for t in range(seq)
            ]

    acts = _activations(n, len(_DEFAULT_ACTIVATIONS[kind]), nd, clip)
    states = []
    for i in (5, 6) if kind == "LSTM" else (5,):
        s = n.x(i) if n.has(i) else None
        states.append(b.transpose(s, perm=(1, 0, 2)) if s is not None and layout == 1 else s)

    w, r = n.x(1), n.x(2)
    ys, last_h, last_c = [], [], []
    for d in range(nd):
        wd, rd = _pick(n, w, d), _pick(n, r, d)
        bias_x = bias_rh = None
        if n.has(3):
            bd = _pick(n, n.x(3), d)
            wb, rb = _cols(n, bd, 0, g), _cols(n, bd, g, 2 * g)
            if lbr:  # Rb_h stays inside r * (h R_h^T + Rb_h)
                zeros = b.constant(n.full((hidden,), 0, x.type.dtype.np, "Rb_h's zeros"), x.type.dtype)
                bias_x = b.add(wb, b.concat(_cols(n, rb, 0, 2 * hidden), zeros, axis=0))
                bias_rh = _cols(n, rb, 2 * hidden, g)
            else:
                bias_x = b.add(wb, rb)
        xw = _add(n, b.matmul(x, b.transpose(wd, perm=(1, 0))), bias_x)  # [seq, batch, gates*hidden]
        steps = b.split(xw, axis=0, sections=[1] * seq) if seq > 1 else (xw,)
        steps = [b.squeeze(s, axes=[0]) for s in steps]
        h = _pick(n, states[0], d) if states[0] is not None else None
        c = _pick(n, states[1], d) if kind == "LSTM" and states[1] is not None else None
        peep = None
        if kind == "LSTM" and n.has(7):
            pd = _pick(n, n.x(7), d)
            peep = [_cols(n, pd, k * hidden, (k + 1) * hidden) for k in range(3)]  # i, o, f
        if kind == "GRU":
            r_zr = b.transpose(b.slice(rd, starts=[0], ends=[2 * hidden], axes=[0]), perm=(1, 0))
            r_h = b.transpose(b.slice(rd, starts=[2 * hidden], ends=[g], axes=[0]), perm=(1, 0))
            rt = None
        else:
            rt = b.transpose(rd, perm=(1, 0))
        out: list[Value | None] = [None] * seq
        order = (
            range(seq)
            if direction == "forward" or (direction == "bidirectional" and d == 0)
            else range(seq - 1, -1, -1)
        )
        for t in order:
            xt = steps[t]
            if kind == "RNN":
                h_new, c_new = acts[d][0](_add(n, xt, b.matmul(h, rt) if h is not None else None)), None
            elif kind == "LSTM":
                h_new, c_new = _lstm_step(n, acts[d], xt, h, c, rt, peep, hidden, input_forget)
            else:
                h_new, c_new = _gru_step(n, acts[d], xt, h, r_zr, r_h, bias_rh, hidden, lbr), None
            if masks is not None:
                m = masks[t]
                zero = n.scalar(0, h_new)
                out[t] = b.where(m, h_new, zero)
                h = b.where(m, h_new, h if h is not None else zero)
                if c_new is not None:
                    c = b.where(m, c_new, c if c is not None else zero)
            else:
                out[t], h, c = h_new, h_new, c_new
        if n.output_used(0):
            ys.append(
                b.concat(*[b.unsqueeze(y, axes=[0]) for y in out], axis=0) if seq > 1 else b.unsqueeze(out[0], axes=[0])
            )
        last_h.append(h)
        last_c.append(c)

    def stack(vs: list[Value], perm: tuple[int, ...]) -> Value:
        v = b.concat(*[b.unsqueeze(s, axes=[0]) for s in vs], axis=0) if len(vs) > 1 else b.unsqueeze(vs[0], axes=[0])
        return b.transpose(v, perm=perm) if layout == 1 else v

    results: list[Value | None] = [None, None]
    if n.output_used(0):  # [seq, num_directions, batch, hidden] (layout 1: [batch, seq, num_directions, hidden])
        y = b.concat(*[b.unsqueeze(v, axes=[1]) for v in ys], axis=1) if nd > 1 else b.unsqueeze(ys[0], axes=[1])
        results[0] = b.transpose(y, perm=(2, 0, 1, 3)) if layout == 1 else y
    if n.output_used(1):
        results[1] = stack(last_h, (1, 0, 2))
    if kind == "LSTM":
        results.append(stack(last_c, (1, 0, 2)) if n.output_used(2) else None)
    return results


def _lstm_step(
    n: Node,
    acts: list,
    xt: Value,
    h: Value | None,
    c: Value | None,
    rt: Value,
    peep: list | None,
    hidden: int,
    input_forget: int,
) -> tuple[Value, Value]:
    """it = f(.. + Pi*Ct-1), ft = f(.. + Pf*Ct-1) (1 - it with input_forget), ct = g(..), Ct = ft*Ct-1 + it*ct,
    ot = f(.. + Po*Ct), Ht = ot * h(Ct)."""
    b = n.b
    f, g, hh = acts
    pre = _add(n, xt, b.matmul(h, rt) if h is not None else None)
    gi, go, gf, gc = (_cols(n, pre, k * hidden, (k + 1) * hidden) for k in range(4))
    pi, po, pf = peep if peep is not None else (None, None, None)
    i = f(_add(n, gi, b.mul(pi, c) if pi is not None and c is not None else None))
    if input_forget:
        fg = b.sub(n.scalar(1, i), i)
    else:
        fg = f(_add(n, gf, b.mul(pf, c) if pf is not None and c is not None else None))
    c_new = b.mul(i, g(gc))
    if c is not None:
        c_new = b.add(b.mul(fg, c), c_new)
    o = f(_add(n, go, b.mul(po, c_new) if po is not None else None))
    return b.mul(o, hh(c_new, clip=False)), c_new


def _gru_step(
    n: Node,
    acts: list,
    xt: Value,
    h: Value | None,
    r_zr: Value,
    r_h: Value,
    bias_rh: Value | None,
    hidden: int,
    lbr: int,
) -> Value:
    """zt = f(..), rt = f(..), ht = g(Xt Wh^T + (rt*Ht-1) Rh^T + Rbh + Wbh) (linear_before_reset:
    g(Xt Wh^T + rt*(Ht-1 Rh^T + Rbh) + Wbh)), Ht = (1 - zt)*ht + zt*Ht-1 = ht + zt*(Ht-1 - ht)."""
    b = n.b
    f, g = acts
    x_zr, x_h = _cols(n, xt, 0, 2 * hidden), _cols(n, xt, 2 * hidden, 3 * hidden)
    zr = _add(n, x_zr, b.matmul(h, r_zr) if h is not None else None)
    z = f(_cols(n, zr, 0, hidden))
    r = f(_cols(n, zr, hidden, 2 * hidden))
    if h is None:
        rec = bias_rh if lbr else None  # Ht-1 = 0
        if rec is not None:
            rec = b.mul(r, rec)
    elif lbr:
        rec = b.mul(r, _add(n, b.matmul(h, r_h), bias_rh))
    else:
        rec = b.matmul(b.mul(r, h), r_h)
    ht = g(_add(n, x_h, rec))
    if h is None:
        return b.sub(ht, b.mul(z, ht))
    return b.add(ht, b.mul(z, b.sub(h, ht)))
