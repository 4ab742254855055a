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
