"""A file of many runs stores what it holds whichever way its runs are summarised: each small
run's ``run_stats`` with the file's other runs at the end of the file, or each at once
(``SUMMARY_AT_ONCE_POINTS``); the logged lr and the user's corrections of every run, each
read in one query for the file; and on an error nothing of the file at all."""
from __future__ import annotations

import json

import pytest

from loaders.ingest import ingest_paths
from loaders.logs import newpoints
from loaders.logs.runs import set_run_metadata
from loaders.store import Store

TABLES = ("runs", "points", "run_stats", "run_overrides")


def export(path, runs: int, *, shift: float = 0.0) -> None:
    """A W&B export of ``runs`` runs logging ``train/loss`` and ``lr``: run i is named with an
    lr (``lr0.001``, which its logged lr of 1e-3 x (1 + i % 3) then overrides with a note when
    it differs), logs step 20 twice when i % 5 == 0 (the later row wins) and no lr when
    i % 4 == 3."""
    names = [f"r{i:03d}-lr0.001" for i in range(runs)]
    cols = ["Step"] + [f"{r} - {m}{b}" for r in names for m in ("train/loss", "lr") for b in ("", "__MIN", "__MAX")]
    lines = [",".join(f'"{c}"' for c in cols)]
    for row, step in enumerate((0, 10, 20, 20, 30)):
        cells = [str(step)]
        for i in range(runs):
            if step == 20 and row == 2 and i % 5:       # the first step-20 row: only every 5th run
                cells += ["", "", "", "", "", ""]
                continue
            loss = round(3 - step / 100 + i / 1000 + shift + (row == 3) / 10, 6)
            lr = "" if i % 4 == 3 else repr(1e-3 * (1 + i % 3) * (1 + step / 100))
            cells += [repr(loss), repr(loss - 0.01), repr(loss + 0.01), lr, lr, lr]
        lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")


def stored(store: Store) -> dict[str, list]:
    with store.connect(read_only=True) as con:
        got = {t: con.execute(f"SELECT * EXCLUDE (created_at) FROM {t} ORDER BY ALL" if t == "runs"
                              else f"SELECT * EXCLUDE (updated_at) FROM {t} ORDER BY ALL" if t == "run_overrides"
                              else f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    return got


def ingest_twice(tmp_path, name: str) -> dict[str, list]:
    """The export stored, one run corrected by the user, the export rewritten and stored again."""
    p = tmp_path / "wandb_export.csv"                                    # one path: the runs' source
    export(p, 40)
    store = Store(tmp_path / f"{name}.duckdb")
    [f] = ingest_paths(store, [p]).files
    assert (f.status, f.n_points) == ("added", 40 * 4 + 30 * 4)          # a repeated step counts once
    with store.connect(read_only=True) as con:
        [(run_id,)] = con.execute("SELECT id FROM runs WHERE name = 'r007-lr0.001'").fetchall()
    set_run_metadata(store, run_id, lr=0.5, note="checked by hand")
    export(p, 40, shift=0.5)
    [f] = ingest_paths(store, [p]).files
    assert f.status == "added"
    return stored(store)


def test_every_run_is_stored_alike_whenever_it_is_summarised(tmp_path, monkeypatch):
    later = ingest_twice(tmp_path, "later")
    monkeypatch.setattr(newpoints, "SUMMARY_AT_ONCE_POINTS", -1)       # every run summarised at once
    at_once = ingest_twice(tmp_path, "at_once")
    assert later == at_once
    assert len(later["runs"]) == 40 and len(later["run_stats"]) == 40 * 2 - 10


def test_the_logged_lr_and_the_corrections_of_each_run(tmp_path):
    got = ingest_twice(tmp_path, "db")
    with Store(tmp_path / "db.duckdb").connect(read_only=True) as con:
        rows = {name: (lr, cfg) for name, lr, cfg in con.execute(
            "SELECT name, lr, config::JSON FROM runs").fetchall()}
        step20 = con.execute("SELECT p.value FROM points p JOIN runs r ON r.id = p.run_id "
                             "WHERE r.name = 'r005-lr0.001' AND p.metric = 'train/loss' AND p.step = 20").fetchall()
    lr, cfg = rows["r001-lr0.001"]
    cfg = json.loads(cfg)
    assert lr == pytest.approx(2e-3 * 1.3) and cfg["lr_peak"] == pytest.approx(2e-3 * 1.3)
    assert cfg["lr_initial"] == pytest.approx(2e-3)
    assert "the name says lr 0.001, the logged lr peaks at 0.0026: the logged value is kept" in cfg["metadata_notes"]
    lr, cfg = rows["r003-lr0.001"]                                     # no lr logged: the name's
    assert lr == pytest.approx(1e-3) and "lr_peak" not in json.loads(cfg)
    lr, cfg = rows["r007-lr0.001"]                                     # the user's correction wins
    cfg = json.loads(cfg)
    assert lr == 0.5 and cfg["note"] == "checked by hand" and cfg["overrides"] == ["lr", "note"]
    assert step20 == [(pytest.approx(3 - 0.2 + 0.005 + 0.5 + 0.1),)]   # step 20 twice: the later row won
    assert len(got["run_overrides"]) == 2


def test_an_error_stores_nothing_of_the_file(tmp_path):
    p = tmp_path / "wandb_export.csv"
    export(p, 30)
    text = p.read_text().splitlines()
    p.write_text("\n".join([text[0]] + [",".join(c if i == 0 else "n/a" for i, c in enumerate(line.split(",")))
                                        for line in text[1:]]) + "\n")
    store = Store(tmp_path / "db.duckdb")
    [f] = ingest_paths(store, [p]).files
    assert f.status == "error" and "found none to store" in f.reason
    assert all(rows == [] for rows in stored(store).values())
