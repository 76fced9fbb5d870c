"""ONNX conformance: every model of the ONNX backend test data that the onnx package ships from PyTorch
(onnx/backend/test/data/pytorch-converted and pytorch-operator) is imported, run on the interpreter and
compiled for llvm (weights bound at compile time), and both are compared with the outputs stored beside
the model. A case that cannot pass is listed in XFAIL with the reason; strict, so that one that starts
passing is noticed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper

import compiler
from compiler.importers.onnx import import_onnx

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SUITES = ["pytorch-converted", "pytorch-operator"]
RTOL, ATOL = 1e-3, 1e-4

# Cases outside what gc can import, with the reason. (All 117 cases of onnx 1.23 pass today.)
XFAIL: dict[str, str] = {}


def cases() -> list:
    out = []
    for suite in SUITES:
        for d in sorted((DATA / suite).glob("test_*")):
            marks = [pytest.mark.xfail(reason=XFAIL[d.name], strict=True)] if d.name in XFAIL else []
            out.append(pytest.param(d, id=f"{suite}/{d.name}", marks=marks))
    return out


def load(path: Path) -> np.ndarray:
    # A copy: numpy_helper's arrays are read-only, and the compiled model passes inputs on without copying.
    return np.array(numpy_helper.to_array(onnx.load_tensor(str(path))))


def data_sets(d: Path) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    sets = []
    for s in sorted(d.glob("test_data_set_*")):
        inputs = [load(p) for p in sorted(s.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
        outputs = [load(p) for p in sorted(s.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
        sets.append((inputs, outputs))
    return sets


def assert_outputs(got: list[np.ndarray], expected: list[np.ndarray], where: str) -> None:
    assert len(got) == len(expected), f"{where}: {len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, f"{where}: output {i} has shape {g.shape}, expected {e.shape}"
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"{where}: output {i}")


@pytest.mark.parametrize("case", cases())
def test_onnx_backend_model_runs_on_interpreter_and_llvm(case: Path) -> None:
    imported = import_onnx(case / "model.onnx")
    f = imported.module["main"]
    data_args = [a.name for a in f.args if a.name not in imported.weights]
    model = compiler.compile(imported.module, "llvm", params=imported.weights)
    for k, (inputs, outputs) in enumerate(data_sets(case)):
        feeds = dict(zip(data_args, inputs, strict=True))
        assert_outputs(compiler.run(imported.module, {**feeds, **imported.weights}), outputs, f"set {k}, interp")
        assert_outputs(model(**feeds), outputs, f"set {k}, llvm")


# The ONNX "light" models: real CNN graphs whose weights are ConstantOfShape fills (so their outputs are
# uniform, and compiling them, 8-12 s each, would prove little). Importing checks op coverage and shape
# inference on whole networks: the result must be what the model declares. (alexnet, vgg19 and zfnet512
# also import, but fill hundreds of MB of weights doing so.)
LIGHT = ["densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet"]


@pytest.mark.parametrize("name", LIGHT)
def test_onnx_light_model_imports(name: str) -> None:
    path = DATA / "light" / f"light_{name}.onnx"
    declared = [tuple(d.dim_value for d in o.type.tensor_type.shape.dim) for o in onnx.load(path).graph.output]
    f = import_onnx(path).module["main"]
    assert [t.shape for t in f.result_types] == declared
