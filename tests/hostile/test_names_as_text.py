"""Names from links and logs render as text on the pages: Markdown images and links,
HTML and Streamlit's icon syntax are escaped (``app.plain``), plotly legends show
``<a href>`` as written."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from analysis.variants import VARIANTS
from app.figures import as_text
from app.plain import html, md
from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.app.apptest import page_test

IMAGE = "![x](https://attacker.example/pixel.png)"
LINK = "[text](https://attacker.example)"
VARIANT_NAMES = list(VARIANTS)


@pytest.mark.parametrize("text, shown", [
    (IMAGE, r"\!\[x\]\(https\:\/\/attacker\.example\/pixel\.png\)"),
    ('<img src=x onerror="alert(1)">', r'\<img src\=x onerror\=\"alert\(1\)\"\>'),
    (":material/home: $x$ *b* `c`\nnext", r"\:material\/home\: \$x\$ \*b\* \`c\` next"),
])
def test_md_escapes_every_markdown_and_html_mark(text, shown):
    assert md(text) == shown


def test_legend_names_are_text_not_html():
    fig = go.Figure([go.Scatter(x=[0], y=[1], name='<a href="https://attacker.example">run</a> & co',
                                legendgroup="g", legendgrouptitle_text="<b>group</b>")])
    out = as_text(fig)
    assert out.data[0].name == '&lt;a href="https://attacker.example"&gt;run&lt;/a&gt; &amp; co'
    assert out.data[0].legendgrouptitle.text == "&lt;b&gt;group&lt;/b&gt;"
    assert fig.data[0].name.startswith("<a href")                 # the caller's figure is unchanged
    assert html("a<b") == "a&lt;b"


def test_kv_cost_echoes_link_values_as_text(tmp_path, monkeypatch):
    db = tmp_path / "kv.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("kv_cost", {"ctx": IMAGE, "variant": LINK}).run()
    assert not at.exception
    [warning] = at.warning
    assert warning.value.startswith("Ignored in the URL: ")
    assert md(f"variant={LINK!r} (one of {', '.join(VARIANT_NAMES)})") in warning.value
    assert md(f"ctx={IMAGE!r} (expected an integer)") in warning.value
    assert "](" not in warning.value and "![" not in warning.value


def test_diverged_run_names_in_the_experiments_page_are_text(tmp_path, monkeypatch):
    name = "[evil](javascript:alert(1)) <img src=x>"
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / f"{name}.csv").write_text("step,loss\n0,3\n1,inf\n")
    (logs / "fine.csv").write_text("step,loss\n0,3\n1,2\n")
    db = tmp_path / "db.duckdb"
    ingest_paths(Store(db), [logs])
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("experiments").run()
    assert not at.exception
    texts = [w.value for w in at.warning] + [c.value for c in at.caption]
    shown = [t for t in texts if "evil" in t]
    assert shown and all(md(name) in t for t in shown), texts


# -- every figure builder: names from files as text in tooltips, titles and axis labels ----------

#: A name from a log or a file: HTML plotly would draw (an image tag, a link, bold), Markdown, and
#: a hovertemplate field.
PAYLOAD = '<img src=x onerror=alert(1)> <a href="https://attacker.example">a</a> <b>b</b> ' \
          '[x](javascript:alert(1)) **b** %{y}'


def _strings(node, path: str = ""):
    """(path, string) of every string in a figure's JSON (``data.0.hovertemplate``, ``layout.title.text``)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k != "template":
                yield from _strings(v, f"{path}.{k}" if path else k)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}.{i}")
    elif hasattr(node, "tolist"):                                   # numpy arrays of strings
        yield from _strings(node.tolist(), path)
    elif isinstance(node, str):
        yield path, node


def _shown(text: str) -> str:
    """What plotly shows of a string of its HTML subset: entities decoded (``&lt;``, ``&#37;``)."""
    import html as _h
    return _h.unescape(text)


def assert_shown_as_text(fig, *places: str) -> None:
    """``fig``, as the dashboard draws it and the CLI writes it (``as_text``): no string it draws holds
    ``PAYLOAD`` as markup or with its ``%{y}`` live in a hovertemplate (parallel coordinates' tick
    texts excepted: plotly sets them as plain text), and the payload is shown, as written, at
    every one of ``places`` (path prefixes of ``_strings``; ``*`` stands for any index)."""
    texts = [(p, s) for p, s in _strings(as_text(fig).to_plotly_json())
             if not p.endswith("legendgroup")]                        # an identifier, never drawn
    plain_text = [p for p, _ in texts if ".dimensions." in p and p.split(".")[-2] == "ticktext"]
    raw = [p for p, s in texts if PAYLOAD in s and p not in plain_text]
    assert not raw, raw
    live = [p for p, s in texts if p.endswith("hovertemplate") and html(PAYLOAD) in s]
    assert not live, live
    for place in places:
        where = re.compile(re.escape(place).replace(r"\*", r"\d+"))
        assert any(PAYLOAD in _shown(s) for p, s in texts if where.match(p)), (place, texts)


def _import_charts():
    from app import attention_view, charts, page_figures
    return attention_view, charts, page_figures


def test_curve_and_band_figures_show_run_group_and_metric_names_as_text():
    _, charts, _ = _import_charts()
    raw = pd.DataFrame({"run_id": [1, 1], "step": [0, 10], "x": [0, 10], "value": [3.0, 2.0]})
    fig = charts.curves_figure(raw, {1: PAYLOAD}, metric=PAYLOAD, smoothed=raw)
    assert_shown_as_text(fig, "data.0.name", "data.0.hovertemplate", "data.1.hovertemplate", "layout.yaxis.title")
    tokens = charts.curves_figure(raw, {1: PAYLOAD}, x="tokens", metric=PAYLOAD)
    assert_shown_as_text(tokens, "data.0.hovertemplate", "layout.yaxis.title")
    band = pd.DataFrame({"group": [PAYLOAD] * 2, "x": [0, 10], "mean": [3.0, 2.0], "lo": [2.9, 1.9],
                         "hi": [3.1, 2.1], "n_runs": [2, 2]})
    assert_shown_as_text(charts.band_figure(band, metric=PAYLOAD), "data.2.name", "data.2.hovertemplate",
                         "layout.yaxis.title")


def test_final_metric_figures_show_run_project_and_hyperparameter_names_as_text():
    _, charts, _ = _import_charts()
    frame = pd.DataFrame({"name": [PAYLOAD, "b"], "variant": "qkv", "project": [PAYLOAD, "other"],
                          PAYLOAD: [0.1, 0.2], "final": [2.0, 2.1]})
    scatter = charts.final_scatter(frame, hparam=PAYLOAD, metric=PAYLOAD)
    assert_shown_as_text(scatter, "data.0.name", "data.0.text", "data.0.hovertemplate", "layout.xaxis.title",
                         "layout.yaxis.title")
    summary = charts.final_summary_figure(frame, hparam=PAYLOAD, metric=PAYLOAD)
    assert_shown_as_text(summary, "data.0.name", "data.0.text", "layout.xaxis.title", "layout.yaxis.title")
    parallel = charts.parallel_figure(frame.assign(task=[PAYLOAD, "t"]), [PAYLOAD, "task"], metric=PAYLOAD)
    assert_shown_as_text(parallel, "data.0.dimensions.0.label", "data.0.dimensions.2.label",
                         "data.0.line.colorbar.title")
    # the category texts of a parallel axis are plain text to plotly: written as they are
    assert PAYLOAD in as_text(parallel).data[0].dimensions[1].ticktext


def test_metric_and_checkpoint_figures_show_names_as_text():
    _, charts, _ = _import_charts()
    heads = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "metric": PAYLOAD, "value": [0.3, 0.4], "chance": 0.25})
    assert_shown_as_text(charts.heatmap_figure(heads, PAYLOAD, help_text=PAYLOAD), "data.0.customdata",
                         "data.0.colorbar.title", "layout.title")
    assert_shown_as_text(charts.heatmap_figure(heads.iloc[:0], PAYLOAD), "layout.annotations.0.text")
    layers = heads.assign(head=None)
    assert_shown_as_text(charts.layer_figure(layers, PAYLOAD), "data.0.name", "data.0.customdata",
                         "layout.yaxis.title")
    traj = pd.DataFrame({"step": [1, 2], "layer": [0, 0], "metric": PAYLOAD, "value": [0.2, 0.3], "chance": 0.1})
    assert_shown_as_text(charts.trajectory_figure(traj, PAYLOAD), "data.0.customdata", "layout.yaxis.title")
    diff = pd.DataFrame({"metric": [PAYLOAD], "layer": [0], "head": [1], "a": [0.3], "b": [0.36], "diff": [0.06]})
    assert_shown_as_text(charts.diff_heatmap(diff, PAYLOAD, a_label=PAYLOAD, b_label="B"), "data.0.customdata",
                         "data.0.colorbar.title")
    spectra = pd.DataFrame({"projection": [PAYLOAD] * 2, "index": [0, 1], "sigma": [0.9, 0.3]})
    assert_shown_as_text(charts.spectra_figure(spectra), "data.0.name", "data.0.hovertemplate")


def test_attention_maps_show_tokens_and_titles_as_text():
    attention_view, charts, _ = _import_charts()
    weights = np.full((2, 2), 0.5)
    assert_shown_as_text(charts.attention_figure(weights, [PAYLOAD, "b"], title=PAYLOAD), "data.0.x", "data.0.y",
                         "layout.title")
    head = attention_view.head_figure(weights, [PAYLOAD, "b"], title=PAYLOAD)
    assert_shown_as_text(head, "data.0.customdata", "layout.xaxis.ticktext", "layout.yaxis.ticktext", "layout.title")
    assert_shown_as_text(attention_view.grid_figure(weights[None], [PAYLOAD, "b"], layer=0), "data.0.customdata")


def test_weight_decay_figures_show_group_project_and_metric_names_as_text():
    _, charts, page_figures = _import_charts()
    from app.pages.weight_decay import coefficient_figure, regression_figure

    pts = pd.DataFrame({"variant": "qkv", "group": PAYLOAD, "weight_decay": [0.1, 0.01], "final_val_loss": [3.0, 2.9],
                        "diverged": False, "spikes": 0, "run_id": [1, 2]})
    fig = charts.wd_figure(pts, y_title=PAYLOAD)
    assert_shown_as_text(fig, "data.0.name", "data.1.hovertemplate", "layout.yaxis.title")
    means = pd.DataFrame({"variant": "qkv", "group": PAYLOAD, "weight_decay": [0.1, 0.01], "n_runs": [2, 1],
                          "mean": [3.0, 2.9], "ci_low": [2.8, None], "ci_high": [3.2, None]})
    assert_shown_as_text(page_figures.add_intervals(fig, means, y_title=PAYLOAD), "data.2.hovertemplate")
    norms = pd.DataFrame({"variant": "qkv", "task": [PAYLOAD, "language"], "weight_decay": [0.1, 0.01],
                          "run_id": [1, 2], "metric": "norm_q", "value": [3.0, 2.0]})
    assert_shown_as_text(charts.norms_figure(norms), "data.*.name", "data.*.hovertemplate")
    reg = {"weight_decays": [0.01, 0.1], "values": [3.0, 2.9], "run_ids": [1, 2], "pd_values": [3.0, 2.9],
           "pd_weight_decays": [0.01, 0.1], "linear_pd_values": [3.0, 2.9], "wd_coef": -0.1,
           "wd_coef_ci_low": -0.2, "wd_coef_ci_high": 0.0, "n_runs": 2, "confidence": 0.95}
    regs = {("language", "qkv", PAYLOAD): reg, ("language", "qkv", "other"): reg}
    assert_shown_as_text(regression_figure(regs, y_title=PAYLOAD), "data.0.name", "data.0.hovertemplate",
                         "data.1.hovertemplate", "layout.yaxis.title")
    assert_shown_as_text(coefficient_figure(regs, metric=PAYLOAD), "data.0.y", "data.0.hovertemplate",
                         "layout.xaxis.title")


def test_results_and_whatif_figures_show_labels_and_projects_as_text():
    _, _, page_figures = _import_charts()
    table = pd.DataFrame({"label": [PAYLOAD, "Q-K-V"], "variant": "qkv", "sharing": "MHA",
                          "project": [PAYLOAD, "other"], "KV bytes/token": [1024, 2048],
                          f"{PAYLOAD} mean": [3.0, 2.9], f"{PAYLOAD} std": [0.1, 0.1], f"{PAYLOAD} n": [2, 2]})
    assert_shown_as_text(page_figures.results_figure(table, PAYLOAD), "data.0.name", "data.0.hovertemplate",
                         "layout.yaxis.title")
    curve = pd.DataFrame({"kv_saved_pct": [0, 10], "delta_ppl_pct": [0, 1], "layers": ["", PAYLOAD]})
    points = pd.DataFrame({"kv_saved_pct": [50], "delta_ppl_pct": [2], "label": [PAYLOAD]})
    assert_shown_as_text(page_figures.whatif_figure({PAYLOAD: curve}, points, points), "data.0.name",
                         "data.0.text", "data.1.text", "data.2.text")


def test_figures_written_by_the_cli_show_names_as_text(tmp_path, monkeypatch):
    import plotly.io as pio

    from app.figures import write_figures

    written = []
    monkeypatch.setattr(pio, "write_images", lambda figs, paths, **kw: written.extend(figs))
    fig = go.Figure([go.Scatter(x=[0], y=[1], name=PAYLOAD)])
    write_figures({"curves": fig}, tmp_path, formats=("svg",))
    assert [f.data[0].name for f in written] == [html(PAYLOAD)]
