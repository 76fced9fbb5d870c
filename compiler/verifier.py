"""The verifier: SSA dominance, result types against each op's infer(), returns against signatures.

Run after parsing (filling in result types the text left out) and after every pass. It reports
every problem it finds; an op whose operands are already in error is skipped, so one mistake
gives one diagnostic.
"""

from __future__ import annotations

from compiler.diagnostics import DiagnosticCollector, GCError, Location
from compiler.ir import Func, Module, Op, Value


def verify_module(module: Module, *, infer_missing: bool = False) -> None:
    """Raise GCError with every diagnostic if `module` is not valid IR."""
    diag = DiagnosticCollector()
    for f in module:
        _verify_func(f, module, diag, infer_missing)
    diag.raise_if_any()


def _verify_func(f: Func, module: Module, diag: DiagnosticCollector, infer_missing: bool) -> None:
    defined: set[Value] = set()
    for a in f.args:
        if a in defined:
            diag.error(f"@{f.name}: argument %{a.name} appears twice", a.loc or f.loc)
        defined.add(a)
    for op in f.ops:
        if any(v.type is None for v in op.operands):
            defined.update(op.results)
            continue  # already reported where the operand went wrong
        for i, v in enumerate(op.operands):
            if v not in defined:
                where = "later" if v.owner in f.ops else "outside this function"
                diag.error(f"{op.name}: operand #{i} (%{v.name}) is defined {where}: not dominated", op.loc)
        _verify_op(op, module, diag, infer_missing)
        _verify_runtime_attrs(op, defined, diag)
        for r in op.results:
            if r in defined:
                diag.error(f"{op.name}: result %{r.name} is defined twice", op.loc)
            defined.add(r)
    _verify_return(f, defined, diag)


def _verify_runtime_attrs(op: Op, defined: set[Value], diag: DiagnosticCollector) -> None:
    """An attribute taken at run time names a value defined before its op, computed from sizes, constants
    and arguments that are small static tensors (their values key a specialization), never from data."""
    refs = op.runtime_attrs()
    if not refs:
        return
    by_name = {v.name: v for v in defined}
    for key, ref in refs.items():
        v = by_name.get(ref.name)
        if v is None:
            diag.error(f"{op.name}: attribute '{key}' = {ref} names no value defined before it", op.loc)
        elif (u := data_read(v, by_name)) is not None:
            diag.error(f"{op.name}: attribute '{key}' = {ref} is computed from %{u.name}, a {u.type}: a value "
                       "taken at run time may read sizes (graph.shape), constants and arguments that are static "
                       "tensors of rank 0 or 1", op.loc)


def data_read(v: Value, by_name: dict[str, Value]) -> Value | None:
    """An argument (the first by name) `v` is computed from that is no static tensor of rank 0 or 1 (data,
    whose value no specialization could key on), or None. Ops that read only sizes (graph.shape) end the walk."""
    from compiler.specialize import computed_from

    data = [u for u in computed_from([v], by_name)[1] if u.owner is None and u.type is not None
            and not (u.type.is_static and u.type.rank <= 1)]
    return min(data, key=lambda u: u.name or "") if data else None


def _verify_op(op: Op, module: Module, diag: DiagnosticCollector, infer_missing: bool) -> None:
    if op.runtime_attrs():  # written types (the parser and Op insist), checked when specialized to a call
        return
    try:
        inferred = op.infer_types()
        check = getattr(op, "verify_symbols", None)
        if check is not None:
            check(module)
    except GCError as e:
        diag.add(e)
        return
    if len(inferred) != len(op.results):
        diag.error(f"{op.name}: expected {len(inferred)} result(s), got {len(op.results)}", op.loc)
        return
    for r, t in zip(op.results, inferred):
        if r.type is None and infer_missing:
            r.type = t
        elif r.type.fits(t):  # a `?` written where inference knows the size: the size is kept
            if infer_missing:
                r.type = t
        elif r.type != t:
            diag.error(f"{op.name}: result type {r.type} does not match the inferred type {t}", op.loc)
            if infer_missing:
                r.type = None  # poison it, so its users do not report the same mistake again


def _verify_return(f: Func, defined: set[Value], diag: DiagnosticCollector) -> None:
    loc: Location | None = f.return_loc or f.loc
    if any(v.type is None for v in f.results):
        return
    if len(f.results) != len(f.result_types):
        diag.error(f"return: @{f.name} returns {len(f.result_types)} value(s), got {len(f.results)}", loc)
        return
    for i, (v, t) in enumerate(zip(f.results, f.result_types)):
        if v not in defined:
            diag.error(f"return: value #{i} (%{v.name}) is not defined in @{f.name}", loc)
        elif t is not None and not t.fits(v.type):
            diag.error(f"return: value #{i} has type {v.type} but @{f.name} declares {t}", loc)
