"""``python -m app bench`` / ``bench/run_all.py``: discovery, quick options,
the parsers on real outputs of each script, failures and timeouts as FAIL
rows, one table. (The timing scripts themselves run only in the slow test.)"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.commands.bench import _runner

ROOT = Path(__file__).resolve().parents[2]
R = _runner()

# What each script printed on this machine (quick sizes), verbatim.
LOG_INGEST = """\
long: 200,000 points, 4.6 MB | duckdb read_csv 0.114 s | qkvscope ingest_log 0.241 s | ratio 2.11x (target <= 2x)
wide: 200,000 points, 2.1 MB | duckdb read_csv 0.072 s | qkvscope ingest_log 0.204 s | ratio 1.83x (target <= 2x)
"""
CHECKPOINT_MEMORY = """\
wrote /tmp/qkvscope-bench-b0b6pgd5/llama-1b-shaped/model.safetensors (0.44 GB, 2 layers, bfloat16) in 2 s

run                                             peak RSS MiB  minus base MiB  / file size      s
baseline (imports only)                                  222               0                 1.3
baseline, reading child idle                             304               0                 3.0
python -m app info --json (its reading child)            565             261        0.624    3.4
open_checkpoint().layers()                               474             252        0.604    1.5
source get(attn), pread                                  276              54        0.130    1.3
source get(attn), mmap                                   317              95        0.227    1.2

file 418 MiB; worst (peak - baseline) / file size = 0.624 (target < 0.25: NOT met)
"""
ANALYSIS_SPEED = """\
read      {"seconds": 0.1845577840003898, "n_tensors": 88, "peak_rss_mib": 1413.68359375}
analysis  {"seconds": 5.613487290000194, "stacked_wq_seconds": 3.7885475040020538, "rows": 10296, "notes": ["wq_absorb_error"], "peak_rss_mib": 674.85546875}
naive     {"seconds": 37.55142429300031, "layers": 1, "scaled_seconds": 826.1313344460068, "peak_rss_mib": 647.234375}

device cpu: read 0.185 s, analysis 5.613 s (10296 values, 22 layers)
analysis / read           = 30.4x   (target <= 5x on CPU); of which the stacked-W_Q condition/defect take 3.789 s
naive (scaled) / analysis = 147x   (naive 37.6 s on 1 layers -> 826 s for 22; target >= 100x)
peak RSS MiB: read 1414, analysis 675, naive 647
"""
DASHBOARD_SPEED = """\
started 2026-12-01 19:10:43 UTC; load average 1.76 on 2 cores
database: 50 runs x 2000 steps x 3 metrics = 300,000 points, built in 0.2 s (7 MiB)
build (SQL bulk insert from range(), not the ingest path): 1,390,639 points/s; DuckDB file 7 MB = 24.5 bytes/point
ingest, 20 runs' CSV logs x 2000 steps x 3 metrics (120,000 points, 2 MB), into a new database: 120,000 points in 3.28 s = 36,594 points/s
curve query, 20 runs: downsampled 40,000 points in 84 ms; raw 40,000 points in 42 ms; downsampled/raw time ratio 2.00
experiments page, 20 runs selected (chart drawn: True, 20 traces): script cold 0.78 s, warm 0.18 s (AppTest wall 1.10 / 0.19 s); warm/cold 0.23
experiments run filter (search box set to 'run-1' and cleared, 6 changes; 'run-1' shows 11 of 50 runs): first change 0.23 s, later ones median 0.19 s, max 0.21 s
inspector, analysed checkpoint, no reading child started yet: script cold 8.26 s (AppTest wall 8.43 s)
inspector, analysed checkpoint, the reading child prestarted: script cold 0.74 s, warm 0.61 s (AppTest wall 0.80 / 0.61 s); warm/cold 0.82
  experiments cold   script   0.78 s  under the 1 s target
  experiments warm   script   0.18 s  under the 1 s target
  filter first       script   0.23 s  under the 0.5 s target
  filter warm        script   0.19 s  under the 0.5 s target
  inspector unstarted script   8.26 s  (measured, no target)
  inspector cold     script   0.74 s  under the 1 s target
  inspector warm     script   0.61 s  under the 1 s target
ingest, the same 20 runs' CSV logs into this 50-run database: 120,000 points in 2.19 s = 54,826 points/s
plotly.js draw in this Chromium, 20 runs x 2,000 points, blank page: WebGL (Scattergl) 1.48 s; SVG (Scatter) 0.13 s
"""
#: The same script's output before the filter and ingest rows (10 runs plotted): still read.
DASHBOARD_SPEED_10 = """\
database: 50 runs x 2000 steps x 3 metrics = 300,000 points, built in 0.2 s (7 MiB)
curve query, 10 runs: downsampled 20,000 points in 51 ms; raw 20,000 points in 21 ms; downsampled/raw time ratio 2.42
  experiments warm   script   0.08 s  under the 1 s target
  inspector cold     script   1.34 s  OVER the 1 s target
"""


def rows(name: str, out: str) -> list[tuple]:
    return [(r.measured, r.figure, r.against, r.target, r.result) for r in R.PARSERS[name](out)]


def test_every_bench_script_is_found_and_parsed():
    assert R.discover() == ["activations_speed", "analysis_scaling", "analysis_speed", "batch_speed", "checkpoint_memory",
                            "dashboard_speed", "foreign_forward", "forward_speed", "log_ingest"]
    # every script is parsed or prints its own BENCH_ROW lines, and has quick sizes
    assert set(R.PARSERS) | {"analysis_scaling", "batch_speed", "forward_speed"} == set(R.discover()) == set(R.QUICK_ARGS) | set(R.QUICK_RUNS)
    # analysis_speed runs at both shapes; the dashboard at 2,000 runs x 50,000 steps
    assert [c[2:] for c in R.commands("analysis_speed", False)] == R.FULL_RUNS["analysis_speed"]
    assert ["--shape", "7B"] == R.FULL_RUNS["analysis_speed"][1][:2]
    assert R.commands("dashboard_speed", False)[0][2:] == ["--runs", "2000", "--steps", "50000"]


def test_rows_a_script_prints_itself(tmp_path, monkeypatch):
    row = {"bench": "x", "measured": "m", "figure": "1.50x (3.00 s)", "against": "a (2.00 s)",
           "target": "<= 2x", "result": "pass"}
    (tmp_path / "x.py").write_text("import json\nprint('noise')\n"
                                   f"print('BENCH_ROW ' + json.dumps({row!r}))\n"
                                   f"print('BENCH_ROW ' + json.dumps({ {**row, 'result': 'FAIL'}!r}))\n")
    monkeypatch.setattr(R, "BENCH_DIR", tmp_path)
    got, info = R.run_one("x", quick=False, timeout=60)
    assert [r.result for r in got] == ["pass", "FAIL"] and got[0] == R.Row(**row)
    assert info["exit_status"] == 0


ACTIVATIONS_SPEED = """device cpu, threads 2, 8 windows x 512 tokens, d_model 2048, 32 heads, 8 kv heads, d_head 64
floor: the layer's K, V projections and Grams alone 0.120 s
logits=False: add() 0.82 s, result(n_boot=200) 1.40 s (n_boot=2: 0.07 s), total 2.22 s  (median of 3); total / floor = 18.5x
logits=True : add() 3.90 s, result(n_boot=200) 1.30 s (n_boot=2: 0.06 s), total 5.20 s  (median of 3); total / floor = 43.3x
"""


def test_activations_speed_rows():
    got = rows("activations_speed", ACTIVATIONS_SPEED)
    assert [g[1] for g in got] == ["18.5x (2.22 s)", "43.3x (5.20 s)"]
    assert got[1][0].endswith("with logits") and got[0][2] == "its K, V projections and Grams alone (0.120 s)"


def test_log_ingest_rows():
    """The long layout against read_csv (<= 2x); the wide one against read_csv alone has no target,
    in output written before this was so too: the bench measures it against read_csv + UNPIVOT."""
    expected = [("ingest_log, long CSV (200,000 points, 4.6 MB)", "2.11x (0.241 s)",
                 "DuckDB read_csv of the same file (0.114 s)", "<= 2x", "FAIL"),
                ("ingest_log, wide CSV (200,000 points, 2.1 MB)", "1.83x (0.204 s)",
                 "DuckDB read_csv of the same file (0.072 s)", "-", "-")]
    assert rows("log_ingest", LOG_INGEST) == expected
    now = LOG_INGEST.replace("1.83x (target <= 2x)", "1.83x (no target: against read_csv + UNPIVOT below)")
    assert now != LOG_INGEST and rows("log_ingest", now) == expected


def test_checkpoint_memory_rows():
    got = rows("checkpoint_memory", CHECKPOINT_MEMORY)
    assert got[0] == ("peak RSS above imports: python -m app info --json (its reading child)",
                      "0.624 of the file (261 MiB)", "file size (418 MiB)", "< 0.25", "FAIL")
    assert [g[4] for g in got] == ["FAIL", "FAIL", "pass", "pass"]
    assert len(got) == 4                                  # the baseline rows are not measurements


def test_checkpoint_memory_counts_the_peak_of_a_child_the_command_waited_for(tmp_path):
    """``info`` reads in its reading child: the peak that matters is that child's, which the
    command's own ``VmHWM`` never saw (the row measured only the command line's imports)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import checkpoint_memory
    finally:
        sys.path.remove(str(ROOT / "bench"))
    spawn = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
             "'b = bytearray(300 << 20); b[::4096] = bytes(len(b[::4096]))'], check=True)")
    alone, _ = checkpoint_memory.peak_rss("pass", [])
    with_child, _ = checkpoint_memory.peak_rss(spawn, [])
    assert alone < 100 << 20 and with_child >= 300 << 20


def test_analysis_speed_rows():
    assert rows("analysis_speed", ANALYSIS_SPEED) == [
        ("every weight metric, Llama-1B-shaped attention (22 layers)", "30.4x (5.61 s)",
         "reading the same tensors (0.18 s)", "<= 5x", "FAIL"),
        ("naive per-head SVD version, scaled to 22 layers", "147x (826 s)", "the analysis (5.61 s)",
         ">= 100x", "pass")]


def test_dashboard_speed_rows():
    got = rows("dashboard_speed", DASHBOARD_SPEED)
    size = "50 runs x 2000 steps"
    assert got[:4] == [
        (f"database build, SQL bulk insert from range() ({size}, 300,000 points)", "1,390,639 points/s (0.2 s)",
         "-", "-", "-"),
        (f"DuckDB file size ({size})", "7 MB", "24.5 bytes/point", "-", "-"),
        ("ingest of 20 runs' CSV logs (ingest_paths), into a new database", "36,594 points/s (3.28 s)", "-", "-", "-"),
        (f"ingest of 20 runs' CSV logs (ingest_paths), into the {size} database", "54,826 points/s (2.19 s)",
         "-", "-", "-")]
    assert got[4] == (f"curve query, 20 runs ({size}), 40,000 points drawn", "2.00x (84 ms)",
                      "fetching all 40,000 raw points (42 ms)", "-", "-")
    assert got[5:12] == [
        (f"experiments page script run, cold, 20 runs selected ({size})", "0.78 s",
         "absolute (AppTest render time)", "< 1 s", "pass"),
        (f"experiments page script run, warm, 20 runs selected ({size})", "0.18 s",
         "absolute (AppTest render time)", "< 1 s", "pass"),
        (f"experiments run list filter change, first time, 20 runs selected ({size})", "0.23 s",
         "absolute (AppTest render time)", "< 0.5 s", "pass"),
        (f"experiments run list filter change, warm (median), 20 runs selected ({size})", "0.19 s",
         "absolute (AppTest render time)", "< 0.5 s", "pass"),
        (f"inspector page script run, cold, before any reading child has started ({size})", "8.26 s",
         "absolute (AppTest render time)", "-", "-"),
        (f"inspector page script run, cold (the reading child prestarted, as the dashboard does) ({size})", "0.74 s",
         "absolute (AppTest render time)", "< 1 s", "pass"),
        (f"inspector page script run, warm ({size})", "0.61 s", "absolute (AppTest render time)", "< 1 s", "pass")]
    assert got[12:] == [("browser, plotly.js alone drawing 20 runs x 2,000 points as WebGL (Scattergl; app/charts.py draws SVG)",
                         "1.48 s", "the same as SVG (Scatter: 0.13 s)", "-", "-")]
    # the earlier output (10 runs, no filter or ingest lines) still gives its rows
    assert rows("dashboard_speed", DASHBOARD_SPEED_10) == [
        (f"curve query, 10 runs ({size}), 20,000 points drawn", "2.42x (51 ms)",
         "fetching all 20,000 raw points (21 ms)", "-", "-"),
        (f"experiments page script run, warm ({size})", "0.08 s", "absolute (AppTest render time)", "< 1 s", "pass"),
        (f"inspector page script run, cold (the reading child prestarted, as the dashboard does) ({size})",
         "1.34 s", "absolute (AppTest render time)", "< 1 s", "FAIL")]


@pytest.fixture
def fake_bench(tmp_path, monkeypatch):
    """A bench/ folder of small scripts standing in for the real ones."""
    d = tmp_path / "bench"
    d.mkdir()
    scripts = {
        "log_ingest": f"""
            import sys
            print("long: 10 points, 0.1 MB | duckdb read_csv 1.000 s | qkvscope ingest_log 1.500 s | "
                  "ratio 1.50x (target <= 2x)")
            print("args", sys.argv[1:], file=sys.stderr)""",
        "has_quick": """
            import argparse
            ap = argparse.ArgumentParser(); ap.add_argument("--quick", action="store_true")
            a = ap.parse_args(); print("quick" if a.quick else "full")""",
        "broken": """
            raise SystemExit("could not build the benchmark file")""",
        "sleepy": """
            import time; time.sleep(30)""",
    }
    for name, body in scripts.items():
        (d / f"{name}.py").write_text(textwrap.dedent(body))
    (d / "run_all.py").write_text("# the runner itself is not a benchmark\n")
    monkeypatch.setattr(R, "BENCH_DIR", d)
    monkeypatch.setattr(R, "__file__", str(d / "run_all.py"))
    return d


def test_discovery_quick_flags_and_failures(fake_bench):
    assert R.discover() == ["broken", "has_quick", "log_ingest", "sleepy"]
    assert R.command("has_quick", True)[2:] == ["--quick"]              # the script's own --quick
    assert R.command("log_ingest", True)[2:] == R.QUICK_ARGS["log_ingest"]
    assert R.command("log_ingest", False)[2:] == []
    [row], info = R.run_one("log_ingest", quick=True, timeout=60)
    assert (row.figure, row.result) == ("1.50x (1.500 s)", "pass")
    assert info["exit_status"] == 0 and "args ['--points', '1000000', '--repeat', '2']" in info["output_tail"]
    [row], info = R.run_one("has_quick", quick=True, timeout=60)
    assert (row.measured, row.result) == ("ran in 0 s (no parser for its output; see its output)", "-")
    assert info["output_tail"] == "quick\n"
    [row], info = R.run_one("broken", quick=False, timeout=60)
    assert (row.figure, row.result) == ("failed", "FAIL")
    assert info["error"] == "exit status 1: could not build the benchmark file"
    [row], info = R.run_one("sleepy", quick=False, timeout=1)
    assert (row.figure, row.result) == ("failed", "FAIL") and info["error"].startswith("stopped after 1 s")


def test_one_table_and_exit_status(fake_bench, capsys):
    import argparse

    ap = argparse.ArgumentParser()
    R.add_arguments(ap)
    assert R.run(ap.parse_args(["--only", "log_ingest"])) == 0
    out = capsys.readouterr().out.splitlines()
    assert [c.strip() for c in out[0].split("|")[1:-1]] == [
        "bench", "measured", "figure", "against (same run)", "target", "result"]
    assert len({len(line) for line in out[:3]}) == 1          # columns line up
    assert out[2].startswith("| log_ingest | ingest_log, long CSV (10 points, 0.1 MB) | 1.50x (1.500 s) |")
    assert out[-1].endswith("full sizes; 1 pass, 0 FAIL")
    assert R.run(ap.parse_args(["--only", "broken", "--only", "log_ingest", "--json"])) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(r["bench"], r["result"]) for r in doc["rows"]] == [("broken", "FAIL"), ("log_ingest", "pass")]
    assert R.run(ap.parse_args(["--only", "nope"])) == 2
    assert capsys.readouterr().err == (f"error: no benchmark named nope in {fake_bench}; expected one of "
                                       f"broken, has_quick, log_ingest, sleepy\n")


@pytest.mark.slow
def test_the_real_command_runs_one_benchmark_quickly():
    """``python -m app bench --quick --only log_ingest --json``: the real script,
    parsed into its two rows (figures vary; their form does not)."""
    proc = subprocess.run([sys.executable, "-m", "app", "bench", "--quick", "--only", "log_ingest", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert [re.sub(r"[\d.]+ MB", "N MB", r["measured"]) for r in doc["rows"]] == [
        "ingest_log, long CSV (1,000,000 points, N MB)", "ingest_log, wide CSV (1,000,000 points, N MB)",
        "ingest_log against UNPIVOT, wide CSV (1,000,000 points, N MB)"]
    assert [r["target"] for r in doc["rows"]] == ["<= 2x", "-", "<= 1.5x"]      # wide: against UNPIVOT
    assert [r["result"] in ("pass", "FAIL") for r in doc["rows"]] == [True, False, True]
    assert doc["runs"][0]["command"] == "bench/log_ingest.py --points 1000000 --repeat 2"


FOREIGN_FORWARD = """device cpu, torch 2.13.0+cpu, 2 threads
llama2.c v0 .bin (stories15M shape) tokenizer.bin      load   1.55 s  forward        492 tok/s  job's forward pass        400 tok/s  activation job 4,096 tokens in  79.00 s (      52 tok/s)
nanoGPT RMSNorm+SwiGLU ckpt.pt     bytes            load   1.23 s  forward        607 tok/s  to the last attention input      1,680 tok/s  job's forward pass        420 tok/s  activation job 4,096 tokens in  86.00 s (      48 tok/s)
"""


def test_foreign_forward_rows():
    got = rows("foreign_forward", FOREIGN_FORWARD)
    # the forward pass with the hooks >= 0.7 of the plain one (420 / 607 = 0.6919 reads 0.69);
    # the whole job (statistics, chance levels, intervals) beside it with no target
    # the forward it stops (to the last attention input) beside it, where the line has it (the
    # first line is the older output, without it)
    assert [g[1] for g in got] == ["0.81x (400 tok/s)", "0.11x (52 tok/s in 79.00 s)",
                                   "0.69x (420 tok/s)", "0.25x (420 tok/s)", "0.08x (48 tok/s in 86.00 s)"]
    assert [(g[3], g[4]) for g in got] == [(">= 0.7x", "pass"), ("-", "-"), (">= 0.7x", "FAIL"), ("-", "-"),
                                           ("-", "-")]
    assert got[3][0] == ("activation job's forward pass against the forward it stops, nanoGPT RMSNorm+SwiGLU "
                         "ckpt.pt, 4,096 tokens")
    assert got[3][2] == "its forward to the last attention input, no add() (1,680 tok/s)"
    assert got[0][0] == "activation job's forward pass (hooks, add()), llama2.c v0 .bin (stories15M shape), 4,096 tokens"
    assert got[1][2] == "its plain forward pass, same windows (492 tok/s)"


def test_wide_ingest_against_unpivot_row():
    out = LOG_INGEST + ("      context: duckdb read_csv + UNPIVOT into a long table 0.140 s (1.94x read_csv); "
                        "qkvscope ingest_log / that 1.46x\n")
    got = rows("log_ingest", out)
    assert got[:2] == rows("log_ingest", LOG_INGEST)
    assert got[2] == ("ingest_log against UNPIVOT, wide CSV (200,000 points, 2.1 MB)", "1.46x",
                      "DuckDB read_csv + UNPIVOT into a long table (0.140 s)", "<= 1.5x", "pass")
