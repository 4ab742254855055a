"""Today's language-model layouts on checkpoints written by ``transformers`` (tiny
random models, ``save_pretrained``): Gemma 1/2/3 (head_dim, query pre-scaling,
soft-capping, QK-norm), Qwen3 and OLMo 2 (QK-norm gains), DeepSeek-V3 multi-head
latent attention (the composed W_K, W_V against the model's own latent path).
Known answers come from the library's modules (forward hooks)."""
from __future__ import annotations

import shutil

import pytest
import torch
import transformers as tf

from app.commands.info import describe
from loaders.checkpoints import checkpoint_from_source, open_checkpoint
from loaders.errors import CheckpointFormatError
from loaders.tensor_source import DictSource
from tests.loaders.layout_checks import (bad_shape_error, capture, check_projections, cli, cli_json,
                                         heads, project, randomise, reshaped)

_LM = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, vocab_size=256)
_ATTN = "model.layers.{i}.self_attn."

# id, model factory, expected (architecture, n_heads, n_kv_heads, d_head, qk_norm, softcap), QK-norm scope
CASES = [
    ("gemma", lambda: tf.GemmaForCausalLM(tf.GemmaConfig(num_attention_heads=4, num_key_value_heads=1,
                                                         head_dim=12, **_LM)),
     ("gemma", 4, 1, 12, "none", None)),
    ("gemma2", lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(num_attention_heads=4, num_key_value_heads=2,
                                                            head_dim=16, query_pre_attn_scalar=24,
                                                            attn_logit_softcapping=50.0, **_LM)),
     ("gemma", 4, 2, 16, "none", 50.0)),
    ("gemma3", lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=2,
                                                                head_dim=16, query_pre_attn_scalar=20,
                                                                **_LM)),
     ("gemma", 4, 2, 16, "head", None)),
    ("qwen3", lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(num_attention_heads=4, num_key_value_heads=2,
                                                         head_dim=12, **_LM)),
     ("qwen3", 4, 2, 12, "head", None)),
    ("olmo2", lambda: tf.Olmo2ForCausalLM(tf.Olmo2Config(num_attention_heads=4, num_key_value_heads=2, **_LM)),
     ("olmo2", 4, 2, 8, "layer", None)),
]
IDS = [c[0] for c in CASES]
_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj")


def ids(seed=1):
    torch.manual_seed(seed)
    return {"input_ids": torch.randint(0, 256, (2, 7))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for cid, make, _ in CASES:
        model = randomise(make())
        folder = tmp_path_factory.mktemp(cid)
        model.save_pretrained(folder, safe_serialization=True)
        out[cid] = (model, folder)
    return out


def _rms_normed(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_geometry_projections_and_qk_norm(case, saved):
    cid, _, (arch, n, n_kv, dh, qk_norm, cap_) = case
    model, folder = saved[cid]
    attn = model.model.layers[0].self_attn
    names = [_ATTN.format(i=i) + r for i in (0, 1) for r in _ROLES]
    norms = [_ATTN.format(i=i) + r for i in (0, 1) for r in ("q_norm", "k_norm")] if qk_norm != "none" else []
    cap = capture(model, names + norms, **ids())
    with open_checkpoint(folder) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_layers, m.n_heads, m.n_kv_heads, m.d_model, m.d_head) == (arch, 2, n, n_kv, 32, dh)
        assert (m.qk_norm, m.logit_softcap) == (qk_norm, cap_)
        assert m.attn_scale == pytest.approx(attn.scaling)          # Gemma 2/3: query_pre_attn_scalar ** -0.5
        assert getattr(attn, "attn_logit_softcapping", None) == cap_
        for i in (0, 1):
            layer = ckpt.layer(i)
            check_projections(layer, m, cap, *[_ATTN.format(i=i) + r for r in _ROLES])
            if qk_norm == "none":
                assert layer.q_norm is None and layer.k_norm is None and "qk_symmetry" not in m.notes
                continue
            assert "before the model's QK-norm" in m.notes["qk_symmetry"] and "kv_cka" in m.notes
            assert "erank_v" not in m.notes
            eps = model.config.rms_norm_eps
            for key, gain, count in (("q_norm", layer.q_norm, n), ("k_norm", layer.k_norm, n_kv)):
                x, y = cap[_ATTN.format(i=i) + key]
                assert gain.shape == (count, dh)
                if qk_norm == "head":
                    # Qwen3 normalises before the head transpose, x [B, T, heads, d_head];
                    # Gemma 3 after it, x [B, heads, T, d_head] (T = 7 is no head count here)
                    g = gain.double()[:, None, :] if x.shape[1] == count else gain.double()
                    want = _rms_normed(x, eps) * g
                else:                                                   # x: [B, T, heads*d_head]
                    want = _rms_normed(x, eps) * gain.double().reshape(-1)
                torch.testing.assert_close(want.float(), y.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_params_counted(case, saved):
    model, folder = saved[case[0]]
    with open_checkpoint(folder) as ckpt:
        assert ckpt.meta.params_total == sum(p.numel() for p in model.parameters())
        attn = sum(p.numel() for name, p in model.named_parameters()
                   if ".self_attn." in name and "norm" not in name)
        assert ckpt.meta.params_attention == attn


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bad_shape_names_key_found_and_expected(case, saved, tmp_path):
    cid, _, (_, n, n_kv, dh, *_) = case
    folder = shutil.copytree(saved[cid][1], tmp_path / cid)
    key = "model.layers.1.self_attn.k_proj.weight"
    kv = f", {n_kv} kv heads" if n_kv != n else ""
    with pytest.raises(CheckpointFormatError) as exc:
        open_checkpoint(reshaped(folder, key, (n_kv * dh + 1, 32)))
    assert str(exc.value) == (f"{folder}: layer 1 key '{key}' has shape ({n_kv * dh + 1}, 32); expected "
                              f"({n_kv * dh}, 32) for d_model 32, {n} heads{kv} of d_head {dh}")


@pytest.mark.parametrize("cid,key,bad", [("qwen3", "model.layers.1.self_attn.q_norm.weight", (13,)),
                                         ("olmo2", "model.layers.0.self_attn.k_norm.weight", (8,))])
def test_bad_qk_norm_shape(cid, key, bad, saved, tmp_path):
    folder = shutil.copytree(saved[cid][1], tmp_path / cid)
    layer = key.split(".")[2]
    want = {"qwen3": "(12)", "olmo2": "(16)"}[cid]
    geom = {"qwen3": "4 heads, 2 kv heads of d_head 12", "olmo2": "4 heads, 2 kv heads of d_head 8"}[cid]
    with pytest.raises(CheckpointFormatError) as exc:
        open_checkpoint(reshaped(folder, key, bad))
    assert str(exc.value) == (f"{folder}: layer {layer} key '{key}' has shape ({bad[0]}); expected {want} "
                              f"for d_model 32, {geom}")


def test_qk_norm_layouts_claim_undeclared_keys_by_norm_shape(saved):
    """Without a model_type, a [d_head] q_norm reads as Qwen3, a [n*d_head] one as OLMo 2."""
    for cid, arch in (("qwen3", "qwen3"), ("olmo2", "olmo2")):
        model = saved[cid][0]
        config = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
        assert checkpoint_from_source(DictSource(model.state_dict(), config=config)).meta.architecture == arch


# ---- DeepSeek multi-head latent attention -----------------------------------

def mla_model(q_lora_rank=12, v_head_dim=5, attention_bias=False, rope_scaling=None, version=3):
    config_cls, model_cls = ((tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM) if version == 3
                             else (tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM))
    config = config_cls(
        num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=q_lora_rank,
        kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=v_head_dim,
        attention_bias=attention_bias, **_LM)
    if rope_scaling is not None:
        config.rope_parameters = {**config.rope_parameters, **rope_scaling}
    return randomise(model_cls(config))


MLA = [("q_lora_v_narrow", dict(q_lora_rank=12, v_head_dim=5)),
       ("q_proj_v_wide_bias", dict(q_lora_rank=None, v_head_dim=12, attention_bias=True)),
       ("v2_q_lora", dict(q_lora_rank=12, v_head_dim=5, version=2))]


@pytest.mark.parametrize("kwargs", [c[1] for c in MLA], ids=[c[0] for c in MLA])
def test_mla_composed_maps_equal_the_model_latent_path(kwargs, tmp_path):
    """x W_K[h] * s equals the model's k_nope for head h, s = 1/rms(c) of the latent c = x W_dkv^T;
    the rotary columns equal the shared (un-rotated) k_rope; x W_V[h] * s the model's value; likewise
    the query through q_a/q_b (or q_proj); W_O against o_proj; the padding is zeros."""
    model = mla_model(**kwargs)
    model.save_pretrained(tmp_path)
    n, r, rope, nope, v = 4, 8, 4, 6, kwargs["v_head_dim"]
    qk, dh = nope + rope, max(nope + rope, kwargs["v_head_dim"])
    q_lora = kwargs["q_lora_rank"]
    parts = ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"] + (["q_a_proj", "q_b_proj"] if q_lora else ["q_proj"])
    cap = capture(model, [_ATTN.format(i=i) + p for i in (0, 1) for p in parts], **ids())
    eps = model.model.layers[0].self_attn.kv_a_layernorm.variance_epsilon
    with open_checkpoint(tmp_path) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_heads, m.n_kv_heads, m.d_model, m.d_head) == ("deepseek_mla", n, n, 32, dh)
        assert (m.latent.kv_lora_rank, m.latent.q_lora_rank, m.latent.rope_dim, m.latent.nope_dim,
                m.latent.v_dim) == (r, q_lora, rope, nope, v)
        assert m.kv_bytes_per_token == 2 * (r + rope) * 4                  # layers * (latent + rope) * fp32
        assert m.attn_scale == pytest.approx(model.model.layers[0].self_attn.scaling)
        assert "composed maps" in m.notes["kv_cka"] and "composed maps" in m.notes["erank_vcache"]
        for i in (0, 1):
            L = ckpt.layer(i)
            x, kva = cap[_ATTN.format(i=i) + "kv_a_proj_with_mqa"]
            s = 1 / torch.sqrt(kva[..., :r].double().pow(2).mean(-1, keepdim=True) + eps)   # [B, T, 1]
            kv_b = cap[_ATTN.format(i=i) + "kv_b_proj"][1].squeeze(1)      # the latent is fed as [B, 1, T, r]
            kv = heads(kv_b, n, nope + v).double()                             # [n, B, T, nope+v]
            k = project(x, L.W_K, L.b_K)                                       # [n, B, T, dh]
            val = project(x, L.W_V, L.b_V)
            close = dict(atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(k[..., :nope] * s, kv[..., :nope], **close)
            torch.testing.assert_close(k[..., nope:qk], kva[..., r:].double().expand(n, *kva.shape[:-1], rope),
                                       **close)
            torch.testing.assert_close(val[..., :v] * s, kv[..., nope:], **close)
            assert not L.W_K[..., qk:].any() and not L.W_V[..., v:].any() and not L.W_O[:, v:].any()
            q_ref = heads(cap[_ATTN.format(i=i) + ("q_b_proj" if q_lora else "q_proj")][1], n, qk).double()
            q = project(x, L.W_Q, L.b_Q)
            if q_lora:
                qa = cap[_ATTN.format(i=i) + "q_a_proj"][1].double()
                q = q * (1 / torch.sqrt(qa.pow(2).mean(-1, keepdim=True) + eps))
            torch.testing.assert_close(q[..., :qk], q_ref, **close)
            assert not L.W_Q[..., qk:].any()
            z, o = cap[_ATTN.format(i=i) + "o_proj"]
            out = torch.einsum("hbte,hed->btd", heads(z, n, v).double(), L.W_O[:, :v].double())
            torch.testing.assert_close(out + (0 if L.b_O is None else L.b_O.double()), o.double(), **close)
        assert m.params_total == sum(p.numel() for p in model.parameters())
        assert m.params_attention == sum(p.numel() for nm, p in model.named_parameters()
                                         if ".self_attn." in nm and "norm" not in nm)


def test_mla_yarn_scale_matches_the_model(tmp_path):
    model = mla_model(rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 1.0,
                                    "original_max_position_embeddings": 16})
    model.save_pretrained(tmp_path)
    with open_checkpoint(tmp_path) as ckpt:
        want = model.model.layers[0].self_attn.scaling
        assert want != pytest.approx(10 ** -0.5)                           # the YaRN factor is in it
        assert ckpt.meta.attn_scale == pytest.approx(want)


def test_mla_bad_shape_names_key_found_and_expected(tmp_path):
    mla_model().save_pretrained(tmp_path)
    key = "model.layers.1.self_attn.kv_b_proj.weight"
    with pytest.raises(CheckpointFormatError) as exc:
        open_checkpoint(reshaped(tmp_path, key, (44, 9)))
    assert str(exc.value) == (f"{tmp_path}: layer 1 key '{key}' has shape (44, 9); expected (44, 8) for "
                              "d_model 32, 4 heads, kv_lora_rank 8, q_lora_rank 12, nope/rope/v dims 6/4/5")


def test_mla_config_without_latent_rank_says_so(tmp_path):
    model = mla_model()
    config = model.config.to_dict()
    del config["kv_lora_rank"]
    with pytest.raises(CheckpointFormatError) as exc:
        checkpoint_from_source(DictSource(model.state_dict(), config=config, path="ds"))
    assert str(exc.value) == ("ds: config has no kv_lora_rank (kv_lora_rank); "
                              "it cannot be inferred from tensor shapes")


# ---- info and analyze on each (the CLI reads files in a child process: seconds each) ----

@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_info_and_analyze_run(case, saved, tmp_path):
    cid, _, (arch, n, n_kv, dh, qk_norm, _) = case
    folder = saved[cid][1]
    info = cli_json("info", str(folder))
    assert (info["architecture"], info["n_heads"], info["n_kv_heads"], info["d_head"], info["qk_norm"]) == (
        arch, n, n_kv, dh, qk_norm)
    assert info["tied"]["variant"] == "qkv"
    out = cli_json("analyze", str(folder), "--db", str(tmp_path / "db.duckdb"))
    cka = [r for r in out["metrics"] if r["metric"] == "kv_cka"]
    assert len(cka) == 2 * n_kv and all(0 <= r["value"] <= 1 for r in cka)


@pytest.mark.slow
def test_mla_info_reports_latent_and_cache(tmp_path):
    mla_model().save_pretrained(tmp_path / "ds")
    info = cli_json("info", str(tmp_path / "ds"))
    assert info["latent"] == {"kv_lora_rank": 8, "q_lora_rank": 12, "rope_dim": 4, "nope_dim": 6, "v_dim": 5,
                              "cache_width": 12}
    assert info["kv_bytes_per_token"] == 2 * 12 * 4
    rc, text, _ = cli("info", str(tmp_path / "ds"))
    assert rc == 0 and ("  latent (MLA)         kv_lora_rank 8 + rotary 4 = 12 cached per token and layer; "
                        "q_lora_rank 12; W_K, W_V are composed maps") in text
    out = cli_json("analyze", str(tmp_path / "ds"), "--db", str(tmp_path / "db.duckdb"))
    assert {r["layer"] for r in out["metrics"]} == {0, 1}
    line = bad_shape_error(reshaped(tmp_path / "ds", "model.layers.0.self_attn.o_proj.weight", (32, 21)))
    assert line.startswith(f"error: {tmp_path / 'ds'}: layer 0 key 'model.layers.0.self_attn.o_proj.weight' "
                           "has shape (32, 21); expected (32, 20)")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["qwen3", "mla"])
def test_activations_run_through_transformers(which, saved, tmp_path):
    """The existing Hugging Face forward path runs these (UTF-8 bytes as tokens: vocab 256)."""
    if which == "mla":
        folder = tmp_path / "ds"
        mla_model().save_pretrained(folder)
    else:
        folder = saved["qwen3"][1]
    out = cli_json("analyze", str(folder), "--activations", "--tokens", "256", "--db", str(tmp_path / "db.duckdb"))
    acts = [r for r in out["metrics"] if r["metric"] == "kv_cka_act"]
    assert len(acts) == 2 * (4 if which == "mla" else 2) and all(r["n_tokens"] >= 256 for r in acts)


def test_tied_read_from_the_tensors_with_qk_norm(tmp_path):
    """A Gemma 3 whose v_proj is its k_proj (GQA) reads as k_eq_v from the tensors; a random one as qkv."""
    model = randomise(CASES[2][1]())
    model.save_pretrained(tmp_path / "qkv")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.copy_(layer.self_attn.k_proj.weight)
    model.save_pretrained(tmp_path / "kv")
    assert describe(str(tmp_path / "qkv"))["tied"]["variant"] == "qkv"
    assert describe(str(tmp_path / "kv"))["tied"]["variant"] == "k_eq_v"
