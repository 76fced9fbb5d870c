"""Dynamic sizes against static ones: each example with its batch (or sequence) `?`, one compile called
at several sizes, against the static model compiled for each size, in turns in one process.

    python tools/bench_dynamic.py [--batches 15] [--calls 5] [--target cuda]

Each figure is the median over batches of the fastest of `--calls` calls (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compiler  # noqa: E402
from compiler.inputs import random_inputs  # noqa: E402

MLP, CNN, TF = ((ROOT / "examples" / f).read_text() for f in ("mlp.gir", "cnn.gir", "transformer.gir"))


def transformer(n) -> str:
    text = re.sub(r"(?<=[<x])128(?=x)", str(n), TF)
    return text.replace("shape = [128, ", "shape = [0, " if n == "?" else f"shape = [{n}, ")


CASES = {  # name -> (GIR at size n, the sizes to time)
    "mlp": (lambda n: MLP.replace("tensor<64x", f"tensor<{n}x"), [1, 16, 64]),
    "cnn": (lambda n: re.sub(r"tensor<1x", f"tensor<{n}x", CNN), [1, 8, 16]),
    "transformer": (transformer, [32, 128, 384]),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=15)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--target", default="llvm", choices=["llvm", "cuda"], help="cuda: whole calls from NumPy")
    p.add_argument("--only", help="comma-separated cases (mlp, cnn, transformer)")
    args = p.parse_args()
    only = set(args.only.split(",")) if args.only else set(CASES)
    print("| model | size | dynamic ms | static ms | dynamic / static | kernels built at this size |\n"
          "|---|---:|---:|---:|---:|---:|")
    for name, (at, sizes) in CASES.items():
        if name not in only:
            continue
        first = random_inputs(compiler.parse(at(sizes[0]))["main"], 0)
        data = next(iter(first))
        weights = {k: v for k, v in first.items() if k != data}
        dynamic = compiler.compile(at("?"), args.target, params=weights)
        for n in sizes:
            x = random_inputs(compiler.parse(at(n))["main"], 0)[data]
            static = compiler.compile(at(n), args.target, params=weights)
            dynamic(x), static(x)  # the dynamic model compiles this size at its first call
            best: dict[str, list[float]] = {"dynamic": [], "static": []}
            for _ in range(args.batches):
                for key, model in (("dynamic", dynamic), ("static", static)):
                    times = []
                    for _ in range(args.calls):
                        t = time.perf_counter()
                        model(x)
                        times.append(time.perf_counter() - t)
                    best[key].append(min(times))
            d, s = np.median(best["dynamic"]), np.median(best["static"])
            built = getattr(dynamic.model_for([x.shape]), "built_functions", "-")
            print(f"| {name} | {n} | {d * 1e3:.3f} | {s * 1e3:.3f} | {d / s:.2f} | {built} |", flush=True)


if __name__ == "__main__":
    main()
