"""ONNX RNN, GRU and LSTM, unrolled over the sequence: gc's interpreter (and one llvm compile) against ONNX
Runtime, over directions, layouts, biases, initial states, peepholes, input_forget, linear_before_reset,
activations with their alpha/beta, clip and sequence_lens (constant or given at run time); and the
diagnostics of what gc does not take."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.diagnostics import GCError
from compiler.importers.onnx import import_onnx

RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def rnn_model(op: str, feeds: dict, inits: dict, outputs=("Y", "Y_h"), opset: int = 22, **attrs):
    """One node of `op` over the inputs named in `feeds` (model inputs) and `inits` (initializers)."""
    names = [k if k in feeds or k in inits else "" for k in INPUTS]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, list(outputs), **attrs)
    info = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()
    ]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o]
    graph = helper.make_graph(
        [node], "g", info, outs, initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def weights(op: str, nd: int, size: int, hidden: int, bias=True, peep=False) -> dict:
    g = GATES[op] * hidden
    w = {"W": rand(nd, g, size, scale=0.5), "R": rand(nd, g, hidden, scale=0.5)}
    if bias:
        w["B"] = rand(nd, 2 * g, scale=0.5)
    if peep:
        w["P"] = rand(nd, 3 * hidden, scale=0.5)
    return w


def onnxruntime_outputs(model, feeds: dict) -> list:
    """ONNX Runtime's outputs; it takes hidden_size only as an attribute and layout 0 only, so a model with
    layout 1 runs as its layout-0 twin, inputs and outputs transposed."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    node = model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    hidden = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "R")).shape[-1]
    layout = attrs.pop("layout", 0)
    attrs["hidden_size"] = hidden
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    if layout == 1:
        feeds = {k: v.transpose(1, 0, 2) if k in ("X", "initial_h", "initial_c") else v for k, v in feeds.items()}
        for i in model.graph.input:
            if i.name in ("X", "initial_h", "initial_c"):
                dims = i.type.tensor_type.shape.dim
                dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    if layout == 1:
        names = [o.name for o in model.graph.output]
        out = [o.transpose(2, 0, 1, 3) if k == "Y" else o.transpose(1, 0, 2) for k, o in zip(names, out)]
    return out


def check(model, feeds: dict, target: str | None = None, rtol=1e-5, atol=1e-5) -> list:
    """gc (interpreter, or compiled for `target`) against ONNX Runtime; returns gc's outputs."""
    expected = onnxruntime_outputs(model, feeds)
    imported = import_onnx(model)
    if target is None:
        got = compiler.run(imported.module, {**feeds, **imported.weights})
    else:
        got = compiler.compile(imported.module, target, cache=False)(**feeds, **imported.weights)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got


def states(op: str, nd: int, batch: int, hidden: int, layout: int) -> dict:
    shape = (nd, batch, hidden) if layout == 0 else (batch, nd, hidden)
    s = {"initial_h": rand(*shape)}
    if op == "LSTM":
        s["initial_c"] = rand(*shape)
    return s


OUTPUTS = {"RNN": ("Y", "Y_h"), "GRU": ("Y", "Y_h"), "LSTM": ("Y", "Y_h", "Y_c")}


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_directions_and_layouts_match_onnxruntime(op: str, direction: str, layout: int) -> None:
    seq, batch, size, hidden, nd = 5, 3, 4, 6, 2 if direction == "bidirectional" else 1
    x = rand(seq, batch, size) if layout == 0 else rand(batch, seq, size)
    feeds = {"X": x, **states(op, nd, batch, hidden, layout)}
    model = rnn_model(
        op,
        feeds,
        weights(op, nd, size, hidden, peep=op == "LSTM"),
        OUTPUTS[op],
        direction=direction,
        hidden_size=hidden,
        layout=layout,
    )
    check(model, feeds)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_without_bias_and_initial_state(op: str) -> None:
    feeds = {"X": rand(3, 2, 4)}
    model = rnn_model(op, feeds, weights(op, 1, 4, 5, bias=False), OUTPUTS[op])  # hidden_size from R
    check(model, feeds)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("initial", [False, True])
def test_gru_linear_before_reset(lbr: int, initial: bool) -> None:
    feeds = {"X": rand(4, 2, 3), **(states("GRU", 2, 2, 5, 0) if initial else {})}
    model = rnn_model("GRU", feeds, weights("GRU", 2, 3, 5), direction="bidirectional", linear_before_reset=lbr)
    check(model, feeds)


def test_lstm_input_forget_and_peepholes() -> None:
    feeds = {"X": rand(4, 2, 3), **states("LSTM", 1, 2, 5, 0)}
    model = rnn_model("LSTM", feeds, weights("LSTM", 1, 3, 5, peep=True), OUTPUTS["LSTM"], input_forget=1)
    check(model, feeds)


ACTIVATIONS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
               "Elu", "Softsign", "Softplus"]  # fmt: skip


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_activations_take_their_alpha_and_beta_in_order(op: str, act: str) -> None:
    """alpha and beta are consumed in order by the activations that take them (as ONNX Runtime reads them):
    a LeakyRelu then an Affine take alphas 0.3 and 0.7, the Affine beta 0.6."""
    count = len(OUTPUTS[op])  # RNN 1, GRU 2, LSTM 3 activations
    acts = ([act, "Affine", "Tanh"] if op == "LSTM" else [act, "Affine"])[: count if op != "RNN" else 1]
    feeds = {"X": rand(3, 2, 3), **states(op, 2, 2, 4, 0)}
    model = rnn_model(
        op,
        feeds,
        weights(op, 2, 3, 4),
        OUTPUTS[op],
        direction="bidirectional",
        activations=acts * 2,
        activation_alpha=[0.3, 0.7, 0.4, 0.8],
        activation_beta=[0.6, 0.2, 0.5, 0.1],
    )
    check(model, feeds, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_clip_bounds_the_gates_inputs(op: str) -> None:
    """clip applies to the input of every gate activation (not to LSTM's h(Ct), as ONNX Runtime)."""
    feeds = {"X": rand(4, 2, 3, scale=3.0), **states(op, 1, 2, 4, 0)}
    model = rnn_model(op, feeds, weights(op, 1, 3, 4), OUTPUTS[op], clip=0.5)
    check(model, feeds)


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_sequence_lens_mask_the_steps(op: str, runtime: bool, layout: int) -> None:
    """Past its length, an entry's Y is zero and Y_h/Y_c hold its last valid step; the reverse direction
    starts at that step."""
    seq, batch = 5, 4
    lens = np.array([5, 2, 1, 3], np.int32)
    x = rand(seq, batch, 3) if layout == 0 else rand(batch, seq, 3)
    feeds = {"X": x, **states(op, 2, batch, 4, layout)}
    inits = weights(op, 2, 3, 4)
    (feeds if runtime else inits)["sequence_lens"] = lens
    model = rnn_model(op, feeds, inits, OUTPUTS[op], direction="bidirectional", layout=layout)
    y = check(model, feeds)[0]
    y = y if layout == 0 else y.transpose(1, 2, 0, 3)
    assert not y[2:, :, 1].any() and not y[1:, :, 2].any()


def test_sequence_lens_equal_to_the_sequence_need_no_mask() -> None:
    feeds = {"X": rand(3, 2, 4)}
    model = rnn_model("LSTM", feeds, {**weights("LSTM", 1, 4, 5), "sequence_lens": np.array([3, 3], np.int32)})
    check(model, feeds)
    assert "graph.where" not in import_onnx(model).text


@pytest.mark.parametrize("outputs", [("", "Y_h"), ("Y",), ("", "", "Y_c")])
def test_only_the_outputs_asked_are_computed(outputs) -> None:
    feeds = {"X": rand(4, 2, 3)}
    model = rnn_model("LSTM", feeds, weights("LSTM", 2, 3, 5), outputs, direction="bidirectional")
    check(model, feeds)
    assert ("tensor<4x2x2x5xf32>" in import_onnx(model).text) == ("Y" in outputs)  # Y: [seq, 2, batch, hidden]


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_a_symbolic_batch_stays_dynamic(op: str) -> None:
    """The batch may be `?`: one import runs every batch size, sequence_lens given at run time too."""
    info = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, "batch", 4]),
            helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, ["batch"])]  # fmt: skip
    node = helper.make_node(op, INPUTS[:5], ["Y", "Y_h"], hidden_size=5, direction="bidirectional")
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("Y", "Y_h")]
    inits = [numpy_helper.from_array(v, k) for k, v in weights(op, 2, 4, 5).items()]
    model = helper.make_model(helper.make_graph([node], "g", info, outs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 22)])  # fmt: skip
    assert str(import_onnx(model).module.funcs["main"].args[0].type) == "tensor<3x?(batch)x4xf32>"
    for batch in (2, 5):
        check(model, {"X": rand(3, batch, 4), "sequence_lens": np.array([3, 1, 2, 2, 3][:batch], np.int32)})


@pytest.mark.parametrize("opset", [7, 14])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_older_opsets(op: str, opset: int) -> None:
    feeds = {"X": rand(3, 2, 4), **states(op, 1, 2, 3, 0)}
    model = rnn_model(op, feeds, weights(op, 1, 4, 3), OUTPUTS[op], opset=opset)
    check(model, feeds)


def test_bidirectional_lstm_with_run_time_lengths_compiles_for_llvm() -> None:
    feeds = {"X": rand(2, 5, 3), "sequence_lens": np.array([5, 3], np.int32), **states("LSTM", 2, 2, 4, 1)}
    model = rnn_model(
        "LSTM", feeds, weights("LSTM", 2, 3, 4, peep=True), OUTPUTS["LSTM"], direction="bidirectional", layout=1
    )
    check(model, feeds, target="llvm")


# --- diagnostics ------------------------------------------------------------------------------------------


def import_error(model) -> str:
    with pytest.raises(GCError) as e:
        import_onnx(model)
    return e.value.render()


def lstm(inits: dict | None = None, feeds: dict | None = None, **attrs):
    feeds = feeds or {"X": rand(3, 2, 4)}
    return rnn_model("LSTM", feeds, {**weights("LSTM", 1, 4, 5), **(inits or {})}, **attrs)


@pytest.mark.parametrize(
    "model, message",
    [
        (lambda: lstm(direction="sideways"), "direction must be forward, reverse or bidirectional, got 'sideways'"),
        (lambda: lstm(activations=["Sigmoid", "Gelu", "Tanh"]), "unsupported activation 'Gelu'"),
        (lambda: lstm(activations=["Sigmoid", "Tanh"]), "activations has 2 entries, but a LSTM with 1 direction"),
        (lambda: lstm(hidden_size=7), "hidden_size is 7, but R [1, 20, 5] has hidden size 5"),
        (lambda: lstm(clip=-1.0), "clip must be a positive finite number"),
        (lambda: lstm(layout=2), "layout must be 0 or 1, got 2"),
        (lambda: lstm(input_forget=3), "input_forget must be 0 or 1"),
        (lambda: lstm(direction="bidirectional"), "input #1 (W) must have the shape"),
        (
            lambda: lstm({"W": rand(1, 20, 3)}),
            "input #1 (W) must have the shape [num_directions, gates*hidden_size, input_size] = 1x20x4, but has 1x20x3",
        ),
        (lambda: lstm({"B": rand(1, 20)}), "input #3 (B) must have the shape"),
        (lambda: lstm({"P": rand(1, 20)}), "input #7 (P) must have the shape"),
        (lambda: lstm({"sequence_lens": np.array([3, 4], np.int32)}), "sequence_lens [3, 4] must lie between 0"),
        (lambda: lstm(feeds={"X": rand(3, 4)}), "input #0 (X) must have rank 3"),
        (lambda: lstm(opset=1), "from opset 7 on"),
        (lambda: lstm(feeds={"X": rand(5000, 1, 4)}), "the sequence has 5000 steps; gc unrolls at most 4096"),
    ],
)
def test_what_gc_does_not_take_is_one_diagnostic(model, message: str) -> None:
    msg = import_error(model())
    assert message in msg, msg
    assert msg.count("error:") == 1 and "Traceback" not in msg


@pytest.mark.parametrize("layout", [0, 1])
def test_a_symbolic_sequence_length_is_kept_static(layout: int) -> None:
    """gc unrolls the sequence: a named sequence axis is static, 1 where it leads, else an error asking its size."""
    dims = ["seq", 2, 4] if layout == 0 else [2, "seq", 4]
    info = [helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)]
    node = helper.make_node("RNN", ["X", "W", "R"], ["Y"], hidden_size=5, layout=layout)
    w = weights("RNN", 1, 4, 5, bias=False)
    graph = helper.make_graph(
        [node], "g", info, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in w.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    if layout == 1:
        assert "--input-shape X=2xN" in import_error(model)
        assert import_onnx(model, input_shapes={"X": (2, 3, 4)}).module.funcs["main"].results[0].type.shape == (
            2,
            3,
            1,
            5,
        )
        return
    imported = import_onnx(model)
    assert "unrolls its sequence" in imported.note
    assert imported.module.funcs["main"].results[0].type.shape == (1, 1, 2, 5)
