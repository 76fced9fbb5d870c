"""Placement: offsets in one arena for blocks of bytes with lifetimes, best fit over several orders
(TFLite's "greedy by size" and relatives), keeping the smallest arena, and keeping tensors one kernel
reads and writes apart modulo a page where that costs nothing."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.memory.liveness import lower_bound, round_up


@dataclass(eq=False)
class Block:
    """Bytes to place: one tensor, or several that share storage (an output written over its input)."""

    size: int
    start: int
    end: int
    offset: int = 0
    members: list = field(default_factory=list)  # the values stored here


# 4K aliasing: a load whose address equals an in-flight store's in the low 12 bits waits for that store
# (x86 compares only those bits first). A kernel that reads one arena tensor while writing another at the
# same offset modulo 4 KiB hits it on every element: a conv with a residual input runs 13% slower
# (32x32x32 maps: 156 -> 137 us). Tensors one kernel reads and writes are kept this far apart modulo a page.
PAGE = 4096


SKEW = 256


def place(blocks: list[Block], align: int, *, tries: int = 32, seed: int = 0,
          conflict: Callable[[Block, Block], bool] | None = None,
          apart: dict[Block, set[Block]] | None = None) -> int:
    """Give every block an offset (a multiple of `align`) so that blocks alive at the same step do not
    overlap; returns the arena size. Best fit over several orders: by size (TFLite's greedy by size),
    by start, by duration, by size x duration, then seeded shuffles of the size order while the result is
    above the lower bound. `conflict` replaces "alive at the same step" when steps may run concurrently.
    `apart` pairs blocks that one kernel accesses together: of two such blocks of a page or more, the
    later placed moves up (by `align` steps, in its gap if it still fits) until their offsets differ by
    at least SKEW bytes modulo PAGE. That costs a few hundred bytes of arena at most, and is given up
    where it would make the arena larger than a buffer per block (the plan never costs more memory
    than no plan)."""
    live = [b for b in blocks if b.size > 0]
    if not live:
        return 0
    best = _search(live, align, tries, seed, conflict or _overlap, apart or {})
    if apart and best[0] > sum(round_up(b.size, align) for b in live):
        plain = _search(live, align, tries, seed, conflict or _overlap, {})
        best = min(best, plain, key=lambda r: r[0])
    for b, off in zip(live, best[1]):
        b.offset = off
    for b in blocks:
        if b.size == 0:
            b.offset = 0
    return best[0]


def _search(live: list[Block], align: int, tries: int, seed: int, conflict: Callable[[Block, Block], bool],
            apart: dict[Block, set[Block]]) -> tuple[int, list[int]]:
    """The smallest arena best fit finds over the orders `place` describes, and the offsets of `live`."""
    bound = _round_up_bound(live, align)
    orders = [
        sorted(live, key=lambda b: (-b.size, b.start)),
        sorted(live, key=lambda b: (b.start, -b.size)),
        sorted(live, key=lambda b: (-(b.end - b.start), -b.size)),
        sorted(live, key=lambda b: (-b.size * (b.end - b.start + 1), b.start)),
    ]
    rng = random.Random(seed)
    best: tuple[int, list[int]] | None = None
    for i in range(len(orders) + tries):
        if i < len(orders):
            order = orders[i]
        else:
            if best is not None and best[0] <= bound:
                break
            order = sorted(live, key=lambda b: (-b.size * rng.uniform(0.5, 1.5), b.start))
        size, offsets = _best_fit(order, align, conflict, apart)
        if best is None or size < best[0]:
            best = (size, [offsets[b] for b in live])
    assert best is not None
    return best


def _round_up_bound(blocks: list[Block], align: int) -> int:
    return lower_bound([Block(round_up(b.size, align), b.start, b.end) for b in blocks])


def _overlap(a: Block, b: Block) -> bool:
    return a.start <= b.end and b.start <= a.end


def _best_fit(order: list[Block], align: int, conflict: Callable[[Block, Block], bool],
              apart: dict[Block, set[Block]]) -> tuple[int, dict[Block, int]]:
    """Place blocks in `order`, each in the smallest gap between blocks alive with it that fits."""
    placed: list[tuple[int, int, Block]] = []
    offsets: dict[Block, int] = {}
    top = 0
    for b in order:
        need = round_up(b.size, align)
        busy = sorted((o, o + s) for o, s, p in placed if conflict(p, b))
        partners = [offsets[p] for p in apart.get(b, ()) if p in offsets and p.size >= PAGE] if b.size >= PAGE else []
        best_off, best_gap, prev = None, None, 0
        for lo, hi in busy:
            gap = lo - prev
            # (the skew is looked for only in a gap that could take the block and beat the best so far)
            if gap >= need and (best_gap is None or gap < best_gap):
                off = _skewed(prev, partners, align)
                if off + need <= lo:
                    best_off, best_gap = off, gap
            prev = max(prev, hi)
        off = _skewed(prev, partners, align) if best_off is None else best_off
        placed.append((off, need, b))
        offsets[b] = off
        top = max(top, off + need)
    return top, offsets


def _skewed(off: int, partners: list[int], align: int) -> int:
    """The first offset from `off` on, in `align` steps, at least SKEW bytes from every partner modulo PAGE."""
    for step in range(0, PAGE, align):
        if all(SKEW <= (off + step - q) % PAGE <= PAGE - SKEW for q in partners):
            return off + step
    return off  # more partners than a page has room to keep apart: the first offset will do
