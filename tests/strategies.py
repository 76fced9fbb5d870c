"""Hypothesis strategies: random valid GIR modules over the graph v1 op set, for differential tests.

`modules()` builds a random DAG with compiler.builder: a few arguments of random shapes and dtypes,
then up to `max_ops` steps, each one op (or a short idiom such as `log(abs(x) + 1)`) whose operands
are picked from the values made so far, or made to fit: constants (splats, dense, exact 0 and 1,
duplicates of earlier ones) or fresh arguments. Shapes are constructed to be valid, so every module
verifies; the patterns passes look for (x + 0, x * 1, identical ops, identity reshapes, conv2d followed
by batch_norm with constant parameters, ...) come up often on purpose.

`continuous=True` leaves out the ops whose output can jump when an input moves by one rounding error
(floor, comparisons, casts to integers, argmax, unguarded division): for passes that reassociate
floating-point arithmetic (fold-batch-norm), whose results differ from the original in the last bits.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st

from compiler.builder import finish, new_func
from compiler.diagnostics import GCError
from compiler.ir import Dense, DType, Module, TensorType, Value

F16, BF16, F32, F64, I1, I32, I64 = DType.f16, DType.bf16, DType.f32, DType.f64, DType.i1, DType.i32, DType.i64
INT64_MAX = 9223372036854775807

UNARY_ANY = ["neg", "abs", "relu", "clip"]
UNARY_FLOAT = ["exp", "tanh", "sigmoid", "erf", "sin", "cos", "softplus", "gelu", "leaky_relu", "elu", "atan", "sinh",
               "cosh", "asinh"]
# Poles, or NaN outside a domain: not where a continuous function is needed.
UNARY_JUMPY = ["floor", "ceil", "reciprocal", "tan", "asin", "acos", "acosh", "atanh"]
BITWISE = ["bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right"]
POSITIVE_DOMAIN = ["log", "sqrt", "rsqrt", "reciprocal"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
REDUCE = ["reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min"]


def is_float(t: TensorType) -> bool:
    return t.dtype.is_float


def is_numeric(t: TensorType) -> bool:
    return not t.dtype.is_bool


def nonempty(t: TensorType) -> bool:
    return t.size > 0


class _Gen:
    """The state of one module under construction: the function, its builder and the values so far."""

    def __init__(self, draw, *, max_args: int, continuous: bool, low_precision: bool):
        self.draw = draw
        self.continuous = continuous
        self.low_precision = low_precision
        n = draw(st.integers(1, max_args))
        self.f, self.b, args = new_func("main", {f"a{i}": self.tensor_type() for i in range(n)})
        self.pool: list[Value] = list(args)
        self.consts: dict[TensorType, list[Dense]] = {}

    # --- drawing ------------------------------------------------------------------------------------

    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def chance(self, percent: int) -> bool:
        """True with about this probability; shrinks to False."""
        return self.draw(st.integers(0, 99)) >= 100 - percent

    def choice(self, items: list):
        return self.draw(st.sampled_from(items))

    def dtype(self, float_only: bool = False) -> DType:
        if self.continuous or float_only:
            return self.choice([F32, F32, F32, F64])
        return self.choice([F32, F32, F32, F32, F32, F32, F64, F64, I32, I64])

    def shape(self, min_rank: int = 0, max_rank: int = 4, max_dim: int = 5) -> tuple[int, ...]:
        return tuple(self.int(1, max_dim) for _ in range(self.int(min_rank, max_rank)))

    def tensor_type(self, min_rank: int = 0, max_rank: int = 4, float_only: bool = False) -> TensorType:
        return TensorType(self.shape(min_rank, max_rank), self.dtype(float_only))

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.int(0, 2**16))

    # --- values -------------------------------------------------------------------------------------

    def emit(self, *values: Value) -> None:
        self.pool.extend(values)

    def new_arg(self, t: TensorType) -> Value:
        v = Value(t, f"a{len(self.f.args)}")
        self.f.args.append(v)
        self.pool.append(v)
        return v

    def pick(self, ok: Callable[[TensorType], bool], make: Callable[[], TensorType]) -> Value:
        """A value of the pool satisfying `ok` (most often the latest), else a fresh argument or constant."""
        cands = [v for v in self.pool if ok(v.type)]
        if not cands or self.chance(10):
            t = make()
            return self.const(t) if self.chance(25) else self.new_arg(t)
        if self.chance(50):
            return cands[-1]
        return cands[self.int(0, len(cands) - 1)]

    def operand(self, t: TensorType) -> Value:
        """A value of exactly type `t`: from the pool, a constant, or a fresh argument."""
        same = [v for v in self.pool if v.type == t]
        if same and self.chance(40):
            return self.choice(same)
        return self.const(t) if self.chance(60) else self.new_arg(t)

    def const(self, t: TensorType, kind: str | None = None) -> Value:
        """A graph.constant of type `t`: dense, splat, exact 0 or 1, or a repeat of an earlier value."""
        earlier = self.consts.get(t, [])
        kinds = ["dense", "splat", "zero", "one"] + (["repeat", "repeat"] if earlier else [])
        kind = kind or self.choice(kinds)
        if kind == "repeat":
            dense = self.choice(earlier)
            v = self.b.constant(dense.array, t.dtype)
            self.emit(v)
            return v
        dt = t.dtype
        if kind in ("zero", "one"):
            arr = np.full(t.shape, 0 if kind == "zero" else 1)
        elif kind == "splat":
            arr = np.full(t.shape, self.choice(self.splat_values(dt)))
        elif dt.is_bool:
            arr = self.rng().random(t.shape) < 0.5
        elif dt.is_int:
            arr = self.rng().integers(-4, 5, size=t.shape)
        else:
            arr = np.round(self.rng().standard_normal(t.shape), 3)
        if dt.is_bool:
            arr = arr != 0
        v = self.b.constant(np.asarray(arr).astype(dt.np), dt)
        self.consts.setdefault(t, []).append(v.owner.value)
        self.emit(v)
        return v

    def splat_values(self, dt: DType) -> list:
        if dt.is_bool:
            return [True, False]
        if dt.is_int:
            return [2, -1, 3, 7]
        special = [] if self.continuous else [-0.0, math.inf, math.nan]
        return [0.5, -1.0, 2.0, 0.25, -3.0, *special]

    def compatible_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with `shape`: a suffix of it, some dims 1, maybe extra leading dims."""
        k = self.int(0, len(shape))
        out = []
        for d in shape[len(shape) - k :]:
            if d == 1 and self.chance(20):
                out.append(self.int(1, 4))  # broadcasts x along this axis
            else:
                out.append(1 if self.chance(30) else d)
        if k == len(shape) < 4 and self.chance(15):
            out = [self.int(1, 3) for _ in range(self.int(1, 4 - len(shape)))] + out
        return tuple(out)

    def positive(self, x: Value) -> Value:
        """abs(x) + 1, at least 1: keeps log, sqrt and division finite and smooth."""
        shape = () if self.chance(50) else x.type.shape
        return self.b.add(self.b.abs(x), self.const(TensorType(shape, x.type.dtype), "one"))

    def float_value(self, min_rank: int = 0, max_rank: int = 4) -> Value:
        """A floating-point value of rank in [min_rank, max_rank], all dims at least 1."""

        def fits(t: TensorType) -> bool:
            return is_float(t) and min_rank <= t.rank <= max_rank and nonempty(t)

        return self.pick(fits, lambda: self.tensor_type(min_rank, max_rank, float_only=True))

    # --- elementwise --------------------------------------------------------------------------------

    def g_unary(self) -> None:
        names = UNARY_ANY + UNARY_FLOAT + ([] if self.continuous else UNARY_JUMPY)
        name = self.choice(names)
        ok = is_numeric if name in UNARY_ANY else is_float
        x = self.pick(ok, lambda: self.tensor_type(float_only=name not in UNARY_ANY))
        attrs: dict = {}
        if name == "gelu":
            attrs["approximate"] = self.choice(["none", "tanh"])
        elif name == "leaky_relu":
            attrs["alpha"] = self.choice([0.01, 0.2, 0.0, 1.0])
        elif name == "elu":
            attrs["alpha"] = self.choice([1.0, 0.5])
        elif name == "clip":
            attrs["min"] = self.choice([-math.inf, -1.0, 0.0, 0.5])
            attrs["max"] = self.choice([math.inf, 1.0, 6.0, 0.5])
        y = getattr(self.b, name)(x, **attrs)
        if self.chance(25):  # relu(relu(x)), neg(neg(x)): idempotent and involutive chains
            y = getattr(self.b, name)(y, **attrs)
        self.emit(y)

    def g_positive_domain(self) -> None:
        name = self.choice(POSITIVE_DOMAIN)
        x = self.pick(is_float, lambda: self.tensor_type(float_only=True))
        self.emit(getattr(self.b, name)(self.positive(x)))

    def g_binary(self) -> None:
        names = [n for n in BINARY if not (self.continuous and n == "pow")]
        name = self.choice(["add", "sub", "mul", "div", *names])  # the ones canonicalize knows come twice as often
        ok = is_float if name == "pow" else is_numeric
        x = self.pick(ok, lambda: self.tensor_type(float_only=name == "pow"))
        y = self.second_operand(x, special=name in ("add", "sub", "mul", "div"))
        if name == "div" and (self.continuous or self.chance(30)):
            y = self.positive(y) if y.type.dtype.is_float else y
        if name == "pow" and self.chance(50):
            x = self.positive(x)
        a, b = (y, x) if self.chance(30) else (x, y)
        self.emit(getattr(self.b, name)(a, b))

    def second_operand(self, x: Value, special: bool = False) -> Value:
        """An operand that broadcasts with x and has its dtype: x itself, a pool value, a constant, an argument."""
        t = x.type
        r = self.int(0, 9)
        if r == 0:
            return x
        if r <= 3:
            kind = self.choice(["zero", "one"]) if special else None
            return self.const(TensorType(self.compatible_shape(t.shape), t.dtype), kind)
        if r <= 6:
            def fits(u: TensorType) -> bool:
                return u.dtype == t.dtype and _broadcasts(u.shape, t.shape)

            cands = [v for v in self.pool if fits(v.type)]
            if cands:
                return self.choice(cands)
        if r <= 8:
            return self.const(TensorType(self.compatible_shape(t.shape), t.dtype))
        return self.new_arg(TensorType(self.compatible_shape(t.shape), t.dtype))

    def g_bitwise(self) -> None:
        """An integer op: bitwise, or a shift by amounts that may be negative or past the width."""
        if self.continuous:
            return
        x = self.pick(lambda t: t.dtype.is_int, lambda: TensorType(self.shape(), self.choice([I32, I64])))
        name = self.choice([*BITWISE, "bitwise_not"])
        if name == "bitwise_not":
            self.emit(self.b.bitwise_not(x))
            return
        y = self.second_operand(x)
        self.emit(getattr(self.b, name)(*((y, x) if self.chance(30) else (x, y))))

    def g_compare(self) -> None:
        if self.continuous:
            return
        name = self.choice(["less", "greater", "equal"])
        x = self.pick(is_numeric, self.tensor_type)
        y = self.second_operand(x)
        cond = getattr(self.b, name)(x, y)
        self.emit(cond)
        if self.chance(70):
            a = x if self.chance(50) else self.second_operand(x)
            b = self.second_operand(x)
            if _broadcasts(cond.type.shape, a.type.shape) and _broadcasts(cond.type.shape, b.type.shape):
                if _broadcasts(a.type.shape, b.type.shape):
                    self.emit(self.b.where(cond, a, b))

    def g_cast(self) -> None:
        x = self.pick(lambda t: True, self.tensor_type)
        if self.continuous:
            if not is_float(x.type):
                return
            targets = [F32, F64]
        else:
            targets = [F32, F64, I32, I64, I1, x.type.dtype] + ([F16, BF16] if self.low_precision else [])
        y = self.b.cast(x, dtype=self.choice(targets))
        if self.chance(30):  # a round trip, exact or not
            y = self.b.cast(y, dtype=x.type.dtype)
        self.emit(y)

    # --- reductions, matmul -------------------------------------------------------------------------

    def g_reduce(self) -> None:
        x = self.pick(is_numeric, self.tensor_type)
        r = x.type.rank
        attrs: dict = {"keepdims": self.chance(40)}
        if r and self.chance(75):
            axes = [a for a in range(r) if self.chance(50)] or [self.int(0, r - 1)]
            attrs["axes"] = [a - r if self.chance(30) else a for a in axes]
        elif self.chance(30):
            attrs["axes"] = []
        self.emit(getattr(self.b, self.choice(REDUCE))(x, **attrs))

    def g_argmax(self) -> None:
        if self.continuous:
            return
        x = self.pick(lambda t: is_numeric(t) and t.rank >= 1 and nonempty(t), lambda: self.tensor_type(1))
        axis = self.int(-x.type.rank, x.type.rank - 1)
        self.emit(self.b.argmax(x, axis=axis, keepdims=self.chance(40)))

    def g_matmul(self) -> None:
        x = self.pick(lambda t: is_numeric(t) and 1 <= t.rank <= 4, lambda: self.tensor_type(1, 3))
        xs, dt = x.type.shape, x.type.dtype
        k, n = xs[-1], self.int(1, 5)
        form = self.int(0, 2)
        if form == 0:
            ws: tuple[int, ...] = (k,)
        elif form == 1:
            ws = (k, n)
        else:
            b = self.choice([1, xs[-3]]) if len(xs) >= 3 else self.int(1, 3)
            ws = (b, k, n)
        w = self.const(TensorType(ws, dt), "dense") if self.chance(50) else self.operand(TensorType(ws, dt))
        y = self.b.matmul(x, w)
        if y.type.rank == 2 and dt.is_float and self.chance(50):  # a linear layer, then batch_norm
            if self.chance(50):
                y = self.b.add(y, self.operand(TensorType(y.type.shape[-1:], dt)))
            y = self.batch_norm(y, constant=self.chance(70))
        self.emit(y)

    # --- nn -----------------------------------------------------------------------------------------

    def g_conv2d(self) -> None:
        x = self.float_value(4, 4)
        n, c, h, w = x.type.shape
        dt = x.type.dtype
        groups = self.choice([g for g in range(1, c + 1) if c % g == 0])
        o = groups * self.int(1, 3)
        pad = [self.int(0, 1) for _ in range(4)]
        kh, kw = self.int(1, min(3, h + pad[0] + pad[2])), self.int(1, min(3, w + pad[1] + pad[3]))
        padded = (h + pad[0] + pad[2], w + pad[1] + pad[3])
        dil = [1 if (k - 1) * 2 + 1 > size else self.int(1, 2) for k, size in zip((kh, kw), padded)]
        attrs = {"strides": [self.int(1, 2), self.int(1, 2)], "padding": pad, "dilations": dil, "groups": groups}
        wt = TensorType((o, c // groups, kh, kw), dt)
        operands = [x, self.const(wt, "dense") if self.chance(70) else self.operand(wt)]
        if self.chance(50):
            operands.append(self.operand(TensorType((o,), dt)))
        y = self.b.conv2d(*operands, **attrs)
        if self.chance(50):  # conv2d then batch_norm with constant parameters: what fold-batch-norm folds
            y = self.batch_norm(y, constant=True)
        self.emit(y)

    def g_winograd(self) -> None:
        """A 3x3 convolution as Winograd's transforms around a batched matmul (what the CPU build writes)."""
        x = self.float_value(4, 4)
        n, c, h, w = x.type.shape
        dt, m = x.type.dtype, self.choice([2, 3, 4])
        pad = [self.int(1, 2), self.int(1, 2), self.int(0, 1), self.int(0, 1)]
        v = self.b.winograd_input(x, tile=m, padding=pad)
        o = self.int(1, 3)
        mt = self.b.matmul(v, self.const(TensorType((v.type.shape[0], c, o), dt), "dense"))
        bias = [self.operand(TensorType((o,), dt))] if self.chance(50) else []
        size = [h + pad[0] + pad[2] - 2, w + pad[1] + pad[3] - 2]
        self.emit(self.b.winograd_output(mt, *bias, tile=m, size=size))

    def batch_norm(self, x: Value, constant: bool) -> Value:
        c, dt = x.type.shape[1], x.type.dtype
        t = TensorType((c,), dt)
        params = [self.const(t, "dense") if constant else self.operand(t) for _ in range(3)]
        if constant or self.chance(50):
            if self.chance(30):
                arr = np.full(c, self.choice([1.0, 0.5, 2.0]))
            else:
                arr = np.round(np.abs(self.rng().standard_normal(c)) + 0.5, 3)
            var = self.b.constant(arr.astype(dt.np), dt)  # a variance is positive
            self.emit(var)
        else:
            var = self.new_arg(t)  # random_inputs draws a batch_norm variance from a positive range
        return self.b.batch_norm(x, *params, var, epsilon=self.choice([1e-5, 1e-3]))

    def g_batch_norm(self) -> None:
        x = self.float_value(2, 4)
        self.emit(self.batch_norm(x, constant=self.chance(50)))

    def g_pool(self) -> None:
        name = self.choice(["max_pool2d", "avg_pool2d", "global_avg_pool2d"])
        x = self.float_value(4, 4)
        if name == "global_avg_pool2d":
            self.emit(self.b.global_avg_pool2d(x))
            return
        _, _, h, w = x.type.shape
        kernel = [self.int(1, min(3, h)), self.int(1, min(3, w))]
        attrs: dict = {"kernel": kernel, "ceil_mode": self.chance(40)}
        attrs["padding"] = [self.int(0, kernel[i % 2] - 1) for i in range(4)]
        if self.chance(60):
            attrs["strides"] = [self.int(1, 3), self.int(1, 3)]
        if name == "avg_pool2d":
            attrs["count_include_pad"] = self.chance(50)
        self.emit(getattr(self.b, name)(x, **attrs))

    def g_layer_norm(self) -> None:
        x = self.float_value(1, 4)
        r = x.type.rank
        axis = self.int(-r, r - 1)
        t = TensorType(x.type.shape[axis % r :], x.type.dtype)
        scale, bias = self.operand(t), self.operand(t)
        self.emit(self.b.layer_norm(x, scale, bias, axis=axis, epsilon=self.choice([1e-5, 1e-3])))

    def g_softmax(self) -> None:
        x = self.float_value(1, 4)
        axis = self.int(-x.type.rank, x.type.rank - 1)
        self.emit(getattr(self.b, self.choice(["softmax", "log_softmax"]))(x, axis=axis))

    def g_lrn(self) -> None:
        x = self.float_value(2, 4)
        attrs = {"size": self.int(1, 5), "alpha": self.choice([1e-4, 0.1]), "beta": self.choice([0.75, 0.5])}
        self.emit(self.b.lrn(x, **attrs, bias=self.choice([1.0, 2.0])))

    def g_dropout(self) -> None:
        x = self.pick(is_float, lambda: self.tensor_type(float_only=True))
        self.emit(self.b.dropout(x, rate=self.choice([0.5, 0.0, 0.1])))

    def g_loss(self) -> None:
        if self.chance(50):
            a = self.float_value(0, 4)
            self.emit(self.b.mse_loss(a, self.operand(a.type)))
            return
        logits = self.float_value(2, 2)
        n, c = logits.type.shape
        dt = self.choice([I32, I64])
        if self.chance(50):
            labels = self.b.constant(self.rng().integers(0, c, size=n).astype(dt.np), dt)
            if not self.continuous:
                self.emit(labels)
        else:
            labels = self.new_arg(TensorType((n,), dt))  # random_inputs keeps labels in [0, c)
            if self.continuous:  # no integer value for later ops to pick (a concat of labels would jump)
                self.pool.remove(labels)
        self.emit(self.b.softmax_cross_entropy(logits, labels))

    # --- shape ops ----------------------------------------------------------------------------------

    def any_value(self, min_rank: int = 0, max_rank: int = 4) -> Value:
        return self.pick(lambda t: min_rank <= t.rank <= max_rank, lambda: self.tensor_type(min_rank, max_rank))

    def g_reshape(self) -> None:
        x = self.any_value()
        shape = self.reshape_target(x.type.shape)
        self.emit(self.b.reshape(x, shape=shape))

    def reshape_target(self, in_shape: tuple[int, ...]) -> list[int]:
        n = math.prod(in_shape)
        if n == 0 or self.chance(10):
            out = list(in_shape)  # a reshape to its own shape
        else:
            out = [1] * self.int(0 if n == 1 else 1, 4)
            for p in _prime_factors(n):
                out[self.int(0, len(out) - 1)] *= p
        if n and out and self.chance(40):
            out[self.int(0, len(out) - 1)] = -1
        for i in range(min(len(out), len(in_shape))):
            if out[i] == in_shape[i] and self.chance(30):
                out[i] = 0  # ONNX: 0 copies the input's size at that position
        return out

    def g_transpose(self) -> None:
        x = self.any_value()
        r = x.type.rank
        kind = self.int(0, 3)
        if kind == 0:
            self.emit(self.b.transpose(x))
            return
        perm = list(range(r))
        if kind >= 2:
            perm = list(self.draw(st.permutations(perm)))
        perm = [p - r if self.chance(20) else p for p in perm]
        y = self.b.transpose(x, perm=perm)
        if self.chance(30):  # transpose(transpose(x))
            y = self.b.transpose(y, perm=list(self.draw(st.permutations(range(r)))))
        self.emit(y)

    def g_concat(self) -> None:
        x = self.any_value(1, 4)
        r = x.type.rank
        axis = self.int(-r, r - 1)
        parts = [x]
        for _ in range(self.int(0, 2)):
            if self.chance(30):
                parts.append(x)
                continue
            shape = list(x.type.shape)
            shape[axis % r] = self.int(0, 3)
            parts.append(self.operand(TensorType(tuple(shape), x.type.dtype)))
        if self.chance(50):
            parts.reverse()
        self.emit(self.b.concat(*parts, axis=axis))

    def g_split(self) -> None:
        x = self.any_value(1, 4)
        r = x.type.rank
        axis = self.int(-r, r - 1)
        d = x.type.shape[axis % r]
        cuts = sorted(self.int(0, d) for _ in range(self.int(0, 2)))
        sections = [b - a for a, b in zip([0, *cuts], [*cuts, d])]
        outs = self.b.split(x, axis=axis, sections=sections)
        self.emit(*(outs if isinstance(outs, tuple) else (outs,)))

    def g_slice(self) -> None:
        x = self.any_value(1, 4)
        r = x.type.rank
        axes = list(self.draw(st.permutations(range(r))))[: self.int(1, r)]
        starts, ends, steps = [], [], []
        for a in axes:
            d = x.type.shape[a]
            step = self.choice([1, 1, 2, -1, -2, 3])
            edges = [0, d, -1, 1, -d - 2, d + 2, INT64_MAX, -INT64_MAX, self.int(-d, d)]
            starts.append(self.choice(edges))
            ends.append(self.choice(edges))
            steps.append(step)
        attrs: dict = {"starts": starts, "ends": ends}
        if axes != list(range(len(axes))) or self.chance(50):
            attrs["axes"] = [a - r if self.chance(30) else a for a in axes]
        if any(s != 1 for s in steps) or self.chance(50):
            attrs["steps"] = steps
        self.emit(self.b.slice(x, **attrs))

    def g_broadcast_to(self) -> None:
        x = self.any_value(0, 4)
        shape = [self.int(1, 4) if d == 1 and self.chance(60) else d for d in x.type.shape]
        shape = [1 if self.chance(10) else d for d in shape]  # Expand also takes a 1 where x is larger
        if len(shape) < 4 and self.chance(50):
            shape = [self.int(1, 3) for _ in range(self.int(1, 4 - len(shape)))] + shape
        self.emit(self.b.broadcast_to(x, shape=shape))

    def g_squeeze(self) -> None:
        def make() -> TensorType:
            return TensorType((*self.shape(0, 2), 1, *self.shape(0, 1)), self.dtype())

        x = self.pick(lambda t: 1 in t.shape, make)
        ones = [i for i, d in enumerate(x.type.shape) if d == 1]
        if self.chance(30):
            self.emit(self.b.squeeze(x))
            return
        axes = [a for a in ones if self.chance(50)] or ones[:1]
        r = x.type.rank
        self.emit(self.b.squeeze(x, axes=[a - r if self.chance(30) else a for a in axes]))

    def g_unsqueeze(self) -> None:
        x = self.any_value(0, 3)
        out_rank = x.type.rank + self.int(1, min(2, 4 - x.type.rank))
        axes = list(self.draw(st.permutations(range(out_rank))))[: out_rank - x.type.rank]
        y = self.b.unsqueeze(x, axes=[a - out_rank if self.chance(30) else a for a in axes])
        if self.chance(30):  # squeeze(unsqueeze(x))
            y = self.b.squeeze(y, axes=axes)
        self.emit(y)

    def g_flatten(self) -> None:
        x = self.any_value()
        r = x.type.rank
        self.emit(self.b.flatten(x, axis=self.int(-r, r)))

    def g_pad(self) -> None:
        x = self.any_value(0, 4)
        shape, dt = x.type.shape, x.type.dtype
        lo = [self.int(-1, 2) if self.chance(70) else 0 for _ in shape]
        hi = [self.int(-1, 2) if self.chance(70) else 0 for _ in shape]
        for i, d in enumerate(shape):  # never crop more than the axis holds
            if max(-lo[i], 0) + max(-hi[i], 0) > d:
                lo[i], hi[i] = max(lo[i], 0), max(hi[i], 0)
        if dt.is_bool:
            value = self.choice([0.0, 1.0])
        elif dt.is_int:
            value = self.choice([0.0, 1.0, -3.0])
        else:
            value = self.choice([0.0, 1.0, -1.5])
        self.emit(self.b.pad(x, pads=lo + hi, value=value))

    def g_gather(self) -> None:
        data = self.pick(lambda t: t.rank >= 1 and nonempty(t), lambda: self.tensor_type(1, 3))
        r = data.type.rank
        axis = self.int(-r, r - 1)
        d = data.type.shape[axis % r]
        dt = self.choice([I64, I32])
        shape = self.shape(0, 4 - r)
        if self.chance(70):
            idx = self.b.constant(self.rng().integers(-d, d, size=shape).astype(dt.np), dt)
            if not self.continuous:  # other ops may read it; continuous modules compute on floats only
                self.emit(idx)
        else:
            idx = Value(TensorType(shape, dt), f"a{len(self.f.args)}")  # kept out of the pool: its range is gather's
            self.f.args.append(idx)
        self.emit(self.b.gather(data, idx, axis=axis))

    # --- repeats, for cse ---------------------------------------------------------------------------

    def g_repeat(self) -> None:
        """An op made again with the same operands and attributes: cse should merge the two."""
        ops = [op for op in self.f.ops if op.name != "graph.constant"]
        if not ops:
            return
        op = self.choice(ops)
        self.emit(*self.b.create(type(op), list(op.operands), dict(op.attrs)).results)

    def g_repeat_chain(self) -> None:
        """The last few ops made again, each reading the copies of the ones before: cse must merge in order."""
        tail = self.f.ops[-self.int(2, 4) :]
        copies: dict[Value, Value] = {}
        for op in tail:
            new = self.b.create(type(op), [copies.get(v, v) for v in op.operands], dict(op.attrs))
            copies.update(zip(op.results, new.results))
            self.emit(*new.results)

    GENERATORS: list[tuple[str, int]] = [
        ("g_unary", 13), ("g_positive_domain", 3), ("g_binary", 10), ("g_compare", 3), ("g_cast", 3),
        ("g_reduce", 4), ("g_argmax", 1), ("g_matmul", 3), ("g_conv2d", 2), ("g_winograd", 1), ("g_batch_norm", 1), ("g_pool", 2),
        ("g_layer_norm", 1), ("g_softmax", 2), ("g_lrn", 1), ("g_dropout", 1), ("g_loss", 2),
        ("g_reshape", 3), ("g_transpose", 3), ("g_concat", 2), ("g_split", 2), ("g_slice", 3),
        ("g_broadcast_to", 2), ("g_squeeze", 1), ("g_unsqueeze", 2), ("g_flatten", 1), ("g_pad", 2),
        ("g_gather", 2), ("g_repeat", 3), ("g_repeat_chain", 2), ("g_bitwise", 3),
    ]  # fmt: skip

    def step(self) -> None:
        getattr(self, self.choice([name for name, weight in self.GENERATORS for _ in range(weight)]))()

    def results(self) -> list[Value]:
        """1-3 values to return: the latest, then mostly values nothing reads (so little is dead code),
        sometimes any value (an argument, a constant, one already returned)."""
        made = [v for op in self.f.ops if op.name != "graph.constant" for v in op.results] or self.pool
        read = {v for op in self.f.ops for v in op.operands}
        leaves = [v for v in made[:-1] if v not in read]
        out = [made[-1]]
        for _ in range(self.int(0, 2)):
            out.append(self.choice(self.pool if self.chance(20) or not leaves else leaves))
        return out


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def modules(
    draw,
    max_ops: int = 12,
    *,
    min_ops: int = 1,
    max_args: int = 3,
    continuous: bool = False,
    low_precision: bool = True,
) -> Module:
    """A random valid module with one function @main of `min_ops`..`max_ops` generator steps.

    `continuous`: only ops whose outputs move little when an input moves by a rounding error, on floats.
    `low_precision`: casts to f16 and bf16 too."""
    g = _Gen(draw, max_args=max_args, continuous=continuous, low_precision=low_precision and not continuous)
    try:
        for _ in range(draw(st.integers(min_ops, max_ops))):
            g.step()
        f = finish(g.f, *g.results())
    except GCError:
        reject()  # the generators build valid shapes; this only guards against a rare slip
    return Module([f])


def op_names(module: Module) -> set[str]:
    return {op.name for f in module for op in f.ops}


def all_op_names() -> set[str]:
    """Every graph op but call (the strategy builds one function)."""
    from dialects.graph import GRAPH

    return {op.name for op in GRAPH.ops} - {"graph.call"}

