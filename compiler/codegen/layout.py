"""Channel-blocked storage between CPU kernels: a 4-D tensor that one kernel writes and others read may be
stored [N, C/c, H, W, c] (NCHW[c]c, c = the vector width in its dtype) instead of NCHW, as ONNX Runtime's
NchwcTransformer does. A conv then reads its input without packing it and writes its output a vector of
channels at a time without transposing it back, and a depthwise conv takes its channels in the lanes
at any row width. The graph IR, the interpreter and a model's arguments and results stay NCHW; only
the bytes of an arena buffer are arranged differently (C a multiple of c: the same size).

The choice is made per storage group (tensors that share bytes: a bordered buffer's tensors, an
output written in place over an input; `lower.read` finds them) and only where every kernel touching the group takes the
layout natively, as its schedule rule reports (`schedule_cpu.schedule`'s `native`). A kernel asked to
take a blocked tensor its rule cannot read natively still computes right (the parameter's layout is
transformed whatever the schedule), just slower; `assign` asks again until every group it keeps is
native everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from compiler.ir import Value
from dialects.mem import padded_strides

# GC_LAYOUT=nchw keeps every tensor NCHW (to measure what blocking gains; part of the compile cache's key).
ENABLED = os.environ.get("GC_LAYOUT", "").lower() != "nchw"


@dataclass(frozen=True)
class Blocked:
    """A kernel parameter stored channel-blocked: `c` channels a block, and the element strides of the
    5-D buffer where it is a bordered buffer's interior (None: compact, or the bordered buffer whole)."""

    c: int
    strides: tuple[int, ...] | None = None


def blocked_shape(shape, c: int) -> tuple[int, ...]:
    n, ch, h, w = shape
    return (int(n), int(ch) // c, int(h), int(w), c)


def blocked_pads(pads) -> list[int]:
    """4-D pads ([begin per dim..., end per dim...]) as the 5-D blocked buffer's: none on the lanes."""
    return [*pads[:4], 0, *pads[4:], 0]


def lanes_of(v: Value) -> int:
    from compiler.codegen.target import cpu

    return cpu().lanes(v.type.dtype.tvm)


def eligible(v: Value) -> int:
    """The block width `v` could be stored with, or 0: a floating 4-D tensor of more than one pixel whose
    channels whole vectors divide."""
    t = v.type
    # (A map of one pixel is stored alike either way: [N, C/c, 1, 1, c] is NCHW's byte order.)
    if t.rank != 4 or not t.dtype.is_float or t.size == 0 or t.shape[2] * t.shape[3] == 1:
        return 0
    c = lanes_of(v)
    return c if c > 1 and t.shape[1] % c == 0 else 0


def assign(planned, native: Callable[[object, dict[int, Blocked]], frozenset[int]]) -> dict[Value, int]:
    """The values of a planned function (`lower.Planned`) to store channel-blocked, with their block width.

    Its kernels' PrimFuncs are lowered (`const_ops` known); `native(k, proposal)` schedules kernel k with
    the parameters of `proposal` blocked and returns the parameter positions its rule took natively.
    Groups a kernel refuses are dropped, and every kernel whose proposal changed is asked again (a rule's
    answer for one parameter may depend on another: a conv whose output stays NCHW may take the pixel
    tile, which reads its input NCHW), until every kernel takes all it is given. The caller memoizes
    `native` by proposal: the last answers are the build's schedules."""
    kernels, group_of = planned.kernels, planned.groups
    returned = set(planned.f.results)
    candidates: dict[Value, int] = {}
    # Every launch's results, not only the built kernels': a concat whose operands' producers wrote
    # into its bytes runs no kernel, yet its tensor shares their layout (their storage group).
    for op in planned.launches:
        for v in op.results:
            c, p = eligible(v), planned.pads.get(v)
            spatial_border = p is None or not (p[0] or p[1] or p[4] or p[5])  # (none on batch or channels)
            if c and v not in returned and v not in planned.read_elsewhere and spatial_border:
                candidates[v] = c
    # A group is a candidate only whole, of one block width, its members differing in channels alone (a
    # concat's operands: each lies in the concat's blocked bytes at a whole channel block). A reshape view
    # that regroups the map ([1, 32, 4, 4] as [1, 16, 8, 4]) shares its operand's bytes in NCHW only.
    for members in {id(g): g for g in group_of.values()}.values():
        widths = {candidates.get(v, 0) for v in members}
        maps = {(v.type.shape[0], *v.type.shape[2:]) for v in members}
        if len(widths) != 1 or 0 in widths or len(maps) != 1:
            for v in members:
                candidates.pop(v, None)
    chosen = dict(candidates)
    while True:
        refused = set()
        for k in kernels:
            proposal = proposal_of(k, chosen)
            took = native(k, proposal) if proposal else frozenset()
            refused.update(v for i, v in _positions(k) if i in proposal and i not in took)
        if not refused:
            return chosen
        for v in refused:
            for u in group_of.get(v, [v]):
                chosen.pop(u, None)


def proposal_of(k, chosen: dict[Value, int]) -> dict[int, Blocked]:
    """Kernel k's parameters stored blocked under `chosen`, with the strides of bordered interiors."""
    out: dict[int, Blocked] = {}
    n_in = len(k.inputs)
    for i, v in _positions(k):
        c = chosen.get(v)
        if c is None:
            continue
        if i < n_in:
            p = k.in_pads[i] if i < len(k.in_pads) else None
            interior = p is not None and (i >= len(k.in_views) or k.in_views[i] != "whole")
        else:
            j = i - n_in - len(k.const_ops)
            p = k.out_pads[j] if j < len(k.out_pads) else None
            interior = p is not None
        strides = padded_strides(blocked_shape(v.type.shape, c), blocked_pads(p)) if interior else None
        out[i] = Blocked(c, strides)
    return out


def _positions(k) -> list[tuple[int, Value]]:
    """(PrimFunc parameter position, value) of the kernel's inputs and outputs (constants in between)."""
    n_in = len(k.inputs)
    first_out = n_in + len(k.const_ops)
    return [*enumerate(k.inputs), *((first_out + j, v) for j, v in enumerate(k.outputs))]
