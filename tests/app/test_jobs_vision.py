"""Activation metrics of Hugging Face vision encoders (issue "Vision transformers"): ViT, DeiT,
SigLIP vision and a full CLIP (vision tower on images, text tower on text), on tiny checkpoints
written by ``transformers`` itself, fed the bundled digits resized to the model's images."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.captures import fit_images
from analysis.registry import names
from experiments import activation_runs, attention_maps, runnable
from loaders.checkpoints import open_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 170                      # 10 images of 17 tokens: quick, and still several windows
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             image_size=32, patch_size=8)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    import transformers as T

    root = tmp_path_factory.mktemp("hf_vision")
    torch.manual_seed(0)
    built = {
        "vit": T.ViTForImageClassification(T.ViTConfig(**SMALL, num_labels=10)),
        "deit": T.DeiTModel(T.DeiTConfig(**SMALL)),
        "siglip": T.SiglipVisionModel(T.SiglipVisionConfig(**SMALL)),
        "clip": T.CLIPModel(T.CLIPConfig(
            text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                             vocab_size=300, max_position_embeddings=32),
            vision_config=dict(SMALL, hidden_size=48, num_hidden_layers=3), projection_dim=16)),
    }
    out = {}
    for name, model in built.items():
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


def run(folder: Path, **sample) -> activation_runs.ActivationRun:
    with open_checkpoint(folder) as ckpt:
        return activation_runs.corpus_activations(ckpt, device="cpu", sample=activation_runs.SampleSpec(tokens=TOKENS, **sample))


def assert_rows(frame, layers: list[int], n_tokens: int) -> None:
    """Every activation metric of every layer, each row with its token count, interval and chance."""
    assert sorted(set(frame.layer)) == layers
    assert set(frame.metric) == set(names("activations"))
    assert (frame.n_tokens == n_tokens).all()
    for col in ("value", "chance", "ci_low", "ci_high"):
        assert frame[col].map(math.isfinite).all(), col
    assert (frame.ci_low <= frame.ci_high).all()


@pytest.mark.slow
def test_vit_activations_match_a_float64_reference(folders):
    """ViTForImageClassification: 17 tokens an image (16 patches and the class token); layer 0's
    kv_cosine_act of head 1 equals tr(K^T V) / sqrt(tr(K^T K) tr(V^T V)) in float64 over the
    keys and values the model's own k_proj / v_proj produce on the same images."""
    import transformers as T
    from experiments.vision import load_images

    got = run(folders["vit"])
    assert got.sample["window"] == 17 and got.sample["windows"] == 10 and got.sample["images"] == "digits"
    assert_rows(got.frame, [0, 1], 170)
    assert got.notes["kv_cosine_act"].startswith(
        "inputs: 10 validation images of digits (8x8x1, standardised per channel, resized to 32x32x3), "
        "17 tokens each (16 patches and 1 class/distillation/register token)")

    model = T.AutoModel.from_pretrained(folders["vit"], trust_remote_code=False, attn_implementation="eager").eval()
    images = fit_images(load_images("digits").val_x[:10], 32, 3)                # [10, 3, 32, 32]
    seen = {}
    attn = model.layers[0].attention
    hooks = [getattr(attn, f"{r}_proj").register_forward_hook(lambda m, a, o, r=r: seen.__setitem__(r, o))
             for r in "kv"]
    with torch.no_grad():
        model(images)
    for h in hooks:
        h.remove()
    k, v = (seen[r].double().reshape(10, 17, 4, 8)[:, :, 1] for r in "kv")     # [N, T, d_head], head 1
    want = (k * v).sum() / torch.sqrt((k * k).sum() * (v * v).sum())
    row = got.frame[(got.frame.layer == 0) & (got.frame.metric == "kv_cosine_act") & (got.frame["head"] == 1)]
    assert abs(float(row.value.iloc[0]) - float(want)) < 1e-5 * max(1.0, abs(float(want)))


@pytest.mark.slow
def test_deit_counts_its_distillation_token_and_siglip_skips_its_pooling_head(folders):
    deit = run(folders["deit"], images=None)
    assert deit.sample["window"] == 18                                            # 16 patches, class, distillation
    assert "18 tokens each (16 patches and 2 class/distillation/register tokens)" in deit.notes["kv_cka_act"]
    assert_rows(deit.frame, [0, 1], 18 * 10)
    siglip = run(folders["siglip"])                                               # no class token; head.attention
    assert siglip.sample["window"] == 16 and "16 patches)" in siglip.notes["kv_cka_act"]
    assert_rows(siglip.frame, [0, 1], 16 * 11)                                    # ceil(170 / 16) = 11 images


@pytest.mark.slow
def test_full_clip_vision_tower_on_images_text_tower_on_text(folders):
    got = run(folders["clip"])
    vision, text = (got.frame[got.frame.layer.isin(r)] for r in ([0, 1, 2], [3, 4]))
    assert_rows(vision, [0, 1, 2], 170)
    assert_rows(text, [3, 4], got.sample["towers"]["text"]["n_tokens"])
    assert got.sample["towers"]["vision"]["tokenizer"] == "image patches"
    assert got.sample["towers"]["text"]["tokenizer"] == "bytes" and got.sample["towers"]["text"]["window"] == 32
    assert got.notes["kv_cosine_act"].startswith("vision tower: inputs: 10 validation images of digits")
    with open_checkpoint(folders["clip"]) as ckpt, pytest.raises(runnable.NoForwardPass, match="a vision model reads images"):
        attention_maps.capture_activations(ckpt, device="cpu")


@pytest.mark.slow
def test_analyze_cli_runs_a_vit_on_the_users_images(folders, tmp_path):
    """``analyze VIT --activations --images NPZ``: colour 12x12 images resized to 32x32, the rows in the JSON
    (ingested and computed in the child processes); a bad --images is one line naming it."""
    from loaders.errors import FileError

    rng = np.random.default_rng(0)
    npz = tmp_path / "rgb.npz"
    np.savez(npz, x=rng.random((100, 12, 12, 3)).astype(np.float32), y=np.arange(100) % 4)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "app", "analyze", str(folders["vit"]), "--activations",
                           "--db", str(tmp_path / "q.duckdb"), "--device", "cpu", "--tokens", str(TOKENS),
                           "--images", str(npz), "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    acts = [r for r in out["metrics"] if r["metric"] in names("activations")]
    assert {r["layer"] for r in acts} == {0, 1} and all(r["n_tokens"] == 170 for r in acts)
    assert f"of {npz} (12x12x3, standardised per channel, resized to 32x32x3)" in out["notes"]["kv_cka_act"]
    with pytest.raises(FileError) as err:
        run(folders["vit"], images=str(tmp_path / "nothing.npz"))
    assert str(err.value) == (f"{tmp_path / 'nothing.npz'}: no such file or folder; expected 'digits', an .npz "
                              "or a folder of class subfolders")
