"""Code generation through TVM: graph kernels -> TE -> scheduled PrimFuncs -> LLVM (CPU) or CUDA.

TVM's CPU thread pool defaults to half the cores on x86 (it assumes SMT); gc uses them all, which
must be said before TVM is imported.
"""

from __future__ import annotations

import os

from compiler.codegen.target import num_cores

os.environ.setdefault("TVM_NUM_THREADS", str(num_cores()))
