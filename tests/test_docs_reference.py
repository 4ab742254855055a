"""The reference pages under docs/reference/ are what scripts/gen_reference.py
writes from the code now (regenerated into a temporary folder and compared),
and every QKVSCOPE_* variable the code reads is documented there."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.fixture(scope="module")
def fresh(gen, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    gen.write(out)
    return out


def test_every_generated_page_is_committed_and_current(gen, fresh):
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(gen.PAGES)
    stale = [n for n in names if not (REFERENCE / n).is_file() or (REFERENCE / n).read_text() != (fresh / n).read_text()]
    assert not stale, f"stale reference pages {stale}: run python scripts/gen_reference.py"


def test_check_names_a_stale_page(gen, fresh, capsys):
    (fresh / "metrics.md").write_text("old\n")
    assert gen.main(["--check", "--out", str(fresh)]) == 1
    assert capsys.readouterr().out == f"stale: {fresh / 'metrics.md'} (run python scripts/gen_reference.py)\n"
    gen.write(fresh)
    assert gen.main(["--check", "--out", str(fresh)]) == 0


def test_every_setting_the_code_reads_is_documented(gen, fresh):
    from loaders.budgets import BUDGETS
    from loaders.settings import SETTINGS
    from loaders.sql_console import SQL_BUDGETS

    in_code = gen.settings_in_code()
    assert {"QKVSCOPE_DB", "QKVSCOPE_PARSE_MEMORY_MB", "QKVSCOPE_SQL_RESULT_MB"} <= in_code
    undocumented = sorted(in_code - set(BUDGETS) - set(SQL_BUDGETS) - set(SETTINGS))
    assert not undocumented, f"add these to loaders/settings.py: {undocumented}"
    page = (fresh / "settings.md").read_text()
    assert [n for n in in_code if f"| `{n}` |" not in page] == []


def test_the_pages_hold_what_the_code_declares(fresh):
    from analysis.registry import METRICS
    from app.cli import command_modules
    from loaders.layouts import LAYOUTS
    from loaders.logs.readers import READERS

    cli = (fresh / "cli.md").read_text()
    assert all(f"\n## {m.NAME}\n" in cli for m in command_modules())
    assert "* `--spike-ratio SPIKE_RATIO`" in cli or "* `--spike-ratio " in cli
    layouts = (fresh / "layouts.md").read_text()
    assert all(f"\n## {m.NAME}\n" in layouts for m in LAYOUTS)
    formats = (fresh / "log-formats.md").read_text()
    assert all(f"\n## {name}\n" in formats for name in READERS)
    assert "| [`lightning`](#lightning) | 52 | `lightning_logs/version_0/metrics.csv` | yes |" in formats
    metrics = (fresh / "metrics.md").read_text()
    assert all(f"\n### {m.name}\n" in metrics for m in METRICS)
    assert "Chance (closed): " in metrics
    schema = (fresh / "schema.md").read_text()
    assert "\n## runs\n" in schema and "\n## points\n" in schema
    assert "| `read_bytes` | BIGINT | yes |  | how far a text log was consumed |" in schema
    for text in (cli, layouts, formats, metrics, schema):
        assert str(ROOT) not in text


def test_every_reader_declares_an_example_path():
    from loaders.logs.readers import READERS

    assert [name for name, mod in READERS.items() if not getattr(mod, "EXAMPLE", None)] == []


def test_a_command_with_subcommands_gets_a_section_for_each(gen):
    import argparse

    parser = argparse.ArgumentParser(prog="python -m app results")
    parser.add_argument("--db", help="database file")
    sub = parser.add_subparsers(dest="action")
    show = sub.add_parser("show", help="print one project's table")
    show.add_argument("--format", choices=["md", "csv"], default="md", help="output format")
    text = "".join(gen._command("results", parser, "projects and their tables", 2))
    assert "\n## results\n\nprojects and their tables\n" in text
    assert "* `--db DB`: database file\n" in text
    assert "\n### results show\n\nprint one project's table\n" in text
    assert "* `--format {md,csv}`: output format (default `md`)\n" in text


def test_the_readme_lists_every_log_format_with_an_example_path(gen):
    from loaders.logs.readers import READERS

    readme = (ROOT / "README.md").read_text()
    assert readme == gen.readme_with_formats(readme), "stale README formats table: run python scripts/gen_reference.py"
    block = readme[readme.index(gen.README_START):readme.index(gen.README_END)]
    for name, mod in READERS.items():
        assert f"| [`{name}`](docs/reference/log-formats.md#{name}) | `{mod.EXAMPLE}` |" in block
