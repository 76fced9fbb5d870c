"""gc: a deep-learning compiler for the GIR textual graph IR.

The Python API: `parse`, `parse_file`, `run` (the reference interpreter), `compile` and `load`. A wrong
argument (a type the function does not take, a file that does not exist) raises GCError with a message,
as a wrong input file does; anything else escaping is a bug in gc.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from compiler.diagnostics import GCError

# The parser, the interpreter and TVM load where first used: `import compiler` (and `gc`'s start, where
# a Ctrl-C must already be an interrupt, not a traceback out of lark's imports) stays light.

__version__ = "0.1.0"
TARGETS = ("llvm", "cuda")


def parse(text, filename: str = "<input>", **kwargs):
    """GIR text (str, or UTF-8 bytes) -> a verified Module."""
    from compiler.parser import parse as _parse

    return _parse(_text(text, "parse"), _str(filename, "parse", "filename"), **kwargs)


def parse_file(path):
    """A .gir file -> a verified Module."""
    from compiler.parser import parse_file as _parse_file

    return _parse_file(_path(path, "parse_file"))


def run(module, inputs, entry: str = "main"):
    """Run `entry` of a Module on the reference interpreter; inputs by argument name (a dict) or position."""
    from compiler.interpreter import run as _run
    from compiler.ir import Module

    if not isinstance(module, Module):
        raise GCError(f"run() takes a Module (from parse or parse_file), not {_kind(module)}")
    if not isinstance(inputs, (Mapping, Sequence)) or isinstance(inputs, (str, bytes)):
        raise GCError(f"run() takes the inputs as a dict by argument name or a list by position, not {_kind(inputs)}")
    return _run(module, dict(inputs) if isinstance(inputs, Mapping) else list(inputs), _str(entry, "run", "entry"))


def compile(source, target: str = "llvm", **kwargs):
    """Compile a module (a path, GIR text or a Module) for "llvm" or "cuda": a callable CompiledModel.

    Keyword arguments: params={name: array} binds weights at compile time, entry="main", pipeline=...,
    arch="sm_80" for cuda, concurrent=True for a cuda plan whose branches never wait on each other,
    cache=False to bypass the compile cache (compiler/cache.py; GC_CACHE=off does so everywhere)."""
    from compiler import driver
    from compiler.ir import Module

    unknown = sorted(set(kwargs) - {"params", "entry", "pipeline", "arch", "concurrent", "cache"})
    if unknown:
        raise GCError(f"compile(): unknown keyword argument {unknown[0]!r}")
    if not isinstance(source, Module):
        source = _source(source)
    if target not in TARGETS:
        raise GCError(f"compile(): unknown target {target!r}; targets: {', '.join(TARGETS)}")
    params = kwargs.get("params")
    if params is not None:
        if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
            raise GCError(f"compile(): params is a dict of arrays by argument name, not {_kind(params)}")
    for key in ("entry", "pipeline", "arch"):
        if kwargs.get(key) is not None:
            _str(kwargs[key], "compile", key)
    options = driver.Options(target=target, entry=kwargs.get("entry") or "main", pipeline=kwargs.get("pipeline"),
                             arch=kwargs.get("arch"), concurrent=bool(kwargs.get("concurrent", False)))
    text, name = driver.load_source(source)
    cache = kwargs.get("cache")
    return driver.compile(text, options, params=dict(params) if params else None, name=name,
                          use_cache=None if cache is None else bool(cache))


def load(path):
    """Load a compiled model saved with `model.save(path)` (or `gc compile -o`). A .gcpkg holds native
    code that runs when it loads, as a pickle does: load only artifacts from a source you trust."""
    from compiler.codegen.runtime import CompiledModel

    return CompiledModel.load(_path(path, "load"))


def _source(source):
    """compile()'s source as a path or text: a single line without braces is a path, which must exist."""
    if isinstance(source, bytes):
        return _text(source, "compile")
    if isinstance(source, os.PathLike):
        return _path(source, "compile")
    if not isinstance(source, str):
        raise GCError(f"compile() takes a .gir path, GIR text or a Module, not {_kind(source)}")
    if "\n" in source or "{" in source:
        return source
    return _path(source, "compile")


def _path(path, fn: str):
    from pathlib import Path

    if not isinstance(path, (str, os.PathLike)):
        raise GCError(f"{fn}() takes a path, not {_kind(path)}")
    if not Path(path).is_file():
        raise GCError(f"{fn}(): no such file: {os.fspath(path)}")
    return Path(path)


def _text(text, fn: str) -> str:
    from compiler.parser import decode

    if isinstance(text, bytes):
        return decode(text, "<bytes>")
    if not isinstance(text, str):
        raise GCError(f"{fn}() takes GIR text (str or UTF-8 bytes), not {_kind(text)}")
    return text


def _str(value, fn: str, what: str) -> str:
    if not isinstance(value, str):
        raise GCError(f"{fn}(): {what} is a string, not {_kind(value)}")
    return value


def _kind(x) -> str:
    name = type(x).__name__
    return "None" if x is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


__all__ = ["GCError", "compile", "load", "parse", "parse_file", "run"]
