"""The bundled demo experiments in data/demo/.

  python -m app demo              list the demo runs and their final validation losses
  python -m app demo --rebuild    re-train all of them (94.5 min measured on 2 shared CPU cores)
  python -m app demo --rebuild --part vision    only the 24 vision runs (vit-*)

--rebuild trains into <out>.rebuild/ and replaces the rebuilt part's run folders
in <out> only when every run finished, then writes <out>/README.md (command,
machine, duration and table of each half; rebuilds.json keeps how each half
was last built).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from app.commands._common import print_json
from app.paths import DEMO_DIR

NAME = "demo"
HELP = "show the bundled demo runs, or re-train them with --rebuild"
DEFAULT_OUT = DEMO_DIR


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rebuild", action="store_true", help="re-train every demo run (tens of minutes)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="demo folder (default data/demo)")
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once (default 2)")
    p.add_argument("--part", choices=("all", "language", "vision"), default="all",
                   help="with --rebuild: both halves (default), the language runs or the vision runs (vit-*)")
    p.add_argument("--steps", type=int, default=None, help="override the steps per run (smoke tests)")
    p.add_argument("--json", action="store_true", help="print the runs as JSON")


def run(args: argparse.Namespace) -> int:
    # here: torch loads when the command runs, not at CLI start
    from experiments.distributed import refuse_under_torchrun

    refuse_under_torchrun('demo')
    from experiments import demo  # here: torch loads when the command runs, not at CLI start

    out: Path = args.out
    if args.rebuild:
        specs = []
        if args.part in ("all", "language"):
            specs += demo.demo_specs(args.steps or demo.STEPS)
        if args.part in ("all", "vision"):
            specs += demo.vision_specs(args.steps or demo.VISION_STEPS)
        tmp = out.with_name(out.name + ".rebuild")
        t0 = time.time()
        demo.run_demo_sweep(specs, tmp, jobs=args.jobs)
        wall = time.time() - t0
        if out.exists():
            for child in out.iterdir():
                vision = child.name.startswith("vit-")
                if child.is_dir() and (child / "config.json").exists() and (
                        args.part == "all" or vision == (args.part == "vision")):
                    shutil.rmtree(child)
        out.mkdir(parents=True, exist_ok=True)
        for child in tmp.iterdir():
            if child.is_dir():
                shutil.move(str(child), str(out / child.name))
        shutil.rmtree(tmp)
        command = "python -m app demo --rebuild" + (f" --part {args.part}" if args.part != "all" else "") \
            + (f" --jobs {args.jobs}" if args.jobs != 2 else "") + (f" --steps {args.steps}" if args.steps else "")
        readme = demo.write_readme(out, command=command, wall_s=wall, jobs=args.jobs,
                                   machine=demo.machine_description(), part=args.part)
        print(f"rebuilt {len(specs)} runs in {wall / 60:.1f} min; wrote {readme}")
    if not out.exists() or not any(out.glob("*/config.json")):
        print(f"error: {out}: expected demo run folders, found none; run python -m app demo --rebuild",
              file=sys.stderr)
        return 2
    rows = demo.read_runs(out)
    if args.json:
        print_json(rows)
        return 0
    print(f"{out}: {len(rows)} runs, {demo.folder_bytes(out) / 1e6:.1f} MB")
    print(f"{'run':<28} {'val loss':>9} {'val acc':>7} {'params':>9} {'KV B/tok':>9}  checkpoints")
    for r in rows:
        acc = f"{r['final_val_accuracy']:>7.3f}" if r.get("final_val_accuracy") is not None else f"{'':>7}"
        print(f"{r['name']:<28} {r['final_val_loss']:>9.4f} {acc} {r.get('params', 0):>9,} "
              f"{r.get('kv_bytes_per_token', 0):>9,}  {len(r['checkpoints'])}")
    return 0
