#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one run: CUDA tests, CLI on the examples, streams, and
# tools/bench_cuda.py (matmul vs cuBLAS, nets vs torch CUDA). For a lent machine that has python3, torch,
# numpy, ml_dtypes and nvcc but not TVM: BUNDLE names a folder holding site.tar.xz (TVM, tvm_ffi, lark,
# graphviz unpacked from their wheels, without libtvm_compiler.so) and libtvm_compiler.so.xz, which the
# device tool's 64 MiB limit cannot carry as a wheel. Logs go to $OUT (or ./gpu-out).
#
#   BUNDLE=.gpu OUT=/tmp/out [BENCH_ONLY=nets] [ZOO=bert,gpt2] bash tools/gpu_check.sh \
#     [tests,dynamic,cli,streams,bench,zoo,suite]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
STEPS=${1:-tests,cli,streams,bench}
SITE=/tmp/gc-site
log() { echo "== $* ($(date +%T))"; }

if [ -n "${BUNDLE:-}" ] && [ ! -e "$SITE/tvm/lib/libtvm_compiler.so" ]; then
  log unpacking "$BUNDLE"
  python3 - "$BUNDLE" "$SITE" <<'EOF' || exit 1
import lzma, shutil, sys, tarfile
bundle, site = sys.argv[1:]
with tarfile.open(f"{bundle}/site.tar.xz") as t:
    t.extractall(site, filter="data")
with lzma.open(f"{bundle}/libtvm_compiler.so.xz") as src, open(f"{site}/tvm/lib/libtvm_compiler.so", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 24)
EOF
fi
[ -n "${BUNDLE:-}" ] && export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 - <<'EOF' 2>&1 | tee -a "$OUT/gpu.txt" || exit 1
import sys, numpy, tvm, torch
print("python", sys.version.split()[0], "numpy", numpy.__version__, "tvm", tvm.__version__, "torch", torch.__version__)
print("tvm cuda runtime:", tvm.runtime.enabled("cuda"), "device:", tvm.cuda(0).exist,
      "compute", tvm.cuda(0).compute_version if tvm.cuda(0).exist else "-")
import compiler, numpy as np
m = compiler.compile("func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {\n"
                     "  %z = graph.add(%x, %y)\n  return %z\n}\n", "cuda")
print("add on the GPU:", m(np.ones(4, np.float32), np.full(4, 2, np.float32))[0], "target", m.target)
EOF

if [[ $STEPS == *tests* ]]; then
  # (--timeout: pytest-timeout, in the lent image; one slow kernel build must not take the whole lease)
  log tests/test_codegen_cuda.py and the cuda cases of tests/test_nan.py
  python3 -m pytest tests/test_codegen_cuda.py tests/test_nan.py -q -n 8 -p no:cacheprovider -rfEs --no-header --timeout 180 2>&1 |
    tee "$OUT/test_codegen_cuda.log" | tail -40
fi

if [[ $STEPS == *dynamic* ]]; then
  log "tools/bench_dynamic.py --target cuda: one ? model against the static one per size"
  timeout 300 python3 tools/bench_dynamic.py --target cuda --batches 9 2>&1 | tee "$OUT/dynamic.log"
fi

if [[ $STEPS == *cli* ]]; then
  log CLI on the examples
  {
    for f in examples/*.gir; do
      echo "--- gc run $f --target cuda, against --target interp"
      timeout 120 python3 -m compiler run "$f" --target cuda --random-inputs 0 --outputs /tmp/cuda.npz 2>&1 | tail -4
      timeout 120 python3 -m compiler run "$f" --random-inputs 0 --outputs /tmp/interp.npz --quiet &&
        python3 -c "import numpy as np; a, b = np.load('/tmp/cuda.npz'), np.load('/tmp/interp.npz'); \
print('matches interp:', all(np.allclose(a[k], b[k], rtol=1e-3, atol=1e-4) for k in b.files))"
    done
    for f in examples/cnn.gir examples/transformer.gir examples/inception.gir; do
      echo "--- gc run $f --target cuda --profile 50"
      timeout 120 python3 -m compiler run "$f" --target cuda --random-inputs 0 --profile 50 --quiet 2>&1 | tail -25
    done
  } 2>&1 | tee "$OUT/cli.log"
fi

if [[ $STEPS == *streams* ]]; then
  log "streams: examples/inception.gir, whole calls, the plan's streams vs the same launches on one stream"
  {
    timeout 180 python3 - <<'PY'
import statistics, time, numpy as np, compiler
from compiler.codegen.runtime import _getter
mod = compiler.parse(open("examples/inception.gir").read(), "inception.gir")
from compiler.inputs import random_inputs
inputs = random_inputs(mod["main"], 0, mod)
want = compiler.run(mod, inputs)[0]

def timed(m):
    for _ in range(20): m(**inputs)
    ts = []
    for _ in range(300):
        t = time.perf_counter(); m(**inputs); ts.append(time.perf_counter() - t)
    return 1e6 * statistics.median(ts)

for label, kw in [("default plan", {}), ("--concurrent", {"concurrent": True})]:
    m = compiler.compile("examples/inception.gir", "cuda", **kw)
    ok = [np.allclose(m(**inputs)[0], want, rtol=1e-3, atol=1e-4) for _ in range(5)]
    streams = 1 + max(c.stream for c in m.plan.steps)
    multi = timed(m)
    (ws,) = m._idle  # one caller: the one workspace; its launches again, on the default stream alone
    ws.streams = None
    ws.calls = [(fn, _getter(idx)) for fn, idx in filter(None, (m._step(c, None) for c in m.plan.steps))]
    one = timed(m)
    print(f"{label}: {streams} streams, 5 calls match interp: {all(ok)}; whole call median {multi:.1f} us "
          f"on the streams, {one:.1f} us on one stream")
PY
  } 2>&1 | tee "$OUT/streams.log"
fi

if [[ $STEPS == *bench* ]]; then
  log tools/bench_cuda.py
  timeout 300 python3 tools/bench_cuda.py --only "${BENCH_ONLY:-matmul,nets,resnet}" --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.log" | grep -v '^{' | tail -40
fi

if [[ $STEPS == *zoo* ]]; then
  # exports each model there first (torchvision, transformers and onnxscript are in the lent image)
  log "tools/bench_cuda.py --only zoo: ${ZOO:-every model}"
  timeout "${ZOO_TIMEOUT:-400}" python3 tools/bench_cuda.py --only zoo ${ZOO:+--zoo "$ZOO"} \
    --json "$OUT/bench_zoo.json" 2>&1 | tee "$OUT/bench_zoo.log" | grep -v '^{' | tail -40
fi

if [[ $STEPS == *suite* ]]; then
  log the whole suite beside a GPU
  timeout 400 python3 -m pytest -q -n 14 -p no:cacheprovider --no-header -x 2>&1 | tee "$OUT/suite.log" | tail -30
fi
log done
