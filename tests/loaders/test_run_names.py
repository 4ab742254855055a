"""Run display names: unique in the database, the fewest parent folders added; on the real
TensorBoard run under two sweep folders and two Lightning ``version_0`` (``tests/projects_db.py``)."""
from __future__ import annotations

import pytest

from loaders.run_names import display_names
from loaders.run_table import run_table
from loaders.store import Store
from tests.projects_db import build_projects


def test_repeated_names_get_the_fewest_distinguishing_folders():
    got = display_names(
        [1, 2, 3, 4, 5, 6],
        ["GPT8L8H", "GPT8L8H", "lightning_logs/version_0", "lightning_logs/version_0", "x", "x"],
        ["/r/logs/tensorboard/add-carryTrue/GPT8L8H", "/t/sweeps/add-carryFalse/GPT8L8H",
         "/p/a/sweep-a/lightning_logs/version_0/metrics.csv", "/p/a/sweep-b/lightning_logs/version_0",
         "/w/export.csv", "/w/export.csv"])
    assert got == {1: "add-carryTrue/GPT8L8H", 2: "add-carryFalse/GPT8L8H",
                   3: "sweep-a/lightning_logs/version_0", 4: "sweep-b/lightning_logs/version_0",
                   5: "w/x #5", 6: "w/x #6"}          # two runs of one file: told apart by id


def test_names_are_unique_in_a_database_of_several_projects(tmp_path_factory):
    store = Store(build_projects(tmp_path_factory, tmp_path_factory.mktemp("names") / "p.duckdb"))
    runs = run_table(store)
    assert runs["name"].is_unique
    shown = dict(zip(runs["stored_name"] + "@" + runs["project"], runs["name"]))
    assert shown["GPT8L8H@tensorboard"] == "add-carryTrue/GPT8L8H"
    assert shown["GPT8L8H@carry-sweep"] == "add-carryFalse/GPT8L8H"
    assert shown["lightning_logs/version_0@sweep-a"] == "sweep-a/lightning_logs/version_0"
    assert shown["lightning_logs/version_0@sweep-b"] == "sweep-b/lightning_logs/version_0"
    assert shown["qkv-mha-wd0.1@demo"] == "qkv-mha-wd0.1"          # a unique name stays as it is
