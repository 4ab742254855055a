"""Start the dashboard (Streamlit) on 127.0.0.1.

Examples:
  python -m app serve                       # data/qkvscope.duckdb, port 8501
  python -m app serve --db my.duckdb --port 8600
  python -m app serve --host 0.0.0.0        # reachable from other machines: see README

On the first start with the default database, the bundled demo experiments
(data/demo) are ingested so that the pages have something to show.
"""
from __future__ import annotations

import argparse
import os
import sys

from app.commands._common import add_db_argument

NAME = "serve"
HELP = "start the dashboard in the browser"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_db_argument(parser)
    parser.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1, this machine only). Anything "
                             "else lets every host that reaches it browse your server's files "
                             "through the ingest form and upload files.")
    parser.add_argument("--no-demo", action="store_true",
                        help="do not ingest the bundled demo into a new database")


def ensure_demo(db_path, *, quiet: bool = False) -> None:
    """Ingest data/demo into a database that does not exist yet."""
    from app.paths import DEMO_DIR
    from loaders.ingest import ingest_paths
    from loaders.store import Store

    if db_path.exists() or not DEMO_DIR.exists():
        return
    if not quiet:
        print(f"First start: building {db_path} from the bundled demo ({DEMO_DIR})...",
              file=sys.stderr)
    report = ingest_paths(Store(db_path), [DEMO_DIR])
    if not quiet:
        j = report.to_json()
        print(f"  {j['added']} files added, {j['skipped']} skipped, {j['errors']} errors",
              file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from app.paths import ROOT
    from loaders.store import default_db_path

    db = (args.db or default_db_path()).expanduser().resolve()
    if not args.no_demo and args.db is None:
        ensure_demo(db)
    env = dict(os.environ, QKVSCOPE_DB=str(db), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "dashboard" / "streamlit_app.py"),
           "--server.address", args.host, "--server.port", str(args.port),
           "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"qkvscope: http://{args.host}:{args.port}  (database {db})", file=sys.stderr)
    os.chdir(ROOT)  # streamlit reads .streamlit/config.toml from the working directory
    os.execve(sys.executable, cmd, env)
    return 0  # not reached: execve replaces this process
