"""Batch analysis: many checkpoints, in-process or on a Ray cluster, results as Parquet.

``run_batch(store, checkpoint_ids, results=..., ray_address=None)`` analyses
every checkpoint with ONE task per checkpoint. A task (``run_task``) opens its
checkpoint at the stored path (streaming one layer at a time, as
``app.jobs.weight_frame`` does), computes the weight metrics (and with
``activations`` the activation metrics) and writes, per kind, two Parquet files::

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
from loaders.store import Store

KINDS = ("weights", "activations")
#: URL schemes DuckDB's httpfs extension reads and writes.
REMOTE_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "r2://")
_GLOB_CHARS = re.compile(r"[*?\[]")


class BatchError(QkvscopeError):
    """A batch cannot start or its results cannot be read back (user-facing, one line)."""


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

    def part(self, sha256: str, kind: str) -> str:
        return f"{self.folder(sha256, kind)}/part.parquet"

    def job(self, sha256: str, kind: str) -> str:
        return f"{self.folder(sha256, kind)}/job.parquet"

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
    })


def run_task(spec: TaskSpec, log) -> TaskOutcome:
    """Analyse one checkpoint and write its Parquet files; the body of every task.

    A ``QkvscopeError`` (unreadable checkpoint, missing file) is returned as a
    ``failed`` outcome: retrying cannot help. Anything else propagates, so Ray
    (or the in-process loop) retries it.
    """
    from app.jobs import activation_frame, weight_frame
    from analysis.weights import default_device
    from loaders.checkpoints import open_checkpoint

    host, pid = socket.gethostname(), os.getpid()
    attempt = log_call(log, "start", spec.sha256, host, pid)
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
                for kind in spec.kinds:
                    t_kind = time.perf_counter()
                    fn = weight_frame if kind == "weights" else activation_frame
                    frame, notes = fn(ckpt, device=dev)
                    seconds = time.perf_counter() - t_kind
                    loc.write(con, _result_frame(frame, spec), loc.part(spec.sha256, kind))
                    job = pd.DataFrame([{
                        "checkpoint_sha256": spec.sha256, "path": spec.path, "kind": kind,
                        "metric_version": METRIC_VERSION, "notes": json.dumps(notes, sort_keys=True),
                        "seconds": seconds, "device": str(dev), "host": host}])
                    loc.write(con, job, loc.job(spec.sha256, kind))   # last: the completion marker
        finally:
            con.close()
    except QkvscopeError as exc:
        out.status, out.error = "failed", str(exc)
        log_call(log, "end", spec.sha256, attempt, f"failed: {exc}")
        return out
    except Exception as exc:
        log_call(log, "end", spec.sha256, attempt, f"{type(exc).__name__}: {exc} (retried if attempts remain)")
        raise
    log_call(log, "end", spec.sha256, attempt, "computed")
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
def register(store: Store, checkpoint_id: int, sha256: str, kind: str, loc: ResultsLocation) -> int:
    """Read one result's Parquet into the store (replacing that checkpoint's rows of this
    kind and metric version) and record where it lives. Returns the rows read."""
    part, job = loc.part(sha256, kind), loc.job(sha256, kind)
    with store.transaction() as con:
        loc.prepare(con)
        try:
            jrow = con.execute("SELECT checkpoint_sha256, metric_version, notes, seconds, device "
                               "FROM read_parquet(?, hive_partitioning = false)", [job]).fetchall()
        except duckdb.Error as exc:
            raise BatchError(f"{job}: cannot read the job file of checkpoint {checkpoint_id} ({exc})") from exc
        if len(jrow) != 1 or jrow[0][0] != sha256 or jrow[0][1] != METRIC_VERSION:
            found = [(r[0], r[1]) for r in jrow]
            raise BatchError(f"{job}: expected one row for checkpoint sha256 {sha256} at metric version "
                             f"{METRIC_VERSION}, found {found}")
        _, _, notes, seconds, device = jrow[0]
        level = names(kind)
        con.execute("DELETE FROM analysis_results WHERE checkpoint_id = ? AND metric_version = ? "
                    "AND list_contains(?, metric)", [checkpoint_id, METRIC_VERSION, level])
        con.execute("DELETE FROM analysis_jobs WHERE checkpoint_id = ? AND kind = ? AND metric_version = ?",
                    [checkpoint_id, kind, METRIC_VERSION])
        try:
            n = con.execute(
                """INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, metric_version)
                   SELECT ?, layer, head, metric, CASE WHEN isfinite(value) THEN value ELSE NULL END, ?
                   FROM read_parquet(?, hive_partitioning = false) WHERE checkpoint_sha256 = ?""",
                [checkpoint_id, METRIC_VERSION, part, sha256]).fetchone()[0]
            total = con.execute("SELECT count(*) FROM read_parquet(?, hive_partitioning = false)", [part]).fetchone()[0]
        except duckdb.Error as exc:
            raise BatchError(f"{part}: cannot read the results of checkpoint {checkpoint_id} ({exc})") from exc
        if n != total:
            raise BatchError(f"{part}: expected every row to belong to checkpoint sha256 {sha256}, "
                             f"found {total - n} of {total} rows of another checkpoint")
        con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version, device, seconds, notes) "
                    "VALUES (?, ?, ?, ?, ?, ?)", [checkpoint_id, kind, METRIC_VERSION, device, seconds, notes])
        con.execute("DELETE FROM analysis_result_files WHERE checkpoint_id = ? AND kind = ? "
                    "AND metric_version = ?", [checkpoint_id, kind, METRIC_VERSION])
        con.execute("INSERT INTO analysis_result_files (checkpoint_id, kind, metric_version, sha256, location, "
                    "job_location, n_rows) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [checkpoint_id, kind, METRIC_VERSION, sha256, part, job, n])
    return int(n)


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
    attempts: list[dict] = field(default_factory=list)
    error: str | None = None


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


def _stored(store: Store, ids: list[int]) -> list[dict]:
    with store.connect() as con:
        rows = con.execute("SELECT id, path, sha256 FROM checkpoints WHERE list_contains(?, id) ORDER BY id",
                           [ids]).fetchall()
    by_id = {r[0]: {"id": r[0], "path": r[1], "sha256": r[2]} for r in rows}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise StoreError(f"{store.path}: no checkpoint with id {missing[0]} (stored ids: {sorted(by_id) or 'none'})")
    return [by_id[i] for i in ids]


def _registered(store: Store, checkpoint_id: int, loc: ResultsLocation, sha256: str,
                kinds: list[str]) -> int | None:
    """Rows already registered from exactly these files (with their job rows), or None."""
    with store.connect() as con:
        rows = con.execute(
            """SELECT f.kind, f.location, f.n_rows FROM analysis_result_files f
               JOIN analysis_jobs j USING (checkpoint_id, kind, metric_version)
               WHERE f.checkpoint_id = ? AND f.metric_version = ? AND f.sha256 = ?""",
            [checkpoint_id, METRIC_VERSION, sha256]).fetchall()
    by_kind = {k: (location, n) for k, location, n in rows}
    if any(by_kind.get(k, (None,))[0] != loc.part(sha256, k) for k in kinds):
        return None
    return sum(int(by_kind[k][1]) for k in kinds)


def _package_dirs() -> list[str]:
    root = Path(__file__).resolve().parent.parent
    return [str(root / p) for p in ("app", "analysis", "loaders", "experiments") if (root / p).is_dir()]


def _ray_entry(task_fn: TaskFn, spec: TaskSpec, log) -> TaskOutcome:
    return task_fn(spec, log)


def run_batch(store: Store, checkpoint_ids: list[int], *, results: str | Path,
              activations: bool = False, device: str | None = None, force: bool = False,
              ray_address: str | None = None, gpus_per_task: float | None = None, retries: int = 2,
              input_errors: list[dict] | None = None, notify: Notify | None = None,
              task_fn: TaskFn = run_task, quiet_workers: bool = False) -> BatchReport:
    """Analyse ``checkpoint_ids`` into Parquet under ``results`` and register them in ``store``.

    ``ray_address`` None runs in-process; otherwise see the module docstring.
    ``gpus_per_task`` None asks for 1 GPU per task when the cluster has any, else 0.
    ``task_fn`` replaces ``run_task`` (tests inject worker crashes).
    """
    if retries < 0:
        raise BatchError(f"--retries: expected a count >= 0, found {retries}")
    loc = ResultsLocation(results)
    if not loc.remote and Path(loc.root).exists() and not Path(loc.root).is_dir():
        raise BatchError(f"{loc.root}: expected a folder for the results, found a file")
    kinds = ["weights"] + (["activations"] if activations else [])
    rows = _stored(store, checkpoint_ids)
    reports: dict[int, CheckpointReport] = {}
    specs: list[TaskSpec] = []
    con = duckdb.connect()
    try:
        if loc.remote:
            loc.prepare(con)
        for r in rows:
            done = [k for k in kinds if loc.exists(loc.job(r["sha256"], k), con)]
            rep = CheckpointReport(r["id"], r["path"], r["sha256"], "skipped", list(kinds))
            reports[r["id"]] = rep
            if force or len(done) < len(kinds):
                todo = tuple(kinds) if force else tuple(k for k in kinds if k not in done)
                specs.append(TaskSpec(r["id"], r["sha256"], r["path"], todo, loc.root, device))
    finally:
        con.close()
    total, finished = len(rows), 0

    def finish(rep: CheckpointReport) -> None:
        nonlocal finished
        if rep.status != "failed":
            try:
                rep.rows = sum(register(store, rep.id, rep.sha256, k, loc) for k in rep.kinds)
                rep.files = [loc.part(rep.sha256, k) for k in rep.kinds]
            except BatchError as exc:               # unreadable or foreign results: this one fails
                rep.status, rep.error, rep.rows = "failed", str(exc), 0
        finished += 1
        if notify:
            notify(rep, finished, total)

    queued = {s.checkpoint_id for s in specs}
    for rep in reports.values():                 # everything already there: register what is not yet
        if rep.id in queued:
            continue
        known = _registered(store, rep.id, loc, rep.sha256, rep.kinds)
        if known is None:
            finish(rep)
        else:
            rep.rows, rep.files = known, [loc.part(rep.sha256, k) for k in rep.kinds]
            finished += 1
            if notify:
                notify(rep, finished, total)

    if ray_address is None:
        executor = "in-process"
        log = AttemptLog()
        for spec in specs:
            rep = reports[spec.checkpoint_id]
            for left in range(retries, -1, -1):
                before = len(log.attempts(spec.sha256))
                try:
                    outcome = task_fn(spec, log)
                    break
                except Exception as exc:                # noqa: BLE001 - retried, then reported
                    _close_attempt(log, spec.sha256, before, exc)
                    if left == 0:
                        outcome = TaskOutcome(spec.checkpoint_id, spec.sha256, "failed", 0, socket.gethostname(),
                                              os.getpid(), error=f"{type(exc).__name__}: {exc}")
            rep.attempts = log.attempts(spec.sha256)
            _apply(rep, outcome)
            finish(rep)
    else:
        executor = f"ray {ray_address}"
        if specs:
            _run_on_ray(specs, reports, finish, ray_address=ray_address, gpus_per_task=gpus_per_task,
                        retries=retries, task_fn=task_fn, quiet_workers=quiet_workers)
    ordered = [reports[i] for i in checkpoint_ids if i in reports]
    return BatchReport(loc.root, METRIC_VERSION, executor, ordered, list(input_errors or []))


def _close_attempt(log: AttemptLog, key: str, before: int, exc: Exception) -> None:
    """In-process: record an exception that escaped ``task_fn`` on its attempt (or on a new one
    when it raised before logging a start), so the report counts every try."""
    if len(log.attempts(key)) == before:
        log.start(key, socket.gethostname(), os.getpid())
    log.close_open(key, f"{type(exc).__name__}: {exc} (retried if attempts remain)")


def _apply(rep: CheckpointReport, outcome: TaskOutcome) -> None:
    if outcome.status == "failed":
        rep.status, rep.error = "failed", outcome.error
    else:
        rep.status = "computed"


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


def _run_on_ray(specs: list[TaskSpec], reports: dict[int, CheckpointReport], finish, *, ray_address: str,
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
            rep = reports[spec.checkpoint_id]
            try:
                outcome = ray.get(ready[0])
            except ray.exceptions.RayError as exc:         # retries exhausted: report, never drop
                outcome = TaskOutcome(spec.checkpoint_id, spec.sha256, "failed", 0, "", 0,
                                      error=_ray_error_line(exc))
            rep.attempts = ray.get(log.attempts.remote(spec.sha256))
            _apply(rep, outcome)
            finish(rep)
    finally:
        if started:
            ray.shutdown()
