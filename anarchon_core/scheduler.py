"""The :class:`Scheduler`: the public API, over a few collaborators with one job each.

The scheduler registers jobs, starts and stops, and answers reads; the work is theirs:

* :class:`~anarchon_core.firing.Firing`: the one timer, and the claims of the slots due;
* :class:`~anarchon_core.claiming.Claims`: requests, store calls, what a won claim passes;
* :class:`~anarchon_core.runs.Runs`: the attempts running here, and a graceful stop's part;
* :class:`~anarchon_core.backups.Backups`: watching live runs elsewhere, orphan recovery;
* :class:`~anarchon_core.manual.ManualRuns`: ``run_now`` and ``backfill``;
* :class:`~anarchon_core.downtime.MissedSlots`: slots missed while down, recorded ``missed``;
* :class:`~anarchon_core.storeclock.StoreClock`, :class:`~anarchon_core.health.StoreHealth`
  and :class:`~anarchon_core.membership.FleetMember`: the store's clock, whether it answers,
  and this instance's fleet record and view of the paused jobs.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import threading
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, tzinfo
from types import TracebackType
from typing import Any, TypeVar, overload

from . import sharing
from .backend import Backend, Retention
from .backups import Backups
from .claim import ClaimHandle
from .claiming import Claims, NotClaimed
from .clocks import SYSTEM_CLOCK, Clock
from .contenders import CONTENDERS, ORPHAN_SCAN, Contenders, group_digest
from .downtime import MISSED_STORE, MissedSlots
from .durations import Duration
from .errors import ConfigError
from .events import EventBus, EventKind, Listener
from .execution import Handler
from .firing import Firing
from .fleet import PAUSED, FleetStatus, JobDefinition, PauseInfo, check_job_name, validate_reason
from .health import StoreHealth
from .jobs import RegisteredJob
from .lifecycle import serve
from .manual import STORE_PAGE, ManualRuns
from .membership import FleetMember
from .models import ClaimOutcome, HistoryQuery, JobInfo, Run, RunPage
from .naming import validate_instance_id, validate_job_name
from .options import DEFAULT_LEASE_MS, JobOptions, validate_history, validate_lease_timings
from .runs import Runs
from .schedules import Dst, Schedule, cron_schedule, every_schedule
from .sources import DEFAULT_INTERVAL_S, JobSource, SchedulerJobs, SourcedJob, SourceSync
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
    :param clock: the local clocks it reads (default the machine's); tests pass a
        controlled one.
    :param contenders: on a lease store with a fleet registry, only a few instances of
        the fleet contend for each slot (see :mod:`anarchon_core.contenders`); False:
        this instance claims every slot.

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
        stop_grace_ms: int = DEFAULT_STOP_GRACE_MS, clock: Clock = SYSTEM_CLOCK,
        contenders: bool = True,
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
        #: The longest a late claim or a catch-up of any job here may ask back (ms).
        self._keep_ms = 0
        self._closer: asyncio.Future[None] | None = None
        self._events = EventBus(self.instance_id)
        self._health = StoreHealth(self._events, self.backend.describe(),
                                   on_recovered=self._on_store_recovered, clock=clock)
        #: The store's clock: what every slot, lateness and timer is reckoned in.
        self._clock = StoreClock(self.backend, self._health, self._events,
                                 on_moved=self._timers.clock_moved, clock=clock)
        stopping = self._is_stopping
        if not isinstance(contenders, bool):
            raise ConfigError(f"invalid contenders {contenders!r}: expected True or False")
        self._contenders = Contenders(
            self.instance_id, enabled=contenders and self.backend.supports_leases, clock=clock)
        self._fleet = FleetMember(self.backend, self.instance_id, health=self._health,
                                  clock=self._clock, jobs_version=lambda: self._jobs_version,
                                  job_definitions=self._job_definitions, stopping=stopping,
                                  contenders=self._contenders, group=self._group)
        self._claims = Claims(self.backend, self, health=self._health, events=self._events,
                              clock=self._clock, stopping=stopping,
                              paused=lambda: self._fleet.paused)
        self._missed = MissedSlots(self.backend, self._health, self._events,
                                   now_ms=self._now_ms, request=self._claims.request)
        self._runs = Runs(self, self._claims, events=self._events, health=self._health,
                          stopping=stopping, now_ms=self._now_ms,
                          watch=self._start_watch if self.backend.supports_leases else None)
        self._backups = Backups(self.backend, self, self._claims, self._runs,
                                health=self._health, clock=self._clock, stopping=stopping,
                                job=self._jobs.get, jobs=self._job_list, spawn=self._spawn,
                                scans=self._scans_orphans)
        self._firing = Firing(self.backend, self._timers, self._claims, self._runs,
                              health=self._health, now_ms=self._now_ms,
                              watch=lambda job, slot: self._backups.watch(job, slot, manual=False),
                              job=self._jobs.get, jobs=self._job_list, spawn=self._spawn,
                              active=lambda: self._running and not self._stopping,
                              stopping=stopping, catch_up=self.backend.supports_leases,
                              contenders=self._contenders)
        self._contenders.on_change = self._firing.contenders_changed
        self._manual = ManualRuns(self.backend, self._claims, self._runs, now_ms=self._now_ms,
                                  stopping=stopping)
        #: Bumped when a job is added or removed (the fleet registry rewrites its list).
        self._jobs_version = 0
        self._group_of: tuple[int, str] | None = None
        #: Job sources kept in step while running (:meth:`add_source`).
        self._sources: list[SourceSync] = []
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
        clock = self._clock.clock
        sent = clock.monotonic()
        await self._clock.read_store_ms()
        return (clock.monotonic() - sent) * 1000

    @property
    def store_down(self) -> bool:
        """True from a failed store call until the next one that succeeds."""
        return self._health.down

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
        ``jitter_ms``, ``max_late_ms``, and on lease backends ``overlap`` (``"skip"``,
        ``"allow"``, ``"buffer_one"``, ``"cancel_other"``), ``max_attempts``,
        ``catch_up_ms`` and ``catch_up``.
        """
        schedule = every_schedule(interval, offset)
        return self._register(name, schedule, handler, options)

    @overload
    def cron(self, name: str, expression: str, handler: None = None, *,
             tz: str | tzinfo = "UTC", dst: Dst = None, **options: Any) -> Callable[[H], H]: ...
    @overload
    def cron(self, name: str, expression: str, handler: H, *, tz: str | tzinfo = "UTC",
             dst: Dst = None, **options: Any) -> H: ...

    def cron(self, name: str, expression: str, handler: Handler | None = None, *,
             tz: str | tzinfo = "UTC", dst: Dst = None, **options: Any) -> Any:
        """Register a job on a cron expression (5 fields, or 6 with seconds first) in ``tz``.

        ``tz`` is an IANA name (``"Europe/Athens"``) or a zone object that has one
        (``ZoneInfo("Europe/Athens")``, ``datetime.UTC``). ``dst`` chooses what the job
        does when clocks change (``"once_last"``, ``"skip"``, ``"both,shift"``...; see
        :class:`~anarchon_core.schedules.DstRule`); by default cron(8)'s rule. Without
        ``handler`` it returns a decorator. Same options as :meth:`every`.
        """
        schedule = cron_schedule(expression, tz, dst)
        return self._register(name, schedule, handler, options)

    @overload
    def add(self, name: str, schedule: Schedule, handler: None = None,
            **options: Any) -> Callable[[H], H]: ...
    @overload
    def add(self, name: str, schedule: Schedule, handler: H, **options: Any) -> H: ...

    def add(self, name: str, schedule: Schedule, handler: Handler | None = None,
            **options: Any) -> Any:
        """Register a job on a :class:`~anarchon_core.Schedule` object.

        ``scheduler.add("report", CronSchedule("0 8 * * *", "Europe/Athens"), report)`` is
        ``scheduler.cron("report", "0 8 * * *", report, tz="Europe/Athens")``; any
        ``Schedule`` (your own subclass too) works. Same options as :meth:`every`.
        """
        if not isinstance(schedule, Schedule):
            raise ConfigError(f"invalid schedule {schedule!r} for job {name!r}: expected a "
                              "Schedule (EverySchedule, CronSchedule...)")
        return self._register(name, schedule, handler, options)

    def add_source(self, source: JobSource, handler_for: Callable[[SourcedJob], Handler], *,
                   interval_s: float = DEFAULT_INTERVAL_S) -> SourceSync:
        """Keep some of this scheduler's jobs in step with ``source`` (a database table).

        While the scheduler runs, ``source`` is polled every ``interval_s`` for the
        records changed since the last poll (never the whole source on a quiet poll); a
        new or changed record (re)registers its job with ``handler_for(job)`` as the
        handler, a disabled or deleted one removes it. :meth:`start` loads the source
        before its first claim. A record whose name a job declared in code has, or that
        the scheduler refuses, is a warning naming it. Returns the
        :class:`~anarchon_core.sources.SourceSync` (its ``definitions`` are the records
        held now).
        """
        if not isinstance(source, JobSource):
            raise ConfigError(f"invalid source {source!r}: expected a JobSource")
        consumer = SchedulerJobs(self, handler_for, source.description)
        sync = SourceSync(source, consumer, interval_s=interval_s, clock=self._now_ms)
        self._sources.append(sync)
        if self._running and not self._stopping:
            self._supervise(f"source {source.description}", sync.loop)
        return sync

    def has_job(self, name: str) -> bool:
        """Whether a job of that name is registered here (cheaper than :meth:`jobs`)."""
        return name in self._jobs

    @property
    def sources(self) -> list[SourceSync]:
        """The job sources added with :meth:`add_source`."""
        return list(self._sources)

    def define(self, name: str, schedule: Schedule | None = None, *,
               on_takeover: Callable[[ClaimHandle], Any] | None = None,
               schedule_text: str | None = None, contenders: bool = False,
               **options: Any) -> JobInfo:
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

        ``contenders=True`` says that every instance of the fleet claims each slot of the
        job from its own timer (the APScheduler executor does): with contender sets, the
        instances that do not contend for a slot are answered ``taken`` without asking the
        store, and the later contenders look first (see "Contender sets" in
        docs/concepts.md). Leave it False when one caller claims a slot (a Celery worker
        tracking its task): it must always ask the store.
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
        if on_takeover is None and job_options.overlap in ("buffer_one", "cancel_other"):
            raise ConfigError(f"overlap={job_options.overlap!r} for job {name!r} needs "
                              "on_takeover=: a buffered slot starts later, when the run "
                              "before it ends, and on_takeover(handle) is what starts it")
        with self._jobs_lock:
            self._add(RegisteredJob(name, schedule, None, job_options, fires=False,
                           on_takeover=on_takeover, schedule_text=schedule_text,
                           contends=contenders is True))
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
                self._on_loop(self._firing.start_job, job)

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
        return [self._info(j) for j in self._job_list()]

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
        for sync in self._sources:  # its jobs claim from the first slot, like the code's
            with LoopGuard(f"source {sync.source.description}", lambda: True).item(
                    "the first load"):
                await sync.poll_and_apply()
        self._running, self._stopping = True, False
        self._runs.threads = HandlerThreads(self.handler_threads)
        self._timers.clear()
        self._supervise("clock", self._clock.loop)
        self._supervise("timer", self._firing.loop)
        if self.backend.supports_leases:
            self._supervise("orphan recovery", self._backups.orphan_loop)
        self._supervise("fleet", self._fleet.loop)
        for sync in self._sources:
            self._supervise(f"source {sync.source.description}", sync.loop)
        jobs = self._job_list()
        for job in jobs:
            self._firing.start_job(job)
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
        attempt_tasks = self._runs.tasks()
        for task in self._tasks - attempt_tasks:
            task.cancel()
        pending = await self._runs.stop(grace)
        others = [t for t in self._tasks if t not in attempt_tasks]
        await asyncio.gather(*others, return_exceptions=True)
        await self._fleet.leave()
        threads, self._runs.threads = self._runs.threads, None
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
                                 limit=min(limit - len(page), STORE_PAGE))
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
        return [JobDefinition.of(j.name, j.schedule, j.options, text=j.schedule_text)
                for j in self._job_list()]

    def _group(self) -> str:
        """The contender group of this instance: the jobs it fires, as it defines them."""
        version = self._jobs_version
        if self._group_of is None or self._group_of[0] != version:
            firing = [j for j in self._job_list() if j.contends or (
                j.fires and j.handler is not None and j.schedule is not None)]
            self._group_of = (version, group_digest(
                (j.name, JobDefinition.of(j.name, j.schedule, j.options,
                                          text=j.schedule_text).digest)
                for j in firing))
        return self._group_of[1]

    def _scans_orphans(self, job: str) -> bool:
        rank = self._contenders.rank(job, ORPHAN_SCAN)
        return rank is None or rank < CONTENDERS

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
        if job.contends:
            passed = await self._firing.caller_turn(job, slot)
            if passed is not None:
                return passed
        outcome = await self._claims.claim_slot(
            job, slot, raise_unavailable=True,
            buffered=lambda request, handle: self._spawn(
                self._runs.run_buffered(job, request, handle)))
        if (isinstance(outcome, NotClaimed) and outcome.outcome is ClaimOutcome.RUNNING
                and job.on_takeover is not None and self._running and not self._stopping):
            self._backups.start_watch(job, slot)
        return outcome

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
        return await self._manual.run_now(job)

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
        await self._open_backend()
        return await self._manual.backfill(job, start, end, limit)

    def _runnable(self, name: str) -> RegisteredJob:
        job = self._job(name)
        if job.handler is None:
            raise ConfigError(f"job {name!r} has no handler here (defined with define()); "
                              "claim its slots with claim()")
        return job

    # ---------------------------------------------------------------- the clock

    def _now_ms(self) -> float:
        return self._clock.now_ms()

    def _is_stopping(self) -> bool:
        return self._stopping

    def _job_list(self) -> list[RegisteredJob]:
        with self._jobs_lock:
            return list(self._jobs.values())

    def _start_watch(self, job: RegisteredJob, slot: int) -> None:
        self._backups.start_watch(job, slot)

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

    def _on_store_recovered(self, slots: list[tuple[str, int]]) -> None:
        with self._jobs_lock:
            pending = [(self._jobs[name], slot) for name, slot in slots if name in self._jobs]
        if pending and self._running and not self._stopping:
            self._spawn(self._missed.record(pending, MISSED_STORE))


def run_forever(*schedulers: Scheduler) -> None:
    """Start every scheduler, run until SIGINT or SIGTERM, then stop them all. Blocks.

    For scripts and worker processes with one or several schedulers (e.g. different
    namespaces); the schedulers share this thread's event loop. A store that does not
    answer at start is retried with back-off (see :mod:`anarchon_core.lifecycle`).
    """
    if not schedulers:
        raise ConfigError("run_forever() needs at least one scheduler")
    asyncio.run(serve(*schedulers))
