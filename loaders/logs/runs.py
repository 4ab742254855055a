"""Reading runs back, and user corrections of their metadata.

A correction is a row of ``run_overrides`` (run_id, field, JSON value). It is
written over the run row at once and again after every ingest of the run's
log, so it survives re-ingestion. Fields that are columns of ``runs`` go
there; any other field goes into the run's ``config`` JSON.
"""
from __future__ import annotations

import json

from loaders import run_rows
from loaders.errors import QkvscopeError
from loaders.logs.metadata import VARIANTS, normalise_variant
from loaders.store import Store

#: Overridable fields stored as columns of ``runs``, with their Python type.
COLUMN_FIELDS = {"name": str, "variant": str, "n_kv_heads": int, "weight_decay": float, "lr": float,
                 "seed": int, "model_size": int, "resumed": bool, "project": str}

RUN_FIELDS = ("id", "name", "project", "source", "format", "variant", "n_kv_heads", "weight_decay", "lr", "seed",
              "model_size", "resumed", "n_points", "metrics", "first_step", "last_step", "config",
              "overrides")


def list_runs(store: Store, con=None) -> list[dict]:
    """Every run (oldest first) with its point counts and the user's overrides applied.

    Each dict has the keys of ``RUN_FIELDS``; ``metrics`` is the sorted list of
    metric names, ``config`` the parsed config JSON, ``overrides`` the fields
    the user set.
    """
    sql = """
        SELECT r.id, r.name, r.project, r.source, r.format, r.variant, r.n_kv_heads, r.weight_decay, r.lr, r.seed,
               r.model_size, r.resumed, coalesce(p.n, 0), coalesce(p.metrics, []), p.first_step,
               p.last_step, r.config
        FROM runs r LEFT JOIN (
            SELECT run_id, sum(n) AS n, list(metric ORDER BY metric) AS metrics,
                   min(first_step) AS first_step, max(last_step) AS last_step
            FROM run_stats GROUP BY run_id) p ON p.run_id = r.id
        ORDER BY r.id"""
    if con is None:
        with store.connect() as c:
            rows = c.execute(sql).fetchall()
            overrides = c.execute("SELECT run_id, field, value FROM run_overrides").fetchall()
    else:
        rows = con.execute(sql).fetchall()
        overrides = con.execute("SELECT run_id, field, value FROM run_overrides").fetchall()
    by_run: dict[int, dict] = {}
    for run_id, field, value in overrides:
        by_run.setdefault(run_id, {})[field] = json.loads(value) if value is not None else None
    out = []
    for row in rows:
        d = dict(zip(RUN_FIELDS[:-2], row[:-1]))
        d["config"] = json.loads(row[-1]) if row[-1] else {}
        d["metrics"] = list(d["metrics"])
        ov = by_run.get(d["id"], {})
        for field, value in ov.items():
            if field in COLUMN_FIELDS:
                d[field] = value
            else:
                d["config"][field] = value
        d["overrides"] = sorted(ov)
        out.append(d)
    return out


def apply_overrides(con, run_id: int) -> None:
    """Write the user's corrections (``run_overrides``) of run ``run_id`` over
    its row, on ``con`` (inside the caller's transaction): ``COLUMN_FIELDS``
    into their columns, other fields into ``config``, whose ``overrides``
    lists them. ``set_run_metadata`` calls it, and the log ingest after every
    store of the run."""
    rows = con.execute("SELECT field, value FROM run_overrides WHERE run_id = ? ORDER BY field",
                       [run_id]).fetchall()
    if not rows:
        return
    stored = run_rows.row(con, run_id)
    cfg = stored["config"] if stored is not None else {}
    for field, value in rows:
        v = json.loads(value) if value is not None else None
        if field in COLUMN_FIELDS:
            run_rows.update(con, run_id, **{field: v})
        else:
            cfg[field] = v
    cfg["overrides"] = sorted(f for f, _ in rows)
    run_rows.update(con, run_id, config=cfg)


def _coerce(run_id: int, field: str, value):
    if value is None:
        return None
    kind = COLUMN_FIELDS.get(field)
    if field == "variant":
        canon = normalise_variant(value)
        if canon is None and value != "unknown":
            raise QkvscopeError(f"run {run_id}: variant must be one of {', '.join(VARIANTS)} or unknown, "
                                f"found {value!r}")
        return canon or "unknown"
    if kind is None:
        return value
    if field == "project":
        if not str(value).strip():
            raise QkvscopeError(f"run {run_id}: project must be a name, found {value!r}")
        return str(value).strip()
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes"):
            return True
        if str(value).lower() in ("false", "0", "no"):
            return False
        raise QkvscopeError(f"run {run_id}: {field} must be true or false, found {value!r}")
    try:
        if kind is int:
            f = float(value)
            if f != int(f):
                raise ValueError
            return int(f)
        return kind(value)
    except (TypeError, ValueError):
        raise QkvscopeError(f"run {run_id}: {field} must be {'an integer' if kind is int else 'a number'}"
                            f", found {value!r}") from None


def set_run_metadata(store: Store, run_id: int, **fields) -> dict:
    """Record user corrections of run ``run_id`` and apply them; returns the run.

    ``fields``: any of ``COLUMN_FIELDS`` (typed and checked: ``variant`` one of
    ``VARIANTS`` or ``unknown``) or other names (kept in the run's config).
    A value of None removes that override (the ingested value comes back on
    the next ingest).
    """
    if not fields:
        raise QkvscopeError(f"run {run_id}: no fields to set (use FIELD=VALUE)")
    clean = {f: _coerce(run_id, f, v) for f, v in fields.items()}
    with store.transaction() as con:
        if run_rows.row(con, run_id) is None:
            raise QkvscopeError(f"run {run_id}: no such run in {store.path} (see `python -m app runs`)")
        for field, value in clean.items():
            if value is None and field in fields and fields[field] is None:
                con.execute("DELETE FROM run_overrides WHERE run_id = ? AND field = ?", [run_id, field])
                continue
            con.execute(
                """INSERT OR REPLACE INTO run_overrides (run_id, field, value, updated_at)
                   VALUES (?, ?, ?, current_timestamp)""", [run_id, field, json.dumps(value)])
        apply_overrides(con, run_id)
        return next(r for r in list_runs(store, con) if r["id"] == run_id)
