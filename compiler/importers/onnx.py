"""ONNX -> GIR: `gc import model.onnx -o model.gir` writes the module and its weights (model.npz) beside it.

The graph is walked in node order. Each node becomes graph ops through the converter of its op type
(onnx_ops.py), and every op's own `infer` gives the shapes, so a mismatch is reported at the node where
it happens; value_info is never trusted. A named (symbolic) axis is `?` unless `--input-shape` pins it;
where the import must read such a size itself (Shape, Size), the axes are kept static instead (a
leading one at 1, any other needing `--input-shape`) and `Imported.note` says why.

Values known at import time (Constant, Shape of a static shape, integer and scalar initializers, and what
is computed from those alone) are also evaluated on the interpreter, so that the inputs ONNX passes as
tensors but GIR takes as attributes (Reshape's shape, Slice's starts, Pad's pads, ...) resolve to
numbers. Floating-point initializers with more than one element are the weights: function arguments,
written to the .npz (or constants, with --embed-weights).

ONNX has no lines, so every op line of the written .gir ends with a comment naming the node it came
from (`// node 12 'Conv_3' (Conv)`), and the module is parsed back from that text: each op's location
is its line in the .gir. The `onnx` package is imported only here, lazily: gc works without it.

A model file is untrusted input: protobuf only guarantees that the fields parse, not that they agree.
So what the converters rely on is checked first, against ONNX's own op schemas where it has them: the
opset, the graph's names, every initializer's dims against its data, every node's input and output
counts, and each attribute's type as it is read. A malformed model is one diagnostic, never a traceback.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.builder import Builder
from compiler.diagnostics import Diagnostic, GCError, printable
from compiler.files import check_writable, write_atomic
from compiler.inputs import parse_sized_name, save_npz
from compiler.ir import DYN, ArgValue, DType, Func, Module, Op, Sym, TensorType, Value, known
from compiler.parser import parse
from compiler.printer import print_module
from compiler.rewrite import erase_dead_ops

# ONNX TensorProto element types that have a GIR dtype.
DTYPES = {1: DType.f32, 2: DType.u8, 3: DType.i8, 4: DType.u16, 5: DType.i16, 6: DType.i32, 7: DType.i64, 9: DType.i1,
          10: DType.f16, 11: DType.f64, 12: DType.u32, 13: DType.u64, 16: DType.bf16}  # fmt: skip
# The same, as ONNX's op schemas name them in their type constraints.
TYPE_STRS = {DType.f32: "float", DType.i8: "int8", DType.i16: "int16", DType.i32: "int32", DType.i64: "int64",
             DType.u8: "uint8", DType.u16: "uint16", DType.u32: "uint32", DType.u64: "uint64", DType.i1: "bool",
             DType.f16: "float16", DType.f64: "double", DType.bf16: "bfloat16"}  # fmt: skip
# Results computed from constants above this many elements are left to gc's own fold-constants.
FOLD_LIMIT = 1 << 16
# Arrays the importer makes itself (ConstantOfShape's fill, Range, masks, index tables) may have at most this
# many elements: a model's sizes are only numbers, and 2^60 of them is an error, not an allocation.
BUILD_LIMIT = 1 << 28
# What a GIR tensor type may be (the parser's limits): the written module must parse back.
MAX_RANK, MAX_BYTES = 64, 2**63 - 1
_REQUIRED = object()
# Keyword names of np.savez: weights may not be called so.
_RESERVED = {"file", "allow_pickle"}
# AttributeProto's types (its AttributeType numbers) and the field that holds each one's value.
_ATTR_FIELDS = {1: "f", 2: "i", 3: "s", 4: "t", 5: "g", 11: "sparse_tensor", 13: "tp", 6: "floats", 7: "ints",
                8: "strings", 9: "tensors", 10: "graphs", 12: "sparse_tensors", 14: "type_protos"}  # fmt: skip
_ATTR_KINDS = {1: "one float", 2: "one integer", 3: "one string", 4: "a tensor", 5: "a graph", 6: "a list of floats",
               7: "a list of integers", 8: "a list of strings", 9: "a list of tensors"}  # fmt: skip
_LISTS = {6, 7, 8, 9, 10, 12, 14}


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
    note: str = ""  # why named axes were kept at a size rather than `?`, if they were

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
    file: str | None = None,
) -> Imported:
    """Import an ONNX model (a path or a ModelProto) as a module with one function, @main. `file` names a
    ModelProto in diagnostics (default <model>)."""
    onnx = require_onnx()
    if isinstance(source, (str, Path)):
        file = str(source)
        model = load_model(file)
    else:
        file, model = file or "<model>", source
    gir_name = gir_name or (Path(file).with_suffix(".gir").name if file != "<model>" else "model.gir")
    note = ""
    imp = _Importer(model, file, dict(input_shapes or {}), embed_weights, onnx, dynamic=True)
    try:  # named (symbolic) axes as `?`, unless --input-shape pins them
        func = imp.run()
    except (SizeNeeded, TypeError, GCError) as e:
        if not imp.named_axes:
            raise
        # A size the import itself must know (a Shape read, an attribute computed from one): GIR has no shape
        # values yet, so the axes are kept static, as before dynamic shapes (a leading one at 1).
        why = e.diagnostics[0].message if isinstance(e, GCError) else str(e)
        note = f"kept the named axes {', '.join(imp.named_axes)} static: {why}"
        imp = _Importer(model, file, dict(input_shapes or {}), embed_weights, onnx, dynamic=False)
        func = imp.run()
    weights = {a.name: imp.weights[n] for n, a in imp.weight_args.items()}
    text = _header(model, file, gir_name, imp.opset, func, weights) + _annotate(func, imp.comments)
    return Imported(parse(text, gir_name), text, {a.name: weights[a.name] for a in func.args if a.name in weights},
                    note)


class SizeNeeded(Exception):
    """The import needs a size that a named axis leaves to run time (raised where it is read)."""


@functools.cache
def _schemas() -> dict[str, list[Any]]:
    """Every version of every op schema of the default ONNX domain that the onnx package knows, oldest first."""
    out: dict[str, list[Any]] = {}
    for s in require_onnx().defs.get_all_schemas_with_history():
        if s.domain in ("", "ai.onnx"):
            out.setdefault(s.name, []).append(s)
    for versions in out.values():
        versions.sort(key=lambda s: s.since_version)
    return out


def _count(low: int, high: int, what: str) -> str:
    """`1 input`, `2 to 3 outputs`, `at least 1 input`: a schema's bounds on a count, in words."""
    if high >= 1 << 30:  # a variadic parameter: the schema's maximum is INT_MAX
        return f"at least {low} {what}{'s' if low != 1 else ''}"
    return f"{low if low == high else f'{low} to {high}'} {what}{'s' if high != 1 else ''}"


def load_model(path: str, data: bytes | None = None) -> Any:
    """The ModelProto in file `path`, or in `data` (a model read from standard input: no external data)."""
    onnx = require_onnx()
    if data is None and not Path(path).is_file():
        raise file_error(path, "cannot read the model: no such file")
    try:
        return onnx.load(path) if data is None else onnx.load_model_from_string(data)
    except Exception as e:  # noqa: BLE001 (protobuf raises its own DecodeError, external data OSError, ...)
        raise file_error(path, f"cannot read the model: {type(e).__name__}: {e}") from None


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`input=1x3x224x224` -> ("input", (1, 3, 224, 224)); `x=` is a scalar. ValueError if malformed."""
    return parse_sized_name(text, "--input-shape")


def cmd_import(args) -> int:
    """`gc import MODEL.onnx [-o OUT.gir] [--input-shape NAME=DIMS]... [--embed-weights]`"""
    import sys

    shapes: dict[str, tuple[int, ...]] = {}
    for name, dims in map(parse_input_shape, args.input_shape):
        if name in shapes and shapes[name] != dims:
            raise GCError(f"--input-shape gives '{name}' two shapes: {'x'.join(map(str, shapes[name]))} and "
                          f"{'x'.join(map(str, dims))}")
        shapes[name] = dims
    stdin = args.file == "-"
    out = Path(args.output or ("stdin.gir" if stdin else Path(args.file).with_suffix(".gir").name))
    check_writable(out)  # and the weights' .npz beside it, before the import
    check_writable(out.with_suffix(".npz"))
    source = load_model("<stdin>", sys.stdin.buffer.read()) if stdin else args.file
    imported = import_onnx(source, input_shapes=shapes, embed_weights=args.embed_weights, gir_name=str(out),
                           file="<stdin>" if stdin else None)
    npz = imported.write(out)
    if imported.note:
        print(f"gc: {imported.note}; --input-shape NAME=D1xD2... chooses their sizes", file=sys.stderr)
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

    def __init__(self, model: Any, file: str, input_shapes: dict, embed: bool, onnx: Any, dynamic: bool = False):
        self.onnx = onnx
        self.dynamic = dynamic  # named axes as `?` (else a leading one is 1, and any other an error)
        self.named_axes: list[str] = []  # those made `?`, as "input[axis] 'name'"
        self.size_names: dict[str, str] = {}  # dim_param -> its GIR size name (distinct ones kept distinct)
        self.file = file
        self.model = model
        self.graph = model.graph
        self.opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
        self.opset = self.opsets.get("ai.onnx", 0)
        self.embed = embed
        self.input_shapes = input_shapes
        self.func = Func("main", [], [])
        self.b = Builder(self.func)
        self.values: dict[str, Value] = {}  # ONNX name -> GIR value
        self.known: dict[str, np.ndarray] = {}  # ONNX name -> its content, where known at import time
        self.folded: dict[Value, np.ndarray] = {}  # the same by GIR value: constants and what folds from them
        self.weights: dict[str, np.ndarray] = {}  # initializers that become arguments
        self.unusable: dict[str, str] = {}  # initializers of element types GIR lacks: why, should a node use one
        self.weight_args: dict[str, Value] = {}
        self.taken: set[str] = set(_RESERVED)
        self.comments: dict[Op, str] = {}
        self.assigned: set[str] = set()  # every node output's name so far, computed or not
        self.used = {i for node in self.graph.node for i in node.input} | {o.name for o in self.graph.output}

    def error(self, message: str) -> GCError:
        return file_error(self.file, message)

    def run(self) -> Func:
        self.check_text(self.model, "")
        self.check_opset()
        self.check_graph_names()
        self.load_initializers()
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

    def check_text(self, message: Any, where: str) -> None:
        """protobuf hands back a string field that is not UTF-8 as bytes, which no name may be: the first
        such field, anywhere in the model, is the error."""
        for field, value in message.ListFields():
            if field.type not in (field.TYPE_MESSAGE, field.TYPE_STRING):
                continue  # numbers and bytes (raw_data): nothing to decode, and far too many to walk
            repeated = getattr(field, "is_repeated", None)  # protobuf >= 6; `label` before, gone in 7
            repeated = field.label == field.LABEL_REPEATED if repeated is None else repeated
            for k, item in enumerate(value if repeated else [value]):
                at = f"{where}{field.name}" + (f"[{k}]" if repeated else "")
                if field.type == field.TYPE_MESSAGE:
                    self.check_text(item, at + ".")
                elif not isinstance(item, str):
                    raise self.error(f"field {at} is not UTF-8 text")

    def check_opset(self) -> None:
        """The default domain's opset decides every op's semantics: it must be one the onnx package knows."""
        versions = {o.version for o in self.model.opset_import if (o.domain or "ai.onnx") == "ai.onnx"}
        if not versions:
            raise self.error("the model names no opset of the default ONNX domain")
        if len(versions) > 1:
            shown = " and ".join(map(str, sorted(versions)))
            raise self.error(f"the model names two opsets of the default ONNX domain: {shown}")
        top = self.onnx.defs.onnx_opset_version()
        if self.opset < 1:
            raise self.error(f"opset {self.opset} of the default ONNX domain is not an opset: they run from 1 to {top}")
        if self.opset > top:
            raise self.error(
                f"opset {self.opset} of the default ONNX domain is newer than opset {top}, the highest the installed "
                f"onnx package ({self.onnx.__version__}) knows: upgrade onnx, or export the model for opset {top}"
            )

    def check_graph_names(self) -> None:
        """Names are how ONNX wires the graph: one given twice would silently pick one of the values."""
        inputs: set[str] = set()
        for i in self.graph.input:
            if i.name in inputs:
                raise self.error(f"graph input '{i.name}' is listed twice")
            inputs.add(i.name)
        outputs: set[str] = set()
        for o in self.graph.output:
            if o.name in outputs:
                raise self.error(f"graph output '{o.name}' is listed twice: give each output its own name")
            if o.name in inputs:
                raise self.error(
                    f"graph output '{o.name}' is also a graph input: give the output its own name (through an Identity)"
                )
            outputs.add(o.name)

    def load_initializers(self) -> None:
        for init in self.graph.initializer:
            if self.defined(init.name) or init.name in self.unusable:
                raise self.error(f"initializer '{init.name}' is given twice")
            if init.data_type not in DTYPES:
                # An error only where a node uses it: a model may carry tensors it never reads.
                self.unusable[init.name] = (
                    f"initializer '{init.name}' has element type {self.type_name(init.data_type)}, "
                    "which GIR has no dtype for"
                )
                continue
            arr = self.tensor(init, f"initializer '{init.name}'")
            is_weight = not self.embed and arr.dtype.kind == "f" and arr.size > 1
            (self.weights if is_weight else self.known)[init.name] = arr

    def tensor(self, t: Any, what: str, error: Any = None) -> np.ndarray:
        """A TensorProto's content. Its dims and its data are separate fields, which a malformed model lets
        disagree: they are checked here, not left to numpy's reshape. `error` makes the diagnostic (a node's)."""
        error = error or self.error
        tp = self.onnx.TensorProto
        if t.data_type not in DTYPES:
            raise error(f"{what} has element type {self.type_name(t.data_type)}, which GIR has no dtype for")
        dims = list(t.dims)
        if any(d < 0 for d in dims):
            raise error(f"{what} has a negative dimension in its shape {dims}")
        if t.data_location == tp.EXTERNAL:
            raise error(f"{what} keeps its data in an external file: import the model from its path, beside it")
        if t.HasField("segment"):
            raise error(f"{what} is a segment of a larger tensor, which gc cannot read")
        count, itemsize = math.prod(dims), DTYPES[t.data_type].itemsize
        if t.HasField("raw_data"):
            if len(t.raw_data) != count * itemsize:
                raise error(
                    f"{what} has shape {dims} ({count} element{'s' * (count != 1)} of {itemsize} bytes), but "
                    f"{len(t.raw_data)} bytes of raw_data"
                )
        else:
            field = self.onnx.helper.tensor_dtype_to_field(t.data_type)
            if len(getattr(t, field)) != count:
                raise error(
                    f"{what} has shape {dims} ({count} element{'s' * (count != 1)}), but {len(getattr(t, field))} "
                    f"values in {field}"
                )
        return self.onnx.numpy_helper.to_array(t)

    def schema(self, op_type: str) -> Any | None:
        """The op's schema at the model's opset (its newest version up to it); None if the op came later."""
        return next((s for s in reversed(_schemas().get(op_type, [])) if s.since_version <= self.opset), None)

    def attribute_type(self, op_type: str, name: str) -> int | None:
        """The AttributeProto type ONNX gives the op's attribute: as of the model's opset where it has the
        attribute, else as of the nearest version that has it (converters accept a few attributes of other
        opsets: consumed_inputs, allowzero); None if no version of the op has it."""
        versions = _schemas().get(op_type, [])
        older = [s for s in versions if s.since_version <= self.opset]
        newer = [s for s in versions if s.since_version > self.opset]
        for s in [*reversed(older), *newer]:
            if name in s.attributes:
                return int(s.attributes[name].type.value)
        return None

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
        elif any(d < 0 for d in dims if isinstance(d, int)):
            raise self.error(f"input '{inp.name}' has a negative size in its shape [{', '.join(map(str, dims))}]")
        elif not tt.HasField("shape"):
            raise self.error(f"input '{inp.name}' has no shape in the model: give --input-shape {inp.name}=D1xD2x...")
        elif self.dynamic:
            # A named axis is a named size: inputs that share the name take one size at each call (ONNX's
            # dim_param); an axis without a name is a `?` of its own.
            shape = tuple(d if isinstance(d, int) else DYN if d == "?" else Sym.symbol(self.size_name(d)) for d in dims)
            self.named_axes += [f"'{d}' ({inp.name}[{i}])" for i, d in enumerate(dims) if not isinstance(d, int)]
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
        self.check_type(v.type, f"input '{inp.name}'", self.error)
        self.values[inp.name] = v
        return v

    @staticmethod
    def check_type(t: TensorType, what: str, error: Any) -> None:
        """A model's sizes are only numbers: the type they make must be one GIR (and NumPy) can hold."""
        if t.rank > MAX_RANK:
            raise error(f"{what} has rank {t.rank}; GIR tensors have at most {MAX_RANK} dimensions")
        # In Python integers (numpy's would wrap), and an empty axis does not excuse a huge one, as in the parser.
        if math.prod(max(d, 1) if known(d) else 1 for d in t.shape) * t.dtype.itemsize > MAX_BYTES:
            raise error(f"{what} is {t}, too large: a GIR tensor holds at most 2^63 - 1 bytes")

    def check_output(self, out: Any, v: Value) -> Value:
        """The inferred type must agree with what the model declares (where it declares a static size)."""
        tt = out.type.tensor_type
        if tt.elem_type and DTYPES.get(tt.elem_type) != v.type.dtype:
            raise self.error(
                f"output '{out.name}' is {v.type}, but the model declares element type {self.type_name(tt.elem_type)}"
            )
        if tt.HasField("shape"):
            dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in tt.shape.dim]
            if len(dims) != v.type.rank or any(d is not None and known(s) and d != s for d, s in zip(dims, v.type.shape)):
                shown = ", ".join("?" if d is None else str(d) for d in dims)
                raise self.error(f"output '{out.name}' is {v.type}, but the model declares shape [{shown}]")
        return v

    # -- values --

    def defined(self, name: str) -> bool:
        return name in self.values or name in self.known or name in self.weights or name in self.unusable

    def content(self, name: str) -> np.ndarray | None:
        """The value's content if known at import time (a weight's too), else None."""
        if name in self.unusable:
            raise self.error(self.unusable[name])
        if name in self.known:
            return self.known[name]
        return self.weights.get(name)

    def value(self, name: str) -> Value:
        """The GIR value of an ONNX name; weights become arguments and known values constants, on first use."""
        if name in self.values:
            return self.values[name]
        if name in self.unusable:
            raise self.error(self.unusable[name])
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
        import compiler.importers.onnx_rnn  # noqa: F401  (registers its converters)
        from compiler.importers import onnx_attention  # noqa: F401  (registers its converters)
        from compiler.importers.onnx_ops import CONVERTERS

        n = Node(self, index, proto)
        domain = proto.domain or "ai.onnx"
        conv = CONVERTERS.get(proto.op_type) if domain == "ai.onnx" else None
        if conv is None:
            op = proto.op_type if domain == "ai.onnx" else f"{domain}.{proto.op_type}"
            raise self.error(f"{n.label}: unsupported op {op} (opset {self.opsets.get(domain, '?')})")
        self.check_node(n, conv.attrs)
        start = len(self.func.ops)
        try:
            outs = conv.fn(n)
            new = self.func.ops[start:]
            for r in (r for op in new for r in op.results):
                self.check_type(r.type, "a result", n.error)
            self.fold(new)
        except GCError as e:
            if isinstance(e.diagnostics[0], FileDiagnostic):
                raise
            raise n.error(e.message) from None  # a graph op's own diagnostic, in terms of the node
        self.bind(n, outs, new)
        for op in new:
            self.comments[op] = n.label + f" ({proto.op_type})"

    def check_node(self, n: Node, attrs: frozenset[str]) -> None:
        """What converters take for granted, checked against the op's schema: a converter may then read
        input #1 of a Reshape, or ignore a Relu's third input, without a malformed node going unnoticed."""
        proto, schema = n.proto, n.schema
        if schema is None:
            versions = _schemas().get(proto.op_type)
            if not versions:
                raise n.error(f"the installed onnx package ({self.onnx.__version__}) knows no op {proto.op_type}")
            first = versions[0].since_version
            raise n.error(f"{proto.op_type} is not an op of opset {self.opset}: it came in opset {first}")
        for what, names, params, low, high in (
            ("input", proto.input, schema.inputs, schema.min_input, schema.max_input),
            ("output", proto.output, schema.outputs, schema.min_output, schema.max_output),
        ):
            if not low <= len(names) <= high:
                raise n.error(f"takes {_count(low, high, what)}, but has {len(names)}")
            for i, name in enumerate(names):
                param = params[min(i, len(params) - 1)]  # a variadic parameter is the last one
                if not name and param.option != type(param.option).Optional:
                    raise n.error(f"{what} #{i} ({param.name}) is required, but the node leaves it empty")
        for a in proto.attribute:
            if a.name not in attrs or self.attribute_type(proto.op_type, a.name) is None:
                raise n.error(f"unsupported attribute '{a.name}'")
        for i, name in enumerate(proto.input):
            if name and not self.defined(name):
                raise n.error(f"input #{i} '{name}' is computed by no earlier node")
        self.check_input_types(n)
        named = [name for name in proto.output if name]
        for i, name in enumerate(proto.output):
            if name and (self.defined(name) or name in self.assigned or named.count(name) > 1):
                raise n.error(f"output #{i} '{name}' is defined twice: ONNX names each value once")
        self.assigned.update(named)

    def check_input_types(self, n: Node) -> None:
        """Each input's element type must be one the schema allows, and inputs that share a type parameter
        (Add's A and B) must agree: converters may then assume a float where ONNX promises one."""
        allowed = {c.type_param_str: c.allowed_type_strs for c in n.schema.type_constraints}
        bound: dict[str, tuple[int, str]] = {}
        for i, name in enumerate(n.proto.input):
            if not name:
                continue
            param = n.schema.inputs[min(i, len(n.schema.inputs) - 1)]
            t = TYPE_STRS[n.type(i).dtype]
            ok = [a.removeprefix("tensor(").removesuffix(")") for a in allowed.get(param.type_str, [param.type_str])]
            if t not in ok:
                raise n.error(f"input #{i} ({param.name}) has element type {t}, but {n.op_type} takes {', '.join(ok)}")
            if param.type_str not in allowed or not param.is_homogeneous:
                continue
            j, u = bound.setdefault(param.type_str, (i, t))
            if u != t:
                raise n.error(
                    f"input #{i} ({param.name}) has element type {t}, but input #{j} has {u}: the two must agree"
                )

    def size_name(self, dim_param: str) -> str:
        """The GIR name of an ONNX dim_param: one name per dim_param, two dim_params never one name ("seq len"
        and "seq_len" are seq_len and seq_len_2)."""
        if dim_param not in self.size_names:
            base = name = _size_name(dim_param)
            taken, k = set(self.size_names.values()), 2
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            self.size_names[dim_param] = name
        return self.size_names[dim_param]

    def fold(self, ops: list[Op]) -> None:
        """Evaluate the new ops whose operands are all known, so that later nodes can read the results."""
        for op in ops:
            if op.kind == "constant":
                self.folded[op.result] = op.value.array
                continue
            if not op.operands or any(v not in self.folded for v in op.operands) or op.runtime_attrs():
                continue
            if not all(r.type.is_static for r in op.results):
                continue  # (its sizes are known at each call only)
            if any(math.prod(max(d, 1) for d in r.type.shape) > FOLD_LIMIT for r in op.results):
                continue  # big (or empty beside a huge axis, which numpy cannot make either): left to fold-constants
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
            if isinstance(out, (np.ndarray, np.generic)):
                self.known[name] = np.asarray(out)  # numpy's ufuncs make 0-d arrays scalars: known values are arrays
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
        self.schema = imp.schema(proto.op_type) if (proto.domain or "ai.onnx") == "ai.onnx" else None

    def error(self, message: str) -> GCError:
        return self.imp.error(f"{self.label}: {self.op_type} (opset {self.opset}): {message}")

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        a = self.attrs.get(name)
        if a is None:
            if default is _REQUIRED:
                raise self.error(f"missing required attribute '{name}'")
            return default
        return self.attr_value(a, self.imp.attribute_type(self.op_type, name))

    def attr_value(self, a: Any, expected: int | None) -> Any:
        """The attribute's value, of the type the ONNX spec gives it (an int for INT, a list for INTS, ...).
        A model may declare another type, or fill another field than its type names: each is a diagnostic."""
        held = [t for t, f in _ATTR_FIELDS.items() if (len(getattr(a, f)) if t in _LISTS else a.HasField(f))]
        found = a.type or (held[0] if len(held) == 1 else 0)  # IR version 1 had no type field
        if found not in _ATTR_FIELDS:
            raise self.error(f"attribute '{a.name}' has no type")
        if expected is not None and found != expected:
            raise self.error(f"attribute '{a.name}' must be {self.attr_kind(expected)}, but is {self.attr_kind(found)}")
        if held and found not in held or not held and found not in _LISTS:
            holds = " and ".join(self.attr_kind(t) for t in held) or "nothing"
            raise self.error(f"attribute '{a.name}' is declared {self.attr_kind(found)}, but holds {holds}")
        v = getattr(a, _ATTR_FIELDS[found])
        if found in (1, 2):
            return v
        if found in (6, 7):
            return list(v)
        if found == 3:
            return self.text(a.name, v)
        if found == 8:
            return [self.text(a.name, x) for x in v]
        if found == 4:
            return self.imp.tensor(v, f"attribute '{a.name}'", self.error)
        raise self.error(f"attribute '{a.name}' is {self.attr_kind(found)}, which gc cannot import")

    def attr_kind(self, t: int) -> str:
        """`INTS (a list of integers)`: an attribute type as ONNX names it, and in words."""
        name = {v: k for k, v in self.imp.onnx.AttributeProto.AttributeType.items()}.get(t, f"#{t}")
        return f"{name} ({_ATTR_KINDS[t]})" if t in _ATTR_KINDS else name

    def text(self, name: str, raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise self.error(f"attribute '{name}' is not UTF-8 text") from None

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

    def runtime(self, i: int, what: str) -> ArgValue:
        """Input #i, not known at import time, as an attribute taken from it at each call (`{axes = %axes}`):
        an input of the model or a value computed from sizes (a Shape), constants and such inputs, a static
        tensor of rank 0 or 1 (what it is computed from, the verifier checks once the function is whole)."""
        from compiler.verifier import data_read

        v = self.x(i)
        data = data_read(v, {}) if v.owner is not None else None
        if not v.type.is_static or v.type.rank > 1 or (v.owner is not None and not v.type.dtype.is_int) or data:
            raise self.error(
                f"input #{i} ({what}) must be a constant, an input of the model or computed from sizes, but "
                f"'{self.proto.input[i]}' is a {v.type} computed at run time"
                + (f" from the data '{data.name}'" if data is not None else "") + "; gc needs it known when the model "
                "is called"
            )
        return ArgValue(v.name)

    def constants(self) -> list[np.ndarray] | None:
        """Every input's content, if all are constants known at import time (weights are not)."""
        names = [name for name in self.proto.input if name]
        if any(name not in self.imp.known for name in names):
            return None
        return [self.imp.known[name] for name in names]

    def ints(self, i: int, what: str) -> tuple[int, ...] | None:
        arr = self.const(i, what)
        if arr is not None and arr.dtype.kind not in "biu":  # a float would be rounded, a NaN cannot be
            raise self.error(f"input #{i} ({what}) must be integers, but '{self.proto.input[i]}' is {arr.dtype}")
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

    def check_size(self, shape: tuple[int, ...] | list[int], what: str) -> None:
        """An array the importer is about to make must be one it can: sizes in a model are just numbers."""
        shape = [d for d in shape if known(d)]  # (a `?` size is the caller's at each call)
        if any(d < 0 for d in shape):
            raise self.error(f"{what} has a negative size in its shape {list(shape)}")
        if math.prod(max(d, 1) for d in shape) > BUILD_LIMIT:  # numpy refuses a huge axis beside an empty one too
            raise self.error(
                f"{what} would have the shape {list(shape)}; gc makes arrays at import time of at most {BUILD_LIMIT} "
                "elements"
            )

    def full(self, shape: tuple[int, ...], value: Any, dtype: Any, what: str) -> np.ndarray:
        """np.full, for a shape that came from the model (checked first)."""
        self.check_size(shape, what)
        return np.full(shape, value, dtype=dtype)

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


def _size_name(dim_param: str) -> str:
    """An ONNX dim_param ("batch_size", "seq len", "2d") as a GIR size name: other characters as _."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in dim_param)
    return name if name[:1].isalpha() or name[:1] == "_" else "_" + name
