"""Deliberately wrong passes, loaded with `gc opt --load-pass-plugin`, to test the pipeline's debugging aids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir import Dense, Module
from compiler.passes import Pass


@dataclass
class Crash(Pass):
    name = "test-crash"
    summary = "raises, as a buggy pass would"

    def run(self, module: Module) -> None:
        raise ZeroDivisionError("the pass divided by zero")


@dataclass
class BreakTypes(Pass):
    name = "test-break-types"
    summary = "gives the first op's result a wrong type, so verification fails"

    def run(self, module: Module) -> None:
        for f in module:
            for op in f.ops:
                r = op.results[0]
                r.type = r.type.with_shape((*r.type.shape, 1))
                return


@dataclass
class Perturb(Pass):
    name = "test-perturb"
    summary = "adds `amount` to every f32 constant: a numerically wrong rewrite"
    amount: float = 0.5

    def run(self, module: Module) -> None:
        for f in module:
            for op in f.ops:
                if op.name == "graph.constant" and op.value.type.dtype.is_float:
                    op.attrs["value"] = Dense.of(op.value.array + np.float32(self.amount), op.value.type.dtype)
                    self.stats["constants-perturbed"] += 1


@dataclass
class Nothing(Pass):
    name = "test-nothing"
    summary = "changes nothing"

    def run(self, module: Module) -> None:
        pass


@dataclass
class RenameMain(Pass):
    name = "test-rename-main"
    summary = "renames @main: the function the caller asked for is gone"

    def run(self, module: Module) -> None:
        f = module.funcs.pop("main")
        f.name = "renamed"
        module.funcs["renamed"] = f


@dataclass
class DropResult(Pass):
    name = "test-drop-result"
    summary = "returns one result fewer from every function with two or more"

    def run(self, module: Module) -> None:
        for f in module:
            if len(f.results) > 1:
                f.results = f.results[:-1]
                f.result_types = f.result_types[:-1]
