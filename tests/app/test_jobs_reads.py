"""How often ``analyze PATH`` reads the checkpoint's bytes: the two jobs the reading child runs
for it (``ingest_checkpoint``, then ``analyze``: ``app.jobs.compute_jobs``), here in this process
on a demo safetensors file, every read of the file counted by byte range.

What one job reads, and why:

* the whole file once, in order, for its content hash (``loaders.sources.hashing``: the store's
  key, ``sha256sum FILE``; streamed in 1 MiB chunks, never held);
* each attention tensor once at ingest, for the NaN/Inf count stored with the checkpoint
  (``loaders.checkpoints.count_nonfinite``; it runs beside the hash, in another thread);
* each attention tensor once more for the metrics, and the ties (``app.jobs.layer_ties``) and
  the non-finite notes ride along that read: no third pass.

The same file analysed again reads nothing: the ingest journal knows it by path, size and
mtime (``loaders.journal.stored_checkpoint``) and gives its stored id without hashing, and the
stored job is current (``loaders.results.current_job``), so nothing is computed. That check trusts
the file system: a file rewritten in place with the same size and the same mtime (to the
nanosecond) is taken for the stored one.

The second read of the attention tensors stays: the hash decides whether anything is stored and
computed at all (the same content under a second name, a job already current), and the
checkpoint row, its count included, is stored whole before any analysis runs, so a metric that
cannot be computed (a bomb that ends the child, a weight dtype no metric takes) leaves a stored
checkpoint, not half a one. Riding the hash along the metrics' read would need the file in file
order while the metrics read it layer by layer in layer order (safetensors stores
``layers.10`` before ``layers.2``), one layer in memory at a time. What the extra reads cost
beside the metrics is small: on the 1.1B shape of ``bench/_shapes.py`` the hash and the count
together take a few CPU-seconds, against minutes for the metrics of the 22 layers.
"""
from __future__ import annotations

import builtins
import json
import os
import struct
from pathlib import Path

import numpy as np

from app import jobs
from app.jobs import compute_jobs
from loaders.ingest import ingest_checkpoint
from loaders.sources import hashing, safetensors_file, sniff
from loaders.store import Store

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo" / "q_eq_k-mha-wd0.1" / "checkpoints"


def _ranges(path: Path) -> tuple[int, dict[str, tuple[int, int]]]:
    """The data area's start and each tensor's ``[begin, end)`` in the file (safetensors layout)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return 8 + n, {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in header.items()}


class _Counted:
    """A file object of ``path`` whose reads add their byte ranges to ``log``."""

    def __init__(self, fh, log: list):
        self._fh, self._log = fh, log

    def read(self, n=-1):
        at = self._fh.tell()
        data = self._fh.read(n)
        self._log.append((at, at + len(data)))
        return data

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def test_analyze_path_reads_the_file_for_its_hash_and_the_attention_tensors_twice(tmp_path, monkeypatch):
    path = tmp_path / "final_step_004000.safetensors"
    path.write_bytes((DEMO / path.name).read_bytes())
    size = path.stat().st_size
    start, tensors = _ranges(path)
    reads: list[tuple[int, int]] = []

    def counted_open(file, mode="r", *args, **kwargs):
        fh = builtins.open(file, mode, *args, **kwargs)
        return _Counted(fh, reads) if Path(file) == path and "b" in mode else fh

    for module in (hashing, safetensors_file, sniff):
        monkeypatch.setattr(module, "open", counted_open, raising=False)
    real_preadv = os.preadv

    def counted_preadv(fd, buffers, offset, *args):
        n = real_preadv(fd, buffers, offset, *args)
        if Path(os.readlink(f"/proc/self/fd/{fd}")) == path:
            reads.append((offset, offset + n))
        return n

    monkeypatch.setattr(os, "preadv", counted_preadv)
    store = Store(tmp_path / "reads.duckdb")
    store.migrate()

    added = ingest_checkpoint(store, path)
    assert added.status == "added"
    job = compute_jobs(str(path), kinds=["weights"], device="cpu")[0]
    assert job["tied"]["variant"] == "q_eq_k"           # the ties came from the metrics' read
    jobs._store_results(store, [jobs._job_from_json(added.checkpoint_id, str(path), job)])
    first = list(reads)

    # analysed again, unchanged (size and mtime as journalled): no byte is read, nothing computed
    reads.clear()
    again = ingest_checkpoint(store, path)
    assert (again.status, again.checkpoint_id) == ("unchanged", added.checkpoint_id)
    (cached,) = jobs.analyze(store, added.checkpoint_id)
    assert cached.cached and cached.tied["variant"] == "q_eq_k"
    assert reads == []

    # how many reads covered each byte of the file, tensor by tensor
    reads = first
    covered = np.zeros(size, dtype=np.int64)
    for a, b in reads:
        covered[a:b] += 1
    times = {key: set(covered[begin:end].tolist()) for key, (begin, end) in tensors.items() if end > begin}
    attention = {k for k in tensors if ".attn." in k}
    assert attention and all(times[k] == {3} for k in attention)
    others = set(times) - attention
    assert others and all(times[k] == {1} for k in others)
    # the hash streamed the whole file once, in order, from byte 0 to the end
    hashed = [r for r in reads if r[1] - r[0] > 0 and r[0] < start]
    assert hashed and hashed[0][0] == 0 and max(b for _, b in reads) == size
