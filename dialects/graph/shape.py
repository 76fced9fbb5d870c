"""Shape ops: reshape, transpose, concat, split, slice, broadcast_to, squeeze, unsqueeze, flatten, pad, gather.

They move data without arithmetic, so every one is "injective" for fusion and costs no flops. Each keeps
its operand's dtype. Where an op must resolve its attributes against the input shape (reshape's -1,
slice's clamping), one helper does it for both `infer` and `reference`, so the two cannot disagree.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import (
    DYN,
    Bound,
    DType,
    Op,
    Sym,
    TensorType,
    Value,
    agree,
    attribute,
    differ,
    dim_text,
    kernel_shape,
    known,
    operand,
    size_max,
    size_min,
    static,
)
from dialects.graph.common import (
    broadcast_shapes,
    dilate,
    normalize_axis,
    pad_or_crop,
    reshaped,
    same_dtype,
    same_type,
    size_value,
    unbroadcast,
    zeros,
)

if TYPE_CHECKING:
    from compiler.builder import Builder


def _dims(shape) -> str:
    return "[" + ", ".join(dim_text(d) for d in shape) + "]"


def _count(n) -> str:
    return dim_text(n)


def _axes(op: Op, axes: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """Normalized axes; out of range or repeated is the op's error."""
    # Checked here rather than by normalize_axis, which lets a scalar have an axis 0.
    bad = [a for a in axes if not -rank <= a < rank]
    if bad:
        raise op.error(f"axis {bad[0]} is out of range for rank {rank}")
    out = tuple(a % rank for a in axes)
    if len(set(out)) != len(out):
        raise op.error(f"axes {list(axes)} repeat an axis")
    return out


class ShapeOp(Op):
    """Base of the data-movement ops: injective for fusion, no arithmetic."""

    kind = "injective"

    def flops(self) -> int:
        return 0

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        """The result's shape, as the kernel being lowered takes it (ir.kernel_shape)."""
        return kernel_shape(self.results[i].type.shape)


class Regroup(ShapeOp):
    """Base of the ops that keep the elements in row-major order (reshape, squeeze, unsqueeze, flatten):
    the gradient is dy under the input's shape."""

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [reshaped(b, dys[0], self.operands[0].type.shape)]

    def operand_offsets(self) -> list[int] | None:
        """The result is the operand's bytes as they lie: the memory planner has the operand's producer
        write them where the result lies, and the launch copies nothing (GPT-2 ran 37 reshape copies)."""
        return [0] if len(self.operands) == 1 else None


# --- lowering helpers (TVM is imported inside lowerings only) ----------------------------------------


def _reshaped(x, op: Op, name: str):
    """The same elements in row-major order under a new shape: op's operand's shape -> its result's."""
    import tvm
    from tvm import te, tirx

    in_shape, out_shape = kernel_shape(op.operands[0].type.shape), op.out_shape()
    groups = _groups(op.operands[0].type.shape, op.result.type.shape) or [(range(len(in_shape)), range(len(out_shape)))]

    def body(*idx):
        src: list = [0] * len(in_shape)
        for ins, outs in groups:
            flat = 0
            for k in outs:
                flat = flat * out_shape[k] + idx[k]
            for k in reversed(ins):  # the run's input indices, innermost first
                if k == ins[0]:
                    src[k] = flat
                elif isinstance(in_shape[k], int) and in_shape[k] == 1:
                    src[k] = 0
                else:
                    src[k], flat = tirx.floormod(flat, in_shape[k]), tirx.floordiv(flat, in_shape[k])
        # Simplified under the indices' bounds, a reshape that splits or merges dims reads x[c, h, w], not
        # x[(c * 784 + h * 28 + w) // 784 % 116, ...]: the schedules can then see which loops a load
        # is contiguous in (a channel shuffle's plane copies were gathers: 76 -> 5.3 us, Zen 4).
        ana = tvm.sym.Analyzer()
        for i, d in zip(idx, out_shape):
            ana.bind(i, tvm.ir.Range(0, d))
        return x(*(ana.simplify(e) if not isinstance(e, int) else e for e in src))

    return te.compute(out_shape, body, name=name)


def _groups(a: tuple, b: tuple) -> list[tuple[range, range]] | None:
    """Consecutive runs of the dims of shapes `a` and `b` (of the same elements) whose sizes multiply to the
    same, each as small as can be: a reshape maps each run of `a` to the same run of `b`, so no index is
    divided by a size outside its run. (A size known at run time, an expression in a kernel for every size,
    is not simplified away by TVM as a number is: `(i * seq + j) // seq` stays; Bound sizes are compared by
    their expressions.) None where the runs cannot be told at these sizes."""
    def key(d):
        return d.sym if isinstance(d, Bound) else d

    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        i0, j0 = i, j
        pa, pb, ka, kb = int(a[i]), int(b[j]), key(a[i]), key(b[j])
        i, j = i + 1, j + 1
        while not (pa == pb and ka == kb):
            if pa == pb and (i == len(a) or j == len(b)):
                return None
            if (pa < pb or pa == pb) and i < len(a):
                pa, ka, i = pa * int(a[i]), ka * key(a[i]), i + 1
            elif j < len(b):
                pb, kb, j = pb * int(b[j]), kb * key(b[j]), j + 1
            else:
                return None
        out.append((range(i0, i), range(j0, j)))
    if not out:
        return None
    if i < len(a) or j < len(b):  # trailing sizes of 1
        if any(int(d) != 1 for d in (*a[i:], *b[j:])):
            return None
        ins, outs = out[-1]
        out[-1] = (range(ins.start, len(a)), range(outs.start, len(b)))
    return out


def _clamp_index(i, lo: int, hi: int):
    """i kept inside [lo, hi]: a select evaluates both sides, so every load must stay in bounds."""
    from tvm import tirx

    return tirx.max(tirx.min(i, hi), lo)


# --- reshape, transpose -----------------------------------------------------------------------------


class Reshape(Regroup, name="graph.reshape"):
    """Same elements, new shape:  %y = graph.reshape(%x) {shape = [2, -1]} : tensor<2x6xf32>"""
    precision = "follow"
    movement = True

    x = operand()
    shape = attribute("ints")

    def fold(self) -> Value | None:
        """reshape(x) to x's own shape -> x: row-major order is kept, so the elements do not move."""
        return same_type(self, self.x)

    def target(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The result shape: 0 copies the input's size at that position (ONNX allowzero=0), -1 is inferred."""
        want, rank = _dims(self.shape), len(in_shape)
        if list(self.shape).count(-1) > 1:
            raise self.error(f"shape {want} has more than one -1")
        out = []
        for i, d in enumerate(self.shape):
            if isinstance(d, Sym):  # a size taken from named ones (specialize.py): a size as it stands
                out.append(d)
                continue
            if d < -1:
                raise self.error(f"shape {want} has a negative size {d}")
            if d == 0 and i >= rank:
                raise self.error(f"shape {want}: 0 at position {i} copies an input size, but the input has rank {rank}")
            out.append(in_shape[i] if d == 0 else d)
        # A `?` that a 0 copies is a factor of both sides and cancels; any other `?` of the input leaves the
        # element count to run time (and -1 is then `?`). Named sizes count as numbers do: [B, 128, 256]
        # to [-1, 256] is [B * 128, 256].
        copied = {i for i, d in enumerate(self.shape) if d == 0 and in_shape[i] is DYN}
        if any(d is DYN and i not in copied for i, d in enumerate(in_shape)):
            return tuple(DYN if d == -1 else d for d in out)
        n = math.prod(d for i, d in enumerate(in_shape) if i not in copied)
        sizes = math.prod(d for i, d in enumerate(out) if not (isinstance(d, int) and d == -1) and i not in copied)
        if -1 not in out:
            if differ(sizes, n):
                raise self.error(f"cannot reshape {_dims(in_shape)} ({_count(n)} elements) to {want} "
                                 f"({_count(sizes)} elements)")
            return tuple(out)
        if agree(sizes, 0):
            raise self.error(f"shape {want}: -1 is ambiguous when the other sizes multiply to 0")
        if known(n) and known(sizes) and n % sizes:
            why = f"{n} is not divisible by {sizes}"
            raise self.error(f"cannot reshape {_dims(in_shape)} ({n} elements) to {want}: {why}")
        q = n // sizes
        out[out.index(-1)] = q if agree(q * sizes, n) else DYN
        return tuple(out)

    def infer(self, x: TensorType) -> TensorType:
        return x.with_shape(self.target(x.shape))

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.target(x.shape))

    def lower(self, x):
        return _reshaped(x, self, "reshape")


class Transpose(ShapeOp, name="graph.transpose"):
    """Permute the axes (reversed if perm is absent):  %y = graph.transpose(%x) {perm = [1, 0]} : tensor<3x2xf32>"""
    precision = "follow"
    movement = True

    x = operand()
    perm = attribute("ints", None)

    def fold(self) -> Value | None:
        """transpose(x) with the identity perm -> x. The perm is compared normalised (-1 is the last axis)."""
        rank = self.x.type.rank
        return same_type(self, self.x) if self.resolved(rank) == tuple(range(rank)) else None

    def resolved(self, rank: int) -> tuple[int, ...]:
        if self.perm is None:
            return tuple(reversed(range(rank)))
        if len(self.perm) != rank:
            raise self.error(f"perm {list(self.perm)} has {len(self.perm)} entries but the operand has rank {rank}")
        perm = tuple(normalize_axis(self, p, rank, "perm entry") for p in self.perm)
        if sorted(perm) != list(range(rank)):
            raise self.error(f"perm {list(self.perm)} is not a permutation of 0..{rank - 1}")
        return perm

    def infer(self, x: TensorType) -> TensorType:
        return x.with_shape(tuple(x.shape[p] for p in self.resolved(x.rank)))

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.transpose(x, self.resolved(x.ndim))

    def lower(self, x):
        from tvm import te

        # Output axis k is input axis perm[k], so input axis d is read with output index inverse[d].
        inverse = np.argsort(self.resolved(self.operands[0].type.rank)).tolist()
        return te.compute(self.out_shape(), lambda *i: x(*[i[p] for p in inverse]), name="transpose")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [b.transpose(dys[0], perm=np.argsort(self.resolved(self.operands[0].type.rank)).tolist())]


# --- concat, split ----------------------------------------------------------------------------------


class Concat(ShapeOp, name="graph.concat"):
    """Join along one axis:  %y = graph.concat(%a, %b) {axis = 0} : tensor<5x3xf32>"""
    precision = "follow"

    xs = operand(variadic=True)
    axis = attribute(int)

    def fold(self) -> Value | None:
        """concat(x) of one operand -> x."""
        return same_type(self, self.operands[0]) if len(self.operands) == 1 else None

    def operand_offsets(self) -> list[int] | None:
        """With only 1s before the axis (one image, channels joined), each operand is one contiguous run."""
        out = self.results[0].type
        if any(d != 1 for d in out.shape[: self.axis % out.rank]):
            return None
        offsets, at = [], 0
        for v in self.operands:
            offsets.append(at)
            at += v.type.nbytes
        return offsets

    def infer(self, xs: list[TensorType]) -> TensorType:
        dtype = same_dtype(self, *xs)
        first = xs[0]
        if first.rank == 0:
            raise self.error(f"cannot concatenate scalars ({first})")
        axis = normalize_axis(self, self.axis, first.rank)
        for i, t in enumerate(xs[1:], 1):
            if t.rank != first.rank:
                raise self.error(f"operand #{i} has rank {t.rank} but operand #0 has rank {first.rank}")
            for d in range(first.rank):
                if d != axis and differ(t.shape[d], first.shape[d]):
                    raise self.error(
                        f"operand #{i} has shape {_dims(t.shape)} but operand #0 has {_dims(first.shape)}: "
                        f"dimension {d} differs ({t.shape[d]} vs {first.shape[d]}); only axis {axis} may differ"
                    )
        shape = list(first.shape)
        shape[axis] = sum(t.shape[axis] for t in xs)
        return TensorType(tuple(shape), dtype)

    def reference(self, xs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(xs, axis=self.axis)

    def lower(self, xs: list):
        from tvm import te, tirx

        out = self.out_shape()
        axis = self.axis % len(out)
        # Empty operands contribute nothing (and have no element to read).
        parts, offset = [], 0
        for x, v in zip(xs, self.operands):
            n = v.type.shape[axis]
            if n:
                parts.append((x, offset, n))
            offset += n
        if not parts:  # every operand is empty, and so is the result
            return te.compute(out, lambda *i: tirx.const(0, self.results[0].type.dtype.tvm), name="concat")

        def body(*i):
            def pick(lo: int, hi: int):
                """The element from parts[lo:hi], by halving: log2(k) comparisons and one load. (A chain of
                selects loaded from every operand: DenseNet's concats of 24 ran at 2-3 GB/s.)"""
                if hi - lo == 1:
                    x, off, _ = parts[lo]
                    return x(*i[:axis], i[axis] - off, *i[axis + 1 :])
                mid = (lo + hi) // 2
                return tirx.if_then_else(i[axis] < parts[mid][1], pick(lo, mid), pick(mid, hi))

            return pick(0, len(parts))

        return te.compute(out, body, name="concat")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """Each operand's part of dy, cut out by one split."""
        if len(self.operands) == 1:
            return [dys[0]]
        sizes = [v.type.shape[self.axis % v.type.rank] for v in self.operands]
        return list(b.split(dys[0], axis=self.axis, sections=sizes))


class Split(ShapeOp, name="graph.split"):
    """Cut along one axis, one result per section:
    %a, %b = graph.split(%x) {axis = 0, sections = [2, 3]} : (tensor<2x4xf32>, tensor<3x4xf32>)"""
    precision = "follow"

    x = operand()
    axis = attribute(int, 0)
    sections = attribute("ints")

    def infer(self, x: TensorType) -> tuple[TensorType, ...]:
        if x.rank == 0:
            raise self.error(f"cannot split a scalar ({x})")
        axis = normalize_axis(self, self.axis, x.rank)
        if not self.sections:
            raise self.error("sections is empty: a split needs at least one section")
        if any(s < 0 for s in self.sections):
            raise self.error(f"sections {list(self.sections)} has a negative size")
        if differ(sum(self.sections), x.shape[axis]):
            raise self.error(
                f"sections {list(self.sections)} sum to {sum(self.sections)} but axis {axis} has size {x.shape[axis]}"
            )
        out = []
        for s in self.sections:
            shape = list(x.shape)
            shape[axis] = s
            out.append(x.with_shape(shape))
        return tuple(out)

    def reference(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        cuts = np.cumsum(self.sections)[:-1]
        return tuple(np.split(x, cuts, axis=self.axis))

    def per_result(self, b: Builder) -> list[Value] | None:
        """Each section a slice: read once either way, and each can fuse with its reader (GPT-2's q, k, v
        from one [1, 128, 2304] product went through a split kernel and three head transposes)."""
        axis, at, out = self.axis % self.x.type.rank, 0, []
        for size in self.sections:
            out.append(b.slice(self.x, starts=[at], ends=[at + size], axes=[axis]))
            at += size
        return out

    def lower(self, x) -> tuple:
        from tvm import te

        axis = self.axis % self.operands[0].type.rank

        def part(k: int, off: int):
            return te.compute(
                self.out_shape(k), lambda *i: x(*i[:axis], i[axis] + off, *i[axis + 1 :]), name=f"split{k}"
            )

        offsets = [0, *np.cumsum(self.sections)[:-1].tolist()]
        return tuple(part(k, int(off)) for k, off in enumerate(offsets))

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """The results' gradients side by side again (zeros for results that do not reach the loss)."""
        parts = [dy if dy is not None else zeros(b, r.type) for dy, r in zip(dys, self.results)]
        return [parts[0] if len(parts) == 1 else b.concat(*parts, axis=self.axis)]


# --- slice ------------------------------------------------------------------------------------------


def _clamp(v: int, lo: int, hi: int) -> int:
    # The upper bound wins, so an empty axis with a negative step gives the empty range(-1, -1, -1).
    return min(max(v, lo), hi)


class Slice(ShapeOp, name="graph.slice"):
    """ONNX Slice:  %y = graph.slice(%x) {starts = [1], ends = [-1], axes = [1], steps = [2]} : tensor<4x3xf32>"""
    precision = "follow"

    # Each element read from one place of its input: a conv or matmul may write only the slice, in its
    # epilogue (pad-channels' padded convs), instead of the whole result and then a copy of part of it.
    fuses_as_epilogue = True

    x = operand()
    starts = attribute("ints")
    ends = attribute("ints")
    axes = attribute("ints", None)
    steps = attribute("ints", None)

    def fold(self) -> Value | None:
        """slice(x) keeping every element in order -> x: every step 1 and the result has x's shape (with step 1,
        a kept length equal to the axis size means the range starts at 0). A reversing step -1 stays."""
        if self.steps is not None and any(s != 1 for s in self.steps):
            return None
        return same_type(self, self.x)

    def plan(self, shape: tuple[int, ...]) -> dict[int, range]:
        """The indices kept on each sliced axis, clamped exactly as ONNX Slice clamps them."""
        n = len(self.starts)
        axes = self.axes if self.axes is not None else tuple(range(n))
        steps = self.steps if self.steps is not None else (1,) * n
        for what, vals in (("ends", self.ends), ("axes", axes), ("steps", steps)):
            if len(vals) != n:
                raise self.error(f"starts has {n} entries but {what} has {len(vals)}")
        axes = _axes(self, axes, len(shape))
        out = {}
        for a, start, end, step in zip(axes, self.starts, self.ends, steps):
            if step == 0:
                raise self.error(f"step for axis {a} is 0")
            d = shape[a]
            named = isinstance(d, Sym) or isinstance(start, Sym) or isinstance(end, Sym)
            if named and step > 0 and all(isinstance(x, (int, Sym)) for x in (start, end, d)):
                try:  # (named sizes: the length as their expression, where the sizes' choices are made)
                    out[a] = _sym_span(start, end, step, d)
                    continue
                except TypeError:
                    pass
            if not known(d) or named:  # its length is known at run time (None here; infer says ?)
                out[a] = None
                continue
            start = start + d if start < 0 else start
            end = end + d if end < 0 else end
            if step > 0:
                out[a] = range(_clamp(start, 0, d), _clamp(end, 0, d), step)
            else:
                out[a] = range(_clamp(start, 0, d - 1), _clamp(end, -1, d - 1), step)
        return out

    def infer(self, x: TensorType) -> TensorType:
        plan = self.plan(x.shape)
        def length(r):  # a range, the length of one on a named axis (_sym_span), or None: not known
            return DYN if r is None else len(r) if isinstance(r, range) else r

        return x.with_shape(tuple(length(plan[a]) if a in plan else d for a, d in enumerate(x.shape)))

    def reference(self, x: np.ndarray) -> np.ndarray:
        for a, r in self.plan(x.shape).items():
            x = np.take(x, np.array(r, dtype=np.int64), axis=a)
        return x

    def lower(self, x):
        from tvm import te

        plan = self.plan(self.operands[0].type.shape)

        def body(*i):
            return x(*[plan[a].start + plan[a].step * v if a in plan else v for a, v in enumerate(i)])

        return te.compute(self.out_shape(), body, name="slice")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """dy scattered back to the positions it was read from, zeros elsewhere: reversed along axes read
        backwards, spread apart by the step, then padded into place."""
        x, dy = self.operands[0].type, dys[0]
        plan = {a: r for a, r in self.plan(x.shape).items() if len(r) != x.shape[a] or r.step != 1}
        if any(len(r) == 0 for r in plan.values()):
            return [zeros(b, x)]
        backwards = [a for a, r in plan.items() if r.step < 0]
        if backwards:
            n = len(backwards)
            ends = [-dy.type.shape[a] - 1 for a in backwards]
            dy = b.slice(dy, starts=[-1] * n, ends=ends, axes=backwards, steps=[-1] * n)
        dy = dilate(b, dy, {a: abs(r.step) for a, r in plan.items()})
        pads = [0] * (2 * x.rank)
        for a, r in plan.items():
            first = min(r[0], r[-1])
            pads[a], pads[x.rank + a] = first, x.shape[a] - first - dy.type.shape[a]
        return [pad_or_crop(b, dy, pads)]


def _sym_span(start, end, step: int, d):
    """The length of ONNX Slice's [start, end) by `step` > 0 where the axis's size d or a bound is an
    expression of named sizes (BERT's positions [0, seq) of 512), as an expression:
    bounds clamped as `plan` clamps them, each comparison with d a choice at the sizes the function is
    made for (ir.size_min: a guard, codegen/symbolic.py); an int where the length is a number."""
    def at(x):
        x = x + d if isinstance(x, int) and x < 0 else x
        return size_min(size_max(x, 0), d)

    n = size_max(at(end) - at(start), 0)
    return n if step == 1 else (n + step - 1) // step


# --- broadcast_to, squeeze, unsqueeze, flatten ------------------------------------------------------


class BroadcastTo(ShapeOp, name="graph.broadcast_to"):
    """Broadcast to a shape, as ONNX Expand:  %y = graph.broadcast_to(%x) {shape = [4, 3]} : tensor<4x3xf32>"""
    precision = "follow"
    movement = True

    x = operand()
    shape = attribute("ints")

    def fold(self) -> Value | None:
        """broadcast_to(x) whose result has x's shape -> x: nothing is repeated."""
        return same_type(self, self.x)

    def infer(self, x: TensorType) -> TensorType:
        if any(known(d) and d < 0 for d in self.shape):
            raise self.error(f"shape {_dims(self.shape)} has a negative size")
        return x.with_shape(broadcast_shapes(self, x.shape, self.shape))

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.broadcast_to(x, np.broadcast_shapes(x.shape, self.shape)).copy()

    def lower(self, x):
        from tvm import te

        shape = self.operands[0].type.shape

        def body(*i):
            tail = i[len(i) - len(shape) :] if shape else ()
            return x(*[0 if d == 1 else v for d, v in zip(shape, tail)])

        return te.compute(self.out_shape(), body, name="broadcast_to")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [unbroadcast(b, dys[0], self.operands[0].type.shape)]


class Squeeze(Regroup, name="graph.squeeze"):
    """Drop size-1 axes (all of them if axes is absent):  %y = graph.squeeze(%x) {axes = [0]} : tensor<3xf32>"""
    precision = "follow"
    movement = True

    x = operand()
    axes = attribute("ints", None)

    def dropped(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.axes is None:
            if not static(shape):
                raise self.error(f"without axes, which axes of {_dims(shape)} are 1 is known only at run time: name them")
            return tuple(i for i, d in enumerate(shape) if d == 1)
        axes = _axes(self, self.axes, len(shape))
        for a in axes:
            if differ(shape[a], 1):  # a `?` named here must be 1 at run time
                raise self.error(f"cannot squeeze axis {a} of size {shape[a]} (shape {_dims(shape)})")
        return axes

    def infer(self, x: TensorType) -> TensorType:
        drop = self.dropped(x.shape)
        return x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in drop))

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.squeeze(x, axis=self.dropped(x.shape))

    def lower(self, x):
        return _reshaped(x, self, "squeeze")


class Unsqueeze(Regroup, name="graph.unsqueeze"):
    """Insert size-1 axes at output positions:  %y = graph.unsqueeze(%x) {axes = [0]} : tensor<1x3xf32>"""
    precision = "follow"
    movement = True

    x = operand()
    axes = attribute("ints")

    def lower(self, x):
        return _reshaped(x, self, "unsqueeze")

    def infer(self, x: TensorType) -> TensorType:
        # Axes index the result (ONNX), so they are normalized against the output rank.
        rank = x.rank + len(self.axes)
        new = set(_axes(self, self.axes, rank))
        rest = iter(x.shape)
        return x.with_shape(tuple(1 if i in new else next(rest) for i in range(rank)))

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.results[0].type.shape)


class Flatten(Regroup, name="graph.flatten"):
    """To 2-D, splitting the axes at `axis`:  %y = graph.flatten(%x) {axis = 1} : tensor<2x12xf32>"""
    precision = "follow"
    movement = True

    x = operand()
    axis = attribute(int, 1)

    def fold(self) -> Value | None:
        """flatten(x) of a 2-D x whose result has x's shape (axis 1, or a leading 1) -> x."""
        return same_type(self, self.x)

    def lower(self, x):
        return _reshaped(x, self, "flatten")

    def infer(self, x: TensorType) -> TensorType:
        # Unlike other axes, axis == rank is valid here (everything goes to the first dimension).
        if not -x.rank <= self.axis <= x.rank:
            raise self.error(f"axis {self.axis} is out of range for rank {x.rank} (allowed {-x.rank}..{x.rank})")
        axis = self.axis + x.rank if self.axis < 0 else self.axis
        return x.with_shape((math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.results[0].type.shape)


# --- pad, gather ------------------------------------------------------------------------------------


class Pad(ShapeOp, name="graph.pad"):
    """Constant padding, negative pads crop:
    %y = graph.pad(%x) {pads = [0, 1, 0, 1], value = 0.0} : tensor<2x5xf32>"""
    precision = "follow"

    x = operand()
    pads = attribute("ints")
    value = attribute(float, 0.0)

    def fold(self) -> Value | None:
        """pad(x) with every pad 0 -> x: nothing is added or cropped, whatever the pad value."""
        return None if any(self.pads) else same_type(self, self.x)

    def infer(self, x: TensorType) -> TensorType:
        r = x.rank
        if len(self.pads) != 2 * r:
            raise self.error(f"pads {list(self.pads)} has {len(self.pads)} entries; rank {r} needs {2 * r}")
        self.check_value(x.dtype)
        shape = []
        for a, (d, lo, hi) in enumerate(zip(x.shape, self.pads[:r], self.pads[r:])):
            crop = max(-lo, 0) + max(-hi, 0)
            if known(d) and crop > d:
                raise self.error(f"pads {list(self.pads)} crop {crop} elements from axis {a} of size {d}")
            shape.append(d + lo + hi)
        return x.with_shape(shape)

    def check_value(self, dtype: DType) -> None:
        v = self.value
        if dtype.is_bool and v not in (0.0, 1.0):
            raise self.error(f"pad value {v} is not a bool (0 or 1) for an {dtype} tensor")
        if dtype.is_int:
            info = np.iinfo(dtype.np)
            if not (v.is_integer() and info.min <= v <= info.max):
                raise self.error(f"pad value {v} is not representable in {dtype}")

    def reference(self, x: np.ndarray) -> np.ndarray:
        r = x.ndim
        lo, hi = self.pads[:r], self.pads[r:]
        # Crop first (negative pads), then pad with the constant.
        x = x[tuple(slice(max(-b, 0), d - max(-e, 0)) for d, b, e in zip(x.shape, lo, hi))]
        shape = tuple(n + max(b, 0) + max(e, 0) for n, b, e in zip(x.shape, lo, hi))
        out = np.full(shape, np.array(self.value).astype(x.dtype), dtype=x.dtype)
        out[tuple(slice(max(b, 0), max(b, 0) + n) for n, b in zip(x.shape, lo))] = x
        return out

    def lower(self, x):
        from tvm import te, tirx

        t = self.operands[0].type
        lo, hi = self.pads[: t.rank], self.pads[t.rank :]
        value = bool(self.value) if t.dtype.is_bool else int(self.value) if t.dtype.is_int else self.value
        fill = tirx.const(value, t.dtype.tvm)
        if t.size == 0:  # everything is padding
            return te.compute(self.out_shape(), lambda *i: fill, name="pad")
        padded = [a for a in range(t.rank) if lo[a] > 0 or hi[a] > 0]  # only cropped axes never leave the input

        def body(*i):
            # Output index i reads input index i - lo (a negative lo crops); outside the input is the fill.
            src = [v - b for v, b in zip(i, lo)]
            inside = [(src[a] >= 0) & (src[a] < t.shape[a]) for a in padded]
            elem = x(*[_clamp_index(s, 0, d - 1) for s, d in zip(src, t.shape)])
            if not inside:
                return elem
            return tirx.Select(tirx.all(*inside), elem, fill)

        return te.compute(self.out_shape(), body, name="pad")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        # Padding is cropped off again and cropped-off elements get zeros: the opposite pads.
        return [pad_or_crop(b, dys[0], [-p for p in self.pads])]


class Gather(ShapeOp, name="graph.gather"):
    """ONNX Gather (embeddings):  %y = graph.gather(%table, %ids) {axis = 0} : tensor<8x16xf32>"""
    precision = "follow"

    data = operand()
    indices = operand()
    axis = attribute(int, 0)

    def infer(self, data: TensorType, indices: TensorType) -> TensorType:
        if indices.dtype not in (DType.i32, DType.i64):
            raise self.error(f"indices must be i32 or i64, got {indices}")
        if data.rank == 0:
            raise self.error(f"data must have rank >= 1, got {data}")
        axis = normalize_axis(self, self.axis, data.rank)
        return data.with_shape(data.shape[:axis] + indices.shape + data.shape[axis + 1 :])

    def reference(self, data: np.ndarray, indices: np.ndarray) -> np.ndarray:
        axis = self.axis % data.ndim
        d = data.shape[axis]
        bad = (indices < -d) | (indices >= d)
        if bad.any():
            i = int(indices[bad].flat[0])
            raise self.error(f"index {i} is out of range for axis {axis} of size {d} (allowed {-d}..{d - 1})")
        return np.take(data, np.where(indices < 0, indices + d, indices).astype(np.int64), axis=axis)

    def lower(self, data, indices):
        from tvm import te, tirx

        t, ti = self.operands[0].type, self.operands[1].type
        axis = self.axis % t.rank
        d = size_value(kernel_shape(t.shape)[axis], ti.dtype.tvm)

        def body(*i):
            j = indices(*i[axis : axis + ti.rank])
            j = tirx.Select(j < 0, j + d, j)
            # The interpreter rejects an index out of range; compiled code clamps it rather than read astray.
            j = _clamp_index(j, 0, d - 1).astype(i[0].ty if i else "int32")
            return data(*i[:axis], j, *i[axis + ti.rank :])

        return te.compute(self.out_shape(), body, name="gather")

    def input_range(self, index: int) -> tuple[int, int] | None:
        """Random indices stay inside the gathered axis."""
        data = self.operands[0].type
        return (0, data.shape[self.axis % data.rank]) if index == 1 else None

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """Scatter-add of dy into the table: onehot(indices)^T [D, I] @ dy [outer, I, inner], so rows gathered
        twice get both gradients. The indices are integers, with no gradient."""
        data, indices, dy = self.operands[0].type, self.operands[1], dys[0]
        axis = self.axis % data.rank
        d = data.shape[axis]
        outer, inner = math.prod(data.shape[:axis]), math.prod(data.shape[axis + 1 :])
        flat = reshaped(b, indices, [indices.type.size, 1])
        zero = b.constant(np.array(0), indices.type.dtype)
        flat = b.where(b.less(flat, zero), b.add(flat, b.constant(np.array(d), indices.type.dtype)), flat)
        rows = b.constant(np.arange(d).reshape(1, d), indices.type.dtype)
        onehot = b.cast(b.equal(flat, rows), dtype=data.dtype)  # [I, D]
        grouped = reshaped(b, dy, [outer, indices.type.size, inner])
        table = b.matmul(b.transpose(onehot, perm=[1, 0]), grouped)  # [outer, D, inner]
        return [reshaped(b, table, data.shape), None]


OPS = [Reshape, Transpose, Concat, Split, Slice, BroadcastTo, Squeeze, Unsqueeze, Flatten, Pad, Gather]
