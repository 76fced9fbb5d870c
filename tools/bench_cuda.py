"""Benchmark gc's CUDA target against PyTorch on the GPU: matmul against cuBLAS, and the example nets.

    python tools/bench_cuda.py [--only matmul,nets,resnet] [--json out.json]

Needs an NVIDIA GPU, TVM's CUDA runtime and torch with CUDA (`nvidia-smi` and `torch.cuda.is_available()`).
What each number is:
  matmul  one gc kernel (`graph.matmul`, dlight's Matmul rule) against torch.matmul (cuBLAS), both on
          tensors already on the GPU, timed back to back with a synchronisation at the end of each sample:
          TFLOP/s and gc's share of cuBLAS's. f32 with TF32 off on both sides (gc computes true f32), and f16.
  nets    the examples, compiled for cuda with their weights bound and checked against the interpreter,
          then timed two ways against torch eager on the same graph and weights (bench.py's translation):
          `device` - the kernels (torch: the module) on GPU-resident buffers, no host copies;
          `call`   - a whole call from NumPy arrays to NumPy arrays, as `model(x)` is used (host copies in).
  resnet  ResNet-18 exported from torch and imported with `gc import` (bench.py's net), the same two ways.
  zoo     tools/zoo.py's models (exported to ONNX once, cached under --cache), imported with `gc import`,
          compiled for cuda with their weights and checked against ONNX Runtime's output, the same two ways
          against the torchvision or Hugging Face module in eager mode on the GPU (--zoo picks the models).
Every number is the median of repeated samples; each framework's run is separate (one after the other in
one process: unlike the CPU's thread pools, the GPU work of one does not run while the other is timed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GC_CACHE", "off")  # compile seconds are cold compiles, and builds keep their TIR
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import bench  # noqa: E402  (the CPU benchmark's nets and GIR -> torch translation)

MATMULS = [(1024, 1024, 1024, "f32"), (4096, 4096, 4096, "f32"), (64, 784, 1024, "f32"), (64, 1024, 1024, "f32"),
           (64, 1024, 10, "f32"), (1024, 1024, 1024, "f16"), (4096, 4096, 4096, "f16")]
NETS = ["mlp-b64", "cnn-b1", "cnn-b16", "transformer", "inception"]


def median_seconds(fn, sync, budget: float = 1.0, min_reps: int = 5) -> float:
    """Median seconds per call of `fn` (asynchronous GPU work), `sync` ending each sample."""
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, int(2e-3 / one))  # samples of at least ~2 ms, so launch jitter averages out
    reps = max(min_reps, min(200, int(budget / (one * inner))))
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - t) / inner)
    return statistics.median(samples)


def resident(model, inputs: dict[str, np.ndarray]):
    """The model's kernels run back to back on its own GPU buffers (inputs copied there once)."""
    ws = model._take()  # held by run(): its arena views live as long as the workspace
    bufs = model._buffers_for(ws, model._bind((), inputs))
    steps = [(fn, [bufs[j] for j in idx]) for fn, idx in model._plain_calls()]

    def run(ws=ws) -> None:
        for fn, xs in steps:
            fn(*xs)

    return run


def gc_matmul(m: int, k: int, n: int, dtype: str, torch) -> dict:
    import compiler

    gir = bench.matmul_gir(m, k, n).replace("xf32>", f"x{dtype}>")
    np_dtype = {"f32": np.float32, "f16": np.float16}[dtype]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np_dtype)
    b = rng.standard_normal((k, n)).astype(np_dtype)
    t = time.perf_counter()
    model = compiler.compile(gir, "cuda")
    compile_s = time.perf_counter() - t
    got = model(a, b)[0].astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    sync = model.device.sync
    gc_s = median_seconds(resident(model, {"a": a, "b": b}), sync)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    torch_s = median_seconds(lambda: torch.matmul(ta, tb), torch.cuda.synchronize)
    tref = torch.matmul(ta, tb).double().cpu().numpy()
    trel = float(np.linalg.norm(tref - ref) / np.linalg.norm(ref))
    flop = 2 * m * k * n
    sched = [str(f.attrs["gc.schedule"]) for f in model.scheduled.functions.values() if "gc.schedule" in f.attrs]
    return {"name": f"matmul-{m}x{k}x{n}-{dtype}", "gc_us": gc_s * 1e6, "cublas_us": torch_s * 1e6,
            "gc_tflops": flop / gc_s / 1e12, "cublas_tflops": flop / torch_s / 1e12, "share": torch_s / gc_s,
            "gc_rel_err": rel, "cublas_rel_err": trel, "compile_s": compile_s, "schedule": sched}


def net_benches(names: list[str]) -> list[dict]:
    out = [b for b in bench.benches() if b["name"] in names]
    if "inception" in names:
        out.append({"name": "inception", "group": "inception", "kind": "net", "data": ["x"],
                    "gir": (ROOT / "examples" / "inception.gir").read_text()})
    return out


def gc_net(b: dict, torch) -> dict:
    import compiler
    from compiler.inputs import random_inputs

    weights = {}
    if b.get("onnx") == "resnet18":
        b["gir"], weights = bench.resnet18_onnx(0)
    module = compiler.parse(b["gir"], b["name"])
    inputs = {**random_inputs(module["main"], 0, module), **weights}
    expected = compiler.run(module, inputs)[0]
    row: dict = {"name": b["name"]}
    t = time.perf_counter()
    data = {k: v for k, v in inputs.items() if k in b["data"]}
    model = compiler.compile(b["gir"], "cuda", params={k: v for k, v in inputs.items() if k not in data})
    row["compile_s"] = time.perf_counter() - t
    row["kernels"] = model.num_kernels
    row["max_err"] = bench.check(model(**data)[0], np.asarray(expected))
    row["gc_call_ms"] = median_seconds(lambda: model(**data), lambda: None) * 1e3
    row["gc_device_ms"] = median_seconds(resident(model, data), model.device.sync) * 1e3
    p = model.profile(**data, repeat=20, warmup=3)
    row["worst"] = [(r.name, ",".join(r.ops), r.schedule, round(r.us, 1), round(r.gflops, 1)) for r in p.top(3)]
    try:
        row.update(torch_net(b, module, inputs, expected, torch))
    except Exception as e:  # noqa: BLE001 (gc's numbers stand without torch's)
        traceback.print_exc()
        row["torch_error"] = bench.brief(e)
    return row


def torch_net(b: dict, module, inputs: dict[str, np.ndarray], expected, torch) -> dict:
    weights = {k: v for k, v in inputs.items() if k not in b["data"]}
    net_w = bench.to_torch(module, weights, b["data"])
    # to_torch captures the weights as CPU tensors in its scope; move every captured tensor to the GPU.
    scope = net_w.__globals__
    scope["W"] = {k: v.cuda() for k, v in scope["W"].items()}
    scope["C"][:] = [c.cuda() for c in scope["C"]]
    xs = [torch.from_numpy(inputs[k]).cuda() for k in b["data"]]
    out: dict = {}
    with torch.inference_mode():
        bench.check(net_w(*xs).cpu().numpy(), np.asarray(expected))
        out["torch_device_ms"] = median_seconds(lambda: net_w(*xs), torch.cuda.synchronize) * 1e3
        host = [inputs[k] for k in b["data"]]
        out["torch_call_ms"] = median_seconds(
            lambda: net_w(*[torch.from_numpy(x).cuda() for x in host]).cpu().numpy(), lambda: None) * 1e3
    return out


def zoo_net(name: str, cache: Path, torch) -> dict:
    """One zoo model: gc import, compile for cuda with its weights, check, time; torchvision eager beside it."""
    import onnx
    import zoo

    import compiler
    from compiler.importers.onnx import import_onnx

    d = Path(zoo.prepare(name, cache)["dir"])
    x, ref = np.load(d / "input.npy"), np.load(d / "reference.npy")
    row: dict = {"name": f"{name}-b1"}
    t = time.perf_counter()
    imported = import_onnx(onnx.load(str(d / "model.onnx")), gir_name=f"{name}.gir")
    model = compiler.compile(imported.text, "cuda", params=imported.weights)
    row["compile_s"] = time.perf_counter() - t
    row["kernels"] = model.num_kernels
    row["max_err"] = bench.check(model(x)[0], ref)
    row["gc_call_ms"] = median_seconds(lambda: model(x), lambda: None) * 1e3
    # weights bound: the image is the model's one argument
    row["gc_device_ms"] = median_seconds(resident(model, {model.arg_names[0]: x}), model.device.sync) * 1e3
    p = model.profile(x, repeat=20, warmup=3)
    row["worst"] = [(r.name, ",".join(r.ops), r.schedule, round(r.us, 1), round(r.gflops, 1)) for r in p.top(3)]
    if name in zoo.TEXT:  # Hugging Face: the same module the export traced, its weights from the export
        net = zoo.text_model(name)
    else:
        net = getattr(zoo.import_torchvision().models, name)(weights=None)
    net.load_state_dict(torch.load(d / "state.pt"))
    net = net.eval().cuda()
    xt = torch.from_numpy(x).cuda()
    with torch.inference_mode():
        row["torch_max_err"] = bench.check(net(xt).cpu().numpy(), ref)
        row["torch_device_ms"] = median_seconds(lambda: net(xt), torch.cuda.synchronize) * 1e3
        row["torch_call_ms"] = median_seconds(lambda: net(torch.from_numpy(x).cuda()).cpu().numpy(),
                                              lambda: None) * 1e3
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="matmul,nets,resnet")
    ap.add_argument("--zoo", default="resnet50,mobilenet_v2,efficientnet_b0,shufflenet_v2_x1_0,squeezenet1_1,"
                    "densenet121,vit_b_16,swin_t,bert,gpt2,distilbert", help="the zoo models --only zoo runs")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "gc" / "zoo"), help="the zoo's exports")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    import tvm

    only = set(args.only.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "tvm": tvm.__version__,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}
    print(json.dumps(info), flush=True)
    results: dict = {"machine": info, "matmul": [], "nets": []}
    if "matmul" in only:
        for m, k, n, dt in MATMULS:
            try:
                r = gc_matmul(m, k, n, dt, torch)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                r = {"name": f"matmul-{m}x{k}x{n}-{dt}", "error": bench.brief(e)}
            results["matmul"].append(r)
            print(json.dumps(r), flush=True)
    names = (NETS if "nets" in only else []) + (["resnet18-onnx-b1"] if "resnet" in only else [])
    for b in net_benches(names):
        try:
            r = gc_net(b, torch)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            r = {"name": b["name"], "error": bench.brief(e)}
        results["nets"].append(r)
        print(json.dumps(r), flush=True)
    for name in args.zoo.split(",") if "zoo" in only else []:
        try:
            r = zoo_net(name, Path(args.cache), torch)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            r = {"name": f"{name}-b1", "error": bench.brief(e)}
        results["nets"].append(r)
        print(json.dumps(r), flush=True)
    na = lambda r, k: r[k] if k in r else float("nan")  # noqa: E731 (torch absent: n/a)
    rows = [[r["name"], f"error: {r['error']}"] + [""] * 4 if "error" in r else
            [r["name"], f"{r['gc_us']:.1f}", f"{r['cublas_us']:.1f}", f"{r['gc_tflops']:.2f}",
             f"{r['cublas_tflops']:.2f}", f"{100 * r['share']:.0f}%"] for r in results["matmul"]]
    print("\n" + bench.table(["matmul", "gc us", "cuBLAS us", "gc TFLOP/s", "cuBLAS TFLOP/s", "gc / cuBLAS speed"],
                             rows))
    rows = [[r["name"], f"error: {r['error']}"] + [""] * 6 if "error" in r else
            [r["name"], f"{r['gc_device_ms']:.3f}", f"{na(r, 'torch_device_ms'):.3f}",
             f"{r['gc_device_ms'] / na(r, 'torch_device_ms'):.2f}", f"{r['gc_call_ms']:.3f}",
             f"{na(r, 'torch_call_ms'):.3f}", f"{r['gc_call_ms'] / na(r, 'torch_call_ms'):.2f}", f"{r['compile_s']:.1f}"]
            for r in results["nets"]]
    print("\n" + bench.table(["net", "gc device ms", "torch device ms", "ratio", "gc call ms", "torch call ms", "ratio",
                              "compile s"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
