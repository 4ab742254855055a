"""Other people's checkpoints as the project's GPT (``experiments.foreign``).

State dicts are built here with the key names and shapes of the
projection-sharing paper's language models (SYNTHETIC: random tensors; the
facts are in ``loaders/layouts/projection_sharing.py``'s docstring) and of the query-free
paper's nanoGPT fork. Logits are checked against a float64 forward written
here from their documented architecture: embeddings + learned positions,
pre-norm LayerNorm blocks, causal softmax(q k^T / sqrt(d_head)) v, GELU MLP,
tied output embedding.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import experiments.foreign
import experiments.model
from experiments.foreign import ForeignCheckpointError, from_projection_sharing, runnable
from experiments.model import GPT
from loaders.checkpoints import checkpoint_from_source, open_checkpoint
from loaders.layouts._body import Body, memory_source
from loaders.tensor_source import DictSource
from tests.loaders.paper_b import PAPER_B_CASES, paper_b_model
from tests.loaders.test_nanogpt_norm import small_gpt_checkpoint

D, H, DH, L, VOCAB, P = 16, 4, 4, 2, 300, 12

#: id -> (their attention modules: rows in heads, kv heads, expected variant, roles)
#: roles: q / k / v -> (module, first row, rows) in their layer's tensors
PS_LM = {
    "QKV": ({"c_attn": 3 * H}, H, "qkv",
            {"q": ("c_attn", 0, D), "k": ("c_attn", D, D), "v": ("c_attn", 2 * D, D)}),
    "Q-K=V": ({"c_q": H, "c_k": H}, H, "k_eq_v",
              {"q": ("c_q", 0, D), "k": ("c_k", 0, D), "v": ("c_k", 0, D)}),
    "Q=K-V": ({"c_k": H, "c_v": H}, H, "q_eq_k",
              {"q": ("c_k", 0, D), "k": ("c_k", 0, D), "v": ("c_v", 0, D)}),
    "Q=K=V": ({"c_k": H}, H, "q_eq_k_eq_v",
              {"q": ("c_k", 0, D), "k": ("c_k", 0, D), "v": ("c_k", 0, D)}),
    "GQA-2": ({"c_q": H, "c_k": 2, "c_v": 2}, 2, "qkv",
              {"q": ("c_q", 0, D), "k": ("c_k", 0, 2 * DH), "v": ("c_v", 0, 2 * DH)}),
    "MQA_fused": ({"c_attn": H + 2}, 1, "qkv",
                  {"q": ("c_attn", 0, D), "k": ("c_attn", D, DH), "v": ("c_attn", D + DH, DH)}),
    "Q-GQA-2": ({"c_q": H, "c_kv": 2}, 2, "k_eq_v",
                {"q": ("c_q", 0, D), "k": ("c_kv", 0, 2 * DH), "v": ("c_kv", 0, 2 * DH)}),
    "Q-MQA": ({"c_q": H, "c_kv": 1}, 1, "k_eq_v",
              {"q": ("c_q", 0, D), "k": ("c_kv", 0, DH), "v": ("c_kv", 0, DH)}),
}


def their_lm_sd(mods: dict[str, int], *, seed=0, use_bias=True, tied=True) -> dict[str, torch.Tensor]:
    """Their GPT's state_dict: top-level wte/wpe/ln_f, blocks h.{i} with ln_1, attn.<mods>,
    attn.c_proj, the causal-mask buffer attn.bias, ln_2, mlp.c_fc, mlp.c_proj."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731

    def lin(prefix, rows, cols):
        out = {f"{prefix}.weight": r(rows, cols)}
        if use_bias:
            out[f"{prefix}.bias"] = r(rows)
        return out

    sd = {"wte.weight": r(VOCAB, D), "wpe.weight": r(P, D),
          "ln_f.weight": 1 + r(D), "ln_f.bias": r(D)}
    for i in range(L):
        p = f"h.{i}"
        sd.update({f"{p}.ln_1.weight": 1 + r(D), f"{p}.ln_1.bias": r(D)})
        for m, heads in mods.items():
            sd.update(lin(f"{p}.attn.{m}", heads * DH, D))
        sd.update(lin(f"{p}.attn.c_proj", D, D))
        sd[f"{p}.attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        sd.update({f"{p}.ln_2.weight": 1 + r(D), f"{p}.ln_2.bias": r(D)})
        sd.update(lin(f"{p}.mlp.c_fc", 4 * D, D))
        sd.update(lin(f"{p}.mlp.c_proj", D, 4 * D))
    if not tied:
        sd["lm_head.weight"] = r(VOCAB, D)
    return sd


def their_config(n_kv_groups=None, **extra) -> dict:
    conf = {"vocab_size": VOCAB, "n_positions": P, "n_layer": L, "n_embd": D, "n_head": H,
            "n_inner": 4 * D, "embd_pdrop": 0.0, "resid_pdrop": 0.1, "attn_pdrop": 0.0,
            "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "use_bias": True,
            "tie_word_embeddings": True, "use_flash_attention": False}
    if n_kv_groups is not None:
        conf["n_kv_groups"] = n_kv_groups
    conf.update(extra)
    return conf


def their_forward(sd, idx, roles, n_kv, eps=1e-5, capture=None) -> torch.Tensor:
    """Float64 logits (B, T, vocab) of their language model; ``capture``: list
    that receives each layer's keys (B, n_kv, T, d_head)."""
    sd = {k: v.double() for k, v in sd.items()}
    B, T = idx.shape

    def lin(x, p):
        return F.linear(x, sd[p + ".weight"], sd.get(p + ".bias"))

    def ln(x, p):
        return F.layer_norm(x, (D,), sd[p + ".weight"], sd[p + ".bias"], eps)

    def heads(t, n):
        return t.view(B, T, n, DH).transpose(1, 2)            # (B, n, T, dh)

    x = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        h = ln(x, f"h.{i}.ln_1")
        out = {}
        for role, (m, start, rows) in roles.items():
            out[role] = lin(h, f"h.{i}.attn.{m}")[..., start:start + rows]
        nq = out["q"].shape[-1] // DH
        q, k, v = heads(out["q"], nq), heads(out["k"], n_kv), heads(out["v"], n_kv)
        if capture is not None:
            capture.append(k)
        q = q.repeat_interleave(H // nq, dim=1)                # q = k variants: per kv head
        k, v = k.repeat_interleave(H // n_kv, dim=1), v.repeat_interleave(H // n_kv, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(DH)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + lin(y, f"h.{i}.attn.c_proj")
        x = x + lin(F.gelu(lin(ln(x, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc")), f"h.{i}.mlp.c_proj")
    out_embed = sd.get("lm_head.weight", sd["wte.weight"])
    return ln(x, "ln_f") @ out_embed.T


def _idx(seed=1):
    return torch.randint(0, VOCAB, (2, P), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", list(PS_LM))
def test_projection_sharing_lm_matches_reference(case):
    mods, n_kv, variant, roles = PS_LM[case]
    sd = their_lm_sd(mods)
    before = {k: v.clone() for k, v in sd.items()}
    conf = their_config(n_kv_groups=n_kv if "c_kv" in mods else None)
    model = from_projection_sharing({"module." + k: v for k, v in sd.items()}, conf).eval()
    assert (model.cfg.variant, model.cfg.n_head, model.cfg.n_kv_heads) == (variant, H, n_kv)
    assert model.cfg.tie_embeddings and model.cfg.block_size == P and model.cfg.d_mlp == 4 * D
    idx = _idx()
    with torch.inference_mode():
        got = model(idx)[0]
    torch.testing.assert_close(got.double(), their_forward(sd, idx, roles, n_kv), rtol=1e-4, atol=1e-4)
    assert all(torch.equal(sd[k], before[k]) for k in sd)          # inputs untouched
    # the weight converter reads the same variant and kv heads
    meta = checkpoint_from_source(DictSource(sd, config=conf, extras={"tokens_seen": 1})).meta
    assert (meta.architecture, meta.variant, meta.n_kv_heads) == ("projection_sharing", variant, n_kv)
    assert runnable("projection_sharing", sd, conf, variant=meta.variant, n_heads=meta.n_heads,
                    n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale).cfg.variant == variant


@pytest.mark.parametrize("file,cls,size,heads,variant", PAPER_B_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in PAPER_B_CASES])
def test_paper_b_model_classes_run_as_their_models(file, cls, size, heads, variant):
    """Their own model classes (vendored, tests/loaders/paper_b): the GPT built from
    their state_dict gives their model's logits."""
    model, conf = paper_b_model(file, cls, *heads)
    sd = model.state_dict()
    ours = from_projection_sharing(sd, dataclasses.asdict(conf)).eval()
    assert (ours.cfg.variant, ours.cfg.n_head, ours.cfg.n_kv_heads) == (variant, *heads)
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        torch.testing.assert_close(ours(idx)[0], model(idx)[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("use_bias, tied", [(False, True), (True, False)])
def test_projection_sharing_without_linear_biases_and_untied_head(use_bias, tied):
    """use_bias=False drops the Linear biases but their LayerNorms keep theirs;
    tie_word_embeddings=False adds an lm_head without bias."""
    mods, n_kv, _, roles = PS_LM["Q-K=V"]
    sd = their_lm_sd(mods, use_bias=use_bias, tied=tied)
    assert ("h.0.attn.c_q.bias" in sd) == use_bias and "h.0.ln_1.bias" in sd
    model = from_projection_sharing(sd, their_config(use_bias=use_bias, tie_word_embeddings=tied))
    assert model.cfg.tie_embeddings == tied
    idx = _idx(2)
    with torch.inference_mode():
        got = model.eval()(idx)[0]
    torch.testing.assert_close(got.double(), their_forward(sd, idx, roles, n_kv), rtol=1e-4, atol=1e-4)


def test_mha_checkpoint_with_default_n_kv_groups():
    """Their ModelConfig declares n_kv_groups=1 for every variant: shapes decide."""
    mods, _, _, roles = PS_LM["QKV"]
    sd = their_lm_sd(mods)
    conf = their_config(n_kv_groups=1)
    meta = checkpoint_from_source(DictSource(sd, config=conf, extras={"tokens_seen": 1})).meta
    assert (meta.variant, meta.n_kv_heads) == ("qkv", H)
    model = runnable("projection_sharing", sd, conf, variant="qkv", n_heads=H, n_kv_heads=H,
                     attn_scale=meta.attn_scale)
    assert model.cfg.n_kv_heads == H


def test_projection_sharing_layer_norm_eps_from_config():
    mods, n_kv, _, roles = PS_LM["QKV"]
    sd = their_lm_sd(mods)
    model = from_projection_sharing(sd, their_config(layer_norm_epsilon=0.5)).eval()
    assert model.cfg.norm_eps == 0.5
    idx = _idx(3)
    with torch.inference_mode():
        got = model(idx)[0]
    torch.testing.assert_close(got.double(), their_forward(sd, idx, roles, n_kv, eps=0.5),
                               rtol=1e-4, atol=1e-4)


def test_extra_attention_tensors_are_refused():
    """E.g. the 2D positional correction of a (Q=K)+ variant: this GPT cannot run it."""
    sd = their_lm_sd({"c_k": H, "c_v": H})
    for i in range(L):
        sd[f"h.{i}.attn.pos_w"] = torch.zeros(10)
        sd[f"h.{i}.attn.pos_b"] = torch.zeros(1)
    with pytest.raises(ForeignCheckpointError) as e:
        from_projection_sharing(sd, their_config())
    assert str(e.value) == (
        "tensors this GPT has no place for: h.0.attn.pos_b, h.0.attn.pos_w, h.1.attn.pos_b, "
        "h.1.attn.pos_w (a q_eq_k layer runs c_k, c_v and c_proj; the MLP is mlp.c_fc and "
        "mlp.c_proj)")


def test_synthetic_encoder_and_missing_head_count_messages():
    enc = {"embed.weight": torch.zeros(D, 10), "blocks.0.attn.c_q.weight": torch.zeros(D, D),
           "blocks.0.attn.c_kv.weight": torch.zeros(D, D)}
    with pytest.raises(ForeignCheckpointError) as e:
        from_projection_sharing(enc, {"n_head": H})
    assert str(e.value) == ("a synthetic-task encoder (blocks.N: one-hot inputs, no causal mask) "
                            "is not a causal language model")
    # the layout's own reading and message (one converter: loaders/layouts/projection_sharing.py)
    with pytest.raises(ForeignCheckpointError) as e:
        from_projection_sharing(their_lm_sd({"c_attn": 3 * H}), {"n_embd": D})
    assert str(e.value) == "config has no head count (n_head); it cannot be inferred from tensor shapes"
    with pytest.raises(ForeignCheckpointError) as e:
        from_projection_sharing(their_lm_sd({"c_q": H, "c_v": H}), their_config())
    assert str(e.value) == ("attention modules c_q, c_v at layer 0 match no projection-sharing variant; "
                            "expected one of c_attn | c_q+c_k+c_v | c_q+c_kv | c_q+c_k | c_k+c_v | "
                            "c_qk+c_v | c_k | c_kv | c_qkv")
    with pytest.raises(ForeignCheckpointError) as e:
        from_projection_sharing(their_lm_sd({"c_q": H, "c_kv": 2}), their_config(n_kv_groups=2),
                                n_kv_heads=1)
    assert str(e.value) == "the attention shapes give 2 kv heads, expected 1"


def test_runnable_refuses_a_different_reading():
    sd = their_lm_sd(PS_LM["Q-GQA-2"][0])
    with pytest.raises(ForeignCheckpointError) as e:
        runnable("projection_sharing", sd, their_config(n_kv_groups=2), variant="k_eq_v", n_heads=H,
                 n_kv_heads=1, attn_scale=DH ** -0.5)
    # the layout reads shared K=V at 2 kv heads (n_kv_groups=2): not the stored reading
    assert str(e.value) == ("the forward-pass model reads this checkpoint as k_eq_v with 4 heads, 2 kv "
                            "heads, scale 0.5; the weight converter as k_eq_v with 4 heads, 1 kv "
                            "heads, scale 0.5")
    with pytest.raises(ForeignCheckpointError) as e:
        runnable("gpt2", sd, {}, variant="qkv", n_heads=H, n_kv_heads=H, attn_scale=0.5)
    assert str(e.value) == "no GPT builder for a gpt2 checkpoint"


# ---- the query-free paper's nanoGPT fork ----------------------------------------------

def query_free_sd(mode: str, seed=4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    rows = 2 * D if mode == "identity" else 3 * D
    sd = {"transformer.wte.weight": r(VOCAB, D), "transformer.wpe.weight": r(P, D),
          "transformer.ln_f.weight": 1 + r(D), "transformer.ln_f.bias": r(D)}
    for i in range(L):
        p = f"transformer.h.{i}."
        sd.update({p + "ln_1.weight": 1 + r(D), p + "ln_1.bias": r(D),
                   p + "attn.c_attn.weight": r(rows, D), p + "attn.c_attn.bias": r(rows),
                   p + "attn.c_proj.weight": r(D, D), p + "attn.c_proj.bias": r(D),
                   p + "attn.bias": torch.tril(torch.ones(P, P)).view(1, 1, P, P),
                   p + "ln_2.weight": 1 + r(D), p + "ln_2.bias": r(D),
                   p + "mlp.c_fc.weight": r(4 * D, D), p + "mlp.c_fc.bias": r(4 * D),
                   p + "mlp.c_proj.weight": r(D, 4 * D), p + "mlp.c_proj.bias": r(D)})
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def query_free_forward(sd, idx, mode, scale) -> torch.Tensor:
    """Float64 logits of their CausalSelfAttention-based GPT (query_mode identity /
    original / residual / residual_gelu)."""
    sd = {k: v.double() for k, v in sd.items()}
    B, T = idx.shape

    def lin(x, p):
        return F.linear(x, sd[p + ".weight"], sd[p + ".bias"])

    def ln(x, p):
        return F.layer_norm(x, (D,), sd[p + ".weight"], sd[p + ".bias"], 1e-5)

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        p = f"transformer.h.{i}."
        h = ln(x, p + "ln_1")
        y = lin(h, p + "attn.c_attn")
        if mode == "identity":
            (k, v), q = y.split(D, -1), h
        else:
            q, k, v = y.split(D, -1)
            q = {"original": q, "residual": h + q, "residual_gelu": h + F.gelu(q)}[mode]
        q, k, v = (t.view(B, T, H, DH).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + lin((att @ v).transpose(1, 2).reshape(B, T, D), p + "attn.c_proj")
        x = x + lin(F.gelu(lin(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ sd["lm_head.weight"].T


@pytest.mark.parametrize("mode", ["identity", "original", "residual"])
def test_query_free_modes_match_reference(mode):
    sd = query_free_sd(mode)
    scale = 1 / (2 * math.sqrt(DH))
    config = {"n_layer": L, "num_heads": H, "n_embd": D, "head_size": DH, "bias": True,
              "scale": scale, "query_mode": mode}
    meta = checkpoint_from_source(DictSource(sd, config=config)).meta
    model = runnable(meta.architecture, sd, config, variant=meta.variant, n_heads=meta.n_heads,
                     n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale).eval()
    assert (meta.architecture, model.cfg.variant) == (
        "query_free", "wq_identity" if mode == "identity" else "qkv")
    idx = _idx(5)
    with torch.inference_mode():
        got = model(idx)[0]
    torch.testing.assert_close(got.double(), query_free_forward(sd, idx, mode, scale),
                               rtol=1e-4, atol=1e-4)


def test_query_free_residual_gelu_is_refused():
    sd = query_free_sd("residual_gelu")
    config = {"n_layer": L, "num_heads": H, "n_embd": D, "query_mode": "residual_gelu"}
    with pytest.raises(ForeignCheckpointError) as e:
        runnable("query_free", sd, config, variant="qkv", n_heads=H, n_kv_heads=H, attn_scale=0.125)
    assert str(e.value) == ("query_mode 'residual_gelu' (q = x + GELU(x Wq + bq), Wq the first d_model rows "
                            "of c_attn) is not a linear query, and this GPT computes q as x @ W_Q; runnable "
                            "modes: identity, original, residual")


def test_nanogpt_realworld_checkpoint_is_runnable(realworld):
    """sqtian/GPT_by_Hand's ckpt.pt through the dispatcher (gamma names, no biases, own lm_head)."""
    path = realworld / "checkpoints/nanogpt-gpt-by-hand/ckpt.pt"
    with open_checkpoint(path) as ckpt:
        meta = ckpt.meta
    ck = torch.load(path, weights_only=True, map_location="cpu")
    model = runnable(meta.architecture, ck["model"], ck["model_args"], variant=meta.variant,
                     n_heads=meta.n_heads, n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale,
                     norm=meta.norm).eval()
    assert isinstance(model, GPT) and (model.cfg.n_layer, model.cfg.n_head, model.cfg.d_model) == (2, 2, 16)
    sd = ck["model"]
    assert "transformer.h.0.attn.c_attn.bias" not in sd and "transformer.h.0.ln_1.gamma" in sd
    idx = torch.randint(0, model.cfg.vocab_size, (1, model.cfg.block_size),
                        generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(model(idx)[0].double(), _reference_nanogpt(sd, idx, 2, False, None),
                                   rtol=1e-4, atol=1e-4)


# ---- nanoGPT and the query-free fork, against a float64 reference --------------------

def _reference_nanogpt(sd: dict, idx: torch.Tensor, n_head: int, query_free: bool,
                       scale: float | None) -> torch.Tensor:
    """nanoGPT's forward written out with plain float64 ops (LayerNorm, exact GELU); biases
    where the state dict has them, norm ``gamma``/``beta`` names read as weight/bias, the
    output projection ``lm_head`` or else the tied ``wte``."""
    sd = {(k[:-5] + "weight" if k.endswith(".gamma") else k[:-4] + "bias" if k.endswith(".beta") else k):
          v.double() for k, v in sd.items()}
    d = sd["transformer.wte.weight"].shape[1]
    dh = d // n_head
    B, T = idx.shape
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    n_layer = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))

    def ln(x, p):
        return F.layer_norm(x, (d,), sd[p + ".weight"], sd.get(p + ".bias"), 1e-5)

    def lin(x, p):
        return F.linear(x, sd[p + ".weight"], sd.get(p + ".bias"))

    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        h = ln(x, p + "ln_1")
        qkv = lin(h, p + "attn.c_attn")
        if query_free:
            k, v = qkv.split(d, -1)
            q = h
        else:
            q, k, v = qkv.split(d, -1)
        q, k, v = (t.view(B, T, n_head, dh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(dh))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + lin(y, p + "attn.c_proj")
        x = x + lin(F.gelu(lin(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ sd.get("lm_head.weight", sd["transformer.wte.weight"]).T


def _nanogpt_sd(d=16, n_layer=2, vocab=40, block=12, rows=3) -> dict:
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2  # noqa: E731
    sd = {"transformer.wte.weight": r(vocab, d), "transformer.wpe.weight": r(block, d),
          "transformer.ln_f.weight": 1 + r(d), "transformer.ln_f.bias": r(d)}
    for i in range(n_layer):
        p = f"_orig_mod.transformer.h.{i}."
        sd.update({p + "ln_1.weight": 1 + r(d), p + "ln_1.bias": r(d),
                   p + "attn.c_attn.weight": r(rows * d, d), p + "attn.c_attn.bias": r(rows * d),
                   p + "attn.c_proj.weight": r(d, d), p + "attn.c_proj.bias": r(d),
                   p + "ln_2.weight": 1 + r(d), p + "ln_2.bias": r(d),
                   p + "mlp.c_fc.weight": r(4 * d, d), p + "mlp.c_fc.bias": r(4 * d),
                   p + "mlp.c_proj.weight": r(d, 4 * d), p + "mlp.c_proj.bias": r(d)})
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def _run_nanogpt(sd: dict, config: dict) -> GPT:
    """The GPT of a nanoGPT-style state dict through the layout the converter picks."""
    meta = checkpoint_from_source(memory_source(sd, config)).meta
    return runnable(meta.architecture, sd, config, variant=meta.variant, n_heads=meta.n_heads,
                    n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale, norm=meta.norm)


@pytest.mark.parametrize("query_free, scale", [(False, None), (True, 1 / (2 * math.sqrt(8)))])
def test_nanogpt_and_query_free_identity_match_reference(query_free, scale):
    """``_orig_mod.`` prefixes on some keys (torch.compile), stripped by the layouts' source."""
    sd = _nanogpt_sd(rows=2 if query_free else 3)
    before = {k: v.clone() for k, v in sd.items()}
    config = {"n_head": 2, **({"query_mode": "identity", "scale": scale} if query_free else {})}
    m = _run_nanogpt(sd, config).eval()
    assert m.cfg.variant == ("wq_identity" if query_free else "qkv")
    idx = torch.randint(0, 40, (2, 12))
    with torch.inference_mode():
        got = m(idx)[0]
    ref = _reference_nanogpt({k.removeprefix("_orig_mod."): v for k, v in sd.items()}, idx, 2,
                             query_free, scale)
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)
    assert all(torch.equal(sd[k], before[k]) for k in sd)


def test_query_free_identity_wrong_rows_message():
    sd = _nanogpt_sd(rows=3)
    with pytest.raises(ForeignCheckpointError) as e:
        runnable("query_free", sd, {"n_head": 2, "query_mode": "identity"}, variant="wq_identity",
                 n_heads=2, n_kv_heads=2, attn_scale=0.125)
    assert str(e.value) == ("layer 0 key 'transformer.h.0.attn.c_attn.weight' has shape (48, 16); "
                            "expected (32, 16) for d_model 16")


def test_checkpoint_key_names_are_written_in_the_layouts_only():
    """The papers', nanoGPT's and llama2.c's key names and config fields: in their layout
    modules, not in the model builder or the model (one converter per layout)."""
    theirs = ("c_attn", "c_q", "c_kv", "c_fc", "c_proj", "transformer.", "tok_embeddings", "feed_forward",
              "attention_norm", "ffn_norm", "_orig_mod", "module.", "gamma", "query_mode", "n_kv_groups",
              "layer_norm_epsilon", "rope_theta", "max_seq_len", "h.0.", "w1")
    for mod in (experiments.foreign, experiments.model):
        text = Path(mod.__file__).read_text()
        assert [name for name in theirs if name in text] == [], mod.__name__


def test_body_and_memory_source():
    """The layouts' in-memory source strips torch.compile's and DDP's prefixes; a Body names its MLP."""
    src = memory_source({"_orig_mod.module.wte.weight": torch.zeros(2, 2), "ln_f.bias": torch.zeros(2)},
                        {"n_head": 1})
    assert sorted(src.keys()) == ["ln_f.bias", "wte.weight"] and src.config == {"n_head": 1}
    with pytest.raises(ValueError) as e:
        Body({}, mlp="relu", context=4)
    assert str(e.value) == "mlp 'relu' is not one of gelu, swiglu"


def test_small_gpt_rmsnorm_swiglu_runs_as_its_model():
    """andrew-noble/small-gpt's model (tests/loaders/test_nanogpt_norm.py builds its state dict):
    the GPT gives the logits of its forward, written here from its model.py in float64:
    x = wte + wpe; x += c_proj(sdpa(c_attn(rms(x)))); x += w2(silu(w1 rms(x)) * w3 rms(x));
    lm_head(rms_f(x)); nn.RMSNorm(eps=None): finfo(float32).eps."""
    ck = small_gpt_checkpoint()
    sd, args = ck["model"], ck["model_args"]
    model = runnable("nanogpt", sd, args, variant="qkv", n_heads=2, n_kv_heads=2, attn_scale=32 ** -0.5,
                     norm="rmsnorm").eval()
    assert model.cfg.norm == "rmsnorm" and model.cfg.norm_eps == torch.finfo(torch.float32).eps
    idx = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(3))
    w = {k: v.double() for k, v in sd.items()}
    eps = torch.finfo(torch.float32).eps

    def rms(x, k):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[k]

    B, T = idx.shape
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][:T]
    for i in range(2):
        p = f"transformer.h.{i}."
        q, k, v = (rms(x, p + "ln_1.weight") @ w[p + "attn.c_attn.weight"].T).split(64, dim=2)
        q, k, v = (t.view(B, T, 2, 32).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, 64)
        x = x + y @ w[p + "attn.c_proj.weight"].T
        h = rms(x, p + "ln_2.weight")
        x = x + (F.silu(h @ w[p + "ffd.w1.weight"].T) * (h @ w[p + "ffd.w3.weight"].T)) @ w[p + "ffd.w2.weight"].T
    ref = rms(x, "transformer.ln_f.weight") @ w["lm_head.weight"].T
    with torch.inference_mode():
        torch.testing.assert_close(model(idx)[0].double(), ref, rtol=1e-4, atol=1e-4)
