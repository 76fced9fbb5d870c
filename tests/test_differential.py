"""Differential testing of the passes: random pipelines over random modules must keep every output.

Each example is a random valid module (tests/strategies.py) and a random pipeline drawn from the
registered passes, with random options. The interpreter runs the module on seeded inputs before and
after the pipeline; the outputs must keep their dtypes and shapes and agree within rtol 1e-5, atol 1e-6
(NaN equal to NaN, integers and bools exactly). The pipeline must not crash, and what it leaves must
verify and print/parse round trip. A failure message holds the pipeline and the module as a reproducer
for `gc opt`.

Passes appear here as they land: the pipelines draw from whatever load_all() registers, less the ones
that change a function's meaning by design (prune-weights, the test-* plugin passes). Passes that
reassociate floating-point arithmetic (fold-batch-norm) run on continuous modules only, where a rounding
difference cannot flip a comparison or a floor.

GC_DIFF_EXAMPLES=100000 pytest tests/test_differential.py runs it for about an hour (the default, 500, takes about 20 s).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import get_type_hints

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import modules

from compiler.diagnostics import GCError
from compiler.inputs import random_inputs
from compiler.interpreter import run
from compiler.ir import DType, Module
from compiler.parser import parse, parse_file
from compiler.passes import Pass, load_all
from compiler.pipeline import NAMED_PIPELINES, run_pipeline
from compiler.printer import print_module
from compiler.verifier import verify_module

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))
N_EXAMPLES = int(os.environ.get("GC_DIFF_EXAMPLES", "500"))

CHANGES_MEANING = {"prune-weights", "mixed-precision"}  # zeroes weights / rounds to 16 bits on purpose
INEXACT = {"fold-batch-norm"}  # folds in f64 and rounds once: the last bits of f32 results move
TOLERANCE = {DType.f16: (1e-3, 1e-4), DType.bf16: (1e-2, 1e-3)}  # else rtol 1e-5, atol 1e-6

SETTINGS = settings(
    max_examples=N_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def pass_names(*, inexact: bool) -> list[str]:
    """The registered passes a pipeline may draw, in a stable order."""
    names = [n for n in load_all() if n not in CHANGES_MEANING and not n.startswith("test-")]
    return sorted(n for n in names if inexact or n not in INEXACT)


@st.composite
def a_pass(draw, names: list[str]) -> Pass:
    """One pass with random options: bools either way, ints small, lists a non-empty subset of the default."""
    cls = load_all()[draw(st.sampled_from(names))]
    hints = get_type_hints(cls)
    kwargs = {}
    for f in cls.options():
        typ, default = hints[f.name], f.default
        if draw(st.booleans()):
            continue  # keep the default
        if typ is bool:
            kwargs[f.name] = not default
        elif typ is int:
            kwargs[f.name] = draw(st.sampled_from([1, 2, 3, 8]))
        elif getattr(typ, "__origin__", None) is tuple and default:
            kwargs[f.name] = tuple(draw(st.lists(st.sampled_from(default), min_size=1, unique=True)))
    try:
        return cls(**kwargs)
    except GCError:
        return cls()


def pipelines(*, inexact: bool = False) -> st.SearchStrategy[list[Pass]]:
    names = pass_names(inexact=inexact)
    return st.lists(a_pass(names), min_size=1, max_size=6)


def spelled(passes: list[Pass]) -> str:
    return ",".join(p.spelled() for p in passes)


def reproducer(source: str, passes: list[Pass] | str) -> str:
    pipe = passes if isinstance(passes, str) else spelled(passes)
    return f"reproduce with: gc opt repro.gir -p '{pipe}'\n--- repro.gir ---\n{source}"


def outputs(module: Module, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """@main's outputs on the inputs its (maybe pruned) arguments still name."""
    f = module["main"]
    with np.errstate(all="ignore"):
        return run(module, {a.name: inputs[a.name] for a in f.args})


def mismatch(expected: list[np.ndarray], got: list[np.ndarray], rtol: float, atol: float) -> str | None:
    """What differs between two lists of outputs, or None."""
    if len(expected) != len(got):
        return f"{len(got)} outputs instead of {len(expected)}"
    for i, (a, b) in enumerate(zip(expected, got)):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"result {i} is {b.dtype}{list(b.shape)} instead of {a.dtype}{list(a.shape)}"
        dtype = DType.from_numpy(a.dtype)
        if dtype.is_float:  # bf16 is no np.floating
            r, t = TOLERANCE.get(dtype, (rtol, atol))
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            if not np.allclose(b64, a64, rtol=r, atol=t, equal_nan=True):
                with np.errstate(all="ignore"):
                    bad = ~np.isclose(b64, a64, rtol=r, atol=t, equal_nan=True)
                k = tuple(int(j) for j in np.argwhere(bad)[0])
                return f"result {i} differs at {list(k)}: {b64[k]!r} instead of {a64[k]!r} ({int(bad.sum())} elements)"
        elif not np.array_equal(a, b):
            k = tuple(int(j) for j in np.argwhere(a != b)[0])
            return f"result {i} differs at {list(k)}: {b[k]!r} instead of {a[k]!r}"
    return None


def check_pipeline(
    module: Module,
    passes: list[Pass] | str,
    seed: int = 0,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    inputs: dict[str, np.ndarray] | None = None,
) -> None:
    """Run `passes` over `module` in place; fail, with a reproducer, unless the outputs stay the same."""
    source = print_module(module)
    inputs = inputs if inputs is not None else random_inputs(module["main"], seed)
    try:
        expected = outputs(module, inputs)
    except Exception as e:  # noqa: BLE001 (the strategy makes modules that run: a bug of an op or of the strategy)
        pytest.fail(f"the module fails to run before any pass: {type(e).__name__}: {e}\n{source}", pytrace=False)
    problem = transform_and_compare(module, passes, inputs, expected, rtol, atol)
    if problem:
        pytest.fail(f"{problem}\n{reproducer(source, passes)}", pytrace=False)


def transform_and_compare(
    module: Module,
    passes: list[Pass] | str,
    inputs: dict[str, np.ndarray],
    expected: list[np.ndarray],
    rtol: float,
    atol: float,
) -> str | None:
    """What went wrong running `passes` and the transformed module, or None."""
    try:
        run_pipeline(module, passes)
    except GCError:
        return None  # a diagnostic (a pass refusing its options), not a crash
    except Exception as e:  # noqa: BLE001 (PipelineFailure, or anything else: a crash)
        return f"pipeline failed: {type(e).__name__}: {e}"
    text = print_module(module)
    try:
        verify_module(module)
        again = print_module(parse(text, "after.gir"))
    except GCError as e:
        return f"the pipeline left IR that does not verify or parse back:\n{e}\n--- after ---\n{text}"
    if again != text:
        return f"the pipeline's output does not round trip:\n{text}\n--- parsed and printed again ---\n{again}"
    try:
        got = outputs(module, inputs)
    except Exception as e:  # noqa: BLE001
        return f"the transformed module fails to run: {type(e).__name__}: {e}\n--- after ---\n{text}"
    bad = mismatch(expected, got, rtol, atol)
    return f"outputs changed: {bad}\n--- after ---\n{text}" if bad else None


# --- random pipelines over random modules ------------------------------------------------------------


# Exact values where identities live: x + 0, x * 1, relu at 0, ties of max and argmax, signed zeros.
SPECIAL_VALUES = [0.0, -0.0, 1.0, -1.0]


def with_special_values(module: Module, seed: int) -> dict[str, np.ndarray]:
    """random_inputs, with about a quarter of the elements of each float argument set to a special value;
    arguments whose users ask for a range (a batch_norm variance) keep theirs."""
    f = module["main"]
    inputs = random_inputs(f, seed)
    rng = np.random.default_rng(seed)
    uses = f.users()
    for a in f.args:
        if not a.type.dtype.is_float or any(_has_range(op, i) for op, i in uses.get(a, [])):
            continue
        x = np.array(inputs[a.name])
        mask = rng.random(x.shape) < 0.25
        x[mask] = rng.choice(SPECIAL_VALUES, size=int(mask.sum()))
        inputs[a.name] = x
    return inputs


def _has_range(op, index: int) -> bool:
    hook = getattr(op, "input_range", None)
    return hook is not None and hook(index) is not None


@SETTINGS
@given(module=modules(), passes=pipelines(), seed=st.integers(0, 2**16), special=st.booleans())
def test_random_pipelines_keep_outputs(module: Module, passes: list[Pass], seed: int, special: bool) -> None:
    check_pipeline(module, passes, seed, inputs=with_special_values(module, seed) if special else None)


@settings(SETTINGS, max_examples=max(N_EXAMPLES // 3, 10))
@given(module=modules(continuous=True), passes=pipelines(inexact=True), seed=st.integers(0, 2**16))
def test_random_pipelines_with_inexact_passes_keep_outputs_of_continuous_modules(
    module: Module, passes: list[Pass], seed: int
) -> None:
    check_pipeline(module, passes, seed)


# --- the standard pipelines over the examples --------------------------------------------------------


def standard_pipeline(level: str) -> str:
    """-O1/-O2 as named by the pipeline module, keeping only the passes registered so far."""
    registered = load_all()
    elements, depth, start, text = [], 0, 0, NAMED_PIPELINES[level] + ","
    for i, c in enumerate(text):  # split at the commas outside braces: `fuse{kinds=a,b}` is one element
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            elements.append(text[start:i].strip())
            start = i + 1
    return ",".join(e for e in elements if e and e.split("{")[0] in registered)


# Each pass alone, and the standard pipelines, over every example: the per-pass "examples keep their
# outputs" tests, in one place.
PASSES_ALONE = ["canonicalize", "cse", "dce", "fold-constants", "fold-constants,cse,dce", "fuse"]


@pytest.mark.parametrize("pipeline", [*PASSES_ALONE, "O1", "O2"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_passes_and_standard_pipelines_keep_example_outputs(path: Path, pipeline: str) -> None:
    """Every pass alone keeps every output of every example bit for bit (none of them reassociates), and
    refuses none of them; -O1 and -O2 (as far as their passes are registered) keep them within tolerance."""
    if pipeline in ("O1", "O2"):
        pipeline = standard_pipeline(pipeline)
        if not pipeline:
            pytest.skip("no pass of the pipeline is registered yet")
        check_pipeline(parse_file(path), pipeline, seed=0)
        return
    module = parse_file(path)
    inputs = random_inputs(module["main"], 0)
    expected = outputs(module, inputs)
    run_pipeline(module, pipeline)  # a diagnostic fails the test too
    verify_module(module)
    text = print_module(module)
    assert print_module(parse(text, "after.gir")) == text
    for i, (want, got) in enumerate(zip(expected, outputs(module, inputs), strict=True)):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), f"result {i}"
        assert got.tobytes() == want.tobytes(), f"result {i} changed: {mismatch([want], [got], 0, 0)}"


# --- bugs the differential test found ----------------------------------------------------------------

SIGNED_ZERO = """func @main(%x: tensor<2xf32>) -> tensor<2xf32> {{
  %zero = graph.constant {{value = dense<{zero}> : tensor<2xf32>}}
  %s = graph.{op}(%x, %zero)
  %r = graph.reciprocal(%s)
  return %r
}}
"""


@pytest.mark.parametrize("op, zero", [("add", "0.0"), ("sub", "-0.0")])
def test_canonicalize_keeps_the_sign_of_a_zero_sum(op: str, zero: str) -> None:
    if "canonicalize" not in load_all():
        pytest.skip("canonicalize is not registered yet")
    module = parse(SIGNED_ZERO.format(op=op, zero=zero))
    check_pipeline(module, "canonicalize", inputs={"x": np.array([-0.0, 2.0], np.float32)})
