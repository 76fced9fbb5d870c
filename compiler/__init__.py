"""gc: a deep-learning compiler for the GIR textual graph IR."""

from compiler.diagnostics import GCError
from compiler.interpreter import run
from compiler.parser import parse, parse_file

__version__ = "0.1.0"


def compile(source, target: str = "llvm", **kwargs):
    """Compile a module (a path, GIR text or a Module) for "llvm" or "cuda": a callable CompiledModel.

    Keyword arguments: params={name: array} binds weights at compile time, entry="main", pipeline=...,
    arch="sm_80" for cuda."""
    from compiler.codegen.build import compile as build

    return build(source, target, **kwargs)


def load(path):
    """Load a compiled model saved with `model.save(path)` (or `gc compile -o`)."""
    from compiler.codegen.runtime import CompiledModel

    return CompiledModel.load(path)


__all__ = ["GCError", "compile", "load", "parse", "parse_file", "run"]
