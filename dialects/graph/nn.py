"""Neural-network ops: conv2d, pooling, normalization, softmax, dropout.

Layout is NCHW with OIHW weights; `padding` is [top, left, bottom, right]. Where ONNX leaves pooling's
`ceil_mode` open, the output size and divisors are PyTorch's.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import Op, TensorType, attribute, operand
from dialects.graph.common import normalize_axis, require_float, require_numeric, same_dtype


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


def _pool_out(size: int, kernel: int, stride: int, begin: int, end: int, ceil_mode: bool) -> int:
    """Output length along one axis, PyTorch's rule: the last window starts inside input or left padding."""
    span = size + begin + end - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + begin:
        out -= 1
    return out


# --- convolution --------------------------------------------------------------------------------


class Conv2d(Op, name="graph.conv2d"):
    """2-D convolution, NCHW x OIHW:  %y = graph.conv2d(%x, %w, %b) {padding = [1, 1, 1, 1]} : tensor<1x8x32x32xf32>"""

    kind = "out-elementwise-fusable"
    x = operand()
    w = operand()
    b = operand(optional=True)
    strides = attribute("ints", (1, 1))
    padding = attribute("ints", (0, 0, 0, 0))
    dilations = attribute("ints", (1, 1))
    groups = attribute(int, 1)

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
        if c != cg * g:
            raise self.error(f"x has {c} channels but w expects {cg} x groups {g} = {cg * g}")
        if o % g:
            raise self.error(f"w's {o} output channels are not divisible by groups {g}")
        if kh < 1 or kw < 1:
            raise self.error(f"the kernel must be at least 1x1, got {kh}x{kw}")
        if b is not None and b.shape != (o,):
            raise self.error(f"bias must have shape [{o}] (w's output channels), got {b}")
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.strides, self.dilations, self.padding
        ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
        if ho < 1 or wo < 1:
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

    def flops(self) -> int:
        _, w, b = self.operand_groups()
        y = self.results[0].type
        macs = y.size * w.type.shape[1] * w.type.shape[2] * w.type.shape[3]
        return 2 * macs + (y.size if b is not None else 0)


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
        if h + pt + pb < kh or w + pl + pr < kw:
            raise self.error(f"the {kh}x{kw} kernel is larger than the padded {h + pt + pb}x{w + pl + pr} input")
        ho = _pool_out(h, kh, sh, pt, pb, self.ceil_mode)
        wo = _pool_out(w, kw, sw, pl, pr, self.ceil_mode)
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

    def flops(self) -> int:
        kh, kw = self.kernel
        return self.results[0].type.size * kh * kw


class MaxPool2d(Pool2d, name="graph.max_pool2d"):
    """Max over windows, padding never wins:  %y = graph.max_pool2d(%x) {kernel = [2, 2]} : tensor<1x3x16x16xf32>"""

    def check_dtype(self, x: TensorType) -> None:
        require_numeric(self, x, "x")

    def reference(self, x: np.ndarray) -> np.ndarray:
        low = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        return self.windows(x, low, low).max(axis=(-2, -1))


class AvgPool2d(Pool2d, name="graph.avg_pool2d"):
    """Mean over windows:  %y = graph.avg_pool2d(%x) {kernel = [3, 3], strides = [1, 1]} : tensor<1x3x30x30xf32>"""

    count_include_pad = attribute(bool, False)

    def reference(self, x: np.ndarray) -> np.ndarray:
        total = self.windows(x.astype(np.float64), 0.0, 0.0).sum(axis=(-2, -1))
        # The divisor counts input cells, plus padding cells if asked; never a ceil-mode overhang past
        # the padded edge (as PyTorch).
        ones = np.ones((1, 1, *x.shape[2:]))
        count = self.windows(ones, 1.0 if self.count_include_pad else 0.0, 0.0).sum(axis=(-2, -1))
        return total / count

    def flops(self) -> int:
        kh, kw = self.kernel
        return self.results[0].type.size * (kh * kw + 1)



class GlobalAvgPool2d(Op, name="graph.global_avg_pool2d"):
    """Mean over H and W, kept as 1x1:  %y = graph.global_avg_pool2d(%x) : tensor<1x512x1x1xf32>"""

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

    def flops(self) -> int:
        return self.operands[0].type.size + self.results[0].type.size


# --- normalization ------------------------------------------------------------------------------


class BatchNorm(Op, name="graph.batch_norm"):
    """Inference batch norm, axis 1:  %y = graph.batch_norm(%x, %scale, %bias, %mean, %var) : tensor<8x16x4x4xf32>"""

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
            if t.shape != (c,):
                raise self.error(f"{name} must have shape [{c}] (the channels of x), got {t}")
        return x

    def reference(self, x: np.ndarray, *params: np.ndarray) -> np.ndarray:
        channel = (1, -1) + (1,) * (x.ndim - 2)
        scale, bias, mean, var = (p.astype(np.float64).reshape(channel) for p in params)
        return (x.astype(np.float64) - mean) / np.sqrt(var + self.epsilon) * scale + bias

    def input_range(self, index: int) -> tuple[float, float] | None:
        """A variance is positive: random inputs for it are drawn from this range."""
        return (0.5, 1.5) if index == 4 else None

    def flops(self) -> int:
        # Folded to one multiply-add per element once scale/sqrt(var + eps) is known.
        return 2 * self.operands[0].type.size


class LayerNorm(Op, name="graph.layer_norm"):
    """Normalize over dims axis..end:  %y = graph.layer_norm(%x, %scale, %bias) {axis = -1} : tensor<2x5x8xf32>"""

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
            if t.shape != dims:
                want = "[" + ", ".join(map(str, dims)) + "]"
                raise self.error(f"{name} must have shape {want} (x's dims from axis {self.axis}), got {t}")
        return x

    def reference(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        x = x.astype(np.float64)
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        return (x - mean) / np.sqrt(var + self.epsilon) * scale.astype(np.float64) + bias.astype(np.float64)

    def flops(self) -> int:
        # Mean, centre, square, sum, normalize, scale, shift: about eight per element.
        return 8 * self.operands[0].type.size


class Lrn(Op, name="graph.lrn"):
    """Local response norm across channels:  %y = graph.lrn(%x) {size = 5} : tensor<1x16x8x8xf32>"""

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

    def flops(self) -> int:
        # A square and a window sum per element, then scale, power and divide.
        return (self.size + 4) * self.operands[0].type.size


class Softmax(Op, name="graph.softmax"):
    """e^x / sum(e^x) along one axis:  %y = graph.softmax(%x) {axis = -1} : tensor<2x10xf32>"""

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

    def flops(self) -> int:
        # Max, subtract, exp, sum, divide.
        return 5 * self.operands[0].type.size


class LogSoftmax(Softmax, name="graph.log_softmax"):
    """x - log(sum(e^x)) along one axis:  %y = graph.log_softmax(%x) {axis = 1} : tensor<2x10xf32>"""

    def reference(self, x: np.ndarray) -> np.ndarray:
        z, log_sum = self.shifted(x)
        return z - log_sum


class Dropout(Op, name="graph.dropout"):
    """The identity at inference:  %y = graph.dropout(%x) {rate = 0.1} : tensor<4x8xf32>"""

    kind = "elementwise"
    x = operand()
    rate = attribute(float, 0.5)

    def infer(self, x: TensorType) -> TensorType:
        require_float(self, x, "x")
        if not 0.0 <= self.rate < 1.0:
            raise self.error(f"rate must be in [0, 1), got {self.rate}")
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x

    def flops(self) -> int:
        return 0


OPS = [Conv2d, MaxPool2d, AvgPool2d, GlobalAvgPool2d, BatchNorm, LayerNorm, Lrn, Softmax, LogSoftmax, Dropout]
