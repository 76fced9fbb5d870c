"""Dialects: one package per dialect. Importing this registers every op.

graph: the network as written (the v1 op set). mem: where tensors live once memory is planned.
exec: the kernel launches of a planned function, on streams.
"""

from dialects import exec, graph, mem  # noqa: F401
