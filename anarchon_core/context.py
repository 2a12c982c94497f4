"""The handler's view of its run: :class:`JobContext`."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime
from typing import TYPE_CHECKING

from .claim import LEASE_LOST, STOPPING, TIMEOUT
from .schedules import ms_to_datetime

if TYPE_CHECKING:
    from .claim import ClaimHandle
    from .transactional import TransactionEnd

__all__ = ["LEASE_LOST", "STOPPING", "TIMEOUT", "JobContext"]


class JobContext:
    """What a handler receives: which run it is, and whether it should stop.

    Async handlers are awaited in their run's task and cancelled there (timeout and a lost
    lease at once, ``stop()`` after its grace period); sync handlers run in a worker
    thread and should look at :attr:`cancelled` (or wait on :attr:`cancel_event`) between
    steps, or call :meth:`raise_if_cancelled`. Whatever the handler does, its lease is
    held until its code has returned. :attr:`meta` is recorded with the run (``Run.meta``).
    """

    def __init__(self, handle: ClaimHandle, instance_id: str) -> None:
        self._handle = handle
        self.job = handle.job
        self.slot = handle.slot
        self.attempt = handle.attempt
        self.instance_id = instance_id
        self.token = handle.token
        self.manual = handle.manual
        #: A small str → str mapping stored with this attempt's end (``Run.meta``).
        self.meta: dict[str, str] = handle.meta
        #: How many missed slots this run stands for when it catches up after downtime
        #: (``catch_up``: all of them for ``"newest"``, 1 for each run of ``"all"``); 0 for a
        #: run at its own time.
        self.missed_count = _missed_count(handle.meta)

    @property
    def scheduled_at(self) -> datetime:
        """The slot as an aware UTC datetime."""
        return ms_to_datetime(self.slot)

    @property
    def cancel_event(self) -> threading.Event:
        """Set once the run has been asked to stop (wait on it in a sync handler)."""
        return self._handle.cancel_event

    @property
    def cancelled(self) -> bool:
        """True once the run has been asked to stop."""
        return self._handle.cancelled

    @property
    def cancel_reason(self) -> str | None:
        """``"timeout"``, ``"stopping"`` or ``"lease lost"`` once cancelled, else None."""
        return self._handle.cancel_reason

    def raise_if_cancelled(self) -> None:
        """Raise :class:`Cancelled` (:class:`LeaseLost` if fenced) once cancelled."""
        self._handle.raise_if_cancelled()

    async def acheck_lease(self) -> None:
        """Heartbeat now; raise :class:`LeaseLost` if another attempt has taken over.

        Call it right before a side effect that must not happen twice. On a claim-only
        backend there is no lease: it only raises if the run was cancelled.
        """
        await self._handle.check_lease()

    def check_lease(self, timeout: float = 30.0) -> None:
        """The synchronous twin of :meth:`acheck_lease`, for sync handlers (worker threads)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._handle.loop:
            raise RuntimeError("check_lease() blocks; in an async handler use "
                               "'await ctx.acheck_lease()'")
        asyncio.run_coroutine_threadsafe(self._handle.check_lease(),
                                         self._handle.loop).result(timeout)

    def end_in_transaction(self, status: str = "success",
                           error: str | None = None) -> TransactionEnd:
        """Record this run's end in a transaction of your own connection to the store.

        For SQL stores whose database your code writes to: your writes and the run's end
        commit together, and only while this attempt holds the run. See
        :mod:`anarchon_core.transactional` for the steps (``anarchon_django.atomic`` does
        them for the Django ORM). :attr:`meta` is recorded as it is at this call.
        """
        return self._handle.end_in_transaction(status, error)

    def __repr__(self) -> str:
        return (f"<JobContext {self.job} slot={self.slot} attempt={self.attempt}"
                f"{' manual' if self.manual else ''}>")


def _missed_count(meta: dict[str, str]) -> int:
    text = meta.get("missed_count", "0")
    return int(text) if text.isdigit() else 0
