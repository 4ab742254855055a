"""The KV-cost page in Streamlit's AppTest: URL state in and out, figures, plots, errors."""
from __future__ import annotations

import pytest

from app.pages import kv_cost
from loaders.store import Store
from tests.app.apptest import page_test


@pytest.fixture(autouse=True)
def empty_db(tmp_path, monkeypatch):
    db = tmp_path / "kv.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def test_page_protocol():
    assert (kv_cost.TITLE, kv_cost.ICON, kv_cost.ORDER, kv_cost.URL_PATH) == (
        "KV cache & serving cost", ":material/memory:", 60, "kv-cost")
    assert callable(kv_cost.render)


def test_url_state_drives_the_figures_and_is_written_back():
    at = page_test("kv_cost", {"preset": "projection-sharing-300m", "variant": "k_eq_v", "kvh": "1",
                               "ctx": "2048"})
    at.run()
    assert not at.exception
    assert at.metric[0].value == "2.50 KiB"  # 20 layers * 1 * 1 KV head * 64 * 2 B = 2560 B
    assert at.metric[0].delta == "-96.9%"
    qp = dict(at.query_params)
    assert (qp["preset"], qp["variant"], qp["kvh"], qp["ctx"]) == ("projection-sharing-300m", "k_eq_v", "1", "2048")
    table = at.dataframe[0].value
    assert table["label"].iloc[0] == "Q-K-V, MHA"  # the baseline row comes first
    assert "Q-K=V, MQA" in set(table["label"])
    assert len(at.get("plotly_chart")) == 3
    assert len(at.get("download_button")) == 1
    working = at.dataframe[1].value
    assert working.loc[working["step"] == "KV bytes per token", "with numbers"].iloc[0] == (
        "20 * 1 * 1 * 64 * 2 = 2,560.0 B (2.500 KiB)")


def test_changing_a_widget_updates_the_url():
    at = page_test("kv_cost", {"preset": "llama-3-8b"})
    at.run()
    at.selectbox(key="kv_variant").set_value("k_eq_v").run()
    assert not at.exception
    assert at.query_params["variant"] == "k_eq_v"
    assert at.metric[0].value == "64.00 KiB"


def test_bad_link_values_are_named_not_guessed():
    at = page_test("kv_cost", {"preset": "llama-3-8b", "ctx": "lots", "kvh": "5", "gpu": "tpu"})
    at.run()
    assert not at.exception
    warning = at.warning[0].value
    assert "ctx='lots' (expected an integer)" in warning
    assert "kvh=5 (must divide n_heads=32)" in warning
    assert "gpu='tpu' (expected one of" in warning


def test_weights_that_do_not_fit_say_so():
    at = page_test("kv_cost", {"preset": "llama-2-70b", "gpu": "l4"})
    at.run()
    assert not at.exception
    assert at.metric[2].value == "0"
    assert at.metric[4].value == "n/a"


def test_typed_geometry_and_checkpoint_source_without_checkpoints():
    at = page_test("kv_cost", {"src": "typed", "layers": "4", "heads": "8", "nkv": "2", "dhead": "16",
                               "dmodel": "128"})
    at.run()
    assert not at.exception
    assert at.metric[0].value == f"{4 * 2 * 2 * 16 * 2 / 1024:,.2f} KiB"
    at = page_test("kv_cost", {"src": "checkpoint"})
    at.run()
    assert not at.exception
    assert any("No stored checkpoints" in i.value for i in at.info)


@pytest.mark.slow
def test_stored_checkpoint_geometry(tmp_path, empty_db):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from loaders.ingest import ingest_paths

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64,
                               n_positions=64)).save_pretrained(tmp_path / "tiny")
    ingest_paths(Store(empty_db), [tmp_path / "tiny"])
    (row,) = Store(empty_db).checkpoints()
    at = page_test("kv_cost", {"src": "checkpoint", "kvdtype": "fp32"})
    at.run()
    assert not at.exception
    assert at.query_params["ckpt"] == str(row["id"])
    # 2 layers * 2 * 4 heads * d_head 8 * 4 B = 512 B
    assert at.metric[0].value == "0.50 KiB"
    working = at.dataframe[1].value
    assert working.loc[working["step"] == "parameters", "with numbers"].iloc[0].startswith(
        f"{row['params_total']:,} of which attention {row['params_attention']:,}")
