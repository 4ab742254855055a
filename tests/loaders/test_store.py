"""The DuckDB store: schema versions, transactions, locking, bad files."""
from __future__ import annotations

import math

import subprocess
import sys
import textwrap
import time

import pytest

from loaders.errors import DatabaseBusyError, StoreError
from loaders.store import _RUN_STATS_SELECT_3, DB_ENV, RUN_STATS_SELECT, SCHEMA_VERSION, Store, default_db_path, refresh_run_stats

#: run_stats' columns as schema 3 made them
STATS_3 = ("run_id, metric, n, n_values, nonfinite, first_step, last_step, final_step, final, best, "
           "best_step")


def test_new_database_gets_current_schema(tmp_path):
    store = Store(tmp_path / "q.duckdb")
    assert store.migrate() == SCHEMA_VERSION
    with store.connect() as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert store.schema_version(con) == SCHEMA_VERSION
    assert {"runs", "points", "ingest_journal", "checkpoints", "analysis_results",
            "analysis_jobs", "run_overrides", "meta"} <= tables


def test_migrate_twice_changes_nothing(tmp_path):
    path = tmp_path / "q.duckdb"
    Store(path).migrate()
    with Store(path).transaction() as con:
        con.execute("INSERT INTO runs (name, source, format) VALUES ('a', 's', 'csv')")
    assert Store(path).migrate() == SCHEMA_VERSION
    with Store(path).connect() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_transaction_rolls_back_everything_on_error(tmp_path):
    store = Store(tmp_path / "q.duckdb")
    with pytest.raises(RuntimeError):
        with store.transaction() as con:
            con.execute("INSERT INTO runs (name, source, format) VALUES ('a', 's', 'csv')")
            con.execute("INSERT INTO points VALUES (1, 0, 'train/loss', 1.0, NULL, NULL)")
            raise RuntimeError("boom")
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM points").fetchone()[0] == 0


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "q.duckdb"
    store = Store(path)
    with store.transaction() as con:
        con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(StoreError) as err:
        Store(path).migrate()
    assert str(err.value) == (f"{path}: database schema version 999 is newer than this qkvscope "
                              f"understands ({SCHEMA_VERSION}); upgrade qkvscope")


def test_not_a_database(tmp_path):
    path = tmp_path / "notes.duckdb"
    path.write_text("these are my notes, not a database\n")
    with pytest.raises(StoreError) as err:
        Store(path).migrate()
    assert str(err.value).startswith(f"{path}: ")


def test_reading_a_missing_database_says_how_to_create_it(tmp_path):
    store = Store(tmp_path / "none.duckdb")
    store._migrated = True  # skip creation: what a read-only caller sees
    with pytest.raises(StoreError) as err:
        with store.connect(read_only=True):
            pass
    assert "python -m app ingest PATH --db" in str(err.value)


def test_busy_database_waits_then_says_so(tmp_path):
    path = tmp_path / "q.duckdb"
    Store(path).migrate()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, sys, time
        con = duckdb.connect({str(path)!r})
        print("locked", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        store = Store(path, busy_timeout=0.5)
        start = time.monotonic()
        with pytest.raises(DatabaseBusyError) as err:
            with store.connect():
                pass
        assert time.monotonic() - start >= 0.5  # it waited before giving up
        assert str(err.value) == (f"{path}: database is busy (another qkvscope process is writing); "
                                  "gave up after 0.5 s, try again when it finishes")
    finally:
        holder.kill()
        holder.wait()


def test_waiting_writer_gets_in_when_the_lock_is_released(tmp_path):
    path = tmp_path / "q.duckdb"
    Store(path).migrate()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, time
        con = duckdb.connect({str(path)!r})
        print("locked", flush=True)
        time.sleep(1.0)
        con.close()
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with Store(path, busy_timeout=20).transaction() as con:
            con.execute("INSERT INTO runs (name, source, format) VALUES ('a', 's', 'csv')")
        with Store(path).connect() as con:
            assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    finally:
        holder.wait()


def test_env_variable_overrides_default(monkeypatch, tmp_path):
    monkeypatch.setenv(DB_ENV, str(tmp_path / "x.duckdb"))
    assert default_db_path() == tmp_path / "x.duckdb"
    assert Store().path == tmp_path / "x.duckdb"


def _old_database(path, schema: int):
    """An open connection to a new file with the schema qkvscope ``schema`` wrote."""
    import duckdb

    from loaders.store import MIGRATIONS

    con = duckdb.connect(str(path))
    for version, statements in MIGRATIONS:
        if version > schema:
            break
        for sql in statements:
            con.execute(sql)
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(schema)])
    return con


def _counting_opens(monkeypatch) -> list[str]:
    """The paths DuckDB is asked to open from now on (``loaders.duck.connect``)."""
    from loaders import duck

    opened = []
    real = duck.connect

    def counting(database=":memory:", **kwargs):
        opened.append(database)
        return real(database, **kwargs)

    monkeypatch.setattr(duck, "connect", counting)
    return opened


def test_a_file_found_current_and_unchanged_is_not_opened_to_check_it_again(tmp_path, monkeypatch):
    """A page's cached read makes a Store per read: only the first checks the schema."""
    path = tmp_path / "q.duckdb"
    Store(path).migrate()
    opened = _counting_opens(monkeypatch)
    assert Store(path).migrate() == SCHEMA_VERSION
    assert opened == []
    with Store(path).connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    assert opened == [str(path)]                      # the read itself, no check before it


@pytest.mark.parametrize("how", ["replaced", "copied over"])
def test_a_file_changed_since_it_was_found_current_is_checked_again(tmp_path, monkeypatch, how):
    """Another file moved or copied over the checked one (an older qkvscope's database): the next
    Store finds the old schema and upgrades it."""
    import os
    import shutil

    path = tmp_path / "q.duckdb"
    Store(path).migrate()
    old = tmp_path / "old.duckdb"
    con = _old_database(old, 2)
    con.execute("INSERT INTO runs (id, name, source, format) VALUES (1, 'a', 's', 'csv')")
    con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (1, 0, 'val/loss', 4.0)")
    con.close()
    if how == "replaced":
        os.replace(old, path)
    else:
        shutil.copyfile(old, path)                    # the same inode, new bytes
    opened = _counting_opens(monkeypatch)
    with Store(path).connect() as con:
        assert Store(path).schema_version(con) == SCHEMA_VERSION
        assert con.execute("SELECT metric, n, final FROM run_stats").fetchall() == [("val/loss", 1, 4.0)]
    assert opened == [str(path), str(path)]           # the check (and upgrade), then the read


def test_upgrade_from_version_2_backfills_run_stats(tmp_path):
    path = tmp_path / "old.duckdb"
    con = _old_database(path, 2)
    con.execute("INSERT INTO runs (id, name, source, format) VALUES (1, 'a', 's', 'csv')")
    con.execute("""INSERT INTO points (run_id, step, metric, value) VALUES
                   (1, 0, 'val/loss', 4.0), (1, 10, 'val/loss', 3.0), (1, 20, 'val/loss', 'inf'),
                   (1, 30, 'val/loss', NULL), (1, 5, 'lr', 0.1)""")
    con.close()
    store = Store(path)
    assert store.migrate() == SCHEMA_VERSION
    with store.connect() as c:
        rows = c.execute("SELECT metric, n, n_values, nonfinite, first_step, last_step, final_step, final, "
                         "best, best_step FROM run_stats ORDER BY metric").fetchall()
    assert rows == [("lr", 1, 1, 0, 5, 5, 5, 0.1, 0.1, 5),
                    ("val/loss", 4, 3, 1, 0, 30, 10, 3.0, 3.0, 10)]


def test_upgrade_from_version_6_keeps_points_behind_the_view(tmp_path):
    """Schema 7 renames the points table and puts a view of that name over it
    and a new lean table: what was stored reads as before, times included."""
    from loaders.logs import ingest_log

    path = tmp_path / "old.duckdb"
    con = _old_database(path, 6)
    new_run = "INSERT INTO runs (name, source, format) VALUES ('a', 's', 'csv') RETURNING id"
    assert con.execute(new_run).fetchone() == (1,)
    stored = [(1, 0, "val/loss", 4.0, 0.5, None), (1, 10, "val/loss", 3.0, 9.5, 640),
              (1, 5, "lr", 0.1, None, 320)]
    con.executemany("INSERT INTO points VALUES (?, ?, ?, ?, ?, ?)", stored)
    con.execute("INSERT INTO run_stats " + _RUN_STATS_SELECT_3.format(where=""))     # as schema 6 kept it
    before = con.execute(f"SELECT {STATS_3} FROM run_stats ORDER BY metric").fetchall()
    con.close()
    store = Store(path)
    assert store.migrate() == SCHEMA_VERSION
    with store.connect() as c:
        assert c.execute("SELECT * FROM points ORDER BY step").fetchall() == sorted(stored, key=lambda r: r[1])
        assert c.execute(f"SELECT {STATS_3} FROM run_stats ORDER BY metric").fetchall() == before
    log = tmp_path / "new" / "log.csv"
    log.parent.mkdir()
    log.write_text("step,val_loss\n0,2\n")
    ingest_log(store, log)
    with store.connect() as c:
        assert c.execute("SELECT count(*), count(wall_time) FROM points").fetchone() == (4, 2)


def test_upgrade_from_version_10_keeps_every_point_in_one_table(tmp_path):
    """Schema 11 moves the points of points_lean into points_full, after its own rows (of a step
    stored in both, the lean row stays the later one), and names the table points again."""
    from loaders.curves import metric_curves

    path = tmp_path / "old.duckdb"
    con = _old_database(path, 10)
    con.execute("INSERT INTO runs (id, name, source, format) VALUES (1, 'a', 's', 'csv'), (2, 'b', 't', 'csv')")
    con.execute("""INSERT INTO points_full VALUES (1, 0, 'val/loss', 4.0, 0.5, 64), (1, 10, 'val/loss', 3.0, 9.5, 640),
                                                 (2, 0, 'val/loss', 9.0, 1.0, NULL)""")
    con.execute("""INSERT INTO points_lean VALUES (2, 0, 'val/loss', 8.0), (2, 5, 'val/loss', NULL),
                                                 (2, 7, 'lr', 0.1)""")
    con.execute("INSERT INTO run_stats " + RUN_STATS_SELECT.format(where=""))
    before = con.execute("SELECT * FROM run_stats ORDER BY ALL").fetchall()
    con.close()
    store = Store(path)
    assert store.migrate() == SCHEMA_VERSION
    with store.connect() as c:
        assert c.execute("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'points%'").fetchall() == [
            ("points",)]
        assert c.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()[0] == 0
        assert c.execute("SELECT * FROM points ORDER BY rowid").fetchall() == [
            (1, 0, "val/loss", 4.0, 0.5, 64), (1, 10, "val/loss", 3.0, 9.5, 640), (2, 0, "val/loss", 9.0, 1.0, None),
            (2, 0, "val/loss", 8.0, None, None), (2, 5, "val/loss", None, None, None), (2, 7, "lr", 0.1, None, None)]
        assert c.execute("SELECT * FROM run_stats ORDER BY ALL").fetchall() == before
    got = {r: v.tolist() for r, v in metric_curves(store, "val/loss")}       # step 0 of run 2: the later row
    assert got[1] == [4.0, 3.0] and got[2][0] == 8.0 and math.isnan(got[2][1]) and len(got[2]) == 2


def test_upgrade_from_version_7_adds_each_runs_highest_value(tmp_path):
    """Schema 8 rebuilds run_stats from the points with the highest finite value and its step
    (an accuracy's best), what was there before unchanged; ingest keeps them after."""
    from loaders.logs import ingest_log

    path = tmp_path / "old.duckdb"
    con = _old_database(path, 7)
    assert con.execute("INSERT INTO runs (name, source, format) VALUES ('a', 's', 'csv') RETURNING id").fetchone() == (1,)
    con.execute("""INSERT INTO points_lean (run_id, step, metric, value) VALUES
                   (1, 0, 'val/acc', 0.2), (1, 10, 'val/acc', 0.7), (1, 20, 'val/acc', 'inf'),
                   (1, 30, 'val/acc', 0.6), (1, 40, 'val/acc', NULL), (1, 5, 'lr', 0.1)""")
    con.execute("INSERT INTO run_stats " + _RUN_STATS_SELECT_3.format(where=""))
    before = con.execute(f"SELECT {STATS_3} FROM run_stats ORDER BY metric").fetchall()
    con.close()
    store = Store(path)
    assert store.migrate() == SCHEMA_VERSION
    with store.connect() as c:
        assert c.execute(f"SELECT {STATS_3} FROM run_stats ORDER BY metric").fetchall() == before
        assert c.execute("SELECT metric, top, top_step FROM run_stats ORDER BY metric").fetchall() == [
            ("lr", 0.1, 5), ("val/acc", 0.7, 10)]
    log = tmp_path / "new" / "log.csv"
    log.parent.mkdir()
    log.write_text("step,val_acc\n0,0.5\n10,0.9\n20,0.8\n")
    ingest_log(store, log)
    with store.connect() as c:
        assert c.execute("SELECT top, top_step, best, best_step FROM run_stats WHERE run_id = 2").fetchall() == [
            (0.9, 10, 0.5, 0)]


def test_run_stats_follow_ingest_growth_and_resume(tmp_path):
    from loaders.logs import ingest_log, list_runs

    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text("".join(f'{{"step": {s}, "train_loss": {4 - s / 10}}}\n' for s in range(5)))
    store = Store(tmp_path / "q.duckdb")
    ingest_log(store, log)
    with log.open("a") as fh:  # grows, then resumes from step 3 with new values
        fh.write("".join(f'{{"step": {s}, "train_loss": {9 - s / 10}}}\n' for s in range(3, 8)))
    ingest_log(store, log)
    with store.connect() as c:
        direct = c.execute("SELECT count(*), min(step), max(step), arg_max(value, step), min(value) "
                           "FROM points WHERE metric = 'train/loss'").fetchone()
        stats = c.execute("SELECT n, first_step, last_step, final, best FROM run_stats "
                          "WHERE metric = 'train/loss'").fetchone()
    assert stats == direct == (8, 0, 7, 8.3, 3.8)
    [run] = list_runs(store)
    assert (run["n_points"], run["first_step"], run["last_step"]) == (8, 0, 7)


def _run_stats_reference(rows):
    """run_stats computed in Python from (run_id, step, metric, value) rows."""
    import math
    out = {}
    for run_id, metric in sorted({(r[0], r[2]) for r in rows}):
        pts = [(s, v) for (r, s, m, v) in rows if (r, m) == (run_id, metric)]
        fin = [(s, v) for s, v in pts if v is not None and math.isfinite(v)]
        final_step = max((s for s, _ in fin), default=None)
        best = min((v for _, v in fin), default=None)
        top = max((v for _, v in fin), default=None)
        out[(run_id, metric)] = (
            len(pts), sum(v is not None for _, v in pts),
            sum(v is not None and not math.isfinite(v) for _, v in pts),
            min(s for s, _ in pts), max(s for s, _ in pts), final_step,
            next((v for s, v in fin if s == final_step), None), best,
            next((s for s, v in fin if v == best), None), top,
            next((s for s, v in fin if v == top), None))
    return out


@pytest.mark.parametrize("ids", [[1], [1, 2], [2]])
def test_run_stats_equal_a_per_point_reference_with_nan_inf_and_null(tmp_path, ids):
    # NaN can reach points from a frame written by hand (ingest stores NULL): it
    # counts as a value and as non-finite, as +-Inf do; none is final or best.
    nan, inf = float("nan"), float("inf")
    rows = [(1, 0, "loss", 4.0), (1, 10, "loss", 3.0), (1, 20, "loss", inf), (1, 30, "loss", None),
            (1, 40, "loss", nan), (1, 5, "lr", 0.1), (1, 6, "lr", -inf),
            (2, 0, "loss", nan), (2, 1, "loss", inf), (2, 2, "loss", None),   # nothing finite
            (2, 3, "acc", -1.5), (2, 9, "acc", -2.5), (2, 7, "acc", -2.5)]    # best reached twice
    store = Store(tmp_path / "q.duckdb")
    store.migrate()
    with store.transaction() as con:
        con.executemany("INSERT INTO points (run_id, step, metric, value) VALUES (?, ?, ?, ?)", rows)
        refresh_run_stats(con, ids)
        got = con.execute("SELECT run_id, metric, n, n_values, nonfinite, first_step, last_step, final_step, "
                          "final, best, best_step, top, top_step FROM run_stats").fetchall()
    ref = {k: v for k, v in _run_stats_reference(rows).items() if k[0] in ids}
    got = {(r[0], r[1]): tuple(r[2:]) for r in got}
    assert set(got) == set(ref)
    for key, want in ref.items():
        if key == (2, "acc"):        # two points hold the lowest value: either step is right
            assert got[key][:8] == want[:8] and got[key][8] in (7, 9) and got[key][9:] == (-1.5, 3)
        else:
            assert got[key] == want, key
    if ids == [1]:
        assert got[(1, "loss")] == (5, 4, 2, 0, 40, 10, 3.0, 3.0, 10, 4.0, 0)
        assert got[(1, "lr")] == (2, 2, 1, 5, 6, 5, 0.1, 0.1, 5, 0.1, 5)
