"""Figures for papers: the dashboard's chart toolbar and the CLI's ``--figures DIR``.

In the dashboard every chart goes through ``show(fig, key=...)``, which passes
plotly's ``config``: the toolbar's camera button downloads the chart as SVG
(vector, the default) or PNG at ``PNG_SCALE`` times the pixels, at a
publication size (``size_of``: ``WIDTH`` px wide, the figure's own height or
``HEIGHT``), named after the chart. plotly.js has one image button whose
format is set in ``toImageButtonOptions`` (a custom second button needs a
JavaScript ``click`` function, which Streamlit's JSON config cannot carry),
so the format is a switch: the sidebar's "Chart downloads" (``FORMAT_KEY`` in
the session state, set in ``app/dashboard/streamlit_app.py``).

On the command line, ``write_figures({name: fig}, DIR)`` writes each figure as
``DIR/<name>.svg``, ``.pdf`` and ``.png`` through plotly's own static export
(``plotly.io.write_images``: kaleido, which drives the machine's Chrome or
Chromium, found on ``PATH`` as ``chromium``/``google-chrome``, e.g. Debian's
``/usr/bin/chromium``, or named by ``$BROWSER_PATH``; none is downloaded). The
sizes are the toolbar's. ``analyze``, ``wd-sensitivity`` and ``kv-cost``
take ``--figures DIR`` (``add_figures_argument``).

No streamlit import at module level: the CLI imports this module too.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app import plain
from loaders.errors import FileError

if TYPE_CHECKING:                      # plotly loads with the figures, not with every command's parser
    import plotly.graph_objects as go

#: Width in CSS pixels of a downloaded or written figure: 7 inches at 96 px/in, a two-column
#: figure in a paper (text in the figure keeps its point size when placed at that width).
WIDTH = 672
#: Height when the figure sets none.
HEIGHT = 420
#: PNG pixels per CSS pixel: 4 x 672 = 2688 px across 7 in, 384 dpi.
PNG_SCALE = 4
FORMATS = ("svg", "pdf", "png")
#: Session-state key of the toolbar's download format (``"svg"`` or ``"png"``).
FORMAT_KEY = "chart_format"
TOOLBAR_FORMATS = {"svg": "SVG (vector)", "png": f"PNG ({PNG_SCALE}x)"}


class FigureExportError(FileError):
    """A figure file plotly could not write: the file, and kaleido's or the browser's reason."""

    def __init__(self, path: str | Path, exc: Exception):
        why = " ".join(str(exc).split()) or type(exc).__name__
        super().__init__(path, f"cannot write the figure ({type(exc).__name__}: {why}); plotly's export "
                               "needs kaleido and a Chrome or Chromium on this machine")


def size_of(fig: go.Figure) -> tuple[int, int]:
    """(width, height) in CSS pixels: ``WIDTH``, and the figure's own height or ``HEIGHT``."""
    return WIDTH, int(fig.layout.height or HEIGHT)


def file_stem(name: str) -> str:
    """A file name from a chart's name: letters, digits, ``-`` and ``_`` (``exp_curves``, ``kv-cost``)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "figure"


def toolbar_config(fig: go.Figure, name: str, fmt: str = "svg") -> dict:
    """plotly's ``config`` for a chart in the dashboard: the camera button downloads ``fmt`` at
    the publication size, as ``<name>.<fmt>``; no plotly logo."""
    if fmt not in TOOLBAR_FORMATS:
        raise ValueError(f"chart format must be one of {', '.join(TOOLBAR_FORMATS)}; got {fmt!r}")
    width, height = size_of(fig)
    return {"displaylogo": False,
            "toImageButtonOptions": {"format": fmt, "filename": file_stem(name), "width": width,
                                     "height": height, "scale": PNG_SCALE if fmt == "png" else 1}}


def as_text(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` whose trace names and legend group titles (names from logs and files)
    are text, not plotly's HTML (``app.plain.html``): a run named ``<a href="...">`` is shown as
    written, not as a link. Titles and tooltips are built with markup (``<br>``): they escape
    names where built. ``show`` draws and ``write_figures`` writes every figure through this."""
    import plotly.graph_objects as go  # here: plotly loads with the figures

    fig = go.Figure(fig)
    for trace in fig.data:
        if isinstance(trace.name, str):
            trace.name = plain.html(trace.name)
        title = getattr(trace, "legendgrouptitle", None)
        if title is not None and isinstance(title.text, str):
            title.text = plain.html(title.text)
    return fig


def show(fig: go.Figure, *, key: str, where=None, width: str = "stretch", **kwargs) -> None:
    """``st.plotly_chart`` (or ``where.plotly_chart``: a column) with ``toolbar_config``, in the
    format the sidebar's switch chose; every chart of the dashboard is drawn through this."""
    import streamlit as st  # here: the dashboard only

    fmt = st.session_state.get(FORMAT_KEY, "svg")
    fig = as_text(fig)
    (where or st).plotly_chart(fig, width=width, key=key, config=toolbar_config(fig, key, fmt), **kwargs)


def format_switch() -> None:
    """The sidebar's "Chart downloads" switch (``FORMAT_KEY``)."""
    import streamlit as st  # here: the dashboard only

    st.sidebar.radio("Chart downloads", list(TOOLBAR_FORMATS), format_func=TOOLBAR_FORMATS.get,
                     key=FORMAT_KEY, horizontal=True,
                     help="what each chart's camera button downloads, at a two-column paper width")


def report_written(paths: list[Path]) -> None:
    """One line on stderr naming the files written (stdout stays the command's own output)."""
    if paths:
        print(f"figures: {len(paths)} files in {paths[0].parent}: "
              f"{', '.join(sorted({p.stem for p in paths}))} (.svg, .pdf, .png)", file=sys.stderr)


def write_figures(figures: dict[str, go.Figure], out_dir: str | Path,
                  formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write each figure as ``out_dir/<name>.<format>`` (the folder is created); returns the files.

    Each figure at the publication size (``size_of``), PNG at ``PNG_SCALE``; all of them in one
    ``plotly.io.write_images`` call (one browser for the lot: 12 files took 64 s one by one). A
    failed export (no Chrome or Chromium, kaleido missing) raises ``FigureExportError`` naming the
    folder and why.
    """
    import plotly.io as pio  # here: plotly loads with the figures

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(as_text(fig), out / f"{file_stem(name)}.{fmt}", fmt, *size_of(fig), PNG_SCALE if fmt == "png" else 1)
            for name, fig in figures.items() for fmt in formats]
    if not jobs:
        return []
    figs, paths, fmts, widths, heights, scales = (list(col) for col in zip(*jobs))
    try:
        pio.write_images(figs, paths, format=fmts, width=widths, height=heights, scale=scales)
    except Exception as exc:  # noqa: BLE001 -- kaleido's and the browser's own errors, named
        raise FigureExportError(out, exc) from exc
    return paths
