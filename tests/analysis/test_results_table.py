"""Results table: groups, mean ± std over seeds, n, % against qkv, KV bytes and attention parameters (by hand)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.results_table import (attention_params, common_setting, kv_bytes_per_token, results_table,
                                    run_groups, variant_label)


def _runs():
    # qkv MHA: three seeds; k_eq_v MHA: two seeds; qkv MQA and k_eq_v MQA: one each; a vision qkv run
    rows = [(1, "qkv", 4, 4, 1, "language"), (2, "qkv", 4, 4, 2, None), (3, "qkv", 4, 4, 3, "language"),
            (4, "k_eq_v", 4, 4, 1, None), (5, "k_eq_v", 4, 4, 2, None),
            (6, "qkv", 4, 1, 1, None), (7, "k_eq_v", 4, 1, 1, None), (8, "qkv", 4, 4, 1, "vision")]
    frame = pd.DataFrame(rows, columns=["id", "variant", "n_heads", "n_kv_heads", "seed", "task"])
    return frame.assign(n_layers=2, d_model=8, d_head=2, dtype="float16")


def _values():
    loss = {1: 2.0, 2: 2.2, 3: 2.4, 4: 2.5, 5: 2.7, 6: 3.0, 7: 3.3, 8: 1.0}
    best = {k: v - 0.1 for k, v in loss.items()}
    acc = {1: 0.5, 2: 0.6, 3: 0.7, 4: 0.4, 5: 0.5, 6: 0.3, 7: 0.2, 8: 0.9}
    rows = [{"run_id": r, "metric": "val/loss", "final": loss[r], "min": best[r], "max": loss[r] + 1} for r in loss]
    rows += [{"run_id": r, "metric": "val/accuracy", "final": acc[r] - 0.05, "min": 0.0, "max": acc[r]} for r in acc]
    return pd.DataFrame(rows)


def test_groups_keep_mha_and_mqa_and_tasks_apart():
    g = run_groups(_runs()).set_index("id")
    # project (unknown here: ?) | task | d_model | n_layers | n_heads | n_kv_heads | variant
    assert g.loc[1, "group"] == g.loc[2, "group"] == "?|language|8|2|4|4|qkv"
    assert g.loc[6, "group"] == "?|language|8|2|4|1|qkv" and g.loc[6, "sharing"] == "MQA"
    assert g.loc[8, "group"] == "?|vision|8|2|4|4|qkv"
    assert g.loc[2, "task"] == "language"          # missing task: a language run


def test_mean_std_n_and_percent_against_qkv_by_hand():
    t = results_table(_runs(), _values(), ["val/loss"])
    assert list(zip(t["task"], t["variant"], t["sharing"])) == [
        ("language", "qkv", "MHA"), ("language", "k_eq_v", "MHA"), ("language", "qkv", "MQA"),
        ("language", "k_eq_v", "MQA"), ("vision", "qkv", "MHA")]
    q = t.iloc[0]
    # qkv MHA: 2.0, 2.2, 2.4 -> mean 2.2, sample std sqrt((0.04 + 0 + 0.04) / 2) = 0.2
    assert q["val/loss mean"] == pytest.approx(2.2) and q["val/loss std"] == pytest.approx(0.2)
    assert q["val/loss n"] == 3 and q["n runs"] == 3 and q["seeds"] == "1, 2, 3"
    assert math.isnan(q["val/loss vs qkv %"])      # the baseline itself
    kv = t.iloc[1]
    # k_eq_v MHA: 2.5, 2.7 -> mean 2.6, std sqrt(0.02) ; vs qkv: 100 (2.6 - 2.2) / 2.2 = +18.18%
    assert kv["val/loss mean"] == pytest.approx(2.6) and kv["val/loss std"] == pytest.approx(math.sqrt(0.02))
    assert kv["val/loss vs qkv %"] == pytest.approx(100 * 0.4 / 2.2)
    # k_eq_v MQA against qkv MQA (same head sharing): 100 (3.3 - 3.0) / 3.0 = +10%
    assert t.iloc[3]["val/loss vs qkv %"] == pytest.approx(10.0)
    assert math.isnan(t.iloc[2]["val/loss std"]) and t.iloc[2]["val/loss n"] == 1  # one run: no std


def test_best_is_direction_aware_and_perplexity_is_exp_of_each_run():
    t = results_table(_runs(), _values(), ["val/loss", "val/accuracy"], statistic="best", perplexity=True)
    q = t.iloc[0]
    assert q["val/loss mean"] == pytest.approx(2.1)          # the lowest loss of each run
    assert q["val/accuracy mean"] == pytest.approx(0.6)      # the highest accuracy of each run
    # perplexity: the mean of exp(best loss) over runs, not exp of the mean
    assert q["exp(val/loss) mean"] == pytest.approx(np.mean(np.exp([1.9, 2.1, 2.3])))
    assert "exp(val/accuracy) mean" not in t.columns        # not a loss
    assert math.isnan(t.iloc[4]["exp(val/loss) mean"]) and t.iloc[4]["task"] == "vision"  # no perplexity
    final = results_table(_runs(), _values(), ["val/accuracy"])
    assert final.iloc[0]["val/accuracy mean"] == pytest.approx(0.55)
    with pytest.raises(AnalysisError) as err:
        results_table(_runs(), _values(), ["val/loss"], statistic="last")
    assert str(err.value) == "results_table: statistic must be one of final, best; got 'last'"


def test_kv_bytes_and_attention_parameters_from_geometry():
    t = results_table(_runs(), _values(), ["val/loss"]).set_index(["variant", "sharing"]).loc[
        lambda d: d["task"] == "language"]
    # 2 layers x n_cached x n_kv_heads x d_head 2 x 2 bytes (fp16)
    assert t.loc[("qkv", "MHA"), "KV bytes/token"] == 2 * 2 * 4 * 2 * 2
    assert t.loc[("k_eq_v", "MHA"), "KV bytes/token"] == 2 * 1 * 4 * 2 * 2
    assert t.loc[("k_eq_v", "MQA"), "KV bytes/token"] == 2 * 1 * 1 * 2 * 2
    # per layer W_Q 4*8*2 + W_K n_kv*8*2 + W_V (0 when tied) + W_O 4*2*8, two layers
    assert t.loc[("qkv", "MHA"), "attention params"] == 2 * (64 + 64 + 64 + 64)
    assert t.loc[("k_eq_v", "MQA"), "attention params"] == 2 * (64 + 16 + 0 + 64)
    assert attention_params("wq_identity", 1, 4, 4, 8, 2) == 0 + 64 + 64 + 64
    assert kv_bytes_per_token("qkv", 4, 4, 16, 4) == 2048          # the demo's MHA runs at fp32
    assert kv_bytes_per_token("qkv", 4, 4, 16, None) is None
    # a stored value wins unless bytes per element are chosen
    stored = _runs().assign(kv_bytes_per_token=999)
    assert results_table(stored, _values(), ["val/loss"]).iloc[0]["KV bytes/token"] == 999
    assert results_table(stored, _values(), ["val/loss"], bytes_per_elem=1).iloc[0]["KV bytes/token"] == 32


def test_paper_b_qvv3_is_a_row_of_its_own_named_by_its_condition():
    # paper B's QVV(3) is stored as k_eq_v (K=V) with its condition; it is not a Q-K=V run
    runs = _runs().assign(condition=None)
    runs.loc[runs["id"] == 5, "condition"] = "QVV(3)"
    runs.loc[runs["id"] == 4, "condition"] = "Q!=K=V"            # paper B's spelling of Q-K=V itself
    g = run_groups(runs).set_index("id")
    assert g.loc[4, "group"] == "?|language|8|2|4|4|k_eq_v" and g.loc[4, "label"] == "Q-K=V"
    assert g.loc[5, "group"] == "?|language|8|2|4|4|k_eq_v|QVV(3)" and g.loc[5, "label"] == "QVV(3)"
    t = results_table(runs, _values(), ["val/loss"]).query("sharing == 'MHA' and task == 'language'").set_index("label")
    assert t.loc["Q-K=V", "n runs"] == 1 and t.loc["QVV(3)", "n runs"] == 1
    assert t.loc["QVV(3)", "val/loss mean"] == pytest.approx(2.7)
    assert t.loc["QVV(3)", "variant"] == "k_eq_v"
    # its KV cache is K=V's; its W_Q is factored, so no parameter count is computed for it
    assert t.loc["QVV(3)", "KV bytes/token"] == t.loc["Q-K=V", "KV bytes/token"] == 2 * 1 * 4 * 2 * 2
    assert math.isnan(t.loc["QVV(3)", "attention params"]) and t.loc["Q-K=V", "attention params"] > 0
    assert variant_label("k_eq_v", "QVV(3)") == "QVV(3)" and variant_label("k_eq_v", float("nan")) == "Q-K=V"


def test_common_setting_is_the_weight_decay_most_groups_share():
    runs = _runs().assign(weight_decay=[0.1, 0.1, 0.1, 0.1, 0.0, 0.1, 0.1, 0.0])
    assert common_setting(runs) == 0.1
    assert common_setting(runs.drop(columns="weight_decay")) is None


def test_default_selection_is_the_best_run_of_each_group():
    from analysis.results_table import best_of_each_group

    vals = _values()
    loss = vals[vals["metric"] == "val/loss"]
    # groups in table order: qkv MHA (best 2.0: run 1), k_eq_v MHA (run 4), qkv MQA (6), k_eq_v MQA (7), vision (8)
    assert best_of_each_group(_runs(), loss, "val/loss") == [1, 4, 6, 7, 8]
    acc = vals[vals["metric"] == "val/accuracy"]
    # final accuracies 0.45, 0.55, 0.65 for qkv MHA: the highest (run 3) is the best
    assert best_of_each_group(_runs(), acc, "val/accuracy", limit=2) == [3, 5]
    assert best_of_each_group(_runs().iloc[:0], loss, "val/loss") == []


def test_metric_order_puts_validation_loss_then_accuracy_first():
    from analysis.results_table import metric_order

    names = ["lr", "train/loss", "val_top1", "val/accuracy", "val/loss", "train/accuracy", "tokens_per_s"]
    assert metric_order(names) == ["val/loss", "val/accuracy", "val_top1", "train/loss", "train/accuracy", "lr",
                                   "tokens_per_s"]
    # an HF Trainer's eval/train_loss is a training-split loss: after every validation metric
    assert metric_order(["eval/train_loss", "test/loss", "eval/loss", "val/loss", "valid_ppl"]) == [
        "val/loss", "eval/loss", "test/loss", "valid_ppl", "eval/train_loss"]


def test_table_order_is_task_then_sharing_then_variant():
    from analysis.results_table import table_order

    keys = [("language", "MQA", 1, "qkv"), ("language", "MHA", 4, "k_eq_v"), ("language", "GQA-2", 2, "qkv"),
            ("language", "MHA", 4, "qkv"), ("language", "GQA-4", 4, "qkv"), ("vision", "MHA", 4, "qkv")]
    ordered = sorted(keys, key=lambda k: table_order(*k))
    assert ordered == [("language", "MHA", 4, "qkv"), ("language", "MHA", 4, "k_eq_v"),
                       ("language", "GQA-4", 4, "qkv"), ("language", "GQA-2", 2, "qkv"),
                       ("language", "MQA", 1, "qkv"), ("vision", "MHA", 4, "qkv")]


def test_default_selection_and_rows_put_language_before_image_runs():
    import pandas as pd

    from analysis.results_table import best_of_each_group

    runs = pd.DataFrame({"id": [1, 2, 3, 4], "variant": ["qkv", "qkv", "k_eq_v", "k_eq_v"],
                         "task": ["image", "language", "image", "language"], "n_heads": 4, "n_kv_heads": 4})
    finals = pd.DataFrame({"run_id": [1, 2, 3, 4], "final": [0.2, 1.3, 0.3, 1.4]})
    # image losses are lower, but the language groups come first, as the tables order them
    assert best_of_each_group(runs, finals, "val/loss", limit=2) == [2, 4]


def test_projects_and_widths_are_rows_of_their_own_and_differences_are_named():
    runs = pd.DataFrame([
        # (id, project, d_model, seed, lr, last_step)
        {"id": 1, "project": "sweep-a", "d_model": 128, "seed": 1, "lr": 3e-4, "last_step": 149},
        {"id": 2, "project": "sweep-a", "d_model": 128, "seed": 2, "lr": 1e-3, "last_step": 99},
        {"id": 3, "project": "sweep-a", "d_model": 256, "seed": 1, "lr": 3e-4, "last_step": 149},
        {"id": 4, "project": "sweep-b", "d_model": 128, "seed": 1, "lr": 3e-4, "last_step": 149},
    ]).assign(variant="unknown", n_heads=4, n_kv_heads=4, n_layers=4, task="language",
              config=[{"dropout": 0.1, "seed": 1}, {"dropout": 0.1, "seed": 2}, {"dropout": 0.0}, {}])
    values = pd.DataFrame({"run_id": [1, 2, 3, 4], "metric": "val/loss", "final": [2.0, 2.4, 1.8, 2.6],
                           "min": [2.0, 2.4, 1.8, 2.6], "max": [2.7, 2.9, 2.5, 3.1]})
    t = results_table(runs, values, ["val/loss"])
    assert list(zip(t["project"], t["d_model"], t["n runs"], t["run ids"])) == [
        ("sweep-a", 128, 2, "1, 2"), ("sweep-a", 256, 1, "3"), ("sweep-b", 128, 1, "4")]
    assert t.iloc[0]["val/loss mean"] == pytest.approx(2.2)
    assert t.iloc[0]["warnings"] == ["length: last step 149 (run 1), 99 (run 2)",
                                     "lr: 0.0003 (run 1), 0.001 (run 2)"]
    assert t.iloc[1]["warnings"] == [] and t.iloc[2]["warnings"] == []
