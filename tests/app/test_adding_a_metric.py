"""Adding a metric is one module: a toy metric in a temporary file named by ``QKVSCOPE_PLUGINS``
reaches ``analyze --list``, the Inspector's metric list, the docs reference and the Parquet export
without any other file naming it (docs/contributing.md, "Adding a metric").

The toy reads the shared per-layer products (``analysis.products.LayerProducts``), as the built-in
families do: ``tr(Q_h^T Q_h) = ||W_Q[h]||_F^2`` from the float64 Gram ``gq``.
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis import registry
from app import jobs
from app.cli import main
from loaders.results import current_job
from tests.app.test_jobs import L, Opener, make_layer, store  # noqa: F401  (store: the fixture)

ROOT = Path(__file__).resolve().parents[2]
TOY = "toy_q_energy"
MODULE = f'''
import torch
from analysis.registry import Metric, register


@register(Metric("{TOY}", "weights", "head", "toy", "squared Frobenius norm of W_Q[h], from the shared float64 Gram",
                 "none", "monte_carlo", "median of random Gaussian layers of the same shapes: about d_head",
                 reads=("Q",)))
def q_energy(layer, meta, device):
    return torch.diagonal(layer.gq, dim1=1, dim2=2).sum(-1)       # [n_heads] float64
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    path = tmp_path / "toy_metric_module.py"
    path.write_text(MODULE)
    monkeypatch.setenv(registry.PLUGINS_ENV, str(path))
    assert registry.load_plugins() == [str(path)]          # what importing the registry does with the variable
    yield path
    registry.unregister(TOY)
    sys.modules.pop("qkvscope_plugin_toy_metric_module", None)


def test_a_toy_metric_module_reaches_the_list_the_inspector_the_docs_and_the_parquet(toy, store, capsys):  # noqa: F811
    # analyze --list
    assert main(["analyze", "--list"]) == 0
    listed = [line.split()[:3] for line in capsys.readouterr().out.splitlines()]
    assert [TOY, "weights", "head"] in listed
    # the Inspector's metric list (the per-head metrics it offers where rows are stored)
    assert TOY in registry.head_metrics()
    # the docs reference, generated in memory with the plugins' metrics
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    page = gen_reference.metrics_page(plugins=True)
    assert f"### {TOY}\n\nsquared Frobenius norm of W_Q[h]" in page
    assert f"| [`{TOY}`](#{TOY}) | head | toy | none | monte_carlo |" in page
    assert TOY not in gen_reference.metrics_page()         # qkvscope's own pages describe qkvscope
    # the stored job and the Inspector's Parquet download of it
    from app.pages.inspector import download_frame

    (res,) = jobs.analyze(store, 1, device="cpu", opener=Opener())
    job = current_job(store, checkpoint_id=1, kind="weights", metrics=registry.names("weights"),
                      metric_version=registry.METRIC_VERSION)
    buf = io.BytesIO()
    download_frame(job.rows, job.notes).to_parquet(buf, index=False)
    back = pd.read_parquet(io.BytesIO(buf.getvalue()))
    rows = back[back["metric"] == TOY].sort_values(["layer", "head"])
    expect = [float(make_layer(i).W_Q[h].double().square().sum()) for i in range(L) for h in range(4)]
    assert rows["value"].tolist() == pytest.approx(expect, rel=1e-9)
    assert rows["chance"].notna().all() and (rows["chance_low"] < rows["chance_high"]).all()
