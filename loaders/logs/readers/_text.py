"""What the stdout-log readers (``nanogpt``, ``modded_nanogpt``, ``llmc``)
share: the text of a file from a byte on, its lines as a pandas Series, and
the number pattern.

Lines are matched with vectorised pandas string operations (``str.extract``),
not a Python loop per line. Lines that match no pattern (banners, code,
warnings) are skipped.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from loaders.logs.base import complete_lines, decode_text

NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|inf|NaN|Inf)"
#: A ``key:value`` pair of modded-nanogpt and llm.c lines.
KV = r"(\w+):(\S+)"


def read_chunk(path: Path, start: int, complete: bool = False) -> tuple[str, int]:
    """(text of ``path`` from ``start`` to parse, bytes of its complete lines)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    chunk, used = complete_lines(data, complete)
    return decode_text(path, chunk, start), used


def lines_of(text: str) -> pd.Series:
    """The lines of ``text`` (without a last empty one after a final newline)."""
    return pd.Series(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"),
                     dtype="object")


def to_float(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype="float64")


def head_text(head: bytes) -> str:
    """``head`` as text: a character cut at its end dropped, "" if it is no UTF-8."""
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return head[:exc.start].decode("utf-8") if exc.start > len(head) - 4 else ""

