"""Compute the attention-redundancy metrics of checkpoints and store them.

Each PATH_OR_ID is a checkpoint file or folder (ingested first, as `ingest`
would) or the id of a stored checkpoint. Results are stored per checkpoint,
layer and head; analysing the same checkpoint again with the same metric
version reads them back instead of recomputing. `--activations` adds the
metrics that need a forward pass on sample text (Hugging Face folders,
qkvscope's own checkpoints, nanoGPT checkpoints and both papers' language
models); where none is possible the notes say why.

JSON (--json): {"checkpoint": {...}, "metrics": [{"layer", "head", "metric",
"value", "chance", "chance_low", "chance_high", "above_chance", "degenerate"}
(activation rows also "n_tokens", "ci_low", "ci_high"; rows of a pair metric also
"layer2" (a pair of layers) or "head2" (a pair of heads of "layer"))...],
"notes": {metric: why absent or what to mind}, "cached": bool, "tied":
{"variant", "layout_variant", "agree", "layers": [...]}, "sample" (with
--activations): {"text", "tokens", "n_tokens", "windows", "window",
"tokenizer"}} per checkpoint, a list when several are given. Metric names: see
`python -m app analyze --list` (the registry, `analysis/registry.py`, with the
metrics of the modules named in QKVSCOPE_PLUGINS, comma-separated module
names or .py files: docs/contributing.md, "Adding a metric").

Several PATH_OR_IDs: one that cannot be read or analysed (a file that is no
checkpoint, weights of an integer, bool, complex or float8_e8m0 dtype) prints
one error line and the others are analysed; the exit status is then 2. A layer
holding NaN or Inf weights gets null values, the notes naming its non-finite
values; every finite layer gets its metrics.

--figures DIR writes the Inspector's layer x head heatmaps of the headline
metrics (FIGURE_METRICS, where computed) as ckpt<ID>-<metric>.svg, .pdf and
.png (app/figures.py: plotly's export at a two-column paper width).

"chance_low"/"chance_high" bound the null band (2.5%/97.5% of random
projections of the same shapes); "above_chance" is true where the value (or
its whole 95% interval) lies outside it at a 5% false discovery rate over the
metric's heads (Benjamini-Hochberg), null where untested; "degenerate" marks a
value fixed by construction (a tie, a rank-deficient or singular matrix, too
few tokens or input directions), which is never tested (docs/statistics.md).

--activations feeds a corpus (--text FILE or folder of .txt; default the
bundled one) cut into windows of the model's context, --tokens N in total
(default 4096, at least 8 x d_head); results are reused only for the same
text and token count. Vision models (ViTs trained with `train --task image`)
are fed validation images instead (--images DATASET; default the dataset the
run trained on), each image's patches and class token as tokens.

Batch mode, for many checkpoints (in-process, or on Ray with --ray): a glob
pattern as PATH_OR_ID ('ckpts/**/*.safetensors', quoted so the shell leaves
it alone), --all (every stored checkpoint), --ray ADDRESS or --results
LOCATION. One task per checkpoint writes Parquet under --results
(<results>/checkpoint=<sha256>/metric_version=<v>/kind=<kind>/part.parquet);
this process then registers it in the database. Checkpoints whose results
already exist there for the current metric version are skipped (--force
recomputes). A task whose worker died or that raised outside the reading child is retried
(--retries); one whose file failed in the child (a bomb, a bad tensor) fails at once, as one line.
Every attempt is reported.

A checkpoint whose attention weights exceed --max-task-bytes (default 4GB)
computes its weight metrics in tasks of contiguous layer ranges
(part-L<first>-<last>.parquet each); it is registered only when every group
succeeded, and a re-run recomputes only the groups that failed. The rows are
the same as one task's. Activation metrics stay one task per checkpoint.

  python -m app analyze --all --db my.duckdb --ray auto
  python -m app analyze 'ckpts/**/*.safetensors' --ray ray://head:10001 \
      --results s3://bucket/qkvscope/ --db my.duckdb

JSON in batch mode: {"results", "metric_version", "executor", "computed",
"skipped", "failed", "errors": [{"target", "reason"}], "checkpoints": [{"id",
"path", "sha256", "status", "kinds", "rows", "files", "attempts": [{"attempt",
"host", "pid", "outcome", "task"}], "error", "groups": [{"layers": [first,
last], "status", "file", "attempts", "error"}]}]}; exit status 1 when a
checkpoint failed or an input could not be ingested.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.errors import AnalysisError
from analysis.registry import BY_NAME, METRICS, check_plugins
from analysis.tie_names import disagreement
from app.commands._common import (add_db_argument, add_download_argument, add_figures_argument, checkpoint_path,
                                  print_json, store_from)
from loaders.errors import QkvscopeError, StoreError
from loaders.report import one_line

NAME = "analyze"
HELP = "compute K/V, Q/K and rank metrics of checkpoints (cached in the database)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="PATH_OR_ID",
                        help="checkpoint file/folder (ingested first), Hugging Face name (org/name) in the local "
                             "cache, stored checkpoint id, or a quoted glob "
                             "pattern such as 'ckpts/**/*.safetensors' (batch mode)")
    add_db_argument(parser)
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where to compute (default: cuda if available, else cpu)")
    parser.add_argument("--activations", action="store_true",
                        help="also run a forward pass on sample text for the activation metrics")
    parser.add_argument("--text", metavar="FILE", default=None,
                        help="sample text for --activations: a plain UTF-8 file or a folder of .txt files "
                             "(default: the bundled corpus, data/corpus)")
    parser.add_argument("--tokens", type=_positive, default=None, metavar="N",
                        help="tokens fed for --activations, in windows of the model's context (default: "
                             "4096, and at least 8 x d_head)")
    parser.add_argument("--images", metavar="DATASET", default=None,
                        help="vision models, --activations: the images fed (digits, an .npz with x and y, or a "
                             "folder of class folders; default: the dataset the run trained on); their "
                             "validation split's images, patches as tokens")
    parser.add_argument("--force", action="store_true", help="recompute even when results are stored")
    add_download_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary table")
    parser.add_argument("--list", action="store_true", help="list the metrics with their help and exit")
    add_figures_argument(parser)
    batch = parser.add_argument_group("batch mode (glob patterns, --all, --ray, --results)")
    batch.add_argument("--all", action="store_true", dest="all_checkpoints",
                       help="analyse every checkpoint stored in the database")
    batch.add_argument("--ray", metavar="ADDRESS", default=None,
                       help="run one Ray task per checkpoint (or layer group, see --max-task-bytes): 'auto' "
                            "(RAY_ADDRESS, a cluster started with "
                            "`ray start`, else a new local one), 'local', or an address such as ray://head:10001")
    batch.add_argument("--results", metavar="LOCATION", default=None,
                       help="folder or s3:// URL for the Parquet results (default: <db>.results/ beside the "
                            "database file)")
    batch.add_argument("--gpus-per-task", type=float, default=None, metavar="N",
                       help="GPUs each Ray task requests (default: 1 if the cluster has GPUs, else 0)")
    batch.add_argument("--retries", type=int, default=2, metavar="N",
                       help="retries of a task whose worker died or that raised outside the reading child (default 2)")
    # the default as parsed (4GB): argparse parses a string default on every run, loading app.batch
    batch.add_argument("--max-task-bytes", type=_size, default=4 * 10**9, metavar="SIZE",
                       help="split a checkpoint whose attention weights exceed SIZE into tasks of contiguous "
                            "layer ranges, each within SIZE: 4GB (default; GB = 1e9), 512MiB (MiB = 2^20), "
                            "bytes, or 'none' (never split)")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, found {text!r}") from None
    if n < 2:
        raise argparse.ArgumentTypeError(f"expected at least 2 tokens, found {n}")
    return n


def _size(text: str) -> int | None:
    from app.batch import BatchError, parse_size  # here: batch mode only

    try:
        return parse_size(text)
    except BatchError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--max-task-bytes: ")) from None


class _Bar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (a log file
    gets no carriage returns). ``close()`` ends its line, so what is printed next starts on
    a line of its own."""

    def __init__(self, label: str, stream=None):
        self.label, self.stream = label, stream if stream is not None else sys.stderr   # looked up now, not at import
        isatty = getattr(self.stream, "isatty", None)
        self.shown = bool(isatty and isatty())
        self.open = False                      # a line drawn and not ended yet

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.shown:
            return
        width = 24
        filled = width * done // max(total, 1)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what:<24}")
        self.open = not (done >= total and what.endswith("done"))
        if not self.open:
            self.stream.write("\n")
        self.stream.flush()

    def close(self, ok: bool) -> None:
        """End the bar's line: drawn full with "done" when ``ok``, else as it stands."""
        if not self.open:
            return
        if ok:
            self(1, 1, "done")
        else:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False


def _number(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def _row(row) -> dict:
    out = {"layer": int(row.layer), "head": None if pd.isna(row.head) else int(row.head),
           "metric": row.metric, "value": _number(row.value), "chance": _number(row.chance),
           "chance_low": _number(row.chance_low), "chance_high": _number(row.chance_high),
           "above_chance": None if pd.isna(row.above_chance) else bool(row.above_chance),
           "degenerate": bool(row.degenerate)}
    for col in ("layer2", "head2"):             # a pair's second layer or head (registry.PAIR_COLUMNS)
        if not pd.isna(getattr(row, col, pd.NA)):
            out[col] = int(getattr(row, col))
    if BY_NAME[row.metric].level == "activations":
        out |= {"n_tokens": None if pd.isna(row.n_tokens) else int(row.n_tokens),
                "ci_low": _number(row.ci_low), "ci_high": _number(row.ci_high)}
    return out


def _payload(results) -> dict:
    first = results[0]
    frame = pd.concat([r.frame for r in results], ignore_index=True)
    notes: dict[str, str] = {}
    for r in results:
        notes.update(r.notes)
    out = {"checkpoint": {"id": first.checkpoint_id, "path": first.path},
           "metrics": [_row(row) for row in frame.itertuples()], "notes": notes,
           "cached": all(r.cached for r in results)}
    if first.tied is not None:
        out["tied"] = first.tied
    acts = [r for r in results if r.kind == "activations"]
    if acts and acts[0].sample is not None:
        out["sample"] = acts[0].sample
    return out


def _print_table(payload: dict) -> None:
    ck = payload["checkpoint"]
    print(f"checkpoint {ck['id']}: {ck['path']}" + ("  (cached)" if payload["cached"] else ""))
    tied = payload.get("tied")
    note = disagreement(tied["layout_variant"], tied["layers"]) if tied and not tied["agree"] else None
    if note:
        print(f"  note: {note}")
    if "sample" in payload:
        s = payload["sample"]
        if s.get("n_tokens") is None:          # no forward pass ran: the notes below say why
            print("  activations: none computed (see the notes below)")
        elif s.get("images"):
            print(f"  activations on {s['n_tokens']} tokens ({s['windows']} images of {s['window']} tokens, "
                  f"images {s['images']})")
        else:
            print(f"  activations on {s['n_tokens']} tokens ({s['windows']} windows of {s['window']}, "
                  f"text {s.get('text')})")
    df = pd.DataFrame(payload["metrics"])
    if not df.empty:
        summary = df.groupby("metric", sort=False).agg(
            count=("value", "count"), mean=("value", "mean"), min=("value", "min"), max=("value", "max"),
            chance=("chance", "median"))
        print(summary.to_string(float_format=lambda x: f"{x:.4g}"))
    for metric, why in sorted(payload["notes"].items()):
        print(f"  {metric}: {why}")


def _is_glob(target: str) -> bool:
    """``app.batch.is_glob``, the batch package loaded only for a target holding ``*``, ``?`` or ``[``."""
    if not any(c in target for c in "*?["):
        return False
    from app.batch import is_glob  # here: batch mode only

    return is_glob(target)


def _is_batch(args: argparse.Namespace) -> bool:
    return bool(args.all_checkpoints or args.ray or args.results or any(_is_glob(t) for t in args.targets))


def _after_retries(attempts: list[dict]) -> str:
    """' after N retries': attempts beyond the first of each task (layer groups are tasks of their own)."""
    retried = len(attempts) - len({a.get("task") for a in attempts})
    return f" after {retried} retr{'y' if retried == 1 else 'ies'}" if retried > 0 else ""


def _print_batch(report: dict) -> None:
    print(f"{report['computed']} computed, {report['skipped']} skipped, {report['failed']} failed "
          f"({report['executor']}); results in {report['results']}")
    for c in report["checkpoints"]:
        groups = f" in {len(c['groups'])} layer groups" if c["groups"] else ""
        print(f"  {c['id']:>5} {c['status']:<8} {c['rows']:>6} rows  {c['path']}{groups}{_after_retries(c['attempts'])}")
        for g in c["groups"]:
            if g["status"] == "failed" or len(g["attempts"]) > 1:
                first, last = g["layers"]
                print(f"        layers {first}-{last}: {g['status']}{_after_retries(g['attempts'])}")
        if c["error"]:
            print(f"        {c['error']}")
    for e in report["errors"]:
        print(f"  error: {e['target']}: {e['reason']}")


def run_batch_mode(args: argparse.Namespace) -> int:
    from app import batch  # here: batch mode only

    store = store_from(args)
    inputs = batch.expand_targets(store, args.targets, all_checkpoints=args.all_checkpoints)
    results = args.results or str(store.path.with_suffix(".results"))

    def notify(rep, done, total):
        groups = f" ({len(rep.groups)} layer groups)" if rep.groups else ""
        print(f"[{done}/{total}] checkpoint {rep.id} {rep.status}{groups}{_after_retries(rep.attempts)}: "
              f"{rep.path}", file=sys.stderr)

    report = batch.run_batch(
        store, inputs.checkpoint_ids, results=results, activations=args.activations, device=args.device,
        force=args.force, ray_address=args.ray, gpus_per_task=args.gpus_per_task, retries=args.retries,
        max_task_bytes=args.max_task_bytes,
        input_errors=inputs.errors, notify=notify, quiet_workers=args.json).to_dict()
    if args.json:
        print_json(report)
    else:
        _print_batch(report)
    return 1 if report["failed"] or report["errors"] else 0


def _named(target: str, download: bool) -> str:
    """A target as given, or a Hugging Face name (org/name) as its cached snapshot folder."""
    if target.isdigit() or _is_glob(target):
        return target
    return checkpoint_path(target, download)


#: The metrics whose layer x head heatmap (the Inspector's) ``--figures`` writes, where computed:
#: one per question (K = V, Q = K, rank), and their activation counterparts.
FIGURE_METRICS = ("kv_cka", "kv_share_r2", "qk_symmetry", "erank_qk", "kv_cka_act", "logit_symmetry")


def heatmaps(payload: dict) -> dict:
    """``{"ckpt<id>-<metric>": figure}``: the Inspector's heatmap (``app.charts.heatmap_figure``) of
    each of ``FIGURE_METRICS`` that ``payload`` (one checkpoint's ``--json``) holds per head."""
    from app.charts import heatmap_figure  # here: plotly only when asked

    rows = pd.DataFrame(payload["metrics"])
    if rows.empty:
        return {}
    per_head = set(rows.loc[rows["head"].notna(), "metric"])
    return {f"ckpt{payload['checkpoint']['id']}-{m}": heatmap_figure(rows, m)
            for m in FIGURE_METRICS if m in per_head}


def analyze_targets(args: argparse.Namespace, failed: list[str] | None = None) -> list[dict]:
    """Each of ``args.targets`` resolved (a path is ingested first), analysed (or read back) and
    turned into what ``--json`` prints for it (the module docstring), one dict per target.

    ``failed``: a list that gets the one-line error of each target that failed (a file that
    cannot be read or analysed), the others analysed still; without it the first error raises."""
    # torch loads here, when an analysis starts, not when the CLI builds its parsers
    from app import jobs
    from experiments.sample_text import SampleSpec

    sample = SampleSpec(args.text, args.tokens, args.images)
    if args.activations:
        sample.read()                      # a bad --text fails here, before anything is opened
    store = store_from(args)
    payloads = []
    for target in (_named(t, getattr(args, "download", False)) for t in args.targets):
        try:
            cid = jobs.resolve(store, target)
            bar = _Bar(f"checkpoint {cid}")
            ok = False
            try:
                results = jobs.analyze(store, cid, activations=args.activations, device=args.device,
                                       progress=bar, force=args.force, sample=sample)
                ok = True
            finally:
                bar.close(ok)
        except (QkvscopeError, AnalysisError) as exc:
            if failed is None or isinstance(exc, StoreError):    # the database, not this file: stop
                raise
            failed.append(one_line(f"error: {exc}".replace("\n", " ")))
            print(failed[-1], file=sys.stderr)
            continue
        payloads.append(_payload(results))
    return payloads


def run(args: argparse.Namespace) -> int:
    check_plugins()                        # a module in QKVSCOPE_PLUGINS that failed to import: one line
    if args.list:
        for m in METRICS:
            print(f"{m.name:22} {m.level:11} {m.axis:10} {m.help}")
        return 0
    args.targets = [_named(t, args.download) for t in args.targets]
    if _is_batch(args):
        return run_batch_mode(args)
    if not args.targets:
        print("error: give at least one PATH_OR_ID (or --list)", file=sys.stderr)
        return 2
    # several checkpoints: one that fails is one line, the others are analysed
    failed: list[str] | None = [] if len(args.targets) > 1 else None
    payloads = analyze_targets(args, failed)
    if args.figures is not None:
        from app.figures import report_written, write_figures  # here: --figures only

        report_written(write_figures({name: fig for p in payloads for name, fig in heatmaps(p).items()},
                                     args.figures))
    if args.json:
        print_json(payloads[0] if len(payloads) == 1 else payloads)
    else:
        for p in payloads:
            _print_table(p)
    return 2 if failed else 0
