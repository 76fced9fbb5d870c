"""The accuracy table of docs/mixed_precision.md: each example in f16 and bf16 against f32.

    python tools/mixed_precision_report.py           print the table
    python tools/mixed_precision_report.py --write   replace the table in docs/mixed_precision.md
    python tools/mixed_precision_report.py --check   exit 1 if the table there is not this one

For every example, on the same random inputs (compiler.inputs.random_inputs, seed 0): the f32 module
on the interpreter is the reference; the module after `mixed-precision{dtype=...}` runs on the
interpreter and, compiled with the standard compile pipeline plus mixed-precision before fuse, on
llvm, once with every weight an argument and once with the weights bound at compile time (every float
argument but the first becomes a constant: batch_norm folds into the convolutions first). A f32 row
gives the compiled code's own distance from the interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script, the package need not be installed

import doc_table

from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import Module
from compiler.parser import parse_file
from compiler.passes.mixed_precision import with_mixed_precision
from compiler.pipeline import run_pipeline

DOC = ROOT / "docs" / "mixed_precision.md"
BEGIN, END = "<!-- accuracy table: begin -->", "<!-- accuracy table: end -->"
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.gir"))  # every example
DTYPES = ["f32", "f16", "bf16"]


def errors(want: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    """Max absolute error over all results, and the same divided by the largest |reference| value
    (a normwise relative error: elementwise ratios explode where a result crosses zero)."""
    abs_err, scale = 0.0, 0.0
    for w, g in zip(want, got):
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        abs_err = max(abs_err, float(np.max(np.abs(w64 - g64), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(w64), initial=0.0)))
    return abs_err, abs_err / scale if scale else abs_err


def weights(module: Module, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every float argument of @main but the first (the data): what a deployment binds."""
    floats = [a.name for a in module["main"].args if a.type.dtype.is_float]
    return {n: inputs[n] for n in floats[1:]}


def measure(name: str, dtype: str, targets: bool = True) -> dict[str, tuple[float, float]]:
    """Errors of `name` in `dtype` against f32 on the interpreter, and compiled for llvm if `targets`."""
    import compiler
    from compiler.pipeline import PIPELINES

    original = parse_file(ROOT / "examples" / f"{name}.gir")
    inputs = random_inputs(original["main"], 0, original)
    want = run(original, inputs)
    out: dict[str, tuple[float, float]] = {}
    module = original.clone()
    if dtype != "f32":
        run_pipeline(module, f"mixed-precision{{dtype={dtype}}},canonicalize")
    out["interp"] = errors(want, run(module, inputs))
    if not targets:
        return out
    pipeline = PIPELINES["compile-cuda"] if dtype == "f32" else with_mixed_precision(PIPELINES["compile-cuda"], dtype)
    model = compiler.compile(original, "llvm", pipeline=pipeline)
    out["llvm"] = errors(want, model(**inputs))
    bound = weights(original, inputs)
    model = compiler.compile(original, "llvm", pipeline=pipeline, params=bound)
    out["llvm-bound"] = errors(want, model(**{k: v for k, v in inputs.items() if k not in bound}))
    return out


def table() -> str:
    head = (
        "| example | dtype | interpreter abs | interpreter rel | llvm abs | llvm rel "
        "| llvm, weights bound abs | llvm, weights bound rel |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for name in EXAMPLES:
        for dtype in DTYPES:
            e = measure(name, dtype)
            cells = [f"{e[k][0]:.2e} | {e[k][1]:.2e}" for k in ("interp", "llvm", "llvm-bound")]
            lines.append(f"| {name} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    return doc_table.main(DOC, BEGIN, END, table, __doc__, "mixed_precision_report.py")


if __name__ == "__main__":
    sys.exit(main())
