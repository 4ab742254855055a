"""The one staleness rule of stored analysis jobs (``loaders.results.current_job`` / ``current_notes``)."""
from __future__ import annotations

import json

import pytest

from loaders.results import current_job, current_notes
from loaders.store import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "j.duckdb")
    s.migrate()
    with s.transaction() as con:
        con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version, notes, sample) VALUES "
                    "(1, 'weights', 1, '{\"wq_absorb_error\": \"model uses layernorm\"}', NULL), "
                    "(1, 'activations', 1, '{}', ?)", [json.dumps({"text": "corpus", "tokens": 4096})])
        con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, metric_version) "
                    "VALUES (1, 0, 0, 'kv_cka', 0.5, 1), (1, 0, 0, 'kv_cka_act', 0.4, 1)")
    return s


def test_current_notes_need_every_kind_at_this_version(store):
    wanted = {"weights": ["kv_cka", "wq_absorb_error"]}
    assert current_notes(store, 1, wanted, 1) == {"wq_absorb_error": "model uses layernorm"}
    assert current_notes(store, 1, wanted, 2) is None                       # another metric version
    assert current_notes(store, 2, wanted, 1) is None                       # never analysed
    both = {**wanted, "activations": ["kv_cka_act"]}
    assert current_notes(store, 1, both, 1) == {"wq_absorb_error": "model uses layernorm"}


def test_a_metric_with_neither_rows_nor_a_note_makes_a_job_stale(store):
    """A metric registered after the job was stored (a plugin switched on) has no row and no note."""
    assert current_notes(store, 1, {"weights": ["kv_cka", "late_plugin"]}, 1) is None
    assert current_job(store, checkpoint_id=1, kind="weights", metrics=["kv_cka", "late_plugin"],
                       metric_version=1) is None
    job = current_job(store, checkpoint_id=1, kind="weights", metrics=["kv_cka"], metric_version=1)
    assert job is not None and job.rows["metric"].tolist() == ["kv_cka"] and job.rows["value"].tolist() == [0.5]
    light = current_job(store, checkpoint_id=1, kind="weights", metrics=["kv_cka"], metric_version=1, rows=False)
    assert light is not None and light.rows.empty and light.notes == {"wq_absorb_error": "model uses layernorm"}


def test_an_activation_job_of_another_sample_is_stale_only_when_a_sample_is_asked_for(store):
    args = dict(checkpoint_id=1, kind="activations", metrics=["kv_cka_act"], metric_version=1)
    assert current_job(store, **args) is not None
    assert current_job(store, **args, sample={"text": "corpus", "tokens": 4096}) is not None
    assert current_job(store, **args, sample={"text": "corpus", "tokens": 8192}) is None
