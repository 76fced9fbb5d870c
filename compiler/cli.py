"""`gc`: the command line. Each subcommand is a small function over the library.

Exit codes: 0 success, 1 a problem with the user's input (diagnostics on stderr), 2 bad usage,
3 an internal compiler error (with how to report it).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import numpy as np

from compiler.diagnostics import GCError

EXAMPLES = """\
examples:
  gc run examples/mlp.gir --random-inputs 0
  gc run net.gir --inputs in.npz --outputs out.npz
  gc opt net.gir
"""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "cmd", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except GCError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception:
        print("gc: internal compiler error (a bug in gc, not in your input):", file=sys.stderr)
        traceback.print_exc()
        print(
            "Please report it with the command line and the input file: "
            "`gc opt FILE --print-debuginfo` helps us find the op.",
            file=sys.stderr,
        )
        return 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gc",
        description="gc: a deep-learning compiler for the GIR textual graph IR.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    r = sub.add_parser("run", help="run a .gir module on inputs and print/save its outputs",
                       description="Run a function of a .gir module. Inputs come from an .npz keyed by "
                       "argument name (without %%) or are made up with --random-inputs; outputs are "
                       "summarised on the terminal and saved with --outputs, keyed result0, result1, ...")
    r.add_argument("file", help="the .gir file")
    r.add_argument("--target", default="interp", choices=["interp", "llvm", "cuda"],
                   help="where to run: interp is the NumPy reference interpreter (default)")
    r.add_argument("--inputs", metavar="IN.npz", help="inputs keyed by argument name")
    r.add_argument("--random-inputs", metavar="SEED", type=int,
                   help="fill every input not in --inputs deterministically from SEED")
    r.add_argument("--outputs", metavar="OUT.npz", help="write the outputs here, keyed result0, result1, ...")
    r.add_argument("--entry", default="main", metavar="NAME", help="the function to run (default: main)")
    r.add_argument("--quiet", action="store_true", help="do not print the output summary")
    r.set_defaults(func=cmd_run)

    o = sub.add_parser("opt", help="parse, verify, transform and print a .gir module",
                       description="Parse and verify a .gir module, run a pass pipeline over it and print "
                       "the result. With no pipeline it prints the module back in canonical form.")
    o.add_argument("file", help="the .gir file, or - for standard input")
    o.add_argument("-p", "--pipeline", default="", metavar="PIPELINE",
                   help='passes to run, e.g. "canonicalize,cse" (none yet: the pass manager is coming)')
    o.add_argument("-o", "--output", metavar="OUT.gir", help="write the module here instead of stdout")
    o.add_argument("--split-input-file", action="store_true",
                   help="treat each chunk between '// -----' lines as its own module")
    o.add_argument("--verify-diagnostics", action="store_true",
                   help="print diagnostics to stdout and exit 0 (for tests of error messages)")
    o.add_argument("--print-debuginfo", action="store_true", help="print each op's source location")
    o.set_defaults(func=cmd_opt)
    return p


def _read(path: str) -> tuple[str, str]:
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(path).read_text(), path
    except (OSError, UnicodeDecodeError) as e:
        raise GCError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _chunks(text: str, split: bool) -> list[tuple[str, int]]:
    """The text, or its '// -----' chunks, each with the line it starts on (for true line numbers)."""
    if not split:
        return [(text, 0)]
    out, cur, start = [], [], 0
    for i, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == "// -----":
            out.append(("".join(cur), start))
            cur, start = [], i + 1
        else:
            cur.append(line)
    out.append(("".join(cur), start))
    return out


def cmd_opt(args) -> int:
    from compiler.parser import parse
    from compiler.printer import print_module

    if args.pipeline.strip():
        raise GCError(f"unknown pass '{args.pipeline.split(',')[0].split('{')[0].strip()}' (no passes are registered yet)")
    text, name = _read(args.file)
    pieces = []
    for chunk, offset in _chunks(text, args.split_input_file):
        try:
            module = parse(chunk, name, line_offset=offset)
            pieces.append(print_module(module, debuginfo=args.print_debuginfo))
        except GCError as e:
            if not args.verify_diagnostics:
                raise
            pieces.append(e.render() + "\n")
    out = "// -----\n".join(pieces)
    if args.output:
        Path(args.output).write_text(out)
    else:
        sys.stdout.write(out)
    return 0


def cmd_run(args) -> int:
    from compiler.inputs import load_npz, random_inputs, summarize
    from compiler.interpreter import bind_inputs, run_func
    from compiler.parser import parse

    text, name = _read(args.file)
    module = parse(text, name)
    if args.entry not in module:
        names = ", ".join("@" + n for n in module.funcs)
        raise GCError(f"no function @{args.entry} in {name} (functions: {names})")
    f = module[args.entry]
    given = load_npz(args.inputs) if args.inputs else {}
    if args.random_inputs is not None:
        made = random_inputs(f, args.random_inputs)
        given = {**{k: v for k, v in made.items() if k not in given}, **given}
    elif not args.inputs and f.args:
        raise GCError(f"@{f.name} needs inputs: give --inputs IN.npz or --random-inputs SEED")
    if args.target != "interp":
        raise GCError(f"target '{args.target}' is not available yet: code generation has not landed; use --target interp")
    outs = run_func(module, f, bind_inputs(f, given))
    if not args.quiet:
        for i, (x, t) in enumerate(zip(outs, f.result_types)):
            print(summarize(f"result{i}", x, str(t)))
    if args.outputs:
        np.savez(args.outputs, **{f"result{i}": x for i, x in enumerate(outs)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
