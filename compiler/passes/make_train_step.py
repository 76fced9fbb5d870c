"""make-train-step: one SGD step of a loss function as one ordinary function, @train_step.

For @main returning a scalar loss, the pass adds @train_step (@NAME_train_step for another function):
the same arguments; the forward pass, the loss, the gradients (autodiff's `append_backward`) and the
update `w - lr * dL/dw` of each trained argument; it returns the loss (of the weights it was given)
followed by the new value of each trained argument, in argument order, as autodiff puts the loss
first. Because it is plain GIR, cse, fuse (the update joins the kernel computing the gradient),
plan-memory and codegen treat it like any other function.

The trained arguments ("parameters") are those named in `params`, by default every floating-point
argument except the data: the first argument (the input batch, as `gc stats` counts parameters) and
any argument the op computing the loss reads directly (a target, such as mse_loss's second operand).
Integer arguments (labels) are data by their type.

`loss-scale=S` is static loss scaling for mixed precision: the backward pass starts from S * loss,
so that small gradients survive in f16, and the update divides by S again (lr / S; exact for a power
of two).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.builder import Builder
from compiler.ir import DType, Func, Module, Op, Value
from compiler.passes import InputError, Pass
from compiler.passes.autodiff import append_backward
from compiler.rewrite import erase_dead_ops, inline_calls


def step_name(func: str) -> str:
    """@train_step for @main, @NAME_train_step for any other function."""
    return "train_step" if func == "main" else f"{func}_train_step"


def data_args(f: Func) -> list[str]:
    """The arguments that are data by default: the first one and those the loss's own op reads directly.
    `f` has its calls inlined (a loss computed in a called function is seen through the call)."""
    loss_op = f.results[0].owner if f.results else None
    direct = set(loss_op.operands) if loss_op is not None else set()
    return [a.name for i, a in enumerate(f.args) if i == 0 or a in direct]


def trained_args(f: Func, params: Sequence[str] = ()) -> list[Value]:
    """The arguments of `f` a step updates: those named in `params` (in argument order), by default every
    floating-point argument that is not data (`data_args`). `f` has its calls inlined."""
    args = {a.name: a for a in f.args}
    params = [n.removeprefix("%") for n in params]  # params=%w1 as well as params=w1
    unknown = [n for n in params if n not in args]
    if unknown:
        names = ", ".join("%" + n for n in args) or "none"
        raise InputError(f"make-train-step: @{f.name} has no argument %{unknown[0]} (arguments: {names})", f.loc)
    for a in (args[n] for n in params):
        if not a.type.dtype.is_float:
            raise InputError(
                f"make-train-step: %{a.name} is {a.type}: only floating-point arguments can be trained", a.loc or f.loc
            )
    if params:
        return [a for a in f.args if a.name in params]
    data = set(data_args(f))
    chosen = [a for a in f.args if a.type.dtype.is_float and a.name not in data]
    if not chosen:
        raise InputError(
            f"make-train-step: @{f.name} has no floating-point argument besides its data "
            f"({', '.join('%' + n for n in data)}) to train; name them with params=... (gc train: --train NAMES)",
            f.loc,
        )
    return chosen


def _check_loss(f: Func) -> Value:
    """The scalar loss @f returns, or a diagnostic saying why there is none."""
    where = f.return_loc or f.loc
    if len(f.result_types) != 1:
        raise InputError(
            f"make-train-step: @{f.name} returns {len(f.result_types)} values; it needs one scalar loss", where
        )
    t = f.result_types[0]
    if t.rank != 0 or not t.dtype.is_float:
        raise InputError(
            f"make-train-step: @{f.name} returns {t}; it needs a floating-point scalar loss "
            "(tensor<f32>: e.g. graph.softmax_cross_entropy or graph.mse_loss)",
            where,
        )
    return f.results[0]


def build_train_step(module: Module, f: Func, lr: float, params: Sequence[str] = (), loss_scale: float = 1.0) -> Func:
    """@train_step for the loss function @f (not added to `module`): same arguments, returns (loss, new value
    of each trained argument in argument order), the new value being w - lr * d loss / d w."""
    _check_loss(f)
    g = f.clone()
    g.attrs.pop("kernel", None)
    inline_calls(module, g)
    loss = g.results[0]
    weights = trained_args(g, params)  # diagnostics name @f
    g.name = step_name(f.name)
    start = loss
    if loss_scale != 1.0:
        b = Builder(g, None, g.return_loc or g.loc)
        start = b.mul(loss, b.constant(np.array(loss_scale), loss.type.dtype))
        start.name = f"{loss.name or 'loss'}_scaled"
    grads = append_backward(g, start, weights)
    rates: dict[DType, Value] = {}
    new = []
    for w, dw in zip(weights, grads):
        b = Builder(g, None, w.loc or g.loc)
        if w.type.dtype not in rates:  # one learning-rate constant per dtype, lr / S undoing the loss scale
            rates[w.type.dtype] = b.constant(np.array(lr / loss_scale), w.type.dtype)
            rates[w.type.dtype].name = "lr"
        w_new = b.sub(w, b.mul(dw, rates[w.type.dtype]))
        w_new.name = f"{w.name}_new"
        new.append(w_new)
    g.results = [loss, *new]
    g.result_types = [v.type for v in g.results]
    erase_dead_ops(g)
    _update_early(g, {v.owner for w in new for v in (w, w.owner.operands[1])} | {c.owner for c in rates.values()})
    return g


def _update_early(g: Func, update: set[Op]) -> None:
    """Move each update right after the op that makes its gradient: the gradient (and, once fused into
    its matmul's epilogue, that matmul's inputs) then dies there instead of living to the end of the step
    (deep_mlp's step: a file-order peak of 3.97 MB, 2.46 after `schedule`, without this)."""
    pending = [op for op in g.ops if op in update]
    defined = set(g.args)
    out: list[Op] = []

    def place() -> None:
        # An update goes in once its gradient exists; the learning-rate constant right before its first use.
        for op in [p for p in pending if p.kind != "constant"]:
            consts = [v.owner for v in op.operands if v.owner in pending and v.owner.kind == "constant"]
            if all(v in defined or v.owner in consts for v in op.operands):
                for c in dict.fromkeys(consts):
                    out.append(c)
                    defined.update(c.results)
                    pending.remove(c)
                out.append(op)
                defined.update(op.results)
                pending.remove(op)

    place()
    for op in g.ops:
        if op in update:
            continue
        out.append(op)
        defined.update(op.results)
        place()
    g.ops = out + pending


@dataclass
class MakeTrainStep(Pass):
    """Add @train_step: forward, loss, gradients and an SGD update; returns (loss, new weights...)."""

    name = "make-train-step"
    summary = "add @train_step: one SGD step of @main's loss, returning the loss and the updated weights"
    lr: float = field(default=0.1, metadata={"help": "the learning rate of the update w - lr * grad"})
    func: str = field(default="main", metadata={"help": "the loss function (its step is @NAME_train_step)"})
    params: tuple[str, ...] = field(
        default=(), metadata={"help": "the arguments to train (default: every float one but the data)"}
    )
    loss_scale: float = field(
        default=1.0, metadata={"help": "static loss scale S for f16: backward from S * loss, update by lr / S"}
    )

    def run(self, module: Module) -> None:
        if self.func not in module:
            names = ", ".join("@" + n for n in module.funcs) or "none"
            raise InputError(f"make-train-step: no function @{self.func} (functions: {names})")
        f = module[self.func]
        name = step_name(f.name)
        if name in module:
            raise InputError(f"make-train-step: @{name} already exists; rename it or make the step once", f.loc)
        if not (math.isfinite(self.loss_scale) and self.loss_scale > 0):
            raise InputError(f"make-train-step: loss-scale must be a positive number, got {self.loss_scale}")
        if not math.isfinite(self.lr):
            raise InputError(f"make-train-step: lr must be a finite number, got {self.lr}")
        step = build_train_step(module, f, self.lr, self.params, self.loss_scale)
        module.add(step)
        self.stats["steps"] += 1
        self.stats["trained-args"] += len(step.results) - 1
