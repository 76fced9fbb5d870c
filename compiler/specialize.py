"""A function with `?` dimensions specialized to the sizes of one call: every type re-inferred with the
arguments' sizes, so that each op runs (and is checked) as in a static function. Attributes taken at run
time (`{axes = %axes}`) take their value at the call the same way: an argument's, or an earlier op's
result, computed here on the reference interpreter from the sizes (`graph.shape`) and from the values of
the arguments it reads (an ONNX model's Shape -> Gather -> Concat -> Reshape).

Sizes that must agree and could not be checked before the call (a matmul's inner dimension of `?`, two
`?` operands of an add) are checked here, each op by its own shape rule; a mismatch is the op's error at
its location, with a note naming each argument's sizes at this call. Specializations are cached per
function, argument shapes and the values of the arguments that attributes take.
"""

from __future__ import annotations

import weakref

import numpy as np

from compiler.diagnostics import Diagnostic, GCError
from compiler.ir import Func, Module, Op, Sym, Value, bind_sizes, known, stand_in, unheld

_CACHE: weakref.WeakKeyDictionary[Func, dict[tuple, tuple[tuple, Func]]] = weakref.WeakKeyDictionary()


def is_dynamic(f: Func) -> bool:
    """Whether any type in `f` (arguments, results, ops) has a `?`, or an attribute is taken at run time."""
    return (any(not a.type.is_static for a in f.args) or any(t is not None and not t.is_static for t in f.result_types)
            or any(not r.type.is_static for op in f.ops for r in op.results) or has_runtime_attrs(f))


def has_runtime_attrs(f: Func) -> bool:
    return any(op.runtime_attrs() for op in f.ops)


def runtime_args(f: Func) -> list[str]:
    """The arguments whose values attributes take at run time, in argument order: those named, and those
    a named result is computed from (not through an op that reads only its operands' sizes)."""
    reached = {v.name for v in _sources(f)[1] if v.owner is None}
    return [a.name for a in f.args if a.name in reached]


def _sources(f: Func) -> tuple[set[Op], set[Value]]:
    """(the ops computing the values that attributes take at run time, the values they and the attributes
    read): what specialization evaluates before it binds them."""
    values = {v.name: v for v in f.values()}
    return computed_from([v for op in f.ops for v in op.attribute_values(values)], values)


def computed_from(start: list[Value], by_name: dict[str, Value]) -> tuple[set[Op], set[Value]]:
    """(the ops `start` is computed by, every value they read and `start`), back to arguments and
    constants, and through the values attributes take; not past an op that reads its operands' sizes only
    (graph.shape). `by_name` finds the values attributes name."""
    todo, ops, seen = list(start), set(), set()
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v.owner is not None and v.owner not in ops:
            ops.add(v.owner)
            if not v.owner.reads_sizes_only:
                todo.extend(v.owner.operands)
            todo.extend(v.owner.attribute_values(by_name))
    return ops, seen


def value_key(values: dict[str, np.ndarray] | None, names: list[str]) -> tuple:
    """The values of the arguments `names` as a hashable key (dtype and elements)."""
    if not names:
        return ()
    values = values or {}
    missing = [n for n in names if n not in values]
    if missing:
        raise GCError(f"the value of %{missing[0]} is needed: an attribute takes it at run time")
    return tuple((n, str(np.asarray(values[n]).dtype), tuple(np.asarray(values[n]).reshape(-1).tolist()))
                 for n in names)


def specialize(module: Module, f: Func, shapes: list[tuple[int, ...]],
               values: dict[str, np.ndarray] | None = None) -> Func:
    """`f` with its arguments of these shapes and every type inferred from them (f itself if nothing is
    dynamic); `values` holds the arguments that attributes take at run time (runtime_args). Raises the op's
    GCError, with notes on the arguments' sizes and values, where they do not fit."""
    if not is_dynamic(f):
        return f
    key = (tuple(tuple(s) for s in shapes), value_key(values, runtime_args(f)))
    # Passes edit functions in place (new ops, operands replaced, attributes set anew): a specialization
    # holds for this wiring only.
    wiring = tuple((id(op), id(op.attrs), *map(id, op.operands)) for op in f.ops) + tuple(map(id, f.results))
    done = _CACHE.setdefault(f, {})
    if done.get(key, (None,))[0] != wiring:
        done[key] = (wiring, _specialize(module, f, key))
    return done[key][1]


def _specialize(module: Module, f: Func, key: tuple) -> Func:
    shapes, values = key
    try:
        sizes = bind_sizes([(a.name, a.type.shape, a.loc or f.loc) for a in f.args], list(shapes))
    except GCError as e:
        raise _at_this_call(e, f, key) from None
    g = f.clone()
    for a, shape in zip(g.args, shapes):
        a.type = a.type.with_shape(shape)
    shapes_of = {a.name: a.type.shape for a in g.args}
    given = {name: np.asarray(elems, dtype).reshape(shapes_of[name]) for name, dtype, elems in values}
    computed = _sources(g)[0]
    for op, generic in zip(g.ops, f.ops):
        try:
            if op.runtime_attrs():
                _bind_attrs(op, given)
            called = op.called()
            if called is not None and called.name in module:  # the callee at these operand sizes
                callee = specialize(module, module[called.name], [v.type.shape for v in op.operands])
                types = [v.type for v in callee.results]
            else:
                types = op.infer_types()
        except GCError as e:
            raise _at_this_call(e, f, key) from None
        for r, t, was in zip(op.results, types, generic.results):
            if not was.type.fits(t) or unheld(was.type.shape, t.shape, sizes) is not None:
                raise _at_this_call(op.error(f"gives {t} at these sizes, but {was.type} where they are ?"), f, key)
            r.type = t
        if op in computed:  # a value an attribute takes (or one it is computed from): computed now
            try:
                given.update(zip((r.name for r in op.results), _evaluate(op, given)))
            except GCError as e:
                raise _at_this_call(e, f, key) from None
    for i, (v, t) in enumerate(zip(g.results, f.result_types)):
        if t is not None and (not t.fits(v.type) or unheld(t.shape, v.type.shape, sizes) is not None):
            err = GCError(f"return: value #{i} has type {v.type} at these sizes but @{f.name} declares {t}",
                          f.return_loc or f.loc)
            raise _at_this_call(err, f, key)
    g.result_types = [v.type for v in g.results]
    if values:  # arguments read only for their values now: no remark that nothing uses them
        g.attrs["values_bound"] = tuple(name for name, _, _ in values)
    return g


def _evaluate(op: Op, given: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The op's results on the reference interpreter; operands whose sizes alone it reads stand as
    zero-strided arrays of their shape."""
    args = []
    for v in op.operands:
        if op.reads_sizes_only:
            args.append(stand_in(v.type) if v.type.is_static else _Sizes(v.type))
        elif v.name in given:
            args.append(given[v.name])
        else:
            raise op.error(f"an attribute taken at run time is computed from %{v.name}, whose value is known only "
                           "when the function runs: it may read sizes (graph.shape), constants and arguments")
    with np.errstate(all="ignore"):
        return op.evaluate(args)


class _Sizes:
    """What an op that reads only its operand's sizes sees of an operand whose sizes are named
    (codegen/symbolic.py): its shape, expressions and numbers."""

    def __init__(self, t):
        self.shape, self.ndim, self.dtype = tuple(t.shape), t.rank, t.dtype.np


def bind_values(f: Func, values: dict[str, np.ndarray]) -> None:
    """Attributes taken at run time from the arguments in `values` given those values for good (the
    arguments are being bound as constants: `gc compile --params`)."""
    for op in f.ops:
        if any(ref.name in values for ref in op.runtime_attrs().values()):
            _bind_attrs(op, values, partial=True)


def _bind_attrs(op: Op, given: dict[str, np.ndarray], partial: bool = False) -> None:
    """The op's run-time attributes replaced by the values of this call, checked as written ones are."""
    attrs = dict(op.attrs)
    for key, ref in op.runtime_attrs().items():
        if partial and ref.name not in given:
            continue
        if ref.name not in given:
            raise op.error(f"attribute '{key}' takes %{ref.name} at run time, which a called function cannot "
                           "(only the function called from outside may)")
        arr = np.asarray(given[ref.name])
        kind = type(op).attr_specs[key].kind
        flat = [x.item() if hasattr(x, "item") else x for x in arr.reshape(-1)]
        if kind in ("ints", "floats"):  # (a named size stays an expression: a function for every size)
            attrs[key] = [x if isinstance(x, Sym) else int(x) if kind == "ints" else float(x) for x in flat]
        elif len(flat) != 1:
            raise op.error(f"attribute '{key}' = %{ref.name} takes one number, but this call gives {len(flat)}")
        else:
            attrs[key] = flat[0] if isinstance(flat[0], Sym) and kind is int else kind(flat[0])
    attrs = op.check_attrs(attrs, op.loc)
    op.attrs = attrs


def specialize_module(module: Module, entry: str, shapes: list[tuple[int, ...]],
                      values: dict[str, np.ndarray] | None = None) -> Module:
    """A static module: @entry specialized to argument `shapes` (and `values`, see specialize), and every
    function it calls to the shapes of its calls (one copy per distinct shapes: the first keeps the name,
    others add `_<n>`)."""
    out = Module()
    names: dict[tuple[str, tuple], str] = {}

    def visit(f: Func, key: tuple, vals=None) -> str:
        if (f.name, key) in names:
            return names[(f.name, key)]
        taken = sum(1 for (n, _) in names if n == f.name)
        name = names[(f.name, key)] = f.name if not taken else f"{f.name}_{taken}"
        g = specialize(module, f, list(key), vals)
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

    visit(module[entry], tuple(tuple(s) for s in shapes), values)
    for f in module:  # functions @entry does not reach, as they are (if static)
        if f.name not in out and not is_dynamic(f):
            out.add(f.clone())
    return out


def _at_this_call(e: GCError, f: Func, key: tuple) -> GCError:
    """`e` with a note per dynamic argument: its type and the sizes (or value) this call binds."""
    shapes, values = key
    given = {name: elems for name, _, elems in values}
    notes = []
    for a, shape in zip(f.args, shapes):
        if not a.type.is_static:
            dims = ", ".join(f"dimension {i} = {n}" for i, (d, n) in enumerate(zip(a.type.shape, shape)) if not known(d))
            notes.append((a.loc or f.loc, f"%{a.name} is {a.type}; this call gives it {_dims(shape)} ({dims})"))
        if a.name in given:
            notes.append((a.loc or f.loc, f"%{a.name} is {a.type}, taken by attributes; this call gives it "
                                          f"{list(given[a.name])}"))
    diags = [Diagnostic(d.message, d.loc, d.severity, [*d.notes, *notes]) for d in e.diagnostics]
    return GCError(diags)


def _dims(shape) -> str:
    return "x".join(map(str, shape)) or "a scalar"
