"""Notes beside result rows: ``{metric: text}`` saying why a metric is absent, undefined at some
heads, or computed under a convention. Pure functions of frames with ``analysis.registry.COLUMNS``
(``layer, head, head_label, metric, value``); the jobs store the notes with the rows.
"""
from __future__ import annotations

import math

import pandas as pd

from analysis.registry import names


def merge_notes(into: dict[str, str], new: dict[str, str]) -> None:
    """``new``'s notes added to ``into``, the first note of a metric kept."""
    for k, v in new.items():
        into.setdefault(k, v)


def nonfinite_notes(frame: pd.DataFrame, notes: dict[str, str]) -> None:
    """A note for each metric whose ``value`` is None, NaN or infinite at some heads, naming
    up to 8 of them (``head_label``), appended after the metric's note if it has one."""
    # astype(bool): the map of an empty column is an object Series, which would select columns
    bad = frame[~frame["value"].map(lambda x: x is not None and math.isfinite(x)).astype(bool)]
    for metric, grp in bad.groupby("metric", sort=True):
        labels = ", ".join(grp["head_label"].tolist()[:8]) + (" ..." if len(grp) > 8 else "")
        msg = f"undefined (zero norm or singular matrix) at {labels}"
        # a metric can already carry a note about rows that are absent (e.g. the
        # per-layer erank_o); keep both rather than hide the undefined heads
        notes[metric] = f"{notes[metric]}; {msg}" if metric in notes else msg


def layout_notes(notes: dict[str, str], meta, frame: pd.DataFrame) -> None:
    """The layout's notes on metrics its conventions change (``meta.notes``: QK-norm gains applied
    after W_Q/W_K, MLA's composed K/V maps), for the metrics present in ``frame``."""
    present = set(frame["metric"]) if len(frame) else set()
    for metric, text in (getattr(meta, "notes", None) or {}).items():
        if metric in present and text not in notes.get(metric, ""):
            notes[metric] = f"{notes[metric]}; {text}" if metric in notes else text


def add_activation_note(notes: dict[str, str], said: str) -> None:
    """``said`` appended to the note of every activation metric (what the inputs were)."""
    for m in names("activations"):
        notes[m] = f"{notes[m]}; {said}" if m in notes else said
