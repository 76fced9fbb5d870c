"""The `exec` dialect: the kernel calls of a planned function, in order, on streams.

A launch names a kernel function (a `kernel` function made by `fuse`, or one op outlined by
`plan-memory`), takes its inputs followed by one destination buffer per result, writes the results
there and returns them (destination-passing style, as MLIR's `outs`): readers use the returned value,
so data dependences stay explicit while the memory each result occupies is the destination's.

    %t1 = exec.launch(%x, %w, %b, %t0) {kernel = @fused_matmul_add_relu} : tensor<64x1024xf32>

`assign-streams` puts launches on streams and orders them across streams with events:
`exec.signal {event = 0, stream = 1}` after a producer, `exec.wait {event = 0, stream = 0}` before a
consumer on another stream. Printed order is one valid serial order; the interpreter runs it so.
"""

from __future__ import annotations

import numpy as np

from compiler.interpreter import run_func
from compiler.ir import Dialect, Func, Module, Op, SymbolRef, TensorType, attribute, operand


class Launch(Op, name="exec.launch"):
    """Run a kernel into destinations:  %y = exec.launch(%x, %dst) {kernel = @relu} : tensor<4xf32>"""

    pure = False
    args = operand(variadic=True, doc="the kernel's inputs, then one destination per result")
    kernel = attribute(SymbolRef)
    stream = attribute(int, 0, doc="the stream it runs on (assign-streams)")

    def called(self) -> SymbolRef:
        return self.kernel

    @classmethod
    def check_operand_count(cls, n: int, loc) -> None:
        pass  # checked against the kernel in verify_symbols

    def infer(self, args: list[TensorType]) -> tuple[TensorType, ...]:
        types = [r.type for r in getattr(self, "results", [None])]
        if any(t is None for t in types):
            raise self.error("write the result types; they are the destinations' types")
        if len(types) > len(args):
            raise self.error(f"{len(types)} result(s) need as many destination operands, got {len(args)} operand(s)")
        for i, (t, d) in enumerate(zip(types, args[len(args) - len(types) :])):
            if t != d:
                raise self.error(f"result #{i} has type {t} but its destination operand has type {d}")
        if self.stream < 0:
            raise self.error(f"stream must be non-negative, got {self.stream}")
        return tuple(types)

    @property
    def inputs(self) -> list:
        return self.operands[: len(self.operands) - len(self.results)]

    @property
    def destinations(self) -> list:
        return self.operands[len(self.operands) - len(self.results) :]

    def lookup(self, module: Module) -> Func:
        name = self.kernel.name
        if name not in module:
            raise self.error(f"unknown kernel @{name}")
        return module[name]

    def verify_symbols(self, module: Module) -> None:
        f = self.lookup(module)
        ins = self.inputs
        if len(ins) != len(f.args):
            raise self.error(f"@{f.name} takes {len(f.args)} input(s), got {len(ins)} (operands are the inputs, "
                             f"then {len(self.results)} destination(s))")
        for i, (v, a) in enumerate(zip(ins, f.args)):
            if v.type != a.type:
                raise self.error(f"operand #{i} has type {v.type} but @{f.name} expects {a.type} for %{a.name}")
        if [r.type for r in self.results] != list(f.result_types):
            want = ", ".join(map(str, f.result_types))
            raise self.error(f"@{f.name} returns ({want}), but the launch writes "
                             f"({', '.join(str(r.type) for r in self.results)})")

    def interpret(self, module: Module, arrays: list[np.ndarray]) -> list[np.ndarray]:
        n = len(arrays) - len(self.results)
        outs = run_func(module, self.lookup(module), list(arrays[:n]))
        for dst, out in zip(arrays[n:], outs):
            np.copyto(dst, out)
        return list(arrays[n:])

    def flops(self) -> int:
        return 0


class Copy(Op, name="exec.copy"):
    """Copy a tensor into a destination (a result that is an argument or a constant):
    %r = exec.copy(%x, %dst) : tensor<4xf32>"""

    pure = False
    source = operand()
    dest = operand()
    stream = attribute(int, 0)

    def infer(self, source: TensorType, dest: TensorType) -> TensorType:
        if source != dest:
            raise self.error(f"source {source} and destination {dest} differ")
        return dest

    def interpret(self, module: Module, arrays: list[np.ndarray]) -> list[np.ndarray]:
        np.copyto(arrays[1], arrays[0])
        return [arrays[1]]

    def flops(self) -> int:
        return 0


class _Event(Op):
    pure = False
    event = attribute(int)
    stream = attribute(int)

    def infer(self) -> tuple:
        if self.event < 0 or self.stream < 0:
            raise self.error("event and stream are non-negative")
        return ()

    def interpret(self, module: Module, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return []  # the printed order is already a valid serial order

    def flops(self) -> int:
        return 0


class Signal(_Event, name="exec.signal"):
    """Mark that everything queued on `stream` so far is done:  exec.signal {event = 0, stream = 1}"""


class Wait(_Event, name="exec.wait"):
    """Make `stream` wait for an event before its next launch:  exec.wait {event = 0, stream = 0}"""


OPS = [Launch, Copy, Signal, Wait]
EXEC = Dialect("exec", OPS)
