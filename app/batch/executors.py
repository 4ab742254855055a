"""Where batch tasks run: in this process (``run_in_process``) or on a Ray cluster (``run_on_ray``).

Both call the same task function (``app.batch.task.run_task`` unless a test injects
another) and hand each finished task, with its attempts, to ``task_ended``; results
are identical either way.

* ``ray_address=None``: in this process, one after the other.
* ``ray_address="auto"``: ``ray.init()``: the cluster named by ``RAY_ADDRESS``
  or one started with ``ray start`` on this machine, else a new local one;
  ``"local"`` always starts a new local instance; anything else
  (``ray://head:10001``, ``head:6379``) is the cluster's address. The packages
  ``app``, ``analysis``, ``loaders`` and ``experiments`` are shipped to the
  workers (``runtime_env`` ``py_modules``); the checkpoints must be readable by
  the workers at their stored paths.

Failures: a task whose checkpoint is unreadable (a ``QkvscopeError``: broken
file, missing path; and anything that goes wrong while the reading child
computes its metrics, a bomb over the memory or time limit included:
``app.batch.task``) fails at once, without retries. Any other exception, and
a worker process that dies (killed, out of memory), is retried up to
``retries`` times (Ray ``max_retries`` and ``retry_exceptions``; in-process,
exceptions only: a dead process cannot retry itself). Every attempt is logged
(``AttemptLog``, a Ray actor on a cluster) and reported per checkpoint.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable

from app.batch.errors import BatchError
from app.batch.plan import TaskOutcome, TaskSpec
from app.batch.report import AttemptLog
from app.batch.task import TaskFn

TaskEnded = Callable[[TaskSpec, TaskOutcome, list], None]   # (spec, outcome, its attempts)


# -- in this process ------------------------------------------------------------------
def run_in_process(specs: list[TaskSpec], task_ended: TaskEnded, *, retries: int, task_fn: TaskFn) -> None:
    """Run ``specs`` one after the other, each retried up to ``retries`` times when it raises."""
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


def _close_attempt(log: AttemptLog, key: str, before: int, exc: Exception) -> None:
    """In-process: record an exception that escaped ``task_fn`` on its attempt (or on a new one
    when it raised before logging a start), so the report counts every try."""
    if len(log.attempts(key)) == before:
        log.start(key, socket.gethostname(), os.getpid())
    log.close_open(key, f"{type(exc).__name__}: {exc} (retried if attempts remain)")


# -- on Ray ---------------------------------------------------------------------------
def _package_dirs() -> list[str]:
    root = Path(__file__).resolve().parents[2]       # app/batch/executors.py -> the project root
    return [str(root / p) for p in ("app", "analysis", "loaders", "experiments") if (root / p).is_dir()]


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
        import ray                      # here: ray is optional (requirements-scale.txt)
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


def run_on_ray(specs: list[TaskSpec], task_ended: TaskEnded, *, ray_address: str,
               gpus_per_task: float | None, retries: int, task_fn: TaskFn, quiet_workers: bool) -> None:
    """Run ``specs`` as Ray tasks (``gpus_per_task`` None: 1 when the cluster has GPUs, else 0),
    handing each to ``task_ended`` as it finishes; a task whose retries ran out is reported."""
    started = connect_ray(ray_address, quiet_workers=quiet_workers)
    import ray                          # here: connect_ray has checked that it is installed

    try:
        if gpus_per_task is None:
            gpus_per_task = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
        log = ray.remote(num_cpus=0)(AttemptLog).remote()
        remote = ray.remote(task_fn).options(num_cpus=1, num_gpus=gpus_per_task, max_retries=retries,
                                             retry_exceptions=True)
        pending = {remote.remote(spec, log): spec for spec in specs}
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
