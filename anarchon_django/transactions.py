"""``anarchon_django.atomic(ctx)``: a job's ORM writes and its run's end in one commit.

With ``ANARCHON['BACKEND']`` a database alias, the runs table lives in that database, so a
sync handler's own writes and the record "this run succeeded" can commit together::

    @anarchon_django.every("close-day", "1d")
    def close_day(ctx):
        with anarchon_django.atomic(ctx):
            Ledger.objects.create(day=ctx.scheduled_at.date(), ...)

Either both commit or neither does, and they commit only while this attempt still holds
the run: when another attempt has taken over, the end record changes no row, the block
raises :class:`~anarchon_core.LeaseLost` and everything in it is rolled back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connections, transaction

from anarchon_core import ConfigError, JobContext
from anarchon_core.transactional import TransactionEnd

from . import conf

__all__ = ["atomic", "store_alias"]


def store_alias() -> str:
    """The Django database holding the runs table (``ANARCHON['BACKEND']``).

    :class:`~anarchon_core.ConfigError` when ``BACKEND`` is a store URL: the run's end
    can only share a transaction with the ORM in a database the project reaches.
    """
    target = conf.load().database
    if target is None:
        raise ConfigError("anarchon_django.atomic(ctx) needs ANARCHON['BACKEND'] to be a "
                          "database alias (the runs table in the project's database), not "
                          "a store URL")
    return target.alias


@contextlib.contextmanager
def atomic(ctx: JobContext) -> Iterator[None]:
    """Commit the block's ORM writes with this run's ``success`` record, only while it holds.

    The outermost transaction on the runs table's database (``ANARCHON['BACKEND']``):
    nested in another ``transaction.atomic`` it is refused, since its commit would not be
    the real one. An exception in the block rolls it back and the run ends as usual
    (``failed``); a lost lease raises :class:`~anarchon_core.LeaseLost` at the end of the
    block and rolls it back. For sync handlers (the ORM's own rule); the run's ``meta``
    is recorded as it is when the block ends.
    """
    alias = store_alias()
    connection = connections[alias]
    if connection.in_atomic_block:
        raise RuntimeError(f"anarchon_django.atomic(ctx) must be the outermost transaction "
                           f"on database {alias!r}: it commits the run's end")
    end: TransactionEnd | None = None
    try:
        with transaction.atomic(using=alias):
            yield
            end = ctx.end_in_transaction("success")
            if end.statement.dialect != connection.vendor:
                raise ConfigError(f"the runs table is in a {end.statement.dialect} store, "
                                  f"but database {alias!r} is {connection.vendor}")
            with connection.cursor() as cursor:
                cursor.execute(end.statement.sql, dict(end.statement.params))
                end.applied(cursor.rowcount)
    except BaseException:
        if end is not None:
            end.rolled_back()
        raise
    if end is not None:
        end.committed()
