"""`gc`: the command line. Each subcommand is a small function over the library.

Exit codes: 0 success, 1 a problem with the user's input (diagnostics on stderr), 2 bad usage,
3 an internal compiler error (with how to report it).
"""

from __future__ import annotations

import argparse
import errno
import math
import sys
import traceback
from pathlib import Path

import numpy as np

from compiler.diagnostics import GCError, Location
from compiler.files import check_writable, write_atomic
from compiler.specialize import is_dynamic

EXAMPLES = """\
examples:
  gc run examples/mlp.gir --random-inputs 0
  gc run net.gir --inputs in.npz --outputs out.npz
  gc opt net.gir -O2 --print-ir-after-change --timing
  gc compile net.gir --target llvm -o net.gcpkg && gc run net.gcpkg --inputs in.npz
  gc import model.onnx -o model.gir && gc compile model.gir --params model.npz
"""


_interrupted: list[bool] = []


def _on_sigint(signum, frame) -> None:
    """Ctrl-C: Python's KeyboardInterrupt, remembered. Raised inside a callback TVM runs from C++ it
    comes back as another exception (a bare RuntimeError), which is then still an interrupt, not a bug."""
    _interrupted.append(True)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)
    try:  # the parser too: a Ctrl-C while it is built (a slow machine's first 0.4 s) is an interrupt
        parser = _parser()
        args = parser.parse_args(argv)
        if not getattr(args, "cmd", None):
            parser.print_help(sys.stderr)
            return 1
        return args.func(args) or 0
    except GCError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except UsageError as e:
        print(f"gc: error: {e}", file=sys.stderr)
        return 1
    except MemoryError:
        # The tensors of the input do not fit: the user's machine, not a bug in gc.
        print("gc: error: out of memory: the tensors of this module (or its inputs) do not fit in this machine's "
              "memory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EIO, errno.EDQUOT) or e.filename is not None:
            return _internal_error()
        # Standard output on a full disk (`gc opt x.gir > /dev/full`): gc's own files go through
        # write_atomic, which names them.
        print(f"gc: error: cannot write standard output: {e.strerror}", file=sys.stderr)
        _discard_stdout()
        return 1
    except Exception:
        if _interrupted:
            print("gc: interrupted", file=sys.stderr)
            return 130
        return _internal_error()


def _internal_error() -> int:
    print("gc: internal compiler error (a bug in gc, not in your input):", file=sys.stderr)
    traceback.print_exc()
    print("Please report it with the command line and the input file: "
          "`gc opt FILE --print-debuginfo` helps us find the op.", file=sys.stderr)
    return 3


def _discard_stdout() -> None:
    """What is left in stdout's buffer goes nowhere, so that Python's flush at exit does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


REQUIRED_STATS = ("arena_bytes", "naive_bytes", "lower_bound_bytes", "num_kernels", "compile_seconds")


def _seed(text: str) -> int:
    """A random seed: NumPy takes non-negative integers only."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is a non-negative integer, got {text}")
    return value


_seed.__name__ = "seed"  # argparse names the type in "invalid seed value: 'x'"


def _finite(lo: float, what: str):
    """An argparse type: a finite float >= lo (a tolerance, a learning rate)."""

    def parse(text: str) -> float:
        value = float(text)
        if not (math.isfinite(value) and value >= lo):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number >= {lo:g}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


class _ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line exits 1 like every other mistake of the user's (argparse says 2)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(
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
    r.add_argument("file", help="the .gir file, or a compiled .gcpkg artifact")
    r.add_argument("--target", default=None, choices=["interp", "llvm", "cuda"],
                   help="where to run: interp is the NumPy reference interpreter (default for .gir files)")
    r.add_argument("--inputs", metavar="IN.npz", help="inputs keyed by argument name")
    r.add_argument("--random-inputs", metavar="SEED", type=_seed,
                   help="fill every input not in --inputs deterministically from SEED")
    r.add_argument("--shape", metavar="NAME=D1xD2..", action="append", type=_shape_arg, default=[],
                   help="the sizes of argument NAME where its type has ? dimensions, for --random-inputs "
                   "(repeat for each such argument)")
    r.add_argument("--outputs", metavar="OUT.npz", help="write the outputs here, keyed result0, result1, ...")
    r.add_argument("--entry", default="main", metavar="NAME", help="the function to run (default: main)")
    r.add_argument("--quiet", action="store_true", help="do not print the output summary")
    r.add_argument("--profile", metavar="N", type=int, nargs="?", const=100,
                   help="then time every kernel of the compiled model, N runs each (default 100), and print "
                   "a table: microseconds, share, GFLOP/s, GB/s, source line (a .gir file compiles for llvm "
                   "unless --target says cuda)")
    r.add_argument("--in-call", action="store_true",
                   help="with --profile: time each kernel inside whole calls, caches as a call leaves them "
                   "(as ONNX Runtime's profiler does), not on its own N times in a row")
    r.set_defaults(func=cmd_run)

    o = sub.add_parser("opt", help="parse, verify, transform and print a .gir module",
                       description="Parse and verify a .gir module, run a pass pipeline over it and print "
                       "the result. With no pipeline it prints the module back in canonical form.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="pipelines: passes separated by commas, options in braces, e.g.\n"
                       "  gc opt net.gir -p 'canonicalize,cse,dce{prune-args=true}'\n"
                       "  gc opt net.gir -O2 --print-ir-after-change --timing")
    o.add_argument("file", nargs="?", help="the .gir file, or - for standard input")
    _pipeline_args(o)
    o.add_argument("-o", "--output", metavar="OUT.gir", help="write the module here instead of stdout")
    o.add_argument("--list-passes", action="store_true", help="list every pass, its options, and the -O pipelines")
    o.add_argument("--split-input-file", action="store_true",
                   help="treat each chunk between '// -----' lines as its own module")
    o.add_argument("--verify-diagnostics", action="store_true",
                   help="print diagnostics to stdout and exit 0 (for tests of error messages)")
    dbg = o.add_argument_group("pipeline debugging (IR dumps and reports go to stderr)")
    dbg.add_argument("--print-ir-before", metavar="P", action="append", default=[], help="print the IR before pass P")
    dbg.add_argument("--print-ir-after", metavar="P", action="append", default=[], help="print the IR after pass P")
    dbg.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass")
    dbg.add_argument("--print-ir-after-change", action="store_true", help="print the IR after passes that changed it")
    dbg.add_argument("--print-ir-after-failure", action="store_true", help="print the IR a failing pass left behind")
    dbg.add_argument("--print-diff", action="store_true", help="print a unified diff against the previous stage")
    dbg.add_argument("--print-debuginfo", action="store_true", help="print each op's source location(s)")
    dbg.add_argument("--timing", action="store_true", help="a table of wall time per pass")
    dbg.add_argument("--pass-statistics", action="store_true", help="the counters each pass keeps")
    dbg.add_argument("--verify-each", action=argparse.BooleanOptionalAction, default=True,
                     help="verify the IR after every pass (default: on)")
    dbg.add_argument("--dump-dir", metavar="DIR", help="write the IR after every pass as DIR/NN-pass.gir")
    dbg.add_argument("--check-numerics", action="store_true",
                     help="run the interpreter after every pass and report the passes that change the outputs")
    dbg.add_argument("--bisect-limit", metavar="N", type=int, help="run only the first N passes (opt-bisect)")
    o.set_defaults(func=cmd_opt)

    c = sub.add_parser("compile", help="compile a .gir module for the CPU (llvm) or an NVIDIA GPU (cuda)",
                       description="Compile the whole pipeline down to a deployable artifact: graph passes, "
                       "fusion, one TVM kernel per fused group, scheduled for the target, and a runtime plan. "
                       "The artifact (.gcpkg) runs with `gc run OUT.gcpkg` or `compiler.load(path)`; it holds "
                       "native code, so load only artifacts from a source you trust. llvm builds for this CPU, or "
                       "for the LLVM CPU the environment variable GC_CPU names (e.g. znver3, sapphirerapids).",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  gc compile examples/mlp.gir --target llvm -o mlp.gcpkg --stats stats.json\n"
                       "  gc compile net.gir --target cuda --emit cuda\n  gc compile net.gir --params w.npz -o net.gcpkg")
    c.add_argument("file", help="the .gir file, or - for standard input")
    c.add_argument("--target", default="llvm", choices=["llvm", "cuda"],
                   help="llvm (the host CPU, or GC_CPU's; default) or cuda")
    c.add_argument("--arch", metavar="SM", help="CUDA arch, e.g. sm_80 (default: the GPU's, else sm_80)")
    c.add_argument("-o", "--output", metavar="OUT.gcpkg", help="where to write the artifact (default: FILE.gcpkg)")
    c.add_argument("--params", metavar="W.npz", help="bind these arguments as constants (weights) at compile time")
    c.add_argument("--entry", default="main", metavar="NAME", help="the function to compile (default: main)")
    c.add_argument("--stats", metavar="STATS.json", help="write compile statistics (memory, kernels, time) as JSON")
    c.add_argument("--concurrent", action="store_true",
                   help="cuda: plan memory so that independent branches on separate streams never wait for each "
                   "other's bytes (a larger arena)")
    c.add_argument("--emit", choices=["gir", "plan", "tir", "llvm", "cuda", "asm"],
                   help="print this stage to stdout instead of writing an artifact: gir (after the graph passes), "
                   "plan (memory planned: mem/exec IR), tir, llvm, cuda, asm")
    c.add_argument("-p", "--pipeline", default=None, metavar="PIPELINE",
                   help="graph passes before codegen (default: the compile pipeline, -O2 plus folding bound weights)")
    c.add_argument("--no-cache", action="store_true",
                   help="compile even if the compile cache holds this model (GC_CACHE_DIR moves the cache, "
                   "GC_CACHE=off turns it off)")
    c.set_defaults(func=cmd_compile)

    bi = sub.add_parser("bisect", help="find the first pass of a pipeline that changes a module's outputs",
                        description="Run the pipeline, executing the module on the reference interpreter with "
                        "seeded inputs after every pass, and name the first pass whose outputs move beyond "
                        "tolerance, with the max absolute and relative error. Exit 1 if one does.")
    bi.add_argument("file", help="the .gir file, or - for standard input")
    _pipeline_args(bi)
    bi.add_argument("--rtol", type=_finite(0, "--rtol"), default=1e-4, help="relative tolerance (default 1e-4)")
    bi.add_argument("--atol", type=_finite(0, "--atol"), default=1e-5, help="absolute tolerance (default 1e-5)")
    bi.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs (default 0)")
    bi.set_defaults(func=cmd_bisect)

    st = sub.add_parser("stats", help="count a function's ops, kernels, FLOPs, parameters and memory",
                        description="Print what one run of a function costs: ops by name and by fusion kind, "
                        "kernels (a call of a `kernel = true` function is one, any other non-constant op is "
                        "one), FLOPs (through calls), parameters (constants plus the floating-point arguments "
                        "that are not data inputs; the data input is the first argument unless --data-args "
                        "says otherwise) and the bytes of inputs, outputs and intermediates.",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  gc stats examples/mlp.gir\n  gc stats net.gir -O2 --json\n"
                        "  gc compile net.gir --stats s.json && gc stats s.json\n"
                        "  gc stats net.gir -p 'canonicalize,cse' --compare")
    st.add_argument("file", help="the .gir file, - for standard input, or a STATS.json from `gc compile --stats`")
    _pipeline_args(st)
    st.add_argument("--entry", default="main", metavar="NAME", help="the function to measure (default: main)")
    st.add_argument("--data-args", metavar="NAMES",
                    help="comma-separated arguments that are data inputs, not parameters (default: the first)")
    st.add_argument("--json", action="store_true", help="print the statistics as JSON")
    st.add_argument("--compare", action="store_true",
                    help="print the statistics before and after the pipeline side by side")
    st.set_defaults(func=cmd_stats)

    vz = sub.add_parser("viz", help="draw a function's dataflow graph with Graphviz",
                        description="Draw a function as a graph: a node per op (name, result type), its "
                        "arguments and its return, edges labelled with tensor types, and each call of a "
                        "`kernel = true` function (what fuse makes) as a box holding the kernel's ops. "
                        "The format follows the extension of -o: .dot/.gv write Graphviz source; .svg, .png, "
                        ".pdf and .html (a page embedding the SVG) need Graphviz's `dot` program. Without -o "
                        "the dot source goes to standard output.",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  gc viz examples/mlp.gir -o mlp.svg\n  gc viz net.gir -O2 -o net.html\n"
                        "  gc viz net.gir | dot -Tpng > net.png")
    vz.add_argument("file", help="the .gir file, or - for standard input")
    _pipeline_args(vz)
    vz.add_argument("--entry", default="main", metavar="NAME", help="the function to draw (default: main)")
    vz.add_argument("-o", "--output", metavar="OUT",
                    help="where to write: graph.dot, graph.svg, graph.png, graph.pdf or graph.html")
    vz.set_defaults(func=cmd_viz)

    pr = sub.add_parser("prune", help="magnitude-prune the weights of a net given as arguments in an .npz",
                        description="Prune the weights of matmul/conv2d layers that come in as arguments: "
                        "unstructured zeroes the smallest weights; channel removes whole output channels with "
                        "the smallest L1 norm and shrinks what depends on them, so both the .gir and the .npz "
                        "get smaller. Prints parameters and FLOPs before and after. (Weights that are "
                        "constants in the IR are pruned by the prune-weights pass.)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="example:\n  gc prune net.gir --params w.npz --sparsity 0.5 --mode channel "
                        "-o pruned.gir --params-out pruned.npz")
    pr.add_argument("file", help="the .gir file")
    pr.add_argument("--params", metavar="W.npz", help="the weights, keyed by argument name")
    pr.add_argument("--sparsity", type=float, default=0.5, help="the fraction to prune (default 0.5)")
    pr.add_argument("--mode", choices=["unstructured", "channel"], default="unstructured",
                    help="unstructured (default) or channel")
    pr.add_argument("--entry", default="main", metavar="NAME", help="the function to prune (default: main)")
    pr.add_argument("-o", "--output", metavar="OUT.gir", help="write the pruned module here (default: stdout)")
    pr.add_argument("--params-out", metavar="OUT.npz", help="write the pruned weights here")
    pr.set_defaults(func=_cmd_prune)

    im = sub.add_parser("import", help="convert an ONNX model into a .gir module, its weights into an .npz",
                        description="Convert an ONNX model into a .gir module with one function, @main: the "
                        "model's inputs are its first arguments, the weights (floating-point initializers) the "
                        "rest, written to an .npz beside the .gir (or constants in it with --embed-weights). "
                        "Each op line names the ONNX node it came from in a comment. A named (symbolic) "
                        "dimension stays a size known at each call, ?(name) (inputs that share the name share "
                        "the size; an axis with no name is ?), also where the model computes shapes "
                        "from it (a transformer's reshapes), unless --input-shape pins it; where the import "
                        "itself must know it (an RNN's sequence), the axes are kept static and it says so. "
                        "Needs the onnx package.",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  gc import model.onnx -o model.gir\n"
                        "  gc import bert.onnx --input-shape input_ids=1x128 -o bert.gir\n"
                        "  gc compile model.gir --params model.npz -o model.gcpkg")
    im.add_argument("file", help="the .onnx model (- reads it from standard input)")
    im.add_argument("-o", "--output", metavar="OUT.gir",
                    help="where to write the module (default: MODEL.gir here); the weights go to OUT.npz")
    im.add_argument("--input-shape", metavar="NAME=D1xD2x...", action="append", default=[],
                    help="pin the shape of an input with symbolic dimensions, e.g. input=1x3x224x224 "
                         "(repeatable)")
    im.add_argument("--embed-weights", action="store_true",
                    help="write the weights into the .gir as constants instead of an .npz")
    im.set_defaults(func=_cmd_import)

    tr = sub.add_parser("train", help="train a loss function's weights with SGD on a synthetic data set",
                        description="Train the weights of a function returning a scalar loss: the "
                        "make-train-step pass adds its SGD step (forward, loss, gradients, w - lr * grad), "
                        "compiled once, run --steps times over a synthetic data set the net can learn "
                        "(Gaussian clusters per class for softmax_cross_entropy, a random teacher net's outputs "
                        "as mse_loss targets). The data inputs are the first argument and the loss's targets; "
                        "every other floating-point argument is a weight. Prints the first and last loss and "
                        "writes the trained weights as an .npz keyed by argument name.",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  gc train examples/train_mlp.gir --steps 200 -o trained.npz\n"
                        "  gc train net.gir --steps 50 --target interp --lr 0.05 --params init.npz\n"
                        "  gc compile examples/mlp.gir --params trained.npz -o mlp.gcpkg")
    tr.add_argument("file", help="the .gir file; its function returns a scalar loss")
    tr.add_argument("--steps", type=int, default=100, help="SGD steps (default 100)")
    tr.add_argument("--target", default="llvm", choices=["interp", "llvm", "cuda"],
                    help="where the step runs: llvm (default, compiled once), cuda, or interp (the reference "
                    "interpreter)")
    tr.add_argument("--lr", type=_finite(0, "--lr"), default=0.1, help="learning rate (default 0.1)")
    tr.add_argument("--batch-size", type=int, metavar="N",
                    help="train at this batch size (default: the function's own leading data dimension)")
    tr.add_argument("--examples", type=int, metavar="N", help="size of the synthetic data set (default 16 batches)")
    tr.add_argument("--params", metavar="W.npz", help="initial weights keyed by argument name (default: He-normal)")
    tr.add_argument("--train", metavar="NAMES", help="comma-separated arguments to train (default: every "
                    "floating-point one but the data)")
    tr.add_argument("-o", "--output", metavar="OUT.npz", help="where to write the weights (default: FILE.trained.npz)")
    tr.add_argument("--entry", default="main", metavar="NAME", help="the loss function (default: main)")
    tr.add_argument("--seed", type=_seed, default=0, help="seed of the data set and the initial weights (default 0)")
    tr.set_defaults(func=_cmd_train)
    return p


def _cmd_train(args) -> int:
    from compiler.training import cmd_train

    return cmd_train(args)


def _cmd_import(args) -> int:
    from compiler.importers.onnx import cmd_import, parse_input_shape

    for text in args.input_shape:
        try:
            parse_input_shape(text)
        except ValueError as e:
            raise UsageError(str(e)) from None
    return cmd_import(args)


def _cmd_prune(args) -> int:
    from compiler.prune import cmd_prune

    if not 0 <= args.sparsity < 1:
        raise UsageError(f"--sparsity must be in [0, 1), got {args.sparsity}")
    return cmd_prune(args)


def _pipeline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--pipeline", default=None, metavar="PIPELINE",
                   help="passes to run, e.g. 'canonicalize,cse,dce' (see --list-passes)")
    p.add_argument("--load-pass-plugin", metavar="FILE.py", action="append", default=[],
                   help="a Python file defining more passes (subclasses of compiler.passes.Pass)")
    for level in ("0", "1", "2"):
        p.add_argument(f"-O{level}", dest="opt_level", action="store_const", const=f"O{level}",
                       help=f"the standard pipeline O{level} (see --list-passes)")


def _pipeline_text(args) -> str:
    import runpy

    from compiler.pipeline import NAMED_PIPELINES

    for plugin in args.load_pass_plugin:
        if not Path(plugin).is_file():
            raise GCError(f"cannot load pass plugin {plugin}: no such file")
        try:
            runpy.run_path(plugin)
        except SyntaxError as e:  # the user's file: a diagnostic at its line, not a traceback
            raise GCError(f"pass plugin: {e.msg}", Location(plugin, e.lineno or 1, e.offset or 1)) from None

    if args.pipeline is not None and args.opt_level:
        raise UsageError("give either -p PIPELINE or -O0/-O1/-O2, not both")
    if args.opt_level:
        return NAMED_PIPELINES[args.opt_level]
    return args.pipeline or ""


class UsageError(Exception):
    """Bad usage (options that do not go together): exit code 1, no location."""


def _read(path: str) -> tuple[str, str]:
    from compiler.parser import read_text

    if path == "-":
        return read_text("<stdin>", sys.stdin.buffer.read()), "<stdin>"
    return read_text(path), path


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
    from compiler.pipeline import Instrumentation, PipelineFailure, parse_pipeline, run_pipeline
    from compiler.printer import print_module

    if args.output:
        check_writable(args.output)  # before the passes run
    passes_text = _pipeline_text(args)
    if args.list_passes:
        print(list_passes())
        return 0
    if args.file is None:
        raise UsageError("gc opt needs a FILE (or - for standard input)")
    text, name = _read(args.file)
    pipeline_names = [p.name for p in parse_pipeline(passes_text)]
    inst = Instrumentation(
        print_before=_print_at("--print-ir-before", args.print_ir_before, pipeline_names),
        print_after=_print_at("--print-ir-after", args.print_ir_after, pipeline_names),
        print_after_all=args.print_ir_after_all,
        print_after_change=args.print_ir_after_change,
        print_after_failure=args.print_ir_after_failure,
        print_diff=args.print_diff,
        debuginfo=args.print_debuginfo,
        timing=args.timing,
        statistics=args.pass_statistics,
        verify_each=args.verify_each,
        dump_dir=args.dump_dir,
        bisect_limit=args.bisect_limit,
        check_numerics=args.check_numerics,
        reproducer=_reproducer_path(name),
    )
    pieces = []
    for chunk, offset in _chunks(text, args.split_input_file):
        try:
            module = parse(chunk, name, line_offset=offset)
            run_pipeline(module, parse_pipeline(passes_text), inst)
            pieces.append(print_module(module, debuginfo=args.print_debuginfo))
        except GCError as e:
            if not args.verify_diagnostics:
                raise
            pieces.append(e.render() + "\n")
        except PipelineFailure as e:
            print(f"gc: internal compiler error: {e}", file=sys.stderr)
            return 3
    out = "// -----\n".join(pieces)
    if args.output:
        write_atomic(args.output, out)
    else:
        sys.stdout.write(out)
    return 0


def _print_at(flag: str, values: list[str], pipeline: list[str]) -> set[str]:
    """The pass names of --print-ir-before/after: a name that is no pass is a mistake; one the pipeline
    does not run would print nothing, so say so."""
    from compiler.passes import load_all

    known = load_all()
    names = {n.strip() for v in values for n in v.split(",") if n.strip()}
    for n in sorted(names):
        if "{" in n or "}" in n:
            raise UsageError(f"{flag} takes pass names (e.g. fuse), without options: got '{n}'")
        if n not in known:
            import difflib

            near = difflib.get_close_matches(n, list(known), 1)
            raise UsageError(f"{flag}: unknown pass '{n}'" + (f"; did you mean '{near[0]}'?" if near else ""))
        if n not in pipeline:
            print(f"gc: note: {flag}={n}: the pipeline does not run {n}", file=sys.stderr)
    return names


def _reproducer_path(name: str) -> str:
    base = Path(name).name if name != "<stdin>" else "stdin.gir"
    stem = base[: -len(".gir")] if base.endswith(".gir") else base
    return str((Path(name).parent if name != "<stdin>" else Path(".")) / f"{stem}.reproducer.gir")


def list_passes() -> str:
    from compiler.passes import _format_option, load_all
    from compiler.pipeline import OPT_LEVELS, PIPELINES

    lines = ["Passes:"]
    for name, cls in sorted(load_all().items()):
        lines.append(f"  {name:<20} {cls.summary}")
        for f in cls.options():
            value = _format_option(f.default)
            lines.append(f"      {f.name.replace('_', '-')}={value}  {f.metadata.get('help', '')}".rstrip())
    lines.append("Pipelines:")
    for name, text in PIPELINES.items():
        flag = f"-{name}" if name in OPT_LEVELS else f"{name} (gc compile --target {name.split('-')[1]})"
        lines.append(f"  {flag}  {text or '(no passes)'}")
    return "\n".join(lines)


def cmd_bisect(args) -> int:
    import io

    from compiler.parser import parse
    from compiler.pipeline import Instrumentation, parse_pipeline, run_pipeline

    pipeline = _pipeline_text(args)
    text, name = _read(args.file)
    module = parse(text, name)
    passes = parse_pipeline(pipeline)
    log = io.StringIO()
    inst = Instrumentation(check_numerics=True, rtol=args.rtol, atol=args.atol, seed=args.seed, out=log)
    records = run_pipeline(module, passes, inst)
    first = None
    for line in log.getvalue().splitlines():
        if line.startswith("check-numerics: pass") and first is None:
            first = line
    print(f"bisect: {len(records)} pass(es), inputs seeded with {args.seed}, rtol={args.rtol}, atol={args.atol}")
    if first is None:
        print("bisect: no pass changed the outputs beyond tolerance")
        return 0
    print("bisect: first bad " + first.removeprefix("check-numerics: "))
    return 1


def cmd_run(args) -> int:
    from compiler.inputs import load_npz, random_inputs
    from compiler.interpreter import bind_inputs, run_func
    from compiler.parser import parse

    if args.in_call and args.profile is None:
        raise UsageError("--in-call says how --profile times the kernels: give --profile too")
    if args.outputs:
        check_writable(args.outputs)  # before the run
    if _is_artifact(args.file):
        return _run_artifact(args)
    text, name = _read(args.file)
    module = parse(text, name)
    if args.entry not in module:
        names = ", ".join("@" + n for n in module.funcs)
        raise GCError(f"no function @{args.entry} in {name} (functions: {names})")
    f = module[args.entry]
    given = load_npz(args.inputs) if args.inputs else {}
    if args.shape and args.random_inputs is None:
        raise UsageError("--shape gives the sizes of made-up inputs: give --random-inputs SEED too")
    if args.random_inputs is not None:
        sized = {k: tuple(np.shape(v)) for k, v in given.items() if k in {a.name for a in f.args}}
        made = random_inputs(f, args.random_inputs, module, shapes={**sized, **dict(args.shape)}, skip=set(given))
        given = {**made, **given}
    elif not args.inputs and f.args:
        raise GCError(f"@{f.name} needs inputs: give --inputs IN.npz or --random-inputs SEED")
    inputs = bind_inputs(f, given)
    if args.profile is not None and args.target == "interp":
        raise UsageError("--profile times compiled kernels: use --target llvm or cuda")
    target = args.target or ("llvm" if args.profile is not None else "interp")
    if target == "interp":
        outs = run_func(module, f, inputs)
    else:
        import compiler

        model = compiler.compile(module, target, entry=args.entry)
        outs = model(*inputs)
    _report(args, outs, [str(t.with_shape(np.shape(o))) for t, o in zip(f.result_types, outs)])
    if args.profile is not None:
        print(model.profile(*inputs, repeat=args.profile, in_call=args.in_call).render())
    return 0


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=8x784 (NAME= for a scalar) -> ("NAME", (8, 784))."""
    from compiler.inputs import parse_sized_name

    try:
        return parse_sized_name(text, "--shape")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _is_artifact(path: str) -> bool:
    if path == "-" or not Path(path).is_file():
        return False
    with open(path, "rb") as fh:
        return fh.read(4) == b"PK\x03\x04"


def _run_artifact(args) -> int:
    import compiler
    from compiler.codegen.runtime import CompiledModel
    from compiler.inputs import load_npz

    # Checked before loading: loading a cuda model where no GPU is fails for that reason instead.
    plan = CompiledModel.read_plan(args.file)
    if args.target not in (None, plan["target"]["kind"]):
        raise GCError(f"{args.file} was compiled for {plan['target']['kind']}, not {args.target}")
    if args.entry not in (None, plan["entry"]):
        raise GCError(f"{args.file} was compiled from @{plan['entry']}, not @{args.entry}: compile "
                      f"the .gir with --entry {args.entry} for that function")
    model = compiler.load(args.file)
    given = load_npz(args.inputs) if args.inputs else {}
    if args.shape and args.random_inputs is None:
        raise UsageError("--shape gives the sizes of made-up inputs: give --random-inputs SEED too")
    if args.random_inputs is not None:
        made = _artifact_random_inputs(model, args.random_inputs, dict(args.shape), set(given))
        given = {**made, **given}
    elif not args.inputs and model.arg_names:
        raise GCError("the model needs inputs: give --inputs IN.npz or --random-inputs SEED")
    outs = model(**given)
    dynamic = getattr(model, "func", None)
    types = [str(t.with_shape(np.shape(o))) for t, o in zip(dynamic.result_types, outs)] if dynamic else \
        model.plan.result_types
    _report(args, outs, types)
    if args.profile is not None:
        print(model.profile(**given, repeat=args.profile, in_call=args.in_call).render())
    return 0


def _artifact_random_inputs(model, seed: int, shapes: dict | None = None, skip: set = frozenset()) -> dict:
    """The inputs `gc run SOURCE.gir --random-inputs SEED` would make, when the artifact kept its source."""
    from compiler.inputs import random_inputs
    from compiler.parser import parse

    if model.source is not None:
        module = parse(model.source, "<artifact>")
        entry = model.func.name if hasattr(model, "func") else model.plan.entry
        made = random_inputs(module[entry], seed, module, shapes=shapes, skip=skip | ({a.name for a in module[entry].args} - set(model.arg_names)))
        return {k: v for k, v in made.items() if k in model.arg_names}
    if shapes:
        raise GCError("--shape: this artifact keeps no source, and its sizes are fixed")
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) if d.kind == "f" else rng.integers(0, 10, s)).astype(d)
            for n, (s, d) in zip(model.arg_names, model.arg_types)}


def _report(args, outs: list, types: list[str]) -> None:
    from compiler.inputs import save_npz, summarize

    if not args.quiet:
        for i, (x, t) in enumerate(zip(outs, types)):
            print(summarize(f"result{i}", x, t))
    if args.outputs:
        save_npz(args.outputs, {f"result{i}": x for i, x in enumerate(outs)})


def cmd_compile(args) -> int:
    import json
    import time
    from dataclasses import asdict

    from compiler import cache, driver
    from compiler.codegen.plan import Plan
    from compiler.files import copy_atomic
    from compiler.inputs import load_npz
    from compiler.printer import print_module

    t0 = time.perf_counter()
    text, name = _read(args.file)
    out = args.output or _default_artifact(name)
    if not args.emit:  # the paths it will write, before the compile that takes seconds
        check_writable(out)
        if args.stats:
            check_writable(args.stats)
    options = driver.Options(target=args.target, entry=args.entry, pipeline=args.pipeline, arch=args.arch,
                             concurrent=args.concurrent)
    if args.emit in ("gir", "plan"):
        params = load_npz(args.params) if args.params else None
        module, _ = driver.frontend(text, name, options, params)
        driver.optimize(module, options)
        if args.emit == "plan" and is_dynamic(module[args.entry]):
            raise GCError(_PER_SIZE.format(what="the memory plan is", f=args.entry))
        if args.emit == "plan":
            from compiler.codegen.build import plan_module

            plan_module(module, args.target, args.entry, concurrent=args.concurrent)
        sys.stdout.write(print_module(module))
        return 0
    if args.emit:  # the build's own products (TIR, LLVM IR, CUDA C), which a cached artifact does not keep
        params = load_npz(args.params) if args.params else None
        model = driver.compile(text, options, params=params, name=name, use_cache=False)
        if not hasattr(model, "lib"):
            raise GCError(_PER_SIZE.format(what="the kernels (most of them one for every size) are", f=args.entry))
        sys.stdout.write(_emit(model, args.emit))
        return 0
    use_cache = cache.enabled() and not args.no_cache
    # The weights file's digest, not its arrays, keys the entry: a hit never reads them. (A file that cannot
    # be read: no key; load_npz below says why.)
    digest = cache.file_digest(args.params) if use_cache and args.params else None
    k = cache.key(text, None, asdict(options), params_file=digest) if use_cache and (digest or not args.params) \
        else None
    hit = cache.lookup_file(k) if k else None
    if hit is not None:
        entry, checked = hit
        copy_atomic(entry, out)
        plan = Plan.from_json(checked)
    else:
        params = load_npz(args.params) if args.params else None
        model = driver.compile(text, options, params=params, name=name, use_cache=False)
        warm = not hasattr(model, "lib") and model.warm()  # `?` sizes: kernels built now, at one size, and saved
        model.save(out)
        if not hasattr(model, "lib"):  # `?` sizes: a memory plan (and what is not symbolic) at each new size
            return _wrote_dynamic(args, out, time.perf_counter() - t0, model.symbolic is not None, warm)
        if k:
            cache.store_file(k, Path(out), model)
        plan = model.plan
    kernels = [c.kernel for c in plan.kernel_steps]
    num_kernels = len(kernels)
    seconds = time.perf_counter() - t0
    if args.stats:
        stats = {**plan.memory, "num_kernels": num_kernels, "compile_seconds": round(seconds, 4),
                 "target": args.target, "source": name, "kernels": kernels, "from_cache": hit is not None}
        write_atomic(args.stats, json.dumps(stats, indent=2) + "\n")
    how = ", from the compile cache" if hit is not None else ""
    print(f"gc: wrote {out} ({num_kernels} kernels, {args.target}, {seconds:.2f} s{how})", file=sys.stderr)
    return 0


_PER_SIZE = ("@{f} has sizes known only at run time (?): {what} made for each size at its first call; "
             "write the sizes in the source to see them for one size")


def _wrote_dynamic(args, out: str, seconds: float, symbolic: bool, built: bool) -> int:
    import json

    if args.stats:
        stats = {"dynamic": True, "num_kernels": 0, "compile_seconds": round(seconds, 4), "target": args.target,
                 "source": args.file, "kernels": [], "from_cache": False}
        write_atomic(args.stats, json.dumps(stats, indent=2) + "\n")
    when = "built now" if built else "built at the first call"
    how = (f"one kernel for every size, {when}; each new size plans its memory at its first call" if symbolic
           else "each compiles at its first call")
    print(f"gc: wrote {out} ({args.target}, sizes known at run time: {how}, {seconds:.2f} s)", file=sys.stderr)
    return 0


def _default_artifact(name: str) -> str:
    return (Path(name).stem if name != "<stdin>" else "stdin") + ".gcpkg"


def _emit(model, what: str) -> str:
    if what == "tir":
        return "\n".join(model.scheduled[g].script() for g in model.scheduled.get_global_vars()) + "\n"
    if model.lib is None:
        return ""
    if what == "cuda":
        if model.target["kind"] != "cuda":
            raise UsageError("--emit cuda needs --target cuda")
        from compiler.codegen.emit import cuda_source

        return cuda_source(model.lib)
    fmt = {"llvm": "ll", "asm": "asm"}[what]
    parts = getattr(model, "sources", None) or [model.lib.mod]  # a library built in parts: each part's source
    return "\n".join(part.inspect_source(fmt) for part in parts)


def _load(args):
    """Parse args.file and run the pipeline the arguments name; the module before and after."""
    from compiler.parser import parse
    from compiler.pipeline import parse_pipeline, run_pipeline

    pipeline = _pipeline_text(args)
    text, name = _read(args.file)
    module = parse(text, name)
    before = module.clone() if pipeline else module
    if pipeline:
        run_pipeline(module, parse_pipeline(pipeline))
    return before, module


def _compile_stats(args) -> int:
    """`gc stats STATS.json`: what `gc compile --stats` wrote, readably."""
    import json

    from compiler.stats import format_compile_stats

    try:
        stats = json.loads(Path(args.file).read_text(encoding="utf-8"))
        missing = [k for k in REQUIRED_STATS if not isinstance(stats, dict) or k not in stats]
        if missing:
            raise ValueError("it has no " + ", ".join(missing))
        text = format_compile_stats(stats) if not args.json else json.dumps(stats, indent=2) + "\n"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise GCError(f"{args.file}: not a statistics file written by `gc compile --stats` ({e})") from None
    sys.stdout.write(text)
    return 0


def cmd_stats(args) -> int:
    import json

    from compiler.stats import format_compare, format_stats, module_stats

    if args.compare and not (args.pipeline or args.opt_level):
        raise UsageError("--compare needs a pipeline to compare against: -p PIPELINE or -O0/-O1/-O2")
    if args.file.endswith(".json"):
        return _compile_stats(args)
    data = [n.strip() for n in args.data_args.split(",") if n.strip()] if args.data_args is not None else None
    before, after = _load(args)
    stats = module_stats(after, args.entry, data)
    old = module_stats(before, args.entry, data) if args.compare else None
    if args.json:
        print(json.dumps({"before": old, "after": stats} if old else stats, indent=2))
    else:
        sys.stdout.write(format_compare(old, stats) if old else format_stats(stats))
    return 0


def cmd_viz(args) -> int:
    from compiler.stats import format_stats, module_stats
    from compiler.viz import check_output, to_dot, write

    if args.output:
        check_output(args.output)  # before the pipeline runs: a wrong extension should fail fast
    _, module = _load(args)
    graph = to_dot(module, args.entry)
    if not args.output:
        sys.stdout.write(graph.source)
        return 0
    # An .html page shows the statistics above the graph.
    notes = format_stats(module_stats(module, args.entry)) if args.output.lower().endswith(".html") else ""
    write(graph, args.output, title=f"@{args.entry} in {args.file}", notes=notes)
    return 0

if __name__ == "__main__":
    sys.exit(main())
