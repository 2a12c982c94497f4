"""Test helpers for users of anarchon: an in-memory lease backend.

``MemoryBackend`` keeps runs in a dict and applies the same decision table as every
lease backend, so jobs can be unit-tested without a store::

    from anarchon_core import Scheduler
    from anarchon_core.testing import MemoryBackend

    scheduler = Scheduler(MemoryBackend())
    scheduler.every("sync", "10s", sync)
    run = await scheduler.run_now("sync")
    assert run.status == "success"

It lives in one process: several schedulers sharing one ``MemoryBackend`` object behave
like instances sharing a store, which makes races testable with a controllable clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .backend import Backend
from .decision import HANDED_OVER, Action, RunState, decide, needs_overlap_check
from .models import ClaimOutcome, ClaimRequest, ClaimResult, Run, RunRef
from .schedules import ms_to_datetime

__all__ = ["MemoryBackend"]


@dataclass
class _Attempt:
    attempt: int
    token: str
    status: str
    runner: str
    lease_until: int | None
    started_at: int
    finished_at: int | None = None
    error: str | None = None


class MemoryBackend(Backend):
    """A lease backend in process memory (for tests; nothing is persisted).

    :param clock: returns "the store's clock" in ms; defaults to the wall clock. Tests can
        pass their own to move time without sleeping.
    """

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self._clock = clock or (lambda: round(time.time() * 1000))
        self._runs: dict[tuple[str, int, bool], list[_Attempt]] = {}
        self._lock = asyncio.Lock()

    async def clock_ms(self) -> int:
        """The configured clock."""
        return self._clock()

    def _live_elsewhere(self, request: ClaimRequest, now: int) -> bool:
        for (job, slot, manual), attempts in self._runs.items():
            if job != request.job or (slot, manual) == (request.slot, request.manual):
                continue
            last = attempts[-1]
            if last.status == "running" and (last.lease_until or 0) > now:
                return True
        return False

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Apply the lease decision table."""
        async with self._lock:
            now = self._clock()
            key = (request.job, request.slot, request.manual)
            attempts = self._runs.get(key, [])
            current = attempts[-1] if attempts else None
            state = (RunState(current.attempt, current.token, current.status,
                              current.lease_until) if current else None)
            other = needs_overlap_check(request, state) and self._live_elsewhere(request, now)
            decision = decide(request, state, now, other)
            if decision.action is Action.START:
                if current is not None:
                    current.status, current.finished_at = "interrupted", now
                    current.error = current.error or decision.error
                    current.lease_until = None
                attempts.append(_Attempt(decision.attempt, request.token, "running",
                                         request.runner, decision.lease_until_ms, now))
                self._runs[key] = attempts
                self._trim(request, now)
            elif decision.action is Action.SKIP:
                attempts.append(_Attempt(1, request.token, "skipped", request.runner, None,
                                         now, now, decision.error))
            elif decision.action is Action.GIVE_UP and current is not None:
                current.status, current.finished_at = "interrupted", now
                current.error, current.lease_until = decision.error, None
            if attempts:
                self._runs[key] = attempts
            token = request.token if decision.outcome is ClaimOutcome.WON else None
            return ClaimResult(decision.outcome, decision.attempt, token,
                               decision.lease_until_ms)

    def _trim(self, request: ClaimRequest, now: int) -> None:
        """Keep about ``history_size`` runs and ``history_ttl_ms``, like the stores do."""
        slots = sorted((k for k in self._runs if k[0] == request.job), reverse=True)
        cutoffs = [slots[request.history_size][1]] if len(slots) > request.history_size else []
        if request.history_ttl_ms is not None:
            cutoffs.append(now - request.history_ttl_ms)
        if not cutoffs:
            return
        cutoff, keep_after = max(cutoffs), now - request.keep_ms
        for key in slots:
            if key[1] <= cutoff and key[1] < keep_after and \
                    self._runs[key][-1].status != "running":
                del self._runs[key]

    def _current(self, ref: RunRef) -> _Attempt | None:
        attempts = self._runs.get((ref.job, ref.slot, ref.manual))
        if not attempts:
            return None
        last = attempts[-1]
        if last.token != ref.token or last.attempt != ref.attempt or last.status != "running":
            return None
        return last

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease if ``ref`` is the current attempt."""
        current = self._current(ref)
        if current is None:
            return False
        current.lease_until = self._clock() + lease_ms
        return True

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the end if ``ref`` is the current attempt."""
        current = self._current(ref)
        if current is None:
            return False
        current.status, current.error = status, error
        current.finished_at, current.lease_until = self._clock(), None
        return True

    async def release(self, ref: RunRef) -> bool:
        """Expire the lease now (hand-over)."""
        current = self._current(ref)
        if current is None:
            return False
        current.lease_until, current.error = self._clock(), HANDED_OVER
        return True

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first."""
        now = self._clock()
        out = []
        for (name, slot, manual), attempts in self._runs.items():
            if name != job:
                continue
            for a in attempts:
                status, error = a.status, a.error
                if status == "running" and a.lease_until is not None and a.lease_until <= now:
                    status, error = "interrupted", error or "lease expired: the runner is gone"
                out.append(Run(job=name, slot=slot, attempt=a.attempt, status=status,
                               runner=a.runner, started_at=ms_to_datetime(a.started_at),
                               finished_at=ms_to_datetime(a.finished_at)
                               if a.finished_at is not None else None,
                               error=error, manual=manual))
        out.sort(key=lambda r: (r.slot, r.manual, r.attempt), reverse=True)
        return out[:limit]
