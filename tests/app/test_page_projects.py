"""Every page narrowed to some projects (URL key ``project``), on a database of several real projects
(``tests/projects_db.py``): the Overview lists the projects with their counts; other pages show only
the chosen projects' runs and checkpoints; a URL value naming no project is named in a note."""
from __future__ import annotations

import pytest

from tests.app.apptest import page_test, shown
from tests.projects_db import build_projects


@pytest.fixture(scope="module")
def projects_path(tmp_path_factory):
    return build_projects(tmp_path_factory, tmp_path_factory.mktemp("pages") / "projects.duckdb")


@pytest.fixture
def projects_db(projects_path, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(projects_path))
    return projects_path


@pytest.fixture(scope="module")
def demo_page():
    """``demo_page(name)``: the page run with ``?project=demo`` (AppTest), once for this file's tests
    that read what it drew; call it from a test that holds ``projects_db``."""
    runs: dict = {}

    def run(name: str):
        if name not in runs:
            runs[name] = page_test(name, {"project": "demo"}).run()
        return runs[name]
    return run


def _sidebar_captions(at) -> list[str]:
    return [shown(c.value) for c in at.sidebar.caption]


def test_overview_lists_projects_and_narrows_to_the_chosen(projects_db):
    at = page_test("overview", {"project": ["sweep-a", "nope"]}).run()
    assert not at.exception, at.exception
    counts = at.dataframe[0].value
    assert counts.to_dict("records") == [
        {"project": p, "runs": r, "checkpoints": c} for p, r, c in (
            ("carry-sweep", 1, 0), ("demo", 47, 55), ("hf-trainer", 1, 0), ("llmc", 1, 0), ("sweep-a", 3, 0),
            ("sweep-b", 1, 0), ("tensorboard", 1, 0))]
    runs = at.dataframe[1].value
    assert set(runs["project"]) == {"sweep-a"} and len(runs) == 3
    assert at.sidebar.multiselect[0].value == ["sweep-a"]
    assert "Ignored in the URL: project 'nope' (no such project stored)." in _sidebar_captions(at)
    assert at.query_params["project"] == "sweep-a"          # one value: the key once


@pytest.mark.parametrize("page", ["results", "experiments", "weight_decay", "compare", "inspector", "papers",
                                  "kv_cost", "sql"])
def test_every_page_has_the_project_filter(projects_db, demo_page, page):
    at = demo_page(page)
    assert not at.exception, at.exception
    [filt] = at.sidebar.multiselect
    assert filt.label == "Projects" and filt.value == ["demo"]


def test_weight_decay_draws_one_figure_and_y_axis_per_task(projects_db, demo_page):
    from tests.app.test_page_experiments import figures

    at = demo_page("weight_decay")
    assert not at.exception, at.exception
    keys = [k for k in figures(at) if k and k.startswith("wd_curve")]
    assert keys == ["wd_curve_language", "wd_curve_image"]


def test_results_notes_every_ignored_url_value(projects_db):
    at = page_test("results", {"project": "demo", "wd": "0.7", "stat": "median", "metrics": "val/loss,nope"}).run()
    assert not at.exception, at.exception
    assert ("Ignored in the URL: metrics='nope' (not logged by these runs); stat='median' (final or best); "
            "wd='0.7' (no run has it).") in [shown(c.value) for c in at.caption]
