"""The :class:`Scheduler`: registration, the per-job timer loops, claims, backups and stop."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, tzinfo
from types import TracebackType
from typing import Any, TypeVar, overload

from . import sharing
from .backend import Backend, Retention, new_token
from .claim import ClaimHandle, LeaseTimings, retry_delay
from .decision import EARLY_TOLERANCE_MS, OVERLAP_SKIP, late_error
from .downtime import MISSED_STORE, MissedSlots
from .durations import Duration
from .errors import ConfigError, StoreUnavailable
from .events import EventBus, EventKind, Listener
from .events import run_fields as _fields
from .execution import Attempt, Handler
from .fleet import PAUSED, FleetStatus, JobDefinition, PauseInfo, check_job_name, validate_reason
from .health import StoreHealth
from .jobs import RegisteredJob
from .lifecycle import serve
from .membership import FleetMember
from .models import (
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ExpiredRun,
    HistoryQuery,
    JobInfo,
    Run,
    RunPage,
    RunRef,
)
from .naming import validate_instance_id, validate_job_name
from .options import DEFAULT_LEASE_MS, JobOptions, validate_history, validate_lease_timings
from .schedules import CronSchedule, Schedule, every_schedule, ms_to_datetime
from .slots import slot_from_datetime, slot_to_datetime
from .storeclock import StoreClock
from .supervision import LoopGuard
from .sync import SyncScheduler
from .threads import DEFAULT_HANDLER_THREADS, HandlerThreads
from .timers import SlotTimers
from .url import backend_from_url

__all__ = ["NotClaimed", "Scheduler", "run_forever"]

log = logging.getLogger("anarchon.scheduler")

H = TypeVar("H", bound=Handler)
#: Runs stay in the store at least this long past max_late_ms/catch_up_ms.
_KEEP_MARGIN_MS = 60_000
DEFAULT_STOP_GRACE_MS = 5_000
_EARLY_RETRIES = 3
#: Orphan recovery: jobs looked at per period, and expired runs read per job.
_ORPHAN_JOBS_PER_PERIOD = 50
_ORPHAN_RUNS_PER_JOB = 10
#: The largest page asked of a store in one read.
_STORE_PAGE = 1_000
#: How long stop() waits for runs whose handler returned to record their end.
_RECORD_WAIT_S = 10.0


@dataclass(frozen=True)
class NotClaimed:
    """Why :meth:`Scheduler.try_claim` did not win a slot (falsy).

    ``outcome`` is the claim's answer (``taken``, ``running``, ``overlap``, ``done``,
    ``late``, ``early``) and ``reason`` says it in words, as history records a skip.
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


def _resolve_backend(backend: Backend | str | None) -> Backend:
    if isinstance(backend, Backend):
        return backend
    if backend is None:
        url = os.environ.get("ANARCHON_URL")
        if url:
            return backend_from_url(url)
        return backend_from_url("redis://localhost:6379")
    if isinstance(backend, str):
        return backend_from_url(backend)
    raise ConfigError(
        f"invalid backend {backend!r}: expected a Backend, a URL string or None"
    )


class Scheduler:
    """Runs registered jobs; every instance runs the same, and each slot runs once.

    :param backend: a :class:`Backend`, a URL (see :func:`backend_from_url`) or ``None``
        for the URL in ``ANARCHON_URL``, else Redis on localhost:6379. Several schedulers
        may share one backend object (on one event loop).
    :param instance_id: recorded in history; default ``"<hostname>:<pid>"``.
    :param lease_ms: lease length (lease backends only); default 30 s.
    :param heartbeat_ms: heartbeat period, smaller than ``lease_ms``; default a third of it.
    :param history_size: about how many runs per job the store keeps.
    :param history_ttl_ms: if set, runs older than this are dropped too.
    :param handler_threads: size of the thread pool for sync handlers (default 32).
    :param stop_grace_ms: how long :meth:`stop` lets handlers finish (default 5 s).

    Use it with ``await start()``/``await stop()``, ``async with scheduler:``,
    :meth:`run_forever` in scripts, or through :attr:`sync` from synchronous code.
    ``every``, ``cron``, ``define`` and ``remove`` may be called from any thread, also
    while the scheduler runs.
    """

    def __init__(
        self, backend: Backend | str | None = None, *, instance_id: str | None = None,
        lease_ms: int | None = DEFAULT_LEASE_MS, heartbeat_ms: int | None = None,
        history_size: int = 1000, history_ttl_ms: int | None = None,
        handler_threads: int = DEFAULT_HANDLER_THREADS,
        stop_grace_ms: int = DEFAULT_STOP_GRACE_MS,
    ) -> None:
        self.backend = _resolve_backend(backend)
        if lease_ms is DEFAULT_LEASE_MS:
            lease_ms = None  # not given: a claim-only backend takes it
        if not self.backend.supports_leases and (lease_ms is not None or heartbeat_ms is not None):
            given = ", ".join(n for n, v in (("lease_ms", lease_ms), ("heartbeat_ms", heartbeat_ms))
                              if v is not None)
            raise ConfigError(
                f"{given} need a lease backend (Redis/Valkey strategy 'lease', PostgreSQL, "
                f"SQLite); {self.backend.describe()} only claims"
            )
        if instance_id is None:
            instance_id = f"{socket.gethostname()}:{os.getpid()}"
        self.instance_id = validate_instance_id(instance_id)
        self.lease_ms, self.heartbeat_ms = validate_lease_timings(lease_ms, heartbeat_ms)
        #: One LeaseTimings shared by every handle (made again if the timings change).
        self._timings: LeaseTimings | None = None
        self.history_size, self.history_ttl_ms = validate_history(history_size, history_ttl_ms)
        if isinstance(handler_threads, bool) or not isinstance(handler_threads, int) \
                or not 1 <= handler_threads <= 10_000:
            raise ConfigError(f"invalid handler_threads {handler_threads!r}: expected an int "
                              "in 1..10000")
        self.handler_threads = handler_threads
        if isinstance(stop_grace_ms, bool) or not isinstance(stop_grace_ms, int) \
                or stop_grace_ms < 0:
            raise ConfigError(f"invalid stop_grace_ms {stop_grace_ms!r}: expected an int ≥ 0")
        self.stop_grace_ms = stop_grace_ms
        self._jobs: dict[str, RegisteredJob] = {}
        self._jobs_lock = threading.RLock()
        self._attempts: set[Attempt] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        #: Bound once: every run's task gets it as its done-callback, run in one context
        #: (it only forgets the task and logs a crash) instead of a copy per task.
        self._on_task_done = self._task_done
        self._done_context = contextvars.Context()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._stopping = False
        #: One timer for every job: (fire at, store-clock ms; sequence; slot; job name). Only
        #: numbers and a name, so the collector stops tracking them (thousands of jobs).
        self._timers = SlotTimers(self._now_ms)
        self._threads: HandlerThreads | None = None
        self._orphan_cursor = 0
        #: The longest a late claim or a catch-up of any job here may ask back (ms).
        self._keep_ms = 0
        self._closer: asyncio.Future[None] | None = None
        self._events = EventBus(self.instance_id)
        self._health = StoreHealth(self._events, self.backend.describe(),
                                   on_recovered=self._on_store_recovered)
        #: The store's clock: what every slot, lateness and timer is reckoned in.
        self._clock = StoreClock(self.backend, self._health, self._events,
                                 on_moved=self._timers.clock_moved)
        self._missed = MissedSlots(self.backend, self._health, self._events,
                                   now_ms=self._now_ms, request=self._request)
        self._fleet = FleetMember(self.backend, self.instance_id, health=self._health,
                                  clock=self._clock, jobs_version=lambda: self._jobs_version,
                                  job_definitions=self._job_definitions,
                                  stopping=lambda: self._stopping)
        #: Bumped when a job is added or removed (the fleet registry rewrites its list).
        self._jobs_version = 0
        #: Synchronous twins of the coroutine methods, for sync code (see :class:`SyncScheduler`).
        self.sync = SyncScheduler(self)

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return (f"<Scheduler {self.instance_id} {state} jobs={len(self._jobs)} "
                f"backend={self.backend.describe()}>")

    # ---------------------------------------------------------------- events

    def add_listener(self, listener: Listener,
                     kinds: Iterable[EventKind | str] | None = None) -> Listener:
        """Call ``listener(event)`` for each :class:`~anarchon_core.Event` (see docs/operations.md).

        ``kinds`` limits it to some :class:`~anarchon_core.EventKind` values. A plain
        function runs inline on the scheduler's loop and must return quickly; a coroutine
        function gets a task per event. A listener's exception is logged, never raised.
        Returns ``listener``, so it also works as a decorator. Thread-safe.
        """
        self._events.add(listener, kinds)
        return listener

    def remove_listener(self, listener: Listener) -> bool:
        """Stop calling ``listener``; False if it was not added."""
        return self._events.remove(listener)

    async def probe_store(self) -> float:
        """Ask the store for its clock (a cheap liveness probe); the round trip in ms.

        Counts toward the store's health like every other call (one log line when an
        outage starts, one when it ends) and raises
        :class:`~anarchon_core.StoreUnavailable` when the store does not answer.
        """
        await self._open_backend()
        sent = time.monotonic()
        await self._clock.read_store_ms()
        return (time.monotonic() - sent) * 1000

    @property
    def store_down(self) -> bool:
        """True from a failed store call until the next one that succeeds."""
        return self._health.down

    def _report_claim(self, request: ClaimRequest, result: ClaimResult) -> None:
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
            fields["lateness_ms"] = self._now_ms() - request.slot
        elif outcome is ClaimOutcome.OVERLAP:
            kind, fields["reason"] = EventKind.CLAIM_SKIPPED, OVERLAP_SKIP
        elif outcome is ClaimOutcome.LATE:
            kind, fields["reason"] = EventKind.LATE, late_error(request, round(self._now_ms()))
        elif outcome is ClaimOutcome.EARLY:
            kind = EventKind.EARLY
        else:
            kind = EventKind.CLAIM_TAKEN
        events.emit(kind, **fields)

    # ---------------------------------------------------------------- registration

    @overload
    def every(self, name: str, interval: Duration, handler: None = None, *,
              offset: Duration = 0, **options: Any) -> Callable[[H], H]: ...
    @overload
    def every(self, name: str, interval: Duration, handler: H, *,
              offset: Duration = 0, **options: Any) -> H: ...

    def every(self, name: str, interval: Duration, handler: Handler | None = None, *,
              offset: Duration = 0, **options: Any) -> Any:
        """Register a job on the epoch grid: ``every("sync", "10s")`` runs at :00, :10...

        Without ``handler`` it returns a decorator. Options: ``timeout_ms``,
        ``jitter_ms``, ``max_late_ms``, and on lease backends ``overlap``,
        ``max_attempts``, ``catch_up_ms``.
        """
        schedule = every_schedule(interval, offset)
        return self._register(name, schedule, handler, options)

    @overload
    def cron(self, name: str, expression: str, handler: None = None, *,
             tz: str | tzinfo = "UTC", **options: Any) -> Callable[[H], H]: ...
    @overload
    def cron(self, name: str, expression: str, handler: H, *, tz: str | tzinfo = "UTC",
             **options: Any) -> H: ...

    def cron(self, name: str, expression: str, handler: Handler | None = None, *,
             tz: str | tzinfo = "UTC", **options: Any) -> Any:
        """Register a job on a cron expression (5 fields, or 6 with seconds first) in ``tz``.

        ``tz`` is an IANA name (``"Europe/Athens"``) or a zone object that has one
        (``ZoneInfo("Europe/Athens")``, ``datetime.UTC``). Without ``handler`` it returns a
        decorator. Same options as :meth:`every`.
        """
        schedule = CronSchedule(expression, tz)
        return self._register(name, schedule, handler, options)

    def define(self, name: str, schedule: Schedule | None = None, *,
               on_takeover: Callable[[ClaimHandle], Any] | None = None,
               schedule_text: str | None = None, **options: Any) -> JobInfo:
        """Register a job that this scheduler never fires itself: its caller claims slots.

        For code that decides its own timing (an APScheduler executor, a Celery beat):
        ``scheduler.define("report", max_late_ms=60_000)`` and then
        ``await scheduler.claim("report", slot)``. Options are validated as for
        :meth:`every`; without a ``schedule``, ``jitter_ms`` defaults to 0 and
        ``max_late_ms`` to 60 s.

        With ``on_takeover`` (lease backends), the scheduler is this job's backup like for
        its own jobs: a claim that finds the slot ``running`` elsewhere is watched, and
        runs of the job whose runner and watchers are gone are recovered (see "Orphaned
        runs" in docs/concepts.md). When this instance takes a run over,
        ``on_takeover(handle)`` is called on the scheduler's event loop with the won
        :class:`ClaimHandle` (attempt + 1); it must start the run without blocking (it may
        be a coroutine function) and end the handle with ``finish``, or ``release`` it.

        ``schedule_text`` says, without a ``schedule``, what decides the job's timing (e.g.
        an APScheduler trigger): :meth:`jobs` and the fleet view (``anarchon status``) show
        it instead of "(claimed by its caller)".
        """
        validate_job_name(name)
        if schedule_text is not None and (not isinstance(schedule_text, str)
                                          or not 0 < len(schedule_text) <= 200):
            raise ConfigError(f"invalid schedule_text {schedule_text!r} for job {name!r}: "
                              "expected a text of 1 to 200 characters")
        job_options = JobOptions.build(schedule, options, leases=self.backend.supports_leases,
                                       now_ms=round(self._now_ms()))
        self.backend.check_job(name, job_options)
        if on_takeover is not None and not callable(on_takeover):
            raise ConfigError(f"invalid on_takeover {on_takeover!r} for job {name!r}: not "
                              "callable")
        with self._jobs_lock:
            self._add(RegisteredJob(name, schedule, None, job_options, fires=False,
                           on_takeover=on_takeover, schedule_text=schedule_text))
        return self._info(self._jobs[name])

    def _register(self, name: str, schedule: Schedule, handler: Handler | None,
                  options: dict[str, Any]) -> Any:
        validate_job_name(name)
        if name in self._jobs:
            raise ConfigError(f"job {name!r} is already registered; remove({name!r}) first")
        job_options = JobOptions.build(schedule, options, leases=self.backend.supports_leases,
                                       now_ms=round(self._now_ms()))
        self.backend.check_job(name, job_options)

        def add(fn: H) -> H:
            if not callable(fn):
                raise ConfigError(f"invalid handler {fn!r} for job {name!r}: not callable")
            self._add(RegisteredJob(name, schedule, fn, job_options))
            return fn

        return add if handler is None else add(handler)

    def _add(self, job: RegisteredJob) -> None:
        with self._jobs_lock:
            if job.name in self._jobs:
                raise ConfigError(
                    f"job {job.name!r} is already registered; remove({job.name!r}) first")
            self._jobs[job.name] = job
            self._jobs_version += 1
            self._configure_retention(job)
            if self._running and not self._stopping:
                self._on_loop(self._start_job, job)

    def remove(self, name: str) -> bool:
        """Unregister a job; a run already going finishes. False if there was none."""
        with self._jobs_lock:
            job = self._jobs.pop(name, None)
            self._jobs_version += 1
        if job is None:
            return False
        job.generation += 1  # its timer entry is dropped when it comes up
        return True

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn`` on the scheduler's loop: now if we are on it, else thread-safely."""
        loop = self._loop
        if loop is None:
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _info(self, job: RegisteredJob) -> JobInfo:
        now = round(self._now_ms())
        schedule = job.schedule
        text = schedule.describe() if schedule else job.schedule_text or "(claimed by its caller)"
        return JobInfo(job.name, text,
                       schedule.next_after(now) if schedule else 0, job.options.as_dict(),
                       job.handler)

    def jobs(self) -> list[JobInfo]:
        """The registered jobs with their next slot (0 for jobs defined without a schedule)."""
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        return [self._info(j) for j in jobs]

    def _configure_retention(self, job: RegisteredJob | None = None) -> None:
        if job is not None:
            o = job.options
            self._keep_ms = max(self._keep_ms, max(o.max_late_ms, o.catch_up_ms) + o.jitter_ms)
        self.backend.configure_retention(Retention(self.history_size, self.history_ttl_ms,
                                                   self._keep_ms + _KEEP_MARGIN_MS))

    # ---------------------------------------------------------------- lifecycle

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._running

    async def _open_backend(self) -> None:
        loop = asyncio.get_running_loop()
        if self._running and self._loop is not loop:
            raise RuntimeError(
                "this Scheduler runs on another event loop; use scheduler.sync from other "
                "threads"
            )
        if sharing.is_open_for(self.backend, self):
            return
        if self.backend.supports_leases:
            self.backend.tune_timeouts(self.lease_ms)
        self._configure_retention()
        await sharing.acquire(self.backend, self)
        self._loop = loop
        self._timers.open()
        await self._clock.refresh()

    async def start(self) -> None:
        """Connect, then claim every job's slots as they come. Returns at once."""
        if self._running:
            return
        await self._open_backend()
        self._running, self._stopping = True, False
        self._threads = HandlerThreads(self.handler_threads)
        self._timers.clear()
        self._supervise("clock", self._clock.loop)
        self._supervise("timer", self._timer_loop)
        if self.backend.supports_leases:
            self._supervise("orphan recovery", self._orphan_loop)
        self._supervise("fleet", self._fleet.loop)
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self._start_job(job)
        self._supervise("downtime scan", lambda guard: self._missed.scan(jobs, guard))
        log.info("scheduler %s started with %d job(s) on %s", self.instance_id,
                 len(jobs), self.backend.describe())

    async def stop(self, grace_ms: int | None = None) -> None:
        """Stop claiming, ask running handlers to stop, wait ``grace_ms``, hand over.

        Handlers see ``ctx.cancelled`` at once; async handlers still running after the
        grace period are cancelled as tasks. A run is handed over (its lease ended so a
        backup takes the next attempt at once) only after its handler has returned. A
        handler that ignores its cancellation keeps its lease until it returns or the
        process exits (its lease then expires on its own); ``stop()`` does not wait for
        it. Closes the connections the backend opened itself once no run needs them.
        """
        if not self._running and not sharing.is_open_for(self.backend, self):
            return
        grace = (self.stop_grace_ms if grace_ms is None else grace_ms) / 1000
        self._stopping = True
        self._timers.clear()
        attempts = list(self._attempts)
        attempt_tasks = {a.task for a in attempts if a.task is not None}
        for task in self._tasks - attempt_tasks:
            task.cancel()
        for attempt in attempts:
            attempt.request_stop(grace)
        pending: set[asyncio.Future[Any]] = set()
        if attempt_tasks:
            # Handlers get the grace (and async ones a moment to take their cancellation),
            # then those whose code returned record their end or hand over.
            codes = {a.code for a in attempts if a.code is not None}
            if codes:
                await asyncio.wait(codes, timeout=grace + 1.0)
            ended = {a.task for a in attempts if a.task is not None and not a.code_running}
            if ended:
                await asyncio.wait(ended, timeout=_RECORD_WAIT_S)
            pending = {t for t in attempt_tasks if not t.done()}
            for attempt in attempts:
                if attempt.code_running:
                    ref = attempt.handle.ref
                    log.warning("%s slot %s attempt %s: still running after the stop grace; "
                                "its lease is kept until it returns or the process exits",
                                ref.job, ref.slot, ref.attempt)
        others = [t for t in self._tasks if t not in attempt_tasks]
        await asyncio.gather(*others, return_exceptions=True)
        await self._fleet.leave()
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
        self._running = False
        if pending:
            # Keep the backend open for the runs still going; close it once they end.
            self._closer = asyncio.ensure_future(self._release_when_done(pending))
        else:
            await sharing.release(self.backend, self)
        log.info("scheduler %s stopped", self.instance_id)

    async def _release_when_done(self, tasks: set[asyncio.Future[Any]]) -> None:
        await asyncio.wait(tasks)
        if not self._running:
            await sharing.release(self.backend, self)

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    def run_forever(self) -> None:
        """Start, run until SIGINT or SIGTERM, then stop gracefully. Blocks (for scripts)."""
        run_forever(self)

    # ---------------------------------------------------------------- reading

    async def history(self, job: str | None = None, limit: int = 50, *,
                      status: str | None = None, runner: str | None = None,
                      before: str | None = None) -> RunPage:
        """Attempts newest first, one entry per attempt: a page of at most ``limit``.

        ``job=None`` reads every job of the namespace; ``status`` and ``runner`` filter;
        the returned :class:`RunPage` is a list with ``.cursor``, to pass as ``before=``
        for the next page (None on the last). ``job`` need not be registered here: a
        scheduler with no jobs reads another service's history in the same namespace.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ConfigError(f"invalid limit {limit!r}: expected an int in 1..10000")
        for name, value in (("job", job), ("status", status), ("runner", runner),
                            ("before", before)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"invalid {name} {value!r}: expected a string or None")
        await self._open_backend()
        page = RunPage(cursor=before)
        while True:  # a long read is several store pages
            query = HistoryQuery(job=job, status=status, runner=runner, before=page.cursor,
                                 limit=min(limit - len(page), _STORE_PAGE))
            part = await self.backend.runs(query)
            page.extend(part)
            page.cursor = part.cursor
            if part.cursor is None or len(page) >= limit:
                return page

    async def job_names(self) -> dict[str, Run | None]:
        """Every job the store holds runs of (not only this process's), with its last attempt."""
        await self._open_backend()
        return await self.backend.job_names()

    # ---------------------------------------------------------------- the fleet

    async def pause(self, name: str, reason: str | None = None) -> PauseInfo:
        """Pause job ``name`` for the whole fleet (every instance of the namespace).

        Each instance notices within a few seconds (:data:`~anarchon_core.fleet.PAUSE_REFRESH_S`);
        from then on each slot is recorded ``skipped`` (error ``paused``) by the one
        instance that claims it, and no handler runs. Manual runs (:meth:`run_now`,
        :meth:`backfill`) still run. The job need not be registered here. Needs a store
        with control records (Redis/Valkey, PostgreSQL, SQLite).
        """
        info = PauseInfo(check_job_name(name), self.instance_id, round(self._now_ms()),
                         validate_reason(reason))
        await self._open_backend()
        await self.backend.write_control(PAUSED + name, info.encode())
        self._fleet.paused[name] = info
        log.warning("%s: paused for the fleet by %s%s", name, self.instance_id,
                    f" ({reason})" if reason else "", extra={"job": name})
        return info

    async def resume(self, name: str) -> bool:
        """Resume a paused job fleet-wide; False if it was not paused."""
        check_job_name(name)
        await self._open_backend()
        was = name in await self._fleet.read_paused()
        await self.backend.write_control(PAUSED + name, None)
        self._fleet.paused.pop(name, None)
        if was:
            log.warning("%s: resumed for the fleet by %s", name, self.instance_id,
                        extra={"job": name})
        return was

    async def paused(self) -> dict[str, PauseInfo]:
        """The jobs paused fleet-wide, by name, read from the store now."""
        await self._open_backend()
        return await self._fleet.read_paused()

    async def status(self) -> FleetStatus:
        """The fleet view: live instances, and per job its schedule, last attempt, next slot.

        ``status().warnings`` names jobs whose live instances define them differently.
        Needs a store with control records (Redis/Valkey, PostgreSQL, SQLite).
        """
        await self._open_backend()
        return await self._fleet.status()

    def _job_definitions(self) -> list[JobDefinition]:
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        return [JobDefinition.of(j.name, j.schedule, j.options, text=j.schedule_text)
                for j in jobs]

    # ---------------------------------------------------------------- claims

    def _job(self, name: str) -> RegisteredJob:
        job = self._jobs.get(name)
        if job is None:
            raise ConfigError(f"unknown job {name!r}; registered: {sorted(self._jobs) or 'none'}")
        return job

    async def claim(self, name: str, slot: int) -> ClaimHandle | None:
        """Claim slot ``slot`` (ms since the epoch) of job ``name`` for the caller.

        Returns a :class:`ClaimHandle` that keeps the lease alive while held, or ``None``
        when the slot is taken, running elsewhere, skipped (overlap) or late — see
        :meth:`try_claim` for the reason. The job must be registered (:meth:`every`,
        :meth:`cron` or :meth:`define`); lateness, early-claim and retry rules are the
        scheduler's own. Raises :class:`~anarchon_core.StoreUnavailable` if the store
        could not be reached before the slot became too late.
        """
        result = await self.try_claim(name, slot)
        return result if isinstance(result, ClaimHandle) else None

    async def try_claim(self, name: str, slot: int) -> ClaimHandle | NotClaimed:
        """Like :meth:`claim`, but a lost claim returns a (falsy) :class:`NotClaimed`."""
        job = self._job(name)
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise ConfigError(f"invalid slot {slot!r}: expected int milliseconds since the "
                              "epoch (see slot_from_datetime)")
        await self._open_backend()
        outcome = await self._claim_slot(job, slot, raise_unavailable=True)
        if (isinstance(outcome, NotClaimed) and outcome.outcome is ClaimOutcome.RUNNING
                and job.on_takeover is not None and self._running and not self._stopping):
            self._spawn(self._watch(job, slot, manual=False))
        return outcome

    def _request(self, job: RegisteredJob, slot: int, *, manual: bool = False,
                 max_late_ms: int | None = None, token: str | None = None,
                 max_attempts: int | None = None) -> ClaimRequest:
        o = job.options
        return ClaimRequest(
            job=job.name, slot=slot, token=token or new_token(), runner=self.instance_id,
            manual=manual, lease_ms=self.lease_ms, overlap=o.overlap or manual,
            max_attempts=max_attempts if max_attempts is not None
            else 1 if manual else o.max_attempts,
            max_late_ms=None if manual else (o.max_late_ms if max_late_ms is None
                                             else max_late_ms),
        )

    async def _call_claim(self, request: ClaimRequest, give_up_at: float | None,
                          answer_lost: bool = False) -> tuple[ClaimResult, float]:
        """Claim, retrying only transient store failures until ``give_up_at`` (store ms).

        Retries reuse the request's token, so a claim that was committed but whose answer
        was lost is won again by the retry. Returns the result and the monotonic instant
        its lease counts from: the sending of the successful call, or for a retry (or
        ``answer_lost``: this request's earlier call failed) no later than the store's
        own expiry allows (:meth:`_rewon_lease`).
        """
        tries = 0
        while True:
            sent = time.monotonic()
            try:
                result = await self._health.timed("claim", self.backend.claim(request))
            except StoreUnavailable as exc:
                tries += 1
                delay = retry_delay(tries)
                if self._stopping or give_up_at is None or self._now_ms() + delay * 1000 > \
                        give_up_at:
                    raise
                if tries == 1:
                    log.debug("%s slot %s: claim failed (%s); retrying", request.job,
                              request.slot, exc)
                await asyncio.sleep(delay)
            else:
                if tries or answer_lost:
                    sent = self._rewon_lease(request, result, sent)
                return result, sent

    def _rewon_lease(self, request: ClaimRequest, result: ClaimResult, sent: float) -> float:
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
        left_ms = result.lease_until_ms - self._now_ms()
        return min(sent, time.monotonic() + (left_ms - request.lease_ms) / 1000)

    async def _claim_slot(self, job: RegisteredJob, slot: int, *, max_late_ms: int | None = None,
                          raise_unavailable: bool = False, request: ClaimRequest | None = None,
                          answer_lost: bool = False) -> ClaimHandle | NotClaimed:
        if request is None:
            request = self._request(job, slot, max_late_ms=max_late_ms)
        give_up_at = slot + (request.max_late_ms or job.options.max_late_ms)
        try:
            result, sent = await self._call_claim(request, give_up_at, answer_lost)
            for _ in range(_EARLY_RETRIES):
                if result.outcome is not ClaimOutcome.EARLY or self._stopping:
                    break
                # The store's clock says the slot has not come: ours jumped. Re-measure,
                # wait for the slot by the store's clock, and claim again.
                log.warning("%s slot %s: claimed early by the store's clock; re-syncing",
                            job.name, slot)
                with contextlib.suppress(StoreUnavailable):
                    await self._clock.refresh()
                wait_ms = slot - self._now_ms()
                if wait_ms > EARLY_TOLERANCE_MS:
                    break
                await asyncio.sleep(max(0.0, wait_ms) / 1000 + 0.01)
                result, sent = await self._call_claim(request, give_up_at)
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
        self._report_claim(request, result)
        if result.won:
            return await self._after_won(self._handle(request, result, sent))
        return NotClaimed(job.name, slot, result.outcome, _reason(request, result,
                                                                  self._now_ms()))

    def _handle(self, request: ClaimRequest, result: ClaimResult, sent: float) -> ClaimHandle:
        timings = None
        if self.backend.supports_leases:
            timings = self._timings
            if (timings is None or timings.lease_ms != self.lease_ms
                    or timings.heartbeat_ms != self.heartbeat_ms):
                timings = self._timings = LeaseTimings(self.lease_ms, self.heartbeat_ms)
        ref = RunRef(request.job, request.slot, request.token, result.attempt, request.manual)
        return ClaimHandle(backend=self.backend, ref=ref, runner=self.instance_id,
                           timings=timings, sent_at=sent, events=self._events,
                           health=self._health)

    # ---------------------------------------------------------------- manual runs

    async def run_now(self, name: str) -> Run:
        """Run job ``name`` now on this instance, outside its schedule; return its Run.

        Recorded in history as manual. On a lease backend it holds a lease like any run,
        so scheduled slots of the job are skipped while it runs (unless ``overlap``). The
        returned run's times are this instance's clock; :meth:`history` shows the store's,
        so the two can differ by a millisecond or more.
        """
        job = self._runnable(name)
        await self._open_backend()
        with self._manual_threads() as threads:
            slot = round(self._now_ms())
            for _ in range(10):  # another instance may have run it in the same millisecond
                request = self._request(job, slot, manual=True)
                result, sent = await self._call_claim(request, slot + 30_000)
                if result.won:
                    attempt = self._attempt(job, self._handle(request, result, sent), threads)
                    await self._run_attempt(attempt)
                    return attempt.as_run()
                slot += 1
            raise RuntimeError(f"could not claim a manual run of {name!r}")

    async def backfill(self, name: str, start: datetime | int, end: datetime | int, *,
                       limit: int = 1_000) -> list[Run]:
        """Run the past slots of job ``name`` from ``start`` to ``end`` (inclusive) once.

        ``start``/``end`` are aware datetimes or slots (ms). Slots of the job's schedule in
        that range that have no success in history are run here one at a time, oldest
        first, each as a manual attempt of *that* slot (``Run.manual``, ``Run.slot`` the
        past slot). Each is claimed first, so a slot runs once fleet-wide even when two
        backfills of the same range race; a slot already backfilled is not run again.
        More than ``limit`` slots in the range is a :class:`ConfigError`. Returns the runs
        made here.
        """
        job = self._runnable(name)
        if job.schedule is None:
            raise ConfigError(f"job {name!r} has no schedule to backfill")
        lo, hi = _as_slot(start, "start"), _as_slot(end, "end")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ConfigError(f"invalid limit {limit!r}: expected an int in 1..100000")
        await self._open_backend()
        now = round(self._now_ms())
        if hi < lo or hi > now:
            raise ConfigError(f"invalid backfill range {_iso(lo)} to {_iso(hi)}: expected "
                              f"start ≤ end ≤ now ({_iso(now)})")
        slots = _backfill_slots(name, job.schedule, lo, hi, limit)
        done = await self._succeeded_slots(name, lo)
        runs: list[Run] = []
        with self._manual_threads() as threads:
            for slot in slots:
                if slot in done or self._stopping:
                    continue
                request = self._request(job, slot, manual=True)
                result, sent = await self._call_claim(request, None)
                if not result.won:
                    log.info("%s slot %s: backfill skipped (%s)", name, slot,
                             result.outcome.value)
                    continue
                attempt = self._attempt(job, self._handle(request, result, sent), threads)
                await self._run_attempt(attempt)
                runs.append(attempt.as_run())
        return runs

    async def _succeeded_slots(self, name: str, since: int) -> set[int]:
        """Slots of ``name`` at or after ``since`` with a successful attempt in history."""
        found: set[int] = set()
        cursor: str | None = None
        for _ in range(1_000):  # pages of 1,000: a million runs back at most
            page = await self.backend.runs(HistoryQuery(job=name, status="success",
                                                        before=cursor, limit=_STORE_PAGE))
            found.update(r.slot for r in page if r.slot >= since)
            cursor = page.cursor
            if cursor is None or not page or min(r.slot for r in page) < since:
                break
        return found

    def _runnable(self, name: str) -> RegisteredJob:
        job = self._job(name)
        if job.handler is None:
            raise ConfigError(f"job {name!r} has no handler here (defined with define()); "
                              "claim its slots with claim()")
        return job

    @contextlib.contextmanager
    def _manual_threads(self) -> Iterator[HandlerThreads]:
        """The scheduler's handler threads, or a small pool when it is not running."""
        own = self._threads is None
        threads = self._threads or HandlerThreads(1, "anarchon-run-now")
        try:
            yield threads
        finally:
            if own:
                threads.shutdown(wait=False)

    # ---------------------------------------------------------------- the clock

    def _now_ms(self) -> float:
        return self._clock.now_ms()

    # ---------------------------------------------------------------- timers and runs

    def _supervise(self, name: str,
                   body: Callable[[LoopGuard], Coroutine[Any, Any, None]]) -> None:
        """Run a background loop under a :class:`LoopGuard` (restarted if it fails)."""
        guard = LoopGuard(name, lambda: self._running and not self._stopping)
        self._spawn(guard.run(body))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._on_task_done, context=self._done_context)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("scheduler task crashed", exc_info=task.exception())

    def _start_job(self, job: RegisteredJob) -> None:
        if job.handler is None or job.schedule is None or not job.fires:
            return
        if self._jobs.get(job.name) is not job or not self._running or self._stopping:
            return
        job.generation += 1
        self._arm(job, job.schedule, round(self._now_ms()))
        if job.options.catch_up_ms and self.backend.supports_leases:
            self._spawn(self._catch_up(job, job.schedule))

    def _arm(self, job: RegisteredJob, schedule: Schedule, after_ms: int) -> None:
        """Put the job's first slot after ``after_ms`` on the timer, with fresh jitter."""
        slot = schedule.next_after(after_ms)
        job.generation = self._timers.arm(job.name, slot,
                                          slot + random.uniform(0, job.options.jitter_ms))

    async def _timer_loop(self, guard: LoopGuard) -> None:
        """Claim each job's slots as they come off the one timer (:mod:`.timers`)."""
        due: list[tuple[RegisteredJob, int]] = []

        def fire(name: str, seq: int, slot: int, now: float) -> bool:
            job = self._jobs.get(name)
            if job is None or job.generation != seq or job.schedule is None:
                return False  # removed or re-armed since
            due.append((job, slot))
            # A wake-up late by up to the job's jitter still claims its next slot.
            self._arm(job, job.schedule, max(slot, round(now) - job.options.jitter_ms))
            return True

        def claim_due() -> None:
            batch = due.copy()
            due.clear()
            self._spawn(self._claim_due(batch))

        await self._timers.run(guard, stopping=lambda: self._stopping, fire=fire,
                               due=claim_due, rearm_all=self._rearm_all)

    def _rearm_all(self) -> None:
        now = round(self._now_ms())
        self._timers.clear()
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            if job.handler is not None and job.schedule is not None and job.fires:
                job.generation += 1
                self._arm(job, job.schedule, now)

    def _on_store_recovered(self, slots: list[tuple[str, int]]) -> None:
        with self._jobs_lock:
            pending = [(self._jobs[name], slot) for name, slot in slots if name in self._jobs]
        if pending and self._running and not self._stopping:
            self._spawn(self._missed.record(pending, MISSED_STORE))

    async def _catch_up(self, job: RegisteredJob, schedule: Schedule) -> None:
        now = self._now_ms()
        slot = schedule.latest_at_or_before(round(now))
        if now - slot <= job.options.catch_up_ms:
            log.info("%s: catching up slot %s", job.name, slot)
            await self._claim_and_handle(job, slot, max_late_ms=job.options.catch_up_ms)

    async def _claim_due(self, due: list[tuple[RegisteredJob, int]]) -> None:
        """Claim the slots the timer found due together, in one call of the store.

        Each claim is still its own request and decision; one that failed (or came early
        by the store's clock) goes the one-by-one way, with its retries, same token.
        """
        requests = [self._request(job, slot) for job, slot in due]
        sent = time.monotonic()
        results: list[ClaimResult | BaseException]
        try:
            results = await self.backend.claim_many(requests)
        except Exception as exc:  # noqa: BLE001 - e.g. no connection: each retries on its own
            results = [exc] * len(requests)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            self._health.failed("claim", failed[0], sent)
            log.debug("%d of %d claims due together failed (%s); retrying each on its own",
                      len(failed), len(results), failed[0])
        if len(failed) < len(results):
            self._health.succeeded("claim", sent)
        for (job, slot), request, result in zip(due, requests, results, strict=True):
            if isinstance(result, BaseException) or result.outcome is ClaimOutcome.EARLY:
                self._spawn(self._claim_and_handle(
                    job, slot, request=request, answer_lost=isinstance(result, BaseException)))
                continue
            self._report_claim(request, result)
            if result.won:
                self._spawn(self._run_won(job, self._handle(request, result, sent)))
            elif not self._stopping:
                self._on_not_claimed(job, slot, NotClaimed(
                    job.name, slot, result.outcome, _reason(request, result, self._now_ms())))

    def _on_not_claimed(self, job: RegisteredJob, slot: int, outcome: NotClaimed) -> None:
        if outcome.outcome is ClaimOutcome.RUNNING and self.backend.supports_leases:
            self._spawn(self._watch(job, slot, manual=False))
        elif outcome.outcome in (ClaimOutcome.OVERLAP, ClaimOutcome.LATE):
            # While the store is down the recovery line counts these; one line each would
            # be one per slot of every job.
            log.log(logging.DEBUG if self._health.down else logging.INFO,
                    "%s slot %s: skipped (%s)", job.name, slot, outcome.reason,
                    extra=_fields(job.name, slot, None, self.instance_id))
        else:
            log.debug("%s slot %s: %s", job.name, slot, outcome.outcome.value)

    async def _claim_and_handle(self, job: RegisteredJob, slot: int, max_late_ms: int | None = None,
                                request: ClaimRequest | None = None,
                                answer_lost: bool = False) -> None:
        outcome = await self._claim_slot(job, slot, max_late_ms=max_late_ms, request=request,
                                         answer_lost=answer_lost)
        await self._go_on(job, slot, outcome)

    async def _go_on(self, job: RegisteredJob, slot: int,
                     outcome: ClaimHandle | NotClaimed) -> None:
        """After :meth:`_after_won` or a lost claim: run the handle, or watch or log."""
        if isinstance(outcome, ClaimHandle):
            await self._run_handle(job, outcome)
        elif not self._stopping:
            self._on_not_claimed(job, slot, outcome)

    async def _watch(self, job: RegisteredJob, slot: int, *, manual: bool) -> None:
        """Be a backup: re-claim every 1–2 heartbeats until the run ends or we take over.

        One token for the whole watch: a takeover that the store committed but whose
        answer was lost is won again by the next poll (the store knows the token), with
        the lease that commit set (often expired by then: see :meth:`_rewon_lease`).

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
        request = self._request(job, slot, manual=manual)
        unreachable = False
        lost = False  # a poll's answer was lost since the last one answered
        try:
            while not self._stopping and self._jobs.get(job.name) is job:
                await asyncio.sleep(self.heartbeat_ms * random.uniform(1, 2) / 1000)
                if unreachable:
                    unreachable = not await self._store_answers()
                    if not unreachable:
                        await asyncio.sleep(request.lease_ms / 1000)
                    continue
                sent = time.monotonic()
                try:
                    result = await self._health.timed("claim", self.backend.claim(request))
                except StoreUnavailable as exc:
                    log.debug("%s slot %s: backup check failed: %s", job.name, slot, exc)
                    unreachable = lost = True
                    continue
                if result.won:
                    self._report_claim(request, result)
                    log.warning("%s slot %s: lease expired, taking over as attempt %s",
                                job.name, slot, result.attempt,
                                extra=_fields(job.name, slot, result.attempt, self.instance_id))
                    if lost:
                        sent = self._rewon_lease(request, result, sent)
                    # Won too late to run (fenced at once): the lease runs out by the store's
                    # clock and orphan recovery takes the run, with a token of its own.
                    outcome = await self._after_won(self._handle(request, result, sent))
                    if isinstance(outcome, ClaimHandle):
                        await self._run_handle(job, outcome)
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

    async def _orphan_loop(self, guard: LoopGuard) -> None:
        """Recover runs whose runner and watchers are all gone (on start, then periodically).

        Each period looks at a bounded number of jobs; an expired run is claimed like a
        backup would, so the decision table takes it over (attempt + 1) or gives it up.
        """
        period = self.lease_ms / 1000
        while not self._stopping:
            with self._jobs_lock:
                jobs = [j for j in self._jobs.values()
                        if j.handler is not None or j.on_takeover is not None]
            if jobs:
                start = self._orphan_cursor % len(jobs)
                batch = (jobs[start:] + jobs[:start])[:_ORPHAN_JOBS_PER_PERIOD]
                self._orphan_cursor = start + len(batch)
                for job in batch:
                    if self._stopping:
                        return
                    with guard.item(f"job {job.name!r}"):
                        if not await self._scan_orphans(job):
                            break
            await asyncio.sleep(period * random.uniform(0.75, 1.25))

    async def _scan_orphans(self, job: RegisteredJob) -> bool:
        """Recover the expired runs of one job; False if the store is unreachable."""
        try:
            expired = await self._health.timed(
                "expired_runs", self.backend.expired_runs(job.name, _ORPHAN_RUNS_PER_JOB))
        except StoreUnavailable as exc:
            log.debug("orphan scan of %s failed: %s", job.name, exc)
            return False
        for run in expired:
            if not job.is_watching((run.slot, run.manual)):
                self._spawn(self._recover(job, run))
        return True

    def _orphan_window_ms(self, job: RegisteredJob) -> int:
        return max(job.options.max_late_ms, job.options.catch_up_ms) + 2 * self.lease_ms

    async def _recover(self, job: RegisteredJob, run: ExpiredRun) -> None:
        key = (run.slot, run.manual)
        if job.is_watching(key) or any(a.handle.ref.job == job.name and a.handle.ref.slot ==
                                      run.slot for a in self._attempts):
            return
        expired_at = run.lease_until_ms if run.lease_until_ms is not None else run.slot
        too_old = self._now_ms() - expired_at > self._orphan_window_ms(job)
        # Too old to run again: close it as interrupted for good (max_attempts=0 gives up).
        request = self._request(job, run.slot, manual=run.manual,
                                max_attempts=0 if too_old or run.manual else None)
        sent = time.monotonic()
        try:
            result = await self._health.timed("claim", self.backend.claim(request))
        except StoreUnavailable as exc:
            log.debug("%s slot %s: orphan claim failed: %s", job.name, run.slot, exc)
            return
        self._report_claim(request, result)
        if result.won:
            if not self._stopping:
                log.warning("%s slot %s: orphaned run (no runner, no backup) taken over as "
                            "attempt %s", job.name, run.slot, result.attempt,
                            extra=_fields(job.name, run.slot, result.attempt, self.instance_id))
            await self._go_on(job, run.slot,
                              await self._after_won(self._handle(request, result, sent)))
        elif result.outcome is ClaimOutcome.RUNNING:
            await self._watch(job, run.slot, manual=run.manual)
        elif too_old:
            log.warning("%s slot %s: orphaned run older than its recovery window closed as "
                        "interrupted", job.name, run.slot)

    def _attempt(self, job: RegisteredJob, handle: ClaimHandle, threads: HandlerThreads) -> Attempt:
        assert job.handler is not None
        return Attempt(handle=handle, handler=job.handler, instance_id=self.instance_id,
                       timeout_ms=job.options.timeout_ms, threads=threads,
                       stop_grace_s=self.stop_grace_ms / 1000)

    def _is_paused(self, handle: ClaimHandle) -> bool:
        return not handle.manual and handle.job in self._fleet.paused

    async def _skip_paused(self, handle: ClaimHandle) -> NotClaimed:
        """Record a won slot of a paused job ``skipped`` (error ``paused``); run nothing."""
        info = self._fleet.paused.get(handle.job)
        reason = "paused" + (f" by {info.by}" if info else "") + \
            (f": {info.reason}" if info and info.reason else "")
        await handle.finish("skipped", "paused")
        log.info("%s slot %s: skipped (%s)", handle.job, handle.slot, reason,
                 extra=_fields(handle.job, handle.slot, handle.attempt, self.instance_id))
        self._events.emit(EventKind.CLAIM_SKIPPED, job=handle.job, slot=handle.slot,
                          attempt=handle.attempt, outcome=ClaimOutcome.PAUSED.value,
                          reason=reason)
        return NotClaimed(handle.job, handle.slot, ClaimOutcome.PAUSED, reason)

    async def _after_won(self, handle: ClaimHandle) -> ClaimHandle | NotClaimed:
        """Every won claim passes here before it runs: fenced, stopping, paused, in order.

        The handle back when it may run; else why not, having done what that case needs
        (a run won while stopping is handed over, a paused job's slot recorded skipped).
        """
        if handle.fence_if_expired():
            # Answered too late to be sure of the lease: the run is left to a backup.
            return NotClaimed(handle.job, handle.slot, ClaimOutcome.RUNNING, LATE_ANSWER)
        if self._stopping:
            # Won while stopping: hand it straight over instead of dropping it.
            await handle.release()
            return NotClaimed(handle.job, handle.slot, ClaimOutcome.TAKEN,
                              "this scheduler is stopping; handed over")
        if self._is_paused(handle):
            return await self._skip_paused(handle)
        return handle

    def _run_won(self, job: RegisteredJob, handle: ClaimHandle) -> Coroutine[Any, Any, None]:
        """What runs a slot won at its instant: the attempt itself in the common case.

        The common case is :meth:`_after_won`'s checks all passing, tested here without a
        coroutine of their own (thousands of slots may be won at one instant).
        """
        threads = self._threads
        if job.handler is not None and threads is not None and not self._stopping \
                and not handle.fence_if_expired() and not self._is_paused(handle):
            return self._run_attempt(self._attempt(job, handle, threads))
        return self._run_won_otherwise(job, handle)

    async def _run_won_otherwise(self, job: RegisteredJob, handle: ClaimHandle) -> None:
        await self._go_on(job, handle.slot, await self._after_won(handle))

    async def _run_handle(self, job: RegisteredJob, handle: ClaimHandle) -> None:
        """Run a won handle that passed :meth:`_after_won`."""
        threads = self._threads
        if job.handler is None and job.on_takeover is not None and not self._stopping:
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
        await self._run_attempt(self._attempt(job, handle, threads))

    async def _run_attempt(self, attempt: Attempt) -> None:
        self._attempts.add(attempt)
        attempt.task = asyncio.current_task()
        if self._stopping:
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
            self._attempts.discard(attempt)
        if events:
            duration = None if attempt.finished_at is None \
                else (attempt.finished_at - attempt.started_at) * 1000
            events.emit(EventKind.ATTEMPT_ENDED, job=ref.job, slot=ref.slot,
                        attempt=ref.attempt, manual=ref.manual, status=attempt.status,
                        error=attempt.error, duration_ms=duration)


#: Why a claim won, but answered after its lease could be confirmed, is not run here.
LATE_ANSWER = ("running: won, but the store's answer came after the lease could be "
               "confirmed; a backup takes the run over once the lease has expired")


def _reason(request: ClaimRequest, result: ClaimResult, now_ms: float) -> str:
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
        return "done: this run has already ended"
    return "taken: another instance won this slot"


def _backfill_slots(name: str, schedule: Schedule, lo: int, hi: int, limit: int) -> list[int]:
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


def _as_slot(value: datetime | int, what: str) -> int:
    if isinstance(value, datetime):
        return slot_from_datetime(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"invalid {what} {value!r}: expected an aware datetime or int ms "
                          "since the epoch")
    slot_to_datetime(value)  # ConfigError outside 0001-01-01..9999-12-31 UTC
    return value


def _iso(slot: int) -> str:
    return ms_to_datetime(slot).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_forever(*schedulers: Scheduler) -> None:
    """Start every scheduler, run until SIGINT or SIGTERM, then stop them all. Blocks.

    For scripts and worker processes with one or several schedulers (e.g. different
    namespaces); the schedulers share this thread's event loop. A store that does not
    answer at start is retried with back-off (see :mod:`anarchon_core.lifecycle`).
    """
    if not schedulers:
        raise ConfigError("run_forever() needs at least one scheduler")
    asyncio.run(serve(*schedulers))
