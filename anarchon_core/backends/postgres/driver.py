"""Driving one transaction of SQL steps on one psycopg connection.

The steps of :mod:`~anarchon_core.backends.sqlstore` go out in as few round trips as
psycopg allows, with the session functions (:mod:`~anarchon_core.backends.pgfunctions`)
created where they are missing.

Free of connection management: :mod:`.connections` hands it a connection.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from ...errors import StoreError
from ..sqlstore import (
    MAX_YIELDS,
    Last,
    Step,
    Steps,
)

__all__ = ["SETTINGS", "FunctionVanished", "Source", "drive_async", "drive_sync", "within"]

logger = logging.getLogger("anarchon.postgres")
T = TypeVar("T")

# Set once per session on anarchon's own connection, per transaction on a user's: a frozen
# client cannot hold a job's lock for long, and a waiter gives up (and retries) instead of
# hanging.
SETTINGS = (
    "SELECT set_config('lock_timeout', %(timeout)s, {scope}), "
    "set_config('statement_timeout', %(statement_timeout)s, {scope}), "
    "set_config('idle_in_transaction_session_timeout', %(timeout)s, {scope})"
)


# -- where connections come from ------------------------------------------------------


def _lost(error: psycopg.Error, conn: psycopg.BaseConnection[Any]) -> psycopg.Error:
    """``error``, or an OperationalError if it left the connection broken.

    A server-side termination can surface as another class (the idle-in-transaction
    timeout is an InternalError) with the connection gone: that is transient too.
    """
    if isinstance(error, psycopg.OperationalError) or not (conn.broken or conn.closed):
        return error
    lost = psycopg.OperationalError(f"the connection was lost: {error}")
    lost.__cause__ = error
    return lost


class Source(Protocol):
    """Where a backend's transactions run: anarchon's connections, or the user's."""

    #: How many transactions it runs at once (connections it can use side by side).
    parallel: int

    async def run(self, queries: dict[str, str], steps: Steps[T]) -> T:
        """Run one transaction of ``steps`` (a fresh generator per call)."""

    async def close(self) -> None:
        """Close what anarchon opened (a user's connection or pool stays open)."""

    def describe(self) -> str:
        """The connection as shown in logs and reprs (password masked)."""


def _check_idle(conn: psycopg.BaseConnection[Any]) -> None:
    if conn.closed:
        raise psycopg.OperationalError("the connection given to PostgresBackend is closed")
    if conn.pgconn.transaction_status != TransactionStatus.IDLE:
        raise StoreError(
            "the psycopg connection given to PostgresBackend is inside a transaction: "
            "anarchon's claims would only be savepoints of it. Give anarchon a connection "
            "of its own (or a pool), in autocommit mode or idle between uses."
        )


def _as_list(item: Step | list[Step]) -> list[Step]:
    return item if isinstance(item, list) else [item]


def _too_many() -> RuntimeError:
    return RuntimeError(f"a transaction yielded more than {MAX_YIELDS} times")


# How a transaction goes out: each item the steps yield (one statement, or a list of
# statements that need no result of each other) is ONE simple-protocol Query message,
# its parameters bound on the client: one round trip, with ``BEGIN`` in the first message
# and ``COMMIT`` in the one carrying the Last steps. The server has read the whole message
# before it runs any of it, and it sits "idle in transaction" (its timeout armed) between
# messages, so a client frozen halfway can never hold a job's lock past that timeout. (In
# pipeline mode it could: the server arms that timeout only at a Sync, and psycopg writes
# each pipelined statement out as it is queued.) A transaction that is one message on an
# autocommit connection of anarchon's own needs neither ``BEGIN`` nor ``COMMIT`` (one
# message is one transaction); if it is one statement, its parameters are bound by the
# server instead, so psycopg prepares it once it has been run a few times.


#: Binds parameters into a statement's text on the client (a client cursor's ``mogrify``).
_Bind = Callable[[str, dict[str, Any]], str]


def _message(bind: _Bind, queries: dict[str, str], head: list[str], steps: list[Step],
             commit: bool) -> str:
    """The statements of one round trip as one text (values bound as literals)."""
    parts = [*head, *(bind(queries[step.query], step.params) for step in steps)]
    if commit:
        parts.append("COMMIT")
    return ";\n".join(parts)


def _head(conn: psycopg.BaseConnection[Any], settings: dict[str, str] | None,
          bind: _Bind) -> list[str]:
    """The statements the first message starts with.

    ``BEGIN`` (unless the connection is not in autocommit mode: psycopg begins then), and
    the transaction's timeouts when given.
    """
    head = ["BEGIN"] if conn.autocommit else []
    if settings is not None:
        head.append(bind(SETTINGS.format(scope="true"), settings))
    return head


@dataclass(frozen=True)
class _Send:
    """One message of a transaction: its text, and what to keep of each statement's result.

    ``keep`` holds, per statement, None (nothing: ``BEGIN`` and the timeouts), True (its
    rows) or False (its row count).
    """

    text: str
    keep: list[bool | None]
    #: The parameters of a lone statement (``text`` has their placeholders), bound by the
    #: server; None: ``text`` is complete.
    params: dict[str, Any] | None = None


def _messages(bind: _Bind, queries: dict[str, str], steps: Steps[T], head: list[str],
              session: _SessionFunctions) -> Generator[_Send, list[Any], T]:
    """The messages of ``steps``' transaction; each is sent back the replies it kept.

    No I/O here: :func:`drive_async` and :func:`drive_sync` send each message and read
    its results, so both drivers run the same transaction. The value is the steps' result,
    returned once the message carrying ``COMMIT`` has been answered.

    A transaction that is one message on an autocommit connection goes without ``BEGIN``
    and ``COMMIT``: the statements of one Query message are one transaction already.
    """
    reply: Any = None
    for _ in range(MAX_YIELDS):
        try:
            item = steps.send(reply)
        except StopIteration as done:
            yield _Send(_message(bind, queries, head, [], commit=True), [])
            result: T = done.value
            return result
        batch, last = _as_list(item), isinstance(item, Last)
        commit = last
        if last and head == ["BEGIN"]:
            head, commit = [], False
        head = [*head, *session.prelude(queries, batch)]
        replies: list[Any] = []
        if not head and not commit and len(batch) == 1:
            # One statement alone: bound by the server, so the driver may prepare it.
            replies = yield _Send(queries[batch[0].query], [batch[0].rows], batch[0].params)
        elif text := _message(bind, queries, head, batch, commit=commit):
            replies = yield _Send(text, [None] * len(head) + [step.rows for step in batch])
        head = []
        reply = replies if isinstance(item, list) else replies[0]
        if last:
            return _finish_steps(steps, replies)
    raise _too_many()


class FunctionVanished(psycopg.OperationalError):
    """A session function was gone: created again by the next call (transient)."""


#: The session functions (``pg_temp``) each connection has created, by their ``CREATE``.
_CREATED: weakref.WeakKeyDictionary[psycopg.BaseConnection[Any], set[str]] = \
    weakref.WeakKeyDictionary()


class _SessionFunctions:
    """The session functions one transaction calls: created first where still missing.

    A step whose query ``q`` has a ``"create:q"`` companion calls a ``pg_temp`` function;
    the first message that calls it on a connection creates it first. It counts as created
    once the transaction committed (a rolled-back ``CREATE`` is gone again).
    """

    def __init__(self, conn: psycopg.BaseConnection[Any]) -> None:
        self.made = _CREATED.setdefault(conn, set())
        self.new: list[str] = []
        self.used = False

    def prelude(self, queries: dict[str, str], steps: list[Step]) -> list[str]:
        """The ``CREATE`` statements ``steps`` need before them on this connection."""
        out = []
        for step in steps:
            create = queries.get("create:" + step.query)
            if create is None:
                continue
            self.used = True
            if create not in self.made and create not in self.new:
                self.new.append(create)
                out.append(create)
        return out

    def committed(self) -> None:
        self.made.update(self.new)

    def lost(self, exc: psycopg.Error) -> psycopg.Error:
        """``exc``, or a transient error when a session function had vanished.

        A pool's reset (``DISCARD ALL``) drops ``pg_temp``: the function is created again
        by the next call, which the scheduler makes as for any dropped connection.
        """
        if not (self.used and isinstance(exc, psycopg.errors.UndefinedFunction)):
            return exc
        self.made.clear()
        lost = FunctionVanished(
            f"a session function of anarchon was dropped (a reset of the session?): {exc}; "
            "it is created again on the next call")
        lost.__cause__ = exc
        return lost


def _walk_results(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any],
                  keep: list[bool | None]) -> Generator[bool, Any, list[Any]]:
    """Walk the results of one message: yields where rows must be fetched, and is sent them.

    Fetching is the one call that differs between the two drivers (awaited or not).
    """
    replies: list[Any] = []
    for i, rows in enumerate(keep):
        if i and not cur.nextset():
            raise psycopg.InterfaceError("fewer results than statements")
        if rows is not None:
            replies.append((yield True) if rows else cur.rowcount)
    return replies


async def drive_async(conn: psycopg.AsyncConnection[Any], queries: dict[str, str],
                       steps: Steps[T], settings: dict[str, str] | None) -> T:
    """Run ``steps`` in one transaction; return only once the COMMIT has succeeded.

    One round trip per item the steps yield (see above). ``settings``: the timeouts to set
    for this transaction (None: the session has them).
    """
    _check_idle(conn)
    client: psycopg.AsyncClientCursor[Any] | None = None

    def bind(query: str, params: dict[str, Any]) -> str:
        nonlocal client
        client = client or psycopg.AsyncClientCursor(conn, row_factory=tuple_row)
        return client.mogrify(query, params)

    session = _SessionFunctions(conn)
    messages = _messages(bind, queries, steps, _head(conn, settings, bind), session)
    bound: psycopg.AsyncCursor[Any] | None = None
    try:
        send = next(messages)
        while True:
            if send.params is None:
                client = client or psycopg.AsyncClientCursor(conn, row_factory=tuple_row)
                used: psycopg.AsyncCursor[Any] = client
                await used.execute(send.text)
            else:
                used = bound = bound or conn.cursor(row_factory=tuple_row)
                await bound.execute(send.text, send.params)
            walk = _walk_results(used, send.keep)
            try:
                walk.send(None)
                while True:
                    walk.send(await used.fetchall())
            except StopIteration as read:
                send = messages.send(read.value)
    except StopIteration as done:
        session.committed()
        result: T = done.value
        return result
    except BaseException as exc:
        await _rollback_async(conn)
        if isinstance(exc, psycopg.Error) and (lost := _lost(session.lost(exc), conn)) \
                is not exc:
            raise lost from exc
        raise


async def _rollback_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """End a failed transaction, if the connection still holds one (never raises)."""
    if conn.broken or conn.closed or \
            conn.info.transaction_status not in (TransactionStatus.INTRANS,
                                                 TransactionStatus.INERROR):
        return
    try:
        await conn.rollback()
    except psycopg.Error as exc:
        logger.debug("rollback after a failed transaction failed: %s", exc)


def drive_sync(conn: psycopg.Connection[Any], queries: dict[str, str],
                steps: Steps[T], settings: dict[str, str]) -> T:
    """The blocking twin of :func:`drive_async`, for a user's synchronous connection."""
    _check_idle(conn)
    client: psycopg.ClientCursor[Any] | None = None

    def bind(query: str, params: dict[str, Any]) -> str:
        nonlocal client
        client = client or psycopg.ClientCursor(conn, row_factory=tuple_row)
        return client.mogrify(query, params)

    session = _SessionFunctions(conn)
    messages = _messages(bind, queries, steps, _head(conn, settings, bind), session)
    bound: psycopg.Cursor[Any] | None = None
    try:
        send = next(messages)
        while True:
            if send.params is None:
                client = client or psycopg.ClientCursor(conn, row_factory=tuple_row)
                used: psycopg.Cursor[Any] = client
                used.execute(send.text)
            else:
                used = bound = bound or conn.cursor(row_factory=tuple_row)
                bound.execute(send.text, send.params)
            walk = _walk_results(used, send.keep)
            try:
                walk.send(None)
                while True:
                    walk.send(used.fetchall())
            except StopIteration as read:
                send = messages.send(read.value)
    except StopIteration as done:
        session.committed()
        result: T = done.value
        return result
    except BaseException as exc:
        _rollback_sync(conn)
        if isinstance(exc, psycopg.Error) and (lost := _lost(session.lost(exc), conn)) \
                is not exc:
            raise lost from exc
        raise


def _rollback_sync(conn: psycopg.Connection[Any]) -> None:
    """The blocking twin of :func:`_rollback_async`."""
    if conn.broken or conn.closed or \
            conn.info.transaction_status not in (TransactionStatus.INTRANS,
                                                 TransactionStatus.INERROR):
        return
    try:
        conn.rollback()
    except psycopg.Error as exc:
        logger.debug("rollback after a failed transaction failed: %s", exc)


def _finish_steps(steps: Steps[T], replies: list[Any]) -> T:
    """Hand the replies of the :class:`Last` steps back; the generator must end there."""
    try:
        steps.send(replies)
    except StopIteration as done:
        result: T = done.value
        return result
    raise RuntimeError("a transaction yielded steps after its Last ones")


async def within(work: Awaitable[T], seconds: float) -> T:
    """``work``, cancelled after ``seconds`` (TimeoutError); no task of its own."""
    async with asyncio.timeout(seconds):
        return await work


