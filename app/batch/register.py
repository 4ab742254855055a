"""Reading results back into the store (the driver only: DuckDB allows one writer).

``register`` reads one result's Parquet into ``analysis_results`` / ``analysis_jobs``
(through ``loaders.results.replace_results``, so ``analyze ID``, the dashboard and SQL
see them) and records the file locations in ``analysis_result_files``. Only a
complete result has a ``job.parquet``.

``finalise_groups`` joins a checkpoint computed in layer groups once every group has
succeeded: it merges the groups' notes in layer order, adds the undefined-value notes
once over all rows (as one task would), and writes the checkpoint's ``job.parquet``
listing the parts (``parts``); only then is the result registered, and only then does a
re-run take it as done. A failed group leaves no ``job.parquet``, so nothing is
registered; a re-run recomputes only the groups without a job file (of the same layer
range) and then joins them.

``registered`` tells a re-run that a result is already in the store. The statements
are in ``loaders.batch_results``.
"""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd

from analysis.registry import names
from app.batch.errors import BatchError
from app.batch.location import RESULT_FILE, ResultsLocation
from app.batch.plan import layer_label
from loaders import batch_results as sql
from loaders.results import replace_results
from loaders.store import Store


def finalise_groups(con: duckdb.DuckDBPyConnection, loc: ResultsLocation, *, checkpoint_id: int, sha256: str,
                    path: str, kind: str, groups: list[tuple[int, int]]) -> None:
    """Join the layer groups of one checkpoint into its result: check every group's job file,
    build the notes exactly as ``weight_frame`` builds them for all layers at once (the
    groups' layer notes merged in layer order, then the undefined-value notes over the
    joined rows, with the helpers of ``analysis.notes`` that single jobs use), and write the checkpoint's
    ``job.parquet``, its completion marker, listing the group parts in layer order.
    The driver calls it only once every group succeeded."""
    from analysis.notes import merge_notes, nonfinite_notes
    from app.jobs import _label, tied_summary   # here: app.jobs imports torch, app.batch stays torch-free

    version = loc.metric_version
    notes: dict[str, str] = {}
    seconds, devices, hosts, frames = 0.0, [], [], []
    layer_ties, layout_variant, all_tied = [], None, True
    for g in groups:
        url = loc.job(sha256, kind, g)
        try:
            rows = sql.read_group_job(con, url)
        except duckdb.Error as exc:
            raise BatchError(f"{url}: cannot read the job file of {layer_label(g)} of checkpoint "
                             f"{checkpoint_id} ({exc})") from exc
        want = (sha256, version, g[0], g[1] - 1)
        if len(rows) != 1 or tuple(rows[0][:4]) != want:
            raise BatchError(f"{url}: expected one row for checkpoint sha256 {sha256}, metric version "
                             f"{version}, layers {g[0]} to {g[1] - 1}, found {[tuple(r[:4]) for r in rows]}")
        _, _, _, _, group_notes, group_seconds, device, host, *tied = rows[0]
        merge_notes(notes, json.loads(group_notes) if group_notes else {})
        # each group's ties sum up its layers; the checkpoint's, over all of them, as one job would
        group_tied = json.loads(tied[0]) if tied and tied[0] else None
        if group_tied is None:
            all_tied = False
        else:
            layer_ties += group_tied["layers"]
            layout_variant = group_tied["layout_variant"]
        seconds += float(group_seconds or 0.0)
        devices += [device] if device not in devices else []
        hosts += [host] if host not in hosts else []
        part = loc.part(sha256, kind, g)
        try:
            frames.append(sql.read_layer_rows(con, part))
        except duckdb.Error as exc:
            raise BatchError(f"{part}: cannot read the results of {layer_label(g)} of checkpoint "
                             f"{checkpoint_id} ({exc})") from exc
    frame = pd.concat(frames, ignore_index=True)               # layer order, as one task would produce
    frame["head_label"] = [_label(*row) for row in zip(frame["layer"], frame["head"], frame["metric"],
                                                        frame["layer2"], frame["head2"])]
    nonfinite_notes(frame, notes)
    parts = [Path(loc.part(sha256, kind, g)).name for g in groups]
    job = pd.DataFrame([{
        "checkpoint_sha256": sha256, "path": path, "kind": kind, "metric_version": version,
        "notes": json.dumps(notes, sort_keys=True), "seconds": seconds, "device": ",".join(devices),
        "host": ",".join(hosts), "parts": json.dumps(parts), "sample": None,
        "tied": json.dumps(tied_summary(layer_ties, layout_variant), sort_keys=True) if all_tied else None}])
    loc.write(con, job, loc.job(sha256, kind))


def _job_parts(loc: ResultsLocation, sha256: str, kind: str, listed: str | None) -> list[str]:
    """The part files a checkpoint's ``job.parquet`` stands for: its ``parts`` list (layer groups)
    or, without one, ``part.parquet``."""
    if listed is None:
        return [loc.part(sha256, kind)]
    names_ = json.loads(listed)
    bad = [n for n in names_ if not (isinstance(n, str) and RESULT_FILE.fullmatch(n) and n.startswith("part"))]
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
    version = loc.metric_version
    job = loc.job(sha256, kind)
    with store.transaction() as con:
        loc.prepare(con)
        try:
            got = sql.read_job(con, job)
        except duckdb.Error as exc:
            raise BatchError(f"{job}: cannot read the job file of checkpoint {checkpoint_id} ({exc})") from exc
        missing = sorted({"checkpoint_sha256", "metric_version", "notes", "seconds", "device"} - set(got.columns))
        if missing:
            raise BatchError(f"{job}: expected the columns of a job file, missing {', '.join(missing)}")
        jrow = list(zip(got["checkpoint_sha256"], got["metric_version"]))
        if len(jrow) != 1 or jrow[0][0] != sha256 or jrow[0][1] != version:
            found = [(s, int(v)) for s, v in jrow]
            raise BatchError(f"{job}: expected one row for checkpoint sha256 {sha256} at metric version "
                             f"{version}, found {found}")
        first = got.iloc[0]
        notes, device = first["notes"], first["device"]
        # what a single analyze stores beside its rows (absent from job files written without them)
        sample, tied = (json.loads(first[c]) if c in got.columns and isinstance(first[c], str) else None
                        for c in ("sample", "tied"))
        seconds = None if pd.isna(first["seconds"]) else float(first["seconds"])
        parts = _job_parts(loc, sha256, kind, first["parts"] if "parts" in got.columns else None)
        where = parts[0] if len(parts) == 1 else f"{loc.folder(sha256, kind)} ({len(parts)} parts)"
        try:
            n = replace_results(con, checkpoint_id=checkpoint_id, kind=kind, metrics=names(kind),
                                metric_version=version, notes=notes, seconds=seconds, device=device,
                                parquet=parts, sha256=sha256, sample=sample, tied=tied)
            total = sql.count_rows(con, parts)
        except duckdb.Error as exc:
            raise BatchError(f"{where}: cannot read the results of checkpoint {checkpoint_id} ({exc})") from exc
        if n != total:
            raise BatchError(f"{where}: expected every row to belong to checkpoint sha256 {sha256}, "
                             f"found {total - n} of {total} rows of another checkpoint")
        # one location per result: the part, or for layer groups the glob of their parts
        location = loc.part(sha256, kind) if parts == [loc.part(sha256, kind)] else loc.parts_glob(sha256, kind)
        sql.record_result_file(con, checkpoint_id=checkpoint_id, kind=kind, metric_version=version,
                               sha256=sha256, location=location, job_location=job, n_rows=n)
    return int(n), location


def registered(store: Store, checkpoint_id: int, loc: ResultsLocation, sha256: str,
               kinds: list[str]) -> tuple[int, list[str]] | None:
    """Rows already registered from exactly these results (the same ``job.parquet`` per kind,
    with their job rows) and their locations, or None."""
    by_kind = sql.registered_files(store, checkpoint_id=checkpoint_id, sha256=sha256,
                                   metric_version=loc.metric_version)
    if any(by_kind.get(k, (None, None))[1] != loc.job(sha256, k) for k in kinds):
        return None
    return sum(int(by_kind[k][2]) for k in kinds), [by_kind[k][0] for k in kinds]
