"""The compile cache (compiler/cache.py): an unchanged model is answered from the cache, anything the compile
depends on changing misses it, a damaged entry is compiled again, and the folder keeps to its size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import gc

import compiler
from compiler import cache
from compiler.inputs import random_inputs

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "mlp.gir"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GC_CACHE", "on")
    monkeypatch.setenv("GC_CACHE_DIR", str(d))
    monkeypatch.delenv("GC_CACHE_MAX_MB", raising=False)
    return d


def weights(path: Path, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(data inputs, weights) of an example: its arguments other than %x are weights."""
    module = compiler.parse_file(path)
    inputs = random_inputs(module["main"], seed, module)
    return {"x": inputs.pop("x")}, inputs


def entries(d: Path) -> list[Path]:
    return sorted(d.glob("*.gcpkg")) if d.is_dir() else []


def test_an_unchanged_model_comes_from_the_cache_and_computes_the_same(cache_dir: Path) -> None:
    data, params = weights(MLP)
    first = compiler.compile(MLP, params=params)
    assert not first.from_cache and len(entries(cache_dir)) == 1
    again = compiler.compile(MLP, params=params)
    assert again.from_cache and len(entries(cache_dir)) == 1
    np.testing.assert_array_equal(again(**data)[0], first(**data)[0])
    want = compiler.run(compiler.parse_file(MLP), {**data, **params})[0]
    np.testing.assert_allclose(again(**data)[0], want, rtol=1e-4, atol=1e-4)
    assert again.source == first.source  # the artifact's source.gir: what `gc run --random-inputs` reads


def test_what_the_compile_depends_on_is_in_the_key(cache_dir: Path) -> None:
    """Other weights, another entry, pipeline or text: each a compile of its own, never a stale answer."""
    data, params = weights(MLP)
    base = compiler.compile(MLP, params=params)
    _, other = weights(MLP, seed=1)
    changed = compiler.compile(MLP, params=other)
    assert not changed.from_cache
    want = compiler.run(compiler.parse_file(MLP), {**data, **other})[0]
    np.testing.assert_allclose(changed(**data)[0], want, rtol=1e-4, atol=1e-4)
    assert not np.allclose(changed(**data)[0], base(**data)[0])
    assert not compiler.compile(MLP, params=params, pipeline="canonicalize,fuse").from_cache
    text = MLP.read_text().replace("%a2 = graph.relu(%z2)", "%a2 = graph.sigmoid(%z2)")
    assert not compiler.compile(text, params=params).from_cache
    assert len(entries(cache_dir)) == 4


def test_the_target_and_gcs_own_code_are_in_the_key(monkeypatch) -> None:
    """Two CPUs sharing a home folder never exchange code; an edited gc never gets an old artifact."""
    llvm = {"target": "llvm", "entry": "main"}
    k = cache.key("func", None, llvm)
    assert cache.key("func", None, {**llvm, "entry": "f"}) != k
    given = os.environ.get("GC_CPU")  # the run's own (GC_CPU=znver3 pytest), or none
    monkeypatch.setenv("GC_CPU", "znver3" if given != "znver3" else "skylake")
    assert cache.key("func", None, llvm) != k
    if given:
        monkeypatch.setenv("GC_CPU", given)
    else:
        monkeypatch.delenv("GC_CPU")
    assert cache.key("func", None, llvm) == k
    monkeypatch.setattr(cache, "code_fingerprint", lambda: "an edited gc")
    assert cache.key("func", None, llvm) != k


def test_bypassed_the_cache_is_neither_read_nor_written(cache_dir: Path, monkeypatch) -> None:
    _, params = weights(MLP)
    assert not compiler.compile(MLP, params=params, cache=False).from_cache
    assert entries(cache_dir) == []
    compiler.compile(MLP, params=params)
    assert not compiler.compile(MLP, params=params, cache=False).from_cache
    monkeypatch.setenv("GC_CACHE", "off")
    assert not compiler.compile(MLP, params=params).from_cache


def test_a_damaged_entry_is_compiled_again_and_replaced(cache_dir: Path) -> None:
    data, params = weights(MLP)
    first = compiler.compile(MLP, params=params)
    (entry,) = entries(cache_dir)
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    again = compiler.compile(MLP, params=params)
    assert not again.from_cache
    np.testing.assert_array_equal(again(**data)[0], first(**data)[0])
    assert compiler.compile(MLP, params=params).from_cache  # the whole entry written again


def test_the_folder_keeps_to_its_size_least_recently_used_first(cache_dir: Path, monkeypatch) -> None:
    """Three entries of one size where 2.5 fit: the one least recently used goes, and a hit counts as a use."""
    ps = [weights(MLP, seed)[1] for seed in range(3)]
    compiler.compile(MLP, params=ps[0])
    (e0,) = entries(cache_dir)
    compiler.compile(MLP, params=ps[1])
    (e1,) = set(entries(cache_dir)) - {e0}
    os.utime(e0, (1, 1))
    os.utime(e1, (2, 2))
    assert compiler.compile(MLP, params=ps[0]).from_cache  # e0 used now: e1 is the least recent
    monkeypatch.setenv("GC_CACHE_MAX_MB", str(2.5 * e0.stat().st_size / (1 << 20)))
    compiler.compile(MLP, params=ps[2])
    left = entries(cache_dir)
    assert len(left) == 2 and e0 in left and e1 not in left


def test_gc_compile_copies_a_cached_artifact(cache_dir: Path, tmp_path: Path) -> None:
    data, params = weights(MLP)
    np.savez(tmp_path / "w.npz", **params)
    np.savez(tmp_path / "in.npz", **data)
    env = {**os.environ}
    runs = []
    for i, extra in enumerate([[], [], ["--no-cache"]]):
        out, stats = tmp_path / f"m{i}.gcpkg", tmp_path / f"s{i}.json"
        r = gc("compile", str(MLP), "--params", str(tmp_path / "w.npz"), "-o", str(out), "--stats", str(stats),
               *extra, env=env)
        assert r.returncode == 0, r.stderr
        runs.append((r.stderr, json.loads(stats.read_text()), compiler.load(out)(**data)[0]))
    (first, s0, y0), (second, s1, y1), (third, s2, y2) = runs
    assert "from the compile cache" not in first and "from the compile cache" in second
    assert "from the compile cache" not in third
    assert (s0["from_cache"], s1["from_cache"], s2["from_cache"]) == (False, True, False)
    assert s1["arena_bytes"] == s0["arena_bytes"] and s1["num_kernels"] == s0["num_kernels"] == 3
    assert s1["kernels"] == s0["kernels"]
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(y2, y0)
    assert len(entries(cache_dir)) == 1


def test_a_compile_from_the_cache_imports_neither_tvm_nor_ml_dtypes(cache_dir: Path, tmp_path: Path) -> None:
    """What makes an unchanged model's compile take well under a second: TVM (1 s to import) and ml_dtypes
    (0.5 s: it registers its ufunc loops one by one) are imported only where a kernel is built or a bf16
    value is met, so a compile answered from the cache loads neither."""
    import subprocess
    import sys

    data, params = weights(MLP)
    np.savez(tmp_path / "w.npz", **params)
    args = ["compile", str(MLP), "--params", str(tmp_path / "w.npz"), "-o", str(tmp_path / "m.gcpkg")]
    assert gc(*args, env={**os.environ}).returncode == 0
    probe = ("import sys; from compiler import cli\n"
             "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('tvm', 'tvm_ffi', 'ml_dtypes') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env={**os.environ},
                       cwd=ROOT)
    assert "from the compile cache" in r.stderr, r.stderr
    assert r.stdout.strip() == "[]"


def test_gc_compile_never_copies_a_damaged_entry(cache_dir: Path, tmp_path: Path) -> None:
    """A byte changed inside the weights of the cached file: every member's hash is checked before the copy,
    so the model is compiled again and what gc compile writes loads."""
    data, params = weights(MLP)
    np.savez(tmp_path / "w.npz", **params)
    out = tmp_path / "m.gcpkg"
    args = ("compile", str(MLP), "--params", str(tmp_path / "w.npz"), "-o", str(out))
    assert gc(*args).returncode == 0
    (entry,) = entries(cache_dir)
    raw = bytearray(entry.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # the middle of the file: the weights, the largest member
    entry.write_bytes(bytes(raw))
    r = gc(*args)
    assert r.returncode == 0 and "from the compile cache" not in r.stderr
    want = compiler.compile(MLP, params=params, cache=False)(**data)[0]
    np.testing.assert_array_equal(compiler.load(out)(**data)[0], want)
    assert "from the compile cache" in gc(*args).stderr  # the entry written whole again


def test_gc_compile_with_the_cache_still_says_what_is_wrong_with_params(cache_dir: Path, tmp_path: Path) -> None:
    """The CLI keys weights by their file's digest: a missing file is still load_npz's one diagnostic."""
    r = gc("compile", str(MLP), "--params", str(tmp_path / "none.npz"), "-o", str(tmp_path / "m.gcpkg"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.count("error:") == 1
    assert "none.npz" in r.stderr and entries(cache_dir) == []


def test_a_weights_file_is_hashed_again_only_when_it_changed(cache_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """The digest of a settled file is remembered by its identity and times; a file rewritten (other bytes,
    the same size) gets a new digest, and a file changed moments ago is not remembered at all (its times
    might not change with a rewrite within the clock's granularity)."""
    f = tmp_path / "w.npz"
    f.write_bytes(b"a" * 1000)
    first = cache.file_digest(str(f))
    assert not list((cache_dir / "digests").glob("*"))  # just written: hashed, not remembered
    old = os.stat(f).st_mtime_ns - 10**10
    os.utime(f, ns=(old, old))
    monkeypatch.setattr(cache, "SETTLED_S", -1.0)  # (the ctime utime just set is recent too)
    assert cache.file_digest(str(f)) == first
    assert len(list((cache_dir / "digests").glob("*"))) == 1
    reads = []
    real_open = open
    with monkeypatch.context() as m:
        m.setattr("builtins.open", lambda *a, **k: reads.append(a[0]) or real_open(*a, **k))
        assert cache.file_digest(str(f)) == first and str(f) not in reads  # remembered: not read again
    f.write_bytes(b"b" * 1000)
    os.utime(f, ns=(old + 1, old + 1))
    assert cache.file_digest(str(f)) != first


@pytest.mark.parametrize("kernel_copy", ["works", "refused", "absent"])
def test_copy_atomic_copies_whole_files_in_the_kernel_or_not(tmp_path: Path, monkeypatch, kernel_copy: str) -> None:
    """What gc compile does with a cached artifact: the bytes in the kernel (copy_file_range) where the OS
    offers it, through Python where it refuses (another file system, an old kernel) or lacks it."""
    from compiler.files import copy_atomic

    src, dst = tmp_path / "a.bin", tmp_path / "b.bin"
    data = np.random.default_rng(0).bytes(3 << 20)
    src.write_bytes(data)
    dst.write_bytes(b"old, longer than nothing")
    if kernel_copy == "refused" and hasattr(os, "copy_file_range"):
        monkeypatch.setattr(os, "copy_file_range", lambda *a: (_ for _ in ()).throw(OSError(18, "EXDEV")))
    elif kernel_copy == "absent":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    copy_atomic(src, dst)
    assert dst.read_bytes() == data
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left
