"""The `mem` dialect: where tensors live once memory is planned.

After `plan-memory`, every intermediate tensor of a function is a view into one arena at a fixed,
aligned offset; the function's results get buffers of their own (`mem.alloc`), which the caller owns.
Arguments and constants stay where they are. With `plan-memory{conv-borders=true}` (the CPU build), a
tensor that a padded convolution reads gets a buffer of its own with a zero border as wide as the
padding (`mem.alloc {pads = ...}`): its producer writes the interior, the border stays zero, and the
convolution reads the whole bordered buffer in place instead of copying its input padded every call.
With `plan-memory{borders-in-arena=true}` (the CPU build) such a tensor is a view of the arena instead
(`mem.view {pads = ...}`), its bytes shared with other tensors at other times: the kernel that writes it
writes its border's zeros too.

    %arena = mem.arena {size = 524288} : tensor<524288xi8>
    %t = mem.view(%arena) {offset = 262144} : tensor<64x1024xf32>
    %out = mem.alloc() : tensor<64x10xf32>
    %h = mem.alloc() {pads = [0, 0, 1, 1, 0, 0, 1, 1]} : tensor<1x32x32x32xf32>

On the reference interpreter the arena is one NumPy byte array and views alias it, so a plan that lets
two live tensors overlap computes wrong numbers there too.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.ir import Dialect, DType, Module, Op, TensorType, attribute, operand


class Arena(Op, name="mem.arena"):
    """One block of bytes for all intermediates:  %arena = mem.arena {size = 4096} : tensor<4096xi8>"""

    pure = False  # a fresh block each time: two arenas are never one
    size = attribute(int, doc="bytes")
    align = attribute(int, 64, doc="every view's offset is a multiple of it (64 for CPU vectors, 256 for CUDA)")

    def infer(self) -> TensorType:
        if self.size < 0:
            raise self.error(f"size must be non-negative, got {self.size}")
        if self.align < 1 or self.align & (self.align - 1):
            raise self.error(f"align must be a power of two, got {self.align}")
        return TensorType((self.size,), DType.i8)

    def interpret(self, module: Module, arrays: list[np.ndarray]) -> list[np.ndarray]:
        # 0xFF bytes are NaN in every float type: a read before its write shows up in the results.
        raw = np.full(self.size + self.align, 0xFF, np.uint8)
        start = -raw.ctypes.data % self.align
        return [raw[start : start + self.size].view(np.int8)]

    def flops(self) -> int:
        return 0


class View(Op, name="mem.view"):
    """A tensor at a byte offset in the arena:  %t = mem.view(%arena) {offset = 256} : tensor<8x8xf32>

    With `pads` (as mem.alloc's), the bytes from `offset` hold the tensor with a zero border around it
    (`padded_bytes` of them) and the tensor is their interior: a consumer may read the padded whole in
    place (a convolution with that padding). Other tensors use those bytes at other times, so the launch
    that writes the tensor writes the border's zeros as well as the interior."""

    arena = operand()
    offset = attribute(int, doc="bytes from the arena's start")
    pads = attribute("ints", (), doc="a zero border around the tensor: begin per dim, then end per dim")

    def infer(self, arena: TensorType) -> TensorType:
        t = _written_type(self)
        if arena.rank != 1 or arena.dtype != DType.i8:
            raise self.error(f"operand must be an arena (tensor<Nxi8>), got {arena}")
        _check_pads(self, t)
        size = padded_bytes(t, self.pads)
        if self.offset < 0 or self.offset + size > arena.shape[0]:
            what = f"{t} with pads {list(self.pads)}" if self.pads else str(t)
            raise self.error(f"bytes [{self.offset}, {self.offset + size}) of {what} lie outside the "
                             f"{arena.shape[0]}-byte arena")
        owner = self.operands[0].owner
        align = owner.align if isinstance(owner, Arena) else 1
        if self.offset % align:
            raise self.error(f"offset {self.offset} is not a multiple of the arena's alignment {align}")
        return t

    @property
    def padded_bytes(self) -> int:
        """The arena bytes the view covers, border included."""
        return padded_bytes(self.result.type, self.pads)

    def interpret(self, module: Module, arrays: list[np.ndarray]) -> list[np.ndarray]:
        t = self.result.type
        raw = arrays[0].view(np.uint8)[self.offset : self.offset + self.padded_bytes]
        whole = raw.view(t.dtype.np).reshape(padded_shape(t.shape, self.pads))
        return [whole[_interior(t, self.pads)] if self.pads else whole]

    def flops(self) -> int:
        return 0


class Alloc(Op, name="mem.alloc"):
    """A buffer of its own, outside the arena (a function result):  %r = mem.alloc() : tensor<64x10xf32>

    With `pads` ([begin per dim..., end per dim...], as graph.pad), the tensor is the interior of a
    larger buffer whose border is zero and stays zero: nothing but the tensor's interior is ever written
    there, so a consumer may read the padded whole (a convolution with that padding) in place."""

    pure = False
    pads = attribute("ints", (), doc="a zero border around the tensor: begin per dim, then end per dim")

    def infer(self) -> TensorType:
        t = _written_type(self)
        _check_pads(self, t)
        return t

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """The whole buffer's shape (the tensor's own without pads)."""
        return padded_shape(self.result.type.shape, self.pads)

    @property
    def padded_bytes(self) -> int:
        """The whole buffer's bytes, border included."""
        return padded_bytes(self.result.type, self.pads)

    def interpret(self, module: Module, arrays: list[np.ndarray]) -> list[np.ndarray]:
        t = self.result.type
        if not self.pads:
            return [np.full(t.shape, np.nan if t.dtype.is_float else 0).astype(t.dtype.np)]
        whole = np.zeros(self.padded_shape, t.dtype.np)
        inside = _interior(t, self.pads)
        whole[inside] = np.nan if t.dtype.is_float else 0  # a read before the write shows up
        return [whole[inside]]

    def flops(self) -> int:
        return 0


def _check_pads(op: Op, t: TensorType) -> None:
    if op.pads and (len(op.pads) != 2 * t.rank or min(op.pads) < 0):
        raise op.error(f"pads {list(op.pads)} must be {2 * t.rank} non-negative widths for {t}")


def _interior(t: TensorType, pads) -> tuple[slice, ...]:
    return tuple(slice(lo, lo + d) for d, lo in zip(t.shape, pads[: t.rank])) if pads else ()


def padded_shape(shape: tuple[int, ...], pads) -> tuple[int, ...]:
    """`shape` grown by `pads` ([begin per dim..., end per dim...]); `shape` itself without pads."""
    if not pads:
        return tuple(shape)
    r = len(shape)
    return tuple((int(d) if isinstance(d, (int, np.integer)) else d) + lo + hi for d, lo, hi in zip(shape, pads[:r], pads[r:]))


def padded_strides(shape: tuple[int, ...], pads) -> tuple[int, ...]:
    """Element strides of the whole padded buffer: those of the interior view of a bordered tensor."""
    out, step = [], 1
    for d in reversed(padded_shape(shape, pads)):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def padded_bytes(t: TensorType, pads) -> int:
    return math.prod(padded_shape(t.shape, pads)) * t.dtype.itemsize


def _written_type(op: Op) -> TensorType:
    """Views and allocations say their type; nothing else determines it."""
    types = [r.type for r in getattr(op, "results", [None])]
    if len(types) != 1 or types[0] is None:
        raise op.error("write the result type, e.g. `: tensor<64x1024xf32>`")
    return types[0]


OPS = [Arena, View, Alloc]
MEM = Dialect("mem", OPS)
