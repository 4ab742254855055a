"""Ingest: walk paths, store every checkpoint and training log found.

``ingest_paths`` is what ``python -m app ingest`` and the Overview page call.
Each file is stored in its own transaction, so a failure (or a kill) part-way
through a folder leaves every file either completely stored or not at all,
and the report says what happened to each file and why.

Checkpoints are keyed by content hash: the same weights under a second name
add nothing. A llama2.c ``model.bin`` exported from the ``ckpt.pt`` beside it
holds the same weights in other bytes: it is recognised by its tensors
(``loaders.llama2c.exported_from``) and reported as that checkpoint. Logs are handled by ``loaders.logs`` (journal, growth, resume).
A checkpoint is linked to a run when they share a run folder (the checkpoint
sits in the run's folder or a sub-folder of it); its training step comes from
the checkpoint itself (``step``/``iter_num``) or from its name (``step_500``,
``ckpt-1000``, ``checkpoint-1000``).

The readers are imported where they are first used, not at the top: the
checkpoint readers (``loaders.sources``, ``loaders.checkpoints``,
``loaders.llama2c``) import torch and the log readers (``loaders.logs``)
pandas, and the parent of ``loaders/sandbox.py`` runs ``scan`` and
``link_checkpoints`` from here without either (its child reads the files).
The walk's helpers (``loaders.tracker_stores``, ``loaders.projects``) load with
the walk: the reading child's ``ingest_checkpoint`` of one path needs neither.
"""
from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator

from loaders import checkpoint_rows, journal, run_rows
from loaders.checkpoint_names import HF_WEIGHT_FILES
from loaders.errors import CheckpointFormatError, DatabaseBusyError, FileError, QkvscopeError, StoreError
from loaders.filecheck import MAX_FOLDER_DEPTH, check_openable, failure, refusal, unencodable_name
from loaders.report import FileReport, IngestReport
from loaders.store import Store

Progress = Callable[[int, int, str], None]  # (done, total, current path)

# Folders that never hold experiments; skipping them keeps scans of a home
# directory or a repository fast.
_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".ipynb_checkpoints",
              ".pytest_cache", ".hypothesis"}
_CONFIG_FILES = {"config.json", "hparams.json", "args.json", "training_args.json",
                 "generation_config.json", "tokenizer_config.json", "run_config.json"}
_CHECKPOINT_SUFFIXES = {".safetensors", ".pt", ".pth", ".ckpt"}
#: Suffixes of text logs: an unreadable one is reported with the reason, and
#: one that is not UTF-8 is an error (the user meant it to be read).
_LOG_SUFFIXES = {".csv", ".tsv", ".jsonl", ".log", ".txt", ".out"}
#: Suffixes of database files: a tracker's store (MLflow, trackio) is read, another is
#: reported with its tables.
_DATABASE_SUFFIXES = {".db", ".sqlite", ".sqlite3"}
_STEP_IN_NAME = re.compile(r"(?:step|iter|ckpt|checkpoint)[-_]?0*(\d+)", re.IGNORECASE)


def _is_hf_folder(path: Path) -> bool:
    # is_file: a regular file (through links), never a FIFO named like weights.
    return (path / "config.json").is_file() and any((path / f).is_file() for f in HF_WEIGHT_FILES)


def discover(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Every file or Hugging Face folder under ``paths``, in a stable order.

    A Hugging Face folder (``config.json`` beside weights) is yielded as one
    item and not descended into: its shards are one checkpoint. What
    ``scan`` skips (FIFOs, devices, links out of the folder, ...) is left out.
    """
    return (path for path, why in scan(paths) if why is None)


def scan(paths: Iterable[str | Path]) -> Iterator[tuple[Path, str | None]]:
    """``(path, None)`` for what ``discover`` yields, ``(path, reason)`` for what
    is skipped without being opened: anything but regular files and folders
    (FIFOs, sockets, devices), symbolic links that loop or lead out of the
    ingested folder (``loaders.filecheck.refusal``), and folders more than
    ``MAX_FOLDER_DEPTH`` levels down. A tracker's run folder (a W&B run, an
    MLflow run: ``loaders.tracker_stores.unit_file``) is one item, the file
    its reader reads, and is not searched further. A folder whose name starts
    with a dot is searched only when it holds a tracker's store (``.aim`` is
    reported: its RocksDB is not read); otherwise it is reported as skipped,
    with the reason. The walk keeps its own stack: Python's recursion would
    end near 1,000 levels."""
    from loaders import tracker_stores  # here: the walk only (the module docstring)

    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists() and not path.is_symlink():
            raise FileError(path, "no such file or folder")
        why = refusal(path)
        if why or not path.is_dir():
            yield path, why
            continue
        if _is_hf_folder(path):
            yield path, None
            continue
        root = path
        stack = [(path, 0)]
        while stack:
            folder, depth = stack.pop()
            unit = tracker_stores.unit_file(folder)
            if unit is not None:            # a tracker's run folder: one run, read through this file
                yield unit, None
                continue
            if tracker_stores.aim_repo(folder):
                yield folder, tracker_stores.aim_skip(folder)
                continue
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as exc:
                yield folder, failure(exc)
                continue
            hf, files, subfolders = [], [], []
            for entry in entries:
                child = Path(entry.path)
                if entry.name in _SKIP_DIRS:
                    continue
                if entry.name.startswith("."):
                    why = _dot_folder(child, entry)
                    if why is not None:         # not a tracker's store: reported (a dot-file is not)
                        if why:
                            files.append((child, why))
                        continue
                why = refusal(child, root=root)
                if why:
                    files.append((child, why))
                elif entry.is_dir(follow_symlinks=False):
                    if _is_hf_folder(child):
                        hf.append((child, None))
                    elif depth + 1 > MAX_FOLDER_DEPTH:
                        files.append((child, f"folders more than {MAX_FOLDER_DEPTH} levels below {root} "
                                             f"are not searched"))
                    else:
                        subfolders.append(child)
                elif not entry.is_dir():        # a link to a folder is not followed
                    files.append((child, None))
            yield from hf
            yield from files
            # Depth first, in name order: a folder's own items before its sub-folders' (as os.walk).
            stack.extend((d, depth + 1) for d in reversed(subfolders))


def _dot_folder(child: Path, entry: os.DirEntry) -> str | None:
    """None to walk a dot-folder (a tracker's store: ``tracker_stores.store_folder``),
    else why it is skipped; "" for a dot-file (left out without a word, as editors'
    and systems' files are)."""
    from loaders import tracker_stores  # here: the walk only (the module docstring)

    if not entry.is_dir(follow_symlinks=False):
        return ""
    if child.name == ".trash" and child.parent.name == "mlruns":
        return tracker_stores.MLFLOW_TRASH
    if tracker_stores.store_folder(child):
        return None
    return ("folder whose name starts with a dot, holding no tracker's store (W&B, MLflow, Aim): "
            "not searched; ingest it by its path to read it")


def _step_from_name(path: Path) -> int | None:
    m = _STEP_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _find_run_for(con, path: Path) -> int | None:
    """The run whose folder holds ``path`` (nearest enclosing folder wins)."""
    best: tuple[int, int] | None = None
    resolved = path.resolve()
    for run_id, source, config in run_rows.folders(con):
        run_dir = config.get("run_dir") if isinstance(config, dict) else None
        folder = Path(run_dir) if run_dir else Path(source).parent
        try:
            resolved.relative_to(folder.resolve())
        except ValueError:
            continue
        depth = len(folder.resolve().parts)
        if best is None or depth > best[1]:
            best = (run_id, depth)
    return best[0] if best else None


def ingest_checkpoint(store: Store, path: str | Path) -> FileReport:
    """Store one checkpoint's geometry (not its weights) under its content hash.

    Reads the metadata and makes one pass over the attention layers to count
    NaN/Inf values; the database is written only after everything was read.
    """
    from loaders.checkpoints import inspect_checkpoint   # torch: see the module docstring
    from loaders.sources import content_hash

    path = Path(path)
    stored = journalled(store, path)
    size, mtime = _size_of(path), _mtime_of(path)
    if stored is not None:
        return FileReport(str(path), "checkpoint", "unchanged", checkpoint_id=stored,
                          reason="already stored")
    same = _export_of_stored(store, path, size, mtime)
    if same is not None:
        return same
    try:
        digest, info = _hash_and_inspect(path, content_hash, inspect_checkpoint)
    except Exception:
        _check_unchanged(path, size, mtime)   # a file rewritten while it was read: that is what to say
        raise
    _check_unchanged(path, size, mtime)       # what was read is what was hashed
    with store.connect() as con:
        same = checkpoint_rows.id_of(con, digest)
    if same is not None:
        _journal(store, path, size, mtime, digest)
        return FileReport(str(path), "checkpoint", "unchanged", checkpoint_id=same,
                          reason="same content already stored")
    step = info.get("step")
    if step is None:
        step = _step_from_name(path)
    with store.transaction() as con:
        # A concurrent ingest may have stored it since we looked.
        same = checkpoint_rows.id_of(con, digest)
        if same is not None:
            return FileReport(str(path), "checkpoint", "unchanged", checkpoint_id=same,
                              reason="same content already stored")
        run_id = _find_run_for(con, path)
        ckpt_id = checkpoint_rows.insert(con, path=str(path.resolve()), digest=digest, size=size, info=info,
                                         run_id=run_id, step=step)
        journal.record_checkpoint(con, str(path.resolve()), size, mtime, digest)
    reason = None
    if info.get("nonfinite"):
        reason = f"{info['nonfinite']} NaN/Inf values in attention weights"
    return FileReport(str(path), "checkpoint", "added", format=info["architecture"],
                      checkpoint_id=ckpt_id, reason=reason)


def journalled(store: Store, path: str | Path) -> int | None:
    """The id of the stored checkpoint the journal knows ``path`` as, at its current size and
    mtime; None when it must be read. Reads nothing of the file (``stat`` of it, or of a folder's
    files, and one query), so a parent may ask before it starts a reading child. The journal
    spares re-hashing an unchanged multi-GB file on every scan; it trusts the file system (a file
    rewritten in place with the same size and mtime is taken for the stored one)."""
    path = Path(path)
    check_openable(path)
    with store.connect() as con:
        return journal.stored_checkpoint(con, str(path.resolve()), _size_of(path), _mtime_of(path))


def _export_of_stored(store: Store, path: Path, size: int, mtime: float) -> FileReport | None:
    """A llama2.c export (``model.bin``) whose weights are those of the training checkpoint
    beside it (``loaders.llama2c.exported_from``) is that checkpoint: the checkpoint is
    ingested (or found stored) and the export reported ``unchanged`` with its id, journalled
    under its digest so that a rescan does not compare the two again. None otherwise."""
    if not (path.is_file() and path.suffix.lower() == ".bin"):
        return None
    from loaders.llama2c import exported_from   # torch: see the module docstring

    source = exported_from(path)
    if source is None:
        return None
    rep = ingest_checkpoint(store, source)
    if rep.checkpoint_id is None:
        return None
    with store.connect() as con:
        digest = checkpoint_rows.digest_of(con, rep.checkpoint_id)
    _journal(store, path, size, mtime, digest)
    return FileReport(str(path), "checkpoint", "unchanged", format=rep.format, checkpoint_id=rep.checkpoint_id,
                      reason=f"the llama2.c export of {source.name} beside it: the same weights, stored "
                             f"once as {source.name}")


def _hash_and_inspect(path: Path, content_hash, inspect_checkpoint) -> tuple[str, dict]:
    """``(content_hash(path), inspect_checkpoint(path))``, the hash in a second thread while
    this one reads the geometry and counts NaN/Inf: both read the whole file, and hashing
    and reading release the GIL (a 1 GB 7B-shaped checkpoint: 1.47-1.72 s one after the
    other, 1.06-1.08 s side by side). The hash ran first before; its error (a bad header,
    a tensor in a hole: ``validate``) still wins over the reader's, and an unchanged copy
    of stored content is read once more than before, for nothing."""
    with ThreadPoolExecutor(1, thread_name_prefix="qkvscope-hash") as pool:
        hashing = pool.submit(content_hash, path)
        try:
            info = inspect_checkpoint(path)
        except BaseException:
            if hashing.exception() is not None:               # waits for it
                hashing.result()                              # raises the hash's error
            raise
        return hashing.result(), info


def _check_unchanged(path: Path, size: int, mtime: float) -> None:
    """Raise ``CheckpointFormatError`` when ``path`` changed since ``size``/``mtime``
    were taken (a training run rewriting its checkpoint while it is read): the
    hash and the geometry would describe different bytes."""
    try:
        if not path.exists():
            raise FileNotFoundError(path)
        now = _size_of(path), _mtime_of(path)
    except FileNotFoundError:
        raise CheckpointFormatError(path, "vanished while it was read; ingest it again once it "
                                          "is written") from None
    if now != (size, mtime):
        raise CheckpointFormatError(
            path, f"changed while it was read (size {size} -> {now[0]} bytes, mtime {mtime} -> "
                  f"{now[1]}); ingest it again once it is written")


def _journal(store: Store, path: Path, size: int, mtime: float, digest: str) -> None:
    with store.transaction() as con:
        journal.record_checkpoint(con, str(path.resolve()), size, mtime, digest)


def _mtime_of(path: Path) -> float:
    if path.is_file():
        return path.stat().st_mtime
    return max((p.stat().st_mtime for p in path.rglob("*") if p.is_file()), default=0.0)


def _size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def link_checkpoints(store: Store) -> int:
    """Attach stored checkpoints without a run to the run whose folder holds them,
    and give runs without a known model size their checkpoints' parameter count.

    Logs and checkpoints of one run may arrive in either order; this runs at
    the end of every ingest. Returns how many checkpoints were linked.
    """
    linked = 0
    with store.transaction() as con:
        for ckpt_id, path in checkpoint_rows.unlinked(con):
            run_id = _find_run_for(con, Path(path))
            if run_id is not None:
                checkpoint_rows.link(con, ckpt_id, run_id)
                linked += 1
        run_rows.sizes_from_checkpoints(con)
    return linked


def _classify(path: Path) -> tuple[str, str | None]:
    """('log', format) / ('checkpoint', None) / ('unknown', reason) /
    ('broken_log', reason): a text log that is not UTF-8, or whose first line is
    longer than ``QKVSCOPE_CSV_LINE_BYTES``."""
    from loaders.logs import detect_log                  # pandas, torch: see the module docstring
    from loaders.logs.registry import why_not_a_log
    from loaders.sources import is_checkpoint_candidate

    if path.is_dir():
        fmt = detect_log(path)
        if fmt:
            return "log", fmt
        if is_checkpoint_candidate(path):
            return "checkpoint", None
        return "unknown", "folder without config.json and weights"
    # A log reader gets first look: some logs are .pt tensors (query-free paper).
    fmt = detect_log(path)
    if fmt:
        return "log", fmt
    if path.name in ("wandb-summary.json", "wandb-metadata.json"):
        return "unknown", ("W&B run file: read with its run folder's run-<id>.wandb, "
                           "never as a run of its own")
    if path.name in _CONFIG_FILES or path.suffix.lower() in (".yaml", ".yml"):
        return "unknown", "configuration file: read as metadata of the run beside it"
    if path.suffix.lower() == ".bin" and path.name.startswith("tok"):
        from loaders.llama2c import is_tokenizer         # torch: see the module docstring

        if is_tokenizer(path):
            return "unknown", ("llama2.c tokenizer: read as the vocabulary of the checkpoint beside it, "
                               "not a checkpoint")
    if is_checkpoint_candidate(path) or path.suffix.lower() in _CHECKPOINT_SUFFIXES:
        # A broken file named like a checkpoint is an error the user must see,
        # not a silent skip.
        return "checkpoint", None
    if path.suffix.lower() in _DATABASE_SUFFIXES:       # a tracker's SQLite store, or why it is none
        return "unknown", f"not a training log qkvscope reads: {why_not_a_log(path)}"
    if path.suffix.lower() in _LOG_SUFFIXES:
        why = why_not_a_log(path)
        if why.startswith(("expected UTF-8", "expected a first line of at most")):
            return "broken_log", why
        return "unknown", f"not a training log qkvscope reads: {why}"
    return "unknown", "not a checkpoint or a training log qkvscope reads"


def ingest_file(store: Store, path: Path) -> list[FileReport]:
    """Ingest one file or folder; whatever reading it raises becomes one ``error`` report.

    This is the per-file boundary of a folder ingest: typed errors, and the
    exceptions parsers raise on hostile content (``RecursionError`` on deep
    nesting, ``MemoryError`` in a parser, ``duckdb.Error``, ``OSError`` on a
    file deleted or replaced meanwhile, ``ValueError``, torch's
    ``RuntimeError``, ...) are reported as ``PATH: what`` while that file's
    transaction rolls back, and the next file is ingested. ``StoreError`` (the
    database itself) and ``KeyboardInterrupt`` still stop the ingest.
    """
    from loaders.logs import ingest_log                  # pandas: see the module docstring

    why = unencodable_name(path)
    if why:
        return [FileReport(str(path), "unknown", "error", reason=f"{path}: {why}")]
    kind, detail = "unknown", None
    try:
        kind, detail = _classify(path)
        if kind == "unknown":
            return [FileReport(str(path), "unknown", "skipped", reason=detail)]
        if kind == "broken_log":
            return [FileReport(str(path), "log", "error", reason=f"{path}: {detail}")]
        if kind == "log":
            return ingest_log(store, path, format=detail)
        reports = [ingest_checkpoint(store, path)]
    except StoreError:
        raise                   # the database, not this file: stop (the CLI says "database is busy")
    except Exception as exc:    # noqa: BLE001 -- the per-file boundary, see the docstring
        return [FileReport(str(path), kind, "error", format=detail, reason=_reason(path, exc))]
    # Some checkpoints also carry a run's metrics (the projection-sharing
    # paper's final_model.pt holds val_metrics): store them as a log too.
    try:
        fmt = _log_inside_checkpoint(path)
        if fmt:
            reports.extend(ingest_log(store, path, format=fmt))
    except StoreError:
        raise
    except Exception as exc:    # noqa: BLE001 -- the per-file boundary
        reports.append(FileReport(str(path), "log", "error", reason=_reason(path, exc)))
    return reports


def _reason(path: Path, exc: Exception) -> str:
    """``PATH: what`` for any exception from reading ``path``."""
    if isinstance(exc, FileError):
        return str(exc)
    if isinstance(exc, QkvscopeError):
        return f"{path}: {exc}"
    return f"{path}: {failure(exc)}"


def _log_inside_checkpoint(path: Path) -> str | None:
    from loaders.logs import CHECKPOINT_LOG_FORMATS, READERS   # pandas: see the module docstring

    if not path.is_file():
        return None
    with path.open("rb") as fh:
        head = fh.read(65536)
    for fmt in CHECKPOINT_LOG_FORMATS:
        if READERS[fmt].sniff(path, head):
            return fmt
    return None


def scan_projects(paths: Iterable[str | Path], project: str | None) -> Iterator[tuple[Path, str | None, str]]:
    """``scan(paths)`` with the project of each item: ``project`` when given, else
    ``loaders.projects.default_project`` of the path it was found under."""
    from loaders.projects import default_project  # here: the walk only (the module docstring)

    for raw in paths:
        name = project if project is not None else default_project(raw)
        for path, why in scan([raw]):
            yield path, why, name


def _kind_here(path: Path) -> str:
    """What ``path`` is (``_classify``), read in this process; ``unknown`` when that fails
    (``ingest_file`` reports why in its turn)."""
    try:
        return _classify(path)[0]
    except Exception:       # noqa: BLE001 -- ingest_file reports it in its turn
        return "unknown"


def ingest_paths(store: Store, paths: Iterable[str | Path], *,
                 progress: Progress | None = None, project: str | None = None,
                 kind_of: Callable[[Path], str] = _kind_here,
                 ingest_one: Callable[[Store, Path, str], list[FileReport]] | None = None) -> IngestReport:
    """Ingest everything found under ``paths``; one transaction per file.

    Logs go first so that checkpoints find their runs; a final pass links any
    checkpoint stored before its run. What each file stored is then put into
    ``project`` (every run and checkpoint read, also those stored before) or,
    without one, into the default project of the path it was found under where it
    has none yet (``loaders.projects``). ``kind_of(path)`` and ``ingest_one(store, path,
    kind)`` read a file: in this process by default (``_classify``, ``ingest_file``), in
    the reading child for ``loaders.sandbox.ingest_paths``.
    """
    from loaders.projects import assign_project, check_name  # here: the walk only (the module docstring)

    if ingest_one is None:
        ingest_one = lambda store, path, kind: ingest_file(store, path)  # noqa: E731
    if project is not None:
        project = check_name(project)
    report = IngestReport()
    classified = []
    for p, why, name in scan_projects(paths, project):
        if why is not None:
            report.files.append(FileReport(str(p), "unknown", "skipped", reason=why))
            continue
        kind = kind_of(p)
        classified.append((0 if kind == "log" else 1, p, kind, name))
    ordered = sorted(classified, key=lambda t: t[0])
    for i, (_, path, kind, name) in enumerate(ordered):
        if progress:
            progress(i, len(ordered), str(path))
        reports = ingest_one(store, path, kind)
        assign_project(store, reports, name, replace=project is not None)
        report.files.extend(reports)
    if any(f.status in ("added", "appended") for f in report.files):
        link_checkpoints(store)
    if progress:
        progress(len(ordered), len(ordered), "")
    return report


def watch(store: Store, paths: Iterable[str | Path], *, interval: float = 2.0,
          on_report: Callable[[IngestReport], None] | None = None,
          on_busy: Callable[[DatabaseBusyError], None] | None = None,
          stop: Callable[[], bool] | None = None,
          ingest: Callable[[Store, list], IngestReport] = ingest_paths) -> None:
    """Poll ``paths`` and ingest what is new or has grown, until ``stop()`` is true.

    Unchanged files cost a stat and a journal look-up per poll; grown logs
    append only their new points (``loaders.logs``). A poll that finds the
    database busy for longer than the store's ``busy_timeout`` (another
    process writing a large file) is reported to ``on_busy`` and tried again
    at the next poll: each file is one transaction, so nothing is half-stored
    and the next poll picks up where this one stopped. Without ``on_busy``
    the error propagates. ``ingest(store, paths)`` makes one poll:
    ``ingest_paths`` here, the reading child's in ``loaders.sandbox.watch``.
    """
    paths = list(paths)
    while True:
        try:
            report = ingest(store, paths)
        except DatabaseBusyError as exc:
            if on_busy is None:
                raise
            on_busy(exc)
        else:
            if on_report is not None:
                on_report(report)
        if stop is not None and stop():
            return
        time.sleep(interval)

