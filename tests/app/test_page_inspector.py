"""Checkpoint inspector in AppTest: pick, analyse once, heatmap per metric, server path, uploads."""
from __future__ import annotations

import io
import time

import pytest
import torch

from app.pages.inspector import save_uploads
from loaders.errors import QkvscopeError
from loaders.ingest import ingest_checkpoint
from loaders.store import Store
from tests.app.apptest import page_test, shown
from tests.app.test_page_experiments import arr, figures, qp


def tiny_gpt2(folder, seed: int = 0):
    """A 2-layer, 4-head GPT-2 saved as a Hugging Face folder (vocab 300: UTF-8 bytes fit)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=300, n_positions=128,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    return folder


def _analysed_in_process(store, cid: int) -> None:
    """Store a checkpoint's weight metrics in this process (a test of what the page shows
    besides them need not pay for the analysis child; ``test_analyses_once...`` checks that path)."""
    from app.jobs import analyze
    from loaders.checkpoints import open_checkpoint

    analyze(store, cid, opener=lambda p: open_checkpoint(p))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_gpt2(tmp_path_factory.mktemp("m") / "gpt2-tiny")


@pytest.fixture
def ckpt_db(tmp_path, monkeypatch, model_dir):
    db = tmp_path / "ck.duckdb"
    store = Store(db)
    store.migrate()
    assert ingest_checkpoint(store, model_dir).checkpoint_id == 1
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def test_empty_database_says_how_to_get_a_checkpoint(tmp_path, monkeypatch):
    db = tmp_path / "e.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("inspector").run()
    assert not at.exception
    assert at.info[0].value.startswith("No checkpoints stored yet. Upload one above, give a server path")


def test_analyses_once_and_metric_picker_changes_the_heatmap(ckpt_db):
    at = page_test("inspector").run()
    assert not at.exception, at.exception
    assert [t.value for t in at.toast][0].startswith("Analysed in")
    with Store(ckpt_db).connect() as con:
        assert con.execute("SELECT count(*) FROM analysis_jobs").fetchone()[0] == 1
    heat_fig = figures(at)["insp_heatmap"]
    heat = heat_fig["data"][0]
    assert heat["type"] == "heatmap" and heat["y"] == ["L0", "L1"]
    # a forced "linear" axis type draws categorical heatmaps empty in the browser
    assert "type" not in heat_fig["layout"]["xaxis"] and "type" not in heat_fig["layout"]["yaxis"]
    assert qp(at, "metric") == "kv_cka" and qp(at, "ckpt") == "1"
    # the layer x layer map (app.layer_maps): its one pair, centred on its chance, linked to the calculator
    from analysis.registry import METRIC_VERSION
    from loaders.curves import analysis_results

    pair = analysis_results(Store(ckpt_db), 1, METRIC_VERSION)
    pair = pair[pair["metric"] == "xlayer_cka_wk"].iloc[0]
    xmap = figures(at)["insp_layer_map"]["data"][0]
    assert xmap["x"] == ["L0", "L1"] and xmap["z"][0][1] == xmap["z"][1][0] == pytest.approx(pair["value"])
    assert xmap["zmid"] == pytest.approx(pair["chance"]) and xmap["z"][0][0] is None
    assert any("./kv-cost?src=checkpoint&ckpt=1&lpc=2" in m.value for m in at.markdown)
    at.selectbox(key="insp_metric").select("qk_symmetry").run()
    other = figures(at)["insp_heatmap"]["data"][0]
    assert other["x"] == ["H0", "H1", "H2", "H3"]
    assert arr(other["z"]) != arr(heat["z"])
    # the scale diverges from the stored chance level (analysis.chance), which the colour bar names
    stored = analysis_results(Store(ckpt_db), 1, METRIC_VERSION)
    stored = stored[(stored["metric"] == "qk_symmetry") & stored["head"].notna()]
    chance = float(stored["chance"].median())
    assert 0.4 < chance < 0.6 and other["zmid"] == pytest.approx(chance)
    assert other["colorbar"]["title"]["text"].startswith("qk_symmetry<br>chance 0.5")
    first = stored[(stored["layer"] == 0) & (stored["head"] == 0)].iloc[0]
    assert other["customdata"][0][0] == (f"L0H0<br>qk_symmetry {first['value']:.4g} "
                                         f"(chance {first['chance']:.4g})")
    assert "insp_layer" in figures(at)  # head+layer metrics also get the per-layer line
    # second visit: read from the store, nothing recomputed
    again = page_test("inspector", {"ckpt": "1", "metric": "qk_symmetry"}).run()
    assert not again.exception and len(again.toast) == 0
    assert arr(figures(again)["insp_heatmap"]["data"][0]["z"]) == arr(other["z"])


def test_spectra_attention_reports_and_downloads(ckpt_db):
    _analysed_in_process(Store(ckpt_db), 1)               # this test reads the stored metrics
    at = page_test("inspector", {"layer": "1", "head": "2"}).run()
    assert not at.exception, at.exception
    spectra = figures(at)["insp_spectra"]["data"]
    assert [t["name"] for t in spectra] == ["W_Q", "W_K", "W_V", "W_O"]
    assert len(arr(spectra[0]["y"])) == 8  # d_head singular values
    assert figures(at)["insp_attention"]["layout"]["title"]["text"] == "L1H2"
    assert {d.key for d in at.get("download_button")} == {"insp_csv", "insp_parquet"}
    absorb = _frame(at, "wq_condition").value  # geometry table, absorbability, K=V fit
    assert absorb["layer"].tolist() == [0, 1] and "wq_condition" in absorb.columns
    # the cross-head map of a layer, its groupings read from the weights beside it
    head_map = figures(at)["insp_head_map"]
    assert head_map["data"][0]["x"] == ["KV0", "KV1", "KV2", "KV3"]
    assert head_map["layout"]["title"]["text"] == "Layer 1: xhead_sim_k"      # the page's layer (URL)
    groupings = at.dataframe[-1].value
    assert groupings[["G", "kind"]].values.tolist() == [[2, "contiguous"], [2, "free"], [1, "contiguous"], [1, "free"]]
    at.selectbox(key="insp_pair_layer").select(0).run()
    assert figures(at)["insp_head_map"]["layout"]["title"]["text"] == "Layer 0: xhead_sim_k"
    at.number_input(key="insp_layer_n").set_value(0).run()
    assert figures(at)["insp_attention"]["layout"]["title"]["text"] == "L0H2"
    assert qp(at, "layer") == "0"


def test_server_path_is_inspected_without_storing_until_added(tmp_path, monkeypatch, model_dir):
    db = tmp_path / "p.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    before = db.read_bytes()
    at = page_test("inspector", {"src": "path", "path": str(model_dir)}).run()
    assert not at.exception, at.exception
    # a link alone reads nothing on the server
    assert "insp_heatmap" not in figures(at) and Store(db).checkpoints() == []
    assert db.read_bytes() == before
    assert any("Press **Open** to read it" in i.value for i in at.info)
    at.button[0].click().run()                                   # the form's Open button
    assert not at.exception, at.exception
    # read and analysed in the session's scratch store: the database is as it was, the link has no id
    assert "insp_heatmap" in figures(at)
    assert Store(db).checkpoints() == [] and db.read_bytes() == before
    assert qp(at, "ckpt") is None
    assert at.text_input(key="insp_add_project").value == model_dir.name
    at.text_input(key="insp_add_project").set_value("tiny-models")
    [add] = [b for b in at.button if b.label == "Add to database"]
    add.click().run()
    assert not at.exception, at.exception
    [stored] = Store(db).checkpoints()
    assert (stored["id"], stored["project"]) == (1, "tiny-models")
    assert "Stored in the database as checkpoint #1, project 'tiny-models'." in [shown(s.value) for s in at.success]
    # the same link again opens the stored checkpoint from the database
    again = page_test("inspector", {"src": "path", "path": str(model_dir)}).run()
    assert not again.exception and "insp_heatmap" in figures(again)
    assert qp(again, "ckpt") == "1" and len(Store(db).checkpoints()) == 1


def test_server_path_that_does_not_exist_says_so(ckpt_db, tmp_path):
    at = page_test("inspector", {"src": "path", "path": str(tmp_path / "nope")}).run()
    assert not at.exception
    assert not at.error                                          # nothing is looked at before Open
    at.button[0].click().run()
    assert not at.exception
    assert shown(at.error[0].value).startswith(f"{tmp_path / 'nope'}: no such file or folder on the server.")


def test_save_uploads_single_file_folder_and_names(tmp_path):
    one = save_uploads([("model.safetensors", io.BytesIO(b"abc"))], tmp_path)
    assert one == tmp_path / "model.safetensors" and one.read_bytes() == b"abc"
    sub = tmp_path / "many"
    sub.mkdir()
    folder = save_uploads([("config.json", io.BytesIO(b"{}")), ("../../model.safetensors", io.BytesIO(b"x"))], sub)
    assert folder == sub and sorted(p.name for p in sub.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(QkvscopeError) as err:
        save_uploads([("a/config.json", io.BytesIO(b"1")), ("b/config.json", io.BytesIO(b"2"))], tmp_path)
    assert str(err.value) == "uploaded files share names: config.json; upload each file once"


@pytest.mark.browser
def test_upload_a_zipped_checkpoint_and_compare_in_a_real_browser(tmp_path, model_dir, chromium_browser):
    import zipfile

    from tests.app.browser import dashboard, reading_children, screenshot, session, wait_idle

    zpath = tmp_path / "gpt2-tiny.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for name in ("config.json", "model.safetensors"):
            zf.write(model_dir / name, f"gpt2-tiny/{name}")
    db = tmp_path / "browser-insp.duckdb"
    Store(db).migrate()
    # a tall viewport: the metric picker's list opens with room for every option (it draws only
    # the options that fit, and at 1,000 px qk_symmetry can fall outside them)
    with dashboard(db, "--no-demo") as url, session((url, chromium_browser), 1400, 2400) as (_, page):
        page.goto(f"{url}/inspector?src=upload")
        wait_idle(page, timeout=60_000)
        page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(str(zpath))
        page.locator(".js-plotly-plot .heatmaplayer").first.wait_for(timeout=120_000)
        wait_idle(page, timeout=120_000)
        # inspected in the session's scratch store: no database id in the link, nothing stored yet
        assert "ckpt=" not in page.url and "metric=kv_cka" in page.url
        assert Store(db).checkpoints() == []
        # change an input: the metric picker redraws the heatmap and writes the URL
        page.locator("[data-testid='stSelectbox']").filter(has_text="Metric").first.click()
        page.get_by_role("option", name="qk_symmetry", exact=True).click()
        wait_idle(page, timeout=60_000)
        assert "metric=qk_symmetry" in page.url
        page.get_by_text("qk_symmetry", exact=False).first.wait_for(timeout=30_000)
        screenshot(page, "inspector")
        # Picking a head the spectra have not shown reads the file again, in the same reading
        # child: it must outlive the script run that used it (a child started by that thread was
        # killed when the run ended, and every pick paid a fresh start).
        time.sleep(0.5)
        children = reading_children(url)
        assert children, "no reading child alive after the page was drawn"
        head = page.get_by_role("spinbutton", name="Head")
        head.fill("1")
        head.press("Enter")
        wait_idle(page, timeout=60_000)
        assert "head=1" in page.url
        page.locator(".js-plotly-plot").filter(has=page.locator(".scatterlayer")).first.wait_for(timeout=30_000)
        assert reading_children(url) == children
        # "Add to database" stores it (into project "uploads"): then it opens from the database
        page.get_by_role("button", name="Add to database").click()
        page.get_by_text("Stored in the database as checkpoint #1").wait_for(timeout=120_000)
        assert [c["project"] for c in Store(db).checkpoints()] == ["uploads"]
        page.goto(f"{url}/inspector?ckpt=1&metric=erank_k")
        wait_idle(page, timeout=60_000)
        page.locator(".js-plotly-plot .heatmaplayer").first.wait_for(timeout=60_000)
        page.goto(f"{url}/compare?a=1&b=1")
        wait_idle(page, timeout=60_000)
        page.locator(".js-plotly-plot .heatmaplayer").first.wait_for(timeout=60_000)
        wait_idle(page, timeout=60_000)
        screenshot(page, "compare")
        page.get_by_text("Largest changes of kv_cka").scroll_into_view_if_needed(timeout=60_000)
        page.locator(".js-plotly-plot .heatmaplayer").nth(2).wait_for(timeout=60_000)  # A, B and B - A


#: d_head 8 of the tiny GPT-2: metrics needing 8 x d_head tokens want 64.
FEW = "40 tokens < 8 x d_head = 64: fewer tokens than columns bias the fit up; read it against its chance level"


@pytest.fixture
def chance_db(tmp_path, monkeypatch, model_dir):
    """The tiny GPT-2 ingested, with weight and activation results (chance, tokens, intervals) and
    their job rows written as the jobs write them, so the page computes nothing."""
    import pandas as pd

    from analysis.registry import METRIC_VERSION, names
    from loaders.results import replace_results

    db = tmp_path / "chance.duckdb"
    store = Store(db)
    store.migrate()
    assert ingest_checkpoint(store, model_dir).checkpoint_id == 1
    heads = [(l, h) for l in range(2) for h in range(4)]
    weights = pd.DataFrame(
        [{"layer": l, "head": h, "metric": "kv_share_r2", "value": 0.2 + 0.02 * (4 * l + h), "chance": 0.25}
         for l, h in heads]
        + [{"layer": l, "head": None, "metric": "wq_condition", "value": 20.0 + l, "chance": 117.4} for l in range(2)])
    acts = pd.DataFrame(
        [{"layer": l, "head": h, "metric": m, "value": v, "chance": c, "n_tokens": 40, "ci_low": v - 0.05,
          "ci_high": v + 0.05} for l, h in heads
         for m, v, c in (("kv_share_r2_act", 0.9, 0.3), ("kv_cka_act", 0.5 + 0.01 * h, 0.2))])
    # every other metric is absent with a note, so the stored jobs are current (app.state.current_notes)
    absent = {m: "not in this fixture" for m in names("weights") + names("activations")
              if m not in set(weights["metric"]) | set(acts["metric"])}
    # the stored test (analysis.above_chance), here: the value (weights) or the whole interval
    # (activations) above chance
    weights["above_chance"] = (weights["value"] > weights["chance"]).astype("boolean")
    acts["above_chance"] = (acts["ci_low"] > acts["chance"]).astype("boolean")
    with store.transaction() as con:
        replace_results(con, checkpoint_id=1, kind="weights", metrics=names("weights"),
                        metric_version=METRIC_VERSION, notes={**absent, "wq_absorb_error": "model uses layernorm"},
                        seconds=0.1, device="cpu", frame=weights)
        replace_results(con, checkpoint_id=1, kind="activations", metrics=names("activations"),
                        metric_version=METRIC_VERSION, notes={**absent, "kv_share_r2_act": FEW}, seconds=0.1,
                        device="cpu", frame=acts)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def _frame(at, column: str):
    """The one table on the page with ``column`` (st.dataframe has no key to find it by)."""
    found = [d for d in at.dataframe if column in d.value.columns]
    assert len(found) == 1, [list(d.value.columns) for d in at.dataframe]
    return found[0]


def _greyed_rows(df) -> set[int]:
    """Rows the table's Styler greys (``app.tables.MUTED``)."""
    import re

    css = df.proto.arrow_data.styler.styles
    return {int(r) for block in css.split("}") if "#9a9a9a" in block for r in re.findall(r"row(\d+)_col", block)}


def test_activation_heatmap_and_tables_show_chance_tokens_interval_and_greyed_reason(chance_db):
    import pandas as pd

    at = page_test("inspector", {"ckpt": "1", "act": "1", "metric": "kv_share_r2_act"}).run()
    assert not at.exception, at.exception
    assert len(at.toast) == 0  # stored: nothing analysed
    heat_fig = figures(at)["insp_heatmap"]
    heat = heat_fig["data"][0]
    assert heat["zmid"] == 0.3 and heat["colorbar"]["title"]["text"] == "kv_share_r2_act<br>chance 0.3"
    assert heat["customdata"][1][2] == ("L1H2<br>kv_share_r2_act 0.9 (chance 0.3)<br>n=40 tokens, 95% CI 0.85–0.95"
                                        "<br>above chance (outside the null band, 5% false discovery rate)")
    assert heat["opacity"] == 0.35 and heat_fig["layout"]["title"]["text"] == "Faded: too few tokens (40 tokens &lt; 8 x d_head = 64)"
    assert any(w.value == f"kv_share_r2_act rests on too few tokens: {FEW}" for w in at.warning)
    assert any(c.value.startswith("**chance 0.3**: the same metric of the same captured layer input")
               for c in at.caption)
    kv = _frame(at, "heads above chance")
    table = kv.value
    assert list(table.columns) == ["layer", "metric", "mean", "min", "max", "chance", "heads above chance",
                                   "n_tokens", "95% CI (mean of heads' bounds)", "note"]
    act = table[(table["layer"] == 0) & (table["metric"] == "kv_cka_act")].iloc[0]
    assert act["chance"] == pytest.approx(0.2) and act["n_tokens"] == "40"
    assert act["heads above chance"] == "4 of 4"  # every head's interval (>= 0.45) above 0.2
    assert act["95% CI (mean of heads' bounds)"] == "0.465–0.565"
    w = table[(table["layer"] == 0) & (table["metric"] == "kv_share_r2")].iloc[0]
    assert w["chance"] == 0.25 and w["heads above chance"] == "1 of 4"  # 0.20, 0.22, 0.24, 0.26 against 0.25
    assert w["n_tokens"] == "" and w["95% CI (mean of heads' bounds)"] == ""  # weights are not sampled
    few = set(table.index[table["metric"] == "kv_share_r2_act"])
    assert few and _greyed_rows(kv) == few and (table.loc[list(few), "note"] == FEW).all()
    assert any(c.value == f"Greyed rows rest on too few tokens: kv_share_r2_act: {FEW}" for c in at.caption)
    absorb = _frame(at, "wq_condition").value
    assert list(absorb.columns) == ["layer", "wq_condition", "wq_condition chance"]
    assert absorb["wq_condition chance"].tolist() == [117.4, 117.4]
    heads = _frame(at, "95% CI").value
    assert {"value", "chance", "n_tokens", "95% CI", "note"} <= set(heads.columns)


def test_downloads_carry_chance_tokens_interval_and_note(chance_db, monkeypatch):
    import io

    import pandas as pd
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    sent: dict[str, bytes] = {}
    real = MemoryMediaFileStorage.load_and_get_id

    def record(self, path_or_data, mimetype, kind, filename=None):
        sent[filename] = path_or_data
        return real(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", record)
    at = page_test("inspector", {"ckpt": "1", "act": "1"}).run()
    assert not at.exception, at.exception
    csv = pd.read_csv(io.BytesIO(sent["checkpoint-1.csv"]))
    parquet = pd.read_parquet(io.BytesIO(sent["checkpoint-1.parquet"]))
    for frame in (csv, parquet):
        assert list(frame.columns) == ["layer", "head", "metric", "value", "metric_version", "chance",
                                       "n_tokens", "ci_low", "ci_high", "chance_low", "chance_high",
                                       "above_chance", "degenerate", "layer2", "head2", "note"]
    act = parquet[(parquet["metric"] == "kv_share_r2_act") & (parquet["layer"] == 0) & (parquet["head"] == 0)]
    assert act[["chance", "n_tokens", "ci_low", "ci_high"]].iloc[0].tolist() == pytest.approx([0.3, 40, 0.85, 0.95])
    assert act["note"].iloc[0] == FEW
    assert parquet[parquet["metric"] == "kv_share_r2"]["n_tokens"].isna().all()


def test_tied_tensors_in_a_standard_layout_are_flagged(tmp_path, monkeypatch, model_dir):
    """A GPT-2 whose c_attn has V = K (layout: qkv; tensors: k_eq_v); the untouched one says nothing."""
    import shutil

    from safetensors.torch import load_file, save_file

    tied = tmp_path / "gpt2-kv-tied"
    shutil.copytree(model_dir, tied)
    sd = load_file(tied / "model.safetensors")
    for i in range(2):
        w = sd[f"transformer.h.{i}.attn.c_attn.weight"].clone()       # Conv1D [d_model, 3 d_model]: q | k | v
        w[:, 64:96] = w[:, 32:64]
        sd[f"transformer.h.{i}.attn.c_attn.weight"] = w
        b = sd[f"transformer.h.{i}.attn.c_attn.bias"].clone()
        b[64:96] = b[32:64]
        sd[f"transformer.h.{i}.attn.c_attn.bias"] = b
    save_file(sd, tied / "model.safetensors", metadata={"format": "pt"})
    db = tmp_path / "tied.duckdb"
    store = Store(db)
    store.migrate()
    assert ingest_checkpoint(store, model_dir).checkpoint_id == 1
    assert ingest_checkpoint(store, tied).checkpoint_id == 2
    for cid in (1, 2):                                # stored here: the page only reads the ties
        _analysed_in_process(store, cid)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    children = _record_child_calls(monkeypatch)
    at = page_test("inspector", {"ckpt": "2"}).run()
    assert not at.exception, at.exception
    warned = [w.value for w in at.warning if w.value.startswith("The layout reads")]
    assert warned == [TIED_KV]
    plain = page_test("inspector", {"ckpt": "1"}).run()
    assert not plain.exception and not [w for w in plain.warning if w.value.startswith("The layout reads")]
    # the ties came with the stored analysis: the file was not read again for them
    assert "ties" not in children
    # an analysis stored without them (before ties were kept): the reading child reads the file
    with store.transaction() as con:
        con.execute("UPDATE analysis_jobs SET tied = NULL")
    again = page_test("inspector", {"ckpt": "2"}).run()
    assert not again.exception, again.exception
    assert [w.value for w in again.warning if w.value.startswith("The layout reads")] == [TIED_KV]
    assert children.count("ties") == 1


TIED_KV = ("The layout reads variant qkv, but the tensors read k_eq_v (W_V = W_K in every layer, to float "
           "tolerance). The metrics are computed from the tensors as stored: read the K=V and Q=K fits with the "
           "ties in mind.")


def _record_child_calls(monkeypatch) -> list[str]:
    """The names of the jobs the page runs in the sandbox (``app.sandbox_jobs.call``),
    in order; the calls still run."""
    import app.sandbox_jobs as sandbox_jobs

    names, call = [], sandbox_jobs.call

    def recording(name, *args, **kwargs):
        names.append(name)
        return call(name, *args, **kwargs)
    monkeypatch.setattr(sandbox_jobs, "call", recording)
    return names


def test_tie_message_names_layers_that_differ():
    from app.pages.inspector import tie_message

    def ties(layer, **on):
        return {"layer": layer, "q_identity": False, "q_eq_k": False, "k_eq_v": False, "q_eq_v": False, **on}

    assert tie_message("qkv", [ties(0), ties(1)]) is None
    assert tie_message("k_eq_v", [ties(0, k_eq_v=True)]) is None
    msg = tie_message("qkv", [ties(0), ties(1, k_eq_v=True), ties(2, k_eq_v=True), ties(3)])
    assert msg.startswith("The layout reads variant qkv, but the tensors read mixed (W_V = W_K in layers 1-2, to "
                          "float tolerance; by layer: qkv in layers 0, 3, k_eq_v in layers 1-2). The metrics")


def test_attention_grid_of_all_heads_enlarges_one_and_stays_small_at_2048_tokens(tmp_path, monkeypatch):
    """Issue 17 item 10: every head of the layer as small multiples on one scale, one enlarged
    (chosen by a control), 2,048 tokens drawn as max-pooled blocks; the default text ends on a word."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from app.attention_view import GRID_BINS, LARGE_BINS
    from experiments.attention_maps import SAMPLE_TEXT

    torch.manual_seed(0)
    folder = tmp_path / "gpt2-long"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=300, n_positions=2048,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    db = tmp_path / "long.duckdb"
    store = Store(db)
    store.migrate()
    _analysed_in_process(store, ingest_checkpoint(store, folder).checkpoint_id)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("inspector", {"layer": "1", "head": "2"}, timeout=180).run()
    assert not at.exception, at.exception
    text = at.text_area(key="insp_text").value
    assert SAMPLE_TEXT.startswith(text) and SAMPLE_TEXT[len(text)] == " " and text.endswith(".")
    grid = figures(at)["insp_attention_grid"]
    assert [t["name"] for t in grid["data"]] == ["L1H0", "L1H1", "L1H2", "L1H3"]
    assert {t["coloraxis"] for t in grid["data"]} == {"coloraxis"}        # one colour scale
    assert figures(at)["insp_attention"]["layout"]["title"]["text"] == "L1H2"
    at.segmented_control(key="insp_attn_head").set_value(0).run()
    assert figures(at)["insp_attention"]["layout"]["title"]["text"] == "L1H0" and qp(at, "ahead") == "0"
    long_text = ("word " * 2100).strip()                                   # byte tokens: 2,048 used
    long = page_test("inspector", {"layer": "0", "text": long_text, "tokens": "2048"}, timeout=300).run()
    assert not long.exception, long.exception
    figs = figures(long)
    assert all(len(arr(t["z"])) == GRID_BINS for t in figs["insp_attention_grid"]["data"])
    big = figs["insp_attention"]["data"][0]
    assert len(arr(big["z"])) == LARGE_BINS and "block max at query" in big["hovertemplate"]
    assert big["customdata"][LARGE_BINS - 1][0][0].startswith("20")       # a query near token 2,047


def test_the_page_of_an_analysed_checkpoint_runs_without_torch_in_the_server(tmp_path, model_dir):
    """The server process never imports torch for a stored, analysed checkpoint (1.2 s on the first
    visit): its ties are named from the stored analysis (``analysis.tie_names``), the sample text
    comes from ``experiments.sample_text``, and spectra and maps run in the reading child; nor for the
    navigation, which imports every page module (the What-if page's conversion names live apart from
    the conversions). Run in a fresh interpreter, since this test process has torch already."""
    import os
    import subprocess
    import sys

    from tests.app.apptest import ROOT

    db = tmp_path / "a.duckdb"
    store = Store(db)
    store.migrate()
    assert ingest_checkpoint(store, model_dir).checkpoint_id == 1
    _analysed_in_process(store, 1)
    probe = (
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.app.apptest import page_test\n"
        "at = page_test('inspector', {'ckpt': '1'}, timeout=120).run()\n"
        "assert not at.exception, at.exception\n"
        "print('spectra shown:', any(e.key == 'insp_spectra' for e in at.get('plotly_chart')))\n"
        "from app.pages import page_modules\n"
        "page_modules()\n"              # what the server's entry script imports to build its navigation
        "print('torch imported:', 'torch' in sys.modules)\n")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "QKVSCOPE_DB": str(db)})
    assert got.returncode == 0, got.stderr[-2000:]
    assert "spectra shown: True" in got.stdout and "torch imported: False" in got.stdout, got.stdout
