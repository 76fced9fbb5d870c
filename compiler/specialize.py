"""A function with `?` dimensions specialized to the sizes of one call: every type re-inferred with the
arguments' sizes, so that each op runs (and is checked) as in a static function.

Sizes that must agree and could not be checked before the call (a matmul's inner dimension of `?`, two
`?` operands of an add) are checked here, each op by its own shape rule; a mismatch is the op's error at
its location, with a note naming each argument's sizes at this call. Specializations are cached per
function and argument shapes.
"""

from __future__ import annotations

import weakref

from compiler.diagnostics import Diagnostic, GCError
from compiler.ir import Func, Module, known

_CACHE: weakref.WeakKeyDictionary[Func, dict[tuple, tuple[tuple, Func]]] = weakref.WeakKeyDictionary()


def is_dynamic(f: Func) -> bool:
    """Whether any type in `f` (arguments, results, ops) has a `?`."""
    return (any(not a.type.is_static for a in f.args) or any(t is not None and not t.is_static for t in f.result_types)
            or any(not r.type.is_static for op in f.ops for r in op.results))


def specialize(module: Module, f: Func, shapes: list[tuple[int, ...]]) -> Func:
    """`f` with its arguments of these shapes and every type inferred from them (f itself if nothing is
    dynamic). Raises the op's GCError, with notes on the arguments' sizes, where the sizes disagree."""
    if not is_dynamic(f):
        return f
    key = tuple(tuple(s) for s in shapes)
    # Passes edit functions in place (new ops, operands replaced, attributes set anew): a specialization
    # holds for this wiring only.
    wiring = tuple((id(op), id(op.attrs), *map(id, op.operands)) for op in f.ops) + tuple(map(id, f.results))
    done = _CACHE.setdefault(f, {})
    if done.get(key, (None,))[0] != wiring:
        done[key] = (wiring, _specialize(module, f, key))
    return done[key][1]


def _specialize(module: Module, f: Func, shapes: tuple) -> Func:
    g = f.clone()
    for a, shape in zip(g.args, shapes):
        a.type = a.type.with_shape(shape)
    for op, generic in zip(g.ops, f.ops):
        try:
            called = op.called()
            if called is not None and called.name in module:  # the callee at these operand sizes
                callee = specialize(module, module[called.name], [v.type.shape for v in op.operands])
                types = [v.type for v in callee.results]
            else:
                types = op.infer_types()
        except GCError as e:
            raise _at_this_call(e, f, shapes) from None
        for r, t, was in zip(op.results, types, generic.results):
            if not was.type.fits(t):
                raise _at_this_call(op.error(f"gives {t} at these sizes, but {was.type} where they are ?"), f, shapes)
            r.type = t
    for i, (v, t) in enumerate(zip(g.results, f.result_types)):
        if t is not None and not t.fits(v.type):
            err = GCError(f"return: value #{i} has type {v.type} at these sizes but @{f.name} declares {t}",
                          f.return_loc or f.loc)
            raise _at_this_call(err, f, shapes)
    g.result_types = [v.type for v in g.results]
    return g


def specialize_module(module: Module, entry: str, shapes: list[tuple[int, ...]]) -> Module:
    """A static module: @entry specialized to argument `shapes`, and every function it calls to the shapes
    of its calls (one copy per distinct shapes: the first keeps the name, others add `_<n>`)."""
    out = Module()
    names: dict[tuple[str, tuple], str] = {}

    def visit(f: Func, key: tuple) -> str:
        if (f.name, key) in names:
            return names[(f.name, key)]
        taken = sum(1 for (n, _) in names if n == f.name)
        name = names[(f.name, key)] = f.name if not taken else f"{f.name}_{taken}"
        g = specialize(module, f, list(key))
        if g is f:
            g = f.clone()
        g.name = name
        for op in g.ops:
            callee = op.called()
            if callee is not None and callee.name in module:
                new = visit(module[callee.name], tuple(tuple(v.type.shape) for v in op.operands))
                if new != callee.name:
                    op.attrs = {**op.attrs, "callee": type(callee)(new)}
        out.add(g)
        return name

    visit(module[entry], tuple(tuple(s) for s in shapes))
    for f in module:  # functions @entry does not reach, as they are (if static)
        if f.name not in out and not is_dynamic(f):
            out.add(f.clone())
    return out


def _at_this_call(e: GCError, f: Func, shapes: tuple) -> GCError:
    """`e` with a note per dynamic argument: its type and the sizes this call binds."""
    notes = []
    for a, shape in zip(f.args, shapes):
        if not a.type.is_static:
            dims = ", ".join(f"dimension {i} = {n}" for i, (d, n) in enumerate(zip(a.type.shape, shape)) if not known(d))
            notes.append((a.loc or f.loc, f"%{a.name} is {a.type}; this call gives it {_dims(shape)} ({dims})"))
    diags = [Diagnostic(d.message, d.loc, d.severity, [*d.notes, *notes]) for d in e.diagnostics]
    return GCError(diags)


def _dims(shape) -> str:
    return "x".join(map(str, shape)) or "a scalar"
