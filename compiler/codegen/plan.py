"""The runtime plan: what a compiled model runs, typed. `build()` makes it from the planned IR, the artifact
stores it as plan.json (`to_json`) and reads it back only after checking it (`artifact.check_plan`, then
`Plan.from_json`), and the runtime, the profiler and the CLI read its fields.

A plan is a list of buffers (slots) and a list of steps over them: kernel calls, copies and stream events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from compiler.ir import DType

# The keys of a buffer's JSON beside kind, shape and dtype, by kind (a bordered buffer in an arena adds
# "arena" and "offset"; any buffer stored channel-blocked adds "layout").
_KEYS = {"arg": ("index", "name"), "const": ("name",), "temp": (), "arena": ("size", "align"),
         "view": ("arena", "offset"), "bordered": ("pads",), "whole": ("of",)}


@dataclass(frozen=True)
class Arg:
    """An argument of the entry function, as the caller passes it."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Buffer:
    """One slot of the plan. `kind`: an argument (`index`), a constant (`name` in consts.npz), a buffer of
    its own (`temp`), an arena (`size`, `align`), a view of an arena (`arena`'s slot, `offset` bytes), the
    interior of a zero-bordered buffer (`pads`; in an arena at `offset`, or a buffer of its own), or that
    bordered buffer whole (`of`: its interior's slot). `layout` is "NCHW16c" and the like where the
    tensor is stored channel-blocked (its `shape` then 5-D)."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    index: int = -1
    name: str = ""
    size: int = 0
    align: int = 0
    arena: int = -1
    offset: int = 0
    pads: tuple[int, ...] = ()
    of: int = -1
    layout: str = ""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DType(self.dtype).itemsize

    @property
    def in_arena(self) -> bool:
        return self.arena >= 0

    def to_json(self) -> dict:
        if self.kind == "whole":  # (the key order plan.json has always had)
            return {"kind": "whole", "of": self.of, "shape": list(self.shape), "dtype": self.dtype}
        out: dict = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype}
        for key in _KEYS[self.kind]:
            value = getattr(self, key)
            out[key] = list(value) if isinstance(value, tuple) else value
        if self.kind == "bordered" and self.in_arena:
            out.update(arena=self.arena, offset=self.offset)
        if self.layout:
            out["layout"] = self.layout
        return out

    @classmethod
    def from_json(cls, d: dict) -> Buffer:
        extra = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in _BUFFER_EXTRAS}
        return cls(d["kind"], tuple(d["shape"]), d["dtype"], **extra)


@dataclass(frozen=True)
class Step:
    """One step, on `stream`: a kernel call (`kernel` over the slots `buffers`, inputs first; `ops`,
    `schedule`, `flops`, `bytes` and `loc` describe it for the profiler), a copy (`copy`: from, to), or an
    event (`signal` or `wait`)."""

    stream: int = 0
    kernel: str = ""
    buffers: tuple[int, ...] = ()
    copy: tuple[int, int] | None = None
    signal: int | None = None
    wait: int | None = None
    ops: tuple[str, ...] = ()
    schedule: str = ""
    flops: int = 0
    bytes: int = 0
    loc: str = ""

    def to_json(self) -> dict:
        if self.kernel:
            return {"kernel": self.kernel, "stream": self.stream, "buffers": list(self.buffers), "ops": list(self.ops),
                    "schedule": self.schedule, "flops": self.flops, "bytes": self.bytes, "loc": self.loc}
        if self.copy is not None:
            return {"copy": list(self.copy), "stream": self.stream}
        key = "signal" if self.signal is not None else "wait"
        return {key: getattr(self, key), "stream": self.stream}

    @classmethod
    def from_json(cls, d: dict) -> Step:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in _STEP_KEYS})


_BUFFER_EXTRAS = {f.name for f in fields(Buffer)} - {"kind", "shape", "dtype"}
_STEP_KEYS = {f.name for f in fields(Step)}


@dataclass
class Plan:
    """The entry function as steps over buffers. `signatures`: each kernel's [shape, dtype, strides or
    None] per parameter, which every call is checked against (the CPU kernels check nothing themselves);
    `memory`: the plan's figures (compiler.memory.plan_stats); `unaligned_inputs`: every kernel takes
    inputs at any alignment, so a call passes the caller's arrays without copying them."""

    entry: str
    args: list[Arg]
    buffers: list[Buffer]
    steps: list[Step]
    results: list[int]
    result_types: list[str]
    memory: dict[str, int] = field(default_factory=dict)
    signatures: dict[str, list] = field(default_factory=dict)
    unaligned_inputs: bool = False

    @property
    def kernel_steps(self) -> list[Step]:
        return [s for s in self.steps if s.kernel]

    def to_json(self) -> dict:
        return {"entry": self.entry, "memory": dict(self.memory),
                "args": [{"name": a.name, "shape": list(a.shape), "dtype": a.dtype} for a in self.args],
                "buffers": [b.to_json() for b in self.buffers], "calls": [s.to_json() for s in self.steps],
                "results": list(self.results), "result_types": list(self.result_types),
                "signatures": self.signatures, "unaligned_inputs": self.unaligned_inputs}

    @classmethod
    def from_json(cls, d: dict) -> Plan:
        """A plan from plan.json that `artifact.check_plan` has accepted."""
        return cls(d["entry"], [Arg(a["name"], tuple(a["shape"]), a["dtype"]) for a in d["args"]],
                   [Buffer.from_json(b) for b in d["buffers"]], [Step.from_json(c) for c in d["calls"]],
                   list(d["results"]), list(d["result_types"]), dict(d.get("memory", {})),
                   dict(d.get("signatures", {})), bool(d.get("unaligned_inputs")))
