"""PostgreSQL: the lease backend on a shared database (psycopg 3).

Runs are stored one row per attempt, exactly as :mod:`anarchon_core.backends.sqlstore` lays them
out, and every claim runs that module's steps inside one transaction. What is specific to
PostgreSQL is only how the steps are executed:

* claims, heartbeats, finishes and releases of one job are serialised by a
  transaction-scoped advisory lock on (table, job), so reading a run's state and writing
  the decision cannot interleave with another instance's writes to the same job;
* times come from the server clock (``clock_timestamp()``), never from the instances;
* anarchon's sessions run with ``lock_timeout``, ``statement_timeout`` and
  ``idle_in_transaction_session_timeout`` (set on the connection anarchon opens, local to
  each transaction on a connection or pool of yours): an instance frozen in the middle of
  a claim (SIGSTOP, a long GC pause) cannot hold the job's lock for longer than that;
* a transaction that fails because the connection dropped (or any
  :class:`psycopg.OperationalError`) is retried as a whole, a bounded number of times, on a
  new connection. A claim reports ``won`` only after its ``COMMIT`` succeeded. If the
  connection drops while the ``COMMIT`` is in flight, the retried claim finds the run
  already taken and reports ``running``: nobody runs that attempt until its lease expires
  and a backup takes over as attempt 2; the run is delayed, never duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import threading
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Union

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from ..backend import FORMAT_VERSION, Backend
from ..decision import HANDED_OVER
from ..errors import ConfigError, StoreError
from ..models import ClaimRequest, ClaimResult, Run, RunRef
from ..naming import validate_table
from ..url import NAMESPACE_PARAMS, mask_url, split_namespace_params
from .sqlstore import SqlQueries, Step, check_format, claim_steps, ref_params, rows_to_runs

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

__all__ = ["PostgresBackend"]

logger = logging.getLogger("anarchon.postgres")

T = TypeVar("T")
#: A transaction written as steps (see :mod:`anarchon_core.backends.sqlstore`); made fresh per try.
Work = Callable[[], Generator[Step, Any, T]]
Connection = Union[
    str, "psycopg.AsyncConnection[Any]", "psycopg.Connection[Any]",
    "AsyncConnectionPool[Any]", "ConnectionPool[Any]",
]

# Whole milliseconds since the epoch by the server clock. No "::" cast: sqlstore turns
# ":name" into placeholders.
_NOW_MS = "CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT)"
_MAX_IDENT = 63  # PostgreSQL truncates longer identifiers (NAMEDATALEN - 1)
_DEFAULT_CONNECT_TIMEOUT_S = 10


class PostgresBackend(Backend):
    """Lease backend on a PostgreSQL table.

    :param connection: where to store runs. A conninfo string or URL
        (``"postgresql://user@host/db"``; ``None``: libpq's defaults and ``PG*`` environment
        variables): anarchon opens one connection of its own,
        re-opens it when it drops, and closes it on :meth:`stop`. Or a client of yours,
        which anarchon uses but never closes: a ``psycopg.AsyncConnection`` (dedicate it to
        anarchon: it must not be inside a transaction of yours), a
        ``psycopg_pool.AsyncConnectionPool`` (opened; the best choice to share connections
        with your application), or their synchronous twins ``psycopg.Connection`` and
        ``psycopg_pool.ConnectionPool`` (used from a worker thread). A dropped connection is
        re-established for a URL or a pool; a single connection of yours cannot be, so the
        error is raised.
    :param table: the runs table, default ``"anarchon_runs"``, optionally
        schema-qualified (``"shipping.cron_runs"``; the schema is created if missing). It is
        the namespace: instances sharing jobs use the same table. A ``<table>_meta`` table
        beside it holds the store format record.
    :param retries: how many times a transaction is retried after a connection error.
    :param timeout_ms: bound on how long one statement runs or waits for a lock, and on how
        long a transaction may sit idle (a frozen client) before the server ends it.
    """

    def __init__(
        self, connection: Connection | None = None, *,
        table: str = "anarchon_runs", retries: int = 6, timeout_ms: int = 5_000,
    ) -> None:
        parts = validate_table(table, allow_schema=True)
        for option, value, low in (("retries", retries, 0), ("timeout_ms", timeout_ms, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"invalid {option} {value!r}: expected an int ≥ {low}")
        self.table = table
        self.retries = retries
        self.timeout_ms = timeout_ms
        self._schema = parts[0] if len(parts) == 2 else None
        name = parts[-1]
        # A lock wait reports itself as such (LockNotAvailable), before the statement limit.
        settings = {"timeout": str(timeout_ms), "statement_timeout": str(2 * timeout_ms)}
        self._source = _make_source(connection, settings)
        runs = sql.Identifier(*parts)
        meta = sql.Identifier(*parts[:-1], _derived(name, "_meta"))
        self._queries = SqlQueries.render(
            runs=runs.as_string(), meta=meta.as_string(),
            live_index=sql.Identifier(_derived(name, "_live")).as_string(),
            now=_NOW_MS, bigint="BIGINT", placeholder="%({})s",
            # Keyed on the table's oid: one key per table whatever name or search_path
            # reached it.
            lock_job=sql.SQL(
                "SELECT pg_advisory_xact_lock(hashtextextended(:lock_key, "
                "CAST(CAST(CAST({} AS regclass) AS oid) AS BIGINT)))"
            ).format(sql.Literal(runs.as_string())).as_string(),
        )
        self._sql: dict[str, str] = {
            **self._queries.text,
            "ddl_lock": "SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))",
            "exists": sql.SQL(
                "SELECT to_regclass({}) IS NOT NULL AND to_regclass({}) IS NOT NULL"
            ).format(sql.Literal(runs.as_string()), sql.Literal(meta.as_string())).as_string(),
            "schema_exists": "SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s",
            "create_schema": sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(self._schema or "public")).as_string(),
            "attempt_status": sql.SQL(
                "SELECT status, error FROM {} WHERE job = %(job)s AND slot = %(slot)s "
                "AND manual = %(manual)s AND attempt = %(attempt)s AND token = %(token)s"
            ).format(runs).as_string(),
        }
        self._started = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """``postgresql://user:password@host:5432/db?table=shipping.cron_runs``.

        ``table`` is read out of the query string; the other parameters go to libpq
        (``sslmode``, ``application_name``...). Keyword ``options`` override the URL.
        """
        _, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"table"})
        if unknown:
            raise ConfigError(
                f"invalid PostgreSQL URL {mask_url(url)!r}: parameter {unknown[0]!r} is not "
                "used by PostgresBackend (use 'table' to choose the namespace)"
            )
        return cls(_strip_params(url, NAMESPACE_PARAMS), **{**params, **options})

    def describe(self) -> str:
        """E.g. ``PostgresBackend(connection='postgresql://app:***@db/prod', table='cron')``."""
        return f"PostgresBackend(connection={self._source.describe()}, table={self.table!r})"

    # -- running transactions ---------------------------------------------------------

    async def _run(self, work: Work[T], *, what: str) -> T:
        """Run ``work`` as one transaction, retrying it on a new connection if one drops."""
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                return await self._source.run(self._sql, work())
            except _TransientError as exc:
                if attempt == self.retries:
                    raise exc.error from None
                logger.warning(
                    "PostgreSQL %s failed (%s: %s); retry %d/%d in %.2fs",
                    what, type(exc.error).__name__, " ".join(str(exc.error).split()),
                    attempt + 1, self.retries, delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.start()

    async def start(self) -> None:
        """Create the schema, tables and index if missing; check the store format.

        Several instances may start at once: creation is serialised by an advisory lock
        on the table name. When both tables already exist nothing is created, so an
        application role with only read/write rights on them is enough.
        """
        schema, qualified = self._schema, self.table

        def setup() -> Generator[Step, Any, None]:
            (exists,) = (yield Step("exists", {}))[0]
            if not exists:
                yield Step("ddl_lock", {"key": f"anarchon:create:{qualified}"})
                if schema is not None and not (yield Step("schema_exists",
                                                          {"schema": schema})):
                    yield Step("create_schema", {}, rows=False)
                for name in ("create_runs", "create_live_index", "create_meta"):
                    yield Step(name, {}, rows=False)
            yield Step("insert_format", {"format": str(FORMAT_VERSION)}, rows=False)
            check_format((yield Step("read_format", {})))

        await self._run(setup, what="start")
        self._started = True

    async def stop(self) -> None:
        """Close the connection anarchon opened (a connection or pool of yours stays open)."""
        self._started = False
        await self._source.close()

    # -- the backend contract ---------------------------------------------------------

    async def clock_ms(self) -> int:
        """The PostgreSQL server's clock."""
        await self._ensure_started()

        def read() -> Generator[Step, Any, int]:
            return int((yield Step("now", {}))[0][0])

        return await self._run(read, what="clock read")

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Apply the lease decision table in one transaction (see the module docstring)."""
        await self._ensure_started()
        return await self._run(lambda: claim_steps(request), what="claim")

    async def _update(self, query: str, ref: RunRef, params: dict[str, Any]) -> bool:
        await self._ensure_started()
        tried = False

        def update() -> Generator[Step, Any, bool]:
            nonlocal tried
            yield Step("lock_job", {"lock_key": ref.job})
            if tried and query == "finish":
                # The first try may have committed before its connection dropped.
                rows = yield Step("attempt_status", ref_params(ref))
                if rows and (rows[0][0], rows[0][1]) == (params["status"], params["error"]):
                    return True
            tried = True
            return bool((yield Step(query, params, rows=False)) == 1)

        return await self._run(update, what=query)

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease to server-now + ``lease_ms`` if ``ref`` is the current attempt."""
        return await self._update("heartbeat", ref, {**ref_params(ref), "lease_ms": lease_ms})

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the end of the attempt if ``ref`` is still the current attempt."""
        return await self._update("finish", ref, {**ref_params(ref), "status": status,
                                                  "error": error})

    async def release(self, ref: RunRef) -> bool:
        """Expire the lease now so a backup takes over at once."""
        return await self._update("release", ref, {**ref_params(ref),
                                                   "handed_over": HANDED_OVER})

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first."""
        await self._ensure_started()

        def read() -> Generator[Step, Any, list[Any]]:
            rows: list[Any] = yield Step("history", {"job": job, "limit": limit})
            return rows

        return rows_to_runs(await self._run(read, what="history read"))


# Set once per session on anarchon's own connection, per transaction on a user's: a frozen
# client cannot hold a job's lock for long, and a waiter gives up (and retries) instead of
# hanging.
_SETTINGS = (
    "SELECT set_config('lock_timeout', %(timeout)s, {scope}), "
    "set_config('statement_timeout', %(statement_timeout)s, {scope}), "
    "set_config('idle_in_transaction_session_timeout', %(timeout)s, {scope})"
)


def _derived(name: str, suffix: str) -> str:
    """``name + suffix``, shortened with a hash when longer than PostgreSQL keeps."""
    if len(name) + len(suffix) <= _MAX_IDENT:
        return name + suffix
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[:_MAX_IDENT - len(suffix) - 9]}_{digest}{suffix}"


def _strip_params(url: str, names: tuple[str, ...]) -> str:
    """Remove the query parameters ``names`` from ``url``, leaving the others byte for byte.

    (Re-encoding them would turn spaces into ``+``, which libpq does not decode.)
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url
    kept = [p for p in query.split("&") if p and p.split("=", 1)[0] not in names]
    return f"{base}?{'&'.join(kept)}" if kept else base


# -- where connections come from ------------------------------------------------------


class _TransientError(Exception):
    """A transaction failed in a way worth retrying on a (new) connection."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _transient(error: psycopg.Error, conn: psycopg.BaseConnection[Any]) -> bool:
    # A dropped or terminated connection, a lock or statement timeout, a serialisation
    # failure: OperationalError. A server-side termination can also surface as another
    # class (idle-in-transaction timeout is an InternalError) with the connection broken.
    return isinstance(error, psycopg.OperationalError) or conn.broken or conn.closed


class _Source(Protocol):
    async def run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T: ...

    async def close(self) -> None: ...

    def describe(self) -> str: ...


def _check_idle(conn: psycopg.BaseConnection[Any]) -> None:
    if conn.closed:
        raise psycopg.OperationalError("the connection given to PostgresBackend is closed")
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise StoreError(
            "the psycopg connection given to PostgresBackend is inside a transaction: "
            "anarchon's claims would only be savepoints of it. Give anarchon a connection "
            "of its own (or a pool), in autocommit mode or idle between uses."
        )


async def _drive_async(conn: psycopg.AsyncConnection[Any], queries: dict[str, str],
                       steps: Generator[Step, Any, T], settings: dict[str, str] | None) -> T:
    """Run ``steps`` in one transaction; return only once the COMMIT has succeeded.

    ``settings``: the timeouts to set for this transaction (None: the session has them).
    """
    _check_idle(conn)
    try:
        async with conn.transaction():
            cur = conn.cursor()
            if settings is not None:
                await cur.execute(_SETTINGS.format(scope="true"), settings)
            reply: Any = None
            while True:
                try:
                    step = steps.send(reply)
                except StopIteration as done:
                    result: T = done.value
                    break
                await cur.execute(queries[step.query], step.params)
                reply = await cur.fetchall() if step.rows else cur.rowcount
    except psycopg.Error as exc:
        if _transient(exc, conn):
            raise _TransientError(exc) from exc
        raise
    return result


def _drive_sync(conn: psycopg.Connection[Any], queries: dict[str, str],
                steps: Generator[Step, Any, T], settings: dict[str, str]) -> T:
    """The blocking twin of :func:`_drive_async`, for a user's synchronous connection."""
    _check_idle(conn)
    try:
        with conn.transaction():
            cur = conn.cursor()
            cur.execute(_SETTINGS.format(scope="true"), settings)
            reply: Any = None
            while True:
                try:
                    step = steps.send(reply)
                except StopIteration as done:
                    result: T = done.value
                    break
                cur.execute(queries[step.query], step.params)
                reply = cur.fetchall() if step.rows else cur.rowcount
    except psycopg.Error as exc:
        if _transient(exc, conn):
            raise _TransientError(exc) from exc
        raise
    return result


class _OwnedConnection:
    """One connection anarchon opens from a conninfo, re-opens after a drop, and closes."""

    def __init__(self, conninfo: str, settings: dict[str, str]) -> None:
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(
                f"invalid PostgreSQL connection string {_mask_conninfo(conninfo)!r}: {exc}"
            ) from None
        self.conninfo = conninfo
        self.settings = settings
        self.extra: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            self.extra["connect_timeout"] = _DEFAULT_CONNECT_TIMEOUT_S
        if "application_name" not in params:
            self.extra["application_name"] = "anarchon"
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.lock = asyncio.Lock()

    def describe(self) -> str:
        return repr(_mask_conninfo(self.conninfo)) if self.conninfo else "'' (libpq defaults)"

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        try:
            conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.extra)
            try:
                await conn.execute(_SETTINGS.format(scope="false"), self.settings)
            except BaseException:
                await conn.close()
                raise
        except psycopg.OperationalError as exc:
            raise _TransientError(exc) from exc
        logger.debug("connected to %s", self.describe())
        return conn

    async def run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T:
        async with self.lock:
            if self.conn is None or self.conn.closed:
                self.conn = await self._connect()
            conn = self.conn
            try:
                return await _drive_async(conn, queries, steps, None)
            except BaseException:
                # Dropped, or interrupted mid-transaction (cancelled): start afresh.
                if conn.broken or conn.closed or \
                        conn.info.transaction_status != TransactionStatus.IDLE:
                    self.conn = None
                    await conn.close()
                raise

    async def close(self) -> None:
        async with self.lock:
            conn, self.conn = self.conn, None
            if conn is not None:
                await conn.close()


class _UserAsyncConnection:
    def __init__(self, conn: psycopg.AsyncConnection[Any], settings: dict[str, str]) -> None:
        self.conn = conn
        self.settings = settings
        self.lock = asyncio.Lock()

    def describe(self) -> str:
        return "<psycopg.AsyncConnection>"

    async def run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T:
        async with self.lock:
            return await _drive_async(self.conn, queries, steps, self.settings)

    async def close(self) -> None:
        return None


class _UserAsyncPool:
    def __init__(self, pool: AsyncConnectionPool[Any], settings: dict[str, str]) -> None:
        self.pool = pool
        self.settings = settings

    def describe(self) -> str:
        return "<psycopg_pool.AsyncConnectionPool>"

    async def run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T:
        try:
            async with self.pool.connection() as conn:
                return await _drive_async(conn, queries, steps, self.settings)
        except psycopg.OperationalError as exc:  # PoolTimeout: no connection came
            raise _TransientError(exc) from exc

    async def close(self) -> None:
        return None


class _UserSyncConnection:
    def __init__(self, conn: psycopg.Connection[Any], settings: dict[str, str]) -> None:
        self.conn = conn
        self.settings = settings
        self.lock = threading.Lock()

    def describe(self) -> str:
        return "<psycopg.Connection>"

    def _run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T:
        with self.lock:
            return _drive_sync(self.conn, queries, steps, self.settings)

    async def run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T:
        return await asyncio.to_thread(self._run, queries, steps)

    async def close(self) -> None:
        return None


class _UserSyncPool:
    def __init__(self, pool: ConnectionPool[Any], settings: dict[str, str]) -> None:
        self.pool = pool
        self.settings = settings

    def describe(self) -> str:
        return "<psycopg_pool.ConnectionPool>"

    def _run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T:
        try:
            with self.pool.connection() as conn:
                return _drive_sync(conn, queries, steps, self.settings)
        except psycopg.OperationalError as exc:
            raise _TransientError(exc) from exc

    async def run(self, queries: dict[str, str], steps: Generator[Step, Any, T]) -> T:
        return await asyncio.to_thread(self._run, queries, steps)

    async def close(self) -> None:
        return None


def _make_source(connection: object, settings: dict[str, str]) -> _Source:
    if connection is None:
        return _OwnedConnection("", settings)
    if isinstance(connection, str):
        if not connection.strip():
            raise ConfigError("invalid connection '': expected a PostgreSQL URL or conninfo")
        return _OwnedConnection(connection, settings)
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


def _mask_conninfo(conninfo: str) -> str:
    """A URL or ``key=value`` conninfo with any password replaced by ``***``."""
    if "://" in conninfo:
        return mask_url(conninfo)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", conninfo)
