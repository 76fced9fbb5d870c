"""dce: dead ops go, live ones stay, unused arguments are reported or pruned, outputs are kept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from test_pass_cse import assert_same_outputs, random_module, run_pass

from compiler.ir import Module
from compiler.parser import parse


def dce(text: str, pipeline: str = "dce") -> tuple[Module, dict]:
    m = parse(text, "t.gir")
    (p,) = run_pass(m, pipeline)
    return m, dict(+p.stats)  # + drops the counters left at zero


def test_ops_no_result_depends_on_are_erased() -> None:
    m, stats = dce(
        "func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %a = graph.relu(%x)\n  %b = graph.exp(%a)\n  %c = graph.add(%b, %x)\n"
        "  %k = graph.constant {value = dense<1.0> : tensor<4xf32>}\n  return %a\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.relu"]
    assert stats == {"ops-erased": 3}


def test_live_ops_and_their_order_are_untouched() -> None:
    text = (
        "func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
        "  %a = graph.mul(%x, %y)\n  %b = graph.exp(%a)\n  %c = graph.sub(%b, %a)\n  return %c, %b\n}\n"
    )
    m, stats = dce(text)
    assert str(m) == str(parse(text, "t.gir")) and stats == {}


def test_multi_result_op_lives_while_one_result_is_used() -> None:
    m, stats = dce(
        "func @main(%x: tensor<4xf32>) -> tensor<3xf32> {\n"
        "  %p, %q = graph.split(%x) {sections = [1, 3]}\n  %n = graph.neg(%p)\n  return %q\n}\n"
    )
    assert [op.name for op in m["main"].ops] == ["graph.split"] and stats == {"ops-erased": 1}


def test_dead_calls_are_erased_but_the_callee_stays() -> None:
    m, stats = dce(
        "func @sq(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = graph.mul(%x, %x)\n  return %y\n}\n"
        "func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %a = graph.call(%x) {callee = @sq} : tensor<2xf32>\n  return %x\n}\n"
    )
    assert m["main"].ops == [] and len(m["sq"].ops) == 1 and stats == {"ops-erased": 1}


def test_unused_arguments_are_reported_not_removed(capsys: pytest.CaptureFixture) -> None:
    m, stats = dce(
        "func @main(%x: tensor<2xf32>, %y: tensor<2xf32>, %z: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %d = graph.add(%y, %z)\n  return %x\n}\n"
    )
    assert [a.name for a in m["main"].args] == ["x", "y", "z"]
    assert stats == {"ops-erased": 1, "unused-args": 2}
    assert "dce: @main does not use %y, %z (dce{prune-args=true} removes them)" in capsys.readouterr().err


def test_prune_args_removes_unused_arguments_of_uncalled_functions(capsys: pytest.CaptureFixture) -> None:
    m, stats = dce(
        "func @main(%x: tensor<2xf32>, %y: tensor<2xf32>) -> tensor<2xf32> {\n  %d = graph.neg(%y)\n  return %x\n}\n",
        "dce{prune-args=true}",
    )
    assert [a.name for a in m["main"].args] == ["x"]
    assert stats == {"ops-erased": 1, "unused-args": 1, "args-pruned": 1}
    assert "does not use" not in capsys.readouterr().err


def test_prune_args_keeps_arguments_of_called_functions() -> None:
    m, stats = dce(
        "func @first(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {\n  return %a\n}\n"
        "func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %y = graph.call(%x, %x) {callee = @first} : tensor<2xf32>\n  return %y\n}\n",
        "dce{prune-args=true}",
    )
    assert [a.name for a in m["first"].args] == ["a", "b"]
    assert stats == {"unused-args": 1}


@settings(max_examples=60, deadline=None)
@given(random_module())
def test_random_modules_keep_their_outputs(module: Module) -> None:
    after = module.clone()
    (p,) = run_pass(after, "dce{prune-args=true}")
    assert len(module["main"].ops) - len(after["main"].ops) == p.stats["ops-erased"]
    live = {v for op in after["main"].ops for v in op.operands} | set(after["main"].results)
    assert all(any(r in live for r in op.results) for op in after["main"].ops)
    assert_same_outputs(module, after)
