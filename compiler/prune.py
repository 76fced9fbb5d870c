"""`gc prune`: the prune-weights pass for weights that come in as function arguments, through an .npz.

The named arguments are bound as constants, the pass prunes them as it prunes any constant weight, and
the constants it leaves become arguments again, under their own names, with their (possibly smaller)
types. Arguments that are not in the .npz (the inputs) stay as they are.
"""

from __future__ import annotations

import sys

import numpy as np

from compiler.builder import bind_arguments
from compiler.diagnostics import GCError
from compiler.files import check_writable, write_atomic
from compiler.ir import Func, Module, Value
from compiler.passes.prune_weights import PruneWeights
from compiler.verifier import verify_module
from dialects.graph.creation import Call, Constant


def prune_npz(
    module: Module, params: dict[str, np.ndarray], sparsity: float, mode: str, entry: str = "main"
) -> tuple[Module, dict[str, np.ndarray]]:
    """Prune the weights of @entry given in `params` (keyed by argument name); returns a new module and
    the new parameters. In channel mode the pruned arguments' types shrink."""
    prune = PruneWeights(sparsity=sparsity, mode=mode)
    if entry not in module:
        raise GCError(f"no function @{entry} in the module (functions: {', '.join('@' + n for n in module.funcs)})")
    if any(isinstance(op, Call) and op.callee.name == entry for f in module for op in f.ops):
        raise GCError(f"@{entry} is called by another function: its argument types cannot change")
    module = module.clone()
    f = module[entry]
    args = list(f.args)
    _bind(f, _checked(f, params))
    prune.run(module)
    new_params = _unbind(f, args, params)
    verify_module(module)
    return module, new_params


def _checked(f: Func, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The parameters cast to their arguments' dtypes; an unknown name or a wrong shape is a user error."""
    types = {a.name: a.type for a in f.args}
    out = {}
    for name, x in params.items():
        if name not in types:
            names = ", ".join("%" + a.name for a in f.args)
            raise GCError(f"parameter '{name}' is not an argument of @{f.name} (arguments: {names})")
        x = np.asarray(x)
        if tuple(x.shape) != types[name].shape:
            raise GCError(f"parameter '{name}' has shape {list(x.shape)} but %{name} is {types[name]}")
        out[name] = x
    return out


def _bind(f: Func, params: dict[str, np.ndarray]) -> None:
    """Replace each argument named in `params` by a constant of the same name holding its value."""
    bind_arguments(f, params)


def _unbind(f: Func, args: list[Value], params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Turn the constants named after bound arguments back into arguments, in the original order. A weight
    the pass split in two (one argument shared by layers pruned differently) becomes NAME, NAME_1, ..."""
    by_name: dict[str, list[Constant]] = {}
    for op in f.ops:
        if isinstance(op, Constant) and op.result.name in params:
            by_name.setdefault(op.result.name, []).append(op)
    new_args: list[Value] = []
    new_params: dict[str, np.ndarray] = {}
    taken = {a.name for a in args} | {r.name for op in f.ops for r in op.results if r.name}
    for a in args:
        consts = by_name.get(a.name)
        if a.name not in params or not consts:
            new_args.append(a)  # an input, or a weight nothing reads any more: as it was
            if a.name in params:
                new_params[a.name] = params[a.name]
            continue
        for i, c in enumerate(consts):
            name = a.name if i == 0 else _fresh(f"{a.name}_{i}", taken)
            v = Value(c.result.type, name)
            v.loc = a.loc
            f.replace_all_uses(c.result, v)
            f.ops.remove(c)
            new_args.append(v)
            new_params[name] = np.array(c.value.array)
    f.args = new_args
    return new_params


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


# --- gc prune -------------------------------------------------------------------------------------


def count_parameters(f: Func, params: dict[str, np.ndarray]) -> tuple[int, int]:
    """(all, nonzero) entries of the weights: the given parameters and the function's constants."""
    arrays = [*params.values(), *(op.value.array for op in f.ops if isinstance(op, Constant))]
    return sum(int(a.size) for a in arrays), sum(int(np.count_nonzero(a)) for a in arrays)


def count_flops(f: Func) -> int:
    """The floating-point operations of one call, as each op counts its own."""
    return sum(op.flops() for op in f.ops if hasattr(op, "flops"))


def cmd_prune(args) -> int:
    """`gc prune net.gir --params w.npz --sparsity 0.5 --mode channel -o pruned.gir --params-out pruned.npz`"""
    from compiler.inputs import load_npz, save_npz
    from compiler.parser import parse_file
    from compiler.printer import print_module

    for path in (args.output, args.params_out):
        if path:
            check_writable(path)

    module = parse_file(args.file)
    params = load_npz(args.params) if args.params else {}
    entry = getattr(args, "entry", None) or "main"
    if entry in module:
        _check_weights_given(module[entry], params, args.params)
    pruned, new_params = prune_npz(module, params, args.sparsity, args.mode, entry)
    text = print_module(pruned)
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    if args.params_out:
        save_npz(args.params_out, new_params)
    elif new_params:
        print("gc prune: no --params-out given: the pruned parameters were not saved", file=sys.stderr)
    report = sys.stdout if args.output else sys.stderr
    before, after = module[entry], pruned[entry]
    (n0, nz0), (n1, nz1) = count_parameters(before, params), count_parameters(after, new_params)
    f0, f1 = count_flops(before), count_flops(after)
    print(f"parameters: {n0} -> {n1} ({_change(n0, n1)}), nonzero {nz0} -> {nz1} ({_change(nz0, nz1)})", file=report)
    print(f"FLOPs:      {f0} -> {f1} ({_change(f0, f1)})", file=report)
    if args.sparsity > 0 and (n0, nz0) == (n1, nz1):
        print(f"gc prune: nothing was pruned: no matmul or conv2d of @{entry} reads a weight directly or through "
              "a transpose" + (" (channel mode: directly only)" if args.mode == "channel" else ""), file=sys.stderr)
    return 0


def _check_weights_given(f: Func, params: dict[str, np.ndarray], path: str | None) -> None:
    """Every argument a matmul or conv2d reads as its weight must come in the .npz: pruning the others
    and passing that one through would leave a half-pruned net without a word."""
    args = set(f.args)
    weights = list(dict.fromkeys(op.operands[i] for op in f.ops for i in op.weight_operands
                                 if op.operands[i] in args and op.operands[i].type.dtype.is_float))
    missing = [w for w in weights if w.name not in params]
    if not missing:
        return
    names = ", ".join("%" + w.name for w in weights)
    if path is None:
        raise GCError(f"@{f.name} takes its weights ({names}) as arguments: give them with --params W.npz")
    raise GCError(f"{path} has no '{missing[0].name}', the weight of a layer of @{f.name} (weights: {names})",
                  missing[0].loc)


def _change(a: int, b: int) -> str:
    return f"{100.0 * (b - a) / a:+.1f}%" if a else "n/a"
