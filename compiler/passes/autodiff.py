"""autodiff: reverse-mode differentiation as an IR transformation (a pass, never a tape).

For a function @f returning one scalar loss, the pass adds @f_grad: the same arguments, returning the
loss and then d loss / d arg for each floating-point argument in argument order (`wrt` restricts them;
integer arguments have no gradient). @f_grad is @f's body (calls inlined) followed by the backward
ops: a sweep over the forward ops in reverse, where each op's `grad` method (next to its definition in
dialects/) emits the vector-Jacobian product as ordinary graph ops, so cse, canonicalize and fuse
optimize the backward pass like any other code. The backward ops read the forward values they need
directly, so a later pass can decide to recompute them instead of keeping them alive.

Only ops on a path from a differentiated argument to the loss are differentiated ("active" values);
the gradient of an argument the loss does not depend on is a zero tensor.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.builder import Builder
from compiler.diagnostics import GCError
from compiler.ir import Func, Module, Op, Value, shapes_differ
from compiler.passes import InputError, Pass
from compiler.rewrite import erase_dead_ops, inline_calls
from dialects.graph import creation


def active_values(f: Func, loss: Value, wrt: Sequence[Value]) -> set[Value]:
    """The floating-point values on a path from an argument of `wrt` to `loss`: those that need a gradient."""
    varied = {v for v in wrt if v.type.dtype.is_float}
    for op in f.ops:
        if any(v in varied for v in op.operands):
            varied.update(r for r in op.results if r.type.dtype.is_float)
    useful = {loss}
    for op in reversed(f.ops):
        if any(r in useful for r in op.results):
            useful.update(op.operands)
    return varied & useful


def append_backward(f: Func, loss: Value, wrt: Sequence[Value]) -> list[Value]:
    """Append to `f` the ops computing d loss / d v for each v of `wrt` (values of `f` of a float type) and
    return those gradients, a zero tensor where the loss does not depend on v. `loss` is a scalar of `f`.
    The core of the pass, for passes that build on it (a training step appends its updates after it)."""
    active = active_values(f, loss, wrt)
    adjoint: dict[Value, Value] = {}
    if loss in active:
        seed = Builder(f, None, f.return_loc).constant(np.array(1.0), loss.type.dtype)
        adjoint[loss] = seed
    for op in reversed(list(f.ops)):
        dys = [adjoint.get(r) for r in op.results]
        if all(dy is None for dy in dys):
            continue
        for r, dy in zip(op.results, dys):
            _name(dy, r)
        if type(op).grad is Op.grad:
            raise InputError(f"{op.name} has no gradient rule: autodiff cannot differentiate through it", op.loc)
        b = Builder(f, None, op.loc)
        try:
            grads = op.grad(b, dys)
        except (TypeError, AssertionError, GCError) as e:
            if all(v.type.is_static for v in (*op.operands, *op.results)):
                raise
            # A gradient written with a size that is `?` here (a split's sections along a `?` axis, a
            # gather's one-hot over `?` indices, a pool's window counts over a `?` height): not yet.
            why = e.message if isinstance(e, GCError) else str(e)
            raise InputError(f"autodiff: {op.name}'s gradient needs sizes that are ? here ({why}); write "
                             "them in the types to differentiate it", op.loc) from None
        assert len(grads) == len(op.operands), f"{op.name}.grad gave {len(grads)} gradients for {len(op.operands)}"
        for v, g in zip(op.operands, grads):
            if g is None or v not in active:
                continue
            # With `?` sizes a gradient may know a size its value's type leaves `?`, or the reverse (a conv's
            # channels, known from the weights, `?` in the input): the types must be able to agree.
            assert g.type.dtype == v.type.dtype and not shapes_differ(g.type.shape, v.type.shape), (
                f"{op.name}.grad: the gradient of {v.type} has type {g.type}")
            adjoint[v] = b.add(adjoint[v], g) if v in adjoint else g
    out = []
    for v in wrt:
        g = adjoint.get(v)
        if g is None:
            b = Builder(f, None, v.loc)
            if v.type.is_static:
                g = b.constant(np.zeros(v.type.shape), v.type.dtype)
            else:  # zeros of v's run-time shape
                zero = b.constant(np.array(0.0), v.type.dtype)
                g = b.where(b.equal(v, v), zero, zero)
        _name(g, v)
        out.append(g)
    return out


def _name(grad: Value | None, v: Value) -> None:
    """Call the gradient of %v `%v_grad` (unless it is a value with a name already, forward or not)."""
    if grad is not None and v.name and grad.name is None:
        grad.name = f"{v.name}_grad"


def build_grad(module: Module, f: Func, wrt: Sequence[str] | None = None) -> Func:
    """@f_grad for the scalar loss @f (not added to `module`): same arguments, returns (loss, d loss / d arg
    for each floating-point argument, or each named in `wrt`, in argument order)."""
    loss_type = f.result_types[0] if len(f.result_types) == 1 else None
    where = f.return_loc or f.loc
    if loss_type is None:
        raise InputError(f"autodiff: @{f.name} returns {len(f.result_types)} values; it needs one scalar loss", where)
    if loss_type.rank != 0 or not loss_type.dtype.is_float:
        raise InputError(
            f"autodiff: @{f.name} returns {loss_type}; it needs a floating-point scalar loss (tensor<f32>: "
            "reduce it first, e.g. graph.reduce_mean or graph.mse_loss)",
            where,
        )
    g = f.clone()
    g.name = f"{f.name}_grad"
    g.attrs.pop("kernel", None)
    inline_calls(module, g)
    args = {a.name: a for a in g.args}
    wrt = [n.removeprefix("%") for n in wrt or ()]  # `wrt=%w1` names %w1 as well as `wrt=w1`
    if wrt:
        unknown = [n for n in wrt if n not in args]
        if unknown:
            names = ", ".join("%" + n for n in args) or "none"
            raise InputError(f"autodiff: @{f.name} has no argument %{unknown[0]} (arguments: {names})", f.loc)
        for a in (args[n] for n in wrt if not args[n].type.dtype.is_float):
            # Skipped like every integer argument; said, since here the user asked for it by name.
            print(f"autodiff: %{a.name} is {a.type}: integer arguments have no gradient (skipped)", file=sys.stderr)
    chosen = [a for a in g.args if a.type.dtype.is_float and (not wrt or a.name in wrt)]
    grads = append_backward(g, g.results[0], chosen)
    g.results = [g.results[0], *grads]
    g.result_types = [v.type for v in g.results]
    erase_dead_ops(g)
    return g


@dataclass
class Autodiff(Pass):
    """Reverse-mode autodiff: @f returning a scalar loss gets @f_grad returning (loss, gradients)."""

    name = "autodiff"
    summary = "add @NAME_grad returning the scalar loss of @NAME and its gradient for each float argument"
    func: str = field(
        default="", metadata={"help": "the function to differentiate (default: @main, else the uncalled losses)"}
    )
    wrt: tuple[str, ...] = field(
        default=(), metadata={"help": "the arguments to differentiate with respect to (default: every float one)"}
    )

    def run(self, module: Module) -> None:
        for f in self.targets(module):
            name = f"{f.name}_grad"
            if name in module:
                raise InputError(f"autodiff: @{name} already exists; rename it or differentiate once", f.loc)
            g = build_grad(module, f, self.wrt)
            _insert_after(module, f, g)
            self.stats["functions"] += 1
            self.stats["gradients"] += len(g.results) - 1

    def targets(self, module: Module) -> list[Func]:
        """The function named by `func`; by default @main if it returns a loss (one floating-point
        scalar), else every function nothing calls that does (@loss calling a @main that returns logits);
        without any, @main (or every uncalled function), whose diagnostic then says what it returns."""
        if self.func:
            if self.func not in module:
                names = ", ".join("@" + n for n in module.funcs) or "none"
                raise InputError(f"autodiff: no function @{self.func} (functions: {names})")
            return [module[self.func]]
        called = {op.callee.name for f in module for op in f.ops if isinstance(op, creation.Call)}
        grads = {f"{f.name}_grad" for f in module}  # gradients made before are no losses themselves
        roots = [f for f in module if f.name not in called | grads and not f.attrs.get("kernel")]
        losses = [f for f in roots if len(f.result_types) == 1 and f.result_types[0].rank == 0
                  and f.result_types[0].dtype.is_float]
        if any(f.name == "main" for f in losses):
            return [module["main"]]
        if losses:
            return losses
        return [module["main"]] if "main" in module else roots


def _insert_after(module: Module, f: Func, g: Func) -> None:
    """Add `g` to the module right after `f`, so that a function and its gradient print together."""
    funcs = list(module)
    module.funcs.clear()
    for h in funcs:
        module.add(h)
        if h is f:
            module.add(g)
