"""``python -m app bench`` (``bench/run_all.py``): one smoke run of every benchmark script at
``--quick`` sizes, each script's output read into rows of the one table; and, on stand-in
scripts, what a broken, slow or unparsed script gives (a FAIL row, the exit status).
No timing is asserted: figures vary, their form does not."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.commands.bench import _runner

ROOT = Path(__file__).resolve().parents[2]
R = _runner()


@pytest.mark.slow
@pytest.mark.system                      # its scripts start Ray, servers' pages, reading children
def test_quick_run_of_every_benchmark_gives_parsed_rows():
    proc = subprocess.run([sys.executable, "-m", "app", "bench", "--quick", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]      # 1: a target missed on this machine
    doc = json.loads(proc.stdout)
    assert doc["quick"] is True
    names = R.discover()
    assert [run["bench"] for run in doc["runs"]] == [n for n in names for _ in R.commands(n, True)]
    for run in doc["runs"]:
        assert run["exit_status"] == 0 and "error" not in run, run
    rows = doc["rows"]
    assert {r["bench"] for r in rows} == set(names)                         # every script gave rows
    for r in rows:
        assert set(r) == {"bench", "measured", "figure", "against", "target", "result"}
        assert "see its output" not in r["measured"], r                  # parsed, not just "it ran"
        assert r["result"] in (("-",) if r["target"].startswith("-") else ("pass", "FAIL")), r   # "- (why)"
    assert proc.returncode == (1 if any(r["result"] == "FAIL" for r in rows) else 0)


def test_quick_sizes_name_real_options_and_full_sizes_are_the_quoted_ones():
    for name in R.discover():
        for cmd in R.commands(name, True):
            assert cmd[1] == str(R.BENCH_DIR / f"{name}.py") and len(cmd) > 2, (name, cmd)
    assert [c[2:] for c in R.commands("analysis_speed", False)] == R.FULL_RUNS["analysis_speed"]
    assert R.commands("dashboard_speed", False)[0][2:] == ["--runs", "2000", "--steps", "50000"]
    assert R.commands("log_ingest", False)[0][2:] == []


def test_activation_rows_name_the_layer_and_tokens_measured():
    head = "device cpu, threads 1, {} windows x {} tokens, d_model {}, {} heads, {} kv heads, d_head 64, n_random 3\n"
    body = ("floor: the layer's K, V projections and Grams alone 0.100 s\n"
            "logits=False: add() 0.50 s, result() 0.70 s, total 1.20 s  (median of 1); total / floor = 12.0x\n")
    [full] = R.parse_activations_speed(head.format(8, 512, 2048, 32, 8) + body)
    [quick] = R.parse_activations_speed(head.format(4, 128, 256, 4, 2) + body)
    assert full.measured == "activation metrics, chance and intervals of one Llama-1B-shaped layer, 4,096 tokens"
    assert quick.measured == ("activation metrics, chance and intervals of one layer of d_model 256, 4 heads, "
                              "2 kv heads, d_head 64, 512 tokens")
    assert (quick.figure, quick.against) == ("12.0x (1.20 s)", "its K, V projections and Grams alone (0.100 s)")


@pytest.fixture
def fake_bench(tmp_path, monkeypatch):
    """A bench/ folder of small scripts standing in for the real ones."""
    d = tmp_path / "bench"
    d.mkdir()
    scripts = {
        "log_ingest": """
            import os, sys
            print("long: 10 points, 0.1 MB | duckdb read_csv 1.000 s | qkvscope ingest_log 1.500 s | "
                  "ratio 1.50x (target <= 2x)")
            print("args", sys.argv[1:], file=sys.stderr)
            print("threads", os.environ.get("OMP_NUM_THREADS"), file=sys.stderr)""",
        "has_quick": """
            import argparse
            ap = argparse.ArgumentParser(); ap.add_argument("--quick", action="store_true")
            a = ap.parse_args(); print("quick" if a.quick else "full")""",
        "prints_rows": """
            import json
            row = {"bench": "prints_rows", "measured": "m", "figure": "1.50x (3.00 s)", "against": "a (2.00 s)",
                   "target": "<= 2x", "result": "pass"}
            print("noise")
            print("BENCH_ROW " + json.dumps(row))
            print("BENCH_ROW " + json.dumps({**row, "result": "FAIL"}))""",
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


def test_discovery_quick_flags_and_failures(fake_bench, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert R.discover() == ["broken", "has_quick", "log_ingest", "prints_rows", "sleepy"]
    assert R.command("has_quick", True)[2:] == ["--quick"]              # the script's own --quick
    assert R.command("log_ingest", True)[2:] == R.QUICK_ARGS["log_ingest"]
    assert R.command("log_ingest", False)[2:] == []
    [row], info = R.run_one("log_ingest", quick=True, timeout=60)
    assert (row.figure, row.against, row.target, row.result) == (
        "1.50x (1.500 s)", "DuckDB read_csv of the same file (1.000 s)", "<= 2x", "pass")
    assert info["exit_status"] == 0 and f"args {R.QUICK_ARGS['log_ingest']}" in info["output_tail"]
    assert "threads 1\n" in info["output_tail"]                           # QUICK_ENV: one OpenMP thread
    [_], info = R.run_one("log_ingest", quick=False, timeout=60)
    assert "threads 2\n" in info["output_tail"]                           # full sizes: the caller's own
    got, _ = R.run_one("prints_rows", quick=False, timeout=60)
    assert [(r.measured, r.figure, r.result) for r in got] == [("m", "1.50x (3.00 s)", "pass"),
                                                                ("m", "1.50x (3.00 s)", "FAIL")]
    [row], info = R.run_one("has_quick", quick=True, timeout=60)
    assert (row.measured, row.result) == ("ran in 0 s (no parser for its output; see its output)", "-")
    assert info["output_tail"] == "quick\n"
    [row], info = R.run_one("broken", quick=False, timeout=60)
    assert (row.figure, row.result) == ("failed", "FAIL")
    assert info["error"] == "exit status 1: could not build the benchmark file"
    [row], info = R.run_one("sleepy", quick=False, timeout=1)
    assert (row.figure, row.result) == ("failed", "FAIL") and info["error"].startswith("stopped after 1 s")


def test_one_table_and_exit_status(fake_bench, capsys):
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
                                       f"broken, has_quick, log_ingest, prints_rows, sleepy\n")
