"""Two or more compiled artifacts timed against each other: is a change faster?

    python tools/ab.py before.gcpkg after.gcpkg [--inputs IN.npz] [--batches 40] [--calls 5]

On a shared host the machine's speed drifts by 1.3-1.6x over minutes (docs/benchmarks.md), so two
artifacts timed one after the other can differ by more than the change. Here they are loaded into one
process and take turns: a batch of `--calls` calls of one, then of the next, `--batches` times; each
batch counts its fastest call, and each artifact's figure is the median over its batches (with the
25th percentile and the minimum). A drift then slows every artifact alike. Every artifact must take
the same inputs: `--inputs` (an .npz keyed by argument name, as `gc run` takes) or random ones made
from the first artifact's source (seed 0); their outputs are compared with the first's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiler  # noqa: E402


def inputs_for(model, path: str | None) -> dict[str, np.ndarray]:
    if path:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    from compiler.inputs import random_inputs

    if model.source is None:
        raise SystemExit("error: the artifact keeps no source to make inputs from: pass --inputs")
    module = compiler.parse(model.source)
    made = random_inputs(module["main"], 0, module)
    return {k: v for k, v in made.items() if k in model.arg_names}  # weights bound at compile time are no inputs


def time_alternately(models: list, inputs: dict, batches: int, calls: int) -> list[list[float]]:
    """Seconds of each batch's fastest call, per model, the models taking turns batch by batch."""
    for m in models:
        for _ in range(3):
            m(**inputs)
    best: list[list[float]] = [[] for _ in models]
    for _ in range(batches):
        for i, m in enumerate(models):
            fastest = float("inf")
            for _ in range(calls):
                t = time.perf_counter()
                m(**inputs)
                fastest = min(fastest, time.perf_counter() - t)
            best[i].append(fastest)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("artifacts", nargs="+", help=".gcpkg files compiled from the same model")
    p.add_argument("--inputs", help="an .npz keyed by argument name (default: random, seed 0)")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args(argv)
    models = [compiler.load(a) for a in args.artifacts]
    inputs = inputs_for(models[0], args.inputs)
    first = models[0](**inputs)
    for path, m in zip(args.artifacts[1:], models[1:]):
        out = m(**inputs)
        err = max(float(np.max(np.abs(a - b))) / (float(np.max(np.abs(a))) or 1.0) for a, b in zip(first, out))
        if err > 1e-3:
            print(f"warning: {path}'s outputs differ from {args.artifacts[0]}'s by {err:.1e} of their scale")
    best = time_alternately(models, inputs, args.batches, args.calls)
    base = float(np.median(best[0]))
    for path, b in zip(args.artifacts, best):
        med = float(np.median(b))
        print(f"{path}: median {med * 1e3:.3f} ms  p25 {np.percentile(b, 25) * 1e3:.3f}  min {min(b) * 1e3:.3f}"
              f"  ({med / base:.2f}x the first)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
