"""analysis.notes.nonfinite_notes: a note per metric with undefined values, naming the heads."""
from __future__ import annotations

import math

import pandas as pd

from analysis.notes import nonfinite_notes
from analysis.registry import RESULT_COLUMNS


def frame(values):
    rows = [dict(layer=0, head=i, head_label=f"L0H{i}", metric="kv_cosine_act", value=v, chance=0.0, n_tokens=1,
                 ci_low=0.0, ci_high=1.0) for i, v in enumerate(values)]
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def test_undefined_heads_are_named_after_the_metrics_own_note():
    notes = {"kv_cosine_act": "few tokens"}
    nonfinite_notes(frame([0.5, math.nan, None, math.inf]), notes)
    assert notes == {"kv_cosine_act": "few tokens; undefined (zero norm or singular matrix) at L0H1, L0H2, L0H3"}


def test_a_frame_without_rows_gives_no_note():
    notes = {}
    nonfinite_notes(pd.DataFrame(columns=RESULT_COLUMNS), notes)
    nonfinite_notes(frame([0.25]), notes)
    assert notes == {}
