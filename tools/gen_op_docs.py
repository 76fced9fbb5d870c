"""Write docs/ops.md, the catalog of the `graph`, `mem` and `exec` dialects, from the op classes themselves.

    python tools/gen_op_docs.py          rewrite docs/ops.md
    python tools/gen_op_docs.py --check  exit 1 if docs/ops.md is not what the op classes give
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script, the package need not be installed

from compiler.diagnostics import GCError  # noqa: E402
from compiler.ir import AttrSpec, Op, OperandSpec, format_attr  # noqa: E402
from dialects.exec import EXEC  # noqa: E402
from dialects.graph import GRAPH  # noqa: E402
from dialects.mem import MEM  # noqa: E402

OUT = ROOT / "docs" / "ops.md"

# One heading per module of dialects/graph, in the order the dialect lists its ops.
HEADINGS = {
    "elementwise": "Elementwise",
    "reduce": "Reductions",
    "linalg": "Linear algebra",
    "nn": "Neural-network ops",
    "shape": "Shape ops",
    "creation": "Creation",
    "loss": "Losses",
    "image": "Image sampling",
    "winograd": "Winograd convolution",
    "mem": "The mem dialect (planned memory)",
    "exec": "The exec dialect (kernel launches, streams)",
}

HEADER = """\
# Op catalog: the `graph` dialect, and the `mem` and `exec` dialects of planned functions

Generated from the op classes in `dialects/` by `python tools/gen_op_docs.py`; do not edit it
by hand. The language itself (syntax, types, attribute values, semantics notes) is in [ir.md](ir.md).

Each op lists its operands, its attributes with what each takes and its default (a `required` one
must be written; leaving out one that is `absent by default` has a meaning of its own, given in the
op's docs) and its `kind`, the class fusion sees it as.
"""


def split_doc(op: type[Op]) -> tuple[str, str, str]:
    """An op docstring `meaning:  %y = graph.x(...) : T`, then any further paragraphs, as (meaning, example,
    the rest)."""
    first, _, rest = (op.__doc__ or "").partition("\n\n")
    doc, rest = " ".join(first.split()), " ".join(rest.split())
    m = re.match(r"(.*?):\s+(%.*|(?:mem|exec)\.[a-z_]+ .*)$", doc)
    if m is None:
        return doc, "", rest
    return m.group(1), m.group(2), rest


def describe_operand(op: type[Op], spec: OperandSpec) -> str:
    """`name`, marked optional or variadic, with its doc."""
    text = f"`{spec.name}`"
    if spec.variadic:
        text += " (zero or more)" if _accepts_no_operands(op) else " (one or more)"
    elif spec.optional:
        text += " (optional)"
    return text + (f": {spec.doc}" if spec.doc else "")


def _accepts_no_operands(op: type[Op]) -> bool:
    try:
        op.check_operand_count(0, None)
    except GCError:
        return False
    return True


def describe_attr(spec: AttrSpec) -> str:
    """`name`: what it takes, its choices, then its default, `required` or `absent by default`."""
    text = f"`{spec.name}`: {spec.describe()}"
    if spec.choices:
        text += ", one of " + ", ".join(f"`{format_attr(c)}`" for c in spec.choices)
    if spec.required:
        text += ", required"
    elif spec.default is None:
        text += ", absent by default"
    else:
        text += f", default `{format_attr(spec.default)}`"
    return text + (f" ({spec.doc})" if spec.doc else "")


def render_op(op: type[Op]) -> str:
    """One op's section: meaning, example, operands, attributes, kind."""
    meaning, example, rest = split_doc(op)
    operands = ", ".join(describe_operand(op, s) for s in op.operand_specs) or "none"
    attrs = "".join(f"\n  - {describe_attr(s)}" for s in op.attr_specs.values()) or " none"
    lines = [f"### `{op.name}`", "", meaning]
    if example:
        lines += ["", "```gir", example, "```"]
    if rest:
        lines += ["", rest]
    lines += ["", f"- operands: {operands}", f"- attributes:{attrs}", f"- kind: `{op.kind}`", ""]
    return "\n".join(lines)


def heading(op: type[Op]) -> str:
    """The heading of the module that defines `op` (`nn` -> `Neural-network ops`)."""
    mod = op.__module__.rsplit(".", 1)[-1]
    return HEADINGS.get(mod, mod)


def render() -> str:
    """The whole of docs/ops.md."""
    groups: dict[str, list[type[Op]]] = {}
    for op in [*GRAPH.ops, *MEM.ops, *EXEC.ops]:
        groups.setdefault(heading(op), []).append(op)
    index = ["| group | ops |", "|---|---|"]
    for title, ops in groups.items():
        names = " ".join(f"`{op.name.split('.', 1)[1]}`" for op in ops)
        index.append(f"| [{title}](#{_anchor(title)}) | {names} |")
    parts = [HEADER, "\n".join(index) + "\n"]
    for title, ops in groups.items():
        module = sys.modules[ops[0].__module__]
        summary = " ".join((module.__doc__ or "").split("\n\n")[0].split())
        path = module.__name__.replace(".", "/") + ("/__init__.py" if module.__file__.endswith("__init__.py") else ".py")
        parts.append(f"## {title}\n\n`{path}`: {summary}\n")
        parts += [render_op(op) for op in ops]
    return "\n".join(parts)


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    """Write docs/ops.md, or with --check say whether it is up to date."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/ops.md is stale instead of writing it")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python tools/gen_op_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
