"""winograd: a 3x3 stride-1 convolution with bound weights as Winograd's F(m x m, 3 x 3) (the CPU build).

conv2d(x, w, b) becomes winograd_output(matmul(winograd_input(x), U), b) with U = G w G^T computed here,
once, from the constant weights (dialects/graph/winograd.py). For m = 4 a tile's 16 outputs take 36
products per channel pair where the direct convolution takes 144; the batched matmul runs on the matmul
rule, and the transforms are memory-bound passes over the input and output. What the matmul saves must
pay for those passes and for U, which is 4x the weights' size: the pass leaves alone convolutions of
fewer than `min-tiles` tiles (late maps of a batch of one, where the weights outweigh the activations:
ResNet-50's 512 -> 512 at 7x7 ran slower; a batch that is a named size counts at the size the passes
run for, and a size on the other side of the bound gets a graph of its own: `ir.at_least`), and those
of few channels, whose transforms cost as much as their matmul (a first conv on RGB). Grouped, strided
and dilated convolutions, and weights passed per call, are left alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from compiler.builder import Builder
from compiler.diagnostics import GCError
from compiler.ir import DType, Module, Value, at_least, static
from compiler.passes import Pass
from compiler.rewrite import rewrite
from dialects.graph import creation, nn
from dialects.graph import winograd as wg


@dataclass
class Winograd(Pass):
    name = "winograd"
    summary = "3x3 stride-1 convs with bound weights as Winograd F(m, 3): two transforms around a batched matmul"

    tile: int = field(default=4, metadata={"help": "outputs per tile side, m (2 to 6)"})
    min_tiles: int = field(default=16, metadata={"help": "convs with fewer output tiles are left alone"})
    min_channels: int = field(default=16, metadata={"help": "convs with fewer input or output channels are left alone"})

    def __post_init__(self) -> None:
        if self.tile not in wg.TILES:
            raise GCError(f"pass 'winograd': tile must be one of {list(wg.TILES)}, got {self.tile}")

    def run(self, module: Module) -> None:
        done: Counter = Counter()
        rewrite(module, [self.convert], done)
        self.stats["convs-converted"] += sum(done.values())

    def convert(self, op: nn.Conv2d, b: Builder) -> Value | None:
        if not isinstance(op, nn.Conv2d) or op.groups != 1 or tuple(op.strides) != (1, 1) or tuple(op.dilations) != (1, 1):
            return None
        w = op.w
        if w.type.shape[2:] != (3, 3) or w.type.dtype != DType.f32 or not isinstance(w.owner, creation.Constant):
            return None
        o, c = w.type.shape[:2]
        n, _, oh, ow = op.result.type.shape
        m = self.tile
        if not static((oh, ow)):  # the output transform's size is an attribute
            return None
        if min(o, c) < self.min_channels:
            return None
        # A named batch is taken at the sizes the passes run for, a graph per side of the bound (ir.at_least);
        # one known only at run time otherwise has at least one image.
        tiles = wg.tiles(oh, m) * wg.tiles(ow, m)
        try:
            enough = at_least(n * tiles, self.min_tiles)
        except TypeError:
            enough = tiles >= self.min_tiles
        if not enough:
            return None
        b.loc = op.loc
        u = b.constant(wg.weights(w.owner.value.array, m), w.type.dtype)
        v = b.winograd_input(op.x, tile=m, padding=list(op.padding))
        y = b.winograd_output(b.matmul(v, u), *([op.b] if op.b is not None else []), tile=m, size=[oh, ow])
        y.name = op.result.name
        return y
