"""The parser: every attribute form of the contract, types, locations, and what it rejects."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from compiler.diagnostics import GCError
from compiler.ir import DType, Dense, TensorType
from compiler.parser import parse
from compiler.printer import print_module


def one_op(body: str, args: str = "%x: tensor<4xf32>", ret: str = "tensor<4xf32>"):
    text = f"func @main({args}) -> {ret} {{\n  {body}\n  return %r\n}}\n"
    return parse(text, "t.gir")["main"].ops[-1]


def test_types_and_scalars() -> None:
    f = parse("func @f(%a: tensor<f32>, %b: tensor<2x0x3xi64>, %c: tensor<1xbf16>) -> tensor<f32> { return %a }")["f"]
    assert [a.type for a in f.args] == [
        TensorType((), DType.f32),
        TensorType((2, 0, 3), DType.i64),
        TensorType((1,), DType.bf16),
    ]


@pytest.mark.parametrize(
    "text, value",
    [
        ("1e-5", 1e-5),
        ("1.0e-5", 1e-5),
        ("-1.0e4", -1e4),
        ("2", 2.0),
        ("inf", math.inf),
        ("-inf", -math.inf),
    ],
)
def test_float_attribute_forms(text: str, value: float) -> None:
    op = one_op(f"%r = graph.leaky_relu(%x) {{alpha = {text}}}")
    assert op.alpha == value and isinstance(op.alpha, float)


def test_nan_attribute() -> None:
    op = one_op("%r = graph.clip(%x) {min = nan}")
    assert math.isnan(op.min)
    assert "min = nan" in print_module(parse(print_module(parse(f"func @m(%x: tensor<4xf32>) -> tensor<4xf32> {{\n  {op!r}\n  return %r\n}}"))))


def test_int64_attribute_limits() -> None:
    text = "func @m(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %r = graph.clip(%x) {min = 9223372036854775807}\n  return %r\n}"
    assert parse(text)["m"].ops[0].min == 9223372036854775807.0
    with pytest.raises(GCError, match="does not fit in 64 bits"):
        parse(text.replace("9223372036854775807", "9223372036854775808"))


def test_constant_without_parentheses_and_dense_forms() -> None:
    text = """func @m() -> (tensor<2x2xf32>, tensor<3xi32>, tensor<2xi1>, tensor<f64>) {
  %a = graph.constant {value = dense<[[1.0, 2.0], [3.0, 4.5]]> : tensor<2x2xf32>}
  %b = graph.constant {value = dense<7> : tensor<3xi32>} : tensor<3xi32>
  %c = graph.constant {value = dense<[true, false]> : tensor<2xi1>}
  %d = graph.constant {value = dense<-0.25> : tensor<f64>}
  return %a, %b, %c, %d
}"""
    f = parse(text)["m"]
    values = [op.value for op in f.ops]
    assert all(isinstance(v, Dense) for v in values)
    np.testing.assert_array_equal(values[0].array, [[1, 2], [3, 4.5]])
    np.testing.assert_array_equal(values[1].array, [7, 7, 7])
    np.testing.assert_array_equal(values[2].array, [True, False])
    assert values[3].array.dtype == np.float64 and float(values[3].array) == -0.25
    printed = print_module(parse(text))
    assert "dense<7> : tensor<3xi32>" in printed
    assert "graph.constant {value" in printed


@pytest.mark.parametrize(
    "dense, message",
    [
        ("dense<[1.0, 2.0]> : tensor<3xf32>", "dense literal has shape [2] but its type is tensor<3xf32>"),
        ("dense<[[1.0], [2.0, 3.0]]> : tensor<2x2xf32>", "not rectangular"),
        ("dense<1.5> : tensor<2xi32>", "must be integers"),
        ("dense<300> : tensor<2xi8>", "out of range for i8"),
        ("dense<1.0> : tensor<99999999999999999999xf32>",
         "2:52: error: tensor<99999999999999999999xf32> is too large: a tensor holds at most 2^63 - 1 bytes"),
        ("dense<1.0> : tensor<100000x100000x100000xf32>",
         "error: dense constant tensor<100000x100000x100000xf32> (4,000,000,000,000,000 bytes) does not fit"),
        ("dense<7> : tensor<100000x100000x100000xi64>", "bytes) does not fit in memory"),
        ("dense<[1.0, 1e39]> : tensor<2xf32>", "dense value 1e+39 is out of range for f32 (largest 3.40282e+38"),
        ("dense<70000.0> : tensor<2xf16>", "dense value 70000 is out of range for f16 (largest 65504;"),
        ("dense<-1e39> : tensor<2xbf16>", "dense value -1e+39 is out of range for bf16 (largest 3.38953e+38;"),
    ],
)
def test_bad_dense_literals(dense: str, message: str) -> None:
    """One diagnostic each, however large the type (a splat is checked before it is expanded)."""
    with pytest.raises(GCError, match=re.escape(message)) as e:
        parse(f"func @m() -> tensor<f32> {{\n  %a = graph.constant {{value = {dense}}}\n  return %a\n}}")
    assert len(e.value.diagnostics) == 1


def test_a_location_with_a_fractional_line_is_a_diagnostic() -> None:
    with pytest.raises(GCError, match=re.escape("2:35: error: a location's line and column are integers, got '1.5'")):
        parse('func @m(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = graph.relu(%x) loc("a.gir":1.5:2)\n'
              "  return %y\n}")


def test_comments_and_free_layout() -> None:
    text = "// c\nfunc @m(%x: tensor<4xf32>)   // trailing\n -> tensor<4xf32>\n{ %0 = graph.relu(%x) return %0 }"
    assert print_module(parse(text)) == "func @m(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = graph.relu(%x) : tensor<4xf32>\n  return %0\n}\n"


def test_value_names_allow_digits_dots_and_underscores() -> None:
    text = "func @m(%x.1: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = graph.neg(%x.1)\n  %a_b = graph.neg(%0)\n  return %a_b\n}\n"
    assert "%a_b = graph.neg(%0)" in print_module(parse(text))


def test_multiple_functions_and_results() -> None:
    text = """func @a(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %y = graph.neg(%x)
  return %x, %y
}

func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x
}
"""
    m = parse(text)
    assert list(m.funcs) == ["a", "b"]
    assert print_module(m).count("func @") == 2


def test_op_location_is_the_op_name() -> None:
    op = one_op("%r = graph.relu(%x)")
    assert (op.loc.file, op.loc.line, op.loc.col) == ("t.gir", 2, 8)


def test_diagnostic_shows_source_line_and_caret() -> None:
    with pytest.raises(GCError) as e:
        parse("func @m(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %r = graph.relu(%y)\n  return %r\n}", "net.gir")
    assert e.value.render() == (
        "net.gir:2:19: error: use of undefined value %y\n  %r = graph.relu(%y)\n                  ^"
    )


def test_string_attribute_escapes_round_trip() -> None:
    op = one_op('%r = graph.gelu(%x) {approximate = "tanh"}')
    assert op.approximate == "tanh"


def test_a_wrong_result_type_is_reported_once() -> None:
    with pytest.raises(GCError) as e:
        parse("func @m(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = graph.relu(%x) : tensor<5xf32>\n  return %y\n}")
    assert [d.message for d in e.value.diagnostics] == [
        "graph.relu: result type tensor<5xf32> does not match the inferred type tensor<4xf32>"
    ]


def test_strings_with_escapes_round_trip() -> None:
    from compiler.ir import format_attr
    from compiler.parser import _unescape

    for s in ["a\nb", 'é\t"q\\', "plain"]:
        assert _unescape(format_attr(s)[1:-1]) == s


def test_empty_dense_prints_as_a_splat() -> None:
    text = "func @m() -> tensor<0x3xf32> {\n  %c = graph.constant {value = dense<0.0> : tensor<0x3xf32>}\n  return %c\n}\n"
    printed = print_module(parse(text))
    assert "dense<0.0> : tensor<0x3xf32>" in printed and print_module(parse(printed)) == printed


def test_bools_are_not_float_dense_values() -> None:
    with pytest.raises(GCError, match="must be numbers, not true/false"):
        parse("func @m() -> tensor<2xf32> {\n  %c = graph.constant {value = dense<[true, 2.0]> : tensor<2xf32>}\n  return %c\n}")


def test_a_diagnostic_about_a_whole_file_names_the_file() -> None:
    from compiler.diagnostics import Location

    assert str(GCError("not a model", Location("model.onnx", 0, 0))) == "model.onnx: error: not a model"
    assert str(GCError("no location")) == "error: no location"


@pytest.mark.parametrize("text", ["", "// only a comment\n", "\n\n"])
def test_a_file_without_a_function_is_a_diagnostic(text: str) -> None:
    with pytest.raises(GCError, match=re.escape("empty.gir:1:1: error: no function in the file")):
        parse(text, "empty.gir")


# --- input a hostile or careless file can hold: one diagnostic each, never a traceback ---------------

RELU = "func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = graph.relu(%x)\n  return %y\n}\n"


def test_a_byte_order_mark_is_dropped(tmp_path) -> None:
    from compiler.parser import parse_file

    (tmp_path / "bom.gir").write_bytes(b"\xef\xbb\xbf" + RELU.encode())
    assert parse_file(tmp_path / "bom.gir")["main"].ops[0].name == "graph.relu"
    assert parse("\ufeff" + RELU)["main"].ops[0].name == "graph.relu"


def test_invalid_utf8_is_a_diagnostic_at_its_line_and_column(tmp_path) -> None:
    from compiler.parser import parse_file

    (tmp_path / "bad.gir").write_bytes(RELU.encode().replace(b"  return", b"  // caf\xc8\n  return"))
    with pytest.raises(GCError) as e:
        parse_file(tmp_path / "bad.gir")
    assert e.value.render().startswith(f"{tmp_path / 'bad.gir'}:3:9: error: invalid UTF-8 (byte c8)")  # '  // caf'


@pytest.mark.parametrize("where", ["attribute", "dense"])
def test_lists_nested_past_64_are_a_diagnostic(where: str) -> None:
    deep = "[" * 200 + "1" + "]" * 200
    body = ("  %y = graph.relu(%x) {foo = " + deep + "}\n" if where == "attribute" else
            "  %c = graph.constant {value = dense<" + deep + "> : tensor<2xf32>}\n  %y = graph.add(%x, %c)\n")
    text = "func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n" + body + "  return %y\n}\n"
    with pytest.raises(GCError, match="lists nest more than 64 deep"):
        parse(text)


def test_a_rank_past_64_is_a_diagnostic() -> None:
    shape = "x".join(["1"] * 65)
    with pytest.raises(GCError, match="a tensor of rank 65: gc supports ranks up to 64"):
        parse(f"func @main(%x: tensor<{shape}xf32>) -> tensor<{shape}xf32> {{\n  return %x\n}}\n")


def call_chain(calls: int) -> str:
    """@main calling @f1 calling ... @f<calls>, which returns relu."""
    funcs = []
    for i in range(calls + 1):
        name = "main" if i == 0 else f"f{i}"
        body = (f"  %y = graph.call(%x) {{callee = @f{i + 1}}} : tensor<2xf32>" if i < calls else "  %y = graph.relu(%x)")
        funcs.append(f"func @{name}(%x: tensor<2xf32>) -> tensor<2xf32> {{\n{body}\n  return %y\n}}\n")
    return "".join(funcs)


def test_calls_nest_at_most_32_deep() -> None:
    from compiler.interpreter import run

    x = np.array([-1, 2], np.float32)
    np.testing.assert_array_equal(run(parse(call_chain(32)), [x])[0], [0, 2])
    with pytest.raises(GCError) as e:
        parse(call_chain(500))
    assert len(e.value.diagnostics) == 1  # said once, at the top of the chain
    assert "2:8: error: graph.call: calls nest 500 deep from @main; gc supports at most 32" in e.value.render()


@pytest.mark.parametrize("op, attr, meant", [
    ("graph.conv2d(%x, %w) {pads = [1, 1, 1, 1]}", "pads", "padding"),  # ONNX's names
    ("graph.max_pool2d(%x) {kernel_shape = [2, 2]}", "kernel_shape", "kernel"),
    ("graph.conv2d(%x, %w) {group = 1}", "group", "groups"),
    ("graph.reduce_sum(%x) {axis = [1]}", "axis", "axes"),
])
def test_an_unknown_attribute_gets_a_did_you_mean(op: str, attr: str, meant: str) -> None:
    text = ("func @main(%x: tensor<1x1x4x4xf32>, %w: tensor<1x1x3x3xf32>) -> tensor<1xf32> {\n"
            f"  %y = {op}\n  return %y\n}}\n")
    with pytest.raises(GCError, match=f"unknown attribute '{attr}'; did you mean '{meant}'"):
        parse(text)
