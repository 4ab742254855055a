"""Results: the runs as a paper's results table, variants as rows and metrics as columns.

One row per task x variant x head sharing (MHA, GQA-g, MQA); per chosen metric the mean ±
sample std over its runs (seeds, with the weight decay held fixed), n, and the difference to
the Q-K-V row of the same head sharing and task in % (paper B's "+3.1% perplexity"); KV bytes
per token and attention parameters beside them (``analysis.results_table``). Sortable, and
exported as CSV, Markdown and LaTeX (booktabs). An undefined value (the std of a one-run row, the
baseline's own %) is NaN in the table and shows as ``tables.MISSING`` on screen (blank in the
exports); paper B's QVV(3) runs are a row of their own (``analysis.results_table.OWN_CONDITIONS``).

URL keys: ``metrics`` (comma list), ``stat`` (``final``/``best``), ``wd`` (a weight decay or
``all``), ``task`` (a task, or ``all``; default ``language`` when several are stored), ``ppl`` (``0`` hides the perplexity columns), ``kvb`` (bytes per element
of the KV cache: ``ckpt``, ``1``, ``2``, ``4``), ``sort`` (a column) and ``desc`` (``1``).
"""
from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from analysis.directions import direction
from analysis.results_table import common_setting, metric_order, results_table
from app import tables
from app.state import (data_version, get_store, in_projects, metric_directions, project_filter, query_param,
                       set_query_params, store_at)
from loaders import curves
from loaders.run_table import run_table

TITLE = "Results"
ICON = ":material/table_chart:"
ORDER = 25
URL_PATH = "results"

#: Bytes per element of the KV cache: the checkpoint's own dtype, or a serving precision.
KV_BYTES = {"ckpt": "checkpoint dtype", "2": "2 (fp16 / bf16)", "4": "4 (fp32)", "1": "1 (fp8 / int8)"}
ORDER_BY = "paper order"


@st.cache_data(show_spinner=False, max_entries=8)
def _runs(db: str, version: tuple) -> pd.DataFrame:
    """Runs with their config facts (task, heads, paper condition) and their latest checkpoint's
    geometry (``loaders.run_table``)."""
    frame = run_table(store_at(db), geometry=True)
    return frame.drop(columns=["config", "overrides"], errors="ignore")


@st.cache_data(show_spinner=False, max_entries=16)
def _values(db: str, version: tuple, metrics: tuple) -> pd.DataFrame:
    return curves.run_metric_summary(store_at(db), list(metrics))


def _metric_options(runs: pd.DataFrame) -> list[str]:
    names = {str(m) for ms in runs["metrics"] for m in list(ms)}
    return [m for m in metric_order(names) if m not in ("lr", "learning_rate")]


def _fmt(v) -> str:
    return "all" if v is None else f"{v:g}"


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
    in_url = [m for m in (query_param("metrics", "") or "").split(",") if m in options]
    metrics = c1.multiselect("Metrics (columns)", options, default=in_url or options[:1], key="res_metrics")
    stat = c2.radio("Value of each run", ["final", "best"], index=1 if query_param("stat") == "best" else 0,
                    horizontal=True, key="res_stat",
                    help="final: its last logged value; best: its lowest loss or highest accuracy")
    wds = sorted({float(w) for w in runs["weight_decay"].dropna()})
    default_wd = common_setting(runs)
    wd_choices = ["all"] + [_fmt(w) for w in wds]
    wd_url = query_param("wd")
    wd_pick = c3.selectbox("Weight decay", wd_choices,
                           index=wd_choices.index(wd_url) if wd_url in wd_choices
                           else wd_choices.index(_fmt(default_wd)) if default_wd is not None else 0,
                           key="res_wd", help="rows average over seeds; hold the weight decay fixed so a row's "
                                              "runs differ in seed only (default: the one most rows share)")
    kvb = c4.selectbox("KV cache bytes per element", list(KV_BYTES), format_func=KV_BYTES.get,
                       index=list(KV_BYTES).index(query_param("kvb")) if query_param("kvb") in KV_BYTES else 0,
                       key="res_kvb")
    tasks = sorted(runs["task"].astype(str).unique())
    c5, c6, c7, c8 = st.columns([1.4, 1.2, 2, 0.8])
    # several tasks: language rows first by default (a loss in nats per byte and a classifier's
    # cross-entropy are different quantities); ?task=all shows every task's rows together
    options = ["all"] + tasks
    default_task = "language" if "language" in tasks and len(tasks) > 1 else "all"
    asked = query_param("task")
    task = c5.selectbox("Task", options, index=options.index(asked if asked in options else default_task),
                        key="res_task") if len(tasks) > 1 else "all"

    overrides = metric_directions(str(store.path), version)      # the user's choices (Experiments page)
    losses = [m for m in metrics if direction(m, overrides) == "min"]
    ppl = c6.toggle("Perplexity", value=query_param("ppl") != "0", key="res_ppl", disabled=not losses,
                    help="add exp(loss) per run (the perplexity of a loss in nats; per byte for a byte-level loss)")
    chosen = runs if wd_pick == "all" else runs[runs["weight_decay"].map(
        lambda w: w is not None and not (isinstance(w, float) and math.isnan(w)) and _fmt(w) == wd_pick)]
    if task != "all":
        chosen = chosen[chosen["task"].astype(str) == task]
    if not metrics:
        set_query_params(metrics=None)
        st.info("Pick at least one metric.", icon=":material/touch_app:")
        return
    values = _values(str(store.path), version, tuple(metrics))
    table = results_table(chosen, values, metrics, statistic=stat, perplexity=bool(ppl and losses),
                          bytes_per_elem=None if kvb == "ckpt" else int(kvb), overrides=overrides)
    display = tables.results_display(table)
    sortable = [ORDER_BY] + [c for c in table.columns if c.endswith((" mean", " vs qkv %"))] + [
        "KV bytes/token", "attention params", "n runs"]
    sort_url = query_param("sort", ORDER_BY)
    sort = c7.selectbox("Sort by", sortable, index=sortable.index(sort_url) if sort_url in sortable else 0,
                        key="res_sort")
    desc = c8.toggle("Descending", value=query_param("desc") == "1", key="res_desc")
    set_query_params(metrics=",".join(metrics), stat=None if stat == "final" else stat,
                     wd=None if wd_pick == _fmt(default_wd) else wd_pick, kvb=None if kvb == "ckpt" else kvb,
                     task=None if task == default_task else task, ppl=None if ppl else "0",
                     sort=None if sort == ORDER_BY else sort, desc="1" if desc else None)
    if sort != ORDER_BY:
        order = table[sort].sort_values(ascending=not desc, na_position="last", kind="stable").index
    else:
        order = table.index[::-1] if desc else table.index
    table, display = table.loc[order].reset_index(drop=True), display.loc[order].reset_index(drop=True)
    if table.empty:
        st.caption("No run matches these choices.")
        return
    st.dataframe(_screen(table), hide_index=True, width="stretch", placeholder=tables.MISSING, key="res_table",
                 column_config=_column_config(table), height=min(35 * (len(table) + 1) + 3, 800))
    st.caption(f"{stat.capitalize()} value of each run; mean ± sample standard deviation over a row's runs "
               f"(n); weight decay {wd_pick}. \"vs Q-K-V\": the row's mean against the Q-K-V row of the same "
               "head sharing and task, in %. KV bytes per token = layers x cached tensors (1 for K=V, else 2) x "
               "KV heads x d_head x bytes per element; attention parameters: W_Q, W_K, W_V, W_O without biases, "
               "a tied projection counted once. Click a column header to sort as well.")
    caption = (f"{', '.join(metrics)} ({stat} value, mean $\\pm$ std over seeds), weight decay {wd_pick}")
    e1, e2, e3 = st.columns(3)
    e1.download_button("CSV", table.to_csv(index=False).encode(), file_name="results.csv", mime="text/csv",
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
    keep = ["task", "label", "sharing", "n runs", "seeds", "KV bytes/token", "attention params"]
    if table["task"].nunique() <= 1:
        keep.remove("task")
    metric_cols = [c for c in table.columns if c.endswith((" mean", " std", " vs qkv %"))
                   or (c.endswith(" n") and not (table[c] == table["n runs"]).all())]
    return table[keep + metric_cols]


def _column_config(table: pd.DataFrame) -> dict:
    cfg = {"label": st.column_config.TextColumn("variant"), "sharing": st.column_config.TextColumn("heads"),
           "n runs": st.column_config.NumberColumn("runs"),
           "KV bytes/token": st.column_config.NumberColumn("KV bytes/token", format="%d"),
           "attention params": st.column_config.NumberColumn("attention params", format="%d")}
    for c in table.columns:
        if c.endswith(" mean") or c.endswith(" std"):
            cfg[c] = st.column_config.NumberColumn(c, format="%.4f")
        elif c.endswith(" vs qkv %"):
            cfg[c] = st.column_config.NumberColumn(c.replace("vs qkv %", "vs Q-K-V"), format="%+.1f%%")
    return cfg
