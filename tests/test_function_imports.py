"""An import inside a function says why it is there.

Imports belong at the top of a module; one inside a function is there for a
reason (torch loaded only when a command runs, a real import cycle, code that
runs only in the reading child, ...) and that reason is written beside it: a
comment on one of the block's lines or on the line above it.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "analysis", "loaders", "experiments")


def _unexplained(path: Path) -> list[str]:
    src = path.read_text()
    lines = src.splitlines()
    found = []
    for fn in ast.walk(ast.parse(src, filename=str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        block: list[ast.stmt] = []
        for node in [*fn.body, None]:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                block.append(node)
                continue
            if block:
                first = block[0].lineno
                texts = [lines[b.lineno - 1] for b in block] + [lines[first - 2]]
                if not any("#" in t for t in texts):
                    found.append(f"{path.relative_to(ROOT)}:{first}: {lines[first - 1].strip()}")
                block = []
    return found


def test_every_import_inside_a_function_gives_its_reason():
    bad = [b for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) for b in _unexplained(p)]
    assert bad == [], "imports inside functions without a reason:\n" + "\n".join(bad)
