"""What the stdout-log readers (``nanogpt``, ``modded_nanogpt``, ``llmc``,
``hf_stdout``, ``megatron``, ``deepspeed``, ``fairseq``, ``torchtune``) share:
the text of a file from a byte on, its lines as a pandas Series, the number
pattern, printed literals and argument lists read without running anything
(``ast.literal_eval``), and the words for lines that were not read.

Lines are matched with vectorised pandas string operations (``str.extract``),
not a Python loop per line. Lines that match no pattern (banners, code,
warnings) are skipped.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.errors import LogFormatError
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



#: Longest text ``literal`` parses: no printed dict or argument list is longer.
LITERAL_MAX_CHARS = 100_000


def literal(text: str):
    """The Python literal ``text`` spells (``ast.literal_eval``: nothing is
    executed), or None when it is none or longer than ``LITERAL_MAX_CHARS``."""
    if len(text) > LITERAL_MAX_CHARS:
        return None
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def call_keywords(text: str) -> dict | None:
    """The keyword arguments of a printed call, ``Namespace(lr=[0.0005], seed=1, ...)``,
    whose values are literals (others are left out); None if ``text`` is no call."""
    if len(text) > LITERAL_MAX_CHARS:
        return None
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.Call):
        return None
    out = {}
    for kw in node.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return out


def scalar_config(cfg: dict) -> dict:
    """``cfg`` with one-element lists unwrapped (fairseq prints ``lr=[0.0005]``):
    the form ``loaders.logs.metadata.from_config`` reads numbers in."""
    return {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in cfg.items()}


def unread_note(n: int, what: str, first: str, line_no: int | None) -> str:
    """The report's words for ``n`` lines that look like ``what`` lines (an
    adjective: "Megatron iteration") but were not read, ``first`` the first of them."""
    where = f"line {line_no + 1} " if line_no is not None else ""
    return f"{n} {what} line{'s' * (n != 1)} not read (first: {where}{first.strip()[:120]!r})"


def no_points_error(path: Path, expected: str, n_bad: int, first: str, line_no: int | None) -> LogFormatError:
    """The error for a log whose every line of its format is unreadable."""
    where = f"line {line_no + 1} " if line_no is not None else ""
    return LogFormatError(path, f"expected {expected}, found {n_bad} such line{'s' * (n_bad != 1)} "
                                f"none of which parses (first: {where}{first.strip()[:120]!r})")
