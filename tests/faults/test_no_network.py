"""Nothing leaves the machine: ``strace -f -e trace=connect`` of ``ingest``,
``analyze`` and ``serve`` (with every process they start) shows no connection but
to loopback, a Unix socket or the kernel (netlink). The inputs: a checkpoint
folder and a log, an SQLite file given as ``--db`` (DuckDB would fetch
``sqlite_scanner`` to open it), and the dashboard's pages run in Chromium with a
query on the SQL page (its query process is traced too)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.app.browser import chromium, free_port, wait_idle
from tests.faults.data import gpt2_folder

STRACE = shutil.which("strace")
#: ``connect(fd, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("1.2.3.4")}, 16)``
_CONNECT = re.compile(r"connect\(\d+, \{sa_family=(?P<family>AF_\w+)(?P<rest>.*?)\}")
_LOCAL_FAMILIES = {"AF_UNIX", "AF_NETLINK", "AF_UNSPEC"}


def outside(trace: Path) -> list[str]:
    """The connect calls in ``trace`` to an address that is not loopback."""
    bad = []
    for line in trace.read_text().splitlines():
        m = _CONNECT.search(line)
        if m is None or m["family"] in _LOCAL_FAMILIES:
            continue
        addr = re.search(r'inet_(?:addr|pton)\((?:AF_INET6, )?"([^"]+)"', m["rest"])
        if addr and (addr[1].startswith("127.") or addr[1] in ("::1", "::") or
                     addr[1].startswith("::ffff:127.") or addr[1] == "0.0.0.0"):
            continue
        bad.append(line)
    return bad


@pytest.fixture(scope="module")
def strace_works(tmp_path_factory):
    """strace's options here: with ``--seccomp-bpf`` where the kernel allows it (only the traced
    calls stop the process, so a traced server runs at nearly its speed)."""
    if STRACE is None:
        pytest.skip(f"strace is not installed (looked for it on PATH: {shutil.which('strace')!r}); "
                    "apt-get install strace runs this test")
    out = tmp_path_factory.mktemp("probe") / "probe.txt"
    errors = []
    for options in (["-f", "--seccomp-bpf"], ["-f"]):
        done = subprocess.run([STRACE, *options, "-e", "trace=connect,execve", "-o", str(out), "true"],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return options
        errors.append(done.stderr.strip()[:200])
    pytest.skip(f"strace cannot attach here (ptrace restricted?): {errors[-1]}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def traced(options: list[str], trace: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([STRACE, *options, "-qq", "-e", "trace=connect,execve", "-o", str(trace),
                             sys.executable, "-m", "app", *args], **kw)


@pytest.mark.slow
def test_ingest_analyze_and_serve_connect_to_nothing_outside(tmp_path, strace_works):
    folder = gpt2_folder(tmp_path / "runs" / "m", seed=1)
    (tmp_path / "runs" / "log.csv").write_text("step,loss\n0,3\n1,2\n")
    db = tmp_path / "db.duckdb"
    sqlite = tmp_path / "mlflow.db"
    con = sqlite3.connect(sqlite)
    con.execute("CREATE TABLE runs (id INTEGER)")
    con.commit()
    con.close()
    for name, args, db_arg, rc in (
            ("ingest", ["ingest", str(tmp_path / "runs")], db, 0),
            ("analyze", ["analyze", str(folder), "--activations", "--tokens", "128"], db, 0),
            ("sqlite", ["ingest", str(tmp_path / "runs" / "log.csv")], sqlite, 2)):
        trace = tmp_path / f"{name}.trace"
        proc = traced(strace_works, trace, *args, "--db", str(db_arg), stdout=subprocess.DEVNULL,
                      stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == rc, err.decode()[-2000:]
        if rc == 0:
            assert trace.read_text().count("execve(") >= 2, name     # the trace followed the children
        assert outside(trace) == [], name

    port = free_port()
    trace = tmp_path / "serve.trace"
    proc = traced(strace_works, trace, "serve", "--db", str(db), "--port", str(port), "--no-demo",
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the dashboard did not answer"
            time.sleep(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200
        with chromium() as browser:                      # the pages' scripts run: a session each
            page = browser.new_context(reduced_motion="reduce").new_page()   # no spinner repaints
            page.goto(f"http://127.0.0.1:{port}/")
            wait_idle(page, timeout=120_000)
            page.goto(f"http://127.0.0.1:{port}/sql?q=SELECT%20count(*)%20AS%20n%20FROM%20runs")
            wait_idle(page, timeout=120_000)
            page.get_by_role("button", name="Run").click()
            page.get_by_text("1 row in").wait_for(timeout=120_000)
            page.context.close()
        time.sleep(3)                                    # whatever a started server sends, it has begun
    finally:
        # strace and the server it traces share one session: SIGINT to strace alone detaches it and
        # leaves the server running, so the whole group is stopped, and killed if it lingers
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        deadline = time.monotonic() + 30
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert '"-m", "loaders.sql_child"]' in trace.read_text()        # the SQL page's query process, traced
    assert outside(trace) == []


def test_the_trace_reader_tells_loopback_from_outside(tmp_path):
    trace = tmp_path / "t.trace"
    trace.write_text(
        '1 connect(4, {sa_family=AF_INET, sin_port=htons(8501), sin_addr=inet_addr("127.0.0.1")}, 16) = 0\n'
        '1 connect(5, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT\n'
        '2 connect(6, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0\n'
        '2 connect(7, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("185.199.108.133")}, 16) = 0\n'
        '3 connect(8, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "2606:4700::6810:84e5", &sin6_addr), sin6_scope_id=0}, 28) = 0\n')
    assert [l.split()[1] for l in outside(trace)] == ["connect(7,", "connect(8,"]
