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
