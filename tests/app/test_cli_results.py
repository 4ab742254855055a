"""``python -m app results`` and ``wd-sensitivity --json`` on a database of several real projects
(``tests/projects_db.py``): rows never span projects or geometries, runs that differ are named, and
the command prints the Results page's own rows."""
from __future__ import annotations

import json
import math

import pytest

from app.cli import main
from tests.app.apptest import page_test
from tests.projects_db import build_projects


@pytest.fixture(scope="module")
def projects_path(tmp_path_factory):
    return build_projects(tmp_path_factory, tmp_path_factory.mktemp("cli") / "projects.duckdb")


def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_results_keeps_projects_and_widths_apart_and_names_differences(projects_path, capsys):
    rows = _json(capsys, "results", "--db", str(projects_path), "--project", "sweep-a", "--project", "sweep-b",
                 "--metric", "val/loss", "--wd", "all", "--json")
    got = [(r["project"], r["task"], r["variant"], r["n_kv_heads"], r["d_model"], r["n_layers"], r["n"],
            r["run_ids"]) for r in rows]
    ids = {r["project"] + ":" + str(r["d_model"]): r["run_ids"] for r in rows}
    assert got == [("sweep-a", "language", "unknown", 4, 128, 4, 2, ids["sweep-a:128"]),
                   ("sweep-a", "language", "unknown", 4, 256, 4, 1, ids["sweep-a:256"]),
                   ("sweep-b", "language", "unknown", 4, 128, 4, 1, ids["sweep-b:128"])]
    a, b = ids["sweep-a:128"]
    # version_0 logged 3 validations (last step 149), version_1 two (99), at another lr
    assert rows[0]["val/loss mean"] == pytest.approx((2.0 + 2.4) / 2)
    assert rows[0]["warnings"] == [f"length: last step 149 (run {a}), 99 (run {b})",
                                   f"lr: 0.0003 (run {a}), 0.001 (run {b})"]
    assert rows[1]["warnings"] == [] and rows[2]["warnings"] == []
    assert {"project", "task", "variant", "n_kv_heads", "d_model", "n_layers", "n", "run_ids",
            "warnings", "val/loss std", "val/loss vs qkv %"} <= set(rows[0])


def test_results_json_is_the_pages_table(projects_path, capsys, monkeypatch):
    rows = _json(capsys, "results", "--db", str(projects_path), "--json")
    monkeypatch.setenv("QKVSCOPE_DB", str(projects_path))
    at = page_test("results").run()
    assert not at.exception, at.exception
    page = at.dataframe[0].value
    assert len(rows) == len(page) > 5
    for r, p in zip(rows, page.to_dict("records")):
        assert (r["label"], r["sharing"], r["n"], "; ".join(r["warnings"])) == (
            p["label"], p["sharing"], p["n runs"], p["warnings"])
        for col in ("val/loss mean", "val/loss std", "exp(val/loss) mean"):
            assert (r[col] is None and math.isnan(p[col])) or r[col] == pytest.approx(p[col])


def test_results_says_why_it_is_empty(projects_path, capsys):
    assert main(["results", "--db", str(projects_path), "--project", "llmc", "--wd", "0.1", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == []
    assert out.err == "empty: no run has weight decay 0.1 (metric val/loss, weight decay 0.1)\n"


def test_wd_sensitivity_groups_carry_project_and_run_ids(projects_path, capsys):
    groups = _json(capsys, "wd-sensitivity", "--db", str(projects_path), "--json", "--boot", "20")
    projects = {g["project"] for g in groups}
    assert {"demo", "sweep-a", "sweep-b"} <= projects
    runs = {r["id"]: r for r in _json(capsys, "runs", "--db", str(projects_path), "--json")}
    for g in groups:
        assert g["run_ids"] and {runs[i]["project"] for i in g["run_ids"]} == {g["project"]}
    # the two Lightning folders named lightning_logs/version_0 are two projects' groups, not one; sweep-a's
    # d_model 128 runs differ in lr (two groups), its d_model 256 run is a third
    mine = [(g["project"], g["group"], len(g["run_ids"])) for g in groups if g["project"] in ("sweep-a", "sweep-b")]
    assert sorted(mine) == [("sweep-a", "all", 1), ("sweep-a", "lr=0.0003", 1), ("sweep-a", "lr=0.001", 1),
                            ("sweep-b", "all", 1)]
