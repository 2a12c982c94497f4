"""What a scheduler does with a claimed slot: run the won attempt, or watch, or log why not.

:class:`Runs` holds the attempts running here and the thread pool of sync handlers. A won
handle runs its job's handler as an :class:`~anarchon_core.execution.Attempt` (or, for a
``define(on_takeover=...)`` job, is given to that callback); a slot found ``running``
elsewhere is watched as a backup (the ``watch`` callback); any other answer is logged.
:meth:`Runs.stop` is the attempts' part of a graceful stop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from .claim import ClaimHandle
from .claiming import Claims, NotClaimed
from .events import EventBus, EventKind
from .events import run_fields as _fields
from .execution import Attempt
from .health import StoreHealth
from .jobs import RegisteredJob
from .models import ClaimOutcome, ClaimRequest
from .threads import HandlerThreads

__all__ = ["RunSettings", "Runs"]

log = logging.getLogger("anarchon.scheduler")

#: How long a stop waits for runs whose handler returned to record their end (s).
RECORD_WAIT_S = 10.0


class RunSettings(Protocol):
    """What runs read of their scheduler's configuration."""

    instance_id: str
    stop_grace_ms: int


class Runs:
    """The attempts of one scheduler (see the module's docstring).

    :param watch: start watching ``(job, slot, manual)`` as a backup (lease stores).
    :param now_ms: the store's clock (events' lateness).
    """

    def __init__(self, settings: RunSettings, claims: Claims, *, events: EventBus,
                 health: StoreHealth, stopping: Callable[[], bool],
                 watch: Callable[[RegisteredJob, int], None] | None,
                 now_ms: Callable[[], float]) -> None:
        self._settings = settings
        self._claims = claims
        self._events = events
        self._health = health
        self._stopping = stopping
        self._watch = watch
        self._now_ms = now_ms
        #: The attempts running here.
        self.attempts: set[Attempt] = set()
        #: The pool of sync handlers while the scheduler runs.
        self.threads: HandlerThreads | None = None

    def attempt(self, job: RegisteredJob, handle: ClaimHandle,
                threads: HandlerThreads) -> Attempt:
        """An attempt of ``job``'s handler under ``handle``."""
        assert job.handler is not None
        return Attempt(handle=handle, handler=job.handler,
                       instance_id=self._settings.instance_id,
                       timeout_ms=job.options.timeout_ms, threads=threads,
                       stop_grace_s=self._settings.stop_grace_ms / 1000)

    def run_won(self, job: RegisteredJob, handle: ClaimHandle) -> Coroutine[Any, Any, None]:
        """What runs a slot won at its instant: the attempt itself in the common case."""
        threads = self.threads
        if job.handler is not None and threads is not None \
                and self._claims.may_run_now(handle):
            return self.run_attempt(self.attempt(job, handle, threads))
        return self._run_won_otherwise(job, handle)

    async def _run_won_otherwise(self, job: RegisteredJob, handle: ClaimHandle) -> None:
        await self.go_on(job, handle.slot, await self._claims.after_won(handle))

    async def go_on(self, job: RegisteredJob, slot: int,
                    outcome: ClaimHandle | NotClaimed) -> None:
        """After :meth:`Claims.after_won` or a lost claim: run the handle, or watch or log."""
        if isinstance(outcome, ClaimHandle):
            await self.run_handle(job, outcome)
        elif not self._stopping():
            self.on_not_claimed(job, slot, outcome)

    def on_not_claimed(self, job: RegisteredJob, slot: int, outcome: NotClaimed) -> None:
        """Watch a slot running elsewhere (lease stores); log any other answer."""
        if outcome.outcome is ClaimOutcome.RUNNING and self._watch is not None:
            self._watch(job, slot)
        elif outcome.outcome in (ClaimOutcome.OVERLAP, ClaimOutcome.LATE):
            # While the store is down the recovery line counts these; one line each would
            # be one per slot of every job.
            log.log(logging.DEBUG if self._health.down else logging.INFO,
                    "%s slot %s: skipped (%s)", job.name, slot, outcome.reason,
                    extra=_fields(job.name, slot, None, self._settings.instance_id))
        else:
            log.debug("%s slot %s: %s", job.name, slot, outcome.outcome.value)

    async def run_buffered(self, job: RegisteredJob, request: ClaimRequest,
                           handle: ClaimHandle) -> None:
        """Hold a buffered slot until its turn (:meth:`Claims.wait_turn`), then go on."""
        await self.go_on(job, request.slot, await self._claims.wait_turn(request, handle))

    async def run_handle(self, job: RegisteredJob, handle: ClaimHandle) -> None:
        """Run a won handle that passed :meth:`Claims.after_won`."""
        threads = self.threads
        if job.handler is None and job.on_takeover is not None and not self._stopping():
            try:
                started = job.on_takeover(handle)
                if inspect.isawaitable(started):
                    await started
            except Exception:
                log.exception("%s slot %s: on_takeover failed; handing the run over",
                              job.name, handle.slot)
                if not handle.ended and not handle.fenced:
                    await handle.release()
            return
        if threads is None or job.handler is None:
            await handle.release()
            return
        await self.run_attempt(self.attempt(job, handle, threads))

    async def run_attempt(self, attempt: Attempt) -> None:
        """Run ``attempt`` to its recorded end, with its start and end as events."""
        self.attempts.add(attempt)
        attempt.task = asyncio.current_task()
        if self._stopping():
            attempt.request_stop(0)
        events = self._events
        ref = attempt.handle.ref
        if events:
            events.emit(EventKind.ATTEMPT_STARTED, job=ref.job, slot=ref.slot,
                        attempt=ref.attempt, manual=ref.manual,
                        lateness_ms=self._now_ms() - ref.slot)
        try:
            await attempt.run_to_end()
        finally:
            self.attempts.discard(attempt)
        if events:
            duration = None if attempt.finished_at is None \
                else (attempt.finished_at - attempt.started_at) * 1000
            events.emit(EventKind.ATTEMPT_ENDED, job=ref.job, slot=ref.slot,
                        attempt=ref.attempt, manual=ref.manual, status=attempt.status,
                        error=attempt.error, duration_ms=duration)

    def runs_here(self, job: str, slot: int) -> bool:
        """Whether an attempt of that slot runs on this instance."""
        return any(a.handle.ref.job == job and a.handle.ref.slot == slot
                   for a in self.attempts)

    def tasks(self) -> set[asyncio.Future[Any]]:
        """The tasks of the attempts running here."""
        return {a.task for a in self.attempts if a.task is not None}

    async def stop(self, grace: float) -> set[asyncio.Future[Any]]:
        """Ask every attempt to stop, give handlers ``grace`` s, let those that returned end.

        Returns the tasks of attempts still running (a handler that ignores its
        cancellation keeps its lease until it returns; a warning names each).
        """
        attempts = list(self.attempts)
        attempt_tasks = {a.task for a in attempts if a.task is not None}
        for attempt in attempts:
            attempt.request_stop(grace)
        if not attempt_tasks:
            return set()
        # Handlers get the grace (and async ones a moment to take their cancellation),
        # then those whose code returned record their end or hand over.
        codes = {a.code for a in attempts if a.code is not None}
        if codes:
            await asyncio.wait(codes, timeout=grace + 1.0)
        ended = {a.task for a in attempts if a.task is not None and not a.code_running}
        if ended:
            await asyncio.wait(ended, timeout=RECORD_WAIT_S)
        for attempt in attempts:
            if attempt.code_running:
                ref = attempt.handle.ref
                log.warning("%s slot %s attempt %s: still running after the stop grace; "
                            "its lease is kept until it returns or the process exits",
                            ref.job, ref.slot, ref.attempt)
        return {t for t in attempt_tasks if not t.done()}
