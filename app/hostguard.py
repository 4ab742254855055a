"""The dashboard's Host allow-list and websocket Origin check, and the launcher that installs them.

DNS rebinding: a page on ``evil.example`` whose name is then re-pointed at
127.0.0.1 talks to a server on this machine as if it were its own origin: the
browser sends ``Host: evil.example:8501`` and, for the websocket, ``Origin:
http://evil.example:8501``, so a same-origin check alone passes. The cure is
to refuse any request whose Host is not a name this server is meant to be
reached by. ``HostGuard`` is an ASGI wrapper around Streamlit's whole
application: a request (HTTP or websocket) whose ``Host`` names another host
gets ``403`` and never reaches Streamlit; a websocket upgrade whose
``Origin`` is not the same allowed host (scheme aside: same host and port as
``Host``) is refused with ``403`` too. A websocket without ``Origin`` (not a
browser, so not a rebinding page) is let through like Streamlit does.

Allowed by default: ``localhost``, ``127.0.0.1``, ``::1`` and the address
given to ``python -m app serve --host``; more with ``--allow-host NAME``
(repeatable) or ``QKVSCOPE_ALLOWED_HOSTS=name1,name2`` (``*`` allows any
Host: the check is off). Ports are not compared with the server's (a
rebinding page uses the server's own port anyway).

How it is installed (``python -m app.hostguard run SCRIPT [streamlit options]``
is what ``serve`` execs): Streamlit 1.67 serves with uvicorn, and its
``UvicornServer.start`` builds the application through the module-level name
``starlette_server.create_starlette_app``; the launcher replaces that name
with a function returning ``HostGuard(original(runtime))`` before Streamlit's
CLI starts. One name is patched, nothing inside Streamlit is edited, and if
the name is missing (a Streamlit that serves differently) the launcher
refuses to start rather than serve unguarded. Streamlit's own
``server.allowedHosts`` (its websocket check) is set to the same names as a
second line. A reverse proxy in front was the alternative: a second server
and port, every websocket frame copied, for the same two header checks.

Deep links (``/experiments``): Streamlit's page looks for its server at two
bases, the page's own path first (``/experiments/_stcore/health`` and
``/_stcore/host-config`` beside it, which Streamlit answers 404 on purpose)
and its parent second, so every deep link left two 404s in the browser's
network log. The guard tells the page where its server is instead: into the
HTML of a page navigation (a GET whose ``Accept`` names ``text/html``, not
under ``/_stcore/``) it writes, first thing in ``<head>``, a script setting
``window.__streamlit.BACKEND_BASE_URL`` (the embedding setting Streamlit's
page reads before it connects, ``BASE_SCRIPT``) to the browser's path minus
the path this server was asked for, so the page connects once, at the right
base, behind a path-stripping proxy too. Such a request is sent on without
``Accept-Encoding`` (the HTML is ~2 kB), so its body arrives uncompressed.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Iterable
from urllib.parse import urlsplit

ENV = "QKVSCOPE_ALLOWED_HOSTS"
#: Streamlit's health endpoint; its answers carry ``SERVER_HEADER``: this process's id, so that a
#: poll (``app.serverlog.announce_when_ready``) knows it reached this server and not another on the port.
READY_PATH = "/_stcore/health"
SERVER_HEADER = b"x-qkvscope-server"


def _with_server_id(send):
    async def wrapped(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              (SERVER_HEADER, str(os.getpid()).encode())]}
        await send(message)
    return wrapped
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")

#: Written first into ``<head>`` of a deep link's HTML; ``%s`` is the path this server was asked
#: for (percent-encoded, as JSON). Where the browser's path ends with it, the server's base is the
#: browser's path without it (``/`` direct, ``/prefix/`` behind a proxy that strips ``/prefix``).
BASE_SCRIPT = ('<script>(function(){var p=location.pathname,s=%s;if(p.slice(-s.length)===s){'
               'window.__streamlit=Object.assign({},window.__streamlit,{BACKEND_BASE_URL:'
               'location.origin+p.slice(0,p.length-s.length)+"/"});}})();</script>')


def is_page_navigation(scope) -> bool:
    """A browser loading a page below the root (``GET /experiments``, ``Accept: text/html...``):
    the requests whose HTML gets ``BASE_SCRIPT``."""
    path = scope.get("path") or "/"
    if scope.get("type") != "http" or scope.get("method") != "GET" or path == "/" \
            or "/_stcore/" in path or path.startswith(("/static/", "/media/", "/component/")):
        return False
    accept = b",".join(v for k, v in scope.get("headers") or [] if k == b"accept")
    return b"text/html" in accept


def with_backend_base(scope):
    """``(scope, wrap)`` for a page navigation: the scope without ``Accept-Encoding``, and a wrapper
    of ``send`` that writes ``BASE_SCRIPT`` after ``<head>`` of an HTML answer (other answers
    pass unchanged)."""
    raw = scope.get("raw_path") or scope["path"].encode()
    served = json.dumps(raw.split(b"?", 1)[0].decode("latin-1")).replace("<", "\\u003c")
    script = (BASE_SCRIPT % served).encode()
    scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers") or [] if k != b"accept-encoding"]}

    def wrap(send):
        held: dict = {}
        chunks: list[bytes] = []

        async def wrapped(message):
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                html = headers.get(b"content-type", b"").startswith(b"text/html") \
                    and b"content-encoding" not in headers and message.get("status") == 200
                if not html:
                    await send(message)
                    return
                held["start"] = message
                return
            if message["type"] != "http.response.body" or "start" not in held:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks).replace(b"<head>", b"<head>" + script, 1)
            start = held.pop("start")
            headers = [(k, str(len(body)).encode() if k == b"content-length" else v)
                       for k, v in start.get("headers") or []]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        return wrapped

    return scope, wrap


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header value (``localhost:8501``, ``[::1]:8501``),
    lower case without a trailing dot; None when it is not a plain host[:port]."""
    value = value.strip()
    if not value or any(c in value for c in "/@?#\\ \t"):
        return None
    try:
        parts = urlsplit(f"//{value}")
        _ = parts.port                              # a port that is not a number raises
    except ValueError:
        return None
    name = parts.hostname
    return name.rstrip(".") if name else None


def allowed_hosts(bind: str | None = None, extra: Iterable[str] = ()) -> list[str]:
    """The allow-list: the defaults, ``bind`` (serve's ``--host``), ``extra``
    (``--allow-host``) and ``$QKVSCOPE_ALLOWED_HOSTS`` (comma-separated)."""
    names = [*DEFAULT_HOSTS, *([bind] if bind else []), *extra,
             *os.environ.get(ENV, "").split(",")]
    out: list[str] = []
    for n in names:
        n = n.strip().lower().strip("[]").rstrip(".")
        if n and n not in out:
            out.append(n)
    return out


class HostGuard:
    """ASGI wrapper: refuse foreign ``Host`` headers, and websocket upgrades
    from another origin, before the wrapped application sees them."""

    def __init__(self, app, allowed: Iterable[str]):
        self.app = app
        self.allowed = frozenset(allowed)

    def refusal(self, scope) -> str | None:
        """Why this request is refused, or None."""
        headers = scope.get("headers") or []
        hosts = [v.decode("latin-1") for k, v in headers if k == b"host"]
        if len(hosts) != 1:
            return "request without exactly one Host header"
        name = host_name(hosts[0])
        if name is None or ("*" not in self.allowed and name not in self.allowed):
            return f"Host {hosts[0]!r} is not one this server answers to"
        if scope["type"] == "websocket":
            origins = [v.decode("latin-1") for k, v in headers if k == b"origin"]
            if not origins:
                return None
            origin = urlsplit(origins[0].strip())
            if len(origins) != 1 or origin.scheme not in ("http", "https") or \
                    origin.netloc.lower() != hosts[0].strip().lower():
                return f"websocket from origin {origins[0]!r}, not this server's {hosts[0]!r}"
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        why = self.refusal(scope)
        if why is None and scope["type"] == "http" and scope.get("path") == READY_PATH:
            await self.app(scope, receive, _with_server_id(send))
            return
        if why is None and is_page_navigation(scope):
            scope, wrap = with_backend_base(scope)
            await self.app(scope, receive, wrap(send))
            return
        if why is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})   # before accept: HTTP 403
            return
        body = (f"403 Forbidden: {why}. qkvscope answers to {', '.join(sorted(self.allowed))}; "
                f"add a name with `python -m app serve --allow-host NAME` or {ENV}.\n").encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def install(allowed: Iterable[str]) -> None:
    """Wrap the application Streamlit's server builds in ``HostGuard``; raise
    ``RuntimeError`` when this Streamlit builds it some other way."""
    # here: streamlit internals, the launched server only
    from streamlit.web.server.starlette import starlette_server

    original = getattr(starlette_server, "create_starlette_app", None)
    if original is None or not hasattr(starlette_server, "UvicornServer"):
        raise RuntimeError("this Streamlit does not build its server through "
                           "starlette_server.create_starlette_app; the Host check cannot be installed")
    allowed = list(allowed)

    def guarded(runtime):
        return HostGuard(original(runtime), allowed)

    starlette_server.create_starlette_app = guarded


def main(argv: list[str]) -> int:
    """``python -m app.hostguard run SCRIPT [streamlit options]``: Streamlit's CLI
    with the guard installed; the allow-list comes from ``$QKVSCOPE_ALLOWED_HOSTS``."""
    from app import serverlog  # here: the launched server only (the CLI imports allowed_hosts)

    allowed = allowed_hosts()
    if serverlog.terminal() is not None:       # serve sent the output to its log: say what matters
        serverlog.show_errors()
        options = dict(zip(argv[2::2], argv[3::2]))     # after: run SCRIPT
        host = options.get("--server.address", "127.0.0.1")
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)   # any address: loopback
        url_host = f"[{host}]" if ":" in host else host
        serverlog.announce_when_ready(f"http://{url_host}:{options.get('--server.port', '8501')}")
    try:
        install(allowed)
    except (ImportError, RuntimeError) as exc:
        print(f"error: {exc}; not starting the dashboard unguarded", file=sys.stderr)
        return 2
    from streamlit.web import cli  # here: streamlit loads only when the server starts

    flags = [a for h in allowed for a in ("--server.allowedHosts", h)]
    sys.argv = ["streamlit", *argv, *flags]
    try:
        return cli.main(prog_name="streamlit")
    except SystemExit as exc:
        if exc.code not in (0, None) and serverlog.terminal() is not None:
            serverlog.say(f"qkvscope: the server stopped (exit status {exc.code}); the end of its log:")
            for line in serverlog.tail():
                serverlog.say(f"  {line}")
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
