"""Per-kernel time of a compiled model: where a call's time goes, kernel by kernel.

Like TVM's debug executor: the plan's steps run one at a time on the model's own buffers, each timed on
its own (`repeat` runs, the median kept; on a GPU the device is synchronised after every step, so
streams run one after the other), next to the whole call timed as users call it. The difference is the
per-call overhead: binding the inputs, staging copies, returning the results. GFLOP/s and GB/s come
from each kernel's op costs (`gc stats` counts them the same way) and the bytes of its operands and
results, so a kernel far from the machine's peak stands out.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass
class KernelTime:
    index: int
    name: str  # the kernel's symbol, or "copy"
    ops: list[str]
    schedule: str
    loc: str
    flops: int
    bytes: int
    us: float  # median microseconds per run

    @property
    def gflops(self) -> float:
        return self.flops / self.us / 1e3 if self.us > 0 else 0.0

    @property
    def gbytes(self) -> float:
        return self.bytes / self.us / 1e3 if self.us > 0 else 0.0


@dataclass
class Profile:
    rows: list[KernelTime]
    call_us: float  # median of whole calls
    repeat: int
    target: str
    notes: list[str] = field(default_factory=list)
    in_call: bool = False  # steps timed inside whole calls, not each on its own

    @property
    def kernels_us(self) -> float:
        return sum(r.us for r in self.rows)

    def top(self, n: int) -> list[KernelTime]:
        return sorted(self.rows, key=lambda r: -r.us)[:n]

    def render(self, sort: bool = False) -> str:
        rows = self.top(len(self.rows)) if sort else self.rows
        total = self.kernels_us or 1.0
        head = ["#", "kernel", "ops", "schedule", "us", "%", "GFLOP/s", "GB/s", "from"]
        body = [[str(r.index), r.name, ",".join(r.ops) or "-", r.schedule or "-", f"{r.us:.1f}",
                 f"{100 * r.us / total:.1f}", f"{r.gflops:.1f}" if r.flops else "-",
                 f"{r.gbytes:.1f}" if r.bytes else "-", r.loc or "-"] for r in rows]
        widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
        right = {0, 4, 5, 6, 7}

        def line(cells: list[str]) -> str:
            padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
            return "  ".join(padded).rstrip()

        how = f"timed inside {self.repeat} whole calls" if self.in_call else f"median of {self.repeat} runs each"
        out = [f"profile: {len(self.rows)} steps on {self.target}, {how} (microseconds)",
               line(head), line(["-" * w for w in widths])]
        out += [line(b) for b in body]
        overhead = self.call_us - self.kernels_us
        out.append(f"kernels {self.kernels_us:.1f} us; whole call {self.call_us:.1f} us "
                   f"(binding, staging and results: {overhead:+.1f} us)")
        out += self.notes
        return "\n".join(out)


def profile(model, args, kwargs, repeat: int = 100, warmup: int = 10, in_call: bool = False) -> Profile:
    """Time each step of `model`'s plan, then whole calls; `args`/`kwargs` as the model takes them.

    Each step runs `repeat` times on its own (isolated: its operands and weights stay in cache from the
    step's previous run), or, with `in_call`, is timed inside `repeat` whole calls, the steps in plan
    order: caches as a call leaves them, the way ONNX Runtime's profiler times its nodes. The two differ
    where a kernel's weights or inputs fall out of cache between calls (a large final matmul)."""
    from compiler.diagnostics import GCError

    if repeat < 1:
        raise GCError(f"profile: repeat must be at least 1, got {repeat}")
    if model.unavailable:
        raise GCError(model.unavailable)
    sync = model.device.sync if model.target["kind"] == "cuda" else (lambda: None)
    for _ in range(warmup):  # a fresh process: thread pool, clock and first-touch of the workspaces
        model(*args, **kwargs)
    # Whole calls first: after thousands of single-kernel runs the thread pool answers slower (ResNet-50's
    # calls measured 48 ms there against 41 ms here and in a fresh process).
    calls = []
    for _ in range(repeat):
        t = time.perf_counter()
        model(*args, **kwargs)
        calls.append(time.perf_counter() - t)
    steps = [c for c in model.plan.steps if c.kernel or c.copy is not None]
    times: list[list[float]] = [[] for _ in steps]
    ws = model._take()
    try:
        bufs = model._buffers_for(ws, model._bind(args, kwargs))
        _time_steps([(fn, [bufs[j] for j in idx]) for fn, idx in model._plain_calls()], times, sync,
                    repeat, warmup, in_call)
    finally:
        model._idle.append(ws)
    rows = []
    for i, (c, ts) in enumerate(zip(steps, times)):
        us = statistics.median(ts) * 1e6
        if c.kernel:
            rows.append(KernelTime(i, c.kernel, list(c.ops), c.schedule, c.loc, int(c.flops), int(c.bytes), us))
        else:
            rows.append(KernelTime(i, "copy", [], "", "", 0, 2 * model.plan.buffers[c.copy[0]].nbytes, us))
    notes = []
    if model.target["kind"] == "cuda" and model._nstreams > 1:
        notes.append("note: steps were timed one at a time; in a call the plan's streams overlap them")
    return Profile(rows, statistics.median(calls) * 1e6, repeat, model.target["kind"], notes, in_call)


def _time_steps(plain: list, times: list[list[float]], sync, repeat: int, warmup: int, in_call: bool) -> None:
    """Time each (function, operands) of `plain` into `times`: each on its own, or inside whole calls."""

    def timed(i: int) -> None:
        fn, operands = plain[i]
        t = time.perf_counter()
        fn(*operands)
        sync()
        times[i].append(time.perf_counter() - t)

    if in_call:
        for _ in range(repeat):
            for i in range(len(plain)):
                timed(i)
        return
    for i, (fn, operands) in enumerate(plain):
        for _ in range(warmup):
            fn(*operands)
        sync()
        for _ in range(repeat):
            timed(i)
