"""The What if page's Pareto chart (``app.page_figures.whatif_figure``): one greedy curve per target
beside the trained runs' and the paper's points, from known results."""
import math

import pandas as pd
import pytest

from analysis.sharing_cost import curve, paper_points, trained_points
from app.page_figures import WHATIF_PAPER, WHATIF_TRAINED, whatif_figure, whatif_label


def _result(target, method, saved_per_layer, delta):
    """A 4-layer ``whatif --layers greedy`` result: each step saves ``saved_per_layer`` of 2048
    bytes per token and raises the perplexity by ``delta`` % more."""
    steps = [{"layers": list(range(k)), "kv_bytes_per_token": 2048 - saved_per_layer * k,
              "delta_ppl_pct": delta * k, "ppl": 20.0 * (1 + delta * k / 100), "ci_low": 19.0, "ci_high": 30.0}
             for k in (1, 2, 3, 4)]
    return {"target": target, "method": method, "steps": steps,
            "baseline": {"ppl": 20.0, "ci_low": 19.0, "ci_high": 21.0, "kv_bytes_per_token": 2048}}


def test_both_targets_curves_beside_the_trained_runs_and_the_paper():
    kv, mqa = _result("k_eq_v", "lstsq", 256, 2.0), _result("mqa", "mean", 384, 5.0)
    runs = pd.DataFrame({"name": ["qkv", "k_eq_v-mha", "qkv-mqa"], "final": [3.0, 3.1, 3.05],
                         "kv_bytes_per_token": [2048, 1024, 512]})
    fig = whatif_figure({whatif_label(r): curve(r) for r in (kv, mqa)},
                        trained_points(runs, "qkv", ["k_eq_v-mha", "qkv-mqa"]), paper_points())
    traces = {t.name: t for t in fig.data}
    assert list(traces) == ["k_eq_v by lstsq, converted (greedy)", "mqa by mean, converted (greedy)",
                            WHATIF_TRAINED, WHATIF_PAPER]
    kv_line, mqa_line = traces["k_eq_v by lstsq, converted (greedy)"], traces["mqa by mean, converted (greedy)"]
    assert list(kv_line.x) == [0.0, 12.5, 25.0, 37.5, 50.0] and list(kv_line.y) == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert list(mqa_line.x) == [0.0, 18.75, 37.5, 56.25, 75.0] and list(mqa_line.y) == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert list(kv_line.text) == ["", "0", "0,1", "0,1,2", "0,1,2,3"]
    trained = traces[WHATIF_TRAINED]
    assert list(trained.text) == ["k_eq_v-mha, trained", "qkv-mqa, trained"]
    assert list(trained.x) == [50.0, 75.0]
    assert list(trained.y) == pytest.approx([100 * (math.exp(0.1) - 1), 100 * (math.exp(0.05) - 1)])
    paper = traces[WHATIF_PAPER]
    assert list(zip(paper.x, paper.y)) == [(50.0, 3.1), (87.5, 3.9), (96.9, 4.8)]
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == (
        "KV cache saved (% of bytes per token)", "perplexity change (%)")


def test_without_a_result_only_the_reference_points():
    fig = whatif_figure({}, trained_points(pd.DataFrame(columns=["name", "final", "kv_bytes_per_token"]), "", []),
                        paper_points())
    assert [t.name for t in fig.data] == [WHATIF_TRAINED, WHATIF_PAPER]
    assert len(fig.data[0].x) == 0 and len(fig.data[1].x) == 3
