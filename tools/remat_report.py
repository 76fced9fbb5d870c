"""Gradient checkpointing on the training examples, as the Markdown table in docs/remat.md.

For train_mlp.gir and deep_mlp.gir: @main_grad from `autodiff` and the compile pipeline's graph passes (so
matmuls are fused with their bias and activation, and weight transposes with the matmuls reading them), then
`remat` (none, policy=sqrt, budgets spread between the least peak remat reaches and the peak without it,
and one below what it reaches), then `schedule,plan-memory` for the CPU. Each
row: the arena of intermediates, how many saved activations were dropped and ops cloned to recompute them,
and the FLOPs recomputed, absolute and as a share of one forward pass (@main's FLOPs, the loss included).

    python tools/remat_report.py            # print the table
    python tools/remat_report.py --check    # exit 1 if docs/remat.md's table is not this one
    python tools/remat_report.py --write    # put this table into docs/remat.md
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import doc_table

from compiler.diagnostics import GCError
from compiler.ir import Module
from compiler.memory import plan_stats
from compiler.parser import parse_file
from compiler.passes.remat import Grad, search
from compiler.pipeline import PIPELINES, parse_pipeline, run_pipeline
from compiler.stats import module_stats

BEGIN, END = "<!-- remat-report -->", "<!-- /remat-report -->"
EXAMPLES = ["train_mlp", "deep_mlp"]
BETWEEN = [0.75, 0.5, 0.25, 0.0]  # budgets: from the least peak remat reaches (0) to the peak without it (1)


def arena(m: Module) -> int:
    planned = m.clone()
    run_pipeline(planned, "schedule,plan-memory")
    return plan_stats(planned["main_grad"])["arena_bytes"]


def budgets(m: Module, none: int) -> list[int]:
    """Budgets spread between the least peak remat reaches and `none`, in 64-byte units, then one below."""
    _, least = search(Grad(m, m["main_grad"], 64), 0)
    spread = [least + int((none - least) * x) // 64 * 64 for x in BETWEEN]
    return [*dict.fromkeys(spread), least * 9 // 10 // 64 * 64]


def rows() -> list[str]:
    out = [
        "| example | remat | arena (bytes) | vs. none | dropped | cloned ops | extra FLOPs | extra / forward |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in EXAMPLES:
        base = parse_file(ROOT / "examples" / f"{name}.gir")
        run_pipeline(base, "autodiff," + PIPELINES["compile-cuda"])
        forward = module_stats(base, "main")["flops"]
        none = arena(base)
        out.append(f"| {name} | none | {none:,} | 1.000 | 0 | 0 | 0 | 0.0% |")
        seen = set()
        for options in ["policy=sqrt", *(f"budget={b}" for b in budgets(base, none))]:
            m = base.clone()
            passes = parse_pipeline(f"remat{{{options}}}")
            label = f"`{options.replace('policy=', '')}`"
            try:
                run_pipeline(m, passes)
            except GCError as e:
                least = str(e).split("least peak remat reaches is ")[1].split(" bytes")[0]
                out.append(f"| {name} | {label} | error: the least peak remat reaches is {least} | | | | | |")
                continue
            s = passes[0].stats
            size = arena(m)
            if options.startswith("budget") and (size, s["extra-flops"]) in seen:
                continue  # a tighter budget that the same plan meets
            seen.add((size, s["extra-flops"]))
            out.append(
                f"| {name} | {label} | {size:,} | {size / none:.3f} | {s['recomputed']} | {s['cloned-ops']} | "
                f"{s['extra-flops']:,} | {100 * s['extra-flops'] / forward:.1f}% |"
            )
    return out


def main() -> int:
    return doc_table.main(ROOT / "docs" / "remat.md", BEGIN, END, lambda: "\n".join(rows()), __doc__,
                          "remat_report.py")


if __name__ == "__main__":
    sys.exit(main())
