"""What the CSV readers (``csv_long``, ``csv_wide``, ``lightning``,
``wandb_csv``) share: the header, which of them a file is, and the SQL that
reads its rows.

A CSV reader parses no rows itself. It reads the header, plans the columns
(its ``plan``) and hands the store step ``SqlPoints`` (its ``extract``): a
SELECT over DuckDB's own ``read_csv`` of the file (every column as text,
converted with TRY_CAST), the wide layouts reshaped to long points with
``UNPIVOT``. The store runs it inside its transaction, so the file is parsed
once, straight into the points table (no Python loop per row, no copy
through Arrow or numpy). An empty cell is no point; a cell that says ``nan``
is a point whose value is NaN (stored as NULL), ``inf`` one whose value is
infinite.

A cell that holds text where a number belongs (``n/a``, ``1,5``, ``--``) is
no point, and is counted: ``unread_select`` gives the store step the count
and the first texts, which the file's report line shows ("3 cells not
numbers: n/a"); a row whose step is not a number is counted the same way.

Columns that name runs (``label_columns``: text in every sampled cell, such
as paper B's ``task,variant,step,loss_mean``) split the file into one run
per combination of their values (``run_groups``), named ``task=COPY
variant=QKV``; each run's SELECT keeps its own rows (``group_where``).

A line longer than ``QKVSCOPE_CSV_LINE_BYTES`` is refused before DuckDB reads
the file (``_csv_bytes``): the file fails with one line naming the line and
its length (DuckDB would otherwise fail with an unrelated message, or skip
the line). A file whose lines end in ``\r\r\n`` (Keras' ``CSVLogger`` on
Windows: ``WINDOWS_CSV_LINE_END``) is read as if they ended in ``\n``.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

import duckdb

from loaders import duck
from loaders.errors import LogFormatError
from loaders.logs.base import (SOURCE_VIEW, Parsed, RunData, complete_lines, decode_text, normalise_metric,
                               read_head)
from loaders.logs.readers._csv_bytes import (check_utf8_file, complete_end, csv_line_bytes, first_line_end,
                                             scan_bytes, text_chunk)

STEP_COLUMNS = ("step", "global_step", "_step", "iter", "iteration", "iter_num", "it",
                "trainer/global_step", "steps")
#: The step axis of a per-epoch log without any of ``STEP_COLUMNS``.
EPOCH_COLUMNS = ("epoch", "epochs")
WALL_COLUMNS = ("wall_time", "walltime", "_timestamp", "timestamp", "time_s", "elapsed_s")
TOKEN_COLUMNS = ("tokens", "tokens_seen", "num_tokens", "num_input_tokens_seen")
LONG_REQUIRED = {"step", "metric", "value"}
WANDB_COL = re.compile(r"^(?P<run>.+?) - (?P<metric>.+?)(?P<band>__MIN|__MAX)?$")
VERSION_DIR = re.compile(r"^version_\d+$")


def quote(name: str) -> str:
    """A SQL identifier for a column name taken from a file header."""
    return '"' + name.replace('"', '""') + '"'


def header_fields(text: str) -> tuple[list[str], str] | None:
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
    step = pick(fields, STEP_COLUMNS)
    if step is not None:
        return step, "step"
    epoch = pick(fields, EPOCH_COLUMNS)
    return (epoch, "epoch") if epoch is not None else (None, "step")


def pick(fields: list[str], names: tuple[str, ...]) -> str | None:
    low = {f.lower(): f for f in fields}
    for n in names:
        if n in low:
            return low[n]
    return None


#: Cell texts that stand for a missing or yes/no value, not for a label: a
#: column of them is a metric column whose cells are not numbers.
NOT_LABELS = {"n/a", "na", "none", "null", "nil", "-", "--", "?", "#n/a", "missing", "true", "false",
              "yes", "no"}
#: A date or a time of day: a timestamp column, not a label.
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}|^\d{1,2}:\d{2}")


def sample_rows(text: str, delim: str) -> list[list[str]]:
    """The first 49 data rows of a CSV's head (``[]`` when they do not parse)."""
    try:
        return list(csv.reader(io.StringIO("\n".join(text.split("\n")[1:50])), delimiter=delim))
    except csv.Error:                     # a bare carriage return inside a field
        return []


def _is_label(cell: str) -> bool:
    cell = cell.strip()
    if not cell or cell.lower() in NOT_LABELS or DATETIME.match(cell):
        return False
    try:
        float(cell)
        return False
    except ValueError:
        return True


def label_columns(text: str, delim: str, fields: list[str], candidates: list[str]) -> list[str]:
    """The columns of ``candidates`` that name runs: every non-empty cell of
    the head's first rows (``sample_rows``) is a label (text that is not a
    number, a missing-value marker such as ``n/a``, true/false, a date or a
    time), and there is one."""
    rows = sample_rows(text, delim)
    out = []
    for col in candidates:
        i = fields.index(col)
        cells = [r[i] for r in rows if len(r) > i and r[i].strip()]
        if cells and all(_is_label(c) for c in cells):
            out.append(col)
    return out


def head_text(path: Path) -> str:
    """The complete lines of the first ``HEAD_BYTES`` of ``path``, as text."""
    head = read_head(path)
    return decode_text(path, head[: head.rfind(b"\n") + 1] or head)


def _numeric_sample(text: str, delim: str, fields: list[str], col: str) -> bool:
    """Whether ``col`` holds a number in some of the first data rows."""
    idx = fields.index(col)
    for row in sample_rows(text, delim):
        if len(row) > idx and row[idx].strip():
            try:
                float(row[idx])
                return True
            except ValueError:
                return False
    return False


def classify_csv(path: Path, head: bytes) -> str | None:
    """Which CSV reader fits: ``csv_long``, ``csv_wide``, ``lightning``, ``wandb_csv``, or None.

    Each CSV reader's ``sniff`` asks this; the answer for one head is
    computed once (the four ask in turn)."""
    lightning = path.name == "metrics.csv" and ((path.parent / "hparams.yaml").is_file()
                                                or bool(VERSION_DIR.match(path.parent.name)))
    return _classify(head, lightning)


@lru_cache(maxsize=8)
def _classify(head: bytes, lightning: bool) -> str | None:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the 64 KB boundary
            return None
        text = head[:exc.start].decode("utf-8")
    hdr = header_fields(text)
    if hdr is None:
        return None
    fields, delim = hdr
    if len(text.split("\n")) < 2:
        return None
    low = {f.lower() for f in fields}
    wandb = [f for f in fields if WANDB_COL.match(f)]
    if wandb and pick(fields, STEP_COLUMNS) and len(wandb) == len(fields) - 1:
        return "wandb_csv"
    step, _ = step_column(fields)
    if step is None or not _numeric_sample(text, delim, fields, step):
        return None
    if LONG_REQUIRED <= low:
        return "csv_long"
    if lightning:
        return "lightning"
    others = [f for f in fields if f != step]
    if any(_numeric_sample(text, delim, fields, f) for f in others[:50]):
        return "csv_wide"
    # no number beside the step, but cells where numbers belong (n/a): read, to say so
    if set(others[:50]) - set(label_columns(text, delim, fields, others[:50])) - {""}:
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
    #: Lines end in ``\r\r\n`` (``WINDOWS_CSV_LINE_END``): DuckDB reads a copy ending them in ``\n``.
    double_cr: bool = False

    def __call__(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
        if self.double_cr:
            data = self.data
            if data is None:
                with open(self.path, "rb") as fh:
                    data = fh.read(self.size or -1)
            src = io.BytesIO(data.replace(WINDOWS_CSV_LINE_END, b"\n"))
        else:   # the file itself, never a pattern its name may spell (log?.csv)
            src = duck.literal_file(self.path) if self.data is None else io.BytesIO(self.data)
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


#: A CSV written on Windows by Python's ``csv`` module into a file opened in
#: text mode (Keras' ``CSVLogger``): the writer ends rows in ``\r\n`` and the
#: file turns its ``\n`` into ``\r\n`` again. DuckDB's parser refuses the
#: lone ``\r``; such a file is read as if its lines ended in ``\n``.
WINDOWS_CSV_LINE_END = b"\r\r\n"


def cast_step(col: str) -> str:
    return f"TRY_CAST(TRY_CAST({quote(col)} AS DOUBLE) AS BIGINT)"


def cast_wall(col: str | None) -> str:
    return f"TRY_CAST({quote(col)} AS DOUBLE)" if col else "NULL::DOUBLE"


def cast_tokens(col: str | None) -> str:
    return f"TRY_CAST(TRY_CAST({quote(col)} AS DOUBLE) AS BIGINT)" if col else "NULL::BIGINT"


# Names the unpivot SELECT uses for itself; a metric alias must not be one.
_RESERVED = {"__step", "__wall", "__tokens", "__metric", "__value"}


def unpivot_select(step: str, metrics: list[tuple[str, str]], wall: str | None,
                   tokens: str | None, where: str = "true") -> tuple[str, dict]:
    """(SELECT, params): wide rows of ``SOURCE_VIEW`` to long points.

    ``metrics``: (column, metric name as logged) pairs. UNPIVOT drops absent
    (NULL) cells and keeps NaN; rows come out row-major (all metrics of row 0,
    then row 1), which is file order. The normalised names are the column
    aliases, so the metric column needs no per-row mapping; when two names
    coincide (``loss`` and ``train_loss``), the aliases are positional and a
    parameter list maps them. ``where``: which rows of the file (``group_where``).
    """
    names = [normalise_metric(m) for _, m in metrics]
    low = [n.lower() for n in names]
    by_alias = len(set(low)) == len(low) and not (set(low) & _RESERVED) and all("\x00" not in n for n in names)
    aliases = names if by_alias else [f"__m{i}" for i in range(len(names))]
    casts = ", ".join(f"TRY_CAST({quote(c)} AS DOUBLE) AS {quote(a)}" for (c, _), a in zip(metrics, aliases))
    metric_sql, params = "__metric", {}
    if not by_alias:
        metric_sql, params = "list_extract($metric_names, CAST(substr(__metric, 4) AS INTEGER) + 1)", \
            {"metric_names": names}
    return f"""
        SELECT __step AS step, {metric_sql} AS metric, __value AS value, __wall AS wall_time,
               __tokens AS tokens
        FROM (SELECT {cast_step(step)} AS __step, {cast_wall(wall)} AS __wall,
                     {cast_tokens(tokens)} AS __tokens, {casts}
              FROM {SOURCE_VIEW} WHERE {where})
        UNPIVOT (__value FOR __metric IN ({", ".join(quote(a) for a in aliases)}))
        WHERE __step IS NOT NULL""", params


def _not_number(x: str) -> str:
    return f"TRY_CAST({x} AS DOUBLE) IS NULL"


def unread_select(step: str, cells: list[str], where: str = "true", *,
                  empty_counts: bool = False) -> tuple[str, str]:
    """(counts, texts): two SELECTs over ``SOURCE_VIEW`` of what the points
    SELECT cannot read, among the rows ``where`` keeps.

    ``counts`` gives one row: (cells of ``cells`` in rows with a step that
    are not numbers, rows with a cell but no step number). ``texts`` gives
    one row: the first 4 distinct texts of each (in file order), run only
    when a count is not 0. ``empty_counts``: an empty cell is counted too,
    as ``''`` (the value of a long CSV's row; a wide CSV's empty cells are
    its sparse layout). Both are one pass over the file.
    """
    if not cells:
        return "SELECT 0, 0", "SELECT [], []"
    q = [quote(c) for c in cells]
    vals = ", ".join(f"coalesce({c}, '')" if empty_counts else c for c in q)
    blank = "" if empty_counts else " AND trim(x) <> ''"           # a blank cell is an empty one
    bad = f"list_filter([{vals}], lambda x: x IS NOT NULL{blank} AND {_not_number('x')})"
    no_step = f"{cast_step(step)} IS NULL AND coalesce({quote(step)}, {', '.join(q)}) IS NOT NULL"
    src = f"SELECT {cast_step(step)} IS NOT NULL AS __ok, {bad} AS __bad, {quote(step)} AS __rawstep, " \
          f"({no_step}) AS __nostep FROM {SOURCE_VIEW} WHERE {where}"
    counts = f"""SELECT coalesce(sum(len(__bad)) FILTER (WHERE __ok), 0)::BIGINT,
                        count(*) FILTER (WHERE __nostep) FROM ({src})"""
    texts = f"""
        WITH r AS MATERIALIZED (SELECT row_number() OVER () AS __rn, * FROM ({src}))
        SELECT (SELECT coalesce(list(t ORDER BY f), []) FROM (
                   SELECT t, min(__rn) AS f FROM (SELECT __rn, unnest(__bad) AS t FROM r WHERE __ok)
                   GROUP BY t ORDER BY f LIMIT 4)),
               (SELECT coalesce(list(t ORDER BY f), []) FROM (
                   SELECT coalesce(__rawstep, '') AS t, min(__rn) AS f FROM r WHERE __nostep
                   GROUP BY t ORDER BY f LIMIT 4))"""
    return counts, texts


def group_where(columns: list[str], values: tuple) -> tuple[str, dict]:
    """(SQL condition, params): the rows whose ``columns`` hold ``values`` (None: empty)."""
    conds, params = [], {}
    for i, (c, v) in enumerate(zip(columns, values)):
        conds.append(f"{quote(c)} IS NOT DISTINCT FROM $__g{i}")
        params[f"__g{i}"] = v
    return (" AND ".join(conds) or "true"), params


def run_groups(source: CsvFile, columns: list[str]) -> list[tuple]:
    """The distinct combinations of ``columns``' values in ``source``, in the
    order they first appear (one DuckDB pass over the file)."""
    cols = ", ".join(quote(c) for c in columns)
    con = duck.connect()
    try:
        con.register(SOURCE_VIEW, source(con))
        return [tuple(r) for r in con.execute(
            f"""SELECT {cols} FROM (SELECT {cols}, row_number() OVER () AS __rn FROM {SOURCE_VIEW})
                GROUP BY {cols} ORDER BY min(__rn)""").fetchall()]
    finally:
        con.close()


def split_runs(source: CsvFile, state: dict,
               run: Callable[[str, dict], RunData]) -> list[RunData]:
    """The runs of a CSV: ``run(where, params)`` for the whole file, or, when
    it has label columns (``state["labels"]``), one per combination of their
    values, named ``group_name`` and configured ``{"run_columns": {...}}``."""
    labels = state.get("labels") or []
    if not labels:
        return [run("true", {})]
    names = columns(state)
    cols = [names[f] for f in labels]
    out = []
    for values in run_groups(source, cols):
        where, params = group_where(cols, values)
        r = run(where, params)
        r.name = group_name(labels, values)
        r.config = {**r.config, "run_columns": dict(zip(labels, values))}
        out.append(r)
    return out


def group_name(fields: list[str], values: tuple) -> str:
    """``task=COPY variant=QKV``: a run's name from the values of its label columns."""
    return " ".join(f"{f}={'' if v is None else v}" for f, v in zip(fields, values))


def read_csv_log(path: Path, plan: Callable[[Path, list[str], str], dict],
                 extract: Callable[[CsvFile | None, dict], list[RunData]], *, start: int = 0,
                 state: dict | None = None, complete: bool = False) -> Parsed:
    """A CSV reader's ``read``: the header through ``plan(path, fields,
    delimiter) -> state``, then ``extract(source, state) -> runs`` (source
    None for a file without rows). Appended bytes (``start`` > 0) are read
    with the header planned before (``state``)."""
    if start == 0 or not state:
        text = head_text(path)
        hdr = header_fields(text)
        if hdr is None:
            raise LogFormatError(path, "expected a CSV header line with a step column, "
                                       f"found {text.splitlines()[0][:80]!r}" if text else
                                 "expected a CSV header line, found an empty file")
        fields, delim = hdr
        state = plan(path, fields, delim)
        state["header_bytes"] = first_line_end(path)
        with open(path, "rb") as fh:
            state["double_cr"] = WINDOWS_CSV_LINE_END in fh.read(state["header_bytes"])
        # The whole file through read_csv; only complete lines count as read.
        size = path.stat().st_size
        with open(path, "rb") as fh:
            fh.seek(max(0, size - 1))
            last = fh.read(1)
        columns = tuple(column_names(state["fields"]))
        if last == b"\n" or size == 0 or complete:
            check_utf8_file(path)
            body_end = size
            if last != b"\n" and size:   # finished, last line without newline: read it,
                body_end = complete_end(path, size)     # count only complete lines as read
            source = CsvFile(path, None, True, columns, delim, size, state["double_cr"])
            empty = size <= state["header_bytes"]
        else:                               # a log being written: its last line is not complete
            with open(path, "rb") as fh:
                chunk, body_end = complete_lines(fh.read())
            scan_bytes(path, chunk)
            decode_text(path, chunk)
            source = CsvFile(path, chunk, True, columns, delim, double_cr=state["double_cr"])
            empty = body_end <= state["header_bytes"]
    else:
        chunk, used = text_chunk(path, start, complete=complete)
        body_end = start + used
        if not chunk.strip():
            return Parsed(runs=[], read_bytes=body_end, state=state)
        source = CsvFile(path, chunk, False, tuple(column_names(state["fields"])), state["delim"],
                         double_cr=bool(state.get("double_cr")))
        empty = False
    return Parsed(runs=extract(None if empty else source, state), read_bytes=body_end, state=state)


def columns(state: dict) -> dict[str, str]:
    """Each header field's read_csv column name (``column_names``; a repeated field: its first
    column), built once for all of a file's fields: a wide CSV has thousands."""
    out: dict[str, str] = {}
    for f, name in zip(state["fields"], column_names(state["fields"])):
        out.setdefault(f, name)
    return out


def column(state: dict, field: str | None) -> str | None:
    """The read_csv column name of header field ``field``."""
    return None if field is None else columns(state)[field]
