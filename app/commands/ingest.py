"""Store every checkpoint and training log found under the given paths.

Examples:
  python -m app ingest path/to/runs/ --db my.duckdb
  python -m app ingest ~/experiments/ --json
  python -m app ingest ~/sweeps/lr-grid/ --project lr-grid
  python -m app ingest ~/experiments/ --watch        # follow live runs; Ctrl-C stops
                                                    # (a busy database is tried again at the next poll)

Experiment trackers' stores are read as their runs, one stored run per
tracker run, named as the tracker names it, its config and params giving lr,
weight decay, seed and model size, its project or experiment kept:
  wandb/offline-run-*/, wandb/run-*/   W&B run folders (run-<id>.wandb + files/config.yaml)
  mlruns/<experiment>/<run>/           MLflow's file store
  mlflow.db                            MLflow's SQLite store (every run in it)
  <project>.db                         trackio's project file (every run in it)
A folder whose name starts with a dot is searched only when it holds one of
these (e.g. .cache/wandb/); others are skipped with the reason. An Aim
repository (.aim/) is reported, not read (RocksDB): export its metrics to CSV.

Each file is one transaction: it is stored completely or not at all. The same
content ingested twice adds nothing; a log that grew adds only its new points.
Files that are neither checkpoints nor logs are skipped with the reason, and so
is what is never opened: FIFOs, sockets, devices, symbolic links that loop or
lead out of the folder, folders more than 64 levels down. A file that cannot
be read is one ``error`` line (``PATH: what``; names that are not printable
are quoted); the folder's other files are still ingested.
Each file is read by a child process under a memory limit
(``QKVSCOPE_PARSE_MEMORY_MB`` plus the file's size) and a time limit
(``QKVSCOPE_PARSE_TIMEOUT_S``): a file that needs more is one ``error`` line
and nothing of it is stored.
Every run and checkpoint belongs to a project; the pages compare runs of one project
only. By default it is the tracker's own project name where the log states one, else
the name of the folder ingested (a file: its folder's name); `--project NAME` puts
everything read from PATH... into NAME, also what was stored before. A correction with
`python -m app run-meta ID --set project=NAME` wins over both.
Exit status: 0, or 2 when some file had an error (the others are stored).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time

from app.commands._common import add_db_argument, add_download_argument, checkpoint_path, print_json, store_from
from loaders.report import one_line, shown

NAME = "ingest"
HELP = "store the checkpoints and training logs found under PATH..."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="files or folders, or Hugging Face names (org/name) in the local cache")
    add_download_argument(parser)
    add_db_argument(parser)
    parser.add_argument("--project", metavar="NAME", default=None,
                        help="put every run and checkpoint read from PATH... into project NAME (default: the "
                             "tracker's own project name, else the name of the folder ingested)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--watch", action="store_true",
                        help="keep polling PATH... and ingest new or grown files until stopped")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between polls with --watch (default 2)")


class Progress:
    """Files done / total on stderr while an ingest runs: a bar redrawn in place on a terminal,
    else (a log, a pipe) once it has run ``quiet`` seconds, one line at most every ``every``
    seconds and one at the end (``label: 40/198 files, 12 s``): a short ingest in a script
    leaves stderr to its errors."""

    def __init__(self, label: str = "ingest", *, every: float = 2.0, quiet: float = 5.0, stream=None):
        self.label, self.every, self.quiet = label, every, quiet
        self.stream = stream if stream is not None else sys.stderr     # looked up now, not at import
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int, path: str) -> None:
        if not total:
            return
        now = time.monotonic()
        if self.tty:
            width = 30
            fill = int(width * done / total)
            self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {one_line(path)[-40:]:<40}")
            if done == total:
                self.stream.write("\n")
        elif now - self.start < self.quiet:
            return
        elif done == total or now - self.last >= self.every:
            self.last = now
            self.stream.write(f"{self.label}: {done}/{total} files, {now - self.start:.0f} s\n")
        self.stream.flush()


def print_report(report) -> None:
    for f in report.files:
        if f.status in ("added", "appended", "error", "skipped"):
            what = f.format or f.kind
            detail = f" ({f.reason})" if f.reason else ""
            extra = f", {f.n_points} points" if f.n_points else ""
            print(one_line(f"{f.status:<9} {what:<18} ") + shown(f.path) + one_line(f"{extra}{detail}"))
    j = report.to_json()
    print(f"{j['added']} added, {j['appended']} appended, {j['unchanged']} unchanged, "
          f"{j['skipped']} skipped, {j['errors']} errors")


def run(args: argparse.Namespace) -> int:
    # Each file is read (and stored) by a child process under a memory and a time
    # limit (loaders/sandbox.py); this process only walks the folders.
    from loaders.sandbox import ingest_paths, watch

    args.paths = [checkpoint_path(p, args.download) for p in args.paths]
    store = store_from(args)
    if args.watch:
        def on_report(report) -> None:
            changed = [f for f in report.files if f.status in ("added", "appended", "error")]
            if changed:
                if args.json:
                    print_json({**report.to_json(), "files": [f.to_json() for f in changed]})
                else:
                    print_report(type(report)(files=changed))
                sys.stdout.flush()
        def on_busy(exc) -> None:        # another process holds the file: try again next poll
            print(f"warning: {exc}; trying again in {args.interval:g} s", file=sys.stderr, flush=True)

        # Ctrl-C ends the watch even when this process was started with SIGINT ignored (a parent
        # that ignores it, as some job runners and test workers do, passes that on to its children)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            watch(store, args.paths, interval=args.interval, on_report=on_report, on_busy=on_busy,
                  project=args.project)
        except KeyboardInterrupt:
            return 0
        return 0
    report = ingest_paths(store, args.paths, progress=Progress(), project=args.project)
    if args.json:
        print_json(report.to_json())
    else:
        print_report(report)
    return 2 if report.count("error") else 0
