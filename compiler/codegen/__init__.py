"""Code generation through TVM: graph kernels -> TE -> scheduled PrimFuncs -> LLVM (CPU) or CUDA.

TVM's CPU thread pool defaults to half the cores on x86 (it assumes SMT); gc uses them all, which
must be said before TVM is imported.

TVM's FFI imports torch eagerly where it is installed: 1.5 s added to every gc command, and a Ctrl-C
during torch's C++ initialisation aborts the process (SIGABRT, not exit 130). gc hands TVM NumPy arrays
only, so TVM is imported with torch hidden, unless the process has imported torch already; torch can be
imported normally afterwards.
"""

from __future__ import annotations

import os
import sys

from compiler.codegen.target import num_cores

os.environ.setdefault("TVM_NUM_THREADS", str(num_cores()))

if "tvm" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        import tvm  # noqa: F401
    finally:
        del sys.modules["torch"]
