"""Block and loop queries every schedule rule needs, CPU or CUDA, and the TIR rewrites of parameters."""

from __future__ import annotations

import ctypes
import itertools
from functools import lru_cache

from tvm import s_tir, tirx

SPATIAL = 0  # IterVar.iter_type of a data-parallel block iterator


class Schedule(s_tir.Schedule):
    """s_tir.Schedule without the Python type check TVM wraps every primitive in (`type_checked`: an
    inspect.Signature bind and a walk of each argument's annotation per call). The rules make some
    fourteen thousand such calls compiling DenseNet-121, and the checks were a fifth of its scheduling
    time; a wrong argument still fails, in the primitive itself."""


for _name, _fn in list(vars(s_tir.Schedule).items()):
    if callable(_fn) and hasattr(_fn, "__wrapped__"):
        setattr(Schedule, _name, _fn.__wrapped__)


def blocks(sch: s_tir.Schedule) -> list:
    """The top-level blocks of the function, in order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_spatial(sch: s_tir.Schedule, b) -> bool:
    return all(iv.iter_type == SPATIAL for iv in sch.get(b).iter_vars)


def leading_spatial_loops(sch: s_tir.Schedule, b) -> list:
    """The outer loops of `b` that bind its leading data-parallel iterators (the ones safe to split
    across threads or GPU blocks)."""
    ivs = sch.get(b).iter_vars
    spatial = []
    for loop in sch.get_loops(b):
        if len(spatial) < len(ivs) and ivs[len(spatial)].iter_type == SPATIAL:
            spatial.append(loop)
        else:
            break
    return spatial


def inline_spatial(sch: s_tir.Schedule, bs: list, keep_costly: int | None = None) -> None:
    """Inline the spatial blocks of `bs` into their consumers where TVM allows it. With `keep_costly`, a
    block whose expression has more nodes than that and whose copies a consumer's extra reads would add
    more than REREAD_NODES x that stays a stage of its own: inlining copies it at every read, and a chain
    of such ops (maximum reads each operand three times) would grow exponentially. A ReLU's two reads of
    a fused batch_norm are cheap to copy (and LLVM merges them); storing the batch_norm to memory and
    reading it back is not (DenseNet's concat + batch_norm + relu: 2.5x slower kept)."""
    for b in bs:
        if not is_spatial(sch, b) or (keep_costly is not None and _costly_reread(sch, b, keep_costly)):
            continue
        try:
            sch.compute_inline(b)
        except Exception:  # noqa: BLE001 (e.g. an output block: it stays a loop nest of its own)
            pass


def _costly_reread(sch: s_tir.Schedule, b, limit: int) -> bool:
    body = sch.get(b).body
    if not hasattr(body, "value") or count_nodes(body.value, limit + 1) <= limit:
        return False
    buf = sch.get(b).writes[0].source
    size = count_nodes(body.value, REREAD_NODES * limit)
    return any((_reads(sch.get(c).body, buf) - 1) * size > REREAD_NODES * limit for c in sch.get_consumers(b))


REREAD_NODES = 8  # nodes a reread may add by inlining, in units of keep_costly's


def sub_expressions(e):
    """`e` and its sub-expressions, depth first: operands of arithmetic, calls, selects and loads (with
    their indices)."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        for name in ("a", "b", "value", "condition", "true_value", "false_value"):
            v = getattr(x, name, None)
            if v is not None and not isinstance(v, (int, float, str)):
                stack.append(v)
        stack.extend(getattr(x, "args", None) or [])
        stack.extend(getattr(x, "indices", None) or [])


def uses(e, var) -> bool:
    """Whether expression `e` mentions `var`."""
    return any(y.same_as(var) for y in sub_expressions(e))


def is_sum(e, x, y) -> bool:
    """Whether `e` is x + y (either order)."""
    return isinstance(e, tirx.Add) and ((e.a.same_as(x) and e.b.same_as(y)) or (e.a.same_as(y) and e.b.same_as(x)))


def count_nodes(e, cap: int, buf=None) -> int:
    """The nodes of expression `e` (or, given `buf`, its loads of `buf`), looking at no more than `cap`."""
    from tvm.ir.expr import TensorLoad

    nodes = itertools.islice(sub_expressions(e), cap)
    return sum(1 for x in nodes if buf is None or (isinstance(x, TensorLoad) and x.source.same_as(buf)))


def _reads(stmt, buf) -> int:
    """How many loads of `buf` a block's body (a store) holds. Loads of one element count each time: LLVM
    merges them, but inlining copies the producer's whole expression into each, and a chain of such ops
    would grow the TIR (and the compile) exponentially."""
    value = getattr(stmt, "value", None)
    return count_nodes(value, 1 << 16, buf) if value is not None else 0


def is_select(e) -> bool:
    """Whether `e` is a call of if_then_else (a padding's or a concat's choice of what to read)."""
    return str(getattr(getattr(e, "op", None), "name", "")).endswith("if_then_else")


def redeclare_params(prim, strides: dict[int, tuple[int, ...] | None]):
    """`prim` with the parameters at the given positions declared aligned to their element size only, and
    strided where a stride tuple is given (else as they were), mapped with tvm_ffi's structural_map (a
    TVMScript print and parse took 50-70 ms a kernel)."""
    import tvm_ffi
    from tvm.ir.expr import Var

    new = {}
    for i, st in strides.items():
        p = prim.params[i]
        digits = "".join(ch for ch in str(p.dtype) if ch.isdigit())
        new[p] = tirx.decl_buffer(p.shape, p.dtype, p.name, strides=list(st) if st is not None else p.strides,
                                  elem_offset=p.elem_offset, scope=p.scope(),
                                  data_alignment=max(1, int(digits or 8) // 8), offset_factor=p.offset_factor)
    return tvm_ffi.structural_map(prim, [(Var, lambda v: new.get(v, v))]) if new else prim


@lru_cache(maxsize=1)
def register_infinite_reducers() -> None:
    """Let rfactor (the CPU rules) and the cross-thread reductions of dlight's GPU rules know max with
    identity -inf and min with +inf, which the lowerings use for floats (TVM registers them with the type's
    finite extremes only: softmax's row max took the GPU's Fallback schedule, 24% of the transformer's
    kernel time). A registered pair only ever matches a block that starts from that value."""
    import tvm_ffi

    register = tvm_ffi.get_global_func("s_tir.schedule.RegisterReducer")

    def identity(sign: float):
        def get(values):
            # Called from C++ for every reduction rfactor inspects: it must not raise.
            try:
                dtype = str(values[0].ty.dtype)
                if dtype.startswith(("float", "bfloat")):
                    return [tirx.const(sign * float("inf"), dtype)]
                return [tirx.min_value(dtype) if sign < 0 else tirx.max_value(dtype)]
            except Exception:  # noqa: BLE001
                return [tirx.const(0, "int32")]

        return get

    for combine, sign in ((tirx.max, -1.0), (tirx.min, 1.0)):
        fs = [tvm_ffi.convert(lambda x, y, f=combine: [f(x[0], y[0])]), tvm_ffi.convert(identity(sign))]
        # The registry is a C++ static that outlives the interpreter: were these callbacks freed with
        # it, their Python side would be released after finalization (abort at exit). Leak them.
        for f in fs:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(f))
        register(1, *fs)
