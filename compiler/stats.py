"""`gc stats`: what a function costs: ops, kernels, FLOPs, parameters and intermediate memory.

The numbers describe one run of the entry function, with calls followed. Op counts take every op that
runs, constants included; a call is not counted as an op, the callee's ops are, once per call. Kernels
and intermediates:
- a call of a function marked `attributes {kernel = true}` (what `fuse` makes) is one kernel; the
  callee's ops count in the op and FLOP totals, but its inner values never reach memory, so only the
  call's results count as intermediates;
- a call of any other function counts as if the callee were written in place (inlined);
- every other op except a constant is one kernel, and its results are intermediates (the returned
  values included: they are written by a kernel like any other).
Parameters are the constants (each function's once, however often it runs) plus the floating-point
arguments that are not data inputs. The data inputs are the first argument unless `data_args` names
them; integer and bool arguments (labels, token ids, masks) are always inputs, never parameters.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import product
from typing import Any

from compiler.diagnostics import GCError
from compiler.ir import DYN, NOMINAL, Func, Module, Op, Sym, evaluate_dim, known
from compiler.specialize import is_dynamic


def module_stats(module: Module, entry: str = "main", data_args: Sequence[str] | None = None,
                 memory: bool = True) -> dict[str, Any]:
    """The statistics of `module`'s function `entry` as a JSON-ready dict (see the module docstring)."""
    f = _entry(module, entry)
    if is_dynamic(f):
        return _dynamic_stats(module, f, data_args)
    names = [a.name for a in f.args]
    data = set(names[:1] if data_args is None else data_args)
    unknown = sorted(data - set(names))
    if unknown:
        raise GCError(f"@{f.name} has no argument {', '.join('%' + n for n in unknown)} (arguments: "
                      f"{', '.join('%' + n for n in names) or 'none'})")
    params = [a for a in f.args if a.type.dtype.is_float and a.name not in data]
    inputs = [a for a in f.args if a not in params]

    walk = _Walk(module)
    walk.func(f, in_kernel=False)
    constants = [op for g in walk.funcs for op in g.ops if op.kind == "constant"]
    const_elems = sum(op.value.type.size for op in constants)
    const_bytes = sum(op.value.type.nbytes for op in constants)
    return {
        "function": f.name,
        "num_ops": sum(walk.by_name.values()),
        "ops_by_name": dict(sorted(walk.by_name.items())),
        "ops_by_kind": dict(sorted(walk.by_kind.items())),
        "num_kernels": walk.kernels,
        "kernel_calls": dict(sorted(walk.kernel_calls.items())),
        "num_calls": walk.calls,
        "flops": walk.flops,
        "flops_estimated_for": sorted(walk.estimated),
        "params": sum(a.type.size for a in params) + const_elems,
        "param_bytes": sum(a.type.nbytes for a in params) + const_bytes,
        "param_args": [a.name for a in params],
        "num_constants": len(constants),
        "constant_params": const_elems,
        "inputs": [a.name for a in inputs],
        "input_bytes": sum(a.type.nbytes for a in inputs),
        "output_bytes": sum(t.nbytes for t in f.result_types),
        "intermediate_bytes": walk.intermediate_bytes,
        "memory": memory_plan(module, f) if memory else {},
    }


# The sizes a dynamic function is counted at: each `?` = n, and each named size, at four values from the
# smallest the function takes; a polynomial of degree <= 3 in each (FLOPs and bytes are sums of products
# of sizes: a batch times a sequence squared) is fitted through them exactly and checked at one more.
_SAMPLES = (0, 1, 2, 3)
_VARYING = ("flops", "params", "param_bytes", "input_bytes", "output_bytes", "intermediate_bytes")
_MAX_NAMES = 3  # 4^k samples: past three names every size is taken as one n


def _dynamic_stats(module: Module, f: Func, data_args: Sequence[str] | None) -> dict[str, Any]:
    """The statistics of a function with sizes known at run time: each figure with every size at NOMINAL,
    and (`expressions`) each that varies as a polynomial in the sizes' names (`n` for every `?`); the
    memory plan at NOMINAL."""
    from compiler.specialize import specialize_module

    names = sorted({s for a in f.args for d in a.type.shape if isinstance(d, Sym) for s in d.symbols()})
    if any(d is DYN for a in f.args for d in a.type.shape):
        names.append("n")
    one = len(names) > _MAX_NAMES
    if one:
        names = ["n"]

    def at(env: dict[str, int], memory: bool = False) -> dict[str, Any]:
        def size(d):
            if known(d):
                return d
            return env["n"] if one or d is DYN else evaluate_dim(d, env)

        shapes = [tuple(size(d) for d in a.type.shape) for a in f.args]
        return module_stats(specialize_module(module, f.name, shapes), f.name, data_args, memory)

    out = at(dict.fromkeys(names, NOMINAL), True)
    # The smallest sizes the function takes (a 3x3 conv over a `?` height needs 3 rows, a pool its window).
    first = next((n for n in (1, 2, 4, 8, 16, 32, 64) if _valid(lambda: at(dict.fromkeys(names, n)))), NOMINAL)
    samples: dict[tuple, dict] = {}

    def sample(point: tuple) -> dict:
        if point not in samples:
            samples[point] = at(dict(zip(names, point)))
        return samples[point]

    expressions = {}
    for key in _VARYING:
        try:
            varies = len({sample((first + d,) * len(names))[key] for d in _SAMPLES}) > 1
            coeffs = _fit(len(names), [first + d for d in _SAMPLES], lambda p: sample(p)[key]) if varies else None
        except GCError:
            varies, coeffs = True, None
        if not varies:
            continue
        check = (first + len(_SAMPLES),) * len(names)
        ok = coeffs is not None and _poly(coeffs, check) == sample(check)[key] and \
            _poly(coeffs, (NOMINAL,) * len(names)) == out[key]
        expressions[key] = _format_poly(coeffs, names) if ok else "varies with " + ", ".join(names)
    named = [x for x in names if x != "n"]
    what = (["every size = n"] if one else ["every ? = n"] if "n" in names else []) + \
        ([f"named sizes {', '.join(named)}"] if named else [])
    at_nominal = f"figures at {NOMINAL} each" if named else f"figures at n = {NOMINAL}"
    return {**out, "sizes": "; ".join([*what, at_nominal]), "expressions": expressions}


def _valid(make) -> bool:
    try:
        make()
        return True
    except GCError:
        return False


def _fit(k: int, xs: list[int], value) -> dict[tuple, int] | None:
    """Integer coefficients {exponents: c} of the polynomial of degree < len(xs) in each of k variables
    through value(point) at every point of the grid xs^k (one variable at a time: each coefficient of the
    first is a polynomial of the others), or None where one is not an integer."""
    if k == 0:
        return {(): value(())}
    out: dict[tuple, int] = {}
    inner = {}  # exponent of the first variable -> {rest point -> coefficient}
    for rest in product(xs, repeat=k - 1):
        c = _fit1(xs, [value((x, *rest)) for x in xs])
        if c is None:
            return None
        for e, v in enumerate(c):
            inner.setdefault(e, {})[rest] = v
    for e, at_rest in inner.items():
        sub = _fit(k - 1, xs, lambda rest: at_rest[rest])
        if sub is None:
            return None
        for exps, c in sub.items():
            if c:
                out[(e, *exps)] = c
    return out


def _fit1(xs: list[int], values: list[int]) -> list[int] | None:
    """Integer coefficients c0..c3 of the cubic through (x1, v1)..(x4, v4), or None if they are not integers."""
    from fractions import Fraction

    n = len(values)
    rows = [[Fraction(x**k) for k in range(n)] + [Fraction(v)] for x, v in zip(xs, values)]
    for i in range(n):  # Gauss-Jordan on the Vandermonde system, exactly
        p = next(r for r in range(i, n) if rows[r][i] != 0)
        rows[i], rows[p] = rows[p], rows[i]
        rows[i] = [v / rows[i][i] for v in rows[i]]
        for r in range(n):
            if r != i and rows[r][i] != 0:
                rows[r] = [a - rows[r][i] * b for a, b in zip(rows[r], rows[i])]
    coeffs = [rows[i][n] for i in range(n)]
    return [int(c) for c in coeffs] if all(c.denominator == 1 for c in coeffs) else None


def _poly(coeffs: dict[tuple, int], point: tuple) -> int:
    return sum(c * math.prod(x**e for x, e in zip(point, exps)) for exps, c in coeffs.items())


_POWER = ["", "", "²", "³"]


def _format_poly(coeffs: dict[tuple, int], names: list[str]) -> str:
    """{(1, 2): 3, (0, 0): 10} in (b, s) -> '3·b·s² + 10', highest degree first."""
    terms = []
    for exps, c in sorted(coeffs.items(), key=lambda t: (-sum(t[0]), [-e for e in t[0]])):
        factors = "".join(f"·{x}{_POWER[e]}" for x, e in zip(names, exps) if e)
        terms.append(f"{c:,}{factors}")
    return " + ".join(terms).replace("+ -", "- ") or "0"


def memory_plan(module: Module, f: Func) -> dict[str, int]:
    """The memory plan's figures (what `gc compile --stats` reports for the CPU): of `f` as planned if it is
    already, else of a copy planned exactly as the CPU build plans it (zero-bordered conv inputs and
    in-place epilogues included); plus the file order's lower bound."""
    from compiler.codegen.build import plan_module
    from compiler.memory import is_planned, plan_stats

    if is_planned(f):
        return plan_stats(f)
    copy = module.clone()
    file_order = plan_module(copy, "llvm", f.name)
    return {**plan_stats(copy[f.name]), "file_order_lower_bound_bytes": file_order}


def _entry(module: Module, entry: str) -> Func:
    if entry not in module:
        names = ", ".join("@" + n for n in module.funcs) or "none"
        raise GCError(f"no function @{entry} in the module (functions: {names})")
    return module[entry]


class _Walk:
    """Counts one run of a function, following calls (see the module docstring for the rules)."""

    def __init__(self, module: Module):
        self.module = module
        self.by_name: Counter = Counter()
        self.by_kind: Counter = Counter()
        self.kernel_calls: Counter = Counter()
        self.estimated: set[str] = set()
        self.kernels = self.calls = self.flops = self.intermediate_bytes = 0
        self.funcs: list[Func] = []  # every function reached, once: their constants are stored once
        self.stack: list[str] = []

    def func(self, f: Func, in_kernel: bool) -> None:
        # The verifier rejects recursion; the guard only keeps unverified input from looping forever.
        if f.name in self.stack:
            return
        if f not in self.funcs:
            self.funcs.append(f)
        self.stack.append(f.name)
        for op in f.ops:
            self.op(op, in_kernel)
        self.stack.pop()

    def op(self, op: Op, in_kernel: bool) -> None:
        if op.called() is not None:
            self.call(op, in_kernel)
            return
        if op.name.startswith(("mem.", "exec.")):
            return  # memory and synchronization of a planned function: no computation
        self.by_name[op.name] += 1
        self.by_kind[op.kind] += 1
        self.flops += self._flops(op)
        if op.kind == "constant" or in_kernel:
            return
        self.kernels += 1
        self.intermediate_bytes += sum(r.type.nbytes for r in op.results)

    def call(self, op: Op, in_kernel: bool) -> None:
        self.calls += 1
        callee = self.module.funcs.get(op.kernel.name if op.name == "exec.launch" else op.callee.name)
        if callee is None:
            return
        is_kernel = callee.attrs.get("kernel") is True
        if is_kernel and not in_kernel:
            self.kernels += 1
            self.kernel_calls[callee.name] += 1
            self.intermediate_bytes += sum(r.type.nbytes for r in op.results)
        self.func(callee, in_kernel or is_kernel)

    def _flops(self, op: Op) -> int:
        if getattr(op, "flops", None) is None:
            self.estimated.add(op.name)
        return op_flops(op)


def op_flops(op: Op) -> int:
    """The op's own count; one operation per element it produces for an op that does not state its cost."""
    flops = getattr(op, "flops", None)
    return int(flops()) if flops is not None else sum(r.type.size for r in op.results)


# --- text ---------------------------------------------------------------------------------------

_W = 24  # the label column: wide enough for "out-elementwise-fusable"
_SUMMARY = [
    ("ops", "num_ops", "count"),
    ("kernels", "num_kernels", "count"),
    ("FLOPs", "flops", "count"),
    ("parameters", "params", "count"),
    ("parameter bytes", "param_bytes", "bytes"),
    ("input bytes", "input_bytes", "bytes"),
    ("output bytes", "output_bytes", "bytes"),
    ("intermediate bytes", "intermediate_bytes", "bytes"),
]


def format_stats(stats: dict[str, Any]) -> str:
    """A readable table of `module_stats`' result."""
    lines = [f"@{stats['function']}" + (f"  ({stats['sizes']})" if "sizes" in stats else "")]
    expressions = stats.get("expressions", {})
    for label, key, unit in _SUMMARY:
        note = f"= {expressions[key]}" if key in expressions else _human(stats[key], unit)
        lines.append(f"  {label:<{_W}} {stats[key]:>16,}  {note}".rstrip())
    params = ", ".join("%" + n for n in stats["param_args"]) or "none"
    lines.append(f"  {'parameter args':<{_W}} {params}")
    if stats["num_constants"]:
        n = stats["constant_params"]
        lines.append(f"  {'constants':<{_W}} {stats['num_constants']:>16,}  ({n:,} element{'s' * (n != 1)})")
    lines.append(f"  {'inputs':<{_W}} {', '.join('%' + n for n in stats['inputs']) or 'none'}")
    if stats["flops_estimated_for"]:
        lines.append(f"  (FLOPs estimated as one per result element for {', '.join(stats['flops_estimated_for'])})")
    lines += _section("ops by name", stats["ops_by_name"])
    lines += _section("ops by kind", stats["ops_by_kind"])
    lines += _section("kernel calls", stats["kernel_calls"])
    lines += format_memory(stats["memory"], f" at every size = {NOMINAL}" if "sizes" in stats else "")
    return "\n".join(lines) + "\n"


_MEMORY = [
    ("arena (planned)", "arena_bytes"),
    ("naive (one per tensor)", "naive_bytes"),
    ("lower bound", "lower_bound_bytes"),
    ("lower bound, no borders", "tensor_bound_bytes"),  # at the tensors' own sizes
    ("lower bound, file order", "file_order_lower_bound_bytes"),
]


def format_memory(memory: dict[str, int], where: str = "") -> list[str]:
    """The memory plan's figures, with the arena's ratio to the naive size and to the lower bound."""
    lines = [f"memory plan (intermediates{where}):"]
    for label, key in _MEMORY:
        if key == "tensor_bound_bytes" and memory.get(key) == memory.get("lower_bound_bytes"):
            continue  # no borders: the same bound
        if key in memory:
            lines.append(f"  {label:<{_W}} {memory[key]:>16,}  {_human(memory[key], 'bytes')}".rstrip())
    arena, naive, bound = memory.get("arena_bytes", 0), memory.get("naive_bytes", 0), memory.get("lower_bound_bytes", 0)
    if naive and bound:
        lines.append(f"  {'arena / naive':<{_W}} {arena / naive:>16.3f}")
        lines.append(f"  {'arena / lower bound':<{_W}} {arena / bound:>16.3f}")
    return lines


def format_compile_stats(stats: dict[str, Any]) -> str:
    """`gc compile --stats` JSON, readably."""
    lines = [f"compiled {stats.get('source', '?')} for {stats.get('target', '?')} in {stats['compile_seconds']:.2f} s",
             f"  {'kernels':<{_W}} {stats['num_kernels']:>16,}"]
    lines += format_memory(stats)
    if stats.get("kernels"):
        lines += ["kernels, in order:"] + [f"  {k}" for k in stats["kernels"]]
    return "\n".join(lines) + "\n"


def _section(title: str, counts: dict[str, int]) -> list[str]:
    if not counts:
        return []
    width = max(_W, *(len(k) for k in counts))
    return [f"{title}:"] + [f"  {k:<{width}} {n:>16,}" for k, n in counts.items()]


def format_compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """`before` and `after` side by side, with the change of each number."""
    rows: list[tuple[str, int, int] | str] = [(lbl, before[k], after[k]) for lbl, k, _ in _SUMMARY]
    for title, section in (("ops by name", "ops_by_name"), ("ops by kind", "ops_by_kind")):
        keys = sorted(set(before[section]) | set(after[section]))
        rows += [f"{title}:"] + [(f"  {k}", before[section].get(k, 0), after[section].get(k, 0)) for k in keys]
    width = max(_W + 2, *(len(r[0]) for r in rows if isinstance(r, tuple)))
    lines = [f"{'@' + before['function']:<{width}} {'before':>16} {'after':>16} {'change':>16}"]
    for r in rows:
        lines.append(r if isinstance(r, str) else f"{r[0]:<{width}} {r[1]:>16,} {r[2]:>16,} {_change(r[1], r[2]):>16}")
    return "\n".join(lines) + "\n"


def _change(a: int, b: int) -> str:
    if a == b:
        return "="
    pct = f" ({(b - a) / a:+.1%})" if a else ""
    return f"{b - a:+,}{pct}"


def _human(n: int, unit: str) -> str:
    if unit == "bytes":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if n >= scale:
                return f"({n / scale:.2f} {name})"
        return ""
    for scale, name in ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"({n / scale:.2f} {name})"
    return ""
