"""llm.c logs (karpathy/llm.c ``-o``, ``main.log``): ``s:N trl:X lr:Y
norm:Z`` train lines and ``s:N tel:X`` eval lines.

-> ``train/loss``, ``lr``, ``norm``, ``val/loss``; other ``key:value`` pairs
kept as logged.
"""
from __future__ import annotations

import re
from pathlib import Path

from loaders.logs.base import Parsed, RunData, empty_points, is_text_head, points_frame, steps_went_back
from loaders.logs.readers._text import KV, head_text, lines_of, read_chunk, to_float

NAME = "llmc"
PRIORITY = 60
HELP = "llm.c log (-o): 's:N trl:X lr:Y norm:Z' train lines and 's:N tel:X' eval lines"
APPENDABLE = True
EXAMPLE = "log124M/main.log"

#: How most of an llm.c log's first lines start.
_LLMC_LINE = re.compile(r"^s:\d+ \w+:")
_LLMC_NAMES = {"trl": "train/loss", "tel": "val/loss", "lr": "lr"}


def sniff(path: Path, head: bytes) -> bool:
    if not is_text_head(head):
        return False
    text = head_text(head)
    lines = [l for l in text.split("\n")[:200] if l.strip()]
    return bool(lines) and sum(bool(_LLMC_LINE.match(l)) for l in lines) >= max(1, len(lines) // 2)


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, start, complete)
    lines = lines_of(text)
    m = lines.str.extract(r"^s:(\d+)\s+(.*)$").dropna(subset=[0])
    if not len(m):
        return Parsed(runs=[RunData(name="", points=empty_points())], read_bytes=start + used,
                      state=dict(state or {}))
    pairs = m[1].str.extractall(KV)
    line_of = pairs.index.get_level_values(0).to_numpy()
    steps = m[0].astype("int64").reindex(line_of).to_numpy()
    metric = pairs[0].map(lambda k: _LLMC_NAMES.get(k, k)).to_numpy()
    pts = points_frame(steps, metric, to_float(pairs[1]))
    return Parsed(runs=[RunData(name="", points=pts, resumed=steps_went_back(pts))],
                  read_bytes=start + used, state=dict(state or {}))
