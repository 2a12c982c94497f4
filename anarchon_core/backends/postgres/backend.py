"""PostgreSQL: the lease backend on a shared database (psycopg 3).

Runs are stored one row per attempt, exactly as :mod:`anarchon_core.backends.sqlstore` lays them
out, with that module's statements. What is specific to PostgreSQL is how they are run:

* claims of one job are serialised by a transaction-scoped advisory lock on (table, job),
  so reading a run's state and writing the decision cannot interleave with another
  instance's claim of the same job. A claim that may take a run over reads it
  ``FOR UPDATE``, so a heartbeat, finish or release of that attempt (a conditional
  ``UPDATE`` of its row, which takes no job lock) either lands first or finds itself fenced;
* a claim is one round trip: the session's own temporary function applies the decision
  table on the server (:mod:`anarchon_core.backends.pgfunctions`), a heartbeat, finish or
  release is one statement. Claims made at the same moment share one call of the function
  (the locks of all their jobs taken in one fixed order, then each claim decided on its
  own), and heartbeats, finishes and releases one call of another. With
  ``transaction_pooling=True``, or for a role that may not create temporary functions, a
  claim runs :mod:`sqlstore`'s steps instead (the decision in Python): two round trips,
  statements that need no result of each other sent together as one message;
* times come from the server clock (``clock_timestamp()``), never from the instances;
* anarchon's sessions run with ``lock_timeout``, ``statement_timeout`` and
  ``idle_in_transaction_session_timeout`` (set on the connection anarchon opens, local to
  each transaction on a connection or pool of yours): an instance frozen in the middle of
  a claim (SIGSTOP, a long GC pause) cannot hold the job's lock for longer than that;
* errors are classified once, here: a dropped or refused connection, a timeout, a lock
  not granted in time, a server shutting down, a serialization failure (every
  :class:`psycopg.OperationalError`, and any error that left the connection broken) raise
  :class:`~anarchon_core.errors.StoreUnavailable`, which the scheduler retries; other
  database errors raise :class:`~anarchon_core.errors.StoreError`. Nothing is retried
  inside the backend: the scheduler has the one retry policy. A dead connection of
  anarchon's own is re-opened on the next call. A claim reports ``won`` only after its
  ``COMMIT`` succeeded; a claim retried with the same token after its answer was lost is
  answered ``won`` again (the decision table knows its own token), and a ``finish``
  retried after a lost answer finds its own result;
* anarchon's own connection has a connect timeout, TCP keepalives, ``tcp_user_timeout``
  and a bound on each transaction, all fitted to the lease
  (:meth:`PostgresBackend.tune_timeouts`): a server that accepts connections but never
  answers makes ``start()`` fail within :attr:`PostgresBackend.connect_bound_s` (6 s by
  default, 3 s to 6 s when fitted to a lease).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Union

import psycopg
from psycopg import sql

from ...backend import MAX_NAMESPACES, Backend
from ...decision import HANDED_OVER
from ...errors import ConfigError, StoreError, StoreUnavailable
from ...models import ClaimRequest, ClaimResult, ExpiredRun, HistoryQuery, Run, RunPage, RunRef
from ...readmodel import dump_meta
from ...schema import sql_names, sql_schema, sql_upgrade
from ...transactional import SqlStatement
from ...url import NAMESPACE_PARAMS, mask_url, split_namespace_params
from ..common import missing_store, parse_flag, refuse_write
from ..pgfunctions import (
    claim_call,
    claim_call_steps,
    claim_function,
    claim_one_call,
    claim_one_function,
    function_name,
    update_call,
    update_call_steps,
    update_function,
)
from ..sqlstore import (
    Answers,
    Batched,
    SqlQueries,
    Step,
    Steps,
    Update,
    add_meta_steps,
    check_format,
    claim_batch_steps,
    control_read_steps,
    control_write_steps,
    expired_steps,
    finish_params,
    history_steps,
    job_names_steps,
    newest_slots_steps,
    ref_params,
    run_rounds,
    runs_steps,
    slot_states_steps,
    update_batch_steps,
)
from ..storeerrors import STORE, TRANSIENT, Kind, StoreErrors

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .connections import OwnedConnection, make_source
from .driver import FunctionVanished

__all__ = ["MAX_BATCH", "MAX_VANISHED", "PostgresBackend"]

logger = logging.getLogger("anarchon.postgres")

T = TypeVar("T")
#: A transaction written as steps (see :mod:`anarchon_core.backends.sqlstore`); made fresh per try.
Work = Callable[[], Steps[T]]
Connection = Union[
    str, "psycopg.AsyncConnection[Any]", "psycopg.Connection[Any]",
    "AsyncConnectionPool[Any]", "ConnectionPool[Any]",
]

# Whole milliseconds since the epoch by the server clock. No "::" cast: sqlstore turns
# ":name" into placeholders.
_NOW_MS = "CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT)"
# The anarchon tables of the database: ``<t>`` beside a readable ``<t>_meta`` (a text
# ``name`` column) that holds a ``format`` row. The CASE runs the per-table query only on
# tables known to be readable; query_to_xml runs it inside this one statement.
_NAMESPACES = """
SELECT n.nspname, r.relname, pg_table_is_visible(r.oid)
FROM pg_class m
JOIN pg_namespace n ON n.oid = m.relnamespace
JOIN pg_class r ON r.relnamespace = m.relnamespace AND r.relkind IN ('r', 'p')
    AND m.relname = r.relname || '_meta'
WHERE m.relkind IN ('r', 'p') AND right(m.relname, 5) = '_meta'
    AND n.nspname <> 'information_schema' AND left(n.nspname, 3) <> 'pg_'
    AND CASE WHEN has_table_privilege(m.oid, 'SELECT') AND EXISTS (
            SELECT 1 FROM pg_attribute a WHERE a.attrelid = m.oid AND a.attname = 'name'
            AND a.atttypid = CAST('text' AS regtype) AND NOT a.attisdropped)
        THEN CAST(query_to_xml('SELECT 1 FROM ' || quote_ident(n.nspname) || '.'
                               || quote_ident(m.relname) || ' WHERE name = ''format''',
                               false, true, '') AS text) <> ''
        ELSE false END
ORDER BY 3 DESC, 1, 2
LIMIT %(limit)s
"""
#: Most calls one transaction serves (a batch of claims, or of heartbeats and finishes).
MAX_BATCH = 128
#: After this many calls found the session functions gone, claims stop using them.
MAX_VANISHED = 3


def _classify(exc: BaseException) -> Kind:
    """PostgreSQL's error table.

    Every :class:`psycopg.OperationalError` is transient: connection refused, reset or
    closed, a timeout, DNS, ``admin_shutdown`` and the other connection-class errors, a
    lock not granted within ``lock_timeout``, a serialization failure or deadlock, a pool
    that gave no connection in time. Other database errors are the store's. Anything else
    is not a store error.
    """
    if isinstance(exc, psycopg.OperationalError):
        return TRANSIENT
    if isinstance(exc, psycopg.Error):
        return STORE
    return None


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
    :param timeout_ms: bound on how long one statement runs or waits for a lock, and on how
        long a transaction may sit idle (a frozen client) before the server ends it.
    :param read_only: read history only: create, upgrade and write nothing (a role with
        ``SELECT`` on the two tables is enough); every write raises
        :class:`~anarchon_core.errors.ReadOnlyError`.
    :param transaction_pooling: ``True`` behind a proxy that gives each transaction another
        server session (PgBouncer in transaction mode): anarchon then keeps nothing in a
        session (no temporary functions, no prepared statements, its timeouts set per
        transaction) and a claim takes two round trips. By default a claim is one round
        trip, through the session's own temporary functions
        (:mod:`~anarchon_core.backends.pgfunctions`); a role without the ``TEMPORARY``
        right, or a session that keeps losing them, falls back by itself, with a warning.
    """

    def __init__(
        self, connection: Connection | None = None, *,
        table: str = "anarchon_runs", timeout_ms: int = 5_000,
        read_only: bool = False, transaction_pooling: bool = False,
    ) -> None:
        names = sql_names("postgresql", table)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
            raise ConfigError(f"invalid timeout_ms {timeout_ms!r}: expected an int ≥ 1")
        self.table = table
        self.timeout_ms = timeout_ms
        self._errors = StoreErrors(self.describe, _classify)
        #: Tokens whose finish failed transiently: it may have committed before the answer
        #: was lost, so the next finish with the token first looks for its own result.
        self._uncertain: set[str] = set()
        self.read_only = parse_flag("read_only", read_only)
        self._schema = names.schema
        self._names = names
        # A lock wait reports itself as such (LockNotAvailable), before the statement limit.
        settings = {"timeout": str(timeout_ms), "statement_timeout": str(2 * timeout_ms)}
        self.transaction_pooling = parse_flag("transaction_pooling", transaction_pooling)
        self._source = make_source(connection, settings, self.transaction_pooling)
        self._sql = self._build_sql(has_meta=True)
        #: Claims and lease updates call session functions (False once the role was refused
        #: creating them, or they kept vanishing).
        self._functions = not self.transaction_pooling
        self._vanished = 0
        self._started = False
        # As many batches in flight as transactions the source runs at once.
        self._claims: Batched[ClaimRequest, ClaimResult] = Batched(
            self._claim_many, max_batch=MAX_BATCH, max_in_flight=self._source.parallel)
        self._updates: Batched[Update, bool] = Batched(
            self._update_many, max_batch=MAX_BATCH, max_in_flight=self._source.parallel)

    def _build_sql(self, *, has_meta: bool) -> dict[str, str]:
        runs, meta = self._names.runs, self._names.meta
        queries = self._render(placeholder="%({})s", has_meta=has_meta)
        # The claim's read of the run takes its row lock: a heartbeat, finish or release of
        # that attempt waits for the claim (they take no job lock of their own).
        current_locked = queries["current"] + " FOR UPDATE"
        # The same statements with PL/pgSQL variables, for the session's claim function.
        in_function = {**self._render(placeholder="v_{}", has_meta=has_meta).text}
        in_function["current_locked"] = in_function["current"] + " FOR UPDATE"
        function = function_name(runs)
        create_function = claim_function(function, in_function, _NOW_MS)
        lone = function_name(runs, "claim_one")
        updater = function_name(runs, "update")
        return {
            **queries.text,
            "current": current_locked,
            "claim_call": claim_call(function),
            # Sent as is (never through mogrify) before the first claim call of a session.
            "create:claim_call": create_function,
            "claim_one_call": claim_one_call(lone),
            "create:claim_one_call": claim_one_function(lone, in_function, _NOW_MS),
            "update_call": update_call(updater),
            "create:update_call": update_function(updater, in_function),
            "ddl_lock": "SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))",
            "exists": sql.SQL(
                "SELECT to_regclass({}) IS NOT NULL, to_regclass({}) IS NOT NULL"
            ).format(sql.Literal(runs), sql.Literal(meta)).as_string(),
            "has_meta": sql.SQL(
                "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass({}) "
                "AND attname = 'meta' AND NOT attisdropped"
            ).format(sql.Literal(runs)).as_string(),
            "schema_exists": "SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s",
            "namespaces": _NAMESPACES,
            "create_schema": sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(self._schema or "public")).as_string(),
            **{f"schema_{i}": statement for i, statement in
               enumerate(sql_schema("postgresql", self.table, create_schema=False))},
            **{f"upgrade_{i}": statement for i, statement in
               enumerate(sql_upgrade("postgresql", self.table))},
        }

    def _render(self, *, placeholder: str, has_meta: bool) -> SqlQueries:
        runs, meta = self._names.runs, self._names.meta
        # Keyed on the table's oid: one key per table whatever name or search_path reached it.
        key = sql.SQL("hashtextextended({}, CAST(CAST(CAST({} AS regclass) AS oid) AS BIGINT))")
        return SqlQueries.render(
            runs=runs, meta=meta, now=_NOW_MS, placeholder=placeholder, has_meta=has_meta,
            lock_job=sql.SQL("SELECT pg_advisory_xact_lock({})").format(
                key.format(sql.SQL(":lock_key"), sql.Literal(runs))).as_string(),
            # Sorted by the key itself: every transaction takes its locks in one order.
            # The ORDER BY and DISTINCT keep the subquery apart, so the locks are taken
            # row by row in that order.
            lock_jobs=sql.SQL(
                "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT {} AS k "
                "FROM unnest(CAST(:lock_keys AS TEXT[])) AS j ORDER BY k) AS keys"
            ).format(key.format(sql.SQL("j"), sql.Literal(runs))).as_string(),
            slot_keys="(SELECT value->>0 AS job, CAST(value->>1 AS BIGINT) AS slot "
                      "FROM json_array_elements(CAST(:keys AS json))) AS k",
        )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """``postgresql://user:password@host:5432/db?table=shipping.cron_runs``.

        ``table``, ``read_only`` and ``transaction_pooling`` are read out of the query
        string; the other parameters
        go to libpq (``sslmode``, ``application_name``...). Keyword ``options`` override
        the URL.
        """
        _, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"table", "read_only", "transaction_pooling"})
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
        """Run ``work`` as one transaction; driver errors become StoreUnavailable/StoreError.

        Nothing is retried here: the scheduler retries a :class:`StoreUnavailable`, and
        its next call opens a new connection if this one dropped.
        """
        with self._errors.guard(what):
            return await self._source.run(self._sql, work())

    @property
    def connect_bound_s(self) -> float:
        """How long a call waits at most for anarchon's own connection to be opened.

        0 for a connection or pool of yours (its own settings apply).
        """
        source = self._source
        return source.connect_bound_s if isinstance(source, OwnedConnection) else 0.0

    def tune_timeouts(self, lease_ms: int) -> None:
        """Fit anarchon's own connection to ``lease_ms`` (the shortest lease wins).

        ``connect_timeout`` a third of the lease (2 s to 5 s; the whole connect, with the
        session settings, is bounded by it + 1 s), TCP keepalives (idle a third of the
        lease, at most 10 s; probes every sixth, at most 5 s; 3 probes),
        ``tcp_user_timeout`` half the lease (1 s to 15 s) and each transaction bounded by
        the lease (at most ``2 * timeout_ms + 1 s``). Values in the conninfo win. A
        connection or pool of yours is left as it is. Applies from the next connection.
        """
        if isinstance(self._source, OwnedConnection):
            self._source.tune(lease_ms)

    async def expired_runs(self, job: str, limit: int = 100) -> list[ExpiredRun]:
        """Runs of ``job`` still running whose lease expired by the server clock.

        One query on the partial index of running rows, at most ``limit`` rows.
        """
        await self._ensure_started()
        return await self._run(lambda: expired_steps(job, limit), what="expired runs read")

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.start()

    async def start(self) -> None:
        """Create the schema, tables and index if missing; check the store format.

        Several instances may start at once: creation is serialised by an advisory lock
        on the table name. When both tables already exist nothing is created, so an
        application role with only read/write rights on them is enough. A table of an
        earlier release gets the ``meta`` column (``ALTER TABLE``); a role that may not
        alter it runs on without storing meta, with a warning. With ``read_only`` nothing
        is created or changed, and a missing table is a :class:`StoreError`.
        """
        schema, qualified, n_schema = self._schema, self.table, \
            len(sql_schema("postgresql", self.table, create_schema=False))
        read_only = self.read_only

        def setup() -> Generator[Step, Any, bool | None]:
            runs_exist, meta_exists = (yield Step("exists", {}))[0]
            if read_only:
                if not runs_exist:
                    return None
                if meta_exists:
                    check_format((yield Step("read_format", {})))
                return bool((yield Step("has_meta", {})))
            if not (runs_exist and meta_exists):
                yield Step("ddl_lock", {"key": f"anarchon:create:{qualified}"})
                if schema is not None and not (yield Step("schema_exists",
                                                          {"schema": schema})):
                    yield Step("create_schema", {}, rows=False)
                for i in range(n_schema - 1):
                    yield Step(f"schema_{i}", {}, rows=False)
            yield Step(f"schema_{n_schema - 1}", {}, rows=False)  # the format record
            check_format((yield Step("read_format", {})))
            return bool((yield Step("has_meta", {})))

        has_meta = await self._run(setup, what="start")
        if has_meta is None:
            raise await missing_store(self, "table", qualified,
                                      f"table {qualified!r} does not exist")
        if not has_meta and not read_only:
            has_meta = await self._add_meta_column()
        if not has_meta:
            self._sql = self._build_sql(has_meta=False)
        self._started = True

    async def namespaces(self) -> list[str] | None:
        """The tables of the database that have an anarchon format record, in one query.

        A table on the ``search_path`` is named as it is, others with their schema; tables
        this role may not read are left out. Reads only.
        """
        def find() -> Generator[Step, Any, list[str]]:
            rows = yield Step("namespaces", {"limit": MAX_NAMESPACES})
            return [str(name) if visible else f"{schema}.{name}"
                    for schema, name, visible in rows]

        return await self._run(find, what="namespace list")

    async def _add_meta_column(self) -> bool:
        """Give a table of an earlier release the ``meta`` column; False if not allowed."""
        def upgrade() -> Generator[Step, Any, None]:
            yield Step("ddl_lock", {"key": f"anarchon:create:{self.table}"})
            yield Step("upgrade_0", {}, rows=False)

        try:
            await self._run(upgrade, what="upgrade")
        except (psycopg.errors.InsufficientPrivilege, StoreError) as exc:
            cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
            if not isinstance(cause, psycopg.errors.InsufficientPrivilege):
                raise
            logger.warning(
                "%s: this role may not add the meta column to %s, so Run.meta is not "
                "stored; run as the table's owner: %s", self.describe(), self.table,
                sql_upgrade("postgresql", self.table)[0])
            return False
        logger.info("%s: added the meta column to %s", self.describe(), self.table)
        return True

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
        """Apply the lease decision table in one transaction (see the module docstring).

        Claims made at the same moment share the transaction, each decided on its own.
        """
        refuse_write(self, "claim")
        await self._ensure_started()
        return await self._claims.call(request)

    async def _claim_many(self, requests: list[ClaimRequest]) -> Answers[ClaimResult]:
        return await run_rounds(requests, lambda r: r.job, self._claim_group)

    async def _claim_group(self, group: list[ClaimRequest]) -> list[ClaimResult]:
        """Claims of distinct jobs in one transaction: one call of the claim function."""
        retention = self.retention
        return await self._with_functions(lambda: claim_call_steps(group, retention),
                                          lambda: claim_batch_steps(group, retention), "claim")

    async def _with_functions(self, work: Work[T], fallback: Work[T], what: str) -> T:
        """``work`` (calls of the session functions), or ``fallback`` without them.

        A role that may not create them (no ``TEMPORARY`` right on the database) runs
        ``fallback`` from then on (a claim takes two round trips), with one warning.
        """
        if not self._functions:
            return await self._run(fallback, what=what)
        try:
            return await self._run(work, what=what)
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, FunctionVanished):
                self._vanished += 1
                if self._vanished >= MAX_VANISHED and self._functions:
                    self._functions = False
                    logger.warning(
                        "%s: the session's temporary functions vanished %d times (a proxy "
                        "that changes the server session, such as PgBouncer in transaction "
                        "mode?), so each claim takes two round trips from now on; say "
                        "transaction_pooling=True", self.describe(), self._vanished)
            raise
        except StoreError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
                raise
            result = await self._run(fallback, what=what)
            if self._functions:
                self._functions = False
                logger.warning(
                    "%s: this role may not create temporary functions (%s), so each "
                    "claim takes two round trips; grant it TEMPORARY on the database",
                    self.describe(), exc.__cause__)
            return result

    async def _update(self, query: str, ref: RunRef, params: dict[str, Any]) -> bool:
        refuse_write(self, query)
        await self._ensure_started()
        recheck = query == "finish" and ref.token in self._uncertain
        return await self._updates.call(Update(query, ref, params, recheck))

    async def _update_many(self, updates: list[Update]) -> Answers[bool]:
        answers = await run_rounds(updates, lambda u: u.attempt_key, self._update_group)
        for update, answer in zip(updates, answers, strict=True):
            if update.query != "finish":
                continue
            if isinstance(answer, StoreUnavailable):
                # It may have committed before the answer was lost: the next finish with
                # this token first looks for its own result.
                if len(self._uncertain) >= 10_000:
                    self._uncertain.clear()
                self._uncertain.add(update.ref.token)
            elif not isinstance(answer, BaseException):
                self._uncertain.discard(update.ref.token)
        return answers

    async def _update_group(self, group: list[Update]) -> list[bool]:
        """Updates of distinct attempts in one transaction.

        A lone one is its own statement; more are one call of the update function (a
        batch with a finish to recheck reads that attempt first, in two round trips).
        """
        what = "/".join(sorted({u.query for u in group}))
        fallback: Work[list[bool]] = lambda: update_batch_steps(group, lock=False)  # noqa: E731
        if len(group) == 1 or any(u.recheck for u in group):
            return await self._run(fallback, what=what)
        return await self._with_functions(lambda: update_call_steps(group), fallback, what)

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease to server-now + ``lease_ms`` if ``ref`` is the current attempt."""
        return await self._update("heartbeat", ref, {**ref_params(ref), "lease_ms": lease_ms})

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the end of the attempt if ``ref`` is still the current attempt."""
        return await self._update("finish", ref, {**ref_params(ref), "status": status,
                                                  "error": error, "meta": dump_meta(meta)})

    async def release(self, ref: RunRef) -> bool:
        """Expire the lease now so a backup takes over at once."""
        return await self._update("release", ref, {**ref_params(ref),
                                                   "handed_over": HANDED_OVER})

    def finish_statement(self, ref: RunRef, status: str, error: str | None = None,
                         meta: Mapping[str, str] | None = None) -> SqlStatement:
        """:meth:`finish` for a transaction of the caller's own connection to this database.

        See :mod:`anarchon_core.transactional`: its ``UPDATE`` locks the attempt's row,
        and a claim reads that row ``FOR UPDATE``, so a backup waits for the caller's
        transaction and then sees the run ended.
        """
        refuse_write(self, "finish")
        return SqlStatement(self._sql["finish"], finish_params(ref, status, error, meta),
                            "postgresql")

    async def add_meta(self, ref: RunRef, meta: Mapping[str, str]) -> bool:
        """Merge ``meta`` into an ended attempt's stored meta, in one transaction."""
        refuse_write(self, "add_meta")
        await self._ensure_started()
        return await self._run(lambda: add_meta_steps(ref, meta), what="add meta")

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first."""
        await self._ensure_started()
        return await self._run(lambda: history_steps(job, limit), what="history read")

    async def runs(self, query: HistoryQuery) -> RunPage:
        """One page of the table's history, newest first (keyset pagination)."""
        await self._ensure_started()
        return await self._run(lambda: runs_steps(query), what="history read")

    async def job_names(self) -> dict[str, Run | None]:
        """Every job in the table with its newest attempt."""
        await self._ensure_started()
        return await self._run(job_names_steps, what="job list read")

    async def newest_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """The newest scheduled slot of each job, in one transaction."""
        await self._ensure_started()
        return await self._run(lambda: newest_slots_steps(jobs), what="newest slots read")

    async def slot_states(self, slots: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], str] | None:
        """The newest attempt's status of each scheduled slot on record, in one statement."""
        if not slots:
            return {}
        await self._ensure_started()
        return await self._run(lambda: slot_states_steps(slots), what="slot states read")

    async def write_control(self, name: str, value: str | None) -> None:
        """Set or delete a control record (a ``control:`` row of the meta table)."""
        refuse_write(self, "write_control")
        await self._ensure_started()
        await self._run(lambda: control_write_steps(name, value), what="control write")

    async def read_controls(self, prefix: str) -> dict[str, str]:
        """The control records whose name starts with ``prefix``."""
        await self._ensure_started()
        return await self._run(lambda: control_read_steps(prefix), what="control read")


def _strip_params(url: str, names: tuple[str, ...]) -> str:
    """Remove the query parameters ``names`` from ``url``, leaving the others byte for byte.

    (Re-encoding them would turn spaces into ``+``, which libpq does not decode.)
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url
    kept = [p for p in query.split("&") if p and p.split("=", 1)[0] not in names]
    return f"{base}?{'&'.join(kept)}" if kept else base


