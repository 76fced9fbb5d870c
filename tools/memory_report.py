"""The memory plan of every example, as the Markdown table in docs/memory.md.

For each example and target: the bytes of intermediates if each had a buffer of its own (naive), the
arena the plan uses, the lower bound (the most bytes alive at one step of the chosen order, a tensor
with a zero border counted with it: what the schedule needs), the same bound at the tensors' own sizes
(the difference is what borders cost), and the bound for the order the file is written in. Alignment is 64 bytes for llvm and 256 for cuda;
"cuda, concurrent" is `gc compile --target cuda --concurrent`, whose plan keeps independent branches
apart so that their streams never wait for each other's memory.

    python tools/memory_report.py            # print the table
    python tools/memory_report.py --check    # exit 1 if docs/memory.md's table is not this one
    python tools/memory_report.py --write    # put this table into docs/memory.md
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import doc_table

from compiler.codegen.build import plan_module
from compiler.memory import plan_stats
from compiler.parser import parse_file
from compiler.pipeline import PIPELINES, run_pipeline

BEGIN, END = "<!-- memory-report -->", "<!-- /memory-report -->"


def rows() -> list[str]:
    out = ["| example | target | naive | planned | lower bound | tensors' bound | file-order bound | planned / bound | "
           "planned / tensors' bound | planned / naive |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for path in sorted((ROOT / "examples").glob("*.gir")):
        for target, concurrent in (("llvm", False), ("cuda", False), ("cuda", True)):
            m = parse_file(path)
            run_pipeline(m, PIPELINES["compile-cuda"])
            file_order = plan_module(m, target, concurrent=concurrent)
            s = plan_stats(m["main"])
            label = target + (", concurrent" if concurrent else "")
            out.append(f"| {path.stem} | {label} | {s['naive_bytes']:,} | {s['arena_bytes']:,} | "
                       f"{s['lower_bound_bytes']:,} | {s['tensor_bound_bytes']:,} | {file_order:,} | "
                       f"{s['arena_bytes'] / max(s['lower_bound_bytes'], 1):.3f} | "
                       f"{s['arena_bytes'] / max(s['tensor_bound_bytes'], 1):.3f} | "
                       f"{s['arena_bytes'] / max(s['naive_bytes'], 1):.3f} |")
    return out


def main() -> int:
    return doc_table.main(ROOT / "docs" / "memory.md", BEGIN, END, lambda: "\n".join(rows()), __doc__,
                          "memory_report.py")


if __name__ == "__main__":
    sys.exit(main())
