"""mixed-precision{dtype=f16|bf16}: matmul and conv2d compute in a 16-bit float; sensitive ops stay f32.

The policy, like PyTorch AMP's lists, is each op's own `precision` (compiler/ir.py's Op; set where the op
is defined; docs/mixed_precision.md has the reasons and the measured errors):
- "low" (matmul, conv2d) always runs in the low dtype: its f32 operands are converted, its result is
  low. Every gc lowering (and the interpreter) multiplies 16-bit operands in f32, accumulates in f32 and
  rounds the result once, so only the operands and the result are rounded.
- "f32" (softmax, norms, reductions that sum, losses, exp/log/pow/erf/div, ..., and every op that says
  nothing: cast, call, ops of other dialects, ops added later) always runs in f32: a low operand is
  converted back (exactly: every f16/bf16 value is an f32 value). New ops are safe until they say
  otherwise.
- "follow" (cheap elementwise and data movement: add, relu, gelu, reshape, max_pool2d, ...) runs in the
  precision of its operands: low when some operand was computed low and the operands that were computed
  in f32 hold fewer elements than those computed low (a bias vector or a scalar next to an activation:
  the chain matmul -> add -> relu -> matmul stays low). A tie stays f32, so a residual add of an f32
  input and a low branch keeps the residual stream in f32.

Only f32 values are touched: f64, integer and existing f16/bf16 values pass through. Arguments and
results keep their types (a low result is converted back before `return`), so the signature stays.
Each value is converted at most once in each direction and the conversion is shared by all its users;
a constant is converted at compile time (a new constant, no cast op); a low copy of an f32 value made by
an op that is pure data movement (`movement`: transpose, reshape, ...) of another is made by converting
the source and repeating the data movement (exact), so `matmul(x, transpose(w))` still reads `w` through
the transpose that fusion folds into it. Run canonicalize afterwards: casts already in the input may now
form cancelling pairs.

Loss scaling for training is not done here; docs/mixed_precision.md has the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Dense, DType, Func, Module, Op, Value, lookup_op, nominal
from compiler.passes import Pass
from dialects.graph.creation import Constant
from dialects.graph.elementwise import Cast

LOW_DTYPES = {"f16": DType.f16, "bf16": DType.bf16}


@dataclass
class MixedPrecision(Pass):
    name = "mixed-precision"
    summary = "run matmul/conv2d (and the cheap ops between them) in f16 or bf16; sensitive ops stay f32"
    dtype: str = field(default="f16", metadata={"help": "the low-precision dtype: f16 or bf16"})
    keep_f32: tuple[str, ...] = field(default=(), metadata={"help": "ops that stay f32 (e.g. matmul,add)"})

    def __post_init__(self) -> None:
        if self.dtype not in LOW_DTYPES:
            raise GCError(f"pass 'mixed-precision': dtype must be f16 or bf16, got '{self.dtype}'")
        full = tuple(n if "." in n else f"graph.{n}" for n in self.keep_f32)  # keep-f32=matmul: the user's names
        unknown = [n for n in full if lookup_op(n) is None]
        if unknown:
            raise GCError(f"pass 'mixed-precision': keep-f32 names no op '{unknown[0]}'")
        self.keep_f32 = full

    def run(self, module: Module) -> None:
        for f in module:
            _Convert(f, LOW_DTYPES[self.dtype], frozenset(self.keep_f32), self).run()


def _is_f32(v: Value) -> bool:
    return v.type.dtype is DType.f32


class _Convert:
    """One function's conversion: ops in program order, each operand taken in the precision its op runs in."""

    def __init__(self, f: Func, low: DType, keep: frozenset[str], p: MixedPrecision):
        self.f, self.low, self.keep, self.stats = f, low, keep, p.stats
        # Per original f32 value: its version in the low dtype and in f32, each made at most once.
        self.lo: dict[Value, Value] = {}
        self.wide: dict[Value, Value] = {a: a for a in f.args if _is_f32(a)}
        self.computed_low: set[Value] = set()  # original values whose op now runs in the low dtype
        self.same: dict[Value, Value] = {}  # non-f32 results of rebuilt ops (the i1 of a compare)
        self.inputs: dict[Op, list[Value]] = {}  # original operands of the ops kept in f32
        self.maybe_dead: list[Op] = []  # constants and data movements whose users may all read low copies
        self.out: list[Op] = []

    def run(self) -> None:
        for op in self.f.ops:
            if self.runs_low(op):
                self.rebuild_low(op)
            else:
                self.keep_f32(op)
        self.f.results = [self.as_f32(v) if _is_f32(v) else self.same.get(v, v) for v in self.f.results]
        self.f.ops = self.out
        self.erase_unused()

    def runs_low(self, op: Op) -> bool:
        floats = [v for v in (*op.operands, *op.results) if v.type.dtype.is_float]
        if not floats or not all(_is_f32(v) for v in floats) or op.name in self.keep:
            return False
        if op.precision == "low":
            return True
        if op.precision != "follow":
            return False
        ins = {v: None for v in op.operands if _is_f32(v) and not isinstance(v.owner, Constant)}
        low = sum(nominal(v.type).size for v in ins if v in self.computed_low)
        wide = sum(nominal(v.type).size for v in ins if v not in self.computed_low)
        return low > 0 and wide < low

    def rebuild_low(self, op: Op) -> None:
        operands = [self.as_low(v) if _is_f32(v) else self.same.get(v, v) for v in op.operands]
        new = type(op)(operands, dict(op.attrs), None, op.loc)
        self.out.append(new)
        for r, n in zip(op.results, new.results):
            n.name = r.name
            if _is_f32(r):
                self.lo[r] = n
                self.computed_low.add(r)
            else:
                self.same[r] = n
        self.stats["ops-in-low"] += 1

    def keep_f32(self, op: Op) -> None:
        self.inputs[op] = list(op.operands)
        op.operands = [self.as_f32(v) if _is_f32(v) else self.same.get(v, v) for v in op.operands]
        self.wide.update((r, r) for r in op.results if _is_f32(r))
        self.out.append(op)

    def as_low(self, v: Value) -> Value:
        """v in the low dtype: a converted constant, a data movement of the converted source, or a cast."""
        if v in self.lo:
            return self.lo[v]
        owner, dt = v.owner, self.low
        src = self.inputs.get(owner, []) if owner is not None else []
        if isinstance(owner, Constant):
            new = Constant([], {"value": Dense.of(owner.value.array, dt)}, None, owner.loc)
            self.maybe_dead.append(owner)
            self.stats["constants-converted"] += 1
        elif owner is not None and owner.movement and owner.name not in self.keep and len(src) == 1 and _is_f32(src[0]):
            new = type(owner)([self.as_low(src[0])], dict(owner.attrs), None, owner.loc)
            self.maybe_dead.append(owner)
            self.stats["movement-hoisted"] += 1
        else:
            new = Cast([self.wide[v]], {"dtype": dt}, None, owner.loc if owner else v.loc)
            self.stats["casts-to-low"] += 1
        return self._made(new, v, self.lo, str(dt))

    def as_f32(self, v: Value) -> Value:
        """v in f32: as it is, or a cast of its low version (exact)."""
        if v in self.wide:
            return self.wide[v]
        new = Cast([self.lo[v]], {"dtype": DType.f32}, None, v.owner.loc if v.owner else v.loc)
        self.stats["casts-to-f32"] += 1
        return self._made(new, v, self.wide, "f32")

    def _made(self, new: Op, v: Value, table: dict[Value, Value], suffix: str) -> Value:
        self.out.append(new)
        new.result.name = f"{v.name}.{suffix}" if v.name else None
        table[v] = new.result
        return new.result

    def erase_unused(self) -> None:
        """Drop the f32 constants and data movements whose users all read their low copies now."""
        for op in reversed(self.maybe_dead):  # a movement's source comes earlier in the list
            used = {x for o in self.f.ops for x in o.operands} | set(self.f.results)
            if op in self.f.ops and not any(r in used for r in op.results):
                self.f.ops.remove(op)


def with_mixed_precision(pipeline: str, dtype: str = "f16") -> str:
    """`pipeline` with mixed-precision (and the canonicalize that cancels cast pairs) just before fuse, or at
    the end: after the folding of batch_norm into constant weights, which is exact only in f32."""
    elements, depth, start = [], 0, 0
    for i, c in enumerate(pipeline + ","):  # commas inside braces belong to an option: `fuse{kinds=a,b}`
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            elements.append(pipeline[start:i].strip())
            start = i + 1
    elements = [e for e in elements if e]
    at = next((i for i in reversed(range(len(elements))) if elements[i].split("{")[0] == "fuse"), len(elements))
    elements[at:at] = [f"mixed-precision{{dtype={dtype}}}", "canonicalize"]
    return ",".join(elements)
