"""Logs that are legal but nasty: NaN/Inf values, steps that go back, a CSV
with 10,000 columns; and how ingest names text logs it cannot read."""
from __future__ import annotations

import math

import pytest

from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.hostile.corpus import LOG_EXPECTED


def points(store, run_name):
    with store.connect(read_only=True) as con:
        return con.execute(
            """SELECT p.step, p.metric, p.value FROM points p JOIN runs r ON r.id = p.run_id
               WHERE r.name = ? ORDER BY p.step, p.metric""", [run_name]).fetchall()


@pytest.mark.parametrize("name, text", [
    ("nan_long.csv", "step,metric,value\n0,train_loss,nan\n1,train_loss,inf\n2,train_loss,-inf\n"
                     "3,train_loss,NaN\n4,train_loss,1.5\n"),
    ("nan_wide.csv", "step,train_loss\n0,nan\n1,inf\n2,-inf\n3,NaN\n4,1.5\n"),
    ("nan.jsonl", '{"step": 0, "loss": NaN}\n{"step": 1, "loss": Infinity}\n{"step": 2, "loss": -Infinity}\n'
                  '{"step": 3, "loss": NaN}\n{"step": 4, "loss": 1.5}\n'),
])
def test_nan_is_stored_as_null_and_inf_as_inf(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    store = Store(tmp_path / "db.duckdb")
    [f] = ingest_paths(store, [p]).files
    assert (f.status, f.n_points) == ("added", 5)
    got = points(store, p.stem)
    assert got == [(0, "train/loss", None), (1, "train/loss", math.inf), (2, "train/loss", -math.inf),
                   (3, "train/loss", None), (4, "train/loss", 1.5)]


def test_steps_that_go_back_are_one_resumed_run_and_the_last_value_wins(tmp_path):
    p = tmp_path / "resumed.csv"
    p.write_text("step,metric,value\n0,train_loss,3\n1,train_loss,2\n2,train_loss,1\n"
                 "1,train_loss,9\n2,train_loss,8\n3,train_loss,7\n")
    store = Store(tmp_path / "db.duckdb")
    [f] = ingest_paths(store, [p]).files
    assert (f.status, f.n_points) == ("added", 4)
    assert points(store, "resumed") == [(0, "train/loss", 3.0), (1, "train/loss", 9.0),
                                        (2, "train/loss", 8.0), (3, "train/loss", 7.0)]
    with store.connect(read_only=True) as con:
        assert con.execute("SELECT resumed FROM runs WHERE name = 'resumed'").fetchall() == [(True,)]


@pytest.mark.slow
def test_a_csv_with_10000_columns(tmp_path):
    """5 rows x 9,999 metrics: stored whole (about 6 s on 2 cores, most of it
    DuckDB binding 10,000 columns)."""
    p = tmp_path / "wide.csv"
    with open(p, "w") as f:
        f.write("step," + ",".join(f"m{i}" for i in range(9999)) + "\n")
        for s in range(5):
            f.write(f"{s}," + ",".join(str(s + i / 8) for i in range(9999)) + "\n")
    store = Store(tmp_path / "db.duckdb")
    [f] = ingest_paths(store, [p]).files
    assert (f.status, f.format, f.n_points) == ("added", "csv_wide", 5 * 9999)
    with store.connect(read_only=True) as con:
        assert con.execute("SELECT count(DISTINCT metric), sum(value) FROM points").fetchone() == (
            9999, sum(s + i / 8 for s in range(5) for i in range(9999)))


def test_text_logs_that_cannot_be_read_say_why(tmp_path):
    """Before: every one of these was skipped as 'not a checkpoint or a training
    log qkvscope reads'. A log that is not UTF-8 is now an error with the byte;
    other unreadable text logs are skipped with the log readers' reason."""
    (tmp_path / "bad.jsonl").write_bytes(b'{"step": 1, "loss": 2.0}\n{"note": "\xff"}\n')
    (tmp_path / "notes.txt").write_text("remember to buy milk\n")
    (tmp_path / "README").write_text("hello\n")
    report = ingest_paths(Store(tmp_path / "db.duckdb"), [tmp_path])
    got = {f.path.rsplit("/", 1)[1]: (f.kind, f.status, f.reason) for f in report.files}
    assert got == {
        "bad.jsonl": ("log", "error", f"{tmp_path / 'bad.jsonl'}: expected UTF-8 text, found byte 0xff at "
                                      f"offset 35 that is not valid UTF-8"),
        "notes.txt": ("unknown", "skipped", f"not a training log qkvscope reads: {LOG_EXPECTED}; found text "
                                            f"whose first line is 'remember to buy milk'"),
        "README": ("unknown", "skipped", "not a checkpoint or a training log qkvscope reads"),
    }
