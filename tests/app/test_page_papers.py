"""Papers page in AppTest (claims beside measurements, URL keys) and in a real browser on the demo."""
from __future__ import annotations

import math

import pandas as pd
import pytest

import json

from analysis.registry import METRIC_VERSION, names
from app.plain import md
from loaders.store import Store, refresh_run_stats
from tests.app.apptest import page_test

#: The notes of a stored weights job of this fixture, which holds kv_cosine_flat rows at most:
#: every weight metric has rows or a note, so the job is current (app.state.current_notes).
NOTES = json.dumps({m: "not in this fixture" for m in names("weights")})

#: (run id, variant, n_kv_heads, weight decay, final val loss)
RUNS = [(1, "qkv", 4, 0.1, 1.30), (2, "qkv", 4, 0.1, 1.32), (3, "k_eq_v", 4, 0.1, 1.36), (4, "q_eq_k", 4, 0.1, 1.40)]


@pytest.fixture
def papers_db(tmp_path, monkeypatch):
    db = tmp_path / "papers.duckdb"
    store = Store(db)
    store.migrate()
    points = pd.DataFrame([(rid, step, "val/loss", final + (1.0 if step == 0 else 0.0))
                           for rid, _, _, _, final in RUNS for step in (0, 100)],
                          columns=["run_id", "step", "metric", "value"])
    with store.transaction() as con:
        for rid, variant, nkv, wd, _ in RUNS:
            con.execute("INSERT INTO runs (id, name, source, format, variant, n_kv_heads, weight_decay, config) "
                        "VALUES (?, ?, ?, 'csv', ?, ?, ?, '{\"n_head\": 4}')",
                        [rid, f"{variant}-{rid}", f"/s/{rid}", variant, nkv, wd])
            con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                        "n_kv_heads, d_model, d_head, attn_scale, run_id, step) "
                        "VALUES (?, 'gone', ?, 'qkvscope', ?, 1, 4, ?, 64, 16, 0.25, ?, 100)",
                        [rid, f"s{rid}", variant, nkv, rid])
            # a current job: every other weight metric is explained by a note (app.state.current_notes)
            con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version, notes) VALUES "
                        "(?, 'weights', ?, ?)", [rid, METRIC_VERSION, NOTES])
        # checkpoint 1 has chance levels, checkpoint 2 predates them (NULL)
        for cid, chance in ((1, 0.0), (2, None)):
            for head, value in ((0, 0.05), (1, -0.01)):
                con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, metric_version, "
                            "chance) VALUES (?, 0, ?, 'kv_cosine_flat', ?, ?, ?)", [cid, head, value, METRIC_VERSION, chance])
        con.register("p", points)
        con.execute("INSERT INTO points (run_id, step, metric, value) SELECT * FROM p")
        refresh_run_stats(con, [r[0] for r in RUNS])
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def _rows(at) -> pd.DataFrame:
    frame = pd.concat([t.value for t in at.table])
    return frame.rename(columns={"paper": "paper_value", "on this database": "measured", "chance level": "chance"})


def test_claims_sit_beside_measurements_with_chance_and_n(papers_db):
    at = page_test("papers").run()
    assert not at.exception, at.exception
    assert [s.value for s in at.subheader] == ["Query-free attention (arXiv 2510.23912)",
                                               "Projection sharing (arXiv 2606.04032)"]
    rows = _rows(at)
    cos = rows.loc["trained QKV models: K-V cosine similarity 0.73"]
    assert cos["paper_value"] == "0.73 cosine"
    # 4 heads of the two qkv checkpoints (k_eq_v left out; q_eq_k has none stored): median of 0.05, -0.01, 0.05, -0.01
    assert cos["measured"] == "flat cosine median 0.020 (range -0.010 to 0.050)"
    assert cos["chance"] == "flat cosine: 0.000"
    assert cos["n"] == "4 kv heads"
    kv = rows.loc["Q-K=V costs +3.1% validation perplexity at 300M (5.27 vs 5.11)"]
    assert kv["measured"].startswith(f"{100 * (math.exp(1.36 - 1.31) - 1):+.2f}% perplexity")
    assert kv["n"] == "1 runs (+2 qkv)"
    q = rows.loc["W_Q = identity removes 25% of the attention parameters"]
    assert q["measured"] == "MHA (4 of 4 KV heads): 25.0%"
    assert rows.loc["up to 67x cache reduction with Q-MQA", "measured"].startswith("64x")
    assert not at.info  # every compared checkpoint is analysed


def test_chance_not_computed_yet_on_an_older_database(papers_db):
    with Store(papers_db).transaction() as con:
        con.execute("UPDATE analysis_results SET chance = NULL")
    rows = _rows(page_test("papers").run())
    assert rows.loc["trained QKV models: K-V cosine similarity 0.73", "chance"] == \
        "flat cosine: chance not computed yet"


def test_selections_live_in_the_url(papers_db):
    at = page_test("papers", {"paper": "a"}).run()
    assert not at.exception
    assert [s.value for s in at.subheader] == ["Query-free attention (arXiv 2510.23912)"]
    at.radio(key="papers_paper").set_value("b").run()
    assert at.query_params["paper"] in ("b", ["b"])
    assert [s.value for s in at.subheader] == ["Projection sharing (arXiv 2606.04032)"]
    at.radio(key="papers_ckpts").set_value("all").run()
    assert at.query_params["ckpts"] in ("all", ["all"])
    at.radio(key="papers_paper").set_value("both").run()
    assert "paper" not in at.query_params


def test_a_bad_url_value_falls_back_to_the_default(papers_db):
    at = page_test("papers", {"paper": "z", "ckpts": "some"}).run()
    assert not at.exception
    assert len(at.subheader) == 2 and at.radio(key="papers_ckpts").value == "latest"


def test_unanalysed_checkpoints_get_a_button(papers_db):
    with Store(papers_db).transaction() as con:
        con.execute("DELETE FROM analysis_jobs WHERE checkpoint_id = 4")
    at = page_test("papers").run()
    assert at.info[0].value.startswith("1 of 4 compared checkpoints have no stored weight analysis yet")
    assert at.button(key="papers_analyse").label == "Analyse 1 checkpoints (weights)"
    # its file is gone: the button says so in one line and stays; the tables are still drawn
    at.button(key="papers_analyse").click().run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [md("checkpoint 4: gone: checkpoint 4 is stored but its file is gone; "
                                              "re-ingest it from its new place")]   # shown as text
    assert not at.success and at.button(key="papers_analyse").label == "Analyse 1 checkpoints (weights)"
    assert len(at.subheader) == 2


@pytest.mark.browser
@pytest.mark.slow
def test_papers_page_on_the_demo_in_a_real_browser(tmp_path, tmp_path_factory):
    """The demo with the checkpoints of three of its runs (qkv, k_eq_v and q_eq_k at weight decay
    0.1; every run's logs stay): the button analyses them from the page, and the tables are drawn again."""
    from tests.app.browser import browser_page, dashboard, screenshot, wait_idle
    from tests.demo_db import demo_db

    db = demo_db(tmp_path_factory, tmp_path / "demo.duckdb")
    with Store(db).transaction() as con:
        con.execute("DELETE FROM checkpoints WHERE run_id NOT IN (SELECT id FROM runs WHERE name IN "
                    "('qkv-mha-wd0.1', 'k_eq_v-mha-wd0.1', 'q_eq_k-mha-wd0.1'))")
    with dashboard(db, "--no-demo") as url, browser_page(viewport=(1400, 2200)) as page:
        page.goto(f"{url}/papers?ckpts=latest")
        wait_idle(page, timeout=120_000)
        page.get_by_text("Projection sharing (arXiv 2606.04032)").first.wait_for(timeout=60_000)
        assert page.locator("[data-testid='stTable']").count() == 2
        button = page.get_by_role("button", name="Analyse 3 checkpoints (weights)")
        button.click()
        wait_idle(page, timeout=300_000)
        page.get_by_text("Projection sharing (arXiv 2606.04032)").first.wait_for(timeout=60_000)
        assert page.get_by_role("button", name="Analyse 3 checkpoints (weights)").count() == 0
        page.get_by_text("Query-free attention (2510.23912)").click()
        wait_idle(page, timeout=60_000)
        assert "paper=a" in page.url
        assert page.locator("[data-testid='stTable']").count() == 1
        page.goto(f"{url}/papers")
        wait_idle(page, timeout=60_000)
        page.locator("[data-testid='stTable']").nth(1).wait_for(timeout=60_000)
        screenshot(page, "papers")


def test_papers_page_compares_within_each_project_never_across(papers_db):
    """A second project (an uploads folder holding a qkv run of the same name and a tokenizer-sized
    vocabulary) beside the first: the K-V figure is one median per project, the perplexity change
    is the per-token project's (the first project's runs record no vocabulary: unit unknown, named),
    and the project filter narrows both to the chosen project."""
    with Store(papers_db).transaction() as con:
        con.execute("UPDATE runs SET project = 'sweep'")
        con.execute("UPDATE checkpoints SET project = 'sweep'")
        for rid, variant, final in ((11, "qkv", 3.00), (12, "k_eq_v", 3.03)):
            con.execute("INSERT INTO runs (id, name, source, format, variant, n_kv_heads, weight_decay, config, project) "
                        "VALUES (?, ?, ?, 'csv', ?, 4, 0.1, '{\"n_head\": 4, \"vocab_size\": 50304}', 'uploads')",
                        [rid, f"{variant}-1", f"/u/{rid}", variant])
            con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, n_kv_heads, "
                        "d_model, d_head, attn_scale, run_id, step, project) "
                        "VALUES (?, 'gone', ?, 'qkvscope', ?, 1, 4, 4, 64, 16, 0.25, ?, 100, 'uploads')",
                        [rid, f"s{rid}", variant, rid])
            con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version, notes) VALUES "
                        "(?, 'weights', ?, ?)", [rid, METRIC_VERSION, NOTES])
            con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (?, 0, 'val/loss', ?), "
                        "(?, 100, 'val/loss', ?)", [rid, final + 1.0, rid, final])
        con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, metric_version, chance) "
                    "VALUES (11, 0, 0, 'kv_cosine_flat', 0.60, ?, 0.0)", [METRIC_VERSION])
        refresh_run_stats(con, [11, 12])
    rows = _rows(page_test("papers").run())
    cos = rows.loc["trained QKV models: K-V cosine similarity 0.73"]
    assert cos["measured"] == ("[project sweep, d_model 64, 1 layers, 4 heads] flat cosine median 0.020 (range -0.010 "
                               "to 0.050) | [project uploads, d_model 64, 1 layers, 4 heads] flat cosine median 0.600 "
                               "(range 0.600 to 0.600)")
    assert cos["n"] == "5 kv heads in 2 groups"
    kv = rows.loc["Q-K=V costs +3.1% validation perplexity at 300M (5.27 vs 5.11)"]
    assert kv["measured"] == f"{100 * (math.exp(0.03) - 1):+.2f}% perplexity per token (+1.00% final val/loss)"
    assert kv["paper's model"] == "300M (20 layers, d_model 1024, 16 heads)"
    assert kv["how to read it"].startswith("Project uploads, d_model ?, ? layers, 4 heads (MHA)")
    assert kv["how to read it"].endswith(f"Other groups: project sweep, d_model ?, ? layers, 4 heads: "
                                         f"{100 * (math.exp(0.05) - 1):+.2f}% unit unknown.")
    only = _rows(page_test("papers", {"project": "sweep"}).run())
    assert only.loc["trained QKV models: K-V cosine similarity 0.73", "measured"] == \
        "flat cosine median 0.020 (range -0.010 to 0.050)"
    assert only.loc["Q-K=V costs +3.1% validation perplexity at 300M (5.27 vs 5.11)", "measured"] == \
        f"{100 * (math.exp(0.05) - 1):+.2f}% perplexity unit unknown: not compared (+3.82% final val/loss)"


def test_the_authors_whole_layer_definitions_sit_beside_the_per_head_figures(papers_db):
    """Stored whole-layer rows of the two qkv checkpoints: the 0.6956 row states the authors'
    definition beside the measured mean over layers, and the 0.73 row keeps its per-head figures with
    the authors' figures after them."""
    with Store(papers_db).transaction() as con:
        for cid, values in ((1, (0.70, 0.60)), (2, (0.50, 0.40))):
            for layer, value in enumerate(values):
                con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, metric_version, "
                            "chance, n_tokens) VALUES (?, ?, NULL, 'kv_cka_layer_act', ?, ?, 0.3, 4096)",
                            [cid, layer, value, METRIC_VERSION])
    rows = _rows(page_test("papers").run())
    cka = rows.loc["trained QKV 300M model: linear CKA of a whole layer's K and V activations, averaged over "
                   "layers, 0.6956"]
    assert cka["paper_value"] == "0.6956 linear CKA, mean over layers"
    assert cka["measured"] == "whole-layer activation CKA mean over layers, median of 2 checkpoints 0.550 (range 0.450 to 0.650)"
    assert cka["chance"] == "whole-layer activation CKA: 0.300"
    assert "kv_similarity_llm.py" in cka["where stated"]
    assert "The authors' definition (kv_similarity_llm.py): per whole layer, the linear CKA" in cka["how to read it"]
    cos = rows.loc["trained QKV models: K-V cosine similarity 0.73"]
    assert cos["measured"] == ("flat cosine median 0.020 (range -0.010 to 0.050); authors' definitions "
                               "(kv_similarity_llm.py): whole-layer activation CKA mean over layers, median of 2 "
                               "checkpoints 0.550 (range 0.450 to 0.650)")
