"""What a checkpoint picker needs to name a stored checkpoint (pages hold no SQL).

``checkpoint_choices(store)`` is one row per stored checkpoint with its geometry,
its step and the run it belongs to (name, variant, weight decay, lr, seed), so a
picker can say "k_eq_v-mha-wd0.1 · step 4,000" instead of a file name, search
over the run's settings, and a page can pick two checkpoints that differ in one
setting only (``app.pickers``).
"""
from __future__ import annotations

import pandas as pd

from loaders.projects import NO_PROJECT
from loaders.run_names import stored_display_names
from loaders.store import Store

#: Columns of ``checkpoint_choices``, in order.
CHOICE_COLUMNS = ["id", "path", "size", "step", "architecture", "variant", "n_layers", "n_heads",
                  "n_kv_heads", "d_model", "d_head", "run_id", "run", "run_variant", "weight_decay",
                  "lr", "seed", "project"]


def checkpoint_choices(store: Store) -> pd.DataFrame:
    """Every stored checkpoint, by id: ``CHOICE_COLUMNS``.

    ``run``, ``run_variant``, ``weight_decay``, ``lr``, ``seed`` are NULL (NaN/None)
    for a checkpoint not linked to a run (one ingested on its own, or uploaded);
    ``step`` is NULL when neither the file nor its name records one.
    """
    with store.connect() as con:
        names = stored_display_names(con)
        frame = con.execute(
            """SELECT c.id, c.path, c.size, c.step, c.architecture, c.variant, c.n_layers, c.n_heads,
                      c.n_kv_heads, c.d_model, c.d_head, c.run_id, r.name AS run, r.variant AS run_variant,
                      r.weight_decay, r.lr, r.seed, coalesce(c.project, ?) AS project
               FROM checkpoints c LEFT JOIN runs r ON r.id = c.run_id
               ORDER BY c.id""", [NO_PROJECT]).df()
    # the run's unique display name (loaders.run_names): two sweeps' GPT8L8H are told apart
    frame["run"] = [names.get(int(r), n) if pd.notna(r) else n for r, n in zip(frame["run_id"], frame["run"])]
    return frame
