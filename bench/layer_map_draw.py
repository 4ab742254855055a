"""Seconds Debian's Chromium takes to draw the Inspector's cross-layer map (``app.layer_maps``) of an
``n``-layer model with plotly.js alone (no server, no Streamlit), and the figure's size.

    python bench/layer_map_draw.py [--layers 32] [--repeat 5] [--png FILE]

Prints two ``BENCH_ROW`` lines: the median and the slowest of ``repeat`` draws (``Plotly.newPlot``
to the next frame) and of ``repeat`` hovers over a cell (``Plotly.Fx.hover`` to the next frame),
with the figure's JSON size, judged against ``DRAW_MS`` and ``HOVER_MS``; ``--png`` writes a
screenshot of the drawn map.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: "Without lag": a map drawn within a second of its data arriving, a tooltip within 100 ms (the
#: delay under which a response reads as instant).
DRAW_MS, HOVER_MS = 1000, 100

def synthetic_results(n_layers: int, metric: str = "xlayer_cka_kcache", seed: int = 0) -> pd.DataFrame:
    """Stored-looking pair rows of ``metric`` for ``n_layers`` layers: values falling with the
    distance between the layers, a chance level with a null band, activation tokens and intervals."""
    rng = np.random.default_rng(seed)
    rows = []
    for l in range(n_layers):
        for l2 in range(l + 1, n_layers):
            v = 0.35 + 0.6 * np.exp(-(l2 - l) / 4) + 0.02 * rng.standard_normal()
            rows.append({"layer": l, "head": pd.NA, "metric": metric, "value": v, "chance": 0.4,
                         "chance_low": 0.33, "chance_high": 0.47, "n_tokens": 512, "ci_low": v - 0.03,
                         "ci_high": v + 0.03, "above_chance": v - 0.03 > 0.47, "degenerate": False,
                         "layer2": l2, "head2": pd.NA})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright
    from plotly.offline import get_plotlyjs

    from app.layer_maps import layer_map_figure
    from tests.app.browser import CHROMIUM, CHROMIUM_ARGS

    fig = layer_map_figure(synthetic_results(args.layers), "xlayer_cka_kcache")
    spec = fig.to_json()
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "map.html"
        html.write_text("<html><body><div id='p' style='width:900px'></div><script>" + get_plotlyjs()
                        + "</script></body></html>")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1000, "height": 1000})
                page.goto(html.as_uri())
                draw = [page.evaluate("""async (spec) => {
                    const f = JSON.parse(spec); Plotly.purge("p"); const t0 = performance.now();
                    await Plotly.newPlot("p", f.data, f.layout);
                    await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
                    return performance.now() - t0; }""", spec) for _ in range(args.repeat)]
                hover = [page.evaluate("""async ([i, n]) => {
                    const t0 = performance.now();
                    Plotly.Fx.hover("p", [{curveNumber: 0, pointNumber: [(i + 1) % n, (7 * i) % n]}]);
                    await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
                    return performance.now() - t0; }""", [i, args.layers]) for i in range(args.repeat)]
                if args.png:
                    page.locator("#p").screenshot(path=str(args.png))
            finally:
                browser.close()
    size = f"{args.layers} layers ({args.layers ** 2} cells, {len(spec) // 1024} KB of figure JSON)"
    for measured, values, limit in (("draw", draw, DRAW_MS), ("hover", hover, HOVER_MS)):
        med = statistics.median(values)
        print("BENCH_ROW " + json.dumps({
            "bench": "layer_map_draw", "measured": f"{measured} of the layer x layer map, {size}, median ms",
            "figure": f"{med:.1f} (max {max(values):.1f}, {len(values)} runs)", "against": "plotly.js in Chromium",
            "target": f"< {limit} ms", "result": "pass" if med < limit else "FAIL"}), flush=True)

if __name__ == "__main__":
    main()
