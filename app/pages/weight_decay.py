"""Weight decay: how sensitive each variant is to weight decay, and how sure that is
(``analysis.wd_sensitivity``).

Final (or best) validation loss against weight decay per variant on a log
axis, each run a marker (diverged: a cross; loss spikes: ringed), and per
weight decay the mean over its runs with a 95% t interval where more
than one run (seeds) shares it, labelled with its n. Per group of runs that
agree in everything but weight decay: the best weight decay, a robust slope
and curvature against log10(wd), with intervals where runs repeat, how many
runs and weight decays stand behind them, and the reason where one is
absent (an em dash in the table, the reason in "why absent"). A table lists
every weight decay's n, mean and interval. Random sweeps (no two runs agree
in everything but weight decay; ``analysis.wd_regression``): per variant the
estimator chosen (grouped or regression, or the one asked for), and for a
regression the tree model's partial dependence of the metric on log10(wd)
with the runs' points and the linear model's line, the wd coefficient with
its case-bootstrap interval and n against the zero (no effect) line, the
covariates used and the runs left out. Where runs have checkpoints, their
projection norms against weight decay; "Analyse" names each checkpoint by its
run and step and redraws the page when done.

Each task's runs (vision, language: ``loaders.run_table``'s ``task``) are grouped, fitted and
regressed on their own (``sensitivity_by_task``), language first; where several tasks are
shown, or the one shown is not language, every legend entry and table row names its task
(``"Q-K-V [image]"``, ``charts.wd_group_name``), and paper B's QVV(3) runs are named by their
condition. Each task has its own figures and y axes (the grouped chart, the regression and its
coefficient: a language loss in nats per token and a ViT's cross-entropy never share an axis or
a fit), and each project's regression is its own (named by project where several are shown). The metric may be any logged one (a loss, ``val/accuracy``, ``val_top1``): best
means its direction (``analysis.directions``).
URL: ``?wm=val/loss&wl=best&variant=qkv,k_eq_v&we=regression``.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analysis.registry import names
from analysis.results_table import DEFAULT_TASK, metric_order, own_condition
from analysis.wd_sensitivity import CONFIDENCE, METHODS, N_BOOT, SEED, projection_norms_vs_wd, wd_sensitivity
from app import charts, figures, tables
from app.attempts import analyse_each, show_batch
from app.page_figures import _task_column, by_task, per_run, per_wd, regressions, wd_curve_figures
from app.pickers import checkpoint_label
from app.plain import hover, html, md
from app.state import (current_notes, data_version, get_store, in_projects, project_filter, query_param,
                       results_over_checkpoints, set_query_params, store_at, cached_read)
from loaders import curves
from loaders.run_table import run_table

TITLE = "Weight decay"
ICON = ":material/tune:"
ORDER = 30
URL_PATH = "weight-decay"

NORMS = names(family="norms")  # norm_q, norm_k, norm_v, norm_o, in registry order
#: shown where a statistic is absent (the reason is in the "why absent" column)
DASH = tables.MISSING


#: The runs' columns the page reads (``loaders.run_table``).
RUN_COLUMNS = ["run_id", "name", "project", "variant", "weight_decay", "lr", "config", "metrics", "task", "condition",
               "n_heads", "n_kv_heads", "d_model", "n_layers", "last_step"]


@cached_read
def _runs(store) -> pd.DataFrame:
    return run_table(store).rename(columns={"id": "run_id"})[RUN_COLUMNS]


def sensitivity_by_task(runs: pd.DataFrame, curves_of, **options) -> pd.DataFrame:
    """``analysis.wd_sensitivity`` of each task's runs on their own (a vision and a language run
    never share a group, a fit or a regression), with ``task`` and ``condition`` first: the paper
    condition all of a group's runs share (``analysis.results_table.OWN_CONDITIONS``), else None.
    ``runs``: ``RUN_COLUMNS``; ``curves_of``: a list of run ids -> their curves (``wd_sensitivity``'s
    ``points``: a frame, or ``loaders.curves.StoredCurves`` read one run at a time); ``options``:
    ``wd_sensitivity``'s keywords."""
    condition = dict(zip(runs["run_id"].astype(int), runs["condition"].map(own_condition)))
    parts = []
    for task, sub in runs.groupby("task", sort=False):
        table = wd_sensitivity(sub, curves_of(sub["run_id"].tolist()), **options)
        if len(table):
            own = [{condition.get(int(i)) for i in ids} for ids in table["run_ids"]]
            parts.append(table.assign(task=str(task), condition=[c.pop() if len(c) == 1 else None for c in own]))
    if not parts:
        return wd_sensitivity(runs.iloc[:0], [], **options).assign(task=None, condition=None)
    out = pd.concat(parts, ignore_index=True)
    order = sorted(out["task"].unique(), key=lambda t: (t != DEFAULT_TASK, t))  # language first, as Results
    out["_t"] = out["task"].map({t: i for i, t in enumerate(order)})
    out = out.sort_values(["_t", "variant", "group"], kind="stable").drop(columns="_t").reset_index(drop=True)
    return out[["task", "condition"] + [c for c in out.columns if c not in ("task", "condition")]]


@st.cache_data(show_spinner=False, max_entries=8)
def _sensitivity(db: str, version: tuple, metric: str, spike_ratio: float, diverge_ratio: float,
                 statistic: str = "final", method: str = "auto"):
    runs = _runs(db, version)
    store = store_at(db)
    return sensitivity_by_task(runs, lambda ids: curves.StoredCurves(store, metric, tuple(ids)),
                               spike_ratio=spike_ratio, diverge_ratio=diverge_ratio, statistic=statistic,
                               metric=metric, method=method, overrides=curves.metric_directions(store))


@st.cache_data(show_spinner=False, max_entries=8)
def _latest(db: str, version: tuple) -> pd.DataFrame:
    """Each run's latest checkpoint (``loaders.curves.latest_run_checkpoints``) and ``analysed``:
    whether its weights analysis is current (``app.state.current_notes``, analyze's rule)."""
    latest = curves.latest_run_checkpoints(store_at(db))
    latest["analysed"] = [current_notes(db, version, int(c), ("weights",)) is not None
                          for c in latest["checkpoint_id"]]
    return latest


def _ci(lo, hi, fmt: str) -> str:
    return f"{lo:{fmt}} to {hi:{fmt}}" if _has(lo) and _has(hi) else DASH


def _has(value) -> bool:
    return value is not None and not (isinstance(value, float) and value != value)


def _fmt(value, fmt: str) -> str:
    """A number as text, or an em dash where it is absent (NaN or None)."""
    return format(value, fmt) if _has(value) else DASH


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per group: counts, best wd, slope, curvature with their intervals, and why any is absent.

    Statistics are text, an em dash where absent (the reason in ``why absent``), so no cell reads "None".
    A ``task`` column comes first when the table holds several tasks, and a paper condition of its
    own names its group's variant (``"QVV(3)"``)."""
    out = table[["variant", "group", "method", "n_runs", "n_wd", "n_wd_fit"]].copy()
    if "condition" in table.columns:
        out["variant"] = [own_condition(c) or v for v, c in zip(table["variant"], table["condition"])]
    if "task" in table.columns and charts.several_tasks(table["task"]):
        out.insert(0, "task", table["task"])
    out["best_weight_decay"] = [_fmt(v, "g") for v in table["best_weight_decay"]]
    out["slope"] = [_fmt(v, "+.4f") for v in table["slope"]]
    out["curvature"] = [_fmt(v, "+.4f") for v in table["curvature"]]
    out["best wd 95% CI"] = [_ci(lo, hi, "g") for lo, hi in zip(table["best_wd_ci_low"], table["best_wd_ci_high"])]
    out["best in"] = [f"{s:.0%} of draws" if _has(s) else DASH for s in table["best_wd_share"]]
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
    ``"**slope, curvature** n/a for q_eq_k, qkv [n_kv_heads=4]: 2 distinct weight decays > 0 ..."``.
    A variant whose method is the regression gets one line instead of one per group (a random
    sweep has a group per run): ``"**grouped statistics** n/a for the 40 groups of qkv: ..."``."""
    by: dict[tuple[str, str], list[str]] = {}
    swept = table[table["method"] == "regression"] if "method" in table.columns else table.iloc[:0]
    lines = []
    shown = charts.wd_task_shown(table)
    for (task, variant), g in swept.groupby([_task_column(swept), "variant"], sort=True):
        lone = int((g["n_wd"] <= 1).sum())
        lines.append(f"**grouped statistics** n/a for {lone} of the {len(g)} groups of "
                     f"{charts.wd_group_name(variant, 'all', shown(task), paper_label=False)}: each holds runs "
                     "at one weight decay (a random sweep); the regression under *Random sweeps* is used instead")
    for r in table.drop(swept.index).itertuples():
        name = charts.wd_group_name(r.variant, r.group, shown(getattr(r, "task", None)), getattr(r, "condition", None),
                                    paper_label=False)
        for what, why in (("slope, curvature", r.fit_reason), ("best wd", r.best_reason),
                          ("intervals", r.interval_reason)):
            if isinstance(why, str):
                by.setdefault((what, why), []).append(name)
    return lines + [f"**{what}** n/a for {', '.join(names)}: {why}" for (what, why), names in by.items()]


def points_table(points: pd.DataFrame) -> pd.DataFrame:
    """``per_wd`` for display: the interval as text, an em dash with "(one run)" where no run repeats;
    ``task`` first when the points are of several tasks."""
    out = points[["variant", "group", "weight_decay", "n_runs", "mean"]].copy()
    if "task" in points.columns and charts.several_tasks(points["task"]):
        out.insert(0, "task", points["task"])
    out["95% CI"] = [_ci(lo, hi, ".4f") if _has(lo) else f"{DASH} (one run)" if n == 1 else DASH
                     for lo, hi, n in zip(points["ci_low"], points["ci_high"], points["n_runs"])]
    out["diverged"], out["spiky"] = points["n_diverged"], points["n_spiky"]
    return out


# -- random sweeps: the regression estimator ---------------------------------------------------

RegKey = tuple[str, str, str]        # (task, variant, project): app.page_figures.regressions


def _subject(key: RegKey, keys, *, paper_label: bool = True) -> str:
    """A regression's name: its variant (paper label or stored name), with its task where ``keys``
    hold several tasks or the task is not language (``"Q-K-V [image]"``), and its project where
    they hold several projects (``"Q-K-V [image] · sweep-a"``)."""
    task, variant, project = key
    keys = list(keys)
    shown = charts.wd_task_shown(pd.DataFrame({"task": [k[0] for k in keys]}))
    name = charts.wd_group_name(variant, "all", shown(task) if task else None, paper_label=paper_label)
    return f"{name} · {project}" if len({k[2] for k in keys}) > 1 else name


def regression_figure(regs: dict[RegKey, dict], *, y_title: str, names=None) -> go.Figure:
    """Per variant (and project) of one task: the runs used (markers), the tree model's partial
    dependence on log10(wd) (solid) and the linear model's (dotted), log x. One task per figure
    (``app.page_figures.by_task``): tasks never share a y axis. ``names``: the keys the names are
    made unique among (all shown regressions; ``regs``' own by default)."""
    fig = go.Figure()
    names = list(names or regs)
    for i, (key, reg) in enumerate(sorted(regs.items())):
        color, shown = charts.variant_color(key[1], i), _subject(key, names)
        fig.add_trace(go.Scatter(
            x=reg["weight_decays"], y=reg["values"], mode="markers", name=f"{shown}: runs", legendgroup=shown,
            marker=dict(color=color, size=8, opacity=0.6), customdata=reg["run_ids"],
            hovertemplate=f"{hover(shown)}<br>run %{{customdata}}<br>wd %{{x:.4g}}<br>{hover(y_title)} %{{y:.4g}}"
                          "<extra></extra>"))
        if reg["pd_values"] is None:
            continue
        fig.add_trace(go.Scatter(
            x=reg["pd_weight_decays"], y=reg["pd_values"], mode="lines", name=f"{shown}: partial dependence (trees)",
            legendgroup=shown, line=dict(color=color, width=3),
            hovertemplate=f"{hover(shown)}<br>wd %{{x:.4g}}<br>partial dependence %{{y:.4g}}<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=reg["pd_weight_decays"], y=reg["linear_pd_values"], mode="lines", name=f"{shown}: linear model",
            legendgroup=shown, line=dict(color=color, width=1.5, dash="dot"), hoverinfo="skip"))
    fig.update_layout(height=420, template="plotly_white", margin=dict(l=60, r=20, t=20, b=50),
                      legend=dict(orientation="h", y=-0.2), hovermode="closest")
    fig.update_xaxes(type="log", title="weight decay (log; wd 0 left out)")
    fig.update_yaxes(title=html(y_title))
    return fig


def coefficient_figure(regs: dict[RegKey, dict], *, metric: str, names=None) -> go.Figure:
    """The wd coefficient per variant (and project) of one task with its case-bootstrap interval and n,
    and the zero (no effect) line: in the task's own units, so one task per figure."""
    fig = go.Figure()
    rows = [(k, r) for k, r in sorted(regs.items()) if r["wd_coef"] is not None]
    names = list(names or regs)
    for i, (key, reg) in enumerate(rows):
        variant, shown = key[1], _subject(key, names)
        lo, hi, b = reg["wd_coef_ci_low"], reg["wd_coef_ci_high"], reg["wd_coef"]
        err = (dict(type="data", symmetric=False, array=[hi - b], arrayminus=[b - lo], thickness=2, width=8)
               if lo is not None else None)
        fig.add_trace(go.Scatter(
            x=[b], y=[html(shown)], mode="markers+text", name=shown, showlegend=False, error_x=err,
            marker=dict(color=charts.variant_color(variant, i), size=12), text=[f"n={reg['n_runs']}"],
            textposition="top center",
            hovertemplate=(f"{hover(shown)}<br>d {hover(metric)} / d log10(wd) %{{x:+.4f}}<br>"
                           f"{reg['confidence']:.0%} CI {_ci(lo, hi, '+.4f')}<br>n {reg['n_runs']} runs"
                           "<extra></extra>")))
    fig.add_vline(x=0, line=dict(color="#555", dash="dash", width=1), annotation_text="0: no effect",
                  annotation_position="top")
    fig.update_layout(height=120 + 60 * max(len(rows), 1), template="plotly_white",
                      margin=dict(l=60, r=20, t=30, b=50))
    fig.update_xaxes(title=html(f"d {metric} / d log10(wd)"), zeroline=False)
    return fig


def regression_table(regs: dict[RegKey, dict]) -> pd.DataFrame:
    """One row per task, variant and project (``"qkv"``, ``"qkv [image]"``, ``"qkv · sweep-a"``): n,
    the wd coefficient with its interval, R^2, the covariates, the runs left out, and the tree
    model's best wd and slope; an em dash where absent, the reason in ``why absent``."""
    rows = []
    for key, reg in sorted(regs.items()):
        variant = _subject(key, regs, paper_label=False)
        covs = ", ".join(f"log10({c['name']})" if c["transform"] == "log10" else c["name"] for c in reg["covariates"])
        rows.append({
            "variant": variant, "runs": reg["n_runs"], "wd coefficient": _fmt(reg["wd_coef"], "+.4f"),
            f"{reg['confidence']:.0%} CI": _ci(reg["wd_coef_ci_low"], reg["wd_coef_ci_high"], "+.4f"),
            "R²": _fmt(reg["r2"], ".3f"), "covariates": covs or DASH,
            "not used": "; ".join(f"{u['name']}: {u['reason']}" for u in reg["unused"]) or DASH,
            "left out": reg["note"] or DASH,
            "trees: best wd": _fmt(reg["pd_best_weight_decay"], ".4g"), "trees: slope": _fmt(reg["pd_slope"], "+.4f"),
            "why absent": reg["reason"] or ""})
    return pd.DataFrame(rows)


def _regression_section(table: pd.DataFrame, *, metric: str, y_title: str) -> None:
    keyed = table.assign(task=_task_column(table), project=table["project"] if "project" in table.columns else "")
    methods = keyed.drop_duplicates(["task", "variant", "project"])[["task", "variant", "project", "method",
                                                                     "method_reason"]]
    method_keys = [(str(m.task or ""), str(m.variant), str(m.project or "")) for m in methods.itertuples()]
    regs = regressions(table)
    st.subheader("Random sweeps: effect of log10(wd) with the other hyperparameters held fixed")
    st.markdown("\n".join(f"* **{_subject(k, method_keys, paper_label=False)}**: {m.method} ({m.method_reason})"
                          for k, m in zip(method_keys, methods.itertuples())))
    if not regs:
        st.caption("No variant uses the regression: each has runs that agree in everything but weight decay "
                   "(choose *regression* above to fit it anyway).")
        return
    # one figure pair per task: a task's losses have their own scale, so no y axis or fit is shared
    per_task = by_task(regs)
    for task, task_regs in per_task.items():
        suffix = "" if len(per_task) == 1 else f"_{task}"
        if len(per_task) > 1:
            st.markdown(f"**{md(task)}**")
        left, right = st.columns([3, 2])
        figures.show(regression_figure(task_regs, y_title=y_title, names=regs), key=f"wd_regression{suffix}",
                     where=left)
        figures.show(coefficient_figure(task_regs, metric=metric, names=regs), key=f"wd_coef{suffix}", where=right)
    st.caption(f"Right: change of the {md(y_title)} per decade of weight decay with the other hyperparameters held "
               "fixed; bars: its case-bootstrap interval; n: runs fitted. An interval across the dashed line "
               "means the sweep cannot tell the sign. Each task, project and geometry is fitted on its own.")
    st.dataframe(regression_table(regs), hide_index=True, width="stretch", placeholder=tables.MISSING, key="wd_regression_table")
    any_reg = next(iter(regs.values()))
    st.caption(
        f"Linear model: least squares of each run's {md(y_title)} on log10(wd) and the other swept hyperparameters "
        "(log10 for learning rates and other positive values drawn over orders of magnitude; standardised); the "
        f"coefficient is the change per decade of weight decay with the others held fixed, its interval a "
        f"{any_reg['confidence']:.0%} case bootstrap ({any_reg['n_boot']:,} resamples of the runs). Partial "
        f"dependence: {any_reg['pd_model']}, its prediction at each weight decay averaged over the runs' other "
        "hyperparameters; trees flatten an effect at the edges, so read its shape, and the coefficient for the "
        "size. Runs at wd 0 are left out (log10 0 is undefined).")


def applies_to_line(runs: pd.DataFrame) -> str | None:
    """Which optimizer group's weight decay the page shows, for runs whose code sets several
    (modded-nanogpt: Muon for the matrices, Adam for embeddings and scalars); None when no run
    says (a single weight decay)."""
    groups = {}
    for name, cfg in zip(runs["name"], runs["config"]):
        if isinstance(cfg, dict) and cfg.get("weight_decay_applies_to"):
            groups.setdefault(str(cfg["weight_decay_applies_to"]), []).append(str(name))
    if not groups:
        return None
    parts = "; ".join(f"{g} ({len(n)} run{'s' if len(n) > 1 else ''})" for g, n in sorted(groups.items()))
    return (f"Weight decay here is the one applied to the attention and MLP matrices, read from the optimizer "
            f"call of the run's code: {parts}. Every parameter group's value is in the run's config "
            "(`optimizer_groups`).")


def _norms_section(store, version, runs: pd.DataFrame, variants=None) -> None:
    st.subheader("Projection norms against weight decay")
    latest = _latest(str(store.path), version)
    latest = latest[latest["run_id"].isin(runs["run_id"])]
    if latest.empty:
        st.caption("No run has a checkpoint with a training step yet. Checkpoints in a run's folder are linked "
                   "to it when ingested; their norms then show here.")
        return
    show_batch("wd_analysed")
    todo = latest[~latest["analysed"]]
    if len(todo):
        names = dict(zip(runs["run_id"], runs["name"]))
        labels = [checkpoint_label({"id": r.checkpoint_id, "step": r.step, "path": "",
                                    "run": names.get(r.run_id, f"run {r.run_id}")}) for r in todo.itertuples()]
        st.caption(f"{len(todo)} of {len(latest)} runs' latest checkpoints are not analysed yet: "
                   + ", ".join(labels) + ".")
        if st.button(f"Analyse {len(todo)} checkpoints", icon=":material/play_arrow:", key="wd_analyse"):
            # one checkpoint that fails does not stop the others (app.attempts.analyse_each)
            st.session_state["wd_analysed"] = analyse_each(store, list(zip(todo["checkpoint_id"], labels)))
            # what was drawn above (the caption, the button) describes the store before the analysis:
            # draw the page again from the store as it is now
            _latest.clear()
            st.rerun()
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
    # the Variants filter applies here too; the runs give head counts, so MHA and MQA are apart
    figures.show(charts.norms_figure(table, variants=variants, runs=runs), key="wd_norms")


def render() -> None:
    store = get_store()
    st.title("Weight decay")
    version = data_version(store)
    runs = in_projects(_runs(str(store.path), version), project_filter(store, version))
    with_wd = runs[runs["weight_decay"].notna()]
    if with_wd.empty:
        st.info("No runs with a weight decay yet. Ingest a weight-decay sweep (folders like `qkv-wd0.1`, or logs "
                "whose config states `weight_decay`), or set a run's weight decay on the Experiments page. "
                f"From a shell: `python -m app ingest PATH --db {store.path}`.", icon=":material/inbox:")
        return
    # validation loss, then accuracies (val/accuracy, val_top1), then training metrics (as every page)
    metrics = metric_order(str(m) for ms in with_wd["metrics"] for m in list(ms))
    c1, c2, c3, c4 = st.columns([2, 2, 1, 1])
    wm_url = query_param("wm", "val/loss")
    metric = c1.selectbox("Metric", metrics, index=metrics.index(wm_url) if wm_url in metrics else 0, key="wd_metric")
    variants = sorted(with_wd["variant"].astype(str).unique())
    picked = c2.multiselect("Variants", variants, default=[v for v in (query_param("variant", "") or "").split(",")
                                                              if v in variants], key="wd_variants",
                            placeholder="all variants")
    spike = c3.number_input("Spike above best by", 0.01, 10.0, float(query_param("spike", "0.1")), step=0.05,
                            key="wd_spike", help="a rise of more than this fraction above the best value so far")
    diverge = c4.number_input("Diverged above best x", 1.01, 100.0, float(query_param("div", "1.5")), step=0.1,
                              key="wd_div", help="final loss above this multiple of the best counts as diverged")
    meth_url = query_param("we", "auto")
    method = c2.radio("Estimator", list(METHODS), index=list(METHODS).index(meth_url) if meth_url in METHODS else 0,
                      horizontal=True, key="wd_method",
                      help="grouped: runs that agree in everything but weight decay; regression: log10(wd) with "
                           "the other swept hyperparameters as covariates (random sweeps); auto: regression for a "
                           "variant when under half of its runs are in groups with runs at 2 or more weight decays")
    stat_url = query_param("wl", "final")
    statistic = c1.radio("Loss of each run", ["final", "best"], index=1 if stat_url == "best" else 0,
                         horizontal=True, key="wd_statistic",
                         help="final: its last logged value; best: its lowest")
    set_query_params(wm=metric if metric != "val/loss" else None, variant=",".join(picked),
                     spike=None if spike == 0.1 else f"{spike:g}", div=None if diverge == 1.5 else f"{diverge:g}",
                     wl=None if statistic == "final" else statistic, we=None if method == "auto" else method)
    applies = applies_to_line(with_wd if not picked else with_wd[with_wd["variant"].isin(picked)])
    if applies:
        st.caption(applies)
    table = _sensitivity(str(store.path), version, metric, float(spike), float(diverge), statistic, method)
    if picked:
        table = table[table["variant"].isin(picked)]
    if table.empty:
        st.caption(f"No run with a weight decay logged {md(metric)}.")
        return
    long = per_run(table)
    points = per_wd(table)
    names = dict(zip(runs["run_id"], runs["name"]))
    y_title = f"{statistic} {metric}"
    # a variant fitted by the regression has a group per run: its runs are drawn under "Random sweeps"
    swept = sorted(regressions(table))
    shown = wd_curve_figures(table, statistic=statistic, metric=metric)
    if shown:
        for task, fig in shown.items():
            if len(shown) > 1:
                st.markdown(f"**{md(task)}**")
            figures.show(fig, key="wd_curve" if len(shown) == 1 else f"wd_curve_{task}")
        st.caption(f"Markers: one per run (crosses: diverged; black ring: loss spikes). Lines: mean {statistic} loss "
                   f"of the runs that did not diverge. Dashes with bars: the mean over every run at that weight decay "
                   f"and its {CONFIDENCE:.0%} t interval (n - 1 degrees of freedom), "
                   "drawn only where more than one run (seeds) shares the weight decay, labelled with that n; an "
                   "unlabelled weight decay has one run, so its spread is not measured."
                   + (f" Not drawn here: {', '.join(_subject(k, swept, paper_label=False) for k in swept)} "
                      "(a group per run; see *Random sweeps*)." if swept else ""))
    _regression_section(table, metric=metric, y_title=y_title)
    summary = summary_table(table)
    st.dataframe(summary, hide_index=True, width="stretch", placeholder=tables.MISSING,
                 column_config={"n_runs": st.column_config.NumberColumn("runs"),
                                "n_wd": st.column_config.NumberColumn("weight decays"),
                                "n_wd_fit": st.column_config.NumberColumn("of them > 0",
                                                                          help="wd 0 has no log10: not in the fit"),
                                "best_weight_decay": st.column_config.TextColumn("best wd"),
                                "slope": st.column_config.TextColumn("slope d loss / d log10 wd"),
                                "curvature": st.column_config.TextColumn("curvature d² loss / d(log10 wd)²")})
    st.caption("Slope and curvature: robust (Huber) fits of every run's loss against log10(wd), reported from "
               "3 or more distinct weight decays > 0; best wd: the lowest mean loss, from 2 or more runs at 2 or "
               "more weight decays. Slope and curvature intervals: the fit \u00b1 a t quantile times a wild-bootstrap "
               f"standard error ({N_BOOT:,} refits, seeded per group from {SEED}); best in: the share of {N_BOOT:,} draws "
               "of the means from their empirical-Bayes posterior whose best wd is the one reported. They hold "
               "the seed-to-seed spread only at the weight decays that have repeated runs.")
    absent = absent_lines(table)
    if absent:
        st.markdown("\n".join(f"* {line}" for line in absent))
    with st.expander("Every weight decay: runs, mean, interval", expanded=False):
        st.dataframe(points_table(points), hide_index=True, width="stretch", placeholder=tables.MISSING, key="wd_points",
                     column_config={"weight_decay": st.column_config.NumberColumn("wd", format="%.4g"),
                                    "n_runs": st.column_config.NumberColumn("n runs"),
                                    "mean": st.column_config.NumberColumn(f"mean {statistic} loss", format="%.4f")})

    flagged = long[long["diverged"] | (long["spikes"] > 0)]
    if len(flagged):
        st.warning("Unstable runs: " + ", ".join(
            f"{md(names.get(r.run_id, r.run_id))} (wd {r.weight_decay:g}: "
            + ("diverged" if r.diverged else f"{r.spikes} spikes") + ")" for r in flagged.itertuples()),
            icon=":material/warning:")
    _norms_section(store, version, with_wd, variants=picked)
