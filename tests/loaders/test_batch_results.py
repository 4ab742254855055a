"""loaders.batch_results: the SQL of batch analysis (Parquet files, S3 secrets, result locations)."""
from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from loaders import batch_results as br
from loaders.errors import StoreError
from loaders.store import Store


class Recording:
    """A connection that records the statements it is given."""

    def __init__(self):
        self.statements: list[str] = []

    def execute(self, statement, *args):
        self.statements.append(statement)


def _store_with_checkpoints(tmp_path, n: int) -> Store:
    store = Store(tmp_path / "s.duckdb")
    with store.transaction() as con:
        for i in range(1, n + 1):
            con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                        "n_kv_heads, d_model, d_head, dtype, params_attention) "
                        "VALUES (?, ?, ?, 'gpt2', 'qkv', ?, 4, 2, 32, 8, 'float32', ?)",
                        [i, f"/c/{i}.pt", f"sha{i}", i + 1, 1000 * i])
    return store


def test_sql_string_doubles_quotes():
    assert br.sql_string("it's") == "'it''s'"
    with duckdb.connect() as con:
        assert con.execute("SELECT " + br.sql_string("a'b")).fetchall() == [("a'b",)]


@pytest.mark.parametrize("endpoint, ssl, host", [
    ("http://localhost:9000/", "false", "localhost:9000"),
    ("https://r2.example.com", "true", "r2.example.com"),
])
def test_s3_secret_from_keys(endpoint, ssl, host):
    con = Recording()
    br.create_s3_secret(con, key_id="AK'1", secret="s", session_token="tok", endpoint=endpoint, region="eu-1")
    assert con.statements == [
        "CREATE OR REPLACE TEMPORARY SECRET qkvscope_s3 (TYPE s3, PROVIDER config, KEY_ID 'AK''1', SECRET 's', "
        f"SESSION_TOKEN 'tok', USE_SSL {ssl}, ENDPOINT '{host}', REGION 'eu-1')"]


def test_s3_secret_keys_only_and_credential_chain():
    con = Recording()
    br.create_s3_secret(con, key_id="k", secret="")
    br.create_credential_chain_secret(con)
    br.load_httpfs(con)
    assert con.statements == [
        "CREATE OR REPLACE TEMPORARY SECRET qkvscope_s3 (TYPE s3, PROVIDER config, KEY_ID 'k', SECRET '')",
        "INSTALL aws", "LOAD aws",
        "CREATE OR REPLACE TEMPORARY SECRET qkvscope_s3 (TYPE s3, PROVIDER credential_chain)",
        "INSTALL httpfs", "LOAD httpfs"]


def test_parquet_round_trip(tmp_path):
    rows = pd.DataFrame({"checkpoint_sha256": ["a", "a", "a"], "layer": [0, 0, 1], "head": [0, 1, None],
                         "metric": ["m", "m", "n"], "value": [0.5, 0.25, 2.0],
                         "layer2": pd.array([None, None, 0], dtype="Int32"),
                         "head2": pd.array([None, 0, None], dtype="Int32")})
    job = pd.DataFrame([{"checkpoint_sha256": "a", "metric_version": 3, "first_layer": 0, "last_layer": 1,
                         "notes": "{}", "seconds": 1.5, "device": "cpu", "host": "h"}])
    part, marker = tmp_path / "it's" / "part.parquet", tmp_path / "it's" / "job.parquet"
    part.parent.mkdir()
    with duckdb.connect() as con:
        assert not br.file_exists(con, str(part))
        br.copy_to_parquet(con, rows, str(part))
        br.copy_to_parquet(con, job, str(marker))
        assert br.file_exists(con, str(part)) and br.count_rows(con, [str(part), str(part)]) == 6
        back = br.read_layer_rows(con, str(part))
        assert list(back.columns) == ["layer", "head", "metric", "value", "layer2", "head2"]
        assert back["layer2"].isna().tolist() == [True, True, False] and back["head2"].isna().tolist() == [
            True, False, True]
        assert back["value"].tolist() == [0.5, 0.25, 2.0] and back["head"].isna().tolist() == [False, False, True]
        # a job file written without a ties column reads its ties as NULL
        assert br.read_group_job(con, str(marker)) == [("a", 3, 0, 1, "{}", 1.5, "cpu", "h", None)]
        assert br.read_job(con, str(marker)).to_dict("records") == job.to_dict("records")
        assert "_qkv_out" not in {r[0] for r in con.execute("SHOW TABLES").fetchall()}   # unregistered
        with pytest.raises(duckdb.Error):
            br.read_job(con, str(tmp_path / "missing.parquet"))


def test_stored_checkpoints_in_the_order_asked(tmp_path):
    store = _store_with_checkpoints(tmp_path, 3)
    got = br.stored_checkpoints(store, [3, 1])
    assert [r["id"] for r in got] == [3, 1] and tuple(got[0]) == br.STORED_COLUMNS
    assert (got[0]["n_layers"], got[0]["params_attention"], got[0]["dtype"]) == (4, 3000, "float32")
    with pytest.raises(StoreError) as exc:
        br.stored_checkpoints(store, [2, 9])
    assert str(exc.value) == f"{store.path}: no checkpoint with id 9 (stored ids: [2])"


def test_result_files_replace_and_need_their_job_row(tmp_path):
    store = _store_with_checkpoints(tmp_path, 1)
    for n in (10, 12):                                      # recorded twice: the second replaces the first
        with store.transaction() as con:
            br.record_result_file(con, checkpoint_id=1, kind="weights", metric_version=3, sha256="sha1",
                                  location=f"/r/{n}/part.parquet", job_location="/r/job.parquet", n_rows=n)
    assert br.registered_files(store, checkpoint_id=1, sha256="sha1", metric_version=3) == {}   # no job row
    with store.transaction() as con:
        con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version) VALUES (1, 'weights', 3)")
    assert br.registered_files(store, checkpoint_id=1, sha256="sha1", metric_version=3) == {
        "weights": ("/r/12/part.parquet", "/r/job.parquet", 12)}
    assert br.registered_files(store, checkpoint_id=1, sha256="other", metric_version=3) == {}
    assert br.registered_files(store, checkpoint_id=1, sha256="sha1", metric_version=2) == {}
