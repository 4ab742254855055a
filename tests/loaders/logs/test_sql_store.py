"""The store step's SQL path: a CSV is read by DuckDB's read_csv
straight into ``points``, then checked there (names, resumes, repeats)."""
from __future__ import annotations

import numpy as np
import pytest

from loaders.errors import LogFormatError
from loaders.logs import detect_log, ingest_log, list_runs
from loaders.logs.readers._csv import column_names
from loaders.logs.newpoints import went_back_and_repeats
from loaders.store import Store
from tests.loaders.logs.helpers import count_points, points, write


def metrics(store: Store, run_id: int) -> list[str]:
    with store.connect() as con:
        return [r[0] for r in con.execute("SELECT DISTINCT metric FROM points WHERE run_id = ? ORDER BY 1",
                                          [run_id]).fetchall()]


# -- the order check, on its own ------------------------------------------------------------------
@pytest.mark.parametrize("steps, codes, expected", [
    ([], None, (False, False)),
    ([5], [0], (False, False)),
    ([0, 1, 2], None, (False, False)),
    ([0, 1, 1], None, (False, True)),
    ([0, 2, 1], None, (True, False)),
    ([0, 0, 1, 1], [0, 1, 0, 1], (False, False)),            # long layout, two metrics per step
    ([0, 0, 1, 1], [1, 0, 0, 1], (False, False)),            # their order within a step varies
    ([0, 0, 0, 1], [0, 1, 0, 1], (False, True)),             # metric 0 twice at step 0
    ([0, 1, 2, 1, 2, 3], [0, 0, 0, 0, 0, 0], (True, False)), # a resumed run (then deduplicated anyway)
    ([0, 5, 3, 9], [0, 1, 0, 1], (False, False)),            # goes back overall, not within a metric
    ([0, 5, 3, 9], [0, 0, 1, 0], (False, False)),
    ([0, 5, 3, 9], [0, 0, 0, 1], (True, False)),
    ([3, 3], [70, 70], (False, True)),                       # codes beyond one 64-bit mask
    ([3, 3], [70, 71], (False, False)),
])
def test_went_back_and_repeats_known_answers(steps, codes, expected):
    got = went_back_and_repeats(np.array(steps, dtype=np.int64),
                                None if codes is None else np.array(codes, dtype=np.int64))
    assert got == expected


def _reference(steps, codes) -> tuple[bool, bool]:
    """Per metric, in file order: a step below the previous one; a step seen before."""
    back = repeat = False
    for c in set(codes):
        seq = [s for s, k in zip(steps, codes) if k == c]
        back |= any(b < a for a, b in zip(seq, seq[1:]))
        repeat |= len(set(seq)) < len(seq)
    return back, repeat


@pytest.mark.parametrize("seed", range(40))
def test_went_back_and_repeats_agrees_with_a_per_metric_reference(seed):
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(2, 60)), int(rng.integers(1, 6))
    if seed % 2:   # nondecreasing steps (most logs), a few repeats by chance
        steps = np.sort(rng.integers(0, n // 2 + 1, n))
    else:          # anything
        steps = rng.integers(0, n, n)
    codes = rng.integers(0, m, n)
    back, repeat = _reference(steps.tolist(), codes.tolist())
    got_back, got_repeat = went_back_and_repeats(steps.astype(np.int64), codes.astype(np.uint8))
    assert got_back == back
    if not back:   # after a step goes back the run is deduplicated anyway
        assert got_repeat == repeat


def _key_path(steps, names) -> tuple[bool, bool]:
    """``_went_back_and_repeats_of`` on these points staged in a real DuckDB table."""
    import duckdb

    from loaders.logs.newpoints import STAGE, NewPoints, _went_back_and_repeats_of
    con = duckdb.connect()
    con.execute(f"CREATE TEMP TABLE {STAGE} (step BIGINT, metric VARCHAR)")
    con.executemany(f"INSERT INTO {STAGE} VALUES (?, ?)", list(zip(steps, names)))
    new = NewPoints(STAGE, "true", {}, len(steps))
    for s, m in zip(steps, names):
        new.first[m] = min(s, new.first.get(m, s))
        new.last[m] = max(s, new.last.get(m, s))
    return _went_back_and_repeats_of(con, new)


@pytest.mark.parametrize("seed", range(40))
def test_the_one_key_check_agrees_with_the_per_metric_reference(seed):
    # Wide rows (one order of metrics per step, some cells empty), long logs
    # whose order varies, repeated rows, resumes, negative and huge steps.
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 6))
    cols = ["val_loss", "train_loss", "lr", "acc", "grad_norm"][:m]      # not sorted: codes follow the file
    steps, names = [], []
    for row_step in np.sort(rng.integers(-3, 40, int(rng.integers(1, 25)))) if seed % 3 else \
            rng.integers(-3, 40, int(rng.integers(1, 25))):
        cells = [c for c in (cols if seed % 4 else rng.permutation(cols)) if rng.random() > 0.2]
        steps += [int(row_step)] * len(cells)
        names += list(cells)
    if seed % 5 == 0:
        steps = [s + (1 << 57) for s in steps]            # past the key's range: the general path
    if len(steps) < 2:
        return
    back, repeat = _reference(steps, names)
    got_back, got_repeat = _key_path(steps, names)
    assert got_back == back
    if not back:
        assert got_repeat == repeat


@pytest.mark.parametrize("steps, names, expected", [
    ([0, 0, 1, 1], ["b", "a", "b", "a"], (False, False)),   # wide rows, columns not sorted
    ([0, 0, 0, 0], ["b", "a", "b", "a"], (False, True)),    # a row logged twice
    ([0, 1, 1, 2], ["b", "b", "a", "a"], (False, False)),   # a's first cell empty
    ([0, 0, 5, 5, 3, 3], ["b", "a"] * 3, (True, False)),    # resumed
    ([-2, -2, -1, -1], ["b", "a", "b", "a"], (False, False)),
])
def test_the_one_key_check_known_answers(steps, names, expected):
    assert _key_path(steps, names) == expected


def test_column_names_are_unique_for_read_csv():
    assert column_names(["step", "a", "A", "", "a_1", "a"]) == ["step", "a", "A_1", "column3", "a_1_1", "a_2"]


# -- CSVs through the SQL path --------------------------------------------------------------------
def test_a_resume_deep_in_a_large_csv_is_found_in_file_order(store, tmp_path):
    """300,000 lines (several DuckDB row groups, read in parallel): insertion
    order is file order, so the resume and the latest values are found."""
    p = tmp_path / "big" / "long.csv"
    p.parent.mkdir()
    with open(p, "w") as f:
        f.write("step,metric,value\n")
        f.writelines(f"{s},train_loss,{s}\n" for s in range(200_000))
        f.writelines(f"{s},train_loss,{-s}\n" for s in range(150_000, 250_000))   # resumed at 150,000
    [rep] = ingest_log(store, p)
    assert rep.n_points == 250_000 and count_points(store) == 250_000
    [run] = list_runs(store)
    assert run["resumed"] is True
    with store.connect() as con:
        got = con.execute("SELECT step, value FROM points WHERE step IN (0, 149999, 150000, 199999, 249999) "
                          "ORDER BY step").fetchall()
    assert got == [(0, 0.0), (149_999, 149_999.0), (150_000, -150_000.0), (199_999, -199_999.0),
                   (249_999, -249_999.0)]


def test_a_large_wide_csv_in_order_is_not_resumed(store, tmp_path):
    p = tmp_path / "big" / "wide.csv"
    p.parent.mkdir()
    with open(p, "w") as f:
        f.write("step,train_loss,val_loss,lr\n")
        f.writelines(f"{s},{s},{s + 0.5},\n" for s in range(100_000))       # lr never logged
    [rep] = ingest_log(store, p)
    assert rep.n_points == 200_000
    [run] = list_runs(store)
    assert run["resumed"] is False
    assert metrics(store, run["id"]) == ["train/loss", "val/loss"]


def test_long_metric_names_are_normalised_and_a_merged_name_keeps_the_latest(store, tmp_path):
    p = write(tmp_path / "r" / "names.csv",
              "step,metric,value\n"
              "0,train_loss,1\n0, Train_Loss ,2\n"         # one metric once normalised: the later wins
              "0,LR,0.1\n1,lr-AdamW,0.2\n"                 # other case; Lightning's lr monitor
              "0,eval/loss,3\n0,my/metric,4\n")
    [rep] = ingest_log(store, p)
    rid = rep.run_ids[0]
    assert rep.n_points == 5
    assert metrics(store, rid) == ["lr", "my/metric", "train/loss", "val/loss"]
    assert points(store, rid, "train/loss") == [(0, 2.0)]
    assert points(store, rid, "lr") == [(0, 0.1), (1, 0.2)]
    assert list_runs(store)[0]["resumed"] is False   # a repeat at one step is no resume


def test_wide_columns_whose_names_coincide_or_are_reserved(store, tmp_path):
    p = write(tmp_path / "r" / "wide.csv", "step,loss,train_loss,value,__step\n0,1,2,3,4\n1,5,6,7,8\n")
    [rep] = ingest_log(store, p)
    rid = rep.run_ids[0]
    assert rep.n_points == 6
    assert metrics(store, rid) == ["__step", "train/loss", "value"]
    assert points(store, rid, "train/loss") == [(0, 2.0), (1, 6.0)]   # the later column of the row
    assert points(store, rid, "value") == [(0, 3.0), (1, 7.0)]
    assert points(store, rid, "__step") == [(0, 4.0), (1, 8.0)]


def test_a_header_that_repeats_a_name(store, tmp_path):
    p = write(tmp_path / "r" / "wide.csv", "step,val_loss,VAL_LOSS\n0,1,2\n")
    [rep] = ingest_log(store, p)
    assert points(store, rep.run_ids[0], "val/loss") == [(0, 2.0)]


def test_cells_that_are_no_number(store, tmp_path):
    """Every cell is read as text and converted; a cell that is not a number
    is no point and is counted on the file's report line (in the long
    layout an empty value cell too; a wide CSV's empty cells are its layout),
    as is a row whose step is not a number."""
    long = write(tmp_path / "a" / "long.csv", "step,metric,value\n0,train_loss,abc\n1,train_loss,\n2,train_loss,1e-3\n")
    wide = write(tmp_path / "b" / "wide.csv", "step,train_loss,flag\n0,2.5,true\n1,abc,false\nx,3,\n")
    [a] = ingest_log(store, long)
    assert points(store, a.run_ids[0], "train/loss") == [(2, 0.001)]
    assert (a.n_points, a.reason) == (1, "2 cells not numbers: abc, ''")
    [b] = ingest_log(store, wide)
    assert points(store, b.run_ids[0], "train/loss") == [(0, 2.5)]
    assert points(store, b.run_ids[0], "flag") == []
    assert (b.n_points, b.reason) == (1, "3 cells not numbers: true, abc, false; 1 row without a step number: x")


def test_a_csv_being_written_is_read_to_its_last_complete_line(store, tmp_path):
    p = write(tmp_path / "r" / "wide.csv", "step,train_loss\n1,3.0\n2,2.0\n3,1.")
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("added", 2)
    with open(p, "a") as f:
        f.write("5\n")
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("appended", 1)
    assert points(store, rep.run_ids[0], "train/loss") == [(1, 3.0), (2, 2.0), (3, 1.5)]


def test_an_appended_part_that_goes_back_replaces_and_marks_the_run_resumed(store, tmp_path):
    p = write(tmp_path / "r" / "wide.csv", "step,train_loss\n0,1\n1,2\n2,3\n")
    ingest_log(store, p)
    with open(p, "a") as f:
        f.write("1,20\n2,30\n3,40\n")
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("appended", 3)
    [run] = list_runs(store)
    assert run["resumed"] is True
    assert points(store, run["id"], "train/loss") == [(0, 1.0), (1, 20.0), (2, 30.0), (3, 40.0)]


@pytest.mark.parametrize("text, line, found", [
    ("step,metric,value\n0,train_loss,1\n1,train_loss\n", "3; Original Line: 1,train_loss", 2),
    # a log being written: complete lines from memory, counted the same way
    ("step,metric,value\n0,train_loss,1,9\n1,train", "2; Original Line: 0,train_loss,1,9", 4),
])
def test_a_row_with_another_number_of_fields_names_its_line(store, tmp_path, text, line, found):
    p = write(tmp_path / "r" / "m.csv", text)
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == (f"{p}: expected a csv_long log, found content it cannot parse (InvalidInputException: "
                            f"Invalid Input Error: CSV Error on Line: {line}; Expected Number of Columns: 3 "
                            f"Found: {found})")
    assert count_points(store) == 0 and list_runs(store) == []


def test_a_bad_row_in_an_appended_part_says_where_the_part_begins(store, tmp_path):
    p = write(tmp_path / "r" / "m.csv", "step,metric,value\n0,train_loss,1\n")
    ingest_log(store, p)
    with open(p, "a") as f:
        f.write("1,train_loss,2\n2,train_loss\n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == (f"{p}: expected a csv_long log, found content it cannot parse in the part from byte 33 "
                            f"on (InvalidInputException: Invalid Input Error: CSV Error on Line: 2; Original Line: "
                            f"2,train_loss; Expected Number of Columns: 3 Found: 2)")
    assert count_points(store) == 1      # the transaction left the stored part as it was


def test_ingest_leaves_no_view_or_table_behind(store, tmp_path):
    """The file is opened as a temporary view of the store's connection, never
    a view saved in the database (a saved read_csv view would outlive the file)."""
    p = write(tmp_path / "r" / "wide.csv", "step,train_loss\n0,1\n")
    j = write(tmp_path / "s" / "log.jsonl", '{"step": 0, "val_loss": 2.0}\n')
    ingest_log(store, p)
    ingest_log(store, j)
    with open(p, "a") as f:
        f.write("1,0.5\n")
    assert ingest_log(store, p)[0].status == "appended"          # the staged path
    with store.connect() as con:
        views = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert views == []
    assert tables == {"meta", "runs", "run_overrides", "points", "ingest_journal", "checkpoints",
                      "analysis_results", "analysis_jobs", "analysis_result_files", "run_stats",
                      "metric_directions"}
    assert detect_log(p) == "csv_wide"


@pytest.mark.parametrize("half_line", ["2,3", "2"])   # a row by itself; one field short
def test_a_csv_written_to_while_duckdb_reads_it(store, tmp_path, monkeypatch, half_line):
    """The writer appends half a line just as DuckDB opens the file: the store
    step sees the file changed, rolls back and reads a copy of the complete
    lines instead (not a wrong point, nor an error about a row being written)."""
    from loaders.logs.readers._csv import CsvFile

    p = write(tmp_path / "r" / "wide.csv", "step,train_loss\n0,1\n1,2\n")
    real = CsvFile.__call__
    opened = []

    def call(self, con):
        if self.data is None and not opened:          # the file itself, the first time
            with open(self.path, "a") as f:
                f.write(half_line)
        opened.append(self.data is None)
        return real(self, con)

    monkeypatch.setattr(CsvFile, "__call__", call)
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("added", 2)
    assert opened == [True, False]                    # then the complete lines, from memory
    with open(p, "a") as f:
        f.write(",3\n" if half_line == "2" else "\n")
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("appended", 1)
    [run] = list_runs(store)
    assert points(store, run["id"], "train/loss") == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert run["resumed"] is False


# -- run_stats kept by the point check ------------------------------------------------------------
def _stats(store: Store) -> list[tuple]:
    with store.connect() as con:
        return con.execute("SELECT r.name, s.metric, s.n, s.n_values, s.nonfinite, s.first_step, s.last_step, "
                           "s.final_step, s.final, s.best, s.best_step FROM run_stats s JOIN runs r "
                           "ON r.id = s.run_id ORDER BY 1, 2").fetchall()


@pytest.mark.parametrize("name, text, expected", [
    # in order: the summary computed with the first/last steps is the run's
    ("plain.csv", "step,train_loss,val_loss\n0,3.0,\n10,2.0,2.5\n20,inf,2.25\n",
     [("train/loss", 3, 3, 1, 0, 20, 10, 2.0, 2.0, 10), ("val/loss", 2, 2, 0, 10, 20, 20, 2.25, 2.25, 20)]),
    # a repeated step: the latest point wins, the summary is the one after that
    ("repeat.csv", "step,train_loss\n0,3.0\n10,2.0\n10,1.0\n20,1.5\n",
     [("train/loss", 3, 3, 0, 0, 20, 20, 1.5, 1.0, 10)]),
    # a long log whose names are normalised after the insert
    ("names.csv", "step,metric,value\n0,Train_Loss,3.0\n5,Train_Loss,1.0\n5,LR,0.1\n",
     [("lr", 1, 1, 0, 5, 5, 5, 0.1, 0.1, 5), ("train/loss", 2, 2, 0, 0, 5, 5, 1.0, 1.0, 5)]),
])
def test_run_stats_after_ingest_are_the_points_summary(store, tmp_path, name, text, expected):
    p = write(tmp_path / "r" / name, text)
    ingest_log(store, p)
    got = [row[1:] for row in _stats(store)]
    assert got == expected


def test_run_stats_follow_a_rewritten_and_a_grown_log(store, tmp_path):
    p = write(tmp_path / "r" / "log.csv", "step,train_loss\n0,3.0\n10,2.0\n")
    ingest_log(store, p)
    with open(p, "a", encoding="utf-8") as fh:        # grown: staged, summarised at the end
        fh.write("20,1.0\n")
    ingest_log(store, p)
    assert [row[1:] for row in _stats(store)] == [("train/loss", 3, 3, 0, 0, 20, 20, 1.0, 1.0, 20)]
    write(p, "step,val_loss\n5,4.0\n")                # rewritten: the old points and their summary go
    ingest_log(store, p)
    assert [row[1:] for row in _stats(store)] == [("val/loss", 1, 1, 0, 5, 5, 5, 4.0, 4.0, 5)]


# -- the time columns -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text, timed", [
    ("wide.csv", "step,train_loss,val_loss\n0,4,\n1,3,4\n", False),
    ("long.csv", "step,metric,value\n0,train_loss,4\n1,train_loss,3\n1,val_loss,4\n", False),
    ("timed.csv", "step,metric,value,wall_time\n0,train_loss,4,0.5\n1,train_loss,3,1.5\n1,val_loss,4,1.5\n", True),
    ("tokens.csv", "step,train_loss,val_loss,tokens\n0,4,,0\n1,3,4,4096\n", True),
    ("log.jsonl", '{"step": 0, "train_loss": 4}\n{"step": 1, "train_loss": 3, "val_loss": 4}\n', False),
    ("log.jsonl", '{"step": 0, "train_loss": 4, "_timestamp": 1.0}\n{"step": 1, "train_loss": 3, "val_loss": 4}\n',
     True),
])
def test_points_keep_their_time_and_tokens_where_logged(store, tmp_path, name, text, timed):
    p = write(tmp_path / "r" / name, text)
    [rep] = ingest_log(store, p)
    assert rep.n_points == 3
    with store.connect() as con:
        rows = con.execute("SELECT step, metric, value, wall_time, tokens FROM points ORDER BY step, metric").fetchall()
    assert [r[:3] for r in rows] == [(0, "train/loss", 4.0), (1, "train/loss", 3.0), (1, "val/loss", 4.0)]
    if name == "timed.csv":
        assert [r[3] for r in rows] == [0.5, 1.5, 1.5]
    if name == "tokens.csv":
        assert [r[4] for r in rows] == [0, 4096, 4096]
    if not timed:
        assert all(r[3] is None and r[4] is None for r in rows)


def test_a_run_fed_by_two_files_reads_whole_and_the_latest_file_wins(store, tmp_path):
    """A trainer run folder feeds one run from an untimed CSV and a timed JSONL: both are
    read, and a file that logs a (step, metric) again replaces the stored point."""
    run = tmp_path / "run1"
    write(run / "config.json", '{"variant": "qkv"}')
    csv = write(run / "metrics.csv", "step,train_loss\n0,4\n1,3\n2,2\n")
    jsonl = write(run / "metrics.jsonl", '{"step": 2, "train_loss": 1.5, "wall_time": 20.0}\n'
                                         '{"step": 3, "train_loss": 1.0, "wall_time": 30.0}\n')
    [a] = ingest_log(store, csv)
    [b] = ingest_log(store, jsonl)
    assert a.run_ids == b.run_ids
    run_id = a.run_ids[0]
    assert points(store, run_id, "train/loss") == [(0, 4.0), (1, 3.0), (2, 1.5), (3, 1.0)]
    write(csv, "step,train_loss\n0,4\n1,3\n2,2.5\n3,0.9\n")            # rewritten: steps 2, 3 again
    ingest_log(store, csv)
    assert points(store, run_id, "train/loss") == [(0, 4.0), (1, 3.0), (2, 2.5), (3, 0.9)]
    assert _stats(store) == [("run1", "train/loss", 4, 4, 0, 0, 3, 3, 0.9, 0.9, 3)]
