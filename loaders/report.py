"""What one ingest did, file by file: the report the CLI prints and the page shows."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (newline, tab,
    control characters, the lone surrogates a name that is not UTF-8 decodes to)
    written as its Python escape, so one report entry stays one line."""
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else ascii(c)[1:-1]
                   for c in text)


def terminal_text(text: str) -> str:
    """``text`` safe to write to a terminal: as ``one_line``, but newlines, tabs and carriage
    returns (a progress bar's) kept, so an escape sequence in a run or file name (clear the
    screen, set the window title) is printed as text, never obeyed."""
    return "".join(c if c in "\n\t\r" or (c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF)
                   else ascii(c)[1:-1] for c in text)


class TerminalSafe:
    """A text stream that writes through ``terminal_text``: the CLI's stdout and stderr, so every
    command's output (tables of run names, notes, paths) is safe however it was printed."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(terminal_text(text))
        return len(text)

    def __getattr__(self, name):            # flush, fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def shown(name: str) -> str:
    """A file name for a text report: as it is when printable, else quoted
    repr-style (``'evil\\nname.csv'``), so a newline cannot split a line."""
    return name if one_line(name) == name else repr(name)


@dataclass
class FileReport:
    """The outcome of ingesting one file.

    ``status``: ``added`` (new content stored), ``appended`` (a grown log's new
    points), ``unchanged`` (already stored, nothing added), ``skipped``
    (not something qkvscope reads; ``reason`` says why) or ``error`` (it should
    have been readable but is broken; ``reason`` is the typed error's message).
    """

    path: str
    kind: str                     # 'checkpoint', 'log' or 'unknown'
    status: str
    format: str | None = None
    reason: str | None = None
    run_ids: list[int] = field(default_factory=list)
    checkpoint_id: int | None = None
    n_points: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class IngestReport:
    files: list[FileReport] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)

    def to_json(self) -> dict:
        return {
            "added": self.count("added"), "appended": self.count("appended"),
            "unchanged": self.count("unchanged"), "skipped": self.count("skipped"),
            "errors": self.count("error"),
            "files": [f.to_json() for f in self.files],
        }
