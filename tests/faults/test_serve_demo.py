"""``serve`` builds the demo into a default database that is missing or empty."""
from __future__ import annotations

from loaders.queries import summary
from loaders.store import Store

from app.commands import serve


def _tiny_demo(root):
    run = root / "demo" / "run_a"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,train_loss\n0,2.5\n1,2.4\n")
    return root / "demo"


def test_an_empty_database_gets_the_demo_and_a_full_one_is_left_alone(tmp_path, monkeypatch):
    import app.paths

    monkeypatch.setattr(app.paths, "DEMO_DIR", _tiny_demo(tmp_path))
    db = tmp_path / "qkvscope.duckdb"
    Store(db).migrate()                                   # exists, holds nothing (a first start that died)
    assert db.exists() and serve.is_empty(db)
    serve.ensure_demo(db, quiet=True)
    assert summary(Store(db))["runs"] == 1
    assert not serve.is_empty(db)
    before = db.read_bytes()
    serve.ensure_demo(db, quiet=True)                     # not empty: nothing ingested again
    assert db.read_bytes() == before


def test_a_missing_database_gets_the_demo_and_an_unreadable_one_is_not_touched(tmp_path, monkeypatch):
    import app.paths

    monkeypatch.setattr(app.paths, "DEMO_DIR", _tiny_demo(tmp_path))
    db = tmp_path / "new.duckdb"
    serve.ensure_demo(db, quiet=True)
    assert summary(Store(db))["runs"] == 1
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database" * 100)
    assert not serve.is_empty(junk)
    serve.ensure_demo(junk, quiet=True)
    assert junk.read_bytes() == b"not a database" * 100


def test_first_start_says_what_was_skipped():
    from app.commands.serve import skipped_lines

    report = {"files": [{"status": "added", "reason": None},
                        {"status": "skipped", "reason": "configuration file: read as metadata of the run beside it"},
                        {"status": "skipped", "reason": "configuration file: read as metadata of the run beside it"},
                        {"status": "skipped", "reason": "not a checkpoint or a log"}]}
    assert skipped_lines(report) == ["  2 skipped: configuration file: read as metadata of the run beside it",
                                     "  1 skipped: not a checkpoint or a log"]
