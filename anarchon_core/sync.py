"""Synchronous twins of the scheduler's coroutines, for Django, Celery beat, APScheduler.

``scheduler.sync.start()`` runs the scheduler on an event loop in a background thread;
``scheduler.sync.history(...)``, ``run_now(...)`` and ``stop()`` run on whichever loop the
scheduler lives on (that thread's, or the user's own loop when started with
``await scheduler.start()`` elsewhere), so its connections are only ever used from their
own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .claim import ClaimHandle, SyncClaimHandle

if TYPE_CHECKING:
    from datetime import datetime

    from .fleet import FleetStatus, PauseInfo
    from .models import Run, RunPage
    from .scheduler import NotClaimed, Scheduler

__all__ = ["SyncScheduler"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="anarchon-loop",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class SyncScheduler:
    """Blocking versions of :class:`Scheduler`'s coroutines: ``scheduler.sync.<name>``.

    ``start()``, ``stop()``, ``history(...)``, ``job_names()``, ``run_now(name)``,
    ``claim(name, slot)``, ``pause(name)``, ``resume(name)``, ``paused()``, ``status()`` and
    ``backfill(name, start, end)`` block until done. Call them from ordinary threads (a Django
    view, a Celery beat, an APScheduler executor); inside an event loop use the coroutines
    instead. Registration (``every``, ``cron``, ``define``, ``remove``) is thread-safe on
    the scheduler itself.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._thread: _LoopThread | None = None
        self._lock = threading.Lock()

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._scheduler._loop
        if loop is not None and loop.is_running():
            return loop
        with self._lock:
            if self._thread is None:
                self._thread = _LoopThread()
            return self._thread.loop

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float | None) -> T:
        loop = self._loop()
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            raise RuntimeError("scheduler.sync.* blocks the event loop it needs; "
                               "await the coroutine method instead")
        return asyncio.run_coroutine_threadsafe(make(), loop).result(timeout)

    def start(self) -> None:
        """Start the scheduler on a background event loop thread; returns once started."""
        self._call(self._scheduler.start, 60)

    def stop(self, grace_ms: int | None = None) -> None:
        """Stop the scheduler (see :meth:`Scheduler.stop`) and its background thread."""
        self._call(lambda: self._scheduler.stop(grace_ms), None)
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.close()

    def history(self, job: str | None = None, limit: int = 50, *, status: str | None = None,
                runner: str | None = None, before: str | None = None) -> RunPage:
        """Blocking :meth:`Scheduler.history`."""
        return self._call(lambda: self._scheduler.history(
            job, limit, status=status, runner=runner, before=before), 60)

    def job_names(self) -> dict[str, Run | None]:
        """Blocking :meth:`Scheduler.job_names`."""
        return self._call(self._scheduler.job_names, 60)

    def claim(self, name: str, slot: int, timeout: float | None = 60.0
              ) -> SyncClaimHandle | NotClaimed:
        """Blocking :meth:`Scheduler.try_claim`: a handle, or a falsy :class:`NotClaimed`.

        ``with scheduler.sync.claim("report", slot) as claim:`` gives the handle (leaving
        the block records success, or failed with the exception) or ``None`` when the
        slot was not won. The lease is kept by the scheduler's event loop meanwhile.
        """
        result = self._call(lambda: self._scheduler.try_claim(name, slot), timeout)
        if isinstance(result, ClaimHandle):
            return SyncClaimHandle(result, timeout)
        return result

    def run_now(self, name: str, timeout: float | None = None) -> Run:
        """Blocking :meth:`Scheduler.run_now`; ``timeout`` in seconds (None waits)."""
        return self._call(lambda: self._scheduler.run_now(name), timeout)

    def backfill(self, name: str, start: datetime | int, end: datetime | int, *,
                 limit: int = 1_000, timeout: float | None = None) -> list[Run]:
        """Blocking :meth:`Scheduler.backfill`; ``timeout`` in seconds (None waits)."""
        return self._call(lambda: self._scheduler.backfill(name, start, end, limit=limit),
                          timeout)

    def pause(self, name: str, reason: str | None = None) -> PauseInfo:
        """Blocking :meth:`Scheduler.pause`."""
        return self._call(lambda: self._scheduler.pause(name, reason), 60)

    def resume(self, name: str) -> bool:
        """Blocking :meth:`Scheduler.resume`."""
        return self._call(lambda: self._scheduler.resume(name), 60)

    def paused(self) -> dict[str, PauseInfo]:
        """Blocking :meth:`Scheduler.paused`."""
        return self._call(self._scheduler.paused, 60)

    def status(self) -> FleetStatus:
        """Blocking :meth:`Scheduler.status`."""
        return self._call(self._scheduler.status, 60)
