"""`gc viz`: a function's dataflow graph through Graphviz.

A node per op (its name without the dialect, its result types), one per argument and one for the return;
each edge carries the type of the value it moves. A call of a function marked `kernel = true` (what
`fuse` makes) is drawn as a box named after the kernel, holding the callee's ops: edges run straight
from the producers outside to the ops inside that read them, and from the ops inside that make the
kernel's results to their users outside. Other calls are one node.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path

import graphviz

from compiler.diagnostics import GCError
from compiler.files import write_atomic
from compiler.ir import Func, Module, Op, TensorType, Value

# Fill colours by fusion kind, so the fusable chains and the heavy ops stand out.
_COLOURS = {
    "elementwise": "#d9f2d9",
    "broadcast": "#d9f2d9",
    "injective": "#fff5cc",
    "reduction": "#ffe0cc",
    "out-elementwise-fusable": "#cce0ff",
    "opaque": "#e6e6e6",
    "constant": "#ffffff",
}
_NO_DOT = ("needs the Graphviz 'dot' program, which is not on PATH: install Graphviz (apt install graphviz, "
           "brew install graphviz) or write .dot source instead")
FORMATS = {".dot": "dot source", ".gv": "dot source", ".svg": "SVG", ".png": "PNG", ".pdf": "PDF",
           ".html": "an HTML page embedding the SVG"}


def to_dot(module: Module, entry: str = "main") -> graphviz.Digraph:
    """The dataflow graph of `module`'s function `entry`."""
    if entry not in module:
        names = ", ".join("@" + n for n in module.funcs) or "none"
        raise GCError(f"no function @{entry} in the module (functions: {names})")
    f = module[entry]
    g = graphviz.Digraph(name=f.name, graph_attr={"rankdir": "TB", "label": f"@{f.name}", "labelloc": "t"},
                         node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Helvetica",
                                    "fontsize": "11"},
                         edge_attr={"fontname": "Helvetica", "fontsize": "9"})
    env: dict[Value, str] = {}
    for i, a in enumerate(f.args):
        env[a] = f"arg{i}"
        g.node(f"arg{i}", f"%{a.name}\\n{_short(a.type)}", shape="ellipse", fillcolor="#f2f2f2")
    drawer = _Drawer(module)
    drawer.func(g, f, env, prefix="")
    g.node("return", "return", shape="doublecircle", fillcolor="#f2f2f2", fontsize="9")
    drawer.edges += [(env[v], "return", str(v.type)) for v in f.results]
    # Edges go in the top graph: an edge written inside a cluster would pull both its ends into the box.
    for tail, head, label in drawer.edges:
        g.edge(tail, head, label=label)
    return g


class _Drawer:
    """Adds a function's ops to a graph and collects its edges; `env` maps each value to the node making it."""

    def __init__(self, module: Module):
        self.module = module
        self.clusters = 0
        self.edges: list[tuple[str, str, str]] = []

    def func(self, g: graphviz.Digraph, f: Func, env: dict[Value, str], prefix: str) -> None:
        for i, op in enumerate(f.ops):
            callee = self._kernel(op)
            if callee is not None:
                self.kernel(g, op, callee, env, prefix=f"{prefix}k{i}_")
                continue
            node = f"{prefix}op{i}"
            g.node(node, _label(op), fillcolor=_COLOURS.get(op.kind, "#ffffff"), tooltip=_where(op))
            self.edges += [(env[v], node, str(v.type)) for v in op.operands]
            for r in op.results:
                env[r] = node

    def kernel(self, g: graphviz.Digraph, op: Op, callee: Func, env: dict[Value, str], prefix: str) -> None:
        """The callee's ops inside a cluster; its arguments stand for the call's operands."""
        self.clusters += 1
        inner = dict(zip(callee.args, (env[v] for v in op.operands)))
        # The "cluster" prefix is what makes Graphviz draw a subgraph as a box.
        with g.subgraph(name=f"cluster_{self.clusters}_{callee.name}") as c:
            c.attr(label=f"@{callee.name}", style="rounded,dashed", color="#5577aa", fontname="Helvetica",
                   fontsize="10", tooltip=_where(op))
            self.func(c, callee, inner, prefix)
        for r, v in zip(op.results, callee.results):
            env[r] = inner[v]

    def _kernel(self, op: Op) -> Func | None:
        if op.called() is None:
            return None
        callee = self.module.funcs.get(op.called().name)
        return callee if callee is not None and callee.attrs.get("kernel") is True else None


def _label(op: Op) -> str:
    name = op.name.split(".", 1)[1] if "." in op.name else op.name
    if op.called() is not None:
        name += f" @{op.called().name}"
    return "\\n".join([name, *(_short(r.type) for r in op.results)])


def _short(t: TensorType) -> str:
    """`tensor<64x10xf32>` as `64x10xf32`: the node says it is a tensor already."""
    return str(t)[len("tensor<") : -1]


def _where(op: Op) -> str:
    return ", ".join(str(loc) for loc in op.loc.all()) if op.loc else op.name


def check_output(path: str) -> str:
    """The format `path`'s extension names (see FORMATS), or an error saying why it cannot be written."""
    ext = Path(path).suffix.lower()
    if ext not in FORMATS:
        known = ", ".join(FORMATS)
        raise GCError(f"cannot write {path}: unknown extension '{ext or '(none)'}'; use one of {known}")
    if ext not in (".dot", ".gv") and shutil.which("dot") is None:
        raise GCError(f"writing {path} {_NO_DOT}")
    return ext


def write(graph: graphviz.Digraph, path: str, title: str = "", notes: str = "") -> None:
    """Write `graph` to `path` in the format its extension names; an .html page shows `notes` above it."""
    ext = check_output(path)
    if ext in (".dot", ".gv"):
        _save(path, graph.source)
    elif ext == ".html":
        _save(path, _page(render(graph, "svg").decode(), title or graph.name, notes))
    else:
        _save(path, render(graph, ext[1:]))


def render(graph: graphviz.Digraph, fmt: str) -> bytes:
    """`graph` laid out by Graphviz's `dot` program in format `fmt` (svg, png, pdf)."""
    try:
        return graph.pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise GCError(f"rendering {fmt.upper()} {_NO_DOT}") from None
    except (graphviz.CalledProcessError, subprocess.SubprocessError, OSError) as e:
        raise GCError(f"Graphviz 'dot' failed to render {fmt.upper()}: {e}") from None


def _page(svg: str, title: str, notes: str) -> str:
    # dot's SVG starts with an XML prologue and DOCTYPE, which do not belong inside an HTML body.
    body = svg[svg.find("<svg") :] if "<svg" in svg else svg
    pre = f"<pre>{html.escape(notes)}</pre>\n" if notes else ""
    return (f"<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n<title>{html.escape(title)}</title>\n"
            "<style>body { font-family: Helvetica, sans-serif; } svg { max-width: 100%; height: auto; }</style>\n"
            f"</head>\n<body>\n<h1>{html.escape(title)}</h1>\n{pre}{body}\n</body>\n</html>\n")


def _save(path: str, data: str | bytes) -> None:
    write_atomic(path, data)
