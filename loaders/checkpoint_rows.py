"""The ``checkpoints`` table's rows: every statement that writes it, and the reads those writes
build on.

A row is one checkpoint's geometry under its content hash (columns: ``loaders/store.py``, the
schema); the weights stay in the file. It is written by the checkpoint ingest
(``loaders.ingest``: the row, its link to a run) and by projects (``loaders.projects``), each
through the functions here; ``tests/test_sql_boundary.py`` fails when another module writes the
table. The pages' queries that join checkpoints to other tables read it where they are.

Every function takes ``con``, a connection (inside the caller's transaction where it writes).
"""
from __future__ import annotations

import json


def id_of(con, digest: str) -> int | None:
    """The id of the checkpoint stored under content hash ``digest``, None when there is none."""
    row = con.execute("SELECT id FROM checkpoints WHERE sha256 = ?", [digest]).fetchone()
    return None if row is None else row[0]


def digest_of(con, checkpoint_id: int) -> str:
    """The content hash checkpoint ``checkpoint_id`` is stored under."""
    return con.execute("SELECT sha256 FROM checkpoints WHERE id = ?", [checkpoint_id]).fetchone()[0]


def insert(con, *, path: str, digest: str, size: int, info: dict, run_id: int | None, step: int | None) -> int:
    """Store a checkpoint: ``info`` is ``loaders.checkpoints.inspect_checkpoint``'s JSON
    (geometry, ``params``, ``kv_bytes_per_token``, ``nonfinite``, ``config``, ``towers``).
    Returns its id."""
    return con.execute(
        """INSERT INTO checkpoints (path, sha256, size, architecture, variant, n_layers, n_heads,
               n_kv_heads, d_model, d_head, norm, positions, attn_scale, dtype, params_total,
               params_attention, kv_bytes_per_token, nonfinite, run_id, step, config, towers)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id""",
        [path, digest, size, info["architecture"], info["variant"],
         info["n_layers"], info["n_heads"], info["n_kv_heads"], info["d_model"], info["d_head"],
         info.get("norm"), info.get("positions"), info.get("attn_scale"), info.get("dtype"),
         info["params"]["total"], info["params"]["attention"], info["kv_bytes_per_token"],
         int(info.get("nonfinite", 0)), run_id, step,
         json.dumps(info.get("config", {}), default=str),
         # which layers belong to which tower (CLIP/SigLIP): [] for one attention stack
         json.dumps(info.get("towers") or [], default=str)],
    ).fetchone()[0]


def unlinked(con) -> list[tuple[int, str]]:
    """``(id, path)`` of every checkpoint not linked to a run."""
    return con.execute("SELECT id, path FROM checkpoints WHERE run_id IS NULL").fetchall()


def link(con, checkpoint_id: int, run_id: int) -> None:
    """Link checkpoint ``checkpoint_id`` to run ``run_id``."""
    con.execute("UPDATE checkpoints SET run_id = ? WHERE id = ?", [run_id, checkpoint_id])


def set_project(con, checkpoint_ids: list[int], name: str, *, only_new: bool) -> None:
    """Put checkpoints ``checkpoint_ids`` into project ``name``; ``only_new``: those without one only."""
    con.execute(f"UPDATE checkpoints SET project = ? WHERE id IN (SELECT unnest(?::INTEGER[]))"
                f"{' AND project IS NULL' if only_new else ''}", [name, checkpoint_ids])
