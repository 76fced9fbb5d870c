"""The reference interpreter: runs a verified module on NumPy, one op.reference() at a time.

It is the oracle every pass and every target is tested against, so it stays exact and simple.
"""

from __future__ import annotations

import numpy as np

from compiler.diagnostics import GCError
from compiler.inputs import castable, narrowed
from compiler.ir import Func, Module, Value, fits
from compiler.specialize import runtime_args, specialize


def run(module: Module, inputs: dict[str, np.ndarray] | list[np.ndarray], entry: str = "main") -> list[np.ndarray]:
    """Run `entry` on inputs given by argument name (without %) or by position."""
    if entry not in module:
        names = ", ".join("@" + n for n in module.funcs) or "none"
        raise GCError(f"no function @{entry} in the module (functions: {names})")
    f = module[entry]
    args = bind_inputs(f, inputs)
    return run_func(module, f, args)


def run_func(module: Module, f: Func, args: list[np.ndarray]) -> list[np.ndarray]:
    # `?` sizes and attributes taken at run time bound to this call's (f itself if none)
    names = runtime_args(f)
    f = specialize(module, f, [a.shape for a in args], {a.name: x for a, x in zip(f.args, args) if a.name in names})
    env: dict[Value, np.ndarray] = dict(zip(f.args, args))
    for op in f.ops:
        call = getattr(op, "interpret", None)
        outs = call(module, [env[v] for v in op.operands]) if call else op.evaluate([env[v] for v in op.operands])
        for r, a in zip(op.results, outs):
            assert a.shape == r.type.shape and a.dtype == r.type.dtype.np, f"{op.name} produced {a.shape} {a.dtype}"
            env[r] = a
    return [env[v] for v in f.results]


def bind_inputs(f: Func, inputs: dict[str, np.ndarray] | list[np.ndarray]) -> list[np.ndarray]:
    """Check inputs against @f's arguments: a missing, extra or mis-shaped one is a user error."""
    if isinstance(inputs, (list, tuple)):
        if len(inputs) != len(f.args):
            raise GCError(f"@{f.name} takes {len(f.args)} input(s), got {len(inputs)}")
        inputs = {a.name: x for a, x in zip(f.args, inputs)}
    names = [a.name for a in f.args]
    extra = [k for k in inputs if k not in names]
    if extra:
        raise GCError(f"unknown input '{extra[0]}': @{f.name} has arguments " + ", ".join("%" + n for n in names))
    out = []
    for a in f.args:
        if a.name not in inputs:
            raise GCError(f"missing input '{a.name}' for %{a.name}: {a.type}", a.loc)
        x = np.asarray(inputs[a.name])
        if not fits(a.type.shape, x.shape):
            raise GCError(f"input '{a.name}' has shape {list(x.shape)} but %{a.name} is {a.type}", a.loc)
        want = a.type.dtype.np
        if x.dtype != want:
            if not castable(x.dtype, want):
                raise GCError(f"input '{a.name}' has dtype {x.dtype} but %{a.name} is {a.type}", a.loc)
            x = narrowed(a.name, x, want, a.loc)
        out.append(x)
    return out
