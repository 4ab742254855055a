"""Reads of someone's checkpoint that may fail, tried once per browser session and file version.

Streamlit caches no exception: a cached read that raised runs again at the next rerun, and
every widget on a page reruns it. The reads that open a stored checkpoint (an analysis, the
Inspector's spectra, attention maps and tie check) run in the reading child under
``QKVSCOPE_ANALYSIS_TIMEOUT_S``, so a file that fails there (a memory bomb, a forward pass
that never ends, a file broken since it was stored) would cost up to that limit again at every
click. ``attempt`` remembers a failure for the session, keyed by what was asked and the file's
``file_stamp`` (so a replaced or repaired file is tried again by itself), and ``show_failure``
draws its reason with a *Try again* button that forgets it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import streamlit as st

from app.pickers import user_message
from app.plain import md
from loaders.errors import DatabaseBusyError, QkvscopeError

T = TypeVar("T")

#: ``st.session_state`` entry: ``{(kind, *key): message}`` of this session's failed reads.
FAILED = "qkvscope_failed_reads"


def file_stamp(path: str) -> str:
    """A key that changes when the file (or a folder's newest file) changes: each file's name,
    size and modification time; ``missing`` for a path that is gone (or goes while it is listed:
    a released upload)."""
    p = Path(path)
    try:
        files = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        stats = [(q.name, q.stat()) for q in files]
    except OSError:
        return "missing"
    if not stats:
        return "missing" if not p.exists() else "empty"
    return ";".join(f"{name}:{st_.st_size}:{st_.st_mtime_ns}" for name, st_ in stats)


def _retry_key(kind: str) -> str:
    return f"retry_{kind}"


def attempt(kind: str, key: tuple, fn: Callable[[], T],
            errors: tuple[type[BaseException], ...] = (QkvscopeError,)) -> tuple[T | None, str | None]:
    """``(fn(), None)``, or ``(None, message)`` when ``fn`` raised one of ``errors`` in this
    session for the same ``(kind, *key)``: then ``fn`` is not called again until the *Try
    again* button of ``show_failure(kind, ...)`` is pressed (which retries every failure of
    ``kind``) or ``key`` changes (put the file's ``file_stamp`` in it). A busy database
    (``DatabaseBusyError``: another process writing) says nothing about the file, so it is
    shown but not remembered; other exceptions propagate and are not remembered."""
    failed: dict[tuple, str] = st.session_state.setdefault(FAILED, {})
    if st.session_state.get(_retry_key(kind)):       # its button was pressed: this run tries again
        for k in [k for k in failed if k[0] == kind]:
            del failed[k]
    full = (kind, *key)
    if full in failed:
        return None, failed[full]
    try:
        return fn(), None
    except errors as exc:
        if not isinstance(exc, DatabaseBusyError):
            failed[full] = str(exc)
        return None, str(exc)


def show_failure(kind: str, messages: str | list[str], slot=None) -> None:
    """Each of ``messages`` as an error (upload folders named as uploaded) and one *Try again*
    button that makes ``attempt`` call the failed reads of ``kind`` again, in ``slot`` (a
    container; the page by default)."""
    where = st if slot is None else slot
    for message in [messages] if isinstance(messages, str) else messages:
        where.error(user_message(message), icon=":material/error:")
    where.button("Try again", key=_retry_key(kind), icon=":material/refresh:",
                 help="A failed read is remembered for this browser session, so that other controls "
                      "do not read the file again; a file that changed is read again by itself.")


def analyse_each(store, checkpoints: list[tuple[int, str]]) -> tuple[list[str], list[str]]:
    """The weight analysis (``app.jobs.analyze``) of each ``(checkpoint id, label)`` under one
    progress bar, for a page's *Analyse* button: a checkpoint that fails (file gone, broken,
    a bomb) is one message and the others are still analysed. Returns the labels analysed and
    the failures' messages (upload folders named as uploaded)."""
    from app.jobs import analyze  # here: app.jobs imports torch; the pages load without it
    from analysis.errors import AnalysisError

    done, failures = [], []
    bar = st.progress(0.0)
    try:
        for n, (cid, label) in enumerate(checkpoints):
            bar.progress(n / len(checkpoints), text=f"{label} ({n + 1}/{len(checkpoints)})")
            try:
                analyze(store, int(cid))
                done.append(label)
            except (QkvscopeError, AnalysisError) as exc:
                failures.append(user_message(f"{label}: {exc}"))
    finally:
        bar.empty()
    return done, failures


def show_batch(key: str) -> None:
    """What an *Analyse* button's ``analyse_each`` left in ``st.session_state[key]`` before the
    page's rerun, ``(labels analysed, failures)``: one success line and each failure; once."""
    got = st.session_state.pop(key, None)
    if not got:
        return
    done, failures = got
    if done:
        st.success(f"Analysed {', '.join(md(d) for d in done)}.", icon=":material/check:")
    for message in failures:
        st.error(md(message), icon=":material/error:")
