"""Print the Results table: one row per comparable group, as the Results page shows it.

Rows are groups of runs that agree in project, task, geometry (d_model, n_layers, heads),
variant and head sharing (``analysis.comparable``); a row never averages across them. Per
metric: the mean and sample std over the row's runs of each run's final (or best) value, n, and
the difference to the Q-K-V row of the same group in %; KV bytes per token and attention
parameters beside them. ``warnings`` names what a row's runs differ in besides weight decay and
seed (training length, a logged hyperparameter). The table is the page's own function
(``analysis.results_table.results_view``), so both show the same rows.

Defaults as on the page: the first metric in picking order (a validation loss: ``val/loss``,
``eval/loss``, other validation losses, ``test``; never a name containing ``train``), the weight
decay most groups with data share, the language runs where there are several tasks.

JSON (--json): a list of rows, each ``project, task, variant, label, sharing, n_kv_heads,
n_heads, d_model, n_layers, n`` (runs), ``run_ids``, ``seeds``, per metric ``"<metric> mean"``,
``"<metric> std"``, ``"<metric> n"``, ``"<metric> vs qkv %"`` (null where undefined),
``"KV bytes/token"``, ``"attention params"`` and ``warnings`` (a list of sentences).

Examples:
  python -m app results --json
  python -m app results --project nanogpt-grid --metric val/loss --wd all --stat best --markdown
"""
from __future__ import annotations

import argparse
import sys

from app.commands._common import add_db_argument, add_figures_argument, print_json, store_from
from app.figures import report_written, write_figures

NAME = "results"
HELP = "print the Results table (one row per comparable group) as JSON, CSV, Markdown or LaTeX"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_db_argument(parser)
    parser.add_argument("--project", action="append", default=[], metavar="P",
                        help="only runs of project P (repeatable; default: every project, each its own rows)")
    parser.add_argument("--metric", action="append", default=[], metavar="M",
                        help="a metric column (repeatable; default: the validation loss)")
    parser.add_argument("--wd", default=None, metavar="W|all",
                        help="hold the weight decay at W, or all (default: the one most groups with data share)")
    parser.add_argument("--stat", choices=("final", "best"), default="final",
                        help="each run's final or best value (default final)")
    parser.add_argument("--no-perplexity", action="store_true",
                        help="leave out the exp(loss) columns the page adds for each loss metric")
    parser.add_argument("--task", default=None,
                        help="only runs of this task, or all (default: language when the runs hold several tasks)")
    add_figures_argument(parser)
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON rows")
    out.add_argument("--csv", action="store_true", help="print CSV")
    out.add_argument("--markdown", action="store_true", help="print a Markdown table")
    out.add_argument("--latex", action="store_true", help="print a LaTeX booktabs table")


def run(args: argparse.Namespace) -> int:
    # pandas and the store: loaded when the command runs, not when the parser imports every command
    from analysis.results_table import default_task, default_wd, metric_order, results_json, results_view, wd_choices
    from analysis.directions import direction
    from app import tables
    from loaders.curves import metric_directions, run_metric_summary
    from loaders.errors import QkvscopeError
    from loaders.run_table import run_table

    store = store_from(args)
    runs = run_table(store, geometry=True)
    if args.project:
        known = set(runs["project"])
        unknown = [p for p in args.project if p not in known]
        if unknown:
            raise QkvscopeError(f"--project {', '.join(unknown)}: no such project in {store.path} "
                                f"(stored: {', '.join(sorted(known)) or 'none'})")
        runs = runs[runs["project"].isin(args.project)]
    logged = [m for m in metric_order({str(m) for ms in runs["metrics"] for m in list(ms)})
              if m not in ("lr", "learning_rate")]
    metrics = args.metric or logged[:1]
    values = run_metric_summary(store, metrics)
    wd = args.wd if args.wd is not None else default_wd(runs, values, metrics[0] if metrics else None)
    if wd != "all" and wd not in wd_choices(runs):
        try:
            wd = f"{float(wd):g}"
        except ValueError:
            raise QkvscopeError(f"--wd {args.wd!r}: expected a number or all") from None
    task = args.task if args.task is not None else default_task(runs)
    overrides = metric_directions(store)
    perplexity = not args.no_perplexity and any(direction(m, overrides) == "min" for m in metrics)
    table, why = results_view(runs, values, metrics, wd=wd, task=task, statistic=args.stat,
                              perplexity=perplexity, overrides=overrides)
    if why:
        print(f"empty: {why} (metric {', '.join(metrics) or 'none'}, weight decay {wd})", file=sys.stderr)
    if args.figures is not None:
        # here: plotly only when asked
        from app.page_figures import results_figure

        fig = results_figure(table, metrics[0]) if metrics else None
        report_written(write_figures({"results": fig} if fig is not None else {}, args.figures))
    if args.json:
        print_json(results_json(table))
    elif args.csv:
        sys.stdout.write(tables.results_csv(table).decode())
    elif args.latex:
        caption = f"{', '.join(metrics)} ({args.stat} value, mean ± std over seeds), weight decay {wd}"
        print(tables.results_latex(tables.results_display(table), caption=caption, label="tab:results"))
    else:
        print(tables.results_markdown(tables.results_display(table)))
    return 0
