"""All SQL lives in ``loaders/``: no SQL statement in a string literal under app/, analysis/, experiments/.

DESIGN.md ("Store"). The scan reads each file's syntax tree and
looks only at string constants (f-strings with their ``{...}`` parts as ``{}``;
adjacent literals are one constant already), so comments and docstrings that
describe SQL in words are allowed; docstrings are left out explicitly. A statement is
an upper-case SQL verb followed, later in the same string, by the word that completes
it (``SELECT ... FROM``, ``INSERT INTO``, ``COPY ... TO``, ``CREATE ... TABLE``), or
``INSTALL`` / ``LOAD`` of an extension. Lower-case SQL is not caught (none of the
project's SQL is written that way).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("app", "analysis", "experiments")
_STATEMENT = re.compile(
    r"\b(SELECT|INSERT|DELETE|UPDATE|CREATE|COPY|DROP|ALTER|DESCRIBE|WITH)\b[\s\S]*?"
    r"\b(FROM|INTO|TABLE|TO|SET|SECRET|SEQUENCE|VIEW|INDEX|AS)\b"
    r"|\b(INSTALL|LOAD|ATTACH)\s+['\"]?[A-Za-z_]")
#: (file, variable) whose value may be SQL. app/pages/sql.py's EXAMPLE is the text the SQL
#: page's editor starts with: the user's own query, shown for them to edit and run through
#: loaders.sql_console like anything they type, not a query the page runs for itself.
ALLOWED = {("app/pages/sql.py", "EXAMPLE")}
def _text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def sql_literals(source: str, path: str = "<source>") -> list[tuple[int, str]]:
    """``(line, text)`` of every string literal in ``source`` that holds a SQL statement,
    leaving out docstrings and the values ``ALLOWED`` names for ``path``."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))                         # a docstring
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)               # scanned as the whole f-string
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and (path, t.id) in ALLOWED for t in targets) and node.value:
                skip.update(id(n) for n in ast.walk(node.value))
    hits = []
    for node in ast.walk(tree):
        is_str = isinstance(node, ast.Constant) and isinstance(node.value, str) or isinstance(node, ast.JoinedStr)
        if is_str and id(node) not in skip and _STATEMENT.search(_text(node)):
            hits.append((node.lineno, " ".join(_text(node).split())[:80]))
    return sorted(hits)


def _files() -> list[str]:
    return [f.relative_to(ROOT).as_posix() for folder in SCANNED for f in sorted((ROOT / folder).rglob("*.py"))]


def _hits(files: list[str]) -> list[str]:
    return [f"{rel}:{line}: {text}" for rel in files
            for line, text in sql_literals((ROOT / rel).read_text(encoding="utf-8"), rel)]


def test_no_sql_outside_loaders():
    files = _files()
    assert len(files) > 50                                        # the scan found the packages
    assert _hits(files) == []


def test_the_scan_finds_sql_and_spares_words():
    source = '''
"""Module docstring: SELECT value FROM analysis_results is described here."""
A = "SELECT id FROM checkpoints WHERE id = ?"
B = f"SELECT {cols} FROM checkpoints"
C = ("DELETE FROM analysis_result_files "
     "WHERE checkpoint_id = ?")
D = "INSTALL httpfs"
E = f"COPY _qkv_out TO {target} (FORMAT PARQUET)"
# SELECT x FROM y in a comment is not a string
F = "Select a checkpoint from the list"
G = "Read-only: one SELECT at a time; no files, no ATTACH, no writes."
def f():
    """INSERT INTO t VALUES (1): a docstring."""
    return "UPDATE runs SET name = ?"
EXAMPLE = "SELECT 1 AS one FROM runs"
'''
    assert [line for line, _ in sql_literals(source)] == [3, 4, 5, 7, 8, 14, 15]
    assert [line for line, _ in sql_literals(source, "app/pages/sql.py")] == [3, 4, 5, 7, 8, 14]
    assert sql_literals(source)[1] == (4, "SELECT {} FROM checkpoints")


#: Tables whose every statement lives in one module of ``loaders/`` (besides the schema and its
#: migrations in ``loaders/store.py``): reads and writes.
OWNER = {
    "ingest_journal": "loaders/journal.py",
    "metric_directions": "loaders/curves.py",
    "analysis_result_files": "loaders/batch_results.py",
}
#: Tables whose every write lives in one module (their reads join other tables' pages' queries).
WRITER = {
    "analysis_results": "loaders/results.py",
    "analysis_jobs": "loaders/results.py",
    "run_overrides": "loaders/logs/runs.py",
    "points": "loaders/logs/newpoints.py",
    "runs": "loaders/run_rows.py",
    "checkpoints": "loaders/checkpoint_rows.py",
}
_READ_OR_WRITE = r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+{}\b"
_WRITE = r"\b(?:INSERT(?: OR REPLACE)? INTO|UPDATE|DELETE FROM)\s+{}\b"


def _statements_on(table: str, pattern: str) -> set[str]:
    """The files of ``loaders/`` (store.py aside) holding a SQL literal that ``pattern`` finds on ``table``."""
    found = set()
    for f in sorted((ROOT / "loaders").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel == "loaders/store.py":
            continue
        if any(re.search(pattern.format(table), text) for _, text in _all_sql(f.read_text(encoding="utf-8"))):
            found.add(rel)
    return found


def _all_sql(source: str) -> list[tuple[int, str]]:
    """Every string literal of ``source`` (whole, not cut to 80 characters) that holds SQL."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) or isinstance(node, ast.JoinedStr):
            text = " ".join(_text(node).split())
            if _STATEMENT.search(text):
                hits.append((node.lineno, text))
    return hits


def test_each_table_is_read_and_written_by_its_own_module():
    assert {t: _statements_on(t, _READ_OR_WRITE) for t in OWNER} == {t: {m} for t, m in OWNER.items()}
    assert {t: _statements_on(t, _WRITE) for t in WRITER} == {t: {m} for t, m in WRITER.items()}
