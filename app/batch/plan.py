"""What a batch runs: its inputs, task sizes, layer groups and the tasks themselves (``TaskSpec``).

Inputs: ``expand_targets`` turns paths, ids and glob patterns (and ``--all``) into
checkpoint ids, ingesting paths first; an unreadable match is listed, not fatal.

Layer groups (very large checkpoints). When a checkpoint's attention weights
(``params_attention`` times the dtype's bytes, from the store) exceed
``max_task_bytes`` (default ``DEFAULT_MAX_TASK_BYTES``, 4 GB; CLI
``--max-task-bytes``), its weight metrics run as tasks of contiguous layer
ranges, as even as possible, each within the limit (``layer_groups``). Each
group task opens the checkpoint itself, reads only its layers, and writes
``part-L<first>-<last>.parquet`` and ``job-L<first>-<last>.parquet`` in the same
``kind=weights`` folder. Weight metrics are per layer, so the groups' rows
together are exactly the whole checkpoint's rows (``app.batch.register`` joins
them). Activation metrics need the whole model, so they stay one task per
checkpoint.

``plan_tasks`` decides, per checkpoint, what is done already (its ``job.parquet``
exists at the location's metric version) and which tasks remain.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import duckdb

from analysis.registry import METRIC_VERSION
from app.batch.errors import BatchError
from app.batch.location import ResultsLocation, group_tag
from app.batch.report import CheckpointReport
from loaders.errors import QkvscopeError
from loaders.store import Store

#: Default ``max_task_bytes``: 4 GB (1e9 bytes) of attention weights per task.
DEFAULT_MAX_TASK_BYTES = 4 * 10**9
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b|b)?", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_GLOB_CHARS = re.compile(r"[*?\[]")


# -- sizes and layer groups -------------------------------------------------------------
def parse_size(text: str) -> int | None:
    """Bytes from ``4GB``, ``512MiB``, ``1.5TB`` or ``1000000`` (GB = 1e9, GiB = 2^30);
    ``none`` is None: never split a checkpoint into layer groups."""
    if text.strip().lower() == "none":
        return None
    m = _SIZE.fullmatch(text.strip())
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()] if m else 0
    if value < 1:
        raise BatchError(f"--max-task-bytes: expected a size of at least 1 byte such as 4GB, 512MiB or "
                         f"1000000, or 'none', found {text!r}")
    return int(value)


def layer_label(layers: tuple[int, int]) -> str:
    return f"layers {layers[0]}-{layers[1] - 1}"


def attention_bytes(row: dict) -> int:
    """Bytes of a stored checkpoint's attention weights: ``params_attention`` times the size
    of its dtype, or, where ingest did not count them, the geometry's Q, K, V and O."""
    from loaders.canonical import dtype_bytes      # here: importing app.batch stays torch-free

    params = row.get("params_attention") or (
        row["n_layers"] * (2 * row["n_heads"] + 2 * row["n_kv_heads"]) * row["d_model"] * row["d_head"])
    return int(params) * dtype_bytes(row.get("dtype") or "float32")


def layer_groups(n_layers: int, total_bytes: int, max_task_bytes: int | None) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` layer ranges with at most ``max_task_bytes`` of attention
    weights each (one layer at least), as even as possible: ``[(0, n_layers)]`` when the
    whole checkpoint fits or ``max_task_bytes`` is None. Layers count as equal shares."""
    if max_task_bytes is None or n_layers <= 1 or total_bytes <= max_task_bytes:
        return [(0, n_layers)]
    per_layer = -(-total_bytes // n_layers)
    per_group = max(1, max_task_bytes // per_layer)
    count = -(-n_layers // per_group)
    size, extra = divmod(n_layers, count)            # the first `extra` groups take one layer more
    groups, start = [], 0
    for g in range(count):
        stop = start + size + (g < extra)
        groups.append((start, stop))
        start = stop
    return groups


# -- one task ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """What a worker needs: everything plain, so it pickles to any Ray node."""

    checkpoint_id: int
    sha256: str
    path: str
    kinds: tuple[str, ...]
    results: str                    # the results root (folder or URL)
    device: str | None = None       # None: the worker's own default (resolved once, where the task starts)
    layers: tuple[int, int] | None = None   # [start, stop) of one layer group; None: every layer
    metric_version: int = METRIC_VERSION    # the driver's, so every task of a batch writes the same version

    def __post_init__(self):
        if self.layers is not None and self.kinds != ("weights",):
            raise ValueError(f"a layer group computes weight metrics only (activation metrics need the "
                             f"whole model), found kinds {self.kinds}")

    @property
    def key(self) -> str:
        """The attempt-log key: the sha256, plus the layer range for a group."""
        return self.sha256 + group_tag(self.layers)

    @property
    def label(self) -> str:
        return "whole checkpoint" if self.layers is None else layer_label(self.layers)


@dataclass
class TaskOutcome:
    checkpoint_id: int
    sha256: str
    status: str                     # 'computed' or 'failed'
    attempt: int
    host: str
    pid: int
    error: str | None = None


# -- inputs ---------------------------------------------------------------------------
def is_glob(target: str) -> bool:
    """A target that is not an existing path but contains ``*``, ``?`` or ``[``."""
    return bool(_GLOB_CHARS.search(target)) and not Path(target).expanduser().exists()


@dataclass
class Inputs:
    checkpoint_ids: list[int]
    errors: list[dict]              # {"target", "reason"}: inputs that could not be ingested


def expand_targets(store: Store, targets: Iterable[str], *, all_checkpoints: bool = False) -> Inputs:
    """Checkpoint ids for ``targets`` (paths, ids, glob patterns) and, with
    ``all_checkpoints``, every stored checkpoint. Paths and glob matches are
    ingested first; one that cannot be read is listed in ``errors`` and the
    rest go on. A pattern matching nothing is a ``BatchError``."""
    from app.jobs import resolve        # here: app.jobs imports torch, app.batch stays torch-free

    ids: list[int] = []
    errors: list[dict] = []
    if all_checkpoints:
        ids += [int(c["id"]) for c in store.checkpoints()]
    for target in targets:
        if is_glob(target):
            matches = sorted(glob.glob(os.path.expanduser(target), recursive=True))
            if not matches:
                raise BatchError(f"{target}: no file or folder matches this pattern")
            for m in matches:
                try:
                    ids.append(resolve(store, m))
                except QkvscopeError as exc:
                    errors.append({"target": m, "reason": str(exc)})
        else:
            ids.append(resolve(store, target))   # an explicit bad target stops, as in `analyze`
    seen: set[int] = set()
    unique = [i for i in ids if not (i in seen or seen.add(i))]
    return Inputs(unique, errors)


# -- the plan ---------------------------------------------------------------------------
@dataclass
class Plan:
    """Per checkpoint its report, the layer groups of those whose weights are split, and the tasks."""

    reports: dict[int, CheckpointReport]
    split: dict[int, list[tuple[int, int]]]
    specs: list[TaskSpec]


def plan_tasks(rows: list[dict], kinds: list[str], loc: ResultsLocation, con: duckdb.DuckDBPyConnection, *,
               force: bool, device: str | None, max_task_bytes: int | None) -> Plan:
    """The reports, layer groups and tasks of a batch over the stored checkpoints ``rows``.

    A kind whose ``job.parquet`` exists is done (unless ``force``). A checkpoint whose
    weights are to be computed and whose attention weights exceed ``max_task_bytes`` gets
    one weights task per layer group (a group whose own job file exists is reused) and,
    for activations, one whole-checkpoint task; any other gets one task for all its kinds.
    """
    plan = Plan({}, {}, [])
    for r in rows:
        cid, sha = r["id"], r["sha256"]
        rep = plan.reports[cid] = CheckpointReport(cid, r["path"], sha, "skipped", list(kinds))
        todo = list(kinds) if force else [k for k in kinds if not loc.exists(loc.job(sha, k), con)]
        groups = layer_groups(r["n_layers"], attention_bytes(r), max_task_bytes)
        if "weights" in todo and len(groups) > 1:
            todo.remove("weights")
            plan.split[cid] = groups
            if force and not loc.remote:        # a forced run that fails must not leave the old marker
                Path(loc.job(sha, "weights")).unlink(missing_ok=True)
            for g in groups:
                done = not force and loc.exists(loc.job(sha, "weights", g), con)
                rep.groups.append({"layers": [g[0], g[1] - 1], "status": "skipped" if done else "pending",
                                   "file": loc.part(sha, "weights", g), "attempts": [], "error": None})
                if not done:
                    plan.specs.append(TaskSpec(cid, sha, r["path"], ("weights",), loc.root, device, g,
                                               loc.metric_version))
        if todo:
            plan.specs.append(TaskSpec(cid, sha, r["path"], tuple(todo), loc.root, device,
                                       metric_version=loc.metric_version))
    return plan
