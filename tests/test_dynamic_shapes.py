"""Dynamic dimensions (`?`, the contract's v2): types, shape rules with sizes known only at run time,
and running a function at the sizes its arguments bring."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

from compiler.diagnostics import GCError
from compiler.ir import DYN, TensorType, Value, known
from compiler.parser import parse, parse_file

OPS = parse_file(ROOT / "tests" / "gir" / "graph" / "ops.gir")
CASES = [(f.name, n, op) for f in OPS for n, op in enumerate(f.ops)]


def _with_dim_dynamic(op, operand: int, axis: int):
    """A copy of `op` whose operand `operand` has dimension `axis` made `?`."""
    operands = [Value(v.type, v.name) for v in op.operands]
    t = operands[operand].type
    operands[operand].type = t.with_shape(DYN if a == axis else d for a, d in enumerate(t.shape))
    return type(op)(operands, dict(op.attrs), [r.type for r in op.results], op.loc)


@pytest.mark.parametrize("func, n, op", CASES, ids=[f"{f}-{n}-{op.name}" for f, n, op in CASES])
def test_every_shape_rule_takes_a_dimension_known_only_at_run_time(func, n, op) -> None:
    """Each operand dimension of every op in ops.gir made `?` in turn: the rule neither raises nor says
    more than it knows (a result size is the static one or `?`) and keeps ranks and dtypes."""
    static = op.infer_types()
    for i, v in enumerate(op.operands):
        for axis in range(v.type.rank):
            if v.owner is not None and getattr(v.owner, "name", "") == "graph.constant":
                continue  # a constant's sizes are always known
            try:
                got = _with_dim_dynamic(op, i, axis).infer_types()
            except GCError as e:
                if op.name == "graph.squeeze" and op.axes is None:
                    assert "known only at run time" in str(e)  # the rank itself would depend on the size
                    continue
                raise AssertionError(f"operand {i} axis {axis} as ?: {e}") from None
            for s, g in zip(static, got, strict=True):
                assert g.dtype == s.dtype and g.rank == s.rank, (i, axis, s, g)
                assert all(not known(b) or b == a for a, b in zip(s.shape, g.shape)), (i, axis, s, g)


@pytest.mark.parametrize("func, n, op", CASES, ids=[f"{f}-{n}-{op.name}" for f, n, op in CASES])
def test_every_shape_rule_takes_every_dimension_unknown(func, n, op) -> None:
    """All operand dimensions `?` at once (constants keep theirs): ranks and dtypes are still known."""
    operands = [Value(v.type if getattr(v.owner, "name", "") == "graph.constant"
                      else v.type.with_shape((DYN,) * v.type.rank), v.name) for v in op.operands]
    try:
        got = type(op)(operands, dict(op.attrs), [r.type for r in op.results], op.loc).infer_types()
    except GCError as e:
        assert op.name == "graph.squeeze" and op.axes is None and "known only at run time" in str(e)
        return
    for s, g in zip(op.infer_types(), got, strict=True):
        assert g.dtype == s.dtype and g.rank == s.rank
        assert all(not known(b) or b == a for a, b in zip(s.shape, g.shape))


def test_types_with_question_marks_round_trip() -> None:
    text = ("func @main(%x: tensor<?x784xf32>, %s: tensor<1x?x?xi64>) -> tensor<?x784xf32> {\n"
            "  %y = graph.relu(%x) : tensor<?x784xf32>\n  return %y\n}\n")
    m = parse(text)
    assert m["main"].args[0].type == TensorType((DYN, 784), m["main"].args[0].type.dtype)
    assert str(m).strip() == text.strip()
    assert str(parse(str(m))) == str(m)


# --- the examples with a dynamic batch or sequence --------------------------------------------------

import re  # noqa: E402

from compiler.inputs import random_inputs  # noqa: E402
from compiler.interpreter import run  # noqa: E402
from compiler.pipeline import PIPELINES, run_pipeline  # noqa: E402

_MLP, _CNN, _TF = ((ROOT / "examples" / f).read_text() for f in ("mlp.gir", "cnn.gir", "transformer.gir"))


def _transformer(n) -> str:
    """The transformer block at sequence n (`?`: any): its reshapes keep the sequence with 0."""
    text = re.sub(r"(?<=[<x])128(?=x)", str(n), _TF)
    return text.replace("shape = [128, ", "shape = [0, " if n == "?" else f"shape = [{n}, ")


EXAMPLES = {  # name -> (GIR at size n, sizes to run)
    "mlp": (lambda n: _MLP.replace("tensor<64x", f"tensor<{n}x"), [1, 5, 64]),
    "cnn": (lambda n: re.sub(r"tensor<1x", f"tensor<{n}x", _CNN), [1, 3]),
    "transformer": (_transformer, [1, 7, 32]),
}


SPELLINGS = ["?", "?(n)"]  # a size known at run time, anonymous or named (every ? of the example one name)


def _spelled(text: str, spell: str) -> str:
    return text if spell == "?" else re.sub(r"(?<=[<x])\?(?=x)", spell, text)


def _inputs(static_text: str, seed: int = 0) -> dict[str, np.ndarray]:
    m = parse(static_text)
    return random_inputs(m["main"], seed, m)


@pytest.mark.parametrize("spell", SPELLINGS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_a_dynamic_example_runs_at_every_size_as_the_static_one(name, spell) -> None:
    at, sizes = EXAMPLES[name]
    dyn = parse(_spelled(at("?"), spell))
    assert not dyn["main"].args[0].type.is_static
    for n in sizes:
        x = _inputs(at(n))
        want = run(parse(at(n)), x)
        got = run(dyn, x)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("spell", SPELLINGS)
@pytest.mark.parametrize("pipeline", ["O1", "O2", "compile-llvm", "compile-cuda"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_graph_passes_keep_a_dynamic_example_right_at_every_size(name, pipeline, spell) -> None:
    at, sizes = EXAMPLES[name]
    dyn = parse(_spelled(at("?"), spell))
    run_pipeline(dyn, PIPELINES[pipeline])
    assert not dyn["main"].args[0].type.is_static
    for n in sizes[:2]:
        x = _inputs(at(n))
        for g, w in zip(run(dyn, x), run(parse(at(n)), x), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spell", SPELLINGS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_graph_passes_with_bound_weights_keep_a_dynamic_example_right(name, spell) -> None:
    """Weights bound as constants (what `gc compile --params` does): folding, pad-channels and Winograd see
    a dynamic batch or sequence beside static weights."""
    from compiler.driver import bind_params

    at, sizes = EXAMPLES[name]
    x = _inputs(at(sizes[1]))
    data = next(iter(x))
    dyn = parse(_spelled(at("?"), spell))
    bind_params(dyn, "main", {k: v for k, v in x.items() if k != data})
    run_pipeline(dyn, PIPELINES["compile-llvm"])
    static = parse(at(sizes[1]))
    np.testing.assert_allclose(run(dyn, {data: x[data]})[0], run(static, x)[0], rtol=1e-4, atol=1e-4)


_TRAIN = (ROOT / "examples" / "train_mlp.gir").read_text()


@pytest.mark.parametrize("pipeline", ["autodiff", "make-train-step", "make-train-step,remat", "mixed-precision",
                                      "make-train-step{loss-scale=1024},mixed-precision,O2"])
@pytest.mark.parametrize("spell", SPELLINGS)
def test_training_passes_with_a_dynamic_batch(pipeline, spell) -> None:
    """Autodiff and a training step of the MLP with its batch `?`: the gradients' sums over the batch
    (the bias's), the loss's mean and the updates are those of the static MLP at each batch."""
    at = lambda n: _TRAIN.replace("tensor<64", f"tensor<{n}")  # noqa: E731
    dyn = parse(_spelled(at("?"), spell))
    run_pipeline(dyn, ",".join(PIPELINES.get(p, p) for p in pipeline.split(",")))
    for n in (3, 8):
        static = parse(at(n))
        run_pipeline(static, ",".join(PIPELINES.get(p, p) for p in pipeline.split(",")))
        for f in (f for f in static if not f.name.startswith("fused_")):
            x = random_inputs(f, 0, static)
            tol = 5e-2 if "mixed" in pipeline else 1e-5
            for g, w in zip(run(dyn, x, f.name), run(static, x, f.name), strict=True):
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


# --- compiled, and the command line ---------------------------------------------------------------

from helpers import gc, gc_here  # noqa: E402

import compiler  # noqa: E402

_DYN_MLP = EXAMPLES["mlp"][0]("?")


@pytest.mark.parametrize("spell", SPELLINGS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_a_compiled_dynamic_example_matches_the_interpreter_at_every_size(name, spell, tmp_path) -> None:
    """One compile, called at several sizes (a size again after others), saved and loaded with the sizes it
    has compiled: each result is the interpreter's at that size."""
    at, sizes = EXAMPLES[name]
    first = _inputs(at(sizes[0]))
    data = next(iter(first))
    weights = {k: v for k, v in first.items() if k != data}
    x = {n: {**_inputs(at(n)), **weights} for n in sizes}  # one set of weights
    model = compiler.compile(_spelled(at("?"), spell), "llvm", params=weights)
    for n in [*sizes, sizes[0]]:
        (got,) = model(x[n][data])
        (want,) = run(parse(at(n)), x[n])
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    model.save(tmp_path / "m.gcpkg")
    loaded = compiler.load(tmp_path / "m.gcpkg")
    assert loaded.sizes == model.sizes
    np.testing.assert_array_equal(loaded(**{data: x[sizes[1]][data]})[0], model(x[sizes[1]][data])[0])


def test_a_mismatch_at_run_time_names_the_argument_and_dimension_on_every_target() -> None:
    text = ("func @main(%a: tensor<?x4xf32>, %b: tensor<?x4xf32>) -> tensor<?x4xf32> {\n"
            "  %y = graph.add(%a, %b)\n  return %y\n}\n")
    a, b = np.ones((3, 4), np.float32), np.ones((5, 4), np.float32)
    for call in (lambda: run(parse(text), [a, b]), lambda: compiler.compile(text, "llvm")(a, b)):
        with pytest.raises(GCError) as e:
            call()
        msg = str(e.value)
        assert "do not broadcast" in msg and "2:8" in msg
        assert "%a is tensor<?x4xf32>; this call gives it 3x4 (dimension 0 = 3)" in msg
        assert "%b is tensor<?x4xf32>; this call gives it 5x4 (dimension 0 = 5)" in msg
    with pytest.raises(GCError, match=r"input 'a' has shape \[3, 5\] but %a is tensor<\?x4xf32>"):
        compiler.compile(text, "llvm")(np.ones((3, 5), np.float32), b)


def test_gc_run_takes_sizes_from_the_inputs_or_from_shape(tmp_path, capsys) -> None:
    src = tmp_path / "mlp.gir"
    src.write_text(_DYN_MLP)
    rc, out, _ = gc_here(capsys, "run", src, "--random-inputs", "0", "--shape", "x=5x784")
    assert rc == 0 and out.startswith("result0: tensor<5x10xf32>")
    rc, out2, _ = gc_here(capsys, "run", src, "--random-inputs", "0", "--shape", "x=5x784", "--target", "llvm")
    assert rc == 0 and out2.split()[:2] == out.split()[:2]
    r = gc("run", str(src), "--random-inputs", "0")
    assert r.returncode == 1 and "give its sizes" in r.stderr and "--shape x=" in r.stderr
    r = gc("run", str(src), "--random-inputs", "0", "--shape", "x=5x783")
    assert r.returncode == 1 and "does not fit tensor<?x784xf32>" in r.stderr
    r = gc("run", str(src), "--random-inputs", "0", "--shape", "y=5x784")
    assert r.returncode == 1 and "not an argument" in r.stderr


def test_gc_compile_makes_one_artifact_for_every_size(tmp_path) -> None:
    src = tmp_path / "mlp.gir"
    src.write_text(_DYN_MLP)
    r = gc("compile", str(src), "-o", str(tmp_path / "m.gcpkg"))
    assert r.returncode == 0, r.stderr
    assert "one kernel for every size" in r.stderr and "at its first call" in r.stderr
    for n in (2, 7):
        r = gc("run", str(tmp_path / "m.gcpkg"), "--random-inputs", "1", "--shape", f"x={n}x784")
        assert r.returncode == 0 and r.stdout.startswith(f"result0: tensor<{n}x10xf32>"), r.stderr
    r = gc("compile", str(src), "--emit", "tir")
    assert r.returncode == 1 and "known only at run time" in r.stderr and "Traceback" not in r.stderr


def test_gc_stats_gives_sizes_as_polynomials_of_n(tmp_path) -> None:
    src = tmp_path / "t.gir"
    src.write_text(_transformer("?"))
    r = gc("stats", str(src), "--json")
    stats = __import__("json").loads(r.stdout)
    assert stats["sizes"].startswith("every ? = n")
    for n in (7, 32):
        static = parse(_transformer(n))
        from compiler.stats import module_stats
        want = module_stats(static, memory=False)
        coeffs = stats["expressions"]["flops"]
        got = eval(coeffs.replace(",", "").replace("·n²", f"*{n}**2").replace("·n", f"*{n}"))  # noqa: S307
        assert got == want["flops"]
    assert "n²" in stats["expressions"]["flops"]  # attention's scores: a sequence squared


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_OPTIMIZED = {}


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(["mlp", "transformer"]), n=st.integers(1, 48),
       pipeline=st.sampled_from(["O0", "O2", "compile-llvm"]))
def test_any_size_at_any_stage_runs_as_the_static_module(name, n, pipeline) -> None:
    """Hypothesis over sizes: the dynamic module after a pipeline, run at size n, against the static module
    at n (interpreted)."""
    at, _ = EXAMPLES[name]
    if (name, pipeline) not in _OPTIMIZED:
        dyn = parse(at("?"))
        run_pipeline(dyn, PIPELINES[pipeline])
        _OPTIMIZED[name, pipeline] = dyn
    x = _inputs(at(n), seed=n)
    for g, w in zip(run(_OPTIMIZED[name, pipeline], x), run(parse(at(n)), x), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _rewrite_member(src, dst, name: str, data: bytes | None) -> None:
    """A copy of artifact `src` with member `name` replaced (None: removed), its manifest hashes redone."""
    from helpers import rewrite

    rewrite(src, dst, lambda m: m.pop(name) if data is None else m.update({name: data}))


@pytest.mark.parametrize("name, data, message", [
    ("dynamic.json", b'{"options": {"target": "llvm", "entry": "main"}, "sizes": [[[2, 784]], [[3, 784]]]}',
     "sizes and its size-<i>.gcpkg members differ"),
    ("dynamic.json", b'{"options": {"bogus": 1}, "sizes": []}', "dynamic.json names no target"),
    ("dynamic.json", b"[1, 2", "not valid JSON"),
    ("dynamic.json", b'{"options": {"target": "llvm", "entry": "nope"}, "sizes": []}', "no function @nope"),
    ("consts.npz", b"not an npz", "damaged dynamic artifact"),
    ("params.json", b'{"w1": "no such key"}', "damaged dynamic artifact"),
    ("params.json", b'["w1"]', "damaged dynamic artifact"),
    ("source.gir", b"func @main(", "error"),
    ("size-0.gcpkg", b"PK junk", "cannot load"),
    ("size-0.gcpkg", None, "differ"),
])
def test_a_damaged_dynamic_artifact_is_one_diagnostic(tmp_path, name, data, message) -> None:
    model = compiler.compile(_DYN_MLP, "llvm", params={k: v for k, v in _inputs(EXAMPLES["mlp"][0](2)).items()
                                                        if k != "x"})
    model(np.zeros((2, 784), np.float32))
    model.save(tmp_path / "m.gcpkg")
    _rewrite_member(tmp_path / "m.gcpkg", tmp_path / "bad.gcpkg", name, data)
    with pytest.raises(GCError, match=re.escape(message)):
        compiler.load(tmp_path / "bad.gcpkg")
    r = gc("run", str(tmp_path / "bad.gcpkg"), "--random-inputs", "0", "--shape", "x=2x784")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_a_function_edited_in_place_is_specialized_again() -> None:
    """Passes edit functions in place; the interpreter must not run a specialization of the function as it was."""
    m = parse("func @main(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {\n  %y = graph.relu(%x)\n  return %y\n}\n")
    x = -np.ones((2, 4), np.float32)
    assert (run(m, [x])[0] == 0).all()
    from compiler.ir import lookup_op

    f = m["main"]
    op = lookup_op("graph.abs")([f.args[0]])  # the relu replaced, as a pass would
    f.ops[0] = op
    f.results = [op.results[0]]
    assert (run(m, [x])[0] == 1).all()


def test_check_numerics_and_bisect_run_a_dynamic_module(tmp_path) -> None:
    """The per-pass numerics check makes inputs with every `?` = 3 (one size, so sizes that must agree do)."""
    src = tmp_path / "t.gir"
    src.write_text(_transformer("?"))
    r = gc("opt", str(src), "-O2", "--check-numerics")
    assert r.returncode == 0 and "every pass kept the outputs" in r.stderr, r.stderr
    r = gc("bisect", str(src), "-O2")
    assert r.returncode == 0 and "no pass changed the outputs" in r.stdout + r.stderr


_LOSS = "  %s = graph.reduce_sum({v})\n  return %s\n}}\n"


@pytest.mark.parametrize("args, body, last", [
    ("%x: tensor<?x4xf32>, %y: tensor<?x4xf32>", "%c = graph.concat(%x, %y) {axis = 0}", "%c"),
    ("%x: tensor<?x4xf32>", "%c = graph.slice(%x) {starts = [1], ends = [-1], axes = [0]}", "%c"),
    ("%x: tensor<?x8xf32>, %i: tensor<?xi64>", "%c = graph.gather(%x, %i) {axis = 0}", "%c"),
    ("%x: tensor<1x3x?x?xf32>", "%c = graph.avg_pool2d(%x) {kernel = [2, 2]}", "%c"),
])
def test_autodiff_of_a_gradient_that_needs_a_hidden_size_is_one_diagnostic(args, body, last, tmp_path) -> None:
    src = tmp_path / "f.gir"
    src.write_text(f"func @main({args}) -> tensor<f32> {{\n  {body}\n" + _LOSS.format(v=last))
    r = gc("opt", str(src), "-p", "autodiff")
    assert r.returncode == 1 and "gradient needs sizes that are ? here" in r.stderr and "2:" in r.stderr, r.stderr
    assert "internal" not in r.stderr


def test_autodiff_of_a_conv_whose_channels_are_unknown_is_right() -> None:
    """The weights know the channels the input leaves `?`: the gradient types agree at run time."""
    text = ("func @main(%x: tensor<1x?x8x8xf32>, %w: tensor<4x3x3x3xf32>) -> tensor<f32> {\n"
            "  %y = graph.conv2d(%x, %w)\n" + _LOSS.format(v="%y"))
    dyn, static = parse(text), parse(text.replace("1x?x8x8", "1x3x8x8"))
    for m in (dyn, static):
        run_pipeline(m, "autodiff")
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8), dtype=np.float32),
         "w": np.random.default_rng(1).standard_normal((4, 3, 3, 3), dtype=np.float32)}
    for g, w in zip(run(dyn, x, "main_grad"), run(static, x, "main_grad"), strict=True):
        np.testing.assert_array_equal(g, w)


def test_random_inputs_ask_the_sized_function_for_index_ranges(tmp_path) -> None:
    src = tmp_path / "g.gir"
    src.write_text("func @main(%x: tensor<?x8xf32>, %i: tensor<?xi64>) -> tensor<f32> {\n"
                   "  %c = graph.gather(%x, %i) {axis = 0}\n" + _LOSS.format(v="%c"))
    r = gc("run", str(src), "--random-inputs", "0", "--shape", "x=5x8", "--shape", "i=3")
    assert r.returncode == 0 and r.stdout.startswith("result0: tensor<f32>"), r.stderr


def test_gc_stats_starts_at_the_smallest_size_a_function_takes(tmp_path) -> None:
    src = tmp_path / "p.gir"
    src.write_text("func @main(%x: tensor<1x3x?x?xf32>) -> tensor<f32> {\n"
                   "  %c = graph.avg_pool2d(%x) {kernel = [2, 2]}\n" + _LOSS.format(v="%c"))
    r = gc("stats", str(src))
    assert r.returncode == 0, r.stderr
    assert "input bytes                       196,608  = 12·n²" in r.stdout


def test_a_batch_of_zero_runs_and_saves(tmp_path) -> None:
    model = compiler.compile("func @main(%x: tensor<?x64xf32>, %w: tensor<64x24xf32>) -> tensor<?x24xf32> {\n"
                             "  %y = graph.matmul(%x, %w)\n  return %y\n}\n", "llvm")
    w = np.ones((64, 24), np.float32)
    assert model(np.zeros((0, 64), np.float32), w)[0].shape == (0, 24)
    model.save(tmp_path / "m.gcpkg")
    assert compiler.load(tmp_path / "m.gcpkg")(np.zeros((0, 64), np.float32), w)[0].shape == (0, 24)


def test_a_mismatch_is_the_same_diagnostic_for_a_cuda_model() -> None:
    """Sizes are checked when the function is specialized, before any code is made or run: a cuda model
    (built anywhere, run only beside a GPU) says the same as the interpreter and the llvm model."""
    text = ("func @main(%a: tensor<?x4xf32>, %b: tensor<?x4xf32>) -> tensor<?x4xf32> {\n"
            "  %y = graph.add(%a, %b)\n  return %y\n}\n")
    with pytest.raises(GCError) as e:
        compiler.compile(text, "cuda")(np.ones((3, 4), np.float32), np.ones((5, 4), np.float32))
    assert "do not broadcast" in str(e.value) and "%b is tensor<?x4xf32>; this call gives it 5x4" in str(e.value)


def test_threads_calling_a_dynamic_model_at_different_sizes_get_their_own_results() -> None:
    """Sizes compiled on first use under a lock, each size's model thread-safe: four threads, three sizes
    (two threads racing to compile one of them), every result the interpreter's."""
    import threading

    at, _ = EXAMPLES["mlp"]
    first = _inputs(at(4))
    weights = {k: v for k, v in first.items() if k != "x"}
    model = compiler.compile(at("?"), "llvm", params=weights)
    module = parse(at("?"))
    sizes = [2, 5, 5, 9]
    xs = [np.random.default_rng(n + i).standard_normal((n, 784), dtype=np.float32) for i, n in enumerate(sizes)]
    got: dict[int, list] = {}
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            got[i] = [model(xs[i])[0] for _ in range(5)]
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(sizes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(model.sizes) == [((2, 784),), ((5, 784),), ((9, 784),)]
    for i, x in enumerate(xs):
        (want,) = run(module, {"x": x, **weights})
        for g in got[i]:
            np.testing.assert_allclose(g, want, rtol=2e-4, atol=2e-4)
