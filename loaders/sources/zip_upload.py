"""Zip uploads: a checkpoint file or folder extracted safely to a temporary
folder that ``close()`` deletes, then opened as what it holds.

Reads the zip's directory and each entry's local header before anything is
decompressed. Budgets: at most ``_ZIP_MAX_ENTRIES`` (10,000) entries;
``QKVSCOPE_ZIP_TOTAL_BYTES`` (64 GiB) uncompressed in all, both declared and
actually written; 200:1 per entry over 1 MiB; entries may not overlap (a zip
bomb expanding the same bytes once per entry); no entry larger than its
header declares; the declared total must fit the temporary folder's free
space. Errors: ``CheckpointFormatError`` for absolute paths, ``..``, symbolic
links, encryption, duplicate names, nested zips, an empty zip, and any of
the budgets; an error inside names the entry (``ZIP: inner/file: what``).
"""
from __future__ import annotations

import re
import shutil
import stat
import struct
import tempfile
import weakref
import zipfile
from pathlib import Path, PurePosixPath

import torch

from loaders.budgets import budget
from loaders.checkpoint_names import EXPECTED
from loaders.errors import CheckpointFormatError, FileError
from loaders.sources.files import _CHUNK, _Closing
from loaders.sources.sniff import _file_kind
from loaders.tensor_source import TensorSource

# Zip uploads: limits against zip bombs and runaway extraction.
_ZIP_MAX_ENTRIES = 10_000
_ZIP_MAX_TOTAL = budget("QKVSCOPE_ZIP_TOTAL_BYTES")   # 64 GiB uncompressed in all (declared and written)
_ZIP_MAX_RATIO = 200                 # per entry, uncompressed / compressed
_ZIP_RATIO_MIN_SIZE = 1 << 20        # the ratio is checked for entries over 1 MiB
_ZIP_JUNK = ("__MACOSX/",)


def _check_zip_entry(zp: Path, info: zipfile.ZipInfo) -> None:
    name = info.filename
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise CheckpointFormatError(zp, f"zip entry '{name}' has an absolute path; refused")
    if ".." in parts:
        raise CheckpointFormatError(zp, f"zip entry '{name}' climbs out of the folder with '..'; refused")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise CheckpointFormatError(zp, f"zip entry '{name}' is a symbolic link; refused")
    if info.flag_bits & 0x1:
        raise CheckpointFormatError(zp, f"zip entry '{name}' is encrypted; expected a plain zip")
    if info.file_size > _ZIP_RATIO_MIN_SIZE:
        ratio = info.file_size / max(info.compress_size, 1)
        if ratio > _ZIP_MAX_RATIO:
            raise CheckpointFormatError(
                zp, f"zip entry '{name}' expands {ratio:.0f}x ({info.file_size} bytes from "
                    f"{info.compress_size}), over the {_ZIP_MAX_RATIO}x limit; refused as a zip bomb")


def _check_zip_overlap(zp: Path, zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo]) -> None:
    """Each entry's bytes (local header, name, extra field, compressed data) must
    end before the next entry's local header starts: overlapping entries are a
    zip bomb that expands the same compressed bytes once per entry. The local
    header's name and extra lengths (bytes 26..30, APPNOTE 4.3.7) are read from
    the file; nothing is decompressed."""
    spans = []
    fp = zf.fp
    for info in infos:
        fp.seek(info.header_offset)
        local = fp.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise CheckpointFormatError(
                zp, f"zip entry '{info.filename}' has no local header at byte {info.header_offset}; "
                    f"the file is truncated or corrupt")
        n_name, n_extra = struct.unpack("<HH", local[26:30])
        start = info.header_offset
        spans.append((start, start + 30 + n_name + n_extra + info.compress_size, info.filename))
    spans.sort()
    for (s0, e0, a), (s1, _e1, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise CheckpointFormatError(
                zp, f"zip entries '{a}' and '{b}' overlap (bytes {s1}..{e0}); refused as a zip bomb")


def _extract_zip(zp: Path, dest: Path) -> None:
    try:
        zf = zipfile.ZipFile(zp)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CheckpointFormatError(zp, f"is not a readable zip file ({exc})") from None
    with zf:
        infos = [i for i in zf.infolist() if not i.filename.startswith(_ZIP_JUNK)]
        if len(infos) > _ZIP_MAX_ENTRIES:
            raise CheckpointFormatError(
                zp, f"zip has {len(infos)} entries, over the {_ZIP_MAX_ENTRIES}-entry limit")
        seen: set[str] = set()
        total = 0
        for info in infos:
            _check_zip_entry(zp, info)
            norm = info.filename.rstrip("/")
            if norm in seen:
                raise CheckpointFormatError(zp, f"zip entry '{info.filename}' appears twice; refused")
            seen.add(norm)
            total += info.file_size
        if total > _ZIP_MAX_TOTAL:
            raise CheckpointFormatError(
                zp, f"zip expands to {total} bytes, over the {_ZIP_MAX_TOTAL}-byte limit")
        free = shutil.disk_usage(dest).free
        if total > free:
            raise CheckpointFormatError(
                zp, f"zip expands to {total} bytes but the temporary folder {dest} has {free} free")
        _check_zip_overlap(zp, zf, infos)
        root = dest.resolve()
        written_all = 0
        for info in infos:
            target = (dest / info.filename).resolve()
            if root not in target.parents and target != root:
                raise CheckpointFormatError(zp, f"zip entry '{info.filename}' leaves the extraction folder; refused")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            written = 0
            try:
                with zf.open(info) as src, open(target, "wb") as out:
                    while chunk := src.read(_CHUNK):
                        written += len(chunk)
                        written_all += len(chunk)
                        if written_all > _ZIP_MAX_TOTAL:
                            raise CheckpointFormatError(
                                zp, f"zip extraction wrote more than {_ZIP_MAX_TOTAL} bytes in all "
                                    f"(QKVSCOPE_ZIP_TOTAL_BYTES); refused")
                        if written > info.file_size:
                            raise CheckpointFormatError(
                                zp, f"zip entry '{info.filename}' holds more than the {info.file_size} "
                                    f"bytes its header declares; refused")
                        out.write(chunk)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                raise CheckpointFormatError(zp, f"zip entry '{info.filename}' cannot be extracted ({exc})") from None


def _zip_root(tmp: Path) -> Path:
    """The extracted thing to open: a lone top-level folder or file, else the folder itself."""
    root = tmp
    while True:
        items = [c for c in root.iterdir() if not c.name.startswith(".") and c.name != "__MACOSX"]
        if len(items) == 1 and items[0].is_dir():
            root = items[0]
            continue
        if len(items) == 1 and items[0].is_file():
            return items[0]
        return root


class ZipSource(_Closing, TensorSource):
    """A zip upload of a checkpoint file or folder, extracted into a temporary
    folder (entry checks: no absolute paths, no ``..``, no symlinks, at most
    10,000 entries, 64 GiB in all, 200:1 per entry over 1 MiB). ``close()``
    deletes the folder."""

    def __init__(self, path: str | Path):
        zp = Path(path)
        self.path = str(zp)
        tmp = Path(tempfile.mkdtemp(prefix="qkvscope-zip-"))
        self._tmp = tmp
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(tmp), True)
        self._inner: TensorSource | None = None
        try:
            _extract_zip(zp, tmp)
            root = _zip_root(tmp)
            rel = root.relative_to(tmp).as_posix() if root != tmp else "."
            if root == tmp and not any(tmp.iterdir()):
                raise CheckpointFormatError(zp, f"zip is empty; {EXPECTED}")
            try:
                if root.is_file() and _file_kind(root) == "zip":
                    raise CheckpointFormatError(
                        zp, f"zip entry '{rel}' is another zip; nested zips are not opened")
                # the dispatcher imports this module (it opens zips); a zip holds any format
                from loaders.sources.opening import open_source

                self._inner = open_source(root)
            except FileError as exc:
                if exc.path == str(zp):
                    raise
                where = Path(exc.path)
                inner_rel = where.relative_to(tmp).as_posix() if tmp in where.parents or where == tmp else exc.path
                raise type(exc)(zp, f"{inner_rel}: {exc.problem}") from None
        except BaseException:
            self._finalizer()
            raise
        self.format = f"zip/{getattr(self._inner, 'format', 'folder')}"
        self.config = self._inner.config
        self.extras = self._inner.extras
        self.extras["zip_member"] = rel

    def keys(self) -> list[str]:
        return self._inner.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return self._inner.shape(key)

    def dtype(self, key: str) -> str:
        return self._inner.dtype(key)

    def get(self, key: str) -> torch.Tensor:
        return self._inner.get(key)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
        self._finalizer()

    @property
    def extracted_to(self) -> Path | None:
        """The temporary folder (``None`` once closed)."""
        return self._tmp if self._finalizer.alive else None
