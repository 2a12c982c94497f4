"""The shared PostgreSQL server: one table per namespace, dropped at the end of the session.

``postgres`` claims through the session functions (one round trip); ``postgres-two-trips``
is the same store with ``transaction_pooling=True``, the path a role without the
``TEMPORARY`` right takes too (the Python decision table, two round trips per claim, the
timeouts set per transaction, nothing prepared).

``ANARCHON_TEST_POSTGRES_URL`` overrides the server (default the local one, database
``test``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from anarchon_core.backends.postgres import PostgresBackend

from . import StoreHandle, StoreSpec, unavailable

POSTGRES_URL = os.environ.get(
    "ANARCHON_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def connect(url: str = POSTGRES_URL) -> psycopg.Connection[Any]:
    """A sync autocommit psycopg connection, or a loud skip (a failure under CI)."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", f"{url}: {str(exc).strip()}")
        raise


def drop_tables(conn: psycopg.Connection[Any], tables: Iterable[str]) -> None:
    """Drop the runs and meta tables of these (possibly schema-qualified) namespaces."""
    for table in sorted(set(tables)):
        *schema, name = table.split(".")
        for part in (name, f"{name}_meta"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                sql.Identifier(*schema, part)))


@contextmanager
def _open(transaction_pooling: bool = False) -> Iterator[StoreHandle]:
    conn = connect()
    used: set[str] = set()

    def backend(ns: str) -> PostgresBackend:
        used.add(ns)
        return PostgresBackend(POSTGRES_URL, table=ns, transaction_pooling=transaction_pooling)

    def url(ns: str) -> str:
        used.add(ns)
        sep = "&" if "?" in POSTGRES_URL else "?"
        return f"{POSTGRES_URL}{sep}table={ns}"

    def set_format(ns: str, value: str) -> None:
        meta = sql.Identifier(f"{ns}_meta")
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
        ).format(meta))
        conn.execute(sql.SQL(
            "INSERT INTO {} VALUES ('format', %s) "
            "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"
        ).format(meta), (value,))

    def set_lease(ns: str, job: str, slot: int, lease_until: float) -> None:
        conn.execute(sql.SQL(
            "UPDATE {} SET lease_until = %s WHERE job = %s AND slot = %s AND manual = 0 "
            "AND status = 'running'").format(sql.Identifier(ns)), (lease_until, job, slot))

    try:
        yield StoreHandle(backend=backend, url=url, set_format=set_format,
                          set_lease=set_lease, extra=POSTGRES_URL)
    finally:
        try:
            drop_tables(conn, used)
        finally:
            conn.close()


STORES = [
    StoreSpec("postgres", leases=True, open=_open),
    # In-process suites only: processes started by URL use the default path.
    StoreSpec("postgres-two-trips", leases=True, open=lambda: _open(transaction_pooling=True),
              persistent=False),
]
