"""The dashboard server: where it listens, writers beside it, and many browser
sessions at once."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.app.browser import dashboard
from tests.faults.data import build_runs, snapshot
from tests.faults.server import listeners, outside_addresses, pid_of_socket, rss_bytes

ROOT = Path(__file__).resolve().parents[2]


def port_of(url: str) -> int:
    return urllib.parse.urlsplit(url).port


def refused(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=2):
            return False
    except OSError:
        return True


@pytest.mark.slow
def test_the_server_listens_on_loopback_only_unless_told(tmp_path):
    db = tmp_path / "db.duckdb"
    Store(db).migrate()
    with dashboard(db, "--no-demo") as url:
        port = port_of(url)
        socks = listeners(port)
        assert {a for a, _ in socks} == {"127.0.0.1"}, socks
        assert not refused("127.0.0.1", port)
        outside = outside_addresses()
        for addr in outside:
            assert refused(addr, port), f"the dashboard answered on {addr}:{port}"
        print(f"listening on {socks}; refused on {outside}")
    with dashboard(db, "--no-demo", "--host", "0.0.0.0") as url:
        assert {a for a, _ in listeners(port_of(url))} == {"0.0.0.0"}


def test_docs_and_help_say_what_another_host_exposes(capsys):
    from app.cli import main

    doc = (ROOT / "docs" / "guide" / "commands.md").read_text()
    section = doc[doc.index("### `python -m app serve"):]
    section = section[:section.index("\n## ")]
    assert "127.0.0.1:8501" in section
    for phrase in ("--host", "read files on this server", "upload files", "run", "trusted network"):
        assert phrase in section, phrase
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    assert "default 127.0.0.1, this machine only" in " ".join(capsys.readouterr().out.split())


@pytest.fixture(scope="module")
def chromium_browser():
    """One Chromium for this file's browser tests; each opens tabs (Streamlit sessions) of its own."""
    from tests.app.browser import chromium

    with chromium() as browser:
        yield browser


@pytest.mark.slow
@pytest.mark.browser
def test_ingest_while_the_dashboard_serves_pages(tmp_path, chromium_browser):
    """A CLI ingest writes while browser sessions keep reading the same file
    through the Overview and Experiments pages: both go on, nothing lost."""
    from tests.app.browser import session, wait_idle

    runs = build_runs(tmp_path / "runs")
    ref_db = tmp_path / "ref.duckdb"
    ingest_paths(Store(ref_db), [runs])
    ref = snapshot(ref_db)
    db = tmp_path / "db.duckdb"
    ingest_paths(Store(db), [runs / "run_a"])         # something to show from the start
    with dashboard(db, "--no-demo") as url, session((url, chromium_browser)) as (_, page):
        page.goto(url)                                 # the Overview: the main page
        wait_idle(page, timeout=60_000)
        proc = subprocess.Popen([sys.executable, "-m", "app", "ingest", str(runs), "--db", str(db)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        loads = 0
        while proc.poll() is None or loads < 2:
            # the sidebar's links, as a user moves between pages: each runs the page's script
            # again on the file being written (a reload would only start the frontend again too)
            page.get_by_role("link", name=("Experiments", "Overview")[loads % 2]).first.click()
            wait_idle(page, timeout=60_000)
            assert page.locator("[data-testid='stException']").count() == 0
            loads += 1
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        page.goto(url)                                 # a new session once the ingest is done
        wait_idle(page, timeout=60_000)
        assert page.locator("[data-testid='stException']").count() == 0
    assert snapshot(db) == ref
    print(f"{loads} page loads while the ingest ran")


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    from tests.demo_db import demo_db as copy

    return copy(tmp_path_factory, tmp_path_factory.mktemp("demo") / "demo.duckdb")


@pytest.mark.slow
@pytest.mark.browser
def test_ten_browser_sessions_at_once(demo_db, chromium_browser):
    """Ten Streamlit sessions at once (ten tabs of one Chromium: a session and its websocket per
    tab), five on Experiments and five on the inspector; no page errors, and the server's
    resident memory comes back near where it started once they close."""
    from tests.app.browser import screenshot, tab, wait_idle

    with Store(demo_db).connect(read_only=True) as con:
        ckpt = con.execute("SELECT min(id) FROM checkpoints").fetchone()[0]
        run_ids = [r[0] for r in con.execute("SELECT id FROM runs ORDER BY id LIMIT 3").fetchall()]
    targets = (f"experiments?runs={','.join(map(str, run_ids))}", f"inspector?ckpt={ckpt}")
    with dashboard(demo_db, "--no-demo") as url:
        [(_, inode)] = listeners(port_of(url))
        pid = pid_of_socket(inode)
        assert pid is not None
        # one warm-up session: imports and caches that live for the server's lifetime, and the
        # scripts the browser keeps cached (the ten tabs are of one context, as a user's are)
        warm = tab(chromium_browser, url, 1200, 900)
        for target in targets:
            warm.goto(f"{url}/{target}")
            wait_idle(warm, timeout=90_000)
        warm.close()
        time.sleep(2)
        start = rss_bytes(pid)
        pages = [tab(chromium_browser, url, 1200, 900) for _ in range(10)]
        t0 = time.monotonic()
        for i, pg in enumerate(pages):              # all ten start before any is waited on
            # the server answers the tenth while nine sessions' scripts hold its GIL: past
            # Playwright's 30 s default in a loaded CI run; latency is not what this tests
            pg.goto(f"{url}/{targets[i % 2]}", wait_until="commit", timeout=180_000)
        for i, pg in enumerate(pages):
            try:
                wait_idle(pg, timeout=180_000)
            except TimeoutError:
                screenshot(pg, f"ten-sessions-stuck-{i}")
                raise
        elapsed = time.monotonic() - t0
        peak = rss_bytes(pid)
        for pg in pages:
            assert pg.locator("[data-testid='stException']").count() == 0
            assert pg.locator("[data-testid='stApp']").count() == 1
            pg.close()
        # Streamlit drops a closed session's state once the websocket is gone.
        end = rss_bytes(pid)
        for _ in range(20):
            if end - start < 300 << 20:
                break
            time.sleep(1)
            end = rss_bytes(pid)
        print(f"server RSS: start {start / 2**20:.0f} MiB, with 10 sessions {peak / 2**20:.0f} MiB, "
              f"after they closed {end / 2**20:.0f} MiB; 10 page runs in {elapsed:.1f} s")
        assert end - start < 300 << 20


def test_xsrf_protection_and_cors_stay_on():
    from app.commands import serve

    cmd = serve.streamlit_command("127.0.0.1", 8501)
    options = dict(zip(cmd[5::2], cmd[6::2]))             # after: python -m app.hostguard run SCRIPT
    assert options["--server.enableXsrfProtection"] == "true" and options["--server.enableCORS"] == "true"
    assert options["--server.address"] == "127.0.0.1" and options["--server.fileWatcherType"] == "none"


@pytest.mark.parametrize("given, used", [(None, "system"), ("jemalloc", "jemalloc")])
def test_the_server_uses_the_system_arrow_pool_unless_told(tmp_path, monkeypatch, given, used):
    """pyarrow's mimalloc pool reserves a 1 GiB arena: the server asks for glibc's malloc
    (``ARROW_DEFAULT_MEMORY_POOL``) unless its environment names a pool."""
    import argparse

    from app.commands import serve

    if given is None:
        monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    else:
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", given)
    started = []
    monkeypatch.setattr(serve.os, "execve", lambda exe, argv, env: started.append(env))
    serve.run(argparse.Namespace(db=tmp_path / "x.duckdb", no_demo=True, host="127.0.0.1", allow_host=[],
                                 port=8501, verbose=True))
    assert started[0]["ARROW_DEFAULT_MEMORY_POOL"] == used
