"""Claiming a slot for one scheduler: the request, the store call, and what a won claim passes.

:class:`Claims` builds each :class:`~anarchon_core.models.ClaimRequest` from a job's options,
sends it (retrying transient store failures with the same token until the slot is too
late), turns a won answer into a :class:`~anarchon_core.ClaimHandle` and reports every
answer as an event. Every won claim then passes :meth:`Claims.after_won` before it runs:
fenced, stopping, paused, in that order. A claim not won is a :class:`NotClaimed` saying
why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .backend import Backend, new_token
from .claim import ClaimHandle, LeaseTimings, retry_delay
from .decision import EARLY_TOLERANCE_MS, OVERLAP_SKIP, late_error
from .errors import StoreUnavailable
from .events import EventBus, EventKind
from .events import run_fields as _fields
from .fleet import PauseInfo
from .health import StoreHealth
from .jobs import RegisteredJob
from .models import ClaimOutcome, ClaimRequest, ClaimResult, RunRef
from .storeclock import StoreClock

__all__ = ["LATE_ANSWER", "ClaimSettings", "Claims", "NotClaimed", "not_claimed_reason"]

log = logging.getLogger("anarchon.scheduler")

#: Claims answered ``early`` (the store's clock is behind ours) tried again at most this often.
_EARLY_RETRIES = 3
#: How often a buffered slot's holder asks whether its turn has come (at most; s).
BUFFER_POLL_S = 0.5
#: Why a buffered slot was not run here: this scheduler stopped while it waited.
BUFFER_HANDED_OVER = "buffered: this scheduler is stopping; handed over while waiting"

#: Why a claim won, but answered after its lease could be confirmed, is not run here.
LATE_ANSWER = ("running: won, but the store's answer came after the lease could be "
               "confirmed; a backup takes the run over once the lease has expired")


@dataclass(frozen=True)
class NotClaimed:
    """Why :meth:`Scheduler.try_claim` did not win a slot (falsy).

    ``outcome`` is the claim's answer (``taken``, ``running``, ``overlap``, ``done``,
    ``late``, ``early``, ``paused``, or ``buffered``: the slot waits for the job's run
    going on and starts through ``on_takeover`` when it ends) and ``reason`` says it in
    words, as history records a skip.
    """

    job: str
    slot: int
    outcome: ClaimOutcome
    reason: str

    def __bool__(self) -> bool:
        return False

    def __enter__(self) -> None:
        """``with scheduler.sync.claim(...) as claim:`` gives None for a slot not won."""

    def __exit__(self, *exc: object) -> None:
        pass


class ClaimSettings(Protocol):
    """What claims read of their scheduler's configuration."""

    instance_id: str
    lease_ms: int
    heartbeat_ms: int


class Claims:
    """One scheduler's claims (see the module's docstring).

    :param settings: the scheduler's instance id and lease timings.
    :param stopping: whether the scheduler is stopping.
    :param paused: the fleet-wide paused jobs as last read, by name.
    """

    def __init__(self, backend: Backend, settings: ClaimSettings, *, health: StoreHealth,
                 events: EventBus, clock: StoreClock, stopping: Callable[[], bool],
                 paused: Callable[[], dict[str, PauseInfo]]) -> None:
        self._backend = backend
        self._settings = settings
        self._health = health
        self._events = events
        self._clock = clock
        self._stopping = stopping
        self._paused = paused
        #: One LeaseTimings shared by every handle (made again if the timings change).
        self._timings: LeaseTimings | None = None

    def request(self, job: RegisteredJob, slot: int, *, manual: bool = False,
                max_late_ms: int | None = None, token: str | None = None,
                max_attempts: int | None = None, overlap: str | None = None) -> ClaimRequest:
        """The claim of ``slot`` of ``job`` by this instance, with the job's options.

        ``overlap`` replaces the job's policy for this claim, if given.
        """
        o = job.options
        return ClaimRequest(
            job=job.name, slot=slot, token=token or new_token(),
            runner=self._settings.instance_id, manual=manual,
            lease_ms=self._settings.lease_ms,
            overlap="allow" if manual else overlap or o.overlap,
            max_attempts=max_attempts if max_attempts is not None
            else 1 if manual else o.max_attempts,
            max_late_ms=None if manual else (o.max_late_ms if max_late_ms is None
                                             else max_late_ms),
        )

    async def send(self, request: ClaimRequest) -> tuple[ClaimResult, float]:
        """One claim call, timed for the store's health; the result and when it was sent."""
        sent = self._clock.clock.monotonic()
        result = await self._health.timed("claim", self._backend.claim(request))
        return result, sent

    async def send_many(self, requests: list[ClaimRequest],
                        ) -> tuple[list[ClaimResult | BaseException], float]:
        """The claims due together, in one store call; the store's health counts it once.

        Returns each claim's result (or its failure) and when they were sent.
        """
        sent = self._clock.clock.monotonic()
        results: list[ClaimResult | BaseException]
        try:
            results = await self._backend.claim_many(requests)
        except Exception as exc:  # noqa: BLE001 - e.g. no connection: each retries on its own
            results = [exc] * len(requests)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            self._health.failed("claim", failed[0], sent)
            log.debug("%d of %d claims due together failed (%s); retrying each on its own",
                      len(failed), len(results), failed[0])
        if len(failed) < len(results):
            self._health.succeeded("claim", sent)
        return results, sent

    async def call(self, request: ClaimRequest, give_up_at: float | None,
                   answer_lost: bool = False) -> tuple[ClaimResult, float]:
        """Claim, retrying only transient store failures until ``give_up_at`` (store ms).

        Retries reuse the request's token, so a claim that was committed but whose answer
        was lost is won again by the retry. Returns the result and the monotonic instant
        its lease counts from: the sending of the successful call, or for a retry (or
        ``answer_lost``: this request's earlier call failed) no later than the store's
        own expiry allows (:meth:`rewon_lease`).
        """
        tries = 0
        while True:
            try:
                result, sent = await self.send(request)
            except StoreUnavailable as exc:
                tries += 1
                delay = retry_delay(tries)
                if self._stopping() or give_up_at is None or \
                        self._clock.now_ms() + delay * 1000 > give_up_at:
                    raise
                if tries == 1:
                    log.debug("%s slot %s: claim failed (%s); retrying", request.job,
                              request.slot, exc)
                await asyncio.sleep(delay)
            else:
                if tries or answer_lost:
                    sent = self.rewon_lease(request, result, sent)
                return result, sent

    def rewon_lease(self, request: ClaimRequest, result: ClaimResult, sent: float) -> float:
        """Where the lease of a claim that may have been committed by an earlier call starts.

        A claim committed but whose answer was lost is won again by a later call with the
        same token (a retry, a backup's next poll) with the lease that commit set: older
        than the call that answered it, and maybe expired. Its lease then ends at the
        store's expiry (read on the store's clock) if that comes before ``sent`` plus
        ``lease_ms``; a handle past it fences itself at once and a backup takes the run
        over. Only such calls are bounded so: a fresh claim does not depend on the clock.
        """
        if not result.won or result.lease_until_ms is None:
            return sent
        left_ms = result.lease_until_ms - self._clock.now_ms()
        return min(sent, self._clock.clock.monotonic() + (left_ms - request.lease_ms) / 1000)

    async def claim_slot(self, job: RegisteredJob, slot: int, *, max_late_ms: int | None = None,
                         raise_unavailable: bool = False, request: ClaimRequest | None = None,
                         answer_lost: bool = False,
                         buffered: Callable[[ClaimRequest, ClaimHandle], object] | None = None,
                         ) -> ClaimHandle | NotClaimed:
        """Claim one slot, re-claiming after an ``early`` answer; the handle if it may run.

        A store unreachable until the slot is too late is a ``late`` :class:`NotClaimed`
        (or, with ``raise_unavailable``, the :class:`StoreUnavailable` itself). A
        ``buffered`` answer waits for the slot's turn (:meth:`wait_turn`) here, or, given
        ``buffered``, is handed to it (the caller waits elsewhere) and answered as a
        :class:`NotClaimed` ``buffered``.
        """
        if request is None:
            request = self.request(job, slot, max_late_ms=max_late_ms)
        give_up_at = slot + (request.max_late_ms or job.options.max_late_ms)
        try:
            result, sent = await self.call(request, give_up_at, answer_lost)
            for _ in range(_EARLY_RETRIES):
                if result.outcome is not ClaimOutcome.EARLY or self._stopping():
                    break
                # The store's clock says the slot has not come: ours jumped. Re-measure,
                # wait for the slot by the store's clock, and claim again.
                log.warning("%s slot %s: claimed early by the store's clock; re-syncing",
                            job.name, slot)
                with contextlib.suppress(StoreUnavailable):
                    await self._clock.refresh()
                wait_ms = slot - self._clock.now_ms()
                if wait_ms > EARLY_TOLERANCE_MS:
                    break
                await asyncio.sleep(max(0.0, wait_ms) / 1000 + 0.01)
                result, sent = await self.call(request, give_up_at)
        except StoreUnavailable as exc:
            if raise_unavailable:
                raise
            reason = f"store unavailable: {exc}"
            if self._health.slot_missed(job.name, slot):
                log.debug("%s slot %s: not run, %s", job.name, slot, reason)
            else:
                log.error("%s slot %s: store unavailable until the slot was too late; not "
                          "run: %s", job.name, slot, exc)
            self._events.emit(EventKind.LATE, job=job.name, slot=slot, manual=request.manual,
                              outcome=ClaimOutcome.LATE.value, reason=reason)
            return NotClaimed(job.name, slot, ClaimOutcome.LATE, reason)
        self.report(request, result)
        if result.won:
            return await self.after_won(self.handle(request, result, sent))
        if result.outcome is ClaimOutcome.BUFFERED:
            handle = self.handle(request, result, sent)
            if buffered is None:
                return await self.wait_turn(request, handle)
            buffered(request, handle)
        return self.not_claimed(request, result)

    async def wait_turn(self, request: ClaimRequest,
                        handle: ClaimHandle) -> ClaimHandle | NotClaimed:
        """Hold a buffered slot (its lease kept by ``handle``) until it may run.

        Claims again with the same token until the store answers ``won`` (the run it
        waited for has ended; then :meth:`after_won`) or ``done`` (a later slot cancelled
        it). A stop hands the waiting slot over (a backup waits on); a fenced handle (its
        lease lost) leaves it to a backup.
        """
        poll = min(BUFFER_POLL_S, self._settings.heartbeat_ms / 2000)
        while True:
            await asyncio.sleep(poll)
            if handle.fenced:
                return NotClaimed(request.job, request.slot, ClaimOutcome.RUNNING, LATE_ANSWER)
            if self._stopping():
                await handle.release()
                return NotClaimed(request.job, request.slot, ClaimOutcome.TAKEN,
                                  BUFFER_HANDED_OVER)
            try:
                result, _ = await self.send(request)
            except StoreUnavailable as exc:
                log.debug("%s slot %s: buffered, the check failed (%s)", request.job,
                          request.slot, exc)
                continue
            if result.outcome is ClaimOutcome.BUFFERED:
                continue
            if result.won:
                self.report(request, result)
                return await self.after_won(handle)
            handle.abandon()
            return self.not_claimed(request, result)

    def not_claimed(self, request: ClaimRequest, result: ClaimResult) -> NotClaimed:
        """A claim's answer other than ``won``, with its reason in words."""
        return NotClaimed(request.job, request.slot, result.outcome,
                          not_claimed_reason(request, result, self._clock.now_ms()))

    def handle(self, request: ClaimRequest, result: ClaimResult, sent: float) -> ClaimHandle:
        """The handle of a won claim, its lease counted from ``sent`` (monotonic)."""
        timings = None
        settings = self._settings
        if self._backend.supports_leases:
            timings = self._timings
            if (timings is None or timings.lease_ms != settings.lease_ms
                    or timings.heartbeat_ms != settings.heartbeat_ms):
                timings = self._timings = LeaseTimings(settings.lease_ms, settings.heartbeat_ms)
        ref = RunRef(request.job, request.slot, request.token, result.attempt, request.manual)
        return ClaimHandle(backend=self._backend, ref=ref, runner=settings.instance_id,
                           timings=timings, sent_at=sent, events=self._events,
                           health=self._health, clock=self._clock.clock)

    def report(self, request: ClaimRequest, result: ClaimResult) -> None:
        """The claim's answer as an event (cheap when nobody listens)."""
        events = self._events
        if not events:
            return
        outcome = result.outcome
        fields: dict[str, Any] = {"job": request.job, "slot": request.slot,
                                  "attempt": result.attempt, "manual": request.manual,
                                  "outcome": outcome.value}
        if outcome is ClaimOutcome.WON:
            kind = EventKind.TAKEOVER if result.attempt > 1 else EventKind.CLAIM_WON
            fields["lateness_ms"] = self._clock.now_ms() - request.slot
        elif outcome is ClaimOutcome.OVERLAP:
            kind, fields["reason"] = EventKind.CLAIM_SKIPPED, OVERLAP_SKIP
        elif outcome is ClaimOutcome.LATE:
            kind = EventKind.LATE
            fields["reason"] = late_error(request, round(self._clock.now_ms()))
        elif outcome is ClaimOutcome.EARLY:
            kind = EventKind.EARLY
        else:
            kind = EventKind.CLAIM_TAKEN
        events.emit(kind, **fields)

    def may_run_now(self, handle: ClaimHandle) -> bool:
        """Whether :meth:`after_won` would give ``handle`` back unchanged (no coroutine).

        The common case, tested without a coroutine of its own: thousands of slots may be
        won at one instant.
        """
        return not self._stopping() and not handle.fence_if_expired() \
            and not self.is_paused(handle)

    def is_paused(self, handle: ClaimHandle) -> bool:
        """Whether the handle's job is paused fleet-wide (manual runs never are)."""
        return not handle.manual and handle.job in self._paused()

    async def after_won(self, handle: ClaimHandle) -> ClaimHandle | NotClaimed:
        """Every won claim passes here before it runs: fenced, stopping, paused, in order.

        The handle back when it may run; else why not, having done what that case needs
        (a run won while stopping is handed over, a paused job's slot recorded skipped).
        """
        if handle.fence_if_expired():
            # Answered too late to be sure of the lease: the run is left to a backup.
            return NotClaimed(handle.job, handle.slot, ClaimOutcome.RUNNING, LATE_ANSWER)
        if self._stopping():
            # Won while stopping: hand it straight over instead of dropping it.
            await handle.release()
            return NotClaimed(handle.job, handle.slot, ClaimOutcome.TAKEN,
                              "this scheduler is stopping; handed over")
        if self.is_paused(handle):
            return await self._skip_paused(handle)
        return handle

    async def _skip_paused(self, handle: ClaimHandle) -> NotClaimed:
        """Record a won slot of a paused job ``skipped`` (error ``paused``); run nothing."""
        info = self._paused().get(handle.job)
        reason = "paused" + (f" by {info.by}" if info else "") + \
            (f": {info.reason}" if info and info.reason else "")
        await handle.finish("skipped", "paused")
        log.info("%s slot %s: skipped (%s)", handle.job, handle.slot, reason,
                 extra=_fields(handle.job, handle.slot, handle.attempt,
                               self._settings.instance_id))
        self._events.emit(EventKind.CLAIM_SKIPPED, job=handle.job, slot=handle.slot,
                          attempt=handle.attempt, outcome=ClaimOutcome.PAUSED.value,
                          reason=reason)
        return NotClaimed(handle.job, handle.slot, ClaimOutcome.PAUSED, reason)


def not_claimed_reason(request: ClaimRequest, result: ClaimResult, now_ms: float) -> str:
    """Why a claim answered ``result`` was not won, in the words history records."""
    outcome = result.outcome
    if outcome is ClaimOutcome.LATE:
        return late_error(request, round(now_ms))
    if outcome is ClaimOutcome.OVERLAP:
        return OVERLAP_SKIP
    if outcome is ClaimOutcome.RUNNING:
        return f"running: attempt {result.attempt} holds a live lease on another instance"
    if outcome is ClaimOutcome.EARLY:
        return (f"early: the slot is more than {EARLY_TOLERANCE_MS} ms ahead of the store's "
                "clock")
    if outcome is ClaimOutcome.DONE:
        return "done: this run has already ended (or a later slot cancelled it)"
    if outcome is ClaimOutcome.BUFFERED:
        return ("buffered: another run of this job holds a lease; this slot runs once it "
                "ends")
    return "taken: another instance won this slot"
