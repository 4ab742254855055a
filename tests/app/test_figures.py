"""``app.figures``: every chart's toolbar downloads SVG or PNG at a paper's size, and ``--figures DIR``
writes SVG, PDF and PNG through plotly's own export (kaleido and Debian's Chromium)."""
from __future__ import annotations

import ast
import json
import struct
from pathlib import Path

import plotly.graph_objects as go
import pytest

from app import figures
from app.cli import main
from tests.app.apptest import page_test

ROOT = Path(__file__).resolve().parents[2]


def test_the_toolbar_downloads_svg_or_png_at_a_two_column_width():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    assert figures.toolbar_config(fig, "kv plot/cache") == {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "svg", "filename": "kv_plot_cache", "width": 672, "height": 420,
                                 "scale": 1}}
    fig.update_layout(height=520)
    assert figures.toolbar_config(fig, "wd_curve", "png")["toImageButtonOptions"] == {
        "format": "png", "filename": "wd_curve", "width": 672, "height": 520, "scale": 4}
    with pytest.raises(ValueError, match="chart format must be one of svg, png; got 'jpeg'"):
        figures.toolbar_config(fig, "x", "jpeg")


def test_every_chart_of_the_dashboard_goes_through_the_one_helper():
    calls = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "plotly_chart":
                calls.append(str(path.relative_to(ROOT)))
    assert calls == ["app/figures.py"]


def test_a_page_sends_the_download_options_with_each_chart(tmp_path, monkeypatch):
    from loaders.store import Store

    Store(tmp_path / "kv.duckdb").migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(tmp_path / "kv.duckdb"))
    at = page_test("kv_cost", {"preset": "llama-3-8b", "variant": "k_eq_v"}).run()
    assert not at.exception, at.exception
    sent = {e.key: json.loads(e.proto.config) for e in at.get("plotly_chart")}
    assert set(sent) == {"kv_plot_cache", "kv_plot_users", "kv_plot_cost", "kv_plot_gpus"}
    for key, config in sent.items():
        assert config["toImageButtonOptions"] == {"format": "svg", "filename": key, "width": 672, "height": 520,
                                                  "scale": 1}


def test_an_export_that_fails_names_the_folder_and_why(tmp_path, monkeypatch):
    import plotly.io as pio

    def no_browser(*args, **kwargs):
        raise RuntimeError("Could not find a\n Chrome executable")

    monkeypatch.setattr(pio, "write_images", no_browser)
    with pytest.raises(figures.FigureExportError) as exc:
        figures.write_figures({"a": go.Figure()}, tmp_path / "out")
    assert str(exc.value) == (f"{tmp_path / 'out'}: cannot write the figure (RuntimeError: Could not find a Chrome "
                              "executable); plotly's export needs kaleido and a Chrome or Chromium on this machine")


def _png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


@pytest.mark.slow
def test_kv_cost_writes_the_pages_four_sweeps_as_svg_pdf_and_png(tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["kv-cost", "--preset", "llama-3-8b", "--variant", "k_eq_v", "--figures", str(out)]) == 0
    names = ["kv_plot_cache", "kv_plot_cost", "kv_plot_gpus", "kv_plot_users"]
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.{f}" for n in names for f in ("svg", "pdf", "png"))
    for n in names:
        svg = (out / f"{n}.svg").read_text()
        assert svg.startswith("<svg") and 'width="672"' in svg and 'height="520"' in svg
        assert (out / f"{n}.pdf").read_bytes().startswith(b"%PDF-")
        assert (out / f"{n}.png").read_bytes().startswith(b"\x89PNG") and _png_size(out / f"{n}.png") == (2688, 2080)
    assert capsys.readouterr().err.startswith(f"figures: 12 files in {out}: kv_plot_cache, kv_plot_cost")


def test_results_figure_is_the_tables_rows_against_kv_bytes():
    """``results --figures`` and the Results page draw each row of the table: its mean with its
    standard deviation as an error bar, at its KV bytes per token."""
    import pandas as pd

    from app.page_figures import results_figure

    table = pd.DataFrame({"project": "p", "task": "language", "variant": ["qkv", "k_eq_v"], "label": ["Q-K-V", "Q-K=V"],
                          "sharing": ["MHA", "GQA-2"], "d_model": 64, "n_layers": 4,
                          "val/loss mean": [1.32, 1.40], "val/loss std": [0.005, float("nan")], "val/loss n": [3, 1],
                          "KV bytes/token": [2048.0, 512.0]})
    fig = results_figure(table, "val/loss")
    assert [t.name for t in fig.data] == ["Q-K-V · MHA", "Q-K=V · GQA-2"]
    assert [t.y[0] for t in fig.data] == [1.32, 1.40] and [t.x[0] for t in fig.data] == [2048.0, 512.0]
    assert fig.data[0].error_y.array[0] == 0.005 and fig.data[1].error_y.visible is False
    assert (fig.data[0].marker.symbol, fig.data[1].marker.symbol) == ("circle", "square")
    assert fig.layout.xaxis.type == "log"
    assert results_figure(table, "eval/loss") is None
