"""A CSV header longer than detection's first 64 KB (a W&B export of a sweep:
thousands of ``<run> - <metric>`` columns) is read like any line up to
``QKVSCOPE_CSV_LINE_BYTES``; a longer first line is one error naming the budget."""
from __future__ import annotations

from loaders.ingest import ingest_paths
from loaders.store import Store


def wandb_export(path, runs: int, name_chars: int) -> int:
    """A W&B export: ``Step`` and ``<run> - train/loss`` with __MIN/__MAX per run; returns the header's bytes."""
    names = [f"sweep-{i:03d}-" + "x" * (name_chars - 10) for i in range(runs)]
    cols = ["Step"] + [f"{r} - train/loss{band}" for r in names for band in ("", "__MIN", "__MAX")]
    header = ",".join(f'"{c}"' for c in cols) + "\n"
    rows = "".join(",".join([str(s)] + [str(s + i / 4) for i in range(len(cols) - 1)]) + "\n" for s in range(3))
    path.write_text(header + rows)
    return len(header)


def test_a_148_kb_header_is_read_as_a_log(tmp_path):
    p = tmp_path / "wandb_export.csv"
    assert wandb_export(p, runs=10, name_chars=4920) > 148_000
    store = Store(tmp_path / "db.duckdb")
    [f] = ingest_paths(store, [p]).files
    assert (f.status, f.format, f.n_points) == ("added", "wandb_csv", 30)
    with store.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(10,)]
        assert con.execute("SELECT p.step, p.value FROM points p JOIN runs r ON r.id = p.run_id "
                           "WHERE r.name LIKE 'sweep-001-%' ORDER BY p.step").fetchall() == [
            (0, 0.75), (1, 1.75), (2, 2.75)]


def test_a_first_line_past_the_budget_is_one_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_CSV_LINE_BYTES", "100000")
    p = tmp_path / "wandb_export.csv"
    wandb_export(p, runs=10, name_chars=4920)
    [f] = ingest_paths(Store(tmp_path / "db.duckdb"), [p]).files
    assert (f.status, f.reason) == ("error", f"{p}: expected a first line of at most QKVSCOPE_CSV_LINE_BYTES "
                                             "(100000 bytes; raise it in the environment to read this file), "
                                             "found a longer one")


def sweep_export(path, runs: int) -> dict:
    """A W&B export of a ``runs``-run sweep (3 x runs + 1 columns: ``<run> - val_loss`` and
    its __MIN/__MAX band), four steps; run i leaves step 30 empty when i % 3 == 0, logs a
    NaN at step 0 when i % 97 == 5, +inf at step 20 when i % 101 == 7, and ``n/a`` at step 10
    when i % 250 == 3. Returns {run: [(step, value or None)]}, the points a store must hold."""
    names = [f"sweep-wd{i % 7}-lr{i % 5}-seed{i:04d}-xxxxxxxxxx" for i in range(runs)]
    header = ",".join(['"Step"'] + [f'"{r} - val_loss{b}"' for r in names for b in ("", "__MIN", "__MAX")])
    expected: dict[str, list] = {r: [] for r in names}
    lines = [header]
    for step in (0, 10, 20, 30):
        cells = [str(step)]
        for i, r in enumerate(names):
            v = round(3 - step / 100 + i / 1000, 6)
            text = repr(v)
            if step == 30 and i % 3 == 0:
                text = ""
            elif step == 0 and i % 97 == 5:
                text, v = "nan", None
            elif step == 20 and i % 101 == 7:
                text, v = "inf", float("inf")
            elif step == 10 and i % 250 == 3:
                text = "n/a"
            if text and text != "n/a":
                expected[r].append((step, v))
            cells += [text, text and repr(v - 0.01 if v is not None else 0), ""]
        lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return expected


def test_a_1000_run_export_stores_every_value(tmp_path):
    """3,001 columns (a 151 KB header): read in one pass, every run and value stored as in the file,
    the unreadable cells counted."""
    p = tmp_path / "wandb_export.csv"
    expected = sweep_export(p, runs=1000)
    assert len(p.read_text().split("\n", 1)[0].split(",")) == 3001
    assert len(p.read_text().split("\n", 1)[0]) > 150_000
    store = Store(tmp_path / "db.duckdb")
    [f] = ingest_paths(store, [p]).files
    n = sum(map(len, expected.values()))
    assert (f.status, f.format, f.n_points, f.reason) == ("added", "wandb_csv", n, "4 cells not numbers: n/a")
    with store.connect(read_only=True) as con:
        got = con.execute("SELECT r.name, p.step, p.metric, p.value FROM points p JOIN runs r ON r.id = p.run_id "
                          "ORDER BY r.id, p.rowid").fetchall()
        stats = con.execute("SELECT count(*), sum(n), sum(n_values), sum(nonfinite) FROM run_stats").fetchall()
    stored: dict[str, list] = {}
    for name, step, metric, value in got:
        assert metric == "val/loss"
        stored.setdefault(name, []).append((step, value))
    assert stored == expected
    assert stats == [(1000, n, n - 11, 10)]          # 11 NaN points (stored as NULL), 10 +inf
