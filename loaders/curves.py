"""Read queries for training curves and stored analysis results (pages hold no SQL).

Curves are downsampled in DuckDB, not in Python: a run with more points than
``max_points`` is cut into ``max_points // 2`` equal buckets along x and each
bucket keeps its lowest and its highest point (with their own x), so no
curve has more than ``max_points`` points and a one-step loss spike stays
visible however long the run is (the "min-max" or M4-style decimation, Jugel
et al., VLDB 2014, without the first/last pair).

x is one of ``X_AXES``: the training step, tokens seen, or wall time in
seconds since the run's first logged point. Points without that x (a log
without token counts) are left out.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.directions import direction as metric_direction
from loaders.errors import QkvscopeError
from loaders.store import Store

#: x axis name -> column of ``points``.
X_AXES = {"step": "step", "tokens": "tokens", "wall_time": "wall_time"}
#: The most points one curve may have after downsampling.
MAX_POINTS = 2000
#: What a stored analysis value carries besides itself (``loaders.results.RESULT_FIELDS``).
RESULT_EXTRAS = ["chance", "n_tokens", "ci_low", "ci_high", "chance_low", "chance_high", "above_chance",
                 "degenerate"]


def _x_column(x: str) -> str:
    if x not in X_AXES:
        raise QkvscopeError(f"x axis must be one of {', '.join(X_AXES)}; got {x!r}")
    return X_AXES[x]


def _ids(run_ids) -> list[int]:
    return sorted({int(r) for r in run_ids})


def _points_cte(x: str) -> str:
    """SQL for the selected points with their x (``wall_time`` made relative per run)."""
    col = _x_column(x)
    xexpr = (f"{col} - min({col}) OVER (PARTITION BY run_id)" if x == "wall_time"
             else f"CAST({col} AS DOUBLE)")
    return f"""p AS (
        SELECT run_id, step, value, {xexpr} AS x
        FROM points
        WHERE metric = $metric AND run_id IN (SELECT unnest($ids))
          AND value IS NOT NULL AND isfinite(value) AND {col} IS NOT NULL
    )"""


def curves(store: Store, run_ids, metric: str, *, x: str = "step",
           max_points: int = MAX_POINTS) -> pd.DataFrame:
    """One metric of some runs, at most ``max_points`` points per run.

    Returns columns ``run_id, x, value, step`` sorted by (run_id, x). Runs
    with ``max_points`` points or fewer come back whole; longer ones keep the
    minimum and the maximum of each of ``max_points // 2`` equal x buckets.
    """
    if max_points < 2:
        raise QkvscopeError(f"max_points must be at least 2; got {max_points}")
    ids = _ids(run_ids)
    if not ids:
        return pd.DataFrame({"run_id": pd.Series([], dtype="int32"), "x": pd.Series([], dtype="float64"),
                             "value": pd.Series([], dtype="float64"), "step": pd.Series([], dtype="int64")})
    sql = f"""
    WITH {_points_cte(x)},
    r AS (SELECT run_id, min(x) AS lo, max(x) AS hi, count(*) AS n FROM p GROUP BY run_id),
    whole AS (SELECT p.run_id, p.x, p.value, p.step FROM p JOIN r USING (run_id) WHERE r.n <= $max_points),
    cut AS (
        SELECT p.run_id, p.x, p.value, p.step,
               CASE WHEN r.hi > r.lo
                    THEN least(CAST(floor((p.x - r.lo) * $buckets / (r.hi - r.lo)) AS BIGINT), $buckets - 1)
                    ELSE 0 END AS bucket
        FROM p JOIN r USING (run_id) WHERE r.n > $max_points
    ),
    agg AS (
        SELECT run_id, bucket,
               arg_min(x, value) AS x_lo, min(value) AS v_lo, arg_min(step, value) AS s_lo,
               arg_max(x, value) AS x_hi, max(value) AS v_hi, arg_max(step, value) AS s_hi
        FROM cut GROUP BY run_id, bucket
    )
    SELECT run_id, x, value, step FROM whole
    UNION ALL SELECT run_id, x_lo, v_lo, s_lo FROM agg
    UNION ALL SELECT run_id, x_hi, v_hi, s_hi FROM agg WHERE x_hi <> x_lo OR v_hi <> v_lo
    ORDER BY run_id, x, step
    """
    params = {"metric": metric, "ids": ids, "max_points": int(max_points),
              "buckets": int(max_points // 2)}
    with store.connect() as con:
        return con.execute(sql, params).df()


def band_points(store: Store, run_ids, metric: str, *, x: str = "step",
                n_bins: int = 200) -> pd.DataFrame:
    """Each run's mean value in ``n_bins`` equal x bins shared by all the runs.

    Returns ``run_id, bin, x, value`` (x: the bin's mean x over the runs' points),
    the common grid that ``group_band`` needs to average runs logged at
    different steps.
    """
    ids = _ids(run_ids)
    if not ids:
        return pd.DataFrame(columns=["run_id", "bin", "x", "value"])
    sql = f"""
    WITH {_points_cte(x)},
    g AS (SELECT min(x) AS lo, max(x) AS hi FROM p)
    SELECT run_id,
           CASE WHEN g.hi > g.lo
                THEN least(CAST(floor((x - g.lo) * $bins / (g.hi - g.lo)) AS BIGINT), $bins - 1)
                ELSE 0 END AS bin,
           avg(x) AS x, avg(value) AS value
    FROM p, g GROUP BY ALL ORDER BY run_id, bin
    """
    with store.connect() as con:
        return con.execute(sql, {"metric": metric, "ids": ids, "bins": int(n_bins)}).df()


def group_band(binned: pd.DataFrame, groups: dict[int, str]) -> pd.DataFrame:
    """Mean and min-max band across the runs of each group, bin by bin.

    ``binned`` is ``band_points``' frame, ``groups`` maps run id to a group
    label (e.g. its variant). Returns ``group, bin, x, mean, lo, hi, n_runs``;
    a bin appears once at least one run of the group has a point in it.
    """
    cols = ["group", "bin", "x", "mean", "lo", "hi", "n_runs"]
    if binned.empty:
        return pd.DataFrame(columns=cols)
    frame = binned.assign(group=binned["run_id"].map(lambda r: groups.get(int(r), "unknown")))
    out = (frame.groupby(["group", "bin"], sort=True)
           .agg(x=("x", "mean"), mean=("value", "mean"), lo=("value", "min"), hi=("value", "max"),
                n_runs=("run_id", "nunique"))
           .reset_index())
    return out[cols]


def final_values(store: Store, metric: str, run_ids=None, *, overrides: dict[str, str] | None = None) -> pd.DataFrame:
    """Per run: last value of ``metric`` (at its highest step), best value, spikes.

    Returns ``run_id, final_step, final, best, best_step, n, nonfinite``;
    ``nonfinite`` counts infinite values (a diverged run). ``best`` is direction-aware
    (``analysis.directions``): the lowest value of a loss, the highest of an accuracy
    (``overrides`` as there). Read from the ``run_stats`` summary that ingest keeps
    (``best`` and ``top``, schema 8), never from the points.
    """
    ids = None if run_ids is None else _ids(run_ids)
    where = "metric = $metric" + ("" if ids is None else " AND run_id IN (SELECT unnest($ids))")
    params = {"metric": metric} if ids is None else {"metric": metric, "ids": ids}
    best = "top AS best, top_step" if metric_direction(metric, overrides) == "max" else "best, best_step"
    sql = f"""
    SELECT run_id, final_step, final, {best} AS best_step, n_values AS n, nonfinite
    FROM run_stats WHERE {where} AND n_values > 0
    ORDER BY run_id
    """
    with store.connect() as con:
        return con.execute(sql, params).df()


def run_metric_summary(store: Store, metrics, run_ids=None) -> pd.DataFrame:
    """Per run and metric: ``run_id, metric, n, final_step, final, min, max`` over finite values
    (``final`` the value at the highest step with a finite value), for the Results table: read
    from ``run_stats`` (runs and metrics with at least one finite value)."""
    names = [str(m) for m in metrics]
    cols = ["run_id", "metric", "n", "final_step", "final", "min", "max"]
    if not names:
        return pd.DataFrame(columns=cols)
    ids = None if run_ids is None else _ids(run_ids)
    where = "metric IN (SELECT unnest($metrics)) AND n_values > nonfinite" + (
        "" if ids is None else " AND run_id IN (SELECT unnest($ids))")
    params: dict = {"metrics": names} if ids is None else {"metrics": names, "ids": ids}
    sql = f"""
    SELECT run_id, metric, n_values - nonfinite AS n, final_step, final, best AS min, top AS max
    FROM run_stats WHERE {where} ORDER BY run_id, metric
    """
    with store.connect() as con:
        return con.execute(sql, params).df()[cols]


def run_geometry(store: Store) -> pd.DataFrame:
    """Each run's latest checkpoint geometry: ``run_id, checkpoint_id, step, n_layers, n_heads,
    n_kv_heads, d_model, d_head, dtype, params_attention, kv_bytes_per_token`` (runs without a
    linked checkpoint are absent)."""
    sql = """
    SELECT run_id, id AS checkpoint_id, step, n_layers, n_heads, n_kv_heads, d_model, d_head, dtype,
           params_attention, kv_bytes_per_token
    FROM checkpoints WHERE run_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY step DESC NULLS LAST, id DESC) = 1
    ORDER BY run_id
    """
    with store.connect() as con:
        return con.execute(sql).df()


def metric_names(store: Store, run_ids=None) -> list[str]:
    """Metrics logged by the given runs (all runs when None), sorted. Read from ``run_stats`` (one
    row per run and metric with points, kept with every write to ``points``), not from the
    points: on 2,000 runs x 50,000 steps the DISTINCT over ``points`` took 0.34-0.42 s, at
    every run of the Papers page."""
    ids = None if run_ids is None else _ids(run_ids)
    if ids == []:
        return []
    sql = "SELECT DISTINCT metric FROM run_stats WHERE n > 0" + (
        "" if ids is None else " AND run_id IN (SELECT unnest($ids))")
    with store.connect() as con:
        rows = con.execute(sql + " ORDER BY metric", {} if ids is None else {"ids": ids}).fetchall()
    return [r[0] for r in rows]


# -- analysis results ---------------------------------------------------------

def analysis_results(store: Store, checkpoint_id: int, metric_version: int) -> pd.DataFrame:
    """Stored metric values of one checkpoint at ``metric_version`` (the running code's, which
    ``analyze`` stores and reads too: rows of another version are not shown as current).

    Returns ``layer, head, metric, value, metric_version, chance, n_tokens,
    ci_low, ci_high, chance_low, chance_high, above_chance, degenerate, layer2, head2`` (head
    NULL: whole layer; layer NULL: whole model; ``layer2``/``head2``: the pair's second layer
    or head, NULL but on a pair metric's rows), sorted by metric, layer, head, layer2, head2.
    ``chance`` is the value independent projections of the same shapes give and
    ``chance_low, chance_high`` its null band; ``n_tokens`` and the 95% interval
    ``ci_low, ci_high`` are set for activation metrics only (NULL for weight
    metrics and for rows stored before metric version 3); ``above_chance`` (NULL:
    not tested) and ``degenerate`` as ``loaders.results`` stores them.
    """
    sql = """
    SELECT layer, head, metric, value, metric_version, chance, n_tokens, ci_low, ci_high, chance_low, chance_high,
           above_chance, coalesce(degenerate, false) AS degenerate, layer2, head2 FROM analysis_results
    WHERE checkpoint_id = $id
      AND metric_version = $v
    ORDER BY metric, layer NULLS FIRST, head NULLS FIRST, layer2 NULLS FIRST, head2 NULLS FIRST
    """
    with store.connect() as con:
        return con.execute(sql, {"id": int(checkpoint_id), "v": int(metric_version)}).df()


def results_over_checkpoints(store: Store, checkpoint_ids, metric_version: int, metrics=None) -> pd.DataFrame:
    """Stored results of several checkpoints with their step and run.

    Returns ``checkpoint_id, run_id, step, layer, head, metric, value, chance,
    n_tokens, ci_low, ci_high, chance_low, chance_high, above_chance, degenerate``
    (as ``analysis_results``) at ``metric_version``; ``metrics`` restricts the names.
    Rows of pairs (``layer2``/``head2`` set) are not among them: a value over steps is
    one layer's or head's.
    """
    ids = _ids(checkpoint_ids)
    if not ids:
        return pd.DataFrame(columns=["checkpoint_id", "run_id", "step", "layer", "head", "metric", "value",
                                     *RESULT_EXTRAS])
    metric_filter = "" if metrics is None else " AND a.metric IN (SELECT unnest($metrics))"
    sql = f"""
    SELECT a.checkpoint_id, c.run_id, c.step, a.layer, a.head, a.metric, a.value,
           a.chance, a.n_tokens, a.ci_low, a.ci_high, a.chance_low, a.chance_high, a.above_chance,
           coalesce(a.degenerate, false) AS degenerate
    FROM analysis_results a JOIN checkpoints c ON c.id = a.checkpoint_id
    WHERE a.checkpoint_id IN (SELECT unnest($ids)) AND a.metric_version = $v{metric_filter}
      AND a.layer2 IS NULL AND a.head2 IS NULL
    ORDER BY c.step NULLS LAST, a.checkpoint_id, a.metric, a.layer, a.head
    """
    params: dict = {"ids": ids, "v": int(metric_version)}
    if metrics is not None:
        params["metrics"] = list(metrics)
    with store.connect() as con:
        return con.execute(sql, params).df()


def head_difference(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, layer, head, layer2, head2): the values of two checkpoints and ``b - a``.

    Inputs are ``analysis_results`` frames; only cells present in both are kept (a pair's
    second layer or head is part of the cell).
    Returns ``metric, layer, head, layer2, head2, a, b, diff`` and each side's ``chance_a, chance_b,
    n_tokens_a, n_tokens_b, ci_low_a, ci_high_a, ci_low_b, ci_high_b`` (NaN where an
    input has none).
    """
    keys = ["metric", "layer", "head", "layer2", "head2"]

    def side(frame: pd.DataFrame, name: str) -> pd.DataFrame:
        extras = {c: frame[c] if c in frame.columns else np.nan for c in RESULT_EXTRAS}
        pairs = {c: pd.array(frame[c] if c in frame.columns else [pd.NA] * len(frame), dtype="Int64")
                 for c in ("layer2", "head2")}
        return frame[keys[:3] + ["value"]].assign(**pairs, **extras).rename(
            columns={"value": name, **{c: f"{c}_{name}" for c in RESULT_EXTRAS}})

    merged = side(a, "a").merge(side(b, "b"), on=keys, how="inner")
    merged["diff"] = merged["b"] - merged["a"]
    merged = merged[keys + ["a", "b", "diff", "chance_a", "chance_b", "n_tokens_a", "n_tokens_b",
                            "ci_low_a", "ci_high_a", "ci_low_b", "ci_high_b"]]
    return merged.sort_values(keys, na_position="first").reset_index(drop=True)


def run_checkpoints(store: Store) -> pd.DataFrame:
    """Checkpoints linked to a run with a step: ``run_id, run, checkpoint_id, step, path``, by run and step."""
    sql = """
    SELECT c.run_id, r.name AS run, c.id AS checkpoint_id, c.step, c.path
    FROM checkpoints c JOIN runs r ON r.id = c.run_id
    WHERE c.step IS NOT NULL
    ORDER BY c.run_id, c.step, c.id
    """
    with store.connect() as con:
        return con.execute(sql).df()


#: Rows per Arrow batch when ``metric_curves`` streams a metric's points (16 MB of run ids and values).
CURVE_BATCH_ROWS = 1 << 20
#: Points per query of ``metric_curves`` (whole runs, so one run over it is a query of its own).
CURVE_CHUNK_POINTS = 1 << 22


def metric_curves(store: Store, metric: str, run_ids=None, *, batch_rows: int = CURVE_BATCH_ROWS,
                  chunk_points: int = CURVE_CHUNK_POINTS):
    """Every point of one metric, not downsampled, one run at a time: yields ``(run_id, values)``,
    ``values`` float64 in step order, runs by id (a run without a point of ``metric`` yields nothing).

    For whole-curve statistics (spikes, divergence, final value,
    ``analysis.wd_sensitivity``, the Weight decay and Papers pages, ``wd-sensitivity``):

    * non-finite values are kept, a stored NULL as NaN (ingest stores a logged NaN as
      NULL: ``loaders.logs.newpoints``), since either marks a diverged run;
    * at a step stored twice (ingest leaves one point per step; a database written by
      hand may hold more) the value stored last counts (the highest ``rowid``).

    The runs are those ``run_stats`` lists with points of ``metric`` (the summary every
    write to ``points`` keeps, ``loaders.store.refresh_run_stats``), read in id order,
    consecutive runs of up to ``chunk_points`` points (``run_stats.n``) per query (``run_id BETWEEN lo AND hi``, which DuckDB prunes by
    its row groups' zone maps: ingest writes a run's points together), each sorted by
    DuckDB and streamed in Arrow batches of ``batch_rows``. So this process and DuckDB hold
    one chunk, never the metric's every point: on 2,000 runs x 50,000 steps (100M points)
    one query sorting them all into a frame held 9.1 GB at its peak and took ~40 s with the
    statistics; chunked, ~2 GB and ~4 s. A generator: the connection stays open until it
    is exhausted or closed.
    """
    ids = None if run_ids is None else _ids(run_ids)
    among = "" if ids is None else " AND run_id IN (SELECT unnest($ids))"
    params = {"metric": metric} if ids is None else {"metric": metric, "ids": ids}
    # the chunk's runs: BETWEEN lets DuckDB skip row groups, list_contains keeps exactly these ids
    where = "WHERE metric = $metric AND run_id BETWEEN $lo AND $hi AND list_contains($ids, run_id)"
    value = "coalesce(value, 'NaN'::DOUBLE) AS value"
    in_order = f"SELECT run_id, step, {value} FROM points {where} ORDER BY run_id, step, rowid"
    with store.connect() as con:
        counts = con.execute(f"SELECT run_id, n FROM run_stats WHERE metric = $metric AND n > 0{among} "
                             "ORDER BY run_id", params).fetchall()
        for chunk in _chunks(counts, chunk_points):
            chunk_params = {"metric": metric, "lo": chunk[0], "hi": chunk[-1], "ids": chunk}
            # a relation's reader streams; one on an executed (DB-API) result copies every row first
            reader = con.sql(in_order, params=chunk_params).to_arrow_reader(batch_rows)
            yield from _arrow_curves(reader)


def _chunks(counts: list[tuple[int, int]], limit: int):
    """Run ids (``counts``: ``(run_id, points)`` in id order) in consecutive groups of at most
    ``limit`` points each, a run over ``limit`` alone."""
    chunk, size = [], 0
    for rid, n in counts:
        if chunk and size + n > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(int(rid))
        size += int(n)
    if chunk:
        yield chunk


def _arrow_curves(reader):
    """``(run_id, values)`` of each run in a stream of ``run_id, step, value`` batches sorted by run,
    step and order of storing (a run may span batches); of a step stored twice, the last value."""
    run, steps, values = None, [], []

    def whole():
        s, v = np.concatenate(steps), np.concatenate(values)              # [n], [n]
        last = np.r_[s[1:] != s[:-1], True]                               # the last row of each step
        return run, (v if last.all() else v[last])

    for batch in reader:
        if not batch.num_rows:
            continue
        rid = batch.column(0).to_numpy()                                  # [rows], no NULLs (NaN for one)
        step = batch.column(1).to_numpy()
        val = batch.column(2).to_numpy().astype(np.float64, copy=False)
        cuts = np.flatnonzero(rid[1:] != rid[:-1]) + 1                    # where a run starts
        for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(rid)]):
            here = int(rid[start])
            if here != run and steps:
                yield whole()
                steps, values = [], []
            run = here
            steps.append(step[start:stop])
            values.append(val[start:stop])
    if steps:
        yield whole()


@dataclass(frozen=True)
class StoredCurves:
    """The curves of ``metric`` (of ``run_ids``, None: every run) in ``store``, read by
    ``metric_curves`` each time they are iterated: ``analysis.wd_sensitivity``'s and
    ``analysis.paper_claims.Inputs``' ``points`` without holding every point in memory."""

    store: Store
    metric: str
    run_ids: tuple[int, ...] | None = None

    def __iter__(self):
        return metric_curves(self.store, self.metric, self.run_ids)


def latest_run_checkpoints(store: Store) -> pd.DataFrame:
    """Each run's checkpoint with the highest step: ``run_id, checkpoint_id, step`` (whether its
    analysis is current is the app's rule, ``app.state.current_notes``)."""
    with store.connect() as con:
        return con.execute(
            """SELECT c.run_id, arg_max(c.id, c.step) AS checkpoint_id, max(c.step) AS step
               FROM checkpoints c WHERE c.run_id IS NOT NULL AND c.step IS NOT NULL
               GROUP BY c.run_id ORDER BY c.run_id""").df()


def metric_directions(store: Store) -> dict[str, str]:
    """``{metric: 'min' | 'max'}`` the user set (``analysis.directions.direction``'s overrides)."""
    with store.connect() as con:
        return dict(con.execute("SELECT metric, direction FROM metric_directions ORDER BY metric").fetchall())


def set_metric_direction(store: Store, metric: str, direction: str | None) -> None:
    """Store whether lower (``min``) or higher (``max``) is better for ``metric``; None removes
    the setting, so the name decides again."""
    if direction not in (None, "min", "max"):
        raise ValueError(f"direction must be 'min', 'max' or None, got {direction!r}")
    with store.transaction() as con:
        con.execute("DELETE FROM metric_directions WHERE metric = ?", [metric])
        if direction is not None:
            con.execute("INSERT INTO metric_directions VALUES (?, ?)", [metric, direction])
