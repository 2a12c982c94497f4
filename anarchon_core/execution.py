"""Running one attempt's handler under a :class:`~anarchon_core.claim.ClaimHandle`.

The invariant (docs/concepts.md): **an attempt's lease is held until its code has
actually stopped**. A timeout or ``stop()`` only *asks* the handler to stop (the cancel
event; task cancellation at once for a timeout, after the stop grace for ``stop()``); the
run is recorded ended, or released for hand-over, only once the handler has returned.
A handler that ignores its cancellation keeps its lease, heartbeated, until it returns
or the process exits (a warning names the job). Only a lost lease ends the run without
waiting, because another attempt owns it then.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from .claim import LEASE_LOST, STOPPING, TIMEOUT, ClaimHandle
from .context import JobContext
from .errors import Cancelled
from .events import run_fields
from .models import Run
from .schedules import ms_to_datetime
from .waits import until_done

__all__ = ["Attempt", "Handler"]

log = logging.getLogger("anarchon.run")

Handler = Callable[[JobContext], Any]
#: A handler still running this long after it was asked to stop is reported.
_IGNORED_CANCEL_WARN_S = 5.0


class Attempt:
    """One won attempt: the handler, its timeout and cancellation, and the recorded end."""

    def __init__(self, *, handle: ClaimHandle, handler: Handler, instance_id: str,
                 timeout_ms: int | None, threads: Executor, stop_grace_s: float) -> None:
        self.handle = handle
        self.handler = handler
        self.instance_id = instance_id
        self.timeout_ms = timeout_ms
        self.threads = threads
        #: How long an async handler asked to stop may run before it is cancelled.
        self.stop_grace_s = stop_grace_s
        # A callable object with an ``async def __call__`` is an async handler too.
        self.is_async = inspect.iscoroutinefunction(handler) or \
            inspect.iscoroutinefunction(type(handler).__call__)
        self.ctx = JobContext(handle, instance_id)
        self.started_at = self.handle.clock.time()
        self.finished_at: float | None = None
        self.status = "running"
        self.error: str | None = None
        self.handed_over = False
        #: The task awaiting this attempt (set by the scheduler).
        self.task: asyncio.Future[Any] | None = None
        #: A thread's code, or (made when asked for) a future done once async code returned.
        self._code: asyncio.Future[Any] | None = None
        self._started = False
        self._returned = False
        #: The task an async handler is awaited in, and the cancellations sent to it.
        self._here: asyncio.Task[Any] | None = None
        self._cancels_sent = 0
        self._task_cancel: asyncio.TimerHandle | None = None

    @property
    def code(self) -> asyncio.Future[Any] | None:
        """Done once the handler's code has returned (None before it started)."""
        if self._code is None and self._started:
            self._code = self.handle.loop.create_future()
            if self._returned:
                self._code.set_result(None)
        return self._code

    @property
    def code_running(self) -> bool:
        """True while the handler's code has not returned."""
        return not self._returned and (self._code is None or not self._code.done())

    def request_stop(self, grace_s: float) -> None:
        """Ask the handler to stop (``stop()``); an async one is cancelled after ``grace_s``."""
        self.stop_grace_s = grace_s
        self.handle.cancel(STOPPING)

    def _on_cancel(self, reason: str) -> None:
        if not self.is_async or self._returned:
            return  # a sync handler sees ctx.cancelled / cancel_event
        if reason == STOPPING:
            self._task_cancel = self.handle.loop.call_later(self.stop_grace_s,
                                                            self._cancel_code)
        else:
            self._cancel_code()

    def _cancel_code(self) -> None:
        """Cancel the async handler (the task it is awaited in, at the handler's await)."""
        task = self._here
        if task is None or self._returned:
            return
        if asyncio.current_task() is task:
            # Asked from the handler's own code (a failed check_lease): the cancellation
            # must land at its next await, never in what runs after it returned.
            self.handle.loop.call_soon(self._cancel_code)
            return
        self._cancels_sent += 1
        task.cancel()

    def _take_back_cancels(self, task: asyncio.Task[Any], before: int) -> bool:
        """Withdraw the cancellations sent to the handler; True if nobody else cancelled."""
        sent, self._cancels_sent = self._cancels_sent, 0
        for _ in range(sent):
            task.uncancel()
        return sent > 0 and task.cancelling() <= before

    def _time_out(self) -> None:
        if self._returned:
            return
        if self.handle.cancel_reason is None:
            self.handle.cancel(TIMEOUT)
        self.handle.loop.call_later(_IGNORED_CANCEL_WARN_S, self._warn_if_running)

    def _warn_if_running(self) -> None:
        if self._returned or not self.handle.cancelled:
            return
        ref = self.handle.ref
        log.warning("%s slot %s attempt %s: the handler ignores its cancellation (%s); its "
                    "lease is kept until it returns or the process exits", ref.job, ref.slot,
                    ref.attempt, self.handle.cancel_reason)

    def _start_thread(self) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        thread_future = self.threads.submit(self.handler, self.ctx)
        code = asyncio.wrap_future(thread_future, loop=loop)

        async def returned() -> Any:
            result = await code
            if inspect.isawaitable(result):
                result = await result
            return result

        # One awaitable for both kinds: done exactly when the handler's code has returned.
        return asyncio.ensure_future(returned())

    async def run(self) -> Run:
        """Run the handler to its end, record the outcome (unless fenced); the Run."""
        await self.run_to_end()
        return self.as_run()

    async def run_to_end(self) -> None:
        """Run the handler to its end, then record the outcome (unless fenced)."""
        ref = self.handle.ref
        if self.handle.fence_if_expired():
            # Won too late to be sure of the lease: the code never starts, nothing is
            # recorded (a backup takes the slot over once the lease has expired).
            self.status, self.error = "interrupted", "lease lost"
            self.finished_at = self.handle.clock.time()
            return
        if log.isEnabledFor(logging.INFO):
            log.info("%s slot %s attempt %s: started on %s", ref.job, ref.slot, ref.attempt,
                     self.instance_id,
                     extra=run_fields(ref.job, ref.slot, ref.attempt, self.instance_id))
        try:
            if self.is_async:
                exc, cancelled = await self._await_handler()
            else:
                exc, cancelled = await self._wait_for_thread()
        finally:
            if self._task_cancel is not None:
                self._task_cancel.cancel()
            # The handle's callback list holding this attempt is a reference cycle: broken
            # here, a finished run is freed at once instead of waiting for the collector.
            self.handle.remove_cancel_callback(self._on_cancel)
        self._settle(exc, cancelled)
        handle = self.handle
        if handle.end_status is not None:
            # The handler's own transaction recorded the end (end_in_transaction): that
            # is the run's outcome, whatever its code did after the commit.
            self.status, self.error = handle.end_status
            return
        if handle.fenced:
            await handle.release_refused()
            return
        try:
            if self.status == "interrupted" and handle.timings is not None:
                self.handed_over = await handle.release()
            else:
                await handle.finish(self.status, self.error)
        except Exception:
            log.exception("%s slot %s attempt %s: recording its end failed", ref.job,
                          ref.slot, ref.attempt)

    async def _await_handler(self) -> tuple[BaseException | None, bool]:
        """Await the async handler in this task: (its exception, whether it was cancelled).

        No task of its own (thousands of runs at one instant each save a task and the
        wake-ups between two): a timeout, a lost lease or the end of the stop grace cancel
        this task, and the cancellation is taken back here once the handler has let it
        through. A cancellation from elsewhere (the loop going away) goes on up.
        """
        task = asyncio.current_task()
        assert task is not None
        self._here = task
        before = task.cancelling()
        self._started = True
        self.handle.add_cancel_callback(self._on_cancel)
        loop = self.handle.loop
        timer = None if self.timeout_ms is None \
            else loop.call_later(self.timeout_ms / 1000, self._time_out)
        exc: BaseException | None = None
        cancelled = False
        try:
            await self.handler(self.ctx)
        except asyncio.CancelledError:
            if not self._take_back_cancels(task, before):
                # The loop is going away (interpreter exit): nothing can be recorded now,
                # and the lease expires on its own once heartbeats stop.
                self.handle.abandon()
                raise
            cancelled = True
        except Exception as error:  # noqa: BLE001 - recorded as the run's failure
            exc = error
        except BaseException:
            self.handle.abandon()
            raise
        finally:
            self._returned = True
            if timer is not None:
                timer.cancel()
            if self._code is not None and not self._code.done():
                self._code.set_result(None)
        if self._cancels_sent:
            self._take_back_cancels(task, before)  # swallowed by the handler
        return exc, cancelled

    async def _wait_for_thread(self) -> tuple[BaseException | None, bool]:
        """Wait for a sync handler's thread: (its exception, whether it was cancelled)."""
        self._code = code = self._start_thread()
        self._started = True
        timeout = self.timeout_ms / 1000 if self.timeout_ms is not None else None
        try:
            await until_done(code, timeout)
            if not code.done() and self.handle.cancel_reason is None:
                self.handle.cancel(TIMEOUT)
            await self._until_code_returns(code)
        except asyncio.CancelledError:
            # The loop is going away (interpreter exit): nothing can be recorded now, and
            # the lease expires on its own once heartbeats stop.
            self.handle.abandon()
            raise
        self._returned = True
        if code.cancelled():
            return None, True
        return code.exception(), False

    async def _until_code_returns(self, code: asyncio.Future[Any]) -> None:
        warned = False
        while not code.done():
            await until_done(code, _IGNORED_CANCEL_WARN_S)
            if not code.done() and self.handle.cancelled and not warned:
                warned = True
                ref = self.handle.ref
                log.warning(
                    "%s slot %s attempt %s: the handler ignores its cancellation (%s); its "
                    "lease is kept until it returns or the process exits", ref.job, ref.slot,
                    ref.attempt, self.handle.cancel_reason)

    def _settle(self, exc: BaseException | None, cancelled: bool) -> None:
        reason = self.handle.cancel_reason
        if reason == LEASE_LOST:
            self.status, self.error = "interrupted", "lease lost"
        elif reason == TIMEOUT:
            # Past its timeout the run has failed, even if the handler returned afterwards.
            self.status, self.error = "failed", "timeout"
        elif not cancelled and exc is None:
            self.status = "success"
        elif reason == STOPPING:
            self.status, self.error = "interrupted", "stopping"
        elif exc is not None:
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, Cancelled):
                ref = self.handle.ref
                log.error("%s slot %s attempt %s failed", ref.job, ref.slot, ref.attempt,
                          exc_info=exc)
        else:
            self.status, self.error = "failed", "cancelled"
        self.finished_at = self.handle.clock.time()

    def as_run(self) -> Run:
        """The attempt as a history entry, as this instance saw it."""
        ref = self.handle.ref
        return Run(
            job=ref.job, slot=ref.slot, attempt=ref.attempt, status=self.status,
            runner=self.instance_id, started_at=ms_to_datetime(round(self.started_at * 1000)),
            finished_at=ms_to_datetime(round(self.finished_at * 1000))
            if self.finished_at else None,
            error=self.error, manual=ref.manual, meta=dict(self.handle.meta),
        )
