"""app.pickers: checkpoint names (run and step, an upload's own name), search, messages, default pair."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from app import pickers
from loaders.checkpoint_labels import CHOICE_COLUMNS, checkpoint_choices
from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.app.apptest import page_test
from tests.app.test_page_experiments import figures
from tests.app.test_page_inspector import tiny_gpt2


@pytest.mark.parametrize("n, text", [(0, "0 bytes"), (999, "999 bytes"), (1000, "1 kB"), (3_200_000, "3.2 MB"),
                                     (123_456_789, "123 MB"), (1_234_567_890, "1.23 GB"),
                                     (64 * 10**12, "64 TB")])
def test_human_bytes_uses_decimal_units(n, text):
    assert pickers.human_bytes(n) == text


def test_user_message_names_the_upload_and_humanises_bytes():
    raw = ("/tmp/qkvscope-upload-493fhgsw/model.safetensors: header says 12,345,678 bytes but the file "
           "holds 3200000 bytes")
    assert pickers.user_message(raw) == "model.safetensors: header says 12.3 MB but the file holds 3.2 MB"
    folder = "/tmp/qkvscope-upload-x_1/model.safetensors + config.json: no weights"
    assert pickers.user_message(folder) == "model.safetensors + config.json: no weights"
    assert pickers.user_message("/tmp/qkvscope-upload-ab12: empty") == "the uploaded files: empty"
    assert pickers.user_message("/data/m.pt: 512 bytes") == "/data/m.pt: 512 bytes"   # other paths stay


def test_upload_folder_keeps_the_names_and_never_shows_the_temporary_folder():
    holder, one = pickers.upload_folder(["model.safetensors"])
    try:
        assert one.name.startswith(pickers.UPLOAD_PREFIX)
        assert pickers.display_path(one / "model.safetensors") == "model.safetensors (uploaded)"
    finally:
        holder.cleanup()
    holder, many = pickers.upload_folder(["tokenizer.json", "config.json", "model-1.safetensors",
                                          "model-2.safetensors"])
    try:
        assert many.name == "model-1.safetensors + model-2.safetensors + 2 more" and many.is_dir()
        assert pickers.upload_name(many) == "model-1.safetensors + model-2.safetensors + 2 more"
    finally:
        holder.cleanup()
    assert not many.exists()
    assert pickers.upload_name("/data/models/gpt2") is None


def test_checkpoint_label_by_run_and_step_upload_name_or_folder():
    nan = math.nan
    assert pickers.checkpoint_label({"id": 7, "run": "k_eq_v-mha-wd0.1", "step": 4000.0,
                                     "path": "/d/k_eq_v-mha-wd0.1/checkpoints/final_step_004000.safetensors"}) \
        == "k_eq_v-mha-wd0.1 · step 4,000 (#7)"
    assert pickers.checkpoint_label({"id": 8, "run": None, "step": nan,
                                     "path": "/tmp/qkvscope-upload-493fhgsw/gpt2.zip"}) == "gpt2.zip (uploaded) (#8)"
    assert pickers.checkpoint_label({"id": 9, "run": nan, "step": nan, "path": "/m/gpt2-tiny"}) == "gpt2-tiny (#9)"
    assert pickers.checkpoint_label({"id": 10, "run": nan, "step": 12,
                                     "path": "/m/llama/model.safetensors"}) == "llama/model.safetensors · step 12 (#10)"
    assert pickers.checkpoint_label({"id": 11, "run": "r1", "step": None, "path": "/x/r1/best.pt"}) \
        == "r1 · best.pt (#11)"


def _choices(rows: list[dict]) -> pd.DataFrame:
    base = {"path": "/x", "size": 1, "architecture": "qkvscope", "n_layers": 2, "n_heads": 4, "n_kv_heads": 4,
            "d_model": 32, "d_head": 8, "run_id": None, "run_variant": None, "lr": 6e-4, "seed": 0,
            "project": "p"}
    frame = pd.DataFrame([{**base, **r} for r in rows])
    return frame[CHOICE_COLUMNS]


def test_search_matches_every_word_in_the_label_or_a_whole_token():
    c = _choices([{"id": 1, "run": "qkv-mha-wd0.1", "variant": "qkv", "weight_decay": 0.1, "step": 4000},
                  {"id": 2, "run": "k_eq_v-mha-wd0.1", "variant": "k_eq_v", "weight_decay": 0.1, "step": 4000},
                  {"id": 3, "run": "k_eq_v-mqa-wd0", "variant": "k_eq_v", "weight_decay": 0.0, "step": 500,
                   "n_kv_heads": 1}])
    assert pickers.search(c, "")["id"].tolist() == [1, 2, 3]
    assert pickers.search(c, "qkv")["id"].tolist() == [1]          # not every "qkvscope" checkpoint
    assert pickers.search(c, "K_EQ_V wd0.1")["id"].tolist() == [2]
    assert pickers.search(c, "kv1")["id"].tolist() == [3]
    assert pickers.search(c, "step 500")["id"].tolist() == [3]
    assert pickers.search(c, "nothing")["id"].tolist() == []


def test_default_pair_is_one_geometry_differing_in_one_setting():
    c = _choices([
        {"id": 1, "run": "k_eq_v-big", "variant": "k_eq_v", "weight_decay": 0.1, "step": 4000, "n_layers": 12},
        {"id": 2, "run": "q_eq_k-wd0.1", "variant": "q_eq_k", "weight_decay": 0.1, "step": 4000},
        {"id": 3, "run": "k_eq_v-wd0.1", "variant": "k_eq_v", "weight_decay": 0.1, "step": 4000},
        {"id": 4, "run": "qkv-wd0.03", "variant": "qkv", "weight_decay": 0.03, "step": 4000},
        {"id": 5, "run": "qkv-wd0.1", "variant": "qkv", "weight_decay": 0.1, "step": 4000},
        {"id": 6, "architecture": "gpt2", "run": None, "variant": "qkv", "weight_decay": None, "step": None,
         "n_heads": 12, "n_kv_heads": 12},
    ])
    assert pickers.default_pair(c) == (5, 3)                       # qkv vs k_eq_v, same wd, step, shape
    assert pickers.default_pair(c[c["id"] != 3]) == (5, 2)         # then another variant
    assert pickers.default_pair(c[c["id"].isin([4, 5, 6])]) == (4, 5)   # then two weight decays
    steps = _choices([{"id": 1, "run": "r", "variant": "qkv", "weight_decay": 0.1, "step": s} for s in (500,)]
                     + [{"id": 2, "run": "r", "variant": "qkv", "weight_decay": 0.1, "step": 1000}])
    assert pickers.default_pair(steps) == (1, 2)
    assert pickers.default_pair(c[c["id"].isin([1, 6])]) == (1, 6)     # nothing alike: first and last


@pytest.fixture(scope="module")
def label_db(tmp_path_factory):
    """Two runs (wd 0.1 and 0.03), one checkpoint each at step 200, and an upload ingested from its folder."""
    root = tmp_path_factory.mktemp("labels")
    for wd in ("0.1", "0.03"):
        run = root / "runs" / f"gpt2-wd{wd}"
        run.mkdir(parents=True)
        (run / "metrics.csv").write_text("step,train_loss\n0,4\n100,3.5\n200,3\n")
        tiny_gpt2(run / "step_200", seed=int(float(wd) * 100))
    holder, dest = pickers.upload_folder(["config.json", "model.safetensors"])
    tiny_gpt2(dest, seed=9)
    db = root / "labels.duckdb"
    report = ingest_paths(Store(db), [root / "runs", dest]).to_json()
    assert report["errors"] == 0 and report["added"] == 5, report
    yield db
    holder.cleanup()


def test_choices_join_runs_to_checkpoints(label_db):
    c = checkpoint_choices(Store(label_db))
    assert list(c.columns) == CHOICE_COLUMNS
    assert c["run"].tolist()[:2] == ["gpt2-wd0.03", "gpt2-wd0.1"] and c["run"].isna().tolist()[2]
    assert sorted(c["weight_decay"].dropna().tolist()) == [0.03, 0.1] and c["step"].dropna().tolist() == [200, 200]


def test_inspector_picker_names_runs_steps_and_uploads_and_searches(label_db, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(label_db))
    at = page_test("inspector").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="insp_ckpt").options == ["gpt2-wd0.03 · step 200 (#1)", "gpt2-wd0.1 · step 200 (#2)",
                                                     "model.safetensors + config.json (uploaded) (#3)"]
    assert not any(pickers.UPLOAD_PREFIX in str(m.value) for m in at.get("markdown") + at.get("caption"))
    at.text_input(key="insp_ckpt_search").input("wd0.03").run()
    assert at.selectbox(key="insp_ckpt").options == ["gpt2-wd0.03 · step 200 (#1)"]
    assert at.selectbox(key="insp_ckpt").value == 1


def test_compare_defaults_to_two_runs_differing_in_weight_decay(label_db, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(label_db))
    at = page_test("compare").run()
    assert not at.exception, at.exception
    a, b = at.selectbox(key="cmp_a").value, at.selectbox(key="cmp_b").value
    c = checkpoint_choices(Store(label_db)).set_index("id")
    assert {c.loc[a, "weight_decay"], c.loc[b, "weight_decay"]} == {0.03, 0.1}
    assert "cmp_diff" in figures(at)              # one geometry: the head-by-head difference is drawn


def test_a_lone_weight_file_upload_says_which_file_to_add(tmp_path):
    """The Inspector's upload of model.safetensors alone: the message names the upload, not the
    server's temporary folder, and the config.json to add."""
    from loaders.errors import QkvscopeError
    from loaders.sandbox import ingest_checkpoint

    written = tiny_gpt2(tmp_path / "gpt2")
    holder, dest = pickers.upload_folder(["model.safetensors"])
    try:
        (dest / "model.safetensors").write_bytes((written / "model.safetensors").read_bytes())
        with pytest.raises(QkvscopeError) as e:
            ingest_checkpoint(Store(tmp_path / "q.duckdb"), dest / "model.safetensors")
        assert pickers.user_message(str(e.value)) == (
            "model.safetensors: config has no head count (n_head/num_attention_heads); it cannot be inferred "
            "from tensor shapes; model.safetensors holds tensors only: add the config.json that sits beside "
            "model.safetensors in the model's folder (put it beside the file, upload both files together, or "
            "open the folder)")
    finally:
        holder.cleanup()
