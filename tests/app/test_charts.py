"""Chart builders: what the figures encode, independent of a page."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from app import charts


def _results(values):
    return pd.DataFrame([{"layer": l, "head": h, "metric": "kv_cka", "value": v}
                         for l, row in enumerate(values) for h, v in enumerate(row)])


def test_heatmap_of_equal_values_is_one_colour_not_stretched_noise():
    fig = charts.heatmap_figure(_results([[1.0, 1 - 3e-8], [1 + 2e-8, 1.0]]), "kv_cka")
    trace = fig.data[0]
    assert trace.zmin < 1 - 0.4 and trace.zmax > 1 + 0.4


def test_heatmap_of_varied_values_uses_their_range():
    fig = charts.heatmap_figure(_results([[0.1, 0.9], [0.5, 0.3]]), "kv_cka")
    assert fig.data[0].zmin is None and fig.data[0].zmax is None
    assert fig.data[0].x == ("H0", "H1") and fig.data[0].y == ("L0", "L1")


def _trajectory(values):
    return pd.DataFrame([{"step": 500 * (i + 1), "layer": l, "metric": "kv_cka", "value": v}
                         for l, row in enumerate(values) for i, v in enumerate(row)])


def test_trajectory_of_equal_values_is_flat_not_stretched_noise():
    # kv_cka of a K=V run: 1 up to float32 rounding at every checkpoint
    fig = charts.trajectory_figure(_trajectory([[1.0, 1 - 6e-8, 1.0], [1.0, 1.0, 1 + 1e-7]]), "kv_cka")
    lo, hi = fig.layout.yaxis.range
    assert abs(lo - 0.5) < 1e-6 and abs(hi - 1.5) < 1e-6
    assert [t.name for t in fig.data] == ["L0", "L1"]


def test_trajectory_of_varied_values_uses_autorange():
    fig = charts.trajectory_figure(_trajectory([[0.2, 0.5, 0.9]]), "kv_cka")
    assert fig.layout.yaxis.range is None


def _chance_results(values, chance, *, n_tokens=None, ci=None, metric="kv_share_r2"):
    """One metric per (layer, head) with a chance level (and optionally tokens and a 95% interval)."""
    rows = []
    for l, row in enumerate(values):
        for h, v in enumerate(row):
            r = {"layer": l, "head": h, "metric": metric, "value": v, "chance": chance}
            if n_tokens is not None:
                r.update(n_tokens=n_tokens, ci_low=v - ci, ci_high=v + ci)
            rows.append(r)
    return pd.DataFrame(rows)


def test_value_text_gives_chance_and_for_sampled_values_tokens_and_interval():
    assert charts.value_text(0.31, 0.25) == "0.31 (chance 0.25)"
    assert charts.value_text(0.31, 0.25, 4096, 0.28, 0.34) == "0.31 (chance 0.25)<br>n=4096 tokens, 95% CI 0.28–0.34"
    assert charts.value_text(0.31, float("nan")) == "0.31 (no chance level stored)"
    assert charts.value_text(float("nan"), 0.25) == "undefined (chance 0.25)"
    assert charts.value_text(0.99996, 0.2) == "1 (chance 0.2)"  # 4 significant digits
    assert charts.value_text(0.5, 0.2, pd.NA, float("nan"), float("nan")) == "0.5 (chance 0.2)"


def test_heatmap_diverges_from_chance_and_says_so():
    fig = charts.heatmap_figure(_chance_results([[0.31, 0.9], [0.1, 0.25]], 0.25), "kv_share_r2")
    t = fig.data[0]
    assert t.colorscale == charts.go.Heatmap(colorscale="RdBu_r").colorscale  # diverging
    assert t.zmid == 0.25
    # symmetric around chance and wide enough for the farthest value (0.9: 0.65 above)
    assert abs((t.zmin + t.zmax) / 2 - 0.25) < 1e-12 and abs(t.zmax - 0.9) < 1e-12
    assert t.colorbar.title.text == "kv_share_r2<br>chance 0.25"
    assert t.customdata[0][0] == "L0H0<br>kv_share_r2 0.31 (chance 0.25)"
    assert t.hovertemplate == "%{customdata}<extra></extra>"


def test_heatmap_of_activation_metric_tooltips_carry_tokens_and_interval():
    fig = charts.heatmap_figure(_chance_results([[0.31, 0.5]], 0.25, n_tokens=4096, ci=0.03,
                                                metric="kv_cka_act"), "kv_cka_act")
    assert fig.data[0].customdata[0][0] == "L0H0<br>kv_cka_act 0.31 (chance 0.25)<br>n=4096 tokens, 95% CI 0.28–0.34"


def test_heatmap_with_chance_varying_per_head_centres_on_the_median():
    frame = _chance_results([[0.5, 0.5, 0.5]], 0.0)
    frame["chance"] = [0.2, 0.3, 0.25]
    t = charts.heatmap_figure(frame, "kv_share_r2").data[0]
    assert t.zmid == 0.25 and t.colorbar.title.text == "kv_share_r2<br>chance 0.200–0.300"
    assert t.customdata[0][1].endswith("0.5 (chance 0.3)")  # each cell's own chance


def test_heatmap_muted_fades_cells_and_says_why():
    fig = charts.heatmap_figure(_chance_results([[0.9]], 0.25), "kv_share_r2",
                                muted="512 tokens < 8 x d_head = 1024")
    assert fig.data[0].opacity == 0.35
    assert fig.layout.title.text == "Faded: too few tokens (512 tokens &lt; 8 x d_head = 1024)"   # shown as '<'


def test_heat_range_for_shared_scales():
    both = pd.concat([_chance_results([[0.1]], 0.25), _chance_results([[0.35]], 0.25)])
    lo, hi = charts.heat_range(both)
    assert abs(lo - 0.1) < 1e-12 and abs(hi - 0.4) < 1e-12
    assert charts.heat_range(_results([[0.1, 0.3]])) == (0.1, 0.3)  # no chance stored: min and max
    a, b = _chance_results([[0.1]], 0.25), _chance_results([[0.35]], 0.25)
    assert charts.heat_range(a, b) == charts.heat_range(both)        # one chance level: one range
    # two geometries, two chance levels: no range is white at both, so none is shared
    assert charts.heat_range(_chance_results([[0.1]], 0.109), _chance_results([[0.32]], 0.323)) is None
    assert charts.heat_range(_chance_results([[0.1]], 0.25), _results([[0.3]])) is None   # one side without


def test_layer_figure_draws_chance_line_and_interval():
    frame = pd.DataFrame({"layer": [0, 1], "head": [None, None], "metric": ["logit_symmetry"] * 2,
                          "value": [0.7, 0.6], "chance": [0.5, 0.5], "n_tokens": [4096, 4096],
                          "ci_low": [0.65, 0.5], "ci_high": [0.72, 0.7]})
    fig = charts.layer_figure(frame, "logit_symmetry")
    main, chance = fig.data
    np.testing.assert_allclose(main.error_y.array, [0.02, 0.1])
    np.testing.assert_allclose(main.error_y.arrayminus, [0.05, 0.1])
    assert main.customdata[0] == "layer 0<br>logit_symmetry 0.7 (chance 0.5)<br>n=4096 tokens, 95% CI 0.65–0.72"
    assert chance.name == "chance 0.5" and chance.line.dash == "dash" and list(chance.y) == [0.5, 0.5]
    assert fig.layout.xaxis.dtick == 1


def test_trajectory_has_one_chance_line_when_layers_share_it():
    traj = _trajectory([[0.2, 0.5, 0.9], [0.3, 0.4, 0.6]]).assign(chance=0.25)
    fig = charts.trajectory_figure(traj, "kv_cka")
    assert [t.name for t in fig.data] == ["L0", "L1", "chance 0.25"]
    assert fig.data[-1].line.dash == "dash" and list(fig.data[-1].x) == [500, 1500]
    assert fig.data[0].customdata[0] == "L0<br>step 500<br>kv_cka 0.2 (chance 0.25)"


def test_trajectory_of_activation_metric_draws_bands_and_per_layer_chance():
    traj = _trajectory([[0.2, 0.5], [0.3, 0.4]])
    traj = traj.assign(chance=[0.1, 0.1, 0.2, 0.2], n_tokens=4096, ci_low=traj["value"] - 0.05,
                       ci_high=traj["value"] + 0.05)
    fig = charts.trajectory_figure(traj, "kv_cka")
    names = [t.name for t in fig.data]
    assert names == [None, "L0 95% CI", "L0", "L0 chance", None, "L1 95% CI", "L1", "L1 chance"]
    band = fig.data[1]
    assert band.fill == "tonexty"
    np.testing.assert_allclose(band.y, [0.15, 0.45])
    assert fig.data[3].line.dash == "dash" and list(fig.data[3].y) == [0.1, 0.1]


def test_trajectory_flat_at_one_keeps_chance_in_view():
    # K=V run: kv_cka 1 up to rounding, chance 0.2: the y axis must show both, not zoom on the noise
    traj = _trajectory([[1.0, 1 - 6e-8, 1.0]]).assign(chance=0.2)
    fig = charts.trajectory_figure(traj, "kv_cka")
    assert fig.layout.yaxis.range is None


def test_diff_heatmap_tooltip_gives_both_sides_with_chance():
    diff = pd.DataFrame({"metric": ["kv_cka"], "layer": [0], "head": [1], "a": [0.3], "b": [0.36],
                         "diff": [0.06], "chance_a": [0.2], "chance_b": [0.2]})
    t = charts.diff_heatmap(diff, "kv_cka").data[0]
    assert t.zmid == 0.0
    assert t.customdata[0][0] == "L0H1<br>B - A = +0.06<br>A 0.3 (chance 0.2)<br>B 0.36 (chance 0.2)"


def test_chance_label_of_a_range_keeps_the_same_decimals():
    frame = pd.DataFrame({"chance": [0.2772, 0.2799, 0.28]})
    assert charts.chance_label(frame) == "chance 0.277–0.280"
    assert charts.chance_label(pd.DataFrame({"chance": [111.8, 111.8]})) == "chance 111.8"
    assert charts.chance_label(pd.DataFrame({"chance": [float("nan")]})) == "no chance level stored"


# -- one palette and one legend for variant x head sharing --------------

def test_palette_is_the_variants_leaf_and_legend_names_variant_and_sharing():
    from analysis import variants

    assert charts.VARIANT_COLORS is variants.COLORS
    assert charts.legend_label("k_eq_v", "MQA") == "Q-K=V · MQA"
    assert charts.legend_label("qkv", "GQA-2", "vision") == "Q-K-V · GQA-2 · vision"
    assert charts.legend_label("qkv", "?", "language") == "Q-K-V"
    mha, mqa = charts.group_style("k_eq_v", "MHA"), charts.group_style("k_eq_v", "MQA")
    assert mha["color"] == mqa["color"] == variants.COLORS["k_eq_v"]
    assert (mha["dash"], mqa["dash"], charts.group_style("k_eq_v", "GQA-2")["dash"]) == ("solid", "dot", "dash")
    assert mha["symbol"] != mqa["symbol"]


def test_run_styles_share_the_hue_of_a_group_and_shade_its_runs():
    from analysis import variants

    runs = pd.DataFrame({"id": [3, 1, 2], "variant": ["qkv", "qkv", "k_eq_v"], "n_heads": [4, 4, 4],
                         "n_kv_heads": [4, 4, 1]})
    s = charts.run_styles(runs)
    assert s[1]["color"] == variants.COLORS["qkv"] and s[1]["group"] == "Q-K-V · MHA"
    assert s[3]["color"] != s[1]["color"] and s[3]["dash"] == "solid"   # same group: another shade
    assert s[2] == {"color": variants.COLORS["k_eq_v"], "dash": "dot", "symbol": "square", "group": "Q-K=V · MQA"}


def test_log_ticks_read_as_numbers_not_bare_digits():
    t = charts.log_ticks([0.11, 0.95])
    assert t["ticktext"] == ["0.1", "0.2", "0.3", "0.5", "1"]       # ticks just past the data's ends
    assert t["tickvals"] == [0.1, 0.2, 0.3, 0.5, 1.0]
    assert charts.log_ticks([0.25, 0.7])["ticktext"] == ["0.3", "0.4", "0.5", "0.6", "0.7"]
    assert charts.log_ticks([1000, 2e6])["ticktext"][-3:] == ["500k", "1M", "2M"]
    assert charts.log_ticks([0.001, 50])["ticktext"][:4] == ["0.001", "0.003", "0.01", "0.03"]
    assert charts.log_ticks([0.31, 0.33])["ticktext"] == ["0.31", "0.33"]
    assert charts.log_ticks([0.0, -1.0]) == {}


def test_spectra_log_axis_has_labelled_ticks():
    spectra = pd.DataFrame({"projection": ["W_Q"] * 3 + ["W_K"] * 3, "index": [0, 1, 2] * 2,
                            "sigma": [0.9, 0.3, 0.12, 0.8, 0.25, 0.1]})
    fig = charts.spectra_figure(spectra)
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.tickmode == "array"
    assert list(fig.layout.yaxis.ticktext) == ["0.1", "0.2", "0.3", "0.5", "1"]
    assert fig.layout.yaxis.title.text == "singular value σ"


def test_axis_titles_are_words():
    assert charts.axis_title("weight_decay") == "weight decay"
    assert charts.axis_title("n_kv_heads") == "KV heads"
    assert charts.axis_title("some_new_column") == "some new column"
    frame = pd.DataFrame({"name": ["a", "b"], "variant": ["qkv", "k_eq_v"], "lr": [1e-3, 3e-3], "final": [2.0, 2.1]})
    fig = charts.final_scatter(frame, hparam="lr", metric="val/loss", log_x=True)
    assert fig.layout.xaxis.title.text == "learning rate"
    assert [t.name for t in fig.data] == ["Q-K-V", "Q-K=V"]


def test_parallel_coordinates_names_fit_and_read_as_words():
    frame = pd.DataFrame({"variant": ["qkv", "k_eq_v"], "weight_decay": [0.1, 0.0], "n_kv_heads": [4, 1],
                          "final": [2.0, 2.1]})
    fig = charts.parallel_figure(frame, ["weight_decay", "n_kv_heads", "variant"], metric="val/loss")
    dims = fig.data[0].dimensions
    assert [d.label for d in dims] == ["weight decay", "KV heads", "variant", "final val/loss"]
    assert list(dims[2].ticktext) == ["Q-K=V", "Q-K-V"]
    assert fig.layout.margin.t >= 80 and fig.layout.margin.l >= 80 and fig.layout.margin.r >= 80


def _norms(n_variants=5):
    rows = []
    for v in ["qkv", "wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v"][:n_variants]:
        for kv in (4, 1):
            for wd in (0.0, 0.03, 0.1):
                for m in ("norm_q", "norm_k", "norm_v", "norm_o"):
                    rows.append({"variant": v, "weight_decay": wd, "run_id": 1, "metric": m, "value": 10 - wd,
                                 "n_heads": 4, "n_kv_heads": kv})
    return pd.DataFrame(rows)


def test_norms_figure_is_one_panel_per_projection_one_colour_per_variant():
    from analysis import variants

    fig = charts.norms_figure(_norms())
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["W_Q", "W_K", "W_V", "W_O"]
    legend = [t for t in fig.data if t.showlegend]
    # one legend entry per variant x sharing (10), not one per variant x projection (20)
    assert len(legend) == 10 and len({t.name for t in legend}) == 10
    qkv = [t for t in legend if t.name.startswith("Q-K-V ·")]
    assert {t.line.color for t in qkv} == {variants.COLORS["qkv"]} and {t.line.dash for t in qkv} == {"solid", "dot"}
    assert len({t.line.color for t in legend}) == 5   # five variants, five hues
    assert fig.layout.yaxis.title.text == "Frobenius norm"


def test_norms_figure_follows_the_variants_filter():
    fig = charts.norms_figure(_norms(), variants=["k_eq_v"])
    assert {t.name for t in fig.data if t.showlegend} == {"Q-K=V · MHA", "Q-K=V · MQA"}
    assert charts.norms_figure(_norms(), variants=[]).data  # empty filter: all variants
    empty = charts.norms_figure(_norms(), variants=["nope"])
    assert empty.layout.annotations[0].text == "No projection norms for the chosen variants"


def test_norms_figure_reads_head_sharing_from_the_runs_config():
    norms = _norms(1).drop(columns=["n_heads", "n_kv_heads"])
    norms["run_id"] = [1 if i < 12 else 2 for i in range(len(norms))]   # first half MHA, second MQA
    runs = pd.DataFrame({"run_id": [1, 2], "config": [{"files": {"config.json": {"n_head": 4, "n_kv_heads": 4}}},
                                                      {"n_head": 4, "n_kv_heads": 1}]})
    fig = charts.norms_figure(norms, runs=runs)
    assert sorted(t.name for t in fig.data if t.showlegend) == ["Q-K-V · MHA", "Q-K-V · MQA"]


def test_wd_figure_draws_the_head_sharing_groups_of_one_variant_apart():
    from analysis import variants

    pts = pd.DataFrame({"variant": "qkv", "group": ["n_kv_heads=1", "n_kv_heads=2", "n_kv_heads=4"] * 2,
                        "weight_decay": [0.1, 0.1, 0.1, 0.01, 0.01, 0.01], "final_val_loss": [3.0, 2.9, 2.8] * 2,
                        "diverged": False, "spikes": 0, "run_id": [1, 2, 3, 4, 5, 6]})
    lines = {t.name: t.line for t in charts.wd_figure(pts).data if t.mode == "lines"}
    assert {n: l.dash for n, l in lines.items()} == {"Q-K-V [n_kv_heads=1]": "dot", "Q-K-V [n_kv_heads=2]": "dash",
                                                    "Q-K-V [n_kv_heads=4]": "solid"}
    assert {l.color for l in lines.values()} == {variants.COLORS["qkv"]}


def test_scatter_legend_lists_mha_then_gqa_then_mqa():
    frame = pd.DataFrame({"name": list("abc"), "variant": "qkv", "n_heads": 4, "n_kv_heads": [1, 2, 4],
                          "weight_decay": 0.1, "final": [1.0, 2.0, 3.0]})
    assert [t.name for t in charts.final_scatter(frame, hparam="weight_decay").data] == [
        "Q-K-V · MHA", "Q-K-V · GQA-2", "Q-K-V · MQA"]


def test_weight_decay_group_names_say_the_task_and_the_paper_condition():
    assert charts.wd_group_name("qkv", "all") == "Q-K-V"
    assert charts.wd_group_name("qkv", "all", "image") == "Q-K-V [image]"
    assert charts.wd_group_name("qkv", "n_kv_heads=1", "language") == "Q-K-V [language, n_kv_heads=1]"
    # a label that names its task already (analysis.wd_sensitivity across tasks) is not doubled
    assert charts.wd_group_name("qkv", "image, n_kv_heads=1", "image") == "Q-K-V [image, n_kv_heads=1]"
    assert charts.wd_group_name("k_eq_v", "paper_condition=QVV(3), lr=0.1", "image", "QVV(3)") == "QVV(3) [image, lr=0.1]"
    assert charts.wd_group_name("k_eq_v", "all", "image", "QVV(3)", paper_label=False) == "QVV(3) [image]"
    assert charts.wd_group_name("k_eq_v", "all", None, "Q!=K=V", paper_label=False) == "k_eq_v"


def test_weight_decay_figure_puts_language_first_and_names_every_task():
    pts = pd.DataFrame({"task": ["image", "image", "language", "language"], "variant": "qkv", "group": "all",
                        "weight_decay": [0.0, 0.1, 0.0, 0.1], "final_val_loss": [0.3, 0.2, 1.4, 1.3],
                        "diverged": False, "spikes": 0, "run_id": [1, 2, 3, 4]})
    lines = [t for t in charts.wd_figure(pts).data if t.mode == "lines"]
    assert [t.name for t in lines] == ["Q-K-V [language]", "Q-K-V [image]"]
    assert lines[0].line.dash != lines[1].line.dash             # one hue, two tasks: two dashes
    only_language = charts.wd_figure(pts[pts["task"] == "language"])
    assert [t.name for t in only_language.data if t.mode == "lines"] == ["Q-K-V"]


def test_norms_figure_keeps_tasks_apart():
    norms = pd.DataFrame({"run_id": [1, 2, 3, 4], "variant": "qkv", "weight_decay": [0.0, 0.1, 0.0, 0.1],
                          "metric": "norm_k", "value": [1.0, 0.8, 3.0, 2.5]})
    runs = pd.DataFrame({"run_id": [1, 2, 3, 4], "config": [{"n_head": 4}, {"n_head": 4}, {"n_head": 4, "task": "image"},
                                                            {"n_head": 4, "task": "image"}]})
    legend = [t for t in charts.norms_figure(norms, runs=runs).data if t.showlegend]
    assert [t.name for t in legend] == ["Q-K-V · MHA · language", "Q-K-V · MHA · image"]
    assert [list(t.y) for t in legend] == [[1.0, 0.8], [3.0, 2.5]]
    assert legend[0].line.color != legend[1].line.color          # the other task a darker shade


@pytest.mark.parametrize("variant, wq, wv", [("qkv", 2 * 4 * 8 * 2, 2 * 2 * 8 * 2), ("k_eq_v", 2 * 4 * 8 * 2, 0),
                                             ("q_eq_k_plus", 0, 2 * 2 * 8 * 2), ("q_eq_k_eq_v_plus", 0, 0),
                                             ("wq_identity", 0, 2 * 2 * 8 * 2)])
def test_parameter_split_follows_the_variants_ties(variant, wq, wv):
    row = {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_model": 8, "d_head": 2, "variant": variant,
           "params_attention": 1000, "params_total": 5000}
    pie = charts.param_split_figure(row).data[0]
    parts = dict(zip(pie.labels, pie.values))
    assert (parts["W_Q"], parts["W_K"], parts["W_V"], parts["W_O"]) == (wq, 2 * 2 * 8 * 2, wv, 2 * 4 * 2 * 8)
    assert parts["rest of the model"] == 4000
    # a part of no parameters has no percentage drawn beside the ring; the others have theirs
    assert [t == "" for t in pie.texttemplate] == [v == 0 for v in pie.values]


def test_curves_are_svg_lines_one_per_run_and_smoothed_behind():
    # SVG, not WebGL: headless Chromium has no GPU and a WebGL draw blocked the page (bench/dashboard_speed.py)
    raw = pd.DataFrame({"run_id": [1, 1, 2, 2], "x": [0, 1, 0, 1], "value": [3.0, 2.0, 4.0, 1.0], "step": [0, 1, 0, 1]})
    fig = charts.curves_figure(raw, metric="loss", labels={1: "a", 2: "b"})
    assert [(t.type, t.name) for t in fig.data] == [("scatter", "a"), ("scatter", "b")]
    fig = charts.curves_figure(raw, metric="loss", labels={1: "a", 2: "b"}, smoothed=raw)
    assert [t.type for t in fig.data] == ["scatter"] * 4 and fig.data[0].showlegend is False


def test_curves_against_the_step_send_it_once_and_tokens_keep_it_for_the_tooltip():
    raw = pd.DataFrame({"run_id": [1, 1, 1], "x": [0.0, 4096.0, 8192.0], "value": [3.0, 2.5, 2.0],
                        "step": [0, 1, 2]})
    # against the step: x is the step as integers, named in the tooltip as the step; nothing more
    by_step = charts.curves_figure(raw.assign(x=[0.0, 1.0, 2.0]), metric="loss", labels={1: "a"}, x="step")
    t = by_step.data[0]
    assert t.customdata is None and t.x.dtype.kind == "i" and list(t.x) == [0, 1, 2]
    assert t.hovertemplate == "a<br>step %{x}<br>loss %{y:.4g}<extra></extra>"
    smooth = charts.curves_figure(raw.assign(x=[0.0, 1.0, 2.0]), metric="loss", labels={1: "a"}, x="step",
                                  smoothed=raw.assign(x=[0.0, 1.0, 2.0]))
    assert [tr.customdata for tr in smooth.data] == [None, None]
    assert smooth.data[1].hovertemplate == "a (smoothed)<br>step %{x}<br>loss %{y:.4g}<extra></extra>"
    # against tokens: x is the tokens, the step rides along for the tooltip
    t = charts.curves_figure(raw, metric="loss", labels={1: "a"}, x="tokens").data[0]
    assert list(t.x) == [0.0, 4096.0, 8192.0] and list(t.customdata) == [0, 1, 2]
    assert t.hovertemplate == "a<br>step %{customdata}<br>x %{x}<br>loss %{y:.4g}<extra></extra>"
    assert (by_step.to_json().count('"bdata"'), charts.curves_figure(raw, metric="loss", labels={1: "a"},
                                                                       x="tokens").to_json().count('"bdata"')) == (2, 3)


# -- the Experiments page at 2,000 runs: one label and style per group ---------

def _mixed_runs(n: int = 150) -> pd.DataFrame:
    """Runs of every kind the legend tells apart: known and unknown variants, missing and GQA/MQA
    head counts, two tasks and a missing one, a paper condition and missing ones (None, NaN)."""
    rng = np.random.default_rng(7)
    return pd.DataFrame({
        "id": rng.permutation(np.arange(1, n + 1)),
        "name": [f"run-{i}" for i in range(n)],
        "variant": rng.choice(["qkv", "k_eq_v", "q_eq_k", "something_new"], n),
        "n_heads": rng.choice([8.0, np.nan], n),
        "n_kv_heads": rng.choice([8, 2, 1, None], n),
        "task": rng.choice(["language", "vision", None], n),
        "condition": rng.choice(["QVV(3)", None, np.nan], n),
        "weight_decay": rng.choice([0.0, 0.01, 0.1], n),
        "final": rng.normal(3.0, 0.2, n),
    })


def _row(row: dict, key: str):
    v = row.get(key)
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else v


def test_run_styles_of_many_runs_follow_the_per_run_definition():
    runs = _mixed_runs()
    name_task = charts.several_tasks(runs["task"])
    assert name_task                                   # two tasks: every label names its task
    seen: dict[str, int] = {}
    expected = {}
    unknown = 0
    for row in runs.sort_values("id").to_dict("records"):     # the definition, one run at a time
        sharing = charts.sharing_of(row["n_heads"], row["n_kv_heads"])
        task = _row(row, "task") or "language"
        group = charts.legend_label(row["variant"], sharing, task, _row(row, "condition"), name_task=True)
        style = charts.group_style(row["variant"], sharing)
        style["symbol"] += "" if task == "language" else "-open"        # language first, then vision
        if row["variant"] == "something_new":                            # unknown: the second palette, per run
            expected[int(row["id"])] = {**style, "color": charts.UNKNOWN_COLORS[unknown % 12], "group": group}
            unknown += 1
            continue
        k = seen.get(group, 0)
        seen[group] = k + 1
        expected[int(row["id"])] = {**style, "color": charts.shade(style["color"], charts._RUN_SHADES[k % 8]),
                                    "group": group}
    assert charts.run_styles(runs) == expected
    assert len(set(seen)) > 6 and max(seen.values()) > 8      # groups of several runs, shades wrap round


def test_final_scatter_draws_each_group_once_with_all_its_runs():
    runs = _mixed_runs()
    fig = charts.final_scatter(runs, hparam="weight_decay", metric="val/loss")
    keys = charts.legend_keys(runs)
    # one trace per variant x sharing x legend name (a paper condition names runs of two variants alike)
    groups = {(str(k[0]), k[1], charts.legend_label(*k, name_task=True)) for k in keys}
    assert sorted(t.name for t in fig.data) == sorted(g[2] for g in groups)
    assert sum(len(t.x) for t in fig.data) == len(runs)
    label = dict(zip(runs["name"], (charts.legend_label(*k, name_task=True) for k in keys)))
    for trace in fig.data:
        assert {label[n] for n in trace.text} == {trace.name}        # a trace holds its group's runs only
        assert list(trace.x) == sorted(trace.x)                      # in hyperparameter order
        y = dict(zip(runs["name"], runs["final"]))
        assert [y[n] for n in trace.text] == list(trace.y)


def test_light_template_is_plotly_white_less_what_these_figures_never_read():
    import json

    import plotly.io as pio

    white = pio.templates["plotly_white"].to_plotly_json()
    light = json.loads(json.dumps(charts.LIGHT.to_plotly_json()))
    assert set(white["layout"]) - set(light["layout"]) == {"colorscale", "geo", "polar", "scene", "ternary"}
    for key, value in light["layout"].items():
        assert value == white["layout"][key], key
    assert sorted(light["data"]) == sorted(charts.TRACE_TYPES)
    for kind, defaults in light["data"].items():
        assert defaults == charts._without(white["data"][kind], ("colorscale",)), kind
    # every figure here is of those trace types, and each colour scale it uses is its own
    results = _results([[0.1, 0.9], [0.5, 0.3]])
    figs = [charts.heatmap_figure(results, "kv_cka"), charts.final_scatter(_mixed_runs(), hparam="weight_decay"),
            charts.parallel_figure(_mixed_runs(), ["weight_decay"], metric="val/loss"),
            charts.attention_figure(np.eye(3), ["a", "b", "c"])]
    for fig in figs:
        assert fig.layout.template == charts.LIGHT
        for trace in fig.data:
            assert trace.type in charts.TRACE_TYPES
            if trace.type == "heatmap":
                assert trace.colorscale is not None
            if trace.type == "parcoords":
                assert trace.line.colorscale is not None


# -- the final metric summarised: per group and x a mean and its 95% t interval --

def _t_reference(ok: np.ndarray) -> tuple[float, float]:
    """The t interval written out in float64: mean -+ t_{n-1, 0.975} s / sqrt(n) (t quantiles of
    2, 5 and 45 runs from tables)."""
    t = {2: 12.706204736, 5: 2.776445105, 45: 2.015367574}[len(ok)]
    y = ok.astype(np.float64)
    half = t * y.std(ddof=1) / np.sqrt(len(y))
    return y.mean() - half, y.mean() + half


def _summary_runs() -> pd.DataFrame:
    """Two groups at two weight decays with 5, 45, 2 and 1 runs, and one group whose runs at wd 0.1
    include a NaN, an inf and a run that logged non-finite values (its last finite value kept)."""
    rng = np.random.default_rng(3)
    rows = []
    for variant, wd, n in (("qkv", 0.01, 5), ("qkv", 0.1, 45), ("k_eq_v", 0.01, 2), ("k_eq_v", 0.1, 1)):
        rows += [{"variant": variant, "weight_decay": wd, "final": float(v), "nonfinite": 0}
                 for v in rng.normal(3.0 + wd, 0.1, n)]
    rows += [{"variant": "k_eq_v", "weight_decay": 0.1, "final": v, "nonfinite": k}
             for v, k in ((np.nan, 4), (np.inf, 1), (2.5, 7))]
    frame = pd.DataFrame(rows)
    return frame.assign(name=[f"run-{i}" for i in range(len(frame))])


def test_final_summary_is_the_mean_and_t_interval_of_each_group_and_x():
    frame = _summary_runs()
    got = charts.final_summary(frame, hparam="weight_decay")
    assert list(got.columns) == charts.SUMMARY_COLUMNS
    assert list(zip(got["group"], got["x"], got["n"], got["diverged"])) == [
        ("Q-K-V", 0.01, 5, 0), ("Q-K-V", 0.1, 45, 0), ("Q-K=V", 0.01, 2, 0), ("Q-K=V", 0.1, 1, 3)]
    for row in got.to_dict("records"):
        ok = frame[(frame["variant"] == row["variant"]) & (frame["weight_decay"] == row["x"])
                   & (frame["nonfinite"] == 0) & np.isfinite(frame["final"])]["final"].to_numpy(np.float64)
        assert row["mean"] == pytest.approx(np.mean(ok), rel=1e-13)
        assert (row["min"], row["max"]) == (ok.min(), ok.max())
        if len(ok) >= 2:
            lo, hi = _t_reference(ok)
            assert (row["lo"], row["hi"]) == pytest.approx((lo, hi), rel=1e-9)
            assert row["lo"] < row["mean"] < row["hi"]
            assert (row["minus"], row["plus"]) == pytest.approx((row["mean"] - lo, hi - row["mean"]), rel=1e-9)
        else:                                 # one run: its value, no interval
            assert np.isnan(row["lo"]) and np.isnan(row["hi"]) and np.isnan(row["plus"])
    # 45 runs of sd 0.1: the interval is about +-1.96 * 0.1 / sqrt(45) wide
    assert got["hi"][1] - got["lo"][1] == pytest.approx(2 * 1.96 * np.std(
        frame[(frame["variant"] == "qkv") & (frame["weight_decay"] == 0.1)]["final"], ddof=0) / np.sqrt(45), rel=0.2)


def test_final_summary_interval_does_not_move_when_other_runs_are_filtered_out():
    frame = _summary_runs()
    every = charts.final_summary(frame, hparam="weight_decay")
    alone = charts.final_summary(frame[frame["variant"] == "qkv"], hparam="weight_decay")
    pd.testing.assert_frame_equal(alone, every[every["variant"] == "qkv"].reset_index(drop=True))


def test_the_weight_decay_page_and_the_summary_bound_a_mean_the_same_way():
    """One piece of code for a mean over runs: the Weight decay page's per-wd interval is
    ``analysis.intervals.mean_interval`` too."""
    from analysis.intervals import mean_interval
    from analysis.wd_sensitivity import group_statistics

    y = [3.1, 3.0, 3.3, 2.9]
    per_wd = group_statistics([0.1] * 4, y, rng=np.random.default_rng(5))["per_wd"][0]
    assert (per_wd["ci_low"], per_wd["ci_high"]) == mean_interval(y)


def test_final_summary_of_runs_that_all_diverged_has_no_mean():
    frame = pd.DataFrame({"name": ["a", "b", "c"], "variant": "qkv", "lr": [1e-3, 1e-3, 3e-3],
                          "final": [np.inf, np.nan, 2.0]})
    got = charts.final_summary(frame, hparam="lr")
    assert list(zip(got["x"], got["n"], got["diverged"])) == [(1e-3, 0, 2), (3e-3, 1, 0)]
    assert np.isnan(got["mean"][0])
    fig = charts.final_summary_figure(frame, hparam="lr", log_x=True)
    [trace] = fig.data
    assert list(trace.x) == [3e-3] and list(trace.y) == [2.0]      # no marker where nothing is left


def test_final_summary_figure_is_one_marker_per_group_and_x_with_its_interval():
    frame = _summary_runs()
    summary = charts.final_summary(frame, hparam="weight_decay")
    fig = charts.final_summary_figure(frame, hparam="weight_decay", metric="val/loss", log_x=True)
    from analysis.variants import COLORS

    # one trace per group, styled as the every-run scatter's; n in the legend is the runs in the means
    assert [t.name for t in fig.data] == ["Q-K-V (n=50)", "Q-K=V (n=3)"]
    assert [t.marker.color for t in fig.data] == [COLORS["qkv"], COLORS["k_eq_v"]]
    assert [t.marker.color for t in fig.data] == [t.marker.color for t in
                                                  charts.final_scatter(frame, hparam="weight_decay").data]
    qkv, kv = fig.data
    assert list(qkv.x) == [0.01, 0.1] and list(qkv.y) == list(summary["mean"][:2])   # no per-run arrays
    assert qkv.error_y.visible and qkv.error_y.symmetric is False
    assert list(qkv.error_y.array) == pytest.approx(list(summary["plus"][:2]))
    assert list(qkv.error_y.arrayminus) == pytest.approx(list(summary["minus"][:2]))
    assert list(kv.error_y.array) == [summary["plus"][2], None]                     # one run: no bar
    assert fig.layout.yaxis.title.text == "final val/loss (mean, 95% interval)"
    assert fig.layout.xaxis.type == "log"
    hover = dict(zip(kv.x, kv.text))
    assert hover[0.1] == ("Q-K=V<br>weight decay 0.1<br>final val/loss " + charts.num(summary["mean"][3])
                          + "<br>n = 1 (no interval)<br>3 diverged (not in the mean)")
    assert dict(zip(qkv.x, qkv.text))[0.1].split("<br>")[2:] == [
        f"mean final val/loss {charts.num(summary['mean'][1])}",
        f"95% t interval {charts.interval_text(summary['lo'][1], summary['hi'][1])}",
        f"n = 45 runs, min {charts.num(summary['min'][1])}, max {charts.num(summary['max'][1])}"]


def test_final_summary_of_many_runs_keeps_the_groups_of_the_every_run_scatter():
    runs = _mixed_runs()
    every = charts.final_scatter(runs, hparam="weight_decay", metric="val/loss")
    summary = charts.final_summary_figure(runs, hparam="weight_decay", metric="val/loss")
    assert [t.name.rsplit(" (n=", 1)[0] for t in summary.data] == [t.name for t in every.data]
    assert [int(t.name.rsplit("(n=", 1)[1][:-1]) for t in summary.data] == [len(t.x) for t in every.data]
    for s, e in zip(summary.data, every.data):
        assert list(s.x) == sorted(set(e.x))                      # one marker per x of the group
        assert s.type in charts.TRACE_TYPES and s.marker.symbol == e.marker.symbol


def test_unknown_variant_runs_get_distinct_colours_and_tasks_distinct_markers():
    import pandas as pd

    from app.charts import UNKNOWN_COLORS, VARIANT_COLORS, run_styles

    runs = pd.DataFrame({"id": [1, 2, 3, 4, 5], "variant": ["unknown", "unknown", "unknown", "qkv", "qkv"],
                         "n_heads": 4, "n_kv_heads": 4, "task": ["language", "language", "language", "language", "image"]})
    s = run_styles(runs)
    assert [s[i]["color"] for i in (1, 2, 3)] == UNKNOWN_COLORS[:3]
    assert not set(UNKNOWN_COLORS) & set(VARIANT_COLORS.values())
    # language filled, the other task open: told apart without the legend
    assert (s[4]["symbol"], s[5]["symbol"]) == ("circle", "circle-open")


def test_log_ticks_reach_the_lowest_values():
    from app.charts import log_ticks

    # training curves from ~11 down to final losses of 1.31-1.68: a tick where the finals lie
    assert log_ticks([1.31, 1.34, 1.44, 1.68, 4.0, 11.0])["tickvals"] == [1.3, 2.0, 3.0, 5.0, 10.0]
    assert log_ticks([0.2, 0.6])["tickvals"] == [0.2, 0.3, 0.4, 0.5, 0.6]    # already there: unchanged


def test_groups_never_span_projects_or_geometries():
    import pandas as pd

    from app.charts import run_styles

    runs = pd.DataFrame({"id": [1, 2, 3, 4], "variant": "qkv", "n_heads": 4, "n_kv_heads": 4,
                         "project": ["sweep-a", "sweep-a", "sweep-a", "sweep-b"],
                         "d_model": [128, 128, 256, 128], "n_layers": 4})
    s = run_styles(runs)
    assert [s[i]["group"] for i in (1, 2, 3, 4)] == [
        "Q-K-V · MHA · sweep-a · d128 L4", "Q-K-V · MHA · sweep-a · d128 L4", "Q-K-V · MHA · sweep-a · d256 L4",
        "Q-K-V · MHA · sweep-b · d128 L4"]
    one = run_styles(runs[runs["project"] == "sweep-b"])
    assert one[4]["group"] == "Q-K-V · MHA"               # nothing to tell apart: no suffix


def test_heatmap_half_width_is_at_least_the_null_band_and_degenerate_cells_are_grey():
    """A random model's values, all inside the null band, stay pale: the colour range is centred on
    chance with a half-width of at least the band's; a degenerate cell is drawn grey, off the scale,
    and a value called above chance is starred."""
    rows = pd.DataFrame({"layer": [0, 0, 1, 1], "head": pd.array([0, 1, 0, 1], dtype="Int64"),
                         "metric": ["kv_cka"] * 4, "value": [0.21, 0.19, 0.20, 1.0], "chance": [0.2] * 4,
                         "chance_low": [0.15] * 4, "chance_high": [0.26] * 4,
                         "above_chance": pd.array([False, False, False, pd.NA], dtype="boolean"),
                         "degenerate": [False, False, False, True]})
    fig = charts.heatmap_figure(rows, "kv_cka")
    main = fig.data[0]
    assert main.zmid == 0.2 and main.zmin == pytest.approx(0.14) and main.zmax == pytest.approx(0.26)
    assert main.z[1][1] is None or math.isnan(main.z[1][1])           # the degenerate 1.0 is not coloured
    grey = fig.data[1]
    assert grey.name == "degenerate" and grey.z[1][1] == 1.0 and grey.showscale is False
    rows.loc[0, "above_chance"] = True
    assert charts.heatmap_figure(rows, "kv_cka").data[0].text[0][0] == "0.21*"
    assert charts.diverging_range([0.21, 0.19], 0.2) == pytest.approx((0.19, 0.21))
    assert charts.diverging_range([0.21, 0.19], 0.2, (0.15, 0.26)) == pytest.approx((0.14, 0.26))
