"""The :class:`Scheduler`: registration, the per-job timer loops, backups and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar, overload

from .backend import Backend, new_token
from .context import STOPPING
from .decision import EARLY_TOLERANCE_MS
from .durations import Duration
from .errors import ConfigError
from .execution import Attempt, Handler, LeaseTimings
from .models import ClaimOutcome, ClaimRequest, ClaimResult, JobInfo, Run, RunRef
from .naming import validate_job_name
from .options import JobOptions
from .schedules import CronSchedule, EverySchedule, Schedule
from .sync import SyncScheduler
from .url import backend_from_url

__all__ = ["Scheduler"]

log = logging.getLogger("anarchon.scheduler")

H = TypeVar("H", bound=Handler)
_CLOCK_REFRESH_S = 60.0
_MAX_SLEEP_S = 30.0          # long waits are cut so clock corrections apply
_RETRY_DELAYS_S = (0.1, 0.25, 0.5, 1.0, 2.0)
#: Runs stay in the store at least this long past max_late_ms/catch_up_ms.
_KEEP_MARGIN_MS = 60_000
DEFAULT_STOP_GRACE_MS = 5_000
_EARLY_RETRIES = 3
#: The wall clock moved this much more (or less) than the monotonic clock: re-sync now.
_CLOCK_JUMP_MS = 500
_CLOCK_CHECK_S = 2.0
_CLOCK_SAMPLES = 3


@dataclass
class _Job:
    name: str
    schedule: Schedule
    handler: Handler
    options: JobOptions
    loop_task: asyncio.Task[None] | None = None
    watching: set[int] = field(default_factory=set)


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


def _positive_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"invalid {name} {value!r}: expected a positive int of milliseconds")
    return value


class Scheduler:
    """Runs registered jobs; every instance runs the same, and each slot runs once.

    :param backend: a :class:`Backend`, a URL (see :func:`backend_from_url`) or ``None``
        for the URL in ``ANARCHON_URL``, else Redis on localhost:6379.
    :param instance_id: recorded in history; default ``"<hostname>:<pid>"``.
    :param lease_ms: lease length (lease backends only); default 30 s.
    :param heartbeat_ms: heartbeat period, smaller than ``lease_ms``; default a third of it.
    :param history_size: about how many runs per job the store keeps.
    :param history_ttl_ms: if set, runs older than this are dropped too.

    Use it with ``await start()``/``await stop()``, ``async with scheduler:``,
    :meth:`run_forever` in scripts, or through :attr:`sync` from synchronous code.
    """

    def __init__(
        self, backend: Backend | str | None = None, *, instance_id: str | None = None,
        lease_ms: int | None = None, heartbeat_ms: int | None = None,
        history_size: int = 1000, history_ttl_ms: int | None = None,
    ) -> None:
        self.backend = _resolve_backend(backend)
        if not self.backend.supports_leases and (lease_ms is not None or heartbeat_ms is not None):
            given = ", ".join(n for n, v in (("lease_ms", lease_ms), ("heartbeat_ms", heartbeat_ms))
                              if v is not None)
            raise ConfigError(
                f"{given} need a lease backend (Redis/Valkey strategy 'lease', PostgreSQL, "
                f"SQLite); {self.backend.describe()} only claims"
            )
        if instance_id is None:
            instance_id = f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(instance_id, str) or not instance_id.strip():
            raise ConfigError(f"invalid instance_id {instance_id!r}: expected a non-empty string")
        self.instance_id = instance_id
        self.lease_ms = _positive_ms("lease_ms", 30_000 if lease_ms is None else lease_ms)
        self.heartbeat_ms = _positive_ms(
            "heartbeat_ms", self.lease_ms // 3 if heartbeat_ms is None else heartbeat_ms
        )
        if self.heartbeat_ms >= self.lease_ms:
            raise ConfigError(
                f"invalid heartbeat_ms {self.heartbeat_ms}: must be smaller than lease_ms "
                f"({self.lease_ms}), or every lease expires between two heartbeats"
            )
        if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 1:
            raise ConfigError(f"invalid history_size {history_size!r}: expected an int ≥ 1")
        self.history_size = history_size
        self.history_ttl_ms = (
            None if history_ttl_ms is None else _positive_ms("history_ttl_ms", history_ttl_ms)
        )
        self.stop_grace_ms = DEFAULT_STOP_GRACE_MS
        self._jobs: dict[str, _Job] = {}
        self._attempts: set[Attempt] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backend_open = False
        self._running = False
        self._stopping = False
        self._clock_offset_ms = 0.0
        self._clock_moved = asyncio.Event()
        self._executor: ThreadPoolExecutor | None = None
        #: Synchronous twins of the coroutine methods, for sync code (see :class:`SyncScheduler`).
        self.sync = SyncScheduler(self)

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
        schedule = EverySchedule(interval, offset)
        return self._register(name, schedule, handler, options)

    @overload
    def cron(self, name: str, expression: str, handler: None = None, *, tz: str = "UTC",
             **options: Any) -> Callable[[H], H]: ...
    @overload
    def cron(self, name: str, expression: str, handler: H, *, tz: str = "UTC",
             **options: Any) -> H: ...

    def cron(self, name: str, expression: str, handler: Handler | None = None, *,
             tz: str = "UTC", **options: Any) -> Any:
        """Register a job on a cron expression (5 fields, or 6 with seconds first) in ``tz``.

        Without ``handler`` it returns a decorator. Same options as :meth:`every`.
        """
        schedule = CronSchedule(expression, tz)
        return self._register(name, schedule, handler, options)

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
            if name in self._jobs:
                raise ConfigError(f"job {name!r} is already registered; remove({name!r}) first")
            job = _Job(name, schedule, fn, job_options)
            self._jobs[name] = job
            if self._running and not self._stopping:
                self._start_job(job)
            return fn

        return add if handler is None else add(handler)

    def remove(self, name: str) -> bool:
        """Unregister a job; a run already going finishes. False if there was none."""
        job = self._jobs.pop(name, None)
        if job is None:
            return False
        if job.loop_task is not None:
            job.loop_task.cancel()
        return True

    def jobs(self) -> list[JobInfo]:
        """The registered jobs with their next slot."""
        now = round(self._now_ms())
        return [JobInfo(j.name, j.schedule.describe(), j.schedule.next_after(now),
                        j.options.as_dict()) for j in self._jobs.values()]

    # ---------------------------------------------------------------- lifecycle

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._running

    async def _open_backend(self) -> None:
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            raise RuntimeError(
                "this Scheduler is bound to another event loop; use scheduler.sync from "
                "other threads"
            )
        self._loop = asyncio.get_running_loop()
        if not self._backend_open:
            await self.backend.start()
            self._backend_open = True
            await self._refresh_clock()

    async def start(self) -> None:
        """Connect, then claim every job's slots as they come. Returns at once."""
        if self._running:
            return
        await self._open_backend()
        self._running, self._stopping = True, False
        self._executor = ThreadPoolExecutor(thread_name_prefix="anarchon-handler")
        self._spawn(self._clock_loop())
        for job in self._jobs.values():
            self._start_job(job)
        log.info("scheduler %s started with %d job(s) on %s", self.instance_id,
                 len(self._jobs), self.backend.describe())

    async def stop(self, grace_ms: int | None = None) -> None:
        """Stop claiming, cancel running handlers, wait ``grace_ms``, hand over the rest.

        Runs still unfinished after the grace period have their leases ended at once so
        a backup takes the next attempt immediately. Closes the connections the backend
        opened itself.
        """
        grace = (self.stop_grace_ms if grace_ms is None else grace_ms) / 1000
        self._stopping = True
        for job in self._jobs.values():
            if job.loop_task is not None:
                job.loop_task.cancel()
                job.loop_task = None
        attempts = list(self._attempts)
        attempt_tasks = {a.task for a in attempts if a.task is not None}
        for task in self._tasks - attempt_tasks:
            task.cancel()
        for attempt in attempts:
            attempt.cooperation_s = grace
            attempt.request_cancel(STOPPING)
        if attempt_tasks:
            # Each attempt waits up to `grace` for its handler, then hands over by itself.
            _, late = await asyncio.wait(attempt_tasks, timeout=grace + 5)
            for task in late:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._backend_open:
            await self.backend.stop()
            self._backend_open = False
        self._running = False
        self._loop = None
        log.info("scheduler %s stopped", self.instance_id)

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    def run_forever(self) -> None:
        """Start, run until SIGINT or SIGTERM, then stop gracefully. Blocks (for scripts)."""

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await self.start()
            try:
                await stop.wait()
            finally:
                await self.stop()

        asyncio.run(main())

    # ---------------------------------------------------------------- reading and manual runs

    async def history(self, name: str, limit: int = 20) -> list[Run]:
        """Up to ``limit`` attempts of job ``name``, newest first (one entry per attempt).

        ``name`` need not be registered here: a scheduler with no jobs reads another
        service's history in the same namespace.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"invalid limit {limit!r}: expected an int ≥ 1")
        await self._open_backend()
        return await self.backend.history(name, limit)

    async def run_now(self, name: str) -> Run:
        """Run job ``name`` now on this instance, outside its schedule; return its Run.

        Recorded in history as manual. On a lease backend it holds a lease like any run,
        so scheduled slots of the job are skipped while it runs (unless ``overlap``).
        """
        job = self._jobs.get(name)
        if job is None:
            raise ConfigError(f"unknown job {name!r}; registered: {sorted(self._jobs) or 'none'}")
        await self._open_backend()
        executor = self._executor
        own_executor = executor is None
        if executor is None:
            executor = ThreadPoolExecutor(1, thread_name_prefix="anarchon-run-now")
        try:
            slot = round(self._now_ms())
            for _ in range(10):  # another instance may have run it in the same millisecond
                request = self._request(job, slot, manual=True)
                result = await self.backend.claim(request)
                if result.won:
                    attempt = self._attempt(job, request, result, executor)
                    return await self._run_attempt(attempt)
                slot += 1
            raise RuntimeError(f"could not claim a manual run of {name!r}")
        finally:
            if own_executor:
                executor.shutdown(wait=False)

    # ---------------------------------------------------------------- internals

    def _now_ms(self) -> float:
        return time.time() * 1000 + self._clock_offset_ms

    async def _refresh_clock(self) -> None:
        # The sample with the shortest round trip bounds the error best: a reply delayed
        # on one side only (a busy connection, a paused process) skews the midpoint.
        samples = []
        for _ in range(_CLOCK_SAMPLES):
            before = time.time() * 1000
            store = await self.backend.clock_ms()
            after = time.time() * 1000
            samples.append((after - before, store - (before + after) / 2))
        offset = min(samples)[1]
        jumped = abs(offset - self._clock_offset_ms) >= _CLOCK_JUMP_MS
        self._clock_offset_ms = offset
        if jumped:
            moved, self._clock_moved = self._clock_moved, asyncio.Event()
            moved.set()  # wakes every job loop to recompute its next slot
        if abs(self._clock_offset_ms) > 1_000:
            log.warning("this instance's clock is %.0f ms off the store's; scheduling by "
                        "the store's clock", -self._clock_offset_ms)

    async def _clock_loop(self) -> None:
        """Re-measure the store's clock every minute, and at once when ours jumps."""
        last_sync = time.monotonic()
        wall, mono = time.time(), time.monotonic()
        while True:
            await asyncio.sleep(_CLOCK_CHECK_S)
            jump_ms = ((time.time() - wall) - (time.monotonic() - mono)) * 1000
            wall, mono = time.time(), time.monotonic()
            if abs(jump_ms) < _CLOCK_JUMP_MS and mono - last_sync < _CLOCK_REFRESH_S:
                continue
            if abs(jump_ms) >= _CLOCK_JUMP_MS:
                log.warning("this instance's clock jumped by %.0f ms; re-syncing", jump_ms)
            try:
                await self._refresh_clock()
                last_sync = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - keep the last offset
                log.debug("clock refresh failed: %s", exc)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _start_job(self, job: _Job) -> None:
        job.loop_task = asyncio.ensure_future(self._job_loop(job))
        if job.options.catch_up_ms and self.backend.supports_leases:
            self._spawn(self._catch_up(job))

    def _request(self, job: _Job, slot: int, *, manual: bool = False,
                 max_late_ms: int | None = None) -> ClaimRequest:
        o = job.options
        return ClaimRequest(
            job=job.name, slot=slot, token=new_token(), runner=self.instance_id,
            manual=manual, lease_ms=self.lease_ms, overlap=o.overlap or manual,
            max_attempts=1 if manual else o.max_attempts,
            max_late_ms=None if manual else (o.max_late_ms if max_late_ms is None
                                             else max_late_ms),
            keep_ms=max(o.max_late_ms, o.catch_up_ms) + o.jitter_ms + _KEEP_MARGIN_MS,
            history_size=self.history_size, history_ttl_ms=self.history_ttl_ms,
        )

    async def _job_loop(self, job: _Job) -> None:
        last = round(self._now_ms())
        while not self._stopping:
            slot = job.schedule.next_after(max(last, round(self._now_ms())))
            last = slot
            fire_at = slot + random.uniform(0, job.options.jitter_ms)
            moved = self._clock_moved
            while (wait := fire_at - self._now_ms()) > 0 and not moved.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(moved.wait(), min(wait / 1000, _MAX_SLEEP_S))
            if moved.is_set():
                last = round(self._now_ms())  # our clock was corrected: recompute the slot
                continue
            self._spawn(self._claim_and_handle(job, slot))

    async def _catch_up(self, job: _Job) -> None:
        now = self._now_ms()
        slot = job.schedule.latest_at_or_before(round(now))
        if now - slot <= job.options.catch_up_ms:
            log.info("%s: catching up slot %s", job.name, slot)
            await self._claim_and_handle(job, slot, max_late_ms=job.options.catch_up_ms)

    async def _claim(self, request: ClaimRequest, give_up_at: float) -> ClaimResult | None:
        """Claim, retrying a store error until ``give_up_at`` (store clock, ms)."""
        for attempt in range(1_000):
            try:
                return await self.backend.claim(request)
            except Exception as exc:  # noqa: BLE001 - any store error: retry until too late
                if self._stopping or self._now_ms() > give_up_at:
                    log.error("%s slot %s: claim failed, giving up: %s: %s", request.job,
                              request.slot, type(exc).__name__, exc)
                    return None
                delay = _RETRY_DELAYS_S[min(attempt, len(_RETRY_DELAYS_S) - 1)]
                log.warning("%s slot %s: claim failed (%s: %s); retrying in %.2fs",
                            request.job, request.slot, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
        return None

    async def _claim_and_handle(self, job: _Job, slot: int,
                                max_late_ms: int | None = None) -> None:
        request = self._request(job, slot, max_late_ms=max_late_ms)
        give_up_at = slot + (request.max_late_ms or job.options.max_late_ms)
        result = await self._claim(request, give_up_at)
        for _ in range(_EARLY_RETRIES):
            if result is None or result.outcome is not ClaimOutcome.EARLY or self._stopping:
                break
            # The store's clock says the slot has not come: ours jumped. Re-measure; the job
            # loop then recomputes its slots, and a slot still far off is left to it.
            log.warning("%s slot %s: claimed early by the store's clock; re-syncing",
                        job.name, slot)
            with contextlib.suppress(Exception):
                await self._refresh_clock()
            wait_ms = slot - self._now_ms()
            if wait_ms > EARLY_TOLERANCE_MS:
                return
            await asyncio.sleep(max(0.0, wait_ms) / 1000 + 0.01)
            request = self._request(job, slot, max_late_ms=max_late_ms)
            result = await self._claim(request, give_up_at)
        if result is None or self._stopping:
            return
        log.debug("%s slot %s: %s", job.name, slot, result.outcome.value)
        if result.won:
            await self._run_won(job, request, result)
        elif result.outcome is ClaimOutcome.RUNNING and self.backend.supports_leases:
            await self._watch(job, slot)
        elif result.outcome in (ClaimOutcome.OVERLAP, ClaimOutcome.LATE):
            log.info("%s slot %s: skipped (%s)", job.name, slot, result.outcome.value)

    async def _watch(self, job: _Job, slot: int) -> None:
        """Be a backup: re-claim every 1–2 heartbeats until the run ends or we take over."""
        if slot in job.watching:
            return
        job.watching.add(slot)
        try:
            while not self._stopping and self._jobs.get(job.name) is job:
                await asyncio.sleep(self.heartbeat_ms * random.uniform(1, 2) / 1000)
                request = self._request(job, slot)
                try:
                    result = await self.backend.claim(request)
                except Exception as exc:  # noqa: BLE001 - the store may be briefly away
                    log.warning("%s slot %s: backup check failed: %s", job.name, slot, exc)
                    continue
                if result.won:
                    log.warning("%s slot %s: lease expired, taking over as attempt %s",
                                job.name, slot, result.attempt)
                    await self._run_won(job, request, result)
                    return
                if result.outcome is not ClaimOutcome.RUNNING:
                    return
        finally:
            job.watching.discard(slot)

    def _attempt(self, job: _Job, request: ClaimRequest, result: ClaimResult,
                 executor: ThreadPoolExecutor) -> Attempt:
        timings = (LeaseTimings(self.lease_ms, self.heartbeat_ms)
                   if self.backend.supports_leases else None)
        ref = RunRef(request.job, request.slot, request.token, result.attempt, request.manual)
        return Attempt(backend=self.backend, ref=ref, handler=job.handler,
                       instance_id=self.instance_id, timings=timings,
                       timeout_ms=job.options.timeout_ms, executor=executor)

    async def _run_won(self, job: _Job, request: ClaimRequest, result: ClaimResult) -> None:
        assert self._executor is not None
        await self._run_attempt(self._attempt(job, request, result, self._executor))

    async def _run_attempt(self, attempt: Attempt) -> Run:
        self._attempts.add(attempt)
        attempt.task = asyncio.current_task()
        try:
            return await attempt.run()
        finally:
            self._attempts.discard(attempt)
