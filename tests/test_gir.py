"""Runs every `// RUN:` line of the .gir tests under tests/gir, lit-style, under pytest.

Substitutions: %s is the test file, gc is `python -m compiler` of this interpreter, filecheck is the
Python FileCheck, `not CMD` succeeds when CMD fails. Lines run under bash with pipefail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GIR_TESTS = sorted(p for p in (ROOT / "tests" / "gir").rglob("*.gir") if not p.name.endswith(".reproducer.gir"))
BIN = Path(sys.executable).parent


def run_lines(path: Path) -> list[str]:
    lines, cur = [], ""
    for line in path.read_text().splitlines():
        m = re.match(r"\s*//\s*RUN:\s?(.*)$", line)
        if not m:
            continue
        cur += m.group(1)
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        lines.append(cur)
        cur = ""
    return lines


def substitute(cmd: str, path: Path) -> str:
    gc = f"{sys.executable} -m compiler"
    filecheck = str(BIN / "filecheck") if (BIN / "filecheck").exists() else "filecheck"
    cmd = cmd.replace("%s", str(path))
    cmd = re.sub(r"(^|[|;&(]\s*|\bnot\s+)gc\b", lambda m: m.group(1) + gc, cmd)
    cmd = re.sub(r"(^|[|;&(]\s*)filecheck\b", lambda m: m.group(1) + filecheck, cmd)
    cmd = re.sub(r"(^|[|;&(]\s*)not\s+", lambda m: m.group(1) + "! ", cmd)
    return cmd


@pytest.mark.parametrize("path", GIR_TESTS, ids=[str(p.relative_to(ROOT / "tests" / "gir")) for p in GIR_TESTS])
def test_gir_file(path: Path) -> None:
    lines = run_lines(path)
    assert lines, f"{path} has no RUN line"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for line in lines:
        cmd = substitute(line, path)
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, env=env, cwd=ROOT)
        assert proc.returncode == 0, f"RUN: {line}\n$ {cmd}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
