"""whatif on the demo's checkpoints (real runs of this project's trainer) and the real small checkpoints."""
from pathlib import Path

import pytest
import torch

from app.commands.info import tensor_ties
from experiments.activation_runs import SampleSpec
from experiments.runnable import NoForwardPass
from experiments.whatif import Target, WhatIfError, layer_of, parse_layers, whatif
from loaders.checkpoints import open_checkpoint

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
SAMPLE = SampleSpec(None, 512)


def _run(name, to, method=None, sample=SAMPLE, **kw):
    with open_checkpoint(str(DEMO / name / "checkpoints" / "final_step_004000.safetensors")) as ckpt:
        return whatif(ckpt, to=to, method=method, sample=sample, device="cpu", **kw)


def test_a_k_eq_v_trained_model_converted_to_k_eq_v_changes_nothing():
    r = _run("k_eq_v-mha-wd0.1", "k_eq_v")
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5
    assert r["steps"][0]["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"] == 4 * 1 * 4 * 16 * 4


@pytest.mark.parametrize("method", ["mean", "aligned"])
def test_mqa_of_an_mqa_model_changes_nothing(method):
    r = _run("qkv-mqa-wd0.1", "mqa", method)
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5


#: Every Q-K-V model of the demo (``data/demo/qkv-*``).
DEMO_QKV = ["qkv-gqa2-wd0.1", "qkv-mha-wd0", "qkv-mha-wd0.03", "qkv-mha-wd0.1", "qkv-mha-wd0.1-seed1",
            "qkv-mha-wd0.1-seed2", "qkv-mqa-wd0.1"]


def test_demo_qkv_lists_every_qkv_model_of_the_demo():
    assert sorted(p.name for p in DEMO.glob("qkv-*")) == DEMO_QKV


@pytest.mark.parametrize("name", DEMO_QKV)
def test_lstsq_loses_no_more_than_keep_k_on_the_demo_qkv_models(name):
    """On the same 128 evaluation tokens (one window; fit on another), every layer converted."""
    few = SampleSpec(None, 128)
    lstsq, keep = _run(name, "k_eq_v", "lstsq", sample=few), _run(name, "k_eq_v", "keep_k", sample=few)
    assert lstsq["sample"] == keep["sample"] and lstsq["sample"]["n_tokens"] == 128
    assert lstsq["baseline"] == keep["baseline"]
    assert lstsq["steps"][0]["loss"] <= keep["steps"][0]["loss"]
    assert lstsq["steps"][0]["kv_bytes_per_token"] == lstsq["baseline"]["kv_bytes_per_token"] / 2


def test_a_sample_of_fewer_tokens_than_a_window_takes_one_window_to_evaluate_and_one_to_fit():
    r = _run("qkv-mha-wd0.1", "k_eq_v", "keep_k", sample=SampleSpec(None, 64))
    assert (r["sample"]["windows"], r["sample"]["n_tokens"], r["sample"]["fit_tokens"]) == (1, 128, 128)


def test_json_contract_and_greedy_curve():
    r = _run("qkv-mha-wd0.1", "mqa", layers="greedy")
    assert list(r) == ["checkpoint", "target", "method", "sample", "baseline", "steps", "healed", "notes"]
    assert list(r["baseline"]) == ["loss", "ppl", "ci_low", "ci_high", "kv_bytes_per_token", "attention_params"]
    assert [len(s["layers"]) for s in r["steps"]] == [1, 2, 3, 4]
    assert all(a["layers"] == b["layers"][:-1] for a, b in zip(r["steps"], r["steps"][1:]))
    assert [s["kv_bytes_per_token"] for s in r["steps"]] == [2048 - 384 * k for k in (1, 2, 3, 4)]
    s = r["steps"][-1]
    assert list(s) == ["layers", "loss", "ppl", "delta_ppl_pct", "ci_low", "ci_high", "kv_bytes_per_token",
                       "attention_params"]
    assert s["ci_low"] < s["ppl"] < s["ci_high"]
    assert s["delta_ppl_pct"] == pytest.approx(100 * (s["ppl"] / r["baseline"]["ppl"] - 1))
    assert r["target"] == "mqa" and r["method"] == "mean" and r["healed"] is None


def test_saved_conversion_reads_back_as_its_variant(tmp_path):
    r = _run("qkv-gqa2-wd0.1", "k_eq_v", out=str(tmp_path / "conv"))
    saved = r["notes"]["out"]
    with open_checkpoint(saved) as ckpt:
        assert (ckpt.meta.variant, ckpt.meta.n_kv_heads) == ("k_eq_v", 2)
        assert ckpt.meta.kv_bytes_per_token == r["steps"][0]["kv_bytes_per_token"]
    assert tensor_ties(saved)["variant"] == "k_eq_v"
    again = whatif(open_checkpoint(saved), to="k_eq_v", sample=SAMPLE, device="cpu")
    assert again["baseline"]["loss"] == pytest.approx(r["steps"][0]["loss"], abs=1e-5)


def test_healing_keeps_the_tie_and_reports_the_loss():
    r = _run("qkv-mha-wd0.1", "k_eq_v", "keep_k", heal_steps=3, heal_how="lm")
    assert r["healed"]["steps"] == 3
    assert r["healed"]["loss"] < r["steps"][0]["loss"]


def test_layer_subset_and_errors():
    r = _run("qkv-mha-wd0.1", "gqa:2", layers="1,3")
    assert r["steps"][0]["layers"] == [1, 3]
    assert r["steps"][0]["kv_bytes_per_token"] == 2048 - 2 * 256
    with pytest.raises(WhatIfError, match=r"--layers 4: expected all, greedy or distinct layer numbers 0\.\.3 "
                                          r"separated by commas \(the model has 4 layers\)"):
        parse_layers("4", 4)
    with pytest.raises(WhatIfError, match="--to gqa: expected gqa:N with N a positive integer"):
        Target.parse("gqa", None)
    with pytest.raises(WhatIfError, match="--method psd: k_eq_v takes one of lstsq, keep_k, keep_v, avg"):
        Target.parse("k_eq_v", "psd")
    with pytest.raises(WhatIfError, match=r"4 kv heads cannot be pooled into 3 groups"):
        _run("qkv-mha-wd0.1", "gqa:3")


def test_layer_of_reads_the_canonical_form_of_each_variant():
    from experiments.model import GPT, GPTConfig

    for variant in ("qkv", "q_eq_k", "k_eq_v", "q_eq_k_eq_v", "wq_identity"):
        m = GPT(GPTConfig(n_layer=1, d_model=32, n_head=4, n_kv_heads=2, variant=variant, block_size=16))
        layer = layer_of(m.blocks[0].attn, 0)
        x = torch.randn(5, 32)
        k = m.blocks[0].attn._heads((getattr(m.blocks[0].attn, {"qkv": "k", "wq_identity": "k", "q_eq_k": "qk",
                                     "k_eq_v": "kv", "q_eq_k_eq_v": "qkv"}[variant]))(x[None]), 2)[0]
        assert torch.allclose(k[1], x @ layer.W_K[1], atol=1e-6)


@pytest.mark.parametrize("name", ["nanogpt-gpt-by-hand", "llama2c-train-llama2xs"])
def test_real_checkpoints_complete_with_intervals(realworld, name):
    with open_checkpoint(str(realworld / "checkpoints" / name / "ckpt.pt")) as ckpt:
        r = whatif(ckpt, to="k_eq_v", sample=SAMPLE, device="cpu")
    s = r["steps"][0]
    assert s["ci_low"] < s["ppl"] < s["ci_high"]
    assert s["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"] / 2


def test_rotary_models_keep_their_function_where_the_conversion_is_exact():
    """A rotary K=V GQA model to k_eq_v, and a rotary Q-K-V model to a full-rank latent, keep their losses."""
    from experiments.model import GPT, GPTConfig
    from experiments.whatif import Surgery, captured_stats, window_losses

    torch.manual_seed(0)
    windows = torch.randint(0, 256, (4, 17))
    for variant, to in (("k_eq_v", "k_eq_v"), ("qkv", "latent:32"), ("q_eq_k", "q_eq_k")):
        m = GPT(GPTConfig(n_layer=2, d_model=32, n_head=4, n_kv_heads=2, variant=variant, positions="rotary",
                          block_size=16)).eval()
        mods = [b.attn for b in m.blocks]
        surgery = Surgery(m, Target.parse(to, "keep_k" if to == "q_eq_k" else None),
                          captured_stats(m, mods, windows, "cpu"), rotary=True, variant=variant)
        before = window_losses(m, windows, "cpu")
        after = window_losses(surgery.model([0, 1]), windows, "cpu")
        assert abs(after - before).max() <= 1e-5, (variant, to)
        assert [type(b.attn) for b in m.blocks] == [type(a) for a in mods]           # the original untouched
        assert all(b.attn is a for b, a in zip(m.blocks, mods))


def _sharp_gpt(norm, n_layer=2, share_query=False, **kw):
    """A float64 GPT with weights large enough that attention is far from uniform (a 0.02 init
    leaves every conversion invisible); ``share_query``: every layer's W_Q is layer 0's."""
    from experiments.model import GPT, GPTConfig

    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=n_layer, d_model=32, n_head=4, norm=norm, block_size=16, **kw)).double().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if ".ln" in n or n.startswith("ln") else
                    torch.randn_like(p) * (0.3 if ".attn." in n or ".mlp." in n else 1.0))
        if share_query:
            for b in m.blocks[1:]:
                b.attn.q.weight.copy_(m.blocks[0].attn.q.weight)
    return m


@pytest.mark.parametrize("n_layer,share", [(1, False), (3, True)])
def test_wq_identity_of_a_norm_free_model_is_exact(n_layer, share):
    """The query-free theorem: one layer, or W_Q shared by the layers, and no norm: W_Q = I loses nothing."""
    from experiments.whatif import Surgery

    m = _sharp_gpt("none", n_layer, share, n_kv_heads=2)
    s = Surgery(m, Target.parse("wq_identity", None), [None] * n_layer, rotary=False, variant="qkv")
    ids = torch.randint(0, 256, (3, 16))
    ref = m(ids)[0]
    conv = s.model(list(range(n_layer)))
    assert {b.attn.cfg.variant for b in conv.blocks} == {"wq_identity"}
    assert (conv(ids)[0] - ref).abs().max() <= 1e-9 * ref.abs().max()
    assert s.notes["off_block"] == [0.0] * n_layer


@pytest.mark.parametrize("norm,rotary", [("rmsnorm", True), ("layernorm", False)])
def test_wq_identity_with_norms_moves_the_basis_exactly_and_drops_only_what_is_off_the_blocks(norm, rotary):
    """The basis change alone keeps every logit; a model whose W_Q is a common rotation times
    per-head blocks converts exactly (RMSNorm, rotary: per-pair scaled rotations, which commute with
    RoPE; LayerNorm: a rotation that fixes 1, times one scale per layer)."""
    from analysis.conversion import query_basis
    from experiments.whatif import Surgery

    m = _sharp_gpt(norm, 2, positions="rotary" if rotary else "learned", bias=not rotary)
    ids = torch.randint(0, 256, (3, 16))
    ref = m(ids)[0]
    s = Surgery(m, Target.parse("wq_identity", None), [None] * 2, rotary=rotary, variant="qkv")
    assert (s.model([])(ids)[0] - ref).abs().max() <= 1e-9 * ref.abs().max()
    assert min(s.notes["off_block"]) > 0.3                         # random W_Q: far from a rotation
    gen = torch.Generator().manual_seed(3)
    u = query_basis([torch.randn(32, 32, generator=gen, dtype=torch.float64)], norm)[0]
    with torch.no_grad():
        for b in m.blocks:
            a, c = torch.randn(2, 16, dtype=torch.float64, generator=gen)         # per pair: a I + c J
            blocks = torch.block_diag(*[torch.tensor([[x, -y], [y, x]], dtype=torch.float64) for x, y in zip(a, c)])
            if norm == "layernorm":
                blocks = a[0] * torch.eye(32, dtype=torch.float64)
            b.attn.q.weight.copy_((torch.diag(1 / b.ln_1.weight) @ u @ blocks).T)
            if b.attn.q.bias is not None:
                b.attn.q.bias.zero_()
    ref = m(ids)[0]
    s = Surgery(m, Target.parse("wq_identity", None), [None] * 2, rotary=rotary, variant="qkv")
    assert max(s.notes["off_block"]) < 1e-12
    assert (s.model([0, 1])(ids)[0] - ref).abs().max() <= 1e-9 * ref.abs().max()


def test_wq_identity_through_the_command_reads_back_query_free(tmp_path):
    """A norm-free one-layer checkpoint (float32): loss unchanged to float tolerance; the saved
    conversion reads back as wq_identity, by its config and by its tensors."""
    from experiments.train import TrainConfig, save_checkpoint

    m = _sharp_gpt("none", 1, bias=False).float()
    path = tmp_path / "final_step_000001.safetensors"
    save_checkpoint(m, path, step=1, tokens=1, final=True, tc=TrainConfig())
    with open_checkpoint(str(path)) as ckpt:
        r = whatif(ckpt, to="wq_identity", sample=SAMPLE, device="cpu", out=str(tmp_path / "conv"))
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5 * r["baseline"]["loss"]
    assert r["steps"][0]["attention_params"] == r["baseline"]["attention_params"] - 32 * 32
    assert r["steps"][0]["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"]
    assert r["notes"]["wq_identity"]["off_block"] == [0.0]
    with open_checkpoint(r["notes"]["out"]) as ckpt:
        assert ckpt.meta.variant == "wq_identity"
    assert tensor_ties(r["notes"]["out"])["variant"] == "wq_identity"
    with pytest.raises(WhatIfError, match="--to wq_identity: no query-free variant keeps this k_eq_v layer's ties"):
        _run("k_eq_v-mha-wd0.1", "wq_identity")


def test_a_k_eq_v_trained_vit_converted_to_k_eq_v_changes_nothing_and_reports_accuracy():
    """The demo's ViT (this project's trainer, digits): loss = classification cross-entropy per image."""
    with open_checkpoint(str(DEMO / "vit-k_eq_v-gqa2-wd0.1" / "checkpoints" / "final_step_000300.safetensors")) as ckpt:
        r = whatif(ckpt, to="k_eq_v", images="digits", sample=SAMPLE, device="cpu")
        m = whatif(ckpt, to="mqa", images="digits", sample=SAMPLE, device="cpu", heal_steps=2, heal_how="lm")
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5
    assert r["sample"]["n_images"] == 512 // 17
    acc = r["notes"]["accuracy"]
    assert acc["baseline"]["accuracy"] > 0.8 and acc["0,1"] == acc["baseline"]
    assert m["steps"][0]["kv_bytes_per_token"] == m["baseline"]["kv_bytes_per_token"] / 2
    assert set(m["notes"]["accuracy"]) == {"baseline", "0,1", "healed"}
    with pytest.raises(WhatIfError, match="--out writes this project's GPT language models; a ViT is converted"):
        whatif(open_checkpoint(str(DEMO / "vit-k_eq_v-gqa2-wd0.1" / "checkpoints" / "final_step_000300.safetensors")),
               to="k_eq_v", images="digits", sample=SAMPLE, device="cpu", out="/nonexistent/x")


def test_images_need_an_image_classifier():
    with pytest.raises(NoForwardPass, match="--images converts image classifiers: this project's ViT and Hugging Face"):
        _run("qkv-mha-wd0.1", "k_eq_v", images="digits")


def test_gqa_with_the_best_grouping_pools_equal_heads_that_are_not_adjacent():
    """kv heads 0 = 2 and 1 = 3 in every layer: --grouping best pools {0, 2}, {1, 3} and keeps the losses;
    contiguous pooling ({0, 1}, {2, 3}) does not; the groups are in notes."""
    from experiments.whatif import Surgery, captured_stats, window_losses

    m = _sharp_gpt("none", 2, n_kv_heads=4)
    dh = 32 // 4
    with torch.no_grad():
        for b in m.blocks:
            for lin in (b.attn.k, b.attn.v):
                lin.weight[2 * dh:4 * dh] = lin.weight[0:2 * dh]
    windows = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(0))
    mods = [b.attn for b in m.blocks]
    stats = captured_stats(m, mods, windows, "cpu")
    before = window_losses(m, windows, "cpu")
    best = Surgery(m, Target("gqa", "mean", 2, grouping="best"), stats, rotary=False, variant="qkv")
    assert best.notes["layers"][0]["grouping"] == [[0, 2], [1, 3]] and best.notes["layers"][1]["exact"]
    assert abs(window_losses(best.model([0, 1]), windows, "cpu") - before).max() <= 1e-8
    plain = Surgery(m, Target.parse("gqa:2", None), stats, rotary=False, variant="qkv")
    assert abs(window_losses(plain.model([0, 1]), windows, "cpu") - before).max() > 1e-3
    assert plain.notes == {}


def test_grouping_is_refused_for_targets_other_than_gqa():
    with pytest.raises(WhatIfError, match=r"^--grouping best: chooses which kv heads gqa:G pools, not mqa$"):
        _run("qkv-mha-wd0.1", "mqa", grouping="best")
