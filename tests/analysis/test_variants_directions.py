"""The two dependency-free leaves: variant facts and metric directions."""
import math

import pytest

from analysis import directions, variants


def test_every_variant_has_a_label_and_a_colour():
    for v in variants.ALL_VARIANTS + (variants.UNKNOWN,):
        assert v in variants.LABELS and v in variants.COLORS
    assert len(set(variants.COLORS.values())) == len(variants.COLORS)


@pytest.mark.parametrize("variant,cached", [("qkv", 2), ("wq_identity", 2), ("q_eq_k", 2),
                                            ("k_eq_v", 1), ("q_eq_k_eq_v", 1), ("q_eq_k_plus", 2),
                                            ("q_eq_k_eq_v_plus", 1)])
def test_n_cached(variant, cached):
    assert variants.n_cached(variant) == cached


@pytest.mark.parametrize("h,kv,name", [(8, 8, "MHA"), (8, 1, "MQA"), (8, 2, "GQA-2"), (32, 8, "GQA-8"),
                                       (None, 2, "?")])
def test_sharing(h, kv, name):
    assert variants.sharing(h, kv) == name


@pytest.mark.parametrize("metric,way", [
    ("val/loss", "min"), ("train/loss", "min"), ("val/ppl", "min"), ("val_loss", "min"),
    ("val/accuracy", "max"), ("val_top1", "max"), ("val_top5", "max"), ("eval/auroc", "max"),
    ("val/acc@1", "max"), ("error_rate", "min"), ("val/bpb", "min"), ("lr", "min"),
    ("Accuracy/val", "max"), ("loss/accuracy", "min"), ("val/top_1", "max"), ("acc1", "max"),
    ("train/tokens_per_sec", "max"), ("val/wer", "min"),
])
def test_direction_by_name(metric, way):
    assert directions.direction(metric) == way


def test_override_wins_and_best_follows_direction():
    assert directions.direction("val/loss", {"val/loss": "max"}) == "max"
    assert directions.best([0.5, float("nan"), 0.9, None], "val/accuracy") == 0.9
    assert directions.best([0.5, 0.9], "val/loss") == 0.5
    assert directions.best([math.nan], "val/loss") is None


def test_plus_variants_share_their_base_projections():
    assert variants.base("q_eq_k_plus") == "q_eq_k" and variants.base("qkv") == "qkv"
    for plus, b in variants.PLUS.items():
        assert (plus in variants.Q_TIED) == (b in variants.Q_TIED)
        assert (plus in variants.KV_TIED) == (b in variants.KV_TIED)
    assert variants.label("q_eq_k_eq_v_plus") == "(Q=K=V)+"


def test_kv_bytes_formula_is_written_once():
    """DESIGN.md's n_layers * n_cached * n_kv_heads * d_head * bytes, and its callers agree with it."""
    from analysis.results_table import kv_bytes_per_token as table_bytes
    from experiments.config import GPTConfig

    assert variants.kv_bytes_per_token("qkv", 32, 8, 128, 2) == 32 * 2 * 8 * 128 * 2
    assert variants.kv_bytes_per_token("k_eq_v", 32, 8, 128, 2) == 32 * 1 * 8 * 128 * 2
    assert variants.kv_bytes_per_token("q_eq_k_eq_v_plus", 2, 1, 16, 4) == 2 * 1 * 1 * 16 * 4
    assert table_bytes("k_eq_v", 4, 2, 16, 2) == 4 * 1 * 2 * 16 * 2
    cfg = GPTConfig(n_layer=4, n_head=4, n_kv_heads=2, d_model=64, variant="q_eq_k")
    assert cfg.kv_bytes_per_token(2) == 4 * 2 * 2 * 16 * 2
