"""Fast CPU schedule rules, one module per kernel shape: matmul, conv2d, row reductions.

Each rule is `apply(sch) -> bool`: it recognises its kernel from the PrimFunc's blocks, schedules it and
returns True, or returns False (or raises) when the kernel is not its kind; schedule_cpu then falls back.
"""
