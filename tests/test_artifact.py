"""The .gcpkg artifact is untrusted until checked: damage, tampering and another CPU's code are one
diagnostic each (exit 1), checked before anything runs; a good artifact round-trips."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from helpers import gc, members, rewrite

import compiler
from compiler.codegen import artifact
from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.parser import parse_file

CNN = ROOT / "examples" / "cnn.gir"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """examples/cnn.gir with its weights bound: constants (some prepacked) travel in the artifact."""
    path = tmp_path_factory.mktemp("art") / "cnn.gcpkg"
    module = parse_file(CNN)
    weights = {k: v for k, v in random_inputs(module["main"], 0, module).items() if k != "x"}
    compiler.compile(str(CNN), "llvm", params=weights).save(path)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(GCError) as e:
        compiler.load(path)
    message = e.value.render()
    assert message.startswith(f"error: cannot load {path}: ") and "\n" not in message.strip()
    return message


def test_a_saved_model_loads_and_matches(saved: Path, tmp_path: Path) -> None:
    module = parse_file(CNN)
    inputs = random_inputs(module["main"], 0, module)
    want = compiler.run(module, inputs)[0]
    loaded = compiler.load(saved)
    np.testing.assert_allclose(loaded(x=inputs["x"])[0], want, rtol=1e-4, atol=1e-5)
    loaded.save(tmp_path / "again.gcpkg")  # a loaded model saves as it came
    assert members(tmp_path / "again.gcpkg") == members(saved)
    names = set(members(saved))
    assert names == {"manifest.json", "plan.json", "lib.so", "consts.npz", "source.gir"}
    manifest = json.loads(members(saved)["manifest.json"])
    assert manifest["format"] == artifact.FORMAT and set(manifest["sha256"]) == names - {"manifest.json"}
    plan = json.loads(members(saved)["plan.json"])
    assert "avx2" in plan["cpu_features"] or "sse2" in plan["cpu_features"]


@pytest.mark.parametrize("member", ["plan.json", "lib.so", "consts.npz", "source.gir"])
def test_a_flipped_byte_in_any_member_is_caught_by_its_hash(saved: Path, tmp_path: Path, member: str) -> None:
    def flip(m):
        data = bytearray(m[member])
        data[len(data) // 2] ^= 0x40
        m[member] = bytes(data)

    bad = rewrite(saved, tmp_path / "bad.gcpkg", flip, rehash=False)
    assert f"{member} is damaged or was changed after it was saved" in load_error(bad)


@pytest.mark.parametrize("cut", [0, 10, 100, 1000, -1000, -10])
def test_a_truncated_file_is_a_diagnostic(saved: Path, tmp_path: Path, cut: int) -> None:
    data = saved.read_bytes()
    bad = tmp_path / "cut.gcpkg"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    load_error(bad)


@pytest.mark.parametrize("what", ["missing plan.json", "extra member", "no manifest", "garbage manifest",
                                  "old format", "bad plan JSON", "plan not an object"])
def test_a_malformed_archive_is_a_diagnostic(saved: Path, tmp_path: Path, what: str) -> None:
    changes = {
        "missing plan.json": lambda m: m.pop("plan.json"),
        "extra member": lambda m: m.update({"evil.so": b"\x7fELF"}),
        "no manifest": lambda m: m.pop("manifest.json"),
        "garbage manifest": lambda m: m.update({"manifest.json": b"\xff\xfe{{{"}),
        "old format": lambda m: m.update(
            {"manifest.json": m["manifest.json"].replace(artifact.FORMAT.encode(), b"gcpkg-1")}),
        "bad plan JSON": lambda m: m.update({"plan.json": b'{"target": '}),
        "plan not an object": lambda m: m.update({"plan.json": b"[1, 2]"}),
    }
    rehash = what not in ("garbage manifest", "old format", "no manifest", "extra member")
    message = load_error(rewrite(saved, tmp_path / "bad.gcpkg", changes[what], rehash=rehash))
    expected = {"missing plan.json": "manifest.json lists", "extra member": "differ from its manifest's: evil.so",
                "no manifest": "no manifest.json", "garbage manifest": "manifest.json is not valid JSON",
                "old format": "format 'gcpkg-1'", "bad plan JSON": "plan.json is not valid JSON",
                "plan not an object": "plan.json is malformed: not a JSON object"}[what]
    assert expected in message


def _plan_change(fn):
    def change(m):
        plan = json.loads(m["plan.json"])
        fn(plan)
        m["plan.json"] = json.dumps(plan).encode()
    return change


def _first(plan, kind):
    return next(b for b in plan["buffers"] if b["kind"] == kind)


def _rename_first_kernel(plan, name):
    call = next(c for c in plan["calls"] if "kernel" in c)
    plan["signatures"][name] = plan["signatures"][call["kernel"]]
    call["kernel"] = name


def _reshape_first_const_and_its_kernel(plan):
    """The constant's and its kernel's shapes changed together: the constants' own check still sees it."""
    i = next(j for j, b in enumerate(plan["buffers"]) if b["kind"] == "const")
    plan["buffers"][i]["shape"] = [3, 3]
    for c in plan["calls"]:
        if "kernel" in c and i in c["buffers"]:
            plan["signatures"][c["kernel"]][c["buffers"].index(i)][0] = [3, 3]


def _one_sided(pads: list[int]) -> list[int]:
    """[.., 1, 1, .., 1, 1, ..] -> [.., 0, 0, .., 2, 2, ..]: the same padded size and strides."""
    r = len(pads) // 2
    return [0] * r + [lo + hi for lo, hi in zip(pads[:r], pads[r:])]


TAMPERED = {
    # What would make a kernel write outside its buffer, or index a list out of range: caught, rehashed or not.
    "view past its arena": (lambda p: _first(p, "view").update(offset=_first(p, "arena")["size"]),
                            "lie outside its arena"),
    "negative offset": (lambda p: _first(p, "view").update(offset=-64), "lie outside its arena"),
    "shrunk arena": (lambda p: _first(p, "arena").update(size=16), "lie outside its arena"),
    # A bordered view's kernel writes its border too: the padded bytes must lie in the arena, not the interior's.
    "bordered view's border past its arena": (
        lambda p: _first(p, "bordered").update(offset=_first(p, "arena")["size"] - 64), "lie outside its arena"),
    "bordered view of no arena": (lambda p: _first(p, "bordered").update(arena=0), "borders in no arena"),
    # The same strides, the border split otherwise: the kernel's border stores would land outside the view.
    "border moved to one side": (lambda p: _first(p, "bordered").update(pads=_one_sided(_first(p, "bordered")["pads"])),
                                 "border is not the one kernel"),
    "kernel buffer out of range": (lambda p: next(c for c in p["calls"] if "kernel" in c)["buffers"].append(10**6),
                                   "kernel buffers"),
    "result out of range": (lambda p: p["results"].append(-1), "results"),
    "argument retyped": (lambda p: _first(p, "arg").update(shape=[1]), "not argument 0's type"),
    "constant reshaped": (lambda p: _first(p, "const").update(shape=[3, 3]), "where kernel"),
    "unknown kernel": (lambda p: next(c for c in p["calls"] if "kernel" in c).update(kernel="system"),
                       "kernel 'system', which the plan's signatures do not list"),
    "unknown buffer kind": (lambda p: p["buffers"][0].update(kind="mmap"), "buffer #0"),
    "bad dtype": (lambda p: p["buffers"][0].update(dtype="object"), "buffer #0"),
    "target kind": (lambda p: p["target"].update(kind="vulkan"), "unknown target kind"),
    # The kernels check nothing they are passed: what each call passes must be what its kernel takes.
    "view retyped under its kernel": (lambda p: _first(p, "view").update(shape=[1]), "where kernel"),
    "a buffer too few": (lambda p: next(c for c in p["calls"] if "kernel" in c)["buffers"].pop(), "which takes"),
    "no signatures": (lambda p: p.pop("signatures"), "'signatures' missing"),
    "a kernel lib.so lacks, signed": (lambda p: _rename_first_kernel(p, "system"), "which lib.so does not define"),
    "constant reshaped, its kernel too": (_reshape_first_const_and_its_kernel, "constant 'c"),
    "signature widened": (lambda p: next(iter(p["signatures"].values()))[0][0].append(2), "where kernel"),
}


@pytest.mark.parametrize("what", list(TAMPERED))
def test_a_tampered_plan_is_refused_even_with_matching_hashes(saved: Path, tmp_path: Path, what: str) -> None:
    fn, expected = TAMPERED[what]
    assert expected in load_error(rewrite(saved, tmp_path / "t.gcpkg", _plan_change(fn)))


def test_code_for_a_cpu_with_instructions_this_one_lacks_is_refused_by_name(saved: Path, tmp_path: Path) -> None:
    from compiler.codegen.target import host_features

    lacking = sorted(f for f, has in host_features().items() if not has)
    if not lacking:
        pytest.skip("this CPU has every feature LLVM knows")
    bad = rewrite(saved, tmp_path / "other.gcpkg", _plan_change(lambda p: p["cpu_features"].append(lacking[0])))
    message = load_error(bad)
    assert f"uses instructions this CPU lacks: {lacking[0]}; compile it again on this machine" in message


def test_the_cli_says_one_line_and_exits_1(saved: Path, tmp_path: Path) -> None:
    bad = rewrite(saved, tmp_path / "t.gcpkg", _plan_change(TAMPERED["view past its arena"][0]))
    r = gc("run", str(bad), "--random-inputs", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("error:") == 1 and "lie outside its arena" in r.stderr


def test_saving_over_a_good_artifact_that_fails_leaves_it_whole(saved: Path, tmp_path: Path, monkeypatch) -> None:
    """A write that fails midway (a full disk) leaves the earlier file as it was, and no temporary file."""
    import os

    target = tmp_path / "keep.gcpkg"
    target.write_bytes(saved.read_bytes())
    model = compiler.load(target)

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(GCError, match=f"cannot write {target}: No space left on device"):
        model.save(target)
    assert target.read_bytes() == saved.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.gcpkg"]


def test_the_typed_plan_is_what_plan_json_says_and_comes_back_the_same(saved: Path) -> None:
    """The build's Plan, written as plan.json and read back after the checks, is the same plan: every
    slot kind the cnn has (arguments, constants, an arena, views, bordered views in it, their wholes,
    channel-blocked layouts, result buffers) and every step."""
    from compiler.codegen.plan import Plan

    built = compiler.compile(str(CNN), "llvm", params={k: v for k, v in random_inputs(
        parse_file(CNN)["main"], 0, parse_file(CNN)).items() if k != "x"}).plan
    loaded = compiler.load(saved).plan
    assert loaded == built == Plan.from_json(built.to_json())
    kinds = {b.kind for b in loaded.buffers}
    assert kinds == {"arg", "const", "arena", "view", "bordered", "whole", "temp"}
    assert any(b.kind == "bordered" and b.in_arena for b in loaded.buffers) and any(b.layout for b in loaded.buffers)
    assert all(s.kernel and s.ops and s.schedule for s in loaded.steps)


def test_a_kernel_reading_its_operands_as_views_saves_loads_and_matches(tmp_path: Path) -> None:
    """Swin-T's [1, 7, 7, C] @ [C, 4C] with its GELU, then back with a residual: the matmul kernels read A, C
    and the residual as [49, ..] views, and the plan's signatures keep the shapes the loader checks calls
    against, so the artifact loads and runs."""
    src = """func @main(%x: tensor<1x7x7x32xf32>, %w1: tensor<32x64xf32>, %b1: tensor<64xf32>, %w2: tensor<64x32xf32>) -> tensor<1x7x7x32xf32> {
  %h = graph.matmul(%x, %w1)
  %a = graph.add(%h, %b1)
  %g = graph.gelu(%a)
  %o = graph.matmul(%g, %w2)
  %y = graph.add(%o, %x)
  return %y
}
"""
    module = compiler.parse(src, "swin.gir")
    inputs = random_inputs(module["main"], 0, module)
    want = compiler.run(module, inputs)[0]
    weights = {k: v for k, v in inputs.items() if k != "x"}
    model = compiler.compile(src, "llvm", params=weights)
    sigs = model.plan.signatures
    assert any(s[0][0] == [1, 7, 7, 32] for s in sigs.values())  # as the caller passes it, not [49, 32]
    model.save(tmp_path / "swin.gcpkg")
    loaded = compiler.load(tmp_path / "swin.gcpkg")
    np.testing.assert_allclose(loaded(x=inputs["x"])[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model(x=inputs["x"])[0], want, rtol=1e-4, atol=1e-5)


def test_the_weights_stream_into_an_npz_numpy_reads_the_same_as_savez(saved: Path) -> None:
    """consts.npz is streamed into the zip (write_npz into a file that cannot seek, hashed as it passes):
    each array member is byte for byte np.savez's, whatever the array's layout or dtype, and the manifest's
    hash is the stored member's."""
    import io

    import ml_dtypes

    arrays = {"c": np.arange(12, dtype=np.float32).reshape(3, 4), "t": np.arange(12).reshape(3, 4).T,
              "f": np.asfortranarray(np.ones((2, 3))), "strided": np.arange(20.0)[::2], "scalar": np.array(3.5),
              "empty": np.zeros((0, 5), np.int8), "bf16": np.ones((2, 3), ml_dtypes.bfloat16)}

    class Unseekable(io.RawIOBase):
        def __init__(self):
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b) -> int:
            self.data += b
            return memoryview(b).nbytes

    out, ref = Unseekable(), io.BytesIO()
    artifact.write_npz(out, arrays)
    np.savez(ref, **arrays)
    with zipfile.ZipFile(io.BytesIO(bytes(out.data))) as ours, zipfile.ZipFile(ref) as theirs:
        assert ours.namelist() == theirs.namelist()
        assert all(ours.read(n) == theirs.read(n) for n in ours.namelist())
    m = members(saved)
    assert json.loads(m["manifest.json"])["sha256"]["consts.npz"] == hashlib.sha256(m["consts.npz"]).hexdigest()
    with np.load(io.BytesIO(m["consts.npz"]), allow_pickle=False) as z:
        assert set(z.files) == {b.name for b in compiler.load(saved).plan.buffers if b.kind == "const"}


def test_constants_go_to_the_device_at_the_first_call_not_at_compile_or_load(saved: Path, tmp_path: Path) -> None:
    """A model compiled or loaded only to be saved never copies its weights to the device."""
    model = compiler.load(saved)
    assert model._consts is None
    model.save(tmp_path / "again.gcpkg")
    assert model._consts is None
    module = parse_file(CNN)
    model(x=random_inputs(module["main"], 0, module)["x"])
    assert model._consts is not None and any(c is not None for c in model._consts)
