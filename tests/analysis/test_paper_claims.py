"""The papers' claim catalogue and the measurements set beside each claim (known answers)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.kv_cost import Geometry
from analysis.paper_claims import (
    BY_KEY, CLAIMS, PAPER_A, PAPER_B, PAPERS, TABLE_COLUMNS, Claim, Inputs, geometry_savings, kv_saving, loss_unit,
    measure, relative_losses, sharing,
)
from analysis.presets import PRESETS

PAPERS_DOC = Path(__file__).resolve().parents[2] / "docs" / "guide" / "dashboard.md"   # the Papers page


def _inputs(checkpoints=None, results=None, runs=None, points=None) -> Inputs:
    ck_cols = ["id", "run_id", "step", "variant", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head",
               "attn_scale", "params_total", "params_attention", "kv_bytes_per_token", "project"]
    res_cols = ["checkpoint_id", "variant", "layer", "head", "metric", "value", "chance", "n_tokens", "ci_low",
                "ci_high"]
    run_cols = ["run_id", "name", "project", "variant", "n_kv_heads", "n_heads", "d_model", "n_layers", "weight_decay",
                "seed", "mlp_ratio", "config", "final", "loss_unit"]
    return Inputs(checkpoints=pd.DataFrame(checkpoints or [], columns=ck_cols),
                  results=pd.DataFrame(results or [], columns=res_cols),
                  runs=pd.DataFrame(runs or [], columns=run_cols),
                  points=pd.DataFrame(points or [], columns=["run_id", "step", "value"]))


def test_catalogue_holds_the_papers_numbers():
    assert len({c.key for c in CLAIMS}) == len(CLAIMS)
    assert {c.arxiv for c in CLAIMS} == set(PAPERS) == {PAPER_A, PAPER_B}
    expected = {"a_attention_params": 25.0, "a_weight_decay": 0.03125, "a_attn_scale": 0.5, "a_mlp_wider": 4.5,
                "a_mlp_narrower": 3.5, "a_stable_lower_wd": 3.2, "b_kv_cosine": 0.73, "b_ppl_kv_300m": 3.1,
                "b_ppl_kv_1_2b": 2.48, "b_ppl_qk": 4.9, "b_ppl_qkv_tied": 25.4, "b_cache_kv": 50.0,
                "b_cache_q_mqa": 96.9, "b_cache_67x": 67.0}
    assert {k: BY_KEY[k].value for k in expected} == expected
    for c in CLAIMS:
        assert c.where and c.units and c.claim
        assert "Table" not in c.where or "README" in c.where  # table numbers only as the paper's repository README states them


def test_sharing_kinds():
    assert [sharing(16, 16), sharing(16, 4), sharing(16, 1), sharing(None, 4), sharing(float("nan"), 2.0),
            sharing(4, 2.0)] == ["MHA", "GQA-4", "MQA", "?", "?", "GQA-2"]


def _ck(cid, variant, nh, nkv, d=64, dh=16, **kw):
    row = {"id": cid, "run_id": None, "step": None, "variant": variant, "n_layers": 2, "n_heads": nh,
           "n_kv_heads": nkv, "d_model": d, "d_head": dh, "attn_scale": 1 / math.sqrt(dh), "params_total": None,
           "params_attention": None, "kv_bytes_per_token": None}
    row.update(kw)
    return row


def test_query_free_saving_is_25_percent_for_mha_only():
    # Llama-3-8B's attention shapes: 32 heads, 8 KV heads of 128, d_model 4096
    frame = pd.DataFrame([_ck(1, "qkv", 4, 4), _ck(2, "qkv", 32, 8, d=4096, dh=128), _ck(3, "qkv", 4, 1),
                          _ck(4, "wq_identity", 4, 4)])
    geo = geometry_savings(frame).set_index(["n_heads", "n_kv_heads"])
    assert geo.loc[(4, 4), "wq_share"] == pytest.approx(0.25, abs=1e-15)
    assert geo.loc[(4, 4), "n_checkpoints"] == 2
    assert geo.loc[(32, 8), "wq_share"] == pytest.approx(32 / 80, abs=1e-15)  # 40%
    assert geo.loc[(4, 1), "wq_share"] == pytest.approx(4 / 10, abs=1e-15)
    assert geo.loc[(4, 4), "wv_share"] == pytest.approx(1 / 3)
    assert geo.loc[(32, 8), "wv_share"] == pytest.approx(8 / 48)


def test_query_free_saving_counts_biases_from_the_stored_attention_parameters():
    # GPT-2 style biases everywhere: per layer 4 d^2 + 3 d (q, k, v) + d (o); W_Q = I removes d^2 + d
    d, layers = 64, 2
    attn = layers * (4 * d * d + 4 * d)
    geo = geometry_savings(pd.DataFrame([_ck(1, "qkv", 4, 4, params_total=10 ** 6, params_attention=attn)]))
    assert geo["wq_share"].iloc[0] == pytest.approx((d * d + d) / (4 * d * d + 4 * d), abs=1e-15)


def test_kv_saving_matches_the_papers_300m_figures():
    g = PRESETS["projection-sharing-300m"]
    assert kv_saving(g, "k_eq_v", 16) == 0.5
    assert kv_saving(g, "qkv", 4) == 0.75
    assert kv_saving(g, "k_eq_v", 4) == 0.875
    assert kv_saving(g, "k_eq_v", 1) == 0.96875


def _runs():
    rows = []
    rid = 0
    for variant, nkv, wd, final in [("qkv", 4, 0.1, 1.30), ("qkv", 4, 0.1, 1.32), ("qkv", 4, 0.0, 1.28),
                                    ("k_eq_v", 4, 0.1, 1.36), ("k_eq_v", 4, 0.0, 1.33), ("k_eq_v", 4, 0.03, 1.35),
                                    ("k_eq_v", 1, 0.1, 1.40), ("q_eq_k", 4, 0.1, float("inf"))]:
        rid += 1
        rows.append({"run_id": rid, "name": f"r{rid}", "variant": variant, "n_kv_heads": nkv, "n_heads": 4,
                     "weight_decay": wd, "seed": rid, "mlp_ratio": 4.0, "config": {}, "final": final,
                     "loss_unit": "token"})
    return rows


def test_relative_losses_known_answer():
    rel = relative_losses(pd.DataFrame(_runs())).set_index(["variant", "sharing"])
    # k_eq_v MHA: wd 0.1 against mean(1.30, 1.32) = 1.31, wd 0 against 1.28; wd 0.03 has no baseline
    row = rel.loc[("k_eq_v", "MHA")]
    assert row["rel_ppl"] == pytest.approx(np.mean([math.exp(1.36 - 1.31) - 1, math.exp(1.33 - 1.28) - 1]), rel=1e-12)
    assert row["rel_loss"] == pytest.approx(np.mean([1.36 / 1.31 - 1, 1.33 / 1.28 - 1]), rel=1e-12)
    assert row["n_runs"] == 2 and row["n_base"] == 3
    assert sorted(row["weight_decays"]) == [0.0, 0.1]
    assert rel.loc[("k_eq_v", "MQA"), "rel_ppl"] == pytest.approx(math.exp(1.40 - 1.31) - 1, rel=1e-12)
    assert row["seed_spread_ppl"] == pytest.approx(math.exp(0.02) - 1, rel=1e-9)
    assert ("q_eq_k", "MHA") not in rel.index  # its only run diverged (inf): no finite final


def test_relative_losses_names_missing_columns():
    with pytest.raises(AnalysisError) as err:
        relative_losses(pd.DataFrame({"variant": ["qkv"], "final": [1.0]}))
    assert str(err.value) == ("relative_losses: runs frame lacks columns ['n_heads', 'n_kv_heads', 'weight_decay']; "
                              "found ['final', 'variant']")


def test_measure_on_an_empty_database_keeps_every_claim():
    table = measure(_inputs())
    assert list(table.columns) == TABLE_COLUMNS
    assert table["key"].tolist() == [c.key for c in CLAIMS]
    t = table.set_index("key")
    assert t.loc["b_kv_cosine", "measured"] is None
    assert t.loc["b_ppl_kv_300m", "measured"] is None
    assert t.loc["b_ppl_kv_300m", "reading"] == ("No k_eq_v MHA runs beside qkv MHA runs of their own project and "
                                                 "geometry at the same weight decay.")
    # calculator figures need no data
    assert t.loc["b_cache_67x", "measured"].startswith("64x on projection-sharing-1.2b")
    assert "67.1" in t.loc["b_cache_67x", "measured"]
    assert "MiB" in t.loc["b_cache_67x", "reading"] and "MB" in t.loc["b_cache_67x", "reading"]
    assert t.loc["b_cache_q_mqa", "measured"] == "tool calculator on projection-sharing-300m: 96.875%"
    assert t.loc["a_nonembedding_params", "measured"].startswith("8.3")


def test_measure_rejects_an_unknown_measurement():
    bad = Claim("x", PAPER_A, "c", 1.0, "u", "abstract", "nope")
    with pytest.raises(AnalysisError) as err:
        measure(_inputs(), claims=[bad])
    assert str(err.value).startswith("claim 'x': unknown measurement 'nope'; expected one of attn_scale, ")


def test_kv_similarity_leaves_out_tied_variants_and_says_when_chance_is_missing():
    results = [
        # checkpoint 1 (qkv): two kv heads, no chance stored (an older database)
        (1, "qkv", 0, 0, "kv_cosine_flat", 0.02, None, None, None, None),
        (1, "qkv", 0, 1, "kv_cosine_flat", -0.04, None, None, None, None),
        (1, "qkv", 0, 0, "kv_cka", 0.30, None, None, None, None),
        (1, "qkv", 0, 1, "kv_cka", 0.10, None, None, None, None),
        # checkpoint 2 (k_eq_v): 1 by construction, left out
        (2, "k_eq_v", 0, 0, "kv_cosine_flat", 1.0, 0.0, None, None, None),
    ]
    data = _inputs(checkpoints=[_ck(1, "qkv", 2, 2), _ck(2, "k_eq_v", 2, 2)], results=results)
    row = measure(data).set_index("key").loc["b_kv_cosine"]
    assert row["measured"] == ("flat cosine median -0.010 (range -0.040 to 0.020); "
                               "CKA median 0.200 (range 0.100 to 0.300)")
    assert row["chance"] == "flat cosine: chance not computed yet; CKA: chance not computed yet"
    assert row["n"] == "2 kv heads"
    data.results.loc[data.results["metric"] == "kv_cka", "chance"] = [0.21, 0.19]
    row = measure(data).set_index("key").loc["b_kv_cosine"]
    assert row["chance"] == "flat cosine: chance not computed yet; CKA: 0.200"
    assert "basis" in row["reading"]


def test_relative_loss_rows_carry_n_and_seed_spread():
    row = measure(_inputs(runs=_runs())).set_index("key").loc["b_ppl_kv_300m"]
    expected = np.mean([math.exp(1.36 - 1.31) - 1, math.exp(1.33 - 1.28) - 1])
    assert row["measured"].startswith(f"{100 * expected:+.2f}% perplexity")
    assert row["n"] == "2 runs (+3 qkv)"
    assert row["chance"] == f"no chance level; seed spread of qkv {100 * (math.exp(0.02) - 1):+.2f}%"


def test_attention_scale_relative_to_the_usual_one():
    data = _inputs(checkpoints=[_ck(1, "wq_identity", 4, 4, attn_scale=1 / (2 * math.sqrt(16))), _ck(2, "qkv", 4, 4)])
    row = measure(data).set_index("key").loc["a_attn_scale"]
    assert row["measured"] == "scale x sqrt(d_head) by variant: qkv: 1; wq_identity: 0.5"


def test_weight_decay_stability_uses_the_weight_decay_statistics():
    runs, points = [], []
    for rid, (variant, wd, final) in enumerate([("wq_identity", 0.01, 3.0), ("wq_identity", 0.03125, 2.9),
                                                 ("wq_identity", 0.1, 3.1), ("qkv", 0.01, 3.2), ("qkv", 0.03125, 3.1),
                                                 ("qkv", 0.1, 3.0)], start=1):
        runs.append({"run_id": rid, "name": f"r{rid}", "variant": variant, "n_kv_heads": 4, "n_heads": 4,
                     "weight_decay": wd, "seed": 1, "mlp_ratio": None, "config": {}, "final": final})
        points += [(rid, 0, final + 1.0), (rid, 100, final)]
    row = measure(_inputs(runs=runs, points=points)).set_index("key").loc["a_stable_lower_wd"]
    assert "wq_identity [all]: best wd 0.03125" in row["measured"]
    assert "qkv [all]: best wd 0.1" in row["measured"]
    assert "best-wd ratio qkv / wq_identity 3.2" in row["measured"]
    assert row["n"] == "6 runs"


def test_the_papers_page_doc_states_the_catalogue_numbers():
    text = PAPERS_DOC.read_text()
    for key in ("b_ppl_kv_300m", "b_ppl_kv_1_2b", "b_ppl_qk", "b_ppl_qkv_tied"):
        assert f"+{BY_KEY[key].value:g}%" in text, key
    assert "MiB against MB" in text and "GiB against GB" not in text
    assert "0.73" in text


# -- like with like: one figure per project and geometry, the claim's head-sharing class, per token only --

def test_loss_unit_from_the_config():
    assert [loss_unit(256), loss_unit(50304), loss_unit(None, "gpt2"), loss_unit(None), loss_unit("n/a"),
            loss_unit(128, None)] == ["byte", "token", "token", "?", "?", "byte"]


def _run(rid, project, variant, nkv, wd, final, d=64, unit="token", nh=4):
    return {"run_id": rid, "name": "lightning_logs/version_0", "project": project, "variant": variant,
            "n_kv_heads": nkv, "n_heads": nh, "d_model": d, "n_layers": 4, "weight_decay": wd, "seed": 1,
            "mlp_ratio": None, "config": {}, "final": final, "loss_unit": unit}


#: Two projects with runs of the same folder name; sweep-a holds two geometries; sweep-b is byte-level.
SEVERAL = [_run(1, "sweep-a", "qkv", 4, 0.1, 2.00), _run(2, "sweep-a", "k_eq_v", 4, 0.1, 2.10),
           _run(3, "sweep-a", "qkv", 4, 0.1, 1.50, d=128), _run(4, "sweep-a", "k_eq_v", 4, 0.1, 1.52, d=128),
           _run(5, "sweep-a", "k_eq_v", 4, 0.1, 1.53, d=128),
           _run(6, "sweep-b", "qkv", 4, 0.1, 1.00, unit="byte"), _run(7, "sweep-b", "k_eq_v", 4, 0.1, 1.50, unit="byte"),
           _run(8, "sweep-a", "k_eq_v", 2, 0.1, 2.20)]


def test_relative_losses_never_pool_projects_geometries_or_units():
    rel = relative_losses(pd.DataFrame(SEVERAL))
    got = {(r["project"], r["loss_unit"], r["d_model"], r["sharing"]): (round(r["rel_ppl"], 12), r["n_runs"], r["n_base"])
           for r in rel[rel["variant"] == "k_eq_v"].to_dict("records")}
    assert got == {("sweep-a", "token", 64, "MHA"): (round(math.exp(0.10) - 1, 12), 1, 1),
                   ("sweep-a", "token", 64, "GQA-2"): (round(math.exp(0.20) - 1, 12), 1, 1),
                   ("sweep-a", "token", 128, "MHA"): (round(math.exp(1.525 - 1.50) - 1, 12), 2, 1),
                   ("sweep-b", "byte", 64, "MHA"): (round(math.exp(0.50) - 1, 12), 1, 1)}


def test_perplexity_claim_takes_one_per_token_group_and_names_the_others():
    row = measure(_inputs(runs=SEVERAL)).set_index("key").loc["b_ppl_kv_300m"]
    # the per-token group with most runs (sweep-a at d_model 128: 2 runs) stands; no mean across groups
    assert row["measured"] == f"{100 * (math.exp(0.025) - 1):+.2f}% perplexity per token ({100 * (1.525 / 1.5 - 1):+.2f}% final val/loss)"
    assert row["n"] == "2 runs (+1 qkv)"
    assert row["reading"].startswith("Project sweep-a, d_model 128, 4 layers, 4 heads (MHA), against qkv MHA runs")
    assert "the paper's model: 300M (20 layers, d_model 1024, 16 heads)" in row["reading"]
    assert row["reading"].endswith(f" Other groups: project sweep-a, d_model 64, 4 layers, 4 heads: "
                                   f"{100 * (math.exp(0.1) - 1):+.2f}% per token; project sweep-b, d_model 64, 4 layers, "
                                   f"4 heads: {100 * (math.exp(0.5) - 1):+.2f}% per byte.")


def test_a_per_byte_loss_is_shown_but_not_compared():
    row = measure(_inputs(runs=[r for r in SEVERAL if r["project"] == "sweep-b"])).set_index("key").loc["b_ppl_kv_300m"]
    assert row["measured"] == f"{100 * (math.exp(0.5) - 1):+.2f}% perplexity per byte: not compared (+50.00% final val/loss)"
    assert "The paper's perplexity is per token" in row["reading"]


def test_gqa_2_runs_never_stand_for_a_gqa_4_claim():
    t = measure(_inputs(runs=SEVERAL)).set_index("key")
    assert t.loc["b_ppl_q_gqa", "measured"] is None
    assert t.loc["b_ppl_q_gqa", "reading"] == (
        "No k_eq_v GQA-4 runs beside qkv MHA runs of their own project and geometry at the same weight decay. "
        "Runs of k_eq_v with GQA-2, MHA exist: another head-sharing class than the claim's GQA-4, so not compared.")
    gqa4 = [*SEVERAL, _run(9, "sweep-a", "k_eq_v", 4, 0.1, 2.30, nh=16), _run(10, "sweep-a", "qkv", 16, 0.1, 2.0, nh=16)]
    assert t.loc["b_ppl_q_gqa", "model"] == "300M (20 layers, d_model 1024, 16 heads)"
    row = measure(_inputs(runs=gqa4)).set_index("key").loc["b_ppl_q_gqa"]
    assert row["measured"].startswith(f"{100 * (math.exp(0.3) - 1):+.2f}% perplexity per token")


def test_kv_similarity_is_one_figure_per_project_and_geometry_of_mha_checkpoints():
    cks = [_ck(1, "qkv", 4, 4, project="demo"), _ck(2, "qkv", 4, 4, project="uploads"),
           _ck(3, "qkv", 4, 4, d=128, dh=32, project="demo"), _ck(4, "qkv", 4, 2, project="demo")]
    results = [(1, "qkv", 0, 0, "kv_cka", 0.10, 0.2, None, None, None), (1, "qkv", 0, 1, "kv_cka", 0.20, 0.2, None, None, None),
               (2, "qkv", 0, 0, "kv_cka", 0.90, 0.3, None, None, None),
               (3, "qkv", 0, 0, "kv_cka", 0.50, 0.1, None, None, None),
               (4, "qkv", 0, 0, "kv_cka", 0.99, 0.5, None, None, None)]     # GQA-2: not the claim's MHA
    row = measure(_inputs(checkpoints=cks, results=results)).set_index("key").loc["b_kv_cosine"]
    assert row["measured"] == ("[project demo, d_model 64, 2 layers, 4 heads] CKA median 0.150 (range 0.100 to 0.200)"
                               " | [project demo, d_model 128, 2 layers, 4 heads] CKA median 0.500 (range 0.500 to 0.500)"
                               " | [project uploads, d_model 64, 2 layers, 4 heads] CKA median 0.900 (range 0.900 to 0.900)")
    assert row["chance"] == ("[project demo, d_model 64, 2 layers, 4 heads] CKA: 0.200 | [project demo, d_model 128, "
                             "2 layers, 4 heads] CKA: 0.100 | [project uploads, d_model 64, 2 layers, 4 heads] CKA: 0.300")
    assert row["n"] == "4 kv heads in 3 groups"
    assert row["reading"].startswith("One figure per project and geometry, never pooled. Per kv head of MHA")


def test_kv_erank_compares_whole_layer_caches_with_the_per_head_ranks_beside():
    cks = [_ck(1, "qkv", 4, 4, project="demo"), _ck(2, "qkv", 4, 2, project="demo")]
    results = [(1, "qkv", 0, None, "erank_kcache_layer", 40.0, 50.0, 4096, None, None),
               (1, "qkv", 1, None, "erank_kcache_layer", 44.0, 52.0, 4096, None, None),
               (1, "qkv", 0, None, "erank_vcache_layer", 42.0, 50.0, 4096, None, None),
               (1, "qkv", 1, None, "erank_vcache_layer", 46.0, 52.0, 4096, None, None),
               (1, "qkv", 0, 0, "erank_kcache", 10.0, 12.0, 4096, None, None),
               (1, "qkv", 0, 1, "erank_kcache", 12.0, 12.0, 4096, None, None),
               (1, "qkv", 0, 0, "erank_vcache", 11.0, 12.0, 4096, None, None),
               (1, "qkv", 0, 1, "erank_vcache", 13.0, 12.0, 4096, None, None),
               (2, "qkv", 0, None, "erank_kcache_layer", 30.0, 30.0, 4096, None, None),   # GQA-2: left out
               (2, "qkv", 0, None, "erank_vcache_layer", 31.0, 30.0, 4096, None, None)]
    row = measure(_inputs(checkpoints=cks, results=results)).set_index("key").loc["b_kv_erank"]
    assert row["measured"] == ("K cache 42.0 vs V cache 44.0 of 64 (0.656, 0.688 of the width), mean over layers; "
                               "beside it per head K 11.0 vs V 12.0 of 16 (medians over 2 kv heads)")
    assert row["chance"] == "51.0 of 64 (0.797)"
    assert row["n"] == "2 layers"
    assert "on 4,096 tokens" in row["reading"] and "687 or 702" in row["reading"]
    only_gqa = measure(_inputs(checkpoints=cks, results=results[8:])).set_index("key").loc["b_kv_erank"]
    assert only_gqa["measured"] is None and "--activations" in only_gqa["reading"]


def test_the_authors_layer_cka_is_a_mean_over_layers_beside_the_per_head_cka():
    cks = [_ck(1, "qkv", 4, 4), _ck(2, "qkv", 4, 4), _ck(3, "k_eq_v", 4, 4)]
    results = [(1, "qkv", 0, None, "kv_cka_layer_act", 0.70, 0.30, 4096, None, None),
               (1, "qkv", 1, None, "kv_cka_layer_act", 0.60, 0.32, 4096, None, None),
               (1, "qkv", 0, 0, "kv_cka_act", 0.20, 0.10, 4096, None, None),
               (1, "qkv", 0, 1, "kv_cka_act", 0.40, 0.10, 4096, None, None),
               (3, "k_eq_v", 0, None, "kv_cka_layer_act", 1.0, 0.30, 4096, None, None)]   # tied: left out
    data = _inputs(checkpoints=cks, results=results)
    t = measure(data).set_index("key")
    row = t.loc["b_kv_cka_layer"]
    assert row["paper_value"] == "0.6956" and "kv_similarity_llm.py" in row["where"]
    assert row["measured"] == ("whole-layer activation CKA mean over 2 layers 0.650 (layers 0.600 to 0.700); "
                               "beside it per-head CKA on activations median 0.300 (range 0.200 to 0.400)")
    assert row["chance"] == "whole-layer activation CKA: 0.310; per-head CKA on activations: 0.100"
    assert row["n"] == "2 layers of 1 checkpoints"
    assert "The authors' definition (kv_similarity_llm.py): per whole layer" in row["reading"]
    assert "on 4,096 tokens" in row["reading"]
    # the 0.73 row keeps its per-head figures, the authors' definition beside them
    assert t.loc["b_kv_cosine", "measured"] == (
        "CKA on activations median 0.300 (range 0.200 to 0.400); authors' definitions (kv_similarity_llm.py): "
        "whole-layer activation CKA mean over 2 layers 0.650 (layers 0.600 to 0.700)")
    # a second checkpoint of the same project and geometry: the median of the checkpoints' layer means
    data.results.loc[len(data.results)] = (2, "qkv", 0, None, "kv_cka_layer_act", 0.90, 0.30, 4096, None, None)
    row = measure(data).set_index("key").loc["b_kv_cka_layer"]
    assert row["measured"].startswith("whole-layer activation CKA mean over layers, median of 2 checkpoints 0.775 "
                                      "(range 0.650 to 0.900)")
    # nothing stored for the weight cosine: how to measure it
    cos = t.loc["b_kv_cos_layer"]
    assert cos["measured"] is None and cos["paper_value"] == "0"
    assert cos["reading"].startswith("No kv_cosine_layer stored for MHA checkpoints with separate K and V: analyse "
                                     "the checkpoints (button above).")


def test_kv_cache_per_user_on_the_papers_1_2b_geometry():
    row = measure(_inputs()).set_index("key").loc["b_cache_per_user"]
    # 22 layers x 2 x 2048 x 2 bytes x 32768 tokens = 5.906e9 B; Q-MQA 22 x 64 x 2 x 32768 = 92.27e6 B = 88 MiB
    assert row["measured"] == ("tool calculator on projection-sharing-1.2b, bf16, 32,768 tokens: QKV 5.91 GB "
                               "(5.50 GiB) -> Q-K=V with 1 KV head 92.3 MB (88.0 MiB); 64x")
    assert BY_KEY["b_cache_per_user"].value == 88.0 and "transformer_QMQA_1_2B.py" in BY_KEY["b_cache_per_user"].where
    assert row["model"] == "1.2B (22 layers, d_model 2048, 32 heads)"


def test_every_claim_states_its_model():
    assert all(c.model for c in CLAIMS)
