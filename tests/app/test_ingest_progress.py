"""``app.commands.ingest.Progress``: files done / total on stderr, throttled where stderr is not a terminal."""
from __future__ import annotations

import io

from app.commands.ingest import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_interval_and_the_last():
    out = io.StringIO()
    p = Progress("demo ingest", every=3600, quiet=0, stream=out)
    for done in range(1, 6):
        p(done, 5, f"run/{done}.safetensors")
    assert out.getvalue() == "demo ingest: 5/5 files, 0 s\n"           # throttled: only the end
    out = io.StringIO()
    p = Progress("ingest", every=0, quiet=0, stream=out)
    p(0, 0, "")                                                          # nothing to read: nothing said
    p(1, 2, "a")
    p(2, 2, "b")
    assert out.getvalue() == "ingest: 1/2 files, 0 s\ningest: 2/2 files, 0 s\n"


def test_a_short_ingest_in_a_log_says_nothing():
    """Under ``quiet`` seconds a script's stderr is left to its errors."""
    out = io.StringIO()
    p = Progress("ingest", every=0, stream=out)
    p(1, 2, "a")
    p(2, 2, "b")
    assert out.getvalue() == ""


def test_a_terminal_gets_one_bar_redrawn_in_place():
    out = _Tty()
    p = Progress(stream=out)
    p(1, 2, "a")
    p(2, 2, "b")
    assert out.getvalue() == ("\r[###############...............] 1/2 a" + " " * 39 +
                              "\r[##############################] 2/2 b" + " " * 39 + "\n")
