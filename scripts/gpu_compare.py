"""CPU against GPU: every weight and activation metric of real checkpoints, both ways.

The analysis promises the same results on CPU and CUDA to float32 tolerance.
This computes what ``analyze`` computes (``app.jobs._compute``: weights and activations) of
each checkpoint on ``cpu`` and on ``--device`` (default ``cuda``), prints the
largest absolute and relative difference per metric family, and exits 1 if
any value differs by more than ``--rtol`` relative (plus ``--atol``), or is
defined on one device and not the other. With no checkpoints named it takes
the bundled demo's final checkpoints of the qkv, K=V-GQA and query-free runs.

    python3 scripts/gpu_compare.py [CHECKPOINT...] [--device cuda] [--rtol 2e-3] [--atol 1e-4] [--tokens N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEMO = [ROOT / "data" / "demo" / run / "checkpoints" / "final_step_004000.safetensors"
        for run in ("qkv-mha-wd0.1", "k_eq_v-gqa2-wd0.1", "wq_identity-mha-wd0.1")]


def frames(path: Path, device: str, tokens: int | None = None):
    """Every weight and activation metric of ``path`` on ``device`` (``app.jobs._compute``, what
    ``analyze`` computes; ``tokens``: the activation sample's, None for the job's own budget), indexed
    by layer, head label and metric, and their notes."""
    import pandas as pd

    from analysis.result_rows import rows_frame
    from app.jobs import _compute
    from experiments.activation_runs import SampleSpec
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(path) as ck:
        jobs = _compute(ck, ["weights", "activations"], device, SampleSpec(tokens=tokens))
    df = pd.concat([rows_frame(j["rows"]) for j in jobs], ignore_index=True)
    notes = {k: v for j in jobs for k, v in j["notes"].items()}
    return df.set_index(["layer", "head_label", "metric"])["value"], notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="*", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rtol", type=float, default=2e-3)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens of the activation sample (default: the activation job's own budget)")
    args = ap.parse_args()
    import numpy as np

    bad = 0
    for path in args.checkpoints or DEMO:
        ref, ref_notes = frames(path, "cpu", args.tokens)
        got, got_notes = frames(path, args.device, args.tokens)
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {len(ref)} values")
        if set(ref.index) != set(got.index) or ref_notes.keys() != got_notes.keys():
            print(f"  FAIL: the two devices produced different metric sets "
                  f"({len(set(ref.index) ^ set(got.index))} rows, notes {sorted(ref_notes.keys() ^ got_notes.keys())})")
            bad += 1
            continue
        got = got.reindex(ref.index)
        r, g = ref.to_numpy(dtype=float), got.to_numpy(dtype=float)
        same_nan = np.isnan(r) == np.isnan(g)
        both = ~np.isnan(r) & ~np.isnan(g) & np.isfinite(r) & np.isfinite(g)
        diff = np.abs(r - g)
        rel = np.where(both, diff / np.maximum(np.abs(r), 1e-30), 0.0)
        fails = (~same_nan) | (both & (diff > args.atol + args.rtol * np.abs(r))) | (
            ~both & same_nan & ~np.isnan(r) & (r != g))
        metrics = ref.index.get_level_values("metric")
        for fam in sorted(set(m.split("_")[0] for m in metrics)):
            sel = np.array([m.split("_")[0] == fam for m in metrics]) & both
            if sel.any():
                print(f"  {fam:8s} max |diff| {diff[sel].max():.2e}  max rel {rel[sel].max():.2e}")
        if fails.any():
            bad += 1
            for idx in np.flatnonzero(fails)[:10]:
                layer, head, metric = ref.index[idx]
                print(f"  FAIL layer {int(layer)} {head} {metric}: cpu {r[idx]:.6g}, {args.device} {g[idx]:.6g}")
        else:
            print(f"  all {len(r)} values agree (rtol {args.rtol:g}, atol {args.atol:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
