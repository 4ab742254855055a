"""What the fuzzers found, pinned with exact outcomes: each of these escaped
as a raw library exception (a traceback for the user) before the fix."""
from __future__ import annotations

import json
import struct

import pytest

from loaders.errors import CheckpointFormatError
from loaders.ingest import ingest_file
from loaders.logs import detect_log
from loaders.sources import open_source
from loaders.store import Store
from tests.hostile.corpus import LOG_EXPECTED


def test_safetensors_dtype_that_is_not_a_string(tmp_path):
    """Was: TypeError unhashable type 'list' from the dtype table look-up."""
    h = json.dumps({"w": {"dtype": [], "shape": [1], "data_offsets": [0, 4]}}).encode()
    p = tmp_path / "m.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + bytes(4))
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == (f"{p}: safetensors tensor 'w' has unknown dtype [] (known: BF16, BOOL, C64, "
                              f"F16, F32, F64, F8_E4M3, F8_E5M2, F8_E8M0, I16, I32, I64, I8, U16, U32, U64, U8)")


def ingest(tmp_path, name: str, raw: bytes):
    p = tmp_path / "run" / name
    p.parent.mkdir()
    p.write_bytes(raw)
    return p, [(r.status, r.n_points, r.reason) for r in ingest_file(Store(tmp_path / "db.duckdb"), p)]


def test_carriage_return_inside_a_csv_line(tmp_path):
    """Was: _csv.Error 'new-line character seen in unquoted field' out of detection."""
    p, got = ingest(tmp_path, "metrics.csv", b"step,metric,value\n0,\rrain_loss,4.0\n10,train_loss,3.5\n")
    assert detect_log(p) is None
    assert got == [("skipped", 0, f"not a training log qkvscope reads: {LOG_EXPECTED}; found text whose "
                                  f"first line is 'step,metric,value'")]


def test_trainer_state_entries_without_a_finite_step_are_dropped(tmp_path):
    """Was: pandas IntCastingNaNError when one log_history entry had no step."""
    doc = b'{"log_history": [{"stepep": 10, "loss": 3.5}, {"step": 20, "eval_loss": 3.1}, {"step": 1e400, "loss": 1}]}'
    _, got = ingest(tmp_path, "trainer_state.json", doc)
    assert got == [("added", 1, None)]
    with Store(tmp_path / "db.duckdb").connect(read_only=True) as con:
        assert con.execute("SELECT step, metric, value FROM points").fetchall() == [(20, "val/loss", 3.1)]


@pytest.mark.parametrize("name, raw, fmt, cause", [
    ("train.log", b"iter 0: loss 4.0000, time 10.00ms, mfu 1.00%\nstep 1099999999999999999999999: train loss "
                  b"3.5, val loss 3.7\n", "nanogpt", "OverflowError: Python int too large to convert to C long"),
    ("llmc.log", b"s:0 trl:4.0\ns:99999999999999999999999 trl:3.5\n", "llmc",
     "OverflowError: Python int too large to convert to C long"),
    # Was: DuckDB's sniffer took the second line for the header (BinderException
    # 'Referenced column "step" not found'); the header is now the first line.
    ("wide.csv", b"step,train_loss,val_loss,lr\n0,4.0,,0.00x0,3.5,3.7,0.001\n", "csv_wide",
     "InvalidInputException: Invalid Input Error: CSV Error on Line: 2; Original Line: 0,4.0,,0.00x0,3.5,3.7,0.001; "
     "Expected Number of Columns: 4 Found: 5"),
])
def test_content_the_parsing_libraries_reject_is_a_log_error(tmp_path, name, raw, fmt, cause):
    """Was: OverflowError / duckdb exceptions out of the readers."""
    p, got = ingest(tmp_path, name, raw)
    assert got == [("error", 0, f"{p}: expected a {fmt} log, found content it cannot parse ({cause})")]


def test_a_csv_row_with_too_many_fields_is_a_log_error(tmp_path):
    """Was: DuckDB's 'Error when sniffing file'; the dialect is no longer guessed."""
    p, got = ingest(tmp_path, "metrics.csv",
                    b"step,metric,value\n0,train_loss,4Infinity0,train_loss,3.5\n10,val_loss,3.7\n")
    assert got == [("error", 0, f"{p}: expected a csv_long log, found content it cannot parse "
                                f"(InvalidInputException: Invalid Input Error: CSV Error on Line: 2; Original Line: "
                                f"0,train_loss,4Infinity0,train_loss,3.5; Expected Number of Columns: 3 Found: 4)")]
