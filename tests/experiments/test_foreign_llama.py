"""Forward passes of Llama-style (llama2.c, Meta) and nanoGPT RMSNorm/SwiGLU checkpoints,
against float64 references written here from the code that trained them."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from experiments.foreign import ForeignCheckpointError, runnable
from loaders.checkpoints import checkpoint_from_source, open_checkpoint
from loaders.sources import open_source
from loaders.tensor_source import DictSource
from tests.loaders.llama2c_files import llama_state, write_bin

D, H, KV, L, VOCAB, SEQ = 16, 4, 2, 2, 300, 32


def llama_forward(sd, idx, *, n_heads=H, n_kv=KV, eps=1e-5, theta=10000.0) -> torch.Tensor:
    """llama2.c model.py's Transformer in float64: RMSNorm, rotary on pairs (2i, 2i+1),
    repeat_kv, SwiGLU w2(silu(w1 x) * w3 x), logits norm(x) @ output.T."""
    sd = {k: v.double() for k, v in sd.items()}
    B, T = idx.shape
    d = sd["tok_embeddings.weight"].shape[1]
    dh = d // n_heads

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x):                                         # (B, T, h, dh)
        inv = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)       # (T, dh/2)
        xc = torch.view_as_complex(x.reshape(B, T, -1, dh // 2, 2).contiguous())
        out = xc * torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
        return torch.view_as_real(out).reshape(B, T, -1, dh)

    x = sd["tok_embeddings.weight"][idx]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    n_layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    for i in range(n_layers):
        p = f"layers.{i}."
        h = rms(x, sd[p + "attention_norm.weight"])
        q = rope((h @ sd[p + "attention.wq.weight"].T).view(B, T, n_heads, dh))
        k = rope((h @ sd[p + "attention.wk.weight"].T).view(B, T, n_kv, dh))
        v = (h @ sd[p + "attention.wv.weight"].T).view(B, T, n_kv, dh)
        rep = n_heads // n_kv
        k = k[:, :, :, None, :].expand(B, T, n_kv, rep, dh).reshape(B, T, n_heads, dh)
        v = v[:, :, :, None, :].expand(B, T, n_kv, rep, dh).reshape(B, T, n_heads, dh)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, d) @ sd[p + "attention.wo.weight"].T
        h = rms(x, sd[p + "ffn_norm.weight"])
        f = F.silu(h @ sd[p + "feed_forward.w1.weight"].T) * (h @ sd[p + "feed_forward.w3.weight"].T)
        x = x + f @ sd[p + "feed_forward.w2.weight"].T
    out = sd.get("output.weight", sd["tok_embeddings.weight"])
    return rms(x, sd["norm.weight"]) @ out.T


def _idx(T=12, seed=1):
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))


def _model(source):
    meta = checkpoint_from_source(source, close=False).meta
    sd = {k: source.get(k) for k in source.keys()}
    model = runnable(meta.architecture, sd, source.config, variant=meta.variant, n_heads=meta.n_heads,
                     n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale, norm=meta.norm).eval()
    return meta, model


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("meta_device", [False, True])
def test_llama2c_ckpt_matches_reference(shared, meta_device, monkeypatch):
    if meta_device:                                  # the path of models over _META_PARAMS
        monkeypatch.setattr("experiments.foreign._META_PARAMS", 0)
    sd = llama_state(shared=shared)
    config = {"dim": D, "n_layers": L, "n_heads": H, "n_kv_heads": KV, "vocab_size": VOCAB,
              "max_seq_len": SEQ, "multiple_of": 8, "dropout": 0.0}
    meta, model = _model(DictSource(sd, config=config))
    assert (meta.architecture, meta.norm, model.cfg.norm, model.cfg.positions) == (
        "llama_meta", "rmsnorm", "rmsnorm", "rotary")
    assert model.context_limit == SEQ and model.cfg.tie_embeddings == shared
    idx = _idx()
    with torch.inference_mode():
        got = model(idx)[0]
    torch.testing.assert_close(got.double(), llama_forward(sd, idx), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_llama2c_bin_matches_reference(tmp_path, version):
    sd = llama_state(shared=False)
    path = write_bin(tmp_path / "model.bin", sd, version=version, n_heads=H, n_kv=KV, seq_len=SEQ, group_size=8)
    src = open_source(path)
    try:
        meta, model = _model(src)
        stored = {k: src.get(k) for k in src.keys() if not k.startswith("freqs")}   # v2: dequantised
    finally:
        src.close()
    idx = _idx()
    with torch.inference_mode():
        got = model(idx)[0]
    torch.testing.assert_close(got.double(), llama_forward(stored, idx), rtol=1e-4, atol=1e-4)
    if version == 2:                                 # Q8_0 moves the logits, but not far
        assert (got.double() - llama_forward(sd, idx)).abs().max() < 0.5


def test_wrong_rotary_tables_are_refused(tmp_path):
    sd = llama_state()
    sd.pop("output.weight")
    bad = {**sd, "freqs_cos": torch.ones(SEQ, 2), "freqs_sin": torch.zeros(SEQ, 2)}
    with pytest.raises(ForeignCheckpointError) as e:
        runnable("llama_meta", bad, {"n_heads": H, "n_kv_heads": KV}, variant="qkv", n_heads=H,
                 n_kv_heads=KV, attn_scale=0.5)
    assert str(e.value) == ("the rotary tables freqs_cos/freqs_sin (32, 2) are not those of base 10000 and "
                            "head size 4, which this GPT applies")


def test_realworld_llama2c_ckpt_runs(realworld):
    """saltyduckegg/llama2xs.c out/ckpt.pt: 5 layers, 8 heads, 4 kv heads, d_model 64."""
    path = realworld / "checkpoints/llama2c-train-llama2xs/ckpt.pt"
    with open_checkpoint(path) as ckpt:
        meta = ckpt.meta
    src = open_source(path)
    try:
        sd = {k: src.get(k) for k in src.keys()}
        model = runnable(meta.architecture, sd, src.config, variant=meta.variant, n_heads=meta.n_heads,
                         n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale, norm=meta.norm).eval()
    finally:
        src.close()
    idx = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        got = model(idx)[0]
    assert got.shape == (1, 20, 512)
    torch.testing.assert_close(got.double(), llama_forward(sd, idx, n_heads=8, n_kv=4), rtol=1e-4, atol=1e-4)
    assert (model.cfg.n_layer, model.cfg.n_head, model.cfg.n_kv_heads, model.context_limit) == (5, 8, 4, 256)


# ---- nanoGPT with RMSNorm and a SwiGLU MLP ------------------------------------------------

def nano_swiglu_sd(names=("w1", "w3", "w2"), seed=3, hidden=24, rms=True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    sd = {"transformer.wte.weight": r(VOCAB, D), "transformer.wpe.weight": r(SEQ, D),
          "transformer.ln_f.weight": 1 + r(D)}
    gate, up, down = names
    for i in range(L):
        p = f"transformer.h.{i}."
        sd.update({p + "ln_1.weight": 1 + r(D), p + "attn.c_attn.weight": r(3 * D, D),
                   p + "attn.c_proj.weight": r(D, D), p + "ln_2.weight": 1 + r(D),
                   p + f"mlp.{gate}.weight": r(hidden, D), p + f"mlp.{up}.weight": r(hidden, D),
                   p + f"mlp.{down}.weight": r(D, hidden)})
        if not rms:
            sd.update({p + "ln_1.bias": r(D), p + "ln_2.bias": r(D)})
    if not rms:
        sd["transformer.ln_f.bias"] = r(D)
    return sd


def nano_swiglu_forward(sd, idx, names=("w1", "w3", "w2"), rms=True, eps=1e-5) -> torch.Tensor:
    sd = {k: v.double() for k, v in sd.items()}
    B, T = idx.shape
    dh = D // H
    gate, up, down = names

    def norm(x, p):
        if rms:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * sd[p + ".weight"]
        return F.layer_norm(x, (D,), sd[p + ".weight"], sd.get(p + ".bias"), eps)

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        p = f"transformer.h.{i}."
        q, k, v = (norm(x, p + "ln_1") @ sd[p + "attn.c_attn.weight"].T).split(D, -1)
        q, k, v = (t.view(B, T, H, dh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, D) @ sd[p + "attn.c_proj.weight"].T
        h = norm(x, p + "ln_2")
        x = x + (F.silu(h @ sd[p + f"mlp.{gate}.weight"].T) * (h @ sd[p + f"mlp.{up}.weight"].T)) \
            @ sd[p + f"mlp.{down}.weight"].T
    return norm(x, "transformer.ln_f") @ sd["transformer.wte.weight"].T


@pytest.mark.parametrize("names", [("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"),
                                   ("w_gate", "w_up", "w_down")])
def test_nanogpt_rmsnorm_swiglu_matches_reference(names):
    sd = {"_orig_mod." + k: v for k, v in nano_swiglu_sd(names).items()}
    config = {"n_layer": L, "n_head": H, "n_embd": D, "block_size": SEQ, "vocab_size": VOCAB}
    meta, model = _model(DictSource({k.removeprefix("_orig_mod."): v for k, v in sd.items()}, config=config))
    assert (meta.architecture, meta.norm, model.cfg.norm) == ("nanogpt", "rmsnorm", "rmsnorm")
    idx = _idx()
    with torch.inference_mode():
        got = model(idx)[0]
    # no eps in the config: an RMSNorm runs with nn.RMSNorm's default, finfo(float32).eps
    eps = float(torch.finfo(torch.float32).eps)
    torch.testing.assert_close(got.double(), nano_swiglu_forward(nano_swiglu_sd(names), idx, names, eps=eps),
                               rtol=1e-4, atol=1e-4)


def test_nanogpt_layernorm_declared_by_config_matches_reference():
    """A LayerNorm without bias beside a SwiGLU would read as RMSNorm; the config's word wins."""
    sd = nano_swiglu_sd()
    config = {"n_layer": L, "n_head": H, "n_embd": D, "block_size": SEQ, "norm_type": "LayerNorm"}
    meta, model = _model(DictSource(sd, config=config))
    assert (meta.norm, model.cfg.norm) == ("layernorm", "layernorm")
    idx = _idx()
    with torch.inference_mode():
        got = model(idx)[0]
    torch.testing.assert_close(got.double(), nano_swiglu_forward(sd, idx, rms=False), rtol=1e-4, atol=1e-4)


def test_nanogpt_layernorm_biases_without_linear_biases_match_reference():
    """LayerNorm biases beside bias-free Linears: the GPT's one bias flag is on and the
    Linears' biases are zero, which computes the same."""
    sd = nano_swiglu_sd(rms=False)
    config = {"n_layer": L, "n_head": H, "n_embd": D, "block_size": SEQ, "bias": False}
    meta, model = _model(DictSource(sd, config=config))
    assert (meta.norm, model.cfg.bias) == ("layernorm", True)
    assert not model.blocks[0].attn.q.bias.any() and model.blocks[0].ln_1.bias.any()
    idx = _idx()
    with torch.inference_mode():
        got = model(idx)[0]
    torch.testing.assert_close(got.double(), nano_swiglu_forward(sd, idx, rms=False), rtol=1e-4, atol=1e-4)


def test_rmsnorm_with_norm_biases_is_refused():
    sd = nano_swiglu_sd(rms=False)
    config = {"n_layer": L, "n_head": H, "n_embd": D, "block_size": SEQ, "norm_type": "RMSNorm"}
    with pytest.raises(ForeignCheckpointError) as e:
        _model(DictSource(sd, config=config))
    assert str(e.value) == "the norms have biases, which RMSNorm does not"


def test_fused_swiglu_is_refused():
    sd = nano_swiglu_sd()
    for i in range(L):
        p = f"transformer.h.{i}.mlp."
        w1, w3, w2 = sd.pop(p + "w1.weight"), sd.pop(p + "w3.weight"), sd.pop(p + "w2.weight")
        sd[p + "c_fc.weight"], sd[p + "c_proj.weight"] = torch.cat([w1, w3]), w2
    with pytest.raises(ForeignCheckpointError) as e:
        runnable("nanogpt", sd, {"n_head": H}, variant="qkv", n_heads=H, n_kv_heads=H, attn_scale=0.5,
                 norm="rmsnorm")
    assert str(e.value) == ("mlp.c_fc has 48 rows, twice mlp.c_proj's 24 columns: a fused SwiGLU whose gate "
                            "half is not recorded in the weights")
