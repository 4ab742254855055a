"""Compare page in AppTest: two checkpoints' per-head difference, a run's checkpoints over training."""
from __future__ import annotations

import re

import numpy as np
import pytest

from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr, figures, qp
from tests.app.test_page_inspector import tiny_gpt2

#: AppTest's limit for a page run that analyses checkpoints (each in a child process, 15-20 s on a
#: loaded 2-core machine): the first run of a pair and a run's trajectories analyse three or four.
ANALYSING_S = 240


@pytest.fixture(scope="module")
def run_db(tmp_path_factory):
    """One run folder with a CSV log and three checkpoints (steps 100, 200, 300)."""
    root = tmp_path_factory.mktemp("cmp")
    run = root / "runs" / "gpt2-wd0.1"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,train_loss\n" + "".join(f"{s},{4 - s / 1000}\n" for s in range(0, 301, 50)))
    for i, step in enumerate((100, 200, 300)):
        tiny_gpt2(run / f"step_{step}", seed=i)
    db = root / "cmp.duckdb"
    report = ingest_paths(Store(db), [root / "runs"]).to_json()
    assert report["errors"] == 0 and report["added"] == 4, report
    return db


def test_empty_database_says_how_to_get_checkpoints(tmp_path, monkeypatch):
    db = tmp_path / "e.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("compare").run()
    assert not at.exception
    assert at.info[0].value.startswith("No checkpoints stored yet.")


def test_pair_difference_is_b_minus_a(run_db, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(run_db))
    at = page_test("compare", {"a": "1", "b": "3", "metric": "kv_cka"}, timeout=ANALYSING_S).run()
    assert not at.exception, at.exception
    figs = figures(at)
    ha, hb = figs["cmp_heat_a"]["data"][0], figs["cmp_heat_b"]["data"][0]
    assert (ha["zmin"], ha["zmax"]) == (hb["zmin"], hb["zmax"])  # one colour scale for both
    assert ha["zmid"] == hb["zmid"] and (ha["zmin"] + ha["zmax"]) / 2 == pytest.approx(ha["zmid"])
    za = arr(figs["cmp_heat_a"]["data"][0]["z"])
    zb = arr(figs["cmp_heat_b"]["data"][0]["z"])
    zd = arr(figs["cmp_diff"]["data"][0]["z"])
    np.testing.assert_allclose(np.array(zd), np.array(zb) - np.array(za), rtol=1e-6, atol=1e-9)
    assert np.abs(np.array(zd)).max() > 0  # different seeds: different weights
    at.selectbox(key="cmp_metric").select("qk_symmetry").run()
    assert figures(at)["cmp_diff"]["data"][0]["colorbar"]["title"]["text"] == "B - A"
    assert qp(at, "metric") == "qk_symmetry"
    # the same checkpoint on both sides: no difference at all
    same = page_test("compare", {"a": "2", "b": "2"}).run()
    assert all(v == 0 for row in arr(figures(same)["cmp_diff"]["data"][0]["z"]) for v in row)


def test_run_trajectory_has_one_line_per_layer_over_steps(run_db, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(run_db))
    at = page_test("compare", {"tmetric": "kv_share_r2"}, timeout=ANALYSING_S).run()
    assert not at.exception, at.exception
    traj = figures(at)["cmp_traj"]["data"]
    # kv_share_r2 of independent K, V: d_head / d_model = 8 / 32 (closed form), one dashed line
    assert [t["name"] for t in traj] == ["L0", "L1", "chance 0.25"]
    assert traj[2]["line"]["dash"] == "dash" and arr(traj[2]["y"]) == [0.25, 0.25]
    assert arr(traj[0]["x"]) == [100, 200, 300]
    assert "(chance 0.25)" in traj[0]["customdata"][0]
    assert qp(at, "tmetric") == "kv_share_r2" and qp(at, "run") == "1"


FEW = "40 tokens < 8 x d_head = 64: fewer tokens than columns bias CKA up; read it against its chance level"


@pytest.fixture
def chance_run_db(tmp_path, monkeypatch):
    """A run with two checkpoints whose stored results carry chance levels, tokens and intervals
    (written as the jobs write them); step 200's activation sample was too small."""
    import pandas as pd

    from analysis.registry import METRIC_VERSION, names
    from loaders.results import replace_results

    run = tmp_path / "runs" / "gpt2-wd0.1"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,train_loss\n0,4\n200,3\n")
    for i, step in enumerate((100, 200)):
        tiny_gpt2(run / f"step_{step}", seed=i)
    db = tmp_path / "chance.duckdb"
    store = Store(db)
    assert ingest_paths(store, [tmp_path / "runs"]).to_json()["errors"] == 0
    heads = [(l, h) for l in range(2) for h in range(4)]
    with store.transaction() as con:
        for cid, shift in ((1, 0.0), (2, 0.1)):
            weights = pd.DataFrame([{"layer": l, "head": h, "metric": "kv_share_r2", "value": 0.3 + shift,
                                     "chance": 0.25} for l, h in heads])
            acts = pd.DataFrame([{"layer": l, "head": h, "metric": "kv_cka_act", "value": 0.4 + shift + 0.01 * h,
                                  "chance": 0.2, "n_tokens": 4096 if cid == 1 else 40,
                                  "ci_low": 0.35 + shift + 0.01 * h, "ci_high": 0.45 + shift + 0.01 * h}
                                 for l, h in heads])
            # every metric without rows has a note, so the stored jobs are current (the pages
            # and analyze read them back instead of computing again)
            absent = {m: "not in this fixture" for m in names("weights") + names("activations")
                      if m not in ("kv_share_r2", "kv_cka_act")}
            replace_results(con, checkpoint_id=cid, kind="weights", metrics=names("weights"),
                            metric_version=METRIC_VERSION, notes=absent, seconds=0.1, device="cpu", frame=weights)
            replace_results(con, checkpoint_id=cid, kind="activations", metrics=names("activations"),
                            metric_version=METRIC_VERSION, notes={**absent, "kv_cka_act": FEW} if cid == 2 else absent,
                            seconds=0.1, device="cpu", frame=acts)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def test_pair_reads_against_chance_with_intervals_and_greys_the_undersampled_side(chance_run_db):
    at = page_test("compare", {"a": "1", "b": "2", "metric": "kv_cka_act", "tmetric": "kv_cka_act"},
                   timeout=ANALYSING_S).run()
    assert not at.exception, at.exception
    figs = figures(at)
    ha, hb = figs["cmp_heat_a"]["data"][0], figs["cmp_heat_b"]["data"][0]
    assert ha["zmid"] == hb["zmid"] == 0.2
    assert ha["zmin"] == pytest.approx(0.2 - 0.33) and hb["zmax"] == pytest.approx(0.2 + 0.33)  # B's 0.53
    assert "opacity" not in ha and hb["opacity"] == 0.35  # only B rests on too few tokens
    assert ha["customdata"][0][0] == "L0H0<br>kv_cka_act 0.4 (chance 0.2)<br>n=4096 tokens, 95% CI 0.35–0.45"
    assert f"B: kv_cka_act rests on too few tokens: {FEW}" in [w.value for w in at.warning]
    diff = figs["cmp_diff"]["data"][0]
    assert diff["customdata"][0][1] == ("L0H1<br>B - A = +0.1<br>A 0.41 (chance 0.2)<br>n=4096 tokens, "
                                        "95% CI 0.36–0.46<br>B 0.51 (chance 0.2)<br>n=40 tokens, 95% CI 0.46–0.56")
    table = at.dataframe[-1]
    changes = table.value
    assert list(changes.columns) == ["layer", "head", "A", "B", "B - A", "chance A", "chance B", "n_tokens A",
                                     "A 95% CI", "n_tokens B", "B 95% CI", "CIs overlap", "note"]
    first = changes.iloc[0]
    assert (first["chance A"], first["n_tokens B"], first["CIs overlap"]) == (0.2, "40", True)
    assert (changes["note"] == f"B: {FEW}").all()
    greyed = {int(r) for block in table.proto.arrow_data.styler.styles.split("}") if "#9a9a9a" in block
              for r in re.findall(r"row(\d+)_col", block)}
    assert greyed == set(range(len(changes)))
    # trajectories: CI bands, the shared chance line, and the step whose sample was too small
    traj = figs["cmp_traj"]["data"]
    assert [t["name"] for t in traj if t.get("name")] == ["L0 95% CI", "L0", "L1 95% CI", "L1", "chance 0.2"]
    assert arr(traj[1]["y"]) == pytest.approx([0.365, 0.465])  # mean over heads of the lower bounds
    assert f"kv_cka_act at step 200 rests on too few tokens: {FEW}" in [w.value for w in at.warning]


def test_two_chance_levels_get_a_colour_scale_each_centred_on_its_own(chance_run_db):
    """Two checkpoints read against different chance levels (two geometries: a llama2.c model at
    0.109 and a nanoGPT at 0.323 for kv_cka) shared one colour range centred on the median chance
    of all their cells, and plotly ignores ``zmid`` once ``zmin``/``zmax`` are set: B's values at
    its own chance were painted as far above it. Each heatmap is centred on its own chance now."""
    with Store(chance_run_db).transaction() as con:
        con.execute("UPDATE analysis_results SET chance = 0.4 WHERE checkpoint_id = 2 AND metric = 'kv_share_r2'")
    at = page_test("compare", {"a": "1", "b": "2", "metric": "kv_share_r2"}, timeout=ANALYSING_S).run()
    assert not at.exception, at.exception
    figs = figures(at)
    ha, hb = figs["cmp_heat_a"]["data"][0], figs["cmp_heat_b"]["data"][0]
    assert (ha["zmid"], hb["zmid"]) == (0.25, 0.4)
    assert ha["zmin"] + ha["zmax"] == pytest.approx(2 * 0.25) and hb["zmin"] + hb["zmax"] == pytest.approx(2 * 0.4)
    assert ("Each heatmap's colour scale is centred on its own chance level (A **chance 0.25**, B **chance 0.4**): "
            "white at chance, red above, blue below. The colours compare each checkpoint with its own chance, "
            "not A's values with B's.") in [c.value for c in at.caption]


# -- checkpoints grouped by their run's task ---------------------------------------------
def test_checkpoints_are_grouped_by_their_runs_task(tmp_path, monkeypatch):
    import json

    root = tmp_path / "runs"
    for r, name in enumerate(("lm-wd0.1", "vit-wd0.1")):
        run = root / name
        run.mkdir(parents=True)
        (run / "metrics.csv").write_text("step,train_loss\n0,4.0\n200,3.0\n")
        for i, step in enumerate((100, 200)):
            tiny_gpt2(run / f"step_{step}", seed=10 * r + i)     # four different files (one sha256 is one checkpoint)
    db = tmp_path / "tasks.duckdb"
    store = Store(db)
    report = ingest_paths(store, [root]).to_json()
    assert (report["errors"], report["added"]) == (0, 6), report
    with store.transaction() as con:          # the second run is a vision run (its config says so)
        [(rid, cfg)] = con.execute("SELECT id, config FROM runs WHERE name = 'vit-wd0.1'").fetchall()
        con.execute("UPDATE runs SET config = ? WHERE id = ?", [json.dumps(json.loads(cfg or "{}") | {"task": "image"}),
                                                                rid])
        vit = {r[0] for r in con.execute("SELECT id FROM checkpoints WHERE run_id = ?", [rid]).fetchall()}
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("compare", timeout=ANALYSING_S).run()
    assert not at.exception, at.exception
    task = at.selectbox(key="cmp_task")
    assert task.options == ["all tasks", "language", "image"] and task.value == "all"
    runs = at.selectbox(key="cmp_run")
    assert [o.endswith(" · language") for o in runs.options] == [True, False]    # language first, task named
    assert runs.options[1].startswith("vit-wd0.1 (2 checkpoints)") and runs.options[1].endswith(" · image")
    task.select("image").run()
    assert not at.exception, at.exception
    picked = at.selectbox(key="cmp_a")
    assert len(picked.options) == 2 and all(o.startswith("vit-wd0.1 · step") for o in picked.options)
    assert picked.value in vit and at.selectbox(key="cmp_b").value in vit
    headings = [m.value for m in at.markdown if m.value.startswith(("**A**", "**B**"))]
    assert len(headings) == 2 and all(h.endswith(" · image") and "vit-wd0.1" in h for h in headings)
