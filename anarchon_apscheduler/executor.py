"""``AnarchonExecutor``: an APScheduler 3 executor that claims each firing before running it.

Every process runs the same APScheduler setup. When a job is due, each process's scheduler
hands ``(job, run_times)`` to this executor; it claims every ``(job.id, slot)`` through an
anarchon :class:`~anarchon_core.Scheduler` (the slot is the run time without jitter, see
:mod:`anarchon_apscheduler.triggers`) and gives only the run times it won to the inner
executor. With a lease backend the claim is held and heartbeated until the inner run
ends, then recorded as ``success`` or ``failed``. The anarchon scheduler is every job's
backup (``define(on_takeover=...)``): a process that lost while the run was going on
watches its lease, and runs whose runner and watchers are all gone are recovered; the
process that takes a run over is given its claim and hands it to its inner executor.

How APScheduler's options map (see docs/apscheduler.md):

* ``misfire_grace_time`` → ``max_late_ms`` (plus the trigger's jitter, and how far an
  interval's run times are off its grid); ``None`` (no limit) →
  :data:`UNLIMITED_GRACE_MS`. A firing first claimed later than that is recorded
  ``skipped`` and reported ``EVENT_JOB_MISSED`` by the one process that found it late. A
  store that cannot keep a firing that long (RabbitMQ, Redis ``script``) makes the job a
  ``ConfigError``, raised by ``start()`` for the jobs and defaults known then.
* ``max_instances=1`` (the default) on a lease backend → ``overlap=False``: across all
  processes one run of the job at a time; a firing due while an earlier one still runs
  anywhere is recorded ``skipped`` and reported ``EVENT_JOB_MAX_INSTANCES`` by one
  process. ``max_instances > 1`` (or a claim-only backend) → ``overlap=True``, and the
  limit counts this process's runs, as in APScheduler.
* ``coalesce`` is APScheduler's: it decides which run times are handed over; each maps to
  its own slot, the same on every process.
* A ``CronTrigger`` is replaced by the :class:`~anarchon_apscheduler.CronScheduleTrigger`
  that fires at the same times on every other day and follows anarchon's DST rule
  (cron(8)'s), unless ``dst_rule="apscheduler"``; one that cannot be is kept, with one
  warning per job saying why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import math
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from apscheduler.events import (  # type: ignore[import-untyped]
    EVENT_JOB_ADDED,
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_MODIFIED,
    EVENT_JOB_REMOVED,
    EVENT_JOB_SUBMITTED,
    EVENT_SCHEDULER_STARTED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.executors.base import (  # type: ignore[import-untyped]
    BaseExecutor,
    MaxInstancesReachedError,
)
from apscheduler.executors.pool import (  # type: ignore[import-untyped]
    ProcessPoolExecutor,
    ThreadPoolExecutor,
)
from apscheduler.job import Job  # type: ignore[import-untyped]
from apscheduler.schedulers.base import STATE_STOPPED  # type: ignore[import-untyped]

from anarchon_core import (
    Backend,
    ClaimHandle,
    ClaimOutcome,
    ConfigError,
    NotClaimed,
    Scheduler,
    StoreError,
    SyncClaimHandle,
    slot_to_datetime,
)
from anarchon_core.naming import validate_job_name
from anarchon_core.options import JobOptions, overlap_policy

from .context import RunContext, with_context
from .triggers import (
    check_trigger,
    follows_dst,
    lag_ms,
    lateness_allowance_ms,
    slot_for,
    translate_trigger,
)

__all__ = ["DST_RULES", "UNLIMITED_GRACE_MS", "AnarchonExecutor"]

log = logging.getLogger("anarchon.apscheduler")

#: ``misfire_grace_time=None`` ("run however late") is a claim window of one hour: the
#: store must remember every firing for as long as a late claim for it could come.
UNLIMITED_GRACE_MS = 3_600_000
#: What ``dst_rule`` accepts: whose daylight-saving rule a ``CronTrigger`` follows.
DST_RULES = ("anarchon", "apscheduler")
#: Job options the executor accepts as defaults for every job.
_JOB_DEFAULTS = ("max_late_ms", "overlap", "max_attempts")
_REFUSED = {
    "timeout_ms": "APScheduler cannot cancel a running job function; check "
                  "current_run().cancelled in the job instead",
    "jitter_ms": "give the trigger a jitter instead (each process draws its own; the slot "
                 "is the time without it)",
    "catch_up_ms": "APScheduler's misfire_grace_time and coalesce decide what runs after "
                   "downtime",
}
_JOB_SLOTS = [name for name in Job.__slots__ if name != "__weakref__"]
#: Plans not matched with their event within this many seconds are dropped.
_PLAN_TTL_S = 300.0


@dataclass
class _Plan:
    """What the scheduler's submission event for one ``submit_job`` call becomes."""

    run_times: list[datetime]
    job_id: str
    jobstore: str
    submitted: list[datetime]
    missed: list[datetime]
    overlapped: list[datetime]
    made: float = field(default_factory=time.monotonic)

    def events(self, code: int) -> list[Any]:
        out: list[Any] = []
        if code == EVENT_JOB_SUBMITTED and self.submitted:
            out.append(JobSubmissionEvent(EVENT_JOB_SUBMITTED, self.job_id, self.jobstore,
                                          self.submitted))
            out.extend(JobExecutionEvent(EVENT_JOB_MISSED, self.job_id, self.jobstore, t)
                       for t in self.missed)
        if self.overlapped:
            out.append(JobSubmissionEvent(EVENT_JOB_MAX_INSTANCES, self.job_id,
                                          self.jobstore, self.overlapped))
        return out


@dataclass
class _Batch:
    """The run times of one submission this process won; run one after the other."""

    job: Any
    jobstore: str
    items: deque[tuple[datetime, SyncClaimHandle]]
    #: Taken over, or a buffered firing whose turn came: late by design, the claim allowed
    #: it, so the inner executor must not judge it against ``misfire_grace_time`` again.
    late_by_design: bool = False


@dataclass
class _Run:
    batch: _Batch
    run_time: datetime
    handle: SyncClaimHandle


def _check_id_and_trigger(job: Any, *, new: bool) -> None:
    """ConfigError if ``job``'s trigger differs per process or its id names no job."""
    check_trigger(job.id, job.trigger, new=new)
    try:
        validate_job_name(job.id)
    except ConfigError as exc:
        raise ConfigError(f"job id {job.id!r} cannot name an anarchon job: {exc}") from None


def _now() -> datetime:
    """The time a translated job's next run time is computed from again."""
    return datetime.now(UTC)


def _schedule_text(trigger: Any) -> str:
    """The trigger as APScheduler prints it, for anarchon status and jobs()."""
    return f"APScheduler {trigger}"[:200]


#: The longest claim_timeout_s accepted (s): a claim that blocks longer helps nobody.
MAX_CLAIM_TIMEOUT_S = 86_400.0


def _claim_timeout(value: object) -> float:
    """``claim_timeout_s`` as seconds; ConfigError naming it for anything but 0 < s ≤ a day."""
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or not 0 < value <= MAX_CLAIM_TIMEOUT_S:
        raise ConfigError(f"invalid claim_timeout_s {value!r}: expected a number of seconds, "
                          f"more than 0 and at most {MAX_CLAIM_TIMEOUT_S:.0f}")
    return float(value)


class AnarchonExecutor(BaseExecutor):  # type: ignore[misc]
    """An APScheduler 3 executor that runs each firing once across all processes.

    :param inner: the executor that runs the jobs this process wins (default
        ``ThreadPoolExecutor()``): ``ThreadPoolExecutor``, ``ProcessPoolExecutor``,
        ``AsyncIOExecutor``, or another APScheduler executor.
    :param backend: the anarchon store: a :class:`~anarchon_core.Backend`, a URL
        (``"redis://..."``, ``"postgresql://..."``, ``"sqlite:///jobs.db"``) or None for
        ``ANARCHON_URL``. Every process uses the same store and namespace.
    :param scheduler: instead of ``backend``, an anarchon :class:`~anarchon_core.Scheduler`
        to claim through (shared with other code; started here if it is not running, and
        then stopped by :meth:`shutdown`). Its job names must not clash with job ids.
    :param instance_id: with ``lease_ms``, ``heartbeat_ms``, ``history_size`` and
        ``history_ttl_ms``, for the anarchon scheduler made from ``backend`` (see
        :class:`~anarchon_core.Scheduler`).
    :param claim_timeout_s: the longest a claim may block the APScheduler thread, in
        seconds (more than 0, at most a day).
    :param dst_rule: ``"anarchon"`` (the default): each job's ``CronTrigger`` is replaced
        by the :class:`~anarchon_apscheduler.CronScheduleTrigger` of the same times, so
        at daylight-saving changes it follows cron(8)'s rule as ``Scheduler.cron()``
        does (see :meth:`~anarchon_apscheduler.CronScheduleTrigger.from_cron_trigger`
        for what cannot be replaced). ``"apscheduler"``: triggers are left as they are.
        Every process must use the same.
    :param job_defaults: anarchon job options for every job: ``max_late_ms`` (instead of
        the one derived from ``misfire_grace_time``), ``overlap`` (instead of the one
        derived from ``max_instances``), ``max_attempts`` (lease backends: attempts before a
        run whose runners keep dying is given up; default 3).

    Add it as any executor: ``BackgroundScheduler(executors={"default":
    AnarchonExecutor(ThreadPoolExecutor(10), backend="redis://...")})``.
    """

    def __init__(self, inner: Any = None, backend: Backend | str | None = None, *,
                 scheduler: Scheduler | None = None, instance_id: str | None = None,
                 lease_ms: int | None = None, heartbeat_ms: int | None = None,
                 history_size: int = 1000, history_ttl_ms: int | None = None,
                 claim_timeout_s: float = 30.0, dst_rule: str = "anarchon",
                 **job_defaults: Any) -> None:
        super().__init__()
        self._claim_timeout_s = _claim_timeout(claim_timeout_s)
        if not isinstance(dst_rule, str) or dst_rule not in DST_RULES:
            raise ConfigError(f"invalid dst_rule {dst_rule!r}: expected 'anarchon' (a "
                              "CronTrigger follows cron(8)'s rule at daylight-saving "
                              "changes, as Scheduler.cron() does) or 'apscheduler' (it "
                              "keeps APScheduler's)")
        self._dst_rule = dst_rule
        if inner is None:
            inner = ThreadPoolExecutor()
        if not isinstance(inner, BaseExecutor) or isinstance(inner, AnarchonExecutor):
            raise ConfigError(f"invalid inner executor {inner!r}: expected an APScheduler "
                              "executor (ThreadPoolExecutor, ProcessPoolExecutor, "
                              "AsyncIOExecutor, ...)")
        self._inner = inner
        if scheduler is not None:
            if backend is not None or any(v is not None for v in (
                    instance_id, lease_ms, heartbeat_ms, history_ttl_ms)):
                raise ConfigError("give either scheduler= or backend= (with its scheduler "
                                  "options), not both")
            self._anarchon = scheduler
        else:
            self._anarchon = Scheduler(backend, instance_id=instance_id, lease_ms=lease_ms,
                                       heartbeat_ms=heartbeat_ms, history_size=history_size,
                                       history_ttl_ms=history_ttl_ms)
        for name in job_defaults:
            if name in _REFUSED:
                raise ConfigError(f"job option {name} does not apply to APScheduler jobs: "
                                  f"{_REFUSED[name]}")
            if name not in _JOB_DEFAULTS:
                raise ConfigError(f"unknown job option {name!r}; valid: "
                                  f"{', '.join(_JOB_DEFAULTS)}")
        self._leases = self._anarchon.backend.supports_leases
        JobOptions.build(None, dict(job_defaults), leases=self._leases, now_ms=0)
        if overlap_policy(job_defaults.get("overlap", "skip")) == "cancel_other":
            raise ConfigError("overlap='cancel_other' does not apply to APScheduler jobs: "
                              "APScheduler cannot cancel a running job function, so the new "
                              "firing would only wait for it; give overlap='buffer_one' for "
                              "that, or check current_run().cancelled in the job")
        self._job_defaults: dict[str, Any] = dict(job_defaults)
        self._owns_anarchon = False
        #: Job id → the options and schedule text it was defined with.
        self._defined: dict[str, tuple[dict[str, Any], str]] = {}
        self._define_lock = threading.RLock()
        self._plans: dict[int, _Plan] = {}
        self._plans_lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._batches = 0
        self._idle = threading.Condition()
        self._ids = itertools.count(1)
        self._warned: set[str] = set()
        #: (job id, reason) of every CronTrigger left as it is, warned about once.
        self._dst_warned: set[tuple[str, str]] = set()
        #: Job id → why it is refused, for jobs found wrong when they were added or modified
        #: after start (APScheduler gives the executor no say then); raised at each firing.
        self._refused: dict[str, str] = {}
        #: Job id → its pickled trigger when last checked, to tell a new trigger apart.
        self._checked_triggers: dict[str, bytes] = {}
        self._alias = "default"
        #: The latest APScheduler job object and job store seen per job id (for takeovers).
        self._known: dict[str, tuple[Any, str]] = {}
        self._finisher: concurrent.futures.ThreadPoolExecutor | None = None
        self._dispatch: Callable[[Any], None] | None = None
        self._closing = False
        self._stop_lock = threading.Lock()
        self._wrap_funcs = not isinstance(inner, ProcessPoolExecutor)

    @property
    def scheduler(self) -> Scheduler:
        """The anarchon scheduler the claims go through (for ``history()``, ``sync``...)."""
        return self._anarchon

    @property
    def inner(self) -> Any:
        """The wrapped APScheduler executor."""
        return self._inner

    @property
    def dst_rule(self) -> str:
        """``"anarchon"`` or ``"apscheduler"``: whose DST rule a ``CronTrigger`` follows."""
        return self._dst_rule

    # ------------------------------------------------------------------ lifecycle

    def start(self, scheduler: Any, alias: str) -> None:
        """Start the inner executor and the anarchon scheduler (APScheduler calls it).

        First it checks the jobs added before ``start()`` that use this executor, and the
        scheduler's ``job_defaults``: a job that cannot run alike on every process (see
        :meth:`check_job`) raises :class:`ConfigError` from ``scheduler.start()``, before
        anything is started, so the scheduler stays stopped.
        """
        self._check_before_start(scheduler, alias)
        super().start(scheduler, alias)
        self._closing = False
        self._finisher = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="anarchon-apscheduler-end")
        self._inner.start(scheduler, alias)
        # The inner executor reports each run's end to these; they record the claim's end.
        self._inner._run_job_success = self._inner_success
        self._inner._run_job_error = self._inner_error
        if not self._anarchon.running:
            self._anarchon.sync.start()
            self._owns_anarchon = True
        self._install_event_filter(scheduler)

    def _install_event_filter(self, scheduler: Any) -> None:
        # The scheduler emits EVENT_JOB_SUBMITTED for every submit_job() that returns; a
        # firing won by another process must emit nothing here, so the event is replaced
        # by what this process actually did (see _Plan).
        original = scheduler._dispatch_event
        self._dispatch = original

        def dispatch(event: Any) -> None:
            due = self._translation_due(scheduler, event)
            if due is not None:
                # Listeners see the job added (or modified) as asked, then the translation's
                # own EVENT_JOB_MODIFIED, which checks the new trigger.
                original(event)
                if not self._translate(scheduler, *due, event.jobstore):
                    self._recheck(scheduler, event)
                return
            if event.code in (EVENT_JOB_ADDED, EVENT_JOB_MODIFIED, EVENT_JOB_REMOVED):
                self._recheck(scheduler, event)
            if event.code == EVENT_SCHEDULER_STARTED:
                original(event)
                self._translate_stored(scheduler)
                return
            plan = self._take_plan(event)
            if plan is None:
                original(event)
                return
            for replacement in plan.events(event.code):
                original(replacement)

        scheduler._dispatch_event = dispatch

    def shutdown(self, wait: bool = True) -> None:
        """Shut the inner executor down, record the runs' ends, stop the anarchon scheduler.

        With ``wait=True`` it returns once every run has ended and its end is recorded.
        With ``wait=False`` runs still going keep their lease until they end (or the
        process exits); the anarchon scheduler stops after the last one.
        """
        self._closing = True
        self._inner.shutdown(wait)
        if wait and not self._on_scheduler_loop():
            with self._idle:
                self._idle.wait_for(lambda: self._batches == 0, timeout=None)
        with self._idle:
            busy = self._batches > 0
        if not busy:
            self._stop_anarchon()

    def _on_scheduler_loop(self) -> bool:
        # Runs of an asyncio scheduler end on its loop: waiting for them there would hang.
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return running is getattr(self._scheduler, "_eventloop", None)

    def _stop_anarchon(self) -> None:
        # Held throughout: the last run's end and shutdown() may both get here, and the
        # one that comes second must not return (and let the process exit) while the
        # first is still recording ends.
        with self._stop_lock:
            finisher, self._finisher = self._finisher, None
            owns, self._owns_anarchon = self._owns_anarchon, False
            if finisher is not None:
                finisher.shutdown(wait=True)
            if owns:
                try:
                    self._anarchon.sync.stop()
                except Exception:  # the process is shutting down; report, do not raise
                    log.exception("stopping the anarchon scheduler failed")

    # ------------------------------------------------------------------ job definitions

    def _options(self, grace: float | None, max_instances: int, trigger: Any,
                 lag: int) -> dict[str, Any]:
        late = UNLIMITED_GRACE_MS if grace is None else round(float(grace) * 1000)
        allowance = 0 if trigger is None else lateness_allowance_ms(trigger)
        options: dict[str, Any] = {"max_late_ms": late + allowance + lag}
        if self._leases:
            options["overlap"] = max_instances > 1
        options.update(self._job_defaults)
        return options

    def _checked_options(self, name: str, grace: float | None, max_instances: int,
                         trigger: Any, lag: int, *, label: str | None = None
                         ) -> dict[str, Any]:
        """The job's anarchon options, or ConfigError in APScheduler's terms."""
        options = self._options(grace, max_instances, trigger, lag)
        try:
            # An option out of range (misfire_grace_time=10**12) is refused here too, and
            # reported like one the store cannot keep: naming the job and what to change.
            built = JobOptions.build(None, dict(options), leases=self._leases, now_ms=0)
            self._anarchon.backend.check_job(name, built)
        except ConfigError as exc:
            if "max_late_ms" in self._job_defaults:
                raise  # the user's own max_late_ms: the store's message says it all
            if grace is None:
                cause = (f"misfire_grace_time=None (however late) becomes max_late_ms="
                         f"{UNLIMITED_GRACE_MS} (one hour), longer than this store keeps a "
                         "firing")
                way_out = ("give the job (or the scheduler's job_defaults) a "
                           "misfire_grace_time in seconds, or set the limit for every job "
                           "with AnarchonExecutor(..., max_late_ms=...)")
            elif lag:
                cause = (f"its run times come {lag} ms after the grid points of its interval "
                         "(a next_run_time off the grid), so its claims come that late")
                way_out = ("leave next_run_time unset, or set it on a grid point "
                           "(start_date + k × interval)")
            else:
                cause = (f"misfire_grace_time={grace} s (plus the trigger's jitter) becomes "
                         f"max_late_ms={options['max_late_ms']}")
                way_out = ("give it a smaller misfire_grace_time, or set the limit for every "
                           "job with AnarchonExecutor(..., max_late_ms=...)")
            raise ConfigError(f"{label or f'job {name!r}'}: {cause} ({exc}). Way out: "
                              f"{way_out}") from None
        return options

    def check_job(self, job: Any, *, new: bool = True) -> None:
        """Raise :class:`ConfigError` if ``job`` cannot run alike on every process.

        That is a trigger whose run times differ per process (see
        :func:`~anarchon_apscheduler.check_trigger`; ``new``: the job is being added), a job
        id that cannot name an anarchon job, or a ``misfire_grace_time`` the store cannot
        honour (``None`` on RabbitMQ or Redis ``script``). Attributes the job does not have
        yet (a job added before ``start()``) are taken from the scheduler's job_defaults.
        :class:`~anarchon_apscheduler.AnarchonJobStore` calls it when a job is added.
        """
        defaults = getattr(getattr(self, "_scheduler", None), "_job_defaults", None) or {}
        _check_id_and_trigger(job, new=new)
        next_run = getattr(job, "next_run_time", None)
        self._checked_options(
            job.id, getattr(job, "misfire_grace_time", defaults.get("misfire_grace_time", 1)),
            getattr(job, "max_instances", defaults.get("max_instances", 1)), job.trigger,
            0 if next_run is None else lag_ms(job.trigger, next_run))

    def _check_before_start(self, scheduler: Any, alias: str) -> None:
        self._scheduler = scheduler
        self._alias = alias
        defaults = getattr(scheduler, "_job_defaults", None) or {}
        if defaults.get("misfire_grace_time", 1) is None:
            label = f"job_defaults of {type(scheduler).__name__}"
            self._checked_options("job_defaults", None, 1, None, 0, label=label)
        for job, _store, _replace in list(getattr(scheduler, "_pending_jobs", ())):
            if getattr(job, "executor", "default") == alias:
                translated = self._translation(job)
                if translated is not None:
                    # Before the scheduler computes its first run time and stores it.
                    job._modify(trigger=translated)
                self.check_job(job)
                # Defined now, so the scheduler starts with them (its log line, the fleet
                # view); a firing redefines a job only if its options changed meanwhile.
                next_run = getattr(job, "next_run_time", None)
                self._define_options(job.id, self._checked_options(
                    job.id, getattr(job, "misfire_grace_time",
                                    defaults.get("misfire_grace_time", 1)),
                    getattr(job, "max_instances", defaults.get("max_instances", 1)),
                    job.trigger, 0 if next_run is None else lag_ms(job.trigger, next_run)),
                    job.trigger)

    # ------------------------------------------------------------------ DST rule

    def _translation(self, job: Any) -> Any:
        """The CronScheduleTrigger to give ``job`` instead of its CronTrigger, or None.

        None also when its CronTrigger cannot be translated: then the job keeps
        APScheduler's rule, said once per job and reason (only if its zone has DST).
        """
        if self._dst_rule != "anarchon":
            return None
        try:
            return translate_trigger(job.trigger)
        except ConfigError as exc:
            reason = str(exc)
            if (job.id, reason) not in self._dst_warned and follows_dst(job.trigger):
                self._dst_warned.add((job.id, reason))
                log.warning("job %r (%s) keeps APScheduler's DST rule: %s. For anarchon's "
                            "(cron(8)'s) give it a CronScheduleTrigger, or keep "
                            "APScheduler's for every job with AnarchonExecutor(..., "
                            "dst_rule='apscheduler')", job.id, job.trigger, reason)
            return None

    def _translation_due(self, scheduler: Any, event: Any) -> tuple[Any, Any] | None:
        """``(job, new trigger)`` if the job of an added or modified event needs one."""
        if event.code not in (EVENT_JOB_ADDED, EVENT_JOB_MODIFIED) or \
                self._dst_rule != "anarchon" or scheduler.state == STATE_STOPPED:
            return None  # jobs added before start() were translated then
        try:
            job = scheduler.get_job(event.job_id, event.jobstore)
        except Exception:  # noqa: BLE001 - a store's error: _recheck reports what it can
            return None
        if job is None or job.executor != self._alias:
            return None
        translated = self._translation(job)
        return None if translated is None else (job, translated)

    def _translate(self, scheduler: Any, job: Any, translated: Any, jobstore: str) -> bool:
        """Give a stored job its new trigger (``modify_job``); False if that failed.

        A next run time its CronTrigger computed is computed again by the new trigger
        (at a DST change they differ); one set by hand, or None (paused), is kept.
        """
        old = job.trigger
        changes: dict[str, Any] = {"trigger": translated}
        now = _now()
        planned = getattr(job, "next_run_time", None)
        if planned is not None and planned == old.get_next_fire_time(None, now):
            changes["next_run_time"] = translated.get_next_fire_time(None, now)
        try:
            scheduler.modify_job(job.id, jobstore, **changes)
        except Exception as exc:  # noqa: BLE001 - a store's error: the job keeps its trigger
            log.warning("job %r: replacing its %s by %s failed (%s: %s); it keeps "
                        "APScheduler's DST rule", job.id, old, translated,
                        type(exc).__name__, exc)
            return False
        log.debug("job %r: %s runs as %s (anarchon's DST rule)", job.id, old, translated)
        return True

    def _translate_stored(self, scheduler: Any) -> None:
        """Translate the CronTriggers of jobs found in the job stores at start."""
        if self._dst_rule != "anarchon":
            return
        try:
            jobs = scheduler.get_jobs()
        except Exception as exc:  # noqa: BLE001 - a store's error: they keep their trigger
            log.warning("reading the jobs to translate their CronTriggers failed (%s: %s)",
                        type(exc).__name__, exc)
            return
        for job in jobs:
            if job.executor == self._alias:
                translated = self._translation(job)
                if translated is not None:
                    self._translate(scheduler, job, translated, job._jobstore_alias)

    def _recheck(self, scheduler: Any, event: Any) -> None:
        """Check a job added, modified or removed after start; a refusal is logged now."""
        job_id = event.job_id
        if event.code == EVENT_JOB_REMOVED:
            self._refused.pop(job_id, None)
            self._checked_triggers.pop(job_id, None)
            return
        try:
            job = scheduler.get_job(job_id, event.jobstore)
        except Exception:  # noqa: BLE001 - a store's error: the firing checks again
            return
        if job is None or job.executor != self._alias:
            return
        trigger = pickle.dumps(job.trigger, protocol=4)
        new = self._checked_triggers.get(job_id) != trigger
        self._checked_triggers[job_id] = trigger
        try:
            self.check_job(job, new=new)
        except ConfigError as exc:
            self._refused[job_id] = str(exc)
            log.error("%s. None of its firings will run.", exc)
        else:
            self._refused.pop(job_id, None)
            with contextlib.suppress(ConfigError):  # the firing reports it, in its terms
                self._define(job)  # before its first firing: anarchon status shows it

    def _define(self, job: Any, lag: int = 0) -> dict[str, Any]:
        refused = self._refused.get(job.id)
        if refused is not None:
            raise ConfigError(refused)
        _check_id_and_trigger(job, new=False)
        options = self._options(job.misfire_grace_time, job.max_instances, job.trigger, lag)
        with self._define_lock:
            # Checked once per definition.
            if self._defined.get(job.id) != (options, _schedule_text(job.trigger)):
                self._checked_options(job.id, job.misfire_grace_time, job.max_instances,
                                      job.trigger, lag)
                self._define_options(job.id, options, job.trigger)
        self._warn_generated_id(job)
        return options

    def _define_options(self, job_id: str, options: dict[str, Any], trigger: Any) -> None:
        """(Re)define the anarchon job of ``job_id`` with checked ``options``."""
        text = _schedule_text(trigger)
        with self._define_lock:
            if self._defined.get(job_id) == (options, text):
                return
            if job_id in self._defined:
                self._anarchon.remove(job_id)
            # Every process fires the same run times: contender sets choose who claims.
            self._anarchon.define(job_id, on_takeover=self._on_takeover, schedule_text=text,
                                  contenders=True, **options)
            self._defined[job_id] = (options, text)

    def _warn_generated_id(self, job: Any) -> None:
        job_id = job.id
        if job_id in self._warned or len(job_id) != 32 or job_id[12] != "4":
            return
        try:
            int(job_id, 16)
        except ValueError:
            return
        store = getattr(self._scheduler, "_jobstores", {}).get(job._jobstore_alias)
        if getattr(store, "shares_definitions", False):
            return
        self._warned.add(job_id)
        log.warning("job %r (%s) has a generated id: every process that adds it makes a job "
                    "of its own, and each would run its firings. Give it an id: "
                    "add_job(..., id='name', replace_existing=True)", job_id, job)

    # ------------------------------------------------------------------ submission

    def submit_job(self, job: Any, run_times: list[datetime]) -> None:
        """Claim every run time; hand the won ones to the inner executor.

        Raises :class:`ConfigError` for a trigger whose run times differ per process (the
        scheduler logs it) and ``MaxInstancesReachedError`` when the only outcome was an
        overlap (one run of the job at a time, across processes) or this process's own
        limit.
        """
        assert self._lock is not None, "This executor has not been started yet"
        options = self._define(job, max((lag_ms(job.trigger, t) for t in run_times),
                                        default=0))
        overlap_across = self._leases and options.get("overlap", False) not in (True, "allow")
        if not overlap_across:
            with self._lock:
                if self._instances[job.id] >= job.max_instances:
                    raise MaxInstancesReachedError(job)
        jobstore = job._jobstore_alias
        self._known[job.id] = (job, jobstore)
        won: list[tuple[datetime, SyncClaimHandle]] = []
        missed: list[datetime] = []
        overlapped: list[datetime] = []
        for run_time in run_times:
            slot = slot_for(job.trigger, run_time)
            claim = self._claim(job, slot)
            if claim is None:
                continue
            if isinstance(claim, SyncClaimHandle):
                won.append((run_time, claim))
            elif claim.outcome is ClaimOutcome.LATE:
                missed.append(run_time)
                log.warning('Run time of job "%s" was missed (slot %s): %s', job, slot,
                            claim.reason)
            elif claim.outcome is ClaimOutcome.OVERLAP:
                overlapped.append(run_time)
            elif claim.outcome is ClaimOutcome.RUNNING:
                log.debug("%s slot %s: runs elsewhere; watched as its backup", job.id, slot)
            elif claim.outcome is ClaimOutcome.EARLY:
                log.warning("%s slot %s: not claimed: %s", job.id, slot, claim.reason)
            else:
                log.debug("%s slot %s: %s", job.id, slot, claim.reason)
        handed = {t for t, _ in won} | set(missed)
        plan = _Plan(run_times, job.id, jobstore, [t for t in run_times if t in handed],
                     missed, overlapped)
        self._add_plan(plan)
        if not won and not missed and overlapped:
            raise MaxInstancesReachedError(job)
        if won:
            self._start_batch(_Batch(job, jobstore, deque(won)))

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        """Not used: :meth:`submit_job` claims first, then gives the inner executor the job."""
        raise NotImplementedError

    def _claim(self, job: Any, slot: int) -> SyncClaimHandle | NotClaimed | None:
        try:
            return self._anarchon.sync.claim(job.id, slot, timeout=self._claim_timeout_s)
        except (StoreError, TimeoutError, concurrent.futures.TimeoutError) as exc:
            log.error("%s slot %s: could not claim (%s: %s); not run here", job.id, slot,
                      type(exc).__name__, exc)
            return None

    def _on_takeover(self, handle: ClaimHandle) -> None:
        """The anarchon scheduler took a run of one of our jobs over (on its event loop)."""
        known = self._known.get(handle.job)
        claim = SyncClaimHandle(handle, self._claim_timeout_s)
        if known is None or self._closing:
            # Not a job this process runs (any more): hand it over to one that does.
            self._end_claim(claim, None)
            return
        job, jobstore = known
        if handle.attempt > 1:
            log.info("%s slot %s: taken over as attempt %s", job.id, handle.slot,
                     handle.attempt)
        else:  # a buffered firing (overlap='buffer_one') whose turn came
            log.info("%s slot %s: buffered firing starts, the job's earlier run has ended",
                     job.id, handle.slot)
        run_time = slot_to_datetime(handle.slot)
        # Off the anarchon loop: the inner executor and the end records block.
        threading.Thread(target=self._in_scheduler_thread, daemon=True,
                         name="anarchon-apscheduler-takeover",
                         args=(lambda: self._take_over(job, jobstore, run_time, claim),)).start()

    def _take_over(self, job: Any, jobstore: str, run_time: datetime,
                   claim: SyncClaimHandle) -> None:
        if self._closing:
            self._end_claim(claim, None)
            return
        self._emit(JobSubmissionEvent(EVENT_JOB_SUBMITTED, job.id, jobstore, [run_time]))
        self._start_batch(_Batch(job, jobstore, deque([(run_time, claim)]),
                                 late_by_design=True))

    def _in_scheduler_thread(self, call: Callable[[], None]) -> None:
        # AsyncIOExecutor must be given jobs on the event loop's thread.
        loop = getattr(self._scheduler, "_eventloop", None)
        if loop is not None and hasattr(loop, "call_soon_threadsafe"):
            loop.call_soon_threadsafe(call)
        else:
            call()

    # ------------------------------------------------------------------ runs

    def _start_batch(self, batch: _Batch) -> None:
        with self._idle:
            self._batches += 1
        with self._lock:
            self._instances[batch.job.id] += 1
        self._next(batch)

    def _next(self, batch: _Batch) -> None:
        while batch.items:
            run_time, handle = batch.items.popleft()
            if self._closing:
                # Not started: hand it over so a backup runs it now.
                self._end_claim(handle, None)
                continue
            clone_id = f"{batch.job.id}#anarchon-{next(self._ids)}"
            clone = self._clone(batch.job, clone_id, run_time, handle,
                                late_by_design=batch.late_by_design)
            self._runs[clone_id] = _Run(batch, run_time, handle)
            try:
                self._inner.submit_job(clone, [run_time])
                return
            except BaseException as exc:
                self._runs.pop(clone_id, None)
                log.exception('Error submitting job "%s" to the inner executor', batch.job)
                self._end_claim(handle, ("failed", f"{type(exc).__name__}: {exc}"))
        self._end_batch(batch)

    def _end_batch(self, batch: _Batch) -> None:
        assert self._lock is not None
        with self._lock:
            self._instances[batch.job.id] -= 1
            if self._instances[batch.job.id] <= 0:
                del self._instances[batch.job.id]
        with self._idle:
            self._batches -= 1
            idle = self._batches == 0
            self._idle.notify_all()
        if idle and self._closing and self._finisher is not None:
            threading.Thread(target=self._stop_anarchon, daemon=True).start()

    def _clone(self, job: Any, clone_id: str, run_time: datetime,
               handle: SyncClaimHandle, *, late_by_design: bool) -> Any:
        """The job under an id of its own, so each run's end can be told apart."""
        clone = Job.__new__(Job)
        for name in _JOB_SLOTS:
            with contextlib.suppress(AttributeError):
                setattr(clone, name, getattr(job, name))
        clone.id = clone_id
        if late_by_design or handle.attempt > 1:
            clone.misfire_grace_time = None
        if self._wrap_funcs:
            context = RunContext(job.id, run_time, handle.slot, handle.attempt, handle.token,
                                 self._anarchon.instance_id, handle)
            clone.func = with_context(job.func, context)
        return clone

    def _inner_success(self, clone_id: str, events: list[Any]) -> None:
        self._release_inner(clone_id)
        run = self._runs.pop(clone_id, None)
        if run is None:
            for event in events:
                self._emit(event)
            return
        job_id = run.batch.job.id
        end: tuple[str, str | None] = ("failed", "the executor reported no result")
        for event in events:
            event.job_id = job_id
            if event.code == EVENT_JOB_EXECUTED:
                end = ("success", None)
            elif event.code == EVENT_JOB_ERROR:
                exc = event.exception
                end = ("failed", f"{type(exc).__name__}: {exc}")
            elif event.code == EVENT_JOB_MISSED:
                end = ("failed", "missed: the job waited in the executor past its "
                                 "misfire_grace_time")
        self._end_claim(run.handle, end)
        for event in events:
            self._emit(event)
        self._next(run.batch)

    def _inner_error(self, clone_id: str, exc: BaseException, traceback: Any = None) -> None:
        self._release_inner(clone_id)
        run = self._runs.pop(clone_id, None)
        job_id = run.batch.job.id if run is not None else clone_id
        if isinstance(exc, (asyncio.CancelledError, concurrent.futures.CancelledError)):
            # Cancelled by the executor's shutdown: hand the run over to a backup.
            if run is not None:
                self._end_claim(run.handle, None)
                self._next(run.batch)
            return
        log.error("Error running job %s", job_id, exc_info=(type(exc), exc, traceback))
        if run is not None:
            self._end_claim(run.handle, ("failed", f"{type(exc).__name__}: {exc}"))
            self._next(run.batch)

    def _release_inner(self, clone_id: str) -> None:
        # The inner executor counts each clone as one running instance; end that count.
        type(self._inner)._run_job_success(self._inner, clone_id, [])

    def _end_claim(self, handle: SyncClaimHandle, end: tuple[str, str | None] | None) -> None:
        """Record a run's end (None: hand it over) without blocking the calling thread."""
        def record() -> None:
            try:
                if end is None:
                    handle.release()
                elif not handle.finish(end[0], end[1]):
                    log.warning("%s slot %s attempt %s: its end was not recorded: another "
                                "attempt took over", handle.job, handle.slot, handle.attempt)
            except Exception:  # logged; the lease then expires and a backup decides
                log.exception("%s slot %s: recording the end failed", handle.job,
                              handle.slot)

        finisher = self._finisher
        if finisher is None:
            record()
            return
        try:
            finisher.submit(record)
        except RuntimeError:  # shut down meanwhile
            record()

    # ------------------------------------------------------------------ events

    def _emit(self, event: Any) -> None:
        dispatch = self._dispatch
        if dispatch is not None:
            dispatch(event)

    def _add_plan(self, plan: _Plan) -> None:
        now = time.monotonic()
        with self._plans_lock:
            for key in [k for k, p in self._plans.items() if now - p.made > _PLAN_TTL_S]:
                del self._plans[key]
            self._plans[id(plan.run_times)] = plan

    def _take_plan(self, event: Any) -> _Plan | None:
        if not isinstance(event, JobSubmissionEvent) or event.code not in (
                EVENT_JOB_SUBMITTED, EVENT_JOB_MAX_INSTANCES):
            return None
        with self._plans_lock:
            plan = self._plans.get(id(event.scheduled_run_times))
            if plan is None or plan.run_times is not event.scheduled_run_times:
                return None
            del self._plans[id(event.scheduled_run_times)]
        return plan

    def __repr__(self) -> str:
        return (f"<AnarchonExecutor inner={type(self._inner).__name__} "
                f"backend={self._anarchon.backend.describe()}>")
