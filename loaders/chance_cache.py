"""Chance levels kept on disk, one folder per machine, so that a checkpoint of a geometry met before
skips the random layers (``analysis.chance.use_store``).

The chance level of a weight metric depends on the model's shapes, its norm type, whether it is
query-free, the device type and the seed, never on the weights (``analysis.chance``); drawing
them is most of the CPU time of analysing a small checkpoint (about 3.5 of 4 CPU seconds for a
demo checkpoint). Every analysis of another checkpoint of the same geometry (the steps of one
run, the runs of one sweep) would draw them again in its own reading child.

Folder: ``$QKVSCOPE_CHANCE_CACHE`` when set (an empty value turns the store off), else
``chance/`` in the user cache folder (``platformdirs.user_cache_path("qkvscope")``, e.g.
``~/.cache/qkvscope/chance``).

Entry: one JSON file per key, named by the sha256 of the key and of the code that draws the
rows: every ``.py`` file of the ``analysis`` package and the file of each registered metric's
module (plugins included), so changed code, or a plugin switched on, never reads rows drawn by
other code. The file holds ``{"key": [...], "rows": [...]}``; JSON, never a pickle. It is
written to a temporary file and renamed, so a reader sees a whole entry or none. An entry that
does not parse, or whose key or rows are not of the expected form, is drawn again and rewritten;
a folder that cannot be written leaves the analysis as it was (drawn in the process). At most
``MAX_ENTRIES`` files are kept; the least recently written go first.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from analysis import chance, registry

#: The environment variable naming the folder (``loaders/settings.py``).
ENV = "QKVSCOPE_CHANCE_CACHE"
#: Entries kept; one is a few hundred KB at most.
MAX_ENTRIES = 256
#: Fields of one row: ``(metric, whole, chance, how, low, high, null)`` (``analysis.chance``).
_ROW_TYPES = (str, bool, float, str, float, float, list)


def folder() -> Path | None:
    """The folder of the store, or None where ``$QKVSCOPE_CHANCE_CACHE`` is set empty."""
    env = os.environ.get(ENV)
    if env is not None:
        return Path(env) if env.strip() else None
    import platformdirs  # here: only a process that analyses needs it

    return platformdirs.user_cache_path("qkvscope") / "chance"


def code_digest() -> str:
    """sha256 over the source of the ``analysis`` package and of each registered metric's module."""
    root = Path(sys.modules["analysis"].__file__).parent
    files = set(root.rglob("*.py"))
    for p in registry.computed("weights"):
        mod = sys.modules.get(getattr(p.compute, "__module__", ""), None)
        if getattr(mod, "__file__", None):
            files.add(Path(mod.__file__))
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _rows(doc, key: list) -> tuple[tuple, ...] | None:
    """The rows of a parsed entry, or None where it is not an entry of ``key``."""
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("rows"), list):
        return None
    rows = []
    for row in doc["rows"]:
        if not (isinstance(row, list) and len(row) == len(_ROW_TYPES)):
            return None
        row = [float(v) if t is float and isinstance(v, int) and not isinstance(v, bool) else v
               for v, t in zip(row, _ROW_TYPES)]
        if not all(isinstance(v, t) for v, t in zip(row, _ROW_TYPES)) or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row[6]):
            return None
        rows.append((*row[:6], tuple(float(v) for v in row[6])))
    return tuple(rows)


class DiskStore:
    """``get``/``put`` of chance rows in ``root`` (``analysis.chance.use_store``); NaN is written
    as JSON's ``NaN`` and read back as such."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._digests: dict[int, str] = {}

    def _path(self, key: list) -> Path:
            # the code that draws: read again only when a plugin is registered or removed
        digest = self._digests.get(registry.generation()) or \
            self._digests.setdefault(registry.generation(), code_digest())
        text = json.dumps([digest, key], separators=(",", ":"))
        return self.root / f"{hashlib.sha256(text.encode()).hexdigest()}.json"

    def get(self, key: tuple) -> tuple[tuple, ...] | None:
        key = json.loads(json.dumps(key))                    # tuples as the lists the file holds
        try:
            doc = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return _rows(doc, key)

    def put(self, key: tuple, rows: tuple[tuple, ...]) -> None:
        key = json.loads(json.dumps(key))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"key": key, "rows": [list(r) for r in rows]}, f, separators=(",", ":"))
                os.replace(tmp, self._path(key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self._trim()
        except OSError:
            return                                           # a cache: the rows are in the process's memo

    def _trim(self) -> None:
        entries = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[:max(0, len(entries) - MAX_ENTRIES)]:
            old.unlink(missing_ok=True)


def install() -> None:
    """Use the folder's store for this process's chance levels (once; a no-op where it is off)."""
    if getattr(chance, "_STORE", None) is not None or _installed.get("done"):
        return
    _installed["done"] = True
    root = folder()
    if root is not None:
        chance.use_store(DiskStore(root))


_installed: dict[str, bool] = {}
