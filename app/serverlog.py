"""The dashboard server's output: qkvscope's own lines in the terminal, everything else in a log file.

``serve`` (``redirect``) points the server's standard output and error, which
every process it starts inherits (the reading children that load models),
at the log file (``<database>.log`` beside the database, appended to), after
keeping a copy of the terminal's descriptor for the server
(``$QKVSCOPE_TERMINAL_FD``). So Streamlit's banner, third-party warnings,
``transformers``' load reports and progress bars land in the log. The server
(``app.hostguard.main``) then writes to the terminal: ``say`` (qkvscope's own
lines: the address once it answers, ``announce_when_ready``), every logging
record at ERROR or above that reaches the root logger (``show_errors``;
Streamlit's own loggers do not propagate: a page's error shows on the page),
and the last lines of the log when it stops with an error (``tail``), so a
port already in use is still said where the user looks.
``serve --verbose`` leaves the terminal as it is.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import TextIO

TERMINAL_ENV = "QKVSCOPE_TERMINAL_FD"
LOG_ENV = "QKVSCOPE_SERVER_LOG"
LOG_START_ENV = "QKVSCOPE_SERVER_LOG_START"
_terminal: list[TextIO] = []


def log_path_for(db: Path) -> Path:
    """The server's log file: the database's name with ``.log`` (``data/qkvscope.log``)."""
    return db.with_suffix(".log")


def redirect(log: Path) -> dict[str, str]:
    """Point this process's stdout and stderr (fds 1 and 2) at ``log`` (appended), keeping a
    duplicate of the terminal's stderr; returns the environment that tells the server both."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.dup(2)
    os.set_inheritable(terminal, True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    start = os.fstat(fd).st_size          # this start's lines begin here (the log is appended to)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return {TERMINAL_ENV: str(terminal), LOG_ENV: f"{log}", LOG_START_ENV: str(start)}


def terminal() -> TextIO | None:
    """The terminal ``serve`` kept (``$QKVSCOPE_TERMINAL_FD``), or None when output was not redirected."""
    if not _terminal:
        fd = os.environ.get(TERMINAL_ENV)
        if not fd or not fd.isdigit():
            return None
        try:
            _terminal.append(os.fdopen(int(fd), "w", buffering=1, closefd=False))
        except OSError:
            return None
    return _terminal[0]


def say(line: str) -> None:
    """One of qkvscope's own lines to the terminal (to stderr when not redirected)."""
    print(line, file=terminal() or sys.stderr, flush=True)


class _TerminalHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            say(f"qkvscope: {record.levelname.lower()}: {record.getMessage()} (details: {os.environ.get(LOG_ENV)})")
        except Exception:  # noqa: BLE001 -- logging must never raise into the caller
            self.handleError(record)


def show_errors() -> None:
    """Every logging record at ERROR or above, from any logger that reaches the root, also to
    the terminal (one line; the whole record stays in the log)."""
    if terminal() is None:
        return
    logging.getLogger().addHandler(_TerminalHandler(logging.ERROR))


def tail(n: int = 20) -> list[str]:
    """The last ``n`` lines this start wrote to the server's log (``$QKVSCOPE_SERVER_LOG``, from
    ``$QKVSCOPE_SERVER_LOG_START``); none when it is unknown."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = os.environ.get(LOG_START_ENV, "0")
            f.seek(max(int(start) if start.isdigit() else 0, f.tell() - 64 * 1024))
            return f.read().decode("utf-8", "replace").splitlines()[-n:]
    except OSError:
        return []


def announce_when_ready(url: str, timeout: float = 600.0) -> None:
    """In a background thread: poll ``url``'s health endpoint and ``say`` once this process answers."""
    def poll() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    # this server's answer, not another's on the same port (app.hostguard.SERVER_HEADER)
                    if r.status == 200 and r.headers.get("x-qkvscope-server") == str(os.getpid()):
                        say(f"qkvscope: the dashboard answers at {url}  (server log: {os.environ.get(LOG_ENV)})")
                        return
            except OSError:
                pass
            time.sleep(0.5)

    threading.Thread(target=poll, name="qkvscope-ready", daemon=True).start()
