"""python -m app train / sweep / demo through app.cli.main."""
from __future__ import annotations

import json

import pytest

from app.cli import main

TINY = ["--n-layer", "1", "--d-model", "16", "--n-head", "2", "--block-size", "16",
        "--batch-size", "4", "--steps", "6", "--eval-interval", "3", "--eval-batches", "1",
        "--log-interval", "3", "--warmup-steps", "2", "--corpus-max-bytes", "60000"]


def test_train_command(tmp_path, capsys):
    out = tmp_path / "kv-mqa"
    rc = main(["train", "--variant", "k_eq_v", "--n-kv-heads", "1", "--weight-decay", "0.03",
               "--attn-scale", "half", "--save-steps", "3", "--out", str(out), "--json", *TINY])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6 and summary["kv_bytes_per_token"] == 1 * 1 * 1 * 8 * 4
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["variant"], cfg["n_kv_heads"], cfg["weight_decay"]) == ("k_eq_v", 1, 0.03)
    assert cfg["attn_scale"] == pytest.approx(1 / (2 * 8 ** 0.5))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "final_step_000006.safetensors", "step_000003.safetensors"]
    rc = main(["info", str(out / "checkpoints/final_step_000006.safetensors"), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert rc == 0 and (info["variant"], info["n_kv_heads"]) == ("k_eq_v", 1)


def test_train_command_invalid_model(tmp_path, capsys):
    rc = main(["train", "--variant", "wq_identity", "--d-head", "4", "--out", str(tmp_path / "x"), *TINY])
    assert rc == 2
    assert capsys.readouterr().err == ("error: invalid GPTConfig: wq_identity needs n_head * d_head "
                                       "== d_model, found 2 * 4 != 16\n")


def test_train_command_existing_folder(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "--out", str(out), *TINY]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), *TINY]) == 2
    assert capsys.readouterr().err == (f"error: {out}: expected an empty or new run folder, found a run "
                                       "(config.json); pass --resume to continue it or choose another --out\n")
    assert main(["train", "--out", str(out), "--resume", *TINY]) == 0   # finished: nothing to do


@pytest.mark.slow
def test_sweep_and_demo_listing(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["sweep", "--variants", "qkv,q_eq_k_eq_v", "--weight-decays", "0.0,0.1",
               "--n-kv-heads", "2,1", "--out", str(out), "--json", *TINY])
    assert rc == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in runs] == ["qkv-mha-wd0", "qkv-mha-wd0.1", "q_eq_k_eq_v-mha-wd0",
                                        "q_eq_k_eq_v-mha-wd0.1", "qkv-mqa-wd0", "qkv-mqa-wd0.1",
                                        "q_eq_k_eq_v-mqa-wd0", "q_eq_k_eq_v-mqa-wd0.1"]
    assert json.loads((out / "sweep.json").read_text())["runs"][0]["checkpoint"] == \
        "qkv-mha-wd0/checkpoints/final_step_000006.safetensors"
    rc = main(["demo", "--out", str(out), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(rows) == 8
    assert [(r["variant"], r["n_kv_heads"], r["kv_bytes_per_token"]) for r in rows[:2]] == \
        [("qkv", 2, 1 * 2 * 2 * 8 * 4), ("qkv", 2, 1 * 2 * 2 * 8 * 4)]


def test_sweep_unknown_variant(tmp_path, capsys):
    assert main(["sweep", "--variants", "qkv,kq", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: unknown variant(s) kq; expected some of "
                                       "qkv, wq_identity, q_eq_k, k_eq_v, q_eq_k_eq_v, q_eq_k_plus, q_eq_k_eq_v_plus\n")


def test_demo_without_runs(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'none'}: expected demo run folders, "
                                       "found none; run python -m app demo --rebuild\n")


@pytest.mark.slow
def test_demo_rebuild_smoke(tmp_path, capsys):
    """The full demo grid (23 runs) at 2 steps each: folders, README table, listing."""
    from experiments.demo import demo_specs
    out = tmp_path / "demo"
    import experiments.demo as demo
    tiny = demo.GPTConfig(vocab_size=256, block_size=16, n_layer=1, n_head=4, d_model=16)
    specs = [s for s in demo_specs(2, tiny)]
    for s in specs:
        s.train.batch_size, s.train.eval_batches, s.train.corpus_max_bytes = 2, 1, 60000
    demo.run_demo_sweep(specs, out, jobs=1)
    readme = demo.write_readme(out, command="python -m app demo --rebuild --steps 2", wall_s=1.0,
                               jobs=1, machine="test")
    text = readme.read_text()
    assert "python -m app demo --rebuild --steps 2" in text
    assert sum(line.startswith("| `") for line in text.splitlines()) == 23
    assert "trained with seeds\n1337, 1, 2" in text
    assert len(list(out.glob("*/checkpoints/final_step_000002.safetensors"))) == 23
