"""Weight decay: how sensitive each variant is to weight decay (``analysis.wd_sensitivity``).

Final validation loss against weight decay per variant on a log axis, the
best weight decay, a robust slope and the curvature per group of runs that
agree in everything but weight decay; diverged runs are crosses, runs with
loss spikes are ringed. Where runs have checkpoints, their projection norms
against weight decay. URL: ``?wm=val/loss&variant=qkv,k_eq_v``.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.wd_sensitivity import projection_norms_vs_wd, wd_sensitivity
from app import charts
from app.state import data_version, get_store, query_param, results_over_checkpoints, set_query_params
from loaders import curves

TITLE = "Weight decay"
ICON = ":material/tune:"
ORDER = 30
URL_PATH = "weight-decay"

NORMS = ["norm_q", "norm_k", "norm_v", "norm_o"]


@st.cache_data(show_spinner=False, max_entries=8)
def _runs(db: str, version: tuple) -> pd.DataFrame:
    from loaders.logs import list_runs

    frame = pd.DataFrame(list_runs(get_store()))
    cols = ["id", "name", "variant", "weight_decay", "config", "metrics"]
    if frame.empty:
        return pd.DataFrame(columns=["run_id"] + cols[1:])
    return frame[cols].rename(columns={"id": "run_id"})


@st.cache_data(show_spinner=False, max_entries=8)
def _sensitivity(db: str, version: tuple, metric: str, spike_ratio: float, diverge_ratio: float):
    runs = _runs(db, version)
    points = curves.metric_points(get_store(), metric, runs["run_id"].tolist())
    table = wd_sensitivity(runs, points, spike_ratio=spike_ratio, diverge_ratio=diverge_ratio)
    return table


@st.cache_data(show_spinner=False, max_entries=8)
def _latest(db: str, version: tuple) -> pd.DataFrame:
    return curves.latest_run_checkpoints(get_store())


def per_run(table: pd.DataFrame) -> pd.DataFrame:
    """The sensitivity table's per-run lists as one row per run (``variant, group, run_id, weight_decay,
    final_val_loss, best_val_loss, spikes, diverged``)."""
    cols = ["weight_decays", "final_val_loss", "best_val_loss", "run_ids", "spikes", "diverged"]
    if table.empty:
        return pd.DataFrame(columns=["variant", "group", "run_id", "weight_decay", "final_val_loss",
                                     "best_val_loss", "spikes", "diverged"])
    long = table[["variant", "group"] + cols].explode(cols, ignore_index=True)
    long = long.rename(columns={"weight_decays": "weight_decay", "run_ids": "run_id"})
    long["weight_decay"] = long["weight_decay"].astype(float)
    long["final_val_loss"] = pd.to_numeric(long["final_val_loss"], errors="coerce")
    long["best_val_loss"] = pd.to_numeric(long["best_val_loss"], errors="coerce")
    long["spikes"] = long["spikes"].astype(int)
    long["diverged"] = long["diverged"].astype(bool)
    long["run_id"] = long["run_id"].astype(int)
    return long


def _norms_section(store, version, runs: pd.DataFrame) -> None:
    st.subheader("Projection norms against weight decay")
    latest = _latest(str(store.path), version)
    latest = latest[latest["run_id"].isin(runs["run_id"])]
    if latest.empty:
        st.caption("No run has a checkpoint with a training step yet. Checkpoints in a run's folder are linked "
                   "to it when ingested; their norms then show here.")
        return
    todo = latest[~latest["analysed"]]
    if len(todo):
        st.caption(f"{len(todo)} of {len(latest)} runs' latest checkpoints are not analysed yet.")
        if st.button(f"Analyse {len(todo)} checkpoints", icon=":material/play_arrow:", key="wd_analyse"):
            from app.jobs import analyze

            bar = st.progress(0.0)
            for n, cid in enumerate(todo["checkpoint_id"]):
                bar.progress(n / len(todo), text=f"checkpoint {cid} ({n + 1}/{len(todo)})")
                analyze(store, int(cid))
            bar.empty()
            version = data_version(store)
            latest = curves.latest_run_checkpoints(store)
            latest = latest[latest["run_id"].isin(runs["run_id"])]
    done = latest[latest["analysed"]]
    if done.empty:
        return
    norms = results_over_checkpoints(str(store.path), version, tuple(int(c) for c in done["checkpoint_id"]),
                                     tuple(NORMS))
    table = projection_norms_vs_wd(runs[["run_id", "variant", "weight_decay"]].dropna(subset=["weight_decay"]),
                                   norms[["run_id", "step", "metric", "value"]])
    if table.empty:
        st.caption("The analysed checkpoints' runs have no weight decay recorded.")
        return
    st.plotly_chart(charts.norms_figure(table), width="stretch", key="wd_norms")


def render() -> None:
    store = get_store()
    st.title("Weight decay")
    version = data_version(store)
    runs = _runs(str(store.path), version)
    with_wd = runs[runs["weight_decay"].notna()]
    if with_wd.empty:
        st.info("No runs with a weight decay yet. Ingest a weight-decay sweep (folders like `qkv-wd0.1`, or logs "
                "whose config states `weight_decay`), or set a run's weight decay on the Experiments page. "
                f"From a shell: `python -m app ingest PATH --db {store.path}`.", icon=":material/inbox:")
        return
    metrics = sorted({str(m) for ms in with_wd["metrics"] for m in list(ms)})
    metrics = [m for m in ("val/loss", "train/loss") if m in metrics] + [m for m in metrics
                                                                         if m not in ("val/loss", "train/loss")]
    c1, c2, c3, c4 = st.columns([2, 2, 1, 1])
    wm_url = query_param("wm", "val/loss")
    metric = c1.selectbox("Loss", metrics, index=metrics.index(wm_url) if wm_url in metrics else 0, key="wd_metric")
    variants = sorted(with_wd["variant"].astype(str).unique())
    picked = c2.multiselect("Variants", variants, default=[v for v in (query_param("variant", "") or "").split(",")
                                                              if v in variants], key="wd_variants",
                            placeholder="all variants")
    spike = c3.number_input("Spike above best by", 0.01, 10.0, float(query_param("spike", "0.1")), step=0.05,
                            key="wd_spike", help="a rise of more than this fraction above the best value so far")
    diverge = c4.number_input("Diverged above best x", 1.01, 100.0, float(query_param("div", "1.5")), step=0.1,
                              key="wd_div", help="final loss above this multiple of the best counts as diverged")
    set_query_params(wm=metric if metric != "val/loss" else None, variant=",".join(picked),
                     spike=None if spike == 0.1 else f"{spike:g}", div=None if diverge == 1.5 else f"{diverge:g}")
    table = _sensitivity(str(store.path), version, metric, float(spike), float(diverge))
    if picked:
        table = table[table["variant"].isin(picked)]
    if table.empty:
        st.caption(f"No run with a weight decay logged {metric}.")
        return
    long = per_run(table)
    names = dict(zip(runs["run_id"], runs["name"]))
    st.plotly_chart(charts.wd_figure(long, y_title=f"final {metric}"), width="stretch", key="wd_curve")
    st.caption("Lines: mean final loss of the runs that did not diverge. Crosses: diverged; "
               "black ring: loss spikes.")
    summary = table[["variant", "group", "n_runs", "best_weight_decay", "slope", "curvature"]].copy()
    summary["spiky runs"] = [sum(1 for s in sp if s > 0) for sp in table["spikes"]]
    summary["diverged runs"] = [sum(bool(d) for d in dv) for dv in table["diverged"]]
    st.dataframe(summary, hide_index=True, width="stretch",
                 column_config={"best_weight_decay": st.column_config.NumberColumn("best wd", format="%.4g"),
                                "slope": st.column_config.NumberColumn("slope d loss / d log10 wd", format="%.4f"),
                                "curvature": st.column_config.NumberColumn(format="%.4f")})
    flagged = long[long["diverged"] | (long["spikes"] > 0)]
    if len(flagged):
        st.warning("Unstable runs: " + ", ".join(
            f"{names.get(r.run_id, r.run_id)} (wd {r.weight_decay:g}: "
            + ("diverged" if r.diverged else f"{r.spikes} spikes") + ")" for r in flagged.itertuples()),
            icon=":material/warning:")
    _norms_section(store, version, with_wd)
