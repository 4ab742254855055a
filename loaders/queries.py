"""Read queries the dashboard and CLI share (pages hold no SQL)."""
from __future__ import annotations

import pandas as pd

from loaders.projects import NO_PROJECT
from loaders.run_names import stored_display_names
from loaders.store import Store


def summary(store: Store) -> dict:
    """How much the database holds: counts of runs, points, checkpoints, analyses."""
    with store.connect() as con:
        runs, points = con.execute(
            "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM points)").fetchone()
        ckpts, analysed = con.execute(
            "SELECT (SELECT count(*) FROM checkpoints), "
            "(SELECT count(DISTINCT checkpoint_id) FROM analysis_jobs)").fetchone()
        sources = [r[0] for r in con.execute("SELECT source FROM runs").fetchall()]
    return {"runs": runs, "points": points, "checkpoints": ckpts, "analysed": analysed,
            "run_sources": sources}


def checkpoints_frame(store: Store) -> pd.DataFrame:
    """Stored checkpoints with geometry and the display name of their run (``loaders.run_names``),
    if linked."""
    with store.connect() as con:
        names = stored_display_names(con)
        frame = con.execute(
            """SELECT c.id, r.name AS run, c.run_id, c.step, c.architecture, c.variant, c.n_layers,
                      c.n_heads, c.n_kv_heads, c.d_model, c.d_head, c.norm, c.positions,
                      c.dtype, c.params_total, c.params_attention, c.kv_bytes_per_token,
                      c.nonfinite, c.path, c.sha256, coalesce(c.project, ?) AS project
               FROM checkpoints c LEFT JOIN runs r ON r.id = c.run_id
               ORDER BY c.id""", [NO_PROJECT]).df()
    frame["run"] = [names.get(int(r), n) if pd.notna(r) else n for r, n in zip(frame["run_id"], frame["run"])]
    return frame
