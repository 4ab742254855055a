"""A file is read as that file, never as the pattern its name may spell: DuckDB's
readers expand ``?``, ``*``, ``[...]`` and ``{a,b}`` in a path, so ``log?.csv``
would be stored with ``logX.csv``'s points (``loaders.duck.literal_file``)."""
from __future__ import annotations

import pytest

from app.batch.errors import BatchError
from app.batch.location import ResultsLocation
from loaders.ingest import ingest_paths
from loaders.store import Store


def stored(store) -> dict:
    with store.connect(read_only=True) as con:
        rows = con.execute("SELECT r.name, p.step, p.value FROM points p JOIN runs r ON r.id = p.run_id "
                           "ORDER BY r.name, p.step").fetchall()
    out: dict = {}
    for name, step, value in rows:
        out.setdefault(name, []).append((step, value))
    return out


@pytest.mark.parametrize("name, decoy", [
    ("log?.csv", "logX.csv"), ("run[12].csv", "run1.csv"), ("*.csv", "a.csv"), ("{a,b}.csv", "a.csv"),
])
def test_a_csv_named_like_a_pattern_stores_its_own_points(tmp_path, name, decoy):
    (tmp_path / decoy).write_text("step,loss\n0,9\n1,8\n")
    (tmp_path / name).write_text("step,loss\n0,1\n")
    store = Store(tmp_path / "db.duckdb")
    [f] = ingest_paths(store, [tmp_path / name]).files
    assert (f.status, f.n_points) == ("added", 1)
    assert stored(store) == {name[:-4]: [(0, 1.0)]}


def test_a_results_location_named_like_a_pattern_is_refused(tmp_path):
    with pytest.raises(BatchError) as exc:
        ResultsLocation(tmp_path / "out[1]")
    assert str(exc.value) == (f"{tmp_path}/out[1]: expected a results location without any of "
                              "*?[]{} (DuckDB reads them as a file pattern)")
