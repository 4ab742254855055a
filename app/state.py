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


# -- cached reads (keyed by the file they read and its data_version) --

def cached_read(read: Callable | None = None, *, max_entries: int = 8):
    """``read(store, *args)`` as a cached ``reader(db, version, *args)``: Streamlit's
    ``st.cache_data`` keyed by the database file ``db``, its ``data_version`` and the other
    arguments (hashable: tuples, not lists), so new data shows without a restart. Use it on a
    loader function (``_runs = cached_read(curves.run_checkpoints)``) or as a decorator of a
    page's own ``def _x(store, ...)`` that shapes what it reads."""
    if read is None:
        return lambda fn: cached_read(fn, max_entries=max_entries)

    def reader(db: str, version: tuple, *args, **kwargs):
        return read(store_at(db), *args, **kwargs)

    # the cache is Streamlit's, keyed by module and qualified name: one per function read
    reader.__module__, reader.__qualname__ = read.__module__, f"cached_read.{read.__qualname__}"
    reader.__name__, reader.__doc__ = read.__name__, read.__doc__
    return st.cache_data(show_spinner=False, max_entries=max_entries)(reader)



def query_param(name: str, default: str | None = None) -> str | None:
    return st.query_params.get(name, default)


# -- URL values, checked: a value a page cannot use is named in a note, never a traceback --

#: Session key of the URL values ignored in this run of the page (``show_errors`` empties it).
URL_NOTES = "url_ignored"


def url_ignored(name: str, raw, why: str) -> None:
    """Name a URL value the page does not use (``url_notes`` shows it): ``name='raw' (why)``."""
    st.session_state.setdefault(URL_NOTES, []).append(f"{name}={raw!r} ({why})")


def _url_number(name: str, default, lo, hi, parse, expected: str):
    raw = query_param(name)
    if raw is None or raw == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        url_ignored(name, raw, f"expected {expected}")
        return default
    if not lo <= value <= hi:
        shown = (lambda v: f"{v:g}") if parse is float else str
        url_ignored(name, value, f"expected {shown(lo)}..{shown(hi)}")
        return default
    return value


def url_int(name: str, default: int | None, lo: int = 0, hi: int = 10_000_000) -> int | None:
    """The URL value ``name`` as an integer in [lo, hi]; ``default`` when absent, else noted."""
    return _url_number(name, default, lo, hi, int, "an integer")


def url_float(name: str, default: float, lo: float = 0.0, hi: float = 100_000.0) -> float:
    """The URL value ``name`` as a finite number in [lo, hi]; ``default`` when absent, else noted."""
    return _url_number(name, default, lo, hi, float, "a number")


def url_choice(name: str, options, default, why: str | None = None):
    """The URL value ``name`` when it is one of ``options``; ``default`` when absent, else noted
    (``why``: the note's reason, by default the options)."""
    raw = query_param(name)
    if raw is None:
        return default
    if raw not in options:
        url_ignored(name, raw, why or f"one of {', '.join(map(str, options))}")
        return default
    return raw


def url_list(name: str) -> list[str]:
    """The URL value ``name`` split at commas, empty items dropped."""
    return [v for v in (query_param(name, "") or "").split(",") if v]


def url_subset(name: str, options, why: str) -> list[str]:
    """The items of the comma-separated URL value ``name`` that are ``options``; the others noted."""
    items = url_list(name)
    for item in items:
        if item not in options:
            url_ignored(name, item, why)
    return [item for item in items if item in options]


def url_ints(name: str) -> list[int]:
    """The URL value ``name`` as a comma-separated list of integers; an item that is none is noted."""
    out = []
    for item in url_list(name):
        try:
            out.append(int(item))
        except ValueError:
            url_ignored(name, item, "expected an integer")
    return out


def url_notes(where=None, warning: bool = False) -> None:
    """One line naming the URL values ignored so far in this run (a caption, or a warning), then
    forgets them; nothing when there are none."""
    notes = st.session_state.get(URL_NOTES) or []
    if notes:
        text = "Ignored in the URL: " + "; ".join(md(n) for n in notes) + "."
        where = where or st
        if warning:
            where.warning(text, icon=":material/link_off:")
        else:
            where.caption(text)
    st.session_state[URL_NOTES] = []


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


#: ``[{"project", "runs", "checkpoints"}, ...]`` (``loaders.projects.project_counts``).
project_counts = cached_read(projects.project_counts)


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
    st.session_state[URL_NOTES] = []
    try:
        fn()
    except (QkvscopeError, AnalysisError) as exc:
        st.error(md(user_message(str(exc))), icon=":material/error:")


def demo_only(run_sources: list[str]) -> bool:
    """True when every stored run comes from the bundled demo."""
    demo = str(DEMO_DIR.resolve())
    return bool(run_sources) and all(str(s).startswith(demo) for s in run_sources)


#: Stored checkpoints with geometry (``loaders.queries.checkpoints_frame``).
checkpoints_frame = cached_read(queries.checkpoints_frame)
#: What checkpoint pickers list: checkpoints with run, step and run settings
#: (``loaders.checkpoint_labels.checkpoint_choices``; named by ``app.pickers.checkpoint_label``).
checkpoint_choices = cached_read(checkpoint_labels.checkpoint_choices)
#: Counts of runs, points, checkpoints and analyses (``loaders.queries.summary``).
summary = cached_read(queries.summary)
#: ``{metric: 'min' | 'max'}`` set by the user (``loaders.curves.metric_directions``): the
#: overrides every page passes to ``analysis.directions.direction``.
metric_directions = cached_read(curves.metric_directions)


@cached_read(max_entries=32)
def analysis_results(store: Store, checkpoint_id: int) -> pd.DataFrame:
    """One checkpoint's stored metric values at this metric version (``loaders.curves.analysis_results``)."""
    return curves.analysis_results(store, checkpoint_id, METRIC_VERSION)


@cached_read(max_entries=16)
def results_over_checkpoints(store: Store, ids: tuple, metrics: tuple | None = None) -> pd.DataFrame:
    """Several checkpoints' stored values with step and run, optionally only ``metrics``
    (``loaders.curves.results_over_checkpoints``)."""
    return curves.results_over_checkpoints(store, ids, METRIC_VERSION, list(metrics) if metrics else None)


@cached_read(max_entries=64)
def current_notes(store: Store, checkpoint_id: int, kinds: tuple) -> dict[str, str] | None:
    """The notes ({metric: reason}) of the stored analysis jobs of ``kinds`` when every one is
    current, else None (it has to run): ``loaders.results.current_notes``, the staleness rule
    ``analyze`` applies too (stored at this metric version, every metric registered now present
    or explained, so a plugin switched on makes a stored job stale on every page alike)."""
    wanted = {kind: names("weights" if kind == "weights" else "activations") for kind in kinds}
    return results.current_notes(store, checkpoint_id, wanted, METRIC_VERSION)


def stored_notes(db: str, version: tuple, checkpoint_id: int) -> dict[str, str]:
    """The notes ({metric: reason}) of whichever analysis jobs (weights, activations) are
    current for a checkpoint (``current_notes``); {} when none is."""
    notes: dict[str, str] = {}
    for kind in ("weights", "activations"):
        notes.update(current_notes(db, version, checkpoint_id, (kind,)) or {})
    return notes