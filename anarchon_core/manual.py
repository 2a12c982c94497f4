"""Runs outside the schedule: :meth:`Scheduler.run_now` and :meth:`Scheduler.backfill`.

Each manual run is claimed like a scheduled one (manual, one attempt, overlap allowed), so a
slot runs once fleet-wide even when two backfills of the same range race; it runs here on
the scheduler's handler threads, or on a small pool of its own when the scheduler is not
running.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import datetime

from .backend import Backend
from .claiming import Claims
from .errors import ConfigError
from .jobs import RegisteredJob
from .models import HistoryQuery, Run
from .runs import Runs
from .schedules import Schedule, ms_to_datetime
from .slots import slot_from_datetime, slot_to_datetime
from .threads import HandlerThreads

__all__ = ["ManualRuns", "as_slot", "backfill_slots"]

log = logging.getLogger("anarchon.scheduler")

#: The largest page asked of a store in one read.
STORE_PAGE = 1_000
#: A manual run's slot is its instant; one already taken in that millisecond moves on by 1.
_SLOT_TRIES = 10
#: How long a manual run's claim retries a store that does not answer (ms).
_CLAIM_RETRY_MS = 30_000


class ManualRuns:
    """One scheduler's manual runs (see the module's docstring)."""

    def __init__(self, backend: Backend, claims: Claims, runs: Runs, *,
                 now_ms: Callable[[], float], stopping: Callable[[], bool]) -> None:
        self._backend = backend
        self._claims = claims
        self._runs = runs
        self._now_ms = now_ms
        self._stopping = stopping

    async def run_now(self, job: RegisteredJob) -> Run:
        """Run ``job`` now on this instance, outside its schedule; its :class:`Run`."""
        claims, runs = self._claims, self._runs
        with self._threads() as threads:
            slot = round(self._now_ms())
            for _ in range(_SLOT_TRIES):
                request = claims.request(job, slot, manual=True)
                result, sent = await claims.call(request, slot + _CLAIM_RETRY_MS)
                if result.won:
                    attempt = runs.attempt(job, claims.handle(request, result, sent), threads)
                    await runs.run_attempt(attempt)
                    return attempt.as_run()
                slot += 1
            raise RuntimeError(f"could not claim a manual run of {job.name!r}")

    async def backfill(self, job: RegisteredJob, start: datetime | int, end: datetime | int,
                       limit: int) -> list[Run]:
        """Run the slots of ``job`` from ``start`` to ``end`` with no success yet, oldest first."""
        if job.schedule is None:
            raise ConfigError(f"job {job.name!r} has no schedule to backfill")
        lo, hi = as_slot(start, "start"), as_slot(end, "end")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ConfigError(f"invalid limit {limit!r}: expected an int in 1..100000")
        now = round(self._now_ms())
        if hi < lo or hi > now:
            raise ConfigError(f"invalid backfill range {_iso(lo)} to {_iso(hi)}: expected "
                              f"start ≤ end ≤ now ({_iso(now)})")
        slots = backfill_slots(job.name, job.schedule, lo, hi, limit)
        done = await self._succeeded_slots(job.name, lo)
        claims, runs = self._claims, self._runs
        made: list[Run] = []
        with self._threads() as threads:
            for slot in slots:
                if slot in done or self._stopping():
                    continue
                request = claims.request(job, slot, manual=True)
                result, sent = await claims.call(request, None)
                if not result.won:
                    log.info("%s slot %s: backfill skipped (%s)", job.name, slot,
                             result.outcome.value)
                    continue
                attempt = runs.attempt(job, claims.handle(request, result, sent), threads)
                await runs.run_attempt(attempt)
                made.append(attempt.as_run())
        return made

    async def _succeeded_slots(self, name: str, since: int) -> set[int]:
        """Slots of ``name`` at or after ``since`` with a successful attempt in history."""
        found: set[int] = set()
        cursor: str | None = None
        for _ in range(1_000):  # pages of 1,000: a million runs back at most
            page = await self._backend.runs(HistoryQuery(job=name, status="success",
                                                         before=cursor, limit=STORE_PAGE))
            found.update(r.slot for r in page if r.slot >= since)
            cursor = page.cursor
            if cursor is None or not page or min(r.slot for r in page) < since:
                break
        return found

    @contextlib.contextmanager
    def _threads(self) -> Iterator[HandlerThreads]:
        """The scheduler's handler threads, or a small pool when it is not running."""
        own = self._runs.threads is None
        threads = self._runs.threads or HandlerThreads(1, "anarchon-run-now")
        try:
            yield threads
        finally:
            if own:
                threads.shutdown(wait=False)


def backfill_slots(name: str, schedule: Schedule, lo: int, hi: int, limit: int) -> list[int]:
    """The slots of ``schedule`` from ``lo`` to ``hi`` (inclusive); ConfigError past ``limit``."""
    slots: list[int] = []
    try:
        at = schedule.latest_at_or_before(lo - 1)
        while (at := schedule.next_after(at)) <= hi:
            if len(slots) == limit:
                raise ConfigError(f"{name}: more than {limit} slots from {_iso(lo)} to "
                                  f"{_iso(hi)}; backfill a shorter range or raise the limit "
                                  "(limit=, or --limit of anarchon backfill)")
            slots.append(at)
    except OverflowError:  # a cron schedule's slots are datetimes: none before 0001-01-01
        raise ConfigError(f"invalid backfill range {_iso(lo)} to {_iso(hi)}: {name}'s slots "
                          "cannot be computed that close to 0001-01-01 or 9999-12-31; start "
                          "later") from None
    return slots


def as_slot(value: datetime | int, what: str) -> int:
    """A slot (ms since the epoch) from an aware datetime or an int; ConfigError otherwise."""
    if isinstance(value, datetime):
        return slot_from_datetime(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"invalid {what} {value!r}: expected an aware datetime or int ms "
                          "since the epoch")
    slot_to_datetime(value)  # ConfigError outside 0001-01-01..9999-12-31 UTC
    return value


def _iso(slot: int) -> str:
    return ms_to_datetime(slot).isoformat(timespec="seconds").replace("+00:00", "Z")
