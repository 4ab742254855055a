"""The projection-sharing paper's whole-layer definitions (analysis/metrics/whole_layer.py): the
registry rows, ``kv_cosine_layer`` against a float64 reference and its null band, and the two
figures of the paper's ``kv_similarity_llm.py`` reimplemented on a GPT-2 that ``transformers``
builds, against what qkvscope computes through its own loader and forward pass."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis import registry
from analysis.chance import random_layer, weight_chance
from analysis.weights import weight_metrics
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)

NAMES = ("kv_cosine_layer", "kv_cka_layer_act", "erank_kcache_layer", "erank_vcache_layer")


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_registry_rows():
    rows = {n: registry.BY_NAME[n] for n in NAMES}
    assert [(m.level, m.axis, m.chance) for m in rows.values()] == [
        ("weights", "layer", "closed"), ("activations", "layer", "random_projection"),
        ("activations", "layer", "random_projection"), ("activations", "layer", "random_projection")]
    assert all("kv_similarity_llm.py" in rows[n].help for n in ("kv_cosine_layer", "kv_cka_layer_act"))
    assert registry.closed_form("kv_cosine_layer", None, False) == 0.0


def test_analyze_list_prints_them(capsys):
    from app.cli import main

    assert main(["analyze", "--list"]) == 0
    listed = {line.split()[0]: line.split()[1:3] for line in capsys.readouterr().out.splitlines()}
    assert {n: listed[n] for n in NAMES} == {"kv_cosine_layer": ["weights", "layer"],
                                            "kv_cka_layer_act": ["activations", "layer"],
                                            "erank_kcache_layer": ["activations", "layer"],
                                            "erank_vcache_layer": ["activations", "layer"]}


@pytest.mark.parametrize("bias", [True, False])
def test_kv_cosine_layer_equals_a_float64_reference(bias):
    g, d, e = 2, 40, 8
    k, v = rand(g, d, e, seed=1), rand(g, d, e, seed=2)
    v = 0.3 * k + v
    bk, bv = (rand(g, e, seed=3), rand(g, e, seed=4) + 2 * rand(g, e, seed=3)) if bias else (None, None)
    lay = SimpleNamespace(layer=0, W_Q=rand(4, d, e, seed=5), W_K=k, W_V=v, W_O=rand(4, e, d, seed=6), b_Q=None,
                          b_K=bk, b_V=bv, b_O=None)
    meta = SimpleNamespace(n_heads=4, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant="qkv")
    frame, _ = weight_metrics(lay, meta, device="cpu")
    got = frame[frame["metric"] == "kv_cosine_layer"]
    assert got["head"].isna().all() and len(got) == 1
    fk = np.concatenate([k.double().numpy().ravel()] + ([bk.double().numpy().ravel()] if bias else []))
    fv = np.concatenate([v.double().numpy().ravel()] + ([bv.double().numpy().ravel()] if bias else []))
    want = fk @ fv / (np.linalg.norm(fk) * np.linalg.norm(fv))
    assert float(got["value"].iloc[0]) == pytest.approx(want, rel=1e-6)


def test_random_layers_sit_inside_the_cosine_null_band():
    meta = SimpleNamespace(n_heads=4, n_kv_heads=4, d_model=32, d_head=8, norm="layernorm", variant="qkv")
    band = weight_chance(meta, query_free=False, device="cpu").set_index(["metric", "whole"]).loc[
        ("kv_cosine_layer", True)]
    assert band["chance"] == 0.0 and band["chance_low"] < 0 < band["chance_high"]
    gen = torch.Generator().manual_seed(12345)                  # not the chance draws' seed
    inside = 0
    for _ in range(20):
        frame, _ = weight_metrics(random_layer(meta, query_free=False, generator=gen), meta, device="cpu")
        value = float(frame.loc[frame["metric"] == "kv_cosine_layer", "value"].iloc[0])
        inside += band["chance_low"] <= value <= band["chance_high"]
    assert inside >= 16


# -- kv_similarity_llm.py's two figures, reimplemented from its text ---------------------------------
def paper_linear_cka(x, y):
    """``linear_cka`` of kv_similarity_llm.py: centred, ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F + 1e-12)."""
    x = x - x.mean(0, keepdim=True)
    y = y - y.mean(0, keepdim=True)
    return ((y.T @ x).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm() + 1e-12)).item()


def paper_figures(model, input_ids):
    """``(weight_cos_sim, activation_cka)`` as kv_similarity_llm.py's ``main`` computes them: per layer,
    the cosine of ``cat(W_k.flatten(), b_k)`` and ``cat(W_v.flatten(), b_v)`` of the fused ``c_attn``
    and the linear CKA of its K and V outputs ``[tokens, n_embd]`` on one batch, averaged over
    layers. (Its model's ``c_attn`` is an ``nn.Linear``, sliced by rows; GPT-2's is a ``Conv1D``
    computing ``x @ W``, so the same slices are columns here.)"""
    n = model.config.n_embd
    acts, handles = {}, []
    for i, block in enumerate(model.transformer.h):
        def hook(_mod, _inp, out, i=i):
            _q, k, v = out.split(n, dim=2)
            acts[i] = (k.detach().reshape(-1, n), v.detach().reshape(-1, n))
        handles.append(block.attn.c_attn.register_forward_hook(hook))
    with torch.no_grad():
        model(input_ids)
    for h in handles:
        h.remove()
    cos, cka = [], []
    for i, block in enumerate(model.transformer.h):
        w, b = block.attn.c_attn.weight.data, block.attn.c_attn.bias.data
        wk = torch.cat([w[:, n:2 * n].flatten(), b[n:2 * n]])
        wv = torch.cat([w[:, 2 * n:].flatten(), b[2 * n:]])
        cos.append(torch.nn.functional.cosine_similarity(wk, wv, dim=0).item())
        cka.append(paper_linear_cka(*acts[i]))
    return sum(cos) / len(cos), sum(cka) / len(cka)


@pytest.fixture
def gpt2_with_biases(tmp_path):
    """A 3-layer GPT-2 (d_model 32, 4 heads) written by transformers, its c_attn biases and weights
    drawn so that K and V are partly alike (GPT-2's own init has zero biases)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=3, n_head=4))
    with torch.no_grad():
        for block in model.transformer.h:
            w, b = block.attn.c_attn.weight, block.attn.c_attn.bias
            b.normal_(0, 0.5)
            w[:, 64:] = 0.5 * w[:, 32:64] + w[:, 64:]              # V = K/2 + its own, biases too
            b[64:] = 0.5 * b[32:64] + b[64:]
    folder = tmp_path / "gpt2-bias"
    model.save_pretrained(folder)
    return folder, model.eval()


def test_the_paper_figures_equal_what_qkvscope_computes(tmp_path, gpt2_with_biases):
    from analysis.captures import sample_windows
    from experiments.activation_runs import SampleSpec, corpus_activations
    from loaders.checkpoints import open_checkpoint

    folder, model = gpt2_with_biases
    text = tmp_path / "sample.txt"
    text.write_text("Keys and values share a space, queries stay apart. " * 40, encoding="utf-8")
    with open_checkpoint(folder) as ckpt:
        weights = [weight_metrics(layer, ckpt.meta.layer_meta(layer.layer), device="cpu")[0]
                   for layer in ckpt.layers()]
        run = corpus_activations(ckpt, sample=SampleSpec(text=str(text), tokens=1024), device="cpu")
    cos = pd_layer_values(weights, "kv_cosine_layer")
    cka = pd_layer_values([run.frame], "kv_cka_layer_act")
    # the same windows qkvscope fed (no tokenizer, vocabulary 300: UTF-8 bytes), as one batch
    ids = torch.tensor(list(text.read_text(encoding="utf-8").encode("utf-8")))
    windows = sample_windows(ids, context=64, n_tokens=1024)
    assert run.sample["n_tokens"] == windows.numel() == 1024
    paper_cos, paper_cka = paper_figures(model, windows)
    assert len(cos) == len(cka) == 3
    assert sum(cos) / 3 == pytest.approx(paper_cos, abs=1e-6)
    assert sum(cka) / 3 == pytest.approx(paper_cka, abs=1e-5)
    assert paper_cka > 0.1 and abs(paper_cos) > 0.1               # the planted K-V likeness is there


def pd_layer_values(frames, metric):
    import pandas as pd

    frame = pd.concat(frames)
    rows = frame[(frame["metric"] == metric) & frame["head"].isna()].sort_values("layer")
    return [float(v) for v in rows["value"]]
