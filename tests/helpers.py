"""Test helpers: the gc command line, one op through print -> parse -> verify -> interpret, artifacts
rewritten as a tamperer would."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from compiler.builder import finish, new_func
from compiler.interpreter import run
from compiler.ir import DType, Module, TensorType
from compiler.parser import parse


def run_op(name: str, *arrays: np.ndarray, **attrs) -> np.ndarray | tuple[np.ndarray, ...]:
    """Build `graph.<name>(args) {attrs}`, round-trip it through text, and run it on the interpreter.

    Returns one array, or a tuple for a multi-result op."""
    args = {f"a{i}": TensorType(tuple(a.shape), DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)}
    f, b, vals = new_func("main", args)
    out = getattr(b, name)(*vals, **attrs)
    outs = out if isinstance(out, tuple) else (out,)
    finish(f, *outs)
    module = Module([f])
    text = str(module)
    again = parse(text, "<run_op>")
    assert str(again) == text, f"round trip changed the module:\n{text}\n---\n{again}"
    res = run(again, list(arrays))
    return tuple(res) if isinstance(out, tuple) else res[0]


def infer_error(name: str, *types: str, **attrs) -> str:
    """The diagnostic message for an op applied to operands of the given types (e.g. "tensor<2x3xf32>")."""
    from compiler.diagnostics import GCError
    from compiler.ir import format_attr

    args = ", ".join(f"%a{i}: {t}" for i, t in enumerate(types))
    operands = ", ".join(f"%a{i}" for i in range(len(types)))
    attr_text = ""
    if attrs:
        attr_text = " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in attrs.items()) + "}"
    text = f"func @main({args}) -> tensor<f32> {{\n  %r = graph.{name}({operands}){attr_text}\n  return %r\n}}\n"
    try:
        parse(text, "t.gir")
    except GCError as e:
        return e.diagnostics[0].message
    raise AssertionError("expected a diagnostic")


ROOT = Path(__file__).resolve().parent.parent


def gc(*args: str, stdin: str | bytes | None = None, cwd: Path = ROOT, env: dict | None = None,
       timeout: float | None = None) -> subprocess.CompletedProcess:
    """`gc ARGS...` in a process of its own (text output; bytes on stdin pass through as they are)."""
    binary = isinstance(stdin, bytes)
    r = subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=not binary, input=stdin,
                       cwd=cwd, env=env, timeout=timeout)
    if binary:
        r.stdout, r.stderr = (x.decode("utf-8", "replace") for x in (r.stdout, r.stderr))
    return r


def gc_here(capsys, *args) -> tuple[int, str, str]:
    """`gc ARGS...` in this process (compiler.cli.main), with what it printed: (exit code, stdout, stderr)."""
    from compiler.cli import main

    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_outputs(got, want, *, rtol: float = 0.0, atol: float = 0.0, bits: bool = False, err_msg: str = "") -> None:
    """What one computation gave against what another did: as many results, each of the same dtype and
    shape, and equal: bit for bit with `bits` (NaN payloads and signed zeros too), else NaN where NaN and
    the rest within rtol/atol (exactly by default; floats compared through f64, which bf16 needs)."""
    assert len(got) == len(want), f"{len(got)} results, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (
            f"result {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
        if bits:
            assert g.tobytes() == w.tobytes(), f"result {i} differs: {g} != {w} {err_msg}"
            continue
        if g.dtype.kind == "f" or g.dtype.name == "bfloat16":
            g, w = g.astype(np.float64), w.astype(np.float64)
        if rtol or atol:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"result {i} {err_msg}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"result {i} {err_msg}")


def calls_on_nan_arena(model, args: list | dict, want: np.ndarray, n: int = 3, rtol: float = 1e-4,
                       atol: float = 1e-5) -> None:
    """`n` calls of a compiled model, each after the first on an arena of 0xFF bytes (NaN as f32): what a
    kernel reads must have been written in this call (a conv's zero border, a tile), and the first
    result must match `want` every time."""
    for i in range(n):
        if i:
            for ws in model._idle:
                for b, buf in zip(model.plan.buffers, ws.bufs):
                    if b.kind == "arena":
                        np.from_dlpack(buf).view(np.uint8)[:] = 0xFF
        got = model(**args)[0] if isinstance(args, dict) else model(*args)[0]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def assert_pass_leaves_alone(text: str, pass_spec: str, stat: str, weights: tuple[str, ...] = ("w", "b")) -> None:
    """`pass_spec` (one pass) on `text` with the arguments named in `weights` bound as constants changes
    nothing and counts nothing under `stat`."""
    from compiler.builder import bind_arguments
    from compiler.inputs import random_inputs
    from compiler.pipeline import parse_pipeline, run_pipeline

    module = parse(text)
    inputs = random_inputs(module["main"], 0, module)
    bind_arguments(module["main"], {k: inputs[k] for k in weights})
    before = str(module)
    (p,) = parse_pipeline(pass_spec)
    run_pipeline(module, [p])
    assert str(module) == before and p.stats[stat] == 0


def members(path: Path) -> dict[str, bytes]:
    """An artifact's zip members by name."""
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def rewrite(path: Path, out: Path, change, rehash: bool = True) -> Path:
    """A copy of the artifact with `change(members)` applied; with `rehash`, the manifest updated to match
    (a tamperer who knows the format), so that only the deeper checks can catch it."""
    m = members(path)
    change(m)
    if rehash and "manifest.json" in m:
        manifest = json.loads(m["manifest.json"])
        manifest["sha256"] = {n: hashlib.sha256(d).hexdigest() for n, d in m.items() if n != "manifest.json"}
        m["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(out, "w") as z:
        for n, d in m.items():
            z.writestr(n, d)
    return out
