"""The KV-cost page in Streamlit's AppTest: URL state in and out, figures, plots, errors."""
from __future__ import annotations

import json
import math

import pytest
from streamlit.proto.Metric_pb2 import Metric as MetricProto

from app.pages import kv_cost
from app.plain import md
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
    assert len(at.get("plotly_chart")) == 4
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
    assert md("ctx='lots' (expected an integer)") in warning      # link values shown as text
    assert md("kvh=5 (must divide n_heads=32)") in warning
    assert md("gpu='tpu' (expected one of") in warning


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


def _metric(at, label):
    (m,) = [m for m in at.metric if m.label == label]
    return m


def test_a_drop_in_throughput_is_red_and_points_down():
    """Issue 17: at 100,000 users with no batch cap, K=V + MQA needs 62 GPUs instead of 1,000, so
    total tokens/s falls: the delta must read as a drop (down, red), while the GPUs, bytes and
    dollars that fall are drops for the better (down, green)."""
    at = page_test("kv_cost", {"preset": "llama-3-8b", "variant": "k_eq_v", "kvh": "1", "users": "100000",
                               "maxbatch": "0"})
    at.run()
    assert not at.exception
    rate = _metric(at, "Decode tokens/s")
    assert rate.delta.startswith("-") and rate.delta.endswith("x)")
    assert rate.proto.color == MetricProto.MetricColor.RED
    assert rate.proto.direction == MetricProto.MetricDirection.DOWN
    for label in ("KV per token", "GPUs needed", "USD per month"):
        m = _metric(at, label)
        assert m.delta.startswith("-"), label
        assert m.proto.color == MetricProto.MetricColor.GREEN, label  # lower is better
        assert m.proto.direction == MetricProto.MetricDirection.DOWN, label
    per_gpu = _metric(at, "Tokens/s per GPU")
    assert per_gpu.delta.startswith("+") and per_gpu.proto.color == MetricProto.MetricColor.GREEN
    assert per_gpu.proto.direction == MetricProto.MetricDirection.UP
    assert _metric(at, "GPUs needed").value == "62"  # ceil(100,000 / 1,622 users per GPU)
    assert _metric(at, "Users per GPU (memory)").delta == "+1,522% (16.22x)"  # 1,622 against 100
    assert at.query_params["maxbatch"] == "0"


def test_gpus_needed_follow_the_batch_cap_and_are_in_the_table():
    at = page_test("kv_cost", {"preset": "llama-3-8b", "users": "100000", "maxbatch": "64"})
    at.run()
    assert not at.exception
    # 100 users' caches fit a GPU, the cap is 64: ceil(100,000 / min(64, 100))
    assert _metric(at, "GPUs needed").value == f"{math.ceil(100_000 / 64):,}"
    table = at.dataframe[0].value
    base = table.iloc[0]
    assert (base["users_per_gpu"], base["batch_per_replica"], base["gpus"]) == (100, 64, 1563)
    assert {"tokens_per_s_per_gpu", "ttft_ms", "tpot_ms", "usd_per_month"} <= set(table.columns)
    assert base["usd_per_month"] == pytest.approx(3.0 * 1563 * 730)


def test_time_to_first_token_for_a_prompt():
    at = page_test("kv_cost", {"preset": "llama-3-8b", "prompt": "1000"})
    at.run()
    assert not at.exception
    # compute-bound: (2 * params read * 1000 + 4 * 32 * 32 * 128 * 1000*1001/2) / (989.4 TFLOPS * 0.5)
    read = 8_030_261_248 - 128256 * 4096
    ttft = (2 * read * 1000 + 4 * 32 * 32 * 128 * 500_500) / (989.4e12 * 0.5)
    assert _metric(at, "Time to first token").value == f"{ttft * 1e3:,.1f} ms"


def test_gpu_link_accepts_common_spellings():
    at = page_test("kv_cost", {"preset": "llama-3-8b", "gpu": "H100 PCIe"})
    at.run()
    assert not at.exception and not at.warning
    assert at.query_params["gpu"] == "h100-pcie"


def test_link_problems_live_in_the_session_not_the_module():
    at = page_test("kv_cost", {"preset": "llama-3-8b", "ctx": "lots"})
    at.run()
    assert [w.value for w in at.warning] == ["Ignored in the URL: " + md("ctx='lots' (expected an integer)") + "."]
    assert not [name for name, value in vars(kv_cost).items()
                if isinstance(value, list) and not name.startswith("__")]
    clean = page_test("kv_cost", {"preset": "llama-3-8b", "ctx": "99999999999"})
    clean.run()
    assert [w.value for w in clean.warning] == ["Ignored in the URL: " + md("ctx=99999999999 (expected 1..10000000)") + "."]


def _figure(at, key):
    (chart,) = [c for c in at.get("plotly_chart") if c.key == key]
    return json.loads(chart.proto.spec)


@pytest.mark.parametrize("key, axis, title", [
    ("kv_plot_cache", "xaxis", "context (tokens per user)"),
    ("kv_plot_cost", "xaxis", "concurrent users"),
    ("kv_plot_cost", "yaxis", "USD per 1M output tokens"),
    ("kv_plot_gpus", "yaxis", "GPUs needed"),
])
def test_log_axes_have_readable_ticks_and_titles_in_words(key, axis, title):
    at = page_test("kv_cost", {"preset": "llama-3-8b"})
    at.run()
    layout = _figure(at, key)["layout"][axis]
    assert layout["type"] == "log"
    assert layout["title"]["text"] == title
    values, texts = layout["tickvals"], layout["ticktext"]
    assert len(values) >= 2
    # each label is the tick's own value (not a bare mantissa such as "3" for 0.3)
    si = {"k": 1e3, "M": 1e6, "G": 1e9}               # 1-2-5 ticks with SI suffixes from 10k (app.charts)
    read = lambda t: float(t[:-1]) * si[t[-1]] if t and t[-1] in si else float(t)  # noqa: E731
    assert all(read(text) == pytest.approx(value) for value, text in zip(values, texts))


def test_a_checkpoint_of_a_plus_variant_is_offered_its_own_variant(monkeypatch):
    row = {"id": 7, "path": "/runs/plus.pt", "variant": "q_eq_k_eq_v_plus", "n_layers": 2, "n_heads": 4,
           "n_kv_heads": 4, "d_model": 32, "d_head": 8, "params_total": None, "params_attention": None}
    monkeypatch.setattr(kv_cost, "_stored_checkpoints", lambda: [row])
    at = page_test("kv_cost", {"src": "checkpoint", "kvdtype": "fp32"})
    at.run()
    assert not at.exception
    assert at.selectbox(key="kv_variant").value == "q_eq_k_eq_v_plus"
    assert at.metric[0].value == f"{2 * 1 * 4 * 8 * 4 / 1024:,.2f} KiB"  # K=V: one tensor cached


def test_the_four_charts_keep_their_own_look_with_the_legend_under_the_plot():
    """Sent without Streamlit's theme (with it plotly.js draws each chart a third time once it is
    mounted), in the white template the other pages use, the legend below the plot so the curves
    get the half-width column."""
    at = page_test("kv_cost", {"preset": "llama-3-8b"})
    at.run()
    assert not at.exception
    charts = {e.key: e.proto for e in at.get("plotly_chart")}
    assert set(charts) == {"kv_plot_cache", "kv_plot_users", "kv_plot_cost", "kv_plot_gpus"}
    for key, proto in charts.items():
        assert proto.theme == "", key
        layout = json.loads(proto.spec)["layout"]
        assert layout["template"]["layout"]["plot_bgcolor"] == "white"
        assert (layout["legend"]["orientation"], layout["legend"]["title"]["text"]) == ("h", "configuration")


def test_engine_switch_shows_vllms_line_and_hybrid_presets_their_layer_types():
    at = page_test("kv_cost", {"preset": "llama-3-8b", "gpu": "a100-40gb", "ctx": "8192", "engine": "vllm",
                               "gmu": "0.9", "actgib": "9.37"})
    at.run()
    assert not at.exception
    assert "Maximum concurrency for 8,192 tokens per request: 11.12x" in at.info[0].value
    assert dict(at.query_params)["engine"] == "vllm"
    at = page_test("kv_cost", {"preset": "gemma-3-27b", "ctx": "32768"})
    at.run()
    assert not at.exception
    rows = at.dataframe[2].value
    assert list(rows["name"]) == ["sliding_attention", "full_attention"]
    assert list(rows["tokens"]) == [1024, 32768]
    assert not at.info
