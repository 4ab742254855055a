"""The ``runs`` table's rows: every statement that writes it, and the reads those writes build on.

A row is one training run (columns: ``loaders/store.py``, the schema). It is written by the log
ingest (``loaders.logs.ingest``: a run found in a log, its ``lr`` and ``config`` from the
points, ``resumed``), the user's corrections (``loaders.logs.runs``), projects
(``loaders.projects``) and the checkpoints' parameter count (``loaders.ingest.link_checkpoints``),
each through the functions here; ``tests/test_sql_boundary.py`` fails when another module
writes the table. The pages' queries that join runs to other tables read it where they are.

Every function takes ``con``, a connection inside the caller's transaction; ``config`` goes in
and comes out as a dict (JSON in the table).
"""
from __future__ import annotations

import json

#: The columns ``update`` may set (``id``, ``source`` and ``created_at`` are a run's identity).
COLUMNS = ("name", "format", "variant", "n_kv_heads", "weight_decay", "lr", "seed", "model_size", "config",
           "resumed", "project")
#: What a log's metadata (``loaders.logs.metadata.gather``) fills in, in the table's order.
LOGGED = ("variant", "n_kv_heads", "weight_decay", "lr", "seed", "model_size")


def _config(text) -> dict:
    return json.loads(text) if text else {}


def find(con, source: str, name: str, fmt: str | None = None) -> tuple[int, dict] | None:
    """``(id, config)`` of the run ``name`` read from ``source`` (of format ``fmt`` when given),
    None when there is none."""
    sql = "SELECT id, config FROM runs WHERE source = ? AND name = ?"
    row = (con.execute(sql + " AND format = ?", [source, name, fmt]) if fmt is not None
           else con.execute(sql, [source, name])).fetchone()
    return None if row is None else (row[0], _config(row[1]))


def by_name(con, source: str) -> dict[str, tuple[int, dict]]:
    """``{name: (id, config)}`` of the runs read from ``source`` (the lowest id where two share a
    name): what ``find`` answers for each, in one query for all the runs of a file."""
    got: dict[str, tuple[int, dict]] = {}
    for run_id, name, config in con.execute("SELECT id, name, config FROM runs WHERE source = ? ORDER BY id",
                                            [source]).fetchall():
        got.setdefault(name, (run_id, _config(config)))
    return got


def row(con, run_id: int) -> dict | None:
    """Run ``run_id``'s ``lr`` and ``config``, None when there is no such run."""
    got = con.execute("SELECT lr, config FROM runs WHERE id = ?", [run_id]).fetchone()
    return None if got is None else {"lr": got[0], "config": _config(got[1])}


def folders(con) -> list[tuple[int, str, dict]]:
    """``(id, source, config)`` of every run: where each run's files are."""
    return [(i, s, _config(c)) for i, s, c in con.execute("SELECT id, source, config FROM runs").fetchall()]


def upsert(con, *, source: str, name: str, fmt: str, fields: dict, config: dict, project: str | None,
           resumed: bool, joins: bool = False, stored: dict | None = None) -> tuple[int, bool]:
    """The id of run ``name`` from ``source``, stored from a log, and whether its row is new: a new
    row, or the stored row with this log's format, ``LOGGED`` fields and ``config`` merged over the
    stored config (the ``project`` kept where one is set). ``joins``: a file that joins a run
    (final metrics) leaves a stored run as it is. ``stored``: ``by_name(con, source)``, read once
    for a file's runs (else the run is looked up here)."""
    found = find(con, source, name) if stored is None else stored.get(name)
    if found is not None and joins:
        return found[0], False
    values = [fields[c] for c in LOGGED]
    if found is None:
        return con.execute(
            """INSERT INTO runs (name, source, format, variant, n_kv_heads, weight_decay, lr, seed,
                   model_size, config, resumed, project) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id""",
            [name, source, fmt, *values, json.dumps(config, default=str), bool(resumed), project]).fetchone()[0], True
    run_id, old = found
    con.execute(
        """UPDATE runs SET format = ?, variant = ?, n_kv_heads = ?, weight_decay = ?, lr = ?, seed = ?,
               model_size = ?, config = ?, project = coalesce(project, ?) WHERE id = ?""",
        [fmt, *values, json.dumps({**old, **config}, default=str), project, run_id])
    return run_id, False


def update(con, run_id: int, **values) -> None:
    """Set columns (``COLUMNS``) of run ``run_id``; ``config`` as a dict."""
    bad = sorted(set(values) - set(COLUMNS))
    if bad:
        raise ValueError(f"runs has no settable column {', '.join(bad)}; expected one of {', '.join(COLUMNS)}")
    for column, value in values.items():
        if column == "config":
            value = json.dumps(value, default=str)
        con.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", [value, run_id])


def set_project(con, run_ids: list[int], name: str, *, only_new: bool) -> None:
    """Put runs ``run_ids`` into project ``name``; ``only_new``: those without a project only."""
    con.execute(f"UPDATE runs SET project = ? WHERE id IN (SELECT unnest(?::INTEGER[]))"
                f"{' AND project IS NULL' if only_new else ''}", [name, run_ids])


def sizes_from_checkpoints(con) -> None:
    """A run whose logs and configs never state its size takes its checkpoints' largest parameter
    count (a user's correction in ``run_overrides`` still wins)."""
    con.execute(
        """UPDATE runs SET model_size = c.params
           FROM (SELECT run_id, max(params_total) AS params FROM checkpoints
                 WHERE run_id IS NOT NULL GROUP BY run_id) c
           WHERE runs.id = c.run_id AND runs.model_size IS NULL
             AND runs.id NOT IN (SELECT run_id FROM run_overrides WHERE field = 'model_size')""")
