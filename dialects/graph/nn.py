"""Neural-network ops: conv2d, pooling, normalization, softmax, dropout.

Layout is NCHW with OIHW weights; `padding` is [top, left, bottom, right]. Where ONNX leaves pooling's
`ceil_mode` open, the output size and divisors are PyTorch's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import DYN, Op, TensorType, Value, attribute, differ, kernel_shape, known, operand, shapes_differ
from dialects.graph.common import (
    dilate,
    extreme_reducer,
    normalize_axis,
    pad_or_crop,
    require_float,
    require_numeric,
    reshaped,
    same_dtype,
    same_type,
    scalar,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tvm import te

    from compiler.builder import Builder


# --- attribute checks shared by conv and pooling ----------------------------------------------------


def _check_ints(op: Op, name: str, values: tuple[int, ...], count: int, least: int) -> None:
    """`values` has `count` entries, each at least `least`."""
    if len(values) != count:
        raise op.error(f"{name} must have {count} entries, got {len(values)}: {list(values)}")
    if any(v < least for v in values):
        raise op.error(f"{name} must be {'positive' if least > 0 else 'non-negative'}, got {list(values)}")


def _require_nchw(op: Op, x: TensorType, what: str = "x") -> None:
    if x.rank != 4:
        raise op.error(f"{what} must be a 4-D NCHW tensor, got {x}")


def pool_out(size: int, kernel: int, stride: int, begin: int, end: int, ceil_mode: bool) -> int:
    """Output length along one axis, PyTorch's rule: the last window starts inside input or left padding."""
    span = size + begin + end - kernel
    if not known(span):  # a named map size: the floor rule as an expression (ceil mode compares sizes)
        return DYN if span is DYN or ceil_mode else span // stride + 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + begin:
        out -= 1
    return out


# --- lowering helpers (TVM is imported inside lowerings only, so that `gc run` starts fast) -----------


def _compute_dtype(dtype: str) -> str:
    """Arithmetic type of a lowering: f16/bf16 compute in f32 as the reference does, the rest as they are.

    Takes str(x.dtype): a te.Tensor's dtype is a PrimType, which never equals a string."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def _window_count(
    size: int, kernel: int, stride: int, begin: int, end: int, n_out: int, with_pad: bool
) -> Callable:
    """Cells one pooling window covers along one axis, as a function of the output index.

    The window starts at o*stride - begin and stops at the padded edge (with_pad) or at the input's edge;
    a constant when every window covers the same number of cells (no padding, no ceil-mode overhang)."""
    from tvm import tirx

    lo, hi = (-begin, size + end) if with_pad else (0, size)
    counts = {min(o * stride - begin + kernel, hi) - max(o * stride - begin, lo) for o in range(n_out)}
    if len(counts) == 1:
        same = tirx.const(counts.pop(), "int32")
        return lambda o: same
    return lambda o: tirx.min(o * stride - begin + kernel, hi) - tirx.max(o * stride - begin, lo)


# --- convolution --------------------------------------------------------------------------------


class Conv2d(Op, name="graph.conv2d"):
    """2-D convolution, NCHW x OIHW:  %y = graph.conv2d(%x, %w, %b) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>"""
    precision = "low"
    weight_operands = (1,)

    kind = "out-elementwise-fusable"
    x = operand()
    w = operand()
    b = operand(optional=True)
    strides = attribute("ints", (1, 1))
    padding = attribute("ints", (0, 0, 0, 0))
    dilations = attribute("ints", (1, 1))
    groups = attribute(int, 1)

    def fan_in(self, index: int, shape: tuple[int, ...]) -> int | None:
        """C/groups x KH x KW of an OIHW weight."""
        return max(math.prod(shape[1:]), 1) if index == 1 and len(shape) >= 2 else None

    def padded_operand(self, index: int) -> tuple[int, ...] | None:
        """The input is read through its zero padding: from a zero-bordered buffer it needs none."""
        return tuple(self.padding) if index == 0 else None

    def infer(self, x: TensorType, w: TensorType, b: TensorType | None) -> TensorType:
        _require_nchw(self, x)
        if w.rank != 4:
            raise self.error(f"w must be a 4-D OIHW tensor, got {w}")
        same_dtype(self, *(t for t in (x, w, b) if t is not None))
        require_numeric(self, x, "x")
        _check_ints(self, "strides", self.strides, 2, 1)
        _check_ints(self, "padding", self.padding, 4, 0)
        _check_ints(self, "dilations", self.dilations, 2, 1)
        g = self.groups
        if g < 1:
            raise self.error(f"groups must be positive, got {g}")
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        if differ(c, cg * g):
            raise self.error(f"x has {c} channels but w expects {cg} x groups {g} = {cg * g}")
        if known(o) and o % g:
            raise self.error(f"w's {o} output channels are not divisible by groups {g}")
        if any(known(k) and k < 1 for k in (kh, kw)):
            raise self.error(f"the kernel must be at least 1x1, got {kh}x{kw}")
        if b is not None and (b.rank != 1 or differ(b.shape[0], o)):
            raise self.error(f"bias must have shape [{o}] (w's output channels), got {b}")
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.strides, self.dilations, self.padding
        ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
        if any(known(d) and d < 1 for d in (ho, wo)):
            raise self.error(
                f"output size {ho}x{wo} is not positive: the dilated {kh}x{kw} kernel is larger than "
                f"the padded {h + pt + pb}x{wd + pl + pr} input"
            )
        return x.with_shape((n, o, ho, wo))

    def reference(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        acc = np.float64 if np.issubdtype(x.dtype, np.floating) else np.int64
        n, o, ho, wo = self.results[0].type.shape
        _, cg, kh, kw = w.shape
        g = self.groups
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.strides, self.dilations, self.padding
        xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        xg = xp.reshape(n, g, cg, *xp.shape[2:])
        wg = w.astype(acc).reshape(g, o // g, cg, kh, kw)
        y = np.zeros((n, g, o // g, ho, wo), dtype=acc)
        # One kernel tap at a time: the input pixels it meets form a strided slice of the padded input.
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + (ho - 1) * sh + 1, sh)
                cols = slice(j * dw, j * dw + (wo - 1) * sw + 1, sw)
                y += np.einsum("ngchw,goc->ngohw", xg[:, :, :, rows, cols], wg[:, :, :, i, j])
        y = y.reshape(n, o, ho, wo)
        if b is not None:
            y = y + b.astype(acc)[None, :, None, None]
        return y

    def lower(self, x: te.Tensor, w: te.Tensor, b: te.Tensor | None, padded: bool = False) -> te.Tensor:
        """`padded`: x arrives with the padding in place already (a zero-bordered buffer, plan-memory's
        conv-borders), so no pad stage copies it."""
        from tvm import te, topi

        dtype = str(x.dtype)
        # Small integers and half floats accumulate wider, then wrap/round back as the reference's cast does.
        acc = "int32" if dtype == "int8" else _compute_dtype(dtype)
        n, o, ho, wo = kernel_shape(self.results[0].type.shape)
        _, cg, kh, kw = self.operands[1].type.shape
        og = o // self.groups
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.strides, self.dilations, self.padding
        if any(self.padding) and not padded:
            x = topi.nn.pad(x, (0, 0, pt, pl), (0, 0, pb, pr), name="pad")
        rc = te.reduce_axis((0, cg), name="rc")
        ry = te.reduce_axis((0, kh), name="ry")
        rx = te.reduce_axis((0, kw), name="rx")

        def tap(i, oc, oh, ow):
            c = rc if self.groups == 1 else oc // og * cg + rc
            return x[i, c, oh * sh + ry * dh, ow * sw + rx * dw].astype(acc) * w[oc, rc, ry, rx].astype(acc)

        y = te.compute((n, o, ho, wo), lambda *i: te.sum(tap(*i), axis=[rc, ry, rx]), name="conv2d")
        if b is None and acc == dtype:
            return y
        # The epilogue stays a stage of its own, so a schedule can fold it into the reduction's write-back.
        bias = (lambda oc: b[oc].astype(acc)) if b is not None else (lambda oc: 0)
        return te.compute(y.shape, lambda i, oc, oh, ow: (y[i, oc, oh, ow] + bias(oc)).astype(dtype), name="conv2d_out")

    def flops(self) -> int:
        _, w, b = self.operand_groups()
        y = self.results[0].type
        macs = y.size * w.type.shape[1] * w.type.shape[2] * w.type.shape[3]
        return 2 * macs + (y.size if b is not None else 0)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """dx: the transposed convolution of dy; dw: a convolution of x by dy; dbias: dy summed per channel."""
        dy = dys[0]
        x, w, bias = self.operand_groups()
        dx = _transposed_conv(b, dy, _transposed_weights(b, w, self.groups), x.type.shape, self.strides,
                              self.padding[:2], self.dilations, self.groups)
        grads = [dx, _conv_weight_grad(self, b, dy)]
        return grads + ([b.reduce_sum(dy, axes=[0, 2, 3])] if bias is not None else [])


# --- gradients of convolution and pooling, written with v1 ops -----------------------------------------


def _transposed_weights(b: Builder, w: Value, groups: int) -> Value:
    """w [O, C/g, kh, kw] as [C, O/g, kh, kw] with its taps flipped: the weights of the convolution that
    carries a gradient from the output channels back to the input channels (within each group)."""
    o, cg, kh, kw = w.type.shape
    if groups == 1:
        t = b.transpose(w, perm=[1, 0, 2, 3])
    else:
        per_group = reshaped(b, w, [groups, o // groups, cg, kh, kw])
        t = reshaped(b, b.transpose(per_group, perm=[0, 2, 1, 3, 4]), [groups * cg, o // groups, kh, kw])
    flip = [a for a, k in ((2, kh), (3, kw)) if k > 1]
    if not flip:
        return t
    n = len(flip)
    return b.slice(t, starts=[-1] * n, ends=[-w.type.shape[a] - 1 for a in flip], axes=flip, steps=[-1] * n)


def _transposed_conv(
    b: Builder, dy: Value, wt: Value, x_shape: tuple[int, ...], strides, begin, dilations, groups: int
) -> Value:
    """The input gradient of a conv2d (x_shape input, `strides`, top/left padding `begin`, `dilations`) of
    output gradient dy, given its transposed weights wt [C, O/g, kh, kw]: dy dilated by the strides, then
    a stride-1 convolution whose padding lines the taps up with the input (cropping where it cannot)."""
    _, _, kh, kw = wt.type.shape
    _, _, ho, wo = dy.type.shape
    spread = dilate(b, dy, {2: strides[0], 3: strides[1]})  # element k at k * stride, length n * stride
    # Output q of the convolution is input row q when the padding before it is (k - 1) * dilation - begin.
    before = [(k - 1) * d - p for k, d, p in zip((kh, kw), dilations, begin)]
    after = [size - n * s + p for size, n, s, p in zip(x_shape[2:], (ho, wo), strides, begin)]
    padding = [max(v, 0) for v in before + after]
    y = b.conv2d(spread, wt, padding=padding, dilations=list(dilations), groups=groups)
    crop = [min(v, 0) for v in before + after]
    return pad_or_crop(b, y, [0, 0, crop[0], crop[1], 0, 0, crop[2], crop[3]])


def _conv_weight_grad(op: Conv2d, b: Builder, dy: Value) -> Value:
    """dw[o, c, i, j] = sum over n, oh, ow of dy[n, o, oh, ow] x[n, c, oh*s + i*d, ...]: a convolution with
    the batch as channels, x per channel as the batch and dy as the weights, strides and dilations swapped."""
    x = op.x
    n, _, h, w = x.type.shape
    o, cg, kh, kw = op.w.type.shape
    _, _, ho, wo = dy.type.shape
    g = op.groups
    (sh, sw), (dh, dw), (pt, pl, _, _) = op.strides, op.dilations, op.padding
    if g == 1:
        xt, dyt = b.transpose(x, perm=[1, 0, 2, 3]), b.transpose(dy, perm=[1, 0, 2, 3])
    else:  # channels (group, batch), group-major, so that each group meets its own outputs
        xt = b.transpose(reshaped(b, x, [n, g, cg, h, w]), perm=[2, 1, 0, 3, 4])
        xt = reshaped(b, xt, [cg, g * n, h, w])
        dyt = b.transpose(reshaped(b, dy, [n, g, o // g, ho, wo]), perm=[1, 2, 0, 3, 4])
        dyt = reshaped(b, dyt, [o, n, ho, wo])
    # Only as much bottom/right padding as the last tap reads: rows past it never met a weight.
    bottom = max(0, (kh - 1) * dh + (ho - 1) * sh + 1 - h - pt)
    right = max(0, (kw - 1) * dw + (wo - 1) * sw + 1 - w - pl)
    r = b.conv2d(xt, dyt, strides=[dh, dw], padding=[pt, pl, bottom, right], dilations=[sh, sw], groups=g)
    r = b.transpose(r, perm=[1, 0, 2, 3])
    if r.type.shape[2:] != (kh, kw):  # a floor-divided output leaves rows that read only the end padding
        r = b.slice(r, starts=[0, 0], ends=[kh, kw], axes=[2, 3])
    return r


def _place(b: Builder, full: Value, x_shape: tuple[int, ...], begin) -> Value:
    """A gradient over the padded input's rows and columns from 0 on, cut (or zero-extended) to x's own."""
    _, _, h, w = x_shape
    _, _, hp, wp = full.type.shape
    pt, pl = begin
    return pad_or_crop(b, full, [0, 0, -pt, -pl, 0, 0, h + pt - hp, w + pl - wp])


def _interleave(b: Builder, block: Value, x_shape: tuple[int, ...], strides, begin) -> Value:
    """The gradient of windows that do not overlap (stride >= kernel): block [N, C, Ho, kh, Wo, kw] holds each
    window's cells, which lie side by side in the input once padded to the strides."""
    n, c, ho, kh, wo, kw = block.type.shape
    sh, sw = strides
    block = pad_or_crop(b, block, [0] * 6 + [0, 0, 0, sh - kh, 0, sw - kw])
    return _place(b, reshaped(b, block, [n, c, ho * sh, wo * sw]), x_shape, begin)


def _pool_count(op: AvgPool2d) -> np.ndarray:
    """The divisor of each avg_pool2d window [1, 1, Ho, Wo], exactly as the reference counts it."""
    ones = np.ones((1, 1, *op.x.type.shape[2:]))
    return op.windows(ones, 1.0 if op.count_include_pad else 0.0, 0.0).sum(axis=(-2, -1))


# --- pooling --------------------------------------------------------------------------------------


class Pool2d(Op):
    """Base of max_pool2d and avg_pool2d: window attributes, output size, padded windows."""

    kind = "out-elementwise-fusable"
    x = operand()
    kernel = attribute("ints")
    strides = attribute("ints", None, doc="the kernel if absent")
    padding = attribute("ints", (0, 0, 0, 0))
    ceil_mode = attribute(bool, False)

    @property
    def window_strides(self) -> tuple[int, ...]:
        return self.strides if self.strides is not None else self.kernel

    def infer(self, x: TensorType) -> TensorType:
        _require_nchw(self, x)
        self.check_dtype(x)
        _check_ints(self, "kernel", self.kernel, 2, 1)
        _check_ints(self, "strides", self.window_strides, 2, 1)
        _check_ints(self, "padding", self.padding, 4, 0)
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.window_strides, self.padding
        # As ONNX Runtime demands: otherwise a window could lie wholly in the padding.
        if max(pt, pb) >= kh or max(pl, pr) >= kw:
            raise self.error(f"padding {list(self.padding)} must be smaller than the kernel {kh}x{kw}")
        n, c, h, w = x.shape
        if (known(h) and h + pt + pb < kh) or (known(w) and w + pl + pr < kw):
            raise self.error(f"the {kh}x{kw} kernel is larger than the padded {h + pt + pb}x{w + pl + pr} input")
        ho = pool_out(h, kh, sh, pt, pb, self.ceil_mode)
        wo = pool_out(w, kw, sw, pl, pr, self.ceil_mode)
        return x.with_shape((n, c, ho, wo))

    def check_dtype(self, x: TensorType) -> None:
        require_float(self, x, "x")

    def windows(self, x: np.ndarray, pad_value, overhang_value) -> np.ndarray:
        """[N, C, Ho, Wo, kh, kw]: every window of x padded with `pad_value`.

        In ceil mode the last window may run past the bottom/right padding; it reads `overhang_value` there."""
        _, _, ho, wo = self.results[0].type.shape
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.window_strides, self.padding
        xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=pad_value)
        more_h = max(0, (ho - 1) * sh + kh - xp.shape[2])
        more_w = max(0, (wo - 1) * sw + kw - xp.shape[3])
        xp = np.pad(xp, ((0, 0), (0, 0), (0, more_h), (0, more_w)), constant_values=overhang_value)
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
        return win[:, :, ::sh, ::sw][:, :, :ho, :wo]

    def padded(self, x: te.Tensor, value: float) -> te.Tensor:
        """TE twin of `windows`: x padded with `value` so that every window of the output reads inside it,
        a ceil-mode window running past the bottom/right padding included."""
        from tvm import topi

        _, _, h, w = self.operands[0].type.shape
        _, _, ho, wo = self.results[0].type.shape
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.window_strides, self.padding
        bottom = max(pb, (ho - 1) * sh + kh - (h + pt))
        right = max(pr, (wo - 1) * sw + kw - (w + pl))
        if not (pt or pl or bottom or right):
            return x
        return topi.nn.pad(x, (0, 0, pt, pl), (0, 0, bottom, right), pad_value=value, name="pad")

    def window_axes(self) -> tuple:
        from tvm import te

        kh, kw = self.kernel
        return te.reduce_axis((0, kh), name="rh"), te.reduce_axis((0, kw), name="rw")

    def flops(self) -> int:
        kh, kw = self.kernel
        return self.results[0].type.size * kh * kw


class MaxPool2d(Pool2d, name="graph.max_pool2d"):
    """Max over windows, padding never wins:  %y = graph.max_pool2d(%x) {kernel = [2, 2]} : tensor<1x3x16x16xf32>"""
    precision = "follow"

    def check_dtype(self, x: TensorType) -> None:
        require_numeric(self, x, "x")

    def reference(self, x: np.ndarray) -> np.ndarray:
        low = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        return self.windows(x, low, low).max(axis=(-2, -1))

    def lower(self, x: te.Tensor) -> te.Tensor:
        from tvm import te, tirx

        # -inf (not the lowest finite float) so that a window of -inf inputs stays -inf.
        dtype = str(x.dtype)
        low = tirx.const(float("-inf"), dtype) if "float" in dtype else te.min_value(dtype)
        xp = self.padded(x, low)
        (sh, sw), (rh, rw) = self.window_strides, self.window_axes()
        shape = kernel_shape(self.results[0].type.shape)
        # bf16 compares in f32 (exactly: a max picks one of its inputs), as every bf16 op computes: TVM's
        # bf16 legalization leaves a vectorized select of bf16 values unlowered.
        acc = "float32" if dtype.startswith("bfloat") else dtype
        top = extreme_reducer(acc)
        pool = te.compute(
            shape, lambda n, c, i, j: top(xp[n, c, i * sh + rh, j * sw + rw].astype(acc), axis=[rh, rw]),
            name="max_pool2d",
        )
        return pool if acc == dtype else te.compute(shape, lambda *i: pool(*i).astype(dtype), name="max_pool2d_round")

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """Each window's dy goes to its first maximum in row-major order (PyTorch's pick among ties): one
        strided read of x per kernel tap, equal to the result and not already taken by an earlier tap."""
        dy, x, y = dys[0], self.x, self.result
        n, c, h, w = x.type.shape
        _, _, ho, wo = y.type.shape
        (kh, kw), (sh, sw), (pt, pl, _, _) = self.kernel, self.window_strides, self.padding
        # x padded with -inf (never a maximum) to the rows and columns the windows read, as the reference.
        span_h, span_w = (ho - 1) * sh + kh, (wo - 1) * sw + kw
        low = float("-inf")
        xp = b.pad(b.pad(x, pads=[0, 0, pt, pl, 0, 0, 0, 0], value=low) if pt or pl else x,
                   pads=[0, 0, 0, 0, 0, 0, max(span_h - h - pt, 0), max(span_w - w - pl, 0)], value=low)
        one = scalar(b, 1, dy)
        free = None  # 1 where no earlier tap was the window's maximum
        taps = {}
        for i in range(kh):
            for j in range(kw):
                tap = b.slice(xp, starts=[i, j], ends=[i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1], axes=[2, 3],
                              steps=[sh, sw])
                hit = b.cast(b.equal(tap, y), dtype=y.type.dtype)
                first = hit if free is None else b.mul(hit, free)
                if (i, j) != (kh - 1, kw - 1):
                    free = b.sub(one if free is None else free, first)
                taps[i, j] = b.mul(dy, first)
        if sh >= kh and sw >= kw:  # windows do not overlap: the taps interleave
            cell = [n, c, ho, 1, wo, 1]
            rows = [b.concat(*(reshaped(b, taps[i, j], cell) for j in range(kw)), axis=5) for i in range(kh)]
            return [_interleave(b, b.concat(*rows, axis=3), x.type.shape, (sh, sw), (pt, pl))]
        total = None
        for (i, j), t in taps.items():
            spread = pad_or_crop(b, dilate(b, t, {2: sh, 3: sw}), [0, 0, i, j, 0, 0, 0, 0])
            placed = _place(b, spread, x.type.shape, (pt, pl))
            total = placed if total is None else b.add(total, placed)
        return [total]


class AvgPool2d(Pool2d, name="graph.avg_pool2d"):
    """Mean over windows:  %y = graph.avg_pool2d(%x) {kernel = [3, 3], strides = [1, 1]} : tensor<1x3x30x30xf32>"""
    precision = "follow"

    count_include_pad = attribute(bool, False)

    def reference(self, x: np.ndarray) -> np.ndarray:
        total = self.windows(x.astype(np.float64), 0.0, 0.0).sum(axis=(-2, -1))
        # The divisor counts input cells, plus padding cells if asked; never a ceil-mode overhang past
        # the padded edge (as PyTorch).
        ones = np.ones((1, 1, *x.shape[2:]))
        count = self.windows(ones, 1.0 if self.count_include_pad else 0.0, 0.0).sum(axis=(-2, -1))
        return total / count

    def lower(self, x: te.Tensor) -> te.Tensor:
        from tvm import te

        dtype = str(x.dtype)
        acc = _compute_dtype(dtype)
        xp = self.padded(x, 0.0)
        (_, _, h, w), (_, _, ho, wo) = self.operands[0].type.shape, self.results[0].type.shape
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.window_strides, self.padding
        (rh, rw), with_pad = self.window_axes(), self.count_include_pad
        total = te.compute(
            (*x.shape[:2], *kernel_shape((ho, wo))),
            lambda n, c, i, j: te.sum(xp[n, c, i * sh + rh, j * sw + rw].astype(acc), axis=[rh, rw]),
            name="avg_pool2d_sum",
        )
        count_h = _window_count(h, kh, sh, pt, pb, ho, with_pad)
        count_w = _window_count(w, kw, sw, pl, pr, wo, with_pad)
        return te.compute(
            total.shape,
            lambda n, c, i, j: (total[n, c, i, j] / (count_h(i) * count_w(j)).astype(acc)).astype(dtype),
            name="avg_pool2d",
        )

    def flops(self) -> int:
        kh, kw = self.kernel
        return self.results[0].type.size * (kh * kw + 1)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """dy / count spread evenly over each window: side by side when windows do not overlap, else the
        transposed depthwise convolution with a kernel of ones."""
        x, dy = self.x, dys[0]
        n, c, _, _ = x.type.shape
        _, _, ho, wo = dy.type.shape
        (kh, kw), (sh, sw), (pt, pl, _, _) = self.kernel, self.window_strides, self.padding
        count = _pool_count(self)
        uniform = (count == count.flat[0]).all()
        g = b.div(dy, b.constant(count.flat[0] if uniform else count, dy.type.dtype))
        if sh >= kh and sw >= kw:
            cells = b.broadcast_to(reshaped(b, g, [n, c, ho, 1, wo, 1]), shape=[n, c, ho, kh, wo, kw])
            return [_interleave(b, cells, x.type.shape, (sh, sw), (pt, pl))]
        ones = b.constant(np.ones((c, 1, kh, kw)), dy.type.dtype)
        return [_transposed_conv(b, g, ones, x.type.shape, (sh, sw), (pt, pl), (1, 1), c)]



class GlobalAvgPool2d(Op, name="graph.global_avg_pool2d"):
    """Mean over H and W, kept as 1x1:  %y = graph.global_avg_pool2d(%x) : tensor<1x512x1x1xf32>"""
    precision = "f32"

    kind = "out-elementwise-fusable"
    x = operand()

    def infer(self, x: TensorType) -> TensorType:
        _require_nchw(self, x)
        require_float(self, x, "x")
        if x.shape[2] * x.shape[3] == 0:
            raise self.error(f"x has no pixels to average: {x}")
        return x.with_shape((*x.shape[:2], 1, 1))

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64).mean(axis=(2, 3), keepdims=True)

    def lower(self, x: te.Tensor) -> te.Tensor:
        from tvm import te

        dtype = str(x.dtype)
        acc = _compute_dtype(dtype)
        n, c, h, w = self.operands[0].type.shape
        rh, rw = te.reduce_axis((0, h), name="rh"), te.reduce_axis((0, w), name="rw")
        total = te.compute((*x.shape[:2], 1, 1), lambda i, j, _h, _w: te.sum(x[i, j, rh, rw].astype(acc), axis=[rh, rw]),
                           name="global_avg_pool2d_sum")
        return te.compute(total.shape, lambda *i: (total(*i) / float(h * w)).astype(dtype), name="global_avg_pool2d")

    def flops(self) -> int:
        return self.operands[0].type.size + self.results[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        x = self.x.type
        g = b.div(dys[0], scalar(b, x.shape[2] * x.shape[3], dys[0]))
        return [b.broadcast_to(g, shape=x.shape)]


# --- normalization ------------------------------------------------------------------------------


class BatchNorm(Op, name="graph.batch_norm"):
    """Inference batch norm, axis 1:  %y = graph.batch_norm(%x, %scale, %bias, %mean, %var) : tensor<8x16x4x4xf32>"""
    precision = "f32"
    unit_operands = (1, 4)

    kind = "broadcast"
    x = operand()
    scale = operand()
    bias = operand()
    mean = operand()
    var = operand()
    epsilon = attribute(float, 1e-5)

    def infer(self, x: TensorType, *params: TensorType) -> TensorType:
        if x.rank < 2:
            raise self.error(f"x must have rank >= 2 (channels on axis 1), got {x}")
        same_dtype(self, x, *params)
        require_float(self, x, "x")
        c = x.shape[1]
        for name, t in zip(("scale", "bias", "mean", "var"), params):
            if shapes_differ(t.shape, (c,)):
                raise self.error(f"{name} must have shape [{c}] (the channels of x), got {t}")
        return x

    def reference(self, x: np.ndarray, *params: np.ndarray) -> np.ndarray:
        channel = (1, -1) + (1,) * (x.ndim - 2)
        scale, bias, mean, var = (p.astype(np.float64).reshape(channel) for p in params)
        return (x.astype(np.float64) - mean) / np.sqrt(var + self.epsilon) * scale + bias

    def lower(self, x: te.Tensor, *params: te.Tensor) -> te.Tensor:
        from tvm import te

        dtype = str(x.dtype)
        acc = _compute_dtype(dtype)
        scale, bias, mean, var = params

        def at(*i):
            c = i[1]
            inv_std = scale[c].astype(acc) / te.sqrt(var[c].astype(acc) + self.epsilon)
            return ((x(*i).astype(acc) - mean[c].astype(acc)) * inv_std + bias[c].astype(acc)).astype(dtype)

        return te.compute(x.shape, at, name="batch_norm")

    def input_range(self, index: int) -> tuple[float, float] | None:
        """A variance is positive: random inputs for it are drawn from this range."""
        return (0.5, 1.5) if index == 4 else None

    def flops(self) -> int:
        # Folded to one multiply-add per element once scale/sqrt(var + eps) is known.
        return 2 * self.operands[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """y = (x - mean) * inv * scale + bias with inv = 1/sqrt(var + eps): gradients for x and all four
        parameters (each summed over every axis but the channels)."""
        dy = dys[0]
        x, scale, _, mean, var = self.operands
        channel = (1, x.type.shape[1]) + (1,) * (x.type.rank - 2)
        axes = [a for a in range(x.type.rank) if a != 1]
        inv = b.rsqrt(b.add(var, scalar(b, self.epsilon, var)))
        gain = b.mul(scale, inv)
        sum_dy = b.reduce_sum(dy, axes=axes)
        sum_dy_xc = b.reduce_sum(b.mul(dy, b.sub(x, reshaped(b, mean, channel))), axes=axes)
        dx = b.mul(dy, reshaped(b, gain, channel))
        dscale = b.mul(sum_dy_xc, inv)
        dmean = b.neg(b.mul(sum_dy, gain))
        dvar = b.mul(b.mul(sum_dy_xc, scale), b.mul(scalar(b, -0.5, inv), b.mul(inv, b.mul(inv, inv))))
        return [dx, dscale, sum_dy, dmean, dvar]


class LayerNorm(Op, name="graph.layer_norm"):
    """Normalize over dims axis..end:  %y = graph.layer_norm(%x, %scale, %bias) {axis = -1} : tensor<2x5x8xf32>"""
    precision = "f32"
    unit_operands = (1,)

    kind = "reduction"
    x = operand()
    scale = operand()
    bias = operand()
    axis = attribute(int, -1)
    epsilon = attribute(float, 1e-5)

    def infer(self, x: TensorType, scale: TensorType, bias: TensorType) -> TensorType:
        if x.rank < 1:
            raise self.error(f"x must have rank >= 1, got {x}")
        axis = normalize_axis(self, self.axis, x.rank)
        same_dtype(self, x, scale, bias)
        require_float(self, x, "x")
        dims = x.shape[axis:]
        for name, t in (("scale", scale), ("bias", bias)):
            if shapes_differ(t.shape, dims):
                want = "[" + ", ".join(map(str, dims)) + "]"
                raise self.error(f"{name} must have shape {want} (x's dims from axis {self.axis}), got {t}")
        return x

    def reference(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        x = x.astype(np.float64)
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        return (x - mean) / np.sqrt(var + self.epsilon) * scale.astype(np.float64) + bias.astype(np.float64)

    def lower(self, x: te.Tensor, scale: te.Tensor, bias: te.Tensor) -> te.Tensor:
        from tvm import te

        dtype = str(x.dtype)
        acc = _compute_dtype(dtype)
        shape = kernel_shape(self.operands[0].type.shape)
        axis = self.axis % len(shape)
        lead, dims = shape[:axis], shape[axis:]
        count = float(np.prod(self.operands[0].type.shape[axis:]))  # (a number: over a size known at run time, a kernel of that size)

        def row_sum(expr, name):
            def at(*i):
                r = [te.reduce_axis((0, d), name=f"r{k}") for k, d in enumerate(dims)]
                return te.sum(expr(i, tuple(r)), axis=r)

            return te.compute(lead, at, name=name)

        # Two passes (the mean, then the squared deviations from it): E[x^2] - E[x]^2 in one pass
        # cancels catastrophically when |mean| >> std.
        total = row_sum(lambda i, r: x(*i, *r).astype(acc), "layer_norm_sum")

        def mean(*row):
            return total(*row) / count

        def square_dev(i, r):
            d = x(*i, *r).astype(acc) - mean(*i)
            return d * d

        square_devs = row_sum(square_dev, "layer_norm_square_devs")

        def at(*i):
            row, col = i[:axis], i[axis:]
            normed = (x(*i).astype(acc) - mean(*row)) / te.sqrt(square_devs(*row) / count + self.epsilon)
            return (normed * scale(*col).astype(acc) + bias(*col).astype(acc)).astype(dtype)

        return te.compute(shape, at, name="layer_norm")

    def flops(self) -> int:
        # Mean, centre, square, sum, normalize, scale, shift: about eight per element.
        return 8 * self.operands[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """With xhat = (x - mean) * inv and g = dy * scale: dx = inv * (g - mean(g) - xhat * mean(g * xhat))
        over the normalized dims; the statistics are recomputed from x."""
        dy, x = dys[0], self.x
        rank = x.type.rank
        axis = self.axis % rank
        norm, lead = list(range(axis, rank)), list(range(axis))
        mean = b.reduce_mean(x, axes=norm, keepdims=True)
        xc = b.sub(x, mean)
        var = b.reduce_mean(b.mul(xc, xc), axes=norm, keepdims=True)
        inv = b.rsqrt(b.add(var, scalar(b, self.epsilon, var)))
        xhat = b.mul(xc, inv)
        g = b.mul(dy, self.scale)
        centred = b.sub(g, b.reduce_mean(g, axes=norm, keepdims=True))
        dx = b.mul(inv, b.sub(centred, b.mul(xhat, b.reduce_mean(b.mul(g, xhat), axes=norm, keepdims=True))))
        dscale = b.mul(dy, xhat)
        if lead:  # never empty axes: reduce_sum reads them as every axis
            dscale, dy = b.reduce_sum(dscale, axes=lead), b.reduce_sum(dy, axes=lead)
        return [dx, dscale, dy]


class Lrn(Op, name="graph.lrn"):
    """Local response norm across channels:  %y = graph.lrn(%x) {size = 5} : tensor<1x16x8x8xf32>"""
    precision = "f32"

    kind = "opaque"
    x = operand()
    size = attribute(int)
    alpha = attribute(float, 1e-4)
    beta = attribute(float, 0.75)
    bias = attribute(float, 1.0)

    def infer(self, x: TensorType) -> TensorType:
        if x.rank < 2:
            raise self.error(f"x must have rank >= 2 (channels on axis 1), got {x}")
        require_float(self, x, "x")
        if self.size < 1:
            raise self.error(f"size must be positive, got {self.size}")
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        c = x.shape[1]
        # ONNX's window: floor((size-1)/2) channels before c, ceil((size-1)/2) after, clipped to the tensor.
        before, after = (self.size - 1) // 2, self.size // 2
        pads = [(0, 0)] * x.ndim
        pads[1] = (before, after)
        sq = np.pad(x * x, pads)
        square_sum = sum(sq[:, k : k + c] for k in range(self.size))
        return x / (self.bias + self.alpha / self.size * square_sum) ** self.beta

    def lower(self, x: te.Tensor) -> te.Tensor:
        from tvm import te, tirx

        dtype = str(x.dtype)
        acc = _compute_dtype(dtype)
        channels = self.operands[0].type.shape[1]
        before = (self.size - 1) // 2
        k = te.reduce_axis((0, self.size), name="k")

        def square(i, c):
            v = x(i[0], c, *i[2:]).astype(acc)
            return te.if_then_else(te.all(c >= 0, c < channels), v * v, tirx.const(0, acc))

        square_sum = te.compute(
            x.shape, lambda *i: te.sum(square(i, i[1] - before + k), axis=k), name="lrn_square_sum"
        )

        def at(*i):
            denom = te.power(self.bias + self.alpha / self.size * square_sum(*i), tirx.const(self.beta, acc))
            return (x(*i).astype(acc) / denom).astype(dtype)

        return te.compute(x.shape, at, name="lrn")

    def flops(self) -> int:
        # A square and a window sum per element, then scale, power and divide.
        return (self.size + 4) * self.operands[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """y = x d^-beta with d = bias + alpha/size * (window sum of x^2): dx = dy d^-beta - 2 alpha beta / size
        * x * (the transposed window sum of dy y / d), the window's before and after swapped."""
        dy, x, y = dys[0], self.x, self.result
        before, after = (self.size - 1) // 2, self.size // 2
        c = lambda v: scalar(b, v, x)
        d = b.add(c(self.bias), b.mul(c(self.alpha / self.size), _channel_window_sum(b, b.mul(x, x), before, after)))
        spread = _channel_window_sum(b, b.div(b.mul(dy, y), d), after, before)
        direct = b.mul(dy, b.pow(d, c(-self.beta)))
        return [b.sub(direct, b.mul(c(2 * self.alpha * self.beta / self.size), b.mul(x, spread)))]


def _channel_window_sum(b: Builder, v: Value, before: int, after: int) -> Value:
    """s[:, c] = v[:, c - before] + ... + v[:, c + after] (out of range reads 0), as lrn's window."""
    rank, channels = v.type.rank, v.type.shape[1]
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, after
    padded = b.pad(v, pads=pads) if before or after else v
    total = None
    for k in range(before + after + 1):
        part = b.slice(padded, starts=[k], ends=[k + channels], axes=[1]) if before or after else padded
        total = part if total is None else b.add(total, part)
    return total


def _row_max(dtype: str):
    from tvm import te, tirx

    if "float" not in dtype:
        return te.max
    return te.comm_reducer(lambda a, b: tirx.max(a, b), lambda t: tirx.const(float("-inf"), t), name="max")


class Softmax(Op, name="graph.softmax"):
    """e^x / sum(e^x) along one axis:  %y = graph.softmax(%x) {axis = -1} : tensor<2x10xf32>"""
    precision = "f32"

    kind = "reduction"
    x = operand()
    axis = attribute(int, -1)

    def infer(self, x: TensorType) -> TensorType:
        if x.rank < 1:
            raise self.error(f"x must have rank >= 1, got {x}")
        normalize_axis(self, self.axis, x.rank)
        require_float(self, x, "x")
        return x

    def shifted(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x minus its max along the axis (so exp cannot overflow), and the log of the sum of exps."""
        x = x.astype(np.float64)
        z = x - x.max(axis=self.axis, keepdims=True)
        return z, np.log(np.exp(z).sum(axis=self.axis, keepdims=True))

    def reference(self, x: np.ndarray) -> np.ndarray:
        z, log_sum = self.shifted(x)
        return np.exp(z - log_sum)

    def lower(self, x: te.Tensor) -> te.Tensor:
        from tvm import te

        dtype = str(x.dtype)
        acc = _compute_dtype(dtype)
        z, _ = self.shifted_te(x, acc)
        # exp(x - max) as a stage of its own, read by the sum and the quotient: the row schedule keeps it in
        # a row buffer rather than computing the exponential twice.
        e = te.compute(x.shape, lambda *i: te.exp(z(*i)), name="softmax_exp")
        sum_exp = self.row_sum_te(e)
        return te.compute(x.shape, lambda *i: (e(*i) / sum_exp(*self.row(i))).astype(dtype), name="softmax")

    def row_sum_te(self, e: te.Tensor) -> te.Tensor:
        from tvm import te

        shape = kernel_shape(self.operands[0].type.shape)
        axis = self.axis % len(shape)

        def at(*r):
            k = te.reduce_axis((0, shape[axis]), name="k")
            return te.sum(e(*r[:axis], k, *r[axis:]), axis=k)

        return te.compute(shape[:axis] + shape[axis + 1 :], at, name=f"{self.name.split('.')[-1]}_sum")

    def row(self, i: tuple) -> tuple:
        """The index of an element's row (the reduced tensor) from its full index."""
        axis = self.axis % len(i)
        return i[:axis] + i[axis + 1 :]

    def shifted_te(self, x: te.Tensor, acc: str) -> tuple[te.Tensor, te.Tensor]:
        """TE twin of `shifted`: x minus its row max, and the sum of exps of that (not yet its log)."""
        from tvm import te

        shape = kernel_shape(self.operands[0].type.shape)
        axis = self.axis % len(shape)
        rows = shape[:axis] + shape[axis + 1 :]

        def along(expr, name, reducer):
            def at(*r):
                k = te.reduce_axis((0, shape[axis]), name="k")
                return reducer(expr((*r[:axis], k, *r[axis:])), axis=k)

            return te.compute(rows, at, name=name)

        name = self.name.split(".")[-1]
        # The shift needs no NaN-aware max: a NaN anywhere in a row reaches the row's sum, so every output
        # of the row is NaN either way. The plain max (from -inf) is one the CPU rules can split into
        # vector lanes (12x197x208: 309 -> 115 us, Zen 4; rows of 197, prime, stay scalar: 481 -> 367 us).
        top = along(lambda i: x(*i).astype(acc), f"{name}_max", _row_max(acc))
        z = te.compute(shape, lambda *i: x(*i).astype(acc) - top(*self.row(i)), name=f"{name}_shifted")
        return z, along(lambda i: te.exp(z(*i)), f"{name}_sum", te.sum)

    def flops(self) -> int:
        # Max, subtract, exp, sum, divide.
        return 5 * self.operands[0].type.size

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        dy, y = dys[0], self.result
        return [b.mul(y, b.sub(dy, b.reduce_sum(b.mul(dy, y), axes=[self.axis], keepdims=True)))]


class LogSoftmax(Softmax, name="graph.log_softmax"):
    """x - log(sum(e^x)) along one axis:  %y = graph.log_softmax(%x) {axis = 1} : tensor<2x10xf32>"""
    precision = "f32"

    def reference(self, x: np.ndarray) -> np.ndarray:
        z, log_sum = self.shifted(x)
        return z - log_sum

    def lower(self, x: te.Tensor) -> te.Tensor:
        from tvm import te

        dtype = str(x.dtype)
        acc = _compute_dtype(dtype)
        z, sum_exp = self.shifted_te(x, acc)
        return te.compute(
            x.shape, lambda *i: (z(*i) - te.log(sum_exp(*self.row(i)))).astype(dtype), name="log_softmax"
        )

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        dy, y = dys[0], self.result
        return [b.sub(dy, b.mul(b.exp(y), b.reduce_sum(dy, axes=[self.axis], keepdims=True)))]


class Dropout(Op, name="graph.dropout"):
    """The identity at inference:  %y = graph.dropout(%x) {rate = 0.1} : tensor<4x8xf32>"""
    precision = "follow"

    kind = "elementwise"
    x = operand()
    rate = attribute(float, 0.5)

    def fold(self) -> Value | None:
        """dropout(x) -> x: gc compiles and interprets for inference, where dropout is the identity."""
        return same_type(self, self.x)

    def infer(self, x: TensorType) -> TensorType:
        require_float(self, x, "x")
        if not 0.0 <= self.rate < 1.0:
            raise self.error(f"rate must be in [0, 1), got {self.rate}")
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x

    def lower(self, x: te.Tensor) -> te.Tensor:
        return x

    def flops(self) -> int:
        return 0

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        return [dys[0]]  # the identity, as compiled and interpreted runs are


OPS = [Conv2d, MaxPool2d, AvgPool2d, GlobalAvgPool2d, BatchNorm, LayerNorm, Lrn, Softmax, LogSoftmax, Dropout]
