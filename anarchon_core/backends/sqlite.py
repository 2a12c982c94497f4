"""SQLite: the embedded lease backend (no server; several processes on one machine).

Uses the standard library's ``sqlite3`` in WAL mode. Every claim is one ``BEGIN
IMMEDIATE`` transaction, which takes SQLite's write lock first and so serialises claims
across processes; a busy timeout makes concurrent writers wait instead of failing.
All calls run on one worker thread that owns the connection, so the event loop never
blocks on the file. Claims made at the same moment share one transaction (one hop to the
thread, one commit), and so do heartbeats, finishes and releases; each claim is still
decided on its own (:func:`~anarchon_core.backends.sqlstore.claim_batch_steps`).

The store clock is the machine's clock (SQLite's ``julianday('now')``), shared by every
process on the machine, so leases stay correct across processes.

With ``read_only=True`` the file is opened read-only (``mode=ro``): nothing is created,
upgraded or written, and a file or table that does not exist is a :class:`StoreError`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..backend import MAX_NAMESPACES, Backend
from ..decision import HANDED_OVER
from ..errors import ConfigError, StoreError, StoreNotSetUp
from ..models import ClaimRequest, ClaimResult, ExpiredRun, HistoryQuery, Run, RunPage, RunRef
from ..readmodel import dump_meta
from ..schema import sql_names, sql_schema, sql_upgrade
from ..transactional import SqlStatement
from ..url import mask_url, split_namespace_params
from .common import missing_store, parse_flag, refuse_write
from .sqlstore import (
    MAX_YIELDS,
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
from .storeerrors import STORE, TRANSIENT, Kind, StoreErrors

__all__ = ["SqliteBackend"]

T = TypeVar("T")
_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
#: The shortest lock wait a lease can shrink the busy timeout to.
_MIN_BUSY_MS = 1_000
#: Most calls one transaction serves (a batch of claims, or of heartbeats and finishes).
MAX_BATCH = 256


def _classify(exc: BaseException) -> Kind:
    """SQLite's error table.

    A busy or locked database is transient (another process held the write lock longer
    than the busy timeout); other database errors, and a value the file cannot hold, are
    the store's; misuse of the driver is not a store error.
    """
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return TRANSIENT if "locked" in text or "busy" in text else STORE
    if isinstance(exc, sqlite3.ProgrammingError | sqlite3.InterfaceError):
        return None
    if isinstance(exc, sqlite3.Error | OverflowError):
        return STORE
    return None


class SqliteBackend(Backend):
    """Lease backend on a SQLite file.

    :param path: the database file (created if missing), default ``"anarchon.db"``.
    :param table: the runs table, default ``"anarchon_runs"`` (its namespace); a
        ``<table>_meta`` table beside it holds the format record.
    :param busy_timeout_ms: how long a writer waits for another process's lock.
    :param read_only: open the file read-only: read history, create and write nothing
        (every write raises :class:`~anarchon_core.errors.ReadOnlyError`).
    """

    def __init__(
        self, path: str | Path = "anarchon.db", *, table: str = "anarchon_runs",
        busy_timeout_ms: int = 30_000, read_only: bool = False,
    ) -> None:
        if not isinstance(path, str | Path) or not str(path):
            raise ConfigError(f"invalid SQLite path {path!r}: expected a file path")
        self._names = sql_names("sqlite", table)
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int) or \
                busy_timeout_ms < 0:
            raise ConfigError(f"invalid busy_timeout_ms {busy_timeout_ms!r}: expected an int ≥ 0")
        self.path = str(path)
        self.table = table
        self.busy_timeout_ms = busy_timeout_ms
        self._lease_ms: int | None = None
        self._errors = StoreErrors(self.describe, _classify)
        self.read_only = parse_flag("read_only", read_only)
        self._queries = self._render(has_meta=True)
        #: The ``finish`` statement for a caller's own connection (made when first asked for).
        self._in_caller_sql: str | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        # One transaction at a time: the worker thread owns the one connection.
        self._claims: Batched[ClaimRequest, ClaimResult] = Batched(
            self._claim_many, max_batch=MAX_BATCH, max_in_flight=1)
        self._updates: Batched[Update, bool] = Batched(
            self._update_many, max_batch=MAX_BATCH, max_in_flight=1)

    def _render(self, *, has_meta: bool, placeholder: str = ":{}") -> SqlQueries:
        return SqlQueries.render(
            runs=self._names.runs, meta=self._names.meta, now=_NOW_MS, placeholder=placeholder,
            # BEGIN IMMEDIATE already holds the database's write lock.
            lock_job="SELECT :lock_key", lock_jobs="SELECT 1", has_meta=has_meta,
            slot_keys="(SELECT json_extract(value, '$[0]') AS job, "
                      "json_extract(value, '$[1]') AS slot FROM json_each(:keys)) AS k",
        )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqliteBackend:
        """``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

        ``?table=`` and ``?read_only=true`` are allowed; keyword ``options`` override them.
        """
        rest, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"table", "read_only"})
        if "?" in rest:  # SQLite takes no other parameter
            unknown.append(rest.split("?", 1)[1].split("=", 1)[0])
        if unknown:
            raise ConfigError(f"invalid SQLite URL {mask_url(url)!r}: unknown parameter "
                              f"{unknown[0]!r}")
        return cls(_sqlite_path(url), **{**params, **options})

    def describe(self) -> str:
        """E.g. ``SqliteBackend(path='cron.db', table='anarchon_runs')``."""
        return f"SqliteBackend(path={self.path!r}, table={self.table!r})"

    def tune_timeouts(self, lease_ms: int) -> None:
        """Wait at most half the lease (at least 1 s) for another process's write lock.

        A claim or heartbeat that waited longer could no longer save its lease; it fails
        with :class:`~anarchon_core.errors.StoreUnavailable` and the scheduler retries.
        The shortest lease wins; ``busy_timeout_ms`` stays the upper bound.
        """
        self._lease_ms = lease_ms if self._lease_ms is None else min(self._lease_ms, lease_ms)
        if self._conn is not None and self._executor is not None:
            busy = self._busy_ms
            self._executor.submit(self._set_busy, busy)

    def _set_busy(self, busy_ms: int) -> None:
        if self._conn is not None:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")

    @property
    def _busy_ms(self) -> int:
        if self._lease_ms is None:
            return self.busy_timeout_ms
        return min(self.busy_timeout_ms, max(_MIN_BUSY_MS, self._lease_ms // 2))

    async def _call(self, fn: Callable[[sqlite3.Connection], T], what: str = "call") -> T:
        if self._executor is None:
            await self.start()
        return await self._on_worker(fn, what)

    async def _on_worker(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """``fn(connection)`` on the worker thread (started if need be; no :meth:`start`)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="anarchon-sqlite")
        loop = asyncio.get_running_loop()
        with self._errors.guard(what):
            return await loop.run_in_executor(self._executor, self._with_conn, fn)

    def _with_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            folder = Path(self.path).resolve().parent
            if not folder.is_dir():
                raise StoreError(f"{self.describe()}: cannot open {self.path!r}: the folder "
                                 f"{str(folder)!r} does not exist")
            if self.read_only:
                conn = self._open_read_only()
            else:
                busy = self._busy_ms
                conn = sqlite3.connect(self.path, timeout=busy / 1000, isolation_level=None)
                try:
                    conn.execute(f"PRAGMA busy_timeout = {int(busy)}")
                    _switch_to_wal(conn, busy)
                    conn.execute("PRAGMA synchronous = NORMAL")
                except BaseException:
                    conn.close()
                    raise
            self._conn = conn
        return fn(self._conn)

    def _open_read_only(self) -> sqlite3.Connection:
        if not Path(self.path).is_file():  # removed since start() looked
            raise StoreNotSetUp(f"no anarchon store in {self.describe()}: the file does not "
                                "exist, so it was never set up there", namespace=self.path)
        uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout_ms / 1000,
                               isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        return conn

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
                for statement in sql_schema("sqlite", self.table):
                    conn.execute(statement)
                if "meta" not in self._columns(conn):
                    for statement in sql_upgrade("sqlite", self.table, ("meta",)):
                        conn.execute(statement)
                check_format(conn.execute(q["read_format"]).fetchall())
            self._transaction(conn, body)

        def check(conn: sqlite3.Connection) -> bool:
            columns = self._columns(conn)
            found = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
                (self.table, f"{self.table}_meta"))}
            if self.table not in found:
                return False
            if f"{self.table}_meta" in found:
                check_format(conn.execute(q["read_format"]).fetchall())
            if "meta" not in columns:
                self._queries = self._render(has_meta=False)
            return True

        if not self.read_only:
            await self._call(setup)
        elif not await asyncio.to_thread(Path(self.path).is_file):
            raise await missing_store(self, "path", self.path,
                                      f"the file {self.path!r} does not exist")
        elif not await self._call(check):
            raise await missing_store(self, "table", self.table,
                                      f"table {self.table!r} does not exist")

    async def namespaces(self) -> list[str] | None:
        """The tables of the file that have an anarchon format record (None: no file).

        Reads only, and never creates the file.
        """
        if not await asyncio.to_thread(Path(self.path).is_file):
            return None

        def find(conn: sqlite3.Connection) -> list[str]:
            tables = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            found: list[str] = []
            for meta in sorted(t for t in tables if t.endswith("_meta")):
                if meta[:-len("_meta")] not in tables:
                    continue
                quoted = '"' + meta.replace('"', '""') + '"'
                try:
                    row = conn.execute(f"SELECT 1 FROM {quoted} WHERE name = 'format'"
                                       ).fetchone()
                except sqlite3.Error:  # a table of the same name that is not ours
                    continue
                if row is not None:
                    found.append(meta[:-len("_meta")])
                if len(found) == MAX_NAMESPACES:
                    break
            return found

        # Not _call(): its start() would refuse a read-only backend whose table is missing.
        return await self._on_worker(find, "namespaces")

    def _columns(self, conn: sqlite3.Connection) -> set[str]:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({self._names.runs})")}

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

    def _drive(self, conn: sqlite3.Connection, steps: Steps[T]) -> T:
        """Run the steps in order (a list of steps too, one after another)."""
        reply: Any = None
        for _ in range(MAX_YIELDS):
            try:
                item = steps.send(reply)
            except StopIteration as done:
                result: T = done.value
                return result
            if isinstance(item, Step):
                reply = self._execute(conn, item)
            else:
                reply = [self._execute(conn, step) for step in item]
        raise RuntimeError(f"a transaction yielded more than {MAX_YIELDS} times")

    def _execute(self, conn: sqlite3.Connection, step: Step) -> Any:
        cursor = conn.execute(self._queries[step.query], step.params)
        return cursor.fetchall() if step.rows else cursor.rowcount

    async def _read(self, steps: Callable[[], Steps[T]]) -> T:
        """Run read steps in one (deferred) transaction: one snapshot of the file."""
        def read(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN")
            try:
                return self._drive(conn, steps())
            finally:
                conn.execute("COMMIT")
        return await self._call(read)

    async def clock_ms(self) -> int:
        """The machine clock as SQLite reads it."""
        rows = await self._call(lambda c: c.execute(self._queries["now"]).fetchall())
        return int(rows[0][0])

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Apply the lease decision table in a ``BEGIN IMMEDIATE`` transaction.

        Claims made at the same moment share the transaction (see the module docstring).
        """
        refuse_write(self, "claim")
        return await self._claims.call(request)

    def _write(self, steps: Callable[[], Steps[T]], what: str) -> Awaitable[T]:
        """Run ``steps`` as one ``BEGIN IMMEDIATE`` transaction on the worker thread."""
        return self._call(lambda c: self._transaction(c, lambda: self._drive(c, steps())),
                          what)

    async def _claim_many(self, requests: list[ClaimRequest]) -> Answers[ClaimResult]:
        retention = self.retention
        return await run_rounds(
            requests, lambda r: r.job,
            lambda group: self._write(lambda: claim_batch_steps(group, retention), "claim"))

    async def _update_many(self, updates: list[Update]) -> Answers[bool]:
        return await run_rounds(
            updates, lambda u: u.attempt_key,
            lambda group: self._write(lambda: update_batch_steps(group),
                                      "/".join(sorted({u.query for u in group}))))

    async def _update(self, query: str, ref: RunRef, params: dict[str, Any]) -> bool:
        refuse_write(self, query)
        return await self._updates.call(Update(query, ref, params))

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease if ``ref`` is still the current attempt."""
        return await self._update("heartbeat", ref, {**ref_params(ref), "lease_ms": lease_ms})

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the end of the attempt if ``ref`` is still the current attempt."""
        return await self._update("finish", ref, {**ref_params(ref), "status": status,
                                                  "error": error, "meta": dump_meta(meta)})

    async def release(self, ref: RunRef) -> bool:
        """Expire the lease now so a backup takes over at once."""
        return await self._update("release", ref,
                                  {**ref_params(ref), "handed_over": HANDED_OVER})

    def finish_statement(self, ref: RunRef, status: str, error: str | None = None,
                         meta: Mapping[str, str] | None = None) -> SqlStatement:
        """:meth:`finish` for a transaction of the caller's own connection to this file.

        See :mod:`anarchon_core.transactional`; the caller's write lock on the file keeps
        every claim out until its transaction ends.
        """
        refuse_write(self, "finish")
        text = self._in_caller_sql
        if text is None:
            text = self._in_caller_sql = self._render(
                has_meta=True, placeholder="%({})s")["finish"]
        return SqlStatement(text, finish_params(ref, status, error, meta), "sqlite")

    async def add_meta(self, ref: RunRef, meta: Mapping[str, str]) -> bool:
        """Merge ``meta`` into an ended attempt's stored meta, in one transaction."""
        refuse_write(self, "add_meta")
        return await self._write(lambda: add_meta_steps(ref, meta), "add meta")

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first."""
        return await self._read(lambda: history_steps(job, limit))

    async def expired_runs(self, job: str, limit: int = 100) -> list[ExpiredRun]:
        """Runs of ``job`` still running whose lease expired (at most ``limit``).

        One query on the partial index of running rows.
        """
        return await self._read(lambda: expired_steps(job, limit))

    async def runs(self, query: HistoryQuery) -> RunPage:
        """One page of the table's history, newest first (keyset pagination)."""
        return await self._read(lambda: runs_steps(query))

    async def job_names(self) -> dict[str, Run | None]:
        """Every job in the table with its newest attempt."""
        return await self._read(job_names_steps)

    async def newest_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """The newest scheduled slot of each job, in one read transaction."""
        return await self._read(lambda: newest_slots_steps(jobs))

    async def slot_states(self, slots: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], str] | None:
        """The newest attempt's status of each scheduled slot on record, in one read."""
        if not slots:
            return {}
        return await self._read(lambda: slot_states_steps(slots))

    async def write_control(self, name: str, value: str | None) -> None:
        """Set or delete a control record (a ``control:`` row of the meta table)."""
        refuse_write(self, "write_control")
        await self._write(lambda: control_write_steps(name, value), "control write")

    async def read_controls(self, prefix: str) -> dict[str, str]:
        """The control records whose name starts with ``prefix``."""
        return await self._read(lambda: control_read_steps(prefix))


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
