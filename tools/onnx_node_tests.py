"""The ONNX project's backend node tests, run through gc: each case's model imported with gc's importer and run
on the reference interpreter (and, with --target llvm, compiled), its outputs compared with the case's.

    python tools/onnx_node_tests.py                          # every case, interp: counts by outcome
    python tools/onnx_node_tests.py --target llvm            # compiled too (minutes)
    python tools/onnx_node_tests.py --only abs,gather_nd     # cases whose name contains one of these
    python tools/onnx_node_tests.py --write-expected         # rewrite tests/onnx_node_expected.txt

The onnx wheel ships the cases' definitions (`onnx.backend.test.case.node`), not their data files; the
data is made from the definitions as onnx's own generator makes it (NumPy seeded first: many cases draw
random inputs). Each case ends as one of:

- pass: every output of the case's dtype and shape, within the case's rtol/atol (NaN where it has NaN; a
  16-bit float output within two steps of its precision at least, see `_rtol`);
- rejected: gc says why it cannot take the model (an op or a type it lacks, an input it needs constant):
  one diagnostic, the reason of the entry in the expected-failure list;
- unsupported: the case needs what a tensor graph cannot give (sequences, optionals, several data sets);
- wrong: gc runs it and gets other values, dtype or shape;
- error: gc fails while running it with a diagnostic;
- crash: anything else escaping gc (a bug in gc).

tests/onnx_node_expected.txt lists every case that does not pass, with its outcome and reason; the test
suite (tests/test_onnx_node.py) checks a sample of the cases against it in CI and all of them with
GC_ONNX_NODE=all, so a case that starts passing, or fails another way, shows up.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXPECTED = ROOT / "tests" / "onnx_node_expected.txt"
OUTCOMES = ("pass", "rejected", "unsupported", "wrong", "error", "crash")


@dataclass
class Case:
    name: str
    model: object
    inputs: list
    outputs: list
    rtol: float
    atol: float
    why_unsupported: str = ""
    float_tensors: bool = False  # every input and output a float tensor, no subgraph: the subset


def cases() -> list[Case]:
    """Every node test case of the installed onnx, its data made as onnx's generator makes it."""
    np.random.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        raw = collect_testcases()
    out = []
    for c in raw:
        why = ""
        if len(c.data_sets) != 1:
            why = f"{len(c.data_sets)} data sets"
        ins, outs = c.data_sets[0] if c.data_sets else ([], [])
        ins, outs = [_array(x) for x in ins], [_array(x) for x in outs]
        if any(not isinstance(x, np.ndarray) for x in [*ins, *outs]):
            why = why or "sequence or optional values"
        floats = not why and all(x.dtype.kind == "f" or x.dtype.name == "bfloat16" for x in [*ins, *outs])
        subgraphs = any(a.type in (5, 10) for node in c.model.graph.node for a in node.attribute)  # GRAPH(S)
        out.append(Case(c.name, c.model, ins, outs, c.rtol, c.atol, why, floats and not subgraphs))
    return out


def _array(x):
    """A NumPy scalar (a 0-d input such as a window's size) as the 0-d array it stands for; a TensorProto
    (onnx gives the data of 16-bit, 8-bit and 4-bit float and integer casts so) as its array."""
    if isinstance(x, np.generic):
        return np.asarray(x)
    if type(x).__name__ == "TensorProto":
        from onnx import numpy_helper

        return numpy_helper.to_array(x)
    return x


def run_case(case: Case, target: str = "interp") -> tuple[str, str]:
    """(outcome, reason) of one case on the interpreter ("interp") or compiled for "llvm"."""
    import compiler
    from compiler.diagnostics import GCError
    from compiler.importers.onnx import import_onnx

    if case.why_unsupported:
        return "unsupported", case.why_unsupported
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imported = import_onnx(case.model, file=case.name)
    except GCError as e:
        return "rejected", _first_line(e)
    except Exception as e:  # noqa: BLE001 (what escapes the importer is a bug in gc: counted, not raised)
        return "crash", f"import: {type(e).__name__}: {_first_line(e)}"
    f = imported.module["main"]
    data = f.args[: len(f.args) - len(imported.weights)]
    if len(data) != len(case.inputs):
        return "wrong", f"{len(data)} data arguments for the case's {len(case.inputs)} inputs"
    args = [*case.inputs, *(imported.weights[a.name] for a in f.args[len(data) :])]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if target == "interp":
                got = compiler.run(imported.module, args)
            else:
                got = compiler.compile(imported.module, target, cache=False)(*args)
    except GCError as e:
        return "error", _first_line(e)
    except Exception as e:  # noqa: BLE001
        return "crash", f"{type(e).__name__}: {_first_line(e)}"
    return compare(got, case)


def compare(got: list, case: Case) -> tuple[str, str]:
    if len(got) != len(case.outputs):
        return "wrong", f"{len(got)} outputs, the case has {len(case.outputs)}"
    for i, (g, e) in enumerate(zip(got, case.outputs)):
        g = np.asarray(g)
        if g.shape != e.shape:
            return "wrong", f"output {i}: shape {list(g.shape)}, expected {list(e.shape)}"
        if g.dtype != e.dtype:
            return "wrong", f"output {i}: {g.dtype}, expected {e.dtype}"
        if e.dtype.kind in "fc" or e.dtype.name == "bfloat16":  # (ml_dtypes' bf16 is of kind "V")
            ok = np.allclose(g.astype(np.float64), e.astype(np.float64), rtol=_rtol(case, e.dtype), atol=case.atol,
                             equal_nan=True)
        else:
            ok = np.array_equal(g, e)
        if not ok:
            err = np.abs(g.astype(np.float64) - e.astype(np.float64))
            scale = float(np.nanmax(np.abs(e.astype(np.float64)))) if e.size else 0.0
            return "wrong", (f"output {i}: values differ by up to {float(np.nanmax(err)):.3g} at an output scale of "
                             f"{scale:.3g} ({e.dtype}; the case allows rtol {case.rtol:g}, atol {case.atol:g})")
    return "pass", ""


def _rtol(case: Case, dtype) -> float:
    """The case's rtol, but at least two steps of a 16-bit float output's precision where the case
    computes (not where it only converts: a cast must round exactly): onnx's bf16 and f16 attention cases
    ask 1e-3 of values whose step is 4e-3 (bf16 at 0.5-1), which rounding intermediates otherwise than
    onnx's reference does (gc sums in float32) cannot meet."""
    converts = {node.op_type for node in case.model.graph.node} <= {"Cast", "CastLike", "Identity"}
    if dtype.name in ("bfloat16", "float16") and not converts:
        step = 2.0**-7 if dtype.name == "bfloat16" else 2.0**-10
        return max(case.rtol, 2 * step)
    return case.rtol


def _first_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text[:200]


def onnx_version() -> str:
    import onnx

    return onnx.__version__


def written_for(path: Path = EXPECTED) -> str:
    """The onnx version the list was written with (its cases and their random data are that version's)."""
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("# onnx "):
                return line.split()[2]
    return ""


def read_expected(path: Path = EXPECTED) -> dict[str, tuple[str, str]]:
    """name -> (outcome, reason) of every case the list expects not to pass."""
    out = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, outcome, reason = (line.split("\t") + ["", ""])[:3]
        out[name] = (outcome, reason)
    return out


def write_expected(results: dict[str, tuple[str, str]], path: Path = EXPECTED) -> None:
    counts = Counter(o for o, _ in results.values())
    head = ["# The ONNX backend node tests gc does not pass (tools/onnx_node_tests.py --write-expected writes it).",
            f"# onnx {onnx_version()}",
            "# name<TAB>outcome<TAB>reason; outcomes: " + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES) + "."]
    rows = [f"{n}\t{o}\t{r}" for n, (o, r) in sorted(results.items()) if o != "pass"]
    path.write_text("\n".join(head + rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="interp", choices=["interp", "llvm"])
    p.add_argument("--only", default="", help="comma-separated parts of case names")
    p.add_argument("--write-expected", action="store_true", help=f"rewrite {EXPECTED.relative_to(ROOT)}")
    p.add_argument("--show", default="", help="print the cases of these outcomes with their reasons")
    args = p.parse_args(argv)
    parts = [s for s in args.only.split(",") if s]
    todo = [c for c in cases() if not parts or any(s in c.name for s in parts)]
    results = {}
    for c in todo:
        results[c.name] = run_case(c, args.target)
    counts = Counter(o for o, _ in results.values())
    shown = set(args.show.split(",")) if args.show else set()
    for name, (o, r) in sorted(results.items()):
        if o in shown:
            print(f"{o:12} {name}: {r}")
    total = len(results)
    print(f"{total} cases on {args.target}: " + ", ".join(f"{o} {counts[o]} ({100 * counts[o] / max(total, 1):.1f}%)"
                                                        for o in OUTCOMES))
    floats = [c.name for c in todo if c.float_tensors]
    passed = sum(results[n][0] == "pass" for n in floats)
    print(f"float-tensor models without subgraphs: {passed} of {len(floats)} pass ({100 * passed / max(len(floats), 1):.1f}%)")
    if args.write_expected:
        write_expected(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
