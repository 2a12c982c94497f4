"""Backups: every instance that lost a slot to a live run watches it, and orphans are recovered.

On a lease store a claim that finds its slot ``running`` elsewhere makes this instance a
backup (:meth:`Backups.watch`): it re-claims every one to two heartbeats, and the decision
table lets it take the run over (attempt + 1) once the runner's lease has expired. Runs
whose runner and watchers are all gone (every instance restarted) are found by
:meth:`Backups.orphan_loop`, which reads each job's expired runs and claims them like a
backup would.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from .backend import Backend
from .claim import ClaimHandle
from .claiming import Claims
from .errors import StoreUnavailable
from .events import run_fields as _fields
from .health import StoreHealth
from .jobs import RegisteredJob
from .models import ClaimOutcome, ExpiredRun
from .runs import Runs
from .storeclock import StoreClock
from .supervision import LoopGuard

__all__ = ["BackupSettings", "Backups"]

log = logging.getLogger("anarchon.scheduler")

#: Orphan recovery: jobs looked at per period, and expired runs read per job.
ORPHAN_JOBS_PER_PERIOD = 50
ORPHAN_RUNS_PER_JOB = 10


class BackupSettings(Protocol):
    """What backups read of their scheduler's configuration."""

    instance_id: str
    lease_ms: int
    heartbeat_ms: int


class Backups:
    """One scheduler's backup watches and orphan recovery (see the module's docstring).

    :param job: the job registered under a name now (None once removed).
    :param jobs: every registered job.
    :param spawn: run a coroutine as one of the scheduler's tasks.
    :param scans: whether this instance's orphan recovery looks at a job.
    """

    def __init__(self, backend: Backend, settings: BackupSettings, claims: Claims, runs: Runs,
                 *, health: StoreHealth, clock: StoreClock, stopping: Callable[[], bool],
                 job: Callable[[str], RegisteredJob | None],
                 jobs: Callable[[], list[RegisteredJob]],
                 spawn: Callable[[Coroutine[Any, Any, Any]], object],
                 scans: Callable[[str], bool] = lambda job: True) -> None:
        self._backend = backend
        self._settings = settings
        self._claims = claims
        self._runs = runs
        self._health = health
        self._clock = clock
        self._stopping = stopping
        self._job = job
        self._jobs = jobs
        self._spawn = spawn
        self._scans = scans
        self._orphan_cursor = 0

    def start_watch(self, job: RegisteredJob, slot: int) -> None:
        """Watch a scheduled slot running elsewhere, as a task of the scheduler."""
        self._spawn(self.watch(job, slot, manual=False))

    async def watch(self, job: RegisteredJob, slot: int, *, manual: bool) -> None:
        """Be a backup: re-claim every 1–2 heartbeats until the run ends or we take over.

        One token for the whole watch: a takeover that the store committed but whose
        answer was lost is won again by the next poll (the store knows the token), with
        the lease that commit set (often expired by then: see :meth:`Claims.rewon_lease`).

        After the store was unreachable, the runner could not heartbeat or record its end
        either, and its lease may have run out meanwhile: once the store answers again
        (a clock read), the backup leaves the runner one lease to catch up before it
        checks again, so a run that ended during the outage is not run a second time.
        """
        key = (slot, manual)
        if job.is_watching(key):
            return
        if job.watching is None:
            job.watching = set()
        job.watching.add(key)
        claims = self._claims
        request = claims.request(job, slot, manual=manual)
        unreachable = False
        lost = False  # a poll's answer was lost since the last one answered
        try:
            while not self._stopping() and self._job(job.name) is job:
                await asyncio.sleep(self._settings.heartbeat_ms * random.uniform(1, 2) / 1000)
                if unreachable:
                    unreachable = not await self._store_answers()
                    if not unreachable:
                        await asyncio.sleep(request.lease_ms / 1000)
                    continue
                try:
                    result, sent = await claims.send(request)
                except StoreUnavailable as exc:
                    log.debug("%s slot %s: backup check failed: %s", job.name, slot, exc)
                    unreachable = lost = True
                    continue
                if result.won:
                    claims.report(request, result)
                    log.warning("%s slot %s: lease expired, taking over as attempt %s",
                                job.name, slot, result.attempt,
                                extra=_fields(job.name, slot, result.attempt,
                                              self._settings.instance_id))
                    if lost:
                        sent = claims.rewon_lease(request, result, sent)
                    # Won too late to run (fenced at once): the lease runs out by the store's
                    # clock and orphan recovery takes the run, with a token of its own.
                    outcome = await claims.after_won(claims.handle(request, result, sent))
                    if isinstance(outcome, ClaimHandle):
                        await self._runs.run_handle(job, outcome)
                    return
                if result.outcome is ClaimOutcome.BUFFERED:
                    # The slot's waiting holder is gone: wait on in its place.
                    claims.report(request, result)
                    await self._runs.run_buffered(job, request,
                                                  claims.handle(request, result, sent))
                    return
                if result.outcome is not ClaimOutcome.RUNNING:
                    return
                lost = False
        finally:
            if job.watching is not None:
                job.watching.discard(key)
                if not job.watching:
                    job.watching = None

    async def _store_answers(self) -> bool:
        """Whether the store answers a clock read now."""
        try:
            await self._clock.read_store_ms()
        except StoreUnavailable:
            return False
        return True

    async def orphan_loop(self, guard: LoopGuard) -> None:
        """Recover runs whose runner and watchers are all gone (on start, then periodically).

        Each period looks at a bounded number of jobs; an expired run is claimed like a
        backup would, so the decision table takes it over (attempt + 1) or gives it up.
        With contender sets, only a job's contenders for :data:`~.contenders.ORPHAN_SCAN`
        scan it (``scans``).
        """
        period = self._settings.lease_ms / 1000
        while not self._stopping():
            runnable = [j for j in self._jobs()
                        if j.handler is not None or j.on_takeover is not None]
            jobs = [j for j in runnable if self._scans(j.name)]
            if jobs:
                # Each job is looked at as often as without contender sets: a share of the
                # batch as large as this instance's share of the jobs.
                size = -(-ORPHAN_JOBS_PER_PERIOD * len(jobs) // len(runnable))
                start = self._orphan_cursor % len(jobs)
                batch = (jobs[start:] + jobs[:start])[:size]
                self._orphan_cursor = start + len(batch)
                for job in batch:
                    if self._stopping():
                        return
                    with guard.item(f"job {job.name!r}"):
                        if not await self._scan_orphans(job):
                            break
            await asyncio.sleep(period * random.uniform(0.75, 1.25))

    async def _scan_orphans(self, job: RegisteredJob) -> bool:
        """Recover the expired runs of one job; False if the store is unreachable."""
        try:
            expired = await self._health.timed(
                "expired_runs", self._backend.expired_runs(job.name, ORPHAN_RUNS_PER_JOB))
        except StoreUnavailable as exc:
            log.debug("orphan scan of %s failed: %s", job.name, exc)
            return False
        for run in expired:
            if not job.is_watching((run.slot, run.manual)):
                self._spawn(self._recover(job, run))
        return True

    def _orphan_window_ms(self, job: RegisteredJob) -> int:
        return max(job.options.max_late_ms, job.options.catch_up_ms) + \
            2 * self._settings.lease_ms

    async def _recover(self, job: RegisteredJob, run: ExpiredRun) -> None:
        if job.is_watching((run.slot, run.manual)) or self._runs.runs_here(job.name, run.slot):
            return
        expired_at = run.lease_until_ms if run.lease_until_ms is not None else run.slot
        too_old = self._clock.now_ms() - expired_at > self._orphan_window_ms(job)
        claims = self._claims
        # Too old to run again: close it as interrupted for good (max_attempts=0 gives up).
        request = claims.request(job, run.slot, manual=run.manual,
                                 max_attempts=0 if too_old or run.manual else None)
        try:
            result, sent = await claims.send(request)
        except StoreUnavailable as exc:
            log.debug("%s slot %s: orphan claim failed: %s", job.name, run.slot, exc)
            return
        claims.report(request, result)
        if result.won:
            if not self._stopping():
                log.warning("%s slot %s: orphaned run (no runner, no backup) taken over as "
                            "attempt %s", job.name, run.slot, result.attempt,
                            extra=_fields(job.name, run.slot, result.attempt,
                                          self._settings.instance_id))
            await self._runs.go_on(job, run.slot,
                                   await claims.after_won(claims.handle(request, result, sent)))
        elif result.outcome is ClaimOutcome.BUFFERED:
            await self._runs.run_buffered(job, request, claims.handle(request, result, sent))
        elif result.outcome is ClaimOutcome.RUNNING:
            await self.watch(job, run.slot, manual=run.manual)
        elif too_old:
            log.warning("%s slot %s: orphaned run older than its recovery window closed as "
                        "interrupted", job.name, run.slot)
