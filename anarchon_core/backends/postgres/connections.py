"""Where a PostgresBackend's connections come from: its own, or the user's connection or pool.

Each source runs a transaction of steps through :mod:`.driver`; only connections
anarchon opened itself are closed by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from ...errors import ConfigError
from ...url import check_postgres_conninfo, mask_url
from ..sqlstore import (
    Steps,
)

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .driver import SETTINGS, Source, drive_async, drive_sync, within

__all__ = ["DEFAULT_LEASE_MS", "OWN_CONNECTIONS", "OwnedConnection", "Timeouts",
           "make_source", "mask_conninfo"]

logger = logging.getLogger("anarchon.postgres")
T = TypeVar("T")
DEFAULT_LEASE_MS = 30_000


@dataclass(frozen=True)
class Timeouts:
    """The timeouts of anarchon's own connection, fitted to a lease (``tune_timeouts``)."""

    connect_s: int
    keepalives_idle_s: int
    keepalives_interval_s: int
    keepalives_count: int
    tcp_user_timeout_ms: int
    transaction_s: float

    @classmethod
    def for_lease(cls, lease_ms: int, statement_ms: int) -> Timeouts:
        """The timeouts fitted to ``lease_ms`` and a statement limit (ms)."""
        lease_s = lease_ms / 1000
        return cls(
            # libpq counts whole seconds and treats less than 2 as 2.
            connect_s=int(min(5, max(2, lease_s // 3))),
            keepalives_idle_s=int(min(10, max(1, lease_s // 3))),
            keepalives_interval_s=int(min(5, max(1, lease_s // 6))),
            keepalives_count=3,
            tcp_user_timeout_ms=int(min(15_000, max(1_000, lease_ms // 2))),
            # A frozen server cannot enforce its statement_timeout: the client bounds each
            # transaction too, by the lease and never below one statement's limit + 1 s
            # unless the lease is shorter.
            transaction_s=max(1.0, min(statement_ms / 1000 + 1, lease_s)),
        )


#: Connections anarchon opens itself per backend: claims of different jobs due at one
#: instant go out in parallel instead of queueing behind one connection.
OWN_CONNECTIONS = 4


class _Slot:
    """One of anarchon's own connections, used by one transaction at a time."""

    def __init__(self) -> None:
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.lock = asyncio.Lock()


class OwnedConnection:
    """anarchon's own connections from a conninfo: opened as work asks, reopened after a drop.

    Up to :data:`OWN_CONNECTIONS` of them, each used by one transaction at a time.
    """

    parallel = OWN_CONNECTIONS

    def __init__(self, conninfo: str, settings: dict[str, str], pooled: bool = False) -> None:
        params = check_postgres_conninfo(conninfo, conninfo_to_dict)
        self.conninfo = conninfo
        self.settings = settings
        #: Behind a transaction-pooling proxy: nothing kept in the server session.
        self.pooled = pooled
        self.given = params
        self.lease_ms: int | None = None
        self.extra: dict[str, Any] = {}
        self.timeouts = Timeouts.for_lease(DEFAULT_LEASE_MS, 0)
        self.tune(DEFAULT_LEASE_MS)
        self.lease_ms = None
        self.slots = [_Slot() for _ in range(OWN_CONNECTIONS)]
        self._turn = 0

    def tune(self, lease_ms: int) -> None:
        """Fit the timeouts to ``lease_ms`` (the shortest lease asked for wins)."""
        self.lease_ms = lease_ms if self.lease_ms is None else min(self.lease_ms, lease_ms)
        t = self.timeouts = Timeouts.for_lease(self.lease_ms,
                                                int(self.settings["statement_timeout"]))
        wanted: dict[str, Any] = {
            "autocommit": True, "application_name": "anarchon",
            "connect_timeout": t.connect_s, "keepalives": 1,
            "keepalives_idle": t.keepalives_idle_s,
            "keepalives_interval": t.keepalives_interval_s,
            "keepalives_count": t.keepalives_count,
            "tcp_user_timeout": t.tcp_user_timeout_ms,
        }
        self.extra = {k: v for k, v in wanted.items() if k == "autocommit" or k not in self.given}
        if self.pooled:
            self.extra["prepare_threshold"] = None

    @property
    def connect_bound_s(self) -> float:
        """The whole connect (every address libpq tries, the session settings) ends by this."""
        given = self.given.get("connect_timeout")
        try:
            seconds = max(2, int(given)) if given is not None else self.timeouts.connect_s
        except ValueError:
            seconds = self.timeouts.connect_s
        return float(seconds + 1)

    def describe(self) -> str:
        """The connection as shown in logs and reprs (password masked)."""
        return repr(mask_conninfo(self.conninfo)) if self.conninfo else "'' (libpq defaults)"

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        async def connect() -> psycopg.AsyncConnection[Any]:
            conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.extra)
            if self.pooled:
                return conn
            try:
                await conn.execute(SETTINGS.format(scope="false"), self.settings)
            except BaseException:
                await conn.close()
                raise
            return conn

        bound = self.connect_bound_s
        try:
            # libpq's connect_timeout applies per address and attempt; this bounds it all,
            # including a server that accepts the connection and never answers.
            conn = await asyncio.wait_for(connect(), bound)
        except TimeoutError:
            raise psycopg.OperationalError(
                f"no answer from the server within {bound:g} s (connect)") from None
        logger.debug("connected to %s", self.describe())
        return conn

    def _pick(self) -> _Slot:
        # An idle open connection first, then one to open, then the next in turn.
        idle = [s for s in self.slots if not s.lock.locked()]
        for slot in idle:
            if slot.conn is not None and not slot.conn.closed:
                return slot
        if idle:
            return idle[0]
        self._turn = (self._turn + 1) % len(self.slots)
        return self.slots[self._turn]

    async def run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        """Run one transaction of ``steps`` on a free connection."""
        slot = self._pick()
        async with slot.lock:
            if slot.conn is None or slot.conn.closed:
                slot.conn = await self._connect()
            conn = slot.conn
            try:
                limit = self.timeouts.transaction_s
                try:
                    settings = self.settings if self.pooled else None
                    return await within(drive_async(conn, queries, steps, settings), limit)
                except TimeoutError:
                    raise psycopg.OperationalError(
                        f"no answer from the server within {limit:g} s") from None
            except BaseException:
                # Dropped, or interrupted mid-transaction (cancelled): start afresh.
                if conn.broken or conn.closed or \
                        conn.info.transaction_status != TransactionStatus.IDLE:
                    slot.conn = None
                    await conn.close()
                raise

    async def close(self) -> None:
        """Close every connection anarchon opened."""
        for slot in self.slots:
            async with slot.lock:
                conn, slot.conn = slot.conn, None
                if conn is not None:
                    await conn.close()


class _UserAsyncConnection:
    parallel = 1

    def __init__(self, conn: psycopg.AsyncConnection[Any], settings: dict[str, str]) -> None:
        self.conn = conn
        self.settings = settings
        self.lock = asyncio.Lock()

    def describe(self) -> str:
        return "<psycopg.AsyncConnection>"

    async def run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        async with self.lock:
            return await drive_async(self.conn, queries, steps, self.settings)

    async def close(self) -> None:
        return None


class _UserAsyncPool:
    def __init__(self, pool: AsyncConnectionPool[Any], settings: dict[str, str]) -> None:
        self.pool = pool
        self.settings = settings
        self.parallel = max(1, pool.max_size)

    def describe(self) -> str:
        return "<psycopg_pool.AsyncConnectionPool>"

    async def run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        async with self.pool.connection() as conn:  # PoolTimeout is an OperationalError
            return await drive_async(conn, queries, steps, self.settings)

    async def close(self) -> None:
        return None


class _UserSyncConnection:
    parallel = 1

    def __init__(self, conn: psycopg.Connection[Any], settings: dict[str, str]) -> None:
        self.conn = conn
        self.settings = settings
        self.lock = threading.Lock()

    def describe(self) -> str:
        return "<psycopg.Connection>"

    def _run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        with self.lock:
            return drive_sync(self.conn, queries, steps, self.settings)

    async def run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        return await asyncio.to_thread(self._run, queries, steps)

    async def close(self) -> None:
        return None


class _UserSyncPool:
    def __init__(self, pool: ConnectionPool[Any], settings: dict[str, str]) -> None:
        self.pool = pool
        self.settings = settings
        self.parallel = max(1, pool.max_size)

    def describe(self) -> str:
        return "<psycopg_pool.ConnectionPool>"

    def _run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        with self.pool.connection() as conn:  # PoolTimeout is an OperationalError
            return drive_sync(conn, queries, steps, self.settings)

    async def run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        return await asyncio.to_thread(self._run, queries, steps)

    async def close(self) -> None:
        return None


def make_source(connection: object, settings: dict[str, str], pooled: bool) -> Source:
    """The :class:`~.driver.Source` for a ``connection`` argument (None: anarchon's own)."""
    if connection is None:
        return OwnedConnection("", settings, pooled)
    if isinstance(connection, str):
        if not connection.strip():
            raise ConfigError("invalid connection '': expected a PostgreSQL URL or conninfo")
        return OwnedConnection(connection, settings, pooled)
    if isinstance(connection, psycopg.AsyncConnection):
        return _UserAsyncConnection(connection, settings)
    if isinstance(connection, psycopg.Connection):
        return _UserSyncConnection(connection, settings)
    with contextlib.suppress(ImportError):
        from psycopg_pool import (  # noqa: PLC0415 - optional: psycopg alone is enough
            AsyncConnectionPool,
            ConnectionPool,
        )

        if isinstance(connection, AsyncConnectionPool):
            return _UserAsyncPool(connection, settings)
        if isinstance(connection, ConnectionPool):
            return _UserSyncPool(connection, settings)
    raise ConfigError(
        f"invalid connection {type(connection).__name__}: expected a PostgreSQL URL or "
        "conninfo string, a psycopg (Async)Connection or a psycopg_pool (Async)ConnectionPool"
    )


def mask_conninfo(conninfo: str) -> str:
    """A URL or ``key=value`` conninfo with every credential replaced by ``***``."""
    return mask_url(conninfo)

