"""The two papers' layouts, from state dicts built here (SYNTHETIC: random
tensors with the key names, shapes and config fields read from the papers'
code, not files those repositories produced).

* Query-free attention, MarkoKarbevski/Wqkv_necessity ``model.py``:
  ``transformer.h.{i}.attn.c_attn`` = ``Linear(d, 2d)`` (identity) or
  ``Linear(d, 3d)`` (original/residual/residual_gelu); ``model_args`` with
  ``n_layer``, ``num_heads``, ``n_embd``, ``head_size``, ``bias``, ``scale``,
  ``query_mode`` (older configs: ``use_query_weights``).
* Projection sharing, Brainchip-Inc/Do-Transformers-Need-3-Projections:
  ``{step, epoch, tokens_seen, model_state_dict, val_metrics, model_config,
  train_config}`` (``transformer_KQV_300M_fineweb.py``); LM state dicts with
  top-level ``wte``/``wpe``/``ln_f`` and blocks ``h.{i}`` holding ``ln_1``,
  ``attn.{c_q,c_k,c_proj}`` (``GPT_QKV_KEqualsV``: v = k = c_k(x)) or
  ``attn.c_attn`` rows ``[q; k; v]`` (QKV baseline), the causal-mask buffer
  ``attn.bias`` ``[1, 1, P, P]``, ``ln_2``, ``mlp``; ``model_config`` with
  ``n_kv_groups`` (default 1 for every variant, ``run_eval.py``); synthetic
  encoders ``blocks.{i}.attn.*`` with ``c_qk``/``c_kv``/``c_qkv``. The LM
  state dicts come from ``tests/experiments/test_foreign.py``.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from loaders.checkpoints import checkpoint_from_source, open_checkpoint
from loaders.errors import CheckpointFormatError
from loaders.tensor_source import DictSource
from tests.experiments.test_foreign import PS_LM, their_config, their_lm_sd
from tests.loaders.paper_b import PAPER_B_CASES, paper_b_model

D, H, DH, L = 16, 4, 4, 2


def _lin(rows, cols, bias, g, prefix):
    out = {f"{prefix}.weight": torch.randn(rows, cols, generator=g)}
    if bias:
        out[f"{prefix}.bias"] = torch.randn(rows, generator=g)
    return out


def _heads(t, n):
    """(B, T, n*dh) -> (B, n, T, dh)"""
    B, T, _ = t.shape
    return t.view(B, T, n, -1).transpose(1, 2)


# ---- query-free ----------------------------------------------------------------

def query_free_sd(mode, bias, g):
    rows = 2 * D if mode == "identity" else 3 * D
    sd = {"transformer.wte.weight": torch.randn(32, D, generator=g),
          "transformer.wpe.weight": torch.randn(8, D, generator=g)}
    for i in range(L):
        p = f"transformer.h.{i}"
        sd[f"{p}.ln_1.weight"] = torch.ones(D)
        sd.update(_lin(rows, D, bias, g, f"{p}.attn.c_attn"))
        sd.update(_lin(D, D, bias, g, f"{p}.attn.c_proj"))
        # the causal-mask buffer their non-flash path registers: not a parameter
        sd[f"{p}.attn.bias"] = torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def their_query_free_qkv(sd, i, x, mode):
    """q, k, v of layer i as their CausalSelfAttention.forward computes them."""
    p = f"transformer.h.{i}.attn.c_attn"
    y = F.linear(x, sd[f"{p}.weight"], sd.get(f"{p}.bias"))
    if mode == "identity":
        k, v = y.split(D, dim=2)
        q = x
    else:
        q, k, v = y.split(D, dim=2)
        if mode == "residual":
            q = x + q
        elif mode == "residual_gelu":
            q = x + F.gelu(q)
    return _heads(q, H), _heads(k, H), _heads(v, H)


@pytest.mark.parametrize("mode,bias", [("identity", False), ("identity", True), ("original", True),
                                       ("residual", True), ("residual_gelu", True)])
def test_query_free_modes(mode, bias):
    g = torch.Generator().manual_seed(0)
    sd = query_free_sd(mode, bias, g)
    scale = 1 / (2 * math.sqrt(DH))
    args = {"n_layer": L, "num_heads": H, "n_embd": D, "head_size": DH, "bias": bias,
            "scale": scale, "query_mode": mode}
    ckpt = checkpoint_from_source(DictSource(sd, config=args))
    meta = ckpt.meta
    assert (meta.architecture, meta.variant) == (
        "query_free", "wq_identity" if mode == "identity" else "qkv")
    assert (meta.n_layers, meta.n_heads, meta.d_model, meta.d_head) == (L, H, D, DH)
    assert meta.attn_scale == scale
    rows = 2 if mode == "identity" else 3
    assert meta.params_attention == L * (rows * D * D + D * D + bias * (rows * D + D))
    assert meta.params_total == 32 * D + 8 * D + L * (D + rows * D * D + D * D
                                                     + bias * (rows * D + D))
    x = torch.randn(2, 5, D, generator=g)
    for i in range(L):
        q_ref, k_ref, v_ref = their_query_free_qkv(sd, i, x, mode)
        lw = ckpt.layer(i)
        for h in range(H):
            if mode == "identity":
                assert lw.W_Q is None and lw.b_Q is None
                q = x[..., h * DH:(h + 1) * DH]
            elif mode == "residual_gelu":
                q = x[..., h * DH:(h + 1) * DH] + F.gelu(x @ lw.W_Q[h] + lw.b_Q[h])
            else:
                q = x @ lw.W_Q[h] + lw.b_Q[h]
            b_k = 0 if lw.b_K is None else lw.b_K[h]
            b_v = 0 if lw.b_V is None else lw.b_V[h]
            torch.testing.assert_close(q, q_ref[:, h], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(x @ lw.W_K[h] + b_k, k_ref[:, h], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(x @ lw.W_V[h] + b_v, v_ref[:, h], atol=1e-5, rtol=1e-5)


def test_query_free_old_config_and_shape_only_detection():
    g = torch.Generator().manual_seed(1)
    sd = query_free_sd("identity", False, g)
    old = {"n_layer": L, "num_heads": H, "n_embd": D, "use_query_weights": False}
    meta = checkpoint_from_source(DictSource(sd, config=old)).meta
    assert (meta.architecture, meta.variant, meta.attn_scale) == ("query_free", "wq_identity",
                                                                  0.125)
    # no query_mode at all: a c_attn of 2*d_model rows is the identity variant
    meta = checkpoint_from_source(DictSource(sd, config={"n_head": H})).meta
    assert (meta.architecture, meta.variant) == ("query_free", "wq_identity")


def test_query_free_unknown_mode():
    sd = query_free_sd("original", False, torch.Generator().manual_seed(2))
    args = {"n_layer": L, "num_heads": H, "n_embd": D, "query_mode": "sideways"}
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(DictSource(sd, config=args, path="qf.pt"))
    assert str(e.value) == ("qf.pt: query_mode 'sideways' is not one of identity, original, "
                            "residual, residual_gelu")


def test_query_free_through_a_file(tmp_path):
    sd = query_free_sd("identity", False, torch.Generator().manual_seed(3))
    args = {"n_layer": L, "num_heads": H, "n_embd": D, "query_mode": "identity",
            "scale": 0.0625}
    torch.save({"model": {"_orig_mod." + k: v for k, v in sd.items()}, "model_args": args,
                "iter_num": 250}, tmp_path / "ckpt.pt")
    with open_checkpoint(tmp_path / "ckpt.pt") as ckpt:
        assert (ckpt.meta.architecture, ckpt.meta.variant) == ("query_free", "wq_identity")
        assert ckpt.layer(1).W_Q is None


# ---- projection sharing ------------------------------------------------------------

def ps_sd(mods, g, n_kv=H, prefix="h", bias=True):
    """mods: module name -> rows (in units of d_head)."""
    sd = {"wte.weight": torch.randn(32, D, generator=g), "wpe.weight": torch.randn(8, D, generator=g)}
    for i in range(L):
        p = f"{prefix}.{i}"
        sd[f"{p}.ln_1.weight"] = torch.ones(D)
        sd[f"{p}.ln_1.bias"] = torch.zeros(D)
        for m, rows in mods.items():
            sd.update(_lin(rows * DH, D, bias, g, f"{p}.attn.{m}"))
        sd.update(_lin(D, D, bias, g, f"{p}.attn.c_proj"))
    return sd


def their_projections(sd, i, x, roles, n_kv, prefix="h"):
    """q, k, v as their attention modules compute them; roles: q/k/v -> (module, row slice)."""
    out = {}
    for r, (m, sl) in roles.items():
        p = f"{prefix}.{i}.attn.{m}"
        y = F.linear(x, sd[f"{p}.weight"], sd.get(f"{p}.bias"))
        out[r] = y[..., sl]
    return out


KV = 2
PS_CASES = [
    # id, modules -> rows/DH, config extra, prefix, expected (variant, n_kv), roles
    ("QKV_c_attn", {"c_attn": 3 * H}, {}, "h", ("qkv", H),
     {"q": ("c_attn", slice(0, D)), "k": ("c_attn", slice(D, 2 * D)),
      "v": ("c_attn", slice(2 * D, 3 * D))}),
    ("Q-K=V_llm", {"c_q": H, "c_k": H}, {}, "h", ("k_eq_v", H),
     {"q": ("c_q", slice(None)), "k": ("c_k", slice(None)), "v": ("c_k", slice(None))}),
    ("Q-GQA", {"c_q": H, "c_kv": KV}, {"n_kv_groups": KV}, "h", ("k_eq_v", KV),
     {"q": ("c_q", slice(None)), "k": ("c_kv", slice(None)), "v": ("c_kv", slice(None))}),
    ("Q-MQA", {"c_q": H, "c_kv": 1}, {"n_kv_groups": 1}, "h", ("k_eq_v", 1),
     {"q": ("c_q", slice(None)), "k": ("c_kv", slice(None)), "v": ("c_kv", slice(None))}),
    ("GQA_packed", {"c_q": H, "c_kv": 2 * KV}, {"n_kv_groups": KV}, "h", ("qkv", KV),
     {"q": ("c_q", slice(None)), "k": ("c_kv", slice(0, KV * DH)),
      "v": ("c_kv", slice(KV * DH, 2 * KV * DH))}),
    ("GQA_separate", {"c_q": H, "c_k": KV, "c_v": KV}, {"n_kv_groups": KV}, "h", ("qkv", KV),
     {"q": ("c_q", slice(None)), "k": ("c_k", slice(None)), "v": ("c_v", slice(None))}),
    ("Q=K-V", {"c_k": H, "c_v": H}, {}, "h", ("q_eq_k", H),
     {"q": ("c_k", slice(None)), "k": ("c_k", slice(None)), "v": ("c_v", slice(None))}),
    ("Q=K=V", {"c_k": H}, {}, "h", ("q_eq_k_eq_v", H),
     {"q": ("c_k", slice(None)), "k": ("c_k", slice(None)), "v": ("c_k", slice(None))}),
    ("synthetic_Q=K!=V", {"c_qk": H, "c_v": H}, {}, "blocks", ("q_eq_k", H),
     {"q": ("c_qk", slice(None)), "k": ("c_qk", slice(None)), "v": ("c_v", slice(None))}),
    ("synthetic_Q!=K=V", {"c_q": H, "c_kv": H}, {}, "blocks", ("k_eq_v", H),
     {"q": ("c_q", slice(None)), "k": ("c_kv", slice(None)), "v": ("c_kv", slice(None))}),
    ("synthetic_Q=K=V", {"c_qkv": H}, {}, "blocks", ("q_eq_k_eq_v", H),
     {"q": ("c_qkv", slice(None)), "k": ("c_qkv", slice(None)), "v": ("c_qkv", slice(None))}),
]


@pytest.mark.parametrize("case", PS_CASES, ids=[c[0] for c in PS_CASES])
def test_projection_sharing_variants(case):
    _, mods, extra, prefix, (variant, n_kv), roles = case
    g = torch.Generator().manual_seed(4)
    sd = ps_sd(mods, g, prefix=prefix)
    conf = {"n_layer": L, "n_head": H, "n_embd": D, "n_positions": 8, "use_bias": True, **extra}
    if prefix == "blocks":   # synthetic_tasks.py exports keep the config under "config"
        source = DictSource(sd, config={}, extras={"config": conf, "variant": case[0]})
    else:
        source = DictSource(sd, config=conf, extras={"train_config": {"weight_decay": 0.1},
                                                     "step": 1000, "tokens_seen": 10})
    ckpt = checkpoint_from_source(source)
    meta = ckpt.meta
    assert (meta.architecture, meta.variant, meta.n_kv_heads) == ("projection_sharing", variant, n_kv)
    assert (meta.n_layers, meta.n_heads, meta.d_model, meta.d_head) == (L, H, D, DH)
    # every stored attention tensor once, tied or not
    assert meta.params_attention == sum(
        v.numel() for k, v in sd.items() if ".attn." in k)
    assert meta.kv_bytes_per_token == L * (1 if "eq_v" in variant else 2) * n_kv * DH * 4
    x = torch.randn(2, 5, D, generator=g)
    group = H // n_kv
    for i in range(L):
        ref = their_projections(sd, i, x, roles, n_kv, prefix)
        lw = ckpt.layer(i)
        q_ref = _heads(ref["q"], H if variant not in ("q_eq_k", "q_eq_k_eq_v") else n_kv)
        k_ref, v_ref = _heads(ref["k"], n_kv), _heads(ref["v"], n_kv)
        for h in range(H):
            kv = h // group
            qh = q_ref[:, h] if q_ref.shape[1] == H else q_ref[:, kv]
            torch.testing.assert_close(x @ lw.W_Q[h] + lw.b_Q[h], qh, atol=1e-5, rtol=1e-5)
        for j in range(n_kv):
            torch.testing.assert_close(x @ lw.W_K[j] + lw.b_K[j], k_ref[:, j], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(x @ lw.W_V[j] + lw.b_V[j], v_ref[:, j], atol=1e-5, rtol=1e-5)
        if variant in ("k_eq_v", "q_eq_k_eq_v"):
            assert torch.equal(lw.W_K, lw.W_V) and lw.W_K is not lw.W_V
        if variant in ("q_eq_k", "q_eq_k_eq_v"):
            assert torch.equal(lw.W_Q, lw.W_K.repeat_interleave(group, 0))


def test_projection_sharing_unknown_module_mix():
    sd = ps_sd({"c_q": H, "c_v": H}, torch.Generator().manual_seed(5))
    conf = {"n_layer": L, "n_head": H, "n_embd": D}
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(DictSource(sd, config=conf, path="ps.pt"))
    assert str(e.value) == (
        "ps.pt: attention modules c_q, c_v at layer 0 match no projection-sharing variant; "
        "expected one of c_attn | c_q+c_k+c_v | c_q+c_kv | c_q+c_k | c_k+c_v | c_qk+c_v | "
        "c_k | c_kv | c_qkv")


def test_projection_sharing_kv_shape_contradicts_config():
    sd = ps_sd({"c_q": H, "c_kv": KV}, torch.Generator().manual_seed(6))
    sd["h.1.attn.c_kv.weight"] = torch.randn(3 * DH, D)
    conf = {"n_layer": L, "n_head": H, "n_embd": D, "n_kv_groups": KV}
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(DictSource(sd, config=conf, path="ps.pt"))
    assert str(e.value) == ("ps.pt: layer 1 key 'h.1.attn.c_kv.weight' has shape (12, 16); "
                            "expected (8, 16) for d_model 16, 4 heads, 2 kv heads of d_head 4")


def test_projection_sharing_paper_checkpoint_file(tmp_path):
    """Their top-level dict, saved with a DDP ``module.`` prefix, read from disk."""
    sd = ps_sd({"c_q": H, "c_k": H}, torch.Generator().manual_seed(7))
    torch.save({"step": 33908, "epoch": 0, "tokens_seen": 10_000,
                "model_state_dict": {"module." + k: v for k, v in sd.items()},
                "val_metrics": {"loss": 3.058, "perplexity": 21.28},
                "model_config": {"n_layer": L, "n_embd": D, "n_head": H, "n_inner": 4 * D,
                                 "n_positions": 8, "vocab_size": 32},
                "train_config": {"weight_decay": 0.1}}, tmp_path / "final_model.pt")
    with open_checkpoint(tmp_path / "final_model.pt") as ckpt:
        assert (ckpt.meta.architecture, ckpt.meta.variant) == ("projection_sharing", "k_eq_v")


@pytest.mark.parametrize("case", ["QKV", "Q-K=V", "Q=K-V", "Q=K=V", "GQA-2", "MQA_fused", "Q-GQA-2",
                                  "Q-MQA"])
def test_projection_sharing_lm_state_dicts(case):
    """Their LM layout with every key (buffers, MLP, norms) and their full
    model_config, whose n_kv_groups is 1 unless the file is a c_kv one."""
    mods, n_kv, variant, roles = PS_LM[case]
    sd = their_lm_sd(mods)
    conf = their_config(n_kv_groups=n_kv if "c_kv" in mods else 1)
    ckpt = checkpoint_from_source(DictSource(sd, config=conf, extras={
        "step": 33908, "epoch": 0, "tokens_seen": 10_000, "val_metrics": {"loss": 3.0},
        "train_config": {"weight_decay": 0.1}}))
    meta = ckpt.meta
    assert (meta.architecture, meta.variant, meta.n_heads, meta.n_kv_heads, meta.d_head) == (
        "projection_sharing", variant, H, n_kv, DH)
    assert meta.attn_scale == pytest.approx(DH ** -0.5)
    assert meta.params_total == sum(v.numel() for k, v in sd.items() if not k.endswith(".attn.bias"))
    assert meta.params_attention == sum(v.numel() for k, v in sd.items()
                                        if ".attn.c_" in k)
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(8))
    group = H // n_kv
    for i in range(L):
        lw = ckpt.layer(i)
        out = {r: F.linear(x, sd[f"h.{i}.attn.{m}.weight"], sd[f"h.{i}.attn.{m}.bias"])[:, a:a + n]
               for r, (m, a, n) in roles.items()}
        for j in range(n_kv):
            torch.testing.assert_close(x @ lw.W_K[j] + lw.b_K[j], out["k"][:, j * DH:(j + 1) * DH])
            torch.testing.assert_close(x @ lw.W_V[j] + lw.b_V[j], out["v"][:, j * DH:(j + 1) * DH])
        for h in range(H):
            qh = h if out["q"].shape[1] == H * DH else h // group   # q = k: the kv head's key
            torch.testing.assert_close(x @ lw.W_Q[h] + lw.b_Q[h], out["q"][:, qh * DH:(qh + 1) * DH])


def test_projection_sharing_c_attn_rows_fit_no_head_count():
    sd = their_lm_sd({"c_attn": 3 * H})
    for i in range(L):
        sd[f"h.{i}.attn.c_attn.weight"] = torch.zeros(3 * D + 1, D)
        sd[f"h.{i}.attn.c_attn.bias"] = torch.zeros(3 * D + 1)
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(DictSource(sd, config=their_config(), extras={"tokens_seen": 1},
                                          path="ps.pt"))
    assert str(e.value) == ("ps.pt: layer 0 key 'h.0.attn.c_attn.weight' has shape (49, 16); "
                            "expected (48, 16) for d_model 16, 4 heads of d_head 4")


# ---- projection sharing: their own model classes -------------------------------------
# Every language-model file of Brainchip-Inc/Do-Transformers-Need-3-Projections, built
# by its own model class (tests/loaders/paper_b).


def canonical_attention(lw, meta, x):
    """Causal softmax attention computed from the canonical tensors, (B, T, d)."""
    T = x.shape[1]
    group = meta.n_heads // meta.n_kv_heads
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    out = 0
    for h in range(meta.n_heads):
        kv = h // group
        q = x @ lw.W_Q[h] + (0 if lw.b_Q is None else lw.b_Q[h])
        k = x @ lw.W_K[kv] + (0 if lw.b_K is None else lw.b_K[kv])
        v = x @ lw.W_V[kv] + (0 if lw.b_V is None else lw.b_V[kv])
        a = (q @ k.transpose(-1, -2) * meta.attn_scale).masked_fill(~mask, float("-inf")).softmax(-1)
        out = out + a @ v @ lw.W_O[h]
    return out + (0 if lw.b_O is None else lw.b_O)


@pytest.mark.parametrize("file,cls,size,heads,variant", PAPER_B_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in PAPER_B_CASES])
def test_paper_b_model_classes(tmp_path, file, cls, size, heads, variant):
    """Each of their model classes, saved as their training script saves final_model.pt,
    reads with its variant and geometry, and the canonical tensors compute what their
    attention module computes."""
    n_head, n_kv = heads
    model, conf = paper_b_model(file, cls, n_head, n_kv)
    path = tmp_path / "final_model.pt"
    torch.save({"step": 100, "epoch": 0, "tokens_seen": 6400, "model_state_dict": model.state_dict(),
                "val_metrics": {"loss": 4.1, "perplexity": 60.3},
                "model_config": dataclasses.asdict(conf), "train_config": {"weight_decay": 0.1}}, path)
    with open_checkpoint(path) as ckpt:
        got = ckpt.meta.to_json()
        assert {k: got[k] for k in ("architecture", "variant", "n_layers", "n_heads", "n_kv_heads",
                                    "d_model", "d_head")} == {
            "architecture": "projection_sharing", "variant": variant, "n_layers": 2, "n_heads": n_head,
            "n_kv_heads": n_kv, "d_model": 4 * n_head, "d_head": 4}
        assert got["params"]["total"] == sum(p.numel() for p in model.parameters())
        assert got["params"]["attention"] == sum(p.numel() for n, p in model.named_parameters()
                                                 if ".attn." in n)
        cached = 1 if variant in ("k_eq_v", "q_eq_k_eq_v") else 2
        assert got["kv_bytes_per_token"] == 2 * cached * n_kv * 4 * 4
        x = torch.randn(2, 7, 4 * n_head, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            for i, block in enumerate(model.h):
                torch.testing.assert_close(canonical_attention(ckpt.layer(i), ckpt.meta, x),
                                           block.attn(x), atol=1e-5, rtol=1e-4)


# ---- nonlinear queries: MarkoKarbevski/beyond_query_linearity ------------------------------
# No licence in that repository: the state dicts below have exactly the key names and
# shapes its model.py (commit 369d84e5) gives for each query_mode, saved as its train.py
# saves ckpt.pt ({model, optimizer, model_args, iter_num, best_val_loss, config}).

BQL_MODES = ("original", "identity", "residual", "residual_gelu")


def bql_checkpoint(mode: str, bias: bool, *, d=16, heads=4, layers=2, block=8, vocab=32, seed=0) -> dict:
    """Their GPT's state dict for ``query_mode`` ``mode``: ``c_attn`` Linear(d, 2d) for identity and
    residual_gelu, Linear(d, 3d) otherwise; residual_gelu adds ``residual_rmsnorm_input``
    (nn.RMSNorm: weight), ``residual_in`` Linear(d, d//2), ``residual_out`` Linear(d//2, d),
    ``residual_layernorm_output`` (their LayerNorm: weight, bias with ``bias``); their LayerNorm
    ln_1/ln_2/ln_f; MLP c_fc/c_proj of mlp_hidden_size; lm_head tied to wte; no mask buffer
    (flash path)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731

    def lin(prefix, rows, cols):
        return {f"{prefix}.weight": r(rows, cols), **({f"{prefix}.bias": r(rows)} if bias else {})}

    def ln(prefix):
        return {f"{prefix}.weight": 1 + r(d), **({f"{prefix}.bias": r(d)} if bias else {})}

    wte = r(vocab, d)
    sd = {"transformer.wte.weight": wte, "transformer.wpe.weight": r(block, d)}
    for i in range(layers):
        p = f"transformer.h.{i}"
        sd.update(ln(f"{p}.ln_1"))
        sd.update(lin(f"{p}.attn.c_attn", (2 if mode in ("identity", "residual_gelu") else 3) * d, d))
        sd.update(lin(f"{p}.attn.c_proj", d, d))
        if mode == "residual_gelu":
            sd[f"{p}.attn.residual_rmsnorm_input.weight"] = 1 + r(d)
            sd.update(ln(f"{p}.attn.residual_layernorm_output"))
            sd.update(lin(f"{p}.attn.residual_in", d // 2, d))
            sd.update(lin(f"{p}.attn.residual_out", d, d // 2))
        sd.update(ln(f"{p}.ln_2"))
        sd.update(lin(f"{p}.mlp.c_fc", 4 * d, d))
        sd.update(lin(f"{p}.mlp.c_proj", d, 4 * d))
    sd.update(ln("transformer.ln_f"))
    sd["lm_head.weight"] = wte
    args = {"block_size": block, "vocab_size": vocab, "n_layer": layers, "num_heads": heads, "n_embd": d,
            "head_size": d // heads, "mlp_hidden_size": 4 * d, "tie_weights": True, "query_mode": mode,
            "dropout": 0.0, "bias": bias, "batch_size": 12, "accumulation_size": 40,
            "scale": 1 / (2 * math.sqrt(d // heads)), "learning_rate": 8e-4, "weight_decay": 0.1}
    return {"model": sd, "optimizer": {"state": {}, "param_groups": [{"lr": 8e-4, "params": [0]}]},
            "model_args": args, "iter_num": 100, "best_val_loss": 3.2, "config": {"out_dir": "out"}}


def their_keys_values(sd, i, x, d=16):
    """k, v of layer i as their CausalSelfAttention computes them (every mode)."""
    p = f"transformer.h.{i}.attn.c_attn"
    y = F.linear(x, sd[f"{p}.weight"], sd.get(f"{p}.bias"))
    return (y[..., :d], y[..., d:2 * d]) if y.shape[-1] == 2 * d else (y[..., d:2 * d], y[..., 2 * d:])


@pytest.mark.parametrize("mode", BQL_MODES)
@pytest.mark.parametrize("bias", [False, True])
def test_nonlinear_query_modes(tmp_path, mode, bias):
    ck = bql_checkpoint(mode, bias)
    torch.save(ck, tmp_path / "ckpt.pt")
    with open_checkpoint(tmp_path / "ckpt.pt") as ckpt:
        m = ckpt.meta.to_json()
        assert (m["architecture"], m["variant"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["d_model"],
                m["d_head"]) == ("query_free", "wq_identity" if mode == "identity" else "qkv", 2, 4, 4, 16, 4)
        assert m["attn_scale"] == 1 / (2 * math.sqrt(4))
        assert m["kv_bytes_per_token"] == 2 * 2 * 4 * 4 * 4
        # the query module takes W_Q's place: its parameters are attention parameters
        assert m["params"]["attention"] == sum(v.numel() for k, v in ck["model"].items() if ".attn." in k)
        if mode == "residual_gelu":
            assert m["query_module"] == (
                "q = x + LayerNorm(W_out GELU(W_in RMSNorm(x))), a bottleneck MLP d_model -> d_model/2 -> "
                "d_model (attn.residual_rmsnorm_input, residual_in, residual_out, residual_layernorm_output)")
        else:
            assert m["query_module"] is None
        x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
        for i in range(2):
            lw = ckpt.layer(i)
            k_ref, v_ref = their_keys_values(ck["model"], i, x)
            for h in range(4):
                cols = slice(4 * h, 4 * h + 4)
                torch.testing.assert_close(x @ lw.W_K[h] + (lw.b_K[h] if bias else 0), k_ref[:, cols])
                torch.testing.assert_close(x @ lw.W_V[h] + (lw.b_V[h] if bias else 0), v_ref[:, cols])
            if mode in ("identity", "residual_gelu"):
                assert lw.W_Q is None


def test_nonlinear_query_metrics_keep_kv_and_say_why_there_is_no_wq():
    from analysis.tied import tied_layer
    from analysis.weights import weight_metrics

    ck = bql_checkpoint("residual_gelu", True)
    ckpt = checkpoint_from_source(DictSource(ck["model"], config=ck["model_args"], path="ckpt.pt"))
    frame, notes = weight_metrics(ckpt.layer(0), ckpt.meta, device="cpu")
    got = set(frame["metric"])
    assert {"kv_cosine_flat", "kv_cka", "kv_share_r2", "erank_k", "erank_v", "norm_k", "norm_v"} <= got
    q_metrics = {"qk_symmetry", "qk_directionality", "erank_q", "norm_q", "erank_qk", "wq_condition",
                 "wq_basis_orth_defect", "wq_absorb_error"}
    assert not got & q_metrics
    why = ("the query is not a linear map of x (q = x + LayerNorm(W_out GELU(W_in RMSNorm(x))), a bottleneck "
           "MLP d_model -> d_model/2 -> d_model (attn.residual_rmsnorm_input, residual_in, residual_out, "
           "residual_layernorm_output)): there is no W_Q to measure")
    assert {m: notes[m] for m in q_metrics} == {m: why for m in q_metrics}
    assert tied_layer(ckpt.layer(0), ckpt.meta) == {"layer": 0, "q_identity": False, "q_eq_k": False,
                                                    "k_eq_v": False, "q_eq_v": False}


def test_nonlinear_query_forward_pass_is_refused_with_the_module_named():
    from experiments.foreign import ForeignCheckpointError, runnable

    ck = bql_checkpoint("residual_gelu", False)
    with pytest.raises(ForeignCheckpointError) as e:
        runnable("query_free", ck["model"], ck["model_args"], variant="qkv", n_heads=4, n_kv_heads=4,
                 attn_scale=0.25)
    assert str(e.value) == (
        "query_mode 'residual_gelu' (q = x + LayerNorm(W_out GELU(W_in RMSNorm(x))), a bottleneck MLP "
        "d_model -> d_model/2 -> d_model (attn.residual_rmsnorm_input, residual_in, residual_out, "
        "residual_layernorm_output)) is not a linear query, and this GPT computes q as x @ W_Q; runnable "
        "modes: identity, original, residual")


def test_nonlinear_query_module_of_the_wrong_width():
    ck = bql_checkpoint("residual_gelu", False)
    ck["model"]["transformer.h.1.attn.residual_in.weight"] = torch.zeros(6, 16)
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(DictSource(ck["model"], config=ck["model_args"], path="ckpt.pt"))
    assert str(e.value) == ("ckpt.pt: layer 1 key 'transformer.h.1.attn.residual_in.weight' has shape (6, 16); "
                            "expected (8, 16) for d_model 16, a query module of width 8")
