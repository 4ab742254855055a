"""Result tables: chance beside each value, sampled rows with tokens and interval, greyed notes."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app import tables


def _results():
    rows = [(0, h, "kv_share_r2", v, 0.25, None, np.nan, np.nan) for h, v in enumerate([0.2, 0.3, 0.4])]
    rows += [(0, h, "kv_cka_act", v, 0.2, 512, v - d, v + d)
             for h, (v, d) in enumerate([(0.5, 0.1), (0.25, 0.1), (0.6, 0.5)])]
    rows += [(l, None, "wq_condition", 10.0 + l, 117.4, None, np.nan, np.nan) for l in range(2)]
    frame = pd.DataFrame(rows, columns=["layer", "head", "metric", "value", "chance", "n_tokens", "ci_low", "ci_high"])
    frame["n_tokens"] = frame["n_tokens"].astype("Int64")
    frame["head"] = frame["head"].astype("Int64")
    # the stored test (analysis.above_chance) and the degenerate flag, as analyze stores them
    frame["above_chance"] = pd.array([False, True, True, True, False, False, pd.NA, pd.NA], dtype="boolean")
    frame["degenerate"] = [False, False, True, False, False, False, False, False]
    frame["chance_low"], frame["chance_high"] = frame["chance"] - 0.05, frame["chance"] + 0.05
    return frame


@pytest.mark.parametrize("note, few", [
    ("512 tokens < 8 x d_head = 1024: CKA at its small-sample floor", True),
    ("1 token < 8 x d_head = 64", True),
    ("Too few tokens for a full count", True),
    ("model uses layernorm", False),
    ("one window: no interval over windows (ci_low, ci_high empty)", False),
    ("", False), (None, False)])
def test_few_tokens_reads_the_notes(note, few):
    assert tables.few_tokens(note) is few


def test_head_summary_counts_the_stored_test_and_leaves_degenerate_heads_out():
    notes = {"kv_cka_act": "512 tokens < 8 x d_head = 1024: biased up", "kv_share_r2": "ok"}
    styled = tables.head_summary(_results(), ["kv_share_r2", "kv_cka_act"], notes)
    t = styled.data.set_index("metric")
    assert t.loc["kv_share_r2", "heads above chance"] == "1 of 2"   # head 2 (0.4) is degenerate: counted nowhere
    assert t.loc["kv_cka_act", "heads above chance"] == "1 of 3"    # the stored above_chance
    assert t.loc["kv_cka_act", "n_tokens"] == "512" and t.loc["kv_share_r2", "n_tokens"] == ""
    assert t.loc["kv_cka_act", "95% CI (mean of heads' bounds)"] == "0.2167–0.6833"
    assert t.loc["kv_share_r2", "mean"] == pytest.approx(0.3) and t.loc["kv_share_r2", "chance"] == 0.25
    html = styled.to_html()
    assert html.count("color: #9a9a9a") == 1 and "row1_col0" in html.split("color: #9a9a9a")[0]  # the act row only


def test_layer_table_puts_chance_beside_each_metric():
    t = tables.layer_table(_results(), ["wq_condition", "wq_absorb_error"])
    assert list(t.columns) == ["layer", "wq_condition", "wq_condition chance"]
    assert t["wq_condition"].tolist() == [10.0, 11.0] and t["wq_condition chance"].tolist() == [117.4, 117.4]


def test_head_means_average_heads_per_step_with_chance_and_bounds():
    res = _results().assign(run_id=1, step=100, checkpoint_id=1)
    m = tables.head_means(res).set_index("metric")
    assert list(tables.head_means(res).columns) == ["run_id", "metric", "layer", "step", "value", "chance",
                                                   "n_tokens", "ci_low", "ci_high"]
    assert m.loc["kv_cka_act", "value"] == pytest.approx(0.45) and m.loc["kv_cka_act", "ci_high"] == pytest.approx(0.6833333)
    assert "wq_condition" not in m.index  # whole-layer rows are not head means


def test_rows_not_tested_are_not_counted_and_all_degenerate_reads_degenerate():
    frame = _results()
    frame.loc[frame["metric"] == "kv_cka_act", "above_chance"] = pd.NA       # e.g. one window: not tested
    t = tables.head_summary(frame, ["kv_cka_act"], {}).data
    assert t["heads above chance"].tolist() == [""]
    frame.loc[frame["metric"] == "kv_share_r2", "degenerate"] = True         # a K = V layer
    styled = tables.head_summary(frame, ["kv_share_r2"], {})
    assert styled.data["heads above chance"].tolist() == ["degenerate"]
    assert "color: #9a9a9a" in styled.to_html()


def test_head_rows_show_the_band_the_call_and_the_flag():
    t = tables.head_rows(_results(), ["kv_share_r2"], {}).data
    assert t["null band"].tolist() == ["0.2–0.3"] * 3
    assert t["above chance"].tolist() == [False, True, None]                 # the degenerate head: no call
    assert t["degenerate"].tolist() == [False, False, True]


def test_short_reason_is_the_first_clause():
    assert tables.short_reason("128 tokens < 8 x d_head = 256: biased toward 1; one window") == \
        "128 tokens < 8 x d_head = 256"


# -- results tables (Results page exports) -----------------------------------------------

def _results_table():
    from analysis.results_table import results_table

    runs = pd.DataFrame({"id": [1, 2, 3, 4], "variant": ["qkv", "qkv", "k_eq_v", "qkv"], "n_heads": 4,
                         "n_kv_heads": [4, 4, 4, 1], "seed": [1, 2, 1, 1], "n_layers": 2, "d_model": 8,
                         "d_head": 2, "dtype": "float32"})
    values = pd.DataFrame({"run_id": [1, 2, 3, 4], "metric": "val/loss", "final": [2.0, 2.2, 2.31, 3.0],
                           "min": np.nan, "max": np.nan})
    return results_table(runs, values, ["val/loss"])


def test_results_display_prints_mean_pm_std_and_percent():
    d = tables.results_display(_results_table())
    assert d.columns.tolist() == ["Variant", "Heads", "n", "val/loss", "val/loss vs Q-K-V", "KV bytes/token",
                                  "Attention params"]
    # qkv MHA: 2.0, 2.2 -> 2.1 ± 0.1414; k_eq_v: 2.31, +10.0% against 2.1; attention params
    # 2 layers x (W_Q 64 + W_K 64 + W_V 64 + W_O 64), W_V tied for k_eq_v
    assert d.iloc[0].tolist() == ["Q-K-V", "MHA", "2", "2.1000 ± 0.1414", "", "128", "512"]
    assert d.iloc[1].tolist() == ["Q-K=V", "MHA", "1", "2.3100", "+10.0%", "64", "384"]
    assert d.iloc[2][["Variant", "Heads", "KV bytes/token"]].tolist() == ["Q-K-V", "MQA", "32"]


def test_results_markdown_and_latex_booktabs():
    d = tables.results_display(_results_table())
    md = tables.results_markdown(d).splitlines()
    assert md[0] == "| Variant | Heads | n | val/loss | val/loss vs Q-K-V | KV bytes/token | Attention params |"
    assert md[1] == "|:---|:---|---:|---:|---:|---:|---:|"
    assert md[3] == "| Q-K=V | MHA | 1 | 2.3100 | +10.0% | 64 | 384 |"
    tex = tables.results_latex(d, caption="Validation loss (mean ± std over seeds)", label="tab:res")
    lines = tex.splitlines()
    assert lines[:5] == [r"\begin{table}[t]", r"\centering", r"\caption{Validation loss (mean $\pm$ std over seeds)}",
                         r"\label{tab:res}", r"\begin{tabular}{llrrrrr}"]
    assert lines[5:8] == [r"\toprule", r"Variant & Heads & n & val/loss & val/loss vs Q-K-V & KV bytes/token & "
                          r"Attention params \\", r"\midrule"]
    assert lines[8] == r"Q-K-V & MHA & 2 & 2.1000 $\pm$ 0.1414 &  & 128 & 512 \\"
    assert lines[9] == r"Q-K=V & MHA & 1 & 2.3100 & +10.0\% & 64 & 384 \\"
    assert lines[10] == r"\midrule"            # MHA block, then MQA
    assert lines[-3:] == [r"\bottomrule", r"\end{tabular}", r"\end{table}"]


def test_csv_downloads_guard_formula_cells_and_headers():
    """A spreadsheet opening a download runs no formula from a run name, a metric or a query."""
    import csv
    import io

    from app.tables import csv_bytes

    frame = pd.DataFrame({"=cmd|' /C calc'!A0": ["=HYPERLINK(\"http://x\")", "+1", "-x", "@SUM(A1)", "\tz", "\rz", "ok\r=1+1"],
                          "value": [-1.5, 2.0, 3.0, 4.0, 5.0, 5.5, 6.0]})
    rows = list(csv.reader(io.StringIO(csv_bytes(frame).decode(), newline="")))
    assert rows[0] == ["'=cmd|' /C calc'!A0", "value"]
    assert [r[0] for r in rows[1:]] == ["'=HYPERLINK(\"http://x\")", "'+1", "'-x", "'@SUM(A1)", "'\tz", "'\rz", "ok\r=1+1"]
    assert [r[1] for r in rows[1:]] == ["-1.5", "2.0", "3.0", "4.0", "5.0", "5.5", "6.0"]   # numbers stay numbers
