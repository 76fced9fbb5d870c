"""A table generated into a doc between two marker comments: print it, check the doc has it, or write it.

The report tools (memory_report.py, remat_report.py, mixed_precision_report.py) each make a Markdown
table and call `main` with their doc and markers; the tests run them with --check.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(doc: Path, begin: str, end: str, make: Callable[[], str], description: str, tool: str) -> int:
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {doc.name}'s table is not this one")
    mode.add_argument("--write", action="store_true", help=f"replace the table in {doc.name}")
    args = ap.parse_args()
    table = make().strip()
    if not (args.check or args.write):
        print(table)
        return 0
    text = doc.read_text()
    before, _, rest = text.partition(begin)
    current, _, after = rest.partition(end)
    if args.write:
        doc.write_text(f"{before}{begin}\n{table}\n{end}{after}")
        return 0
    if current.strip() != table:
        print(f"{doc.name} is out of date: run python tools/{tool} --write", file=sys.stderr)
        return 1
    return 0
