"""Results: the runs as a paper's results table, variants as rows and metrics as columns.

One row per comparable group (``analysis.comparable``: project x task x geometry x variant x
head sharing; never across them), with a warning naming what its runs differ in besides weight
decay and seed; per chosen metric the mean ± sample std over its runs (seeds, with the weight
decay held fixed), n, and the difference to the Q-K-V row of the same group in % (paper B's "+3.1% perplexity"); KV bytes
per token and attention parameters beside them (``analysis.results_table``). Sortable, and
exported as CSV, Markdown and LaTeX (booktabs). An undefined value (the std of a one-run row, the
baseline's own %) is NaN in the table and shows as ``tables.MISSING`` on screen (blank in the
exports); paper B's QVV(3) runs are a row of their own (``analysis.results_table.OWN_CONDITIONS``).
The table is ``analysis.results_table.results_view``, the same function ``python -m app results``
prints. The weight decay opens on the one most groups share among runs that logged the first
metric; an empty table says why in one line.

URL keys: ``project`` (the sidebar's, ``app.state.project_filter``), ``metrics`` (comma list), ``stat`` (``final``/``best``), ``wd`` (a weight decay or
``all``), ``task`` (a task, or ``all``; default ``language`` when several are stored), ``ppl`` (``0`` hides the perplexity columns), ``kvb`` (bytes per element
of the KV cache: ``ckpt``, ``1``, ``2``, ``4``), ``sort`` (a column) and ``desc`` (``1``).
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.directions import direction
from analysis.results_table import default_task, default_wd, metric_order, results_view, wd_choices
from app import figures, plain, tables
from app.page_figures import results_figure
from app.state import (data_version, get_store, in_projects, metric_directions, project_filter, query_param,
                       set_query_params, cached_read, url_choice, url_ignored, url_notes)
from loaders import curves
from loaders.run_table import run_table

TITLE = "Results"
ICON = ":material/table_chart:"
ORDER = 25
URL_PATH = "results"

#: Bytes per element of the KV cache: the checkpoint's own dtype, or a serving precision.
KV_BYTES = {"ckpt": "checkpoint dtype", "2": "2 (fp16 / bf16)", "4": "4 (fp32)", "1": "1 (fp8 / int8)"}
ORDER_BY = "paper order"


@cached_read
def _runs(store) -> pd.DataFrame:
    """Runs with their config facts (task, heads, paper condition) and their latest checkpoint's
    geometry (``loaders.run_table``)."""
    frame = run_table(store, geometry=True)
    return frame.drop(columns=["overrides"], errors="ignore")


@cached_read(max_entries=16)
def _values(store, metrics: tuple) -> pd.DataFrame:
    return curves.run_metric_summary(store, list(metrics))


def _metric_options(runs: pd.DataFrame) -> list[str]:
    names = {str(m) for ms in runs["metrics"] for m in list(ms)}
    return [m for m in metric_order(names) if m not in ("lr", "learning_rate")]


def render() -> None:
    store = get_store()
    st.title("Results")
    version = data_version(store)
    runs = in_projects(_runs(str(store.path), version), project_filter(store, version))
    if runs.empty:
        st.info("No training runs stored yet. Ingest a folder of logs on the Overview page, or from a shell: "
                f"`python -m app ingest PATH --db {store.path}`.", icon=":material/inbox:")
        return
    options = _metric_options(runs)
    if not options:
        st.info("The stored runs logged no metrics.", icon=":material/info:")
        return
    c1, c2, c3, c4 = st.columns([3, 1.2, 1.4, 1.6])
    asked_metrics = [m for m in (query_param("metrics", "") or "").split(",") if m]
    in_url = [m for m in asked_metrics if m in options]
    for m in asked_metrics:
        if m not in options:
            url_ignored("metrics", m, "not logged by these runs")
    metrics = c1.multiselect("Metrics (columns)", options, default=in_url or options[:1], key="res_metrics")
    stat_url = query_param("stat")
    if stat_url not in (None, "final", "best"):
        url_ignored("stat", stat_url, "final or best")
    stat = c2.radio("Value of each run", ["final", "best"], index=1 if stat_url == "best" else 0,
                    horizontal=True, key="res_stat",
                    help="final: its last logged value; best: its lowest loss or highest accuracy")
    values = _values(str(store.path), version, tuple(metrics))
    default = default_wd(runs, values, metrics[0] if metrics else None)
    wd_options = ["all"] + wd_choices(runs)
    wd_url = query_param("wd")
    if wd_url is not None and wd_url not in wd_options:
        url_ignored("wd", wd_url, "no run has it")
    wd_pick = c3.selectbox("Weight decay", wd_options,
                           index=wd_options.index(wd_url if wd_url in wd_options else default),
                           key="res_wd", help="rows average over seeds; hold the weight decay fixed so a row's "
                                              "runs differ in seed only (default: the one most rows with data "
                                              "share)")
    kvb_url = query_param("kvb")
    if kvb_url is not None and kvb_url not in KV_BYTES:
        url_ignored("kvb", kvb_url, f"one of {', '.join(KV_BYTES)}")
    kvb = c4.selectbox("KV cache bytes per element", list(KV_BYTES), format_func=KV_BYTES.get,
                       index=list(KV_BYTES).index(kvb_url) if kvb_url in KV_BYTES else 0, key="res_kvb")
    tasks = sorted(runs["task"].astype(str).unique())
    c5, c6, c7, c8 = st.columns([1.4, 1.2, 2, 0.8])
    # several tasks: language rows first by default (a loss in nats per byte and a classifier's
    # cross-entropy are different quantities); ?task=all shows every task's rows together
    task_options = ["all"] + tasks
    default_task_ = default_task(runs)
    asked = query_param("task")
    if asked is not None and asked not in task_options:
        url_ignored("task", asked, f"one of {', '.join(task_options)}")
    task = c5.selectbox("Task", task_options, index=task_options.index(asked if asked in task_options
                                                                       else default_task_),
                        key="res_task") if len(tasks) > 1 else "all"

    overrides = metric_directions(str(store.path), version)      # the user's choices (Experiments page)
    losses = [m for m in metrics if direction(m, overrides) == "min"]
    ppl = c6.toggle("Perplexity", value=url_choice("ppl", ["0", "1"], "1") == "1", key="res_ppl", disabled=not losses,
                    help="add exp(loss) per run (the perplexity of a loss in nats; per byte for a byte-level loss)")
    url_notes()
    if not metrics:
        set_query_params(metrics=None)
        st.info("Pick at least one metric.", icon=":material/touch_app:")
        return
    table, why_empty = results_view(runs, values, metrics, wd=wd_pick, task=task, statistic=stat,
                                    perplexity=bool(ppl and losses),
                                    bytes_per_elem=None if kvb == "ckpt" else int(kvb), overrides=overrides)
    display = tables.results_display(table)
    sortable = [ORDER_BY] + [c for c in table.columns if c.endswith((" mean", " vs qkv %"))] + [
        "KV bytes/token", "attention params", "n runs"]
    sort_url = url_choice("sort", sortable, ORDER_BY, why="not a column of this table")
    sort = c7.selectbox("Sort by", sortable, index=sortable.index(sort_url),
                        key="res_sort")
    desc = c8.toggle("Descending", value=url_choice("desc", ["0", "1"], "0") == "1", key="res_desc")
    url_notes()
    set_query_params(metrics=",".join(metrics), stat=None if stat == "final" else stat,
                     wd=None if wd_pick == default else wd_pick, kvb=None if kvb == "ckpt" else kvb,
                     task=None if task == default_task_ else task, ppl=None if ppl else "0",
                     sort=None if sort == ORDER_BY else sort, desc="1" if desc else None)
    if sort != ORDER_BY:
        order = table[sort].sort_values(ascending=not desc, na_position="last", kind="stable").index
    else:
        order = table.index[::-1] if desc else table.index
    table, display = table.loc[order].reset_index(drop=True), display.loc[order].reset_index(drop=True)
    if table.empty or why_empty:
        st.caption(f"Empty: {why_empty}." if why_empty else "No run matches these choices.")
        if table.empty:
            return
    st.dataframe(_screen(table), hide_index=True, width="stretch", placeholder=tables.MISSING, key="res_table",
                 column_config=_column_config(table), height=min(35 * (len(table) + 1) + 3, 800))
    st.caption(f"{stat.capitalize()} value of each run; mean ± sample standard deviation over a row's runs "
               f"(n); weight decay {wd_pick}. \"vs Q-K-V\": the row's mean against the Q-K-V row of the same "
               "head sharing and task, in %. KV bytes per token = layers x cached tensors (1 for K=V, else 2) x "
               "KV heads x d_head x bytes per element; attention parameters: W_Q, W_K, W_V, W_O without biases, "
               "a tied projection counted once. Click a column header to sort as well.")
    fig = results_figure(table, metrics[0]) if metrics else None
    if fig is not None:
        figures.show(fig, key="res_figure")
        st.caption(f"Each row above as a point: its mean {plain.md(metrics[0])} (bars: the standard deviation over its "
                   "runs) against the KV-cache bytes per token it serves with.")
    caption = (f"{', '.join(metrics)} ({stat} value, mean $\\pm$ std over seeds), weight decay {wd_pick}")
    e1, e2, e3 = st.columns(3)
    e1.download_button("CSV", tables.results_csv(table), file_name="results.csv", mime="text/csv",
                       icon=":material/download:", key="res_csv")
    md = tables.results_markdown(display)
    e2.download_button("Markdown", md.encode(), file_name="results.md", mime="text/markdown",
                       icon=":material/download:", key="res_md")
    tex = tables.results_latex(display, caption=caption.replace("$\\pm$", "±"), label="tab:results")
    e3.download_button("LaTeX (booktabs)", tex.encode(), file_name="results.tex", mime="text/x-tex",
                       icon=":material/download:", key="res_tex")
    with st.expander("Markdown and LaTeX", icon=":material/code:"):
        st.code(md, language="markdown")
        st.code(tex, language="latex")


def _screen(table: pd.DataFrame) -> pd.DataFrame:
    """The columns shown on screen: labels and costs, then each metric's mean, std, % (and its n
    where it differs from the row's runs: a run that did not log it)."""
    keep = ["project", "task", "label", "sharing", "d_model", "n_layers", "n runs", "seeds", "KV bytes/token",
            "attention params"]
    for col in ("project", "task", "d_model", "n_layers"):
        if table[col].astype(str).nunique() <= 1:
            keep.remove(col)
    metric_cols = [c for c in table.columns if c.endswith((" mean", " std", " vs qkv %"))
                   or (c.endswith(" n") and not (table[c] == table["n runs"]).all())]
    shown = table[keep + metric_cols].copy()
    shown["warnings"] = ["; ".join(w) for w in table["warnings"]]
    return shown


def _column_config(table: pd.DataFrame) -> dict:
    cfg = {"warnings": st.column_config.TextColumn("runs differ in", help="what a row's runs differ in besides "
                                                   "weight decay and seed: read its mean with care"),
           "label": st.column_config.TextColumn("variant"), "sharing": st.column_config.TextColumn("heads"),
           "n runs": st.column_config.NumberColumn("runs"),
           "KV bytes/token": st.column_config.NumberColumn("KV bytes/token", format="%d"),
           "attention params": st.column_config.NumberColumn("attention params", format="%d")}
    for c in table.columns:
        if c.endswith(" mean") or c.endswith(" std"):
            cfg[c] = st.column_config.NumberColumn(c, format="%.4f")
        elif c.endswith(" vs qkv %"):
            cfg[c] = st.column_config.NumberColumn(c.replace("vs qkv %", "vs Q-K-V"), format="%+.1f%%")
    return cfg
