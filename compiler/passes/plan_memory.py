"""plan-memory: give every intermediate tensor an offset in one arena, and make the kernel calls explicit.

Input: a graph-level function, usually after `fuse` and `schedule` (its ops run in the order written).
Output: the same function in the `mem`/`exec` dialects:

    %arena = mem.arena {size = 524288} : tensor<524288xi8>
    %0 = mem.view(%arena) {offset = 0} : tensor<64x1024xf32>
    %h = exec.launch(%x, %w1, %b1, %0) {kernel = @fused_matmul_add_relu} : tensor<64x1024xf32>
    %1 = mem.alloc() : tensor<64x10xf32>
    %y = exec.launch(%h, %w2, %b2, %1) {kernel = @fused_matmul_add} : tensor<64x10xf32>
    return %y

- Every op that is not already a call of a `kernel` function is outlined into one (`@relu`), so every
  step is a launch; calls of ordinary functions are inlined first.
- Lifetimes run from the step that writes a tensor to the last step that reads it
  (`compiler.memory.lifetimes`); tensors whose lifetimes do not overlap share bytes. Offsets come from
  best-fit placement over several orders (`compiler.memory.place`), aligned to `align` bytes.
- In place: a kernel made only of elementwise/broadcast ops writes its output over an input of the same
  shape and size that dies at it (each output element reads only that input element, at its own index).
  With `in-place-epilogues` (on in the CPU and CUDA builds), so does a conv or matmul kernel over an
  input only its elementwise epilogue reads: a residual block's output over the block's input, which its `add` reads.
- `conv-borders` (on in the CPU build): a tensor that a kernel's padded conv2d reads as its input
  gets a buffer of its own outside the arena with a zero border as wide as that padding
  (`mem.alloc {pads = [0, 0, 1, 1, 0, 0, 1, 1]}`); its producer writes the interior, and the
  convolution reads the bordered whole in place instead of copying its input padded on every call.
  The border is never written, so it stays zero from one call to the next.
- `borders-in-arena` (on in the CPU build, with `conv-borders`): those tensors are views of the arena,
  placed with their borders like any other tensor (`mem.view {offset = .., pads = [..]}`), so their
  bytes serve other tensors at other times; the kernel that writes such a tensor writes its border's
  zeros as well (a few stores a row: what sharing the bytes costs).
- `concat-views` (on in the CPU build): where a concat's result is its operands laid end to end (one
  image, channels joined: `Op.operand_offsets`), each operand's producer writes straight into its place
  in the concat's bytes, and the concat's launch, left in the plan, copies each operand onto itself:
  the builder drops it (`compiler.memory.copies_nothing`). Every operand must be an intermediate a kernel
  writes, read by that concat alone, at an aligned offset; the concat's result an intermediate of the
  arena (not bordered, not returned).
- Arguments and constants stay where they are; each result gets a buffer of its own (`mem.alloc`) that
  the caller owns, written by the launch that computes it (or `exec.copy` for a returned argument,
  constant, or a value returned twice).
The plan is checked (`compiler.memory.check_plan`) before the pass returns.
Statistics: arena-bytes, naive-bytes (every intermediate its own buffer), lower-bound-bytes, in-place,
bordered-bytes (the zero-bordered buffers, outside the arena; part of arena-bytes), when there are any.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.diagnostics import GCError
from compiler.ir import Func, Module
from compiler.memory import check_plan, is_planned
from compiler.memory.planner import outline_kernels, plan_function
from compiler.memory.strategies import InPlace, conv_borders
from compiler.passes import Pass
from compiler.rewrite import inline_calls


@dataclass
class PlanMemory(Pass):
    name = "plan-memory"
    summary = "one arena for all intermediates (lifetimes, best-fit offsets, in-place); explicit mem/exec IR"
    align: int = field(default=64, metadata={"help": "offset alignment in bytes (64 for CPU, 256 for CUDA)"})
    in_place: bool = field(default=True, metadata={"help": "let elementwise kernels write over a dying input"})
    in_place_epilogues: bool = field(default=False, metadata={
        "help": "let a conv/matmul kernel write over a dying input that only its elementwise epilogue reads"})
    concurrent: bool = field(default=False, metadata={
        "help": "share bytes only between tensors ordered by data dependence, so that independent branches "
                "may run at once (for assign-streams)"})

    concat_views: bool = field(default=False, metadata={
        "help": "let the producers of a concat's operands write into the concat's bytes (no copy)"})
    conv_borders: bool = field(default=False, metadata={
        "help": "give the input of a padded conv2d a zero-bordered buffer of its own, read in place"})
    borders_in_arena: bool = field(default=False, metadata={
        "help": "with conv-borders: place the bordered tensors in the arena, their writers writing the border"})

    def __post_init__(self) -> None:
        if self.align < 1 or self.align & (self.align - 1):
            raise GCError(f"pass 'plan-memory': align must be a power of two, got {self.align}")

    def run(self, module: Module) -> None:
        taken = set(module.funcs)
        todo = [f for f in module if not f.attrs.get("kernel") and not is_planned(f)]
        for f in todo:  # every caller sees its callees as written, before any is planned
            inline_calls(module, f, only=lambda callee: not callee.attrs.get("kernel"))
        order: list[Func] = []
        for f in module:
            order.append(f)
            if f not in todo:
                continue
            kernels = outline_kernels(module, f, taken)
            order += kernels
            borders = conv_borders(module, f) if self.conv_borders else {}
            in_place = InPlace(self.in_place, self.in_place_epilogues)
            views = self.concat_views and not self.concurrent
            stats = plan_function(module, f, self.align, in_place, self.concurrent, borders, views,
                          self.borders_in_arena and not self.concurrent)
            self.stats.update(stats)
        module.funcs = {f.name: f for f in order}
        for f in module:
            if is_planned(f):
                check_plan(module, f)
