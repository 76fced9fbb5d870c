"""fold-batch-norm: an inference batch_norm after conv2d or matmul becomes part of that layer's weights.

batch_norm(y) = (y - mean) * s + bias with s = scale / sqrt(var + eps) per channel, and y is linear in
its weights, so  batch_norm(conv2d(x, w, c)) = conv2d(x, w * s, (c - mean) * s + bias)  with s along w's
output channels (axis 0 of OIHW), and  batch_norm(matmul(x, w) + c) = matmul(x, w * s) + ((c - mean) * s +
bias)  with s along w's columns. When the weights and parameters are constants the new weights are
computed here, in f64, and stored as constants; when some are function arguments (weights passed per
call) the folding is emitted as graph ops on them, which fold-constants folds once they are bound.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from compiler.builder import Builder
from compiler.diagnostics import Location
from compiler.ir import DType, Func, Module, Op, Value
from compiler.passes import Pass
from compiler.rewrite import rewrite
from dialects.graph import creation, elementwise, linalg, nn

# In f16/bf16 the folded weights would be rounded once more than the unfused ops round them, so the
# outputs could move by an ulp of a low-precision float: not a rewrite that keeps the module's meaning.
_FLOATS = (DType.f32, DType.f64)


def _is_weight(v: Value | None, args: bool = True) -> bool:
    """A constant (or, with `args`, a function argument): a value the folded weights may be computed from."""
    return v is None or (args and v.owner is None) or isinstance(v.owner, creation.Constant)


def _only_user(f: Func, v: Value, user: Op) -> bool:
    """Whether `user` reads `v` once and nothing else reads it (a return counts as a reader)."""
    uses = f.users().get(v, [])
    return len(uses) == 1 and uses[0][0] is user


def _array(v: Value) -> np.ndarray:
    return v.owner.value.array.astype(np.float64)


def _folded(
    b: Builder, bn: nn.BatchNorm, w: Value, c: Value | None, channels: tuple[int, ...]
) -> tuple[Value, Value]:
    """w * s (s reshaped to `channels`, the per-channel shape that broadcasts against w) and
    (c - mean) * s + bias (c absent reads as 0), as constants when every input is one, else as ops."""
    params = [bn.scale, bn.bias, bn.mean, bn.var]
    dtype = bn.result.type.dtype
    if all(isinstance(v.owner, creation.Constant) for v in [w, *params] + ([c] if c is not None else [])):
        scale, bias, mean, var = (_array(p) for p in params)
        s = scale / np.sqrt(var + bn.epsilon)
        shift = _array(c) if c is not None else 0.0
        return b.constant(_array(w) * s.reshape(channels), dtype), b.constant((shift - mean) * s + bias, dtype)
    eps = b.constant(np.array(bn.epsilon), dtype)
    s = b.div(bn.scale, b.sqrt(b.add(bn.var, eps)))
    s_w = s if len(channels) == 1 else b.reshape(s, shape=channels)
    if c is None:
        return b.mul(w, s_w), b.sub(bn.bias, b.mul(bn.mean, s))
    return b.mul(w, s_w), b.add(b.mul(b.sub(c, bn.mean), s), bn.bias)


def _named(y: Value, bn: nn.BatchNorm) -> Value:
    """y, under the name of the batch_norm's result it replaces: the IR still reads like the source."""
    y.name = bn.result.name
    return y


def fold_conv(op: nn.BatchNorm, b: Builder, args: bool = True) -> Value | None:
    """batch_norm(conv2d(x, w, c)) -> conv2d(x, w * s, (c - mean) * s + bias), s along w's axis 0. Only when
    the conv's result has no other user (it would still need the unnormalized value), when w, c and the
    four parameters are constants or arguments, and for f32/f64."""
    conv = op.x.owner
    if not isinstance(conv, nn.Conv2d) or op.result.type.dtype not in _FLOATS:
        return None
    if not _only_user(b.func, conv.result, op):
        return None
    if not all(_is_weight(v, args) for v in (conv.w, conv.b, *op.operands[1:])):
        return None
    b.loc = Location.merge([conv.loc, op.loc])
    w, c = _folded(b, op, conv.w, conv.b, (op.result.type.shape[1], 1, 1, 1))
    return _named(b.conv2d(conv.x, w, c, **conv.attrs), op)


def _matmul_and_bias(y: Value) -> tuple[linalg.MatMul, Value | None, list[Op]] | None:
    """y = matmul(x, w) or matmul(x, w) + c with c of shape [C] (either operand order): the matmul, c, and
    the ops that fold away."""
    op = y.owner
    if isinstance(op, linalg.MatMul):
        return op, None, [op]
    if not isinstance(op, elementwise.Add):
        return None
    for mm, c in ((op.a, op.b), (op.b, op.a)):
        if isinstance(mm.owner, linalg.MatMul) and c.type.shape == y.type.shape[-1:] and mm.type == y.type:
            return mm.owner, c, [mm.owner, op]
    return None


def fold_matmul(op: nn.BatchNorm, b: Builder, args: bool = True) -> Value | None:
    """batch_norm(matmul(x, w) [+ c]) -> matmul(x, w * s) + ((c - mean) * s + bias), s along w's columns.
    Only for a rank-2 [N, C] result of a 2-D x and a 2-D w (then batch_norm's channel axis 1 is w's last),
    c of shape [C]; the matmul (and the add) must have no other user; w, c and the parameters are constants
    or arguments; f32/f64 only."""
    y = op.x
    if y.type.rank != 2 or op.result.type.dtype not in _FLOATS:
        return None
    found = _matmul_and_bias(y)
    if found is None:
        return None
    mm, c, chain = found
    if mm.a.type.rank != 2 or mm.b.type.rank != 2:
        return None
    # Each op of the chain feeds only the next one, the last only the batch_norm.
    if not all(_only_user(b.func, o.result, u) for o, u in zip(chain, [*chain[1:], op])):
        return None
    if not all(_is_weight(v, args) for v in (mm.b, c, *op.operands[1:])):
        return None
    b.loc = Location.merge([*(o.loc for o in chain), op.loc])
    w, shift = _folded(b, op, mm.b, c, (y.type.shape[1],))
    return _named(b.add(b.matmul(mm.a, w), shift), op)


def to_affine(op: nn.BatchNorm, b: Builder) -> Value | None:
    """A batch_norm with constant parameters and no layer before it to fold into (DenseNet's, after each
    concat) -> x * s + t, s and t computed here in f64: per call it would divide by a square root for
    every element. f32/f64 only."""
    if op.result.type.dtype not in _FLOATS or not all(isinstance(v.owner, creation.Constant) for v in op.operands[1:]):
        return None
    scale, bias, mean, var = (_array(p) for p in op.operands[1:])
    s = scale / np.sqrt(var + op.epsilon)
    channels = (op.result.type.shape[1],) + (1,) * (op.result.type.rank - 2)
    dtype = op.result.type.dtype
    b.loc = op.loc
    return _named(b.add(b.mul(op.x, b.constant(s.reshape(channels), dtype)),
                        b.constant((bias - mean * s).reshape(channels), dtype)), op)


@dataclass
class FoldBatchNorm(Pass):
    name = "fold-batch-norm"
    summary = ("fold an inference batch_norm into the weights and bias of the conv2d or matmul before it, or "
               "(constant parameters) into one multiply-add")

    weight_args: bool = field(
        default=True,
        metadata={"help": "also fold weights that are arguments (as ops that run per call until they are bound)"},
    )

    def run(self, module: Module) -> None:
        folds: Counter = Counter()
        if self.weight_args:
            rewrite(module, [fold_conv, fold_matmul, to_affine], folds)
            self.stats["batch-norms-folded"] += sum(folds.values())
            return

        def fold_conv_constants(op: nn.BatchNorm, b: Builder) -> Value | None:
            return fold_conv(op, b, args=False)

        def fold_matmul_constants(op: nn.BatchNorm, b: Builder) -> Value | None:
            return fold_matmul(op, b, args=False)

        rewrite(module, [fold_conv_constants, fold_matmul_constants, to_affine], folds)
        self.stats["batch-norms-folded"] += sum(folds.values())
