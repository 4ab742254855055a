"""Variant facts live in one module: ``analysis/variants.py``.

Any other module that spells out a set of variant names (a tuple, list or set
literal holding two or more of them, e.g. ``variant in ("k_eq_v", "q_eq_k_eq_v")``)
keeps its own copy of a fact the leaf holds (``KV_TIED``, ``Q_TIED``,
``VARIANTS`` ...); this test names each such place.
"""
import ast
from pathlib import Path

from analysis import variants

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "analysis", "loaders", "experiments")
NAMES = set(variants.ALL_VARIANTS) | {"wq_identity"}
#: Literals that name variants without restating a fact of the leaf, with the reason.
ALLOWED = {
    ("app/pickers.py", "BASELINE, PREFERRED"): "the two default picks of a comparison, a choice, not a fact",
    ("analysis/tied.py", '"q_eq_k", "k_eq_v", "q_eq_v"'): "the names of detected ties, not of variants",
    ("experiments/demo.py", "VARIANT_ORDER"): "which variants the demo trains, a choice of the demo",
    ("experiments/demo.py", "VISION_VARIANTS"): "paper B's six, in its tables' order: the demo's choice",
    ("experiments/demo.py", "grid(("): "which variants get the head-sharing runs, a choice of the demo",
    ("analysis/conversion_targets.py", "TARGETS = "): "the conversions `whatif --to` offers, named after what they make",
    ("app/pages/whatif.py", "TARGETS = "): "the conversions the page offers, a choice of the page",
}


def _copies(path: Path) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    rel = str(path.relative_to(ROOT))
    tree = ast.parse(text, filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len([s for s in strings if s in NAMES]) < 2:
                continue
            line = lines[node.lineno - 1]
            if any(f == rel and marker in line for f, marker in ALLOWED):
                continue
            found.append(f"{rel}:{node.lineno}: {sorted(set(strings) & NAMES)}")
    return found


def test_allowed_literals_still_exist():
    """An allowance whose line has gone is stale: remove it."""
    for (rel, marker), _why in ALLOWED.items():
        assert marker in (ROOT / rel).read_text(), (rel, marker)


def test_no_module_but_the_leaf_lists_variants():
    leaf = ROOT / "analysis" / "variants.py"
    copies = [c for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) if p != leaf
              for c in _copies(p)]
    assert copies == [], "variant sets written outside analysis/variants.py:\n" + "\n".join(copies)
