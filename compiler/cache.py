"""The compile cache: a compiled artifact kept under a key of everything the compile depends on, so that an
unchanged model compiles again in well under a second.

The key is a SHA-256 of: the module's text, every bound weight (name, dtype, shape, bytes), the target as
built (for llvm the CPU and its features, so two machines sharing a home folder never exchange code), the
compile options (entry, pipeline, arch, concurrent), the artifact format, TVM's version and gc's own code
(its version and a hash of its source files: a changed pass must not be answered by an old artifact).

An entry is an ordinary .gcpkg, loaded with every check `compiler.load` makes; one that fails them (a
truncated file, a CPU that changed under the same name) is deleted and the model compiled again. Entries
are written atomically, so concurrent compiles of one model leave one whole file. The folder is
`$GC_CACHE_DIR`, else `$XDG_CACHE_HOME/gc/compiled`, else `~/.cache/gc/compiled`; `GC_CACHE=off` (or
`compile(..., cache=False)`, `gc compile --no-cache`) bypasses it. It keeps at most `GC_CACHE_MAX_MB`
(default 2048) megabytes, the least recently used entries going first.
"""

from __future__ import annotations

import hashlib
import os
import time
from functools import cache
from pathlib import Path

import numpy as np

from compiler.diagnostics import GCError

DEFAULT_MAX_MB = 2048


def enabled() -> bool:
    return os.environ.get("GC_CACHE", "on").strip().lower() not in ("off", "0", "no", "false")


def folder() -> Path:
    if os.environ.get("GC_CACHE_DIR"):
        return Path(os.environ["GC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gc" / "compiled"


def key(text: str, params: dict[str, np.ndarray] | None, options: dict, params_file: str | None = None) -> str:
    """The entry's name: a hash of everything the compiled artifact depends on. `options`: the driver's
    Options as a dict (target, entry, pipeline, arch, concurrent). The weights are `params`, or the
    digest of the .npz file they come from (`file_digest`: gc compile --params, which then need not read
    them on a hit; the same weights by the two routes are two entries)."""
    from importlib.metadata import PackageNotFoundError, version

    from compiler.codegen.artifact import FORMAT

    try:
        tvm_version = version("apache-tvm")
    except PackageNotFoundError:  # TVM from a source tree
        import tvm

        tvm_version = tvm.__version__
    target = machine(options["target"], options.get("arch"))
    h = hashlib.sha256()

    def put(part: str | bytes) -> None:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    for part in (FORMAT, tvm_version, code_fingerprint(), repr(sorted(target.items())),
                 repr(sorted(options.items())), text):
        put(part)
    if params_file is not None:
        put(f"npz:{params_file}")
    for name in sorted(params or {}):
        a = np.ascontiguousarray(params[name])
        put(f"{name}:{a.dtype.str}:{a.shape}")
        put(memoryview(a.reshape(-1)).cast("B") if a.size else b"")
    return h.hexdigest()


def machine(target: str, arch: str | None) -> dict:
    """What the code is built for. For llvm: GC_CPU's CPU if set, this one's name and every feature cpuid
    reports (llvmlite: without loading TVM, which a cache hit does not need), and the cores."""
    from compiler.codegen import layout
    from compiler.codegen.target import host_features, make_target, num_cores

    if target == "llvm":
        try:
            import llvmlite.binding as llvm

            host = str(llvm.get_host_cpu_name())
        except Exception:  # noqa: BLE001 (no llvmlite, or an LLVM without the query)
            return {**make_target(target, arch), "blocked_layout": layout.ENABLED}
        # GC_CPU apart from the host's name: built for the host, the features it hides are turned off.
        return {"kind": "llvm", "gc_cpu": os.environ.get("GC_CPU", ""), "blocked_layout": layout.ENABLED,
                "host": host,
                "features": sorted(host_features().items()), "cores": num_cores()}
    import tvm

    # Beside a driver the build holds GPU code; without one CUDA C only (which is never cached anyway).
    return {**make_target(target, arch), "driver": bool(tvm.runtime.enabled("cuda"))}


@cache
def code_fingerprint() -> str:
    """gc's version and a hash of its source (compiler/ and dialects/): an edited gc misses the cache."""
    import compiler
    import dialects

    h = hashlib.sha256(compiler.__version__.encode())
    for pkg in (compiler, dialects):
        root = Path(pkg.__file__).parent
        for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".lark") and "__pycache__" not in p.parts):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


# A file's digest is remembered by its identity and times (path, inode, size, mtime and ctime in ns), as
# ccache's direct mode does, but only for a file last changed this long before it was hashed: a file
# rewritten within the clock's granularity could keep its times and size.
SETTLED_S = 2.0
MAX_DIGESTS = 1000


def file_digest(path: str) -> str | None:
    """SHA-256 of a file's bytes, or None where it cannot be read (the caller's own reading says why).
    Hashing ViT-B/16's 346 MB of weights took 0.35 s of a 1 s cache hit: the digest of a file that has
    not changed since it was last hashed is read back from the cache folder instead."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = "\0".join(str(x) for x in (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                        st.st_ctime_ns))
    memo = folder() / "digests" / hashlib.sha256(stamp.encode()).hexdigest()
    try:
        known = memo.read_text()
        if len(known) == 64 and all(ch in "0123456789abcdef" for ch in known):
            return known
    except OSError:
        pass
    settled = time.time() - max(st.st_mtime, st.st_ctime) > SETTLED_S  # (before reading: the stamp's time)
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    except OSError:
        return None
    digest = h.hexdigest()
    if settled:
        try:
            from compiler.files import write_atomic

            memo.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(memo, digest)
        except (OSError, GCError):
            pass  # a cache folder that cannot be written: the digest is computed again next time
    return digest


def path_of(k: str) -> Path:
    return folder() / f"{k}.gcpkg"


def lookup(k: str):
    """The cached CompiledModel under key `k`, or None. An entry that does not load is removed."""
    from compiler.codegen.artifact import load

    p = path_of(k)
    if not p.is_file():
        return None
    try:
        model = load(p)
    except GCError:
        p.unlink(missing_ok=True)
        return None
    _touch(p)
    return model


def lookup_file(k: str) -> tuple[Path, dict] | None:
    """The cached artifact under key `k` and its checked plan, if it is whole and usable (the CLI copies the
    file as it is): every member read, the plan's structure, a GPU binary for cuda. An entry that fails is
    removed."""
    from compiler.codegen.artifact import read_whole

    p = path_of(k)
    if not p.is_file():
        return None
    try:
        # Every member's CRC-32 (damage); the SHA-256s are the loader's, when the copy is loaded.
        plan = read_whole(p, sha256=False)
    except GCError:
        plan = None
    if plan is None or plan.get("cuda_source_only"):
        p.unlink(missing_ok=True)
        return None
    _touch(p)
    return p, plan


def store(k: str, model) -> None:
    """Keep `model` under key `k`; a cache that cannot be written (a read-only home) is skipped quietly:
    it only saves time."""
    if not _source_only(model):
        _put(k, model.save)


def store_file(k: str, artifact: Path, model) -> None:
    """Keep `artifact`, the file the CLI saved `model` to, under key `k` (a copy: saving again would export
    the library again)."""
    from compiler.files import copy_atomic

    if not _source_only(model):
        _put(k, lambda p: copy_atomic(artifact, p))


def _source_only(model) -> bool:
    """Built for cuda without a driver: CUDA C only, which no later compile could use."""
    from compiler.codegen.artifact import plan_head

    return bool(plan_head(model.target).get("cuda_source_only"))


def _put(k: str, write) -> None:
    """write(path) the entry for `k` (atomically), then keep the folder to its size."""
    p = path_of(k)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write(p)
    except (OSError, GCError):
        return
    evict(p)


def evict(keep: Path | None = None) -> None:
    """Remove the least recently used entries until the folder holds at most GC_CACHE_MAX_MB."""
    try:
        limit = int(float(os.environ.get("GC_CACHE_MAX_MB", DEFAULT_MAX_MB)) * (1 << 20))
    except ValueError:
        limit = DEFAULT_MAX_MB << 20
    try:
        entries = [(e.stat().st_mtime, e.stat().st_size, e) for e in folder().glob("*.gcpkg")]
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    for _, size, e in sorted(entries, key=lambda t: t[0]):
        if total <= limit:
            break
        if e == keep:
            continue
        e.unlink(missing_ok=True)
        total -= size
    try:  # remembered file digests (`file_digest`): the newest MAX_DIGESTS
        memos = sorted(folder().glob("digests/*"), key=lambda e: e.stat().st_mtime)
        for e in memos[:-MAX_DIGESTS]:
            e.unlink(missing_ok=True)
    except OSError:
        pass


def _touch(p: Path) -> None:
    try:
        os.utime(p)
    except OSError:
        pass
