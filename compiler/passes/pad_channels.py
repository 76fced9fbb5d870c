"""pad-channels: a convolution whose output channels no vector divides computes a few zero channels more,
and a slice takes back the real ones (the CPU build; weights bound).

The CPU conv rule tiles output channels in vectors of 4, 8 or 16 lanes. ShuffleNetV2's first-stage 1x1
convs have 58 output channels (2 x 29): no multiple of 4, so they fell to the generic schedule (12 GFLOP/s,
765 us for 24 -> 58 channels at 56x56 on Zen 4). With the weights constants, conv2d(x, w, b) with O output
channels becomes slice(conv2d(x, w', b'), channels [0, O)), w' and b' padded with zeros to a multiple of
`multiple` channels: the padded conv takes the vector rule, and fuse puts the slice in its epilogue, so
the kernel writes only the O real channels (64 us). Channels that 4 divides but the register does not
are padded too where that adds at most `waste` of them: 116 = 4 x 29 took vectors of 4 lanes, a quarter
of an AVX-512 register (116 -> 116 at 28x28: 375 -> 150 us, ShuffleNetV2 4.28 -> 3.56 ms on Zen 4), and
1000 classes vectors of 8. On a CPU whose 512-bit FMAs run at the rate of 256-bit ones (`target.wide_fma`:
Zen 5 server, Intel Xeons; not Zen 4, which splits them in two halves) a half-register vector does half
the work a whole one would, so channels are padded where that adds up to half of them (`wide_waste`)
and each output sums enough products to be bound by its FMAs (`FMA_BOUND_SUM`):
EfficientNet-B0's 40-channel 1x1 convs at 28x28 took 8-lane vectors at 36-39% of this Zen 5's FMA peak;
padded to 48 their kernels take 0.55-0.65x the time, the model 0.96x (MobileNetV2's 24 -> 32: 0.98x).
Grouped convolutions, convolutions of fewer than 8 channels and weights passed per call are left alone.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from compiler.builder import Builder
from compiler.ir import Module, Value
from compiler.passes import Pass
from compiler.rewrite import rewrite
from dialects.graph import creation, nn

FMA_BOUND_SUM = 64  # products an output sums from which a conv counts as bound by its FMAs


def _constant(v: Value | None) -> bool:
    return v is None or isinstance(v.owner, creation.Constant)


@dataclass
class PadChannels(Pass):
    name = "pad-channels"
    summary = "pad a conv's output channels with zero weights to a multiple a vector divides, then slice"

    multiple: int = field(default=16, metadata={"help": "output channels are padded to a multiple of this"})
    waste: float = field(default=0.125, metadata={
        "help": "channels a multiple of 4 are padded too if that adds at most this fraction of them"})
    wide_waste: float = field(default=0.5, metadata={
        "help": "the same fraction where the CPU runs whole-register FMAs as fast as half ones (wide_fma)"})

    def run(self, module: Module) -> None:
        from compiler.codegen.target import wide_fma

        self._wide = wide_fma()
        padded: Counter = Counter()
        rewrite(module, [self.pad], padded)
        self.stats["convs-padded"] += sum(padded.values())

    def pad(self, op: nn.Conv2d, b: Builder) -> Value | None:
        if not isinstance(op, nn.Conv2d) or op.groups != 1 or not op.result.type.dtype.is_float:
            return None
        if not (_constant(op.w) and _constant(op.b)):
            return None
        o = op.result.type.shape[1]
        extra = -o % self.multiple
        # No vector of 4 divides it, or a few more channels make whole registers of it (116 -> 128).
        # On a wide FMA unit half registers halve a conv's FMA rate, which bounds it where each output sums
        # enough products; a short sum (an RGB stem's 27) is bound by its writes, which padding only adds to
        # (ShuffleNetV2's 3 -> 24 stem padded to 32: 70 -> 98 us on a Zen 5).
        fma_bound = self._wide and math.prod(op.w.type.shape[1:]) >= FMA_BOUND_SUM
        worth = o % 4 != 0 or extra <= o * (self.wide_waste if fma_bound else self.waste)
        if not extra or not worth or o < 8:
            return None
        w = op.w.owner.value.array
        weights = b.constant(np.concatenate([w, np.zeros((extra, *w.shape[1:]), w.dtype)]), op.w.type.dtype)
        bias = None
        if op.b is not None:
            c = op.b.owner.value.array
            bias = b.constant(np.concatenate([c, np.zeros(extra, c.dtype)]), op.b.type.dtype)
        b.loc = op.loc
        y = b.conv2d(op.x, weights, *([bias] if bias is not None else []), **op.attrs)
        out = b.slice(y, starts=[0], ends=[o], axes=[1])
        out.name = op.result.name
        return out
