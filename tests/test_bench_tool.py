"""tools/bench.py's bookkeeping (its timings are not tests): rounds merged into one number per cell, and
the frameworks taking turns first from round to round."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench", ROOT / "tools" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounds_merge_into_the_median_of_their_medians(bench) -> None:
    rounds = [{"gc": {"seconds": s, "min_seconds": s - 0.5, "max_err": 1e-7, "kernels": 3}, "gc-params": {"n/a": "x"}}
              for s in (3.0, 1.0, 2.0)]
    merged = bench.merge_rounds(rounds)
    assert merged["gc"]["seconds"] == 2.0 and merged["gc"]["min_seconds"] == 0.5
    assert merged["gc"]["round_seconds"] == [3.0, 1.0, 2.0] and merged["gc"]["kernels"] == 3
    assert merged["gc-params"] == {"n/a": "x"}


def test_a_round_that_failed_does_not_count(bench) -> None:
    merged = bench.merge_rounds([{"seconds": 4.0}, {"error": "boom"}, {"seconds": 2.0}])
    assert merged["seconds"] == 3.0 and merged["round_seconds"] == [4.0, 2.0]


def test_each_round_starts_with_another_framework(bench, tmp_path, monkeypatch) -> None:
    calls = []

    class Done:
        returncode = 0

    def fake_run(cmd, env):
        w, name, r = cmd[cmd.index("--worker") + 1], cmd[cmd.index("--bench") + 1], cmd[cmd.index("--round") + 1]
        calls.append((w, int(r)))
        (tmp_path / f"result-{w}-{name}-{r}.json").write_text(
            '{"versions": {}, "benches": {"%s": {"%s": {"seconds": %d}}}}' % (name, w, 1 + int(r)))
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    job = {"benches": [{"name": "n", "kind": "net"}], "threads": 2, "rounds": 3}
    results = bench.run_workers(job, tmp_path)
    assert calls == [("gc", 0), ("torch", 0), ("ort", 0), ("torch", 1), ("ort", 1), ("gc", 1),
                     ("ort", 2), ("gc", 2), ("torch", 2)]
    assert results["torch"]["benches"]["n"]["torch"]["seconds"] == 2


def test_ab_times_artifacts_in_turns_and_compares_their_outputs(tmp_path, capsys) -> None:
    """tools/ab.py: each artifact's line, the first as the baseline; a second artifact whose outputs differ
    is named."""
    import compiler

    spec = importlib.util.spec_from_file_location("ab", ROOT / "tools" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    relu = "func @main(%x: tensor<64xf32>) -> tensor<64xf32> {\n  %y = graph.relu(%x)\n  return %y\n}\n"
    neg = relu.replace("graph.relu", "graph.neg")
    paths = []
    for i, text in enumerate([relu, relu, neg]):
        paths.append(str(tmp_path / f"m{i}.gcpkg"))
        compiler.compile(text).save(paths[-1])
    assert ab.main([*paths, "--batches", "2", "--calls", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("warning: ") and paths[2] in out[0]
    assert [line.split(":")[0] for line in out[1:]] == paths
    assert out[1].endswith("(1.00x the first)")


def test_the_zoo_measures_the_fma_peak_with_a_loop_compiled_for_this_cpu(monkeypatch) -> None:
    """tools/zoo.py's roofline: the FMA loop llvmlite compiles is valid IR for this host's vector width
    and registers, and runs (a short loop here; its figure is a benchmark's, not a test's)."""
    pytest.importorskip("llvmlite")
    spec = importlib.util.spec_from_file_location("zoo", ROOT / "tools" / "zoo.py")
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    monkeypatch.setattr(zoo, "FMA_LOOP", 100_000)
    assert zoo.fma_peak(2) > 0


def test_the_zoo_exports_with_the_torchscript_exporter_into_a_cache_of_its_own(monkeypatch, tmp_path) -> None:
    """`tools/zoo.py --exporter torchscript`: the same models through torch's older exporter (issue 17 asks
    for both), cached apart so that the two exports of a model never mix."""
    spec = importlib.util.spec_from_file_location("zoo", ROOT / "tools" / "zoo.py")
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    seen = []

    def prepare(name, cache, dynamo=True):
        seen.append((name, Path(cache), dynamo))
        raise RuntimeError("not exported in this test")

    monkeypatch.setattr(zoo, "prepare", prepare)
    for exporter, where, dynamo in [("torchscript", tmp_path / "torchscript", False), ("dynamo", tmp_path, True)]:
        seen.clear()
        assert zoo.main(["--only", "bert", "--rounds", "1", "--cache", str(tmp_path), "--exporter", exporter]) == 0
        assert seen == [("bert", where, dynamo)]
