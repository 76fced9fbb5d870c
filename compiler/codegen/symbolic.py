"""One kernel for every size: a function with `?` sizes compiled once into kernels whose extents are
expressions of its named sizes, and at each new size only a memory plan (issue 18; docs/architecture.md).

    the entry, every `?` of its arguments a fresh name        (`symbolize`: every type an expression)
      -> the graph passes, once                                (`optimized`; again for a size where a
                                                                choice they made by size goes the other
                                                                way: ir.at_least, its guards)
    at each distinct size of the arguments:
      -> the module at that size, each size a `Bound` int      (`instantiate`: an int that keeps its expression)
      -> plan memory, read the kernels, lower each one with its extents as expressions of size variables
         (`KernelSizes`), schedule it, the runtime plan         (build.build, `symbols=`)
      -> the library's function for each kernel: built at an earlier size where the lowered kernel is
         structurally the same (so it is the same code for every size), else built now

Correctness never rests on a kernel being symbolic: a kernel is lowered from the types at this size, and
an op whose lowering reads a size as a number (a mean's divisor over a dynamic axis, a broadcast of a
size that is 1 at this call) writes that number into the kernel, which then differs structurally from
the same kernel at another size and is built for that size alone. What the symbolic build saves is the
build of every kernel whose lowering takes its sizes as expressions, which the shapes of the rules and
the schedules decide; `SymbolicBuild.stats` says how many kernels each size built.
"""

from __future__ import annotations

from compiler.ir import DYN, Bound, Dynamic, Module, Sym, TensorType


def symbolize(module: Module, entry: str) -> Module | None:
    """The module with @entry's arguments' `?` sizes named (`s0`, `s1`, ...; named sizes keep their
    names) and every type inferred from them, or None where some value's size is a `?` that is no
    expression of the names (a size computed from data or from an attribute taken at run time)."""
    from compiler.diagnostics import GCError
    from compiler.specialize import has_runtime_attrs, runtime_args, specialize_module

    f = module[entry]
    if runtime_args(f):  # attributes that take an argument's value: a function for each value
        return None
    try:
        out = specialize_module(module, entry, named_shapes(f))
    except (GCError, TypeError, ValueError, AttributeError):
        # An attribute computed from sizes by arithmetic that names cannot do (an order, a float): sizes
        # one at a time, where the same computation meets numbers.
        if not has_runtime_attrs(f):
            raise
        return None
    if any(d is DYN for g in out for v in g.values() for d in v.type.shape):
        return None
    return out


def named_shapes(f) -> list[tuple]:
    """f's argument shapes with each `?` a fresh name (`s0`, `s1`, ... in order; names given kept)."""
    taken = {s for a in f.args for d in a.type.shape if isinstance(d, Sym) for s in d.symbols()}
    fresh = (f"s{i}" for i in range(10**6) if f"s{i}" not in taken)
    return [tuple(Sym.symbol(next(fresh)) if d is DYN else d for d in a.type.shape) for a in f.args]


def optimized(module: Module, options, sizes: dict[str, int] | None = None):
    """(The symbolized module of @entry after the graph passes, their size-dependent choices made at
    `sizes` (None: every name 2, the size `gc compile` builds at) and recorded as guards:
    ir.SizeChoices), or None where it cannot be symbolized. `module`, the frontend's, is not modified."""
    from compiler import driver
    from compiler.ir import SizeChoices, choosing

    if sizes is None:  # (not 1: a size of 1 is its own specialization, and min(seq + 1, 2 * seq) ties there)
        sizes = {n: 2 for shape in named_shapes(module[options.entry]) for d in shape if isinstance(d, Sym)
                 for n in d.symbols()}

    with choosing(SizeChoices(sizes)) as choices:  # (sizes computed for attributes choose too: size_max)
        out = symbolize(module, options.entry)
        if out is None:
            return None
        driver.optimize(out, options)
    return out, choices


def instantiate(module: Module, sizes: dict[str, int]) -> Module:
    """A copy of a symbolized module at these sizes: every expression of the names a `Bound` int, but for
    sizes of 0 and 1, which stay plain numbers: their kernels are that size's own (as torch.compile
    specializes 0 and 1), since a batch of one row is a GEMV, which the matmul rule schedules apart, and
    a size of 1 broadcasts."""
    def dim(d):
        if not isinstance(d, Sym):
            return d
        n = d.evaluate(sizes)
        return n if n in (0, 1) else Bound(n, d)

    def at(t: TensorType) -> TensorType:
        if all(not isinstance(d, Dynamic) for d in t.shape):
            return t
        return TensorType(tuple(dim(d) for d in t.shape), t.dtype)

    def attr(a):
        if isinstance(a, Sym):
            return a.evaluate(sizes)
        return tuple(attr(x) for x in a) if isinstance(a, tuple) and any(isinstance(x, Sym) for x in a) else a

    out = module.clone()
    for g in out:
        for v in g.values():
            v.type = at(v.type)
        g.result_types = [at(t) if t is not None else None for t in g.result_types]
        for op in g.ops:  # sizes an attribute took from the arguments' (a reshape's [batch, seq, 2, -1])
            if any(isinstance(a, (Sym, tuple)) for a in op.attrs.values()):
                op.attrs = {k: attr(a) for k, a in op.attrs.items()}
    return out


class KernelSizes:
    """The size variables of one kernel and each Bound size as an expression of them.

    TVM binds a variable from the shape of a parameter whose extent it is, at each call; so each name
    becomes a variable where some parameter has it alone as a size, and a name found only in sizes like
    `128 * n + 1` (a flattened batch) is that size's own variable `v`, the name standing for
    `(v - 1) // 128`; any other size whose names no parameter binds alone (a product of two names,
    `batch * seq`) is its own variable. A size no parameter's extent gives (an expression of names none
    of which is a variable) stays a number: the kernel is this size's alone."""

    def __init__(self, shapes: list[tuple]):
        from tvm import tirx

        self.names: dict[str, object] = {}
        self.direct: dict[Sym, object] = {}
        self.bounds = bounds = [d for shape in shapes for d in shape if isinstance(d, Bound)]
        for d in bounds:
            name = d.sym.name
            if name is not None and name not in self.names:
                self.names[name] = self.direct[d.sym] = tirx.Var(name, "int32")
        for d in bounds:
            linear = _linear(d.sym)
            if linear is not None and linear[0] not in self.names:
                name, coef, const = linear
                v = self.direct[d.sym] = tirx.Var(f"{name}_{coef}", "int32")
                self.names[name] = tirx.floordiv(v - const, coef)
        for d in bounds:  # a size of names no parameter binds alone (GPT-2's [batch * seq, 768]): its own
            if d.sym not in self.direct and not d.sym.symbols() <= self.names.keys():
                self.direct[d.sym] = tirx.Var(f"v{len(self.direct)}", "int32")

    def values(self) -> dict[str, int]:
        """Each size variable's value at the sizes of the types (by the variable's name)."""
        return {self.direct[d.sym].name: int(d) for d in self.bounds if d.sym in self.direct}

    def exprs(self) -> dict[str, str]:
        """Each size variable's expression of the names: part of what the kernel is (a kernel over
        `[s0, 64]` and the same one over `[4 * s0, 64]` are two functions, each called at one size a call)."""
        return {v.name: s.expr() for s, v in self.direct.items()}

    def convert(self, d):
        if not isinstance(d, Bound):
            return d
        if d.sym in self.direct:
            return self.direct[d.sym]
        if not d.sym.symbols() <= self.names.keys():
            return int(d)
        return _expr(d.sym, self.names)


def _linear(s: Sym) -> tuple[str, int, int] | None:
    """(name, c, k) where s is c * name + k, else None."""
    const = dict(s.terms).get((), 0)
    rest = [(m, c) for m, c in s.terms if m]
    if len(rest) == 1 and len(rest[0][0]) == 1 and isinstance(rest[0][0][0], str) and rest[0][1] > 0:
        return rest[0][0][0], rest[0][1], const
    return None


def _expr(s: Sym, names: dict[str, object]):
    from tvm import tirx

    total = 0
    for mono, coef in s.terms:
        term = coef
        for a in mono:
            term = term * (names[a] if isinstance(a, str) else tirx.floordiv(_expr(a[1], names), a[2]))
        total = total + term
    return total
