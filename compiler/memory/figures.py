"""The memory figures of a planned function (`gc compile --stats`, `gc stats`): the arena, the naive
size, the lower bounds of the chosen order with and without the zero borders."""

from __future__ import annotations

from compiler.ir import Func, Value
from compiler.memory.liveness import lower_bound, round_up, view_spans
from compiler.memory.placement import Block


def plan_stats(f: Func, unit: int = 1) -> dict[str, int]:
    """The memory figures of a planned function: the planned bytes for intermediates (the arena, plus the
    zero-bordered buffers of conv-borders outside it, borders included); the bytes of its intermediates,
    each in a buffer of its own (naive); and the lower bound: the largest total of intermediates alive at
    one step of its order, where an output written in place over an input that dies at that step counts
    once with it (they are one buffer), so that no plan can be smaller. `lower_bound_bytes` counts a
    bordered tensor with its border (the buffer its schedule needs), `tensor_bound_bytes` at its own size
    (the difference is what borders cost). Sizes are in bytes, or rounded up to `unit` (the alignment
    every buffer needs). `bordered_bytes` is the part of `arena_bytes` in buffers outside the arena."""
    steps = [op for op in f.ops if op.name in ("exec.launch", "exec.copy")]
    arena = next((op.size for op in f.ops if op.name == "mem.arena"), 0)
    where: dict[Value, object] = dict(view_spans(f))
    padded: dict[Value, int] = {op.result: op.padded_bytes for op in f.ops if op.name == "mem.view" and op.pads}
    bordered = 0
    for op in f.ops:
        if op.name == "mem.alloc" and op.pads:
            where[op.result] = op  # a buffer of its own: nothing else shares it
            padded[op.result] = op.padded_bytes
            bordered += op.padded_bytes
    last: dict[Value, int] = {}
    for i, op in enumerate(steps):
        for v in op.operands[: len(op.operands) - len(op.results)]:
            last[v] = i
    blocks: dict[Value, Block] = {}  # value -> the buffer it shares (in place) or owns
    own: dict[Value, Block] = {}  # the same at the tensors' own sizes
    naive = 0
    for i, op in enumerate(steps):
        n = len(op.results)
        ins, dests = op.operands[: len(op.operands) - n], op.operands[len(op.operands) - n :]
        for d, r in zip(dests, op.results):
            if d not in where or not r.type.nbytes:
                continue
            naive += round_up(r.type.nbytes, unit)
            _join(blocks, r, d, ins, where, last, i, round_up(padded.get(d, r.type.nbytes), unit))
            _join(own, r, d, ins, where, last, i, round_up(r.type.nbytes, unit))
    return {"arena_bytes": arena + bordered, "naive_bytes": naive,
            "lower_bound_bytes": lower_bound(list(dict.fromkeys(blocks.values()))),
            "tensor_bound_bytes": lower_bound(list(dict.fromkeys(own.values()))), "bordered_bytes": bordered}


def _join(blocks: dict[Value, Block], r: Value, d: Value, ins: list[Value], where: dict, last: dict, i: int,
          size: int) -> None:
    """Result `r`, written into destination `d` at step `i`, joins the buffer it shares (written in place over
    a dying input, or a concat's operands lying in its bytes) or gets one of its own."""
    where[r] = where[d]
    end = max(i, last.get(r, i))
    donor = next((v for v in ins if v in blocks and where.get(v) == where[d] and last.get(v) == i), None)
    if len(ins) > 1 and _tiled(ins, where, where[d], blocks):  # a concat's operands in its bytes
        b = blocks[ins[0]]
        others = {id(blocks[v]) for v in ins[1:]} - {id(b)}
        b.size, b.start, b.end = max(b.size, size), min(blocks[v].start for v in ins), max(b.end, end)
        for w, wb in blocks.items():
            if id(wb) in others:
                blocks[w] = b
    elif donor is not None:
        b = blocks[donor]
        b.size, b.end = max(b.size, size), max(b.end, end)
    else:
        b = Block(size, i, end)
    blocks[r] = b


def _tiled(ins: list[Value], where: dict, span, blocks: dict) -> bool:
    """The inputs lie end to end exactly over `span`: one buffer with the output (alive or not after it: a
    chain of concats, each a prefix of the next, shares its operands with all of them)."""
    spans = [where.get(v) for v in ins]
    if not ins or not isinstance(span, tuple) or not all(isinstance(s, tuple) for s in spans):
        return False
    ends = [span[0]] + [s[1] for s in spans]
    return (all(s[0] == e for s, e in zip(spans, ends)) and ends[-1] == span[1]
            and all(v in blocks for v in ins))
