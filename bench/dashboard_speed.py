"""How fast the Experiments page and the Checkpoint inspector run on a big database.

Builds (with DuckDB's ``range()``, in seconds) a database of RUNS runs x STEPS
steps x 3 metrics, plus one tiny GPT-2 checkpoint that is analysed once, then
times script runs of the pages in Streamlit's AppTest (the page's ``render()``
measured inside the script, and AppTest's wall time beside it):

* Experiments with 10 runs selected: the first run after the data changed
  (cold caches) and a second one (warm: what every widget change costs);
* the inspector on the analysed checkpoint, cold and warm.

Side by side in the same run it also times the curve query the page uses
(SQL min-max downsampling to <= 2,000 points per run) against fetching the
same 10 runs' raw points, and prints the ratio. Target: each page under 1 s.

    .venv/bin/python bench/dashboard_speed.py [--runs 500] [--steps 20000] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from loaders.store import Store, refresh_run_stats  # noqa: E402

VARIANTS = ["qkv", "wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v"]
WDS = [0.0, 0.01, 0.03125, 0.1, 0.3]


def build(db: Path, runs: int, steps: int) -> float:
    """Fill ``db`` with runs x steps x 3 metrics in SQL; returns seconds."""
    store = Store(db)
    store.migrate()
    t0 = time.perf_counter()
    with store.transaction() as con:
        con.execute(
            """INSERT INTO runs (id, name, source, format, variant, weight_decay, lr, seed)
               SELECT r + 1, 'run-' || (r + 1), '/bench/run-' || (r + 1), 'csv',
                      (?::VARCHAR[])[r % 5 + 1], (?::DOUBLE[])[(r // 5) % 5 + 1], 6e-4, r
               FROM range(?) t(r)""", [VARIANTS, WDS, runs])
        # loss ~ 4 - log(step) noise; a spike every 5,000 steps; lr a cosine schedule
        con.execute(
            """INSERT INTO points
               SELECT r + 1, s, m,
                      CASE m WHEN 'lr' THEN 6e-4 * (1 + cos(pi() * s / ?)) / 2
                             ELSE 4.0 - 0.25 * ln(1 + s) + 0.05 * sin(s * 0.37 + r)
                                  + CASE WHEN s % 5000 = 4999 THEN 2.0 ELSE 0 END
                                  + CASE m WHEN 'val/loss' THEN 0.1 ELSE 0 END END,
                      1.7e9 + s * 0.2, s * 4096
               FROM range(?) t(r), range(?) u(s), (VALUES ('train/loss'), ('val/loss'), ('lr')) v(m)
               ORDER BY 1, 3, 2""", [steps, runs, steps])
        refresh_run_stats(con, range(1, runs + 1))  # what ingest keeps beside the points
    return time.perf_counter() - t0


def add_checkpoint(db: Path, folder: Path) -> int:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from app.jobs import analyze
    from loaders.ingest import ingest_checkpoint

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=4, n_head=8, n_embd=128, vocab_size=300, n_positions=128,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    store = Store(db)
    cid = ingest_checkpoint(store, folder).checkpoint_id
    analyze(store, cid)
    return int(cid)


_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
import importlib
import streamlit as st
from app.state import show_errors
page = importlib.import_module("app.pages.{name}")
t0 = time.perf_counter()
show_errors(page.render)
st.session_state["_bench_s"] = time.perf_counter() - t0
"""


def timed_page(name: str, query: dict) -> tuple[float, float, float, float, object]:
    """(script cold, AppTest wall cold, script warm, AppTest wall warm, app) for one page.

    Script time is the page's ``render()`` measured inside the script run; the
    AppTest wall time adds AppTest's own start-up (component scan, polling).
    Warm is a rerun of the same session, what a widget change costs.
    """
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(_SCRIPT.format(root=str(ROOT), name=name), default_timeout=300)
    for key, value in query.items():
        at.query_params[key] = value
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        at.run()
        wall = time.perf_counter() - t0
        if at.exception:
            raise RuntimeError(f"{name}: {at.exception}")
        out += [float(at.session_state["_bench_s"]), wall]
    return out[0], out[1], out[2], out[3], at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--keep", type=Path, default=None, help="build the database in this folder and keep it")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="qkvscope-bench-")
    folder = args.keep or Path(tmp.name)
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "bench.duckdb"
    if db.exists():
        db.unlink()
    build_s = build(db, args.runs, args.steps)
    n_points = args.runs * args.steps * 3
    print(f"database: {args.runs} runs x {args.steps} steps x 3 metrics = {n_points:,} points, "
          f"built in {build_s:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)")
    cid = add_checkpoint(db, folder / "gpt2-bench")
    os.environ["QKVSCOPE_DB"] = str(db)

    ids = list(range(1, 11))
    from loaders import curves

    store = Store(db)
    t0 = time.perf_counter()
    down = curves.curves(store, ids, "train/loss")
    t_down = time.perf_counter() - t0
    t0 = time.perf_counter()
    with store.connect() as con:
        raw = con.execute("SELECT run_id, step, value FROM points WHERE metric = 'train/loss' "
                          "AND run_id IN (SELECT unnest(?)) ORDER BY run_id, step", [ids]).df()
    t_raw = time.perf_counter() - t0
    print(f"curve query, 10 runs: downsampled {len(down):,} points in {t_down * 1000:.0f} ms; "
          f"raw {len(raw):,} points in {t_raw * 1000:.0f} ms; downsampled/raw time ratio {t_down / t_raw:.2f}")

    query = {"runs": ",".join(map(str, ids)), "m": "train/loss"}
    cold, cold_wall, warm, warm_wall, at = timed_page("experiments", query)
    drawn = any(e.key == "exp_curves" for e in at.get("plotly_chart"))
    print(f"experiments page, 10 runs selected (chart drawn: {drawn}): script cold {cold:.2f} s, warm {warm:.2f} s "
          f"(AppTest wall {cold_wall:.2f} / {warm_wall:.2f} s); warm/cold {warm / cold:.2f}")
    query = {"ckpt": str(cid), "metric": "kv_cka"}
    cold_i, cold_i_wall, warm_i, warm_i_wall, _ = timed_page("inspector", query)
    print(f"inspector, analysed checkpoint: script cold {cold_i:.2f} s, warm {warm_i:.2f} s "
          f"(AppTest wall {cold_i_wall:.2f} / {warm_i_wall:.2f} s); warm/cold {warm_i / cold_i:.2f}")
    target = 1.0
    for label, t in (("experiments cold", cold), ("experiments warm", warm),
                     ("inspector cold", cold_i), ("inspector warm", warm_i)):
        print(f"  {label:18s} script {t:6.2f} s  {'under' if t < target else 'OVER'} the {target:g} s target")

if __name__ == "__main__":
    main()
