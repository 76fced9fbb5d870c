"""The IR: dtypes, tensor types, attributes, values, ops, functions, modules.

An op class declares its operands and attributes once (`x = operand()`, `perm = attribute(...)`);
that declaration gives the constructor's checks, the accessors and the printed form.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import numpy as np

from compiler.diagnostics import GCError, Location


class DType(enum.Enum):
    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    i1 = "i1"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    # Unsigned integers: an extension of the contract's dtypes (ONNX's UINT8..UINT64).
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"

    def __str__(self) -> str:
        return self.value

    @property
    def np(self) -> np.dtype:
        return _NUMPY[self] if self is not DType.bf16 else _bf16()

    @property
    def is_float(self) -> bool:
        return self in (DType.f16, DType.bf16, DType.f32, DType.f64)

    @property
    def is_int(self) -> bool:
        """Signed or unsigned integers (not i1)."""
        return self.np.kind in "iu" and self is not DType.i1

    @property
    def is_unsigned(self) -> bool:
        return self.np.kind == "u"

    @property
    def is_bool(self) -> bool:
        return self is DType.i1

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def tvm(self) -> str:
        return _TVM[self]

    @staticmethod
    def from_numpy(dt: np.dtype) -> DType:
        if is_bf16(np.dtype(dt)):
            return DType.bf16
        for k, v in _NUMPY.items():
            if np.dtype(dt) == v:
                return k
        raise ValueError(f"no GIR dtype for numpy dtype {dt}")


@functools.cache
def _bf16() -> np.dtype:
    # ml_dtypes is imported at the first bf16 value: its import takes 0.5 s (it registers its ufunc loops one
    # by one), which every gc command that never meets a bf16 (a compile from the cache) would pay.
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_bf16(dt: np.dtype) -> bool:
    """Whether a NumPy dtype is ml_dtypes' bfloat16, without importing ml_dtypes."""
    return dt.name == "bfloat16" and dt.itemsize == 2


_NUMPY = {
    DType.f16: np.dtype(np.float16),
    DType.f32: np.dtype(np.float32),
    DType.f64: np.dtype(np.float64),
    DType.i1: np.dtype(np.bool_),
    DType.i8: np.dtype(np.int8),
    DType.i16: np.dtype(np.int16),
    DType.i32: np.dtype(np.int32),
    DType.i64: np.dtype(np.int64),
    DType.u8: np.dtype(np.uint8),
    DType.u16: np.dtype(np.uint16),
    DType.u32: np.dtype(np.uint32),
    DType.u64: np.dtype(np.uint64),
}
_TVM = {
    DType.f16: "float16",
    DType.bf16: "bfloat16",
    DType.f32: "float32",
    DType.f64: "float64",
    DType.i1: "bool",
    DType.i8: "int8",
    DType.i16: "int16",
    DType.i32: "int32",
    DType.i64: "int64",
    DType.u8: "uint8",
    DType.u16: "uint16",
    DType.u32: "uint32",
    DType.u64: "uint64",
}


class Dynamic:
    """`?`, a dimension known only at run time (the contract's v2: `tensor<?x784xf32>`); its one instance
    is `DYN`.

    Arithmetic with it gives `?` (`? * 128` is `?`; `0 * ?` is 0), so a shape rule's sums and products
    carry it without a case of their own. It equals only itself: `tensor<?x4xf32>` is one type, and two
    `?` that differ at run time are told apart when the function is specialized to its arguments' sizes.
    So a rule must never ask `a != b` of sizes that may be `?` (it would call `?` and 4 different):
    `differ(a, b)` and `agree(a, b)` are false where a side is unknown. Ordering a `?` (`? < 4`), its truth
    (`if c % g:`) and `int(?)` raise TypeError: a rule that needs the size itself must say what it does without one."""

    _instance: Dynamic | None = None

    def __new__(cls) -> Dynamic:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def expr(self) -> str:
        """The size as an expression of the symbols (`?` for a size with no name)."""
        return "?"

    def __repr__(self) -> str:
        return "?"

    def __reduce__(self):
        return (Dynamic, ())

    def __hash__(self) -> int:
        return hash("?")

    def __eq__(self, other: object) -> bool:
        return other is self

    def _arith(self, other):
        if isinstance(other, (int, np.integer, Dynamic)) and not isinstance(other, bool):
            return self
        return NotImplemented

    def __mul__(self, other):
        return 0 if isinstance(other, (int, np.integer)) and other == 0 else self._arith(other)

    __add__ = __radd__ = __sub__ = __rsub__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _arith
    __rmul__ = __mul__

    def __neg__(self):
        return self

    def _order(self, other):
        raise TypeError("a dimension known only at run time (?) has no order; use ir.differ/agree")

    __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _order

    def __int__(self):
        raise TypeError("a dimension known only at run time (?) has no value here")

    __index__ = __int__


DYN = Dynamic()


def name_ok(name: str) -> bool:
    """Whether `name` may name a size: a letter or _, then letters, digits or _."""
    return bool(name) and (name[0].isalpha() or name[0] == "_") and all(c.isalnum() or c == "_" for c in name)


class Sym(Dynamic):
    """A size known at run time that has a name, or an expression of such sizes: `?(batch)` in a type
    (`tensor<?(batch)x784xf32>`), `batch * 128` where a reshape flattens it with a 128. Arguments that
    name the same symbol take the same size at every call; shape rules compute with symbols as with
    numbers, so a flattened `[B, 128, 256]` is `[B * 128, 256]` and sizes that differ by a constant are
    known to differ at compile time.

    An expression is a polynomial with integer coefficients in atoms: the symbols, and floor divisions
    of an expression by a number that does not divide it (a strided conv's `(h - 1) // 2 + 1`). It is
    kept normalized (terms sorted, none zero), so equal expressions are equal objects by `==` and one
    without symbols is an int, never a Sym. Like `?` it has no order and no truth; `ir.differ` and
    `ir.agree` compare two (`n + 1` and `n` differ, `2 * n` and `n + n` agree). A type prints a lone
    symbol by its name and any other expression as `?`; reading the text again infers it anew."""

    __slots__ = ("terms", "_hash")

    def __new__(cls, terms: tuple) -> Sym:
        obj = object.__new__(cls)
        obj.terms = terms  # ((monomial: tuple of atoms, sorted), coefficient), sorted by monomial
        obj._hash = hash(terms)
        return obj

    @staticmethod
    def symbol(name: str) -> Sym:
        if not name_ok(name):
            raise ValueError(f"invalid size name {name!r}: a letter or _, then letters, digits or _")
        return Sym((((name,), 1),))

    def __reduce__(self):
        return (Sym, (self.terms,))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and other.terms == self.terms

    @property
    def name(self) -> str | None:
        """The symbol's name where this is one symbol alone."""
        if len(self.terms) == 1:
            mono, coef = self.terms[0]
            if coef == 1 and len(mono) == 1 and isinstance(mono[0], str):
                return mono[0]
        return None

    def __repr__(self) -> str:
        return f"?({self.name})" if self.name is not None else "?"

    def expr(self) -> str:
        parts = []
        for mono, coef in self.terms:
            factors = [_atom_text(a) for a in mono]
            if abs(coef) != 1 or not factors:
                factors.insert(0, str(abs(coef)))
            term = " * ".join(factors)
            parts.append(("-" if coef < 0 else "") + term if not parts else (" - " if coef < 0 else " + ") + term)
        return "".join(parts)

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for mono, _ in self.terms:
            for a in mono:
                out |= {a} if isinstance(a, str) else a[1].symbols()
        return out

    def evaluate(self, sizes: dict[str, int]) -> int:
        """The size at these values of the symbols (a KeyError names one missing)."""
        total = 0
        for mono, coef in self.terms:
            v = coef
            for a in mono:
                v *= sizes[a] if isinstance(a, str) else evaluate_dim(a[1], sizes) // a[2]
            total += v
        return total

    # -- arithmetic: polynomials; with a `?` that has no name, `?` -------------------------------

    def _lift(self, other):
        if isinstance(other, Sym):
            return dict(other.terms)
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return {(): int(other)} if other else {}
        return None

    def __add__(self, other):
        o = self._lift(other)
        if o is None:
            return DYN if isinstance(other, Dynamic) else NotImplemented
        out = dict(self.terms)
        for m, c in o.items():
            out[m] = out.get(m, 0) + c
        return _poly(out)

    __radd__ = __add__

    def __neg__(self):
        return _poly({m: -c for m, c in self.terms})

    def __sub__(self, other):
        o = self._lift(other)
        if o is None:
            return DYN if isinstance(other, Dynamic) else NotImplemented
        return self + _poly({m: -c for m, c in o.items()})

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        o = self._lift(other)
        if o is None:
            return DYN if isinstance(other, Dynamic) else NotImplemented
        out: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in o.items():
                m = tuple(sorted(m1 + m2, key=_atom_key))
                out[m] = out.get(m, 0) + c1 * c2
        return _poly(out)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            k = int(other)
            if k <= 0:
                return DYN
            exact = {m: c // k for m, c in self.terms if m and c % k == 0}
            rest = {m: c for m, c in self.terms if m and c % k}
            const = dict(self.terms).get((), 0)
            if not rest:  # (k a n + c) // k = a n + c // k for whole a n
                return _poly(exact) + const // k
            rest[()] = const
            atom = ("//", _poly(rest), k)
            return _poly(exact) + _poly({(atom,): 1})
        if isinstance(other, Sym) and len(other.terms) == 1:  # an exact division by one term
            mono, coef = other.terms[0]
            out = {}
            for m, c in self.terms:
                left = list(m)
                for a in mono:
                    if a not in left:
                        return DYN
                    left.remove(a)
                if c % coef:
                    return DYN
                out[tuple(left)] = c // coef
            return _poly(out)
        return DYN if isinstance(other, Dynamic) else NotImplemented

    def __mod__(self, other):
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool) and other > 0:
            return self - (self // other) * other
        return DYN if isinstance(other, (Dynamic, int, np.integer)) else NotImplemented

    def __rfloordiv__(self, other):
        return DYN

    __rmod__ = __rfloordiv__


def _atom_key(a) -> str:
    return a if isinstance(a, str) else f"~({a[1].expr()}) // {a[2]}"


def _atom_text(a) -> str:
    return a if isinstance(a, str) else f"({a[1].expr()}) // {a[2]}"


def _poly(terms: dict):
    """A normalized expression: an int where no symbol is left."""
    kept = tuple(sorted(((m, c) for m, c in terms.items() if c), key=lambda t: (not t[0], [_atom_key(a) for a in t[0]])))
    if not kept:
        return 0
    if len(kept) == 1 and kept[0][0] == ():
        return kept[0][1]
    return Sym(kept)


def evaluate_dim(d, sizes: dict[str, int]) -> int:
    """A dimension's size at these values of the symbols (a KeyError for a `?` with no name)."""
    if isinstance(d, Sym):
        return d.evaluate(sizes)
    if isinstance(d, Dynamic):
        raise KeyError("?")
    return int(d)


Dim = int | Dynamic  # a dimension: a size, `?`, or an expression of named sizes (Sym)


class Bound(int):
    """A size at one call that remembers which expression of named sizes it is (`sym`): the types of a
    function made static for one call of a symbolic one (codegen/symbolic.py). It is that int to every
    pass and planner; code generation alone reads `sym`, to write a kernel whose extents are the
    expression, one kernel for every size. Arithmetic on it gives plain ints (what it was derived from
    is not tracked), so a size a rule computes is the size at this call only."""

    sym: Sym

    def __new__(cls, value: int, sym: Sym) -> Bound:
        obj = int.__new__(cls, value)
        obj.sym = sym
        return obj

    def __reduce__(self):
        return (int, (int(self),))


def broadcast(d, out) -> bool:
    """Whether an operand's dimension of size `d` is broadcast along a result's dimension of size `out`
    (None: not known): it is 1, and not by construction the result's own size (a batch that is 1 at
    this call, in a kernel written for every batch)."""
    return d == 1 and not (isinstance(d, Bound) and isinstance(out, Bound) and d.sym == out.sym)


class SizeChoices:
    """The graph passes' choices that depend on a named size (codegen/symbolic.py): the sizes they are
    made at (`sizes`; a name not given counts as 1) and each choice as a guard `(expression, bound,
    outcome)`, as torch.compile guards a graph: a size where some guard goes the other way gets a graph
    of its own. Both graphs compute every size right; the guards only keep each size on the graph made
    for it (Winograd for a late 4x4 map at a batch of 16, direct at a batch of 1)."""

    def __init__(self, sizes: dict[str, int] | None = None):
        self.sizes = dict(sizes or {})
        self.guards: list[tuple[Sym, int, bool]] = []

    def holds(self, sizes: dict[str, int]) -> bool:
        return all((expr.evaluate(sizes) >= bound) == outcome for expr, bound, outcome in self.guards)


_SIZE_CHOICES: contextvars.ContextVar = contextvars.ContextVar("size_choices", default=None)


@contextlib.contextmanager
def choosing(choices: SizeChoices):
    """Run graph passes with their size-dependent choices made at `choices.sizes` and recorded there."""
    token = _SIZE_CHOICES.set(choices)
    try:
        yield choices
    finally:
        _SIZE_CHOICES.reset(token)


def at_least(size, bound: int) -> bool:
    """Whether a size is at least `bound`, for a choice made by it. An expression of names is taken at the
    sizes of `choosing` (a name not given there as 1) and the choice recorded as a guard; outside
    `choosing`, or for a `?` with no name, it cannot be decided: TypeError, as for any order of `?`."""
    if not isinstance(size, Dynamic):
        return int(size) >= bound
    choices = _SIZE_CHOICES.get()
    if not isinstance(size, Sym) or choices is None:
        raise TypeError(f"whether a size known only at run time is at least {bound} is not known here")
    outcome = size.evaluate({s: choices.sizes.get(s, 1) for s in size.symbols()}) >= bound
    choices.guards.append((size, bound, outcome))
    return outcome


def size_max(a, b):
    """max(a, b) of sizes where one is an expression of names (an attribute computed from them): chosen at
    the sizes of `choosing`, the choice a guard (at_least), as a pass chooses."""
    return a if at_least(a - b, 0) else b


def size_min(a, b):
    return b if at_least(a - b, 0) else a


def size_div(a, b):
    """a / b of integer sizes (truncating, as graph.div does), for a positive number b."""
    if not isinstance(b, int) or b <= 0 or not at_least(a, 0):
        raise TypeError(f"{a} / {b}: a size divided by other than a positive number")
    return a // b


# While a kernel is lowered with symbolic extents: Bound -> the extent as a TVM expression (codegen/symbolic.py).
_KERNEL_SIZES: contextvars.ContextVar = contextvars.ContextVar("kernel_sizes", default=None)


def kernel_shape(shape: tuple) -> tuple:
    """A type's shape as the kernel being lowered takes it: each Bound size as its expression of the
    kernel's size variables where the kernel is lowered symbolically, else the shape as it is. An op's
    `lower` reads shapes from types through this; one that reads the numbers themselves still lowers
    right, into a kernel for this size alone."""
    convert = _KERNEL_SIZES.get()
    return tuple(shape) if convert is None else tuple(convert(d) for d in shape)


def bind_sizes(args: list[tuple[str, tuple, Location | None]], shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """The named sizes that a call's argument shapes give, from (name, declared shape, location) of each
    argument; a GCError naming both arguments and dimensions where one name takes two sizes, or where a
    dimension declared as an expression of names (an outlined function's `128 * batch`) does not hold."""
    sizes: dict[str, int] = {}
    first: dict[str, tuple[str, int]] = {}
    for (name, declared, loc), shape in zip(args, shapes):
        for i, (d, n) in enumerate(zip(declared, shape)):
            if isinstance(d, Sym) and d.name is not None and not isinstance(n, Dynamic):  # (a name binds none)
                if d.name in sizes and sizes[d.name] != n:
                    other, j = first[d.name]
                    raise GCError(f"%{name} has size {n} in dimension {i}, which is ?({d.name}); but %{other} gives "
                                  f"{d.name} = {sizes[d.name]} (its dimension {j}) at this call", loc)
                sizes.setdefault(d.name, int(n))
                first.setdefault(d.name, (name, i))
    for (name, declared, loc), shape in zip(args, shapes):
        i = unheld(declared, shape, sizes)
        if i is not None:
            d = declared[i]
            raise GCError(f"%{name} has size {shape[i]} in dimension {i}, which is {d.expr()} = {d.evaluate(sizes)} "
                          "at this call", loc)
    return sizes


def unheld(declared: tuple, actual: tuple, sizes: dict[str, int]) -> int | None:
    """The first dimension whose declared expression of named sizes, all of them in `sizes`, is not the
    actual size (a type written `?(batch)` holds only at the batch the arguments bind), or None."""
    return next((i for i, (d, a) in enumerate(zip(declared, actual)) if isinstance(d, Sym) and not isinstance(a, Dynamic)
                 and d.symbols() <= sizes.keys() and d.evaluate(sizes) != a), None)


def dim_text(d) -> str:
    """A dimension for a message: its size, `?`, or its expression of named sizes (`128 * batch`)."""
    return d.expr() if isinstance(d, Dynamic) else str(d)


# What a `?` size counts as where a pass only weighs sizes against each other (remat's plan, mixed
# precision's majority of inputs): a batch or sequence of 128 scales every tensor it is in alike.
NOMINAL = 128


def nominal(t: TensorType) -> TensorType:
    """`t` with each `?` as NOMINAL (t itself when static)."""
    return t if t.is_static else t.with_shape(d if known(d) else NOMINAL for d in t.shape)


def known(d) -> bool:
    """Whether the dimension `d` is a size (not `?`)."""
    return not isinstance(d, Dynamic)


def differ(a, b) -> bool:
    """Whether two dimensions are known to differ: sizes that differ, or expressions of named sizes whose
    difference is a number other than 0 (`n + 1` and `n`); false where either is `?`."""
    if known(a) and known(b):
        return a != b
    if a is DYN or b is DYN:
        return False
    d = a - b
    return known(d) and d != 0


def agree(a, b) -> bool:
    """Whether two dimensions are known to be equal: the same size, or the same expression of named sizes
    (false where either is `?`)."""
    if known(a) and known(b):
        return a == b
    return a is not DYN and b is not DYN and a == b


def shapes_differ(a: tuple, b: tuple) -> bool:
    """Whether two shapes are known to differ: in rank, or in a size both know."""
    return len(a) != len(b) or any(differ(x, y) for x, y in zip(a, b))


def more_elements(a: tuple, b: tuple) -> bool:
    """Whether shape `a` is known to hold more elements than `b`; with `?` sizes, whether `a` is `b`
    broadcast (more dims, or a size where `b` has 1)."""
    if static(a) and static(b):
        return math.prod(a) > math.prod(b)
    return len(a) > len(b) or any(d == 1 and not e == 1 for d, e in zip(b[::-1], a[::-1]))


def begins(short, long) -> bool:
    """Whether the values `short` are the first of `long`, and fewer."""
    return len(short) < len(long) and all(x is y for x, y in zip(short, long))


def prefix_chains(ops: list) -> dict:
    """Chains of ops each of whose operands begin the next one's (a DenseNet block's concats: [x0, y1],
    [x0, y1, y2], ...): root -> the shorter ops whose operands begin the root's, for every op of `ops`
    whose operands no other's begin with; a root is left out where one of its members also begins another
    root's operands (two chains sharing a prefix: no one buffer holds both). Fuse's concat chains and the
    memory stage's are these."""
    longer = {a: [b for b in ops if begins(a.operands, b.operands)] for a in ops}
    out = {}
    for root in ops:
        if longer[root]:
            continue
        members = [c for c in ops if begins(c.operands, root.operands)]
        if not any(d is not root and d not in members for c in members for d in longer[c]):
            out[root] = members
    return out


def stand_in(t: TensorType) -> np.ndarray:
    """An array of `t`'s shape and dtype whose values nothing reads (zero-strided: no memory), for an op
    that reads only its operands' sizes (`Op.reads_sizes_only`)."""
    return np.broadcast_to(np.zeros((), t.dtype.np), t.shape)


def static(shape) -> bool:
    """Whether every dimension of `shape` is a size."""
    return all(known(d) for d in shape)


def fits(declared: tuple, actual: tuple) -> bool:
    """Whether a shape `actual` may stand where `declared` is written: same rank, each size equal where
    `declared` gives one (a `?` there takes any size)."""
    return len(declared) == len(actual) and all(
        d is DYN or (not differ(d, a) if isinstance(d, Sym) else d == a) for d, a in zip(declared, actual))


@dataclass(frozen=True)
class TensorType:
    """`tensor<2x3xf32>`; a scalar is `tensor<f32>` (shape ()); `tensor<?x3xf32>` has a size known only at
    run time (`DYN`)."""

    shape: tuple[Dim, ...]
    dtype: DType

    def __str__(self) -> str:
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + str(self.dtype) + ">"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return static(self.shape)

    @property
    def size(self) -> int:
        if not self.is_static:
            raise TypeError(f"{self} has a size known only at run time")
        return math.prod(self.shape)  # (np.prod took 15 us a call: the memory planner asks 27,000 times)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def fits(self, other: TensorType) -> bool:
        """Whether a value of type `other` may stand where this type is written (see `fits`)."""
        return self.dtype == other.dtype and fits(self.shape, other.shape)

    def with_shape(self, shape) -> TensorType:
        return TensorType(tuple(d if isinstance(d, Dynamic) else int(d) for d in shape), self.dtype)

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(self.shape, dtype)


# --- attributes -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Dense:
    """A constant tensor: `dense<[1.0, 2.0]> : tensor<2xf32>` or the splat `dense<0.5> : tensor<4xf32>`."""

    array: np.ndarray
    type: TensorType

    @staticmethod
    def of(array, dtype: DType | None = None) -> Dense:
        arr = np.asarray(array)
        dtype = dtype or DType.from_numpy(arr.dtype)
        arr = np.array(arr, dtype=dtype.np, order="C", copy=True)
        arr.setflags(write=False)
        return Dense(arr, TensorType(tuple(arr.shape), dtype))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dense) or self.type != other.type:
            return False
        return bool(np.array_equal(self.array, other.array, equal_nan=self.type.dtype.is_float))

    def __hash__(self) -> int:
        return hash((self.type, self.array.tobytes()))


@dataclass(frozen=True)
class SymbolRef:
    """A reference to a function: `@name`."""

    name: str

    def __str__(self) -> str:
        return "@" + self.name


@dataclass(frozen=True)
class ArgValue:
    """An attribute taken at run time from an argument of the function or an earlier op's result (computed
    from sizes, constants and arguments): `{axes = %axes}`. The function is specialized to each distinct
    value it is called with (compiler/specialize.py), as to each distinct size of its `?` dimensions; before
    that the op's result types are the ones written (see docs/ir.md)."""

    name: str

    def __str__(self) -> str:
        return "%" + self.name


REQUIRED = object()


class AttrSpec:
    """What an attribute accepts: int, float, bool, str, DType, Dense, SymbolRef or a list of ints/floats."""

    def __init__(self, kind, *, default=REQUIRED, choices: tuple[str, ...] | None = None, doc: str = ""):
        self.kind = kind
        self.default = default
        self.choices = choices
        self.doc = doc
        self.name = ""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, op, owner=None):
        if op is None:
            return self
        return op.attrs.get(self.name, None if self.default is REQUIRED else self.default)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def describe(self) -> str:
        return {
            int: "an integer",
            float: "a float",
            bool: "a bool",
            str: "a string",
            DType: "a dtype",
            Dense: "a dense tensor",
            SymbolRef: "a symbol (@name)",
            "ints": "a list of integers",
            "floats": "a list of floats",
        }[self.kind]

    def coerce(self, value: Any) -> Any:
        """The canonical form of `value`, or TypeError with a message a user can act on."""
        k = self.kind
        if isinstance(value, ArgValue) and k in RUNTIME_KINDS:
            return value  # its value is coerced when the function is specialized to a call
        if k is int and isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        if k is int and isinstance(value, Sym):  # a size taken from named sizes (specialize, symbolize)
            return value
        if k is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if k is bool and isinstance(value, bool):
            return value
        if k is str and isinstance(value, str):
            if self.choices and value not in self.choices:
                opts = ", ".join(f'"{c}"' for c in self.choices)
                raise TypeError(f'attribute \'{self.name}\' must be one of {opts}, got "{value}"')
            return value
        if k in (DType, Dense, SymbolRef) and isinstance(value, k):
            return value
        if k in ("ints", "floats") and isinstance(value, (list, tuple)):
            elem = AttrSpec(int if k == "ints" else float)
            try:
                return tuple(elem.coerce(v) for v in value)
            except TypeError:
                pass
        raise TypeError(f"attribute '{self.name}' must be {self.describe()}, got {format_attr(value)}")


# The attribute kinds an argument's value may give at run time (numbers and lists of numbers).
RUNTIME_KINDS = (int, float, bool, "ints", "floats")


def attribute(kind, default=REQUIRED, *, choices=None, doc: str = "") -> Any:
    """Declare an attribute on an op class; `list[int]` is written `"ints"`."""
    return AttrSpec(kind, default=default, choices=choices, doc=doc)


class OperandSpec:
    def __init__(self, *, optional: bool = False, variadic: bool = False, doc: str = ""):
        self.optional = optional
        self.variadic = variadic
        self.doc = doc
        self.name = ""
        self.index = 0

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, op, owner=None):
        if op is None:
            return self
        return op.operand_groups()[self.index]


def operand(*, optional: bool = False, variadic: bool = False, doc: str = "") -> Any:
    """Declare an operand: one value, an optional trailing one, or any number (`variadic`)."""
    return OperandSpec(optional=optional, variadic=variadic, doc=doc)


def format_attr(v: Any) -> str:
    """An attribute value as GIR text."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return '"' + "".join(_ESCAPES.get(c, c) for c in v) + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, (DType, SymbolRef, ArgValue)):
        return str(v)
    if isinstance(v, Dense):
        return format_dense(v)
    raise TypeError(f"not an attribute value: {v!r}")


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}


def format_float(v: float, dtype: DType = DType.f64) -> str:
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    s = repr(float(v)) if dtype is DType.f64 else str(dtype.np.type(v))
    return s if any(c in s for c in ".e") else s + ".0"


def format_dense(d: Dense) -> str:
    arr, dt = d.array, d.type.dtype
    if dt.is_bool:
        elem = lambda x: "true" if x else "false"  # noqa: E731
    elif dt.is_float:
        elem = lambda x: format_float(x, dt)  # noqa: E731
    else:
        elem = lambda x: str(int(x))  # noqa: E731
    flat = arr.reshape(-1)
    if flat.size == 0:
        return f"dense<{elem(np.zeros((), dt.np)[()])}> : {d.type}"
    # A splat only where every element prints the same: -0.0 next to 0.0 compare equal but are not.
    same = (flat == flat[0]) & (np.signbit(flat) == np.signbit(flat[0])) if dt.is_float else flat == flat[0]
    if flat.size > 0 and same.all() or (flat.size > 1 and dt.is_float and np.isnan(flat).all()):
        body = elem(flat[0])
    else:
        body = _nested(arr, elem)
    return f"dense<{body}> : {d.type}"


def _nested(arr: np.ndarray, elem) -> str:
    if arr.ndim == 0:
        return elem(arr[()])
    if arr.ndim == 1:
        return "[" + ", ".join(elem(x) for x in arr.tolist()) + "]"
    return "[" + ", ".join(_nested(a, elem) for a in arr) + "]"


# --- values and ops ---------------------------------------------------------------------------


class Value:
    """An SSA value: a function argument or an op's result."""

    __slots__ = ("type", "name", "owner", "index", "loc")

    def __init__(self, type: TensorType | None, name: str | None = None, owner: Op | None = None, index: int = 0):
        self.type = type
        self.name = name
        self.owner = owner
        self.index = index
        self.loc: Location | None = None

    def __repr__(self) -> str:
        return f"%{self.name or '?'}: {self.type}"


OP_REGISTRY: dict[str, type[Op]] = {}


class Op:
    """Base of every op. Subclasses: `class Relu(Op, name="graph.relu")` with operand/attribute specs."""

    name: ClassVar[str] = ""
    operand_specs: ClassVar[tuple[OperandSpec, ...]] = ()
    attr_specs: ClassVar[dict[str, AttrSpec]] = {}
    # How fusion treats the op, TVM's classification: elementwise, broadcast, injective, reduction,
    # out-elementwise-fusable (matmul, conv2d) or opaque.
    kind: ClassVar[str] = "opaque"
    # False for ops that read or write memory (the mem/exec dialects): dce and cse leave them alone.
    pure: ClassVar[bool] = True
    # -- what passes ask the op (a pass never keeps a list of op names) --
    # mixed-precision: "low" computes in f16/bf16 (matmul, conv2d); "follow" runs in its operands'
    # precision (cheap elementwise ops and data movement); "f32" always sees f32 operands (sensitive
    # ops, and every op not classified: a new op is safe until someone says otherwise).
    precision: ClassVar[str] = "f32"
    # Pure data movement of its one operand, never smaller than it: converting the operand is as cheap.
    movement: ClassVar[bool] = False
    # op(a, b) == op(b, a): cse merges the two.
    commutative: ClassVar[bool] = False
    # Operands that are a layer's weights (pruning, the weights `gc prune` must be given).
    weight_operands: ClassVar[tuple[int, ...]] = ()
    # Parameters that start at one (a norm's scale, a variance), where other vectors start at zero.
    unit_operands: ClassVar[tuple[int, ...]] = ()
    # A transpose of an operand's last two axes is fused in and read in place (matmul(x, transpose(w))).
    reads_transposed_operands: ClassVar[bool] = False
    # The result depends on the operands' sizes, not their values (graph.shape, graph.numel): it folds to a
    # constant once they are known, and a value computed from it for an attribute needs no operand's value.
    reads_sizes_only: ClassVar[bool] = False

    def fan_in(self, index: int, shape: tuple[int, ...]) -> int | None:
        """Inputs summed into each output per element of the weight at operand `index` of this shape (random
        inputs and initial weights are scaled by it), or None where the operand is no such weight."""
        return None

    def fold(self) -> Value | None:
        """An existing value the result equals, exactly (x + -0.0 -> x, a reshape to x's own shape -> x): the
        canonicalize pass forwards it, building nothing. Of the result's type always (no shape or dtype
        changes); None where there is none."""
        return None

    def called(self) -> SymbolRef | None:
        """The function this op runs (graph.call's callee, exec.launch's kernel), else None."""
        return None

    def operand_offsets(self) -> list[int] | None:
        """Where each operand lies in the result, in bytes from its start, when the result is the operands
        laid end to end in row-major order (a concat along an axis with only 1s before it); else None.
        The memory planner then has each operand's producer write it there, and the op copies nothing."""
        return None

    def per_result(self, b: Any) -> list[Value] | None:
        """For an op of several results: one single-result op per result, built with Builder `b`, that
        computes it apart as cheaply (a split's sections as slices). `fuse` takes them, so that each result
        can join its reader's kernel (a kernel has one result). None: the op stays whole."""
        return None

    def padded_operand(self, index: int) -> tuple[int, ...] | None:
        """The zero padding (top, left, bottom, right) the op adds around operand `index` before reading it,
        if it may read it from a zero-bordered buffer in place instead (conv2d's input); else None."""
        return None

    def __init_subclass__(cls, name: str | None = None, **kw):
        super().__init_subclass__(**kw)
        specs: list[OperandSpec] = []
        attrs: dict[str, AttrSpec] = {}
        for klass in reversed(cls.__mro__):
            for key, v in vars(klass).items():
                if isinstance(v, OperandSpec) and v not in specs:
                    specs.append(v)
                elif isinstance(v, AttrSpec):
                    attrs[key] = v
        for i, s in enumerate(specs):
            s.index = i
        cls.operand_specs = tuple(specs)
        cls.attr_specs = attrs
        if name is not None:
            cls.name = name
            OP_REGISTRY[name] = cls

    def __init__(
        self,
        operands: list[Value],
        attrs: dict[str, Any] | None = None,
        result_types: list[TensorType | None] | None = None,
        loc: Location | None = None,
    ):
        self.loc = loc
        self.operands: list[Value] = list(operands)
        self.attrs = self.check_attrs(attrs or {}, loc)
        self.check_operand_count(len(self.operands), loc)
        types = list(result_types) if result_types is not None else None
        runtime = self.runtime_attrs()
        if types is None or (runtime and None in types):
            if runtime:
                raise GCError(f"{self.name}: the result types must be written where an attribute is taken at run "
                              f"time ({self._runtime_list()})", loc)
            inferred = self.infer_types()
            types = list(inferred)
        self.results = [Value(t, None, self, i) for i, t in enumerate(types)]

    # -- declaration-driven checks --

    @classmethod
    def check_operand_count(cls, n: int, loc: Location | None) -> None:
        specs = cls.operand_specs
        fixed = sum(1 for s in specs if not s.optional and not s.variadic)
        if any(s.variadic for s in specs):
            if n < max(fixed, 1):
                raise GCError(f"{cls.name}: expected at least {max(fixed, 1)} operands, got {n}", loc)
            return
        optional = sum(1 for s in specs if s.optional)
        if not fixed <= n <= fixed + optional:
            want = str(fixed) if not optional else f"{fixed} or {fixed + optional}"
            raise GCError(f"{cls.name}: expected {want} operand{'s' if want != '1' else ''}, got {n}", loc)

    @classmethod
    def check_attrs(cls, attrs: dict[str, Any], loc: Location | None, locs: dict[str, Location] | None = None):
        """Coerce the given attributes, fill defaults; unknown, missing or ill-typed ones are errors."""
        locs = locs or {}
        out: dict[str, Any] = {}
        for key, value in attrs.items():
            spec = cls.attr_specs.get(key)
            if spec is None:
                known = ", ".join(cls.attr_specs) or "none"
                near = _near_attribute(key, list(cls.attr_specs))
                hint = f"; did you mean '{near}'?" if near else ""
                raise GCError(f"{cls.name}: unknown attribute '{key}'{hint} (known: {known})", locs.get(key, loc))
            try:
                out[key] = spec.coerce(value)
            except TypeError as e:
                raise GCError(f"{cls.name}: {e}", locs.get(key, loc)) from None
        for key, spec in cls.attr_specs.items():
            if key in out:
                continue
            if spec.required:
                raise GCError(f"{cls.name}: missing required attribute '{key}' ({spec.describe()})", loc)
            if spec.default is not None:
                out[key] = spec.default
        return {k: out[k] for k in cls.attr_specs if k in out}

    def operand_groups(self) -> list:
        """Operands grouped by spec: a Value, None for an absent optional, a list for a variadic."""
        specs, vals = self.operand_specs, self.operands
        if any(s.variadic for s in specs):
            nfixed = len(specs) - 1
            vi = next(i for i, s in enumerate(specs) if s.variadic)
            nvar = len(vals) - nfixed
            return [*vals[:vi], list(vals[vi : vi + nvar]), *vals[vi + nvar :]]
        return [vals[i] if i < len(vals) else None for i in range(len(specs))]

    def _group(self, items: list) -> list:
        """Group a list parallel to `operands` (types, arrays) the way operand_groups does."""
        specs = self.operand_specs
        if any(s.variadic for s in specs):
            vi = next(i for i, s in enumerate(specs) if s.variadic)
            nvar = len(items) - (len(specs) - 1)
            return [*items[:vi], list(items[vi : vi + nvar]), *items[vi + nvar :]]
        return [items[i] if i < len(items) else None for i in range(len(specs))]

    # -- what each op defines --

    def infer(self, *types):
        """Result type(s) from operand types; raise self.error(...) on a mismatch."""
        raise NotImplementedError

    def reference(self, *arrays):
        """NumPy semantics: plainly right rather than fast."""
        raise NotImplementedError

    def grad(self, b, dys: list) -> list:
        """The vector-Jacobian product, emitted as graph ops with the Builder `b`: from the gradient of the
        loss with respect to each result (`dys`, None where a result does not reach the loss), the gradient
        with respect to each operand, one entry per operand (None: zero, or not differentiable)."""
        raise self.error("has no gradient rule: autodiff cannot differentiate through it")

    # -- helpers --

    def infer_types(self) -> tuple[TensorType, ...]:
        if self.runtime_attrs():
            raise self.error(f"its result types follow from {self._runtime_list()}, known at run time: "
                             "specialize the function to a call's values first")
        out = self.infer(*self._group([v.type for v in self.operands]))
        return (out,) if isinstance(out, TensorType) else tuple(out)

    def evaluate(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run `reference` and cast each result to its declared type."""
        # Low-precision floats are computed in f32 and rounded once, as compiled code does.
        arrays = [a.astype(np.float32) if a.dtype == np.float16 or is_bf16(a.dtype) else a for a in arrays]
        with np.errstate(all="ignore"):  # inf and nan are IEEE results, not user errors
            out = self.reference(*self._group(list(arrays)))
        outs = (out,) if not isinstance(out, (tuple, list)) else out
        res = []
        for r, v in zip(outs, self.results):
            a = np.asarray(r)
            # (Sizes computed from named ones stay their expressions: specialize.py, codegen/symbolic.py.)
            if a.dtype != v.type.dtype.np and not (a.dtype == object and any(isinstance(x, Sym) for x in a.flat)):
                a = a.astype(v.type.dtype.np)
            res.append(a.reshape(v.type.shape))
        return res

    def error(self, message: str) -> GCError:
        return GCError(f"{self.name}: {message}", self.loc)

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def runtime_attrs(self) -> dict[str, ArgValue]:
        """The attributes taken at run time from arguments (`{axes = %axes}`), by name."""
        return {k: v for k, v in self.attrs.items() if isinstance(v, ArgValue)}

    def attribute_values(self, by_name: dict[str, Value]) -> list[Value]:
        """The values its attributes taken at run time name, found in `by_name` (a function's, by name)."""
        return [by_name[r.name] for r in self.runtime_attrs().values() if r.name in by_name]

    def _runtime_list(self) -> str:
        return ", ".join(f"{k} = {v}" for k, v in self.runtime_attrs().items())

    def attr_key(self) -> tuple:
        """Hashable identity of the attributes (for CSE)."""
        return tuple((k, _hashable(v)) for k, v in sorted(self.attrs.items()))

    def __repr__(self) -> str:
        from compiler.printer import print_op

        return print_op(self)




def _hashable(v):
    if isinstance(v, float) and np.isnan(v):
        return ("nan",)
    return v


class Func:
    """`func @name(%args...) -> (types) { ops; return values }`"""

    def __init__(self, name: str, args: list[Value], result_types: list[TensorType], loc: Location | None = None):
        self.name = name
        self.args = args
        self.result_types = result_types
        self.ops: list[Op] = []
        self.results: list[Value] = []
        self.attrs: dict[str, Any] = {}
        self.loc = loc
        self.return_loc: Location | None = None

    def users(self) -> dict[Value, list[tuple[Op | None, int]]]:
        """Every use of every value: (op, operand index), or (None, i) for the i-th returned value."""
        uses: dict[Value, list] = {}
        for op in self.ops:
            for i, v in enumerate(op.operands):
                uses.setdefault(v, []).append((op, i))
        for i, v in enumerate(self.results):
            uses.setdefault(v, []).append((None, i))
        return uses

    def replace_all_uses(self, old: Value, new: Value) -> None:
        for op in self.ops:
            op.operands = [new if v is old else v for v in op.operands]
        self.results = [new if v is old else v for v in self.results]

    def values(self) -> Iterator[Value]:
        yield from self.args
        for op in self.ops:
            yield from op.results

    def clone(self) -> Func:
        """A copy with new values and ops (attributes, constants and locations are shared: they are immutable)."""
        vmap: dict[Value, Value] = {}
        args = []
        for a in self.args:
            v = vmap[a] = Value(a.type, a.name)
            v.loc = a.loc
            args.append(v)
        f = Func(self.name, args, list(self.result_types), self.loc)
        f.attrs = dict(self.attrs)
        f.return_loc = self.return_loc
        for op in self.ops:
            new = object.__new__(type(op))
            new.__dict__.update(op.__dict__)
            new.operands = [vmap.get(v, v) for v in op.operands]
            new.attrs = dict(op.attrs)
            new.results = [Value(r.type, r.name, new, r.index) for r in op.results]
            for r, n in zip(op.results, new.results):
                vmap[r] = n
            f.ops.append(new)
        f.results = [vmap.get(v, v) for v in self.results]
        return f


class Module:
    """An ordered collection of functions."""

    def __init__(self, funcs: list[Func] | None = None):
        self.funcs: dict[str, Func] = {}
        for f in funcs or []:
            self.add(f)

    def add(self, f: Func) -> Func:
        self.funcs[f.name] = f
        return f

    def __getitem__(self, name: str) -> Func:
        return self.funcs[name]

    def __contains__(self, name: str) -> bool:
        return name in self.funcs

    def __iter__(self) -> Iterator[Func]:
        return iter(list(self.funcs.values()))

    def __str__(self) -> str:
        from compiler.printer import print_module

        return print_module(self)

    def clone(self) -> Module:
        return Module([f.clone() for f in self])

    def fingerprint(self) -> tuple:
        """Cheap structural identity: equal fingerprints mean no pass changed anything."""
        out = []
        for f in self:
            ids = {v: i for i, v in enumerate(f.values())}
            ops = tuple(
                (op.name, tuple(ids.get(v, -1) for v in op.operands), op.attr_key(), tuple(r.type for r in op.results))
                for op in f.ops
            )
            out.append((f.name, tuple(a.type for a in f.args), ops, tuple(ids.get(v, -1) for v in f.results)))
        return tuple(out)


class Dialect:
    """A named, explicit list of ops (`GRAPH = Dialect("graph", [Transpose, MatMul, ...])`)."""

    def __init__(self, name: str, ops: list[type[Op]]):
        self.name = name
        self.ops = list(ops)
        for op in ops:
            assert op.name.startswith(name + "."), f"{op.name} is not in dialect {name}"
            assert OP_REGISTRY.get(op.name) is op, f"{op.name} is registered twice"


def lookup_op(name: str) -> type[Op] | None:
    import dialects  # noqa: F401  (registers every dialect's ops)

    return OP_REGISTRY.get(name)


def _near_attribute(key: str, known: list[str]) -> str | None:
    """The known attribute `key` most likely means: a close spelling, or one that begins like it (ONNX's
    `pads` for GIR's `padding`) or that its first word is (`kernel_shape` for `kernel`)."""
    import difflib

    close = difflib.get_close_matches(key, known, 1, cutoff=0.5)
    if close:
        return close[0]
    stem = key.split("_")[0]
    return next((k for k in known if k.startswith(stem[:3]) or stem.startswith(k)), None)
