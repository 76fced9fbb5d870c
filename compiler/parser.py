"""GIR text -> IR. Grammar in gir.lark (LALR); every op, value use and attribute keeps its line:col.

The parser resolves names and attributes; types are inferred and checked by the verifier, so both
hand-written files and pass output go through the same checks. Every problem found is reported once.
"""

from __future__ import annotations

import difflib
import math
from functools import lru_cache
from pathlib import Path

import lark
import numpy as np

from compiler.diagnostics import Diagnostic, DiagnosticCollector, GCError, Location, Source
from compiler.ir import (
    DYN,
    OP_REGISTRY,
    ArgValue,
    Dense,
    DType,
    Func,
    Module,
    Op,
    Sym,
    SymbolRef,
    TensorType,
    Value,
    known,
    lookup_op,
    name_ok,
)

_DTYPES = {d.value: d for d in DType}
MAX_RANK = 64  # NumPy's most dimensions (numpy 2); the reference interpreter is NumPy
MAX_BYTES = 2**63 - 1  # what NumPy can index
_INT64 = (-(2**63), 2**63 - 1)

_TOKEN_NAMES = {
    "VALUE": "a %value",
    "SYMBOL": "a @symbol",
    "TENSOR_TYPE": "a tensor type",
    "OP_NAME": "an op name",
    "IDENT": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "RETURN": "'return'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COMMA": "','",
    "COLON": "':'",
    "EQUAL": "'='",
    "MORETHAN": "'>'",
    "LESSTHAN": "'<'",
    "__ANON_0": "'->'",
    "FUNC": "'func'",
    "DENSE": "'dense'",
    "ATTRIBUTES": "'attributes'",
    "LOC": "'loc'",
    "FUSED": "'fused'",
}


@lru_cache(maxsize=1)
def _lark() -> lark.Lark:
    grammar = (Path(__file__).parent / "gir.lark").read_text(encoding="utf-8")
    return lark.Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse_file(path: str | Path) -> Module:
    """Parse a .gir file; a user mistake raises GCError with every diagnostic."""
    return parse(read_text(path), str(path))


def read_text(path: str | Path, data: bytes | None = None) -> str:
    """A .gir file's text (`data`, or read from `path`): UTF-8, a leading byte-order mark dropped. A byte
    that is no UTF-8 is a diagnostic at its line and column."""
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise GCError(f"cannot read {path}: {e.strerror or e}") from None
    return decode(data, str(path))


def decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8-sig")  # -sig: Windows editors begin UTF-8 with a byte-order mark
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        start = data.rfind(b"\n", 0, e.start) + 1
        col = len(data[start : e.start].decode("utf-8", "replace")) + 1
        text = data.decode("utf-8", "replace")
        bad = data[e.start : e.end].hex(" ")
        raise GCError(f"invalid UTF-8 (byte {bad}): a .gir file is UTF-8 text",
                      Location(name, line, col, Source(name, text))) from None


def parse(text: str, filename: str = "<input>", *, verify: bool = True, line_offset: int = 0) -> Module:
    """Parse GIR text into a verified module."""
    text = text.removeprefix("\ufeff")  # a byte-order mark read as text
    source = Source(filename, ("\n" * line_offset) + text if line_offset else text)
    try:
        tree = _lark().parse(source.text)
    except lark.exceptions.UnexpectedInput as e:
        raise GCError(_syntax_message(e), Location(filename, e.line, e.column, source)) from None
    builder = _Builder(source)
    module = builder.module(tree)
    errors = builder.diag.diagnostics
    if not module.funcs and not errors:
        errors = [Diagnostic("no function in the file: a module is one or more `func @name(...) -> ... { ... }`",
                             Location(filename, 1 + line_offset, 1, source))]
    if verify:
        from compiler.verifier import verify_module

        try:
            verify_module(module, infer_missing=True)
        except GCError as e:
            errors = errors + e.diagnostics
    if errors:
        key = lambda d: (d.loc.line, d.loc.col) if d.loc else (0, 0)  # noqa: E731
        raise GCError(sorted(errors, key=key))
    return module


def _syntax_message(e: lark.exceptions.UnexpectedInput) -> str:
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        return f"unexpected character {e.char!r}"
    if isinstance(e, lark.exceptions.UnexpectedEOF) or getattr(e, "token", None) is not None and e.token.type == "$END":
        return "unexpected end of input"
    tok = e.token
    expected = sorted({_TOKEN_NAMES.get(t, repr(t.lower())) for t in (e.expected or ()) if t != "$END"})
    got = f"'{tok}'" if tok.type != "$END" else "end of input"
    if len(expected) > 6:
        return f"unexpected {got}"
    return f"unexpected {got}; expected " + (" or ".join(expected) if len(expected) <= 2 else ", ".join(expected))


_UNESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _unescape(s: str) -> str:
    """The string escapes the printer writes: \\n \\t \\" \\\\ (others keep their backslash)."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            out.append(_UNESCAPES.get(s[i + 1], s[i : i + 2]))
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _leaves(lit):
    if isinstance(lit, list):
        for x in lit:
            yield from _leaves(x)
    else:
        yield lit


class _Builder:
    """Walks the parse tree, building IR and collecting diagnostics."""

    def __init__(self, source: Source):
        self.source = source
        self.diag = DiagnosticCollector()

    def loc(self, tok) -> Location:
        return Location(self.source.name, tok.line, tok.column, self.source)

    def module(self, tree) -> Module:
        module = Module()
        for ft in tree.children:
            f = self.func(ft)
            if f is None:
                continue
            if f.name in module:
                prev = module[f.name]
                self.diag.error(f"redefinition of function @{f.name}", f.loc, [(prev.loc, "previous definition here")])
                continue
            module.add(f)
        return module

    # -- types ------------------------------------------------------------------------------

    def tensor_type(self, tok) -> TensorType | None:
        inner = tok.value[len("tensor<") : -1]
        parts = _split_dims(inner) if inner else [""]
        *dims, dt = parts
        col = tok.column + len("tensor<")
        if inner.count("(") != inner.count(")"):
            at = col + inner.rfind("?(") if "?(" in inner else col
            self.diag.error(f"unclosed size name in {tok.value}: a named size is ?(name)",
                            Location(self.source.name, tok.line, at, self.source))
            return None
        if len(dims) > MAX_RANK:
            loc = Location(self.source.name, tok.line, col, self.source)
            self.diag.error(f"a tensor of rank {len(dims)}: gc supports ranks up to {MAX_RANK} (NumPy's limit)", loc)
            return None
        shape = []
        for d in dims:
            if d == "?":  # a size known only at run time
                shape.append(DYN)
                col += 2
                continue
            if d.startswith("?(") and d.endswith(")"):  # one named: the same size wherever the name is
                name = d[2:-1]
                if not name_ok(name):
                    loc = Location(self.source.name, tok.line, col + 2, self.source)
                    self.diag.error(f"invalid size name '{name}' in {tok.value}: a name is a letter or _, then "
                                    "letters, digits or _", loc)
                    return None
                shape.append(Sym.symbol(name))
                col += len(d) + 1
                continue
            if not d.isdigit():
                loc = Location(self.source.name, tok.line, col, self.source)
                self.diag.error(f"invalid dimension '{d}' in {tok.value}: dimensions are non-negative integers,"
                                " ? (a size known only at run time) or ?(name) (one with a name)", loc)
                return None
            shape.append(int(d))
            if math.prod(d for d in shape if known(d)) * _DTYPES.get(dt, DType.f64).np.itemsize > MAX_BYTES:
                loc = Location(self.source.name, tok.line, col, self.source)
                self.diag.error(f"{tok.value} is too large: a tensor holds at most 2^63 - 1 bytes", loc)
                return None
            col += len(d) + 1
        if dt not in _DTYPES:
            loc = Location(self.source.name, tok.line, col, self.source)
            hint = difflib.get_close_matches(dt, list(_DTYPES), 1)
            more = f"; did you mean {hint[0]}?" if hint else f" (dtypes: {' '.join(_DTYPES)})"
            self.diag.error(f"unknown dtype '{dt}' in {tok.value}{more}", loc)
            return None
        return TensorType(tuple(shape), _DTYPES[dt])

    # -- functions --------------------------------------------------------------------------

    def func(self, t) -> Func | None:
        sym, args_t, results_t, attrs_t, loc_t, body_t = t.children
        floc = self.explicit_loc(loc_t) or self.loc(sym)
        scope: dict[str, tuple[Value, Location]] = {}
        args = []
        for at in args_t.children if args_t is not None else ():
            vtok, ttok, aloc = at.children
            v = Value(self.tensor_type(ttok), vtok.value[1:])
            v.loc = self.explicit_loc(aloc) or self.loc(vtok)
            self.define(scope, v, vtok)
            args.append(v)
        rtypes = [self.tensor_type(x) for x in results_t.children] if results_t is not None else []
        f = Func(sym.value[1:], args, rtypes, floc)
        if attrs_t is not None:
            f.attrs = self.attr_dict(attrs_t.children[0])[0] or {}
        *op_trees, ret = body_t.children
        later = self.later_definitions(op_trees)
        for ot in op_trees:
            op = self.op(ot, scope, later)
            if op is not None:
                f.ops.append(op)
        rtok, vals_t, rloc = ret.children
        f.return_loc = self.explicit_loc(rloc) or self.loc(rtok)
        vals = [self.use(scope, later, v) for v in (vals_t.children if vals_t is not None else ())]
        f.results = [v if v is not None else Value(None) for v in vals]
        return f

    def later_definitions(self, op_trees) -> dict[str, object]:
        out = {}
        for ot in op_trees:
            res = ot.children[0]
            for tok in res.children if res is not None else ():
                out.setdefault(tok.value, tok)
        return out

    def define(self, scope, v: Value, tok) -> None:
        name = tok.value
        if name in scope:
            _, prev = scope[name]
            self.diag.error(f"redefinition of value {name}", self.loc(tok), [(prev, "previous definition here")])
            return
        scope[name] = (v, self.loc(tok))

    def use(self, scope, later, tok) -> Value | None:
        if tok.value in scope:
            return scope[tok.value][0]
        if tok.value in later:
            d = later[tok.value]
            self.diag.error(
                f"use of value {tok.value} before its definition", self.loc(tok), [(self.loc(d), "defined here")]
            )
        else:
            near = difflib.get_close_matches(tok.value, list(scope), 1)
            hint = f"; did you mean {near[0]}?" if near else ""
            self.diag.error(f"use of undefined value {tok.value}{hint}", self.loc(tok))
        return None

    # -- ops ----------------------------------------------------------------------------------

    def op(self, t, scope, later) -> Op | None:
        res_t, name_tok, operands_t, attrs_t, sig_t, loc_t = t.children
        result_toks = list(res_t.children) if res_t is not None else []
        loc = self.explicit_loc(loc_t) or self.loc(name_tok)
        nresults = len(result_toks)
        poisoned = [Value(None, tok.value[1:]) for tok in result_toks]

        def bail() -> None:
            for v, tok in zip(poisoned, result_toks):
                self.define(scope, v, tok)

        cls = OP_REGISTRY.get(name_tok.value) or lookup_op(name_tok.value)
        if cls is None:
            self.diag.error(f"unknown op '{name_tok.value}'{self.suggest(name_tok.value)}", self.loc(name_tok))
            return bail()
        operand_toks = list(operands_t.children) if operands_t is not None else []
        operands = [self.use(scope, later, v) for v in operand_toks]
        attrs, attr_locs = self.attr_dict(attrs_t) if attrs_t is not None else ({}, {})
        if attrs is None:
            return bail()
        types = None
        if sig_t is not None:
            types = [self.tensor_type(x) for x in sig_t.children]
            if len(types) != nresults:
                self.diag.error(
                    f"{cls.name}: {nresults} result name(s) but {len(types)} result type(s)", self.loc(name_tok)
                )
                return bail()
        try:
            cls.check_operand_count(len(operands), loc)
            attrs = cls.check_attrs(attrs, loc, attr_locs)
            self.check_runtime_attrs(cls, attrs, attr_locs, scope, types, loc)
        except GCError as e:
            self.diag.add(e)
            return bail()
        if any(o is None for o in operands):
            return bail()
        op = cls(operands, attrs, types if types is not None else [None] * nresults, loc)
        for v, tok in zip(op.results, result_toks):
            v.name = tok.value[1:]
            self.define(scope, v, tok)
        return op

    def check_runtime_attrs(self, cls, attrs: dict, locs: dict, scope, types, loc) -> None:
        """`{axes = %axes}` names an argument of this function or an earlier op's result: a static integer (or
        float, for a float attribute) tensor of rank 0 or 1, whose value the op takes at each call. Its
        results are written."""
        for key, v in attrs.items():
            if not isinstance(v, ArgValue):
                continue
            at = locs.get(key, loc)
            arg = scope.get("%" + v.name, (None,))[0]
            if arg is not None and arg.type is None:
                continue  # a value already in error
            if arg is None:
                raise GCError(f"{cls.name}: attribute '{key}' = {v}: an attribute taken at run time names an "
                              f"argument of the function or an earlier op's result", at)
            kind = cls.attr_specs[key].kind
            t = arg.type
            ok_dtype = t.dtype.is_int or t.dtype.is_bool or (kind in (float, "floats") and t.dtype.is_float)
            if not (t.is_static and t.rank <= 1 and ok_dtype):
                want = "floats or integers" if kind in (float, "floats") else "integers"
                raise GCError(f"{cls.name}: attribute '{key}' = {v}: %{v.name} is {t}; an attribute taken at run "
                              f"time comes from a static tensor of rank 0 or 1 of {want}", at)
            if types is None:
                raise GCError(f"{cls.name}: the result types must be written where an attribute is taken at run "
                              f"time ({key} = {v})", loc)

    def suggest(self, name: str) -> str:
        names = list(OP_REGISTRY)
        near = difflib.get_close_matches(name, names, 1, cutoff=0.6)
        if not near and "." not in name:
            near = [n for n in names if n.split(".", 1)[-1] == name]
        if not near:
            short = {n.split(".", 1)[-1]: n for n in names}
            m = difflib.get_close_matches(name.split(".")[-1], list(short), 1, cutoff=0.6)
            near = [short[m[0]]] if m else []
        return f"; did you mean {near[0]}?" if near else ""

    # -- attributes ---------------------------------------------------------------------------

    def attr_dict(self, t) -> tuple[dict, dict]:
        attrs, locs = {}, {}
        for entry in t.children:
            key, val = entry.children
            if key.value in attrs:
                self.diag.error(f"attribute '{key.value}' given twice", self.loc(key))
                continue
            try:
                attrs[key.value] = self.attr_value(val)
            except GCError as e:
                self.diag.add(e)
                attrs[key.value] = None
            locs[key.value] = self.loc(key)
        if any(v is None for v in attrs.values()):
            return None, locs  # already reported; checking the rest would only repeat it
        return attrs, locs

    def attr_value(self, t, depth: int = 0):
        if isinstance(t, lark.Token):
            return self.scalar_token(t, allow_dtype=True)
        if t.data == "number":
            return self.number(t.children[0])
        if t.data == "string":
            return _unescape(t.children[0].value[1:-1])
        if t.data == "ident":
            return self.scalar_token(t.children[0], allow_dtype=True)
        if t.data == "symbol":
            return SymbolRef(t.children[0].value[1:])
        if t.data == "argument":
            if depth:
                raise GCError("an attribute taken at run time is a whole argument, not a list element",
                              self.loc(t.children[0]))
            return ArgValue(t.children[0].value[1:])
        if t.data == "list":
            self.check_nesting(t, depth)
            return tuple(self.attr_value(c, depth + 1) for c in t.children)
        if t.data == "dense":
            return self.dense(t)
        raise AssertionError(t.data)

    def check_nesting(self, t, depth: int) -> None:
        """Lists nest at most MAX_RANK deep (a dense literal as deep as its rank): deeper input would
        only exhaust the parser's stack."""
        if depth >= MAX_RANK:
            raise GCError(f"lists nest more than {MAX_RANK} deep", Location(self.source.name, t.meta.line,
                                                                            t.meta.column, self.source))

    def number(self, tok, dense: bool = False):
        s = tok.value
        if any(c in s.lower() for c in ".en") or "inf" in s:
            return float(s)
        v = int(s)
        # A dense literal may hold a u64 up to 2^64 - 1; its dtype's range is checked with the rest of it.
        if not _INT64[0] <= v <= (2**64 - 1 if dense else _INT64[1]):
            raise GCError(f"integer {s} does not fit in 64 bits", self.loc(tok))
        return v

    def scalar_token(self, tok, allow_dtype: bool):
        if tok.type == "NUMBER":
            return self.number(tok)
        if tok.value in ("true", "false"):
            return tok.value == "true"
        if allow_dtype and tok.value in _DTYPES:
            return _DTYPES[tok.value]
        raise GCError(f"unknown attribute value '{tok.value}' (expected a number, true, false, a dtype, ...)", self.loc(tok))

    def dense(self, t) -> Dense:
        body, ttok = t.children
        ty = self.tensor_type(ttok)
        if ty is None:
            raise GCError([])  # tensor_type reported it
        lit = self.dense_literal(body)
        loc = self.loc(ttok)
        if not ty.is_static:
            raise GCError(f"a dense constant has every size known: {ty} has a ?", loc)
        if not ty.dtype.is_bool and any(isinstance(x, bool) for x in _leaves(lit)):
            raise GCError(f"dense values of {ty} must be numbers, not true/false", loc)
        try:
            if ty.dtype.is_bool:
                arr = np.array(lit, dtype=object)
                if not all(isinstance(x, bool) for x in arr.reshape(-1)):
                    raise GCError(f"dense values of {ty} must be true or false", loc)
            arr = np.array(lit, dtype=np.float64 if ty.dtype.is_float else object)
        except ValueError:
            raise GCError(f"dense literal is not rectangular for {ty}", loc) from None
        splat = arr.ndim == 0
        if not splat and tuple(arr.shape) != ty.shape:
            raise GCError(f"dense literal has shape {list(arr.shape)} but its type is {ty}", loc)
        if ty.dtype.is_int:
            flat = arr.reshape(-1)  # a splat's one value
            if any(isinstance(x, (float, bool)) for x in flat):
                raise GCError(f"dense values of {ty} must be integers", loc)
            info = np.iinfo(ty.dtype.np)
            if any(not info.min <= int(x) <= info.max for x in flat):
                raise GCError(f"dense value out of range for {ty.dtype}", loc)
        # Integers straight to their dtype (in range, as checked): a u64 above 2^63 would otherwise go through f64.
        source = np.array(arr.tolist() if arr.dtype == object else arr, dtype=ty.dtype.np if ty.dtype.is_int else None)
        with np.errstate(over="ignore"):
            values = source.astype(ty.dtype.np)
        overflow = np.isinf(values.astype(np.float64)) & np.isfinite(source) if ty.dtype.is_float else None
        if overflow is not None and overflow.any():
            big = source.reshape(-1)[np.flatnonzero(overflow)[0]]
            import ml_dtypes  # (only here: its import costs every command 0.5 s, compiler/ir.py's _bf16)

            raise GCError(f"dense value {big:g} is out of range for {ty.dtype} "
                          f"(largest {float(ml_dtypes.finfo(ty.dtype.np).max):g}; write inf for infinity)", loc)
        try:
            values = np.full(ty.shape, values, ty.dtype.np) if splat else values.reshape(ty.shape)
        except MemoryError:
            raise GCError(f"dense constant {ty} ({ty.nbytes:,} bytes) does not fit in memory", loc) from None
        return Dense.of(values, ty.dtype)

    def dense_literal(self, t, depth: int = 0):
        if isinstance(t, lark.Tree) and t.data == "list":
            self.check_nesting(t, depth)
            return [self.dense_literal(c, depth + 1) for c in t.children]
        tok = t.children[0] if isinstance(t, lark.Tree) else t
        return self.number(tok, dense=True) if tok.type == "NUMBER" else self.scalar_token(tok, allow_dtype=False)

    # -- locations ----------------------------------------------------------------------------

    def explicit_loc(self, t) -> Location | None:
        if t is None:
            return None
        items = []
        for it in t.children:
            f, line, col = it.children
            for n in (line, col):
                if not n.value.isdigit():
                    raise GCError(f"a location's line and column are integers, got '{n.value}'", self.loc(n))
            items.append(Location(f.value[1:-1], int(line.value), int(col.value)))
        return Location.merge(items)


def _split_dims(inner: str) -> list[str]:
    """`4x?(batch)xf32` -> ['4', '?(batch)', 'f32']: split at each x outside a ?(name)."""
    parts, depth, cur = [], 0, []
    for ch in inner:
        depth += (ch == "(") - (ch == ")")
        if ch == "x" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts
