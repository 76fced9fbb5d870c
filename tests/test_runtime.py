"""The compiled model under concurrent calls: every thread gets its own right answer.

GC_STRESS_CALLS=2000 pytest tests/test_runtime.py makes each thread call that many times (default 25)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import compiler
from compiler.inputs import random_inputs
from compiler.parser import parse_file
from conftest import ROOT

THREADS = 4
CALLS = int(os.environ.get("GC_STRESS_CALLS", "25"))


def hammer(model, sets: list[dict], want: list[np.ndarray], calls: int, threads: int = THREADS) -> list[str]:
    """`threads` threads each calling `model` `calls` times on rotating input sets; what came back wrong."""
    wrong: list[str] = []
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        start.wait()
        for i in range(calls):
            k = (t + i) % len(sets)
            got = model(**sets[k])[0]
            if not np.array_equal(got, want[k]):
                wrong.append(f"thread {t} call {i} set {k}")

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return wrong


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_threads_calling_one_model_get_their_own_results(name: str) -> None:
    path = ROOT / "examples" / f"{name}.gir"
    module = parse_file(path)
    model = compiler.compile(str(path), "llvm")
    sets = [random_inputs(module["main"], seed, module) for seed in range(6)]
    want = [model(**x)[0] for x in sets]  # one thread: the reference, itself checked in test_compile
    assert all(not np.array_equal(want[0], w) for w in want[1:])  # a mix-up would show
    assert hammer(model, sets, want, calls=CALLS) == []
    assert 1 <= len(model._idle) <= THREADS  # a workspace per call in flight, kept for the next


def test_run_into_and_profile_are_safe_beside_calls(tmp_path: Path) -> None:
    path = ROOT / "examples" / "mlp.gir"
    module = parse_file(path)
    model = compiler.compile(str(path), "llvm")
    sets = [random_inputs(module["main"], seed, module) for seed in range(3)]
    want = [model(**x)[0] for x in sets]
    errors: list[str] = []

    def into() -> None:
        out = np.empty_like(want[1])
        for _ in range(20):
            model.run_into([out], **sets[1])
            if not np.array_equal(out, want[1]):
                errors.append("run_into")

    def profiled() -> None:
        model.profile(**sets[2], repeat=3, warmup=1)

    threads = [threading.Thread(target=into), threading.Thread(target=profiled)]
    for t in threads:
        t.start()
    wrong = hammer(model, sets[:1], want[:1], calls=20, threads=2)
    for t in threads:
        t.join()
    assert wrong == [] and errors == []


def test_a_loaded_artifact_is_as_safe(tmp_path: Path) -> None:
    path = ROOT / "examples" / "cnn.gir"
    module = parse_file(path)
    compiler.compile(str(path), "llvm").save(tmp_path / "cnn.gcpkg")
    model = compiler.load(tmp_path / "cnn.gcpkg")
    sets = [random_inputs(module["main"], seed, module) for seed in range(4)]
    want = [compiler.run(module, x)[0] for x in sets]
    got = [model(**x)[0] for x in sets]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert hammer(model, sets, got, calls=CALLS) == []
