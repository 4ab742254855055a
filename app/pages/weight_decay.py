"""Weight decay: how sensitive each variant is to weight decay, and how sure that is
(``analysis.wd_sensitivity``).

Final (or best) validation loss against weight decay per variant on a log
axis, each run a marker (diverged: a cross; loss spikes: ringed), and per
weight decay the mean over its runs with a 95% bootstrap interval where more
than one run (seeds) shares it, labelled with its n. Per group of runs that
agree in everything but weight decay: the best weight decay, a robust slope
and curvature against log10(wd), with intervals where runs repeat, how many
runs and weight decays stand behind them, and the reason where one is
absent. A table lists every weight decay's n, mean and interval. Where runs
have checkpoints, their projection norms against weight decay.
URL: ``?wm=val/loss&wl=best&variant=qkv,k_eq_v``.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analysis.wd_sensitivity import CONFIDENCE, N_BOOT, SEED, projection_norms_vs_wd, wd_sensitivity
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
def _sensitivity(db: str, version: tuple, metric: str, spike_ratio: float, diverge_ratio: float,
                 statistic: str = "final"):
    runs = _runs(db, version)
    points = curves.metric_points(get_store(), metric, runs["run_id"].tolist())
    table = wd_sensitivity(runs, points, spike_ratio=spike_ratio, diverge_ratio=diverge_ratio, statistic=statistic)
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


def per_wd(table: pd.DataFrame) -> pd.DataFrame:
    """The sensitivity table's per-weight-decay points as rows: ``variant, group, weight_decay, n_runs,
    mean, ci_low, ci_high, n_diverged, n_spiky``."""
    cols = ["variant", "group", "weight_decay", "n_runs", "mean", "ci_low", "ci_high", "n_diverged", "n_spiky"]
    rows = [{"variant": r.variant, "group": r.group, **{k: p.get(k) for k in cols[2:]}}
            for r in table.itertuples() for p in r.per_wd]
    out = pd.DataFrame(rows, columns=cols)
    for c in ("weight_decay", "mean", "ci_low", "ci_high"):
        out[c] = pd.to_numeric(out[c], errors="coerce")
    return out


def _x_of(fig: go.Figure, wd: pd.Series) -> pd.Series:
    """Where ``charts.wd_figure`` put each weight decay on its log axis (wd 0 sits on the tick labelled "0")."""
    ticks = dict(zip(fig.layout.xaxis.ticktext or (), fig.layout.xaxis.tickvals or ()))
    return wd.where(wd > 0, ticks.get("0"))


def add_intervals(fig: go.Figure, points: pd.DataFrame, *, y_title: str) -> go.Figure:
    """Per weight decay and group: the mean over runs as a dash with its 95% bootstrap interval as an
    error bar (only where runs repeat) and ``n=`` beside it where more than one run stands behind it."""
    data = points.assign(x=lambda d: _x_of(fig, d["weight_decay"]))
    for i, ((variant, group), g) in enumerate(data.groupby(["variant", "group"], sort=True)):
        name = str(variant) if group == "all" else f"{variant} [{group}]"
        has = g["ci_low"].notna()
        err = dict(type="data", symmetric=False, array=(g["ci_high"] - g["mean"]).where(has, 0).tolist(),
                   arrayminus=(g["mean"] - g["ci_low"]).where(has, 0).tolist(), thickness=1.5, width=6,
                   color=charts.variant_color(variant, i))
        ci = [f"{lo:.4g} to {hi:.4g}" if pd.notna(lo) else "none (one run)" for lo, hi in zip(g["ci_low"], g["ci_high"])]
        fig.add_trace(go.Scatter(
            x=g["x"], y=g["mean"], mode="markers+text", name=f"{name}: mean, 95% CI", legendgroup=name,
            showlegend=False, error_y=err,
            marker=dict(symbol="line-ew-open", size=16, color=charts.variant_color(variant, i), line=dict(width=2)),
            text=[f"n={n}" if n > 1 else "" for n in g["n_runs"]], textposition="middle right",
            customdata=[[w, n, c] for w, n, c in zip(g["weight_decay"], g["n_runs"], ci)],
            hovertemplate=(f"{name}<br>wd %{{customdata[0]:.4g}}<br>mean {y_title} %{{y:.4g}} over "
                           "%{customdata[1]} runs<br>95% CI %{customdata[2]}<extra></extra>")))
    return fig


def _ci(lo, hi, fmt: str) -> str:
    return f"{lo:{fmt}} to {hi:{fmt}}" if pd.notna(lo) and pd.notna(hi) else ""


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per group: counts, best wd, slope, curvature with their intervals, and why any is absent."""
    out = table[["variant", "group", "n_runs", "n_wd", "n_wd_fit", "best_weight_decay", "slope", "curvature"]].copy()
    out["best wd 95% CI"] = [_ci(lo, hi, "g") for lo, hi in zip(table["best_wd_ci_low"], table["best_wd_ci_high"])]
    out["best in"] = [f"{s:.0%} of resamples" if pd.notna(s) else "" for s in table["best_wd_share"]]
    out["slope 95% CI"] = [_ci(lo, hi, "+.4f") for lo, hi in zip(table["slope_ci_low"], table["slope_ci_high"])]
    out["curvature 95% CI"] = [_ci(lo, hi, "+.4f")
                               for lo, hi in zip(table["curvature_ci_low"], table["curvature_ci_high"])]
    out["spiky runs"] = [sum(1 for s in sp if s > 0) for sp in table["spikes"]]
    out["diverged runs"] = [sum(bool(d) for d in dv) for dv in table["diverged"]]
    out["why absent"] = ["; ".join(f"{what}: {why}" for what, why in (("slope, curvature", f), ("best wd", b),
                                                                      ("intervals", i)) if isinstance(why, str))
                         for f, b, i in zip(table["fit_reason"], table["best_reason"], table["interval_reason"])]
    return out


def absent_lines(table: pd.DataFrame) -> list[str]:
    """One line per (statistic, reason): which groups lack it and why, e.g.
    ``"**slope, curvature** n/a for q_eq_k, qkv [n_kv_heads=4]: 2 distinct weight decays > 0 ..."``."""
    by: dict[tuple[str, str], list[str]] = {}
    for r in table.itertuples():
        name = str(r.variant) if r.group == "all" else f"{r.variant} [{r.group}]"
        for what, why in (("slope, curvature", r.fit_reason), ("best wd", r.best_reason),
                          ("intervals", r.interval_reason)):
            if isinstance(why, str):
                by.setdefault((what, why), []).append(name)
    return [f"**{what}** n/a for {', '.join(names)}: {why}" for (what, why), names in by.items()]


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
    stat_url = query_param("wl", "final")
    statistic = c1.radio("Loss of each run", ["final", "best"], index=1 if stat_url == "best" else 0,
                         horizontal=True, key="wd_statistic",
                         help="final: its last logged value; best: its lowest")
    set_query_params(wm=metric if metric != "val/loss" else None, variant=",".join(picked),
                     spike=None if spike == 0.1 else f"{spike:g}", div=None if diverge == 1.5 else f"{diverge:g}",
                     wl=None if statistic == "final" else statistic)
    table = _sensitivity(str(store.path), version, metric, float(spike), float(diverge), statistic)
    if picked:
        table = table[table["variant"].isin(picked)]
    if table.empty:
        st.caption(f"No run with a weight decay logged {metric}.")
        return
    long = per_run(table)
    points = per_wd(table)
    names = dict(zip(runs["run_id"], runs["name"]))
    y_title = f"{statistic} {metric}"
    fig = charts.wd_figure(long, y=f"{statistic}_val_loss", y_title=y_title)
    st.plotly_chart(add_intervals(fig, points, y_title=y_title), width="stretch", key="wd_curve")
    st.caption(f"Markers: one per run (crosses: diverged; black ring: loss spikes). Lines: mean {statistic} loss of "
               f"the runs that did not diverge. Dashes with bars: the mean over every run at that weight decay and "
               f"its {CONFIDENCE:.0%} bootstrap interval ({N_BOOT:,} resamples of its runs, seed {SEED}), drawn "
               "only where more than one run (seeds) shares the weight decay, labelled with that n; an unlabelled "
               "weight decay has one run, so its spread is not measured.")
    summary = summary_table(table)
    st.dataframe(summary, hide_index=True, width="stretch",
                 column_config={"n_runs": st.column_config.NumberColumn("runs"),
                                "n_wd": st.column_config.NumberColumn("weight decays"),
                                "n_wd_fit": st.column_config.NumberColumn("of them > 0",
                                                                          help="wd 0 has no log10: not in the fit"),
                                "best_weight_decay": st.column_config.NumberColumn("best wd", format="%.4g"),
                                "slope": st.column_config.NumberColumn("slope d loss / d log10 wd", format="%.4f"),
                                "curvature": st.column_config.NumberColumn("curvature d² loss / d(log10 wd)²",
                                                                           format="%.4f")})
    st.caption("Slope and curvature: robust (Huber) fits of every run's loss against log10(wd), reported from "
               "3 or more distinct weight decays > 0; best wd: the lowest mean loss, from 2 or more runs at 2 or "
               "more weight decays. Their intervals resample the runs within each weight decay, so they hold "
               "the seed-to-seed spread only at the weight decays that have repeated runs.")
    absent = absent_lines(table)
    if absent:
        st.markdown("\n".join(f"* {line}" for line in absent))
    with st.expander("Every weight decay: runs, mean, interval", expanded=False):
        st.dataframe(points, hide_index=True, width="stretch", key="wd_points",
                     column_config={"weight_decay": st.column_config.NumberColumn("wd", format="%.4g"),
                                    "n_runs": st.column_config.NumberColumn("n runs"),
                                    "mean": st.column_config.NumberColumn(f"mean {statistic} loss", format="%.4f"),
                                    "ci_low": st.column_config.NumberColumn("95% CI low", format="%.4f"),
                                    "ci_high": st.column_config.NumberColumn("95% CI high", format="%.4f")})
    flagged = long[long["diverged"] | (long["spikes"] > 0)]
    if len(flagged):
        st.warning("Unstable runs: " + ", ".join(
            f"{names.get(r.run_id, r.run_id)} (wd {r.weight_decay:g}: "
            + ("diverged" if r.diverged else f"{r.spikes} spikes") + ")" for r in flagged.itertuples()),
            icon=":material/warning:")
    _norms_section(store, version, with_wd)
