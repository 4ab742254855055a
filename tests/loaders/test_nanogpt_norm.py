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
