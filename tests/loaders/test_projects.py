"""Projects: the default (the folder ingested), a tracker's own name, ``--project``, corrections,
the schema upgrade, and the counts the Overview lists; on real logs of several projects."""
from __future__ import annotations

import json

import duckdb
import pytest

from loaders.errors import QkvscopeError
from loaders.ingest import ingest_paths
from loaders.logs import list_runs, set_run_metadata
from loaders.projects import NO_PROJECT, default_project, project_counts
from loaders.store import MIGRATIONS, Store
from tests.projects_db import REAL_LOGS, build_projects, write_lightning


@pytest.fixture(scope="module")
def projects_store(tmp_path_factory):
    return Store(build_projects(tmp_path_factory, tmp_path_factory.mktemp("pj") / "projects.duckdb"))


def _by_name(store):
    out: dict[str, list[str]] = {}
    for r in list_runs(store):
        out.setdefault(r["name"], []).append(r["project"])
    return out


def test_each_ingested_folder_is_a_project(projects_store):
    counts = {c["project"]: (c["runs"], c["checkpoints"]) for c in project_counts(projects_store)}
    assert counts == {"carry-sweep": (1, 0), "demo": (47, 55), "hf-trainer": (1, 0), "llmc": (1, 0),
                      "sweep-a": (3, 0), "sweep-b": (1, 0), "tensorboard": (1, 0)}
    names = _by_name(projects_store)
    # two folders' runs of one name stay in their own projects
    assert sorted(names["GPT8L8H"]) == ["carry-sweep", "tensorboard"]
    assert sorted(names["lightning_logs/version_0"]) == ["sweep-a", "sweep-b"]
    with projects_store.connect() as con:
        assert con.execute("SELECT DISTINCT project FROM checkpoints").fetchall() == [("demo",)]


def test_default_project_is_the_folder_or_the_files_folder(tmp_path):
    assert default_project(REAL_LOGS / "llmc") == "llmc"
    assert default_project(REAL_LOGS / "llmc" / "llmc-adamw-f66d43d7.log") == "llmc"


def test_project_option_moves_what_was_stored_and_a_correction_wins(tmp_path):
    store = Store(tmp_path / "db.duckdb")
    write_lightning(tmp_path / "grid" / "lightning_logs" / "version_0", {"weight_decay": 0.1}, [2.0, 1.5])
    ingest_paths(store, [tmp_path / "grid"])
    [run] = list_runs(store)
    assert run["project"] == "grid"
    report = ingest_paths(store, [tmp_path / "grid"], project="lr-sweep")
    assert [f.status for f in report.files if f.kind == "log"] == ["unchanged"]
    assert list_runs(store)[0]["project"] == "lr-sweep"
    set_run_metadata(store, run["id"], project="mine")
    ingest_paths(store, [tmp_path / "grid"], project="other")
    assert list_runs(store)[0]["project"] == "mine"          # the user's correction survives
    with pytest.raises(QkvscopeError) as err:
        set_run_metadata(store, run["id"], project=" ")
    assert str(err.value) == f"run {run['id']}: project must be a name, found ' '"
    with pytest.raises(QkvscopeError) as err:
        ingest_paths(store, [tmp_path / "grid"], project="")
    assert str(err.value) == "project name must not be empty, found ''"


def test_a_trackers_own_project_name_wins_over_the_folder(tmp_path, monkeypatch):
    from loaders.logs.readers import lightning

    real_read = lightning.read

    def read(path, **kw):          # a tracker that names its project (RunData.meta["project"])
        parsed = real_read(path, **kw)
        for run in parsed.runs:
            run.meta["project"] = "optuna-study"
        return parsed

    monkeypatch.setattr(lightning, "read", read)
    store = Store(tmp_path / "db.duckdb")
    write_lightning(tmp_path / "folder" / "lightning_logs" / "version_0", {"weight_decay": 0.1}, [2.0])
    ingest_paths(store, [tmp_path / "folder"])
    assert list_runs(store)[0]["project"] == "optuna-study"
    ingest_paths(store, [tmp_path / "folder"], project="named")
    assert list_runs(store)[0]["project"] == "named"


def test_upgrade_gives_stored_rows_the_folder_above_their_run(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    for version, statements in MIGRATIONS:
        if version > 8:
            break
        for sql in statements:
            con.execute(sql)
    con.execute("INSERT INTO meta VALUES ('schema_version', '8')")
    con.execute("INSERT INTO runs (id, name, source, format) VALUES "
                "(1, 'r', '/home/me/nanogpt-grid/wd0.1/metrics.jsonl', 'jsonl')")
    con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, n_kv_heads, "
                "d_model, d_head, run_id) VALUES (1, '/home/me/nanogpt-grid/wd0.1/ckpt.pt', 'a', 'nanogpt', "
                "'qkv', 1, 1, 1, 8, 8, 1), (2, '/tmp/up/model.safetensors', 'b', 'gpt2', 'qkv', 1, 1, 1, 8, 8, NULL)")
    con.close()
    store = Store(path)
    assert [r["project"] for r in list_runs(store)] == ["nanogpt-grid"]
    assert [c["project"] for c in store.checkpoints()] == ["nanogpt-grid", "up"]


def test_counts_name_rows_without_a_project(tmp_path):
    store = Store(tmp_path / "db.duckdb")
    with store.transaction() as con:
        con.execute("INSERT INTO runs (name, source, format, config) VALUES ('r', '/x/r.csv', 'csv', ?)",
                    [json.dumps({})])
    assert project_counts(store) == [{"project": NO_PROJECT, "runs": 1, "checkpoints": 0}]
