"""loaders.papers: what the Papers page compares (vision runs stay out of the language claims)."""
from __future__ import annotations

import pandas as pd

from loaders import papers
from loaders.store import Store, refresh_run_stats


def _store(tmp_path) -> Store:
    store = Store(tmp_path / "p.duckdb")
    store.migrate()
    runs = [(1, "qkv", '{"n_head": 4}'), (2, "qkv", '{"n_head": 4, "task": "image"}'),
            (3, "k_eq_v", '{"n_head": 4, "task": "language"}')]
    with store.transaction() as con:
        for rid, variant, config in runs:
            con.execute("INSERT INTO runs (id, name, source, format, variant, n_kv_heads, weight_decay, config) "
                        "VALUES (?, ?, ?, 'jsonl', ?, 4, 0.1, ?)", [rid, f"r{rid}", f"/s/{rid}", variant, config])
            con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                        "n_kv_heads, d_model, d_head, attn_scale, run_id, step) "
                        "VALUES (?, 'gone', ?, 'qkvscope', ?, 1, 4, 4, 64, 16, 0.25, ?, 100)",
                        [rid, f"s{rid}", variant, rid])
        con.register("p", pd.DataFrame([(rid, 100, "val/loss", 1.0 + rid / 10) for rid, _, _ in runs],
                                       columns=["run_id", "step", "metric", "value"]))
        con.execute("INSERT INTO points (run_id, step, metric, value) SELECT * FROM p")
        refresh_run_stats(con, [1, 2, 3])
    return store


def test_vision_runs_and_their_checkpoints_are_left_out(tmp_path):
    store = _store(tmp_path)
    assert papers.runs_with_finals(store)["run_id"].tolist() == [1, 3]
    assert papers.compared_checkpoints(store, "all")["id"].tolist() == [1, 3]
    assert papers.compared_checkpoints(store, "latest")["id"].tolist() == [1, 3]
