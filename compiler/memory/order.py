"""The execution order of a function's kernels that keeps peak live memory low (the `schedule` pass):
a memory-aware list scheduler, or an exact best-first search over the sets of kernels already run."""

from __future__ import annotations

import heapq

from compiler.ir import Func, Op, Value
from compiler.memory.liveness import peak_bytes

POLICIES = ("auto", "greedy", "exact", "file")


MAX_STATES = 200_000  # exact search gives up (and schedules greedily) beyond this many sets


def choose_order(f: Func, policy: str = "auto", exact_limit: int = 12, align: int = 64) -> list[Op]:
    """A topological order of `f`'s kernels (non-constant ops) under `policy`."""
    g = _Graph(f, align)
    if policy == "file":
        return list(g.ops)
    if policy == "greedy":
        return g.greedy()
    if len(g.ops) <= exact_limit:
        best = g.exact()
        if best is not None:
            return best
    # Past the exact search's limit the list scheduler (it looks one kernel ahead) stands in; where the
    # file's order peaks lower, that order is kept: exact and auto never do worse than the text.
    greedy = g.greedy()
    return greedy if peak_bytes(f, greedy, align) <= peak_bytes(f, g.ops, align) else list(g.ops)


class _Graph:
    """Kernels, their dependences and the bytes each allocates and frees."""

    def __init__(self, f: Func, align: int):
        self.ops = [op for op in f.ops if op.kind != "constant"]
        index = {op: i for i, op in enumerate(self.ops)}
        returned = set(f.results)
        self.preds: list[set[int]] = [set() for _ in self.ops]
        self.succs: list[set[int]] = [set() for _ in self.ops]
        consumers: dict[Value, set[int]] = {}
        for i, op in enumerate(self.ops):
            for v in op.operands:
                if v.owner in index:
                    self.preds[i].add(index[v.owner])
                    self.succs[index[v.owner]].add(i)
                consumers.setdefault(v, set()).add(i)
        # Tensors that count: intermediates (results the function does not return), by producer.
        self.tensors: list[tuple[int, int, frozenset[int]]] = []  # (producer, bytes, consumers)
        for i, op in enumerate(self.ops):
            for r in op.results:
                if r not in returned and r.type.nbytes > 0:
                    size = -(-r.type.nbytes // align) * align
                    self.tensors.append((i, size, frozenset(consumers.get(r, ()))))
        self.out_bytes = [0] * len(self.ops)
        self.reads: list[list[int]] = [[] for _ in self.ops]  # tensor ids each op reads
        for t, (p, size, cons) in enumerate(self.tensors):
            self.out_bytes[p] += size
            for c in cons:
                self.reads[c].append(t)

    def greedy(self) -> list[Op]:
        n = len(self.ops)
        waiting = [len(p) for p in self.preds]
        left = [len(c) for _, _, c in self.tensors]
        ready = [i for i in range(n) if waiting[i] == 0]
        order: list[int] = []
        while ready:
            def cost(i: int) -> tuple[int, int]:
                freed = sum(self.tensors[t][1] for t in self.reads[i] if left[t] == 1)
                return self.out_bytes[i] - freed, i

            i = min(ready, key=cost)
            ready.remove(i)
            order.append(i)
            for t in set(self.reads[i]):
                left[t] -= 1
            for s in self.succs[i]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    ready.append(s)
        return [self.ops[i] for i in order]

    def exact(self) -> list[Op] | None:
        """Minimum-peak order: best-first over sets of run kernels, ordered by the peak so far (None past
        MAX_STATES sets)."""
        n = len(self.ops)
        preds = [sum(1 << p for p in ps) for ps in self.preds]
        full = (1 << n) - 1

        def alive(done: int) -> int:
            total = 0
            for p, size, cons in self.tensors:
                if done >> p & 1 and any(not done >> c & 1 for c in cons):
                    total += size
            return total

        expanded = 0
        start = (0, 0, 0, ())
        heap = [start]
        best: dict[int, int] = {0: 0}
        while heap:
            peak, _, done, path = heapq.heappop(heap)
            if done == full:
                return [self.ops[i] for i in path]
            if best.get(done, peak) < peak:
                continue
            expanded += 1
            if expanded > MAX_STATES:
                return None
            base = alive(done)
            for i in range(n):
                if done >> i & 1 or preds[i] & ~done:
                    continue
                nxt = done | 1 << i
                # During step i its inputs are still alive (counted in base) and its outputs are too.
                during = base + self.out_bytes[i]
                new_peak = max(peak, during)
                if new_peak < best.get(nxt, 1 << 62):
                    best[nxt] = new_peak
                    heapq.heappush(heap, (new_peak, -len(path) - 1, nxt, path + (i,)))
        raise AssertionError("no topological order: the function has a cycle")
