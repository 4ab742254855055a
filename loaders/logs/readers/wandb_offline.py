"""Weights & Biases run folders, offline or synced (``wandb/offline-run-*/``,
``wandb/run-*/``): ONE run per folder, read without the ``wandb`` package.

The folder's unit file is ``run-<id>.wandb`` (``loaders.tracker_stores``),
W&B's transaction log, decoded here from its documented framing (wandb's
``sdk/internal/datastore.py`` and ``proto/wandb_internal.proto``):

* a 7-byte header ``:W&B``, magic ``0xBEE1`` (u16 LE), version 0;
* then LevelDB-log records in 32 KiB blocks (counted from the file's first
  byte): ``crc32 (u32 LE) | length (u16 LE) | type (u8) | data``, the crc
  being zlib's crc32 of the type byte then the data; type 1 FULL holds a
  whole message, 2 FIRST / 3 MIDDLE / 4 LAST its pieces across blocks; fewer
  than 7 bytes left in a block are zero padding;
* each message a protobuf ``Record``: field 2 ``history``, 5 ``config``,
  17 ``run``. ``HistoryRecord``: items (1) of ``key`` (1) and ``value_json``
  (16), and ``step`` (2, its ``num`` 1). ``RunRecord``: ``run_id`` 1,
  ``project`` 3, ``config`` 4, ``display_name`` 8. ``ConfigRecord``: items
  ``update`` (1) of ``key`` (1) / ``value_json`` (16).

The history is the run's points: the step is the record's ``_step`` item
(else its step number), ``_timestamp`` the wall time; items whose name starts
with ``_`` are W&B's own bookkeeping. Values that are not numbers (media,
histograms, strings) are counted per key in ``config["values_not_numbers"]``.
The config is ``files/config.yaml`` (W&B's ``key: {desc, value}`` format) over
the config records of the log; the run is named by its display name (the run
record, else ``wandb-metadata.json``'s ``name``), else its id; the project
goes to ``meta["project"]``. ``files/wandb-summary.json`` holds the last value
of each metric: the history already has them, so it is never read as points
nor as the run's lr (its lr is the schedule's decayed end).

A file that ends inside a record (a run still being written, or killed:
W&B's own reader stops there too) keeps every whole record before it; the
bytes not read are counted on the file's report line. A record whose
checksum does not match, or whose type is out of order, is a
``LogFormatError`` naming its byte: the run is not stored half-read. A
change to any file of the folder reads it again whole.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

from loaders.budgets import budget
from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, empty_points, normalise_metric, points_frame
from loaders.logs.metadata import _read_yaml
from loaders.tracker_stores import wandb_run_file

NAME = "wandb_offline"
PRIORITY = 11
HELP = ("W&B run folder, offline or synced (wandb/offline-run-*/run-<id>.wandb + files/config.yaml): "
        "one run, history from the .wandb log, config from config.yaml")
APPENDABLE = False
EXAMPLE = "wandb/offline-run-20260118_175801-a5sov16l/run-a5sov16l.wandb"
FOLDER_UNIT = True

#: The file header: ident ``:W&B``, magic 0xBEE1, version 0.
HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
_BLOCK = 32768
_REC_HEAD = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
# Record fields (wandb_internal.proto).
_R_HISTORY, _R_CONFIG, _R_RUN = 2, 5, 17


def sniff(path: Path, head: bytes) -> bool:
    return head[:_REC_HEAD] == HEADER


def sniff_dir(folder: Path) -> Path | None:
    return wandb_run_file(folder)


class CutOff(Exception):
    """The log ends inside a record: ``at`` is the byte where that record starts."""

    def __init__(self, at: int):
        super().__init__(at)
        self.at = at


def messages(path: Path, data: bytes):
    """The messages of a W&B log ``data`` (the bytes of ``path``), in order.

    A file that ends inside a record (a run still being written, or killed)
    raises ``CutOff`` after the last whole message; a checksum that fails, or
    a record type out of order, is a ``LogFormatError``."""
    if data[:_REC_HEAD] != HEADER:
        found = "an empty file (0 bytes)" if not data else f"first bytes {data[:_REC_HEAD].hex(' ')}"
        raise LogFormatError(path, f"expected a W&B log starting with {HEADER.hex(' ')} (':W&B', magic "
                                   f"0xBEE1, version 0), found {found}")
    cap = budget("QKVSCOPE_RECORD_BYTES")
    pos, size = _REC_HEAD, len(data)
    parts: list[bytes] | None = None
    start = pos
    while pos < size:
        left = _BLOCK - pos % _BLOCK
        if left < _REC_HEAD:                     # a block's tail: zero padding
            pos += left
            continue
        if pos + _REC_HEAD > size:
            raise CutOff(start if parts is not None else pos)
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if crc == 0 and length == 0 and kind == 0:
            pos += left                          # the rest of a block written as zeros
            continue
        body = data[pos + _REC_HEAD:pos + _REC_HEAD + length]
        if len(body) < length:
            raise CutOff(start if parts is not None else pos)
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            raise LogFormatError(path, f"W&B record at byte {pos:,} fails its crc32 check "
                                       f"(stored {crc:#010x}): the file is corrupt from there on")
        if kind == _FULL and parts is None:
            yield body
        elif kind == _FIRST and parts is None:
            parts, start = [body], pos
        elif kind in (_MIDDLE, _LAST) and parts is not None:
            parts.append(body)
            if sum(map(len, parts)) > cap:
                raise LogFormatError(path, f"W&B record at byte {start:,} is over the budget of {cap:,} "
                                           f"bytes (QKVSCOPE_RECORD_BYTES; set it in the environment "
                                           f"to raise it)")
            if kind == _LAST:
                yield b"".join(parts)
                parts = None
        else:
            raise LogFormatError(path, f"W&B record at byte {pos:,} has type {kind}, which cannot follow "
                                       f"{'a FIRST piece' if parts is not None else 'a whole record'} "
                                       f"(1 FULL, 2 FIRST, 3 MIDDLE, 4 LAST)")
        pos += _REC_HEAD + length
    if parts is not None:
        raise CutOff(start)


def fields(path: Path, msg: bytes) -> dict[int, list]:
    """Protobuf wire fields of ``msg``: {field number: [value, ...]}; varints
    as ints, length-delimited fields as bytes (fixed-width ones as bytes too)."""
    out: dict[int, list] = {}
    pos, n = 0, len(msg)

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= n or shift > 63:
                raise LogFormatError(path, "expected a protobuf message in a W&B record, found a varint "
                                           "that runs past its end")
            b = msg[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result

    while pos < n:
        tag = varint()
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            value = varint()
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = msg[pos:pos + width], pos + width
        elif wire == 2:
            length = varint()
            value, pos = msg[pos:pos + length], pos + length
        else:
            raise LogFormatError(path, f"expected a protobuf message in a W&B record, found wire type {wire}")
        if pos > n:
            raise LogFormatError(path, "expected a protobuf message in a W&B record, found a field that "
                                       "runs past its end")
        out.setdefault(num, []).append(value)
    return out


def _text(f: dict, num: int) -> str:
    return f[num][-1].decode("utf-8", "replace") if num in f and isinstance(f[num][-1], bytes) else ""


def _items(path: Path, msg: bytes, num: int) -> list[tuple[str, str]]:
    """(key, value_json) of the repeated item field ``num`` of ``msg``."""
    out = []
    for raw in fields(path, msg).get(num, []):
        item = fields(path, raw)
        key = _text(item, 1) or "/".join(v.decode("utf-8", "replace") for v in item.get(2, []))
        out.append((key, _text(item, 16)))
    return out


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def config_yaml(path: Path) -> dict:
    """W&B's ``config.yaml`` (``key: {desc, value}``) as ``{key: value}``,
    without W&B's own ``_wandb`` and ``wandb_version`` entries."""
    doc = _read_yaml(path) if path.is_file() else None
    out = {}
    for k, v in (doc or {}).items():
        if str(k).startswith("_wandb") or k == "wandb_version":
            continue
        out[str(k)] = v["value"] if isinstance(v, dict) and "value" in v else v
    return out


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    data = path.read_bytes()
    folder = path.parent
    config: dict = {}
    run_id = display = project = ""
    steps, metrics, values, walls = [], [], [], []
    not_numbers: dict[str, int] = {}
    notes: list[str] = []
    msgs: list[bytes] = []
    try:
        for msg in messages(path, data):
            msgs.append(msg)
    except CutOff as cut:
        notes.append(f"the last {len(data) - cut.at:,} bytes (from byte {cut.at:,}) not read: the file ends "
                     f"inside a W&B record (a run being written, or killed)")
    for msg in msgs:
        rec = fields(path, msg)
        if _R_HISTORY in rec:
            hist = rec[_R_HISTORY][-1]
            items = dict(_items(path, hist, 1))
            hf = fields(path, hist)
            step_num = fields(path, hf[2][-1]).get(1, [None])[-1] if 2 in hf else None
            step = _number(_json(items.get("_step", "null")))
            step = int(step) if step is not None else step_num
            if step is None:
                continue
            wall = _number(_json(items.get("_timestamp", "null")))
            for key, raw in items.items():
                if key.startswith("_"):
                    continue
                v = _number(_json(raw))
                if v is None:
                    not_numbers[key] = not_numbers.get(key, 0) + 1
                    continue
                steps.append(step)
                metrics.append(normalise_metric(key))
                values.append(v)
                walls.append(math.nan if wall is None else wall)
        elif _R_CONFIG in rec:
            config.update({k: _json(v) for k, v in _items(path, rec[_R_CONFIG][-1], 1)})
        elif _R_RUN in rec:
            run = fields(path, rec[_R_RUN][-1])
            run_id = _text(run, 1) or run_id
            project = _text(run, 3) or project
            display = _text(run, 8) or display
            if 4 in run:
                config.update({k: _json(v) for k, v in _items(path, run[4][-1], 1)})
    config = {k: v for k, v in config.items() if not k.startswith("_wandb")}
    config.update(config_yaml(folder / "files" / "config.yaml"))
    meta_file = folder / "files" / "wandb-metadata.json"
    try:
        wmeta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        wmeta = {}
    name = display or (wmeta.get("name") if isinstance(wmeta, dict) and isinstance(wmeta.get("name"), str)
                       else "") or run_id or folder.name
    pts = points_frame(steps, metrics, values, walls) if steps else empty_points()
    reader_config = {"wandb_run_id": run_id, "wandb_config": config}
    if not_numbers:
        reader_config["values_not_numbers"] = not_numbers
    meta = {}
    if project:
        meta["project"] = reader_config["project"] = project
    return Parsed([RunData(name=name, points=pts, config=reader_config, meta=meta)], notes=notes)
