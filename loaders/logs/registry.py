"""Which reader a log is for: detection by content, and the reader by name.

The readers are the modules of ``loaders.logs.readers`` (its docstring gives
the protocol); ``READERS`` is theirs, by name, in detection order. Detection
reads at most the first 64 KB of a file (``HEAD_BYTES``) and asks each
reader's ``sniff`` in ``PRIORITY`` order: binary framings first, then JSON,
CSV and the stdout formats. A torch zip is opened only to read its small
pickle index, never unpickled.

A folder is a log when a reader's ``sniff_dir`` names the file that stands
for it (``folder_unit``: a Lightning version folder's ``metrics.csv``, a W&B
run folder's ``run-<id>.wandb``, an MLflow run's ``meta.yaml``); that file is
then read, by that reader, whichever way it was reached.
"""
from __future__ import annotations

from pathlib import Path

from loaders.budgets import budget
from loaders.errors import LogFormatError
from loaders.logs.base import HEAD_BYTES, ZIP_MAGIC, first_line_over_budget, looks_binary, read_head
from loaders.logs.readers import READERS, _sqlite

#: Readers ``detect_log`` never picks: their files are checkpoints first (the
#: checkpoint loader owns them); ``ingest_log(..., format=NAME)`` reads them.
CHECKPOINT_LOG_FORMATS = tuple(n for n, r in READERS.items() if getattr(r, "INSIDE_CHECKPOINT", False))

#: Readers whose unit may be a folder (they define ``sniff_dir``), in detection order.
FOLDER_READERS = {n: r for n, r in READERS.items() if hasattr(r, "sniff_dir")}


def folder_unit(folder: Path) -> tuple[str, Path] | None:
    """(reader name, the file standing for the folder) when ``folder`` is one
    run of a folder-unit format (``sniff_dir``), else None."""
    for name, reader in FOLDER_READERS.items():
        unit = reader.sniff_dir(folder)
        if unit is not None:
            return name, unit
    return None


def _unit_reader(path: Path) -> str | None:
    """The reader for which ``path`` is the file standing for its folder."""
    unit = folder_unit(path.parent)
    return unit[0] if unit is not None and unit[1] == path else None


def detect_log(path: Path) -> str | None:
    """The reader name if ``path`` is a training log (a run folder counts:
    ``folder_unit``), else None."""
    path = Path(path)
    if path.is_dir():
        unit = folder_unit(path)
        return unit[0] if unit else None
    if not path.is_file():
        return None
    fmt = _unit_reader(path)
    if fmt is not None:
        return fmt
    try:
        head = read_head(path, HEAD_BYTES)
    except OSError:
        return None
    return detect_from_head(path, head)


# Config files sit beside logs and may hold a "steps" key on one JSON line;
# they are read for run metadata (loaders.logs.metadata), never as logs.
_CONFIG_NAMES = {"config.json", "args.json", "hparams.json", "hparams.yaml", "training_args.json",
                 "run_config.json", "generation_config.json", "tokenizer_config.json",
                 # a W&B run folder's last values and environment: read with its run-<id>.wandb
                 "wandb-summary.json", "wandb-metadata.json"}


def _is_config_file(path: Path) -> bool:
    return path.name in _CONFIG_NAMES or path.stem.endswith("config") or path.suffix in (".yaml", ".yml", ".py")


def _detected(reader) -> bool:
    return not getattr(reader, "INSIDE_CHECKPOINT", False)


def detect_from_head(path: Path, head: bytes) -> str | None:
    """The first reader, in ``READERS`` order, whose ``sniff`` takes ``head``
    (the first bytes of ``path``); None for an empty head or a config file."""
    if not head.strip() or _is_config_file(path):
        return None
    return next((name for name, reader in READERS.items() if _detected(reader) and reader.sniff(path, head)),
                None)


def why_not_a_log(path: Path) -> str:
    """The reason ``detect_log`` found no reader, for the error message."""
    expected = "expected a training log (" + ", ".join(
        n for n, r in READERS.items() if _detected(r)) + ")"
    if not path.exists():
        return "no such file or folder"
    if path.is_dir():
        return (f"{expected}; found a folder that is not a run folder of "
                f"{', '.join(FOLDER_READERS)} (" + "; ".join(r.HELP for r in FOLDER_READERS.values()) + ")")
    size = path.stat().st_size
    if size == 0:
        return f"{expected}; found an empty file (0 bytes)"
    head = read_head(path, HEAD_BYTES)
    if not head.strip():
        return f"{expected}; found only whitespace ({size} bytes)"
    if head[:4] == ZIP_MAGIC:
        return f"{expected}; found a zip/torch file that is not one of the query-free paper's loss tensors"
    if head[:16] == _sqlite.MAGIC:
        return _sqlite.why_not(path, {n: r.SCHEMA for n, r in READERS.items() if hasattr(r, "SCHEMA")})
    if looks_binary(head):
        return f"{expected}; found binary data (first bytes {head[:8].hex(' ')})"
    if first_line_over_budget(head):
        return (f"expected a first line of at most QKVSCOPE_CSV_LINE_BYTES ({budget('QKVSCOPE_CSV_LINE_BYTES')} "
                "bytes; raise it in the environment to read this file), found a longer one")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:
            return (f"expected UTF-8 text, found byte 0x{head[exc.start]:02x} at offset {exc.start} "
                    "that is not valid UTF-8")
        text = head[:exc.start].decode("utf-8")
    first = next((l for l in text.split("\n") if l.strip()), "")
    return f"{expected}; found text whose first line is {first[:80]!r}"


def reader_for(path: Path, format: str | None):
    """(reader module, path to read) for ``path``; LogFormatError when none fits."""
    path = Path(path)
    if path.is_dir():
        unit = folder_unit(path)
        if unit is None:
            raise LogFormatError(path, why_not_a_log(path))
        format, path = format or unit[0], unit[1]
    if format is None:
        if not path.exists():
            raise LogFormatError(path, "no such file or folder")
        format = detect_log(path)
        if format is None:
            raise LogFormatError(path, why_not_a_log(path))
    if format not in READERS:
        raise LogFormatError(path, f"unknown log format {format!r}; expected one of {', '.join(READERS)}")
    if not path.is_file():
        raise LogFormatError(path, "no such file")
    return READERS[format], path
