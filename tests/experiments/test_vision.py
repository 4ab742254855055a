"""Vision transformers, image data, paper B's "+" variants and the image task of the trainer."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.model import GPT, GPTConfig, sincos_2d
from experiments.train import TrainConfig, load_checkpoint, train
from experiments.vision import ImageDataError, ViT, default_patch_size, load_images, vision_config

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("qkv", "wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v", "q_eq_k_plus", "q_eq_k_eq_v_plus")


def _npz(path: Path, n=60, side=8, channels=None, classes=3, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    shape = (n, side, side) if channels is None else (n, side, side, channels)
    x = rng.random(shape).astype(np.float32) + y.reshape((n,) + (1,) * (len(shape) - 1))
    np.savez(path, x=x, y=y)
    return path


def test_sincos_2d_is_asymmetric_in_query_and_key_position():
    P = sincos_2d(6, 10)                                    # [6, 6, 10]
    assert P.shape == (6, 6, 10)
    torch.testing.assert_close(P[2, 4, :5], P[2, 0, :5])    # the first half depends on the query only
    torch.testing.assert_close(P[2, 4, 5:], P[0, 4, 5:])    # the second half on the key only
    assert not torch.allclose(P[1, 3], P[3, 1])


def test_plus_variant_scores_follow_the_formula():
    """scores' = scores * sum(w) + P @ w + b, softmax, @ v: checked against the formula by hand."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=8, variant="q_eq_k_plus",
                    causal=False, pos2d_dim=4)
    m = GPT(cfg)
    attn = m.blocks[0].attn
    with torch.no_grad():
        attn.pos_w.copy_(torch.tensor([0.5, -1.0, 2.0, 0.25]))
        attn.pos_b.fill_(0.3)
    x = torch.randn(1, 5, 8)
    k = attn.qk(x).view(1, 5, 2, 4).transpose(1, 2)          # (1, H, T, dh): q = k
    v = attn.v(x).view(1, 5, 2, 4).transpose(1, 2)
    s = (k @ k.transpose(-2, -1)) * cfg.attn_scale
    P = sincos_2d(8, 4)[:5, :5]
    s = s * attn.pos_w.sum() + P @ attn.pos_w + attn.pos_b
    want = attn.o((s.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, 8))
    torch.testing.assert_close(attn(x), want)
    # and the plain q_eq_k map is symmetric where the "+" one is not
    assert not torch.allclose(s, s.transpose(-2, -1))


def test_causal_false_sees_the_future():
    torch.manual_seed(0)
    enc = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=8, causal=False))
    dec = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=8))
    dec.load_state_dict(enc.state_dict())
    a, b = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 3, 9]])
    assert torch.allclose(dec(a)[0][:, 0], dec(b)[0][:, 0])          # causal: token 0 ignores token 3
    assert not torch.allclose(enc(a)[0][:, 0], enc(b)[0][:, 0])      # encoder: it does not


@pytest.mark.parametrize("side,patch", [(8, 2), (28, 7), (32, 8), (224, 16), (30, 7)])
def test_default_patch_size(side, patch):
    p = default_patch_size(side)
    assert p == (patch if side != 30 else 6) and side % p == 0


def test_digits_split_is_fixed_stratified_and_standardised():
    a, b = load_images("digits"), load_images("digits")
    assert a.info["n_train"] + a.info["n_val"] == 1797 and a.n_classes == 10
    assert a.info["n_val"] == pytest.approx(0.2 * 1797, abs=10)
    torch.testing.assert_close(a.val_x, b.val_x)
    assert torch.equal(a.val_y, b.val_y)
    assert abs(float(a.train_x.mean())) < 1e-4 and float(a.train_x.std()) == pytest.approx(1.0, abs=1e-3)
    counts = torch.bincount(a.val_y, minlength=10)
    assert int(counts.min()) >= 30                                      # every class in validation


def test_npz_grey_and_rgb(tmp_path):
    grey = load_images(str(_npz(tmp_path / "g.npz")))
    rgb = load_images(str(_npz(tmp_path / "c.npz", channels=3)))
    assert grey.train_x.shape[1:] == (1, 8, 8) and rgb.train_x.shape[1:] == (3, 8, 8)
    assert grey.n_classes == 3 and rgb.info["format"] == "npz"


def test_folder_of_class_folders(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(8):
            Image.fromarray((rng.random((12, 12, 3)) * 255).astype(np.uint8)).save(tmp_path / c / f"{i}.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    data = load_images(str(tmp_path))
    assert data.info["classes"] == ["cat", "dog"] and data.train_x.shape[1:] == (3, 12, 12)
    assert data.info["n_train"] + data.info["n_val"] == 16


@pytest.mark.parametrize("make,message", [
    (lambda p: np.savez(p, images=np.zeros((20, 8, 8))), "expected arrays 'x' (N, H, W[, C]) and 'y' (N,), found images"),
    (lambda p: np.savez(p, x=np.zeros((20, 8, 6)), y=np.zeros(20, int)), "expected square images, found 8x6"),
    (lambda p: np.savez(p, x=np.zeros((20, 8, 8)), y=np.zeros(19, int)),
     "expected one label per image and at least 10 images, found 20 images and 19 labels"),
    (lambda p: np.savez(p, x=np.zeros((20, 8, 8)), y=np.zeros(20)), "expected integer class labels, found dtype float64"),
    (lambda p: np.savez(p, x=np.full((20, 8, 8), np.nan), y=np.zeros(20, int)), "images hold NaN or infinite values"),
    (lambda p: p.write_bytes(b"PK\x03\x04 not really"), "not a readable .npz file"),
])
def test_bad_npz_is_a_one_line_error_naming_the_file(tmp_path, make, message):
    path = tmp_path / "bad.npz"
    make(path)
    with pytest.raises(ImageDataError) as err:
        load_images(str(path))
    assert str(path) in str(err.value) and message in str(err.value)


def test_pickled_npz_is_never_unpickled(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([object()] * 20, dtype=object), y=np.zeros(20, int))
    with pytest.raises(ImageDataError, match="not a readable .npz file"):
        load_images(str(path))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_kv", [4, 1])
def test_vit_forward_shapes_and_state_dict_round_trip(variant, n_kv):
    data = load_images("digits", max_images=100)
    cfg = vision_config(data, n_layer=1, n_head=4, d_model=16, variant=variant, n_kv_heads=n_kv)
    assert cfg.block_size == 17 and cfg.patch_size == 2 and not cfg.causal
    torch.manual_seed(0)
    model = ViT(cfg)
    logits, loss = model(data.train_x[:5], data.train_y[:5])
    assert logits.shape == (5, data.n_classes) and loss.ndim == 0
    again = ViT.from_state_dict(cfg, model.export_state_dict())
    torch.testing.assert_close(again(data.train_x[:5])[0], logits)


def test_vit_patches_are_row_major():
    cfg = GPTConfig(task="image", causal=False, image_size=4, patch_size=2, channels=1, n_classes=2,
                    block_size=5, vocab_size=1, tie_embeddings=False, n_layer=1, n_head=1, d_model=4)
    img = torch.arange(16.0).view(1, 1, 4, 4)
    p = ViT(cfg).patches(img)                             # [1, 4 patches, 4 values]
    assert p[0, 0].tolist() == [0, 1, 4, 5] and p[0, 1].tolist() == [2, 3, 6, 7]
    assert p[0, 2].tolist() == [8, 9, 12, 13]


def test_image_training_logs_accuracy_and_resumes(tmp_path):
    data = load_images("digits")
    mc = vision_config(data, n_layer=1, n_head=2, d_model=16, variant="k_eq_v", n_kv_heads=1)
    tc = TrainConfig(steps=12, batch_size=16, lr=3e-3, warmup_steps=2, eval_interval=6, log_interval=3,
                     dataset="digits", save_steps=[6])
    out = tmp_path / "run"
    summary = train(mc, tc, out, progress=lambda line: None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    vals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in vals] == [0, 6, 12]
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in vals)
    assert summary["final_val_accuracy"] == vals[-1]["val_accuracy"]
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "image" and config["dataset"]["dataset"] == "digits"
    assert config["variant"] == "k_eq_v" and config["n_kv_heads"] == 1 and config["weight_decay"] == 0.1
    model = load_checkpoint(out / "checkpoints" / "final_step_000012.safetensors")
    assert isinstance(model, ViT)

    # stopped at step 9 (resume state written at step 6) and resumed: the same weights and metrics
    class Stop(Exception):
        pass

    def stop_at_9(line: str) -> None:
        if "step 9/12" in line:
            raise Stop

    other = tmp_path / "other"
    with pytest.raises(Stop):
        train(mc, tc, other, progress=stop_at_9)
    resumed = train(mc, tc, other, resume=True, progress=lambda line: None)
    wa, wb = model.state_dict(), load_checkpoint(resumed["checkpoint"]).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if k != "wall_time"}  # noqa: E731
                          for x in path.read_text().splitlines()]
    assert strip(out / "metrics.jsonl") == strip(other / "metrics.jsonl")


def test_image_run_folder_ingests_with_accuracy_and_task(tmp_path):
    from loaders import curves
    from loaders.logs.ingest import ingest_log
    from loaders.logs.runs import list_runs
    from loaders.store import Store

    data = load_images("digits", max_images=200)
    mc = vision_config(data, n_layer=1, n_head=2, d_model=16, variant="q_eq_k_plus")
    out = tmp_path / "vit-run"
    train(mc, TrainConfig(steps=4, batch_size=8, warmup_steps=1, eval_interval=2, log_interval=2,
                          dataset="digits"), out, progress=lambda line: None)
    store = Store(tmp_path / "db.duckdb")
    store.migrate()
    ingest_log(store, out / "metrics.jsonl")
    (run,) = list_runs(store)
    assert run["variant"] == "q_eq_k_plus" and run["config"]["task"] == "image"
    assert "val/accuracy" in curves.metric_names(store)
    finals = curves.final_values(store, "val/accuracy")
    assert 0.0 <= float(finals["final"].iloc[0]) <= 1.0


def test_image_checkpoint_reads_with_the_qkvscope_layout(tmp_path):
    from loaders.checkpoints import open_checkpoint

    data = load_images("digits", max_images=100)
    mc = vision_config(data, n_layer=2, n_head=4, d_model=16, variant="q_eq_k_eq_v_plus", n_kv_heads=2)
    tc = TrainConfig(steps=2, batch_size=8, warmup_steps=1, eval_interval=100, log_interval=1, dataset="digits")
    train(mc, tc, tmp_path / "r", progress=lambda line: None)
    with open_checkpoint(tmp_path / "r" / "checkpoints" / "final_step_000002.safetensors") as ckpt:
        meta = ckpt.meta
        assert (meta.variant, meta.n_layers, meta.n_heads, meta.n_kv_heads, meta.d_head) == \
            ("q_eq_k_eq_v_plus", 2, 4, 2, 4)
        layer = ckpt.layer(0)
        torch.testing.assert_close(layer.W_K, layer.W_V)
        assert meta.config["task"] == "image"


@pytest.mark.slow
def test_train_cli_image_task(tmp_path):
    out = tmp_path / "x"
    res = subprocess.run([sys.executable, "-m", "app", "train", "--task", "image", "--dataset", "digits",
                          "--variant", "k_eq_v", "--n-kv-heads", "1", "--n-layer", "1", "--d-model", "16",
                          "--steps", "4", "--eval-interval", "2", "--log-interval", "2", "--out", str(out),
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    assert 0.0 <= summary["final_val_accuracy"] <= 1.0 and summary["steps"] == 4
    bad = subprocess.run([sys.executable, "-m", "app", "train", "--task", "image", "--dataset",
                          str(tmp_path / "none.npz"), "--out", str(tmp_path / "y")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (f"error: {tmp_path / 'none.npz'}: no such file or folder; expected "
                                  "'digits', an .npz or a folder of class subfolders")


@pytest.mark.slow
def test_vision_demo_grid_and_readme(tmp_path):
    """The demo's 24 vision runs at 2 steps each: names, README section, listing beside language runs."""
    import experiments.demo as demo

    specs = demo.vision_specs(2, dict(n_layer=1, n_head=4, d_model=16))
    names = [s.name for s in specs]
    assert len(names) == 24 and len(set(names)) == 24
    assert names[:3] == ["vit-qkv-mha-wd0", "vit-qkv-mha-wd0.03", "vit-qkv-mha-wd0.1"]
    assert "vit-q_eq_k_eq_v_plus-mha-wd0.1" in names and "vit-k_eq_v-mqa-wd0" in names
    assert "vit-k_eq_v-gqa2-wd0.03" in names
    demo.run_demo_sweep(specs, tmp_path, jobs=1)
    readme = demo.write_readme(tmp_path, command="python -m app demo --rebuild --part vision --steps 2",
                               wall_s=60.0, jobs=1, machine="test", part="vision")
    text = readme.read_text()
    assert "## Vision runs (ViT on the 8x8 digits)" in text
    assert "Built with `python -m app demo --rebuild --part vision --steps 2` in 1.0 min" in text
    assert sum(line.startswith("| `vit-") for line in text.splitlines()) == 24
    rows = demo.read_runs(tmp_path)
    assert {r["task"] for r in rows} == {"image"} and all(0 <= r["final_val_accuracy"] <= 1 for r in rows)
    assert json.loads((tmp_path / demo.REBUILDS_FILE).read_text())["vision"]["jobs"] == 1


@pytest.mark.slow
def test_analyze_activations_of_a_vit_runs_on_validation_images(tmp_path):
    data = load_images("digits")
    mc = vision_config(data, n_layer=1, n_head=2, d_model=16, variant="k_eq_v")
    train(mc, TrainConfig(steps=2, batch_size=8, warmup_steps=1, eval_interval=100, log_interval=1,
                          dataset="digits"), tmp_path / "r", progress=lambda line: None)
    ckpt = tmp_path / "r" / "checkpoints" / "final_step_000002.safetensors"
    res = subprocess.run([sys.executable, "-m", "app", "analyze", str(ckpt), "--activations", "--tokens", "340",
                          "--db", str(tmp_path / "db.duckdb"), "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    act = [r for r in out["metrics"] if r.get("n_tokens") is not None]
    assert act and {r["n_tokens"] for r in act} == {20 * 17}          # 20 images x (16 patches + cls)
    assert out["sample"]["images"] == "digits" and out["sample"]["tokenizer"] == "image patches"
    assert any("validation images of digits" in n for n in out["notes"].values())


def test_attention_maps_of_a_vit_say_why_not(tmp_path):
    from experiments.attention_maps import capture_activations
    from experiments.runnable import NoForwardPass
    from loaders.checkpoints import open_checkpoint

    data = load_images("digits", max_images=100)
    mc = vision_config(data, n_layer=1, n_head=2, d_model=16)
    train(mc, TrainConfig(steps=1, batch_size=4, warmup_steps=1, eval_interval=100, log_interval=1,
                          dataset="digits"), tmp_path / "r", progress=lambda line: None)
    with open_checkpoint(tmp_path / "r" / "checkpoints" / "final_step_000001.safetensors") as ckpt:
        with pytest.raises(NoForwardPass, match="a vision model reads images, not text"):
            capture_activations(ckpt)
