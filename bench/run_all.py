"""Run every benchmark under ``bench/`` and print ONE table of results.

    .venv/bin/python bench/run_all.py [--quick | --size quick|full] [--only NAME ...] [--json] [--timeout S]
    .venv/bin/python -m app bench     (the same code)

Each ``bench/*.py`` script (this one excepted) runs in its own process, one
after the other, exactly as a user would run it. ``--quick`` is a smoke run:
each script at the smallest sizes in ``QUICK_RUNS``/``QUICK_ARGS`` below (each
chosen from that script's argparse), else its own ``--quick`` when its
``--help`` lists one, with one OpenMP thread a process (``QUICK_ENV``). The
scripts print their measurements as text; ``PARSERS`` turns each script's
output into rows of (a script may print its rows itself, one ``BENCH_ROW {json}``
line each with these keys; ``FULL_RUNS``/``QUICK_RUNS`` run a script more than once,
e.g. ``analysis_speed`` at the 1.1B and the 7B shape):

* ``bench``: the script; ``measured``: what was timed or sized;
* ``figure``: the measured ratio or time, with its raw numbers;
* ``against``: what a ratio compares to, measured side by side in the same run;
* ``target``: the project's target for it, and ``result``: ``pass``/``FAIL``
  (``-`` where a figure has no target).

A script without a parser still runs; its row says whether it exited cleanly.
Exit status: 0 when every script ran and every target passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

#: Scripts run more than once at full size, one run per argument list (the rows of each are kept).
FULL_RUNS: dict[str, list[list[str]]] = {
    "analysis_speed": [["--shape", "1.1B"], ["--shape", "7B", "--skip-naive", "--repeat", "1"]],
    "dashboard_speed": [["--runs", "2000", "--steps", "50000"]],
}
#: ``--quick``: the smallest sizes that still run every script's code path end to end (a smoke
#: run, ``tests/app/test_bench.py``; its figures are dominated by fixed costs and are not the ones
#: docs/performance.md quotes; one torch thread where a script takes --threads, so a busy machine
#: does not turn them into minutes, and ``QUICK_ENV`` for every script and the processes it starts;
#: no warm-up, and one process where the full size starts one per measurement: each Python process
#: with torch costs 2-4 CPU seconds before it measures anything).
#: Scripts not named here get their own ``--quick`` if their ``--help`` offers one, else their defaults.
QUICK_RUNS: dict[str, list[list[str]]] = {
    "analysis_speed": [["--shape", "tiny", "--skip-naive", "--repeat", "1", "--threads", "1", "--one-process"]],
    "analysis_scaling": [["--layers", "1", "--sizes", "64", "128", "--d-head", "64", "--gqa-kv", "1",
                          "--one-process"]],                                                   # GQA-2 at 128
}

#: One argument list per script at ``--quick`` (``QUICK_RUNS`` holds the scripts run otherwise).
QUICK_ARGS: dict[str, list[str]] = {
    "checkpoint_memory": ["--layers", "1", "--small", "--one-process"],  # 1 of 22 layers, d_model 256
    "log_ingest": ["--points", "20000", "--repeat", "1"],
    "dashboard_speed": ["--runs", "5", "--steps", "100", "--no-browser",
                        "--checkpoint", "data/demo/qkv-mha-wd0/checkpoints/final_step_004000.safetensors"],
    "activations_speed": ["--quick", "--repeat", "1", "--threads", "1"],
    "foreign_forward": ["--quick", "--tokens", "256", "--repeat", "1"],
    # 2 checkpoints of the one demo run that keeps five, in-process and on Ray: ingests 5, not the 55
    "batch_speed": ["--demo", "data/demo/qkv-mha-wd0.1", "--limit", "2", "--workers", "1"],
    "layer_map_draw": ["--layers", "8", "--repeat", "1"],
    "interval_coverage": ["--quick"],                   # named here: asking its --help costs a process
    "forward_speed": ["--quick", "--limit", "1", "--tokens", "256", "--repeat", "1", "--hidden", "64",
                      "--layers", "2", "--heads", "2", "--intermediate", "128", "--vocab", "1000", "--one-process"],
}

#: The environment of every script at ``--quick`` (and of the children it starts): one OpenMP thread
#: per process. A smoke run's operations are small, and OpenMP's waiting threads spin: on a busy
#: 2-core machine two threads each burnt up to twice the CPU seconds of one for the same work
#: (``bench/forward_speed.py`` at the quick sizes: 12 CPU-s against 8).
QUICK_ENV = {"OMP_NUM_THREADS": "1"}


@dataclass
class Row:
    bench: str
    measured: str
    figure: str
    against: str
    target: str
    result: str          # 'pass', 'FAIL' or '-' (no target)


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("pass" if ok else "FAIL")


# -- parsers: one per script, over the text it prints ---------------------------

def parse_log_ingest(out: str) -> list[Row]:
    rows = []
    rx = re.compile(r"^\s*(\w+): ([\d,]+) points, ([\d.]+) MB \| duckdb read_csv ([\d.]+) s \| "
                    r"qkvscope ingest_log ([\d.]+) s \| ratio ([\d.]+)x \((?:target <= ([\d.]+)x|no target[^)]*)\)", re.M)
    for layout, n, mb, plain, ours, ratio, target in rx.findall(out):
        # the bench measures the wide layout against read_csv + UNPIVOT (below), not read_csv alone,
        # which stores a quarter of the rows; older output gave it the long layout's 2x
        target = target if layout != "wide" else ""
        rows.append(Row("log_ingest", f"ingest_log, {layout} CSV ({n} points, {mb} MB)",
                        f"{float(ratio):.2f}x ({float(ours):.3f} s)", f"DuckDB read_csv of the same file ({float(plain):.3f} s)",
                        f"<= {target}x" if target else "-", _verdict(float(ratio) <= float(target)) if target else "-"))
    # the wide layout against DuckDB's own reshaping of the same file (<= 1.5x)
    m = re.search(r"context: duckdb read_csv \+ UNPIVOT into a long table ([\d.]+) s .*?; "
                  r"qkvscope ingest_log / that ([\d.]+)x", out)
    wide = [r for r in rows if ", wide CSV" in r.measured]
    if m and wide:
        ratio = float(m.group(2))
        rows.append(Row("log_ingest", wide[0].measured.replace("ingest_log,", "ingest_log against UNPIVOT,"),
                        f"{ratio:.2f}x", f"DuckDB read_csv + UNPIVOT into a long table ({float(m.group(1)):.3f} s)",
                        f"<= {WIDE_VS_UNPIVOT:g}x", _verdict(ratio <= WIDE_VS_UNPIVOT)))
    return rows


#: Target of the wide CSV ingest against DuckDB's read_csv + UNPIVOT of the same file.
WIDE_VS_UNPIVOT = 1.5
#: Target of the activation job's tokens/s against the same model's plain forward pass.
FORWARD_RATIO = 0.7


def parse_checkpoint_memory(out: str) -> list[Row]:
    rows = []
    size = re.search(r"^file (\d+) MiB;", out, re.M)
    target = re.search(r"\(target < ([\d.]+)", out)
    t = float(target.group(1)) if target else 0.25
    rx = re.compile(r"^(\S.*?)\s{2,}(\d+)\s+(-?\d+)\s+(-?[\d.]+)\s+([\d.]+)$", re.M)
    for label, peak, extra, ratio, secs in rx.findall(out):
        rows.append(Row("checkpoint_memory", f"peak RSS above imports: {label}",
                        f"{float(ratio):.3f} of the file ({extra} MiB)",
                        f"file size ({size.group(1)} MiB)" if size else "file size",
                        f"< {t:g}", _verdict(float(ratio) < t)))
    return rows


def parse_analysis_speed(out: str) -> list[Row]:
    phases = {}
    for name, blob in re.findall(r"^(read|analysis|naive)\s+(\{.*\})$", out, re.M):
        phases[name] = json.loads(blob)
    rows = []
    if "read" in phases and "analysis" in phases:
        r, a = phases["read"]["seconds"], phases["analysis"]["seconds"]
        target = re.search(r"analysis / read\s+= [\d.]+x\s+\(target <= ([\d.]+)x", out)
        t = float(target.group(1)) if target else 5.0
        rows.append(Row("analysis_speed", "every weight metric, Llama-1B-shaped attention (22 layers)",
                        f"{a / r:.1f}x ({a:.2f} s)", f"reading the same tensors ({r:.2f} s)",
                        f"<= {t:g}x", _verdict(a / r <= t)))
        if "naive" in phases:
            n = phases["naive"]["scaled_seconds"]
            target = re.search(r"target >= ([\d.]+)x", out)
            t = float(target.group(1)) if target else 100.0
            rows.append(Row("analysis_speed", "naive per-head SVD version, scaled to 22 layers",
                            f"{n / a:.0f}x ({n:.0f} s)", f"the analysis ({a:.2f} s)",
                            f">= {t:g}x", _verdict(n / a >= t)))
    return rows


#: ``bench/dashboard_speed.py``'s verdict lines: label -> what the row measured.
DASHBOARD_LABELS = {
    "experiments cold": "experiments page script run, cold",
    "experiments warm": "experiments page script run, warm",
    "filter first": "experiments run list filter change, first time",
    "filter warm": "experiments run list filter change, warm (median)",
    "inspector cold": "inspector page script run, cold (no idle reading child)",
    "inspector warm": "inspector page script run, warm",
    "weight decay cold": "weight decay page script run, cold (reads every val/loss point)",
    "weight decay warm": "weight decay page script run, warm",
    "papers cold": "papers page script run, cold (reads every val/loss point)",
    "papers warm": "papers page script run, warm",
}


def parse_dashboard_speed(out: str) -> list[Row]:
    rows = []
    db = re.search(r"^database: (\d+) runs x (\d+) steps x 3 metrics = ([\d,]+) points, built in ([\d.]+) s", out, re.M)
    size = f"{db.group(1)} runs x {db.group(2)} steps" if db else "the benchmark database"
    build = re.search(r"^build \(SQL bulk insert from range\(\), not the ingest path\): ([\d,]+) points/s; "
                      r"DuckDB file ([\d,]+) MB = ([\d.]+) bytes/point", out, re.M)
    if db and build:
        rows.append(Row("dashboard_speed", f"database build, SQL bulk insert from range() ({size}, {db.group(3)} points)",
                        f"{build.group(1)} points/s ({db.group(4)} s)", "-", "-", "-"))
        rows.append(Row("dashboard_speed", f"DuckDB file size ({size})", f"{build.group(2)} MB",
                        f"{build.group(3)} bytes/point", "-", "-"))
    for n, where, secs, rate in re.findall(
            r"^ingest, (?:the same )?(\d+) runs' CSV logs.*?into (a new database|this \d+-run database): "
            r"[\d,]+ points in ([\d.]+) s = ([\d,]+) points/s", out, re.M):
        into = "a new database" if where == "a new database" else f"the {size} database"
        rows.append(Row("dashboard_speed", f"ingest of {n} runs' CSV logs (ingest_paths), into {into}",
                        f"{rate} points/s ({secs} s)", "-", "-", "-"))
    m = re.search(r"curve query, (\d+) runs: downsampled ([\d,]+) points in (\d+) ms; raw ([\d,]+) points in (\d+) ms; "
                  r"downsampled/raw time ratio ([\d.]+)", out)
    if m:
        rows.append(Row("dashboard_speed", f"curve query, {m.group(1)} runs ({size}), {m.group(2)} points drawn",
                        f"{float(m.group(6)):.2f}x ({m.group(3)} ms)",
                        f"fetching all {m.group(4)} raw points ({m.group(5)} ms)", "-", "-"))
    plotted = re.search(r"^experiments page, (\d+) runs selected", out, re.M)
    for label, secs, word, target in re.findall(
            rf"^\s+({'|'.join(DASHBOARD_LABELS)})\s+script\s+([\d.]+) s\s+"
            r"(?:(under|OVER) the ([\d.]+) s target|\(measured, no target\))", out, re.M):
        what = DASHBOARD_LABELS[label]
        if plotted and label.split()[0] in ("experiments", "filter"):
            what += f", {plotted.group(1)} runs selected"
        rows.append(Row("dashboard_speed", f"{what} ({size})", f"{float(secs):.2f} s",
                        "absolute (AppTest render time)", f"< {target} s" if word else "-",
                        _verdict(word == "under") if word else "-"))
    draw = re.search(r"^plotly\.js draw in this Chromium, (\d+) runs x ([\d,]+) points, blank page: "
                     r"WebGL \(Scattergl\) ([\d.]+) s; SVG \(Scatter\) ([\d.]+) s", out, re.M)
    if draw:
        rows.append(Row("dashboard_speed", f"browser, plotly.js alone drawing {draw.group(1)} runs x {draw.group(2)} "
                                           "points as WebGL (Scattergl; app/charts.py draws SVG)",
                        f"{draw.group(3)} s", f"the same as SVG (Scatter: {draw.group(4)} s)", "-", "-"))
    # the browser table: one line per step, median and max over rounds (to the last painted change),
    # the median to the last change of any kind (older output has none), charts drawn, AppTest script time
    for where, step, med, mx, anything, _charts, script, target, verdict in BROWSER_LINE.findall(out):
        rows.append(Row("dashboard_speed", f"browser, {step} ({'demo' if where == 'demo' else size})",
                        f"{med} s (max {mx})", f"AppTest script {script} s"
                        + (f"; to any change, unpainted ones included, {anything} s" if anything else ""),
                        f"< {target} s", verdict))
    for where, what, secs, _charts, after, later in FIRST_VISIT_LINE.findall(out):
        rows.append(Row("dashboard_speed", f"browser, first visit: {what}, {after} s after the first page "
                                           f"({'demo' if where == 'demo' else size})",
                        f"{secs} s", f"later visits (median {later} s)", "-", "-"))
    return rows


#: One line of ``bench/dashboard_speed.py``'s browser table.
BROWSER_LINE = re.compile(r"^\s+(demo|big)\s+(sidebar -> .+?|control: .+?)\s+([\d.]+)s\s+([\d.]+)s\s+"
                          r"(?:([\d.]+)s\s+)?(\d*)\s+"
                          r"([\d.]+|nan)s\s+< ([\d.]+) s\s+(pass|FAIL)$", re.M)
#: Its line for the first visit to the Inspector after the server started (no target).
FIRST_VISIT_LINE = re.compile(r"^\s+(demo|big)\s+first visit: (.+?)\s+([\d.]+)s\s+(\d*)\s+"
                              r"\((\d+) s after the first page; later visits: median ([\d.]+|nan)s\)$", re.M)


def parse_activations_speed(out: str) -> list[Row]:
    rows = []
    floor = re.search(r"^floor: .* ([\d.]+) s$", out, re.M)
    geo = re.search(r"(\d+) windows x (\d+) tokens, d_model (\d+), (\d+) heads, (\d+) kv heads, d_head (\d+)", out)
    layer, tokens = "one Llama-1B-shaped layer", 4096            # the full size (FULL in the script)
    if geo:
        w, t, d, h, g, e = map(int, geo.groups())
        tokens = w * t
        if (d, h, g, e) != (2048, 32, 8, 64):                   # --quick's small layer
            layer = f"one layer of d_model {d}, {h} heads, {g} kv heads, d_head {e}"
    for logits, total, ratio in re.findall(
            r"^logits=(True|False)\s*: .* total ([\d.]+) s .*total / floor = ([\d.]+)x$", out, re.M):
        rows.append(Row("activations_speed",
                        f"activation metrics, chance and intervals of {layer}, {tokens:,} tokens"
                        f"{' with logits' if logits == 'True' else ''}",
                        f"{float(ratio):.1f}x ({float(total):.2f} s)",
                        f"its K, V projections and Grams alone ({floor.group(1) if floor else '?'} s)", "-", "-"))
    return rows


def parse_foreign_forward(out: str) -> list[Row]:
    """Rows per model against the same model's plain forward over the same windows: the
    activation job's forward pass (hooks and captures: the target), the same against the
    forward as far as the job runs it (to the last attention input; no target; a line without
    that figure gives no such row) and the job without its model load (statistics, chance
    levels and intervals included: no target)."""
    rows = []
    for label, fwd, stop, hooked, n, secs, job in re.findall(
            r"^(.+?)\s+\S+\s+load\s+[\d.]+ s\s+forward\s+([\d,]+) tok/s"
            r"(?:\s+to the last attention input\s+([\d,]+) tok/s)?\s+job's forward pass\s+([\d,]+) tok/s"
            r"\s+activation job ([\d,]+) tokens in\s+([\d.]+) s \(\s*([\d,]+) tok/s\)$", out, re.M):
        f, h, j = (float(v.replace(",", "")) for v in (fwd, hooked, job))
        against = f"its plain forward pass, same windows ({fwd} tok/s)"
        rows.append(Row("foreign_forward", f"activation job's forward pass (hooks, add()), {label.strip()}, {n} tokens",
                        f"{math.floor(h / f * 100) / 100:.2f}x ({hooked} tok/s)", against,
                        f">= {FORWARD_RATIO:g}x", _verdict(h / f >= FORWARD_RATIO)))
        if stop:
            st = float(stop.replace(",", ""))
            rows.append(Row("foreign_forward", f"activation job's forward pass against the forward it stops, "
                                               f"{label.strip()}, {n} tokens",
                            f"{math.floor(h / st * 100) / 100:.2f}x ({hooked} tok/s)",
                            f"its forward to the last attention input, no add() ({stop} tok/s)", "-", "-"))
        rows.append(Row("foreign_forward", f"activation job without its load, {label.strip()}, {n} tokens",
                        f"{j / f:.2f}x ({job} tok/s in {secs} s)", against, "-", "-"))
    return rows


PARSERS: dict[str, Callable[[str], list[Row]]] = {
    "activations_speed": parse_activations_speed,
    "log_ingest": parse_log_ingest,
    "checkpoint_memory": parse_checkpoint_memory,
    "analysis_speed": parse_analysis_speed,
    "dashboard_speed": parse_dashboard_speed,
    "foreign_forward": parse_foreign_forward,
}


# -- running ----------------------------------------------------------------------

def discover() -> list[str]:
    """Every benchmark script's name (``bench/NAME.py``), sorted; not this runner."""
    return sorted(p.stem for p in BENCH_DIR.glob("*.py")
                  if p.stem != Path(__file__).stem and not p.stem.startswith("_"))


def supports_quick(script: Path) -> bool:
    """Whether the script's own ``--help`` offers ``--quick``."""
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    return proc.returncode == 0 and re.search(r"(^|\s)--quick\b", proc.stdout) is not None


def commands(name: str, quick: bool) -> list[list[str]]:
    """The command lines that run ``bench/NAME.py`` at full or ``quick`` sizes (usually one)."""
    script = BENCH_DIR / f"{name}.py"
    runs = (QUICK_RUNS if quick else FULL_RUNS).get(name)
    if runs is None:
        if not quick:
            runs = [[]]
        else:
            runs = [QUICK_ARGS[name] if name in QUICK_ARGS else ["--quick"] if supports_quick(script) else []]
    return [[sys.executable, str(script), *args] for args in runs]


def command(name: str, quick: bool) -> list[str]:
    """The first of ``commands``."""
    return commands(name, quick)[0]


#: A row a script prints itself: ``BENCH_ROW {"bench", "measured", "figure", "against", "target", "result"}``.
ROW_LINE = re.compile(r"^BENCH_ROW (\{.*\})$", re.M)


def printed_rows(out: str) -> list[Row]:
    """The ``BENCH_ROW`` lines of a script's output as rows."""
    return [Row(**{k: str(v) for k, v in json.loads(m).items()}) for m in ROW_LINE.findall(out)]


def run_one(name: str, *, quick: bool, timeout: float, cmd: list[str] | None = None) -> tuple[list[Row], dict]:
    """Run ``bench/NAME.py`` (``cmd``: one of ``commands``; default the first); its rows, and what
    ran (command, seconds, exit status, output tail)."""
    cmd = cmd or command(name, quick)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **QUICK_ENV} if quick else None)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, exc.stdout or "", f"stopped after {timeout:g} s"
        out = out.decode() if isinstance(out, bytes) else out
    secs = time.monotonic() - t0
    shown = " ".join([f"bench/{name}.py", *cmd[2:]])
    info = {"bench": name, "command": shown, "seconds": round(secs, 1), "exit_status": rc,
            "output_tail": (out + err)[-2000:]}
    if rc != 0:
        why = f"exit status {rc}" if rc is not None else err
        last = (err.strip().splitlines() or out.strip().splitlines() or [""])[-1][:160]
        return [Row(name, "the script", "failed", "-", "runs cleanly", "FAIL")], {**info, "error": f"{why}: {last}"}
    parser = PARSERS.get(name)
    rows = printed_rows(out) or (parser(out) if parser else [])
    if not rows:
        what = "no parser for its output" if parser is None else "its output had none of the expected lines"
        rows = [Row(name, f"ran in {secs:.0f} s ({what}; see its output)", "-", "-", "-",
                    "FAIL" if parser else "-")]
    return rows, info


def table(rows: list[Row]) -> str:
    """A Markdown table (reads as plain text too)."""
    head = ["bench", "measured", "figure", "against (same run)", "target", "result"]
    cells = [head] + [[r.bench, r.measured, r.figure, r.against, r.target, r.result] for r in rows]
    width = [max(len(c[i]) for c in cells) for i in range(len(head))]
    line = lambda c: "| " + " | ".join(x.ljust(w) for x, w in zip(c, width)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in width) + "|"]
                     + [line(c) for c in cells[1:]])


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true",
                    help="the smallest sizes that run every script (a smoke run; bench/run_all.py QUICK_RUNS, "
                         "QUICK_ARGS, else a script's own --quick; OMP_NUM_THREADS=1)")
    ap.add_argument("--size", choices=["quick", "full"], default=None,
                    help="the sizes to run at: 'quick' is --quick, 'full' (default) the sizes docs/performance.md quotes")
    ap.add_argument("--only", action="append", metavar="NAME", default=None,
                    help="run only this benchmark (repeatable); NAME is bench/NAME.py")
    ap.add_argument("--json", action="store_true", help="print {rows, runs} as JSON instead of the table")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds one script may run before it is stopped (default 1800)")
    ap.add_argument("--list", action="store_true", help="list the benchmark scripts and exit")


def run(args: argparse.Namespace) -> int:
    args.quick = bool(args.quick or getattr(args, "size", None) == "quick")
    names = discover()
    if args.list:
        for n in names:
            full = " | ".join(" ".join(a) or "(defaults)" for a in FULL_RUNS.get(n, [[]]))
            quick = " | ".join(" ".join(a) for a in QUICK_RUNS[n]) if n in QUICK_RUNS else \
                " ".join(QUICK_ARGS.get(n, [])) or "(script --quick if offered)"
            print(f"{n:<20} {'parsed' if n in PARSERS else 'rows it prints'}; full: {full}; quick: {quick}")
        return 0
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            print(f"error: no benchmark named {', '.join(unknown)} in {BENCH_DIR}; "
                  f"expected one of {', '.join(names)}", file=sys.stderr)
            return 2
        names = [n for n in names if n in args.only]
    rows: list[Row] = []
    runs = []
    started = time.strftime("%Y-%m-%d %H:%M")
    for name in names:
        if not args.json:
            print(f"running bench/{name}.py ...", file=sys.stderr, flush=True)
        for cmd in commands(name, args.quick):
            r, info = run_one(name, quick=args.quick, timeout=args.timeout, cmd=cmd)
            rows.extend(r)
            runs.append(info)
            if not args.json:
                print(f"  {info['command']}: {info['seconds']:.0f} s"
                      + (f"  ({info['error']})" if "error" in info else ""), file=sys.stderr, flush=True)
    failed = any(r.result == "FAIL" for r in rows)
    if args.json:
        json.dump({"date": started, "quick": args.quick, "rows": [asdict(r) for r in rows], "runs": runs},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(table(rows))
        print(f"\n{started}, {'quick sizes' if args.quick else 'full sizes'}; "
              f"{sum(r.result == 'pass' for r in rows)} pass, {sum(r.result == 'FAIL' for r in rows)} FAIL")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
