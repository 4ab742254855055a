"""TensorBoard event files (``events.out.tfevents.*``): scalars only, read
without TensorFlow (``tensorboard``'s own event loader).

Event files are appended in a framing we do not split, so a changed file is
read again whole and its points replace what it stored before. The event
files of one folder are one run (``loaders.logs.ingest.run_source``).
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.budgets import budget
from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, empty_points, normalise_metric, points_frame, steps_went_back

NAME = "tensorboard"
PRIORITY = 10
HELP = "TensorBoard event file (events.out.tfevents.*), scalars only; read without TensorFlow"
APPENDABLE = False
EXAMPLE = "runs/exp1/events.out.tfevents.1700000000.host.1234.0"


def sniff(path: Path, head: bytes) -> bool:
    # TFRecord framing (8-byte length, 4-byte CRC), then the first Event,
    # which always carries file_version "brain.Event:N".
    return len(head) > 16 and b"brain.Event:" in head[:64]


def check_record_lengths(path: Path) -> None:
    """Walk a TFRecord file's framing before any record is read.

    Each record is ``u64 length``, ``u32 masked crc32c(length)``, ``length``
    bytes, ``u32 crc`` (TensorFlow ``core/lib/io/record_writer``). Only the
    12-byte headers are read, with one seek per record. A length over
    ``QKVSCOPE_RECORD_BYTES`` (64 MiB) is refused; a header whose length runs
    past the end of the file (or whose checksum is wrong) ends the walk: the
    event loader stops at that record too, reading no more than the file holds.
    """
    # Here, not at the top: tensorboard (and the protobuf it loads) only when an event file is read.
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    cap = budget("QKVSCOPE_RECORD_BYTES")
    size = path.stat().st_size
    with open(path, "rb") as f:
        pos = 0
        while pos + 12 <= size:
            f.seek(pos)
            head = f.read(12)
            if len(head) < 12:
                return
            length, crc = struct.unpack("<QI", head)
            if masked_crc32c(head[:8]) != crc:
                return
            if length > cap:
                raise LogFormatError(path, f"TensorBoard record at byte {pos:,} claims {length:,} bytes, "
                                           f"over the budget of {cap:,} (QKVSCOPE_RECORD_BYTES; set it "
                                           f"in the environment to raise it)")
            if length + 4 > size - pos - 12:
                return
            pos += 12 + length + 4


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    # Here, not at the top: tensorboard (and the protobuf it loads) only when an event file is read.
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    check_record_lengths(path)
    steps, tags, values, walls = [], [], [], []
    n_events = 0
    try:
        for event in EventFileLoader(str(path)).Load():
            n_events += 1
            if not event.HasField("summary"):
                continue
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    x = float(v.simple_value)
                elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "scalars":
                    arr = tensor_util.make_ndarray(v.tensor)
                    if arr.size != 1 or not np.issubdtype(arr.dtype, np.number):
                        continue
                    x = float(arr.reshape(()))
                else:
                    continue
                steps.append(event.step)
                tags.append(v.tag)
                values.append(x)
                walls.append(event.wall_time)
    except Exception as exc:  # the loader raises its own DataLossError and protobuf errors
        raise LogFormatError(path, f"expected TensorBoard event records, found a corrupt record "
                                   f"({type(exc).__name__}: {exc})") from None
    if n_events == 0:
        # The loader stops quietly at the first bad CRC; a file with no
        # readable record at all is corrupt, not an empty run.
        raise LogFormatError(path, "expected TensorBoard event records, found none with a valid "
                                   "checksum (corrupt or truncated file)")
    metrics = pd.Series(tags, dtype="object").map(normalise_metric).to_numpy() if tags else []
    pts = points_frame(steps, metrics, values, walls) if steps else empty_points()
    return Parsed(runs=[RunData(name="", points=pts, resumed=steps_went_back(pts))],
                  read_bytes=path.stat().st_size)
