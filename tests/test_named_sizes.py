"""Named sizes (`?(batch)`, issue 18): expressions of symbols in types, shape rules that compute with them,
one size per name at each call, and the importer's named axes."""

from __future__ import annotations

import operator

import numpy as np
import pytest
from conftest import ROOT
from helpers import gc
from hypothesis import given, settings
from hypothesis import strategies as st

import compiler
from compiler.diagnostics import GCError
from compiler.interpreter import run
from compiler.ir import DYN, Sym, Value, agree, differ, evaluate_dim, known
from compiler.parser import parse, parse_file

A, B = Sym.symbol("a"), Sym.symbol("b")

# --- the algebra ---------------------------------------------------------------------------------------

OPS = [("+", operator.add), ("-", operator.sub), ("*", operator.mul)]


@st.composite
def expressions(draw, depth: int = 3):
    """(an expression of a and b built from ints with + - * and // k, % k; the same as a function of the
    sizes)."""
    if depth == 0 or draw(st.booleans()):
        leaf = draw(st.sampled_from(["a", "b", "int"]))
        if leaf == "int":
            k = draw(st.integers(-5, 9))
            return k, lambda env: k
        return Sym.symbol(leaf), lambda env: env[leaf]
    kind = draw(st.sampled_from(["+", "-", "*", "//", "%"]))
    x, fx = draw(expressions(depth - 1))
    if kind in ("//", "%"):
        k = draw(st.integers(1, 7))
        if kind == "//":
            return x // k, lambda env: fx(env) // k
        return x % k, lambda env: fx(env) % k
    y, fy = draw(expressions(depth - 1))
    fn = dict(OPS)[kind]
    return fn(x, y), lambda env: fn(fx(env), fy(env))


@settings(max_examples=300, deadline=None)
@given(expressions(), st.integers(0, 40), st.integers(0, 40))
def test_expressions_of_sizes_compute_as_numbers(e, a: int, b: int) -> None:
    """Any expression of + - * and floor division or remainder by a number, built from named sizes, is at
    every value of the names what the same arithmetic on the values gives (Python's floor semantics)."""
    sym, fn = e
    assert evaluate_dim(sym, {"a": a, "b": b}) == fn({"a": a, "b": b})
    assert not isinstance(sym, Sym) or sym.symbols() <= {"a", "b"}


def test_expressions_are_normalized_so_equal_ones_agree() -> None:
    assert A * 128 == 128 * A and hash(A * 128) == hash(128 * A) and (A * B) == (B * A)
    assert agree(2 * A, A + A) and agree((A * 128 * 256) // 256, A * 128) and agree((A * B * 768) // (B * 768), A)
    assert A + 1 - A == 1 and A * 0 == 0 and (2 * A + 1) % 2 == 1 and ((A * 4 + 6) // 2) == 2 * A + 3
    assert differ(A + 1, A) and not differ(A, B) and not agree(A, B) and not differ(A, DYN) and not agree(A, A + DYN)
    assert A + DYN is DYN and DYN * A is DYN and (A // B) is DYN  # (no name: nothing to compute with)
    assert ((A - 1) // 2 + 1).expr() == "(a - 1) // 2 + 1" and (3 - A).expr() == "-a + 3" and repr(A) == "?(a)"
    assert repr(A * 2) == "?"  # a type prints an expression as `?`: read again, it is inferred anew
    for bad in (lambda: A < 3, lambda: bool(A), lambda: int(A)):
        with pytest.raises(TypeError):
            bad()


# --- the language --------------------------------------------------------------------------------------

def test_named_sizes_parse_print_and_round_trip() -> None:
    text = ("func @main(%x: tensor<?(max_len)x?x4xf32>, %y: tensor<?(max_len)x1x4xf32>) -> tensor<?(max_len)x?x4xf32> {\n"
            "  %z = graph.add(%x, %y) : tensor<?(max_len)x?x4xf32>\n  return %z\n}\n")
    m = parse(text)
    n = Sym.symbol("max_len")  # an x inside the name is no separator
    assert m["main"].args[0].type.shape == (n, DYN, 4) and m["main"].ops[0].results[0].type.shape == (n, DYN, 4)
    assert "%x: tensor<?(max_len)x?x4xf32>" in str(m) and "-> tensor<?(max_len)x?x4xf32>" in str(m)
    assert str(parse(str(m))) == str(m)


@pytest.mark.parametrize("dim, column", [("?(2d)", 27), ("?(a-b)", 27), ("?()", 27), ("?(a", 25)])
def test_a_bad_size_name_is_one_diagnostic_at_its_column(dim: str, column: int) -> None:
    with pytest.raises(GCError) as e:
        parse(f"func @main(%x: tensor<4x{dim}xf32>) -> tensor<4xf32> {{\n  return %x\n}}\n", "n.gir")
    assert len(e.value.diagnostics) == 1 and e.value.diagnostics[0].loc.col == column
    assert "size name" in str(e.value)


def _types(text: str) -> list[tuple]:
    return [op.results[0].type.shape for op in parse(text)["main"].ops]


def test_shape_rules_compute_with_named_sizes() -> None:
    """Flatten and unflatten, concat sums, a strided conv's and a pool's map, a matmul's rows, broadcasting."""
    shapes = _types("""func @main(%x: tensor<?(b)x128x256xf32>, %w: tensor<256x10xf32>, %m: tensor<?(b)x128x10xf32>,
                                  %i: tensor<1x3x?(h)x?(h)xf32>, %k: tensor<8x3x3x3xf32>) -> tensor<?(b)x128x10xf32> {
  %f = graph.reshape(%x) {shape = [-1, 256]}
  %y = graph.matmul(%f, %w)
  %z = graph.reshape(%y) {shape = [-1, 128, 10]}
  %s = graph.add(%z, %m)
  %c = graph.concat(%s, %m, %s) {axis = 0}
  %v = graph.conv2d(%i, %k) {strides = [2, 2], padding = [1, 1, 1, 1]}
  %p = graph.max_pool2d(%v) {kernel = [3, 3], strides = [2, 2]}
  %t = graph.transpose(%c) {perm = [2, 1, 0]}
  %q = graph.reshape(%t) {shape = [10, 0, -1]}
  return %s
}""")
    b, h = Sym.symbol("b"), Sym.symbol("h")
    conv = (h - 1) // 2 + 1
    assert shapes == [(128 * b, 256), (128 * b, 10), (b, 128, 10), (b, 128, 10), (3 * b, 128, 10),
                      (1, 8, conv, conv), (1, 8, (conv - 3) // 2 + 1, (conv - 3) // 2 + 1), (10, 128, 3 * b),
                      (10, 128, 3 * b)]
    for size in (5, 6, 224):  # the expressions are the static rules' sizes
        assert evaluate_dim(conv, {"h": size}) == (size + 2 - 3) // 2 + 1


def test_sizes_that_provably_differ_are_an_error_at_compile_time() -> None:
    with pytest.raises(GCError, match="matmul"):
        parse("""func @main(%x: tensor<4x?(n)xf32>, %w: tensor<?(n)x3xf32>) -> tensor<4x3xf32> {
  %p = graph.pad(%w) {pads = [1, 0, 0, 0]}
  %y = graph.matmul(%x, %p)
  return %y
}""")
    with pytest.raises(GCError, match="dimension 0 differs"):
        parse("""func @main(%x: tensor<?(n)x4xf32>) -> tensor<?x5xf32> {
  %p = graph.pad(%x) {pads = [0, 0, 1, 0]}
  %y = graph.concat(%x, %p) {axis = 1}
  return %y
}""")


OPS_GIR = parse_file(ROOT / "tests" / "gir" / "graph" / "ops.gir")
CASES = [(f.name, n, op) for f in OPS_GIR for n, op in enumerate(f.ops)]


@pytest.mark.parametrize("func, n, op", CASES, ids=[f"{f}-{n}-{op.name}" for f, n, op in CASES])
def test_every_shape_rule_is_right_about_named_sizes(func, n, op) -> None:
    """Every operand size of 2 or more of every op in ops.gir named by its value (`?(d6)` for a 6; equal
    sizes share a name): each result size the rule gives is a number equal to the static rule's, `?`, or
    an expression whose value at those sizes is the static rule's."""
    static = op.infer_types()
    env = {}

    def named(v):
        if getattr(v.owner, "name", "") == "graph.constant":
            return Value(v.type, v.name)
        shape = []
        for d in v.type.shape:
            if d >= 2:
                env[f"d{d}"] = d
            shape.append(Sym.symbol(f"d{d}") if d >= 2 else d)
        return Value(v.type.with_shape(shape), v.name)

    operands = [named(v) for v in op.operands]
    try:
        got = type(op)(operands, dict(op.attrs), [r.type for r in op.results], op.loc).infer_types()
    except GCError as e:
        assert op.name == "graph.squeeze" and op.axes is None and "known only at run time" in str(e)
        return
    for s, g in zip(static, got, strict=True):
        assert g.dtype == s.dtype and g.rank == s.rank
        for a, b in zip(s.shape, g.shape):
            assert b is DYN or (known(b) and b == a) or (isinstance(b, Sym) and b.evaluate(env) == a), (s, g)


# --- at each call ------------------------------------------------------------------------------------------

SHARED = """func @main(%x: tensor<?(batch)x?(seq)x8xf32>, %mask: tensor<?(batch)x?(seq)x1xf32>) -> tensor<?(batch)x?(seq)x8xf32> {
  %y = graph.mul(%x, %mask)
  %f = graph.reshape(%y) {shape = [-1, 8]}
  %g = graph.relu(%f)
  return %y
}
"""


@pytest.mark.parametrize("target", ["interp", "llvm"])
def test_arguments_that_share_a_name_share_its_size_at_each_call(target: str) -> None:
    m = parse(SHARED)
    model = compiler.compile(m, "llvm", cache=False) if target == "llvm" else None
    call = (lambda *a: model(*a)) if model else (lambda *a: run(m, list(a)))
    rng = np.random.default_rng(0)
    for b, s in ((2, 3), (1, 7), (4, 1)):
        x, mask = rng.standard_normal((b, s, 8), dtype=np.float32), rng.standard_normal((b, s, 1), dtype=np.float32)
        np.testing.assert_allclose(call(x, mask)[0], x * mask, rtol=1e-6)
    with pytest.raises(GCError, match=r"%mask has size 3 in dimension 1, which is \?\(seq\); but %x gives seq = 2"):
        call(np.zeros((1, 2, 8), np.float32), np.zeros((1, 3, 1), np.float32))


def test_random_inputs_take_named_sizes_from_another_arguments_shape(tmp_path) -> None:
    """`gc run --shape x=...` sizes %mask too: its sizes are x's by name."""
    f = tmp_path / "m.gir"
    f.write_text(SHARED)
    out = gc("run", str(f), "--random-inputs", "0", "--shape", "x=2x5x8", "--target", "llvm")
    assert out.returncode == 0 and "tensor<2x5x8xf32>" in out.stdout
    out = gc("run", str(f), "--random-inputs", "0", "--shape", "x=2x5x8", "--shape", "mask=3x5x1")
    assert out.returncode == 1 and "%mask has size 3 in dimension 0" in out.stderr and "Traceback" not in out.stderr


def test_declared_types_of_named_sizes_check_against_each_other() -> None:
    # A result written ?(n) where the rule gives n + 1 provably differs: an error at once.
    with pytest.raises(GCError, match="does not match the inferred type"):
        parse("""func @main(%x: tensor<?(n)x4xf32>) -> tensor<?(n)x4xf32> {
  %y = graph.pad(%x) {pads = [1, 0, 0, 0]} : tensor<?(n)x4xf32>
  return %y
}""")


def test_gc_stats_gives_figures_as_polynomials_in_the_names(tmp_path) -> None:
    """Attention-shaped: a [b, s, 64] projection and the [b, s, s] scores; each figure a polynomial in b
    and s (an anonymous ? is n beside them), equal to the static counts at other sizes."""
    from compiler.stats import module_stats

    text = """func @main(%x: tensor<?(b)x?(s)x64xf32>, %w: tensor<64x64xf32>, %m: tensor<?x4xf32>) -> tensor<?(b)x?(s)x?(s)xf32> {
  %y = graph.matmul(%x, %w)
  %t = graph.transpose(%y) {perm = [0, 2, 1]}
  %a = graph.matmul(%y, %t)
  %r = graph.relu(%m)
  return %a
}
"""
    stats = module_stats(parse(text), data_args=["x", "m"], memory=False)
    assert stats["sizes"] == "every ? = n; named sizes b, s; figures at 128 each"
    ex = stats["expressions"]
    assert ex["flops"] == "128·b·s² + 8,192·b·s + 4·n" and ex["input_bytes"] == "256·b·s + 16·n"
    assert ex["intermediate_bytes"] == "4·b·s² + 512·b·s + 16·n" and "params" not in ex
    for b, s, n in ((2, 5, 3), (1, 9, 1)):
        static = module_stats(parse(text.replace("?(b)", str(b)).replace("?(s)", str(s)).replace("?", str(n))),
                              data_args=["x", "m"], memory=False)
        assert static["flops"] == 128 * b * s * s + 8192 * b * s + 4 * n
        assert static["intermediate_bytes"] == 4 * b * s * s + 512 * b * s + 16 * n


def test_a_result_declared_with_a_name_must_have_that_size_at_each_call() -> None:
    """`-> tensor<?(n)x4xf32>` is a promise checked at each call: a slice that gives another size is an
    error there, not a result of the wrong size."""
    m = parse("""func @main(%x: tensor<?(n)x4xf32>, %k: tensor<2xi64>) -> tensor<?(n)x4xf32> {
  %y = graph.slice(%x) {starts = [0], ends = [3], axes = [0]} : tensor<?x4xf32>
  return %y
}""")
    assert run(m, [np.ones((3, 4), np.float32), np.zeros(2, np.int64)])[0].shape == (3, 4)
    with pytest.raises(GCError, match="declares tensor<\\?\\(n\\)x4xf32>"):
        run(m, [np.ones((5, 4), np.float32), np.zeros(2, np.int64)])
