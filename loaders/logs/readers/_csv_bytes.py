"""A CSV log's bytes, checked before DuckDB reads it: no line longer than
``QKVSCOPE_CSV_LINE_BYTES``, UTF-8 throughout.

DuckDB would fail on an over-long line with an unrelated message (or skip
it), and validates UTF-8 only in the columns a query reads; so the CSV
readers (``_csv.read_csv_log``) refuse such a file here, with one line naming
the line or byte. Also the ends of lines the readers count as read.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from loaders.budgets import budget
from loaders.errors import LogFormatError
from loaders.logs.base import complete_lines, decode_text


def csv_line_bytes() -> int:
    """The longest CSV line read: the ``QKVSCOPE_CSV_LINE_BYTES`` budget (2 MiB by default)."""
    return budget("QKVSCOPE_CSV_LINE_BYTES")


def text_chunk(path: Path, start: int, *, complete: bool = False) -> tuple[bytes, int]:
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    chunk, used = complete_lines(data, complete)
    scan_bytes(path, chunk)
    decode_text(path, chunk, start)
    return chunk, used


def complete_end(path: Path, size: int) -> int:
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


def first_line_end(path: Path) -> int:
    with open(path, "rb") as fh:
        line = fh.readline()
    return len(line)


_SCAN_BLOCK = 4 << 20


def scan_bytes(path: Path, data, offset: int = 0, size: int | None = None) -> bool:
    """Whether every byte of ``data`` (bytes of ``path`` from ``offset``) is below
    0x80; LogFormatError at the first line longer than ``QKVSCOPE_CSV_LINE_BYTES``.

    Usually one pass of C string methods (``_quick_scan``); else one vectorised
    pass in blocks of 4 MiB (the newline positions of a block, the gap to the
    previous block's last newline carried over), which names the line.
    """
    size = len(data) if size is None else size
    limit = csv_line_bytes()
    quick = _quick_scan(data, size, limit)
    if quick is not None:
        return quick
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


#: Below this block size ``_quick_scan`` would loop too often in Python.
_QUICK_MIN = 64 << 10


def _quick_scan(data, size: int, limit: int) -> bool | None:
    """Whether the first ``size`` bytes of ``data`` are all below 0x80, when
    every whole aligned block of c = (limit + 1) // 2 bytes holds a newline;
    None when some block holds none (or c is under ``_QUICK_MIN``).

    A run of 2c bytes without a newline contains a whole aligned block, so when
    every block holds a newline, no line is longer than 2c - 1 <= ``limit``
    bytes (its newline not counted). ``find`` and ``isascii`` run in C, over
    about 1 MiB at a time by default.
    """
    c = (limit + 1) // 2
    if c < _QUICK_MIN:
        return None
    ascii_only = True
    for start in range(0, size, c):
        block = data[start:min(start + c, size)]
        if len(block) == c and block.find(b"\n") < 0:
            return None
        ascii_only = ascii_only and block.isascii()
    return ascii_only


def _too_long(path: Path, line: int, length: int) -> None:
    raise LogFormatError(path, f"line {line:,} is {length:,} bytes long, over the {csv_line_bytes():,}-byte "
                               f"limit for one CSV line (QKVSCOPE_CSV_LINE_BYTES; set it in the environment "
                               f"to raise it); the file is refused, not read without that line")


def _scan_file(path: Path) -> bool:
    """``scan_bytes`` over a read-only map of the whole file, without copying it."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return True
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return scan_bytes(path, mm, 0, size)


def check_utf8_file(path: Path) -> None:
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

