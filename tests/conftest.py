"""Shared fixtures: the repo's .gir files, split into the modules they hold."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
# Tests compile the same modules again and again, some with gc's internals patched: each compile is a real
# one (and the user's cache folder stays untouched). test_cache.py turns the cache on where it tests it;
# subprocesses (the CLI tests) inherit the setting.
os.environ["GC_CACHE"] = "off"


def gir_files() -> list[Path]:
    """Every .gir file in the repo (examples and tests)."""
    files = [*(ROOT / "examples").rglob("*.gir"), *(ROOT / "tests").rglob("*.gir")]
    return sorted(p for p in files if not p.name.endswith(".reproducer.gir"))


def split_chunks(text: str) -> list[tuple[str, int]]:
    from compiler.cli import _chunks

    return _chunks(text, "// -----" in text)


def _hypothesis_profiles() -> None:
    """CI runs hypothesis derandomized, so a red build is reproducible; locally it explores."""
    import os

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")


_hypothesis_profiles()
