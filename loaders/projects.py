"""Projects: which runs and checkpoints belong together.

A project is a name on each run and each checkpoint (``runs.project``, ``checkpoints.project``).
The pages compare runs of one project only (a Lightning sweep, a nanoGPT grid and the demo are
three projects), and every page can be narrowed to some projects (URL key ``project``).

Where a run's project comes from, the first that applies:

1. the user's correction (``python -m app run-meta ID --set project=NAME``, kept in
   ``run_overrides``, so it survives re-ingestion);
2. ``python -m app ingest PATH --project NAME`` (or the Inspector's "add to database"): every run
   and checkpoint read from ``PATH`` is put into ``NAME``, also those stored before;
3. the tracker's own project or experiment name, where the log states one
   (``RunData.meta["project"]``, written when the run is first stored);
4. ``default_project(PATH)``: the name of the folder ingested (``ingest ~/exp/sweep`` ->
   ``sweep``; a single file: its folder's name).

A checkpoint takes 2 or 4. Rows stored by a qkvscope without projects were given the folder above
their run's folder when the database was upgraded (``loaders.store`` schema 9).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from loaders import checkpoint_rows, run_rows
from loaders.errors import QkvscopeError
from loaders.report import FileReport
from loaders.store import Store

#: What a run or checkpoint without a project is listed as (one stored while an ingest was killed
#: between storing a file and naming its project; the next ingest of the file names it).
NO_PROJECT = "(no project)"


def default_project(path: str | Path) -> str:
    """The project of what is ingested from ``path`` when nobody names one: the folder's own
    name, or for a file the name of the folder holding it (``/x/nanogpt-grid`` ->
    ``nanogpt-grid``, ``/x/hf/trainer_state.json`` -> ``hf``)."""
    p = Path(path).expanduser()
    p = p.resolve() if p.exists() else p
    folder = p if p.is_dir() else p.parent
    return folder.name or str(folder)


def check_name(name: str) -> str:
    """``name`` stripped; a ``QkvscopeError`` for an empty one."""
    text = str(name).strip() if name is not None else ""
    if not text:
        raise QkvscopeError(f"project name must not be empty, found {name!r}")
    return text


def assign_project(store: Store, reports: Iterable[FileReport], name: str, *, replace: bool) -> None:
    """Put the runs and checkpoints named by ``reports`` (one ingested path's) into project
    ``name``, in one transaction: with ``replace`` (a project the user named) whatever they were
    in, else only those without a project yet (a tracker's own name stays). The user's
    corrections of a run's project (``run_overrides``) are written over it again."""
    from loaders.logs.runs import apply_overrides     # loaders.logs loads the readers (pandas): on first use

    reports = list(reports)
    run_ids = sorted({int(i) for r in reports for i in (r.run_ids or [])})
    ckpt_ids = sorted({int(r.checkpoint_id) for r in reports if r.checkpoint_id is not None})
    if not run_ids and not ckpt_ids:
        return
    with store.transaction() as con:
        run_rows.set_project(con, run_ids, name, only_new=not replace)
        checkpoint_rows.set_project(con, ckpt_ids, name, only_new=not replace)
        for run_id in run_ids:
            apply_overrides(con, run_id)


def project_counts(store: Store) -> list[dict]:
    """``[{"project", "runs", "checkpoints"}, ...]`` by project name, ``NO_PROJECT`` for rows
    without one."""
    with store.connect() as con:
        rows = con.execute(
            """SELECT coalesce(project, ?) AS p, sum(r) AS runs, sum(c) AS checkpoints FROM (
                   SELECT project, 1 AS r, 0 AS c FROM runs
                   UNION ALL SELECT project, 0, 1 FROM checkpoints) GROUP BY p ORDER BY p""",
            [NO_PROJECT]).fetchall()
    return [{"project": p, "runs": int(r), "checkpoints": int(c)} for p, r, c in rows]
