"""Checkpoint inspector in AppTest: pick, analyse once, heatmap per metric, server path, uploads."""
from __future__ import annotations

import pytest
import torch

from app.pages.inspector import save_uploads
from loaders.errors import QkvscopeError
from loaders.ingest import ingest_checkpoint
from loaders.store import Store
from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr, figures, qp


def tiny_gpt2(folder, seed: int = 0):
    """A 2-layer, 4-head GPT-2 saved as a Hugging Face folder (vocab 300: UTF-8 bytes fit)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=300, n_positions=128,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    return folder


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
    at.selectbox(key="insp_metric").select("qk_symmetry").run()
    other = figures(at)["insp_heatmap"]["data"][0]
    assert other["x"] == ["H0", "H1", "H2", "H3"]
    assert arr(other["z"]) != arr(heat["z"])
    # qk_symmetry of random Q, K is 1/2 (closed form): the scale diverges from it
    assert other["colorbar"]["title"]["text"] == "qk_symmetry<br>chance 0.5" and other["zmid"] == 0.5
    assert other["customdata"][0][0].startswith("L0H0<br>qk_symmetry ") and "(chance 0.5)" in other["customdata"][0][0]
    assert "insp_layer" in figures(at)  # head+layer metrics also get the per-layer line
    # second visit: read from the store, nothing recomputed
    again = page_test("inspector", {"ckpt": "1", "metric": "qk_symmetry"}).run()
    assert not again.exception and len(again.toast) == 0
    assert arr(figures(again)["insp_heatmap"]["data"][0]["z"]) == arr(other["z"])


def test_spectra_attention_reports_and_downloads(ckpt_db):
    at = page_test("inspector", {"layer": "1", "head": "2"}).run()
    assert not at.exception, at.exception
    spectra = figures(at)["insp_spectra"]["data"]
    assert [t["name"] for t in spectra] == ["W_Q", "W_K", "W_V", "W_O"]
    assert len(arr(spectra[0]["y"])) == 8  # d_head singular values
    assert figures(at)["insp_attention"]["layout"]["title"]["text"] == "L1H2"
    assert {d.key for d in at.get("download_button")} == {"insp_csv", "insp_parquet"}
    absorb = at.dataframe[1].value  # geometry table, absorbability, K=V fit
    assert absorb["layer"].tolist() == [0, 1] and "wq_condition" in absorb.columns
    at.number_input(key="insp_layer_n").set_value(0).run()
    assert figures(at)["insp_attention"]["layout"]["title"]["text"] == "L0H2"
    assert qp(at, "layer") == "0"


def test_server_path_ingests_and_shows_the_heatmap(tmp_path, monkeypatch, model_dir):
    db = tmp_path / "p.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("inspector", {"src": "path", "path": str(model_dir)}).run()
    assert not at.exception, at.exception
    assert "insp_heatmap" in figures(at)
    assert qp(at, "ckpt") == "1"


def test_server_path_that_does_not_exist_says_so(ckpt_db, tmp_path):
    at = page_test("inspector", {"src": "path", "path": str(tmp_path / "nope")}).run()
    assert not at.exception
    assert at.error[0].value.startswith(f"{tmp_path / 'nope'}: no such file or folder on the server.")


def test_save_uploads_single_file_folder_and_names(tmp_path):
    one = save_uploads([("model.safetensors", b"abc")], tmp_path)
    assert one == tmp_path / "model.safetensors" and one.read_bytes() == b"abc"
    sub = tmp_path / "many"
    sub.mkdir()
    folder = save_uploads([("config.json", b"{}"), ("../../model.safetensors", b"x")], sub)
    assert folder == sub and sorted(p.name for p in sub.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(QkvscopeError) as err:
        save_uploads([("a/config.json", b"1"), ("b/config.json", b"2")], tmp_path)
    assert str(err.value) == "uploaded files share names: config.json; upload each file once"


@pytest.mark.browser
def test_upload_a_zipped_checkpoint_and_compare_in_a_real_browser(tmp_path, model_dir):
    import zipfile

    from tests.app.browser import browser_page, dashboard, screenshot, wait_idle

    zpath = tmp_path / "gpt2-tiny.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for name in ("config.json", "model.safetensors"):
            zf.write(model_dir / name, f"gpt2-tiny/{name}")
    db = tmp_path / "browser-insp.duckdb"
    Store(db).migrate()
    with dashboard(db, "--no-demo") as url, browser_page(viewport=(1400, 2400)) as page:
        page.goto(f"{url}/inspector?src=upload")
        wait_idle(page, timeout=60_000)
        page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(str(zpath))
        page.locator(".js-plotly-plot .heatmaplayer").first.wait_for(timeout=120_000)
        wait_idle(page, timeout=120_000)
        assert "ckpt=1" in page.url and "metric=kv_cka" in page.url
        # change an input: the metric picker redraws the heatmap and writes the URL
        page.locator("[data-testid='stSelectbox']").filter(has_text="Metric").first.click()
        page.get_by_role("option", name="qk_symmetry").click()
        wait_idle(page, timeout=60_000)
        assert "metric=qk_symmetry" in page.url
        page.get_by_text("qk_symmetry", exact=False).first.wait_for(timeout=30_000)
        screenshot(page, "inspector")
        # the upload was stored: the same checkpoint opens from the database on another page
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
