"""Results page in AppTest: paper-style rows, mean ± std over seeds, % against Q-K-V, costs, URL keys, exports."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from loaders.store import Store, refresh_run_stats
from tests.app.apptest import page_test, shown

#: (id, name, variant, n_kv_heads, weight decay, seed, task, final val/loss, val/accuracy)
RUNS = [(1, "qkv-s1", "qkv", 4, 0.1, 1, None, 2.0, 0.5), (2, "qkv-s2", "qkv", 4, 0.1, 2, None, 2.2, 0.6),
        (3, "kv-s1", "k_eq_v", 4, 0.1, 1, None, 2.31, 0.4), (4, "qkv-mqa", "qkv", 1, 0.1, 1, None, 3.0, 0.3),
        (5, "kv-mqa", "k_eq_v", 1, 0.1, 1, None, 3.3, 0.2), (6, "qkv-wd0", "qkv", 4, 0.0, 1, None, 1.0, 0.9),
        (7, "vit", "qkv", 4, 0.1, 1, "vision", 0.7, 0.8)]


def _fill(db) -> None:
    store = Store(db)
    store.migrate()
    rows = []
    for rid, _, _, _, _, _, _, loss, acc in RUNS:
        rows.append(pd.DataFrame({"run_id": rid, "step": [0, 100, 200], "metric": "val/loss",
                                  "value": [loss + 1.0, loss - 0.1, loss]}))
        rows.append(pd.DataFrame({"run_id": rid, "step": [0, 100, 200], "metric": "val/accuracy",
                                  "value": [0.1, acc, acc - 0.05]}))
    frame = pd.concat(rows, ignore_index=True).assign(wall_time=0.0, tokens=0)
    with store.transaction() as con:
        for rid, name, variant, kv, wd, seed, task, _, _ in RUNS:
            cfg = {"n_head": 4, "n_layer": 2, "d_model": 8} | ({"task": task} if task else {})
            con.execute("INSERT INTO runs (id, name, source, format, variant, n_kv_heads, weight_decay, seed, config) "
                        "VALUES (?, ?, ?, 'csv', ?, ?, ?, ?, ?)", [rid, name, f"/x/{name}", variant, kv, wd, seed,
                                                                  json.dumps(cfg)])
        # run 1 has a checkpoint (fp32): its geometry and stored costs are read from it
        con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, n_kv_heads, "
                    "d_model, d_head, dtype, params_attention, kv_bytes_per_token, run_id, step) VALUES "
                    "(1, 'p', 's1', 'gpt2', 'qkv', 2, 4, 4, 8, 2, 'float32', 512, 128, 1, 200)")
        con.register("f", frame)
        con.execute("INSERT INTO points SELECT run_id, step, metric, value, wall_time, tokens FROM f")
        refresh_run_stats(con, frame["run_id"].unique())


@pytest.fixture
def results_db(tmp_path, monkeypatch):
    db = tmp_path / "results.duckdb"
    _fill(db)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def qp(at, key):
    v = at.query_params.get(key)
    return v[-1] if isinstance(v, list) else v


def test_empty_database_says_how_to_get_data_in(empty_db):
    at = page_test("results").run()
    assert not at.exception
    assert at.info[0].value.startswith("No training runs stored yet.")


def test_rows_are_variant_by_head_sharing_with_mean_std_and_percent(results_db):
    default = page_test("results").run()                 # several tasks: language by default
    assert not default.exception, default.exception
    assert len(default.dataframe[0].value) == 4 and "task" not in default.dataframe[0].value.columns
    at = page_test("results", query={"task": "all"}).run()
    assert not at.exception, at.exception
    t = at.dataframe[0].value
    # weight decay 0.1 (shared by the most groups) by default: run 6 (wd 0) is left out
    assert list(zip(t["task"], t["label"], t["sharing"])) == [
        ("language", "Q-K-V", "MHA"), ("language", "Q-K=V", "MHA"), ("language", "Q-K-V", "MQA"),
        ("language", "Q-K=V", "MQA"), ("vision", "Q-K-V", "MHA")]
    q = t.iloc[0]
    assert q["n runs"] == 2 and q["seeds"] == "1, 2"
    assert q["val/loss mean"] == pytest.approx(2.1) and q["val/loss std"] == pytest.approx(np.std([2.0, 2.2], ddof=1))
    assert t.iloc[1]["val/loss vs qkv %"] == pytest.approx(10.0)        # 100 (2.31 - 2.1) / 2.1
    assert t.iloc[3]["val/loss vs qkv %"] == pytest.approx(10.0)        # 100 (3.3 - 3.0) / 3.0, MQA baseline
    assert t.iloc[0]["exp(val/loss) mean"] == pytest.approx(np.mean(np.exp([2.0, 2.2])))
    # run 1's checkpoint stores 128 bytes and 512 parameters; the rest from the config (no dtype: no bytes)
    assert t.iloc[0]["KV bytes/token"] == 128 and t.iloc[0]["attention params"] == 512
    assert t.iloc[1]["attention params"] == 2 * (64 + 64 + 0 + 64)
    assert qp(at, "metrics") == "val/loss" and qp(at, "wd") is None


def test_url_keys_choose_metrics_statistic_weight_decay_and_costs(results_db):
    at = page_test("results", {"metrics": "val/loss,val/accuracy", "stat": "best", "wd": "all", "kvb": "2",
                               "ppl": "0", "task": "language"}).run()
    assert not at.exception, at.exception
    t = at.dataframe[0].value
    assert "exp(val/loss) mean" not in t.columns and "task" not in t.columns
    q = t.iloc[0]                                                  # qkv MHA: runs 1, 2 and 6 (all wd)
    assert q["n runs"] == 3
    assert q["val/loss mean"] == pytest.approx(np.mean([1.9, 2.1, 0.9]))       # the lowest loss of each
    assert q["val/accuracy mean"] == pytest.approx(np.mean([0.5, 0.6, 0.9]))   # the highest accuracy
    assert q["KV bytes/token"] == 2 * 2 * 4 * 2 * 2               # layers x 2 x kv heads x d_head x 2 bytes
    assert t.iloc[1]["KV bytes/token"] == 2 * 1 * 4 * 2 * 2       # K=V: one cached tensor
    at.selectbox(key="res_sort").select("val/loss vs qkv %").run()
    at.toggle(key="res_desc").set_value(True).run()
    t = at.dataframe[0].value
    # Q-K=V MHA: 100 (2.21 - 1.633) / 1.633 = +35%; Q-K=V MQA: 100 (3.2 - 2.9) / 2.9 = +10%; baselines last
    assert list(zip(t["label"], t["sharing"]))[:2] == [("Q-K=V", "MHA"), ("Q-K=V", "MQA")]
    assert t["val/loss vs qkv %"].iloc[0] == pytest.approx(100 * (2.21 - np.mean([1.9, 2.1, 0.9])) / np.mean([1.9, 2.1, 0.9]))
    assert t["val/loss vs qkv %"].iloc[2:].isna().all()
    assert qp(at, "sort") == "val/loss vs qkv %" and qp(at, "desc") == "1"
    assert (qp(at, "stat"), qp(at, "wd"), qp(at, "kvb"), qp(at, "ppl"), qp(at, "task")) == (
        "best", "all", "2", "0", None)                            # language: the default, not written


def test_url_sort_and_switch_values_it_cannot_use_are_named(results_db):
    at = page_test("results", {"metrics": "val/loss", "sort": "nope", "desc": "yes", "ppl": "2"}).run()
    assert not at.exception, at.exception
    notes = [shown(c.value) for c in at.caption if c.value.startswith("Ignored in the URL")]
    assert notes == ["Ignored in the URL: ppl='2' (one of 0, 1).",
                     "Ignored in the URL: sort='nope' (not a column of this table); desc='yes' (one of 0, 1)."]
    assert at.toggle(key="res_ppl").value and not at.toggle(key="res_desc").value


def test_exports_are_markdown_and_latex_booktabs(results_db):
    at = page_test("results", {"ppl": "0", "task": "all"}).run()
    md, tex = (c.value for c in at.code)
    assert md.splitlines()[0] == ("| Task | Variant | Heads | n | val/loss | val/loss vs Q-K-V | KV bytes/token | "
                                  "Attention params |")
    assert "| language | Q-K=V | MHA | 1 | 2.3100 | +10.0% |" in md
    assert "| language | Q-K-V | MHA | 2 | 2.1000 ± 0.1414 |  | 128 | 512 |" in md
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"2.1000 $\pm$ 0.1414" in tex and r"+10.0\%" in tex
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["CSV", "Markdown", "LaTeX (booktabs)"]


@pytest.mark.slow
def test_demo_reproduces_the_shape_of_paper_b_table_4(tmp_path, tmp_path_factory, monkeypatch):
    from tests.demo_db import demo_db

    db = demo_db(tmp_path_factory, tmp_path / "demo.duckdb")
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("results").run()
    assert not at.exception, at.exception
    t = at.dataframe[0].value
    rows = list(zip(t["label"], t["sharing"]))
    # variants x MHA / GQA / MQA, the KV cache halved by K=V and by each halving of the KV heads
    assert rows == [("Q-K-V", "MHA"), ("query-free (W_Q = I)", "MHA"), ("Q=K-V", "MHA"), ("Q-K=V", "MHA"),
                    ("Q=K=V", "MHA"), ("Q-K-V", "GQA-2"), ("query-free (W_Q = I)", "GQA-2"), ("Q-K=V", "GQA-2"),
                    ("Q-K-V", "MQA"), ("query-free (W_Q = I)", "MQA"), ("Q-K=V", "MQA")]
    assert t["KV bytes/token"].tolist() == [2048, 2048, 2048, 1024, 1024, 1024, 1024, 512, 512, 512, 256]
    assert {"val/loss mean", "val/loss std", "val/loss vs qkv %", "exp(val/loss) mean"} <= set(t.columns)
    q = t.iloc[0]                                        # three seeds at wd 0.1 (data/demo/README.md)
    assert q["n runs"] == 3 and q["val/loss mean"] == pytest.approx(np.mean([1.3246, 1.3181, 1.3155]), abs=1e-4)
    assert (t["val/loss vs qkv %"].iloc[1:5] > 0).all()  # every tie costs loss against Q-K-V MHA
    # the vision runs: paper B's six variants at MHA, K=V at GQA-2 and MQA, accuracy higher-is-better
    at = page_test("results", query={"task": "image", "metrics": "val/accuracy"}).run()
    assert not at.exception, at.exception
    v = at.dataframe[0].value
    assert list(zip(v["label"], v["sharing"])) == [
        ("Q-K-V", "MHA"), ("Q=K-V", "MHA"), ("Q-K=V", "MHA"), ("Q=K=V", "MHA"), ("(Q=K-V)+", "MHA"),
        ("(Q=K=V)+", "MHA"), ("Q-K=V", "GQA-2"), ("Q-K=V", "MQA")]
    assert v["KV bytes/token"].tolist() == [1024, 1024, 512, 512, 1024, 512, 256, 128]
    assert (v["val/accuracy mean"] > 0.7).all() and (v["n runs"] == 1).all()


def test_undefined_values_show_a_dash_on_screen_not_none(results_db):
    # the std of a one-run row and the baseline's own % are undefined: NaN in the frame, drawn as the
    # placeholder (Streamlit draws a missing number as a grey "None" without one)
    at = page_test("results", {"task": "all"}).run()
    assert not at.exception, at.exception
    frame, proto = at.dataframe[0].value, at.dataframe[0].proto
    kv = frame[(frame["label"] == "Q-K=V") & (frame["sharing"] == "MHA")].iloc[0]
    assert kv["n runs"] == 1 and math.isnan(kv["val/loss std"])
    assert math.isnan(frame.iloc[0]["val/loss vs qkv %"])                 # Q-K-V itself
    assert proto.placeholder == "\u2014"
    # no column is handed over as text that reads "None" or "nan" either
    text = frame.select_dtypes(exclude="number").astype(str)
    assert not text.isin(["None", "nan", "NaN", "<NA>"]).any().any()


def test_paper_b_qvv3_runs_are_a_row_of_their_own(results_db):
    store = Store(results_db)
    frame = pd.DataFrame({"run_id": 8, "step": [0, 1, 2], "metric": "val/loss", "value": [3.0, 2.6, 2.5],
                          "wall_time": 0.0, "tokens": 0})
    with store.transaction() as con:
        con.execute("INSERT INTO runs (id, name, source, format, variant, n_kv_heads, weight_decay, seed, config) "
                    "VALUES (8, 'vit_s16_imagenet_QVV_3', '/x/q.csv', 'csv_wide', 'k_eq_v', 4, 0.1, 1, ?)",
                    [json.dumps({"n_head": 4, "n_layer": 2, "d_model": 8, "paper_condition": "QVV(3)",
                                 "step_axis": "epoch"})])
        con.register("f", frame)
        con.execute("INSERT INTO points SELECT run_id, step, metric, value, wall_time, tokens FROM f")
        refresh_run_stats(con, [8])
    at = page_test("results").run()
    assert not at.exception, at.exception
    t = at.dataframe[0].value
    assert list(zip(t["label"], t["sharing"], t["n runs"])) == [
        ("Q-K-V", "MHA", 2), ("Q-K=V", "MHA", 1), ("QVV(3)", "MHA", 1), ("Q-K-V", "MQA", 1), ("Q-K=V", "MQA", 1)]
    assert t.iloc[2]["val/loss mean"] == pytest.approx(2.5)
    assert t.iloc[2]["val/loss vs qkv %"] == pytest.approx(100 * (2.5 - 2.1) / 2.1)


def test_paper_b_epoch_csvs_ingest_and_read_as_accuracy_rows(tmp_path, monkeypatch):
    # paper B's checkpoints_imagenet/*.csv in their exact column layout: epoch is the step axis,
    # val_top1 is higher-better (its best is the highest), the file tag gives the variant
    from loaders.logs import ingest_log

    db = tmp_path / "b.duckdb"
    store = Store(db)
    store.migrate()
    head = "epoch,train_loss,val_loss,val_top1,val_top5,epoch_time_sec,lr\n"
    top1 = {"QKV": [0.10, 0.40, 0.35], "Q__K_V": [0.10, 0.30, 0.38], "QVV_3": [0.05, 0.20, 0.25]}
    for tag, accs in top1.items():
        p = tmp_path / "checkpoints_imagenet" / f"vit_s16_imagenet_{tag}.csv"
        p.parent.mkdir(exist_ok=True)
        p.write_text(head + "".join(f"{e},{6 - e:.4f},{5 - e:.4f},{a:.4f},{a + 0.2:.4f},3335.7,0.000125\n"
                                    for e, a in enumerate(accs)))
        ingest_log(store, p)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("results", {"metrics": "val_top1", "stat": "best", "ppl": "0"}).run()
    assert not at.exception, at.exception
    t = at.dataframe[0].value
    assert list(t["label"]) == ["Q-K-V", "Q-K=V", "QVV(3)"]
    assert t["val_top1 mean"].tolist() == pytest.approx([0.40, 0.38, 0.25])       # the highest of each run
    assert t["val_top1 vs qkv %"].tolist()[1:] == pytest.approx([100 * (0.38 - 0.4) / 0.4, 100 * (0.25 - 0.4) / 0.4])
    final = page_test("results", {"metrics": "val_top1", "ppl": "0"}).run().dataframe[0].value
    assert final["val_top1 mean"].tolist() == pytest.approx([0.35, 0.38, 0.25])  # the last epoch's
    from loaders.logs import list_runs

    assert {(r["first_step"], r["last_step"], r["config"]["step_axis"]) for r in list_runs(store)} == {(0, 2, "epoch")}
