"""Time gc's scheduled CPU kernels against NumPy (OpenBLAS) on the same shapes.

    python tools/bench_kernels.py [--threads 2] [--rounds 3] [--seconds 0.5] [--only matmul,softmax]
    python tools/bench_kernels.py --threads 1 --cpu-time      # on a busy machine

Each case is a one-op GIR module (or examples/mlp.gir) compiled with compiler.compile(..., "llvm").
gc's number is the kernels alone, called on preallocated 64-byte aligned buffers; the MLP row is the
whole CompiledModel call (inputs bound, three kernels, the result copied out). NumPy runs the same
computation in a separate process (this script with --numpy), because TVM's and OpenBLAS's thread
pools spin and fight over the cores when they share one. Both processes get the same thread count.

Other processes on the machine make single runs noisy: the script alternates gc and NumPy processes
for --rounds rounds and reports, per case, the best round's median (and, in the last columns, the
fastest single call seen, which a busy machine disturbs least). `ratio` is NumPy's time over gc's
(above 1: gc is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GC_CACHE", "off")  # compile seconds are cold compiles, and builds keep their TIR
sys.path.insert(0, str(ROOT))


def matmul_case(m: int, k: int, n: int) -> dict:
    src = f"func @main(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32> {{\n"
    src += f"  %c = graph.matmul(%a, %b) : tensor<{m}x{n}xf32>\n  return %c\n}}\n"
    return {"name": f"matmul {m}x{k}x{n}", "gir": src, "flops": 2 * m * k * n, "np": "matmul"}


CASES = [
    matmul_case(1024, 1024, 1024),
    matmul_case(64, 784, 1024),
    matmul_case(64, 1024, 1024),
    matmul_case(64, 1024, 10),
    {"name": "mlp example (end to end)", "path": "examples/mlp.gir", "np": "mlp",
     "flops": 2 * 64 * (784 * 1024 + 1024 * 1024 + 1024 * 10)},
    {"name": "conv2d 3x3 32->32 @32x32", "np": "conv2d", "flops": 2 * 32 * 32 * 32 * 32 * 9,
     "gir": "func @main(%x: tensor<1x32x32x32xf32>, %w: tensor<32x32x3x3xf32>) -> tensor<1x32x32x32xf32> {\n"
            "  %y = graph.conv2d(%x, %w) {padding = [1, 1, 1, 1]} : tensor<1x32x32x32xf32>\n  return %y\n}\n"},
    {"name": "softmax 512x128", "np": "softmax", "flops": 5 * 512 * 128,
     "gir": "func @main(%x: tensor<512x128xf32>) -> tensor<512x128xf32> {\n"
            "  %y = graph.softmax(%x) : tensor<512x128xf32>\n  return %y\n}\n"},
    {"name": "layer_norm 128x256", "np": "layer_norm", "flops": 8 * 128 * 256,
     "gir": "func @main(%x: tensor<128x256xf32>, %g: tensor<256xf32>, %b: tensor<256xf32>) -> tensor<128x256xf32> {\n"
            "  %y = graph.layer_norm(%x, %g, %b) : tensor<128x256xf32>\n  return %y\n}\n"},
]


def timings(fn, seconds: float) -> dict:
    """Median and minimum of repeated calls, after a warm-up; as many calls as fit in about `seconds`.
    With GC_BENCH_CLOCK=cpu the calling thread's CPU time is measured instead of wall time: with one
    thread all work runs in the caller, and CPU time is what other processes on the machine do not
    inflate."""
    clock = time.thread_time if os.environ.get("GC_BENCH_CLOCK") == "cpu" else time.perf_counter
    fn()
    t = clock()
    fn()
    one = max(clock() - t, 1e-7)
    times = []
    for _ in range(max(5, min(2000, int(seconds / one)))):
        t = clock()
        fn()
        times.append(clock() - t)
    return {"seconds": float(np.median(times)), "min": float(np.min(times))}


def aligned(x: np.ndarray) -> np.ndarray:
    raw = np.empty(x.nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    y = raw[off : off + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


def inputs_of(shapes: list[tuple], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [aligned(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def time_gc(case: dict, seconds: float) -> dict:
    import tvm

    import compiler

    t0 = time.perf_counter()
    model = compiler.compile(case.get("path") or case["gir"], "llvm")
    compile_s = time.perf_counter() - t0
    args = inputs_of([a.shape for a in model.plan.args])
    if case["np"] == "mlp":
        return {**timings(lambda: model(*args), seconds), "compile": compile_s}
    ws = model._take()  # held by kernels(): the arena's views live as long as the workspace
    bufs = list(ws.bufs)
    for slot, x in zip(model._arg_slots, args):
        bufs[slot] = tvm.runtime.tensor(x)
    calls = [(fn, [bufs[i] for i in idx]) for fn, idx in model._plain_calls()]

    def kernels(ws=ws):
        for fn, a in calls:
            fn(*a)

    return {**timings(kernels, seconds), "compile": compile_s}


def numpy_fn(kind: str, shapes: list[tuple]):
    """The computation in NumPy, on inputs of `shapes`; the best NumPy way (BLAS where there is one)."""
    xs = inputs_of(shapes)
    if kind == "matmul":
        a, b = xs
        out = np.empty((a.shape[0], b.shape[1]), np.float32)
        return lambda: np.matmul(a, b, out=out)
    if kind == "mlp":
        x, w1, b1, w2, b2, w3, b3 = xs
        return lambda: np.maximum(np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0) @ w3 + b3
    if kind == "conv2d":  # im2col + one BLAS product
        x, w = xs
        o, c, kh, kw = w.shape
        wm = w.reshape(o, -1)

        def conv():
            xp = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
            cols = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))  # c, oh, ow, kh, kw
            col = cols.transpose(0, 3, 4, 1, 2).reshape(c * kh * kw, -1)
            return wm @ col

        return conv
    if kind == "softmax":
        (x,) = xs

        def softmax():
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)

        return softmax
    if kind == "layer_norm":
        x, g, b = xs

        def layer_norm():
            mean = x.mean(axis=1, keepdims=True)
            var = x.var(axis=1, keepdims=True)
            return (x - mean) / np.sqrt(var + 1e-5) * g + b

        return layer_norm
    raise ValueError(kind)


NP_SHAPES = {
    "conv2d": [(1, 32, 32, 32), (32, 32, 3, 3)],
    "softmax": [(512, 128)],
    "layer_norm": [(128, 256), (256,), (256,)],
    "mlp": [(64, 784), (784, 1024), (1024,), (1024, 1024), (1024,), (1024, 10), (10,)],
}


def np_shapes(case: dict) -> list[tuple]:
    if case["np"] == "matmul":
        m, k, n = (int(v) for v in case["name"].split()[1].split("x"))
        return [(m, k), (k, n)]
    return NP_SHAPES[case["np"]]


def worker(which: str, names: list[str], seconds: float) -> None:
    """One process's measurements, printed as JSON: {case name: {"seconds": ...}}."""
    out = {}
    for case in CASES:
        if case["name"] not in names:
            continue
        try:
            if which == "gc":
                out[case["name"]] = time_gc(case, seconds)
            else:
                out[case["name"]] = timings(numpy_fn(case["np"], np_shapes(case)), seconds)
        except Exception as e:  # noqa: BLE001 (a case that cannot run yet, e.g. an op without lowering)
            out[case["name"]] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    print(json.dumps(out))


def run_worker(which: str, names: list[str], threads: int, seconds: float) -> dict:
    env = dict(os.environ)
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    cmd = [sys.executable, __file__, "--worker", which, "--seconds", str(seconds), "--only", ",".join(names)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        sys.exit(f"{which} worker failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.5, help="timing per case per round")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--cpu-time", action="store_true",
                    help="with --threads 1: time the calling thread's CPU time (robust to a busy machine)")
    ap.add_argument("--worker", choices=["gc", "numpy"], help=argparse.SUPPRESS)
    opts = ap.parse_args()
    keys = [s for s in opts.only.split(",") if s]
    names = [c["name"] for c in CASES if not keys or any(k in c["name"] for k in keys)]
    if opts.cpu_time:
        if opts.threads != 1:
            sys.exit("--cpu-time measures the calling thread only: use it with --threads 1")
        os.environ["GC_BENCH_CLOCK"] = "cpu"
    if opts.worker:
        worker(opts.worker, names, opts.seconds)
        return
    best: dict[str, dict[str, dict]] = {"gc": {}, "numpy": {}}
    for _ in range(opts.rounds):
        for which in ("gc", "numpy"):
            for name, r in run_worker(which, names, opts.threads, opts.seconds).items():
                prev = best[which].get(name)
                if prev is None or r.get("seconds", 1e9) < prev.get("seconds", 1e9):
                    best[which][name] = r
    clock = "CPU time" if opts.cpu_time else "wall time"
    print(f"{opts.threads} threads, {clock}, best of {opts.rounds} rounds; load average {os.getloadavg()[0]:.2f}")
    head = f"{'case':28} {'gc':>10} {'GFLOP/s':>8} {'numpy':>10} {'GFLOP/s':>8} {'ratio':>6}"
    print(f"{head}   {'min: gc':>9} {'numpy':>9} {'ratio':>6}")
    for case in CASES:
        name = case["name"]
        if name not in names:
            continue
        g, n = best["gc"].get(name, {}), best["numpy"].get(name, {})
        if "seconds" not in g or "seconds" not in n:
            print(f"{name:28} {g.get('error') or n.get('error')}")
            continue
        gs, ns = g["seconds"], n["seconds"]
        gm, nm = g["min"], n["min"]
        print(f"{name:28} {_us(gs):>10} {case['flops'] / gs / 1e9:8.1f} {_us(ns):>10} "
              f"{case['flops'] / ns / 1e9:8.1f} {ns / gs:6.2f}   {_us(gm):>9} {_us(nm):>9} {nm / gm:6.2f}")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"threads": opts.threads, **best}, indent=1))


def _us(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


if __name__ == "__main__":
    main()
