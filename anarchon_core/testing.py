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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .backend import Backend
from .backends.common import refuse_write
from .decision import (
    CANCELLED,
    WAITING,
    Action,
    RunState,
    decide,
    lease_is_live,
    needs_overlap_check,
    released_error,
    update_applies,
)
from .models import (
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ExpiredRun,
    HistoryQuery,
    Run,
    RunPage,
    RunRef,
)
from .readmodel import dump_meta, history_reader, load_meta, page_jobs, read_status
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
    meta: str | None = None


class MemoryBackend(Backend):
    """A lease backend in process memory (for tests; nothing is persisted).

    :param clock: returns "the store's clock" in ms; defaults to the wall clock. Tests can
        pass their own to move time without sleeping.
    :param read_only: refuse every write (:class:`~anarchon_core.errors.ReadOnlyError`);
        :meth:`reader` gives a read-only view of another memory backend's runs.
    """

    def __init__(self, clock: Callable[[], int] | None = None, *,
                 read_only: bool = False) -> None:
        self._clock = clock or (lambda: round(time.time() * 1000))
        self._runs: dict[tuple[str, int, bool], list[_Attempt]] = {}
        self._controls: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self.read_only = read_only

    def reader(self) -> MemoryBackend:
        """A read-only backend that sees this backend's runs (as a second instance would)."""
        view = MemoryBackend(self._clock, read_only=True)
        view._runs = self._runs
        view._controls = self._controls
        view._lock = self._lock
        return view

    async def clock_ms(self) -> int:
        """The configured clock."""
        return self._clock()

    def _live_elsewhere(self, request: ClaimRequest, now: int) -> tuple[bool, bool]:
        """Whether another run of the job holds a live lease, and whether one of those waits."""
        live = waiting = False
        for (job, slot, manual), attempts in self._runs.items():
            if job != request.job or (slot, manual) == (request.slot, request.manual):
                continue
            last = attempts[-1]
            if last.status == "running" and lease_is_live(last.lease_until, now):
                live = True
                waiting = waiting or last.error == WAITING
        return live, waiting

    def _cancel_others(self, request: ClaimRequest, now: int) -> None:
        for (job, slot, manual), attempts in self._runs.items():
            last = attempts[-1]
            if job == request.job and (slot, manual) != (request.slot, request.manual) and \
                    last.status == "running" and last.lease_until is not None and \
                    last.lease_until > now:
                last.error = CANCELLED

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Apply the lease decision table."""
        refuse_write(self, "claim")
        async with self._lock:
            now = self._clock()
            key = (request.job, request.slot, request.manual)
            attempts = self._runs.get(key, [])
            current = attempts[-1] if attempts else None
            state = (RunState(current.attempt, current.token, current.status,
                              current.lease_until, current.error) if current else None)
            live, waiting = self._live_elsewhere(request, now) \
                if needs_overlap_check(request, state) else (False, False)
            decision = decide(request, state, now, live, waiting)
            if decision.cancel_others:
                self._cancel_others(request, now)
            if decision.action in (Action.START, Action.WAIT):
                waits = decision.action is Action.WAIT
                if current is not None:
                    current.status, current.finished_at = "interrupted", now
                    current.error = current.error or (None if waits else decision.error)
                    current.lease_until = None
                attempts.append(_Attempt(decision.attempt, request.token, "running",
                                         request.runner, decision.lease_until_ms, now,
                                         error=WAITING if waits else None))
                self._runs[key] = attempts
                self._trim(request, now)
            elif decision.action is Action.RESUME and current is not None:
                current.error, current.lease_until = None, decision.lease_until_ms
            elif decision.action is Action.SKIP:
                attempts.append(_Attempt(1, request.token, decision.status, request.runner,
                                         None, now, now, decision.error))
            elif decision.action is Action.GIVE_UP and current is not None:
                # An earlier note (a hand-over, a cancellation) stays, as in the stores.
                current.status, current.finished_at = "interrupted", now
                current.error = current.error or decision.error
                current.lease_until = None
            if attempts:
                self._runs[key] = attempts
            token = request.token if decision.outcome is ClaimOutcome.WON else None
            return ClaimResult(decision.outcome, decision.attempt, token,
                               decision.lease_until_ms)

    def _trim(self, request: ClaimRequest, now: int) -> None:
        """Keep about ``history_size`` runs and ``history_ttl_ms``, like the stores do."""
        keep = self.retention
        slots = sorted((k for k in self._runs if k[0] == request.job), reverse=True)
        cutoffs = [slots[keep.history_size][1]] if len(slots) > keep.history_size else []
        if keep.history_ttl_ms is not None:
            cutoffs.append(now - keep.history_ttl_ms)
        if not cutoffs:
            return
        cutoff, keep_after = max(cutoffs), now - keep.keep_ms
        for key in slots:
            if key[1] <= cutoff and key[1] < keep_after and \
                    self._runs[key][-1].status != "running":
                del self._runs[key]

    def _current(self, ref: RunRef, update: str) -> _Attempt | None:
        """The attempt ``update`` acts on (:func:`~anarchon_core.decision.update_applies`)."""
        attempts = self._runs.get((ref.job, ref.slot, ref.manual))
        if not attempts:
            return None
        last = attempts[-1]
        mine = last.token == ref.token and last.attempt == ref.attempt
        return last if update_applies(update, last.status, last.error, mine) else None

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease if ``ref`` is the current attempt."""
        refuse_write(self, "heartbeat")
        current = self._current(ref, "heartbeat")
        if current is None:
            return False
        current.lease_until = self._clock() + lease_ms
        return True

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the end (and ``meta``) if ``ref`` is the current attempt."""
        refuse_write(self, "finish")
        stored_meta = dump_meta(meta)
        current = self._current(ref, "finish")
        if current is None:
            return False
        current.status, current.error, current.meta = status, error, stored_meta
        current.finished_at, current.lease_until = self._clock(), None
        return True

    async def release(self, ref: RunRef) -> bool:
        """Expire the lease now (hand-over)."""
        refuse_write(self, "release")
        current = self._current(ref, "release")
        if current is None:
            return False
        current.lease_until, current.error = self._clock(), released_error(current.error)
        return True

    async def add_meta(self, ref: RunRef, meta: Mapping[str, str]) -> bool:
        """Merge ``meta`` into an ended attempt's meta (False: no such ended attempt)."""
        refuse_write(self, "add_meta")
        for attempt in self._runs.get((ref.job, ref.slot, ref.manual), []):
            if attempt.attempt == ref.attempt and attempt.status != "running":
                attempt.meta = dump_meta({**load_meta(attempt.meta), **meta})
                return True
        return False

    async def slot_states(self, slots: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], str] | None:
        """The newest attempt's status of each scheduled slot on record."""
        return {(job, slot): attempts[-1].status for job, slot in slots
                if (attempts := self._runs.get((job, slot, False)))}

    async def expired_runs(self, job: str, limit: int = 100) -> list[ExpiredRun]:
        """Runs of ``job`` still running whose lease expired by the configured clock."""
        now = self._clock()
        out = []
        for (name, slot, manual), attempts in self._runs.items():
            last = attempts[-1]
            if name == job and last.status == "running" and \
                    (last.lease_until is None or last.lease_until <= now):
                out.append(ExpiredRun(name, slot, last.attempt, manual, last.lease_until))
                if len(out) >= limit:
                    break
        return out

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first."""
        now = self._clock()
        out = []
        for (name, slot, manual), attempts in self._runs.items():
            if name != job:
                continue
            for a in attempts:
                status, error = read_status(a.status, a.error, a.lease_until, now)
                out.append(Run(job=name, slot=slot, attempt=a.attempt, status=status,
                               runner=a.runner, started_at=ms_to_datetime(a.started_at),
                               finished_at=ms_to_datetime(a.finished_at)
                               if a.finished_at is not None else None,
                               error=error, manual=manual, meta=load_meta(a.meta)))
        out.sort(key=lambda r: (r.slot, r.manual, r.attempt), reverse=True)
        return out[:limit]

    async def runs(self, query: HistoryQuery) -> RunPage:
        """One page of history across every job, newest first."""
        return await page_jobs({k[0] for k in self._runs}, history_reader(self.history), query)

    async def write_control(self, name: str, value: str | None) -> None:
        """Set or delete a control record (pausing, the fleet registry)."""
        refuse_write(self, "write_control")
        if value is None:
            self._controls.pop(name, None)
        else:
            self._controls[name] = value

    async def read_controls(self, prefix: str) -> dict[str, str]:
        """The control records whose name starts with ``prefix``."""
        return {k: v for k, v in self._controls.items() if k.startswith(prefix)}

    async def job_names(self) -> dict[str, Run | None]:
        """Every job with runs, with its newest attempt."""
        names = sorted({k[0] for k in self._runs})
        return {name: next(iter(await self.history(name, 1)), None) for name in names}
