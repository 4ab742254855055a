"""What a database file holds, read from DuckDB's own catalogue: tables,
views (with their SQL), columns (type, nullability, default) and indexes.

``scripts/gen_reference.py`` reads a freshly created database through this
to write the schema reference (``docs/reference/schema.md``), so the page
follows ``loaders.store.MIGRATIONS`` without a hand list.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


from loaders import duck


@dataclass(frozen=True)
class Column:
    table: str
    name: str
    type: str
    nullable: bool
    default: str | None


@dataclass(frozen=True)
class Catalogue:
    tables: list[str]
    views: dict[str, str]            # view name -> its CREATE VIEW statement
    columns: list[Column]            # tables' and views' columns, in table then column order
    indexes: list[tuple[str, str]]   # (index, table)

    def of(self, table: str) -> list[Column]:
        return [c for c in self.columns if c.table == table]


def read_catalogue(path: str | Path) -> Catalogue:
    """The catalogue of the database file at ``path`` (opened read-only)."""
    con = duck.connect(str(path), read_only=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT internal ORDER BY table_name").fetchall()]
        views = dict(con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall())
        columns = [Column(*r) for r in con.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default FROM duckdb_columns() "
            "WHERE NOT internal ORDER BY table_name, column_index").fetchall()]
        indexes = [tuple(r) for r in con.execute(
            "SELECT index_name, table_name FROM duckdb_indexes() ORDER BY index_name").fetchall()]
    finally:
        con.close()
    return Catalogue(tables, views, columns, indexes)
