"""The memory plan of every example, as the Markdown table in docs/memory.md.

For each example and target: the bytes of intermediates if each had a buffer of its own (naive), the
arena the plan uses, the lower bound (the most bytes alive at one step of the chosen order) and the
same bound for the order the file is written in. CPU plans are serial (64-byte alignment); CUDA plans
keep independent branches apart so that they can run on separate streams (256-byte alignment).

    python tools/memory_report.py            # print the table
    python tools/memory_report.py --check    # exit 1 if docs/memory.md's table is not this one
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compiler.codegen.build import PIPELINE, plan_module  # noqa: E402
from compiler.memory import plan_stats  # noqa: E402
from compiler.parser import parse_file  # noqa: E402
from compiler.pipeline import run_pipeline  # noqa: E402

BEGIN, END = "<!-- memory-report -->", "<!-- /memory-report -->"


def rows() -> list[str]:
    out = ["| example | target | naive | arena | lower bound | file-order bound | arena / bound | arena / naive |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for path in sorted((ROOT / "examples").glob("*.gir")):
        for target in ("llvm", "cuda"):
            m = parse_file(path)
            run_pipeline(m, PIPELINE)
            file_order = plan_module(m, target)
            s = plan_stats(m["main"])
            out.append(f"| {path.stem} | {target} | {s['naive_bytes']:,} | {s['arena_bytes']:,} | "
                       f"{s['lower_bound_bytes']:,} | {file_order:,} | "
                       f"{s['arena_bytes'] / max(s['lower_bound_bytes'], 1):.3f} | "
                       f"{s['arena_bytes'] / max(s['naive_bytes'], 1):.3f} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with docs/memory.md instead of printing")
    args = ap.parse_args()
    table = "\n".join(rows())
    if not args.check:
        print(table)
        return 0
    doc = (ROOT / "docs" / "memory.md").read_text()
    current = doc.split(BEGIN)[1].split(END)[0].strip()
    if current != table:
        print("docs/memory.md is out of date: run python tools/memory_report.py and paste the table", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
