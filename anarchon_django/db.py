"""The runs table in the project's database, for ``BACKEND = "<alias>"``.

The migration calls :func:`create_runs_table` on the alias ``BACKEND`` names; it runs the
core's own DDL (:func:`anarchon_core.schema.sql_schema`), the same statements the backend
runs on start, so a table made either way is the same table.
"""

from __future__ import annotations

from typing import Any

from anarchon_core.schema import Dialect, sql_names, sql_schema

from . import conf

__all__ = ["create_runs_table", "drop_runs_table", "migration_target"]


def _dialect(vendor: str) -> Dialect:
    if vendor == "postgresql":
        return "postgresql"
    if vendor == "sqlite":
        return "sqlite"
    raise ValueError(f"anarchon cannot keep runs in a {vendor} database")


def migration_target(alias: str) -> str | None:
    """The runs table to create on database ``alias``, or None when it holds none."""
    parsed, _ = conf.parse()
    target = conf.database_target(parsed) if parsed is not None else None
    if target is None or target.alias != alias:
        return None
    return target.table


def create_runs_table(schema_editor: Any, table: str) -> None:
    """Create ``table`` and its meta table (idempotent) with the core's DDL."""
    for statement in sql_schema(_dialect(schema_editor.connection.vendor), table):
        schema_editor.execute(statement, params=None)


def drop_runs_table(schema_editor: Any, table: str) -> None:
    """Drop ``table`` and its meta table (the history they hold is lost)."""
    names = sql_names(_dialect(schema_editor.connection.vendor), table)
    for name in (names.runs, names.meta):
        schema_editor.execute(f"DROP TABLE IF EXISTS {name}", params=None)
