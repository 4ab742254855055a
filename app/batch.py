"""Batch analysis: many checkpoints, in-process or on a Ray cluster, results as Parquet.

``run_batch(store, checkpoint_ids, results=..., ray_address=None)`` analyses
every checkpoint with ONE task per checkpoint, or, for a checkpoint whose
attention weights exceed ``max_task_bytes``, one task per layer group (below).
A task (``run_task``) opens its checkpoint at the stored path (streaming one
layer at a time, as ``app.jobs.weight_frame`` does), computes the weight
metrics (and with ``activations`` the activation metrics) and writes, per
kind, two Parquet files::

    <results>/checkpoint=<sha256>/metric_version=<v>/kind=<weights|activations>/part.parquet
        checkpoint_sha256, path, layer, head, metric, value      (one row per value)
    <results>/checkpoint=<sha256>/metric_version=<v>/kind=<...>/job.parquet
        checkpoint_sha256, path, kind, metric_version, notes (JSON), seconds, device, host

``job.parquet`` is written last and is the completion marker: a re-run skips a
checkpoint whose ``job.parquet`` exists for every requested kind at the
current ``analysis.registry.METRIC_VERSION``. The driver (this process, the only
DuckDB writer) then registers each result: DuckDB reads the Parquet directly
(``read_parquet``) into ``analysis_results`` / ``analysis_jobs`` (so ``analyze ID``,
the dashboard and SQL see them) and records the file locations in
``analysis_result_files``.

Layer groups (very large checkpoints). When a checkpoint's attention weights
(``params_attention`` times the dtype's bytes, from the store) exceed
``max_task_bytes`` (default ``DEFAULT_MAX_TASK_BYTES``, 4 GB; CLI
``--max-task-bytes``), its weight metrics run as tasks of contiguous layer
ranges, as even as possible, each within the limit (``layer_groups``). Each
group task opens the checkpoint itself, reads only its layers, and writes, in
the same ``kind=weights`` folder::

    part-L<first>-<last>.parquet   the rows of those layers (same columns as part.parquet)
    job-L<first>-<last>.parquet    the group's completion marker (first_layer, last_layer, notes, ...)

Weight metrics are per layer, so the groups' rows together are exactly the
whole checkpoint's rows. Once every group has succeeded the driver joins them
(``finalise_groups``): it merges the groups' notes in layer order, adds the
undefined-value notes once over all rows (as one task would), and writes the
checkpoint's ``job.parquet`` listing the parts (``parts``); only then is the
result registered, and only then does a re-run take it as done. A failed
group leaves no ``job.parquet``, so nothing is registered; a re-run recomputes
only the groups without a job file (of the same layer range) and then joins
them. Activation metrics need the whole model, so they stay one task per
checkpoint. Each group is retried and reported on its own
(``CheckpointReport.groups``, errors prefixed with ``layers A-B``).

Where tasks run:

* ``ray_address=None``: in this process, one after the other, through the
  same ``run_task``; results are identical to a Ray run.
* ``ray_address="auto"``: ``ray.init()``: the cluster named by ``RAY_ADDRESS``
  or one started with ``ray start`` on this machine, else a new local one;
  ``"local"`` always starts a new local instance; anything else
  (``ray://head:10001``, ``head:6379``) is the cluster's address. The packages
  ``app``, ``analysis``, ``loaders`` and ``experiments`` are shipped to the
  workers (``runtime_env`` ``py_modules``); the checkpoints must be readable by
  the workers at their stored paths.

Failures: a task whose checkpoint is unreadable (a ``QkvscopeError``: broken
file, missing path) fails at once, without retries. Any other exception, and
a worker process that dies (killed, out of memory), is retried up to
``retries`` times (Ray ``max_retries`` and ``retry_exceptions``; in-process,
exceptions only: a dead process cannot retry itself). Every attempt is logged
(``AttemptLog``, a Ray actor on a cluster) and reported per checkpoint, so
a retried or failed task is never silently dropped.

Object storage: ``s3://`` (also ``gs://``, ``r2://``) results are read and
written by DuckDB's ``httpfs`` extension (``INSTALL httpfs; LOAD httpfs``,
which needs network access once to download the extension). Credentials come
from the usual ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and
``AWS_ENDPOINT_URL`` environment variables (a ``config`` secret), or, when no
key is set, the AWS SDK credential chain (DuckDB's ``aws`` extension). Workers
need the same variables.
"""
from __future__ import annotations

import glob
import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import duckdb
import pandas as pd

from analysis.registry import METRIC_VERSION, names
from loaders.errors import QkvscopeError, StoreError
from loaders.results import replace_results
from loaders.store import Store

KINDS = ("weights", "activations")
#: URL schemes DuckDB's httpfs extension reads and writes.
REMOTE_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "r2://")
_GLOB_CHARS = re.compile(r"[*?\[]")
#: Files a result folder holds: ``part.parquet``/``job.parquet`` and, per layer group,
#: ``part-L0000-0003.parquet``/``job-L0000-0003.parquet`` (first and last layer).
_RESULT_FILE = re.compile(r"(part|job)(-L\d{4,}-\d{4,})?\.parquet")
#: Default ``max_task_bytes``: 4 GB (1e9 bytes) of attention weights per task.
DEFAULT_MAX_TASK_BYTES = 4 * 10**9
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b|b)?", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class BatchError(QkvscopeError):
    """A batch cannot start or its results cannot be read back (user-facing, one line)."""


# -- layer groups ------------------------------------------------------------------------
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


def group_tag(layers: tuple[int, int] | None) -> str:
    """``-L0004-0007`` for layers [4, 8) (first and last layer), ``''`` for the whole checkpoint."""
    return "" if layers is None else f"-L{layers[0]:04d}-{layers[1] - 1:04d}"


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


# -- where results live ----------------------------------------------------------
def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal. Only for statements that take no parameters
    (``COPY ... TO``, ``CREATE SECRET``); everything else binds values."""
    return "'" + text.replace("'", "''") + "'"


class ResultsLocation:
    """A results root: a local folder or an object-storage URL (``s3://bucket/prefix``).

    ``part(sha, kind)`` and ``job(sha, kind)`` name the two files of one result;
    ``exists``, ``write`` and ``prepare`` hide the local/remote difference.
    """

    def __init__(self, root: str | Path):
        text = str(root)
        self.remote = text.startswith(REMOTE_SCHEMES)
        if self.remote:
            self.root = text.rstrip("/")
        else:
            self.root = str(Path(text).expanduser().resolve())

    def __repr__(self) -> str:
        return f"ResultsLocation({self.root!r})"

    def folder(self, sha256: str, kind: str) -> str:
        return f"{self.root}/checkpoint={sha256}/metric_version={METRIC_VERSION}/kind={kind}"

    def part(self, sha256: str, kind: str, layers: tuple[int, int] | None = None) -> str:
        """The rows of a whole-checkpoint task, or with ``layers`` ([start, stop)) of one layer group."""
        return f"{self.folder(sha256, kind)}/part{group_tag(layers)}.parquet"

    def job(self, sha256: str, kind: str, layers: tuple[int, int] | None = None) -> str:
        """The checkpoint's completion marker, or with ``layers`` the marker of one layer group."""
        return f"{self.folder(sha256, kind)}/job{group_tag(layers)}.parquet"

    def parts_glob(self, sha256: str, kind: str) -> str:
        """Every layer-group part of one checkpoint and kind, as a DuckDB glob."""
        return f"{self.folder(sha256, kind)}/part-L*.parquet"

    def remove_stale(self, sha256: str, kind: str, groups: list[tuple[int, int]] | None) -> None:
        """Delete the part and job files of this result that belong neither to ``groups`` nor,
        with ``groups`` None, to the whole-checkpoint task: those an earlier run with other
        layer groups left, so ``**/part*.parquet`` reads each row once. Local folders only:
        DuckDB cannot delete objects, so a bucket keeps them (registration reads only the
        parts that ``job.parquet`` lists)."""
        if self.remote:
            return
        keep = {"job.parquet"} | {Path(f(sha256, kind, g)).name for g in (groups or [None])
                                  for f in (self.part, self.job)}
        for f in Path(self.folder(sha256, kind)).glob("*.parquet"):
            if f.name not in keep and _RESULT_FILE.fullmatch(f.name):
                f.unlink(missing_ok=True)

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        """Make ``con`` able to read and write this location (httpfs + credentials for URLs)."""
        if not self.remote:
            return
        try:
            con.execute("INSTALL httpfs")
            con.execute("LOAD httpfs")
        except duckdb.Error as exc:
            raise BatchError(f"{self.root}: object-storage results need DuckDB's httpfs extension, "
                             f"which could not be installed or loaded ({exc})") from exc
        key = os.environ.get("AWS_ACCESS_KEY_ID")
        if key:
            parts = [f"KEY_ID {_sql_string(key)}",
                     f"SECRET {_sql_string(os.environ.get('AWS_SECRET_ACCESS_KEY', ''))}"]
            for env, opt in (("AWS_SESSION_TOKEN", "SESSION_TOKEN"), ("AWS_ENDPOINT_URL", "ENDPOINT")):
                if os.environ.get(env):
                    value = os.environ[env]
                    if opt == "ENDPOINT":       # DuckDB wants host[:port], the scheme goes in USE_SSL
                        parts.append(f"USE_SSL {'false' if value.startswith('http://') else 'true'}")
                        value = re.sub(r"^https?://", "", value).rstrip("/")
                    parts.append(f"{opt} {_sql_string(value)}")
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                parts.append(f"REGION {_sql_string(region)}")
            con.execute(f"CREATE OR REPLACE TEMPORARY SECRET qkvscope_s3 "
                        f"(TYPE s3, PROVIDER config, {', '.join(parts)})")
        else:
            try:
                con.execute("INSTALL aws")
                con.execute("LOAD aws")
                con.execute("CREATE OR REPLACE TEMPORARY SECRET qkvscope_s3 (TYPE s3, PROVIDER credential_chain)")
            except duckdb.Error as exc:
                raise BatchError(f"{self.root}: no AWS_ACCESS_KEY_ID in the environment and the AWS "
                                 f"credential chain is unavailable ({exc})") from exc

    def exists(self, url: str, con: duckdb.DuckDBPyConnection | None = None) -> bool:
        if not self.remote:
            return Path(url).is_file()
        own = con is None
        con = con or duckdb.connect()
        try:
            if own:
                self.prepare(con)
            return bool(con.execute("SELECT count(*) FROM glob(?)", [url]).fetchone()[0])
        finally:
            if own:
                con.close()

    def write(self, con: duckdb.DuckDBPyConnection, frame: pd.DataFrame, url: str) -> None:
        """Write ``frame`` as Parquet at ``url``; a local file appears whole or not at all."""
        con.register("_qkv_out", frame)
        try:
            if self.remote:
                con.execute(f"COPY _qkv_out TO {_sql_string(url)} (FORMAT PARQUET)")
                return
            final = Path(url)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
            con.execute(f"COPY _qkv_out TO {_sql_string(str(tmp))} (FORMAT PARQUET)")
            os.replace(tmp, final)
        finally:
            con.unregister("_qkv_out")


# -- one task ------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """What a worker needs: everything plain, so it pickles to any Ray node."""

    checkpoint_id: int
    sha256: str
    path: str
    kinds: tuple[str, ...]
    results: str                    # the results root (folder or URL)
    device: str | None = None
    layers: tuple[int, int] | None = None   # [start, stop) of one layer group; None: every layer

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


class AttemptLog:
    """Every start and end of every task attempt, keyed by checkpoint sha256.

    On Ray it runs as an actor, so attempts on workers that died are still
    known: a start without an end is a worker that never came back.
    """

    def __init__(self):
        self._log: dict[str, list[dict]] = {}

    def start(self, key: str, host: str, pid: int) -> int:
        attempts = self._log.setdefault(key, [])
        attempts.append({"attempt": len(attempts) + 1, "host": host, "pid": pid, "outcome": None})
        return len(attempts)

    def end(self, key: str, attempt: int, outcome: str) -> None:
        self._log[key][attempt - 1]["outcome"] = outcome

    def close_open(self, key: str, outcome: str) -> None:
        """End the latest attempt with ``outcome`` unless it already ended."""
        attempts = self._log.get(key, [])
        if attempts and attempts[-1]["outcome"] is None:
            attempts[-1]["outcome"] = outcome

    def attempts(self, key: str) -> list[dict]:
        return [dict(a, outcome=a["outcome"] or "no result: the worker process died")
                for a in self._log.get(key, [])]


def log_call(log, method: str, *args):
    """Call ``log.method(*args)`` on a plain AttemptLog or, through ``ray.get``, on its actor."""
    fn = getattr(log, method)
    if hasattr(fn, "remote"):
        import ray

        return ray.get(fn.remote(*args))
    return fn(*args)


def _result_frame(frame: pd.DataFrame, spec: TaskSpec) -> pd.DataFrame:
    """The tidy metric frame as the part.parquet columns (head label dropped: derivable)."""
    return pd.DataFrame({
        "checkpoint_sha256": pd.Series([spec.sha256] * len(frame), dtype="string"),
        "path": pd.Series([spec.path] * len(frame), dtype="string"),
        "layer": frame["layer"].astype("int32").to_numpy(),
        "head": frame["head"].astype("Int32").to_numpy(),
        "metric": frame["metric"].astype("string").to_numpy(),
        "value": frame["value"].astype("float64").to_numpy(),
        **{c: pd.to_numeric(frame[c] if c in frame.columns else pd.Series([None] * len(frame)), errors="coerce")
           .astype("Int64" if c == "n_tokens" else "float64").to_numpy()
           for c in ("chance", "n_tokens", "ci_low", "ci_high")},
    })


def run_task(spec: TaskSpec, log) -> TaskOutcome:
    """Analyse one checkpoint (or one layer group of it) and write its Parquet files; the
    body of every task.

    A whole-checkpoint task writes ``part.parquet`` and, last, ``job.parquet`` per kind. A
    layer group (``spec.layers``) opens the checkpoint itself, reads only its layers, and
    writes ``part-L<first>-<last>.parquet`` and, last, ``job-L<first>-<last>.parquet``, whose
    ``notes`` leave out the undefined-value notes: the driver adds those once, over every
    group, when it joins them (``finalise_groups``).

    A ``QkvscopeError`` (unreadable checkpoint, missing file) is returned as a
    ``failed`` outcome: retrying cannot help. Anything else propagates, so Ray
    (or the in-process loop) retries it.
    """
    from app.jobs import activation_frame, weight_frame
    from analysis.weights import default_device
    from loaders.checkpoints import open_checkpoint

    host, pid = socket.gethostname(), os.getpid()
    attempt = log_call(log, "start", spec.key, host, pid)
    out = TaskOutcome(spec.checkpoint_id, spec.sha256, "computed", attempt, host, pid)
    try:
        loc = ResultsLocation(spec.results)
        if not Path(spec.path).exists():
            raise StoreError(f"{spec.path}: checkpoint {spec.checkpoint_id} is not readable on host {host} "
                             "(workers must reach the checkpoints at their stored paths)")
        dev = spec.device or default_device()
        con = duckdb.connect()
        try:
            loc.prepare(con)
            with open_checkpoint(spec.path) as ckpt:
                n_layers = ckpt.meta.n_layers
                if spec.layers is not None and not 0 <= spec.layers[0] < spec.layers[1] <= n_layers:
                    raise BatchError(f"{spec.path}: {spec.label} of checkpoint {spec.checkpoint_id} do not "
                                     f"exist: the file has {n_layers} layers (it changed since it was "
                                     "ingested; ingest it again)")
                for kind in spec.kinds:
                    t_kind = time.perf_counter()
                    if spec.layers is not None:
                        frame, notes = weight_frame(ckpt, device=dev, layers=range(*spec.layers),
                                                    nonfinite_notes=False)
                    else:
                        fn = weight_frame if kind == "weights" else activation_frame
                        frame, notes = fn(ckpt, device=dev)
                    seconds = time.perf_counter() - t_kind
                    loc.write(con, _result_frame(frame, spec), loc.part(spec.sha256, kind, spec.layers))
                    job = {"checkpoint_sha256": spec.sha256, "path": spec.path, "kind": kind,
                           "metric_version": METRIC_VERSION, "notes": json.dumps(notes, sort_keys=True),
                           "seconds": seconds, "device": str(dev), "host": host}
                    if spec.layers is not None:
                        job |= {"first_layer": spec.layers[0], "last_layer": spec.layers[1] - 1}
                    # last: the completion marker (of the checkpoint, or of this group)
                    loc.write(con, pd.DataFrame([job]), loc.job(spec.sha256, kind, spec.layers))
        finally:
            con.close()
    except QkvscopeError as exc:
        out.status, out.error = "failed", str(exc)
        log_call(log, "end", spec.key, attempt, f"failed: {exc}")
        return out
    except Exception as exc:
        log_call(log, "end", spec.key, attempt, f"{type(exc).__name__}: {exc} (retried if attempts remain)")
        raise
    log_call(log, "end", spec.key, attempt, "computed")
    return out


TaskFn = Callable[[TaskSpec, object], TaskOutcome]


# -- inputs --------------------------------------------------------------------------
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
    from app.jobs import resolve

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


# -- registration (driver only: one DuckDB writer) -----------------------------------------
def finalise_groups(con: duckdb.DuckDBPyConnection, loc: ResultsLocation, *, checkpoint_id: int, sha256: str,
                    path: str, kind: str, groups: list[tuple[int, int]]) -> None:
    """Join the layer groups of one checkpoint into its result: check every group's job file,
    build the notes exactly as ``weight_frame`` builds them for all layers at once (the
    groups' layer notes merged in layer order, then the undefined-value notes over the
    joined rows, with the same ``app.jobs`` helpers), and write the checkpoint's
    ``job.parquet``, its completion marker, listing the group parts in layer order.
    The driver calls it only once every group succeeded."""
    from app.jobs import _label, _merge_notes, _nonfinite_notes

    notes: dict[str, str] = {}
    seconds, devices, hosts, frames = 0.0, [], [], []
    for g in groups:
        url = loc.job(sha256, kind, g)
        try:
            rows = con.execute("SELECT checkpoint_sha256, metric_version, first_layer, last_layer, notes, seconds, "
                               "device, host FROM read_parquet(?, hive_partitioning = false)", [url]).fetchall()
        except duckdb.Error as exc:
            raise BatchError(f"{url}: cannot read the job file of {layer_label(g)} of checkpoint "
                             f"{checkpoint_id} ({exc})") from exc
        want = (sha256, METRIC_VERSION, g[0], g[1] - 1)
        if len(rows) != 1 or tuple(rows[0][:4]) != want:
            raise BatchError(f"{url}: expected one row for checkpoint sha256 {sha256}, metric version "
                             f"{METRIC_VERSION}, layers {g[0]} to {g[1] - 1}, found {[tuple(r[:4]) for r in rows]}")
        _, _, _, _, group_notes, group_seconds, device, host = rows[0]
        _merge_notes(notes, json.loads(group_notes) if group_notes else {})
        seconds += float(group_seconds or 0.0)
        devices += [device] if device not in devices else []
        hosts += [host] if host not in hosts else []
        part = loc.part(sha256, kind, g)
        try:
            frames.append(con.execute("SELECT layer, head, metric, value FROM read_parquet(?, hive_partitioning = "
                                      "false, union_by_name = true)", [part]).df())
        except duckdb.Error as exc:
            raise BatchError(f"{part}: cannot read the results of {layer_label(g)} of checkpoint "
                             f"{checkpoint_id} ({exc})") from exc
    frame = pd.concat(frames, ignore_index=True)               # layer order, as one task would produce
    frame["head_label"] = [_label(layer, head, metric) for layer, head, metric
                           in zip(frame["layer"], frame["head"], frame["metric"])]
    _nonfinite_notes(frame, notes)
    parts = [Path(loc.part(sha256, kind, g)).name for g in groups]
    job = pd.DataFrame([{
        "checkpoint_sha256": sha256, "path": path, "kind": kind, "metric_version": METRIC_VERSION,
        "notes": json.dumps(notes, sort_keys=True), "seconds": seconds, "device": ",".join(devices),
        "host": ",".join(hosts), "parts": json.dumps(parts)}])
    loc.write(con, job, loc.job(sha256, kind))


def _job_parts(loc: ResultsLocation, sha256: str, kind: str, listed: str | None) -> list[str]:
    """The part files a checkpoint's ``job.parquet`` stands for: its ``parts`` list (layer groups)
    or, without one, ``part.parquet``."""
    if listed is None:
        return [loc.part(sha256, kind)]
    names_ = json.loads(listed)
    bad = [n for n in names_ if not (isinstance(n, str) and _RESULT_FILE.fullmatch(n) and n.startswith("part"))]
    if bad or not names_:
        raise BatchError(f"{loc.job(sha256, kind)}: expected 'parts' to list part-L<first>-<last>.parquet "
                         f"files, found {names_!r}")
    return [f"{loc.folder(sha256, kind)}/{n}" for n in names_]


def register(store: Store, checkpoint_id: int, sha256: str, kind: str,
             loc: ResultsLocation) -> tuple[int, str]:
    """Read one result's Parquet into the store (replacing that checkpoint's rows of this
    kind and metric version) and record where it lives. Only a complete result has a
    ``job.parquet``; for a checkpoint analysed in layer groups it lists every group's part.
    Returns the rows read and the location recorded for them (``part.parquet``, or for
    layer groups the glob ``part-L*.parquet``)."""
    job = loc.job(sha256, kind)
    with store.transaction() as con:
        loc.prepare(con)
        try:
            got = con.execute("SELECT * FROM read_parquet(?, hive_partitioning = false)", [job]).df()
        except duckdb.Error as exc:
            raise BatchError(f"{job}: cannot read the job file of checkpoint {checkpoint_id} ({exc})") from exc
        missing = sorted({"checkpoint_sha256", "metric_version", "notes", "seconds", "device"} - set(got.columns))
        if missing:
            raise BatchError(f"{job}: expected the columns of a job file, missing {', '.join(missing)}")
        jrow = list(zip(got["checkpoint_sha256"], got["metric_version"]))
        if len(jrow) != 1 or jrow[0][0] != sha256 or jrow[0][1] != METRIC_VERSION:
            found = [(s, int(v)) for s, v in jrow]
            raise BatchError(f"{job}: expected one row for checkpoint sha256 {sha256} at metric version "
                             f"{METRIC_VERSION}, found {found}")
        first = got.iloc[0]
        notes, device = first["notes"], first["device"]
        seconds = None if pd.isna(first["seconds"]) else float(first["seconds"])
        parts = _job_parts(loc, sha256, kind, first["parts"] if "parts" in got.columns else None)
        where = parts[0] if len(parts) == 1 else f"{loc.folder(sha256, kind)} ({len(parts)} parts)"
        try:
            n = replace_results(con, checkpoint_id=checkpoint_id, kind=kind, metrics=names(kind),
                                metric_version=METRIC_VERSION, notes=notes, seconds=seconds, device=device,
                                parquet=parts, sha256=sha256)
            total = con.execute("SELECT count(*) FROM read_parquet(?, hive_partitioning = false)",
                                [parts]).fetchone()[0]
        except duckdb.Error as exc:
            raise BatchError(f"{where}: cannot read the results of checkpoint {checkpoint_id} ({exc})") from exc
        if n != total:
            raise BatchError(f"{where}: expected every row to belong to checkpoint sha256 {sha256}, "
                             f"found {total - n} of {total} rows of another checkpoint")
        con.execute("DELETE FROM analysis_result_files WHERE checkpoint_id = ? AND kind = ? "
                    "AND metric_version = ?", [checkpoint_id, kind, METRIC_VERSION])
        # one location per result: the part, or for layer groups the glob of their parts
        location = loc.part(sha256, kind) if parts == [loc.part(sha256, kind)] else loc.parts_glob(sha256, kind)
        con.execute("INSERT INTO analysis_result_files (checkpoint_id, kind, metric_version, sha256, location, "
                    "job_location, n_rows) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [checkpoint_id, kind, METRIC_VERSION, sha256, location, job, n])
    return int(n), location


# -- the batch -------------------------------------------------------------------------
@dataclass
class CheckpointReport:
    id: int
    path: str
    sha256: str
    status: str                     # 'computed', 'skipped' (results existed) or 'failed'
    kinds: list[str]
    rows: int = 0
    files: list[str] = field(default_factory=list)
    attempts: list[dict] = field(default_factory=list)   # every attempt of every task, with its "task"
    error: str | None = None
    groups: list[dict] = field(default_factory=list)     # layer groups: layers [first, last], status,
                                                          # file, attempts, error (empty: not split)


@dataclass
class BatchReport:
    results: str
    metric_version: int
    executor: str                   # 'in-process' or 'ray <address>'
    checkpoints: list[CheckpointReport]
    errors: list[dict] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checkpoints)

    def to_dict(self) -> dict:
        return {"results": self.results, "metric_version": self.metric_version, "executor": self.executor,
                "computed": self.count("computed"), "skipped": self.count("skipped"),
                "failed": self.count("failed"), "errors": self.errors,
                "checkpoints": [asdict(c) for c in self.checkpoints]}


Notify = Callable[[CheckpointReport, int, int], None]   # (report, done, total)


_STORED = ("id", "path", "sha256", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "dtype",
           "params_attention")


def _stored(store: Store, ids: list[int]) -> list[dict]:
    with store.connect() as con:
        rows = con.execute(f"SELECT {', '.join(_STORED)} FROM checkpoints WHERE list_contains(?, id) ORDER BY id",
                           [ids]).fetchall()
    by_id = {r[0]: dict(zip(_STORED, r)) for r in rows}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise StoreError(f"{store.path}: no checkpoint with id {missing[0]} (stored ids: {sorted(by_id) or 'none'})")
    return [by_id[i] for i in ids]


def _registered(store: Store, checkpoint_id: int, loc: ResultsLocation, sha256: str,
                kinds: list[str]) -> tuple[int, list[str]] | None:
    """Rows already registered from exactly these results (the same ``job.parquet`` per kind,
    with their job rows) and their locations, or None."""
    with store.connect() as con:
        rows = con.execute(
            """SELECT f.kind, f.location, f.job_location, f.n_rows FROM analysis_result_files f
               JOIN analysis_jobs j USING (checkpoint_id, kind, metric_version)
               WHERE f.checkpoint_id = ? AND f.metric_version = ? AND f.sha256 = ?""",
            [checkpoint_id, METRIC_VERSION, sha256]).fetchall()
    by_kind = {k: (location, job, n) for k, location, job, n in rows}
    if any(by_kind.get(k, (None, None))[1] != loc.job(sha256, k) for k in kinds):
        return None
    return sum(int(by_kind[k][2]) for k in kinds), [by_kind[k][0] for k in kinds]


def _package_dirs() -> list[str]:
    root = Path(__file__).resolve().parent.parent
    return [str(root / p) for p in ("app", "analysis", "loaders", "experiments") if (root / p).is_dir()]


def _ray_entry(task_fn: TaskFn, spec: TaskSpec, log) -> TaskOutcome:
    return task_fn(spec, log)


def run_batch(store: Store, checkpoint_ids: list[int], *, results: str | Path,
              activations: bool = False, device: str | None = None, force: bool = False,
              ray_address: str | None = None, gpus_per_task: float | None = None, retries: int = 2,
              max_task_bytes: int | None = DEFAULT_MAX_TASK_BYTES,
              input_errors: list[dict] | None = None, notify: Notify | None = None,
              task_fn: TaskFn = run_task, quiet_workers: bool = False) -> BatchReport:
    """Analyse ``checkpoint_ids`` into Parquet under ``results`` and register them in ``store``.

    ``ray_address`` None runs in-process; otherwise see the module docstring.
    ``gpus_per_task`` None asks for 1 GPU per task when the cluster has any, else 0.
    ``max_task_bytes``: a checkpoint with more attention weights than this computes its
    weight metrics in layer groups, one task each (None: never split).
    ``task_fn`` replaces ``run_task`` (tests inject worker crashes).
    """
    if retries < 0:
        raise BatchError(f"--retries: expected a count >= 0, found {retries}")
    if max_task_bytes is not None and max_task_bytes < 1:
        raise BatchError(f"--max-task-bytes: expected a size of at least 1 byte, found {max_task_bytes}")
    loc = ResultsLocation(results)
    if not loc.remote and Path(loc.root).exists() and not Path(loc.root).is_dir():
        raise BatchError(f"{loc.root}: expected a folder for the results, found a file")
    kinds = ["weights"] + (["activations"] if activations else [])
    rows = _stored(store, checkpoint_ids)
    con = duckdb.connect()                       # the driver's reads and writes of result files
    try:
        if loc.remote:
            loc.prepare(con)
        reports, split, specs = _plan(rows, kinds, loc, con, force=force, device=device,
                                      max_task_bytes=max_task_bytes)
        pending = {cid: 0 for cid in reports}
        for spec in specs:
            pending[spec.checkpoint_id] += 1
        ran: set[int] = set()                    # checkpoints with a task that computed something
        total, finished = len(rows), 0

        def finish(rep: CheckpointReport) -> None:
            nonlocal finished
            if rep.status != "failed":
                try:
                    got = [register(store, rep.id, rep.sha256, k, loc) for k in rep.kinds]
                    rep.rows, rep.files = sum(n for n, _ in got), [where for _, where in got]
                except BatchError as exc:           # unreadable or foreign results: this one fails
                    rep.status, rep.error, rep.rows = "failed", str(exc), 0
            finished += 1
            if notify:
                notify(rep, finished, total)

        def complete(rep: CheckpointReport) -> None:
            """Every task of ``rep`` has ended: join its layer groups, then register or report."""
            errors = [rep.error] if rep.error else []              # the whole-checkpoint task's
            errors += [f"layers {g['layers'][0]}-{g['layers'][1]}: {g['error']}"
                       for g in rep.groups if g["status"] == "failed"]
            if rep.id in split and not any(g["status"] == "failed" for g in rep.groups):
                try:
                    finalise_groups(con, loc, checkpoint_id=rep.id, sha256=rep.sha256, path=rep.path,
                                    kind="weights", groups=split[rep.id])
                    loc.remove_stale(rep.sha256, "weights", split[rep.id])
                except BatchError as exc:
                    errors.append(str(exc))
            rep.error = "; ".join(errors) or None
            rep.status = "failed" if errors else "computed" if rep.id in ran else "skipped"
            finish(rep)

        def task_ended(spec: TaskSpec, outcome: TaskOutcome, attempts: list[dict]) -> None:
            rep = reports[spec.checkpoint_id]
            attempts = [dict(a, task=spec.label) for a in attempts]
            rep.attempts += attempts
            if spec.layers is not None:
                group = next(g for g in rep.groups if g["layers"] == [spec.layers[0], spec.layers[1] - 1])
                group.update(status=outcome.status, attempts=attempts, error=outcome.error)
            elif outcome.status == "failed":
                rep.error = outcome.error
            else:
                for k in spec.kinds:
                    loc.remove_stale(spec.sha256, k, None)
            if outcome.status != "failed":
                ran.add(spec.checkpoint_id)
            pending[spec.checkpoint_id] -= 1
            if pending[spec.checkpoint_id] == 0:
                complete(rep)

        for rep in reports.values():             # nothing to compute: register what is not yet
            if pending[rep.id]:
                continue
            known = None if rep.id in split else _registered(store, rep.id, loc, rep.sha256, rep.kinds)
            if known is None:
                complete(rep)                    # (joins layer groups an earlier run computed)
            else:
                rep.rows, rep.files = known
                finished += 1
                if notify:
                    notify(rep, finished, total)

        if ray_address is None:
            executor = "in-process"
            log = AttemptLog()
            for spec in specs:
                for left in range(retries, -1, -1):
                    before = len(log.attempts(spec.key))
                    try:
                        outcome = task_fn(spec, log)
                        break
                    except Exception as exc:            # noqa: BLE001 - retried, then reported
                        _close_attempt(log, spec.key, before, exc)
                        if left == 0:
                            outcome = TaskOutcome(spec.checkpoint_id, spec.sha256, "failed", 0,
                                                  socket.gethostname(), os.getpid(),
                                                  error=f"{type(exc).__name__}: {exc}")
                task_ended(spec, outcome, log.attempts(spec.key))
        else:
            executor = f"ray {ray_address}"
            if specs:
                _run_on_ray(specs, task_ended, ray_address=ray_address, gpus_per_task=gpus_per_task,
                            retries=retries, task_fn=task_fn, quiet_workers=quiet_workers)
    finally:
        con.close()
    ordered = [reports[i] for i in checkpoint_ids if i in reports]
    return BatchReport(loc.root, METRIC_VERSION, executor, ordered, list(input_errors or []))


def _plan(rows: list[dict], kinds: list[str], loc: ResultsLocation, con: duckdb.DuckDBPyConnection, *,
          force: bool, device: str | None, max_task_bytes: int | None
          ) -> tuple[dict[int, CheckpointReport], dict[int, list[tuple[int, int]]], list[TaskSpec]]:
    """Reports, the layer groups of the checkpoints whose weights are split, and the tasks.

    A kind whose ``job.parquet`` exists is done (unless ``force``). A checkpoint whose
    weights are to be computed and whose attention weights exceed ``max_task_bytes`` gets
    one weights task per layer group (a group whose own job file exists is reused) and,
    for activations, one whole-checkpoint task; any other gets one task for all its kinds.
    """
    reports: dict[int, CheckpointReport] = {}
    split: dict[int, list[tuple[int, int]]] = {}
    specs: list[TaskSpec] = []
    for r in rows:
        cid, sha = r["id"], r["sha256"]
        rep = reports[cid] = CheckpointReport(cid, r["path"], sha, "skipped", list(kinds))
        todo = list(kinds) if force else [k for k in kinds if not loc.exists(loc.job(sha, k), con)]
        groups = layer_groups(r["n_layers"], attention_bytes(r), max_task_bytes)
        if "weights" in todo and len(groups) > 1:
            todo.remove("weights")
            split[cid] = groups
            if force and not loc.remote:        # a forced run that fails must not leave the old marker
                Path(loc.job(sha, "weights")).unlink(missing_ok=True)
            for g in groups:
                done = not force and loc.exists(loc.job(sha, "weights", g), con)
                rep.groups.append({"layers": [g[0], g[1] - 1], "status": "skipped" if done else "pending",
                                   "file": loc.part(sha, "weights", g), "attempts": [], "error": None})
                if not done:
                    specs.append(TaskSpec(cid, sha, r["path"], ("weights",), loc.root, device, g))
        if todo:
            specs.append(TaskSpec(cid, sha, r["path"], tuple(todo), loc.root, device))
    return reports, split, specs


def _close_attempt(log: AttemptLog, key: str, before: int, exc: Exception) -> None:
    """In-process: record an exception that escaped ``task_fn`` on its attempt (or on a new one
    when it raised before logging a start), so the report counts every try."""
    if len(log.attempts(key)) == before:
        log.start(key, socket.gethostname(), os.getpid())
    log.close_open(key, f"{type(exc).__name__}: {exc} (retried if attempts remain)")


def ray_runtime_env() -> dict:
    """The job-level Ray runtime environment: this project's packages, shipped to every worker."""
    return {"py_modules": _package_dirs(), "excludes": ["__pycache__", "*.pyc"]}


def connect_ray(address: str, *, quiet_workers: bool = False, num_cpus: int | None = None) -> bool:
    """Connect to (or start) Ray for ``address``; True when this call started the connection.

    ``auto``: ``ray.init()`` (``RAY_ADDRESS``, a running local cluster, else a new one);
    ``local``: a new local instance (``num_cpus`` caps it); anything else: that cluster.
    The project's packages go to the workers through ``ray_runtime_env()``. A Ray
    connection opened by the caller is used as it is (its runtime_env decides what
    the workers can import).
    """
    try:
        import ray
    except ImportError as exc:
        raise BatchError(f"--ray {address}: the ray package is not installed "
                         "(pip install -r requirements-scale.txt)") from exc
    if ray.is_initialized():
        return False
    kwargs = {"log_to_driver": not quiet_workers, "include_dashboard": False,
              "runtime_env": ray_runtime_env()}
    if num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    try:
        ray.init(address=None if address == "auto" else address, **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise BatchError(f"--ray {address}: cannot connect to a Ray cluster ({exc})") from exc
    return True


def _ray_error_line(exc: Exception) -> str:
    """One line for a task that failed for good: the exception type and its first message line."""
    cause = getattr(exc, "cause", None)
    shown = cause if isinstance(cause, Exception) else exc
    text = str(shown).strip().splitlines()
    return f"{type(shown).__name__}: {text[0] if text else 'no message'}"


TaskEnded = Callable[[TaskSpec, TaskOutcome, list], None]   # (spec, outcome, its attempts)


def _run_on_ray(specs: list[TaskSpec], task_ended: TaskEnded, *, ray_address: str,
                gpus_per_task: float | None, retries: int, task_fn: TaskFn, quiet_workers: bool) -> None:
    started = connect_ray(ray_address, quiet_workers=quiet_workers)
    import ray

    try:
        if gpus_per_task is None:
            gpus_per_task = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
        log = ray.remote(num_cpus=0)(AttemptLog).remote()
        remote = ray.remote(_ray_entry).options(
            num_cpus=1, num_gpus=gpus_per_task, max_retries=retries, retry_exceptions=True)
        pending = {remote.remote(task_fn, spec, log): spec for spec in specs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except ray.exceptions.RayError as exc:         # retries exhausted: report, never drop
                outcome = TaskOutcome(spec.checkpoint_id, spec.sha256, "failed", 0, "", 0,
                                      error=_ray_error_line(exc))
            task_ended(spec, outcome, ray.get(log.attempts.remote(spec.key)))
    finally:
        if started:
            ray.shutdown()
