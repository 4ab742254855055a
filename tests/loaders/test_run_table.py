"""loaders.run_table: the one runs reader of the Experiments, Results and Weight decay pages."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from loaders.run_table import run_facts, run_table
from loaders.store import Store


def test_run_facts_read_nested_configs_and_default_the_task():
    f = run_facts({"files": {"config.json": {"n_layer": 4, "n_head": 4, "n_kv_heads": 1, "d_model": 64}}})
    assert f == {"n_heads": 4, "n_kv_heads": 1, "n_layers": 4, "d_model": 64, "d_head": 16, "task": "language"}
    g = run_facts({"model_config": {"n_head": 8, "n_layer": 2, "n_embd": 128}, "task": "vision"})
    assert (g["n_heads"], g["n_kv_heads"], g["d_head"], g["task"]) == (8, 8, 16, "vision")
    assert run_facts(None)["task"] == "language"


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "runs.duckdb")
    s.migrate()
    rows = [  # id, name, variant, n_kv_heads column, config
        (1, "lm", "qkv", None, {"n_head": 4, "n_kv_heads": 2, "n_layer": 2, "d_model": 8}),
        (2, "vit", "k_eq_v", 1, {"task": "image", "n_head": 4, "n_kv_heads": 4, "n_layer": 2, "d_model": 16}),
        (3, "vit_s16_imagenet_QVV_3", "k_eq_v", None, {"step_axis": "epoch", "paper_condition": "QVV(3)"}),
    ]
    with s.transaction() as con:
        for rid, name, variant, kv, cfg in rows:
            con.execute("INSERT INTO runs (id, name, source, format, variant, n_kv_heads, config) "
                        "VALUES (?, ?, ?, 'csv', ?, ?, ?)", [rid, name, f"/x/{name}", variant, kv, json.dumps(cfg)])
        # run 2's checkpoint: its geometry wins over the config's
        con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, n_kv_heads, "
                    "d_model, d_head, dtype, params_attention, kv_bytes_per_token, run_id, step) VALUES "
                    "(1, 'p', 's1', 'qkvscope', 'k_eq_v', 3, 4, 1, 16, 4, 'float32', 768, 48, 2, 200)")
    return s


def test_run_table_adds_task_geometry_and_condition(store):
    t = run_table(store).set_index("id")
    assert list(t["task"]) == ["language", "image", "language"]
    assert t["n_heads"].tolist()[:2] == [4, 4] and pd.isna(t.loc[3, "n_heads"])
    # the run's own n_kv_heads (run 2: 1) wins over its config's (4); run 1 has none: its config's
    assert t.loc[1, "n_kv_heads"] == 2 and t.loc[2, "n_kv_heads"] == 1
    assert (t.loc[1, "d_head"], t.loc[2, "n_layers"]) == (2, 2)
    assert t["condition"].isna().tolist() == [True, True, False] and t.loc[3, "condition"] == "QVV(3)"
    assert "config" in t.columns and "dtype" not in t.columns


def test_run_table_with_geometry_takes_the_latest_checkpoint(store):
    t = run_table(store, geometry=True).set_index("id")
    assert (t.loc[2, "n_layers"], t.loc[2, "d_head"], t.loc[2, "dtype"], t.loc[2, "kv_bytes_per_token"]) == (
        3, 4, "float32", 48)
    assert t.loc[1, "n_layers"] == 2 and pd.isna(t.loc[1, "dtype"])    # no checkpoint: the config's


def test_run_table_of_an_empty_store_has_the_columns(tmp_path):
    s = Store(tmp_path / "empty.duckdb")
    s.migrate()
    t = run_table(s, geometry=True)
    assert t.empty and {"id", "variant", "task", "n_heads", "condition", "dtype"} <= set(t.columns)
