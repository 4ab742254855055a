"""Start the dashboard (Streamlit) on 127.0.0.1.

Examples:
  python -m app serve                       # data/qkvscope.duckdb, port 8501
  python -m app serve --db my.duckdb --port 8600
  python -m app serve --host 0.0.0.0 --allow-host myserver.lan   # other machines: see docs/security.md

On the first start with the default database (or when it holds no run and no
checkpoint), the bundled demo experiments (data/demo) are ingested so that
the pages have something to show.

The server answers only requests whose Host header is localhost, 127.0.0.1,
::1 or the --host address, plus each --allow-host NAME and the names in
QKVSCOPE_ALLOWED_HOSTS (comma-separated; "*" turns the check off); a
websocket must come from the same allowed host (app/hostguard.py: DNS
rebinding).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

from app.commands._common import add_db_argument
from app.hostguard import ENV, allowed_hosts
from app import paths  # paths.DEMO_DIR read when called (tests point it elsewhere)
from app.paths import ROOT
from loaders.errors import QkvscopeError
from loaders.ingest import ingest_paths
from loaders.queries import summary
from loaders.store import Store, default_db_path

NAME = "serve"
HELP = "start the dashboard in the browser"


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
    report = ingest_paths(Store(db_path), [demo])
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
    env = dict(os.environ, QKVSCOPE_DB=str(db), PYTHONPATH=str(ROOT), **{ENV: ",".join(hosts)})
    # app.hostguard installs the Host allow-list and the websocket Origin check, then runs
    # `streamlit run` (it refuses to start when it cannot install them).
    cmd = [sys.executable, "-m", "app.hostguard", "run", str(ROOT / "app" / "dashboard" / "streamlit_app.py"),
           "--server.address", args.host, "--server.port", str(args.port),
           "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"qkvscope: http://{args.host}:{args.port}  (database {db}; answers to {', '.join(hosts)})",
          file=sys.stderr)
    os.chdir(ROOT)  # streamlit reads .streamlit/config.toml from the working directory
    os.execve(sys.executable, cmd, env)
    return 0  # not reached: execve replaces this process
