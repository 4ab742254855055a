"""CSV training logs: long, wide, PyTorch Lightning ``CSVLogger``, W&B exports.

A reader parses no rows itself. It reads the header, plans the columns and
hands the store step ``SqlPoints``: a SELECT over DuckDB's own ``read_csv`` of
the file (every column as text, converted with TRY_CAST), the wide layouts
reshaped to long points with ``UNPIVOT``. The store runs it inside its
transaction, so the file is parsed once, straight into the points table
(issue 3: no Python loop per row, no copy through Arrow or numpy). An empty
cell is no point; a cell that says ``nan`` is a point whose value is NaN
(stored as NULL).

* long: columns ``step,metric,value`` (optionally ``wall_time``/``tokens``).
* wide: a step column (``step``, ``global_step``, ``iter``, ...) and one
  numeric column per metric. A file without a step column but with
  ``epoch`` (paper B's per-epoch logs, ``epoch,train_loss,val_loss,val_top1,
  val_top5,epoch_time_sec,lr``; timm's ``summary.csv``) uses the epoch as its
  step axis, and the run's config says ``step_axis: "epoch"``.
* Lightning: ``version_N/metrics.csv`` beside ``hparams.yaml``; a wide CSV
  with sparse columns, ``epoch`` kept as a metric.
* W&B: columns ``<run name> - <metric>`` with ``__MIN``/``__MAX``
  companions (dropped: they are the band around the same metric); one file
  holds many runs.

A line longer than ``QKVSCOPE_CSV_LINE_BYTES`` is refused before DuckDB reads the
file: the file fails with one line naming the line and its length (DuckDB
would otherwise fail with an unrelated message, or skip the line).
"""
from __future__ import annotations

import csv
import io
import mmap
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb
import numpy as np

from loaders.budgets import budget
from loaders.errors import LogFormatError
from loaders.logs.base import (SOURCE_VIEW, Parsed, RunData, SqlPoints, complete_lines, decode_text,
                               empty_points, metric_alias_sql, normalise_metric, read_head)

STEP_COLUMNS = ("step", "global_step", "_step", "iter", "iteration", "iter_num", "it",
                "trainer/global_step", "steps")
#: The step axis of a per-epoch log without any of ``STEP_COLUMNS``.
EPOCH_COLUMNS = ("epoch", "epochs")
#: The longest CSV line read, in bytes (DuckDB's default ``max_line_size``).
def csv_line_bytes() -> int:
    """The longest CSV line read: the ``QKVSCOPE_CSV_LINE_BYTES`` budget (2 MiB by default)."""
    return budget("QKVSCOPE_CSV_LINE_BYTES")
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


def step_column(fields: list[str]) -> tuple[str | None, str]:
    """(the step column, ``"step"`` or ``"epoch"``): a step column if there is
    one, else an epoch column (a per-epoch log), else (None, "step")."""
    step = _pick(fields, STEP_COLUMNS)
    if step is not None:
        return step, "step"
    epoch = _pick(fields, EPOCH_COLUMNS)
    return (epoch, "epoch") if epoch is not None else (None, "step")


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
    step, _ = step_column(fields)
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


def column_names(fields: list[str]) -> list[str]:
    """Unique names for ``read_csv``'s ``names``, one per header field.

    DuckDB needs them unique, compared case-insensitively; a repeated or empty
    header field gets ``_1``, ``_2``, ... (``columnN`` when empty), as DuckDB
    itself names them.
    """
    out: list[str] = []
    seen: set[str] = set()
    for i, f in enumerate(fields):
        base = f or f"column{i}"
        name, k = base, 1
        while name.lower() in seen:
            name, k = f"{base}_{k}", k + 1
        seen.add(name.lower())
        out.append(name)
    return out


@dataclass(frozen=True)
class CsvFile:
    """One CSV for DuckDB's ``read_csv`` (a ``PointSource``): the file, its
    first ``size`` bytes planned for; or ``data``, complete lines of it.
    ``header``: the first line is the header.

    Nothing is sniffed: the delimiter and the header are the ones this module
    read, every column is text (the SELECTs convert with TRY_CAST), so a row
    with another number of fields is an error naming its line, not a
    different guess of the dialect.
    """

    path: Path
    data: bytes | None          # None: read the file itself
    header: bool
    columns: tuple[str, ...]
    delim: str
    size: int = 0               # of the file, when read itself

    def __call__(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
        src = str(self.path) if self.data is None else io.BytesIO(self.data)
        return con.read_csv(src, header=self.header, columns={c: "VARCHAR" for c in self.columns},
                            delimiter=self.delim, quotechar='"', auto_detect=False,
                            max_line_size=csv_line_bytes() + 2)

    def changed(self) -> bool:
        if self.data is not None:
            return False
        try:
            return self.path.stat().st_size != self.size
        except OSError:                 # gone: the next attempt says so
            return True

    def frozen(self) -> CsvFile:
        if self.data is not None:
            return self
        with open(self.path, "rb") as fh:
            return replace(self, data=fh.read(self.size))


def _cast_step(col: str) -> str:
    return f"TRY_CAST(TRY_CAST({_quote(col)} AS DOUBLE) AS BIGINT)"


def _cast_wall(col: str | None) -> str:
    return f"TRY_CAST({_quote(col)} AS DOUBLE)" if col else "NULL::DOUBLE"


def _cast_tokens(col: str | None) -> str:
    return f"TRY_CAST(TRY_CAST({_quote(col)} AS DOUBLE) AS BIGINT)" if col else "NULL::BIGINT"


# Names the unpivot SELECT uses for itself; a metric alias must not be one.
_RESERVED = {"__step", "__wall", "__tokens", "__metric", "__value"}


def unpivot_select(step: str, metrics: list[tuple[str, str]], wall: str | None,
                   tokens: str | None) -> tuple[str, dict]:
    """(SELECT, params): wide rows of ``SOURCE_VIEW`` to long points.

    ``metrics``: (column, metric name as logged) pairs. UNPIVOT drops absent
    (NULL) cells and keeps NaN; rows come out row-major (all metrics of row 0,
    then row 1), which is file order. The normalised names are the column
    aliases, so the metric column needs no per-row mapping; when two names
    coincide (``loss`` and ``train_loss``), the aliases are positional and a
    parameter list maps them.
    """
    names = [normalise_metric(m) for _, m in metrics]
    low = [n.lower() for n in names]
    by_alias = len(set(low)) == len(low) and not (set(low) & _RESERVED) and all("\x00" not in n for n in names)
    aliases = names if by_alias else [f"__m{i}" for i in range(len(names))]
    casts = ", ".join(f"TRY_CAST({_quote(c)} AS DOUBLE) AS {_quote(a)}" for (c, _), a in zip(metrics, aliases))
    metric_sql, params = "__metric", {}
    if not by_alias:
        metric_sql, params = "list_extract($metric_names, CAST(substr(__metric, 4) AS INTEGER) + 1)", \
            {"metric_names": names}
    return f"""
        SELECT __step AS step, {metric_sql} AS metric, __value AS value, __wall AS wall_time,
               __tokens AS tokens
        FROM (SELECT {_cast_step(step)} AS __step, {_cast_wall(wall)} AS __wall,
                     {_cast_tokens(tokens)} AS __tokens, {casts}
              FROM {SOURCE_VIEW})
        UNPIVOT (__value FOR __metric IN ({", ".join(_quote(a) for a in aliases)}))
        WHERE __step IS NOT NULL""", params


def _text_chunk(path: Path, start: int, *, complete: bool = False) -> tuple[bytes, int]:
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    chunk, used = complete_lines(data, complete)
    _scan_bytes(path, chunk)
    decode_text(path, chunk, start)
    return chunk, used


def _complete_end(path: Path, size: int) -> int:
    """The end of the last complete line of ``path`` (0 if none), read backwards in blocks."""
    with open(path, "rb") as fh:
        end = size
        while end > 0:
            start = max(0, end - (1 << 20))
            fh.seek(start)
            i = fh.read(end - start).rfind(b"\n")
            if i >= 0:
                return start + i + 1
            end = start
    return 0


def _first_line_end(path: Path) -> int:
    with open(path, "rb") as fh:
        line = fh.readline()
    return len(line)


_SCAN_BLOCK = 4 << 20


def _scan_bytes(path: Path, data, offset: int = 0, size: int | None = None) -> bool:
    """Whether every byte of ``data`` (bytes of ``path`` from ``offset``) is below
    0x80; LogFormatError at the first line longer than ``QKVSCOPE_CSV_LINE_BYTES``.

    One vectorised pass in blocks of 4 MiB (the newline positions of a block,
    the gap to the previous block's last newline carried over).
    """
    size = len(data) if size is None else size
    limit = csv_line_bytes()
    top = 0
    last_nl = -1                      # offset in data of the last newline seen
    lines_before = 0                  # newlines before the current block
    for start in range(0, size, _SCAN_BLOCK):
        block = np.frombuffer(data, dtype=np.uint8, count=min(_SCAN_BLOCK, size - start), offset=start)
        top = max(top, int(block.max()))
        nl = np.flatnonzero(block == 10) + start             # (newlines in block,)
        del block                     # a map cannot close while numpy holds a view of it
        gaps = np.diff(nl, prepend=last_nl) - 1              # (newlines in block,) line lengths
        if len(gaps) and int(gaps.max()) > limit:
            i = int(np.argmax(gaps > limit))
            _too_long(path, lines_before + i + 1, int(gaps[i]))
        if len(nl):
            last_nl = int(nl[-1])
        lines_before += len(nl)
    if size - last_nl - 1 > limit:
        _too_long(path, lines_before + 1, size - last_nl - 1)
    return top < 0x80


def _too_long(path: Path, line: int, length: int) -> None:
    raise LogFormatError(path, f"line {line:,} is {length:,} bytes long, over the {csv_line_bytes():,}-byte "
                               f"limit for one CSV line (QKVSCOPE_CSV_LINE_BYTES; set it in the environment "
                               f"to raise it); the file is refused, not read without that line")


def _scan_file(path: Path) -> bool:
    """``_scan_bytes`` over a read-only map of the whole file, without copying it."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return True
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _scan_bytes(path, mm, 0, size)


def _check_utf8_file(path: Path) -> None:
    """LogFormatError at the first byte of ``path`` that is not UTF-8, or at
    its first line over ``QKVSCOPE_CSV_LINE_BYTES``.

    DuckDB validates only the columns a query reads, so the whole file is
    checked here: most logs are ASCII (``_scan_file``); others are decoded
    block by block.
    """
    if _scan_file(path):
        return
    offset = 0            # file offset of ``carry`` + the next block
    carry = b""           # a character cut at the end of the previous block
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            if not carry and block.isascii():
                offset += len(block)
                continue
            data = carry + block
            try:
                data.decode("utf-8")
                carry, offset = b"", offset + len(data)
            except UnicodeDecodeError as exc:
                if exc.reason != "unexpected end of data" or exc.start < len(data) - 3:
                    decode_text(path, data, offset)          # raises, naming the byte and its offset
                carry, offset = data[exc.start:], offset + exc.start
    if carry:
        decode_text(path, carry, offset)


class _CsvBase:
    appendable = True
    #: ``parse`` reads the header only; the store step reads the rows (SqlPoints).
    rows_read_by_store = True

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None,
              complete: bool = False) -> Parsed:
        if start == 0 or not state:
            head = read_head(path)
            text = decode_text(path, head[: head.rfind(b"\n") + 1] or head)
            hdr = _header(text)
            if hdr is None:
                raise LogFormatError(path, "expected a CSV header line with a step column, "
                                           f"found {text.splitlines()[0][:80]!r}" if text else
                                     "expected a CSV header line, found an empty file")
            fields, delim = hdr
            state = self.plan(path, fields, delim)
            state["header_bytes"] = _first_line_end(path)
            # The whole file through read_csv; only complete lines count as read.
            size = path.stat().st_size
            with open(path, "rb") as fh:
                fh.seek(max(0, size - 1))
                last = fh.read(1)
            columns = tuple(column_names(state["fields"]))
            if last == b"\n" or size == 0 or complete:
                _check_utf8_file(path)
                body_end = size
                if last != b"\n" and size:   # finished, last line without newline: read it,
                    body_end = _complete_end(path, size)     # count only complete lines as read
                source = CsvFile(path, None, True, columns, delim, size)
                empty = size <= state["header_bytes"]
            else:                               # a log being written: its last line is not complete
                with open(path, "rb") as fh:
                    chunk, body_end = complete_lines(fh.read())
                _scan_bytes(path, chunk)
                decode_text(path, chunk)
                source = CsvFile(path, chunk, True, columns, delim)
                empty = body_end <= state["header_bytes"]
        else:
            chunk, used = _text_chunk(path, start, complete=complete)
            body_end = start + used
            if not chunk.strip():
                return Parsed(runs=[], read_bytes=body_end, state=state)
            source = CsvFile(path, chunk, False, tuple(column_names(state["fields"])), state["delim"])
            empty = False
        return Parsed(runs=self.extract(None if empty else source, state), read_bytes=body_end, state=state)

    @staticmethod
    def _column(state: dict, field: str | None) -> str | None:
        """The read_csv column name of header field ``field``."""
        return None if field is None else column_names(state["fields"])[state["fields"].index(field)]


class CsvWideReader(_CsvBase):
    name = "csv_wide"
    help = "CSV with a step column and one column per metric (step,train_loss,val_loss,...)"

    def plan(self, path: Path, fields: list[str], delim: str) -> dict:
        step, axis = step_column(fields)
        if step is None:
            raise LogFormatError(path, f"expected a step column ({', '.join(STEP_COLUMNS[:5])}, ...) "
                                       f"or an epoch column, found columns {fields[:10]}")
        wall = _pick(fields, WALL_COLUMNS)
        tokens = _pick(fields, TOKEN_COLUMNS)
        metrics = [f for f in fields if f not in (step, wall, tokens) and f]
        return {"fields": fields, "delim": delim, "step": step, "wall": wall, "tokens": tokens,
                "metrics": metrics, "step_axis": axis}

    def extract(self, source: CsvFile | None, state: dict) -> list[RunData]:
        config = {"step_axis": "epoch"} if state.get("step_axis") == "epoch" else {}
        if source is None:
            return [RunData(name="", points=empty_points(), config=config)]
        fields, cols = state["fields"], column_names(state["fields"])
        metrics = [(c, f) for c, f in zip(cols, fields) if f not in (state["step"], state["wall"],
                                                                      state["tokens"]) and f]
        select, params = unpivot_select(self._column(state, state["step"]), metrics,
                                        self._column(state, state["wall"]),
                                        self._column(state, state["tokens"]))
        return [RunData(name="", points=SqlPoints(source, select, params), config=config)]


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

    def extract(self, source: CsvFile | None, state: dict) -> list[RunData]:
        if source is None:
            return [RunData(name="", points=empty_points())]
        col = {k: self._column(state, state[k]) for k in ("step", "metric", "value", "wall", "tokens")}
        # An empty value cell is no point; one that is no number is a point without value.
        select = f"""
            SELECT step, {metric_alias_sql("metric")} AS metric, value, wall_time, tokens FROM (
              SELECT {_cast_step(col["step"])} AS step, {_quote(col["metric"])} AS metric,
                     TRY_CAST({_quote(col["value"])} AS DOUBLE) AS value,
                     {_cast_wall(col["wall"])} AS wall_time, {_cast_tokens(col["tokens"])} AS tokens,
                     {_quote(col["value"])} AS raw
              FROM {SOURCE_VIEW})
            WHERE step IS NOT NULL AND metric IS NOT NULL AND raw IS NOT NULL"""
        return [RunData(name="", points=SqlPoints(source, select))]


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

    def extract(self, source: CsvFile | None, state: dict) -> list[RunData]:
        out = []
        for run, cols in state["runs"].items():
            if source is None:
                out.append(RunData(name=run, points=empty_points()))
                continue
            metrics = [(self._column(state, c), m) for c, m in cols]
            select, params = unpivot_select(self._column(state, state["step"]), metrics, None, None)
            out.append(RunData(name=run, points=SqlPoints(source, select, params)))
        return out


__all__ = ["CsvLongReader", "CsvWideReader", "LightningReader", "WandbCsvReader", "classify_csv",
           "unpivot_select", "STEP_COLUMNS", "WALL_COLUMNS", "TOKEN_COLUMNS"]
