"""`python -m app info`: the tensors' ties beside the layout's variant, on Llamas built in code."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from app.cli import main
from tests.app.test_cli import cli, run_main, tiny_gpt2
from tests.loaders.paper_b import PAPER_B_CASES, paper_b_model
from tests.loaders.test_hub_names import COMMIT, hf_cache, tiny_gpt2_files
from tests.loaders.test_layouts_papers import BQL_MODES, bql_checkpoint

pytestmark = pytest.mark.slow                                 # each reads a checkpoint through the CLI


def tiny_llama(folder: Path, *, n_kv: int = 4, tie: str | None = None, tie_layers=(0, 1)) -> Path:
    """A random 2-layer Llama (d_model 32, 4 heads of 8, ``n_kv`` kv heads), saved as
    safetensors; ``tie``: ``"q_identity"`` sets q_proj.weight = I, ``"k_eq_v"`` copies
    k_proj into v_proj, in ``tie_layers``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=n_kv, vocab_size=64, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for i in tie_layers:
            attn = model.model.layers[i].self_attn
            if tie == "q_identity":
                attn.q_proj.weight.copy_(torch.eye(32))          # [n_heads*d_head, d_model] = I
            elif tie == "k_eq_v":
                attn.v_proj.weight.copy_(attn.k_proj.weight)
    model.save_pretrained(folder, safe_serialization=True)
    assert (folder / "model.safetensors").exists()
    return folder


def info_json(folder: Path, capsys) -> dict:
    """``info FOLDER --json`` through the CLI's entry point in this process."""
    out = run_main(capsys, "info", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def info_text(folder: Path, capsys) -> str:
    """The text output, through the same entry point in this process."""
    capsys.readouterr()
    assert main(["info", str(folder)]) == 0
    return capsys.readouterr().out


def layer_ties(q_identity=False, q_eq_k=False, k_eq_v=False, q_eq_v=False, layers=(0, 1)):
    return [{"layer": i, "q_identity": q_identity, "q_eq_k": q_eq_k, "k_eq_v": k_eq_v, "q_eq_v": q_eq_v}
            for i in layers]


def test_llama_with_identity_query_reads_wq_identity(tmp_path, capsys):
    folder = tiny_llama(tmp_path / "llama-wq-eye", tie="q_identity")
    info = info_json(folder, capsys)
    assert (info["architecture"], info["variant"]) == ("llama", "qkv")   # the names say qkv
    assert info["tied"] == {"variant": "wq_identity", "layers": layer_ties(q_identity=True)}
    assert info["params"]["attention"] > 0 and "kv_bytes_per_token" in info   # existing fields kept
    text = info_text(folder, capsys)
    assert "  tied                 wq_identity\n" in text
    assert ("  note: the layout reads variant qkv, but the tensors read wq_identity "
            "(W_Q = identity slice in every layer, to float tolerance)\n") in text


def test_gqa_llama_with_v_equal_to_k_reads_k_eq_v(tmp_path, capsys):
    folder = tiny_llama(tmp_path / "llama-kv", n_kv=2, tie="k_eq_v")
    info = info_json(folder, capsys)
    assert info["variant"] == "qkv" and info["n_kv_heads"] == 2
    assert info["tied"] == {"variant": "k_eq_v", "layers": layer_ties(k_eq_v=True)}
    assert ("  note: the layout reads variant qkv, but the tensors read k_eq_v "
            "(W_V = W_K in every layer, to float tolerance)\n") in info_text(folder, capsys)


def test_a_tie_in_one_layer_only_is_mixed(tmp_path, capsys):
    folder = tiny_llama(tmp_path / "llama-kv-0", tie="k_eq_v", tie_layers=(0,))
    info = info_json(folder, capsys)
    assert info["tied"]["variant"] == "mixed"
    assert [t["k_eq_v"] for t in info["tied"]["layers"]] == [True, False]
    assert ("but the tensors read mixed (W_V = W_K in layer 0, to float tolerance; by layer: k_eq_v in layer 0, "
            "qkv in layer 1)"
            in info_text(folder, capsys))


def test_untied_model_agrees_and_prints_no_note(tmp_path, capsys):
    for folder in (tiny_llama(tmp_path / "llama"), tiny_gpt2(tmp_path / "gpt2")):
        info = info_json(folder, capsys)
        assert info["variant"] == "qkv"
        assert info["tied"] == {"variant": "qkv", "layers": layer_ties()}
        text = info_text(folder, capsys)
        assert "  tied                 qkv\n" in text and "note:" not in text


def test_info_prints_the_layer_types_of_a_hybrid_stack():
    from app.commands.info import _extra_lines
    from loaders.canonical import ModelMeta
    meta = ModelMeta(architecture="gemma", variant="qkv", n_layers=6, n_heads=4, n_kv_heads=2, d_model=64,
                     d_head=16, norm="rmsnorm", positions="rotary", attn_scale=0.25, dtype="bfloat16",
                     params_total=1, params_attention=1,
                     config={"num_hidden_layers": 6, "sliding_window": 512, "sliding_window_pattern": 6})
    assert ("layer types          5 x sliding_attention (window 512), 1 x full_attention; kv_bytes_per_token "
            "sums over them (a sliding layer caps the tokens, not the bytes a token adds)") in _extra_lines(
        meta.to_json())


@pytest.mark.parametrize("file,cls,size,heads,variant", PAPER_B_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in PAPER_B_CASES])
def test_paper_b_model_classes_info_json(tmp_path, capsys, file, cls, size, heads, variant):
    """`info --json` on a final_model.pt that each of their model classes wrote."""
    model, conf = paper_b_model(file, cls, *heads)
    path = tmp_path / "final_model.pt"
    torch.save({"step": 1, "epoch": 0, "tokens_seen": 64, "model_state_dict": model.state_dict(),
                "model_config": dataclasses.asdict(conf), "train_config": {}}, path)
    capsys.readouterr()
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["architecture"], info["variant"], info["n_heads"], info["n_kv_heads"], info["d_head"]) == (
        "projection_sharing", variant, heads[0], heads[1], 4)
    assert info["tied"]["variant"] == variant


# ---- Hugging Face names, resolved in a cache built in tmp (tests/loaders/test_hub_names.py) ----

@pytest.fixture
def hub_gpt2(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = hf_cache(cache, "openai-community/gpt2", tiny_gpt2_files(tmp_path / "written"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, repo


def test_info_of_a_cached_repo_id_offline(hub_gpt2, capsys):
    cache, repo = hub_gpt2
    out = cli("info", "openai-community/gpt2", "--json")     # a subprocess, HF_HUB_* inherited
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["architecture"], info["n_layers"], info["n_heads"], info["d_model"]) == ("gpt2", 2, 4, 32)
    capsys.readouterr()
    assert main(["info", str(repo)]) == 0                     # the models--org--name folder
    assert capsys.readouterr().out.startswith(f"{repo}: {repo / 'snapshots' / COMMIT}\n")


def test_a_name_not_cached_is_one_line(hub_gpt2, capsys):
    cache, _ = hub_gpt2
    for argv in (["info", "BrainChip-AI/qkv-fineweb-300m"],
                 ["kv-cost", "--checkpoint", "BrainChip-AI/qkv-fineweb-300m"]):
        capsys.readouterr()
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"error: BrainChip-AI/qkv-fineweb-300m: no such file or folder, and BrainChip-AI/qkv-fineweb-300m "
            f"is not in the Hugging Face cache ({cache}); fetch it with --download, or: "
            f"hf download BrainChip-AI/qkv-fineweb-300m\n")


def test_ingest_analyze_and_kv_cost_take_a_cached_name(hub_gpt2, tmp_path, capsys):
    _, repo = hub_gpt2
    db = str(tmp_path / "q.duckdb")
    capsys.readouterr()
    assert main(["ingest", "openai-community/gpt2", "--db", db, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["added"] == 1 and report["files"][0]["path"] == str(repo / "snapshots" / COMMIT)
    assert main(["analyze", "openai-community/gpt2", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"]["path"] == str(repo / "snapshots" / COMMIT)
    assert main(["kv-cost", "--checkpoint", "openai-community/gpt2", "--json"]) == 0
    assert "openai-community/gpt2" in capsys.readouterr().out


@pytest.mark.parametrize("mode", BQL_MODES)
def test_nonlinear_query_modes_info(tmp_path, capsys, mode):
    """beyond_query_linearity's ckpt.pt (tests/loaders/test_layouts_papers.py) through `info`."""
    torch.save(bql_checkpoint(mode, False), tmp_path / "ckpt.pt")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "ckpt.pt"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    variant = "wq_identity" if mode == "identity" else "qkv"
    assert (info["architecture"], info["variant"], info["tied"]["variant"], info["n_heads"], info["d_head"]) == (
        "query_free", variant, variant, 4, 4)
    assert (info["query_module"] is not None) == (mode == "residual_gelu")
    assert main(["info", str(tmp_path / "ckpt.pt")]) == 0
    text = capsys.readouterr().out
    assert ("  query_module         q = x + LayerNorm(W_out GELU(W_in RMSNorm(x)))" in text) == (
        mode == "residual_gelu")
    assert "note:" not in text
