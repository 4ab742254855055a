"""A real dashboard server and Debian's Chromium, for the browser tier.

``dashboard(db)`` starts ``python -m app serve`` exactly as the README's quickstart does
(on a free port) and yields its URL; ``chromium()`` drives ``/usr/bin/chromium`` through
Playwright (never a downloaded browser). The page tests of a file share one Chromium
(``tests/app/conftest.py``'s ``chromium_browser``) and one server per database they read;
``session(served, width, height)`` gives each test a Streamlit session of its own on it: a new
tab (Streamlit keeps one session per tab, one websocket each) in the browser's one context,
opened with the origin's cookies and storage cleared, so no test sees another's state.

What keeps Chromium's CPU down without changing what a page shows: the tabs of one context
share its HTTP cache, so the dashboard's scripts are fetched and compiled once (V8's code cache)
rather than once a test; ``--process-per-site`` lets the tabs of one server share a renderer
process, so a script compiled in one tab is reused by the next; the context asks for reduced
motion (``prefers-reduced-motion: reduce``, a setting users choose), so Streamlit's spinners
and transitions do not repaint sixty times a second while a test waits.
Screenshots go to ``test-output/screenshots/``.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = ROOT / "test-output" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--process-per-site"]
CONTEXT = {"reduced_motion": "reduce", "viewport": {"width": 1400, "height": 1000}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard(db: Path, *extra: str, timeout: float = 90.0, preexec_fn=None):
    """The server's URL, once it answers; ``preexec_fn`` runs in the server's process before it
    starts (``resource.setrlimit``: a limit of the server's own, which its children inherit)."""
    port = free_port()
    log = open(db.parent / f"server-{port}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--db", str(db), "--port", str(port), *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        preexec_fn=preexec_fn)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {(db.parent / f'server-{port}.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become healthy")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextlib.contextmanager
def chromium():
    """One Chromium for several tests (a module-scoped fixture), with one context (``CONTEXT``)
    already open, ``browser.contexts[0]``, in which ``session`` and ``tab`` open their tabs."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (bash scripts/setup.sh --dev installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            browser.new_context(**CONTEXT)
            yield browser
        finally:
            browser.close()


def tab(browser, url: str, width: int = 1400, height: int = 1000):
    """A new tab in the browser's one context, its viewport ``width`` x ``height``, with the
    cookies and storage (local storage: Streamlit keeps the sidebar's state there) of ``url``'s
    origin cleared; the caller closes it (``page.close()``)."""
    page = browser.contexts[0].new_page()
    page.set_viewport_size({"width": width, "height": height})
    parts = urllib.parse.urlsplit(url)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Storage.clearDataForOrigin", {"origin": f"{parts.scheme}://{parts.netloc}",
                                            "storageTypes": "cookies,local_storage,indexeddb,cache_storage"})
    cdp.detach()
    return page


@contextlib.contextmanager
def session(served: tuple, width: int = 1400, height: int = 1000):
    """A new Streamlit session on a shared server and Chromium, ``served = (url, browser)``: the
    server's URL and a new tab (``tab``), closed on the way out."""
    url, browser = served
    page = tab(browser, url, width, height)
    try:
        yield url, page
    finally:
        page.close()


@contextlib.contextmanager
def browser_page(viewport=(1400, 1000)):
    with chromium() as browser:
        page = browser.contexts[0].new_page()
        page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
        yield page


IDLE = """([selector, quiet, key]) => {
    const now = performance.now();
    if (document.querySelector(selector)) { delete window[key]; return false; }
    window[key] ??= now;
    return now - window[key] >= quiet;
}"""


def wait_idle(page, timeout: float = 30_000, quiet_ms: int = 1500) -> None:
    """Wait until Streamlit has finished running the script.

    The status widget ("Running...", "Stop") appears only some hundreds of
    milliseconds into a run, so idle means: no status widget for ``quiet_ms``
    in a row, looked for every 250 ms by the page itself (not a round trip to Playwright a look).
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.wait_for_selector("[data-testid='stApp']", timeout=timeout)
    try:
        page.wait_for_function(IDLE, arg=["[data-testid='stStatusWidget']", quiet_ms, f"idle{time.monotonic_ns()}"],
                               polling=250, timeout=timeout)
    except PlaywrightTimeout:
        raise TimeoutError(f"the page was still running after {timeout / 1000:.0f} s") from None


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def reading_children(url: str) -> set[int]:
    """Pids of the reading children (``python -m app.sandbox_jobs``, ``python -m loaders.sandbox``) of the server at ``url``
    (the process whose command line names its port), zombies left out; read from ``/proc``."""
    port = url.rsplit(":", 1)[1]

    def read(pid: str) -> tuple[list[str], str, str]:
        """(command line, state, parent pid); empty for a process that is gone."""
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            return [], "", ""
        return cmd, state, ppid

    procs = {pid: read(pid) for pid in os.listdir("/proc") if pid.isdigit()}
    servers = {pid for pid, (cmd, _, _) in procs.items()
               if "--server.port" in cmd and cmd[cmd.index("--server.port") + 1:][:1] == [port]}
    return {int(pid) for pid, (cmd, state, ppid) in procs.items()
            if ("app.sandbox_jobs" in cmd or "loaders.sandbox" in cmd) and ppid in servers and state != "Z"}
