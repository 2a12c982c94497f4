"""SQLite: the embedded lease backend (no server; several processes on one machine).

Uses the standard library's ``sqlite3`` in WAL mode. Every claim is one ``BEGIN
IMMEDIATE`` transaction, which takes SQLite's write lock first and so serialises claims
across processes; a busy timeout makes concurrent writers wait instead of failing.
All calls run on one worker thread that owns the connection, so the event loop never
blocks on the file.

The store clock is the machine's clock (SQLite's ``julianday('now')``), shared by every
process on the machine, so leases stay correct across processes.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..backend import FORMAT_VERSION, Backend
from ..decision import HANDED_OVER
from ..errors import ConfigError
from ..models import ClaimRequest, ClaimResult, Run, RunRef
from ..naming import validate_table
from ..url import split_namespace_params
from .sqlstore import ClaimSteps, SqlQueries, check_format, claim_steps, ref_params, rows_to_runs

__all__ = ["SqliteBackend"]

T = TypeVar("T")
_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


class SqliteBackend(Backend):
    """Lease backend on a SQLite file.

    :param path: the database file (created if missing), default ``"anarchon.db"``.
    :param table: the runs table, default ``"anarchon_runs"`` (its namespace); a
        ``<table>_meta`` table beside it holds the format record.
    :param busy_timeout_ms: how long a writer waits for another process's lock.
    """

    def __init__(
        self, path: str | Path = "anarchon.db", *, table: str = "anarchon_runs",
        busy_timeout_ms: int = 30_000,
    ) -> None:
        if not isinstance(path, str | Path) or not str(path):
            raise ConfigError(f"invalid SQLite path {path!r}: expected a file path")
        (name,) = validate_table(table, allow_schema=False)
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int) or \
                busy_timeout_ms < 0:
            raise ConfigError(f"invalid busy_timeout_ms {busy_timeout_ms!r}: expected an int ≥ 0")
        self.path = str(path)
        self.table = name
        self.busy_timeout_ms = busy_timeout_ms
        self._queries = SqlQueries.render(
            runs=f'"{name}"', meta=f'"{name}_meta"', live_index=f'"{name}_live"',
            now=_NOW_MS, bigint="INTEGER", placeholder=":{}",
            # BEGIN IMMEDIATE already holds the database's write lock.
            lock_job="SELECT :lock_key",
        )
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqliteBackend:
        """``sqlite:///relative.db`` or ``sqlite:////absolute.db``; ``?table=`` allowed."""
        _, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"table"})
        if unknown:
            raise ConfigError(f"invalid SQLite URL {url!r}: unknown parameter {unknown[0]!r}")
        return cls(_sqlite_path(url), **{**params, **options})

    def describe(self) -> str:
        """E.g. ``SqliteBackend(path='cron.db', table='anarchon_runs')``."""
        return f"SqliteBackend(path={self.path!r}, table={self.table!r})"

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            await self.start()
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_conn, fn)

    def _with_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000,
                                   isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            _switch_to_wal(conn, self.busy_timeout_ms)
            conn.execute("PRAGMA synchronous = NORMAL")
            self._conn = conn
        return fn(self._conn)

    def _transaction(self, conn: sqlite3.Connection, body: Callable[[], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def start(self) -> None:
        """Open the file, create the tables if missing and check the store format."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="anarchon-sqlite")
        q = self._queries

        def setup(conn: sqlite3.Connection) -> None:
            def body() -> None:
                for name in ("create_runs", "create_live_index", "create_meta"):
                    conn.execute(q[name])
                conn.execute(q["insert_format"], {"format": str(FORMAT_VERSION)})
                check_format(conn.execute(q["read_format"]).fetchall())
            self._transaction(conn, body)

        await self._call(setup)

    async def stop(self) -> None:
        """Close the connection and its thread."""
        executor, self._executor = self._executor, None
        if executor is None:
            return

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(executor, close)
        executor.shutdown(wait=True)

    def _drive(self, conn: sqlite3.Connection, steps: ClaimSteps) -> ClaimResult:
        reply: Any = None
        try:
            while True:
                step = steps.send(reply)
                cursor = conn.execute(self._queries[step.query], step.params)
                reply = cursor.fetchall() if step.rows else cursor.rowcount
        except StopIteration as done:
            result: ClaimResult = done.value
            return result

    async def clock_ms(self) -> int:
        """The machine clock as SQLite reads it."""
        rows = await self._call(lambda c: c.execute(self._queries["now"]).fetchall())
        return int(rows[0][0])

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Apply the lease decision table in one ``BEGIN IMMEDIATE`` transaction."""
        return await self._call(
            lambda c: self._transaction(c, lambda: self._drive(c, claim_steps(request)))
        )

    async def _update(self, query: str, params: dict[str, Any]) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            return conn.execute(self._queries[query], params).rowcount == 1
        return await self._call(run)

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease if ``ref`` is still the current attempt."""
        return await self._update("heartbeat", {**ref_params(ref), "lease_ms": lease_ms})

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the end of the attempt if ``ref`` is still the current attempt."""
        return await self._update("finish", {**ref_params(ref), "status": status,
                                             "error": error})

    async def release(self, ref: RunRef) -> bool:
        """Expire the lease now so a backup takes over at once."""
        return await self._update("release", {**ref_params(ref), "handed_over": HANDED_OVER})

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first."""
        rows = await self._call(
            lambda c: c.execute(self._queries["history"], {"job": job, "limit": limit})
            .fetchall()
        )
        return rows_to_runs(rows)


def _switch_to_wal(conn: sqlite3.Connection, timeout_ms: int) -> None:
    """Set WAL mode, retrying while another process holds the file (bounded).

    The switch needs an exclusive moment that the busy timeout does not wait for, so
    processes opening a fresh file together can see "database is locked".
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _sqlite_path(url: str) -> str:
    """``sqlite:///rel.db`` → ``rel.db``; ``sqlite:////abs/x.db`` → ``/abs/x.db``."""
    rest = url.split("://", 1)[1]
    if not rest.startswith("/") or rest == "/":
        raise ConfigError(
            f"invalid SQLite URL {url!r}: expected sqlite:///relative.db or sqlite:////abs.db"
        )
    return rest[1:].split("?", 1)[0]
