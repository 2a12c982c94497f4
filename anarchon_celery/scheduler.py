"""``anarchon_celery.Scheduler``: a Celery beat scheduler where every beat is active.

Each ``beat_schedule`` entry is registered as a job on a core
:class:`anarchon_core.Scheduler` that this beat owns and runs on an event loop thread of
its own. The core decides everything about time: which slots exist, jitter, lateness,
catch-up, the claim, the lease, backups and takeovers. When this beat wins a slot, the
job's handler publishes the entry's task through Celery's own ``apply_async`` path (args,
kwargs and options exactly as Celery's scheduler sends them), with headers naming the
slot and attempt, and records the task id with the run (``Run.meta``).

Beat's ``tick()`` sends nothing and never touches the store: it only re-registers entries
that changed and tells beat when to look again.

With ``anarchon_database_schedules`` the beat also sends the Celery-task rows of the
``anarchon_django.Schedule`` table (:mod:`anarchon_celery.dbschedules`), polled on the
same event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from celery import beat  # type: ignore[import-untyped]

from anarchon_core import (
    AnarchonError,
    ConfigError,
    JobContext,
    StoreUnavailable,
)
from anarchon_core import Scheduler as CoreScheduler
from anarchon_core.lifecycle import start_with_retry
from anarchon_core.logjson import install_log_handler
from anarchon_core.supervision import LoopGuard

from . import tracking
from .entries import ENTRY_OPTIONS_KEY, JobSpec, job_spec, publish_options
from .settings import Settings

if TYPE_CHECKING:
    from anarchon_core.sources import SourceSync

    from .dbschedules import BeatRows

__all__ = [
    "HEADER_ATTEMPT", "HEADER_ID", "HEADER_JOB", "HEADER_RUNNER", "HEADER_SLOT", "Scheduler",
]

log = logging.getLogger("anarchon.celery")

#: Headers every task sent by anarchon carries. ``anarchon_id`` (``"<entry>@<slot>"``) is
#: the same for every attempt of a slot: a consumer deduplicates a takeover's resend on it.
HEADER_JOB, HEADER_SLOT, HEADER_ATTEMPT = "anarchon_job", "anarchon_slot", "anarchon_attempt"
HEADER_RUNNER, HEADER_ID = "anarchon_runner", "anarchon_id"
#: How often the store is probed, and how long one probe or start may take.
_PROBE_S = 5.0
_CALL_TIMEOUT_S = 10.0
#: How long close() waits for the core scheduler to hand over and disconnect.
_CLOSE_TIMEOUT_S = 15.0
#: Longest sleep tick() asks for: beat's liveness checks see a fresh tick at least this often.
_TICK_S = 5.0
#: A publishing thread hands outcomes back to the loop at least this often (in jobs).
_SETTLE_EVERY = 32


class _Runner:
    """The core scheduler on an event loop thread: start with retries, probe, stop.

    ``sources`` are polled on the same loop, store up or down: loaded once before the
    first start (so their jobs claim from the first slot; a source slower than
    ``_CALL_TIMEOUT_S`` finishes its load meanwhile), then every interval.
    """

    def __init__(self, core: CoreScheduler, sources: tuple[SourceSync, ...] = ()) -> None:
        self.core = core
        self.sources = sources
        self.loop = asyncio.new_event_loop()
        self.stopped: asyncio.Event | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="anarchon-beat", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self.stopped = asyncio.Event()
        self.ready.set()
        loads = [asyncio.Event() for _ in self.sources]
        polling = [self.loop.create_task(self._poll(sync, loaded))
                   for sync, loaded in zip(self.sources, loads, strict=True)]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in loads)), _CALL_TIMEOUT_S)
        started = await start_with_retry(
            self.core, self.stopped, retry=(AnarchonError, OSError),
            call_timeout_s=_CALL_TIMEOUT_S, first_delay_s=0.5, announce=True,
            meanwhile="this beat keeps running and connects once it answers (slots due "
                      "meanwhile are sent by another beat, or recorded missed when too late)")
        while started and not self.stopped.is_set():
            if self.core.running:
                # The core logs an outage once when it starts and once when it ends.
                with contextlib.suppress(StoreUnavailable, OSError, asyncio.TimeoutError):
                    await asyncio.wait_for(self.core.probe_store(), _CALL_TIMEOUT_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), _PROBE_S)
        for task in polling:
            task.cancel()
        await asyncio.gather(*polling, return_exceptions=True)
        await self.core.stop()

    async def _poll(self, sync: SourceSync, loaded: asyncio.Event) -> None:
        guard = LoopGuard(f"source {sync.source.description}",
                          lambda: self.stopped is not None and not self.stopped.is_set())
        try:
            with guard.item("the first load"):
                await sync.poll_and_apply()
        finally:
            loaded.set()
        await guard.run(sync.loop)

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the loop (thread-safe)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float) -> None:
        stopped = self.stopped
        if stopped is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(stopped.set)
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning("anarchon: the scheduler did not stop within %.0f s; leases still "
                        "held expire on their own", timeout)


class _Publisher:
    """Threads publishing the tasks of won slots, each draining a queue with one producer.

    Publishing is blocking kombu I/O: it never runs on the core's event loop (heartbeats
    must not wait for a broker). A burst of slots due at once is published with one
    producer per thread taken from the app's pool, as Celery's own beat publishes.
    """

    def __init__(self, app: Any, publish: Callable[[Any, JobContext, Any], Any],
                 threads: int) -> None:
        self.app = app
        self.publish_fn = publish
        self.queue: queue.SimpleQueue[_WonSlot | None] = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._run, name=f"anarchon-publish-{i}",
                                         daemon=True) for i in range(threads)]
        for thread in self.threads:
            thread.start()

    def publish(self, loop: asyncio.AbstractEventLoop, entry: Any,
                ctx: JobContext) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = loop.create_future()
        self.queue.put((loop, future, entry, ctx))
        return future

    def _run(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            done: list[tuple[_WonSlot, Any, BaseException | None]] = []
            try:
                with self.app.producer_or_acquire() as producer:
                    while job is not None:
                        done.append(self._one(producer, job))
                        if len(done) >= _SETTLE_EVERY:
                            _settle(done)
                            done = []
                        job = self._next()
            except Exception as exc:  # noqa: BLE001 - the pool failed: fail this job
                if job is not None:
                    done.append((job, None, exc))
            _settle(done)

    def _next(self) -> _WonSlot | None:
        """The next queued job without waiting (a stop request is put back for the loop)."""
        try:
            job = self.queue.get_nowait()
        except queue.Empty:
            return None
        if job is None:
            self.queue.put(None)
        return job

    def _one(self, producer: Any, job: _WonSlot) -> tuple[_WonSlot, Any, BaseException | None]:
        _, _, entry, ctx = job
        try:
            return job, self.publish_fn(entry, ctx, producer), None
        except Exception as exc:  # noqa: BLE001 - reported to the slot's run
            return job, None, exc

    def close(self, timeout: float) -> None:
        for _ in self.threads:
            self.queue.put(None)
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


_WonSlot = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Any, JobContext]


def _settle(done: list[tuple[_WonSlot, Any, BaseException | None]]) -> None:
    """Hand the outcomes of published jobs back to their loops, one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_WonSlot, Any, BaseException | None]]] = {}
    for outcome in done:
        by_loop.setdefault(outcome[0][0], []).append(outcome)
    for loop, outcomes in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(_set_outcomes, outcomes)


def _set_outcomes(outcomes: list[tuple[_WonSlot, Any, BaseException | None]]) -> None:
    for (_, future, _, _), result, exc in outcomes:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)


class Scheduler(beat.Scheduler):  # type: ignore[misc]
    """Celery beat scheduler: ``beat_scheduler = "anarchon_celery:Scheduler"``.

    Run as many beats as you like: every beat registers every entry, the store decides
    which beat sends each slot, and each slot's task is published once by the winner (a
    beat that dies between its claim and the publish is taken over after its lease). See
    docs/celery.md for the settings (``anarchon_*`` on ``app.conf``) and the guarantee.
    """

    #: The core scheduler this beat owns (None until the schedule is set up).
    core: CoreScheduler | None = None

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.settings = Settings.from_app(app)
        self.core = None
        self._specs: dict[str, JobSpec] = {}
        self._entries: dict[str, Any] = {}
        self._registered: dict[str, Any] | None = None
        self._runner: _Runner | None = None
        self._publisher: _Publisher | None = None
        #: Held while beat_schedule entries or database rows are (un)registered.
        self._lock = threading.RLock()
        #: The database rows' poller and consumer (``anarchon_database_schedules``).
        self.rows: SourceSync | None = None
        self._rows: BeatRows | None = None
        super().__init__(app, *args, **kwargs)

    # ------------------------------------------------------------------ set-up

    def setup_schedule(self) -> None:
        """Read ``beat_schedule``, register every entry, and start the core scheduler."""
        super().setup_schedule()
        if self.settings.log_format == "json":
            # At the level Celery's -l set on the root logger.
            install_log_handler("json", level=logging.getLogger().getEffectiveLevel(),
                                replace=True)
        core = self.settings.make_scheduler("beat")
        self.core = core
        self._sync_jobs()  # a bad entry refuses the beat before anything is served
        if self.settings.database_schedules:
            from . import dbschedules  # noqa: PLC0415 - needs Django, only when asked for

            self.rows, self._rows = dbschedules.sync_for(
                core, self._send_entry, self._specs.keys, self._lock,
                self.settings.job_defaults)
        if self.settings.metrics_port is not None:
            from anarchon_core.metrics.prometheus import serve_metrics  # noqa: PLC0415

            serve_metrics(core, self.settings.metrics_port, self.settings.metrics_addr)
        self._publisher = _Publisher(self.app, self._publish, self.settings.publish_threads)
        self._runner = _Runner(core, (self.rows,) if self.rows is not None else ())
        self._runner.start()
        rows = f" and {self.rows.source.description}" if self.rows is not None else ""
        log.info("anarchon beat %s: %d entries%s on %s", core.instance_id, len(self._specs),
                 rows, self.settings.describe())

    def _sync_jobs(self) -> None:
        """Register entries that are new or changed, remove the ones gone (thread-safe)."""
        with self._lock:
            self._sync_entries()
        if self._rows is not None:
            self._rows.entries_changed()

    def _sync_entries(self) -> None:
        core = self.core
        assert core is not None
        tz = self.app.timezone
        wanted: dict[str, JobSpec] = {}
        for name, entry in self.schedule.items():
            wanted[name] = job_spec(entry, tz, self.settings.job_defaults)
        for name in list(self._specs):
            if name not in wanted or wanted[name] != self._specs[name]:
                core.remove(name)
                del self._specs[name]
        for name, spec in wanted.items():
            self._entries[name] = self.schedule[name]
            if name in self._specs:
                continue
            if self._rows is not None:
                self._rows.yield_name(name)  # the entry wins over a row of its name
            handler = self._handler(name)
            try:
                if spec.kind == "every":
                    assert spec.interval is not None
                    core.every(name, spec.interval, handler, **spec.options)
                else:
                    assert spec.expression is not None
                    core.cron(name, spec.expression, handler, tz=spec.tz, dst=spec.dst,
                              **spec.options)
            except ConfigError as exc:
                raise ConfigError(f"beat_schedule entry {name!r}: {exc}"
                                  f"{self._from_app(name, spec, exc)}") from None
            self._specs[name] = spec
        self._registered = copy.copy(self.schedule)

    def _from_app(self, name: str, spec: JobSpec, exc: ConfigError) -> str:
        """Which ``anarchon_*`` setting gave the option ``exc`` refuses, if the entry did not."""
        own = (self._entries[name].options or {}).get(ENTRY_OPTIONS_KEY) or {}
        inherited = [k for k, v in self.settings.job_defaults.items()
                     if v is not None and own.get(k) is None and k in spec.options]
        named = [k for k in inherited if k in str(exc)]
        if not named:
            return ""
        return " (set by " + ", ".join(f"anarchon_{k}={spec.options[k]!r}" for k in named) + \
            f"; override it in the entry's options[{ENTRY_OPTIONS_KEY!r}])"

    # ------------------------------------------------------------------ beat's loop

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Beat's loop: sends nothing (the core's timers do), never waits on the store.

        Re-registers entries added or changed in :attr:`schedule` since the last tick, and
        returns how long beat may sleep.
        """
        if self.core is not None and not self.schedules_equal(self._registered, self.schedule):
            self._sync_jobs()
        return float(min(self.max_interval, _TICK_S))

    def sync(self) -> None:
        """Nothing to persist: the store holds every slot's state."""

    def close(self) -> None:
        """Stop the core scheduler (runs in progress are handed over), then beat's own."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop(_CLOSE_TIMEOUT_S)
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close(_CLOSE_TIMEOUT_S)
        super().close()

    @property
    def info(self) -> str:
        """Shown in beat's start-up banner."""
        track = ", tracking tasks" if self.settings.track_tasks else ""
        return f"    . anarchon -> {self.settings.describe()}{track}"

    # ------------------------------------------------------------------ sending

    def _handler(self, name: str) -> Callable[[JobContext], Any]:
        async def send(ctx: JobContext) -> None:
            await self._send(name, ctx)

        send.__qualname__ = f"beat entry {name}"
        return send

    async def _send(self, name: str, ctx: JobContext) -> None:
        spec = self._specs.get(name)
        await self._send_entry(ctx, self._entries[name], spec.digest if spec else "")

    async def _send_entry(self, ctx: JobContext, entry: Any, digest: str) -> None:
        """Publish ``entry``'s task for ``ctx``'s slot (once per attempt) and record it."""
        name = ctx.job
        loop = asyncio.get_running_loop()
        if self.settings.track_tasks and ctx.attempt > 1:
            known = await tracking.task_record(self._core(), name, ctx.slot)
            if known is not None:
                # The earlier attempt's task reached a worker: never send it again.
                ctx.meta.update(task_id=known.meta.get("task_id", ""), resent="no")
                await tracking.wait_task(self._core(), ctx, name,
                                         self.settings.track_timeout_ms)
                return
        ctx.raise_if_cancelled()  # the handle fences itself before its lease could expire
        assert self._publisher is not None
        result = await self._publisher.publish(loop, entry, ctx)
        task_id = getattr(result, "id", None)
        ctx.meta.update(task=str(entry.task), task_id=str(task_id or ""), entry=digest)
        if self.settings.track_tasks:
            await tracking.wait_task(self._core(), ctx, name, self.settings.track_timeout_ms)

    def _publish(self, entry: Any, ctx: JobContext, producer: Any) -> Any:
        """Publish ``entry``'s task as Celery's scheduler does, plus the slot headers."""
        options = publish_options(entry.options)
        headers = dict(options.get("headers") or {})
        headers.update({HEADER_JOB: ctx.job, HEADER_SLOT: ctx.slot, HEADER_ATTEMPT: ctx.attempt,
                        HEADER_RUNNER: ctx.instance_id, HEADER_ID: f"{ctx.job}@{ctx.slot}"})
        options["headers"] = headers
        # What beat's apply_async reads of an entry (advance=False), with our options.
        sending = SimpleNamespace(name=entry.name, task=entry.task, args=entry.args,
                                  kwargs=entry.kwargs, options=options)
        result = beat.Scheduler.apply_async(self, sending, producer=producer, advance=False)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s slot %s attempt %s: sent %s", ctx.job, ctx.slot, ctx.attempt,
                      getattr(result, "id", None))
        return result

    def _core(self) -> CoreScheduler:
        assert self.core is not None
        return self.core
