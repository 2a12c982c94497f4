"""SQLite files in a temporary directory."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from anarchon_core.backends.sqlite import SqliteBackend

from . import StoreHandle, StoreSpec


@contextmanager
def _open() -> Iterator[StoreHandle]:
    with tempfile.TemporaryDirectory(prefix="anarchon-sqlite-") as tmp:
        path = Path(tmp) / "store.db"

        def set_format(ns: str, value: str) -> None:
            with closing(sqlite3.connect(path)) as conn, conn:
                conn.execute(f'CREATE TABLE IF NOT EXISTS "{ns}_meta" '
                             "(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
                conn.execute(f'INSERT OR REPLACE INTO "{ns}_meta" VALUES (\'format\', ?)',
                             (value,))

        def set_lease(ns: str, job: str, slot: int, lease_until: float) -> None:
            with closing(sqlite3.connect(path)) as conn, conn:
                conn.execute(f'UPDATE "{ns}" SET lease_until = ? WHERE job = ? AND slot = ? '
                             "AND manual = 0 AND status = 'running'", (lease_until, job, slot))

        yield StoreHandle(
            backend=lambda ns: SqliteBackend(path, table=ns),
            url=lambda ns: f"sqlite:///{path}?table={ns}",
            set_format=set_format, set_lease=set_lease,
        )


STORES = [StoreSpec("sqlite", leases=True, open=_open, multi_host=False)]
