"""Overview: what the database holds, and ingesting a path from the page.

The counters and the demo notice sit at the top but are drawn after the ingest form
has run, from the database as it is then, so an ingest shows in them at once.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from app import tables
from app.plain import md
from app.state import (DEMO_DIR, data_version, demo_only, get_store, in_projects, project_counts, project_filter,
                       query_param, set_query_params, summary, checkpoints_frame as _checkpoints, cached_read)
from loaders.projects import NO_PROJECT
from loaders.sandbox import ingest_paths   # each file read in a child process under the parse budgets

TITLE = "Overview"
ICON = ":material/home:"
ORDER = 10
URL_PATH = "overview"


@cached_read
def _runs(store) -> pd.DataFrame:
    from loaders.logs import list_runs  # here: the log readers load on first use

    from loaders.run_names import display_names

    rows = list_runs(store)
    shown = display_names([r["id"] for r in rows], [r["name"] for r in rows], [r["source"] for r in rows])
    cols = ["id", "name", "project", "task", "format", "variant", "n_kv_heads", "weight_decay", "lr", "n_points",
            "first_step", "last_step", "source"]
    for r in rows:                        # the task a run's config states (vision runs: image)
        r["task"] = str((r.get("config") or {}).get("task") or "language")
        r["project"] = r.get("project") or NO_PROJECT
        r["name"] = shown[r["id"]]                 # unique in the database (loaders.run_names)
    frame = pd.DataFrame(rows)
    return frame[[c for c in cols if c in frame.columns]] if len(frame) else pd.DataFrame(columns=cols)


def task_counts(runs: pd.DataFrame) -> str:
    """``"23 language runs, 24 image runs"``: how many runs of each task the database holds."""
    counts = runs["task"].value_counts()
    order = sorted(counts.index, key=lambda t: (t != "language", t))
    return ", ".join(f"{counts[t]:,} {t} run{'s' if counts[t] != 1 else ''}" for t in order)


def _ingest_form(store) -> None:
    with st.form("ingest", border=True):
        st.markdown("**Ingest a path on this server**: a checkpoint, a run folder or a folder of runs.")
        path = st.text_input("Path", value=query_param("path", ""),
                             placeholder="/home/me/experiments  or  runs/kv-mqa/checkpoints/final.safetensors")
        project = st.text_input("Project", placeholder="default: the folder's name",
                                help="the project its runs and checkpoints belong to; pages compare runs of one "
                                     "project only (default: the tracker's own project name, else the name of "
                                     "the folder ingested)")
        submitted = st.form_submit_button("Ingest", icon=":material/download:")
    if not submitted:
        return
    if not path.strip():
        st.warning("Give a file or folder path first.")
        return
    target = Path(path.strip()).expanduser()
    if not target.exists():
        st.error(f"{md(target)}: no such file or folder on the server.")
        return
    set_query_params(path=str(target))
    bar = st.progress(0.0, text="Scanning...")

    def progress(done: int, total: int, current: str) -> None:
        bar.progress(done / total if total else 1.0,
                     text=f"{done}/{total} {Path(current).name}" if current else "done")

    report = ingest_paths(store, [target], progress=progress, project=project.strip() or None)
    j = report.to_json()
    st.success(f"{j['added']} added, {j['appended']} appended, {j['unchanged']} unchanged, "
               f"{j['skipped']} skipped, {j['errors']} errors")
    interesting = [f for f in j["files"] if f["status"] != "unchanged"]
    if interesting:
        st.dataframe(pd.DataFrame(interesting)[["status", "kind", "format", "path", "reason", "n_points"]],
                     hide_index=True, width="stretch", placeholder=tables.MISSING)


def render() -> None:
    store = get_store()
    st.title("qkvscope")
    st.caption("Does a transformer need all three attention projections? "
               f"Database: `{store.path}`")
    top = st.container()   # filled below, after the ingest form, so an ingest shows at once
    _ingest_form(store)
    version = data_version(store)  # an ingest above changed the file
    s = summary(str(store.path), version)
    c1, c2, c3, c4 = top.columns(4)
    c1.metric("Runs", f"{s['runs']:,}")
    c2.metric("Logged points", f"{s['points']:,}")
    c3.metric("Checkpoints", f"{s['checkpoints']:,}")
    c4.metric("Analysed checkpoints", f"{s['analysed']:,}")

    if demo_only(s["run_sources"]):
        top.info("You are looking at the bundled demo experiments (small models trained on the "
                 "Python standard library's source). Ingest your own runs below or with "
                 "`python -m app ingest PATH`.", icon=":material/science:")
    elif s["runs"] == 0 and s["checkpoints"] == 0:
        top.info("The database is empty. Ingest a folder of runs or a checkpoint below, or from "
                 f"a shell: `python -m app ingest PATH --db {store.path}`. The bundled demo lives "
                 f"in `{DEMO_DIR}`.", icon=":material/inbox:")

    chosen = project_filter(store, version)
    st.subheader("Projects")
    counts = pd.DataFrame(project_counts(str(store.path), version), columns=["project", "runs", "checkpoints"])
    if len(counts):
        st.dataframe(counts, hide_index=True, width="content", placeholder=tables.MISSING)
        st.caption("Pages compare runs of one project only; the sidebar narrows every page to some projects. "
                   "Set a project with `python -m app ingest PATH --project NAME` or "
                   "`python -m app run-meta ID --set project=NAME`.")
    else:
        st.caption("No projects yet: ingest a folder, and its name becomes the project of its runs.")

    st.subheader("Runs")
    runs = in_projects(_runs(str(store.path), version), chosen)
    if len(runs):
        st.caption(task_counts(runs))
        st.dataframe(runs, hide_index=True, width="stretch", placeholder=tables.MISSING,
                     column_config={"name": st.column_config.TextColumn(
                                        "name", width="large", help="unique in the database: a repeated name gets parent folders"),
                                    "weight_decay": st.column_config.NumberColumn(format="%.4g"),
                                    "lr": st.column_config.NumberColumn(format="%.3g")})
    else:
        st.caption("No training logs stored yet.")

    st.subheader("Checkpoints")
    ckpts = in_projects(_checkpoints(str(store.path), version), chosen)
    if len(ckpts):
        st.dataframe(ckpts, hide_index=True, width="stretch", placeholder=tables.MISSING,
                     column_config={"params_total": st.column_config.NumberColumn(format="%d"),
                                    "kv_bytes_per_token": st.column_config.NumberColumn(
                                        "KV bytes/token", format="%d")})
    else:
        st.caption("No checkpoints stored yet.")
