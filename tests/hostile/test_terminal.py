"""Names from files never drive the terminal: every command's text output escapes control
characters (``loaders.report.TerminalSafe`` around the CLI's stdout and stderr)."""
from __future__ import annotations

from app.cli import main
from loaders.report import terminal_text

#: Clear the screen, set the window title, a C1 control, a right-to-left override.
NASTY = "run\x1b[2J\x1b]0;pwned\x07\x9b\u202e"


def test_terminal_text_escapes_controls_and_keeps_line_structure():
    assert terminal_text(NASTY) == "run\\x1b[2J\\x1b]0;pwned\\x07\\x9b\\u202e"
    assert terminal_text("a\tb\r\nc") == "a\tb\r\nc"


def test_runs_with_escape_sequences_in_their_names_print_as_text(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / f"{NASTY}.csv").write_text("step,val/loss\n0,4.0\n10,3.5\n")
    db = str(tmp_path / "t.duckdb")
    assert main(["ingest", str(logs), "--db", db]) == 0
    capsys.readouterr()
    assert main(["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\u202e" not in out
    assert "run\\x1b[2J\\x1b]0;pwned" in out


def test_run_meta_prints_escaped_names(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / f"{NASTY}.csv").write_text("step,val/loss\n0,4.0\n")
    db = str(tmp_path / "t.duckdb")
    assert main(["ingest", str(logs), "--db", db]) == 0
    capsys.readouterr()
    assert main(["run-meta", "1", "--set", "variant=k_eq_v", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J" in out
