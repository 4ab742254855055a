"""The Weight decay page's random-sweep figures: one figure pair (regression, coefficient) and one
y axis per task, one regression per project, never one fit across them (known answers from
simulated sweeps of a language and a ViT task in two projects)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app.page_figures import by_task, regressions, wd_curve_figures
from app.pages.weight_decay import RUN_COLUMNS, coefficient_figure, regression_figure, regression_table, \
    sensitivity_by_task

#: (project, task, variant, loss at wd 1, d loss / d log10 wd): language losses near 3, ViT ones near 1
SWEEPS = [("sweep-a", "language", "qkv", 3.0, 0.08), ("sweep-b", "language", "qkv", 3.4, -0.05),
          ("vit", "image", "qkv", 1.0, 0.20)]


@pytest.fixture(scope="module")
def sweeps():
    rng = np.random.default_rng(0)
    runs, curves, rid = [], {}, 0
    for project, task, variant, base, slope in SWEEPS:
        for _ in range(12):
            rid += 1
            wd, lr = float(10 ** rng.uniform(-3, 0)), float(10 ** rng.uniform(-4, -2))
            final = base + slope * np.log10(wd) - 0.1 * np.log10(lr)
            runs.append({"run_id": rid, "name": "lightning_logs/version_0", "project": project, "variant": variant,
                         "weight_decay": wd, "lr": lr, "config": {"lr": lr, "weight_decay": wd, "task": task},
                         "metrics": ["val/loss"], "task": task, "condition": None, "n_heads": 4, "n_kv_heads": 4,
                         "d_model": 64, "n_layers": 4, "last_step": 200})
            curves[rid] = np.array([final + 1.0, final])
    frame = pd.DataFrame(runs, columns=RUN_COLUMNS)
    return sensitivity_by_task(frame, lambda ids: [(i, curves[i]) for i in ids], method="regression", n_boot=50)


def test_one_regression_per_project_and_task(sweeps):
    regs = regressions(sweeps)
    assert sorted(regs) == [("image", "qkv", "vit"), ("language", "qkv", "sweep-a"), ("language", "qkv", "sweep-b")]
    # exact data: each coefficient is its own project's slope, not a pooled one
    assert {k[2]: round(r["wd_coef"], 9) for k, r in regs.items()} == {"sweep-a": 0.08, "sweep-b": -0.05, "vit": 0.2}
    assert [r["n_runs"] for _, r in sorted(regs.items())] == [12, 12, 12]


def test_each_task_gets_its_own_figure_and_y_axis(sweeps):
    regs = regressions(sweeps)
    split = by_task(regs)
    assert list(split) == ["language", "image"]          # language first
    lang = regression_figure(split["language"], y_title="final val/loss", names=regs)
    vit = regression_figure(split["image"], y_title="final val/loss", names=regs)
    lang_runs = [t for t in lang.data if t.name.endswith(": runs")]
    vit_runs = [t for t in vit.data if t.name.endswith(": runs")]
    # names carry the task where several are shown and the project where several are
    assert [t.name for t in lang_runs] == ["Q-K-V [language] · sweep-a: runs", "Q-K-V [language] · sweep-b: runs"]
    assert [t.name for t in vit_runs] == ["Q-K-V [image] · vit: runs"]
    lang_y = np.concatenate([np.asarray(t.y, float) for t in lang_runs])
    vit_y = np.concatenate([np.asarray(t.y, float) for t in vit_runs])
    assert lang_y.min() > 2.5 and vit_y.max() < 2.0       # the two scales never share an axis
    coef = coefficient_figure(split["image"], metric="val/loss", names=regs)
    assert [t.name for t in coef.data] == ["Q-K-V [image] · vit"]
    assert np.asarray(coef.data[0].x, float)[0] == pytest.approx(0.2, abs=1e-9)
    assert regression_table(regs)["variant"].tolist() == ["qkv [image] · vit", "qkv [language] · sweep-a", "qkv [language] · sweep-b"]


def test_a_swept_variant_leaves_the_grouped_charts(sweeps):
    assert wd_curve_figures(sweeps, statistic="final", metric="val/loss") == {}
