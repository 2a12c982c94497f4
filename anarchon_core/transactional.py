"""Recording an attempt's end inside a transaction of the caller's own connection.

SQL stores (PostgreSQL, SQLite) keep runs in a table of an ordinary database. When the
caller's own writes go to that same database, the attempt's end can commit in the
caller's transaction, together with those writes: both happen or neither does, and only
while the attempt still holds its run. The steps, for a caller holding a won attempt::

    end = ctx.end_in_transaction("success")     # or handle.end_in_transaction(...)
    try:
        with my_connection.transaction():
            ...                                    # the caller's own writes
            cursor.execute(end.statement.sql, end.statement.params)
            end.applied(cursor.rowcount)           # LeaseLost (roll back) unless 1
    except BaseException:
        end.rolled_back()
        raise
    end.committed()

``statement`` is the backend's own fenced ``finish`` (the same conditions: this attempt's
token, still ``running``, not handed over), with ``%(name)s`` placeholders (DB-API
"pyformat", which psycopg and Django's cursors take). Another attempt that took over
makes it change no row; a backup's claim waits for the caller's transaction (the row is
locked by the ``UPDATE``; SQLite has one writer), so the two can never both win.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import LeaseLost

if TYPE_CHECKING:
    from .claim import ClaimHandle

__all__ = ["SqlStatement", "TransactionEnd"]


@dataclass(frozen=True)
class SqlStatement:
    """One statement for the caller to run on its own connection to the store's database.

    ``sql`` has ``%(name)s`` placeholders for ``params``; ``dialect`` names the database
    it is written for (``"postgresql"`` or ``"sqlite"``).
    """

    sql: str
    params: Mapping[str, Any]
    dialect: Literal["postgresql", "sqlite"]


class TransactionEnd:
    """An attempt's end on its way through the caller's transaction (see the module).

    Made by :meth:`ClaimHandle.end_in_transaction`; the handle holds its lease (and sees
    a heartbeat refused meanwhile as this end, not as a takeover) until :meth:`committed`
    or :meth:`rolled_back` says how the transaction ended. Safe to call from any thread.
    """

    def __init__(self, handle: ClaimHandle, statement: SqlStatement, status: str,
                 error: str | None) -> None:
        self._handle = handle
        #: The statement to run last in the transaction, before its commit.
        self.statement = statement
        self.status = status
        self.error = error
        self._settled = False

    def applied(self, rowcount: int) -> None:
        """Check the statement's row count: raise :class:`LeaseLost` unless it is 1.

        0 rows means another attempt took over (or the run ended otherwise): the handle is
        fenced, and the caller must roll its transaction back (raising does that in a
        ``with`` block).
        """
        if rowcount != 1:
            self._settled = True
            self._handle._external_end_refused()
            self._handle.raise_if_cancelled()
            raise LeaseLost(f"{self._handle.job} slot {self._handle.slot}: the end record "
                            "was refused: another attempt holds the run")

    def committed(self) -> None:
        """The transaction committed: the attempt's end is recorded; the handle is ended."""
        if not self._settled:
            self._settled = True
            self._handle._external_end_committed(self.status, self.error)

    def rolled_back(self) -> None:
        """The transaction did not commit: nothing was recorded; the lease is held as before."""
        if not self._settled:
            self._settled = True
            self._handle._external_end_abandoned()
