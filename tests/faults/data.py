"""Run folders for the fault tests, written in code, and the database
snapshot they are compared by."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from loaders.store import Store


def gpt2_folder(folder: Path, seed: int, d: int = 16, n_layer: int = 2) -> Path:
    """A minimal Hugging Face GPT-2 folder: config.json + attention weights."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for i in range(n_layer):
        weights[f"h.{i}.attn.c_attn.weight"] = torch.randn(d, 3 * d, generator=g)   # Conv1D [d, 3d]
        weights[f"h.{i}.attn.c_proj.weight"] = torch.randn(d, d, generator=g)
    save_file(weights, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": n_layer, "n_head": 2, "n_embd": d}))
    return folder


def build_runs(root: Path, *, rows: int = 60_000) -> Path:
    """Four runs, one per log format, each with a checkpoint beside its log."""
    root.mkdir(parents=True, exist_ok=True)
    a = root / "run_a"
    a.mkdir()
    with open(a / "metrics.csv", "w") as f:
        f.write("step,metric,value\n")
        f.writelines(f"{i},train_loss,{4.0 / (1 + i)}\n" for i in range(rows))
    b = root / "run_b"
    b.mkdir()
    with open(b / "log.jsonl", "w") as f:
        f.writelines(json.dumps({"step": i, "loss": 3.0 / (1 + i), "lr": 1e-3}) + "\n" for i in range(rows // 4))
    c = root / "run_c"
    c.mkdir()
    with open(c / "train.log", "w") as f:
        f.writelines(f"iter {i}: loss {2.0 / (1 + i):.4f}, time 10.00ms, mfu 1.00%\n" for i in range(rows // 4))
    d = root / "run_d"
    d.mkdir()
    with open(d / "wide.csv", "w") as f:
        f.write("step,train_loss,val_loss,lr,grad_norm\n")
        f.writelines(f"{i},{1 / (1 + i)},{2 / (1 + i)},0.001,{i % 7}\n" for i in range(rows // 2))
    for k, run in enumerate((a, b, c, d)):
        gpt2_folder(run / f"ckpt_step_{100 * (k + 1)}", seed=k)
    return root


def snapshot(db: Path) -> dict:
    """What a database holds, comparable across ingests: runs by (source, name)
    with their point counts, checkpoints by content hash, journal paths,
    analysis rows per checkpoint."""
    with Store(db).connect(read_only=True) as con:
        runs = dict(((s, n), c) for s, n, c in con.execute(
            """SELECT r.source, r.name, count(p.run_id) FROM runs r LEFT JOIN points p ON p.run_id = r.id
               GROUP BY r.source, r.name""").fetchall())
        dup = con.execute("""SELECT count(*) FROM (SELECT run_id, step, metric FROM points
                             GROUP BY ALL HAVING count(*) > 1)""").fetchone()[0]
        ckpts = {sha: (arch, n_layers, linked) for sha, arch, n_layers, linked in con.execute(
            "SELECT sha256, architecture, n_layers, run_id IS NOT NULL FROM checkpoints").fetchall()}
        journal = {p: k for p, k in con.execute("SELECT path, kind FROM ingest_journal").fetchall()}
        analysis = dict(con.execute(
            "SELECT checkpoint_id, count(*) FROM analysis_results GROUP BY 1").fetchall())
        jobs = {r[0] for r in con.execute("SELECT checkpoint_id FROM analysis_jobs").fetchall()}
    return {"runs": runs, "duplicate_points": dup, "checkpoints": ckpts, "journal": journal,
            "analysis": analysis, "jobs": jobs}
