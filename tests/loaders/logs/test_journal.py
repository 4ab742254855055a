"""Idempotence, growth, rewrites and crash safety of log ingest."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loaders.logs import ingest_log, list_runs
from loaders.store import Store
from tests.loaders.logs.helpers import count_points, points, write
from tests.loaders.logs.test_formats import modded_run

ROOT = Path(__file__).resolve().parents[3]


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def test_reingest_unchanged_adds_nothing(store, tmp_path):
    p = write(tmp_path / "r" / "wide.csv", "step,train_loss\n1,3.0\n2,2.0\n")
    assert ingest_log(store, p)[0].status == "added"
    again = ingest_log(store, p)[0]
    assert (again.status, again.n_points) == ("unchanged", 0)
    assert count_points(store) == 2
    # A touched file with the same bytes is unchanged too.
    os.utime(p, (time.time() + 5, time.time() + 5))
    assert ingest_log(store, p)[0].status == "unchanged"
    assert count_points(store) == 2 and len(list_runs(store)) == 1


@pytest.mark.parametrize("name, first, more, metric, expected", [
    ("wide.csv", "step,train_loss\n1,3.0\n2,2.0\n", "3,1.5\n4,1.25\n", "train/loss",
     [(1, 3.0), (2, 2.0), (3, 1.5), (4, 1.25)]),
    ("log.jsonl", '{"step": 1, "val_loss": 3.0}\n', '{"step": 2, "val_loss": 2.5}\n', "val/loss",
     [(1, 3.0), (2, 2.5)]),
    ("train.log", "iter 0: loss 4.0, time 10.0ms, mfu -100.00%\n", "iter 1: loss 3.5, time 10.0ms, mfu 5.00%\n",
     "train/loss", [(0, 4.0), (1, 3.5)]),
    ("main.log", "s:0 trl:10.0\n", "s:1 trl:9.0\ns:1 tel:9.5\n", "train/loss", [(0, 10.0), (1, 9.0)]),
])
def test_grown_log_appends_only_new_points(store, tmp_path, name, first, more, metric, expected):
    p = write(tmp_path / "run" / name, first)
    [a] = ingest_log(store, p)
    n_first = count_points(store)
    _append(p, more)
    [b] = ingest_log(store, p)
    assert b.status == "appended" and b.run_ids == a.run_ids
    assert b.n_points == count_points(store) - n_first
    assert points(store, a.run_ids[0], metric) == expected
    assert ingest_log(store, p)[0].status == "unchanged"


def test_half_written_line_waits_for_its_end(store, tmp_path):
    p = write(tmp_path / "run" / "log.jsonl", '{"step": 1, "train_loss": 3.0}\n{"step": 2, "trai')
    ingest_log(store, p)
    assert count_points(store) == 1
    _append(p, 'n_loss": 2.0}\n')
    assert ingest_log(store, p)[0].status == "appended"
    [run] = list_runs(store)
    assert points(store, run["id"], "train/loss") == [(1, 3.0), (2, 2.0)]


def test_append_that_resumes_replaces_repeated_steps(store, tmp_path):
    p = write(tmp_path / "run" / "log.jsonl", "".join(f'{{"step": {s}, "train_loss": {s}}}\n' for s in range(5)))
    ingest_log(store, p)
    _append(p, "".join(f'{{"step": {s}, "train_loss": {100 + s}}}\n' for s in range(3, 7)))
    ingest_log(store, p)
    [run] = list_runs(store)
    assert run["resumed"] is True
    assert points(store, run["id"], "train/loss") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 103.0), (4, 104.0),
                                                      (5, 105.0), (6, 106.0)]


def test_modded_log_growing_into_a_new_run(store, tmp_path):
    p = write(tmp_path / "logs" / "abc.txt", modded_run(3, 0, 0.01, 0.0, 10.0))
    ingest_log(store, p)
    _append(p, modded_run(2, 1, 0.02, 0.1, 11.0))
    [rep] = ingest_log(store, p)
    assert rep.status == "appended"
    runs = list_runs(store)
    assert [(r["name"], r["weight_decay"], r["last_step"]) for r in runs] == [("abc", 0.0, 3), ("abc#2", 0.1, 2)]
    assert points(store, runs[0]["id"], "val/loss")[0] == (0, 10.0)


def test_rewritten_log_replaces_its_points(store, tmp_path):
    p = write(tmp_path / "run" / "wide.csv", "step,train_loss\n1,3.0\n2,2.0\n3,1.0\n")
    [a] = ingest_log(store, p)
    write(p, "step,train_loss\n1,9.0\n")  # shorter: a new run of the script overwrote it
    [b] = ingest_log(store, p)
    assert b.status == "added" and b.run_ids == a.run_ids
    assert points(store, a.run_ids[0], "train/loss") == [(1, 9.0)]


def test_tensorboard_file_that_grew_is_read_again(store, tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    d = tmp_path / "tb"
    w = SummaryWriter(log_dir=str(d))
    w.add_scalar("train/loss", 2.0, 1)
    w.flush()
    [ev] = list(d.glob("events.out.tfevents.*"))
    ingest_log(store, ev)
    w.add_scalar("train/loss", 1.0, 2)
    w.close()
    [rep] = ingest_log(store, ev)
    assert rep.status == "added"
    assert points(store, rep.run_ids[0], "train/loss") == [(1, 2.0), (2, 1.0)]


KILLER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from loaders.store import Store
    from loaders.logs import ingest_log
    print("start", flush=True)
    ingest_log(Store({db!r}), Path({log!r}))
    print("done", flush=True)
""")


@pytest.mark.slow
def test_kill_mid_ingest_leaves_file_all_or_nothing(tmp_path):
    log = tmp_path / "big" / "long.csv"
    log.parent.mkdir()
    n = 600_000
    with open(log, "w") as fh:
        fh.write("step,metric,value\n")
        fh.writelines(f"{i},train_loss,{1.0 / (i + 1)}\n" for i in range(n))
    db = tmp_path / "db.duckdb"
    Store(db).migrate()
    script = tmp_path / "ingest.py"
    script.write_text(KILLER.format(root=str(ROOT), db=str(db), log=str(log)))
    outcomes = set()
    for delay in (0.2, 1.0, 1.5, 2.5):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "start"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        store = Store(db)
        total = count_points(store)
        assert total in (0, n)
        with store.connect() as con:
            journal = con.execute("SELECT count(*) FROM ingest_journal").fetchone()[0]
        assert journal == (1 if total == n else 0)
        outcomes.add(total)
        if total == n:
            break
    assert 0 in outcomes  # at least one kill landed mid-ingest
    # Finish the job: the database accepts the file afterwards, completely.
    [rep] = ingest_log(Store(db), log)
    assert count_points(Store(db)) == n
    assert rep.status in ("added", "unchanged")
