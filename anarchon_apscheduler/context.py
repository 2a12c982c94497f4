"""The claim of the run in progress, for job functions that want to fence their writes."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apscheduler.util import iscoroutinefunction_partial  # type: ignore[import-untyped]

from anarchon_core import SyncClaimHandle

__all__ = ["RunContext", "current_run"]

_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "anarchon_apscheduler_run", default=None)


@dataclass(frozen=True)
class RunContext:
    """The firing a job function is running, as :func:`current_run` returns it.

    ``job_id`` and ``run_time`` are APScheduler's; ``slot`` (ms since the epoch) is the
    firing's identity across processes; ``attempt`` is 1, or more after a takeover (a
    monotonic fencing number); ``token`` is this attempt's fencing token.
    """

    job_id: str
    run_time: datetime
    slot: int
    attempt: int
    token: str
    instance_id: str
    handle: SyncClaimHandle = field(repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once the lease was lost (another attempt took over) or the run must stop."""
        return bool(self.handle.cancelled)

    @property
    def cancel_event(self) -> threading.Event:
        """Set when :attr:`cancelled` becomes true; ``wait()`` on it between steps."""
        event: threading.Event = self.handle.cancel_event
        return event

    def check_lease(self) -> None:
        """Confirm the lease with the store now; raise ``LeaseLost`` if another took over.

        Call it right before a side effect that must not happen twice. Blocks for one
        store round trip; in a coroutine job use :meth:`acheck_lease`.
        """
        self.handle.check_lease()

    async def acheck_lease(self) -> None:
        """The coroutine version of :meth:`check_lease`."""
        inner = self.handle.handle
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(inner.check_lease(),
                                                                   inner.loop))


def current_run() -> RunContext | None:
    """The firing the calling job function runs, or None outside one.

    Set while a job runs through :class:`~anarchon_apscheduler.AnarchonExecutor` in a
    thread pool, the asyncio executor or any executor running jobs in this process; not
    in a process pool (the job runs in another process).
    """
    return _current.get()


def with_context(func: Callable[..., Any], run: RunContext) -> Callable[..., Any]:
    """``func`` wrapped so that :func:`current_run` returns ``run`` while it runs."""
    if iscoroutinefunction_partial(func):
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            token = _current.set(run)
            try:
                return await func(*args, **kwargs)
            finally:
                _current.reset(token)

        return run_async

    def run_sync(*args: Any, **kwargs: Any) -> Any:
        token = _current.set(run)
        try:
            return func(*args, **kwargs)
        finally:
            _current.reset(token)

    return run_sync
