"""Overview: how many runs of each task (language, image) the database holds."""
from __future__ import annotations

import pandas as pd

from app.pages.overview import task_counts
from loaders.store import Store
from tests.app.apptest import page_test


def test_task_counts_text():
    runs = pd.DataFrame({"task": ["language", "image", "image", "language", "language"]})
    assert task_counts(runs) == "3 language runs, 2 image runs"
    assert task_counts(pd.DataFrame({"task": ["image"]})) == "1 image run"


def test_overview_says_how_many_runs_of_each_task(tmp_path, monkeypatch):
    db = tmp_path / "o.duckdb"
    store = Store(db)
    store.migrate()
    with store.transaction() as con:
        for rid, cfg in ((1, "{}"), (2, '{"task": "image"}'), (3, '{"task": "image"}')):
            con.execute("INSERT INTO runs (id, name, source, format, variant, config) VALUES (?, ?, ?, 'jsonl', 'qkv', ?)",
                        [rid, f"r{rid}", f"/s/{rid}", cfg])
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("overview").run()
    assert not at.exception, at.exception
    assert "1 language run, 2 image runs" in [c.value for c in at.caption]
    assert at.dataframe[0].value.to_dict("records") == [{"project": "(no project)", "runs": 3, "checkpoints": 0}]
    assert at.dataframe[1].value["task"].tolist() == ["language", "image", "image"]
