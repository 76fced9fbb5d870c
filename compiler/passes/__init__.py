"""Passes: one per file, registered by name. A pass takes verified IR and leaves verified IR.

A pass is a dataclass whose fields are its options (`fuse{max-ops=8}` sets `max_ops`), with a
name, a one-line summary and a `run(module)` that rewrites the module in place and counts what it
did in `self.stats`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections import Counter
from typing import Any, ClassVar, get_type_hints

from compiler.diagnostics import GCError
from compiler.ir import Module

PASSES: dict[str, type[Pass]] = {}


class InputError(GCError):
    """A pass's diagnostic about its input (autodiff of a function that returns no scalar loss): the user's
    mistake, reported like a parse error, where any other exception from a pass is a bug in the pass."""


class Pass:
    """Base of every pass. Subclasses are dataclasses; their fields are the options."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.__dict__.get("name"):
            PASSES[cls.name] = cls

    def run(self, module: Module) -> None:
        raise NotImplementedError

    @property
    def stats(self) -> Counter:
        if "_stats" not in self.__dict__:
            object.__setattr__(self, "_stats", Counter())
        return self.__dict__["_stats"]

    @classmethod
    def options(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else []

    def spelled(self) -> str:
        """The pass as a pipeline element, with the options that differ from their defaults."""
        opts = []
        for f in self.options():
            v = getattr(self, f.name)
            if v != f.default:
                opts.append(f"{f.name.replace('_', '-')}={_format_option(v)}")
        return self.name + ("{" + ",".join(opts) + "}" if opts else "")


def _format_option(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v)
    return str(v)


def load_all() -> dict[str, type[Pass]]:
    """Import every module of this package, so that each pass registers itself."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return PASSES


def make_pass(name: str, options: dict[str, str]) -> Pass:
    """Instantiate a pass from its pipeline spelling, converting each option to the field's type."""
    passes = load_all()
    cls = passes.get(name)
    if cls is None:
        import difflib

        near = difflib.get_close_matches(name, list(passes), 1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        raise GCError(f"unknown pass '{name}'{hint} (see gc opt --list-passes)")
    fields = {f.name.replace("_", "-"): f for f in cls.options()}
    hints = get_type_hints(cls) if fields else {}
    kwargs = {}
    for key, raw in options.items():
        f = fields.get(key)
        if f is None:
            known = ", ".join(fields) or "none"
            raise GCError(f"pass '{name}' has no option '{key}' (options: {known})")
        kwargs[f.name] = _convert(name, key, raw, hints[f.name])
    return cls(**kwargs)


def _convert(pass_name: str, key: str, raw: str, typ) -> Any:
    try:
        if typ is bool:
            if raw not in ("true", "false", "1", "0"):
                raise ValueError
            return raw in ("true", "1")
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if typ is str:
            return raw
        if getattr(typ, "__origin__", None) is tuple:
            return tuple(x.strip() for x in raw.split(",") if x.strip())
    except ValueError:
        pass
    kind = getattr(typ, "__name__", str(typ))
    raise GCError(f"pass '{pass_name}': option '{key}' expects {kind}, got '{raw}'")
