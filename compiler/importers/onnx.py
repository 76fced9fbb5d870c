"""ONNX -> GIR: `gc import model.onnx -o model.gir` writes the module and its weights (model.npz) beside it.

The graph is walked in node order. Each node becomes graph ops through the converter of its op type
(onnx_ops.py), and every op's own `infer` gives the shapes, so a mismatch is reported at the node where
it happens; value_info is never trusted. Shapes are static: a symbolic dimension needs `--input-shape`,
except a leading one (the batch), which is 1.

Values known at import time (Constant, Shape of a static shape, integer and scalar initializers, and what
is computed from those alone) are also evaluated on the interpreter, so that the inputs ONNX passes as
tensors but GIR takes as attributes (Reshape's shape, Slice's starts, Pad's pads, ...) resolve to
numbers. Floating-point initializers with more than one element are the weights: function arguments,
written to the .npz (or constants, with --embed-weights).

ONNX has no lines, so every op line of the written .gir ends with a comment naming the node it came
from (`// node 12 'Conv_3' (Conv)`), and the module is parsed back from that text: each op's location
is its line in the .gir. The `onnx` package is imported only here, lazily: gc works without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.builder import Builder
from compiler.diagnostics import Diagnostic, GCError, printable
from compiler.files import write_atomic
from compiler.inputs import save_npz
from compiler.ir import DType, Func, Module, Op, TensorType, Value
from compiler.parser import parse
from compiler.printer import print_module
from compiler.rewrite import erase_dead_ops

# ONNX TensorProto element types that have a GIR dtype.
DTYPES = {1: DType.f32, 3: DType.i8, 6: DType.i32, 7: DType.i64, 9: DType.i1, 10: DType.f16, 11: DType.f64,
          16: DType.bf16}  # fmt: skip
# Results computed from constants above this many elements are left to gc's own fold-constants.
FOLD_LIMIT = 1 << 16
_REQUIRED = object()
# Keyword names of np.savez: weights may not be called so.
_RESERVED = {"file", "allow_pickle"}


def require_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise GCError("gc import needs the onnx package: pip install onnx (or pip install 'gc[test]')") from None
    return onnx


@dataclass(eq=False)
class FileDiagnostic(Diagnostic):
    """A diagnostic about a file without lines (an ONNX model is binary): `model.onnx: error: ...`."""

    file: str = ""

    def render(self) -> str:
        return f"{printable(self.file)}: {self.severity}: {printable(self.message)}"


def file_error(file: str, message: str) -> GCError:
    return GCError(FileDiagnostic(message, file=file))


@dataclass
class Imported:
    """An imported model: the verified module (each op located at its line of `text`), and the weights
    that are its arguments after the data inputs, keyed by argument name."""

    module: Module
    text: str
    weights: dict[str, np.ndarray]

    def write(self, gir_path: str | Path) -> Path | None:
        """Write the .gir, and the weights (if any) as an .npz beside it; returns the .npz's path."""
        gir_path = Path(gir_path)
        write_atomic(gir_path, self.text)
        if not self.weights:
            return None
        npz = gir_path.with_suffix(".npz")
        save_npz(npz, self.weights)
        return npz


def import_onnx(
    source: str | Path | Any,
    *,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    embed_weights: bool = False,
    gir_name: str | None = None,
) -> Imported:
    """Import an ONNX model (a path or a ModelProto) as a module with one function, @main."""
    onnx = require_onnx()
    if isinstance(source, (str, Path)):
        file = str(source)
        model = load_model(file)
    else:
        file, model = "<model>", source
    gir_name = gir_name or (Path(file).with_suffix(".gir").name if file != "<model>" else "model.gir")
    imp = _Importer(model, file, dict(input_shapes or {}), embed_weights, onnx)
    func = imp.run()
    weights = {a.name: imp.weights[n] for n, a in imp.weight_args.items()}
    text = _header(model, file, gir_name, imp.opset, func, weights) + _annotate(func, imp.comments)
    return Imported(parse(text, gir_name), text, {a.name: weights[a.name] for a in func.args if a.name in weights})


def load_model(path: str) -> Any:
    onnx = require_onnx()
    if not Path(path).is_file():
        raise file_error(path, "cannot read the model: no such file")
    try:
        return onnx.load(path)
    except Exception as e:  # noqa: BLE001 (protobuf raises its own DecodeError, external data OSError, ...)
        raise file_error(path, f"cannot read the model: {type(e).__name__}: {e}") from None


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`input=1x3x224x224` -> ("input", (1, 3, 224, 224)); `x=` is a scalar. ValueError if malformed."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name or not re.fullmatch(r"(\d+(x\d+)*)?", dims):
        raise ValueError(f"bad --input-shape {text!r}: expected NAME=D1xD2x..., e.g. input=1x3x224x224")
    return name, tuple(int(d) for d in dims.split("x")) if dims else ()


def cmd_import(args) -> int:
    """`gc import MODEL.onnx [-o OUT.gir] [--input-shape NAME=DIMS]... [--embed-weights]`"""
    import sys

    shapes: dict[str, tuple[int, ...]] = {}
    for name, dims in map(parse_input_shape, args.input_shape):
        if name in shapes and shapes[name] != dims:
            raise GCError(f"--input-shape gives '{name}' two shapes: {'x'.join(map(str, shapes[name]))} and "
                          f"{'x'.join(map(str, dims))}")
        shapes[name] = dims
    out = Path(args.output or Path(args.file).with_suffix(".gir").name)
    imported = import_onnx(args.file, input_shapes=shapes, embed_weights=args.embed_weights, gir_name=str(out))
    npz = imported.write(out)
    f = imported.module["main"]
    what = f"{len(f.ops)} ops"
    if npz is not None:
        size = sum(w.nbytes for w in imported.weights.values())
        what += f"; {len(imported.weights)} weights ({size / 2**20:.1f} MiB) in {npz}"
    print(f"gc: wrote {out} ({what})", file=sys.stderr)
    return 0


# --- the walk -------------------------------------------------------------------------------------------


class _Importer:
    """One model's import: ONNX names to GIR values, what is known at import time, the weights."""

    def __init__(self, model: Any, file: str, input_shapes: dict, embed: bool, onnx: Any):
        self.onnx = onnx
        self.file = file
        self.graph = model.graph
        self.opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
        self.opset = self.opsets.get("ai.onnx", 0)
        self.input_shapes = input_shapes
        self.func = Func("main", [], [])
        self.b = Builder(self.func)
        self.values: dict[str, Value] = {}  # ONNX name -> GIR value
        self.known: dict[str, np.ndarray] = {}  # ONNX name -> its content, where known at import time
        self.folded: dict[Value, np.ndarray] = {}  # the same by GIR value: constants and what folds from them
        self.weights: dict[str, np.ndarray] = {}  # initializers that become arguments
        self.weight_args: dict[str, Value] = {}
        self.taken: set[str] = set(_RESERVED)
        self.comments: dict[Op, str] = {}
        self.used = {i for node in self.graph.node for i in node.input} | {o.name for o in self.graph.output}
        for init in self.graph.initializer:
            arr = self.onnx.numpy_helper.to_array(init)
            is_weight = not embed and arr.dtype.kind == "f" and arr.size > 1
            (self.weights if is_weight else self.known)[init.name] = arr

    def error(self, message: str) -> GCError:
        return file_error(self.file, message)

    def run(self) -> Func:
        if not self.opset:
            raise self.error("the model names no opset of the default ONNX domain")
        inits = {i.name for i in self.graph.initializer}
        data = [self.data_input(i) for i in self.graph.input if i.name not in inits]
        if self.input_shapes:
            names = ", ".join(f"'{i.name}'" for i in self.graph.input if i.name not in inits) or "none"
            raise self.error(f"--input-shape names '{next(iter(self.input_shapes))}', but the inputs are {names}")
        for index, node in enumerate(self.graph.node):
            self.convert(index, node)
        results = []
        for out in self.graph.output:
            if not self.defined(out.name):
                raise self.error(f"graph output '{out.name}' is computed by no node")
            results.append(self.check_output(out, self.value(out.name)))
        f = self.func
        f.args = data + [self.weight_args[n] for n in self.weights if n in self.weight_args]
        f.results, f.result_types = results, [v.type for v in results]
        erase_dead_ops(f)
        return f

    @staticmethod
    def sanitized(onnx_name: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.]", "_", onnx_name).strip("_") or "v"

    def name(self, onnx_name: str) -> str:
        """A valid, unused GIR value name that keeps the ONNX name recognisable."""
        base = self.sanitized(onnx_name)
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def dtype(self, elem_type: int, what: str) -> DType:
        if elem_type not in DTYPES:
            raise self.error(f"{what} has element type {self.type_name(elem_type)}, which GIR has no dtype for")
        return DTYPES[elem_type]

    def type_name(self, elem_type: int) -> str:
        names = {v: k for k, v in self.onnx.TensorProto.DataType.items()}
        return names.get(elem_type, f"#{elem_type}")

    def data_input(self, inp: Any) -> Value:
        if inp.type.WhichOneof("value") != "tensor_type":
            raise self.error(f"input '{inp.name}' is not a tensor")
        tt = inp.type.tensor_type
        dtype = self.dtype(tt.elem_type, f"input '{inp.name}'")
        given = self.input_shapes.pop(inp.name, None) or self.input_shapes.pop(self.sanitized(inp.name), None)
        dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else (d.dim_param or "?") for d in tt.shape.dim]
        if given is not None:
            static = [(i, d) for i, d in enumerate(dims) if isinstance(d, int)]
            if tt.HasField("shape") and (len(given) != len(dims) or any(given[i] != d for i, d in static)):
                raise self.error(
                    f"--input-shape {inp.name}={'x'.join(map(str, given))} does not fit the model's "
                    f"shape [{', '.join(map(str, dims))}] for input '{inp.name}'"
                )
            shape = given
        elif not tt.HasField("shape"):
            raise self.error(f"input '{inp.name}' has no shape in the model: give --input-shape {inp.name}=D1xD2x...")
        else:
            shape = tuple(d if isinstance(d, int) else 1 if i == 0 else -1 for i, d in enumerate(dims))
            if -1 in shape:
                pos = shape.index(-1)
                hint = "x".join(str(d) if d >= 0 else "N" for d in shape)
                raise self.error(
                    f"input '{inp.name}' has the symbolic dimension '{dims[pos]}' at position {pos}: "
                    f"give its size with --input-shape {inp.name}={hint}"
                )
        v = Value(TensorType(tuple(shape), dtype), self.name(inp.name))
        self.values[inp.name] = v
        return v

    def check_output(self, out: Any, v: Value) -> Value:
        """The inferred type must agree with what the model declares (where it declares a static size)."""
        tt = out.type.tensor_type
        if tt.elem_type and DTYPES.get(tt.elem_type) != v.type.dtype:
            raise self.error(
                f"output '{out.name}' is {v.type}, but the model declares element type {self.type_name(tt.elem_type)}"
            )
        if tt.HasField("shape"):
            dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in tt.shape.dim]
            if len(dims) != v.type.rank or any(d is not None and d != s for d, s in zip(dims, v.type.shape)):
                shown = ", ".join("?" if d is None else str(d) for d in dims)
                raise self.error(f"output '{out.name}' is {v.type}, but the model declares shape [{shown}]")
        return v

    # -- values --

    def defined(self, name: str) -> bool:
        return name in self.values or name in self.known or name in self.weights

    def content(self, name: str) -> np.ndarray | None:
        """The value's content if known at import time (a weight's too), else None."""
        if name in self.known:
            return self.known[name]
        return self.weights.get(name)

    def value(self, name: str) -> Value:
        """The GIR value of an ONNX name; weights become arguments and known values constants, on first use."""
        if name in self.values:
            return self.values[name]
        if name in self.weights:
            arr = self.weights[name]
            v = Value(TensorType(arr.shape, self.numpy_dtype(arr, f"initializer '{name}'")), self.name(name))
            self.weight_args[name] = v
        else:
            arr = self.known[name]
            v = self.b.constant(arr, self.numpy_dtype(arr, f"'{name}'"))
            v.name = self.name(name)
            self.folded[v] = arr
        self.values[name] = v
        return v

    def numpy_dtype(self, arr: np.ndarray, what: str) -> DType:
        try:
            return DType.from_numpy(arr.dtype)
        except ValueError:
            raise self.error(f"{what} has element type {arr.dtype}, which GIR has no dtype for") from None

    # -- nodes --

    def convert(self, index: int, proto: Any) -> None:
        from compiler.importers.onnx_ops import CONVERTERS

        n = Node(self, index, proto)
        domain = proto.domain or "ai.onnx"
        conv = CONVERTERS.get(proto.op_type) if domain == "ai.onnx" else None
        if conv is None:
            op = proto.op_type if domain == "ai.onnx" else f"{domain}.{proto.op_type}"
            raise self.error(f"{n.label}: unsupported op {op} (opset {self.opsets.get(domain, '?')})")
        for a in proto.attribute:
            if a.name not in conv.attrs:
                raise n.error(f"unsupported attribute '{a.name}'")
        for i, name in enumerate(proto.input):
            if name and not self.defined(name):
                raise n.error(f"input #{i} '{name}' is computed by no earlier node")
        start = len(self.func.ops)
        try:
            outs = conv.fn(n)
            new = self.func.ops[start:]
            self.fold(new)
        except GCError as e:
            if isinstance(e.diagnostics[0], FileDiagnostic):
                raise
            raise n.error(e.message) from None  # a graph op's own diagnostic, in terms of the node
        self.bind(n, outs, new)
        for op in new:
            self.comments[op] = n.label + f" ({proto.op_type})"

    def fold(self, ops: list[Op]) -> None:
        """Evaluate the new ops whose operands are all known, so that later nodes can read the results."""
        for op in ops:
            if op.name == "graph.constant":
                self.folded[op.result] = op.value.array
                continue
            if not op.operands or any(v not in self.folded for v in op.operands):
                continue
            if any(r.type.size > FOLD_LIMIT for r in op.results):
                continue
            self.folded.update(zip(op.results, op.evaluate([self.folded[v] for v in op.operands])))

    def bind(self, n: Node, outs: list, new: list[Op]) -> None:
        owned = set(new)
        for i, name in enumerate(n.proto.output):
            if not name:
                continue
            out = outs[i] if i < len(outs) else None
            if out is None:
                if name in self.used:
                    raise n.error(f"output #{i} '{name}' is used, but gc does not compute it")
                continue
            if isinstance(out, np.ndarray):
                self.known[name] = out
                continue
            if out in self.folded:
                self.known[name] = self.folded[out]
                if out.owner in owned:  # a constant, named after the output, where it is used as data
                    continue
            if out.owner in owned and out.name is None:
                out.name = self.name(name)
            self.values[name] = out
        # Intermediates are named after the node's first output, numbered.
        base = next((self.values[o].name for o in n.proto.output if o in self.values), None)
        k = 0
        for op in new:
            for r in op.results:
                if r.name is None and base:
                    r.name = self.name(f"{base}.{k}")
                    k += 1


class Node:
    """What a converter sees of one ONNX node: inputs as values or constants, attributes, the opset."""

    def __init__(self, imp: _Importer, index: int, proto: Any):
        self.imp = imp
        self.index = index
        self.proto = proto
        self.op_type = proto.op_type
        self.opset = imp.opset
        self.b = imp.b
        self.attrs = {a.name: a for a in proto.attribute}
        self.label = f"node {index}" + (f" '{proto.name}'" if proto.name else "")

    def error(self, message: str) -> GCError:
        return self.imp.error(f"{self.label}: {self.op_type} (opset {self.opset}): {message}")

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        a = self.attrs.get(name)
        if a is None:
            if default is _REQUIRED:
                raise self.error(f"missing required attribute '{name}'")
            return default
        v = self.imp.onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, self.imp.onnx.TensorProto):
            return self.imp.onnx.numpy_helper.to_array(v)
        if isinstance(v, (list, tuple)):
            return [x.decode() if isinstance(x, bytes) else x for x in v]
        if not isinstance(v, (int, float)):
            raise self.error(f"attribute '{name}' of kind {a.type} is not supported")
        return v

    def has(self, i: int) -> bool:
        return i < len(self.proto.input) and self.proto.input[i] != ""

    def x(self, i: int) -> Value:
        """Input #i as a GIR value."""
        if not self.has(i):
            raise self.error(f"input #{i} is missing")
        return self.imp.value(self.proto.input[i])

    def xs(self) -> list[Value]:
        return [self.x(i) for i in range(len(self.proto.input)) if self.has(i)]

    def type(self, i: int) -> TensorType:
        """Input #i's type, without making a value of a constant."""
        name = self.proto.input[i]
        arr = self.imp.content(name) if name not in self.imp.values else None
        if arr is not None:
            return TensorType(arr.shape, self.imp.numpy_dtype(arr, f"'{name}'"))
        return self.x(i).type

    def known(self, i: int) -> np.ndarray | None:
        """Input #i's content if known at import time (None if absent or computed at run time)."""
        return self.imp.content(self.proto.input[i]) if self.has(i) else None

    def const(self, i: int, what: str) -> np.ndarray | None:
        """Input #i's content, which must be known at import time; None if the input is absent."""
        if not self.has(i):
            return None
        arr = self.imp.content(self.proto.input[i])
        if arr is None:
            raise self.error(
                f"input #{i} ({what}) must be a constant, but '{self.proto.input[i]}' is computed "
                "at run time; gc needs static shapes"
            )
        return arr

    def constants(self) -> list[np.ndarray] | None:
        """Every input's content, if all are constants known at import time (weights are not)."""
        names = [name for name in self.proto.input if name]
        if any(name not in self.imp.known for name in names):
            return None
        return [self.imp.known[name] for name in names]

    def ints(self, i: int, what: str) -> tuple[int, ...] | None:
        arr = self.const(i, what)
        return None if arr is None else tuple(int(v) for v in arr.reshape(-1))

    def passthrough(self, i: int) -> Value | np.ndarray:
        """Input #i as it is: still known at import time if it was."""
        arr = self.known(i)
        return arr if arr is not None and self.proto.input[i] not in self.imp.weights else self.x(i)

    def output_used(self, i: int) -> bool:
        return i < len(self.proto.output) and self.proto.output[i] in self.imp.used

    def scalar(self, value: float, like: Value) -> Value:
        """A rank-0 constant of `like`'s dtype."""
        return self.b.constant(np.array(value, dtype=like.type.dtype.np), like.type.dtype)

    def constant(self, arr: np.ndarray, dtype: DType) -> Value:
        return self.b.constant(np.asarray(arr, dtype=dtype.np), dtype)

    def dense_dtype(self, elem_type: int) -> DType:
        return self.imp.dtype(elem_type, f"{self.label}'s target type")


# --- the written text -----------------------------------------------------------------------------------


def _header(model: Any, file: str, gir_name: str, opset: int, func: Func, weights: dict) -> str:
    # Every name here comes from the model or the command line: escaped, so that none can end the comment.
    producer = " ".join(x for x in (model.producer_name, model.producer_version) if x) or "unknown"
    head = f"// {printable(Path(gir_name).name)}: imported by `gc import` from {printable(Path(file).name)}"
    lines = [f"{head} (opset {opset}, produced by {printable(producer)})"]
    first = next((a.name for a in func.args if a.name in weights), None)
    if first is not None:
        npz, gir = printable(Path(gir_name).with_suffix(".npz").name), printable(Path(gir_name).name)
        lines.append(f"// The arguments from %{first} on are weights, in {npz}: gc compile {gir} --params {npz}")
    return "\n".join(lines) + "\n"


def _annotate(func: Func, comments: dict[Op, str]) -> str:
    """The printed function, each op line ending with a comment naming the ONNX node it came from."""
    lines = print_module(Module([func])).split("\n")
    start = next(i for i, line in enumerate(lines) if line.endswith("{")) + 1
    for k, op in enumerate(func.ops):
        if op in comments:
            lines[start + k] += "  // " + printable(comments[op])  # node names are the model's: escaped
    return "\n".join(lines)
