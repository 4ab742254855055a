"""The trainer: run folders, determinism, resume, schedule, 30-step runs per variant."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open

from experiments.corpus import load_corpus
from experiments.model import GPTConfig, VARIANTS
from experiments.train import (RESUME_FILE, RunFolderError, TrainConfig, load_checkpoint, lr_at,
                               make_optimizer, train)
from experiments.model import GPT


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=120_000)


def _mc(variant="qkv", n_kv=None, **kw):
    return GPTConfig(n_layer=2, d_model=32, n_head=4, n_kv_heads=n_kv, block_size=32,
                     variant=variant, **kw)


def _tc(**kw):
    base = dict(steps=30, batch_size=8, lr=3e-3, warmup_steps=5, eval_interval=10, eval_batches=2,
                log_interval=5, seed=7)
    base.update(kw)
    return TrainConfig(**base)


def _quiet(line: str) -> None:
    pass


def test_lr_schedule_warmup_then_cosine():
    tc = TrainConfig(steps=101, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, tc) == pytest.approx(0.1)
    assert lr_at(9, tc) == pytest.approx(1.0)
    assert lr_at(10, tc) == pytest.approx(1.0)
    assert lr_at(55, tc) == pytest.approx(0.55)          # half way: (1 + 0.1) / 2
    assert lr_at(100, tc) == pytest.approx(0.1)


def test_weight_decay_on_matrices_only():
    model = GPT(_mc())
    opt = make_optimizer(model, _tc(weight_decay=0.03))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.03 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_run_folder_contents(tmp_path, corpus):
    out = tmp_path / "run"
    s = train(_mc("k_eq_v", 1), _tc(save_steps=[10, 20]), out, corpus=corpus, progress=_quiet)
    cfg = json.loads((out / "config.json").read_text())
    for key in ("variant", "n_kv_heads", "weight_decay", "lr", "seed", "n_layer", "d_model", "n_head",
                "d_head", "norm", "positions", "mlp_ratio", "attn_scale", "corpus", "steps",
                "tokens_per_step"):
        assert key in cfg, key
    assert (cfg["variant"], cfg["n_kv_heads"], cfg["tokens_per_step"]) == ("k_eq_v", 1, 8 * 32)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert all({"step", "lr", "tokens", "wall_time"} <= set(r) for r in rows)
    train_rows = [r for r in rows if "train_loss" in r]
    val_rows = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in train_rows] == [5, 10, 15, 20, 25, 30]
    assert [r["step"] for r in val_rows] == [0, 10, 20, 30]
    assert train_rows[-1]["tokens"] == 30 * 8 * 32
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["final_step_000030.safetensors", "step_000010.safetensors", "step_000020.safetensors"]
    assert list(out.glob("events.out.tfevents.*"))
    assert not (out / RESUME_FILE).exists()
    with safe_open(str(out / "checkpoints/final_step_000030.safetensors"), "pt") as f:
        meta = f.metadata()
        assert "blocks.0.attn.kv.weight" in f.keys() and "blocks.0.attn.k.weight" not in f.keys()
    assert json.loads(meta["qkvscope_run"])["step"] == 30
    assert s["final_val_loss"] == val_rows[-1]["val_loss"]
    assert s["kv_bytes_per_token"] == 2 * 1 * 1 * 8 * 4


def test_tensorboard_tags(tmp_path, corpus):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = tmp_path / "run"
    train(_mc(), _tc(steps=10, eval_interval=5), out, corpus=corpus, progress=_quiet)
    acc = EventAccumulator(str(out))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {"train/loss", "val/loss", "lr"}
    assert [e.step for e in acc.Scalars("val/loss")] == [0, 5, 10]


def test_deterministic_and_resume_is_exact(tmp_path, corpus):
    """Two runs with one seed give identical weights; a run stopped at step 10 and
    resumed gives the same weights and metrics as an uninterrupted one."""
    tc = _tc(steps=20, save_steps=[10])
    a = train(_mc(), tc, tmp_path / "a", corpus=corpus, progress=_quiet)
    b = train(_mc(), tc, tmp_path / "b", corpus=corpus, progress=_quiet)
    wa = load_checkpoint(a["checkpoint"]).state_dict()
    wb = load_checkpoint(b["checkpoint"]).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    # interrupt run c at step 15 (resume state written at step 10), then resume it
    class Stop(Exception):
        pass

    def stop_at_15(line: str) -> None:
        if "step 15/20" in line:
            raise Stop

    with pytest.raises(Stop):
        train(_mc(), tc, tmp_path / "c", corpus=corpus, progress=stop_at_15)
    assert (tmp_path / "c" / RESUME_FILE).exists()
    from loaders.sources import is_checkpoint_candidate  # folder scans must not take it for a model
    assert not is_checkpoint_candidate(tmp_path / "c" / RESUME_FILE)
    assert not is_checkpoint_candidate(tmp_path / "c")
    c = train(_mc(), tc, tmp_path / "c", corpus=corpus, resume=True, progress=_quiet)
    wc = load_checkpoint(c["checkpoint"]).state_dict()
    assert all(torch.equal(wa[k], wc[k]) for k in wa)
    la = [json.loads(x) for x in (tmp_path / "a/metrics.jsonl").read_text().splitlines()]
    lc = [json.loads(x) for x in (tmp_path / "c/metrics.jsonl").read_text().splitlines()]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]  # noqa: E731
    assert strip(la) == strip(lc)


def test_existing_run_folder_refused(tmp_path, corpus):
    train(_mc(), _tc(steps=5, eval_interval=5), tmp_path / "r", corpus=corpus, progress=_quiet)
    with pytest.raises(RunFolderError) as e:
        train(_mc(), _tc(steps=5, eval_interval=5), tmp_path / "r", corpus=corpus, progress=_quiet)
    assert str(e.value) == (f"{tmp_path / 'r'}: expected an empty or new run folder, found a run "
                            "(config.json); pass --resume to continue it or choose another --out")
    with pytest.raises(RunFolderError) as e:
        train(_mc(), _tc(steps=5, eval_interval=5, lr=1e-2), tmp_path / "r", corpus=corpus,
              resume=True, progress=_quiet)
    assert str(e.value) == (f"{tmp_path / 'r'}: expected the same hyperparameters to resume, "
                            "found different values for lr")


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_30_step_run_per_variant(tmp_path, corpus, variant):
    """Loss decreases; the folder reads back; ``info`` reports the variant and head sharing."""
    from loaders.checkpoints import inspect_checkpoint

    out = tmp_path / variant
    n_kv = 2
    s = train(_mc(variant, n_kv), _tc(), out, corpus=corpus, progress=_quiet)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    train_losses = [r["train_loss"] for r in rows if "train_loss" in r]
    val_losses = [r["val_loss"] for r in rows if "val_loss" in r]
    assert train_losses[-1] < train_losses[0] - 0.5
    assert val_losses[-1] < val_losses[0] - 0.5
    assert val_losses[0] == pytest.approx(math.log(256), abs=0.2)   # uniform over bytes at init
    info = inspect_checkpoint(s["checkpoint"])
    assert (info["architecture"], info["variant"], info["n_heads"], info["n_kv_heads"]) == \
        ("qkvscope", variant, 4, n_kv)
    assert info["kv_bytes_per_token"] == s["kv_bytes_per_token"]
    assert info["params"]["total"] == s["params"]


@pytest.mark.gpu
def test_cuda_run_matches_cpu_run_at_start(tmp_path, corpus):
    """--device cuda: same init and batches as on CPU, so the step-0 validation loss
    agrees to float tolerance; the checkpoint is saved from GPU tensors and reads back."""
    cpu = train(_mc("k_eq_v", 2), _tc(steps=5, eval_interval=5), tmp_path / "cpu", corpus=corpus,
                progress=_quiet)
    gpu = train(_mc("k_eq_v", 2), _tc(steps=5, eval_interval=5, device="cuda"), tmp_path / "gpu",
                corpus=corpus, progress=_quiet)
    first = lambda p: json.loads((p / "metrics.jsonl").read_text().splitlines()[0])["val_loss"]  # noqa: E731
    assert first(tmp_path / "gpu") == pytest.approx(first(tmp_path / "cpu"), abs=1e-4)
    assert gpu["final_val_loss"] == pytest.approx(cpu["final_val_loss"], abs=2e-2)
    assert load_checkpoint(gpu["checkpoint"]).cfg.variant == "k_eq_v"
