"""Inputs for `gc run`: from an .npz, or made up deterministically (`--random-inputs SEED`).

Random inputs respect what the graph does with them: class labels fall in [0, C), gather indices
in range, batch_norm variances and log/sqrt operands positive, weights scaled by 1/sqrt(fan-in) so
activations stay near unit size through deep nets.
"""

from __future__ import annotations

import math
import re

import numpy as np

from compiler.diagnostics import GCError
from compiler.ir import DType, Func, Module, Sym, TensorType, Value, bind_sizes, evaluate_dim, fits, is_bf16, known


def load_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz; bf16 ones (which .npy stores as raw 2-byte voids, '|V2') come back as bf16.
    The file is untrusted: whatever NumPy, zipfile or zlib raise on a damaged one becomes one diagnostic."""
    try:
        data = np.load(path, allow_pickle=False)
    except OSError as e:
        raise GCError(f"cannot read {path}: {e.strerror or e}") from None
    except EOFError:
        raise GCError(f"cannot read {path}: the file is empty") from None
    except ValueError:  # NumPy's guess for bytes it cannot place is "pickled data"
        raise GCError(f"cannot read {path}: not an .npz file (np.savez writes one)") from None
    except Exception as e:  # noqa: BLE001 (a damaged zip directory: BadZipFile, NotImplementedError, ...)
        raise GCError(f"cannot read {path}: a damaged .npz file ({_why(e)})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):  # an .npy: one array, no names
        raise GCError(f"{path} holds one unnamed array (an .npy file); give an .npz keyed by argument name, "
                      "e.g. np.savez('in.npz', x=x)")
    arrays = {}
    with data:
        for k in data.files:
            try:
                arrays[k] = data[k]
            except ValueError as e:
                if "allow_pickle" in str(e):
                    raise GCError(f"{path}: '{k}' is an array of Python objects, not numbers") from None
                raise GCError(f"{path}: '{k}' is damaged ({_why(e)})") from None
            except MemoryError:
                raise GCError(f"{path}: '{k}' claims more elements than memory holds") from None
            except Exception as e:  # noqa: BLE001 (cut short, bad CRC, bad deflate stream, ...)
                raise GCError(f"{path}: '{k}' is damaged ({_why(e)})") from None
    return restore_bf16(arrays)


def _why(e: Exception) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def castable(have: np.dtype, want: np.dtype) -> bool:
    """Whether an input of dtype `have` may be cast to an argument's `want`: within a kind only (f64 to f32,
    i64 to i32, u8 to i32), never across kinds (an int or bool array for a float argument is a mistake)."""
    return _kind(np.dtype(have)) == _kind(np.dtype(want))


def _kind(dt: np.dtype) -> str:
    if dt.kind == "f" or is_bf16(dt):
        return "float"
    return "int" if dt.kind in "iu" else dt.kind


def narrowed(name: str, x: np.ndarray, want: np.dtype, loc=None) -> np.ndarray:
    """Integer input `x` cast to the narrower integer dtype `want`; a value that does not fit is an error
    (NumPy would wrap it around: 2**40 as i32 is 0)."""
    if x.size and x.dtype.kind in "iu" and np.dtype(want).kind in "iu" and not np.can_cast(x.dtype, want):
        info = np.iinfo(want)
        lo, hi = x.min(), x.max()
        if lo < info.min or hi > info.max:
            bad = hi if hi > info.max else lo
            raise GCError(f"input '{name}' holds {bad}, which {np.dtype(want).name} cannot represent", loc)
    return x.astype(want)


def restore_bf16(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """bf16 arrays read from an .npy/.npz (stored as raw 2-byte voids, '|V2') as bf16 again."""
    return {k: x.view(DType.bf16.np) if x.dtype.kind == "V" and x.dtype.itemsize == 2 and x.dtype.names is None else x
            for k, x in arrays.items()}


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write arrays to an .npz that NumPy alone reads back: bf16 ones as f32 (exact), not as raw voids.
    At exactly `path`: np.savez given a name adds `.npz` to it."""
    from compiler.files import write_atomic

    write_atomic(path, lambda fh: np.savez(fh, **{k: x.astype(np.float32) if is_bf16(x.dtype) else x
                                                  for k, x in arrays.items()}))


def parse_sized_name(text: str, flag: str) -> tuple[str, tuple[int, ...]]:
    """`x=1x3x224x224` -> ("x", (1, 3, 224, 224)); `x=` is a scalar; a leading % of the name is dropped.
    ValueError naming `flag` if malformed."""
    name, sep, dims = text.rpartition("=")
    name = name.removeprefix("%")
    if not sep or not name or not re.fullmatch(r"(\d+(x\d+)*)?", dims):
        raise ValueError(f"bad {flag} {text!r}: expected NAME=D1xD2x..., e.g. x=1x3x224x224")
    return name, tuple(int(d) for d in dims.split("x")) if dims else ()


def random_inputs(f: Func, seed: int, module: Module | None = None,
                  shapes: dict[str, tuple[int, ...]] | None = None, skip: set[str] = frozenset(),
                  unknown: int | None = None) -> dict[str, np.ndarray]:
    """Deterministic inputs for every argument of `f` (looking through calls when `module` is given) but
    those named in `skip` (given otherwise). `shapes` gives the sizes of arguments with `?` dimensions
    (`gc run --shape NAME=8x784`); `unknown`, if given, is the size of every other `?` (one size for all,
    so that sizes which must agree do)."""
    rng = np.random.default_rng(seed)
    shapes = shapes or {}
    strangers = [n for n in shapes if n not in {a.name for a in f.args}]
    if strangers:
        raise GCError(f"--shape names '{strangers[0]}', which is not an argument of @{f.name}")
    from compiler.specialize import runtime_args

    taken = [n for n in runtime_args(f) if n not in skip]
    if taken:
        arg = next(a for a in f.args if a.name == taken[0])
        raise GCError(f"%{taken[0]} gives an attribute its value at run time (axes, a shape, ...), which random "
                      f"numbers cannot: give it with --inputs", arg.loc)
    types: dict[str, TensorType | None] = {}
    given = [a for a in f.args if a.name in shapes and len(shapes[a.name]) == a.type.rank]
    named = bind_sizes([(a.name, a.type.shape, a.loc) for a in given], [shapes[a.name] for a in given])
    for a in f.args:
        t = a.type
        if a.name in shapes:
            if not fits(t.shape, shapes[a.name]):
                dims = "x".join(map(str, shapes[a.name])) or "a scalar"
                raise GCError(f"shape {dims} given for %{a.name} does not fit {t}", a.loc)
            t = t.with_shape(shapes[a.name])
        elif not t.is_static and all(isinstance(d, Sym) and d.symbols() <= named.keys() for d in t.shape if not known(d)):
            t = t.with_shape(evaluate_dim(d, named) for d in t.shape)  # its sizes named by another's --shape
        elif not t.is_static and unknown is not None:
            t = t.with_shape(d if known(d) else unknown for d in t.shape)
        elif not t.is_static and a.name not in skip:
            raise GCError(f"%{a.name} is {t}: give its sizes to make a random input for it "
                          f"(gc run --shape {a.name}=...)", a.loc)
        types[a.name] = t if t.is_static else None
    # The ops that say what values an input takes (gather's indices, a loss's labels) asked at these sizes.
    g = f
    if any(not a.type.is_static for a in f.args) and all(types.values()):
        from compiler.specialize import specialize

        try:
            g = specialize(module if module is not None else Module(), f, [types[a.name].shape for a in f.args])
        except GCError:
            pass  # sizes that disagree: the run that follows says so, at the op
    out = {}
    for a, ga in zip(f.args, g.args):
        t = types[a.name]
        if t is None:  # given, of a size said only by the array given
            continue
        try:
            x = _random_arg(a, t, _uses(g, ga, module), rng)  # made even where given: the others stay the same
            if a.name not in skip:
                out[a.name] = x
        except MemoryError:
            raise GCError(f"cannot make a random input for %{a.name}: {t} ({t.nbytes:,} bytes) "
                          "does not fit in memory", a.loc) from None
    return out


def _uses(f: Func, a: Value, module: Module | None, depth: int = 0) -> list:
    """The (op, operand index) uses of `a`, following graph.call and exec.launch into the callee's argument
    and graph.cast to its result's users (a weight mixed-precision casts to f16 is still a weight)."""
    from dialects.graph.elementwise import Cast

    out = []
    for op, i in f.users().get(a, []):
        if op is None or depth >= 8:
            out.append((op, i))
            continue
        callee = op.called()
        if module is not None and callee is not None and callee.name in module:
            g = module[callee.name]
            if i < len(g.args):
                out += _uses(g, g.args[i], module, depth + 1)
        elif isinstance(op, Cast):
            out += _uses(f, op.result, module, depth + 1)
        else:
            out.append((op, i))
    return out


def _random_arg(a: Value, t: TensorType, uses, rng: np.random.Generator) -> np.ndarray:
    lo_hi = None
    scale = 1.0
    for op, i in uses:
        hook = getattr(op, "input_range", None) if op is not None else None
        r = hook(i) if hook else None
        if r is not None and known(r[0]) and known(r[1]):  # a bound of a `?` size is no bound here
            both = r if lo_hi is None else (max(lo_hi[0], r[0]), min(lo_hi[1], r[1]))
            # Uses whose ranges do not meet (asin's [-0.9, 0.9], acosh's [1.1, 3]): the first use's; the
            # other op gives NaN there, as it would on such an input.
            lo_hi = both if both[0] <= both[1] else lo_hi
        scale = min(scale, _fan_in_scale(op, i, t.shape))
    dt = t.dtype
    if dt.is_bool:
        return rng.random(t.shape) < 0.5
    if dt.is_int:
        lo, hi = lo_hi if lo_hi is not None else (0, 10)
        return rng.integers(int(lo), max(int(hi), int(lo) + 1), size=t.shape).astype(dt.np)
    if lo_hi is not None:
        return rng.uniform(lo_hi[0], lo_hi[1], size=t.shape).astype(dt.np)
    return (rng.standard_normal(t.shape) * scale).astype(dt.np)


def _fan_in_scale(op, i: int, shape: tuple[int, ...]) -> float:
    """A layer's weights (matmul's and conv2d's operand 1) keep activations at unit scale: 1/sqrt(fan-in)."""
    if op is None or i not in op.weight_operands:
        return 1.0
    fan_in = op.fan_in(i, shape)
    return 1 / math.sqrt(fan_in) if fan_in else 1.0


def summarize(name: str, x: np.ndarray, type_str: str) -> str:
    """One line per output: its type, range, mean, and the first few values."""
    head = f"{name}: {type_str}"
    if x.size == 0:
        return head + "  (empty)"
    flat = x.reshape(-1)
    if x.dtype == np.bool_:
        return head + f"  true {int(flat.sum())}/{flat.size}  " + _first(flat)
    f = flat.astype(np.float64)
    finite = f[np.isfinite(f)]
    stats = ""
    if finite.size:
        stats = f"  min {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}"
    nonfinite = f.size - finite.size
    if nonfinite:
        stats += f"  non-finite {nonfinite}"
    return head + stats + "  " + _first(flat)


def _first(flat: np.ndarray, n: int = 6) -> str:
    vals = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in flat[:n].tolist())
    return "[" + vals + (", ...]" if flat.size > n else "]")
