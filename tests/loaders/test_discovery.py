"""loaders.discovery: the members of a package, found by listing it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loaders.discovery import UNREAD, declared, module_names, modules


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "toypkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "beta.py").write_text("NAME = 'b'\ndef run(): pass\n")
    (root / "alpha.py").write_text("NAME = 'a'\ndef run(): pass\n")
    (root / "helper.py").write_text("def run(): pass\n")          # no NAME: not a member
    (root / "_private.py").write_text("NAME = 'p'\ndef run(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import toypkg
    yield toypkg
    for name in [n for n in sys.modules if n == "toypkg" or n.startswith("toypkg.")]:
        del sys.modules[name]


def test_module_names_skip_private_ones_and_import_nothing(package):
    assert module_names(package) == ["alpha", "beta", "helper"]
    assert "toypkg.alpha" not in sys.modules


def test_members_define_every_required_name(package):
    assert [m.NAME for m in modules(package, ("NAME", "run"))] == ["a", "b"]
    assert [m.__name__ for m in modules(package, ("run",))] == ["toypkg.alpha", "toypkg.beta", "toypkg.helper"]


def test_the_project_packages_list_their_members():
    import app.commands
    from app.cli import command_module, command_modules
    from app.pages import page_modules
    from loaders.layouts import LAYOUTS
    from loaders.logs.readers import READERS

    assert "ingest" in {m.NAME for m in command_modules()}
    assert command_module("run-meta").NAME == "run-meta"
    assert command_module("_private") is None and command_module("nope") is None
    assert "experiments" in {m.URL_PATH for m in page_modules()}
    assert {"gpt2", "nanogpt"} <= {m.NAME for m in LAYOUTS}
    assert "csv" in READERS or len(READERS) > 5
    assert module_names(app.commands)


def test_declared_reads_members_constants_without_importing_them(package):
    root = Path(package.__path__[0])
    (root / "gamma.py").write_text("import os\nNAME = 'g'\nPRIORITY = 5\nKINDS = frozenset({'x'})\n"
                                   "EMPTY = frozenset()\nLATER = os.sep\ndef run(): pass\n")
    found = declared(package, ("NAME", "run"), ("NAME", "PRIORITY", "KINDS", "EMPTY", "LATER"))
    assert list(found) == ["toypkg.alpha", "toypkg.beta", "toypkg.gamma"]
    assert found["toypkg.gamma"] == {"NAME": "g", "PRIORITY": 5, "KINDS": frozenset({"x"}), "EMPTY": frozenset(),
                                     "LATER": UNREAD}
    assert found["toypkg.alpha"] == {"NAME": "a"}
    assert not any(m.startswith("toypkg.") for m in sys.modules)


def test_layouts_are_ordered_and_picked_as_when_all_were_imported():
    from loaders import layouts

    imported = sorted(layouts.LAYOUTS, key=lambda m: (getattr(m, "PRIORITY", 50), m.NAME))
    assert [c["NAME"] for c in layouts._ORDER] == [m.NAME for m in imported] == [m.NAME for m in layouts.LAYOUTS]
    assert all(c.get("MODEL_TYPES", frozenset()) == getattr(m, "MODEL_TYPES", frozenset()) and
               tuple(c.get("ARCHITECTURES", ())) == tuple(getattr(m, "ARCHITECTURES", ()))
               for c, m in zip(layouts._ORDER, layouts.LAYOUTS))
