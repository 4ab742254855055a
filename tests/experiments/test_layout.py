"""loaders/layouts/qkvscope.py: this project's checkpoints in canonical form.

Known answer: attention recomputed from the canonical tensors alone
(q_h = x @ W_Q[h] or the identity slice, k/v from kv head h // group,
y = sum_h softmax(q k^T * scale) v W_O[h]) equals the model's own attention
output, in float64.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from experiments.model import GPT, GPTConfig, KVCache, VARIANTS
from experiments.train import TrainConfig, save_checkpoint
from loaders.checkpoints import inspect_checkpoint, open_checkpoint
from loaders.errors import CheckpointFormatError

D, H, L = 32, 4, 2


def _model(variant: str, n_kv: int, **kw) -> GPT:
    torch.manual_seed(1)
    return GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=L, n_head=H, n_kv_heads=n_kv,
                         d_model=D, variant=variant, **kw)).eval()


def _save(model: GPT, path) -> str:
    save_checkpoint(model, path, step=7, tokens=700, final=True, tc=TrainConfig(weight_decay=0.03))
    return str(path)


def _attention_from_canonical(aw, x: torch.Tensor, n: int, n_kv: int, scale: float, plus=None) -> torch.Tensor:
    x = x.double()  # (T, d)
    T, d = x.shape
    dh = d // n
    group = n // n_kv
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    y = torch.zeros(T, d, dtype=torch.float64)
    for h in range(n):
        q = x[:, h * dh:(h + 1) * dh] if aw.W_Q is None else x @ aw.W_Q[h].double()
        if aw.b_Q is not None:
            q = q + aw.b_Q[h].double()
        k = x @ aw.W_K[h // group].double()
        v = x @ aw.W_V[h // group].double()
        if aw.b_K is not None:
            k, v = k + aw.b_K[h // group].double(), v + aw.b_V[h // group].double()
        scores = q @ k.T * scale
        if plus is not None:                # paper B's "+" correction: scores * sum(w) + P w + b
            w, b, P = (t.double() for t in plus)
            scores = scores * w.sum() + P[:T, :T] @ w + b
        att = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        y = y + att @ v @ aw.W_O[h].double()
    return y + (aw.b_O.double() if aw.b_O is not None else 0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_kv, bias", [(4, False), (2, True), (1, False)])
def test_canonical_attention_equals_model(tmp_path, variant, n_kv, bias):
    model = _model(variant, n_kv, bias=bias)
    path = _save(model, tmp_path / "m.safetensors")
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(5))
    with open_checkpoint(path) as ck:
        meta = ck.meta
        assert (meta.architecture, meta.variant, meta.n_heads, meta.n_kv_heads, meta.d_head) == \
            ("qkvscope", variant, H, n_kv, D // H)
        assert meta.params_total == model.n_params()
        assert meta.params_attention == model.n_attention_params()
        assert meta.config["run"] == {"step": 7, "tokens": 700, "final": True, "weight_decay": 0.03,
                                      "lr": 1e-3, "seed": 1337}
        for i in range(L):
            aw = ck.layer(i)
            assert (aw.W_Q is None) == (variant == "wq_identity")
            assert aw.W_K.shape == (n_kv, D, D // H) and aw.W_O.shape == (H, D // H, D)
            if variant in ("k_eq_v", "q_eq_k_eq_v"):
                assert torch.equal(aw.W_V, aw.W_K)
            if variant in ("q_eq_k", "q_eq_k_eq_v"):
                assert torch.equal(aw.W_Q, aw.W_K.repeat_interleave(H // n_kv, 0))
            # the container holds projections only; a "+" variant's correction comes from the model
            attn = model.blocks[i].attn
            plus = (attn.pos_w.detach(), attn.pos_b.detach(), attn.pos2d) if hasattr(attn, "pos_w") else None
            ref = _attention_from_canonical(aw, x, H, n_kv, meta.attn_scale, plus=plus)
            with torch.inference_mode():
                got = model.blocks[i].attn(x[None])[0]
            torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_kv", (4, 2, 1))
def test_cache_bytes_equal_info_kv_bytes_per_token(tmp_path, variant, n_kv):
    model = _model(variant, n_kv)
    info = inspect_checkpoint(_save(model, tmp_path / "m.safetensors"))
    cache = KVCache(L)
    with torch.inference_mode():
        model(torch.randint(0, 50, (2, 8)), cache=cache)
    assert info["variant"] == variant and info["n_kv_heads"] == n_kv
    assert cache.bytes_per_token() == info["kv_bytes_per_token"]


def test_bad_config_json_message(tmp_path):
    model = _model("qkv", 4)
    path = tmp_path / "bad.safetensors"
    save_file(model.export_state_dict(), str(path), metadata={"qkvscope_config": "{not json"})
    with pytest.raises(CheckpointFormatError) as e:
        open_checkpoint(path)
    assert str(e.value) == (f"{path}: safetensors metadata 'qkvscope_config' is not valid JSON "
                            "(Expecting property name enclosed in double quotes at character 1); "
                            "expected the model config as a JSON object")


def test_missing_tensor_message(tmp_path):
    model = _model("k_eq_v", 2)
    sd = model.export_state_dict()
    del sd["blocks.1.attn.kv.weight"]
    path = tmp_path / "missing.safetensors"
    save_file(sd, str(path), metadata={"qkvscope_config": json.dumps(model.cfg.to_dict())})
    with pytest.raises(CheckpointFormatError) as e:
        open_checkpoint(path)
    assert str(e.value) == (f"{path}: missing attention tensors for layout qkvscope: "
                            "'blocks.1.attn.kv.weight'")


def test_shape_contradicting_config_message(tmp_path):
    model = _model("qkv", 4)
    cfg = model.cfg.to_dict() | {"n_kv_heads": 2}
    path = tmp_path / "shape.safetensors"
    save_file(model.export_state_dict(), str(path), metadata={"qkvscope_config": json.dumps(cfg)})
    with pytest.raises(CheckpointFormatError) as e:
        open_checkpoint(path)
    assert str(e.value) == (f"{path}: layer 0 key 'blocks.0.attn.k.weight' has shape (32, 32); "
                            "expected (16, 32) for d_model 32, 4 heads, 2 kv heads of d_head 8")


def test_unknown_variant_message(tmp_path):
    model = _model("qkv", 4)
    cfg = model.cfg.to_dict() | {"variant": "kv_only"}
    path = tmp_path / "variant.safetensors"
    save_file(model.export_state_dict(), str(path), metadata={"qkvscope_config": json.dumps(cfg)})
    with pytest.raises(CheckpointFormatError) as e:
        open_checkpoint(path)
    assert str(e.value) == (f"{path}: qkvscope config variant 'kv_only' is not one of "
                            "qkv, wq_identity, q_eq_k, k_eq_v, q_eq_k_eq_v, q_eq_k_plus, q_eq_k_eq_v_plus")
