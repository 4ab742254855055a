"""Result rows as JSON and back: what a child process sends its parent.

``json_rows(frame)`` is a frame with ``analysis.registry.RESULT_COLUMNS``
(``layer, head, head_label, metric, value, chance, n_tokens, ci_low, ci_high,
chance_low, chance_high, above_chance, degenerate, layer2, head2``) as a list of rows in that
column order, NaN and NA as None; ``rows_frame(rows)`` is the frame again with
the stored dtypes: ``layer`` int64, ``head``, ``n_tokens``, ``layer2`` and ``head2`` nullable Int64,
``value``, ``chance``, ``ci_low``, ``ci_high``, ``chance_low``, ``chance_high``
float64 (None as NaN), ``above_chance`` nullable boolean, ``degenerate`` bool
(None as False).
"""
from __future__ import annotations

import pandas as pd

from analysis.registry import PAIR_COLUMNS, RESULT_COLUMNS, with_pair_columns


def json_rows(frame: pd.DataFrame) -> list[list]:
    """``frame``'s ``RESULT_COLUMNS`` as JSON-able rows (missing values as None; a frame without
    the pair columns has None there)."""
    frame = frame if all(c in frame.columns for c in PAIR_COLUMNS) else with_pair_columns(frame)
    rows = frame[RESULT_COLUMNS].astype(object).where(frame[RESULT_COLUMNS].notna(), None)
    return rows.values.tolist()


def rows_frame(rows: list[list]) -> pd.DataFrame:
    """The frame of ``json_rows``' rows, with the stored dtypes (module docstring)."""
    frame = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    frame["layer"] = frame["layer"].astype("int64")
    for col in ("head", "n_tokens", "layer2", "head2"):
        frame[col] = pd.array(frame[col], dtype="Int64")
    for col in ("value", "chance", "ci_low", "ci_high", "chance_low", "chance_high"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["above_chance"] = pd.array(frame["above_chance"], dtype="boolean")
    frame["degenerate"] = frame["degenerate"].fillna(False).astype(bool)
    return frame
