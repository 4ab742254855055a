"""Batch analysis speed: ``analyze --all`` over the bundled demo checkpoints, in-process and on Ray.

Ingests the bundled demo (``data/demo``, ``app.paths.DEMO_DIR``; ``--demo DIR``
for another folder) into a fresh DuckDB once, prints how many checkpoints it
holds, then runs the real command line on a fresh copy of that database per
mode, so nothing is cached or skipped, over the same checkpoints, one mode
after the other in this one run:

* ``in-process``: ``python -m app analyze --all --db COPY --results COPY.results --json``
  (one checkpoint after the other, each computed in its reading child);
* ``ray``: the same with ``--ray local`` and ``RAY_OVERRIDE_RESOURCES='{"CPU": N}'``
  (``--workers N``, default 2), so the local Ray instance the command starts
  runs N tasks at once (each task asks for one CPU; Ray gives its workers
  ``OMP_NUM_THREADS=1``), whatever the machine's core count.

For each mode it prints the exit status, the batch JSON's ``computed``,
``skipped`` and ``failed`` counts, the wall time of the whole command (Python
and torch imports, Ray's start, registration in the database included),
checkpoints per minute, the time to the first finished checkpoint, and the
rate over the later half of the checkpoints (from the times of the command's
``[i/n] checkpoint ...`` progress lines), which separates the fixed start cost
(imports, Ray's start) from the throughput. Then the speed-up Ray /
in-process, of the wall times and of the later-half rates. Each figure is one ``BENCH_ROW {json}`` line for
``bench/run_all.py``. Issue 20 sets no target for them (``result`` is ``-``): two
workers on a 2-core machine that also runs the driver need not be faster.

Exit status 1 when a mode's command exits non-zero, a checkpoint failed, or
not every checkpoint was computed (a skipped one would mean the figure is not
what it says); 0 otherwise.

``--quick`` (= ``--limit 6``) analyses 6 checkpoints spread over the demo,
named by id instead of ``--all`` (``--results`` keeps the command in batch mode).

    .venv/bin/python bench/batch_speed.py [--quick | --limit N] [--workers 2] [--device cpu|cuda]
                                          [--demo DIR] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.paths import DEMO_DIR  # noqa: E402
from loaders.ingest import ingest_paths  # noqa: E402
from loaders.store import Store  # noqa: E402

#: Checkpoints analysed at ``--quick``.
QUICK_LIMIT = 6
#: One progress line of batch mode on stderr: ``[3/55] checkpoint 17 computed: PATH``.
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] checkpoint (\d+) (\w+)")


@dataclass
class ModeRun:
    """One mode's run of the command: what ran, how long, and what the batch JSON says."""

    mode: str
    command: list[str]
    seconds: float = 0.0
    exit_status: int | None = None
    report: dict = field(default_factory=dict)
    done_at: list[float] = field(default_factory=list)     # seconds from the start to each finished checkpoint
    stderr_tail: list[str] = field(default_factory=list)

    def count(self, key: str) -> int:
        return int(self.report.get(key, 0))

    def failures(self) -> list[str]:
        """One line per reason this run does not count: exit status, failed or uncomputed checkpoints."""
        out = []
        if self.exit_status != 0:
            out.append(f"{self.mode}: exit status {self.exit_status}")
        for c in self.report.get("checkpoints", []):
            if c.get("status") == "failed":
                out.append(f"{self.mode}: checkpoint {c['id']} failed: {c.get('error')}")
        for e in self.report.get("errors", []):
            out.append(f"{self.mode}: {e['target']}: {e['reason']}")
        if not self.report:
            out.append(f"{self.mode}: no batch JSON on stdout; stderr ended: {' | '.join(self.stderr_tail[-3:])}")
        return out


def per_minute(n: int, seconds: float) -> float:
    """``n`` checkpoints in ``seconds``, as checkpoints per minute (nan for no time)."""
    return 60.0 * n / seconds if seconds > 0 else float("nan")


def start_and_rate(done_at: list[float]) -> tuple[float, float]:
    """(seconds to the first finished checkpoint, checkpoints per minute over the later half)
    from the finish times ``t_1 <= ... <= t_n``: the later ``k = n // 2`` checkpoints finished
    in ``t_n - t_(n-k)``, when every worker is long started (the checkpoints right after the
    first one would flatter Ray: the other workers' first tasks were already under way).
    The rate is nan with fewer than two."""
    if not done_at:
        return float("nan"), float("nan")
    ts = sorted(done_at)
    k = len(ts) // 2
    return ts[0], per_minute(k, ts[-1] - ts[-1 - k]) if k else float("nan")


def spread(ids: list[int], limit: int | None) -> list[int]:
    """``limit`` of ``ids`` spread evenly over them (language and vision runs both), all for None."""
    if limit is None or limit >= len(ids):
        return list(ids)
    return [ids[i * len(ids) // limit] for i in range(limit)]


def build_db(demo: Path, db: Path) -> tuple[list[dict], float]:
    """Ingest ``demo`` into a new DuckDB at ``db``; its checkpoints and the seconds it took."""
    t0 = time.monotonic()
    store = Store(db)
    report = ingest_paths(store, [demo]).to_json()
    if report["errors"]:
        bad = [f"{f.get('path')}: {f.get('reason')}" for f in report.get("files", []) if f.get("status") == "error"]
        raise SystemExit(f"error: {demo}: {report['errors']} files could not be ingested: {'; '.join(bad[:3])}")
    return store.checkpoints(), time.monotonic() - t0


def fresh_copy(db: Path, folder: Path) -> Path:
    """A copy of the database file ``db`` in ``folder`` (its results folder will sit beside it)."""
    folder.mkdir(parents=True)
    copy = folder / db.name
    shutil.copy2(db, copy)
    return copy


def analyze_command(db: Path, ids: list[int] | None, *, ray: bool, device: str | None) -> list[str]:
    """``python -m app analyze`` over ``ids`` (None: ``--all``) into ``db``, in batch mode, JSON out."""
    cmd = [sys.executable, "-m", "app", "analyze", *(["--all"] if ids is None else map(str, ids)),
           "--db", str(db), "--results", str(db.with_suffix(".results")), "--json"]
    if ray:
        cmd += ["--ray", "local"]
    if device:
        cmd += ["--device", device]
    return cmd


def run_mode(mode: str, cmd: list[str], env: dict, out_file: Path) -> ModeRun:
    """Run ``cmd``, timing the whole command and each checkpoint's progress line on stderr."""
    run = ModeRun(mode, cmd)
    t0 = time.monotonic()
    with open(out_file, "w") as out:            # stdout to a file: the JSON may exceed a pipe's buffer
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            if PROGRESS.match(line):
                run.done_at.append(time.monotonic() - t0)
            run.stderr_tail = (run.stderr_tail + [line.rstrip()])[-20:]
        run.exit_status = proc.wait()
    run.seconds = time.monotonic() - t0
    try:
        run.report = json.loads(out_file.read_text())
    except ValueError:
        run.report = {}
    return run


def bench_row(measured: str, figure: str, against: str) -> dict:
    """One row of the bench table, printed as ``BENCH_ROW {json}`` for ``bench/run_all.py``
    (no target is set for batch analysis: target and result are ``-``)."""
    row = {"bench": "batch_speed", "measured": measured, "figure": figure, "against": against,
           "target": "-", "result": "-"}
    print("BENCH_ROW " + json.dumps(row), flush=True)
    return row


def describe(run: ModeRun, n: int) -> str:
    first, rate = start_and_rate(run.done_at)
    workers = {(a.get("host"), a.get("pid")) for c in run.report.get("checkpoints", []) for a in c.get("attempts", [])}
    return (f"{run.mode:<10} exit {run.exit_status}, {run.count('computed')} computed, {run.count('skipped')} skipped, "
            f"{run.count('failed')} failed ({run.report.get('executor', '?')}, {len(workers)} worker processes); "
            f"{run.seconds:.1f} s wall = {per_minute(n, run.seconds):.1f} checkpoints/min; "
            f"first after {first:.1f} s; later half {rate:.1f}/min")


def report_rows(local: ModeRun, ray: ModeRun, n: int, what: str, workers: int) -> list[dict]:
    """The three rows: each mode's checkpoints per minute, and the speed-up Ray / in-process."""
    lr, rr = per_minute(n, local.seconds), per_minute(n, ray.seconds)
    _, l_late = start_and_rate(local.done_at)
    _, r_late = start_and_rate(ray.done_at)
    return [
        bench_row(f"analyze {what}, in-process", f"{lr:.1f} checkpoints/min ({local.seconds:.1f} s)", "-"),
        bench_row(f"analyze {what}, --ray local with {workers} workers",
                  f"{rr:.1f} checkpoints/min ({ray.seconds:.1f} s)",
                  f"in-process ({lr:.1f} checkpoints/min)"),
        bench_row(f"speed-up of --ray local ({workers} workers) over in-process, {what}",
                  f"{local.seconds / ray.seconds:.2f}x wall; {r_late / l_late:.2f}x over the later half",
                  f"in-process ({local.seconds:.1f} s; later half {l_late:.1f}/min)"),
    ]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help=f"analyse {QUICK_LIMIT} checkpoints (= --limit {QUICK_LIMIT})")
    ap.add_argument("--limit", type=int, default=None, metavar="N",
                    help="analyse N checkpoints spread over the demo, by id (default: --all)")
    ap.add_argument("--workers", type=int, default=2, help="Ray CPU slots: tasks at once (default 2)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="passed to analyze (default: analyze's own, cuda if available)")
    ap.add_argument("--demo", type=Path, default=DEMO_DIR, help=f"the checkpoints' folder (default {DEMO_DIR})")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the databases (kept; default a temp dir)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args(argv)
    limit = QUICK_LIMIT if args.quick and args.limit is None else args.limit
    if limit is not None and limit < 1:
        print(f"error: --limit: expected at least 1 checkpoint, found {limit}", file=sys.stderr)
        return 2
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qkvscope-bench-batch-")
        args.dir = Path(tmp.name)
    try:
        base = args.dir / "demo.duckdb"
        checkpoints, ingest_s = build_db(args.demo, base)
        ids = [int(c["id"]) for c in checkpoints]
        chosen = spread(ids, limit)
        n = len(chosen)
        what = (f"--all, {n} demo checkpoints" if n == len(ids)
                else f"{n} of the {len(ids)} demo checkpoints (by id)")
        print(f"demo {args.demo}: {len(ids)} checkpoints, ingested into a fresh DuckDB in {ingest_s:.1f} s; "
              f"measuring {what}")
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
        targets = None if n == len(ids) else chosen
        runs = []
        for mode, ray in (("in-process", False), ("ray", True)):
            db = fresh_copy(base, args.dir / mode)
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            if ray:
                env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"CPU": args.workers})
            cmd = analyze_command(db, targets, ray=ray, device=args.device)
            run = run_mode(mode, cmd, env, db.with_suffix(".json"))
            runs.append(run)
            print(describe(run, n), flush=True)
        local, ray_run = runs
        print(f"command: python -m app {' '.join(local.command[3:])} [--ray local]")
        print(f"load average {os.getloadavg()[0]:.2f} after")
        report_rows(local, ray_run, n, what, args.workers)
        problems = [p for r in runs for p in r.failures()]
        problems += [f"{r.mode}: {r.count('computed')} of {n} checkpoints computed" for r in runs
                     if r.report and r.count("computed") != n]
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1 if problems else 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
