"""How fast the Experiments page and the Checkpoint inspector run on a big database.

Builds (with DuckDB's ``range()``, in seconds) a database of RUNS runs x STEPS
steps x 3 metrics, plus one tiny GPT-2 checkpoint (``--checkpoint PATH``: that checkpoint
instead) that is analysed once, then
times script runs of the pages in Streamlit's AppTest (the page's ``render()``
measured inside the script, and AppTest's wall time beside it):

* Experiments with 20 runs selected: the first run after the data changed
  (cold caches) and a second one (warm: what every widget change costs), and
  what its final-metric chart drew (every run, or the means and intervals of
  its groups: the page's default over 200 runs);
* the inspector on the analysed checkpoint, cold (no idle reading child) and warm.

Side by side in the same run it also times the curve query the page uses
(SQL min-max downsampling to <= ``app.pages.experiments.CURVE_POINTS`` points per run) against fetching the
same 10 runs' raw points, and prints the ratio. Target: each page under 1 s.

Then, in a real browser (Debian's Chromium driven by Playwright, launched as
``tests/app/browser.py`` does; never a downloaded browser), against a real
``python -m app serve`` on the bundled demo and on the big database: the time
from a click to the last change of the page's main area (the last chart
drawn), for sidebar navigation to every page (after one untimed round that
stores analyses and fills the server's caches; median and max of
``--rounds``) and for a control change (the Inspector's metric), beside each
page's AppTest script time. A MutationObserver stamps every change inside
``stMain``; a step has ended when Streamlit's status widget is gone and the
main area has been still for 1.5 s, and its time is the last stamp minus the
click. Targets: sidebar navigation < 1 s, a control change < 0.5 s.
Before that untimed round, the first visit to the Inspector since the server
started, ``FIRST_VISIT_AFTER_S`` after the first page (no target; beside it
the later visits' median).

    .venv/bin/python bench/dashboard_speed.py [--runs 500] [--steps 20000] [--keep DIR]
                                              [--rounds 3] [--no-browser] [--checkpoint PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
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


#: Runs inserted per statement by ``build``: each batch is sorted on its own, so the build's
#: memory follows the batch and not the database (300M points sorted at once spill to disk).
BUILD_BATCH = 100


def build(db: Path, runs: int, steps: int) -> float:
    """Fill ``db`` with runs x steps x 3 metrics in SQL; returns seconds.

    A bulk ``INSERT ... SELECT`` from DuckDB's ``range()``, ``BUILD_BATCH`` runs a
    statement, in one transaction, with the run statistics ingest keeps beside the
    points: the fastest way points can get into the store, not what ingesting logs
    costs (``ingest_logs`` times that).
    """
    store = Store(db)
    store.migrate()
    t0 = time.perf_counter()
    with store.transaction() as con:
        con.execute("SET enable_progress_bar = false")
        con.execute(
            """INSERT INTO runs (id, name, source, format, variant, weight_decay, lr, seed)
               SELECT r + 1, 'run-' || (r + 1), '/bench/run-' || (r + 1), 'csv',
                      (?::VARCHAR[])[r % 5 + 1], (?::DOUBLE[])[(r // 5) % 5 + 1], 6e-4, r
               FROM range(?) t(r)""", [VARIANTS, WDS, runs])
        # the ids were given: move the sequence past them, so that runs ingested later get new ones
        con.execute("SELECT max(nextval('run_ids')) FROM range(?)", [runs])
        # loss ~ 4 - log(step) noise; a spike every 5,000 steps; lr a cosine schedule
        for first in range(0, runs, BUILD_BATCH):
            con.execute(
                """INSERT INTO points
                   SELECT r + 1, s, m,
                          CASE m WHEN 'lr' THEN 6e-4 * (1 + cos(pi() * s / ?)) / 2
                                 ELSE 4.0 - 0.25 * ln(1 + s) + 0.05 * sin(s * 0.37 + r)
                                      + CASE WHEN s % 5000 = 4999 THEN 2.0 ELSE 0 END
                                      + CASE m WHEN 'val/loss' THEN 0.1 ELSE 0 END END,
                          1.7e9 + s * 0.2, s * 4096
                   FROM range(?, ?) t(r), range(?) u(s),
                        (VALUES ('train/loss'), ('val/loss'), ('lr')) v(m)
                   ORDER BY 1, 3, 2""", [steps, first, min(runs, first + BUILD_BATCH), steps])
        refresh_run_stats(con, range(1, runs + 1))  # what ingest keeps beside the points
    return time.perf_counter() - t0


#: Runs' logs written as CSV files and ingested through the real ingest path (``ingest_logs``).
INGEST_RUNS = 20


def write_logs(folder: Path, runs: int, steps: int) -> int:
    """``runs`` training logs as wide CSV files, ``folder/logN/metrics.csv`` (step, train_loss,
    val_loss, lr, wall_time: 3 metrics a step, like ``build``'s); returns the points written.
    Their mtimes are set a minute back: finished logs, not ones being written."""
    import numpy as np

    s = np.arange(steps)
    lr = 6e-4 * (1 + np.cos(np.pi * s / steps)) / 2
    for r in range(runs):
        loss = 4.0 - 0.25 * np.log1p(s) + 0.05 * np.sin(s * 0.37 + r) + np.where(s % 5000 == 4999, 2.0, 0.0)
        path = folder / f"log{r + 1}" / "metrics.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            fh.write("step,train_loss,val_loss,lr,wall_time\n")
            fh.writelines(f"{i},{a:.6f},{a + 0.1:.6f},{b:.6g},{1.7e9 + i * 0.2:.1f}\n"
                          for i, a, b in zip(s.tolist(), loss.tolist(), lr.tolist()))
        old = time.time() - 60
        os.utime(path, (old, old))
    return runs * steps * 3


def ingest_logs(db: Path, logs: Path) -> tuple[float, int]:
    """Seconds and points stored by ``loaders.ingest.ingest_paths`` over ``logs`` into ``db``
    (what ``python -m app ingest FOLDER`` runs); raises when a file was not added."""
    from loaders.ingest import ingest_paths

    store = Store(db)
    store.migrate()
    t0 = time.perf_counter()
    report = ingest_paths(store, [logs])
    secs = time.perf_counter() - t0
    bad = [f for f in report.files if f.status != "added"]
    if bad:
        raise RuntimeError(f"{bad[0].path}: {bad[0].status} ({bad[0].reason})")
    return secs, sum(int(f.n_points or 0) for f in report.files)


def add_checkpoint(db: Path, folder: Path, checkpoint: Path | None = None) -> int:
    """Ingest and analyse a tiny GPT-2 written into ``folder`` (4 layers, 8 heads, d_model 128), or
    ``checkpoint`` instead; its id."""
    from app.jobs import analyze
    from loaders.ingest import ingest_checkpoint

    if checkpoint is None:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_layer=4, n_head=8, n_embd=128, vocab_size=300, n_positions=128,
                                   bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    store = Store(db)
    cid = ingest_checkpoint(store, checkpoint or folder).checkpoint_id
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


#: Runs selected on the Experiments page (20 runs plotted < 1 s warm).
PLOTTED = 20
#: Targets in seconds: a page script run, a change of the run list's filter.
PAGE_TARGET, FILTER_TARGET = 1.0, 0.5
#: What the run list filter is set to, in turn, for the filter timings: the search box
#: (``exp_q``), narrowing 2,000 runs to 1,111 and the 20 plotted to 11, and cleared again.
FILTER_NEEDLES = ("run-1", "")


def timed_filter(at, needles: tuple[str, ...] = FILTER_NEEDLES, rounds: int = 3) -> tuple[float, list[float], str]:
    """Script seconds of changes of the Experiments page's search box (``exp_q``) in the session of
    ``at`` (a page already run): the first change (the narrowed curves queried for the first time),
    the later ones (every state seen before), ``rounds`` times over ``needles``; and the page's
    run count caption after the first change ("1,111 of 2,000 runs")."""
    times, caption = [], ""
    for _ in range(rounds):
        for needle in needles:
            at.text_input(key="exp_q").input(needle).run()
            if at.exception:
                raise RuntimeError(f"experiments filter {needle!r}: {at.exception}")
            times.append(float(at.session_state["_bench_s"]))
            if len(times) == 1:
                caption = next((c.value for c in at.caption if c.value.endswith(" runs")), "?")
    return times[0], times[1:], caption


def verdict_line(label: str, secs: float, target: float | None) -> str:
    """``  LABEL  script  S s  under|OVER the T s target``, or ``(measured, no target)`` (what
    ``bench/run_all.py`` reads)."""
    if target is None:
        return f"  {label:18s} script {secs:6.2f} s  (measured, no target)"
    return f"  {label:18s} script {secs:6.2f} s  {'under' if secs < target else 'OVER'} the {target:g} s target"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--keep", type=Path, default=None, help="build the database in this folder and keep it")
    ap.add_argument("--rounds", type=int, default=3, help="timed browser rounds over every page (default 3)")
    ap.add_argument("--no-browser", action="store_true", help="AppTest figures only (no Chromium)")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="analyse this checkpoint for the inspector (e.g. a bundled demo one: a smoke run, no "
                         "transformers import); default a GPT-2 of 4 layers, 8 heads, d_model 128 written here")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores")
    tmp = tempfile.TemporaryDirectory(prefix="qkvscope-bench-")
    folder = args.keep or Path(tmp.name)
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "bench.duckdb"
    if db.exists():
        db.unlink()
    build_s = build(db, args.runs, args.steps)
    n_points = args.runs * args.steps * 3
    size = db.stat().st_size
    print(f"database: {args.runs} runs x {args.steps} steps x 3 metrics = {n_points:,} points, "
          f"built in {build_s:.1f} s ({size / 2**20:.0f} MiB)")
    print(f"build (SQL bulk insert from range(), not the ingest path): {n_points / build_s:,.0f} points/s; "
          f"DuckDB file {size / 1e6:,.0f} MB = {size / n_points:.1f} bytes/point")
    n_log = min(INGEST_RUNS, args.runs)
    written = write_logs(folder / "logs", n_log, args.steps)
    logs_mb = sum(f.stat().st_size for f in (folder / "logs").rglob("*.csv")) / 1e6
    fresh_s, fresh_n = ingest_logs(folder / "ingest.duckdb", folder / "logs")
    print(f"ingest, {n_log} runs' CSV logs x {args.steps} steps x 3 metrics ({written:,} points, "
          f"{logs_mb:.0f} MB), into a new database: {fresh_n:,} points in {fresh_s:.2f} s = "
          f"{fresh_n / fresh_s:,.0f} points/s")
    cid = add_checkpoint(db, folder / "gpt2-bench", args.checkpoint)
    os.environ["QKVSCOPE_DB"] = str(db)

    ids = list(range(1, min(PLOTTED, args.runs) + 1))
    from app.pages.experiments import CURVE_POINTS
    from loaders import curves

    store = Store(db)
    t0 = time.perf_counter()
    down = curves.curves(store, ids, "train/loss", max_points=CURVE_POINTS)   # what the page queries
    t_down = time.perf_counter() - t0
    t0 = time.perf_counter()
    with store.connect() as con:
        raw = con.execute("SELECT run_id, step, value FROM points WHERE metric = 'train/loss' "
                          "AND run_id IN (SELECT unnest(?)) ORDER BY run_id, step", [ids]).df()
    t_raw = time.perf_counter() - t0
    print(f"curve query, {len(ids)} runs: downsampled {len(down):,} points in {t_down * 1000:.0f} ms; "
          f"raw {len(raw):,} points in {t_raw * 1000:.0f} ms; downsampled/raw time ratio {t_down / t_raw:.2f}")

    query = {"runs": ",".join(map(str, ids)), "m": "train/loss"}
    cold, cold_wall, warm, warm_wall, at = timed_page("experiments", query)
    [chart] = [e for e in at.get("plotly_chart") if e.key == "exp_curves"] or [None]
    traces = len(json.loads(chart.proto.spec)["data"]) if chart is not None else 0
    print(f"experiments page, {len(ids)} runs selected (chart drawn: {chart is not None}, {traces} traces): "
          f"script cold {cold:.2f} s, warm {warm:.2f} s "
          f"(AppTest wall {cold_wall:.2f} / {warm_wall:.2f} s); warm/cold {warm / cold:.2f}")
    print(f"experiments final-metric chart: {final_drawing(at)}")
    first_f, later_f, shown = timed_filter(at)
    print(f"experiments run filter (search box set to {FILTER_NEEDLES[0]!r} and cleared, "
          f"{len(later_f) + 1} changes; '{FILTER_NEEDLES[0]}' shows {shown}): first change {first_f:.2f} s, "
          f"later ones median {statistics.median(later_f):.2f} s, max {max(later_f):.2f} s")
    query = {"ckpt": str(cid), "metric": "kv_cka"}
    # The Inspector's first visit, caches emptied and no idle reading child left (what a user's
    # first Inspector visit after a start meets), then again warm.
    import streamlit as st

    from loaders.sandbox import POOL

    st.cache_data.clear()
    st.cache_resource.clear()
    POOL.close()
    cold_i, cold_i_wall, warm_i, warm_i_wall, _ = timed_page("inspector", query)
    print(f"inspector, analysed checkpoint, no idle reading child: script cold {cold_i:.2f} s, "
          f"warm {warm_i:.2f} s (AppTest wall {cold_i_wall:.2f} / {warm_i_wall:.2f} s); warm/cold {warm_i / cold_i:.2f}")
    # The pages that read every point of a metric (each run's whole val/loss curve: spikes,
    # divergence): cold reads them all; warm, what a widget change costs
    whole = {}
    for name in ("weight_decay", "papers"):
        c, c_wall, w, w_wall, _ = timed_page(name, {})
        whole[name] = (c, w)
        print(f"{name} page (reads every val/loss point): script cold {c:.2f} s, warm {w:.2f} s "
              f"(AppTest wall {c_wall:.2f} / {w_wall:.2f} s)")
    for label, t, target in (("experiments cold", cold, PAGE_TARGET), ("experiments warm", warm, PAGE_TARGET),
                             ("filter first", first_f, FILTER_TARGET),
                             ("filter warm", statistics.median(later_f), FILTER_TARGET),
                             ("inspector cold", cold_i, PAGE_TARGET), ("inspector warm", warm_i, PAGE_TARGET),
                             ("weight decay cold", whole["weight_decay"][0], None),
                             ("weight decay warm", whole["weight_decay"][1], PAGE_TARGET),
                             ("papers cold", whole["papers"][0], None),
                             ("papers warm", whole["papers"][1], PAGE_TARGET)):
        print(verdict_line(label, t, target))
    big_s, big_n = ingest_logs(db, folder / "logs")
    print(f"ingest, the same {n_log} runs' CSV logs into this {args.runs}-run database: {big_n:,} points in "
          f"{big_s:.2f} s = {big_n / big_s:,.0f} points/s")
    if not args.no_browser:
        browser_main(db, folder, args.rounds, experiments=query_runs(ids))


def final_drawing(at) -> str:
    """What the Experiments page's final-metric chart drew in the AppTest session ``at``: the Runs
    control's choice and the markers sent (``"mean and 95% interval, 25 markers for 2,020 runs"``)."""
    from app.pages.experiments import FINAL_DRAWINGS

    [chart] = [e for e in at.get("plotly_chart") if e.key == "exp_final"] or [None]
    if chart is None:
        return "not drawn"
    import base64

    import numpy as np

    markers = 0
    for trace in json.loads(chart.proto.spec)["data"]:
        x = trace.get("x", [])              # a list, or a numpy array as plotly sends it: {dtype, bdata}
        markers += (len(base64.b64decode(x["bdata"])) // np.dtype(x["dtype"]).itemsize
                    if isinstance(x, dict) else len(x))
    n_runs = next((c.value.split(" of ")[0] for c in at.caption if c.value.endswith(" runs")), "?")
    return f"{FINAL_DRAWINGS[at.radio(key='exp_fd').value]}, {markers:,} markers for {n_runs} runs"


def query_runs(ids: list[int]) -> str:
    """The Experiments page's URL query with ``ids`` plotted (the ``runs`` and ``m`` keys)."""
    return f"runs={','.join(map(str, ids))}&m=train/loss"

# -- the browser tier ---------------------------------------------------------------------

#: Targets in seconds.
NAV_TARGET, CONTROL_TARGET = 1.0, 0.5
#: Seconds the browser stays on its first page before its first visit to the Inspector (a user
#: reading that page).
FIRST_VISIT_AFTER_S = 5
#: How long the main area must be still (and the status widget gone) for a step to have ended.
QUIET_MS = 1500
#: Installed before any page script: stamps the time of every change inside the main area.
#: A change to a ``<canvas>``'s children is stamped apart (``__qkvCanvas``): they are its
#: fallback content, never painted where canvas is supported (a change to the canvas element
#: itself, its size or style, is painted and stamped with the rest). st.dataframe's grid (Glide
#: Data Grid) draws on a canvas and fills such a child, an accessibility ``<table>`` of the
#: visible cells, on a debounce some 200-300 ms after the grid was drawn; stamped with the rest,
#: that invisible table was the last change of every page with a table, and the time measured
#: the debounce, not what the user sees. A step still waits until both have been still.
_OBSERVER = """
window.__qkvLast = 0;
window.__qkvCanvas = 0;
new MutationObserver((records) => {
  const t = performance.now();
  for (const r of records) {
    const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
    if (!el || !el.closest || !el.closest("[data-testid='stMain']")) continue;
    const canvas = el.closest("canvas");
    const fallback = canvas && (canvas !== el || r.type === "childList");
    if (fallback) window.__qkvCanvas = t; else window.__qkvLast = t;
  }
}).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
"""
_SETTLED = """([t0, quiet]) => {
  const busy = document.querySelector("[data-testid='stStatusWidget']");
  return !busy && performance.now() - Math.max(window.__qkvLast, window.__qkvCanvas, t0) > quiet;
}"""
_CHARTS = "document.querySelectorAll(\"[data-testid='stMain'] .js-plotly-plot .main-svg:first-of-type\").length"


def _settle(page, t0: float, timeout_s: float) -> tuple[float, int, float]:
    """Seconds from ``t0`` (page clock, ms) to the main area's last painted change (0 when nothing
    changed), the charts drawn, and the seconds to its last change of any kind (the grids'
    accessibility tables inside their canvases included; ``_OBSERVER``)."""
    page.wait_for_function(_SETTLED, arg=[t0, QUIET_MS], timeout=timeout_s * 1000, polling=100)
    last, canvas = page.evaluate("[window.__qkvLast, window.__qkvCanvas]")
    return max(0.0, last - t0) / 1000, int(page.evaluate(_CHARTS)), max(0.0, max(last, canvas) - t0) / 1000


def _click_timed(page, locator, timeout_s: float = 120) -> tuple[float, int, float]:
    """``_timed`` of a click on ``locator``; ``timeout_s`` (a FAIL in the table) when the page has
    not settled by then."""
    locator.wait_for(timeout=timeout_s * 1000)
    return _timed(page, locator.click, timeout_s)


def _timed(page, act, timeout_s: float = 120) -> tuple[float, int, float]:
    """Seconds from ``act()`` (a click, a key press) to the main area's last painted change, the
    charts drawn, and the seconds to its last change of any kind (``_settle``); ``timeout_s`` for
    both when the page has not settled by then."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    t0 = page.evaluate("performance.now()")
    act()
    try:
        return _settle(page, t0, timeout_s)
    except PlaywrightTimeout:
        print(f"  (not settled within {timeout_s:.0f} s after the action at {page.url})")
        return float(timeout_s), int(page.evaluate(_CHARTS)), float(timeout_s)


#: Legend entries of the main area's first chart (the Experiments page: one per run plotted).
_LEGEND = """(() => { const c = document.querySelector("[data-testid='stMain'] .js-plotly-plot");
  return c ? c.querySelectorAll(".legend .traces").length : 0; })()"""
#: The Experiments page's search box (its label).
SEARCH_LABEL = "Search name or source"


def browser_timings(db: Path, titles: list[str], rounds: int, experiments: str | None = None,
                    needles: tuple[str, ...] = FILTER_NEEDLES) -> dict:
    """``{"nav": {title: [seconds...]}, "charts": {title: n}, "control": [seconds...],
    "filter": [seconds...], "legend": n}`` for ``db``: seconds to the last painted change; the
    same keys with ``_any`` (``"nav_any"``...) hold the seconds to the last change of any kind
    (``_OBSERVER``), and ``"first_visit"`` is ``(seconds, charts, seconds to any change)``.

    With ``experiments`` (a URL query, ``query_runs``) the session starts on the Experiments page
    with those runs selected; the page keeps its state in the session, so every later sidebar
    click to it plots them again (``legend``: the legend entries drawn then). ``filter``: typing
    each of ``needles`` in turn into the Experiments search box and pressing Enter, ``rounds``
    times, after one untimed round.
    """
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from tests.app.browser import CHROMIUM, CHROMIUM_ARGS, dashboard

    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: bash scripts/setup.sh --dev installs Debian's chromium")
    out: dict = {"nav": {t: [] for t in titles}, "nav_any": {t: [] for t in titles}, "charts": {},
                 "control": [], "control_any": [], "filter": [], "filter_any": []}
    with dashboard(db, "--no-demo") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(_OBSERVER)
            t0 = time.perf_counter()
            # start away from the first page timed (the SQL page, or Experiments with the runs picked)
            page.goto(f"{url}/experiments?{experiments}" if experiments else f"{url}/sql")
            page.wait_for_selector("[data-testid='stSidebarNav']", timeout=120_000)
            _settle(page, 0, 300)
            out["first_load"] = time.perf_counter() - t0

            def nav(title: str, timeout_s: float = 120) -> tuple[float, int, float]:
                link = page.locator("[data-testid='stSidebarNav'] a").filter(has_text=title).first
                return _click_timed(page, link, timeout_s)

            # the first visit to the Inspector since the server started, as a user makes it: nothing
            # cached, its checkpoint analysed on the way if it is not yet (the demo's is not)
            time.sleep(FIRST_VISIT_AFTER_S)
            out["first_visit"] = nav("Checkpoint inspector", timeout_s=600)
            for title in titles:                # untimed: analyses stored, server caches filled
                nav(title, timeout_s=600)
            for _ in range(rounds):
                for title in titles:
                    secs, charts, anything = nav(title)
                    out["nav"][title].append(secs)
                    out["nav_any"][title].append(anything)
                    out["charts"][title] = charts
                    if title == "Experiments":
                        out["legend"] = int(page.evaluate(_LEGEND))
            nav("Experiments")
            search = page.get_by_label(SEARCH_LABEL)
            for i in range(rounds + 1):         # the first round untimed: the narrowed curves cached
                for needle in needles:
                    search.fill(needle)
                    secs, _, anything = _timed(page, lambda: search.press("Enter"))
                    if i:
                        out["filter"].append(secs)
                        out["filter_any"].append(anything)
            page.goto(f"{url}/inspector")
            _settle(page, 0, 300)
            for i in range(rounds):
                page.locator("[data-testid='stSelectbox']").filter(has_text="Metric").first.click()
                option = page.get_by_role("option", name="qk_symmetry" if i % 2 == 0 else "kv_cka", exact=True)
                secs, _, anything = _click_timed(page, option)
                out["control"].append(secs)
                out["control_any"].append(anything)
        finally:
            browser.close()
    return out


def draw_cost(folder: Path, runs: int = PLOTTED, points: int | None = None, repeat: int = 2) -> dict[str, float]:
    """Seconds this Chromium takes to draw ``runs`` lines of ``points`` points (what the
    Experiments chart holds: ``app.pages.experiments.CURVE_POINTS`` a run, the default) with plotly.js alone,
    in a blank page (no server, no Streamlit): as WebGL (``Scattergl``) and as SVG (``Scatter``,
    what ``app.charts`` draws); best of ``repeat``. Headless Chromium has no GPU and
    renders WebGL in software (SwiftShader), as a browser on a machine without one does."""
    import numpy as np
    import plotly.graph_objects as go
    from playwright.sync_api import sync_playwright
    from plotly.offline import get_plotlyjs

    from app.pages.experiments import CURVE_POINTS
    from tests.app.browser import CHROMIUM, CHROMIUM_ARGS

    points = points or CURVE_POINTS
    html = folder / "draw.html"
    html.write_text("<html><body><div id='p' style='width:1300px;height:450px'></div><script>"
                    + get_plotlyjs() + "</script></body></html>")
    step = np.arange(points) * 25
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(html.as_uri())
            for name, kind in (("WebGL (Scattergl)", go.Scattergl), ("SVG (Scatter)", go.Scatter)):
                fig = go.Figure([kind(x=step, y=4 - 0.25 * np.log1p(step) + 0.05 * np.sin(step * 0.37 + r),
                                      mode="lines", name=f"run-{r + 1}", line=dict(width=1), customdata=step)
                                 for r in range(runs)])
                ms = [page.evaluate("""async (spec) => {
                          const f = JSON.parse(spec); Plotly.purge("p"); const t0 = performance.now();
                          await Plotly.newPlot("p", f.data, f.layout);
                          await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
                          return performance.now() - t0; }""", fig.to_json()) for _ in range(repeat)]
                out[name] = min(ms) / 1000
        finally:
            browser.close()
    return out


def demo_database(folder: Path) -> Path:
    """The bundled demo ingested into ``folder/demo.duckdb`` (what the first start builds)."""
    from app.paths import DEMO_DIR
    from loaders.ingest import ingest_paths

    db = folder / "demo.duckdb"
    if db.exists():
        db.unlink()
    store = Store(db)
    ingest_paths(store, [DEMO_DIR])
    with store.connect() as con:
        n_runs, n_ckpts = con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM checkpoints)").fetchone()
    print(f"demo database: {n_runs} runs, {n_ckpts} checkpoints")
    return db


def apptest_pages(db: Path, experiments: dict | None = None,
                  needles: tuple[str, ...] = FILTER_NEEDLES) -> dict[str, float]:
    """Each page's warm AppTest script time (``timed_page``) on ``db``, by page title (the
    Experiments page with the URL query ``experiments``), and the median later change of its
    search box over ``needles`` (``timed_filter``) as ``"Experiments run filter"``."""
    from app.pages import page_modules

    os.environ["QKVSCOPE_DB"] = str(db)
    times = {}
    for mod in page_modules():
        name = mod.__name__.rsplit(".", 1)[-1]
        _, _, warm, _, at = timed_page(name, (experiments or {}) if name == "experiments" else {})
        times[mod.TITLE] = warm
        if name == "experiments":
            times["Experiments run filter"] = statistics.median(timed_filter(at, needles)[1])
    return times


def print_browser_table(name: str, timings: dict, script: dict[str, float]) -> None:
    """One line per measurement: ``<db> <what>  median s  max s  any s  charts  AppTest s  < target  pass``,
    where median and max time the last painted change, and ``any`` is the median time to the last
    change of any kind (the grids' unpainted accessibility tables included, ``_OBSERVER``)."""
    print(f"browser ({name}): first load {timings['first_load']:.2f} s; click to the last painted change "
          f"(the last chart drawn), median (max) of {len(timings['control'])} rounds; 'any': median to the "
          "last change of any kind, the grids' unpainted accessibility tables included")
    print(f"  {'db':6s} {'step':34s} {'median':>7s} {'max':>7s} {'any':>7s} {'charts':>6s} {'AppTest':>8s}  "
          "target  result")

    def line(step: str, secs: list[float], anything: list[float], charts, apptest: float, target: float) -> None:
        med = statistics.median(secs)
        print(f"  {name:6s} {step:34s} {med:6.2f}s {max(secs):6.2f}s {statistics.median(anything):6.2f}s "
              f"{charts:>6} {apptest:7.2f}s  < {target:g} s  {'pass' if med < target else 'FAIL'}")

    for title, secs in timings["nav"].items():
        step = f"sidebar -> {title}"
        if title == "Experiments" and "legend" in timings:
            step += f" ({timings['legend']} runs plotted)"
        line(step, secs, timings["nav_any"][title], timings["charts"][title], script.get(title, float("nan")),
             NAV_TARGET)
    line("control: Inspector metric", timings["control"], timings["control_any"], "",
         script.get("Checkpoint inspector", float("nan")), CONTROL_TARGET)
    if "first_visit" in timings:
        secs, charts, _ = timings["first_visit"]
        later = statistics.median(timings["nav"].get("Checkpoint inspector") or [float("nan")])
        print(f"  {name:6s} first visit: Checkpoint inspector {secs:6.2f}s {charts:>6}  "
              f"({FIRST_VISIT_AFTER_S} s after the first page; later visits: median {later:.2f}s)")
    if timings.get("filter"):
        line("control: Experiments run filter", timings["filter"], timings["filter_any"], "",
             script.get("Experiments run filter", float("nan")), FILTER_TARGET)


#: The Experiments search box's settings per database for the browser and its AppTest column:
#: the big database's run names (``build``), the demo's (``data/demo``'s folder names).
NEEDLES = {"demo": ("wd0.1", ""), "big": FILTER_NEEDLES}


def browser_main(big_db: Path, folder: Path, rounds: int, experiments: str | None = None) -> None:
    """The browser table on the bundled demo and on ``big_db``; there the Experiments page starts
    with the URL query ``experiments`` (``query_runs``)."""
    from urllib.parse import parse_qsl

    from app.pages import page_modules

    # A server watching its source files shows "File change. Rerun" (in the status widget the
    # timing waits on) whenever the working tree is edited; a user's server does not see edits.
    os.environ["STREAMLIT_SERVER_FILE_WATCHER_TYPE"] = "none"

    titles = [m.TITLE for m in page_modules()]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    from app.pages.experiments import CURVE_POINTS

    draw = draw_cost(folder)
    print(f"plotly.js draw in this Chromium, {PLOTTED} runs x {CURVE_POINTS:,} points, blank page: "
          + "; ".join(f"{k} {v:.2f} s" for k, v in draw.items()))
    demo = demo_database(folder)
    for name, db, query in (("demo", demo, None), ("big", big_db, experiments)):
        script = apptest_pages(db, dict(parse_qsl(query)) if query else None, NEEDLES[name])
        print_browser_table(name, browser_timings(db, titles, rounds, query, NEEDLES[name]), script)


if __name__ == "__main__":
    main()
