"""Store one training log: journal, growth, resumes, one transaction per file.

The journal row of a log (``ingest_journal``, keyed by the resolved path)
holds its size, mtime, how far it was read (``read_bytes``, always the end of
a complete line) and the reader state in ``state``:
``{"reader": {...}, "fingerprint": hex, "runs": {name: {"id": N, "last": {metric: step}}}}``.

* same size and mtime: unchanged, nothing is read;
* a text log that grew and whose consumed part is unchanged (fingerprint:
  sha256 of the first and last 64 KB of the consumed part and its length):
  only the bytes from ``read_bytes`` on are parsed and appended;
* anything else (rewritten, shrunk, a binary or JSON format): read whole, and
  its points replace the ones this file stored before.

A resumed run (steps of a metric go back) stays ONE run: per (step, metric)
the point logged last wins, and ``runs.resumed`` is set. User corrections in
``run_overrides`` are written back over the run row after every ingest.

A run that logs its learning rate (metric ``lr``) and states none elsewhere
(log, config files) gets the peak of the logged values as ``runs.lr``
(``config["lr_peak"]``, ``config["lr_initial"]``: the first logged value),
so an llm.c ``main.log`` or a per-epoch CSV has the lr its schedule reached;
a line in ``config["metadata_notes"]`` says that it is a logged value, not
the configured one.

Several files feed one run where their format says they are one training
(the query-free paper's three tensors of a folder, a Trainer's state files,
the TensorBoard event files of one folder): which run a file feeds is
``loaders.logs.run_identity``'s. The reader is ``loaders.logs.registry``'s
choice (``reader_for``); user corrections are ``loaders.logs.runs``'
``apply_overrides``.

Points go in, and are checked, in SQL (``loaders.logs.newpoints``); a CSV is
read by DuckDB's ``read_csv`` inside the write transaction itself. Its cells
that are not numbers are counted there (``SqlPoints.unread``) and named on
the file's report line (``FileReport.reason``: "3 cells not numbers: n/a");
a file read whole that gives no point but such cells is a ``LogFormatError``
saying so, and stores nothing.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import os
import time
from pathlib import Path

import duckdb

from loaders import journal, run_rows
from loaders.errors import DatabaseBusyError, LogFormatError
from loaders.logs import metadata
from loaders.logs.base import Parsed, RunData, SqlPoints, Unread
from loaders.logs.newpoints import FileChanged, drop_points, insert_new_points, move_staged, replace_stored
from loaders.logs.readers import READERS
from loaders.logs.registry import reader_for, why_not_a_log
from loaders.logs.run_identity import hf_shares_run, run_name, run_source
from loaders.logs.runs import apply_overrides
from loaders.report import FileReport
from loaders.store import Store, refresh_run_stats

_FP_WINDOW = 64 * 1024
#: A file last modified at least this long ago is not being written.
_SETTLE_S = 2.0
#: Exceptions the parsing libraries (csv, json, pandas, numpy, DuckDB) raise on
#: malformed content; ``ingest_log`` reports them as ``LogFormatError``.
_PARSE_ERRORS = (ValueError, OverflowError, csv.Error, duckdb.Error)
#: What DuckDB raises on a file's content while the store step reads it
#: (``SqlPoints``): the same report. Other errors there are the store's.
_SQL_SOURCE_ERRORS = (duckdb.InvalidInputException, duckdb.ConversionException, duckdb.BinderException,
                      duckdb.OutOfRangeException, duckdb.ParserException)


def _cannot_parse(path: Path, fmt: str, exc: Exception, *, start: int = 0) -> LogFormatError:
    """The report of content a parsing library rejected; ``start``: the byte
    where the part read begins (a grown log), from which line numbers count."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    # DuckDB's CSV errors name the line on the first line of the message, and
    # what it held and how many fields were expected on later ones.
    what = lines[0][:200] + "".join(f"; {line[:120]}" for line in lines[1:]
                                     if line.startswith(("Original Line:", "Expected Number of Columns")))
    where = f" in the part from byte {start} on" if start else ""
    return LogFormatError(path, f"expected a {fmt} log, found content it cannot parse{where} "
                                f"({type(exc).__name__}: {what})")


def ends_unterminated(path: Path, size: int) -> bool:
    """Whether the file's last byte is not a newline."""
    if size == 0:
        return False
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1) != b"\n"


def is_finished(st: os.stat_result) -> bool:
    """Whether a file is not being written: unchanged for ``_SETTLE_S`` (its
    mtime that old). A log held back as being written is looked at again by
    the next ingest (or ``--watch`` poll) even if its size and mtime are the
    same, so the last line of a log that stopped growing is read then."""
    return time.time() - st.st_mtime >= _SETTLE_S


def fingerprint(path: Path, length: int) -> str:
    """sha256 over the first and last 64 KB of ``path[:length]`` and the length."""
    h = hashlib.sha256(str(length).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(min(length, _FP_WINDOW)))
        if length > _FP_WINDOW:
            fh.seek(max(_FP_WINDOW, length - _FP_WINDOW))
            h.update(fh.read(length - max(_FP_WINDOW, length - _FP_WINDOW)))
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _JournalMoved(Exception):
    """Another process stored this file between our journal read and our write."""


def ingest_log(store: Store, path: Path, *, format: str | None = None) -> list[FileReport]:
    """Parse ``path`` and store it in one transaction; see the module docstring.

    Raises ``LogFormatError`` for a file no reader understands or a broken one.

    Two processes may ingest the same file at once (two ``ingest`` commands,
    or one beside the dashboard's ingest form). The journal row read before
    parsing is checked again inside the write transaction; if another process
    stored the file meanwhile, this attempt is rolled back and the file is
    looked at afresh (it is then usually ``unchanged``), so no point is
    stored twice.

    A CSV is read by DuckDB inside the write transaction (``SqlPoints``). If
    the file changed meanwhile (a log being written), the attempt is rolled
    back too, and the next one reads a copy of the bytes it planned for; the
    rest is appended by the next ingest.
    """
    frozen = False
    for _ in range(_ATTEMPTS - 1):
        try:
            return _ingest_log_once(store, path, format, frozen=frozen)
        except _JournalMoved:
            continue
        except FileChanged:
            frozen = True
    # A copy cannot change while it is read: the last attempt never meets FileChanged.
    return _ingest_log_once(store, path, format, last_attempt=True, frozen=True)


_ATTEMPTS = 3


def _ingest_log_once(store: Store, path: Path, format: str | None, *,
                     last_attempt: bool = False, frozen: bool = False) -> list[FileReport]:
    reader, path = reader_for(Path(path), format)
    # A reader whose rows are read by the store step (the CSV readers) parses
    # only the header: this connection, open until the file is stored, spares
    # opening the database twice (tens of ms). Other readers may parse for
    # long and must not hold the database meanwhile.
    with store.connect() if getattr(reader, "ROWS_READ_BY_STORE", False) else contextlib.nullcontext():
        return _read_and_store(store, reader, path, last_attempt=last_attempt, frozen=frozen)


def _freeze(parsed: Parsed) -> None:
    """Make the ``SqlPoints`` of ``parsed`` read copies of the bytes planned for."""
    copies: dict[int, object] = {}           # one copy per file (a W&B export's runs share it)
    for run in parsed.runs:
        if isinstance(run.points, SqlPoints):
            src = run.points.source
            if id(src) not in copies:
                copies[id(src)] = src.frozen()
            run.points = dataclasses.replace(run.points, source=copies[id(src)])


def unit_stat(reader, path: Path):
    """``path.stat()``; for a reader whose unit is a whole folder
    (``FOLDER_UNIT``: a tracker's run) the folder's total size and latest
    mtime, so that a change to any of its files reads the run again."""
    st = path.stat()
    if not getattr(reader, "FOLDER_UNIT", False):
        return st
    size, mtime = st.st_size, st.st_mtime
    for p in path.parent.rglob("*"):
        if p != path and p.is_file() and not p.is_symlink():
            q = p.stat()
            size, mtime = size + q.st_size, max(mtime, q.st_mtime)
    return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, size,
                           st.st_atime, mtime, st.st_ctime))


def _read_and_store(store: Store, reader, path: Path, *, last_attempt: bool, frozen: bool) -> list[FileReport]:
    fmt = reader.NAME
    st = unit_stat(reader, path)
    if st.st_size == 0:
        raise LogFormatError(path, why_not_a_log(path))
    key = str(path.resolve())
    with store.connect() as con:
        prev = journal.log_entry(con, key)
    seen = None if prev is None else (prev["size"], prev["mtime"], prev["read_bytes"])
    if prev is not None:
        if prev["format"] != fmt:
            prev = None  # read with another reader before (e.g. format=): start over
    mode = "full"
    # A finished log whose last line has no newline: that line is read too (it
    # is kept back only while the file is being written); the journal still
    # counts only complete lines as read, so if the log grows after all, the
    # line is read again whole and replaces what was read of it.
    unterminated = reader.APPENDABLE and ends_unterminated(path, st.st_size)
    tail = unterminated and is_finished(st)
    held = prev is not None and bool(prev["state"].get("held_tail")) and tail
    if prev is not None:
        same_stat = prev["size"] == st.st_size and prev["mtime"] == st.st_mtime
        if same_stat and not held:
            return [_unchanged(path, fmt, prev)]
        if reader.APPENDABLE and prev["read_bytes"] is not None:
            consumed = prev["read_bytes"]
            intact = st.st_size >= consumed and fingerprint(path, consumed) == prev["state"].get("fingerprint")
            if intact and st.st_size == prev["size"] and not held:
                _touch_journal(store, key, st)
                return [_unchanged(path, fmt, prev)]
            if intact:
                mode = "append"
        elif not reader.APPENDABLE and prev["sha256"] and file_sha256(path) == prev["sha256"]:
            _touch_journal(store, key, st)
            return [_unchanged(path, fmt, prev)]

    extra = {"complete": True} if tail else {}
    try:
        if mode == "append":
            parsed = reader.read(path, start=prev["read_bytes"], state=prev["state"].get("reader"), **extra)
        else:
            parsed = reader.read(path, start=0, state=None, **extra)
    except _PARSE_ERRORS as exc:
        # A reader's own checks raise LogFormatError; these come from the
        # parsing libraries on content no reader anticipated (a step too large
        # for int64, a CSV DuckDB cannot sniff, ...): the file's fault, not a bug.
        raise _cannot_parse(path, fmt, exc) from None
    if frozen:
        _freeze(parsed)
    reports = _store(store, path, key, fmt, st, parsed, prev if mode == "append" else None,
                     prev, reader.APPENDABLE, seen=seen, last_attempt=last_attempt, tail=tail,
                     held_tail=unterminated and not tail, folder_unit=getattr(reader, "FOLDER_UNIT", False))
    if tail:
        for r in reports:
            r.reason = "; ".join(filter(None, [r.reason, "last line has no newline; read, as the file is "
                                                          "not being written"]))
    if parsed.notes:
        for r in reports:
            r.reason = "; ".join(([r.reason] if r.reason else []) + parsed.notes)
    return reports


def _unchanged(path: Path, fmt: str, prev: dict) -> FileReport:
    ids = [r["id"] for r in prev["state"].get("runs", {}).values()]
    return FileReport(str(path), "log", "unchanged", format=fmt, run_ids=ids, reason="already stored")


def _touch_journal(store: Store, key: str, st) -> None:
    with store.transaction() as con:
        journal.touch(con, key, st.st_size, st.st_mtime)


def _store(store: Store, path: Path, key: str, fmt: str, st, parsed: Parsed, append_from: dict | None,
           prev: dict | None, appendable: bool, *, seen: tuple | None = None,
           last_attempt: bool = False, tail: bool = False, held_tail: bool = False,
           folder_unit: bool = False) -> list[FileReport]:
    source, run_dir, shared = run_source(path, fmt)
    prev_runs = (prev or {}).get("state", {}).get("runs", {})
    runs_state: dict = dict(prev_runs) if append_from is not None else {}
    # The last ingest read an unterminated last line, read again now: points at
    # the last stored step are that line's, not a resume.
    reread = append_from is not None and bool(append_from["state"].get("tail"))
    total = 0
    ids: list[int] = []
    fresh: set[int] = set()          # runs whose run_stats the point check already computed
    unread = Unread()                # cells that are not numbers, over the file's runs
    # A folder unit's change is told by its folder's size and mtime (``unit_stat``), not one file's hash.
    digest = None if appendable or folder_unit else file_sha256(path)
    with store.transaction() as con:
        if journal.log_seen(con, key) != seen:
            if last_attempt:
                raise DatabaseBusyError(
                    f"{store.path}: {path} is being stored by another process at the same time; "
                    f"try again when it finishes")
            raise _JournalMoved()
        if fmt == "hf_trainer" and shared and parsed.runs and not hf_shares_run(
                con, source, parsed.runs[0], {r["id"] for r in prev_runs.values()}):
            # A state file of another training in the same output dir: its own run.
            source, shared = key, False
            where = path.parent.name if path.parent.resolve() != run_dir else path.stem
            parsed.runs[0].name = f"{run_dir.name}/{where}"
        if append_from is None and prev_runs and not shared:
            # The file was rewritten: what it stored before goes.
            old = [r["id"] for r in prev_runs.values()]
            drop_points(con, old)
        stored_runs = run_rows.by_name(con, source) if parsed.runs else {}
        for run in parsed.runs:
            name = run_name(path, fmt, run.name)
            known = runs_state.get(name)
            resumed = run.resumed
            created = False
            if known is None:
                run_id, created = _upsert_run(con, path, source, run_dir, name, fmt, run, resumed, stored_runs)
                known = {"id": run_id, "last": {}}
            else:
                run_id = known["id"]
                if run.config:
                    _merge_config(con, run_id, run.config)
            # A run without stored points (a row just created has none) takes its new points
            # straight into ``points``; otherwise they are staged to be told apart from the old.
            direct = created or not con.execute("SELECT EXISTS (SELECT 1 FROM points WHERE run_id = ?)",
                                                [run_id]).fetchall()[0][0]
            try:
                new = insert_new_points(con, run_id, run.points, direct=direct)
            except _SQL_SOURCE_ERRORS as exc:
                if not isinstance(run.points, SqlPoints):
                    raise
                if run.points.source.changed():      # e.g. half a line written while DuckDB read
                    raise FileChanged() from None
                raise _cannot_parse(path, fmt, exc, start=append_from["read_bytes"] if append_from else 0) \
                    from None
            resumed = resumed or new.went_back
            unread.add(new.unread)
            if new.stats_fresh:
                fresh.add(run_id)
            else:
                fresh.discard(run_id)
            if new.staged:
                if new.n and (shared or _overlaps(new.first, known["last"])):
                    # Latest wins: a resumed run (or a second file of a shared
                    # run) replaces the points it logs again.
                    if replace_stored(con, run_id) and not shared and (
                            not reread or _overlaps(new.first, known["last"], strict=True)):
                        resumed = True
                move_staged(con, run_id, new)
            if new.n:
                last = dict(known["last"])
                for m, s in new.last.items():
                    last[m] = max(s, last.get(m, s))
                known = {"id": run_id, "last": last}
            if resumed:
                run_rows.update(con, run_id, resumed=True)
            runs_state[name] = known
            total += new.n
            ids.append(run_id)
        _lr_from_points(con, ids)
        for run_id in _with_overrides(con, ids):
            apply_overrides(con, run_id)
        if unread and total == 0 and append_from is None:
            # nothing stored: the transaction is rolled back and the file reported as an error
            raise LogFormatError(path, f"expected numbers in its metric columns, found none to store: "
                                       f"{unread.text()}")
        refresh_run_stats(con, {*ids, *(r["id"] for r in prev_runs.values())} - fresh)
        state = {"reader": parsed.state, "runs": runs_state}
        if tail:
            state["tail"] = True         # an unterminated last line was read
        if held_tail:
            state["held_tail"] = True    # one was kept back: the file was being written
        read_bytes = parsed.read_bytes if parsed.read_bytes is not None else st.st_size
        if appendable:
            state["fingerprint"] = fingerprint(path, read_bytes)
        journal.record_log(con, key, fmt, st.st_size, st.st_mtime, digest, read_bytes, state)
    status = "appended" if append_from is not None else "added"
    if append_from is not None and total == 0 and not parsed.runs:
        status = "unchanged"
    return [FileReport(str(path), "log", status, format=fmt, run_ids=sorted(set(ids)), n_points=total,
                       reason=unread.text() or None)]


def _overlaps(first: dict[str, int], last: dict[str, int], *, strict: bool = False) -> bool:
    """Whether new points (``first`` step per metric) reach back to steps already
    stored for their metric (``last`` step per metric); ``strict``: to steps
    before the last one."""
    return any(m in last and (s < last[m] if strict else s <= last[m]) for m, s in first.items())


def _upsert_run(con, path: Path, source: str, run_dir: Path, name: str, fmt: str, run: RunData,
                resumed: bool, stored: dict) -> tuple[int, bool]:
    fields, config = metadata.gather(run_dir, name, stated=run.meta, reader_config=run.config,
                                     exclude=path)
    config["log_format"] = fmt
    # the tracker's own project or experiment name, where the log states one (loaders.projects)
    tracker = run.meta.get("project") if isinstance(run.meta, dict) else None
    tracker = str(tracker).strip() or None if tracker is not None else None
    # final metrics joining a run: its format and metadata stay
    return run_rows.upsert(con, source=source, name=name, fmt=fmt, fields=fields, config=config, project=tracker,
                           resumed=resumed, joins=getattr(READERS.get(fmt), "JOINS_RUN", False), stored=stored)


def _with_overrides(con, run_ids: list[int]) -> list[int]:
    """The runs of ``run_ids`` the user corrected (``run_overrides``), in their order: one query
    for a file's runs."""
    if not run_ids:
        return []
    got = {r for (r,) in con.execute("SELECT DISTINCT run_id FROM run_overrides "
                                     "WHERE run_id IN (SELECT unnest(?::INTEGER[]))", [run_ids]).fetchall()}
    return [r for r in dict.fromkeys(run_ids) if r in got]


def _lr_from_points(con, run_ids: list[int]) -> None:
    """For each run of ``run_ids`` that logs an lr: record the logged lr's first and peak values
    in its config; the peak becomes ``runs.lr`` unless the log or a config file states an lr (a
    value read from a name gives way, with a note when it differs). One query for a file's runs."""
    if not run_ids:
        return
    got = con.execute(
        """SELECT run_id, max(value), arg_min(value, step) FROM points
           WHERE run_id IN (SELECT unnest(?::INTEGER[])) AND metric = 'lr' AND value IS NOT NULL
             AND isfinite(value)
           GROUP BY run_id""", [sorted(set(run_ids))]).fetchall()
    by_run = {run_id: (peak, first) for run_id, peak, first in got}
    for run_id in dict.fromkeys(run_ids):
        if run_id in by_run:
            _record_lr(con, run_id, *by_run[run_id])


def _record_lr(con, run_id: int, peak: float, first: float) -> None:
    """``_lr_from_points`` for one run whose logged lr peaks at ``peak`` and starts at ``first``."""
    stored = run_rows.row(con, run_id)
    lr, cfg = stored["lr"], stored["config"]
    cfg["lr_peak"], cfg["lr_initial"] = peak, first
    sources = cfg.setdefault("metadata_sources", {})
    if (lr is None or sources.get("lr") in ("name", "logged lr (peak)")) and metadata.plausible("lr", peak):
        if lr is not None and sources.get("lr") == "name" and abs(lr - peak) > 1e-9 * abs(peak):
            notes = cfg.setdefault("metadata_notes", [])
            note = f"the name says lr {lr:g}, the logged lr peaks at {peak:g}: the logged value is kept"
            if note not in notes:
                notes.append(note)
        sources["lr"] = "logged lr (peak)"
        notes = cfg.setdefault("metadata_notes", [])
        note = (f"lr {peak:g} is the highest lr the log shows (the schedule's value at a logged step, "
                f"after warmup or decay): no config beside the log states the configured lr")
        if note not in notes:
            notes.append(note)
        run_rows.update(con, run_id, lr=peak)
    run_rows.update(con, run_id, config=cfg)


def _merge_config(con, run_id: int, extra: dict) -> None:
    stored = run_rows.row(con, run_id)
    cfg = stored["config"] if stored is not None else {}
    for k, v in extra.items():
        if k == "saved_checkpoints" and isinstance(cfg.get(k), list):
            cfg[k] = cfg[k] + [c for c in v if c not in cfg[k]]
        else:
            cfg[k] = v
    run_rows.update(con, run_id, config=cfg)
