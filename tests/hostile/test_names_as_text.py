"""Names from links and logs render as text on the pages: Markdown images and links,
HTML and Streamlit's icon syntax are escaped (``app.plain``), plotly legends show
``<a href>`` as written."""
from __future__ import annotations

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
