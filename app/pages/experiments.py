"""Experiments: find runs, overlay their curves, compare final metrics, fix metadata.

Every selection lives in the URL (``?runs=3,7&m=val/loss&x=step&s=0.6&logy=1``),
so a copied link reopens the same view, and in the session (``exp_saved``), so
leaving the page and coming back through the navigation (which clears the URL)
reopens it too. Without either, the best run of each group (variant x head
sharing x task) is plotted. The search and filters narrow the curves already
plotted as well as the table. Curves are downsampled in DuckDB
(``loaders.curves``): no curve has more than ``CURVE_POINTS`` (1,000) points and spikes stay.
The curves of every selected run are fetched (and cached) together and the
filters pick from them, so changing a filter runs no new curve query.
Smoothing is ``analysis.trajectories.smooth`` (time-weighted, debiased EMA).
The final-metric scatter draws every run, or per group and hyperparameter value the mean
of its runs with a 95% t interval (``charts.final_summary``, the Weight decay page's
interval: ``analysis.intervals``): every run up to
``EVERY_RUN_MAX`` (200) runs in the table, the means above that, unless the Runs control
(``fd``) says otherwise. The metadata form is drawn only while its expander is open.
"""
from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from analysis.directions import direction
from analysis.results_table import best_of_each_group, metric_order, run_groups, table_order
from analysis.trajectories import smooth
from analysis.variants import ALL_VARIANTS as _KNOWN_VARIANTS, UNKNOWN
from app import charts, figures, tables
from app.plain import md
from app.state import (data_version, get_store, in_projects, metric_directions, project_filter, query_param,
                       set_query_params, url_choice, url_float, url_ignored, url_ints, url_notes, url_subset,
                       cached_read)
from loaders import curves
from loaders.logs.runs import COLUMN_FIELDS, set_run_metadata
from loaders.run_table import run_table

TITLE = "Experiments"
ICON = ":material/monitoring:"
ORDER = 20
URL_PATH = "experiments"

RUN_COLUMNS = ["id", "name", "project", "variant", "condition", "d_model", "n_layers", "n_heads", "n_kv_heads", "task",
               "weight_decay", "lr",
               "seed", "model_size", "format", "n_points", "first_step", "last_step", "metrics", "source"]
HPARAMS = ["weight_decay", "lr", "seed", "model_size", "n_kv_heads", "variant"]
X_LABELS = {"step": "Step", "tokens": "Tokens", "wall_time": "Wall time"}
#: The fields the edit form sets, in form order (three a row): the metadata ingest reads
#: (``loaders.logs.metadata.FIELDS``, each typed as ``loaders.logs.runs.COLUMN_FIELDS`` says);
#: ``variant`` is a select box, the others text boxes.
EDITABLE = ("variant", "weight_decay", "lr", "n_kv_heads", "seed", "model_size")
VARIANTS = (*_KNOWN_VARIANTS, UNKNOWN)
#: URL keys of this page: kept in the session (``SAVED``) so the page reopens as it was left.
URL_KEYS = ("runs", "m", "x", "s", "logx", "logy", "group", "q", "variant", "wd", "fmt", "src", "fm", "hp",
            "view", "fv", "fd")
SAVED = "exp_saved"
#: Runs plotted when nothing is selected yet: the best of each group, at most this many.
DEFAULT_RUNS = 8
#: Points per curve sent to the chart (``loaders.curves``' ``max_points``): the chart is about
#: 900 px wide in the page's column, so 500 min-max buckets are one per 2 px or less, spikes
#: kept, at half the points (and half the browser's drawing) of the loader's 2,000 cap.
CURVE_POINTS = 1000
#: The final-metric scatter's two drawings (URL key ``fd``): every run a marker, or per group and
#: hyperparameter value the mean of its runs with a 95% t interval (``charts.final_summary``).
FINAL_DRAWINGS = {"runs": "every run", "mean": "mean and 95% interval"}
#: Up to this many runs in the table the scatter opens with every run, above it with the means:
#: one marker per group and x whatever the runs (2,000 SVG markers, drawn twice, cost 0.4-0.9 s
#: in Chromium), and a mean with its interval says more than a cloud of overlapping markers.
EVERY_RUN_MAX = 200


# -- cached reads (keyed by the database file's version) ----------------------

@cached_read
def _runs(store) -> pd.DataFrame:
    """The runs table's rows: ``RUN_COLUMNS`` of ``loaders.run_table`` (task, heads, paper condition)."""
    return run_table(store)[RUN_COLUMNS]


@cached_read(max_entries=32)
def _curves(store, ids: tuple, metric: str, x: str) -> pd.DataFrame:
    return curves.curves(store, ids, metric, x=x, max_points=CURVE_POINTS)


@cached_read(max_entries=32)
def _band(store, ids: tuple, metric: str, x: str) -> pd.DataFrame:
    return curves.band_points(store, ids, metric, x=x)


@cached_read(max_entries=16)
def _finals(store, metric: str) -> pd.DataFrame:
    return curves.final_values(store, metric, overrides=curves.metric_directions(store))


# -- URL helpers ----------------------------------------------------------------

def _fmt_wd(v) -> str:
    return "none" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"


def _metrics_of(runs: pd.DataFrame) -> list[str]:
    names: set[str] = set()
    for m in runs["metrics"]:
        if isinstance(m, (list, tuple)):
            names.update(str(x) for x in m)
        elif hasattr(m, "tolist"):
            names.update(str(x) for x in m.tolist())
        elif isinstance(m, str) and m:
            names.update(s.strip() for s in m.split(","))
    return metric_order(names)


def _restore_saved() -> dict | None:
    """The page's last state in this session; written into the URL when the URL has none of
    this page's keys (the navigation cleared it), so widgets start from it."""
    saved = st.session_state.get(SAVED)
    if saved is not None and not any(k in st.query_params for k in URL_KEYS):
        set_query_params(**{k: v for k, v in saved.items() if v})
    return saved


def _save() -> None:
    st.session_state[SAVED] = {k: query_param(k) for k in URL_KEYS}


# -- page sections --------------------------------------------------------------

def _filters(runs: pd.DataFrame) -> pd.DataFrame:
    c1, c2, c3, c4, c5 = st.columns([2, 1.2, 1.2, 1.2, 1.6])
    search = c1.text_input("Search name or source", value=query_param("q", ""), key="exp_q",
                           placeholder="e.g. mqa  or  wd0.1")
    variants = sorted(str(v) for v in runs["variant"].dropna().unique())
    wds = sorted({_fmt_wd(v) for v in runs["weight_decay"]}, key=lambda s: (s == "none", float(s) if s != "none" else 0))
    formats = sorted(str(v) for v in runs["format"].dropna().unique())
    sources = sorted(str(v) for v in runs["source"].dropna().unique())
    pick_v = c2.multiselect("Variant", variants, default=url_subset("variant", variants, "no run shown has it"),
                            key="exp_variant")
    pick_wd = c3.multiselect("Weight decay", wds, default=url_subset("wd", wds, "no run shown has it"), key="exp_wd")
    pick_f = c4.multiselect("Format", formats, default=url_subset("fmt", formats, "no run shown has it"),
                            key="exp_fmt")
    pick_s = c5.multiselect("Source", sources, default=url_subset("src", sources, "no run shown has it"),
                            key="exp_src")
    url_notes()
    set_query_params(q=search.strip(), variant=",".join(pick_v), wd=",".join(pick_wd),
                     fmt=",".join(pick_f), src=",".join(pick_s))
    out = runs
    if search.strip():
        needle = search.strip().lower()
        out = out[out["name"].str.lower().str.contains(needle, regex=False)
                  | out["source"].astype(str).str.lower().str.contains(needle, regex=False)]
    if pick_v:
        out = out[out["variant"].isin(pick_v)]
    if pick_wd:
        out = out[out["weight_decay"].map(_fmt_wd).isin(pick_wd)]
    if pick_f:
        out = out[out["format"].isin(pick_f)]
    if pick_s:
        out = out[out["source"].isin(pick_s)]
    return out


def _default_runs(store, version, runs: pd.DataFrame, shown: pd.DataFrame) -> list[int]:
    """The best run of each group (variant x head sharing x task) among the runs shown, by the
    first metric in picking order (``metric_order``: the validation loss where there is one)."""
    metrics = _metrics_of(shown)
    if not metrics:
        return []
    finals = _finals(str(store.path), version, metrics[0])
    return best_of_each_group(shown, finals, metrics[0], limit=DEFAULT_RUNS)


def _curve_section(store, version, runs: pd.DataFrame, shown: pd.DataFrame, saved: dict | None) -> list[int]:
    styles = charts.run_styles(runs)
    labels = {i: f"{name} ({styles[i]['group']})" for i, name in zip(runs["id"].astype(int).tolist(), runs["name"].tolist())}
    if "runs" in st.query_params or saved is not None:
        in_url = []
        for i in url_ints("runs"):
            if i in labels:
                in_url.append(i)
            else:
                url_ignored("runs", i, "no such run")
    else:                                       # first visit in this session, no runs in the link
        in_url = _default_runs(store, version, runs, shown)
    shown_ids = [int(i) for i in shown["id"]]
    options = list(dict.fromkeys(shown_ids + in_url))
    selected = st.multiselect("Runs to plot", options, default=in_url, format_func=lambda i: labels[i],
                              key="exp_runs", placeholder="Pick runs from the table (search narrows the list)")
    # the search and filters narrow the curves too; the selection is kept for when they are cleared
    shown_set = set(shown_ids)
    plotted = [i for i in selected if i in shown_set]
    metrics = _metrics_of(runs[runs["id"].isin(plotted)] if plotted else runs)
    c1, c2, c3, c4, c5, c6 = st.columns([2, 1.6, 1.4, 0.8, 0.8, 1.2])
    m_url = url_choice("m", metrics, metrics[0], why="not logged by the runs") if metrics else None
    metric = c1.selectbox("Metric", metrics, index=metrics.index(m_url) if metrics else 0,
                          key="exp_metric", help="validation metrics first (loss, then accuracy or top-1)"
                          ) if metrics else None
    x_url = url_choice("x", list(X_LABELS), list(X_LABELS)[0])
    x = c2.radio("x axis", list(X_LABELS), index=list(X_LABELS).index(x_url),
                 format_func=X_LABELS.get, horizontal=True, key="exp_x")
    smoothing = c3.slider("Smoothing (EMA)", 0.0, 0.999,
                          value=url_float("s", 0.0, 0.0, 0.999), step=0.001, format="%.3f",
                          key="exp_s",
                          help="time-weighted, debiased EMA (as W&B and TensorBoard): the weight applies per "
                               "1/1000 of the chart's x range, so sparse validation points are smoothed as much "
                               "per step as dense training points; the line ends between the last two values; "
                               "0 = off")
    log_x = c4.toggle("log x", value=query_param("logx") == "1", key="exp_logx")
    log_y = c5.toggle("log y", value=query_param("logy") == "1", key="exp_logy")
    group = c6.toggle("By variant", value=query_param("group") == "1", key="exp_group",
                      help="mean line and min-max band over the plotted runs of each variant x head sharing "
                           "(MHA, GQA, MQA) x task")
    url_notes()
    set_query_params(runs=",".join(str(i) for i in selected), m=metric, x=x,
                     s=f"{smoothing:g}" if smoothing else None, logx="1" if log_x else None,
                     logy="1" if log_y else None, group="1" if group else None)
    hidden = [i for i in selected if i not in set(plotted)]
    if hidden:
        st.caption(f"{len(hidden)} selected run(s) hidden by the search and filters: "
                   + ", ".join(md(labels[i]) for i in hidden))
    if not plotted:
        st.info("Pick runs above to overlay their curves." if not selected else
                "The search and filters hide every selected run; clear them or pick runs shown in the table.",
                icon=":material/touch_app:")
        return plotted
    if metric is None:
        st.info("The selected runs logged no metrics.", icon=":material/info:")
        return plotted
    key = (str(store.path), version, tuple(sorted(plotted)), metric, x)
    if group:
        binned = _band(*key)
        group_of = {i: styles[i]["group"] for i in plotted}
        band = curves.group_band(binned, group_of)
        if smoothing:
            band = smooth(band, smoothing, by="group", column="mean")
        rows = run_groups(runs[runs["id"].isin(plotted)]).to_dict("records")
        rows.sort(key=lambda r: table_order(r["task"], r["sharing"], r["n_kv_heads"], r["variant"]))
        band_styles = {styles[int(r["id"])]["group"]: charts.group_style(r["variant"], r["sharing"]) for r in rows}
        fig = charts.band_figure(band, x=x, metric=metric, log_x=log_x, log_y=log_y, styles=band_styles)
        n_shown = len(band)
    else:
        # the whole selection's curves, narrowed here to the runs the search and filters show: a
        # filter change reuses the cached query (each run is downsampled on its own, loaders.curves)
        raw = _curves(str(store.path), version, tuple(sorted(selected)), metric, x)
        if len(plotted) < len(selected):
            raw = raw[raw["run_id"].isin(plotted)].reset_index(drop=True)
        smoothed = smooth(raw, smoothing) if smoothing else None
        fig = charts.curves_figure(raw, labels, smoothed=smoothed, x=x, metric=metric, log_x=log_x, log_y=log_y,
                                   styles=styles)
        n_shown = len(raw)
        missing = sorted(set(plotted) - set(int(i) for i in raw["run_id"].unique()))
        if missing:
            st.caption("No points with this metric and x axis for: " + ", ".join(md(labels[i]) for i in missing))
    figures.show(fig, key="exp_curves", theme=charts.CHART_THEME)
    logged = int(runs[runs["id"].isin(plotted)]["n_points"].fillna(0).sum())
    st.caption(f"{n_shown:,} points drawn ({logged:,} logged points in these runs, all metrics); "
               "long curves keep each bucket's minimum and maximum so spikes stay visible.")
    return plotted


BETTER = {"auto": "as its name says", "min": "lower", "max": "higher"}


def _direction_control(store, version, metric: str) -> str:
    """Whether lower or higher is better for ``metric``: the user's stored choice, else its name
    (``analysis.directions``); a change is stored for every page (``loaders.curves``)."""

    overrides = metric_directions(str(store.path), version)
    stored = overrides.get(metric, "auto")
    by_name = direction(metric)
    pick = st.selectbox(f"Better for {md(metric)}", list(BETTER), index=list(BETTER).index(stored),
                        format_func=lambda k: BETTER[k] if k != "auto" else
                        f"{'higher' if by_name == 'max' else 'lower'} ({BETTER['auto']})",
                        key=f"exp_better_{metric}",
                        help="which way is better for this metric on every page (best values, the Results "
                             "table, weight-decay sensitivity); stored in the database")
    if pick != stored:
        curves.set_metric_direction(store, metric, None if pick == "auto" else pick)
        st.cache_data.clear()                 # finals and tables read the new direction
        st.rerun()
    return direction(metric, overrides)


def _pick_drawing() -> None:
    """The Runs control was changed: its choice goes into the URL, and from then on the page keeps
    it instead of following the table's size (``EVERY_RUN_MAX``)."""
    set_query_params(fd=st.session_state["exp_fd"])


def _drawing_control(column, n_runs: int, *, disabled: bool) -> str:
    """The Runs control (``FINAL_DRAWINGS``): the choice in the URL (``fd``, set by a change of
    the control or a link), else every run for ``EVERY_RUN_MAX`` runs in the table or fewer and
    the means above that, so a filter that narrows the table to a few runs shows each of them."""
    chosen = query_param("fd")
    st.session_state["exp_fd"] = chosen if chosen in FINAL_DRAWINGS else (
        "runs" if n_runs <= EVERY_RUN_MAX else "mean")
    return column.radio("Runs", list(FINAL_DRAWINGS), format_func=FINAL_DRAWINGS.get, key="exp_fd",
                        horizontal=True, on_change=_pick_drawing, disabled=disabled,
                        help=f"every run as a marker, or per group and value the mean of its runs with a "
                             f"95% t interval (n, min and max in the tooltip); opens with every run for "
                             f"{EVERY_RUN_MAX} runs in the table or fewer")


def _drawing_caption(drawing: str, n_runs: int) -> str:
    """What the scatter shows and why: the user's choice, or the default for ``n_runs``."""
    chosen = query_param("fd") in FINAL_DRAWINGS
    if drawing == "runs":
        why = "as picked" if chosen else f"{n_runs:,} runs in the table, at most {EVERY_RUN_MAX:,}"
        return f"Every run is a marker ({why}); *mean and 95% interval* summarises each group's runs."
    why = "as picked" if chosen else f"{n_runs:,} runs in the table, over {EVERY_RUN_MAX:,}"
    return (f"Mean of each group's runs at each value, with its 95% t interval (n - 1 degrees of freedom "
            f"over the runs, as on the Weight decay page; no bar for one run; n, min, max and diverged runs "
            f"in the tooltip) ({why}); *every run* draws each run.")


def _final_section(store, version, runs: pd.DataFrame, metric_options: list[str]) -> None:
    st.subheader("Final metric against hyperparameters")
    if not metric_options:
        st.caption("No metrics logged yet.")
        return
    c1, c2, c3, c4, c5 = st.columns([1.8, 1.8, 1.6, 1, 2])
    fm_url = query_param("fm", "val/loss")
    fmetric = c1.selectbox("Metric", metric_options,
                           index=metric_options.index(fm_url) if fm_url in metric_options else 0, key="exp_fm")
    hp_url = query_param("hp", "weight_decay")
    hparam = c2.selectbox("Hyperparameter", HPARAMS, index=HPARAMS.index(hp_url) if hp_url in HPARAMS else 0,
                          key="exp_hp", format_func=charts.axis_title)
    views = ["Scatter", "Parallel coordinates"]
    view = c3.radio("View", views, index=1 if query_param("view") == "parallel" else 0, key="exp_view",
                    horizontal=True)
    drawing = _drawing_control(c5, len(runs), disabled=view != "Scatter")
    way = _direction_control(store, version, fmetric)
    value = c4.radio("Value", ["final", "best"], index=1 if query_param("fv") == "best" else 0, key="exp_fv",
                     horizontal=True, help=f"best of {fmetric}: its {'highest' if way == 'max' else 'lowest'} "
                                           "value (the Better control says which)")
    set_query_params(fm=fmetric, hp=hparam, view="parallel" if view != "Scatter" else None,
                     fv="best" if value == "best" else None)
    finals = _finals(str(store.path), version, fmetric)
    data = runs.merge(finals, left_on="id", right_on="run_id", how="inner")
    if data.empty:
        st.caption(f"No run in the table logged {md(fmetric)}.")
        return
    if view == "Scatter":
        numeric = hparam != "variant"
        positive = numeric and (pd.to_numeric(data[hparam], errors="coerce") > 0).all()
        draw = charts.final_scatter if drawing == "runs" else charts.final_summary_figure
        fig = draw(data, hparam=hparam, value=value, metric=fmetric,
                   log_x=bool(positive) and hparam in ("weight_decay", "lr", "model_size"))
    else:
        dims = [h for h in HPARAMS if data[h].notna().any()]
        fig = charts.parallel_figure(data, dims, color=value, metric=fmetric, direction=way)
    figures.show(fig, key="exp_final", theme=charts.CHART_THEME)
    if view == "Scatter":
        st.caption(_drawing_caption(drawing, len(runs)))
    diverged = data[data["nonfinite"] > 0]
    if len(diverged):
        st.warning("Diverged (non-finite values): " + ", ".join(md(n) for n in diverged["name"].astype(str)),
                   icon=":material/warning:")


def _field_title(name: str) -> str:
    """A field's label in the edit form: ``"weight_decay"`` -> ``"Weight decay"``."""
    title = charts.axis_title(name)
    return title[0].upper() + title[1:]


def _field_text(value, kind) -> str:
    """A field's current value as the form shows it: empty where unset, an integer without ``.0``."""
    if value is None or pd.isna(value):
        return ""
    return str(int(value)) if kind is int else f"{value:g}"


def _edit_section(store, runs: pd.DataFrame) -> None:
    """The metadata form, drawn only while its expander is open (``on_change="rerun"``): closed, it
    costs the page nothing, where its picker of every run (2,000 options) and form took 0.3 s of
    each sidebar navigation in Chromium."""
    editor = st.expander("Edit a run's metadata", icon=":material/edit:", key="exp_edit", on_change="rerun")
    if not editor.open:
        return
    with editor:
        st.caption("Corrections are stored beside what ingest found and survive re-ingesting the logs.")
        labels = {i: f"{name} (id {i})" for i, name in zip(runs["id"].astype(int).tolist(), runs["name"].tolist())}
        rid = st.selectbox("Run", list(labels), format_func=labels.get, key="exp_edit_run")
        row = runs[runs["id"] == rid].iloc[0]
        with st.form(f"exp_edit_{rid}"):
            cells = [c for _ in range(2) for c in st.columns(3)]
            cur_v = str(row["variant"]) if row["variant"] in VARIANTS else "unknown"
            variant = cells[0].selectbox("Variant", VARIANTS, index=VARIANTS.index(cur_v))
            texts = {name: cell.text_input(_field_title(name), value=_field_text(row[name], COLUMN_FIELDS[name]))
                     for name, cell in zip([f for f in EDITABLE if f != "variant"], cells[1:])}
            saved = st.form_submit_button("Save", icon=":material/save:")
        if not saved:
            return
        fields, errors = {}, []
        for name, text in texts.items():
            kind = COLUMN_FIELDS[name]
            text = text.strip()
            if not text:
                continue
            try:
                fields[name] = kind(float(text)) if kind is int else kind(text)
            except ValueError:
                errors.append(f"{name}: expected a number, got {text!r}")
        if errors:
            st.error("Nothing saved. " + "; ".join(md(e) for e in errors))
            return
        fields["variant"] = variant
        changed = {k: v for k, v in fields.items()
                   if not (pd.notna(row[k]) and (row[k] == v))}
        if not changed:
            st.info("Nothing changed.")
            return
        set_run_metadata(store, int(rid), **changed)
        st.success(f"Saved {', '.join(sorted(changed))} for {md(labels[rid])}.")


def render() -> None:
    store = get_store()
    st.title("Experiments")
    version = data_version(store)
    runs = in_projects(_runs(str(store.path), version), project_filter(store, version))
    if runs.empty:
        st.info("No training runs stored yet. Ingest a folder of logs on the Overview page, or from a shell: "
                f"`python -m app ingest PATH --db {store.path}` (CSV, JSONL, TensorBoard, "
                "nanoGPT logs, W&B run folders, MLflow and trackio stores are read).", icon=":material/inbox:")
        return
    saved = _restore_saved()
    shown = _filters(runs)
    st.caption(f"{len(shown):,} of {len(runs):,} runs")
    st.dataframe(shown, hide_index=True, width="stretch", placeholder=tables.MISSING, height=min(38 * (len(shown) + 1), 320),
                 column_config={"name": st.column_config.TextColumn(
                                    "name", width="large", help="unique in the database: a repeated name gets parent folders"),
                                "weight_decay": st.column_config.NumberColumn("weight decay", format="%.4g"),
                                "lr": st.column_config.NumberColumn("learning rate", format="%.3g"),
                                "condition": st.column_config.TextColumn(
                                    "paper condition", help="the paper's own name for the run's condition, "
                                                            "where ingest read one (paper B's file tags: QVV(3))"),
                                "n_heads": st.column_config.NumberColumn("query heads"),
                                "n_kv_heads": st.column_config.NumberColumn("KV heads"),
                                "model_size": st.column_config.NumberColumn("model size (parameters)"),
                                "n_points": st.column_config.NumberColumn("points"),
                                "first_step": st.column_config.NumberColumn("first step"),
                                "last_step": st.column_config.NumberColumn("last step"),
                                "metrics": st.column_config.ListColumn()},
                 key="exp_table")
    _curve_section(store, version, runs, shown, saved)
    _final_section(store, version, shown, _metrics_of(shown))
    _save()
    _edit_section(store, runs)
