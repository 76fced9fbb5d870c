"""The `graph` dialect: the v1 op set of the GIR contract, each op defined once."""

from compiler.ir import Dialect
from dialects.graph import creation, elementwise, image, linalg, loss, nn, reduce, shape, winograd

GRAPH = Dialect(
    "graph",
    [*elementwise.OPS, *reduce.OPS, *linalg.OPS, *nn.OPS, *shape.OPS, *creation.OPS, *loss.OPS, *winograd.OPS, *image.OPS],
)
