"""The runtime requirements alone run every page and command.

The test venv has more than ``requirements.txt`` (pytest, playwright, a pretrained model...), so a
page that imports a test-only package works in the tests and crashes for a user (the
Inspector's ``ModuleNotFoundError: No module named 'transformers'``). This walks every import the
application's packages make, at module level or inside a function, and checks that each
third-party module is installed by a distribution that ``requirements.txt`` brings: named there, or
a dependency of one named there (``importlib.metadata``, transitively). Ray, for batch analysis on
a cluster, comes from ``requirements-scale.txt`` and is imported only inside the functions that use
it, with a message naming that file.
"""
from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "analysis", "loaders", "experiments")
#: Optional extras: module -> the requirements file that brings it (imported lazily only).
OPTIONAL = {"ray": "requirements-scale.txt"}


def _names(req: Path) -> set[str]:
    out = set()
    for line in req.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        out.add(_norm(re.match(r"[A-Za-z0-9_.\-]+", line).group(0)))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: set[str]) -> set[str]:
    """Distributions installed because of ``names`` (their requirements, transitively; extras and
    environment markers that do not apply here are left out)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for r in reqs:
            if ";" in r:
                spec, marker = r.split(";", 1)
                if "extra" in marker:
                    continue
                try:
                    from packaging.markers import Marker
                    if not Marker(marker.strip()).evaluate():
                        continue
                except Exception:
                    pass
            else:
                spec = r
            todo.append(_norm(re.match(r"\s*([A-Za-z0-9_.\-]+)", spec).group(1)))
    return seen


def _imports() -> dict[str, list[str]]:
    """Top-level third-party module -> files importing it (relative imports and the project's own
    packages left out)."""
    local = {p.name for p in ROOT.iterdir() if p.is_dir()} | {p.stem for p in ROOT.glob("*.py")}
    std = set(sys.stdlib_module_names)
    found: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    mods = [node.module]
                else:
                    continue
                for m in mods:
                    top = m.split(".")[0]
                    if top in std or top in local or top == "__future__":
                        continue
                    found.setdefault(top, []).append(str(f.relative_to(ROOT)))
    return found


def test_every_import_of_the_app_comes_with_requirements_txt():
    runtime = _closure(_names(ROOT / "requirements.txt"))
    dists = md.packages_distributions()
    missing = []
    for mod, files in sorted(_imports().items()):
        if mod in OPTIONAL:
            continue
        providers = {_norm(d) for d in dists.get(mod, [])}
        if not providers & runtime:
            missing.append(f"{mod} (from {', '.join(sorted(providers)) or 'no installed distribution'}; "
                           f"imported by {files[0]})")
    assert missing == [], "imported by the app but not brought by requirements.txt: " + "; ".join(missing)


def test_transformers_is_a_runtime_requirement():
    # forward passes of Hugging Face checkpoints are a core feature (item 1)
    assert "transformers" in _names(ROOT / "requirements.txt")


def test_optional_modules_are_imported_lazily_and_named_in_their_file():
    for mod, req in OPTIONAL.items():
        assert _norm(mod) in _names(ROOT / req)
        for pkg in PACKAGES:
            for f in (ROOT / pkg).rglob("*.py"):
                tree = ast.parse(f.read_text())
                for node in tree.body:                       # module level: would break a plain install
                    if isinstance(node, ast.Import):
                        assert all(a.name.split(".")[0] != mod for a in node.names), f
                    if isinstance(node, ast.ImportFrom) and node.module:
                        assert node.module.split(".")[0] != mod, f


def test_the_package_reads_its_dependencies_from_the_requirements_files():
    """One list: ``pip install .`` gets its dependencies and extras from the files ``scripts/setup.sh``
    installs (setuptools reads them; it cannot follow ``-r`` lines, so none is there)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dynamic = project["tool"]["setuptools"]["dynamic"]
    assert set(project["project"]["dynamic"]) == {"dependencies", "optional-dependencies"}
    assert dynamic["dependencies"] == {"file": ["requirements.txt"]}
    assert dynamic["optional-dependencies"] == {
        "scale": {"file": ["requirements-scale.txt"]},
        "dev": {"file": ["requirements-scale.txt", "requirements-dev.txt"]}}
    for name in ("requirements.txt", "requirements-scale.txt", "requirements-dev.txt"):
        assert not [line for line in (ROOT / name).read_text().splitlines() if line.startswith("-")], name
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "reqs=(-r requirements.txt)" in setup
    assert "reqs+=(-r requirements-scale.txt -r requirements-dev.txt)" in setup
    assert project["project"]["scripts"] == {"qkvscope": "app.cli:main"}
