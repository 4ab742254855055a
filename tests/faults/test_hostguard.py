"""DNS rebinding: the dashboard answers only its own host names (app/hostguard.py).

The guard on its own (an ASGI app behind it), then a real ``python -m app
serve`` spoken to with raw HTTP: a foreign ``Host`` gets 403 and never
reaches Streamlit, a websocket upgrade from a foreign ``Origin`` gets 403, the
right host gets 200 / 101.
"""
from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.hostguard import HostGuard, allowed_hosts, host_name
from loaders.store import Store

ROOT = Path(__file__).resolve().parents[2]


def _scope(kind: str, host: str | None, origin: str | None = None) -> dict:
    headers = [] if host is None else [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"type": kind, "path": "/", "headers": headers}


def _through(guard: HostGuard, scope: dict) -> tuple[bool, list[dict]]:
    """(reached the app, messages the guard sent)."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope)

    async def receive():
        return {"type": "http.request"}

    async def send(msg):
        sent.append(msg)

    asyncio.run(guard(scope, receive, send))
    return bool(reached), sent


GUARD = HostGuard(None, allowed_hosts("10.1.2.3", ["box.lan"]))


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:8501", True), ("localhost:8501", True), ("LOCALHOST.:8501", True), ("[::1]:8501", True),
    ("10.1.2.3:8501", True), ("box.lan", True),
    ("evil.example:8501", False), ("localhost.evil.example:8501", False), ("127.0.0.1.nip.io:8501", False),
    ("evil.example@127.0.0.1:8501", False), ("127.0.0.1:85x1", False), ("", False), (None, False),
])
def test_http_host_allow_list(host, ok):
    reached = []

    async def app(scope, receive, send):
        reached.append(1)

    guard = HostGuard(app, GUARD.allowed)
    _, sent = _through(guard, _scope("http", host))
    assert bool(reached) == ok
    if not ok:
        assert sent[0]["status"] == 403
        assert b"qkvscope answers to 10.1.2.3, 127.0.0.1, ::1, box.lan, localhost" in sent[1]["body"]


@pytest.mark.parametrize("host, origin, ok", [
    ("127.0.0.1:8501", "http://127.0.0.1:8501", True),
    ("localhost:8501", "http://localhost:8501", True),
    ("127.0.0.1:8501", None, True),                            # not a browser
    ("evil.example:8501", "http://evil.example:8501", False),   # the rebinding page: same origin, foreign host
    ("127.0.0.1:8501", "http://evil.example:8501", False),
    ("127.0.0.1:8501", "http://localhost:8501", False),         # another allowed host is another origin
    ("127.0.0.1:8501", "http://127.0.0.1:9999", False),
    ("127.0.0.1:8501", "null", False),
    ("127.0.0.1:8501", "file://127.0.0.1:8501", False),
])
def test_websocket_origin_must_be_the_same_allowed_host(host, origin, ok):
    reached = []

    async def app(scope, receive, send):
        reached.append(1)

    _, sent = _through(HostGuard(app, GUARD.allowed), _scope("websocket", host, origin))
    assert bool(reached) == ok
    if not ok:
        assert sent == [{"type": "websocket.close", "code": 1008}]   # before accept: uvicorn answers 403


def test_lifespan_passes_through():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    _through(HostGuard(app, ["localhost"]), {"type": "lifespan"})
    assert reached == ["lifespan"]


def test_allow_list_from_flags_and_environment(monkeypatch):
    monkeypatch.setenv("QKVSCOPE_ALLOWED_HOSTS", " Lab.Example., ,[fe80::1]")
    assert allowed_hosts("0.0.0.0", ["box.lan", "localhost"]) == [
        "localhost", "127.0.0.1", "::1", "0.0.0.0", "box.lan", "lab.example", "fe80::1"]
    assert host_name("[FE80::1]:80") == "fe80::1"
    star = HostGuard(None, ["*"])
    assert star.refusal(_scope("http", "anything.example")) is None


def test_the_launcher_refuses_to_start_when_it_cannot_install_the_guard(monkeypatch, capsys):
    from streamlit.web.server.starlette import starlette_server

    import app.hostguard as hg

    monkeypatch.delattr(starlette_server, "create_starlette_app")
    assert hg.main(["run", "nothing.py"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: this Streamlit does not build its server through starlette_server.create_starlette_app")


def _raw(port: int, request: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request.encode())
        s.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        if data.startswith(b"HTTP/1.1 403"):
            try:
                while chunk := s.recv(65536):
                    data += chunk
            except OSError:
                pass
    return data.decode("latin-1")


def _get(port: int, host: str, path: str = "/_stcore/health") -> str:
    return _raw(port, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")


def _upgrade(port: int, host: str, origin: str) -> str:
    key = base64.b64encode(os.urandom(16)).decode()
    return _raw(port, f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\n"
                      f"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                      f"Sec-WebSocket-Key: {key}\r\n\r\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real server for this file's tests (an empty database, ``qkv.test`` allowed besides this
    machine's names): its URL and its log file."""
    from tests.app.browser import dashboard

    db = tmp_path_factory.mktemp("served") / "db.duckdb"
    Store(db).migrate()
    with dashboard(db, "--no-demo", "--allow-host", "qkv.test") as url:
        yield url, db.parent / f"server-{url.rsplit(':', 1)[1]}.log"


@pytest.mark.slow
def test_a_real_server_refuses_foreign_hosts_and_origins(server):
    url, server_log = server
    port = int(url.rsplit(":", 1)[1])
    here = f"127.0.0.1:{port}"
    for host in (here, f"localhost:{port}", f"qkv.test:{port}"):
        assert _get(port, host).startswith("HTTP/1.1 200"), host
    assert _get(port, here, "/").startswith("HTTP/1.1 200")
    for path in ("/", "/_stcore/health", "/_stcore/upload_file/x/y", "/static/index.html"):
        got = _get(port, f"evil.example:{port}", path)
        assert got.startswith("HTTP/1.1 403"), (path, got[:300])
        assert "Host 'evil.example:" in got and "not one this server answers to" in got
    assert _upgrade(port, here, f"http://{here}").startswith("HTTP/1.1 101")
    for host, origin in ((f"evil.example:{port}", f"http://evil.example:{port}"),
                         (here, f"http://evil.example:{port}"), (here, "null")):
        got = _upgrade(port, host, origin)
        assert got.startswith("HTTP/1.1 403"), (host, origin, got[:300])
    log = server_log.read_text()
    assert f"answers to localhost, 127.0.0.1, ::1, qkv.test" in log


def test_serve_help_names_the_allow_list():
    out = subprocess.run([sys.executable, "-m", "app", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60).stdout
    text = " ".join(out.split())
    assert "--allow-host NAME" in text and "QKVSCOPE_ALLOWED_HOSTS" in text


def _html_app(body: bytes, content_type: bytes = b"text/html; charset=utf-8"):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})
    return app, seen


def _page(path: str, accept: str = "text/html,application/xhtml+xml", method: str = "GET") -> dict:
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
            "headers": [(b"host", b"127.0.0.1:8501"), (b"accept", accept.encode()),
                        (b"accept-encoding", b"gzip, deflate")]}


PAGE = b"<!DOCTYPE html><html><head><title>x</title></head><body></body></html>"


def test_a_deep_link_learns_where_its_server_is():
    app, seen = _html_app(PAGE)
    _, sent = _through(HostGuard(app, ["127.0.0.1"]), _page("/experiments"))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    script = b'<script>(function(){var p=location.pathname,s="/experiments";if(p.slice(-s.length)===s){'
    assert body.startswith(b"<!DOCTYPE html><html><head>" + script)
    assert body.endswith(b"</script><title>x</title></head><body></body></html>")
    assert b'BACKEND_BASE_URL:location.origin+p.slice(0,p.length-s.length)+"/"' in body
    assert dict(sent[0]["headers"])[b"content-length"] == str(len(body)).encode()
    # sent on uncompressed, so the HTML can be read
    assert [k for k, _ in seen[0]["headers"]] == [b"host", b"accept"]


@pytest.mark.parametrize("scope", [
    _page("/"),                                                     # the root has one base already
    _page("/experiments", accept="*/*"),                            # a fetch, not a page
    _page("/experiments", method="POST"),
    _page("/experiments/_stcore/health"),
    _page("/static/js/index.js"),
])
def test_other_requests_pass_unchanged(scope):
    app, seen = _html_app(PAGE)
    _, sent = _through(HostGuard(app, ["127.0.0.1"]), scope)
    assert b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body") == PAGE
    assert seen[0]["headers"] == scope["headers"]


def test_a_deep_link_that_is_not_html_passes_unchanged():
    app, _ = _html_app(b'{"not": "a page, but long enough"}', content_type=b"application/json")
    _, sent = _through(HostGuard(app, ["127.0.0.1"]), _page("/experiments"))
    assert b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body") == \
        b'{"not": "a page, but long enough"}'


def test_a_path_that_could_close_the_script_is_escaped():
    app, _ = _html_app(PAGE)
    _, sent = _through(HostGuard(app, ["127.0.0.1"]), _page("/a</script><b>"))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert body.count(b"</script>") == 1            # only the script's own end
    assert b's="/a\\u003c/script>\\u003cb>"' in body


@pytest.mark.browser
@pytest.mark.slow
def test_deep_links_in_chromium_request_nothing_that_is_not_there(server):
    """Chromium opens deep links: no request of the page answers 4xx (Streamlit's page asked for
    ``/<page>/_stcore/health`` and ``host-config`` first, 404 each), the page connects and draws
    the page linked to, and the URL stays the deep link."""
    from tests.app.browser import browser_page, wait_idle

    url, _ = server
    with browser_page() as page:
        failed = []
        page.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
        page.on("requestfailed", lambda r: failed.append(("failed", r.url)))
        for path, heading in (("/experiments", "Experiments"), ("/kv-cost", "KV cache & serving cost")):
            page.goto(f"{url}{path}")
            wait_idle(page, timeout=90_000)
            page.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)
            assert failed == [], path
            assert page.url.split("?")[0] == f"{url}{path}"
