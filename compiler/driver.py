"""compile(): the one path from GIR to a compiled model, for `gc compile` and `compiler.compile` alike.

    GIR text -----------------------------------------------------------> cache.key --hit--> the artifact
      -> parse                                    (compiler/parser.py)
      -> bind the weights given as constants      (bind_params)
      -> keep @entry and what it calls            (keep_reachable)
      -> the graph pipeline: fold, CSE, fuse ...  (pipeline.PIPELINES["compile-<target>"])
      -> plan memory, lower, schedule and build every kernel, the runtime plan   (codegen/build.py)
      -> CompiledModel ---------------------------------------------------> cache.store

`gc compile --emit gir|plan` stops after the graph pipeline (or the memory plan) and prints the module.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from compiler import cache
from compiler.diagnostics import GCError
from compiler.ir import Module, Value, known
from compiler.parser import parse
from compiler.pipeline import PIPELINES, run_pipeline
from compiler.printer import print_module
from compiler.specialize import bind_values, has_runtime_attrs, is_dynamic


@dataclass(frozen=True)
class Options:
    """What a compile depends on besides the module and its weights (each is part of the cache key)."""

    target: str = "llvm"
    entry: str = "main"
    pipeline: str | None = None  # the graph passes; None: PIPELINES["compile-<target>"]
    arch: str | None = None  # cuda: the GPU architecture (default: the GPU's)
    concurrent: bool = False  # cuda: a memory plan where independent branches never wait on each other

    @property
    def passes(self) -> str:
        return PIPELINES[f"compile-{self.target}"] if self.pipeline is None else self.pipeline


def compile(source: str | Module, options: Options = Options(), *, params: dict[str, np.ndarray] | None = None,
            name: str = "<text>", use_cache: bool | None = None):
    """A CompiledModel of `source` (GIR text, or a Module, which is not modified). `name` is the file
    diagnostics point into. `use_cache`: None follows GC_CACHE (on unless it says off)."""
    from compiler.codegen.build import build

    t0 = time.perf_counter()
    text = source if isinstance(source, str) else print_module(source)
    use_cache = cache.enabled() if use_cache is None else use_cache
    k = cache.key(text, params, asdict(options)) if use_cache else None
    model = cache.lookup(k) if k else None
    if model is not None:
        model.compile_seconds = time.perf_counter() - t0
        model.from_cache = True
        return model
    module, model_source = frontend(source, name, options, params)
    if is_dynamic(module[options.entry]):  # `?` sizes: one model for every size (codegen/dynamic.py)
        from compiler.codegen.dynamic import DynamicModel
        from compiler.codegen.symbolic import optimized

        # One kernel for every size where every size is an expression of the arguments' (codegen/symbolic.py).
        symbolic = optimized(module, options)
        if symbolic is None and not has_runtime_attrs(module[options.entry]):  # (passes need every attribute's value)
            optimize(module, options)  # the graph passes' own diagnostics now, not at the first call
        model = DynamicModel(model_source, options, params, name, symbolic=symbolic or False)
        model.compile_seconds = time.perf_counter() - t0
        return model
    optimize(module, options)
    model = build(module, options.target, entry=options.entry, arch=options.arch, concurrent=options.concurrent)
    model.source = model_source
    model.compile_seconds = time.perf_counter() - t0
    if k:
        cache.store(k, model)
    return model


def frontend(source: str | Module, name: str, options: Options,
             params: dict[str, np.ndarray] | None) -> tuple[Module, str]:
    """The module to optimize: parsed (or a copy of the Module given), weights bound, @entry's call graph;
    and the module's text before any of that (the artifact's source.gir): the text given, so that a dynamic
    model's diagnostics at a call point into the user's own lines, or a Module as printed."""
    module = source.clone() if isinstance(source, Module) else parse(source, name)
    if options.entry not in module:
        raise GCError(f"no function @{options.entry} in {name}")
    printed = source if isinstance(source, str) else print_module(module)
    if params:
        bind_params(module, options.entry, params)
    keep_reachable(module, options.entry)
    return module, printed


def optimize(module: Module, options: Options) -> None:
    """The graph pipeline the compile runs before planning memory."""
    run_pipeline(module, options.passes)


def load_source(source: str | Path | Module) -> tuple[str | Module, str]:
    """(text or Module, the name diagnostics use) from a Module, a Path to a .gir file, or GIR text (the
    API's compile() has told a path from text already)."""
    if isinstance(source, Module):
        return source, "<module>"
    if isinstance(source, Path):
        from compiler.parser import read_text

        return read_text(str(source)), str(source)
    return source, "<text>"


def bind_params(module: Module, entry: str, params: dict[str, np.ndarray]) -> None:
    """Arguments named in `params` become constants: weights fixed at compile time, which passes fold."""
    from compiler.builder import bind_arguments
    from compiler.interpreter import bind_inputs

    f = module[entry]
    names = [a.name for a in f.args]
    unknown = [k for k in params if k not in names]
    if unknown:
        raise GCError(f"--params: @{entry} has no argument %{unknown[0]}")
    checked = bind_inputs(f, {a.name: params.get(a.name, _zeros(a)) for a in f.args})  # shapes, dtypes
    bind_values(f, {n: x for n, x in zip(names, checked) if n in params})  # attributes that took them
    bind_arguments(f, {n: x for n, x in zip(names, checked) if n in params})


def _zeros(a: Value) -> np.ndarray:
    return np.zeros(tuple(d if known(d) else 1 for d in a.type.shape), a.type.dtype.np)  # 1 stands for any `?`


def keep_reachable(module: Module, entry: str) -> None:
    """Only @entry and what it calls: the rest is not compiled, so no pass should spend time (or remarks)
    on it."""
    keep, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        for op in module[name].ops:
            ref = op.called()
            if ref is not None and ref.name in module:
                todo.append(ref.name)
    module.funcs = {n: f for n, f in module.funcs.items() if n in keep}
