"""What every log reader returns, and the helpers they share.

A reader turns one file (or the appended tail of one) into ``Parsed``: a list
of ``RunData``, each holding the run's points in file order with the columns
of ``POINT_COLUMNS``, plus whatever metadata the file itself states. The
points are ONE long pandas DataFrame or Arrow table, or, for the CSV readers,
``SqlPoints``: a SELECT over DuckDB's own reader of the file that the store
step runs inside its transaction, so a large log is parsed once, straight into
the points table. Storing (journal, transactions, resumes, repeated steps,
NaN) is ``loaders.logs.ingest``'s job, not the readers'.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from loaders.budgets import budget
from loaders.errors import LogFormatError

#: Columns of a points frame, in order. ``metric`` may be str or categorical.
POINT_COLUMNS = ("step", "metric", "value", "wall_time", "tokens")

#: How many bytes detection may read from the start of a file.
HEAD_BYTES = 64 * 1024

# Metric names normalised across formats: the training loss, the
# validation loss, the validation top-1 accuracy and the learning rate;
# everything else keeps its logged name (paper B's CSVs keep val_top1, val_top5).
_METRIC_ALIASES = {
    "train/loss": "train/loss", "train_loss": "train/loss", "loss/train": "train/loss", "loss": "train/loss",
    "training_loss": "train/loss", "train-loss": "train/loss", "trainloss": "train/loss",
    "val/loss": "val/loss", "val_loss": "val/loss", "loss/val": "val/loss",
    "valid_loss": "val/loss", "validation_loss": "val/loss", "eval_loss": "val/loss",
    "eval/loss": "val/loss", "val-loss": "val/loss", "loss/validation": "val/loss",
    "lr": "lr", "learning_rate": "lr", "learning-rate": "lr", "train/lr": "lr",
    "train/learning_rate": "lr",
    # top-1 validation accuracy (qkvscope's image runs log val_accuracy; Lightning/Keras val_acc)
    "val/accuracy": "val/accuracy", "val_accuracy": "val/accuracy", "val_acc": "val/accuracy",
    "val/acc": "val/accuracy", "accuracy/val": "val/accuracy", "eval_accuracy": "val/accuracy",
    "eval/accuracy": "val/accuracy",
}


def metric_alias_sql(expr: str) -> str:
    """SQL mapping the usual exact spellings (``train_loss``, ``val_loss``,
    ``learning_rate``, ...) to their normalised names, others unchanged.

    Cheaper per row than ``normalise_metric`` in SQL; the store step
    normalises whatever this leaves (other case, whitespace, ``lr-Adam``).
    The aliases are this module's constants, not file content.
    """
    def lit(s: str) -> str:
        return "'" + s.replace("'", "''") + "'"
    whens = " ".join(f"WHEN {lit(k)} THEN {lit(v)}" for k, v in _METRIC_ALIASES.items() if k != v)
    return f"CASE {expr} {whens} ELSE {expr} END"


def normalise_metric(name: str) -> str:
    """``train/loss``, ``val/loss``, ``val/accuracy`` or ``lr`` for their usual spellings, else ``name``.

    Lightning's ``LearningRateMonitor`` writes ``lr-<Optimizer>``; that is ``lr`` too.
    Lightning's ``self.log(name, on_step=True, on_epoch=True)`` writes
    ``<name>_step`` (the value at each logged step) and ``<name>_epoch`` (its
    mean over the epoch, at the epoch's last step); of a name above, the
    per-step value of a training metric is the metric itself
    (``train_loss_step`` -> ``train/loss``) and its epoch mean keeps the
    suffix (``train_loss_epoch`` -> ``train/loss_epoch``); of a validation
    metric, the epoch value (over the whole validation set) is the metric
    (``val_loss_epoch`` -> ``val/loss``) and the per-batch value keeps the
    suffix (``val_loss_step`` -> ``val/loss_step``).
    """
    key = name.strip()
    low = key.lower()
    if low in _METRIC_ALIASES:
        return _METRIC_ALIASES[low]
    if low.startswith("lr-") and "/" not in low:
        return "lr"
    base, _, when = low.rpartition("_")
    canon = _METRIC_ALIASES.get(base) if when in ("step", "epoch") else None
    if canon and canon != "lr":
        own = "step" if canon.startswith("train/") else "epoch"
        return canon if when == own else f"{canon}_{when}"
    return key


@dataclass
class RunData:
    """One run found in a file: its points and what the file says about it."""

    name: str
    #: A pandas DataFrame, an Arrow table or ``SqlPoints``.
    points: pd.DataFrame | pa.Table | SqlPoints
    config: dict = field(default_factory=dict)
    #: Metadata the file itself states (variant, weight_decay, lr, seed, ...).
    meta: dict = field(default_factory=dict)
    #: True when the reader knows the run was resumed (the store step also
    #: finds steps that go back within ``points``).
    resumed: bool = False


#: The name under which the store step registers a ``SqlPoints`` relation.
SOURCE_VIEW = "qkv_log_source"


class PointSource(Protocol):
    """A log file as DuckDB reads it for ``SqlPoints``."""

    def __call__(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
        """Open it on ``con`` (the store's connection) with DuckDB's own reader."""

    def changed(self) -> bool:
        """Whether the file is no longer what the reader planned for (a log
        written to while DuckDB read it may have given it more, or half a line)."""

    def frozen(self) -> PointSource:
        """The same, over a copy of the bytes the reader planned for."""


@dataclass
class SqlPoints:
    """A run's points still in their file, as SQL the store step runs.

    The store registers ``source(con)`` as the temporary view ``SOURCE_VIEW``,
    which ``select`` reads. ``select`` yields the columns of ``POINT_COLUMNS``
    in file order (step BIGINT, metric VARCHAR, value DOUBLE, wall_time DOUBLE,
    tokens BIGINT); ``params`` are its named parameters. Metric names may
    still be raw: the store step normalises what is left. Errors of the
    file's content (DuckDB's ``InvalidInputException``, ...) surface when the
    store runs it.
    """

    source: PointSource
    select: str
    params: dict = field(default_factory=dict)
    #: (counts, texts): SELECTs of the cells ``select`` cannot read
    #: (``readers._csv.unread_select``), run by the store step for the report.
    unread: tuple[str, str] | None = None


@dataclass
class Unread:
    """Cells of a file that hold no number where one belongs, and rows without
    a step number: counted, with their first distinct texts, for the report."""

    cells: int = 0
    cell_texts: list[str] = field(default_factory=list)
    rows: int = 0
    row_texts: list[str] = field(default_factory=list)

    def add(self, other: Unread) -> None:
        self.cells += other.cells
        self.rows += other.rows
        self.cell_texts = list(dict.fromkeys(self.cell_texts + other.cell_texts))
        self.row_texts = list(dict.fromkeys(self.row_texts + other.row_texts))

    def __bool__(self) -> bool:
        return bool(self.cells or self.rows)

    def text(self) -> str:
        """``3 cells not numbers: n/a`` (and ``1 row without a step number: x``): the first
        three distinct texts, ``''`` for an empty cell, ``...`` when there are more."""
        def shown(texts: list[str]) -> str:
            out = ", ".join(t if t.strip() and t == t.strip() and "," not in t else repr(t) for t in texts[:3])
            return out + (", ..." if len(texts) > 3 else "")
        parts = []
        if self.cells:
            parts.append(f"{self.cells:,} {'cell' if self.cells == 1 else 'cells'} not "
                         f"{'a number' if self.cells == 1 else 'numbers'}: {shown(self.cell_texts)}")
        if self.rows:
            parts.append(f"{self.rows:,} {'row' if self.rows == 1 else 'rows'} without a step number: "
                         f"{shown(self.row_texts)}")
        return "; ".join(parts)


@dataclass
class Parsed:
    """A reader's result for one file (or the new tail of one): what its
    ``read`` returns (protocol: ``loaders.logs.readers``)."""

    runs: list[RunData]
    #: Bytes of the file consumed (end of the last complete line for text logs).
    read_bytes: int | None = None
    #: Reader state for the next append (JSON-able).
    state: dict = field(default_factory=dict)
    #: What the reader could not read and did not store (the file's report line says it).
    notes: list[str] = field(default_factory=list)


def empty_points() -> pd.DataFrame:
    return pd.DataFrame({
        "step": pd.Series([], dtype="int64"), "metric": pd.Series([], dtype="object"),
        "value": pd.Series([], dtype="float64"), "wall_time": pd.Series([], dtype="float64"),
        "tokens": pd.Series([], dtype="Int64"),
    })


def points_frame(step, metric, value, wall_time=None, tokens=None) -> pd.DataFrame:
    """A points frame from column arrays (scalars broadcast for ``metric``)."""
    step = np.asarray(step, dtype="int64")
    n = len(step)
    df = pd.DataFrame({
        "step": step,
        "metric": metric if not isinstance(metric, str) else [metric] * n,
        "value": np.asarray(value, dtype="float64"),
        "wall_time": (np.full(n, np.nan) if wall_time is None
                      else np.asarray(wall_time, dtype="float64")),
        "tokens": (pd.array([pd.NA] * n, dtype="Int64") if tokens is None
                   else pd.array(tokens, dtype="Int64")),
    })
    return df


# A points "frame" is a pandas DataFrame (small logs) or, for the JSONL reader,
# a pyarrow Table straight from DuckDB (no copy into Python objects).
def n_points(points) -> int:
    return points.num_rows if isinstance(points, pa.Table) else len(points)


def step_array(points) -> np.ndarray:
    if isinstance(points, pa.Table):
        return points.column("step").to_numpy()
    return points["step"].to_numpy(dtype="int64")


def metric_codes(points) -> tuple[np.ndarray, list[str]]:
    """(code per point, metric name per code)."""
    if isinstance(points, pa.Table):
        col = points.column("metric")
        if not pa.types.is_dictionary(col.type):
            col = col.dictionary_encode()
        col = col.unify_dictionaries()
        if col.num_chunks == 0:
            return np.zeros(0, dtype="int64"), []
        codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in col.chunks])
        return codes.astype("int64"), [str(x) for x in col.chunks[0].dictionary.to_pylist()]
    codes, names = pd.factorize(points["metric"], sort=False)
    return codes.astype("int64"), [str(x) for x in names]


def steps_went_back(points) -> bool:
    """Whether the steps of some metric decrease in file order (a resumed run)."""
    if n_points(points) < 2:
        return False
    steps = step_array(points)
    if np.all(steps[1:] >= steps[:-1]):
        return False
    codes, _ = metric_codes(points)
    diffs = pd.Series(steps).groupby(codes, sort=False).diff()
    return bool((diffs < 0).any())


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """The first ``n`` bytes of ``path``; for a text file whose first line is
    longer (a W&B export of a sweep: 3,001 columns, a 148 KB header), that line
    and ``n`` bytes after it, so the header and some rows are seen whole. A first
    line longer than ``QKVSCOPE_CSV_LINE_BYTES`` is read up to that budget only
    (``first_line_over_budget`` says so)."""
    with open(path, "rb") as fh:
        head = fh.read(n)
        if len(head) < n or b"\n" in head or not is_text_head(head):
            return head
        limit = budget("QKVSCOPE_CSV_LINE_BYTES")
        more = fh.read(limit + 1 - len(head))         # the rest of the longest line read
        end = more.find(b"\n")
        if end < 0:
            return head + more
        return head + more[:end + 1] + fh.read(n)


def first_line_over_budget(head: bytes) -> bool:
    """Whether ``head`` (from ``read_head``) is text whose first line is longer than
    ``QKVSCOPE_CSV_LINE_BYTES``: a log no reader reads, refused naming the budget."""
    return (is_text_head(head) and b"\n" not in head
            and len(head) > budget("QKVSCOPE_CSV_LINE_BYTES"))


#: The first bytes of a zip file (a torch ``.pt`` is one).
ZIP_MAGIC = b"PK\x03\x04"


def looks_binary(head: bytes) -> bool:
    return b"\x00" in head[:8192]


def is_text_head(head: bytes) -> bool:
    """Whether the first bytes of a file may be a text log: no zip, no NUL
    bytes. Every text reader's ``sniff`` asks this first."""
    return head[:4] != ZIP_MAGIC and not looks_binary(head)


def decode_text(path: Path, data: bytes, offset: int = 0) -> str:
    """UTF-8 text of ``data`` (bytes of ``path`` from ``offset``), or LogFormatError."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LogFormatError(
            path, f"expected UTF-8 text, found byte 0x{data[exc.start]:02x} at offset "
                  f"{offset + exc.start} that is not valid UTF-8") from None


def complete_lines(data: bytes, complete: bool = False) -> tuple[bytes, int]:
    """(the part of ``data`` to parse, the length of its complete lines).

    A log being written may end in half a line; that part is read next time:
    the part to parse ends at the last newline. When the file is complete (a
    finished log whose last line has no newline, ``complete``), the part to
    parse is all of ``data``, and the length still ends at the last newline,
    so that a log which grows after all re-reads that line whole.
    """
    end = data.rfind(b"\n")
    used = end + 1 if end >= 0 else 0
    return (data if complete else data[:used]), used
