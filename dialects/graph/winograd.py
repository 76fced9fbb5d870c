"""Winograd's minimal filtering F(m x m, 3 x 3) (Lavin and Gray, arXiv:1509.09308): a 3x3 stride-1
convolution as two transforms around a batched matmul.

    V = graph.winograd_input(x)       [T, P, C]   each tile of the padded input, B^T d B  (T = (m + 2)^2)
    M = graph.matmul(V, U)            [T, P, O]   U = G g G^T of the weights, [T, C, O], computed once
    y = graph.winograd_output(M, b)   [N, O, H', W']   A^T M A of each tile, cropped, + bias

P counts the output tiles (N x ceil(H'/m) x ceil(W'/m), image by image, row by row), m x m outputs each;
the multiplications of a tile drop from 9 m^2 to (m + 2)^2 per channel pair (4x fewer for m = 4). The
`winograd` pass (compiler/passes/winograd.py) writes convs with bound weights this way for the CPU; the
transform matrices are Cook-Toom's at TVM's interpolation points (tvm.topi.nn.winograd_util), whose
rounding error grows with m and with the channels summed: F(4, 3) in f32 is about 2e-6 of the outputs'
magnitude at 64 input channels, 4e-6 at 256.
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from compiler.ir import Op, TensorType, Value, attribute, differ, kernel_shape, known, operand, shapes_differ
from dialects.graph.common import require_float, reshaped

if TYPE_CHECKING:
    from tvm import te

    from compiler.builder import Builder

TILES = (2, 3, 4, 5, 6)  # output tile sizes m with tabulated interpolation points


@cache
def matrices(m: int, r: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A [m+2, m], B [m+2, m+2], G [m+2, 3]) in float64: y = A^T ((G g G^T) * (B^T d B)) A."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    a, b, g = _cook_toom_convolution(_interpolation_points(m + r - 1), m, r)
    return np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64)


def weights(w: np.ndarray, m: int) -> np.ndarray:
    """U [T, C, O] = G g G^T of each 3x3 filter g of OIHW weights w, in w's dtype (computed in float64)."""
    g = matrices(m)[2]
    o, c = w.shape[:2]
    gg = np.einsum("ea,fb->efab", g, g).reshape((m + 2) ** 2, 9)
    # One matmul with the filters C-major, so that U comes out [T, C, O] as it lies (einsum over all six
    # indices took 0.6 s; transposing U after the product 0.3-0.5 s for 512x512 filters, this 0.05).
    wt = w.transpose(1, 0, 2, 3).reshape(c * o, 9).astype(np.float64)
    return (gg @ wt.T).reshape((m + 2) ** 2, c, o).astype(w.dtype)


def tiles(size: int, m: int) -> int:
    return -(-size // m)


def _check_tile(op: Op) -> None:
    if op.tile not in TILES:
        raise op.error(f"tile must be one of {list(TILES)}, got {op.tile}")


def _terms(coefficients, load) -> object:
    """sum_k c_k * load(k) over the nonzero c_k, with no multiplication by +-1 (TE expression)."""
    out = None
    for k, c in enumerate(coefficients):
        if c == 0:
            continue
        v = load(k)
        term = v if c == 1 else -v if c == -1 else v * float(c)
        out = term if out is None else out + term
    return out


def _choose(index, exprs: list) -> object:
    """exprs[index] for a symbolic index: a chain of selects, which the simplifier resolves once the
    schedule unrolls the index's loop (the CPU rules do)."""
    from tvm import tirx

    out = exprs[-1]
    for k in range(len(exprs) - 2, -1, -1):
        out = tirx.Select(index == k, exprs[k], out)
    return out


class WinogradInput(Op, name="graph.winograd_input"):
    """Each input tile's transform B^T d B, tiles of m + 2 rows and columns every m, read through the zero
    `padding` (and zeros past it, where m does not divide the output):
    %v = graph.winograd_input(%x) {tile = 4, padding = [1, 1, 1, 1]} : tensor<36x64x32xf32>"""
    precision = "follow"
    kind = "opaque"  # its own kernel: fused into a matmul it would be recomputed for every output channel
    x = operand()
    tile = attribute(int, 4)
    padding = attribute("ints", (0, 0, 0, 0))

    def padded_operand(self, index: int) -> tuple[int, ...] | None:
        """The border the tiles read: the padding, and below and right of it the zeros up to the last
        tile's edge where m does not divide the output (14x14 at m = 4: 3, not 1). From a buffer with that
        border the kernel reads every tile unguarded; with the padding's alone each load of the last tiles
        tested its row and column (ResNet-50's 14x14 input transform: 0.54 s of LLVM's time, 0.21 s now)."""
        if index != 0:
            return None
        pt, pl, pb, pr = self.padding
        if not all(known(d) for d in self.operands[0].type.shape[2:]):
            return (pt, pl, pb, pr)
        _, _, th, tw = self._grid()
        h, w = self.operands[0].type.shape[2:]
        return pt, pl, th * self.tile + 2 - h - pt, tw * self.tile + 2 - w - pl

    def _grid(self) -> tuple[int, int, int, int]:
        """(output rows, output columns, tile rows, tile columns) of the 3x3 stride-1 convolution."""
        n, c, h, w = self.operands[0].type.shape
        pt, pl, pb, pr = self.padding
        oh, ow = h + pt + pb - 2, w + pl + pr - 2
        return oh, ow, tiles(oh, self.tile), tiles(ow, self.tile)

    def infer(self, x: TensorType) -> TensorType:
        if x.rank != 4:
            raise self.error(f"x must be a 4-D NCHW tensor, got {x}")
        require_float(self, x, "x")
        _check_tile(self)
        if len(self.padding) != 4 or any(p < 0 for p in self.padding):
            raise self.error(f"padding must be 4 non-negative entries, got {list(self.padding)}")
        oh, ow, th, tw = self._grid()
        if any(known(d) and d < 1 for d in (oh, ow)):
            raise self.error(f"the padded {x.shape[2]}x{x.shape[3]} input is smaller than the 3x3 window")
        return x.with_shape(((self.tile + 2) ** 2, x.shape[0] * th * tw, x.shape[1]))

    def reference(self, x: np.ndarray) -> np.ndarray:
        m, (_, b, _) = self.tile, matrices(self.tile)
        n, c = x.shape[:2]
        _, _, th, tw = self._grid()
        pt, pl, _, _ = self.padding
        rows, cols = th * m + 2, tw * m + 2
        xp = np.zeros((n, c, rows, cols), np.float64)
        crop = x[:, :, : rows - pt, : cols - pl].astype(np.float64)
        xp[:, :, pt : pt + crop.shape[2], pl : pl + crop.shape[3]] = crop
        win = np.lib.stride_tricks.sliding_window_view(xp, (m + 2, m + 2), axis=(2, 3))[:, :, ::m, ::m]
        v = np.einsum("ae,bf,ncijab->efnijc", b, b, win)
        return v.reshape((m + 2) ** 2, n * th * tw, c)

    def lower(self, x: te.Tensor, padded: bool = False) -> te.Tensor:
        """Rows, then columns: S = B^T d of a tile, then V = S B (2 (m + 2)^2 (m + 2) products a tile and
        channel where the direct form takes (m + 2)^4). `padded`: x is the zero-bordered buffer whole."""
        from tvm import te, tirx

        m, (_, b, _) = self.tile, matrices(self.tile)
        a = m + 2
        n, c = kernel_shape(self.operands[0].type.shape[:2])
        _, _, th, tw = self._grid()
        pt, pl, pb, pr = self.padding
        rows, cols = th * m + 2, tw * m + 2  # the padded extent the tiles read
        dtype = str(x.dtype)
        if padded:  # x is [n, c, h + pt + pb, w + pl + pr]; rows and columns past it read as zeros
            hp, wp = (int(d) for d in x.shape[2:])

            def at(i, ch, r, q):
                past = [*([r < hp] if rows > hp else []), *([q < wp] if cols > wp else [])]
                if not past:
                    return x[i, ch, r, q]
                inside = past[0] if len(past) == 1 else tirx.all(*past)
                return tirx.if_then_else(inside, x[i, ch, tirx.min(r, hp - 1), tirx.min(q, wp - 1)],
                                         tirx.const(0, dtype))
        else:
            from tvm import topi

            h, w = (int(d) for d in x.shape[2:])
            xp = topi.nn.pad(x, (0, 0, pt, pl), (0, 0, max(rows - h - pt, 0), max(cols - w - pl, 0)), name="pad")

            def at(i, ch, r, q):
                return xp[i, ch, r, q]

        per_image = th * tw
        # [N, tile rows, tile columns, ...]: the CPU rule reads the tile grid from these extents.
        s = te.compute(
            (n, th, tw, a, a, c),
            lambda i, y, x, e, q, ch: _choose(e, [_terms(b[:, k], lambda r: at(i, ch, y * m + r, x * m + q))
                                                  for k in range(a)]),
            name="winograd_rows",
        )

        def tile(t, p, ch):
            i, y, x = p // per_image, p // tw % th, p % tw
            return _choose(t % a, [_terms(b[:, k], lambda q: s[i, y, x, t // a, q, ch]) for k in range(a)])

        return te.compute((a * a, n * per_image, c), tile, name="winograd_input")

    def flops(self) -> int:
        """Additions of the two passes over each tile (the multiplications by 1 are none)."""
        b = matrices(self.tile)[1]
        t, p, c = self.results[0].type.shape
        return 2 * int(np.count_nonzero(b)) * (self.tile + 2) * p * c

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """The transform is a convolution of each channel by T constant (m+2)x(m+2) kernels at stride m; its
        adjoint is that convolution's transpose: every tile's B dV B^T added back where the tile was read."""
        from dialects.graph.nn import _transposed_conv, _transposed_weights

        m, (_, bm, _) = self.tile, matrices(self.tile)
        a = m + 2
        n, c, h, w = self.operands[0].type.shape
        _, _, th, tw = self._grid()
        dtype = self.operands[0].type.dtype
        kernels = np.einsum("ae,bf->efab", bm, bm).reshape(a * a, 1, a, a)
        dv = reshaped(b, dys[0], (a * a, n, th, tw, c))
        dy = reshaped(b, b.transpose(dv, perm=[1, 4, 0, 2, 3]), (n * c, a * a, th, tw))
        wt = _transposed_weights(b, b.constant(kernels.astype(dtype.np), dtype), 1)
        dx = _transposed_conv(b, dy, wt, (n * c, 1, h, w), (m, m), self.padding[:2], (1, 1), 1)
        return [reshaped(b, dx, (n, c, h, w))]


class WinogradOutput(Op, name="graph.winograd_output"):
    """Each tile's outputs A^T M A from the products of the batched matmul, tiles laid side by side and
    cropped to `size` (the convolution's output rows and columns), plus the bias b:
    %y = graph.winograd_output(%m, %b) {tile = 4, size = [32, 32]} : tensor<1x64x32x32xf32>"""
    precision = "follow"
    kind = "out-elementwise-fusable"  # takes the conv's epilogue (relu, a residual add) as a conv does
    m = operand()
    b = operand(optional=True)
    tile = attribute(int, 4)
    size = attribute("ints")

    def _grid(self) -> tuple[int, int, int, int]:
        oh, ow = self.size
        return oh, ow, tiles(oh, self.tile), tiles(ow, self.tile)

    def infer(self, mt: TensorType, b: TensorType | None) -> TensorType:
        _check_tile(self)
        if mt.rank != 3 or differ(mt.shape[0], (self.tile + 2) ** 2):
            raise self.error(f"m must be [{(self.tile + 2) ** 2}, tiles, channels] for tile {self.tile}, got {mt}")
        require_float(self, mt, "m")
        if len(self.size) != 2 or min(self.size) < 1:
            raise self.error(f"size must be 2 positive entries (rows, columns), got {list(self.size)}")
        oh, ow, th, tw = self._grid()
        if known(mt.shape[1]) and mt.shape[1] % (th * tw):
            raise self.error(f"{mt.shape[1]} tiles are no whole number of {oh}x{ow} maps ({th * tw} tiles each)")
        o = mt.shape[2]
        if b is not None and (shapes_differ(b.shape, (o,)) or b.dtype != mt.dtype):
            raise self.error(f"bias must be tensor<{o}x{mt.dtype}>, got {b}")
        return mt.with_shape((mt.shape[1] // (th * tw), o, oh, ow))

    def reference(self, mt: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        m, (am, _, _) = self.tile, matrices(self.tile)
        oh, ow, th, tw = self._grid()
        o = mt.shape[2]
        n = mt.shape[1] // (th * tw)
        y = np.einsum("ei,fj,efnxyo->noxiyj", am, am, mt.astype(np.float64).reshape(m + 2, m + 2, n, th, tw, o))
        y = y.reshape(n, o, th * m, tw * m)[:, :, :oh, :ow]
        return y + b.astype(np.float64)[None, :, None, None] if b is not None else y

    def lower(self, mt: te.Tensor, b: te.Tensor | None) -> te.Tensor:
        """Columns, then rows: R = M A per tile row of the transform, then y = A^T R at each output."""
        from tvm import te

        m, (am, _, _) = self.tile, matrices(self.tile)
        a = m + 2
        oh, ow, th, tw = self._grid()
        n, o = kernel_shape(self.results[0].type.shape[:2])
        r = te.compute(
            (n, th, tw, a, m, o),
            lambda i, y, x, e, j, ch: _choose(j, [_terms(am[:, k], lambda f: mt[e * a + f, (i * th + y) * tw + x, ch])
                                                  for k in range(m)]),
            name="winograd_cols",
        )

        def at(i, ch, y, x):
            v = _choose(y % m, [_terms(am[:, k], lambda e: r[i, y // m, x // m, e, x % m, ch]) for k in range(m)])
            return v + b[ch] if b is not None else v

        return te.compute((n, o, oh, ow), at, name="winograd_output")

    def flops(self) -> int:
        a = matrices(self.tile)[0]
        t, p, o = self.operands[0].type.shape
        nz = int(np.count_nonzero(a))
        return 2 * nz * (self.tile + 2 + self.tile) * p * o + (math.prod(self.results[0].type.shape) if self.b is not None else 0)

    def grad(self, b: Builder, dys: list[Value | None]) -> list[Value | None]:
        """dM of each tile is A dY A^T of its m x m outputs (zeros past the crop): the tiles do not overlap,
        so it is a reshape and one matmul by the constant [T, m^2] matrix of A's products; db sums dY."""
        m, (am, _, _) = self.tile, matrices(self.tile)
        a = m + 2
        oh, ow, th, tw = self._grid()
        dy = dys[0]
        n, o = dy.type.shape[:2]
        dtype = dy.type.dtype
        if th * m > oh or tw * m > ow:
            dy = b.pad(dy, pads=[0, 0, 0, 0, 0, 0, th * m - oh, tw * m - ow])
        blocks = b.transpose(reshaped(b, dy, (n, o, th, m, tw, m)), perm=[3, 5, 0, 2, 4, 1])  # [m, m, n, th, tw, o]
        products = np.einsum("ei,fj->efij", am, am).reshape(a * a, m * m)
        dm = b.matmul(b.constant(products.astype(dtype.np), dtype), reshaped(b, blocks, (m * m, n * th * tw * o)))
        grads = [reshaped(b, dm, (a * a, n * th * tw, o))]
        return grads + ([b.reduce_sum(dys[0], axes=[0, 2, 3])] if self.b is not None else [])


OPS = [WinogradInput, WinogradOutput]
