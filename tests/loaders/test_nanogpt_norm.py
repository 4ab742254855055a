"""The nanoGPT layout reads the norm from the config and the tensors, not a fixed 'layernorm'."""
from __future__ import annotations

import pytest
import torch

from loaders.checkpoints import checkpoint_from_source, open_checkpoint
from loaders.tensor_source import DictSource

D, L, H = 8, 2, 2


def sd(*, norm_bias: bool, linear_bias: bool, mlp=("c_fc", "c_proj"), norm_name="ln_1", gamma=False):
    out = {"transformer.wte.weight": torch.zeros(50, D), "transformer.wpe.weight": torch.zeros(16, D)}
    w = "gamma" if gamma else "weight"
    for i in range(L):
        p = f"transformer.h.{i}."
        out[p + "attn.c_attn.weight"] = torch.zeros(3 * D, D)
        out[p + "attn.c_proj.weight"] = torch.zeros(D, D)
        if linear_bias:
            out[p + "attn.c_attn.bias"] = torch.zeros(3 * D)
        for n in (norm_name, "ln_2"):
            out[f"{p}{n}.{w}"] = torch.ones(D)
            if norm_bias:
                out[f"{p}{n}.{'beta' if gamma else 'bias'}"] = torch.zeros(D)
        for m in mlp:
            out[f"{p}mlp.{m}.weight"] = torch.zeros(D, D)
    return out


CASES = [
    # (tensors, config beyond the geometry, expected norm)
    (dict(norm_bias=True, linear_bias=True), {"bias": True}, "layernorm"),          # nanoGPT, bias=True
    (dict(norm_bias=False, linear_bias=False), {"bias": False}, "layernorm"),       # nanoGPT, bias=False
    (dict(norm_bias=False, linear_bias=False, gamma=True), {"use_bias": False}, "layernorm"),  # GPT_by_Hand
    (dict(norm_bias=False, linear_bias=True), {}, "rmsnorm"),        # Linears with bias, norm without
    (dict(norm_bias=False, linear_bias=False), {}, "rmsnorm"),       # a weight alone, no bias setting
    (dict(norm_bias=False, linear_bias=False, mlp=("w1", "w2", "w3")), {"bias": False}, "rmsnorm"),
    (dict(norm_bias=False, linear_bias=False, norm_name="rms_1"), {"bias": False}, "rmsnorm"),
    (dict(norm_bias=False, linear_bias=False), {"bias": False, "norm_type": "rmsnorm"}, "rmsnorm"),
    (dict(norm_bias=False, linear_bias=False), {"use_rmsnorm": True, "bias": False}, "rmsnorm"),
    (dict(norm_bias=False, linear_bias=False, mlp=("w1", "w2", "w3")), {"normalization": "LayerNorm"},
     "layernorm"),
    (dict(norm_bias=True, linear_bias=False), {}, "layernorm"),      # a norm with a bias is a LayerNorm
]


@pytest.mark.parametrize("tensors, extra, expected", CASES)
def test_norm_from_config_and_tensors(tensors, extra, expected):
    config = {"n_layer": L, "n_head": H, "n_embd": D, **extra}
    meta = checkpoint_from_source(DictSource(sd(**tensors), config=config)).meta
    assert (meta.architecture, meta.norm) == ("nanogpt", expected)


def test_realworld_gpt_by_hand_is_layernorm(realworld):
    with open_checkpoint(realworld / "checkpoints/nanogpt-gpt-by-hand/ckpt.pt") as ckpt:
        assert ckpt.meta.norm == "layernorm"          # its LayerNorm(bias=use_bias=False): gamma only


# ---- andrew-noble/small-gpt: nn.RMSNorm and a SwiGLU MLP under ffd.w1/w2/w3 ------------
# No licence in that repository, so its model is not copied: the state dict below has
# exactly the key names and shapes its model.py (commit 806a4de6) gives, and the
# checkpoint dict is the one its train.py saves.

def small_gpt_checkpoint(*, n_layer=2, n_head=2, n_embed=64, block_size=64, vocab=96, seed=0) -> dict:
    """``{"model", "model_args", "iter_num", "best_val_loss"}`` as small-gpt's train.py saves it:
    ``transformer.{wte, h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, ffd.w1/w2/w3}, ln_f, wpe}``
    and ``lm_head`` (tied to wte: one tensor under both names); ``nn.RMSNorm`` weights only;
    every Linear ``bias=False``; ``FeedForward`` hidden ``int(2 * 4 * n_embed / 3)``; no causal-mask
    buffer (torch 2 has scaled_dot_product_attention, so ``self.flash`` is true)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.1  # noqa: E731
    hidden = int(2 * (4 * n_embed) / 3)
    wte = r(vocab, n_embed)
    sd = {"transformer.wte.weight": wte}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        sd.update({p + "ln_1.weight": 1 + r(n_embed), p + "attn.c_attn.weight": r(3 * n_embed, n_embed),
                   p + "attn.c_proj.weight": r(n_embed, n_embed), p + "ln_2.weight": 1 + r(n_embed),
                   p + "ffd.w1.weight": r(hidden, n_embed), p + "ffd.w2.weight": r(n_embed, hidden),
                   p + "ffd.w3.weight": r(hidden, n_embed)})
    sd.update({"transformer.ln_f.weight": 1 + r(n_embed), "transformer.wpe.weight": r(block_size, n_embed),
               "lm_head.weight": wte})
    args = {"n_layer": n_layer, "n_head": n_head, "n_embed": n_embed, "block_size": block_size,
            "bias": False, "vocab_size": vocab, "dropout": 0.0}
    return {"model": sd, "model_args": args, "iter_num": 20, "best_val_loss": torch.tensor(5.1)}


def test_small_gpt_reads_rmsnorm_and_says_how(tmp_path):
    torch.save(small_gpt_checkpoint(), tmp_path / "ckpt.pt")
    with open_checkpoint(tmp_path / "ckpt.pt") as ckpt:
        m = ckpt.meta.to_json()
    assert (m["architecture"], m["variant"], m["norm"], m["n_heads"], m["d_model"], m["d_head"]) == (
        "nanogpt", "qkv", "rmsnorm", 2, 64, 32)
    # its model_args say bias=False, as a bias-free LayerNorm's would: the SwiGLU block decides
    assert m["notes"]["norm"] == (
        "rmsnorm: norm weights without a bias beside a SwiGLU MLP (ffd.w1/w3/w2), the Llama-style "
        "block; the weights alone cannot tell nn.RMSNorm from a bias-free LayerNorm")


def test_nanogpt_bias_free_layernorm_note():
    meta = checkpoint_from_source(DictSource(sd(norm_bias=False, linear_bias=False),
                                             config={"n_layer": L, "n_head": H, "bias": False})).meta
    assert meta.notes["norm"] == (
        "layernorm: norm weights without a bias and the config's bias=False (nanoGPT's "
        "LayerNorm(bias=False)); the weights alone cannot tell nn.RMSNorm from a bias-free LayerNorm")
