"""`python -m compiler` and the `gc` command (Debian's graphviz also ships a program called gc).

Ctrl-C is an interrupt (exit 130, one line) from the start: the handler is installed before the CLI's
imports (numpy, lark, the dialects: most of a second on a loaded machine), which run inside its guard."""

import signal
import sys
import threading


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt)
    try:
        from compiler import cli
    except KeyboardInterrupt:
        print("gc: interrupted", file=sys.stderr)
        return 130
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
