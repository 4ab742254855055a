"""``serve`` keeps the terminal to qkvscope's own lines: the server's output goes to ``<db>.log``, the
terminal says when the dashboard answers, and a server that cannot start says why there."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.app.browser import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _serve(db: Path, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "QKVSCOPE_DB"}
    return subprocess.Popen([sys.executable, "-m", "app", "serve", "--db", str(db), "--no-demo", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_terminal_shows_qkvscopes_lines_and_the_log_the_rest(tmp_path):
    db, port = tmp_path / "db.duckdb", free_port()
    server = _serve(db, port)
    lines = []
    try:
        deadline = time.monotonic() + 300
        while not any("the dashboard answers at" in line for line in lines):
            assert time.monotonic() < deadline and server.poll() is None, lines
            lines.append(server.stderr.readline().rstrip("\n"))
    finally:
        server.terminate()
        out, err = server.communicate(timeout=60)
    lines += err.splitlines()
    assert lines[:3] == [
        f"qkvscope: http://127.0.0.1:{port}  (database {db}; answers to localhost, 127.0.0.1, ::1)",
        f"qkvscope: starting the server; its output and third-party messages go to {tmp_path / 'db.log'}",
        f"qkvscope: the dashboard answers at http://127.0.0.1:{port}  (server log: {tmp_path / 'db.log'})"]
    assert out == "" and all(line.startswith("qkvscope: ") for line in lines if line), lines
    assert f"URL: http://127.0.0.1:{port}" in (tmp_path / "db.log").read_text()      # Streamlit's banner


def test_a_server_that_cannot_start_says_why_in_the_terminal(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _serve(tmp_path / "db.duckdb", port)
        out, err = server.communicate(timeout=300)
    assert server.returncode == 1
    lines = err.splitlines()
    assert lines[2] == "qkvscope: the server stopped (exit status 1); the end of its log:"
    assert lines[3:] and lines[-1].endswith(f"Port {port} is not available")
    assert not any("answers at" in line for line in lines)
