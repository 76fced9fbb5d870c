"""Code generation through TVM: graph kernels -> TE -> scheduled PrimFuncs -> LLVM (CPU) or CUDA.

TVM's CPU thread pool defaults to half the cores on x86 (it assumes SMT); gc uses them all, which
must be said before TVM is imported.

TVM's FFI imports torch eagerly where it is installed: 1.5 s added to every gc command, and a Ctrl-C
during torch's C++ initialisation aborts the process (SIGABRT, not exit 130). gc hands TVM NumPy arrays
only, so TVM is imported with torch hidden, unless the process has imported torch already; torch can be
imported normally afterwards. TVM itself (0.6 s) is imported where it is first used, not with this
package: a compile answered from the cache, or reading an artifact's plan, never needs it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

from compiler.codegen.target import num_cores

os.environ.setdefault("TVM_NUM_THREADS", str(num_cores()))


class _TorchHiddenFromTVM(importlib.abc.MetaPathFinder):
    """`import tvm` or `import tvm_ffi` (the one that imports torch), whichever comes first, runs with
    `import torch` failing, unless torch is imported already (see above). While it runs (about 0.6 s, at the
    first compile or load) another thread's first `import torch` fails too, as it did when this package
    imported TVM itself."""

    def find_spec(self, name, path=None, target=None):
        if name not in ("tvm", "tvm_ffi") or "torch" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            hide = "torch" not in sys.modules
            if hide:
                sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
            try:
                run(module)
            finally:
                if hide and sys.modules.get("torch", 0) is None:
                    del sys.modules["torch"]

        spec.loader.exec_module = exec_module
        return spec


if "tvm" not in sys.modules and not any(isinstance(f, _TorchHiddenFromTVM) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchHiddenFromTVM())
