"""Compare: two checkpoints side by side, and one run's checkpoints over training.

Both views read stored analysis results; a checkpoint not analysed yet is
analysed once (``app.jobs.analyze``, with a progress bar) and stored.
Without ``?a=&b=`` the pair is two checkpoints of one geometry that differ in one setting
(``app.pickers.default_pair``: the qkv baseline against k_eq_v at the same weight decay and
step where the store has them). URL: ``?a=1&b=2&metric=kv_cka`` for the pair, ``&run=3&tmetric=qk_symmetry``
for the trajectories.

Checkpoints are grouped by their run's task: where the store holds runs of several tasks (vision
and language), a *Task* choice narrows both pickers to one task's checkpoints (the default pair is
then of that task), headings name each side's task, and the trajectories' runs are listed language
first, each with its task.

Values are read against their chance level: the two heatmaps share one colour scale
centred on it where both are read against the same chance level (one geometry), else each is
centred on its own; the table of largest changes gives both sides' chance (and, for
activation metrics, tokens, 95% intervals and whether they overlap), trajectories
draw it as a dashed line with the interval as a band; metrics resting on too few
tokens are greyed with the reason.
"""
from __future__ import annotations


import pandas as pd
import streamlit as st

from analysis.errors import AnalysisError
from analysis.registry import BY_NAME, METRIC_VERSION, head_metrics
from app import charts, figures, pickers, tables
from app.attempts import attempt, file_stamp, show_failure
from app.state import (data_version, get_store, in_projects, project_filter, results_over_checkpoints,
                       set_query_params, stored_notes, current_notes, checkpoint_choices, checkpoints_frame,
                       analysis_results as _results, url_choice, url_ignored, url_int, url_notes, cached_read)
from analysis.results_table import DEFAULT_TASK
from analysis.variants import informative_metric
from loaders import curves
from loaders.errors import QkvscopeError
from loaders.run_table import run_table

TITLE = "Compare"
ICON = ":material/compare:"
ORDER = 50
URL_PATH = "compare"




@cached_read
def _run_checkpoints(store) -> pd.DataFrame:
    return curves.run_checkpoints(store)


@cached_read
def _run_tasks(store) -> dict[int, str]:
    """``{run id: task}`` (``loaders.run_table``: the run config's task, language where it names none)."""
    runs = run_table(store)
    return dict(zip(runs["id"].astype(int), runs["task"].astype(str)))


ALL_TASKS = "all"


def with_tasks(ckpts: pd.DataFrame, run_tasks: dict[int, str]) -> pd.DataFrame:
    """``ckpts`` (``checkpoint_choices`` rows) with ``task``: its run's, None for a checkpoint not
    linked to a run (ingested on its own or uploaded)."""
    tasks = [run_tasks.get(int(r)) if pd.notna(r) else None for r in ckpts["run_id"]]
    return ckpts.assign(task=pd.Series(tasks, index=ckpts.index, dtype=object))


def task_options(ckpts: pd.DataFrame) -> list[str]:
    """The Task choices: ``"all"`` then each task of a linked checkpoint, language first; only
    ``["all"]`` when they are of one task."""
    tasks = sorted({str(t) for t in ckpts["task"].dropna()}, key=lambda t: (t != DEFAULT_TASK, t))
    return [ALL_TASKS] + tasks if len(tasks) > 1 else [ALL_TASKS]


def side_label(label: str, task) -> str:
    """A side's heading: its checkpoint label with the task where known (``"x · step 200 (#1) · image"``)."""
    return f"{label} · {task}" if isinstance(task, str) and task else label



@st.cache_data(show_spinner=False, max_entries=16)
def _analysed(db: str, version: tuple, ids: tuple) -> set[int]:
    """The checkpoints among ``ids`` whose weight analysis is current (``app.state.current_notes``)."""
    return {cid for cid in ids if current_notes(db, version, cid, ("weights",)) is not None}


def _ensure_analysed(store, ids: list[int], label: str, kind: str) -> list[str]:
    """Analyse the checkpoints among ``ids`` that are not yet (weights level); returns problems.
    Those already analysed are known from one cached read, so a rerun opens nothing; one that
    failed is not analysed again in this session until ``show_failure(kind, ...)``'s *Try again*
    or a change of its file (``app.attempts``): a bomb or a time-out costs its limit once."""
    from app.jobs import analyze  # here: app.jobs imports torch; the page loads without it

    problems = []
    bar = None
    version = data_version(store)
    done = _analysed(str(store.path), version, tuple(ids))
    ids = [cid for cid in ids if cid not in done]
    known = checkpoints_frame(str(store.path), version)
    paths = dict(zip(known["id"].astype(int), known["path"]))
    for n, cid in enumerate(ids):
        if bar is None:
            bar = st.progress(0.0, text=f"{label}: checking stored results...")
        bar.progress(n / len(ids), text=f"{label}: checkpoint {cid} ({n + 1}/{len(ids)})")
        path = str(paths.get(cid, ""))
        _, failure = attempt(kind, (str(store.path), cid, file_stamp(path)), lambda: analyze(store, cid),
                             errors=(QkvscopeError, AnalysisError))
        if failure:                 # a checkpoint whose file is gone or fails: the others still compare
            problems.append(failure)
    if bar is not None:
        bar.empty()
    return problems


def _url_id(name: str, ids, what: str) -> int | None:
    """The URL value ``name`` when it is one of ``ids``; None when absent, else noted."""
    wanted = url_int(name, None)
    if wanted is not None and wanted not in ids:
        url_ignored(name, wanted, f"no such {what}")
        return None
    return wanted


@st.fragment
def _pair(store, ckpts: pd.DataFrame) -> None:
    """The pair view: a fragment, so picking A, B or the metric reruns only this part."""
    st.subheader("Two checkpoints")
    st.caption("By default two checkpoints of one geometry that differ in one setting (the qkv baseline "
               "against a variant at the same weight decay and step, where there is one).")
    options = task_options(ckpts)
    if len(options) > 1:
        task = st.selectbox("Task", options, key="cmp_task", format_func=lambda t: "all tasks" if t == ALL_TASKS else t,
                            help="the task of each checkpoint's run: vision and language checkpoints apart "
                                 "(all tasks: every checkpoint, those without a run too)")
        if task != ALL_TASKS:
            ckpts = ckpts[ckpts["task"] == task]
    known = {int(i) for i in ckpts["id"]}
    a_def, b_def = pickers.default_pair(ckpts)
    a_def, b_def = _url_id("a", known, "checkpoint") or a_def, _url_id("b", known, "checkpoint") or b_def
    url_notes()
    c1, c2 = st.columns(2)
    a = pickers.checkpoint_picker("A", ckpts, key="cmp_a", default=a_def, container=c1)
    b = pickers.checkpoint_picker("B", ckpts, key="cmp_b", default=b_def, container=c2)
    labels = {int(r["id"]): side_label(pickers.checkpoint_label(r), r["task"]) for r in ckpts.to_dict("records")}
    set_query_params(a=a, b=b)
    problems = _ensure_analysed(store, sorted({a, b}), "Analysing", "compare_pair")
    if problems:
        show_failure("compare_pair", problems)
        return
    version = data_version(store)
    ra, rb = _results(str(store.path), version, a), _results(str(store.path), version, b)
    geo = ckpts.set_index("id")
    shape_a = tuple(int(geo.loc[a, k]) for k in ("n_layers", "n_heads", "n_kv_heads"))
    shape_b = tuple(int(geo.loc[b, k]) for k in ("n_layers", "n_heads", "n_kv_heads"))
    both = set(ra["metric"].unique()) & set(rb["metric"].unique())
    available = [m for m in head_metrics() if m in both]
    if not available:
        st.caption("No per-head metric is stored for both checkpoints.")
        return
    # default: a metric neither checkpoint's tie fixes (kv_cka of a K=V model is 1 by construction)
    default = informative_metric(available, [geo.loc[a, "variant"], geo.loc[b, "variant"]])
    m_url = url_choice("metric", available, default, why="not stored for both checkpoints")
    url_notes()
    metric = st.selectbox("Metric", available, index=available.index(m_url), key="cmp_metric")
    set_query_params(metric=metric)
    st.caption(f"**{metric}**: {BY_NAME[metric].help}")
    side_a, side_b = (r[(r["metric"] == metric) & r["head"].notna()] for r in (ra, rb))
    shared = charts.heat_range(side_a, side_b)
    zmin, zmax = shared or (None, None)
    notes_a = stored_notes(str(store.path), version, a)
    notes_b = stored_notes(str(store.path), version, b)
    muted_a = tables.muted_metrics(notes_a).get(metric)
    muted_b = tables.muted_metrics(notes_b).get(metric)
    both = pd.concat([side_a, side_b])
    if shared is None:
        st.caption(f"Each heatmap's colour scale is centred on its own chance level (A **{charts.chance_label(side_a)}**, "
                   f"B **{charts.chance_label(side_b)}**): white at chance, red above, blue below. The colours compare "
                   "each checkpoint with its own chance, not A's values with B's.")
    else:
        st.caption(f"One colour scale for both, **{charts.chance_label(both)}** "
                   + ("at its centre: white at chance, red above, blue below." if both["chance"].notna().any()
                      else "(no chance level stored: run the analysis again to get one)."))
    left, right = st.columns(2)
    left.markdown(f"**A** {labels[a]}")
    figures.show(charts.heatmap_figure(ra, metric, zmin=zmin, zmax=zmax,
                                            muted=muted_a and tables.short_reason(muted_a)), key="cmp_heat_a", where=left)
    right.markdown(f"**B** {labels[b]}")
    figures.show(charts.heatmap_figure(rb, metric, zmin=zmin, zmax=zmax,
                                             muted=muted_b and tables.short_reason(muted_b)), key="cmp_heat_b", where=right)
    for side, reason in (("A", muted_a), ("B", muted_b)):
        if reason:
            st.warning(f"{side}: {metric} rests on too few tokens: {reason}", icon=":material/warning:")
    if shape_a != shape_b:
        st.info(f"The geometries differ (layers, heads, KV heads: A {shape_a}, B {shape_b}), so there is no "
                "head-by-head difference.", icon=":material/info:")
        return
    diff = curves.head_difference(ra, rb)
    figures.show(charts.diff_heatmap(diff, metric, a_label="A", b_label="B"), key="cmp_diff")
    d = diff[(diff["metric"] == metric) & diff["head"].notna()]
    if len(d):
        st.caption(f"Largest changes of {metric} (B - A); mean change {d['diff'].mean():+.4g}.")
        st.dataframe(tables.change_table(diff, metric, notes_a, notes_b), hide_index=True, width="stretch", placeholder=tables.MISSING,
                     column_config={"CIs overlap": st.column_config.CheckboxColumn(
                         help="A's and B's 95% intervals overlap: the change may be sampling noise")})
        if muted_a or muted_b:
            st.caption("Greyed: " + "; ".join(f"{s}: {r}" for s, r in (("A", muted_a), ("B", muted_b)) if r))


@st.fragment
def _trajectories(store) -> None:
    """A run's trajectories: a fragment, so its run and metric pickers rerun only this part."""
    st.subheader("A run's checkpoints over training")
    version = data_version(store)
    rc = _run_checkpoints(str(store.path), version)
    counts = rc.groupby(["run_id", "run"]).size().reset_index(name="n")
    counts = counts[counts["n"] >= 2]
    if counts.empty:
        st.caption("No run has two or more checkpoints with a training step yet. Checkpoints are linked to a run "
                   "when they sit in the run's folder; their step comes from the file or its name "
                   "(`step_500`, `ckpt-1000`).")
        return
    run_tasks = _run_tasks(str(store.path), version)
    several = len({run_tasks.get(int(r)) for r in counts["run_id"]}) > 1
    counts = counts.assign(task=[run_tasks.get(int(r), DEFAULT_TASK) for r in counts["run_id"]])
    counts = (counts.assign(_other=counts["task"] != DEFAULT_TASK)          # language runs first
              .sort_values(["_other", "task", "run_id"], kind="stable"))
    labels = {int(r.run_id): f"{r.run} ({r.n} checkpoints)" + (f" · {r.task}" if several else "")
              for r in counts.itertuples()}
    ids = list(labels)
    r_url = _url_id("run", ids, "run with checkpoints")
    url_notes()
    run = st.selectbox("Run", ids, index=ids.index(r_url) if r_url is not None else 0, format_func=labels.get,
                       key="cmp_run")
    ck = rc[rc["run_id"] == run]
    problems = _ensure_analysed(store, [int(c) for c in ck["checkpoint_id"]], "Analysing the run's checkpoints",
                                "compare_run")
    if problems:                    # the run's other checkpoints are still drawn
        show_failure("compare_run", problems)
    version = data_version(store)
    res = results_over_checkpoints(str(store.path), version, tuple(int(c) for c in ck["checkpoint_id"]))
    per_layer = tables.head_means(res[res["run_id"] == run])
    stored = set(per_layer["metric"].unique())
    available = [m for m in head_metrics() if m in stored]
    if not available:
        st.caption("No per-head metrics stored for this run's checkpoints.")
        return
    default = informative_metric(available, list(ck["variant"].unique()) if "variant" in ck.columns else [])
    t_url = url_choice("tmetric", available, default, why="not stored for this run's checkpoints")
    url_notes()
    metric = st.selectbox("Metric", available, index=available.index(t_url), key="cmp_tmetric")
    set_query_params(run=run, tmetric=metric)
    rows = per_layer[per_layer["metric"] == metric]
    st.caption(f"Dashed: **{charts.chance_label(rows)}**, the value independent random projections of these "
               "shapes give"
               + ("; bands: the mean of the heads' 95% bounds (jackknife t intervals over token windows)."
                  if rows["ci_low"].notna().any() else "."))
    figures.show(charts.trajectory_figure(per_layer, metric), key="cmp_traj")
    steps = dict(zip(ck["checkpoint_id"].astype(int), ck["step"]))
    few = {}
    for cid in ck["checkpoint_id"].astype(int):
        reason = tables.muted_metrics(stored_notes(str(store.path), version, cid)).get(metric)
        if reason:
            few.setdefault(reason, []).append(int(steps[cid]))
    for reason, at_steps in few.items():
        st.warning(f"{metric} at step{'s' if len(at_steps) > 1 else ''} {', '.join(map(str, at_steps))} rests on "
                   f"too few tokens: {reason}", icon=":material/warning:")


def render() -> None:
    store = get_store()
    st.title("Compare")
    version = data_version(store)
    ckpts = in_projects(with_tasks(checkpoint_choices(str(store.path), version), _run_tasks(str(store.path), version)),
                        project_filter(store, version))
    if ckpts.empty:
        st.info("No checkpoints stored yet. Ingest some on the Overview page, upload one on the Checkpoint "
                f"inspector, or from a shell: `python -m app ingest PATH --db {store.path}`.",
                icon=":material/inbox:")
        return
    _pair(store, ckpts)
    _trajectories(store)
