"""CSV training logs: long, wide, PyTorch Lightning ``CSVLogger``, W&B exports.

All four are parsed by DuckDB's own ``read_csv`` and reshaped to long points
with ``UNPIVOT`` in SQL (no Python loop per row). An empty cell is no point; a
cell that says ``nan`` is a point whose value is NaN (stored as NULL).

* long: columns ``step,metric,value`` (optionally ``wall_time``/``tokens``).
* wide: a step column (``step``, ``global_step``, ``iter``, ...) and one
  numeric column per metric.
* Lightning: ``version_N/metrics.csv`` beside ``hparams.yaml``; a wide CSV
  with sparse columns, ``epoch`` kept as a metric.
* W&B: columns ``<run name> - <metric>`` with ``__MIN``/``__MAX``
  companions (dropped: they are the band around the same metric); one file
  holds many runs.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from loaders.errors import LogFormatError
from loaders.logs.base import (Parsed, RunData, complete_lines, decode_text, metric_codes,
                               normalise_metric, steps_went_back)

STEP_COLUMNS = ("step", "global_step", "_step", "iter", "iteration", "iter_num", "it",
                "trainer/global_step", "steps")
WALL_COLUMNS = ("wall_time", "walltime", "_timestamp", "timestamp", "time_s", "elapsed_s")
TOKEN_COLUMNS = ("tokens", "tokens_seen", "num_tokens", "num_input_tokens_seen")
_LONG_REQUIRED = {"step", "metric", "value"}
_WANDB_COL = re.compile(r"^(?P<run>.+?) - (?P<metric>.+?)(?P<band>__MIN|__MAX)?$")
_VERSION_DIR = re.compile(r"^version_\d+$")


def _quote(name: str) -> str:
    """A SQL identifier for a column name taken from a file header."""
    return '"' + name.replace('"', '""') + '"'


def _header(text: str) -> tuple[list[str], str] | None:
    """(fields, delimiter) of the first line, or None when it is no CSV header."""
    first = text.split("\n", 1)[0].rstrip("\r")
    if not first or first.lstrip().startswith(("{", "[", "#")):
        return None
    delim = "\t" if first.count("\t") > first.count(",") else ","
    if first.count(delim) < 1:
        return None
    try:
        fields = next(csv.reader([first], delimiter=delim))
    except csv.Error:                     # e.g. a bare carriage return inside the line
        return None
    return [f.strip() for f in fields], delim


def _pick(fields: list[str], names: tuple[str, ...]) -> str | None:
    low = {f.lower(): f for f in fields}
    for n in names:
        if n in low:
            return low[n]
    return None


def _numeric_sample(text: str, delim: str, fields: list[str], col: str) -> bool:
    """Whether ``col`` holds a number in some of the first data rows."""
    idx = fields.index(col)
    try:
        rows = list(csv.reader(io.StringIO("\n".join(text.split("\n")[1:50])), delimiter=delim))
    except csv.Error:                     # a bare carriage return inside a field
        return False
    for row in rows:
        if len(row) > idx and row[idx].strip():
            try:
                float(row[idx])
                return True
            except ValueError:
                return False
    return False


def classify_csv(path: Path, head: bytes) -> str | None:
    """Which CSV reader fits: ``csv_long``, ``csv_wide``, ``lightning``, ``wandb_csv``."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the 64 KB boundary
            return None
        text = head[:exc.start].decode("utf-8")
    hdr = _header(text)
    if hdr is None:
        return None
    fields, delim = hdr
    if len(text.split("\n")) < 2:
        return None
    low = {f.lower() for f in fields}
    wandb = [f for f in fields if _WANDB_COL.match(f)]
    if wandb and _pick(fields, STEP_COLUMNS) and len(wandb) == len(fields) - 1:
        return "wandb_csv"
    step = _pick(fields, STEP_COLUMNS)
    if step is None or not _numeric_sample(text, delim, fields, step):
        return None
    if _LONG_REQUIRED <= low:
        return "csv_long"
    if path.name == "metrics.csv" and ((path.parent / "hparams.yaml").is_file()
                                       or _VERSION_DIR.match(path.parent.name)):
        return "lightning"
    others = [f for f in fields if f != step]
    if any(_numeric_sample(text, delim, fields, f) for f in others[:50]):
        return "csv_wide"
    return None


def _read_sql(source, *, delim: str, names: list[str] | None,
              as_text: bool = False) -> tuple[duckdb.DuckDBPyConnection, str]:
    """An in-memory connection with view ``src`` over the CSV (file path or bytes)."""
    con = duckdb.connect()
    if isinstance(source, (bytes, bytearray)):
        rel = con.read_csv(io.BytesIO(source), header=False, names=names, all_varchar=True,
                           delimiter=delim, quotechar='"')
    else:
        # Typed columns (DuckDB's sniffer) parse fastest; a file whose later rows
        # contradict the sniffed types is read again as text and cast per cell.
        rel = con.read_csv(str(source), header=True, all_varchar=as_text, delimiter=delim,
                           quotechar='"')
    rel.create_view("src")
    return con, "src"


def _fetch_points(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run ``sql`` (columns of POINT_COLUMNS) to an Arrow table, metric dictionary-encoded."""
    table = con.sql(sql).to_arrow_table()
    idx = table.schema.get_field_index("metric")
    return table.set_column(idx, "metric", table.column("metric").dictionary_encode().unify_dictionaries())


def _unpivot_sql(step: str, metrics: list[str], wall: str | None, tokens: str | None,
                 extra: str = "") -> str:
    """Wide ``src`` to long points; UNPIVOT drops absent (NULL) cells, keeps NaN."""
    casts = ", ".join(f"TRY_CAST({_quote(m)} AS DOUBLE) AS {_quote(m)}" for m in metrics)
    wall_sql = f"TRY_CAST({_quote(wall)} AS DOUBLE)" if wall else "NULL::DOUBLE"
    tok_sql = f"TRY_CAST(TRY_CAST({_quote(tokens)} AS DOUBLE) AS BIGINT)" if tokens else "NULL::BIGINT"
    cols = ", ".join(_quote(m) for m in metrics)
    return f"""
        SELECT __step AS step, metric, value, __wall AS wall_time, __tokens AS tokens
        FROM (SELECT TRY_CAST(TRY_CAST({_quote(step)} AS DOUBLE) AS BIGINT) AS __step,
                     {wall_sql} AS __wall, {tok_sql} AS __tokens, {casts}
              FROM src {extra})
        UNPIVOT (value FOR metric IN ({cols}))
        WHERE __step IS NOT NULL"""


def _text_chunk(path: Path, start: int) -> tuple[bytes, int]:
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    chunk, used = complete_lines(data)
    decode_text(path, chunk, start)
    return chunk, used


def _first_line_end(path: Path) -> int:
    with open(path, "rb") as fh:
        line = fh.readline()
    return len(line)


class _CsvBase:
    appendable = True

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None) -> Parsed:
        if start == 0 or not state:
            head = open(path, "rb").read(64 * 1024)
            text = decode_text(path, head[: head.rfind(b"\n") + 1] or head)
            hdr = _header(text)
            if hdr is None:
                raise LogFormatError(path, "expected a CSV header line with a step column, "
                                           f"found {text.splitlines()[0][:80]!r}" if text else
                                     "expected a CSV header line, found an empty file")
            fields, delim = hdr
            state = self.plan(path, fields, delim)
            state["header_bytes"] = _first_line_end(path)
            # Whole file through read_csv; only complete lines count as read.
            size = path.stat().st_size
            with open(path, "rb") as fh:
                fh.seek(max(0, size - 1))
                last = fh.read(1)
            if last == b"\n" or size == 0:
                body_end = size
                con, _ = _read_sql(path, delim=delim, names=None)
            else:
                with open(path, "rb") as fh:
                    data = fh.read()
                chunk, used = complete_lines(data)
                decode_text(path, chunk)
                body_end = used
                body = chunk[state["header_bytes"]:]
                con, _ = _read_sql(body, delim=delim, names=fields)
            _check_utf8_file(path, con)
        else:
            chunk, used = _text_chunk(path, start)
            body_end = start + used
            if not chunk.strip():
                return Parsed(runs=[], read_bytes=body_end, state=state)
            con, _ = _read_sql(chunk, delim=state["delim"], names=state["fields"])
        try:
            try:
                runs = self.extract(path, con, state)
            except duckdb.ConversionException:
                if start != 0 and state.get("fields"):
                    raise
                con.close()
                con, _ = _read_sql(path, delim=state["delim"], names=None, as_text=True)
                runs = self.extract(path, con, state)
        finally:
            con.close()
        return Parsed(runs=runs, read_bytes=body_end, state=state)


def _check_utf8_file(path: Path, con) -> None:
    """DuckDB replaces invalid UTF-8 silently in some modes; check ourselves (cheap scan)."""
    with open(path, "rb") as fh:
        offset = 0
        carry = b""
        while True:
            block = fh.read(8 << 20)
            if not block:
                break
            data = carry + block
            try:
                data.decode("utf-8")
                carry = b""
            except UnicodeDecodeError as exc:
                if exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
                    carry = data[exc.start:]
                    decode_text(path, data[:exc.start], offset - len(carry))
                else:
                    decode_text(path, data, offset - len(carry))
            offset += len(block)


class CsvWideReader(_CsvBase):
    name = "csv_wide"
    help = "CSV with a step column and one column per metric (step,train_loss,val_loss,...)"

    def plan(self, path: Path, fields: list[str], delim: str) -> dict:
        step = _pick(fields, STEP_COLUMNS)
        if step is None:
            raise LogFormatError(path, f"expected a step column ({', '.join(STEP_COLUMNS[:5])}, ...), "
                                       f"found columns {fields[:10]}")
        wall = _pick(fields, WALL_COLUMNS)
        tokens = _pick(fields, TOKEN_COLUMNS)
        metrics = [f for f in fields if f not in (step, wall, tokens) and f]
        return {"fields": fields, "delim": delim, "step": step, "wall": wall, "tokens": tokens,
                "metrics": metrics}

    def extract(self, path: Path, con, state: dict) -> list[RunData]:
        pts = _fetch_points(con, _unpivot_sql(state["step"], state["metrics"], state["wall"],
                                              state["tokens"]))
        pts = _rename(pts)
        return [RunData(name="", points=pts, resumed=steps_went_back(pts))]


class LightningReader(CsvWideReader):
    name = "lightning"
    help = "PyTorch Lightning CSVLogger folder (version_N/metrics.csv + hparams.yaml)"


class CsvLongReader(_CsvBase):
    name = "csv_long"
    help = "CSV with columns step,metric,value (optionally wall_time, tokens)"

    def plan(self, path: Path, fields: list[str], delim: str) -> dict:
        low = {f.lower(): f for f in fields}
        missing = sorted(_LONG_REQUIRED - set(low))
        if missing:
            raise LogFormatError(path, f"expected columns step, metric, value; missing {missing}")
        return {"fields": fields, "delim": delim, "step": low["step"], "metric": low["metric"],
                "value": low["value"], "wall": _pick(fields, WALL_COLUMNS),
                "tokens": _pick(fields, TOKEN_COLUMNS)}

    def extract(self, path: Path, con, state: dict) -> list[RunData]:
        wall = f"TRY_CAST({_quote(state['wall'])} AS DOUBLE)" if state["wall"] else "NULL::DOUBLE"
        tok = (f"TRY_CAST(TRY_CAST({_quote(state['tokens'])} AS DOUBLE) AS BIGINT)"
               if state["tokens"] else "NULL::BIGINT")
        sql = f"""
            SELECT step, metric, value, wall_time, tokens FROM (
              SELECT TRY_CAST(TRY_CAST({_quote(state['step'])} AS DOUBLE) AS BIGINT) AS step,
                     {_quote(state['metric'])} AS metric,
                     TRY_CAST({_quote(state['value'])} AS DOUBLE) AS value,
                     {wall} AS wall_time, {tok} AS tokens,
                     {_quote(state['value'])} AS raw
              FROM src)
            WHERE step IS NOT NULL AND metric IS NOT NULL AND raw IS NOT NULL"""
        pts = _rename(_fetch_points(con, sql))
        return [RunData(name="", points=pts, resumed=steps_went_back(pts))]


class WandbCsvReader(_CsvBase):
    name = "wandb_csv"
    help = "Weights & Biases CSV export: columns '<run> - <metric>' (+ __MIN/__MAX); many runs"
    appendable = False

    def plan(self, path: Path, fields: list[str], delim: str) -> dict:
        step = _pick(fields, STEP_COLUMNS)
        runs: dict[str, list[list[str]]] = {}
        for f in fields:
            m = _WANDB_COL.match(f)
            if m and not m.group("band"):
                runs.setdefault(m.group("run"), []).append([f, m.group("metric")])
        if step is None or not runs:
            raise LogFormatError(path, "expected a W&B export: a Step column and columns "
                                       f"'<run> - <metric>', found columns {fields[:10]}")
        return {"fields": fields, "delim": delim, "step": step, "runs": runs}

    def extract(self, path: Path, con, state: dict) -> list[RunData]:
        out = []
        for run, cols in state["runs"].items():
            pts = _fetch_points(con, _unpivot_sql(state["step"], [c for c, _ in cols], None, None))
            mapping = {c: m for c, m in cols}
            if pts.num_rows:
                names = metric_codes(pts)[1]
                codes = metric_codes(pts)[0]
                metric = pa.array([normalise_metric(mapping[n]) for n in names], type=pa.string())
                pts = pts.set_column(pts.schema.get_field_index("metric"), "metric",
                                     pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), metric))
            out.append(RunData(name=run, points=pts, resumed=steps_went_back(pts)))
        return out


def _rename(pts: pa.Table) -> pa.Table:
    """Normalised metric names (``normalise_metric``) on the dictionary, not per point."""
    col = pts.column("metric")
    if col.num_chunks == 0 or pts.num_rows == 0:
        return pts
    names = [str(x) for x in col.chunks[0].dictionary.to_pylist()]
    new = [normalise_metric(n) for n in names]
    if new == names:
        return pts
    if len(set(new)) == len(new):
        dictionary = pa.array(new, type=pa.string())
        chunks = [pa.DictionaryArray.from_arrays(c.indices, dictionary) for c in col.chunks]
        return pts.set_column(pts.schema.get_field_index("metric"), "metric", pa.chunked_array(chunks))
    mapped = pa.array(np.array(new, dtype=object)[metric_codes(pts)[0]], type=pa.string())
    return pts.set_column(pts.schema.get_field_index("metric"), "metric", mapped.dictionary_encode())


__all__ = ["CsvLongReader", "CsvWideReader", "LightningReader", "WandbCsvReader", "classify_csv",
           "STEP_COLUMNS", "WALL_COLUMNS", "TOKEN_COLUMNS"]
