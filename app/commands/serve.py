"""Start the dashboard (Streamlit) on 127.0.0.1.

Examples:
  python -m app serve                       # data/qkvscope.duckdb, port 8501
  python -m app serve --db my.duckdb --port 8600
  python -m app serve --host 0.0.0.0 --allow-host myserver.lan   # other machines: see docs/security.md

On the first start with the default database (or when it holds no run and no
checkpoint), the bundled demo experiments (data/demo) are ingested so that
the pages have something to show.

The terminal shows qkvscope's own lines: the address once the dashboard
answers, errors, and the end of the log if the server stops with one. The
server's other output (Streamlit's, warnings and progress bars of the
libraries that load models) goes to the log file beside the database
(data/qkvscope.log for data/qkvscope.duckdb); --verbose keeps it in the
terminal (app/serverlog.py).

The server answers only requests whose Host header is localhost, 127.0.0.1,
::1 or the --host address, plus each --allow-host NAME and the names in
QKVSCOPE_ALLOWED_HOSTS (comma-separated; "*" turns the check off); a
websocket must come from the same allowed host (app/hostguard.py: DNS
rebinding). A deep link (/experiments) is told where its server is, so the
page asks for nothing that is not there (app/hostguard.py: deep links).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

from app.commands._common import add_db_argument
from app import serverlog
from app.commands.ingest import Progress
from app.hostguard import ENV, allowed_hosts
from app import paths  # paths.DEMO_DIR read when called (tests point it elsewhere)
from loaders.errors import QkvscopeError
from loaders.ingest import ingest_paths
from loaders.queries import summary
from loaders.store import Store, default_db_path

NAME = "serve"
HELP = "start the dashboard in the browser"

#: The dashboard's entry script, run by Streamlit.
SCRIPT = Path(__file__).resolve().parents[1] / "dashboard" / "streamlit_app.py"
#: Streamlit's settings, passed as ``--section.key value`` options of ``streamlit run`` (so no
#: ``.streamlit/config.toml`` in the working directory is needed; options override any that is
#: there). ``server.address``/``server.port`` come from ``--host``/``--port``, and
#: ``server.allowedHosts`` from the allow-list (``app.hostguard``).
STREAMLIT_OPTIONS: dict[str, str] = {
    "server.headless": "true",
    # Megabytes. Larger checkpoints: give a server path in the inspector instead.
    "server.maxUploadSize": "2048",
    "server.runOnSave": "false",
    # A served tool, not a development server: no watcher walking the source tree (its polling
    # costs CPU beside the analyses, and an edit in a checkout would offer every user a rerun).
    "server.fileWatcherType": "none",
    # Said explicitly (they are Streamlit's defaults): uploads and widget posts need the
    # XSRF cookie, and cross-origin requests are refused.
    "server.enableXsrfProtection": "true",
    "server.enableCORS": "true",
    "browser.gatherUsageStats": "false",
    "theme.primaryColor": "#6366F1",
    "theme.backgroundColor": "#FFFFFF",
    "theme.secondaryBackgroundColor": "#F4F5FB",
    "theme.textColor": "#1F2333",
    "theme.font": "sans serif",
    # No "Deploy" button: this is a local tool.
    "client.toolbarMode": "viewer",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_db_argument(parser)
    parser.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1, this machine only). Anything "
                             "else lets every host that reaches it browse your server's files "
                             "through the ingest form and upload files.")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests for this host name (repeatable; default: "
                             "localhost, 127.0.0.1, ::1 and --host; also QKVSCOPE_ALLOWED_HOSTS)")
    parser.add_argument("--no-demo", action="store_true",
                        help="do not ingest the bundled demo into a new database")
    parser.add_argument("--verbose", action="store_true",
                        help="leave the server's own output (Streamlit, transformers' load reports, warnings) "
                             "in the terminal instead of the log file beside the database (<db>.log)")


def is_empty(db_path) -> bool:
    """True when ``db_path`` does not exist or holds no run and no checkpoint
    (a database that cannot be read is not empty: it is left alone)."""

    if not db_path.exists():
        return True
    try:
        held = summary(Store(db_path))
    except QkvscopeError:
        return False
    return held["runs"] == 0 and held["checkpoints"] == 0


def ensure_demo(db_path, *, quiet: bool = False) -> None:
    """Ingest data/demo into a database that does not exist yet or is empty."""
    demo = paths.DEMO_DIR
    if not demo.exists() or not is_empty(db_path):
        return
    if not quiet:
        print(f"First start: building {db_path} from the bundled demo ({demo})...",
              file=sys.stderr)
    report = ingest_paths(Store(db_path), [demo], progress=None if quiet else Progress("demo ingest"))
    if not quiet:
        j = report.to_json()
        print(f"  {j['added']} files added, {j['skipped']} skipped, {j['errors']} errors",
              file=sys.stderr)
        for line in skipped_lines(j):
            print(line, file=sys.stderr)


def skipped_lines(report: dict) -> list[str]:
    """What an ingest skipped, grouped by reason (``  24 skipped: configuration file: ...``)."""
    reasons = Counter(f.get("reason") or "no reason given" for f in report.get("files", [])
                      if f.get("status") == "skipped")
    return [f"  {n} skipped: {reason}" for reason, n in reasons.most_common()]


def run(args: argparse.Namespace) -> int:

    db = (args.db or default_db_path()).expanduser().resolve()
    if not args.no_demo and args.db is None:
        ensure_demo(db)

    hosts = allowed_hosts(args.host, args.allow_host)
    env = dict(os.environ, QKVSCOPE_DB=str(db), **{ENV: ",".join(hosts)})
    # pyarrow's default pool (mimalloc) reserves a 1 GiB arena at its first use: a third of a
    # server under a 3 GiB address space (ulimit -v), where a SQL result inside the 64 MB budget
    # then fails with MemoryError. glibc's malloc reserves nothing ahead and keeps less of a
    # result after (60 MB of strings: +155 MB held against +260 MB).
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    print(f"qkvscope: http://{args.host}:{args.port}  (database {db}; answers to {', '.join(hosts)})",
          file=sys.stderr)
    if not args.verbose:
        log = serverlog.log_path_for(db)
        print(f"qkvscope: starting the server; its output and third-party messages go to {log}", file=sys.stderr)
        env.update(serverlog.redirect(log))
    os.execve(sys.executable, streamlit_command(args.host, args.port), env)
    return 0  # not reached: execve replaces this process


def streamlit_command(host: str, port: int) -> list[str]:
    """The server's command line: ``app.hostguard`` installs the Host allow-list and the websocket
    Origin check, then runs ``streamlit run SCRIPT`` with ``STREAMLIT_OPTIONS`` (it refuses to
    start when it cannot install them)."""
    options = {**STREAMLIT_OPTIONS, "server.address": host, "server.port": str(port)}
    return [sys.executable, "-m", "app.hostguard", "run", str(SCRIPT),
            *(a for key, value in options.items() for a in (f"--{key}", value))]
