"""IR -> canonical GIR text. parse(print(m)) == m at every stage; print is a fixed point of parse."""

from __future__ import annotations

from compiler.diagnostics import Location
from compiler.ir import Func, Module, Op, Value, format_attr

WIDTH = 100


def print_module(module: Module, *, debuginfo: bool = False) -> str:
    return "\n".join(print_func(f, debuginfo=debuginfo) for f in module)


def print_func(f: Func, *, debuginfo: bool = False) -> str:
    names = _Namer(f)
    # An argument a pass made (a kernel's) has no place of its own: it is where its function is, which
    # is also where parsing the printed text would put it, so printing is a fixed point.
    args = [f"{names[a]}: {a.type}" + _loc(a.loc or f.loc, debuginfo) for a in f.args]
    ret = ""
    if len(f.result_types) == 1:
        ret = f" -> {f.result_types[0]}"
    elif f.result_types:
        ret = " -> (" + ", ".join(str(t) for t in f.result_types) + ")"
    sig = f"func @{f.name}(" + ", ".join(args) + ")" + ret
    if len(sig) > WIDTH:  # one argument per line keeps big signatures readable
        sig = f"func @{f.name}(\n" + ",\n".join("    " + a for a in args) + "\n)" + ret
    if f.attrs:
        sig += " attributes " + _attr_dict(f.attrs)
    sig += _loc(f.loc, debuginfo)
    lines = [sig + " {"]
    lines += ["  " + print_op(op, names, debuginfo=debuginfo) for op in f.ops]
    ret = "  return" + ("" if not f.results else " " + ", ".join(names[v] for v in f.results))
    lines.append(ret + _loc(f.return_loc, debuginfo))
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_op(op: Op, names: _Namer | None = None, *, debuginfo: bool = False) -> str:
    name = names.__getitem__ if names else (lambda v: f"%{v.name or '?'}")
    out = ""
    if op.results:
        out = ", ".join(name(r) for r in op.results) + " = "
    out += op.name
    shown = {k: v for k, v in op.attrs.items() if not _is_default(op, k, v)}
    if op.operands or not shown:
        out += "(" + ", ".join(name(v) for v in op.operands) + ")"
    if shown:
        out += " " + _attr_dict(shown)
    if len(op.results) == 1:
        out += f" : {op.results[0].type}"
    elif op.results:
        out += " : (" + ", ".join(str(r.type) for r in op.results) + ")"
    return out + _loc(op.loc, debuginfo)


def _is_default(op: Op, key: str, value) -> bool:
    spec = op.attr_specs.get(key)
    if spec is None or spec.required or spec.default is None:
        return False
    return format_attr(spec.default) == format_attr(value)


def _attr_dict(attrs: dict) -> str:
    return "{" + ", ".join(f"{k} = {format_attr(v)}" for k, v in attrs.items()) + "}"


def _loc(loc: Location | None, debuginfo: bool) -> str:
    if not debuginfo or loc is None or loc.line == 0:
        return ""
    items = [f'"{x.file}":{x.line}:{x.col}' for x in loc.all()]
    return f" loc({items[0]})" if len(items) == 1 else " loc(fused[" + ", ".join(items) + "])"


class _Namer:
    """Stable, unique names: a value keeps its own name unless taken; others get %0, %1, ..."""

    def __init__(self, f: Func):
        self.names: dict[Value, str] = {}
        taken: set[str] = set()
        pending: list[Value] = []
        for v in f.values():
            if v.name and v.name not in taken:
                self.names[v] = v.name
                taken.add(v.name)
            else:
                pending.append(v)
        counter = 0
        for v in pending:
            if v in self.names:
                continue
            base = v.name
            while True:
                cand = f"{base}_{counter}" if base else str(counter)
                counter += 1
                if cand not in taken:
                    break
            self.names[v] = cand
            taken.add(cand)

    def __getitem__(self, v: Value) -> str:
        return "%" + self.names.get(v, v.name or "<undefined>")
