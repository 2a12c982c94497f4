"""Running one attempt: the handler, its heartbeats, timeout, cancellation and fencing."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from .backend import Backend
from .context import LEASE_LOST, STOPPING, TIMEOUT, JobContext
from .errors import Cancelled, LeaseLost
from .models import Run, RunRef
from .schedules import ms_to_datetime

__all__ = ["Attempt", "Handler", "LeaseTimings"]

log = logging.getLogger("anarchon.run")

Handler = Callable[[JobContext], Any]
_COOPERATION_S = 1.0
_RECORD_RETRY_S = 30.0
_BEATS_STOP_S = 1.0
_RECORD_DELAYS_S = (0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class LeaseTimings:
    """Lease length and heartbeat period, in ms."""

    lease_ms: int
    heartbeat_ms: int


class Attempt:
    """One won attempt, from handler start to its recorded end (or hand-over).

    The heartbeat runs on the event loop beside the handler, so a busy sync handler never
    delays it. A rejected heartbeat means another attempt took over: the handler is
    cancelled and this attempt records nothing more (it is fenced). A lease that could
    not be confirmed for a whole ``lease_ms`` (store unreachable) is treated the same way,
    since a backup may already be running.
    """

    def __init__(
        self, *, backend: Backend, ref: RunRef, handler: Handler, instance_id: str,
        timings: LeaseTimings | None, timeout_ms: int | None, executor: Executor,
    ) -> None:
        self.backend = backend
        self.ref = ref
        self.handler = handler
        self.instance_id = instance_id
        self.timings = timings
        self.timeout_ms = timeout_ms
        self.executor = executor
        self.fenced = False
        self.handed_over = False
        #: The task awaiting this attempt (set by the scheduler, waited for on stop).
        self.task: asyncio.Future[Any] | None = None
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.status = "running"
        self.error: str | None = None
        self.is_async = inspect.iscoroutinefunction(handler)
        #: How long a handler asked to stop may take to return before the run is ended.
        self.cooperation_s = _COOPERATION_S
        self._cancel = asyncio.Event()
        self._done = asyncio.Event()
        self._last_confirmed = time.monotonic()
        loop = asyncio.get_running_loop()
        self.ctx = JobContext(
            job=ref.job, slot=ref.slot, attempt=ref.attempt, instance_id=instance_id,
            token=ref.token, manual=ref.manual,
            check=self.heartbeat_now if timings else None, loop=loop,
        )

    def request_cancel(self, reason: str) -> None:
        """Ask the handler to stop (``timeout``, ``stopping`` or ``lease lost``)."""
        if self.finished_at is not None:
            return  # the handler is over; only its end is being recorded
        self.ctx._cancel(reason)
        self._cancel.set()

    async def heartbeat_now(self) -> None:
        """Extend the lease now; raise LeaseLost (and cancel) if fenced."""
        if self.fenced:
            raise LeaseLost(f"{self.ref.job} slot {self.ref.slot}: another attempt took over")
        assert self.timings is not None
        if await self.backend.heartbeat(self.ref, self.timings.lease_ms):
            self._last_confirmed = time.monotonic()
            return
        if self._done.is_set():
            return  # a late heartbeat after this attempt's end: nothing to fence
        self._fence()
        raise LeaseLost(f"{self.ref.job} slot {self.ref.slot}: another attempt took over")

    def _fence(self) -> None:
        if not self.fenced:
            self.fenced = True
            log.warning("%s slot %s attempt %s: fenced, another attempt took over; cancelling",
                        self.ref.job, self.ref.slot, self.ref.attempt)
            self.request_cancel(LEASE_LOST)

    async def _heartbeats(self) -> None:
        assert self.timings is not None
        period = self.timings.heartbeat_ms / 1000
        while not self.fenced:
            # Ends on the flag, not only by cancellation: some clients can swallow a task's
            # cancellation mid-command, and a heartbeat outliving its run would keep the
            # lease alive after the run ended.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._done.wait(), period)
            if self._done.is_set():
                return
            try:
                await self.heartbeat_now()
            except LeaseLost:
                return
            except Exception as exc:  # noqa: BLE001 - the store may be briefly unreachable
                unconfirmed = time.monotonic() - self._last_confirmed
                log.warning("%s slot %s: heartbeat failed (%s: %s), lease unconfirmed %.1fs",
                            self.ref.job, self.ref.slot, type(exc).__name__, exc, unconfirmed)
                if unconfirmed * 1000 >= self.timings.lease_ms:
                    self._fence()
                    return

    def _start_handler(self) -> asyncio.Future[Any]:
        if self.is_async:
            return asyncio.ensure_future(self.handler(self.ctx))
        loop = asyncio.get_running_loop()

        async def in_thread() -> Any:
            result = await loop.run_in_executor(self.executor, self.handler, self.ctx)
            if inspect.isawaitable(result):
                result = await result
            return result

        return asyncio.ensure_future(in_thread())

    async def run(self) -> Run:
        """Run the handler to its end and record the outcome (unless fenced/handed over)."""
        log.info("%s slot %s attempt %s: started on %s", self.ref.job, self.ref.slot,
                 self.ref.attempt, self.instance_id)
        beats = asyncio.ensure_future(self._heartbeats()) if self.timings else None
        task = self._start_handler()
        waiter = asyncio.ensure_future(self._cancel.wait())
        timeout = self.timeout_ms / 1000 if self.timeout_ms is not None else None
        try:
            await asyncio.wait({task, waiter}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                if not self._cancel.is_set():
                    self.request_cancel(TIMEOUT)
                if self.is_async:
                    task.cancel()
                # A sync handler sees ctx.cancelled: give it time to return or raise.
                await asyncio.wait({task}, timeout=self.cooperation_s)
                if not task.done():
                    task.cancel()
                    await asyncio.wait({task}, timeout=0.1)
            self._settle(task)
        finally:
            waiter.cancel()
            self._done.set()
            if beats is not None:
                beats.cancel()
                await asyncio.wait({beats}, timeout=_BEATS_STOP_S)
                if not beats.done():
                    log.warning("%s slot %s: heartbeat did not stop when asked",
                                self.ref.job, self.ref.slot)
                beats.add_done_callback(_consume)
        await self._record()
        return self.as_run()

    def _settle(self, task: asyncio.Future[Any]) -> None:
        reason = self.ctx.cancel_reason
        if reason == TIMEOUT:
            # Past its timeout the run has failed, even if the handler returned afterwards.
            self.status, self.error = "failed", "timeout"
        elif task.done() and not task.cancelled() and task.exception() is None:
            self.status = "success"
        elif reason in (STOPPING, LEASE_LOST):
            self.status = "interrupted"
            self.error = "stopping" if reason == STOPPING else "lease lost"
        elif task.done() and not task.cancelled():
            exc = task.exception()
            assert exc is not None
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, Cancelled):
                log.error("%s slot %s attempt %s failed", self.ref.job, self.ref.slot,
                          self.ref.attempt, exc_info=exc)
        else:
            self.status, self.error = "failed", "cancelled"
        if not task.done():
            # A sync handler's thread cannot be killed; let its late result go unobserved.
            task.add_done_callback(_consume)
        self.finished_at = time.time()

    async def _record(self) -> None:
        if self.fenced:
            return
        handing_over = self.status == "interrupted" and self.backend.supports_leases
        # While the store is unreachable nobody can take over either: keep trying, so the
        # run is not re-run merely because its end could not be written.
        deadline = time.monotonic() + max(_RECORD_RETRY_S, 2 * self._lease_s())
        for delay in (*_RECORD_DELAYS_S, *([_RECORD_DELAYS_S[-1]] * 1_000)):
            try:
                if handing_over:
                    self.handed_over = await self.backend.release(self.ref)
                    log.info("%s slot %s attempt %s: handed over", self.ref.job, self.ref.slot,
                             self.ref.attempt)
                    return
                accepted = await self.backend.finish(self.ref, self.status, self.error)
                break
            except Exception as exc:  # noqa: BLE001 - any store error: retry, bounded
                if time.monotonic() + delay > deadline:
                    log.error("%s slot %s attempt %s: could not record its end (%s): %s: %s",
                              self.ref.job, self.ref.slot, self.ref.attempt, self.status,
                              type(exc).__name__, exc)
                    return
                log.warning("%s slot %s attempt %s: recording its end failed (%s); retrying",
                            self.ref.job, self.ref.slot, self.ref.attempt, exc)
                await asyncio.sleep(delay)
        else:
            return
        if not accepted:
            self.fenced = True
            log.warning("%s slot %s attempt %s: finish rejected, another attempt took over",
                        self.ref.job, self.ref.slot, self.ref.attempt)
            return
        log.info("%s slot %s attempt %s: %s%s", self.ref.job, self.ref.slot, self.ref.attempt,
                 self.status, f" ({self.error})" if self.error else "")

    def _lease_s(self) -> float:
        return self.timings.lease_ms / 1000 if self.timings else 0.0

    def as_run(self) -> Run:
        """The attempt as a history entry, as this instance saw it."""
        return Run(
            job=self.ref.job, slot=self.ref.slot, attempt=self.ref.attempt,
            status=self.status, runner=self.instance_id,
            started_at=ms_to_datetime(round(self.started_at * 1000)),
            finished_at=ms_to_datetime(round(self.finished_at * 1000))
            if self.finished_at else None,
            error=self.error, manual=self.ref.manual,
        )


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
