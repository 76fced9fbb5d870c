"""Diagnostics: `file:line:col: error: message`, the source line and a caret."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


def printable(text: str) -> str:
    """`text` with every character that could end a line or steer a terminal (control and format
    characters, line separators, unusual spaces) escaped as Python writes it. Names from an untrusted
    file reach comments of written IR and messages on the terminal only through this."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if c in "\n\r\t":
        return repr(c)[1:-1]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


@dataclass(frozen=True, eq=False)
class Source:
    """A named text the parser read; locations point into it."""

    name: str
    text: str | None = None

    def line(self, n: int) -> str | None:
        text = self.text
        if text is None:
            try:
                text = Path(self.name).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                return None
        lines = text.splitlines()
        return lines[n - 1] if 0 < n <= len(lines) else None


@dataclass(frozen=True)
class Location:
    """Where an op came from. `fused` holds every location an op made from others remembers."""

    file: str
    line: int
    col: int
    source: Source | None = field(default=None, compare=False, repr=False, hash=False)
    fused: tuple[Location, ...] = ()

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def all(self) -> tuple[Location, ...]:
        """This location and every one fused into it, without duplicates, in order."""
        out: list[Location] = []
        for loc in (self, *self.fused):
            base = Location(loc.file, loc.line, loc.col, loc.source)
            if base not in out:
                out.append(base)
        return tuple(out)

    @staticmethod
    def merge(locs: list[Location | None]) -> Location | None:
        """The location of an op built from several: the first, remembering the others."""
        flat: list[Location] = []
        for loc in locs:
            for one in loc.all() if loc else ():
                if one not in flat:
                    flat.append(one)
        if not flat:
            return None
        first = flat[0]
        return Location(first.file, first.line, first.col, first.source, tuple(flat[1:]))


UNKNOWN = Location("<unknown>", 0, 0)


@dataclass
class Diagnostic:
    message: str
    loc: Location | None = None
    severity: str = "error"
    notes: list[tuple[Location | None, str]] = field(default_factory=list)

    def render(self) -> str:
        out = [_render_one(self.loc, self.severity, self.message)]
        out += [_render_one(loc, "note", msg) for loc, msg in self.notes]
        return "\n".join(out)


def _render_one(loc: Location | None, severity: str, message: str) -> str:
    message = printable(message)
    if loc is None or loc.line == 0:
        # A file without lines (a binary model, a whole input) is still named; the unknown location is not.
        named = loc is not None and loc.file and loc.file != UNKNOWN.file
        return f"{printable(loc.file)}: {severity}: {message}" if named else f"{severity}: {message}"
    head = f"{printable(str(loc))}: {severity}: {message}"
    line = loc.source.line(loc.line) if loc.source else Source(loc.file).line(loc.line)
    if line is None:
        return head
    line = line.expandtabs()
    caret = " " * (len(printable(line[: loc.col - 1])) if loc.col > 0 else 0) + "^"
    return f"{head}\n{printable(line)}\n{caret}"


class GCError(Exception):
    """A user's mistake: one or more diagnostics. The CLI prints them and exits with 1."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic | str, loc: Location | None = None):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(diagnostics, loc)]
        elif isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = list(diagnostics)
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(d.render() for d in self.diagnostics)

    @property
    def message(self) -> str:
        return self.diagnostics[0].message


class DiagnosticCollector:
    """Gathers diagnostics so that one pass over the input reports every problem once."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    def error(self, message: str, loc: Location | None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(message, loc, "error", list(notes)))

    def add(self, err: GCError) -> None:
        self.diagnostics.extend(err.diagnostics)

    def raise_if_any(self) -> None:
        if self.diagnostics:
            raise GCError(self.diagnostics)


@contextmanager
def writing(path):
    """Writes to a user's path: one that cannot be written (no such folder, no permission) is their
    mistake, a diagnostic naming it, not a traceback."""
    try:
        yield
    except OSError as e:
        raise GCError(f"cannot write {path}: {e.strerror or e}") from None
