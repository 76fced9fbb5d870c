"""A compiled model of a function with `?` sizes (the contract's v2): one callable, and one artifact, for
every size.

The function is compiled once with its sizes as names (codegen/symbolic.py): the graph passes run once
(again only for a size where a choice they made by size goes the other way: ir.SizeChoices), and each
distinct set of argument shapes at its first call gets a memory plan of its own (at the 1.05x bound of
that size, by construction) and the library functions of the kernels an earlier size built, where the
kernel is the same code for every size (its extents expressions of the sizes); only what is not (a
kernel whose rule needs its sizes as numbers; sizes of 0 and 1, which are their own specialization) is
built for the new size. On the CPU the schedule rules of cpu_rules/, on the GPU dlight's (made for
Relax's dynamic shapes). The sizes are checked first (compiler/specialize.py: every type re-inferred,
sizes that must agree checked, with a diagnostic naming the argument). Where the function's sizes are
no expressions of its arguments' (a size computed from data) or attributes are taken at run time, each
size is compiled as a static module at its first call, through the compile cache.

The artifact (`save`, `compiler.load`) is a zip like a .gcpkg (artifact.py) with the module's text as
given (source.gir), the compile options (dynamic.json), every size compiled so far, each a static .gcpkg
(size-<i>.gcpkg, each with the one library of every kernel built so far) whose constants are named by
key (consts.json), the pool of every array once (consts.npz: the bound weights, whose keys params.json
names, and each size's constants, which sizes share: prepacked weights do not repeat per size), and on
the CPU the kernels built (kernels.json and their object files objects-<i>.o:
build.KernelStore.to_json): a loaded model compiles nothing at a size it was saved with, and at a new one
symbolizes its source again and finds its kernels among the saved ones (`gc compile` builds them before
saving: `warm`). A CUDA library carries device code that no linker joins, so a loaded CUDA model builds
its kernels again at its first new size (once, for every later size).
"""
from __future__ import annotations

import io
import json
import tempfile
import threading
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from compiler.diagnostics import GCError
from compiler.ir import bind_sizes, fits

_UNSET = object()


def _number(name: str) -> int:
    return int(name.split("-", 1)[1].split(".", 1)[0])


class DynamicModel:
    """Call it with NumPy arrays (positional or by argument name) of any sizes its `?` dimensions allow; it
    returns a list of NumPy arrays. Thread-safe: a size's compile happens once, under a lock."""

    def __init__(self, text: str, options, params: dict[str, np.ndarray] | None, name: str = "<text>",
                 symbolic=None):
        from compiler.parser import parse
        from compiler.specialize import is_dynamic

        self.text, self.options, self.name = text, options, name
        self.params = dict(params or {})
        self.module = parse(text, name)
        if options.entry not in self.module:
            raise GCError(f"no function @{options.entry} in {name}")
        f = self.module[options.entry]
        if not is_dynamic(f):
            raise GCError(f"@{f.name} has no ? sizes: compile it as a static model")
        self.func = f
        from compiler.specialize import runtime_args

        self.runtime = runtime_args(f)  # the arguments whose values attributes take: a model per value too
        self._set_params(self.params)
        self.source = text
        self.compile_seconds: float | None = None
        self.from_cache = False
        self._models: dict[tuple, object] = {}
        self._lock = threading.Lock()
        # One kernel for every size (codegen/symbolic.py): the module with named sizes after the graph
        # passes, one per set of their size-dependent choices (made at the first size that needs it: all of
        # them in a loaded artifact), and the kernels built so far.
        # (`symbolic`: the first graph and its choices; False: none can be made; None: not tried yet.)
        self._variants: list[tuple] = [symbolic] if symbolic else []
        self._symbolic = _UNSET if symbolic is None else bool(symbolic)
        self.kernels = None

    def _set_params(self, params: dict[str, np.ndarray]) -> None:
        """The weights bound, and so the data arguments a call takes."""
        self.params = params
        self.arg_names = [a.name for a in self.func.args if a.name not in params]
        self.arg_types = [a.type for a in self.func.args if a.name not in params]
        self._dtypes = [t.dtype.np for t in self.arg_types]

    @property
    def symbolic(self):
        """The symbolized module after the graph passes (the first one made), or None where sizes are
        compiled one by one (a ? that is no expression of the arguments' sizes, attributes taken at run
        time, the GPU)."""
        return self.symbolic_at(None)

    def symbolic_at(self, sizes: dict[str, int] | None):
        """The symbolized module whose graph passes chose by size as they would at `sizes` (its guards
        hold there: ir.SizeChoices), made now where none does; None where there is none."""
        if self._symbolic is False:
            return None
        for module, choices in self._variants:
            if sizes is None or choices.holds(sizes):
                return module
        from compiler import driver
        from compiler.codegen.symbolic import optimized

        module, _ = driver.frontend(self.text, self.name, self.options, self.params or None)
        made = optimized(module, self.options, sizes)
        if made is None:  # (at these sizes: another size may still take an existing graph)
            self._symbolic = bool(self._variants)
            return None
        self._symbolic = True
        self._variants.append(made)
        return made[0]

    @property
    def sizes(self) -> list[tuple]:
        """The argument shapes compiled so far (the data arguments', in order)."""
        return [shapes for shapes, _ in self._models]

    def model_for(self, shapes: list[tuple[int, ...]], values: dict[str, np.ndarray] | None = None):
        """The static CompiledModel of these data argument shapes (and values of the arguments that
        attributes take), compiled at the first request."""
        from compiler.specialize import value_key

        key = (tuple(tuple(int(d) for d in s) for s in shapes), value_key(values, self.runtime))
        model = self._models.get(key)
        if model is None:
            with self._lock:
                model = self._models.get(key)
                if model is None:
                    model = self._models[key] = self._compile(key)
        return model

    def _compile(self, key: tuple):
        from compiler import driver
        from compiler.specialize import specialize_module

        by_name = dict(zip(self.arg_names, key[0]))
        shapes = [by_name[a.name] if a.name in by_name else self.params[a.name].shape for a in self.func.args]
        values = {name: np.array(elems, dtype) for name, dtype, elems in key[1]}
        # (Its errors are the diagnostics of sizes that do not fit, naming the argument and dimension.)
        static = specialize_module(self.module, self.options.entry, shapes, values)
        if self._symbolic is not False:
            model = self._build_symbolic(shapes)
            if model is not None:
                return model
        # The module itself, not its text parsed again (DistilBERT: 0.9 s of a size's first call); its ops
        # keep their locations in the source.
        return driver.compile(static, self.options, params=self.params or None, name=self.name)

    def warm(self, size: int = 2) -> bool:
        """Build the kernels at the size where every named size is `size` (what `gc compile` does, so that
        the artifact carries them and its other sizes build nothing); False where there is nothing to
        build ahead (no symbolic module) or that size does not fit the function."""
        from compiler.codegen.symbolic import named_shapes
        from compiler.ir import Sym

        if self._symbolic is False:
            return False
        shapes = [s for a, s in zip(self.func.args, named_shapes(self.func)) if a.name not in self.params]
        names = {n: size for s in shapes for d in s if isinstance(d, Sym) for n in d.symbols()}
        try:
            self.model_for([tuple(d.evaluate(names) if isinstance(d, Sym) else int(d) for d in s) for s in shapes])
        except GCError:
            return False
        return self._symbolic is True

    def _build_symbolic(self, shapes: list[tuple[int, ...]]):
        """The model at these sizes from the symbolic module: a memory plan, and the kernels an earlier
        size built where they are the same (codegen/symbolic.py); None where there is no symbolic module."""
        import time

        from compiler.codegen.build import KernelStore, build
        from compiler.codegen.symbolic import instantiate, named_shapes
        from compiler.codegen.target import make_target

        t0 = time.perf_counter()
        target = self.options.target
        if self.kernels is None:
            self.kernels = KernelStore(target, make_target(target, self.options.arch), symbolic=True)
        entry = self.options.entry
        before = self.kernels.built_functions
        args = zip(self.func.args, named_shapes(self.func))
        sizes = bind_sizes([(a.name, shape, a.loc) for a, shape in args], shapes)  # (checked: specialize)
        symbolic = self.symbolic_at(sizes)
        if symbolic is None:
            return None
        model = build(instantiate(symbolic, sizes), target, entry=entry, arch=self.options.arch,
                      concurrent=self.options.concurrent, kernels=self.kernels)
        model.source = self.source
        model.compile_seconds = time.perf_counter() - t0
        model.built_functions = self.kernels.built_functions - before
        return model

    def _bind(self, args, kwargs) -> list[np.ndarray]:
        from compiler.interpreter import bind_inputs
        from compiler.ir import Func

        data = Func(self.func.name, [a for a in self.func.args if a.name not in self.params], [])
        if args and kwargs:
            raise GCError("pass the inputs either by position or by name, not both")
        return bind_inputs(data, dict(kwargs) if kwargs else list(args))

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        if not kwargs and len(args) == len(self._dtypes) and all(
                type(x) is np.ndarray and x.dtype == d and fits(t.shape, x.shape)
                for x, d, t in zip(args, self._dtypes, self.arg_types)):
            model = self._models.get((tuple(x.shape for x in args), ()))  # the common case: 16 -> 3 us a call
            if model is not None:
                return model(*args)
        model, inputs = self._resolve(args, kwargs)
        return model(*inputs)

    def run_into(self, outputs: list[np.ndarray], *args, **kwargs) -> list[np.ndarray]:
        model, inputs = self._resolve(args, kwargs)
        return model.run_into(outputs, *inputs)

    def profile(self, *args, **kwargs):
        model, inputs = self._resolve(args, {k: v for k, v in kwargs.items() if k in self.arg_names})
        return model.profile(*inputs, **{k: v for k, v in kwargs.items() if k not in self.arg_names})

    def _resolve(self, args, kwargs) -> tuple:
        """(the static model of these inputs' sizes, the inputs checked and cast)."""
        inputs = self._bind(args, kwargs)
        values = {n: x for n, x in [*zip(self.arg_names, inputs), *self.params.items()] if n in self.runtime}
        return self.model_for([x.shape for x in inputs], values), inputs

    @property
    def plan(self):
        """The plan of the one size compiled so far (a dynamic model has one per size)."""
        if len(self._models) != 1:
            raise GCError(f"a model with ? sizes has a plan per size; {len(self._models)} compiled so far")
        return next(iter(self._models.values())).plan

    # -- the artifact --

    def save(self, path: str | Path) -> None:
        """Write the model, and every size compiled so far, as one zip at `path`, atomically."""
        from compiler.codegen import artifact
        from compiler.codegen.artifact import DYNAMIC_FORMAT, write_members
        from compiler.files import check_writable

        check_writable(path)
        members: dict = {"source.gir": self.text.encode()}
        # Every array once: the weights as given and each size's constants (sizes share prepacked weights).
        pool = artifact.ArrayPool()
        members["params.json"] = json.dumps({n: pool.add(a) for n, a in self.params.items()}).encode()
        sizes, values = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for i, ((shapes, vkey), model) in enumerate(self._models.items()):
                p = Path(tmp) / f"{i}.gcpkg"
                artifact.save(model, p, pool=pool)
                members[f"size-{i}.gcpkg"] = p.read_bytes()
                sizes.append([list(s) for s in shapes])
                values.append([[n, d, list(e)] for n, d, e in vkey])
        members["consts.npz"] = lambda fh: artifact.write_npz(fh, pool.arrays)
        members["dynamic.json"] = json.dumps({"options": asdict(self.options), "name": self.name,
                                              "sizes": sizes, "values": values}).encode()
        store = self.kernels.to_json() if self.kernels is not None else None
        if store is not None:  # the kernels built so far, so that the loaded model's new sizes build none again
            objects = [o for _, objs in self.kernels.libraries for o in objs]
            members["kernels.json"] = json.dumps({**store, "objects": len(objects)}).encode()
            members.update({f"objects-{i}.o": o for i, o in enumerate(objects)})
        write_members(path, DYNAMIC_FORMAT, members, stored=set(members))

    @staticmethod
    def load(path: str | Path, members: dict[str, bytes]) -> DynamicModel:
        """The model of an artifact whose checked members (name -> bytes) are given (artifact.load reads
        and checks the zip): its source is parsed and verified as any GIR, its weights must fit."""
        from compiler import driver
        from compiler.codegen import artifact

        try:
            meta = json.loads(members["dynamic.json"])
            options = driver.Options(**meta["options"])
            with np.load(io.BytesIO(members["consts.npz"]), allow_pickle=False) as z:
                pool = {k: z[k] for k in z.files}
            params = {n: pool[k] for n, k in json.loads(members["params.json"]).items()}
            sizes = [tuple(tuple(int(d) for d in s) for s in key) for key in meta["sizes"]]
            # The values of the arguments that attributes take, per size (none before those existed).
            values = [tuple((str(n), str(np.dtype(d)), tuple(e)) for n, d, e in v)
                      for v in meta.get("values", [[] for _ in sizes])]
            if len(values) != len(sizes):
                raise ValueError("one list of values per size")
        except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError, zipfile.BadZipFile) as e:
            raise GCError(f"{path}: a damaged dynamic artifact ({type(e).__name__}: {e})") from None
        try:
            text = members["source.gir"].decode("utf-8")
        except UnicodeDecodeError:
            raise GCError(f"{path}: source.gir is not UTF-8 text") from None
        model = DynamicModel(text, options, None, str(meta.get("name", path)))
        driver.bind_params(model.module.clone(), options.entry, params)  # names, shapes and dtypes checked
        model._set_params(params)
        objects = [members[n] for n in sorted((n for n in members if n.startswith("objects-")), key=_number)]
        kernels = {"kernels.json"} if "kernels.json" in members else set()
        if set(members) != {"source.gir", "dynamic.json", "params.json", "consts.npz", *kernels,
                            *(f"size-{i}.gcpkg" for i in range(len(sizes))), *(f"objects-{i}.o" for i in range(len(objects)))}:
            raise GCError(f"{path}: its sizes and its size-<i>.gcpkg members differ, or its objects-<i>.o and "
                          "kernels.json")
        with tempfile.TemporaryDirectory() as tmp:
            for i, (key, vkey) in enumerate(zip(sizes, values)):
                if [n for n, _, _ in vkey] != model.runtime:
                    raise GCError(f"{path}: size-{i}'s values are not those of the arguments its attributes take")
                p = Path(tmp) / f"{i}.gcpkg"
                p.write_bytes(members[f"size-{i}.gcpkg"])
                model._models[(key, vkey)] = artifact.load(p, pool)
        if kernels and options.target == "llvm" and not any(m.unavailable for m in model._models.values()):
            from compiler.codegen.build import KernelStore
            from compiler.codegen.target import make_target

            store = KernelStore("llvm", make_target("llvm"), symbolic=True)
            try:
                data = json.loads(members["kernels.json"])
                if data["objects"] != len(objects):
                    raise ValueError("its object files are not those kernels.json counts")
                store.restore(data, objects)
            except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as e:
                raise GCError(f"{path}: a damaged kernels.json ({type(e).__name__}: {e})") from None
            model.kernels = store
        return model
