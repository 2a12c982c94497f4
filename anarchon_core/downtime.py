"""Slots nobody ran, recorded ``missed``: after the whole fleet was down, or the store was.

On start a scheduler scans its jobs (:meth:`MissedSlots.scan`): a slot after a job's
newest record in the store and before now was due while no instance could claim it. After
a store outage, the slots this instance could not claim meanwhile are recorded the same
way (:meth:`MissedSlots.record`). Each slot is recorded once fleet-wide, by whichever
instance's ``missed`` request comes first, and only once its claim window has closed, so a
live instance still claiming it, or a catch-up, always comes first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import StoreUnavailable
from .events import EventBus, EventKind
from .models import ClaimOutcome, ClaimRequest, ClaimResult

if TYPE_CHECKING:
    from .backend import Backend
    from .health import StoreHealth
    from .jobs import RegisteredJob
    from .schedules import Schedule
    from .supervision import LoopGuard

__all__ = ["CATCH_UP_ALL_MAX", "MISSED_DOWN", "MISSED_STORE", "MissedSlots", "catch_up_slots",
           "slots_between"]

log = logging.getLogger("anarchon.scheduler")

MISSED_DOWN = ("missed: no instance claimed it in time (every instance was down or could "
               "not reach the store)")
MISSED_STORE = "missed: the store was unreachable until it was too late"
#: Most slots recorded per job by one scan; jobs read per store call; the margin past a
#: slot's claim window before it is recorded (ms); requests per store call.
MISSED_PER_JOB = 100
SCAN_CHUNK = 200
MARGIN_MS = 1_000
PAGE = 1_000
#: ``catch_up="all"`` runs at most this many missed slots of a job per start (the newest).
CATCH_UP_ALL_MAX = 1_000


class MissedSlots:
    """Records the slots of a scheduler's jobs that no instance ran.

    :param now_ms: the store's clock (ms).
    :param request: the claim request of a job's slot, as the scheduler makes it.
    """

    def __init__(self, backend: Backend, health: StoreHealth, events: EventBus, *,
                 now_ms: Callable[[], float],
                 request: Callable[[RegisteredJob, int], ClaimRequest]) -> None:
        self._backend = backend
        self._health = health
        self._events = events
        self._now_ms = now_ms
        self._request = request

    async def scan(self, jobs: list[RegisteredJob], guard: LoopGuard) -> None:
        """Record ``missed`` the slots of ``jobs`` after their newest record (on start)."""
        firing = [j for j in jobs if j.fires and j.schedule is not None and j.handler]
        for first in range(0, len(firing), SCAN_CHUNK):
            if first:
                await asyncio.sleep(1.0)  # thousands of jobs: a gentle background scan
            chunk = firing[first:first + SCAN_CHUNK]
            with guard.item(f"jobs {chunk[0].name!r} to {chunk[-1].name!r}"):
                if not await self._scan_chunk(chunk, guard):
                    return

    async def _scan_chunk(self, chunk: list[RegisteredJob], guard: LoopGuard) -> bool:
        """The scan of some jobs; False if the store is unreachable (the scan ends)."""
        now = round(self._now_ms())
        try:
            newest = await self._backend.newest_slots([j.name for j in chunk])
        except StoreUnavailable as exc:
            log.debug("downtime accounting skipped: %s", exc)
            return False
        pending: list[tuple[RegisteredJob, int]] = []
        for job in chunk:
            last = newest.get(job.name)
            if last is not None and job.schedule is not None:
                with guard.item(f"job {job.name!r}"):
                    # catch_up="all" runs its window's slots: not missed, only late.
                    caught = set(catch_up_slots(job, job.schedule, now)) \
                        if job.options.catch_up == "all" else set()
                    pending += [(job, slot) for slot in slots_between(
                        job.schedule, last, now, MISSED_PER_JOB) if slot not in caught]
        if pending:
            closes = max(slot + max(j.options.max_late_ms, j.options.catch_up_ms)
                         + j.options.jitter_ms for j, slot in pending) + MARGIN_MS
            await asyncio.sleep(max(0.0, closes - self._now_ms()) / 1000)
            await self.record(pending, MISSED_DOWN)
        return True

    async def record(self, pending: list[tuple[RegisteredJob, int]], reason: str) -> None:
        """Send a ``missed`` request for each slot; the first request per slot records it."""
        recorded: dict[str, int] = {}
        for start in range(0, len(pending), PAGE):
            part = pending[start:start + PAGE]
            requests = [dataclasses.replace(self._request(job, slot), missed=reason)
                        for job, slot in part]
            sent = self._health.clock.monotonic()
            results = await self._backend.claim_many(requests)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                self._health.failed("claim", failed[0], sent)
            for request, result in zip(requests, results, strict=True):
                if isinstance(result, ClaimResult) and result.outcome is ClaimOutcome.LATE:
                    recorded[request.job] = recorded.get(request.job, 0) + 1
                    self._events.emit(EventKind.MISSED, job=request.job, slot=request.slot,
                                      attempt=1, outcome="missed", reason=reason)
        if recorded:
            jobs = ", ".join(f"{name} ×{n}" for name, n in sorted(recorded.items())[:5])
            more = f" and {len(recorded) - 5} more job(s)" if len(recorded) > 5 else ""
            log.warning("recorded %d slot(s) as missed (%s): %s%s", sum(recorded.values()),
                        reason, jobs, more)


def slots_between(schedule: Schedule, after: int, upto: int, limit: int) -> list[int]:
    """The newest ``limit`` slots ``s`` of ``schedule`` with ``after < s <= upto``, in order."""
    out: list[int] = []
    at = schedule.latest_at_or_before(upto)
    while at > after and len(out) < limit:
        out.append(at)
        at = schedule.latest_at_or_before(at - 1)
    return out[::-1]


def catch_up_slots(job: RegisteredJob, schedule: Schedule, now: int) -> list[int]:
    """The slots within the job's ``catch_up_ms`` before ``now``, oldest first.

    At most :data:`CATCH_UP_ALL_MAX` (the newest). A start's catch-up claims them; those
    that ran, or run elsewhere, answer so.
    """
    return slots_between(schedule, now - job.options.catch_up_ms - 1, now, CATCH_UP_ALL_MAX)
