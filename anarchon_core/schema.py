"""The SQL schema of the SQLite and PostgreSQL backends, as a public function.

``sql_schema(dialect, table)`` returns the statements that create a namespace's tables;
:class:`~anarchon_core.backends.sqlite.SqliteBackend` and
:class:`~anarchon_core.backends.postgres.PostgresBackend` run exactly these on ``start()``,
and a framework's migrations (the Django app's) can run them too::

    from anarchon_core import sql_schema

    for statement in sql_schema("postgresql", "shipping.cron_runs"):
        cursor.execute(statement)

Every statement is idempotent (``IF NOT EXISTS`` / ``ON CONFLICT DO NOTHING``). The layout:

* ``<table>``: one row per attempt, keyed ``(job, slot, manual, attempt)``; ``meta`` holds
  the attempt's :attr:`~anarchon_core.models.Run.meta` as JSON text (NULL when empty).
* ``<table>_live``: a partial index of the running attempts (overlap checks).
* ``<table>_meta``: ``name``/``value`` rows; ``format`` is the store format.

Tables made before ``meta`` existed get the column from :func:`sql_upgrade` (the backends
add it on ``start()``); the store format stays 1, because readers that do not know the
column never name it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from .backend import FORMAT_VERSION
from .errors import ConfigError
from .naming import validate_table

__all__ = ["Dialect", "SqlNames", "sql_names", "sql_schema", "sql_upgrade"]

Dialect = Literal["sqlite", "postgresql"]
#: PostgreSQL truncates longer identifiers (NAMEDATALEN - 1).
MAX_IDENT = 63
#: Columns added after format 1 was first released, with their type.
ADDED_COLUMNS: tuple[tuple[str, str], ...] = (("meta", "TEXT"),)


def derived_name(name: str, suffix: str) -> str:
    """``name + suffix``, shortened with a hash when longer than PostgreSQL keeps."""
    if len(name) + len(suffix) <= MAX_IDENT:
        return name + suffix
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[:MAX_IDENT - len(suffix) - 9]}_{digest}{suffix}"


def _quote(*parts: str) -> str:
    # Parts are validated plain identifiers: double quotes make them exact, never unsafe.
    return ".".join(f'"{p}"' for p in parts)


@dataclass(frozen=True)
class SqlNames:
    """The quoted names of one namespace's objects."""

    schema: str | None
    runs: str
    meta: str
    live_index: str
    bigint: str


def sql_names(dialect: Dialect, table: str) -> SqlNames:
    """Validate ``table`` for ``dialect`` and return the quoted names of its objects."""
    if dialect not in ("sqlite", "postgresql"):
        raise ConfigError(f"invalid dialect {dialect!r}: expected 'sqlite' or 'postgresql'")
    parts = validate_table(table, allow_schema=dialect == "postgresql")
    schema, name = (parts[0] if len(parts) == 2 else None), parts[-1]
    if dialect == "postgresql":
        return SqlNames(schema, _quote(*parts), _quote(*parts[:-1], derived_name(name, "_meta")),
                        _quote(derived_name(name, "_live")), "BIGINT")
    return SqlNames(None, _quote(name), _quote(f"{name}_meta"), _quote(f"{name}_live"),
                    "INTEGER")


def sql_schema(dialect: Dialect, table: str = "anarchon_runs", *,
               create_schema: bool = True) -> list[str]:
    """The statements that create the namespace ``table`` (``"sqlite"`` or ``"postgresql"``).

    ``table`` is validated like the backends' option (``"schema.table"`` allowed for
    PostgreSQL; with ``create_schema`` the first statement creates the schema if missing).
    The last statement writes the store-format record.
    """
    n = sql_names(dialect, table)
    out = []
    if n.schema is not None and create_schema:
        out.append(f"CREATE SCHEMA IF NOT EXISTS {_quote(n.schema)}")
    out += [
        f"CREATE TABLE IF NOT EXISTS {n.runs} ("
        "job TEXT NOT NULL, "
        f"slot {n.bigint} NOT NULL, "
        "manual INTEGER NOT NULL, "
        "attempt INTEGER NOT NULL, "
        "token TEXT NOT NULL, "
        "status TEXT NOT NULL, "
        "runner TEXT NOT NULL, "
        f"lease_until {n.bigint}, "
        f"started_at {n.bigint}, "
        f"finished_at {n.bigint}, "
        "error TEXT, "
        "meta TEXT, "
        "PRIMARY KEY (job, slot, manual, attempt))",
        f"CREATE INDEX IF NOT EXISTS {n.live_index} ON {n.runs} (job, lease_until) "
        "WHERE status = 'running'",
        f"CREATE TABLE IF NOT EXISTS {n.meta} (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"INSERT INTO {n.meta} (name, value) VALUES ('format', '{FORMAT_VERSION}') "
        "ON CONFLICT DO NOTHING",
    ]
    return out


def sql_upgrade(dialect: Dialect, table: str, missing: tuple[str, ...] | None = None
                ) -> list[str]:
    """The statements that add the columns a table made by an earlier release lacks.

    ``missing`` names the columns to add (default: every column added since format 1).
    PostgreSQL's statements are idempotent; SQLite has no ``ADD COLUMN IF NOT EXISTS``, so
    give it only the columns its ``PRAGMA table_info`` does not list.
    """
    n = sql_names(dialect, table)
    wanted = [(c, t) for c, t in ADDED_COLUMNS if missing is None or c in missing]
    guard = "IF NOT EXISTS " if dialect == "postgresql" else ""
    return [f"ALTER TABLE {n.runs} ADD COLUMN {guard}{column} {kind}"
            for column, kind in wanted]
