"""One batch's state on the driver (``BatchRun``): which tasks each checkpoint still waits
for, which computed something, how many checkpoints are finished, and what to do when a
task ends (record its attempts, join layer groups, register, notify).

The executors call ``BatchRun.task_ended`` once per task; when a checkpoint's last task
has ended, ``complete`` joins its layer groups (``finalise_groups``), decides its status
and ``finish`` registers it and reports progress. ``register_done`` handles the
checkpoints that had nothing left to compute before any task runs.
"""
from __future__ import annotations

import duckdb

from app.batch.errors import BatchError
from app.batch.location import ResultsLocation
from app.batch.plan import Plan, TaskOutcome, TaskSpec
from app.batch.register import finalise_groups, register, registered
from app.batch.report import CheckpointReport, Notify
from loaders.store import Store


class BatchRun:
    """The driver's bookkeeping of one batch over ``plan`` (``total`` checkpoints asked for).

    ``con`` is the driver's connection for reading and writing result files (layer-group
    joins); registration opens its own store transactions.
    """

    def __init__(self, store: Store, loc: ResultsLocation, con: duckdb.DuckDBPyConnection, plan: Plan, *,
                 total: int, notify: Notify | None = None):
        self.store, self.loc, self.con, self.plan = store, loc, con, plan
        self.reports, self.split = plan.reports, plan.split
        self.total, self.finished, self.notify = total, 0, notify
        self.pending = {cid: 0 for cid in self.reports}     # tasks still running, per checkpoint
        for spec in plan.specs:
            self.pending[spec.checkpoint_id] += 1
        self.ran: set[int] = set()                          # checkpoints with a task that computed something

    def _notify(self, rep: CheckpointReport) -> None:
        self.finished += 1
        if self.notify:
            self.notify(rep, self.finished, self.total)

    def finish(self, rep: CheckpointReport) -> None:
        """Register a checkpoint that did not fail (a result that cannot be read fails it), then report."""
        if rep.status != "failed":
            try:
                got = [register(self.store, rep.id, rep.sha256, k, self.loc) for k in rep.kinds]
                rep.rows, rep.files = sum(n for n, _ in got), [where for _, where in got]
            except BatchError as exc:           # unreadable or foreign results: this one fails
                rep.status, rep.error, rep.rows = "failed", str(exc), 0
        self._notify(rep)

    def complete(self, rep: CheckpointReport) -> None:
        """Every task of ``rep`` has ended: join its layer groups, then register or report."""
        errors = [rep.error] if rep.error else []              # the whole-checkpoint task's
        errors += [f"layers {g['layers'][0]}-{g['layers'][1]}: {g['error']}"
                   for g in rep.groups if g["status"] == "failed"]
        if rep.id in self.split and not any(g["status"] == "failed" for g in rep.groups):
            try:
                finalise_groups(self.con, self.loc, checkpoint_id=rep.id, sha256=rep.sha256, path=rep.path,
                                kind="weights", groups=self.split[rep.id])
                self.loc.remove_stale(rep.sha256, "weights", self.split[rep.id])
            except BatchError as exc:
                errors.append(str(exc))
        rep.error = "; ".join(errors) or None
        rep.status = "failed" if errors else "computed" if rep.id in self.ran else "skipped"
        self.finish(rep)

    def task_ended(self, spec: TaskSpec, outcome: TaskOutcome, attempts: list[dict]) -> None:
        """Record one task's outcome and attempts on its checkpoint; complete it after its last task."""
        rep = self.reports[spec.checkpoint_id]
        attempts = [dict(a, task=spec.label) for a in attempts]
        rep.attempts += attempts
        if spec.layers is not None:
            group = next(g for g in rep.groups if g["layers"] == [spec.layers[0], spec.layers[1] - 1])
            group.update(status=outcome.status, attempts=attempts, error=outcome.error)
        elif outcome.status == "failed":
            rep.error = outcome.error
        else:
            for k in spec.kinds:
                self.loc.remove_stale(spec.sha256, k, None)
        if outcome.status != "failed":
            self.ran.add(spec.checkpoint_id)
        self.pending[spec.checkpoint_id] -= 1
        if self.pending[spec.checkpoint_id] == 0:
            self.complete(rep)

    def register_done(self) -> None:
        """Before any task runs: register the checkpoints with nothing to compute, unless the
        store already holds exactly these results (then only report them)."""
        for rep in self.reports.values():
            if self.pending[rep.id]:
                continue
            known = None if rep.id in self.split else registered(self.store, rep.id, self.loc, rep.sha256,
                                                                  rep.kinds)
            if known is None:
                self.complete(rep)               # (joins layer groups an earlier run computed)
            else:
                rep.rows, rep.files = known
                self._notify(rep)
