"""The model zoo: torchvision and Hugging Face models as a user brings them, through gc import, against ONNX
Runtime and torch.

    pip install -e '.[bench]'       # torch (CPU), torchvision, transformers, onnx, onnxscript, onnxruntime
    python tools/zoo.py [--only resnet50,mobilenet_v2] [--rounds 3] [--threads 2] [--json out.json] [--profile]

Each model is built with random seeded weights (no downloads), its BatchNorm statistics set by a
training-mode pass over seeded images and any all-zero Linear layer redrawn (random init otherwise
gives outputs of 1e-9 or all zeros, which check nothing); the transformers (BERT-base, GPT-2, DistilBERT)
from their default configs, on 128 seeded token ids, returning the last hidden state. Each is exported
with torch.onnx (opset 18; the dynamo exporter, or with `--exporter torchscript` the TorchScript one, whose
exports are cached apart; GPT-2 does not export that way, torch lacking aten::diff), imported
with `gc import` and compiled with `gc compile --params` (the seconds that takes are reported). Then
per round each framework runs in a process of its own (their thread pools fight when they share one):
gc on the artifact, ONNX Runtime on the .onnx (all graph optimizations), torch eager on the model; every
output is first checked against ONNX Runtime without graph optimizations (rtol 1e-3 of the output's
scale). A number is the median over rounds of each round's median; gc / ORT is the median of the rounds'
ratios (gc and ONNX Runtime timed back to back in each round), which a host drifting between rounds
does not skew. `--profile` lists gc's slowest kernels of each model, each placed on this machine's
roofline (the FMA peak of the cores, measured by a loop of vector FMAs that llvmlite compiles for this
CPU, right before and right after that model's profile, since a shared host's speed drifts; the memory
bandwidth as a 128 MB elementwise stream reaches it): compute-bound with its share of
the FMA peak, or memory-bound with its share of the bandwidth. gc's own matmul in cache is reported
beside the peak.
The exported models are cached in
~/.cache/gc/zoo (--cache to move it): a second run starts at the import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GC_CACHE", "off")  # compile seconds are cold compiles, and builds keep their TIR
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench import brief, check, measure, table  # noqa: E402

MODELS = ["resnet50", "mobilenet_v2", "efficientnet_b0", "shufflenet_v2_x1_0", "squeezenet1_1", "densenet121",
          "vit_b_16", "swin_t", "bert", "gpt2", "distilbert"]
TEXT = {"bert": ("BertModel", "BertConfig"), "gpt2": ("GPT2Model", "GPT2Config"),
        "distilbert": ("DistilBertModel", "DistilBertConfig")}  # Hugging Face transformers: name -> classes
SEQUENCE = 128
OPSET = 18
SEED = 0


def import_torchvision():
    """torchvision beside the CPU torch wheel: its C++ ops do not load (built for CUDA torch), and the
    classification models use none; defining the two schemas its meta registrations need is enough."""
    import torch

    global _TV_LIB  # the library object must outlive every use of torchvision
    try:
        import torchvision
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        _TV_LIB = torch.library.Library("torchvision", "DEF")
        _TV_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _TV_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision
    return torchvision


def text_model(name: str):
    """A Hugging Face model from its default config (random weights), returning its last hidden state."""
    import torch

    import_torchvision()  # transformers imports it
    import transformers

    model_cls, config_cls = TEXT[name]
    extra = {"use_cache": False} if name == "gpt2" else {}
    inner = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**extra))

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = inner

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    return LastHidden().eval()


def build(name: str):
    """The model with meaningful random weights, in eval mode, and its seeded input."""
    import torch

    if name in TEXT:
        torch.manual_seed(SEED)
        ids = np.random.default_rng(SEED).integers(0, 1000, (1, SEQUENCE))
        return text_model(name), torch.from_numpy(ids)
    tv = import_torchvision()
    torch.manual_seed(SEED)
    model = getattr(tv.models, name)(weights=None)
    size = 224
    with torch.no_grad():
        model.train()
        for _ in range(2):  # BatchNorm's running statistics from real activations (momentum 0.1 by default)
            for m in model.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.momentum = None  # a cumulative average over the passes
            model(torch.randn(8, 3, size, size))
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and not m.weight.abs().sum():
                m.weight.normal_(0, 0.02)  # ViT's zero-initialized head
        model.eval()
    x = torch.from_numpy(np.random.default_rng(SEED).standard_normal((1, 3, size, size)).astype(np.float32))
    return model, x


def prepare(name: str, cache: Path, dynamo: bool = True) -> dict:
    """Export `name` once (cached): model.onnx, its input, the reference output, the state for torch.
    `dynamo=False`: torch's TorchScript exporter (deprecated, but what older exports were made with)."""
    d = cache / name
    done = d / "reference.npy"
    if not done.exists():
        import onnxruntime as ort
        import torch

        d.mkdir(parents=True, exist_ok=True)
        model, x = build(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation
            torch.onnx.export(model, (x,), str(d / "model.onnx"), opset_version=OPSET, input_names=["x"],
                              output_names=["y"], dynamo=dynamo, **({"external_data": False} if dynamo else {}))
        np.save(d / "input.npy", x.numpy())
        torch.save(model.state_dict(), d / "state.pt")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(str(d / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        ref = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        with torch.no_grad():
            err = float(np.abs(model(x).numpy() - ref).max() / (np.abs(ref).max() or 1))
        if err > 1e-3:
            raise RuntimeError(f"the exported model differs from torch by {err:.2e} of the output's scale")
        if not np.abs(ref).max() > 1e-3:
            raise RuntimeError(f"the output is all but zero ({np.abs(ref).max():.2e}): the check would check nothing")
        np.save(done, ref)
    return {"name": name, "dir": str(d)}


def gc_cli(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True, cwd=ROOT)
    return time.perf_counter() - t, r


def import_and_compile(m: dict) -> None:
    """gc import and gc compile --params, as a user runs them: the seconds each takes."""
    d = Path(m["dir"])
    seconds, r = gc_cli("import", str(d / "model.onnx"), "-o", str(d / "model.gir"))
    if r.returncode:
        raise RuntimeError(f"gc import failed: {r.stderr.strip()[-400:]}")
    m["import_s"] = seconds
    args = ["compile", str(d / "model.gir"), "-o", str(d / "model.gcpkg"), "--stats", str(d / "stats.json")]
    if (d / "model.npz").exists():
        args += ["--params", str(d / "model.npz")]
    seconds, r = gc_cli(*args)
    if r.returncode:
        raise RuntimeError(f"gc compile failed: {r.stderr.strip()[-400:]}")
    m["compile_s"] = seconds
    stats = json.loads((d / "stats.json").read_text())
    m["kernels"] = stats["num_kernels"]
    m["arena_mb"] = stats["arena_bytes"] / 1e6


# --- workers: one framework, one model, one round, in a process of its own --------------------------------


def run_gc(d: Path, x: np.ndarray, quick: bool, profile: bool, threads: int) -> dict:
    import compiler

    model = compiler.load(d / "model.gcpkg")
    out = {**measure(lambda: model(x), quick), "first": model(x)[0]}
    if profile:
        # A shared host's speed drifts by up to 2x from minute to minute: each model's kernels are placed
        # against the FMA peak measured right before and right after its own profile, not at the start.
        before = fma_peak(threads)
        p = model.profile(x, repeat=5 if quick else 20, warmup=2)
        out["peak_around"] = [before, fma_peak(threads)] if before else None
        out["profile"] = [{"kernel": r.name, "ops": ",".join(r.ops), "schedule": r.schedule, "us": round(r.us, 1),
                           "gflops": round(r.gflops, 1), "gbs": round(r.gbytes, 1), "loc": r.loc}
                          for r in p.top(len(p.rows))]
        out["kernels_us"] = p.kernels_us
    return out


def run_ort(d: Path, x: np.ndarray, quick: bool, threads: int) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(d / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    feeds = {sess.get_inputs()[0].name: x}
    return {**measure(lambda: sess.run(None, feeds), quick), "first": sess.run(None, feeds)[0]}


def run_torch(name: str, d: Path, x: np.ndarray, quick: bool, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    model = text_model(name) if name in TEXT else getattr(import_torchvision().models, name)(weights=None)
    model.load_state_dict(torch.load(d / "state.pt"))
    model.eval()
    xt = torch.from_numpy(x)
    with torch.inference_mode():
        return {**measure(lambda: model(xt), quick), "first": model(xt).numpy()}


ROOFLINE_MATMUL = (256, 512, 512)  # in L2: the FMA peak as gc's own matmul reaches it
ROOFLINE_STREAM = 1 << 24  # f32 elements: 64 MB read and 64 MB written, far past every cache


FMA_LOOP = 20_000_000  # iterations of the FMA-peak loop: about a second at 3 GHz


def fma_peak(threads: int) -> float | None:
    """The machine's FMA peak, GFLOP/s: `threads` threads each running a loop of independent vector FMAs
    (registers - 4 chains: more than FMA latency x pipes, none spilled), JIT-compiled for this CPU by
    llvmlite (`target.fma_loop`); ctypes calls release the GIL, so the threads run at once. None without
    llvmlite."""
    import threading

    from compiler.codegen.target import cpu, fma_loop

    lanes, chains = cpu().lanes("float32"), cpu().registers - 4
    spin = fma_loop(lanes, chains)
    if spin is None:
        return None
    spin(1000, 1.0)
    seconds = [0.0] * threads

    def run(t: int) -> None:
        start = time.perf_counter()
        spin(FMA_LOOP, 0.5)
        seconds[t] = time.perf_counter() - start

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(2 * lanes * chains * FMA_LOOP / s for s in seconds) / 1e9


def run_roofline(threads: int) -> dict:
    """The machine's roofs, for telling compute-bound kernels from memory-bound ones: the FMA peak of
    `threads` cores (`fma_peak`), GFLOP/s of gc's matmul whose operands stay in cache (what gc reaches
    of that peak), and GB/s of an elementwise kernel streaming 128 MB. Medians of repeated calls, in a
    process of its own like every framework."""
    import compiler

    m, k, n = ROOFLINE_MATMUL
    rng = np.random.default_rng(0)
    mm = compiler.compile(f"""func @main(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32> {{
  %c = graph.matmul(%a, %b)
  return %c
}}""", "llvm", params={"b": rng.standard_normal((k, n), dtype=np.float32)}, cache=False)
    st = compiler.compile(f"""func @main(%x: tensor<{ROOFLINE_STREAM}xf32>) -> tensor<{ROOFLINE_STREAM}xf32> {{
  %y = graph.relu(%x)
  return %y
}}""", "llvm", cache=False)
    a, x = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal(ROOFLINE_STREAM, dtype=np.float32)
    out_mm, out_st = [np.empty((m, n), np.float32)], [np.empty(ROOFLINE_STREAM, np.float32)]

    def median_seconds(f, calls: int) -> float:
        for _ in range(3):
            f()
        ts = []
        for _ in range(calls):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    t_mm = median_seconds(lambda: mm.run_into(out_mm, a), 200)
    t_st = median_seconds(lambda: st.run_into(out_st, x), 20)
    matmul = 2 * m * k * n / t_mm / 1e9
    fma = fma_peak(threads)
    # Without llvmlite the matmul stands in for the FMA peak (which it then understates).
    return {"peak_gflops": fma or matmul, "fma_measured": fma is not None, "matmul_gflops": matmul,
            "gbs": 2 * 4 * ROOFLINE_STREAM / t_st / 1e9}


def bound(row: dict, roof: dict | None) -> str:
    """compute- or memory-bound by the roofline (intensity against peak / bandwidth), and how close."""
    if not roof or not row["gflops"] or not row["gbs"]:
        return ""
    intensity = row["gflops"] / row["gbs"]
    if intensity >= roof["peak_gflops"] / roof["gbs"]:
        return f"compute {100 * row['gflops'] / roof['peak_gflops']:3.0f}% of FMA peak"
    return f"memory  {100 * row['gbs'] / roof['gbs']:3.0f}% of GB/s"


def worker(framework: str, name: str, d: Path, quick: bool, threads: int, profile: bool, out: Path) -> None:
    if framework == "roofline":
        out.write_text(json.dumps(run_roofline(threads)))
        return
    x, ref = np.load(d / "input.npy"), np.load(d / "reference.npy")
    try:
        if framework == "gc":
            r = run_gc(d, x, quick, profile, threads)
        elif framework == "ort":
            r = run_ort(d, x, quick, threads)
        else:
            r = run_torch(name, d, x, quick, threads)
        r["max_err"] = check(r.pop("first"), ref)
    except Exception as e:  # noqa: BLE001 (reported in the table)
        traceback.print_exc()
        r = {"error": brief(e)}
    out.write_text(json.dumps(r))


# --- the parent -------------------------------------------------------------------------------------------


def cpu_line() -> str:
    """The CPU model and the ISA the figures were taken with."""
    try:
        name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or "unknown CPU"
    from compiler.codegen.target import cpu

    c = cpu()
    isa = "AVX-512" if c.vector_bytes == 64 else "AVX2" if c.vector_bytes == 32 else "SSE"
    return f"{name} (LLVM {c.name}, {isa}, {c.registers} vector registers, L2 {c.l2 >> 10} KiB, {c.cores} cores)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(MODELS), help=f"models (default: all of {', '.join(MODELS)})")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="few repeats per number")
    p.add_argument("--profile", action="store_true", help="also gc's eight slowest kernels of each model, and any compute-bound one below half the FMA peak")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "gc" / "zoo"))
    p.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo",
                   help="torch.onnx.export's exporter (torchscript: dynamo=False; exports cached apart)")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)  # framework, model, result path
    args = p.parse_args(argv)
    if args.worker:
        framework, name, out = args.worker
        worker(framework, name, Path(args.cache) / name, args.quick, args.threads, args.profile, Path(out))
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"--only: unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    cache = Path(args.cache)
    if args.exporter == "torchscript":  # its exports beside the dynamo ones, never mixed with them
        cache = cache / "torchscript"
    load = os.getloadavg()[0]
    models = []
    for n in names:
        print(f"zoo: preparing {n}", file=sys.stderr, flush=True)
        try:
            m = prepare(n, cache, dynamo=args.exporter == "dynamo")
            import_and_compile(m)
        except Exception as e:  # noqa: BLE001 (one model failing must not stop the others)
            traceback.print_exc()
            m = {"name": n, "error": brief(e)}
        models.append(m)
    env = {**os.environ, **{k: str(args.threads) for k in ("TVM_NUM_THREADS", "OMP_NUM_THREADS",
                                                            "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    frameworks = ["gc", "ort", "torch"]
    roof = None
    with tempfile.TemporaryDirectory(prefix="gc-zoo-") as tmp:
        if args.profile:
            print("zoo: the roofline (the FMA peak, gc's matmul in cache, gc streaming 128 MB)", file=sys.stderr, flush=True)
            out = Path(tmp) / "roofline.json"
            subprocess.run([sys.executable, __file__, "--worker", "roofline", "-", str(out), "--cache", str(cache)],
                           env=env)
            roof = json.loads(out.read_text()) if out.exists() else None
        for m in (m for m in models if "error" not in m):
            runs: dict[str, list[dict]] = {f: [] for f in frameworks}
            for r in range(args.rounds):
                # gc and ONNX Runtime back to back in every round, each first in turn.
                for f in (frameworks if r % 2 == 0 else frameworks[::-1]):
                    print(f"zoo: {m['name']}: {f} (round {r + 1} of {args.rounds})", file=sys.stderr, flush=True)
                    out = Path(tmp) / f"{m['name']}-{f}-{r}.json"
                    cmd = [sys.executable, __file__, "--worker", f, m["name"], str(out), "--cache", str(cache),
                           "--threads", str(args.threads)] + (["--quick"] if args.quick else []) + \
                          (["--profile"] if args.profile and f == "gc" and r == 0 else [])
                    subprocess.run(cmd, env=env)
                    runs[f].append(json.loads(out.read_text()) if out.exists() else {"error": "the worker crashed"})
            m["round_ratios"] = [g["seconds"] / o["seconds"] for g, o in zip(runs["gc"], runs["ort"])
                                 if "seconds" in g and "seconds" in o]
            for f, rs in runs.items():
                ok = [x for x in rs if "seconds" in x]
                m[f] = {"ms": statistics.median(x["seconds"] for x in ok) * 1e3 if ok else None,
                        "rounds_ms": [round(x["seconds"] * 1e3, 3) for x in ok],
                        "max_err": max((x["max_err"] for x in ok), default=None),
                        "error": next((x["error"] for x in rs if "error" in x), None)}
                if f == "gc" and rs and "profile" in rs[0]:
                    m["profile"], m["peak_around"] = rs[0]["profile"], rs[0].get("peak_around")
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\ngc model zoo, {date}: {cpu_line()}, {args.threads} threads per framework, {args.rounds} rounds, "
          f"load average {load:.1f} before\n")
    rows = []
    for m in models:
        if "error" in m:
            rows.append([m["name"], m["error"]] + [""] * 6)
            continue
        g, o, t = (m[f]["ms"] for f in frameworks)
        cells = [f"{v:.2f}" if v else (m[f]["error"] or "n/a") for v, f in zip((g, o, t), frameworks)]
        err = m["gc"]["max_err"]
        # The host's speed drifts between rounds (by up to 2x on a shared VM): the ratio is the median of
        # each round's gc / ORT, the two timed back to back, not the ratio of the medians.
        pairs = m["round_ratios"]
        m["gc_over_ort"] = r = statistics.median(pairs) if pairs else None
        rows.append([m["name"], *cells, f"{r:.2f}" if r else "-", str(m["kernels"]),
                     f"{m['compile_s']:.1f}", f"{err:.1e}" if err is not None else "-"])
    print(table(["model", "gc ms", "ONNX Runtime ms", "torch eager ms", "gc / ORT (rounds)", "kernels", "compile s",
                 "max error"], rows))
    if roof:
        mm = roof.get("matmul_gflops", roof["peak_gflops"])
        peak = (f"FMA peak {roof['peak_gflops']:.0f} GFLOP/s ({args.threads} threads of vector FMAs; gc's "
                f"{'x'.join(map(str, ROOFLINE_MATMUL))} matmul in cache {mm:.0f}, "
                f"{100 * mm / roof['peak_gflops']:.0f}%)" if roof.get("fma_measured") else
                f"{mm:.0f} GFLOP/s (gc's {'x'.join(map(str, ROOFLINE_MATMUL))} matmul in cache; no llvmlite for the FMA peak)")
        print(f"\nroofline: {peak}, {roof['gbs']:.1f} GB/s (gc streaming 128 MB): a kernel below "
              f"{roof['peak_gflops'] / roof['gbs']:.1f} FLOP/byte is memory-bound")
    def line(row: dict, roof: dict | None) -> str:
        return (f"  {row['us']:9.1f} us  {row['gflops']:7.1f} GFLOP/s  {row['gbs']:6.1f} GB/s  "
                f"{bound(row, roof):22s} {row['schedule']:8s} {row['kernel']} ({row['ops']}) {row['loc']}")

    for m in (m for m in models if m.get("profile")):
        around, model_roof = m.get("peak_around"), roof
        head = f"\n{m['name']}: gc's slowest kernels"
        if around and roof:
            # The peak of the minutes the profile ran in (the host drifts): the mean of before and after.
            model_roof = {**roof, "peak_gflops": statistics.mean(around)}
            head += (f" (FMA peak {around[0]:.0f} GFLOP/s before the profile, {around[1]:.0f} after"
                     f"{'; the host changed speed meanwhile: shares are rough' if max(around) > 1.2 * min(around) else ''})")
        print(head)
        for row in m["profile"][:8]:
            print(line(row, model_roof))
        # The bar: no compute-bound kernel below half the FMA peak, whatever its share of the call.
        low = sorted((r for r in m["profile"] if bound(r, model_roof).startswith("compute")
                      and r["gflops"] < model_roof["peak_gflops"] / 2), key=lambda r: r["gflops"])
        total = sum(r["us"] for r in m["profile"]) or 1
        print(f"  compute-bound below half the FMA peak: {len(low)} kernels, "
              f"{100 * sum(r['us'] for r in low) / total:.1f}% of the kernels' time{':' if low else ''}")
        for row in low[:5]:
            print(line(row, model_roof))
    if args.json:
        Path(args.json).write_text(json.dumps({"date": date, "cpu": cpu_line(), "threads": args.threads,
                                               "roofline": roof,
                                               "rounds": args.rounds, "load_average": load, "models": models},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
