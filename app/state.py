"""What every page shares: the database, cache keys, URL state, error display.

The database is DuckDB, which lets one process write at a time; the server
never keeps a connection open between script runs (``loaders.store``), so a
CLI ingest can write while the dashboard serves. Cached reads are keyed by
what they read: the database file (``db``, which they open, whatever
``$QKVSCOPE_DB`` says) and ``data_version``, which changes whenever the file
does, so new data shows up without a restart, after an ingest from this page
or from a shell.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd
import streamlit as st

from analysis.errors import AnalysisError
from analysis.registry import METRIC_VERSION, names
from app.pickers import user_message
from app.paths import DEMO_DIR, ROOT  # noqa: F401  (pages import them from here)
from app.plain import md
from loaders import checkpoint_labels, curves, projects, queries, results
from loaders.errors import QkvscopeError
from loaders.store import Store, default_db_path



def get_store() -> Store:
    """The store named by ``$QKVSCOPE_DB`` (set by ``python -m app serve --db``)."""
    return Store(default_db_path(), busy_timeout=10.0)


def store_at(db: str) -> Store:
    """The store of the file ``db``: what a cached reader opens (its cache key names the file)."""
    return Store(Path(db), busy_timeout=10.0)


def data_version(store: Store) -> tuple[int, ...]:
    """Changes whenever the database file (or its WAL) changes: ``(mtime_ns, size)`` of each
    (0, 0 for a missing one), a cache key."""
    stamp: list[int] = []
    for p in (store.path, Path(str(store.path) + ".wal")):
        try:
            s = p.stat()
            stamp += [s.st_mtime_ns, s.st_size]
        except FileNotFoundError:
            stamp += [0, 0]
    return tuple(stamp)


def query_param(name: str, default: str | None = None) -> str | None:
    return st.query_params.get(name, default)


def set_query_params(**values) -> None:
    """Write selections into the URL so a copied link reopens the same view.

    Only a change is written, and all of it at once (``st.query_params.from_dict``): every write
    is a browser-history entry, so a page that wrote each key on every run left several identical
    entries per click, and Back seemed to do nothing."""
    current = {k: st.query_params.get_all(k) for k in st.query_params.keys()}
    wanted = dict(current)
    for key, value in values.items():
        if value is None or value == "" or value == []:
            wanted.pop(key, None)
        elif isinstance(value, (list, tuple)):
            wanted[key] = [str(v) for v in value]
        else:
            wanted[key] = [str(value)]
    if wanted != current:
        st.query_params.from_dict({k: v[0] if len(v) == 1 else v for k, v in wanted.items()})


@st.cache_data(show_spinner=False, max_entries=8)
def project_counts(db: str, version: tuple) -> list[dict]:
    """``[{"project", "runs", "checkpoints"}, ...]`` (``loaders.projects.project_counts``)."""
    return projects.project_counts(store_at(db))


def _project_label(counts: dict):
    def label(name: str) -> str:
        c = counts.get(name, {})
        return f"{name} ({c.get('runs', 0)} runs, {c.get('checkpoints', 0)} ckpts)"
    return label


def project_filter(store: Store, version: tuple) -> list[str]:
    """The page's project filter, in the sidebar (every page draws it, under one widget key, so a
    choice holds across pages): the projects chosen, [] for all. URL key ``project``, repeated
    for several (``?project=demo&project=sweep``); a URL value that names no stored project is
    named in a note and dropped."""
    counts = {c["project"]: c for c in project_counts(str(store.path), version)}
    names = list(counts)
    asked = st.query_params.get_all("project")
    ignored = [p for p in asked if p not in counts]
    if ignored:
        st.sidebar.caption(f"Ignored in the URL: project {', '.join(repr(p) for p in ignored)} "
                           f"(no such project stored).")
    if "project_filter" not in st.session_state:
        st.session_state["project_filter"] = [p for p in asked if p in counts]
    else:   # a project gone from the database (a fresh file) leaves the choice
        st.session_state["project_filter"] = [p for p in st.session_state["project_filter"] if p in counts]
    chosen = st.sidebar.multiselect(
        "Projects", names, key="project_filter", format_func=_project_label(counts),
        placeholder="all projects", disabled=len(names) <= 1,
        help="show only these projects' runs and checkpoints; pages never average or fit across projects")
    set_query_params(project=list(chosen) or None)
    return list(chosen)


def in_projects(frame: pd.DataFrame, chosen: list[str], column: str = "project") -> pd.DataFrame:
    """The rows of ``frame`` in the projects ``chosen`` (all rows for [])."""
    if not chosen or column not in frame.columns:
        return frame
    return frame[frame[column].isin(chosen)]


def show_errors(fn: Callable[[], None]) -> None:
    """Run a page; user-input errors become a message that says what to do."""
    try:
        fn()
    except (QkvscopeError, AnalysisError) as exc:
        st.error(md(user_message(str(exc))), icon=":material/error:")


def demo_only(run_sources: list[str]) -> bool:
    """True when every stored run comes from the bundled demo."""
    demo = str(DEMO_DIR.resolve())
    return bool(run_sources) and all(str(s).startswith(demo) for s in run_sources)


# -- cached reads shared by several pages (keyed by the file they read and its data_version) --

@st.cache_data(show_spinner=False, max_entries=8)
def checkpoints_frame(db: str, version: tuple) -> pd.DataFrame:
    """Stored checkpoints with geometry (``loaders.queries.checkpoints_frame``)."""
    return queries.checkpoints_frame(store_at(db))


@st.cache_data(show_spinner=False, max_entries=8)
def checkpoint_choices(db: str, version: tuple) -> pd.DataFrame:
    """What checkpoint pickers list: checkpoints with run, step and run settings
    (``loaders.checkpoint_labels.checkpoint_choices``; named by ``app.pickers.checkpoint_label``)."""
    return checkpoint_labels.checkpoint_choices(store_at(db))


@st.cache_data(show_spinner=False, max_entries=8)
def summary(db: str, version: tuple) -> dict:
    """Counts of runs, points, checkpoints and analyses (``loaders.queries.summary``)."""
    return queries.summary(store_at(db))


@st.cache_data(show_spinner=False, max_entries=8)
def metric_directions(db: str, version: tuple) -> dict[str, str]:
    """``{metric: 'min' | 'max'}`` set by the user (``loaders.curves.metric_directions``): the
    overrides every page passes to ``analysis.directions.direction``."""
    return curves.metric_directions(store_at(db))


@st.cache_data(show_spinner=False, max_entries=32)
def analysis_results(db: str, version: tuple, checkpoint_id: int) -> pd.DataFrame:
    """One checkpoint's stored metric values at this metric version (``loaders.curves.analysis_results``)."""
    return curves.analysis_results(store_at(db), checkpoint_id, METRIC_VERSION)


@st.cache_data(show_spinner=False, max_entries=16)
def results_over_checkpoints(db: str, version: tuple, ids: tuple,
                             metrics: tuple | None = None) -> pd.DataFrame:
    """Several checkpoints' stored values with step and run, optionally only ``metrics``
    (``loaders.curves.results_over_checkpoints``)."""
    return curves.results_over_checkpoints(store_at(db), ids, METRIC_VERSION, list(metrics) if metrics else None)


@st.cache_data(show_spinner=False, max_entries=64)
def current_notes(db: str, version: tuple, checkpoint_id: int, kinds: tuple) -> dict[str, str] | None:
    """The notes ({metric: reason}) of the stored analysis jobs of ``kinds`` when every one is
    current, else None (it has to run): ``loaders.results.current_notes``, the staleness rule
    ``analyze`` applies too (stored at this metric version, every metric registered now present
    or explained, so a plugin switched on makes a stored job stale on every page alike)."""
    wanted = {kind: names("weights" if kind == "weights" else "activations") for kind in kinds}
    return results.current_notes(store_at(db), checkpoint_id, wanted, METRIC_VERSION)


def stored_notes(db: str, version: tuple, checkpoint_id: int) -> dict[str, str]:
    """The notes ({metric: reason}) of whichever analysis jobs (weights, activations) are
    current for a checkpoint (``current_notes``); {} when none is."""
    notes: dict[str, str] = {}
    for kind in ("weights", "activations"):
        notes.update(current_notes(db, version, checkpoint_id, (kind,)) or {})
    return notes