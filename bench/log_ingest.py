"""Log ingest speed: qkvscope against DuckDB's own read_csv, same file, same run.

Writes a CSV log of N points (default 2,000,000) in the long layout
(step,metric,value) and in the wide layout (step + 4 metric columns), then
times, side by side and alternating, (a) ``CREATE TABLE t AS SELECT * FROM
read_csv(file)`` into a fresh database file and (b) ``ingest_log`` of the same
file into a fresh qkvscope database. Prints each time (best of --repeat) and
the ratio qkvscope / read_csv. Target for the long layout: at most 2x.

For the wide layout it also times DuckDB reshaping the same file itself
(read_csv + UNPIVOT into a long step, metric, value table): what storing four
times as many rows costs DuckDB alone, whatever qkvscope does. That is the wide
layout's reference (at most 1.5x it); read_csv alone, which stores a
quarter of the rows, is printed beside it without a target.

  .venv/bin/python bench/log_ingest.py [--points 2000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loaders.logs import ingest_log  # noqa: E402
from loaders.store import Store  # noqa: E402
from loaders import duck  # noqa: E402

METRICS = ["train_loss", "val_loss", "lr", "grad_norm"]


def write_long(path: Path, n: int) -> None:
    steps = np.repeat(np.arange(n // len(METRICS)), len(METRICS))
    names = np.tile(np.array(METRICS), n // len(METRICS))
    vals = np.random.default_rng(0).random(len(steps)) * 10
    with open(path, "w") as fh:
        fh.write("step,metric,value\n")
        for i in range(0, len(steps), 200_000):
            fh.write("".join(f"{s},{m},{v:.6f}\n" for s, m, v in
                             zip(steps[i:i + 200_000], names[i:i + 200_000], vals[i:i + 200_000])))


def write_wide(path: Path, n: int) -> None:
    rows = n // len(METRICS)
    vals = np.random.default_rng(0).random((rows, len(METRICS))) * 10
    with open(path, "w") as fh:
        fh.write("step," + ",".join(METRICS) + "\n")
        for i in range(0, rows, 100_000):
            fh.write("".join(f"{s}," + ",".join(f"{x:.6f}" for x in r) + "\n"
                             for s, r in zip(range(i, i + 100_000), vals[i:i + 100_000])))


def time_read_csv(csv: Path, work: Path, k: int) -> float:
    db = work / f"plain{k}.duckdb"
    t0 = time.perf_counter()
    con = duck.connect(str(db))
    con.execute("CREATE TABLE t AS SELECT * FROM read_csv(?)", [str(csv)])
    con.close()
    return time.perf_counter() - t0


def time_read_csv_unpivot(csv: Path, work: Path, k: int) -> float:
    db = work / f"long{k}.duckdb"
    cols = ", ".join(METRICS)
    t0 = time.perf_counter()
    con = duck.connect(str(db))
    con.execute(f"CREATE TABLE t AS SELECT step, metric, value FROM read_csv(?) "
                f"UNPIVOT (value FOR metric IN ({cols}))", [str(csv)])
    con.close()
    return time.perf_counter() - t0


def time_ingest(csv: Path, work: Path, k: int) -> tuple[float, int]:
    store = Store(work / f"qkv{k}.duckdb")
    store.migrate()  # schema creation is not part of reading a log
    t0 = time.perf_counter()
    [rep] = ingest_log(store, csv)
    return time.perf_counter() - t0, rep.n_points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for layout, writer in (("long", write_long), ("wide", write_wide)):
            (work / layout).mkdir()
            csv = work / f"{layout}.csv"
            writer(csv, args.points)
            plain, ours, unpivot, n = [], [], [], 0
            for k in range(args.repeat):
                plain.append(time_read_csv(csv, work / layout, k))
                t, n = time_ingest(csv, work / layout, k)
                ours.append(t)
                if layout == "wide":
                    unpivot.append(time_read_csv_unpivot(csv, work / layout, k))
            a, b = min(plain), min(ours)
            print(f"{layout:>4}: {n:,} points, {csv.stat().st_size / 1e6:.1f} MB | duckdb read_csv "
                  f"{a:.3f} s | qkvscope ingest_log {b:.3f} s | ratio {b / a:.2f}x "
                  + ("(target <= 2x)" if layout == "long" else "(no target: against read_csv + UNPIVOT below)"))
            if unpivot:
                c = min(unpivot)
                print(f"      context: duckdb read_csv + UNPIVOT into a long table {c:.3f} s "
                      f"({c / a:.2f}x read_csv); qkvscope ingest_log / that {b / c:.2f}x")


if __name__ == "__main__":
    main()
