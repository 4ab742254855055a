"""The points of the "What if" page: a post-hoc conversion's greedy curve (``python -m app whatif
--layers greedy --json``) beside what training with the tie from scratch gave.

Every point is ``(kv_saved_pct, delta_ppl_pct)``:

* curve: ``kv_saved_pct = 100 (1 - kv / kv_0)`` and ``delta_ppl_pct`` of each step, against the
  converted checkpoint's own baseline;
* trained runs (the demo's K=V- and MQA-trained runs): against a Q-K-V MHA run trained alike,
  ``delta_ppl_pct = 100 (exp(L - L_0) - 1)`` of the final validation losses (nats), and the
  runs' KV bytes per token;
* the projection-sharing paper's trained variants (``analysis.paper_claims``: Q-K=V, Q-GQA-4,
  Q-MQA at 300M, its validation perplexity and KV cache saving).
"""
from __future__ import annotations

import math

import pandas as pd

from analysis.paper_claims import BY_KEY

#: (label, perplexity claim, cache-saving claim) of the paper's trained variants.
PAPER_PAIRS = (("Q-K=V, trained (paper B, 300M)", "b_ppl_kv_300m", "b_cache_kv"),
               ("Q-GQA-4, trained (paper B, 300M)", "b_ppl_q_gqa", "b_cache_q_gqa"),
               ("Q-MQA, trained (paper B, 300M)", "b_ppl_q_mqa", "b_cache_q_mqa"))
POINT_COLUMNS = ["label", "kv_saved_pct", "delta_ppl_pct"]


def curve(result: dict) -> pd.DataFrame:
    """``layers, kv_saved_pct, delta_ppl_pct, ppl, ci_low, ci_high`` of a whatif result, the
    baseline first (0, 0)."""
    b = result["baseline"]
    rows = [{"layers": "", "kv_saved_pct": 0.0, "delta_ppl_pct": 0.0, "ppl": b["ppl"],
             "ci_low": b["ci_low"], "ci_high": b["ci_high"]}]
    for s in result["steps"]:
        rows.append({"layers": ",".join(map(str, s["layers"])),
                     "kv_saved_pct": 100.0 * (1.0 - s["kv_bytes_per_token"] / b["kv_bytes_per_token"]),
                     "delta_ppl_pct": s["delta_ppl_pct"], "ppl": s["ppl"], "ci_low": s["ci_low"],
                     "ci_high": s["ci_high"]})
    return pd.DataFrame(rows)


def paper_points() -> pd.DataFrame:
    """The paper's trained variants as ``POINT_COLUMNS``."""
    return pd.DataFrame([{"label": label, "kv_saved_pct": BY_KEY[cache].value, "delta_ppl_pct": BY_KEY[ppl].value}
                         for label, ppl, cache in PAPER_PAIRS], columns=POINT_COLUMNS)


def trained_points(runs: pd.DataFrame, baseline: str, others: list[str]) -> pd.DataFrame:
    """Runs ``others`` against the run ``baseline`` (names), from ``runs`` with ``name, final,
    kv_bytes_per_token``; a run missing from ``runs`` or without a loss or KV bytes is left out."""
    by = runs.set_index("name")
    if baseline not in by.index:
        return pd.DataFrame(columns=POINT_COLUMNS)
    l0, kv0 = by.at[baseline, "final"], by.at[baseline, "kv_bytes_per_token"]
    rows = []
    for name in others:
        if name not in by.index or pd.isna(by.at[name, "final"]) or pd.isna(by.at[name, "kv_bytes_per_token"]):
            continue
        rows.append({"label": f"{name}, trained", "kv_saved_pct": 100.0 * (1.0 - by.at[name, "kv_bytes_per_token"] / kv0),
                     "delta_ppl_pct": 100.0 * (math.exp(by.at[name, "final"] - l0) - 1.0)})
    return pd.DataFrame(rows, columns=POINT_COLUMNS)
