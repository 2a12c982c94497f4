"""The handler's view of its run: :class:`JobContext`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime

from .errors import Cancelled, LeaseLost
from .schedules import ms_to_datetime

__all__ = ["JobContext"]

#: Cancellation reasons, as ``ctx.cancel_reason`` reports them.
TIMEOUT, STOPPING, LEASE_LOST = "timeout", "stopping", "lease lost"


class JobContext:
    """What a handler receives: which run it is, and whether it should stop.

    Async handlers are cancelled as tasks (timeout, ``stop()``, lost lease); sync handlers
    run in a worker thread and should look at :attr:`cancelled` (or wait on
    :attr:`cancel_event`) between steps, or call :meth:`raise_if_cancelled`.
    """

    def __init__(
        self, *, job: str, slot: int, attempt: int, instance_id: str, token: str,
        manual: bool, check: Callable[[], Awaitable[None]] | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.job = job
        self.slot = slot
        self.attempt = attempt
        self.instance_id = instance_id
        self.token = token
        self.manual = manual
        self.cancel_event = threading.Event()
        self.cancel_reason: str | None = None
        self._check = check
        self._loop = loop

    @property
    def scheduled_at(self) -> datetime:
        """The slot as an aware UTC datetime."""
        return ms_to_datetime(self.slot)

    @property
    def cancelled(self) -> bool:
        """True once the run has been asked to stop."""
        return self.cancel_event.is_set()

    def _cancel(self, reason: str) -> None:
        if not self.cancel_event.is_set():
            self.cancel_reason = reason
            self.cancel_event.set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`Cancelled` (:class:`LeaseLost` if fenced) once cancelled."""
        if self.cancel_event.is_set():
            if self.cancel_reason == LEASE_LOST:
                raise LeaseLost(f"{self.job} slot {self.slot}: another attempt took over")
            raise Cancelled(f"{self.job} slot {self.slot}: cancelled ({self.cancel_reason})")

    async def acheck_lease(self) -> None:
        """Heartbeat now; raise :class:`LeaseLost` if another attempt has taken over.

        Call it right before a side effect that must not happen twice. On a claim-only
        backend there is no lease: it only raises if the run was cancelled.
        """
        self.raise_if_cancelled()
        if self._check is not None:
            await self._check()
        self.raise_if_cancelled()

    def check_lease(self, timeout: float = 30.0) -> None:
        """The synchronous twin of :meth:`acheck_lease`, for sync handlers (worker threads)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("check_lease() blocks; in an async handler use "
                               "'await ctx.acheck_lease()'")
        asyncio.run_coroutine_threadsafe(self.acheck_lease(), self._loop).result(timeout)

    def __repr__(self) -> str:
        return (f"<JobContext {self.job} slot={self.slot} attempt={self.attempt}"
                f"{' manual' if self.manual else ''}>")
