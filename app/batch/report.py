"""What a batch reports: every attempt of every task (``AttemptLog``), one ``CheckpointReport``
per checkpoint and the ``BatchReport`` whose ``to_dict`` is ``analyze --json``'s batch output.

A retried or failed task is never silently dropped: each start and end is logged (on
Ray by an actor, so a worker that died still has its start, and reads as "no result:
the worker process died"), and each checkpoint's report lists the attempts of all its
tasks, each with its ``task`` ("whole checkpoint" or "layers A-B").
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable


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
        import ray                      # here: only a Ray actor gets this far; ray is optional

        return ray.get(fn.remote(*args))
    return fn(*args)


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
