"""Every registered page runs without exception on an empty database and a filled one."""
from __future__ import annotations

import pytest
import torch

from app.pages import page_modules
from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.app.apptest import page_test

PAGES = [m.__name__.rsplit(".", 1)[-1] for m in page_modules()]


@pytest.fixture(scope="module")
def filled_db(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("filled")
    runs = root / "runs" / "gpt2-wd0.1"
    runs.mkdir(parents=True)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64,
                               n_positions=64)).save_pretrained(runs / "final")
    lines = ["step,train_loss,val_loss"] + [f"{s},{4 - s / 100:.3f},{4.2 - s / 100:.3f}" for s in range(0, 300, 10)]
    (runs / "metrics.csv").write_text("\n".join(lines) + "\n")
    db = root / "filled.duckdb"
    ingest_paths(Store(db), [root / "runs"])
    return db


def test_registry_is_ordered_and_complete():
    assert PAGES[0] == "overview"
    assert "sql" in PAGES
    for mod in page_modules():
        assert mod.TITLE and mod.URL_PATH and mod.ICON.startswith(":material/")


@pytest.mark.parametrize("name", PAGES)
def test_page_runs_on_empty_database(name, empty_db):
    at = page_test(name).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


@pytest.mark.parametrize("name", PAGES)
def test_page_runs_on_filled_database(name, filled_db, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(filled_db))
    at = page_test(name).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def test_overview_shows_counts_and_empty_state_and_its_ingest_form_reports_skips(empty_db, tmp_path):
    folder = tmp_path / "stuff"
    folder.mkdir()
    (folder / "readme.txt").write_text("nothing to see\n")
    at = page_test("overview").run()
    labels = {m.label: m.value for m in at.metric}
    assert labels["Runs"] == "0" and labels["Checkpoints"] == "0"
    assert any("The database is empty" in i.value for i in at.info)
    at.text_input[0].input(str(folder))
    at.button[0].click().run()
    assert not at.exception
    assert any("0 added" in s.value and "1 skipped" in s.value for s in at.success)
    assert at.query_params["path"] == [str(folder)] or at.query_params["path"] == str(folder)


def test_overview_counters_and_demo_notice_follow_an_ingest_at_once(tmp_path, monkeypatch):
    """Issue 17 item 6: the counters and the demo notice are drawn from the database after the form ran."""
    from app.paths import DEMO_DIR

    db = tmp_path / "demo-then-own.duckdb"
    assert ingest_paths(Store(db), [DEMO_DIR / "qkv-mha-wd0" / "metrics.jsonl"]).to_json()["errors"] == 0
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    own = tmp_path / "own-run"
    own.mkdir()
    (own / "metrics.csv").write_text("step,train_loss\n0,4\n10,3.5\n20,3.25\n")
    at = page_test("overview").run()
    assert {m.label: m.value for m in at.metric}["Runs"] == "1"
    assert any("bundled demo" in i.value for i in at.info)
    at.text_input[0].input(str(own))
    at.button[0].click().run()
    assert not at.exception, at.exception
    counts = {m.label: m.value for m in at.metric}
    assert counts["Runs"] == "2" and counts["Logged points"] != "0"
    assert not any("bundled demo" in i.value for i in at.info)   # no longer demo only


def test_cached_readers_read_the_database_they_are_given(filled_db, empty_db):
    """Issue 18 item 7: a cached reader opens its ``db`` argument, not whatever $QKVSCOPE_DB says
    (``empty_db`` sets it to an empty file)."""
    from app import state

    version = state.data_version(Store(filled_db))
    assert len(state.checkpoints_frame(str(filled_db), version)) == 1
    assert state.summary(str(filled_db), version)["runs"] == 1
    assert len(state.checkpoint_choices(str(filled_db), version)) == 1
    assert state.summary(str(empty_db), state.data_version(Store(empty_db)))["runs"] == 0
    assert len(version) == 4 and version[1] == filled_db.stat().st_size
