"""Image sampling: grid_sample (ONNX GridSample) and affine_grid (ONNX AffineGrid), 2-D and 3-D.

A grid holds normalized coordinates in [-1, 1], the last axis listing them innermost dimension first (x, the
width, then y, then z), as ONNX and PyTorch do. `align_corners` puts -1 and 1 at the centres of the corner
pixels; without it, at the outer edges of the corner pixels.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import Op, TensorType, Value, attribute, differ, known, operand
from dialects.graph.common import require_float, same_dtype

if TYPE_CHECKING:
    from tvm import te

    from compiler.builder import Builder

CUBIC_A = -0.75  # Keys' cubic convolution coefficient, ONNX's (and PyTorch's) for GridSample


def _denormalize(g, size: int, align_corners: bool):
    """Pixel coordinate of normalized coordinate `g` along an axis of `size` pixels (ONNX's order of operations,
    so f32 rounds alike here and in compiled code)."""
    return (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2


def _bounds(size: int, align_corners: bool) -> tuple[float, float]:
    """The span a coordinate is reflected into, and outside of which border padding clamps it."""
    return (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)


def _cubic_weights(t) -> list:
    """Keys' weights of the taps at floor - 1, floor, floor + 1, floor + 2 for a fraction `t` past the floor."""
    a = CUBIC_A
    return [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]  # fmt: skip


def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Fold `v` back into [lo, hi], bouncing off each end as often as it takes (ONNX's GsReflect)."""
    span = hi - lo
    if span == 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    dx = np.where(below, lo - v, v - hi)
    bounces = np.floor(dx / span)
    rest = dx - bounces * span
    even = bounces % 2 == 0
    return np.where(below | above, np.where(below == even, lo + rest, hi - rest), v)


class GridSample(Op, name="graph.grid_sample"):
    """Sample x at a grid of points (ONNX GridSample):  %y = graph.grid_sample(%x, %grid) {mode = "cubic"} : tensor<1x3x5x6xf32>

    `x` is `[N, C, H, W]` (or `[N, C, D, H, W]`), `grid` `[N, H_out, W_out, 2]` (`[N, D_out, H_out, W_out, 3]`) of
    normalized (x, y[, z]) coordinates; the result is `[N, C, H_out, W_out]`. `linear` interpolates the 2 (4, 8)
    nearest pixels, `cubic` the 4 per axis with Keys' kernel (a = -0.75), `nearest` takes the pixel at the
    coordinate rounded half to even. Outside the image, `zeros` reads 0, `border` clamps the coordinate to the
    edge pixels, `reflection` folds it back off the image's edges (the pixel centres with `align_corners`, else
    the outer edges). No gradient rule: autodiff stops here."""

    kind = "opaque"
    precision = "f32"
    x = operand()
    grid = operand()
    mode = attribute(str, "linear", choices=("linear", "nearest", "cubic"))
    padding_mode = attribute(str, "zeros", choices=("zeros", "border", "reflection"))
    align_corners = attribute(bool, False, doc="-1 and 1 are the corner pixels' centres, not their outer edges")

    def infer(self, x: TensorType, grid: TensorType) -> TensorType:
        require_float(self, x, "x")
        same_dtype(self, x, grid)
        if x.rank not in (4, 5):
            raise self.error(f"x must be [N, C, H, W] or [N, C, D, H, W], got {x}")
        k = x.rank - 2
        if grid.rank != x.rank:
            raise self.error(f"grid must have rank {x.rank} ([N, *out, {k}]) for x {x}, got {grid}")
        if differ(grid.shape[-1], k):
            raise self.error(f"grid's last axis must hold {k} coordinates, got {grid}")
        if differ(grid.shape[0], x.shape[0]):
            raise self.error(f"grid's batch {grid.shape[0]} differs from x's {x.shape[0]}")
        batch = x.shape[0] if known(x.shape[0]) else grid.shape[0]
        return x.with_shape((batch, x.shape[1], *grid.shape[1:-1]))

    def _taps(self, g: np.ndarray, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(pixel index, weight) of each tap along one axis, for normalized coordinates `g`; a weight of 0 where
        zero padding reads outside the image."""
        lo, hi = _bounds(size, self.align_corners)
        c = _denormalize(g, size, self.align_corners)
        if self.mode == "nearest":
            c = np.rint(c)  # half to even, as ONNX's reference and PyTorch
        if self.padding_mode == "border":
            c = np.where((c < lo) | (c > hi), np.clip(c, 0, size - 1), c)
        elif self.padding_mode == "reflection":
            c = _reflect(c, lo, hi)
        else:  # zeros: every tap is outside well before here, and the index fits an integer
            c = np.clip(c, lo - 3, hi + 3)
        if self.mode == "nearest":
            taps = [(c, np.ones_like(c))]
        else:
            f = np.floor(c)
            t = c - f
            weights = [1 - t, t] if self.mode == "linear" else _cubic_weights(t)
            first = 0 if self.mode == "linear" else -1
            taps = [(f + first + j, w) for j, w in enumerate(weights)]
        out = []
        for i, w in taps:
            if self.padding_mode == "zeros":
                w = np.where((i >= 0) & (i <= size - 1), w, 0)
            elif self.padding_mode == "reflection":
                i = np.trunc(_reflect(i, lo, hi))
            out.append((np.clip(i, 0, size - 1).astype(np.int64), w.astype(np.float64)))
        return out

    def reference(self, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
        k = x.ndim - 2
        per_axis = [self._taps(grid[..., k - 1 - a], x.shape[2 + a]) for a in range(k)]
        xt = np.moveaxis(x, 1, -1).astype(np.float64)  # [N, *in, C]
        n = np.arange(x.shape[0]).reshape((-1,) + (1,) * k)
        y = np.zeros((*grid.shape[:-1], x.shape[1]))
        for combo in itertools.product(*per_axis):
            w = math.prod(wt for _, wt in combo)
            y += w[..., None] * xt[(n, *(i for i, _ in combo))]
        return np.moveaxis(y, -1, 1).astype(x.dtype)

    def flops(self) -> int:
        taps = {"nearest": 1, "linear": 2, "cubic": 4}[self.mode] ** (self.operands[0].type.rank - 2)
        return 2 * taps * self.results[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        from compiler.passes import InputError  # the autodiff pass's diagnostic for an op it cannot go through

        raise InputError(
            f"{self.name} has no gradient rule (its input's would scatter-add into the image): "
            "autodiff cannot differentiate through it",
            self.loc,
        )

    def lower(self, x: te.Tensor, grid: te.Tensor) -> te.Tensor:
        from tvm import te, tirx

        dtype = str(x.dtype)
        acc = "float32" if dtype in ("float16", "bfloat16") else dtype
        xt = self.operands[0].type
        k = xt.rank - 2
        sizes = [int(s) for s in xt.shape[2:]]
        f = lambda v: tirx.const(v, acc)

        # The weights and validity flags are let-bound once each: written out, the cubic taps with reflection
        # repeat the coordinate's arithmetic in every one of their 16 (64) terms, and TVM took 11 minutes to
        # lower that one expression for the GPU. The tap indices stay expressions: a buffer index may not
        # use a let-bound variable (the block's read regions are computed outside the lets).
        lets: list = []

        def bind(value, name: str = "v"):
            if hasattr(value, "asobject"):  # a comparison's sugar object
                value = value.asobject()
            v = tirx.Var(f"{name}{len(lets)}", value.ty)
            lets.append((v, value))
            return v

        def keep(value, name: str = "v"):
            return value

        def reflect(v, lo: float, hi: float, b=keep):
            span = hi - lo
            if span == 0:
                return f(lo)
            below, above = b(v < f(lo), "below"), v > f(hi)
            dx = b(te.if_then_else(below, f(lo) - v, v - f(hi)), "dx")
            bounces = b(te.floor(dx / f(span)), "bounces")
            rest = b(dx - bounces * f(span), "rest")
            even = b(bounces - f(2) * te.floor(bounces / f(2)) == f(0), "even")
            low_side = te.any(te.all(below, even), te.all(tirx.Not(below), tirx.Not(even)))
            return b(te.if_then_else(te.any(below, above), te.if_then_else(low_side, f(lo) + rest, f(hi) - rest), v),
                     "reflected")

        def coordinate(g, size: int, b):
            lo, hi = _bounds(size, self.align_corners)
            c = b(_denormalize(g, size, self.align_corners), "c")
            if self.mode == "nearest":
                c = b(te.nearbyint(c), "c")
            if self.padding_mode == "border":
                return b(te.if_then_else(te.any(c < f(lo), c > f(hi)), te.max(te.min(c, f(size - 1)), f(0)), c), "c")
            if self.padding_mode == "reflection":
                return reflect(c, lo, hi, b)
            return b(te.max(te.min(c, f(hi + 3)), f(lo - 3)), "c")

        def taps(g, size: int, ity: str):
            lo, hi = _bounds(size, self.align_corners)
            c = coordinate(g, size, keep)  # for the indices
            if self.mode == "nearest":
                raw = [(c, None, c)]
            else:
                cw = coordinate(g, size, bind)  # for the weights
                fl = bind(te.floor(cw), "floor")
                t = bind(cw - fl, "t")
                weights = [f(1) - t, t] if self.mode == "linear" else _cubic_weights(t)
                first = 0 if self.mode == "linear" else -1
                raw = [(te.floor(c) + f(first + j), bind(w, "w"), fl + f(first + j)) for j, w in enumerate(weights)]
            out = []
            for i, w, iw in raw:
                valid = None
                if self.padding_mode == "zeros":
                    valid = bind(te.all(iw >= f(0), iw <= f(size - 1)), "valid")
                if self.padding_mode == "reflection" and self.mode != "nearest":
                    i = _reflect_index(i.astype(ity), size, self.align_corners)  # a whole tap: integer arithmetic
                else:
                    i = te.max(te.min(i, f(size - 1)), f(0)).astype(ity)
                out.append((i, w, valid))
            return out

        def body(n, ch, *o):
            lets.clear()
            ity = n.ty
            per_axis = [taps(grid(n, *o, k - 1 - a).astype(acc), sizes[a], ity) for a in range(k)]
            total = None
            for combo in itertools.product(*per_axis):
                v = x(n, ch, *(i for i, _, _ in combo)).astype(acc)
                valid = [ok for _, _, ok in combo if ok is not None]
                if valid:
                    v = te.if_then_else(te.all(*valid), v, f(0))
                for _, w, _ in combo:
                    v = v if w is None else v * w
                total = v if total is None else total + v
            out = total.astype(dtype)
            for var, value in reversed(lets):
                out = tirx.Let(var, value, out)
            return out

        return te.compute(self.results[0].type.shape, body, name="grid_sample")


def _reflect_index(i, size: int, align_corners: bool):
    """An integer tap folded back into [0, size - 1] as ONNX's GsReflect folds it (a triangle wave: period
    2 size about -0.5 and size - 0.5, or 2 (size - 1) about 0 and size - 1 with align_corners), with one
    floormod and one select, which TVM's bound analysis of the load's index takes in its stride."""
    from tvm import tirx

    period = 2 * (size - 1) if align_corners else 2 * size
    if period == 0:
        return tirx.const(0, i.dtype if hasattr(i, "dtype") else "int64") * i
    m = tirx.floormod(i, period)
    if align_corners:
        return tirx.Select(m <= size - 1, m, period - m)
    return tirx.Select(m < size, m, period - 1 - m)


def _base_coordinates(size: int, align_corners: bool) -> np.ndarray:
    """The normalized coordinates of an axis's `size` pixel centres."""
    if align_corners:
        return np.linspace(-1.0, 1.0, size) if size > 1 else np.full(size, -1.0)
    return (2 * np.arange(size) + 1) / size - 1


def _base_grid(sizes: tuple[int, ...], align_corners: bool) -> np.ndarray:
    """[prod(sizes), k + 1]: each pixel's (x, y[, z], 1), row-major over the sizes."""
    axes = [_base_coordinates(s, align_corners) for s in sizes]
    mesh = np.meshgrid(*axes, indexing="ij")  # one per axis, outermost (z or y) first
    cols = [m.reshape(-1) for m in reversed(mesh)]  # x first
    return np.stack([*cols, np.ones(math.prod(sizes))], axis=1)


class AffineGrid(Op, name="graph.affine_grid"):
    """The sampling grid of affine maps theta (ONNX AffineGrid):  %g = graph.affine_grid(%theta) {size = [4, 5]} : tensor<2x4x5x2xf32>

    `theta` is `[N, 2, 3]` (`[N, 3, 4]`) and `size` the output's spatial sizes `[H, W]` (`[D, H, W]`); each
    point of the result `[N, H, W, 2]` (`[N, D, H, W, 3]`) is theta times that pixel's normalized (x, y[, z], 1)."""

    kind = "opaque"
    precision = "f32"
    theta = operand()
    size = attribute("ints", doc="the spatial sizes [H, W] or [D, H, W]")
    align_corners = attribute(bool, False, doc="-1 and 1 are the corner pixels' centres, not their outer edges")

    def infer(self, theta: TensorType) -> TensorType:
        require_float(self, theta, "theta")
        k = len(self.size)
        if k not in (2, 3):
            raise self.error(f"size must list 2 or 3 spatial sizes, got {list(self.size)}")
        if any(s < 0 for s in self.size):
            raise self.error(f"size must be non-negative, got {list(self.size)}")
        if theta.rank != 3 or differ(theta.shape[1], k) or differ(theta.shape[2], k + 1):
            raise self.error(f"theta must be [N, {k}, {k + 1}] for {k} spatial sizes, got {theta}")
        return theta.with_shape((theta.shape[0], *self.size, k))

    def reference(self, theta: np.ndarray) -> np.ndarray:
        base = _base_grid(tuple(self.size), self.align_corners)  # [P, k + 1]
        out = np.einsum("nij,pj->npi", theta.astype(np.float64), base)
        return out.reshape((theta.shape[0], *self.size, len(self.size))).astype(theta.dtype)

    def flops(self) -> int:
        return 2 * (len(self.size) + 1) * self.results[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """Linear in theta: dtheta[n] = dy[n]^T (as [k, P]) times the base grid ([P, k + 1])."""
        k = len(self.size)
        base = _base_grid(tuple(self.size), self.align_corners)
        dy = b.reshape(dys[0], shape=(0, math.prod(self.size), k))
        return [b.matmul(b.transpose(dy, perm=(0, 2, 1)), b.constant(base, self.theta.type.dtype))]

    def lower(self, theta: te.Tensor) -> te.Tensor:
        from tvm import te, tirx

        dtype = str(theta.dtype)
        acc = "float32" if dtype in ("float16", "bfloat16") else dtype
        k = len(self.size)

        def coordinate(axis: int, i):
            """The normalized coordinate of pixel i along spatial axis `axis` (0 outermost), its formula."""
            s = self.size[axis]
            if self.align_corners:
                if s == 1:
                    return tirx.const(-1.0, acc)
                return i.astype(acc) * tirx.const(2.0 / (s - 1), acc) - tirx.const(1.0, acc)
            return (i.astype(acc) * tirx.const(2.0, acc) + tirx.const(1.0, acc)) / tirx.const(
                float(s), acc
            ) - tirx.const(1.0, acc)

        def body(n, *rest):
            p, j = rest[:k], rest[k]
            total = theta(n, j, k).astype(acc)  # the homogeneous 1's column
            for a in range(k):  # x (the innermost axis) pairs with theta's column 0
                total = total + theta(n, j, a).astype(acc) * coordinate(k - 1 - a, p[k - 1 - a])
            return total.astype(dtype)

        return te.compute(self.results[0].type.shape, body, name="affine_grid")


OPS = [GridSample, AffineGrid]
