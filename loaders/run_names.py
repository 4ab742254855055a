"""Display names of runs: unique in the database, as short as they can be.

Trackers name runs after their folder, so one database easily holds two ``GPT8L8H`` or two
``lightning_logs/version_0`` (different sweeps, same layout). ``display_names`` keeps a unique
name as it is and gives each run of a repeated name the fewest parent folders of its source
that tell the repeats apart: ``add-carryTrue/GPT8L8H`` and ``add-carryFalse/GPT8L8H``. Names
that stay equal with every folder added (two runs of one file) get `` #ID``.
"""
from __future__ import annotations

from pathlib import PurePath


def _parents(name: str, source: str) -> list[str]:
    """The folders of ``source`` above the part the run's ``name`` already shows, outermost first."""
    parts = list(PurePath(str(source)).parts)
    first = PurePath(str(name)).parts[0] if str(name) else ""
    if first in parts:
        cut = len(parts) - 1 - parts[::-1].index(first)
        return [p for p in parts[:cut] if p not in ("/", "")]
    return [p for p in parts[:-1] if p not in ("/", "")]


def display_names(ids, names, sources) -> dict[int, str]:
    """``{run id: display name}`` for runs of ``names`` read from ``sources`` (same order); see the
    module docstring."""
    ids, names, sources = [int(i) for i in ids], [str(n) for n in names], [str(s) for s in sources]
    out: dict[int, str] = {}
    by_name: dict[str, list[int]] = {}
    for k, n in enumerate(names):
        by_name.setdefault(n, []).append(k)
    for name, members in by_name.items():
        if len(members) == 1:
            out[ids[members[0]]] = name
            continue
        parents = {k: _parents(name, sources[k]) for k in members}
        depth = max(len(p) for p in parents.values())
        shown = {k: name for k in members}
        for d in range(1, depth + 1):
            shown = {k: "/".join(parents[k][-d:] + [name]) for k in members}
            if len(set(shown.values())) == len(members):
                break
        counts: dict[str, int] = {}
        for k in members:
            counts[shown[k]] = counts.get(shown[k], 0) + 1
        for k in members:
            out[ids[k]] = shown[k] if counts[shown[k]] == 1 else f"{shown[k]} #{ids[k]}"
    return out


def stored_display_names(con) -> dict[int, str]:
    """``display_names`` of every stored run, on an open connection."""
    rows = con.execute("SELECT id, name, source FROM runs ORDER BY id").fetchall()
    return display_names([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
