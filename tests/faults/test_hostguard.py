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


@pytest.mark.slow
def test_a_real_server_refuses_foreign_hosts_and_origins(tmp_path):
    from tests.app.browser import dashboard

    db = tmp_path / "db.duckdb"
    Store(db).migrate()
    with dashboard(db, "--no-demo", "--allow-host", "qkv.test") as url:
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
        log = (tmp_path / f"server-{port}.log").read_text()
        assert f"answers to localhost, 127.0.0.1, ::1, qkv.test" in log


def test_serve_help_names_the_allow_list():
    out = subprocess.run([sys.executable, "-m", "app", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60).stdout
    text = " ".join(out.split())
    assert "--allow-host NAME" in text and "QKVSCOPE_ALLOWED_HOSTS" in text
