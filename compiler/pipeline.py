"""Pipelines: "canonicalize,cse,fuse{max-ops=8}" -> passes, run with verification and instrumentation.

Everything a user of mlir-opt or LLVM opt expects to see around a pass lives here: IR before/after
(whole or as a diff), timing, statistics, dumps, crash reproducers, numerical checks and opt-bisect.
"""

from __future__ import annotations

import difflib
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from compiler.diagnostics import GCError
from compiler.files import write_atomic
from compiler.ir import Module
from compiler.passes import InputError, Pass, make_pass
from compiler.printer import print_module
from compiler.verifier import verify_module

# Weights bound at compile time are constants: fold whatever is computed from them alone (transposes,
# batch_norm scales), however big, so that no call repeats it. The artifact carries the result.
_FOLD = "fold-constants{size-limit=4294967296}"
_COMPILE = f"canonicalize,{_FOLD},cse,fold-batch-norm{{weight-args=false}},canonicalize,{_FOLD},cse,dce,fuse"

# Every named pipeline: -O0/-O1/-O2 (gc opt, and any tool taking -O), and the graph passes gc compile
# runs before planning memory, per target.
PIPELINES = {
    "O0": "",
    "O1": "canonicalize,cse,dce",
    # Folding batch_norm into weights that are arguments would add ops that run on every call; once
    # weights are bound (constants) it folds away completely, so -O2 folds only constant weights.
    "O2": "canonicalize,fold-constants,cse,fold-batch-norm{weight-args=false},canonicalize,cse,dce,fuse",
    "compile-cuda": _COMPILE,
    # The CPU's conv rule tiles output channels in vectors: a conv of 58 channels computes 64 (pad-channels);
    # 3x3 stride-1 convs of bound weights run as Winograd transforms around a batched matmul.
    # Concats that share their first operands (DenseNet's blocks) stay ops of their own: plan-memory lays
    # them out as prefixes of one buffer, and they run no kernel.
    # Strided 1x1 convs read a compact copy of the pixels they use (subsample).
    "compile-llvm": _COMPILE.replace(",dce,fuse", ",pad-channels,winograd,subsample,dce,fuse{concat-chains=true}"),
}
OPT_LEVELS = ("O0", "O1", "O2")
NAMED_PIPELINES = {level: PIPELINES[level] for level in OPT_LEVELS}  # what -O names


def parse_pipeline(text: str) -> list[Pass]:
    """`a,b{k=v,k2=v2},c` -> passes. Inside braces a piece without `=` continues a list value."""
    passes: list[Pass] = []
    i, n = 0, len(text)
    while i < n:
        j = i
        while j < n and text[j] not in ",{":
            j += 1
        name = text[i:j].strip()
        options: dict[str, str] = {}
        if j < n and text[j] == "{":
            k = text.find("}", j)
            if k < 0:
                raise GCError(f"pipeline '{text}': missing '}}' after '{name}{{'")
            options = _parse_options(name, text[j + 1 : k])
            j = k + 1
            while j < n and text[j] == " ":
                j += 1
            if j < n and text[j] != ",":
                raise GCError(f"pipeline '{text}': expected ',' after '{text[i:j]}'")
        if name:
            passes.append(make_pass(name, options))
        elif options or (j < n and text[j] == ","):
            raise GCError(f"pipeline '{text}': a pass name is missing")
        i = j + 1
    return passes


def _parse_options(pass_name: str, body: str) -> dict[str, str]:
    options: dict[str, str] = {}
    last = None
    for piece in body.replace(" ", ",").split(","):
        piece = piece.strip()
        if not piece:
            continue
        if "=" in piece:
            key, value = piece.split("=", 1)
            last = key.strip()
            options[last] = value.strip()
        elif last is not None:
            options[last] += "," + piece
        else:
            raise GCError(f"pass '{pass_name}': option '{piece}' needs a value (key=value)")
    return options


@dataclass
class Instrumentation:
    """What to show around each pass. Output goes to `out` (stderr by default), IR dumps included."""

    print_before: set[str] = field(default_factory=set)
    print_after: set[str] = field(default_factory=set)
    print_after_all: bool = False
    print_after_change: bool = False
    print_after_failure: bool = False
    print_diff: bool = False
    debuginfo: bool = False
    timing: bool = False
    statistics: bool = False
    verify_each: bool = True
    dump_dir: str | None = None
    bisect_limit: int | None = None
    check_numerics: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5
    seed: int = 0
    reproducer: str | None = None  # where to write FILE.reproducer.gir; None: do not
    replay: str = "gc opt"  # how the reproducer's replay command starts
    out: TextIO = field(default_factory=lambda: sys.stderr)


@dataclass
class PassRecord:
    name: str
    seconds: float
    changed: bool
    ran: bool


class PipelineFailure(Exception):
    """A pass raised or broke the IR: an internal error, reported with the pass's name."""

    def __init__(self, message: str, reproducer: str | None):
        super().__init__(message)
        self.reproducer = reproducer


@dataclass
class NumericsMismatch:
    pass_name: str
    index: int
    max_abs: float
    max_rel: float
    func: str
    result: int


def _refuse_runtime_attrs(module: Module) -> None:
    """Passes read attributes as numbers: a function taking some at run time is specialized to a call's
    values first (gc run and compiled models do that at each call)."""
    for f in module:
        for op in f.ops:
            if op.runtime_attrs():
                raise GCError(f"{op.name}: {op._runtime_list()} is taken at run time, and graph passes need every "
                              f"attribute's value: @{f.name} is optimized and compiled at each call, once its "
                              f"values are known (gc run and gc compile do so)", op.loc)


def run_pipeline(module: Module, passes: list[Pass] | str, inst: Instrumentation | None = None) -> list[PassRecord]:
    """Run `passes` over `module` in place, verifying after each; returns a record per pass."""
    inst = inst or Instrumentation(verify_each=True)
    if isinstance(passes, str):
        passes = parse_pipeline(passes)
    if passes:
        _refuse_runtime_attrs(module)
    records: list[PassRecord] = []
    numerics = _Numerics(module, inst) if inst.check_numerics else None
    prev_text = print_module(module, debuginfo=inst.debuginfo) if inst.print_diff else None
    dump = Path(inst.dump_dir) if inst.dump_dir else None
    if dump:
        try:
            dump.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise GCError(f"cannot write {dump}: {e.strerror or e}") from None
        write_atomic(dump / "00-input.gir", print_module(module, debuginfo=True))
    for i, p in enumerate(passes):
        label = p.spelled()
        if inst.bisect_limit is not None:
            ran = i < inst.bisect_limit
            verb = "running" if ran else "NOT running"
            print(f"BISECT: {verb} pass ({i + 1}) {label} on module", file=inst.out)
            if not ran:
                records.append(PassRecord(label, 0.0, False, False))
                continue
        if p.name in inst.print_before:
            _show(inst, f"IR Dump Before {label}", print_module(module, debuginfo=inst.debuginfo))
        before = module.fingerprint()
        backup = module.clone()
        t0 = time.perf_counter()
        try:
            p.run(module)
            changed = module.fingerprint() != before
            # (an unchanged module was valid before: DenseNet-121's compile verified 14 times, 0.8 s)
            if inst.verify_each and changed:
                verify_module(module)
        except InputError:
            raise  # the input's fault, not the pass's: a diagnostic, no reproducer
        except Exception as e:  # noqa: BLE001 (any other failure of a pass is a bug in that pass)
            raise _failure(module, backup, passes, i, e, inst) from None
        seconds = time.perf_counter() - t0
        records.append(PassRecord(label, seconds, changed, True))
        if dump:
            write_atomic(dump / f"{i + 1:02d}-{p.name}.gir", print_module(module, debuginfo=True))
        show = inst.print_after_all or p.name in inst.print_after or (inst.print_after_change and changed)
        if show or prev_text is not None:
            text = print_module(module, debuginfo=inst.debuginfo)
            if show:
                if inst.print_diff:
                    _show(inst, f"IR Diff After {label}", _diff(prev_text or "", text, label))
                else:
                    _show(inst, f"IR Dump After {label}" + ("" if changed else " (no change)"), text)
            if prev_text is not None:
                prev_text = text
        if numerics is not None:
            bad = numerics.check(module, label, i)
            if bad is not None:
                print(numerics.describe(bad), file=inst.out)
                numerics.first = numerics.first or bad
    if inst.timing:
        _timing_table(records, inst.out)
    if inst.statistics:
        _statistics(passes, inst.out)
    if numerics is not None and numerics.first is None:
        print(f"check-numerics: every pass kept the outputs within rtol={inst.rtol}, atol={inst.atol}", file=inst.out)
    return records


def _show(inst: Instrumentation, title: str, text: str) -> None:
    print(f"// -----// {title} //----- //", file=inst.out)
    print(text, file=inst.out, end="" if text.endswith("\n") else "\n")


def _diff(a: str, b: str, label: str) -> str:
    lines = difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), "before", f"after {label}")
    return "".join(lines) or "(no change)\n"


def _failure(module: Module, backup: Module, passes: list[Pass], i: int, err: Exception, inst: Instrumentation):
    p = passes[i]
    if isinstance(err, GCError):
        what = f"pass '{p.name}' produced invalid IR:\n{err.render()}"
    else:
        what = f"pass '{p.name}' crashed: {type(err).__name__}: {err}\n" + "".join(traceback.format_tb(err.__traceback__))
    if inst.print_after_failure:
        _show(inst, f"IR Dump After {p.spelled()} Failed", print_module(module, debuginfo=True))
    path = None
    if inst.reproducer:
        rest = ",".join(q.spelled() for q in passes[i:])
        header = (
            f"// gc crash reproducer: the IR before pass '{p.spelled()}' crashed.\n"
            f"// failing pass: {p.spelled()}\n// pipeline from here: {rest}\n"
            f"// replay: {inst.replay} {inst.reproducer} -p '{rest}'\n"
        )
        try:
            write_atomic(inst.reproducer, header + print_module(backup, debuginfo=True))
        except GCError as e:  # the crash is the news: say that no reproducer could be written, not only that
            what += f"\n(no reproducer: {e.message})"
            return PipelineFailure(what, None)
        path = inst.reproducer
        what += f"\nwrote a reproducer: {path}\nreplay it with: {inst.replay} {path} -p '{rest}'"
    return PipelineFailure(what, path)


def _timing_table(records: list[PassRecord], out: TextIO) -> None:
    total = sum(r.seconds for r in records) or 1e-12
    print("===-------------------------------------------------------------------------===", file=out)
    print("                         ... Pass execution timing report ...", file=out)
    print("===-------------------------------------------------------------------------===", file=out)
    print(f"  Total Execution Time: {total:.4f} seconds\n", file=out)
    print("   ---Wall Time---  --- Name ---", file=out)
    for r in records:
        print(f"   {r.seconds:.4f} ({100 * r.seconds / total:5.1f}%)  {r.name}" + ("" if r.ran else " (skipped)"), file=out)
    print(f"   {total:.4f} (100.0%)  Total", file=out)


def _statistics(passes: list[Pass], out: TextIO) -> None:
    print("===-------------------------------------------------------------------------===", file=out)
    print("                         ... Pass statistics report ...", file=out)
    print("===-------------------------------------------------------------------------===", file=out)
    for p in passes:
        print(p.spelled(), file=out)
        for key, n in sorted(p.stats.items()):
            print(f"  ({n}) {key}", file=out)


class _Numerics:
    """Runs the interpreter after every pass on seeded inputs and compares with the input module."""

    def __init__(self, module: Module, inst: Instrumentation):
        from compiler.inputs import random_inputs
        from compiler.interpreter import run

        self.inst = inst
        self.first: NumericsMismatch | None = None
        # A `?` size is 3 in every function: small, and not 1, which would broadcast where 3 cannot.
        self.inputs = {f.name: random_inputs(f, inst.seed, module, unknown=3) for f in module}
        self.expected = {name: run(module, x, name) for name, x in self.inputs.items()}
        self.run = run
        # A called function may be inlined away; one nothing calls is an entry, and losing it is a change.
        called = {op.called().name for f in module for op in f.ops if op.called() is not None}
        self.entries = {f.name for f in module if f.name not in called}

    def check(self, module: Module, label: str, index: int) -> NumericsMismatch | None:
        lost = float("inf")
        for name, expected in self.expected.items():
            if name not in module:
                if name in self.entries:
                    return NumericsMismatch(label, index, lost, lost, name, 0)
                continue
            f = module[name]
            inputs = {k: v for k, v in self.inputs[name].items() if k in {a.name for a in f.args}}
            got = self.run(module, inputs, name)
            if len(got) != len(expected):  # a result gone or added: changed from the first one missing
                return NumericsMismatch(label, index, lost, lost, name, min(len(got), len(expected)))
            for r, (a, b) in enumerate(zip(expected, got)):
                bad = _mismatch(a, b, self.inst.rtol, self.inst.atol)
                if bad is not None:
                    return NumericsMismatch(label, index, bad[0], bad[1], name, r)
        return None

    def describe(self, m: NumericsMismatch) -> str:
        return (
            f"check-numerics: pass ({m.index + 1}) {m.pass_name} changed @{m.func} result {m.result}: "
            f"max abs error {m.max_abs:.3g}, max rel error {m.max_rel:.3g} "
            f"(rtol={self.inst.rtol}, atol={self.inst.atol})"
        )


def _mismatch(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple[float, float] | None:
    if a.shape != b.shape:
        return (float("inf"), float("inf"))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if np.allclose(b64, a64, rtol=rtol, atol=atol, equal_nan=True):
        return None
    with np.errstate(all="ignore"):
        diff = np.abs(a64 - b64)
        diff = np.where(np.isnan(a64) & np.isnan(b64), 0, diff)
        rel = diff / np.maximum(np.abs(a64), np.finfo(np.float64).tiny)
    return float(np.nanmax(diff)), float(np.nanmax(rel))
