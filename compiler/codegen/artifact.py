"""The compiled artifact (.gcpkg): one zip with the kernels' shared library, the plan and the constants.

A .gcpkg holds native code that runs when it is loaded, as a pickle does: load only artifacts from a
source you trust. What loading checks, before anything runs, is that the file is whole and fits this
machine: the format version; a SHA-256 of every member, recorded at save; the plan's structure, every
buffer inside the arena it views, every constant of the shape the plan says, and every kernel call's
buffers what the kernel takes (the plan's `signatures`: CPU kernels check nothing they are passed); the
target (a GPU for
cuda, and for llvm every CPU feature the code may use, against this CPU's). A file that fails any check
is one diagnostic, never a traceback or a crash. The checks catch damage and mistakes; they cannot catch
a library written to do harm by whoever made the file.

Members: manifest.json (format, gc version, the hash of every other member), plan.json (target, entry,
signature, buffers, calls, each kernel's parameter signature; see build._plan), lib.so, consts.npz, and
source.gir (the GIR it came from). A size of a dynamic artifact (codegen/dynamic.py) has consts.json in
place of consts.npz: each constant's key in the dynamic artifact's pool, where every size's constants and
the weights lie once.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from compiler.codegen.plan import Plan
from compiler.diagnostics import GCError
from compiler.ir import DType
from compiler.parser import MAX_RANK
from dialects.mem import padded_shape, padded_strides

FORMAT = "gcpkg-3"  # 3: plan.json carries each kernel's signature, checked at load
MEMBERS = ("plan.json", "lib.so", "consts.npz")  # and source.gir, optionally
OPTIONAL = ("source.gir",)
# A model with ? sizes: its source, weights and each size compiled. 2: the weights and every size's
# constants in one pool (consts.npz, each array once; params.json names the weights' keys), where 1 kept
# the weights as given and each size its own constants (MobileNetV2's artifact grew 14 MB a size).
DYNAMIC_FORMAT = "gcpkg-dynamic-2"
DYNAMIC_MEMBERS = {DYNAMIC_FORMAT: ("source.gir", "consts.npz", "params.json", "dynamic.json")}
JSON_LIMIT = 256 << 20  # a plan beyond this is no plan gc wrote


def plan_head(target: dict) -> dict:
    """What plan.json holds beside the build's plan: the target, the CPU features llvm code may use, and
    whether a cuda library is CUDA C only (built where no driver was)."""
    import tvm

    from compiler.codegen.target import target_features

    head: dict = {"target": target}
    if target["kind"] == "llvm":
        head["cpu_features"] = target_features(target)
    if target["kind"] == "cuda" and not tvm.runtime.enabled("cuda"):
        head["cuda_source_only"] = True
    return head


class ArrayPool:
    """A dynamic artifact's arrays, each once, keyed by a hash of its bytes, dtype and shape. Sizes share
    their prepacked weights as the same objects: each object is hashed once."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self._keys: dict[int, str] = {}  # id of an array (kept alive in `arrays`) -> its key

    def add(self, a: np.ndarray) -> str:
        k = self._keys.get(id(a))
        if k is None:
            h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
            k = h.hexdigest()[:32]
            a = self.arrays.setdefault(k, a)
            self._keys[id(a)] = k
        return k


def save(model, path: str | Path, pool: ArrayPool | None = None) -> None:
    """Write `model` to `path` atomically (a crash or a full disk leaves an earlier file whole). With
    `pool` (a size of a dynamic artifact), its constants go into the pool, once each, and the file names
    their keys (consts.json)."""
    from compiler.files import check_writable

    check_writable(path)
    members: dict[str, bytes | Callable[[BinaryIO], None]] = {
        "plan.json": json.dumps({**plan_head(model.target), **model.plan.to_json()}, indent=1).encode()}
    lib_bytes = model.lib_bytes
    if lib_bytes is None and model.lib is None:  # no kernel to run (every result empty or an input): no library
        lib_bytes = b""
    if lib_bytes is None:  # compiled in this process; a loaded model keeps the library it came with
        with tempfile.TemporaryDirectory() as d:
            lib = Path(d) / "lib.so"
            model.lib.export_library(str(lib))
            lib_bytes = lib.read_bytes()
    members["lib.so"] = lib_bytes
    if pool is None:
        members["consts.npz"] = lambda fh: write_npz(fh, model.consts)
    else:
        members["consts.json"] = json.dumps({name: pool.add(a) for name, a in model.consts.items()}).encode()
    if model.source is not None:
        members["source.gir"] = model.source.encode("utf-8")
    # Weights are stored: deflate took 3.3 s of ResNet-50's compile to save 7% of 102 MB.
    write_members(path, FORMAT, members, stored={"consts.npz"})


def write_npz(fh: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """What np.savez writes (an .npz that np.load reads), streamed into `fh`, a file that need not seek
    (each member's CRC-32 and sizes then follow its data, as zip allows), each array's bytes written as
    they lie (np.savez copies them through nditer); every member dated 1980, so the same weights make the
    same bytes."""
    with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as z:
        for name, a in arrays.items():
            with z.open(zipfile.ZipInfo(f"{name}.npy"), "w", force_zip64=True) as m:
                a = np.asanyarray(a)
                if a.flags.c_contiguous and a.dtype.itemsize and not a.dtype.hasobject:
                    np.lib.format.write_array_header_1_0(m, np.lib.format.header_data_from_array_1_0(a))
                    m.write(a.reshape(-1).view(np.uint8))
                else:
                    np.lib.format.write_array(m, a, allow_pickle=False)


class _Hashing:
    """A file that passes what is written on to `fh`, taking its SHA-256 on the way."""

    def __init__(self, fh: BinaryIO):
        self.fh, self.sha = fh, hashlib.sha256()

    def write(self, data) -> int:
        self.sha.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def write_members(path: str | Path, fmt: str, members: dict[str, bytes | Callable[[BinaryIO], None]],
                  stored: set[str]) -> None:
    """One zip at `path`, atomically: the members, deflated but for those named in `stored`, then
    manifest.json (the format, gc's version, each member's SHA-256; the reader finds members by name, in
    any order). A member given as a function writing into a file is streamed into the zip, hashed as it
    passes: ResNet-50's 144 MB of weights are never held whole nor copied, save 0.86 -> 0.67 s (Zen 3); what
    is left is one SHA-256 and two CRC-32s of the bytes (the npz's, the zip's), the write and the fsync."""
    from compiler import __version__
    from compiler.files import write_atomic

    hashes: dict[str, str] = {}

    def write(fh) -> None:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in members.items():
                info = zipfile.ZipInfo(name, time.localtime()[:6])
                info.compress_type = zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED
                if callable(data):
                    with z.open(info, "w", force_zip64=True) as m:  # zip64: its size is not known yet
                        h = _Hashing(m)
                        data(h)
                    hashes[name] = h.sha.hexdigest()
                else:
                    z.writestr(info, data)
                    hashes[name] = hashlib.sha256(data).hexdigest()
            z.writestr("manifest.json", json.dumps({"format": fmt, "gc": __version__, "sha256": hashes}, indent=1))

    write_atomic(path, write)


class _Reader:
    """The members of an artifact, each read once and checked against the manifest's hash."""

    def __init__(self, path: str | Path):
        self.path = path
        try:
            self.zip = zipfile.ZipFile(path)
            names = self.zip.namelist()
        except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as e:
            raise self.error(f"not a readable zip file ({e})") from None
        if len(set(names)) != len(names):
            raise self.error("a member appears twice in the zip")
        if "manifest.json" not in names:
            if "plan.json" in names:
                raise self.error("it was written by an older gc (no manifest.json); compile it again")
            raise self.error("no manifest.json: not a gc compiled model (`gc compile FILE.gir -o OUT.gcpkg` makes one)")
        manifest = self._json("manifest.json")
        if not isinstance(manifest, dict):
            raise self.error("manifest.json is not a JSON object")
        self.format = manifest.get("format")
        if self.format != FORMAT and self.format not in DYNAMIC_MEMBERS:
            raise self.error(f"format {manifest.get('format')!r}, but this gc reads {FORMAT!r}; compile it again")
        hashes = manifest.get("sha256")
        if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
            raise self.error("manifest.json has no table of member hashes")
        expected = set(MEMBERS) | (set(OPTIONAL) & set(hashes))
        if "consts.json" in hashes:  # a size of a dynamic artifact: its constants in the artifact's pool
            expected = expected - {"consts.npz"} | {"consts.json"}
        if self.format in DYNAMIC_MEMBERS:  # a model with ? sizes (codegen/dynamic.py) and its sizes compiled
            expected = set(DYNAMIC_MEMBERS[self.format]) | {
                n for n in hashes if re.fullmatch(r"size-\d{1,6}\.gcpkg|objects-\d{1,6}\.o", n)}
            expected |= {"kernels.json"} & set(hashes)  # (the kernels built, their object files: KernelStore)
        if set(hashes) != expected:
            raise self.error(f"manifest.json lists {sorted(hashes)}, expected {sorted(expected)}")
        if set(names) != expected | {"manifest.json"}:
            odd = sorted(set(names) ^ (expected | {"manifest.json"}))
            raise self.error(f"the zip's members differ from its manifest's: {', '.join(odd)}")
        self.hashes = hashes

    def error(self, message: str) -> GCError:
        return GCError(f"cannot load {self.path}: {message}")

    def read(self, name: str, limit: int | None = None) -> bytes:
        try:
            info = self.zip.getinfo(name)
            if limit is not None and info.file_size > limit:
                raise self.error(f"{name} is {info.file_size} bytes, too large to be gc's")
            data = self.zip.read(name)
        except (OSError, zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as e:
            raise self.error(f"{name} cannot be read ({e})") from None
        if name != "manifest.json" and hashlib.sha256(data).hexdigest() != self.hashes.get(name):
            raise self.error(f"{name} is damaged or was changed after it was saved (its SHA-256 differs from the "
                             "manifest's)")
        return data

    def _json(self, name: str):
        try:
            return json.loads(self.read(name, JSON_LIMIT))
        except (ValueError, RecursionError) as e:
            raise self.error(f"{name} is not valid JSON ({e})") from None

    def plan(self) -> dict:
        if self.format in DYNAMIC_MEMBERS:  # what `gc run` asks before loading: the target and the entry
            meta = self._json("dynamic.json")
            options = meta.get("options") if isinstance(meta, dict) else None
            if not isinstance(options, dict) or options.get("target") not in ("llvm", "cuda"):
                raise self.error("dynamic.json names no target")
            return {"target": {"kind": options["target"]}, "entry": options.get("entry", "main"), "dynamic": True}
        plan = self._json("plan.json")
        check_plan(plan, self.error)
        return plan


def read_plan(path: str | Path) -> dict:
    """The checked plan.json of a saved model (its target, entry, signature...) without loading its kernels."""
    r = _Reader(path)
    with r.zip:
        return r.plan()


def read_whole(path: str | Path, sha256: bool = True) -> dict:
    """The checked plan, after reading every member and checking its hash (what `load` checks before it
    loads the library: a copy of a file that passes is a whole artifact). `sha256=False` checks each
    member's CRC-32 only, as zip reads it (a third of the time: damage, not tampering)."""
    r = _Reader(path)
    with r.zip:
        plan = r.plan()
        for name in r.hashes:
            if name == "plan.json":
                continue
            if sha256:
                r.read(name)
                continue
            try:
                with r.zip.open(name) as member:
                    while member.read(1 << 24):
                        pass
            except (OSError, zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:
                raise r.error(f"{name} cannot be read ({e})") from None
        return plan


def load(path: str | Path, pool: dict[str, np.ndarray] | None = None):
    """The CompiledModel saved at `path`, after every check the module docstring names; `pool`: the
    constants of the dynamic artifact whose size it is, where its consts.json names them."""
    import tvm

    from compiler.codegen.runtime import CompiledModel, _no_cuda_device
    from compiler.codegen.target import no_cpu_features
    from compiler.inputs import restore_bf16

    r = _Reader(path)
    with r.zip:
        if r.format in DYNAMIC_MEMBERS:
            from compiler.codegen.dynamic import DynamicModel

            r.plan()  # its target and entry, checked
            return DynamicModel.load(path, {name: r.read(name) for name in r.hashes})
        plan = r.plan()
        target = plan["target"]
        if target["kind"] == "cuda":
            if _no_cuda_device(target):  # TVM cannot even load a CUDA library without the driver
                raise r.error(_no_cuda_device(target))
            if plan.get("cuda_source_only"):
                raise r.error("it was compiled where no CUDA driver was, so it holds the kernels' CUDA C source but "
                              "no GPU binary; compile it again on this machine")
        elif no_cpu_features(target, plan["cpu_features"]):
            raise r.error(no_cpu_features(target, plan["cpu_features"]))
        consts = _consts(r, plan, pool)
        source = None
        if "source.gir" in r.hashes:
            try:
                source = r.read("source.gir").decode("utf-8")
            except UnicodeDecodeError:
                raise r.error("source.gir is not UTF-8 text") from None
        lib_bytes = r.read("lib.so")
        if not any("kernel" in c for c in plan["calls"]):  # a plan of no kernel has an empty library
            model = CompiledModel(None, Plan.from_json(plan), restore_bf16(consts), target)
            model.source, model.lib_bytes = source, lib_bytes
            return model
        with tempfile.TemporaryDirectory() as d:
            lib_path = Path(d) / "lib.so"
            lib_path.write_bytes(lib_bytes)
            try:
                lib = tvm.runtime.load_module(str(lib_path))
            except Exception as e:  # noqa: BLE001 (TVM raises its own errors for a library it cannot load)
                raise r.error(f"lib.so does not load: {' '.join(str(e).split())[:300]}") from None
    for name in sorted({c["kernel"] for c in plan["calls"] if "kernel" in c}):
        if not lib.implements_function(name, True):
            raise r.error(f"the plan calls kernel '{name}', which lib.so does not define")
    model = CompiledModel(lib, Plan.from_json(plan), restore_bf16(consts), target)
    model.source = source
    model.lib_bytes = lib_bytes
    return model


def _consts(r: _Reader, plan: dict, pool: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    if "consts.json" in r.hashes:  # a size of a dynamic artifact
        if pool is None:
            raise r.error("its constants are kept by the dynamic artifact it is a size of; load that one")
        keys = r._json("consts.json")
        if not isinstance(keys, dict) or not all(isinstance(k, str) and k in pool for k in keys.values()):
            raise r.error("consts.json names constants that the dynamic artifact's consts.npz does not hold")
        consts = {name: pool[k] for name, k in keys.items()}
    else:
        consts = read_npz(r, "consts.npz")
    for b in plan["buffers"]:
        if b["kind"] != "const":
            continue
        arr = consts.get(b["name"])
        if arr is None:
            raise r.error(f"the plan's constant '{b['name']}' is not in consts.npz")
        want = np.dtype(DType(b["dtype"]).np)
        ok_dtype = arr.dtype == want or (b["dtype"] == "bf16" and arr.dtype.kind == "V" and arr.dtype.itemsize == 2)
        if list(arr.shape) != b["shape"] or not ok_dtype:
            raise r.error(f"constant '{b['name']}' is {arr.dtype}{list(arr.shape)}, the plan says "
                          f"{b['dtype']}{b['shape']}")
    return consts


def read_npz(r: _Reader, name: str) -> dict[str, np.ndarray]:
    """The arrays of the member `name`, an .npz (no pickles)."""
    try:
        with np.load(io.BytesIO(r.read(name)), allow_pickle=False) as c:
            return {k: c[k] for k in c.files}
    except GCError:
        raise
    except Exception as e:  # noqa: BLE001 (NumPy raises ValueError, BadZipFile, OSError... for a bad .npz)
        raise r.error(f"{name} cannot be read ({type(e).__name__}: {e})") from None


# --- the plan's structure -------------------------------------------------------------------------------

KINDS = {"arg", "const", "temp", "arena", "view", "bordered", "whole"}


def check_plan(plan, error) -> None:
    """Raise error(message) unless `plan` is well formed: every index in range, every view inside its
    arena, every step naming buffers that exist; what a kernel could read or write out of bounds with."""

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise error(f"plan.json is malformed: {what}")

    def is_int(x, lo: int = 0) -> bool:
        return type(x) is int and x >= lo

    def shape_ok(s) -> bool:
        return isinstance(s, list) and len(s) <= MAX_RANK and all(is_int(d) for d in s)

    def dtype_ok(d) -> bool:
        try:
            DType(d)
            return True
        except (ValueError, TypeError):
            return False

    def nbytes(b: dict) -> int:
        return math.prod(b["shape"]) * DType(b["dtype"]).itemsize

    need(isinstance(plan, dict), "not a JSON object")
    for key, kind in (("target", dict), ("entry", str), ("args", list), ("buffers", list), ("calls", list),
                      ("results", list), ("result_types", list), ("memory", dict)):
        need(isinstance(plan.get(key), kind), f"'{key}' missing or not a {kind.__name__}")
    target = plan["target"]
    need(target.get("kind") in ("llvm", "cuda"), f"unknown target kind {target.get('kind')!r}")
    if target["kind"] == "llvm":
        feats = plan.get("cpu_features")
        need(isinstance(feats, list) and all(isinstance(f, str) for f in feats), "no list of CPU features")
    args, bufs = plan["args"], plan["buffers"]
    for i, a in enumerate(args):
        need(isinstance(a, dict) and isinstance(a.get("name"), str) and shape_ok(a.get("shape"))
             and dtype_ok(a.get("dtype")), f"argument #{i}")
    for i, b in enumerate(bufs):
        need(isinstance(b, dict) and b.get("kind") in KINDS and shape_ok(b.get("shape")) and dtype_ok(b.get("dtype")),
             f"buffer #{i}")
        kind = b["kind"]
        if kind == "arg":
            k = b.get("index")
            need(is_int(k) and k < len(args), f"buffer #{i}: argument index {k!r}")
            need(b["shape"] == args[k]["shape"] and b["dtype"] == args[k]["dtype"], f"buffer #{i}: not argument {k}'s type")
        elif kind == "const":
            need(isinstance(b.get("name"), str), f"buffer #{i}: constant without a name")
        elif kind == "arena":
            need(is_int(b.get("size")) and b["size"] <= 1 << 48, f"buffer #{i}: arena size {b.get('size')!r}")
        elif kind == "view":
            a, off = b.get("arena"), b.get("offset")
            need(is_int(a) and a < i and bufs[a].get("kind") == "arena", f"buffer #{i}: views no arena")
            need(is_int(off) and off + nbytes(b) <= bufs[a]["size"],
                 f"buffer #{i}: {nbytes(b)} bytes at offset {off!r} lie outside its arena of {bufs[a]['size']} bytes")
        elif kind == "bordered":
            pads = b.get("pads")
            need(isinstance(pads, list) and len(pads) == 2 * len(b["shape"]) and all(is_int(p) for p in pads),
                 f"buffer #{i}: pads {pads!r}")
            if "arena" in b:  # the padded whole in the arena's bytes
                a, off = b.get("arena"), b.get("offset")
                size = math.prod(padded_shape(b["shape"], pads)) * DType(b["dtype"]).itemsize
                need(is_int(a) and a < i and bufs[a].get("kind") == "arena", f"buffer #{i}: borders in no arena")
                need(is_int(off) and off + size <= bufs[a]["size"],
                     f"buffer #{i}: {size} bytes at offset {off!r} lie outside its arena of {bufs[a]['size']} bytes")
        elif kind == "whole":
            of = b.get("of")
            need(is_int(of) and of < i and bufs[of].get("kind") == "bordered", f"buffer #{i}: whole of no bordered buffer")
            padded = list(padded_shape(bufs[of]["shape"], bufs[of]["pads"]))
            need(b["shape"] == padded and b["dtype"] == bufs[of]["dtype"], f"buffer #{i}: not its bordered buffer's shape")
    sigs = plan.get("signatures")
    need(isinstance(sigs, dict), "'signatures' missing or not an object")
    for name, sig in sigs.items():
        need(isinstance(sig, list) and all(isinstance(p, list) and len(p) in (3, 4) and shape_ok(p[0])
                                           and dtype_ok(p[1]) and (p[2] is None or shape_ok(p[2]))
                                           and (len(p) == 3 or shape_ok(p[3])) for p in sig),
             f"signature of kernel {name!r}")
    for i, c in enumerate(plan["calls"]):
        need(isinstance(c, dict) and is_int(c.get("stream", 0)), f"call #{i}")
        if "kernel" in c:
            need(isinstance(c["kernel"], str) and isinstance(c.get("buffers"), list)
                 and all(is_int(j) and j < len(bufs) for j in c["buffers"]), f"call #{i}: kernel buffers")
            # The kernels check nothing of what they are passed (llvm_pipeline): each call's buffers must be
            # what its kernel takes, parameter by parameter, or it would read and write out of bounds.
            sig = sigs.get(c["kernel"])
            need(sig is not None, f"call #{i}: kernel {c['kernel']!r}, which the plan's signatures do not list")
            need(len(sig) == len(c["buffers"]),
                 f"call #{i}: {len(c['buffers'])} buffers for kernel {c['kernel']!r}, which takes {len(sig)}")
            for j, (shape, dtype, strides, *written) in zip(c["buffers"], sig):
                need(bufs[j]["shape"] == shape and bufs[j]["dtype"] == dtype,
                     f"call #{i}: buffer #{j} is {bufs[j]['dtype']}{bufs[j]['shape']}, where kernel {c['kernel']!r} "
                     f"takes {dtype}{shape}")
                # A strided parameter is a bordered buffer's interior, of exactly those strides; a compact
                # one never is (the kernel would step past the interior's rows).
                bordered = bufs[j]["kind"] == "bordered"
                need(bordered == (strides is not None) and (
                    not bordered or list(padded_strides(tuple(shape), bufs[j]["pads"])) == strides),
                     f"call #{i}: buffer #{j} ({bufs[j]['kind']}) is not laid out as kernel {c['kernel']!r} "
                     "reads it")
                # A kernel that writes the border stores at offsets compiled in: the pads must be those.
                need(not written or (bordered and bufs[j]["pads"] == written[0]),
                     f"call #{i}: buffer #{j}'s border is not the one kernel {c['kernel']!r} writes")
        elif "copy" in c:
            cp = c["copy"]
            need(isinstance(cp, list) and len(cp) == 2 and all(is_int(j) and j < len(bufs) for j in cp)
                 and nbytes(bufs[cp[0]]) == nbytes(bufs[cp[1]]), f"call #{i}: copy")
        else:
            need(any(is_int(c.get(k)) and c[k] < 1 << 16 for k in ("signal", "wait")), f"call #{i}: no kernel, copy or event")
    need(all(is_int(r) and r < len(bufs) for r in plan["results"]), "results")
    need(len(plan["result_types"]) == len(plan["results"]), "result types")
