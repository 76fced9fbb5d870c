"""gc: a deep-learning compiler for the GIR textual graph IR."""

from compiler.diagnostics import GCError
from compiler.interpreter import run
from compiler.parser import parse, parse_file

__all__ = ["GCError", "parse", "parse_file", "run"]
