"""``AnarchonJobStore``: job definitions shared by every process, run times kept per process.

APScheduler's persistent job stores (``SQLAlchemyJobStore``, ``RedisJobStore``...) keep one
row per job with its next run time, and every process that shares the store advances
that one value: a process that read the row a moment later than another skips the firing,
or runs it a second time, and a process asleep until its own next job never sees a job
added elsewhere. This wrapper splits the two concerns:

* The **definition** of each job (function, trigger, arguments, options, paused or not)
  lives in the inner store, shared. Adding, modifying, pausing, resuming or removing a
  job on one process writes it there; every process reads the store again every
  ``sync_interval`` seconds (the scheduler is woken at least that often) and follows.
* The **next run time** is kept by each process in memory, so every process hands every
  firing to its :class:`~anarchon_apscheduler.AnarchonExecutor`, which claims it: exactly
  one runs it, and the others stand by as backups.

A job first seen in the store (added by another process, maybe one that is down now)
starts at the next run time stored with it; if that is already past its
``misfire_grace_time``, at the trigger's first run time within that grace.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.jobstores.base import (  # type: ignore[import-untyped]
    BaseJobStore,
    ConflictingIdError,
    JobLookupError,
)

from anarchon_core import ConfigError

from .executor import UNLIMITED_GRACE_MS, AnarchonExecutor
from .triggers import check_trigger, lateness_allowance_ms

__all__ = ["AnarchonJobStore"]

log = logging.getLogger("anarchon.apscheduler")


def _definition(job: Any) -> bytes:
    """Everything about a job that other processes must follow: all but its next run time."""
    state = job.__getstate__()
    state.pop("next_run_time", None)
    return pickle.dumps((state, job.next_run_time is None), protocol=4)


def _timing(job: Any) -> bytes:
    """What decides a job's run times: its trigger and whether it is paused."""
    return pickle.dumps((job.trigger, job.next_run_time is None), protocol=4)


class AnarchonJobStore(BaseJobStore):  # type: ignore[misc]
    """A job store whose jobs every process sees; use it with ``AnarchonExecutor``.

    :param inner: a persistent job store that all processes share, e.g.
        ``SQLAlchemyJobStore(url="postgresql+psycopg://...")`` or ``RedisJobStore(...)``.
    :param sync_interval: seconds between two reads of the shared store (default 2): how
        soon a job added, changed, paused or removed elsewhere is followed here.

    Jobs added by every process at start-up need an explicit ``id`` and
    ``replace_existing=True`` (as with any shared store); a job added at run time on one
    process may keep its generated id. Job functions must be importable by reference
    (``module:function``), as for any persistent store.
    """

    #: Job ids are the same on every process (read by AnarchonExecutor).
    shares_definitions = True

    def __init__(self, inner: Any, *, sync_interval: float = 2.0) -> None:
        super().__init__()
        if not isinstance(inner, BaseJobStore) or isinstance(inner, AnarchonJobStore):
            raise ConfigError(f"invalid inner job store {inner!r}: expected an APScheduler "
                              "job store shared by every process (SQLAlchemyJobStore, "
                              "RedisJobStore, MongoDBJobStore, ...)")
        if isinstance(sync_interval, bool) or not isinstance(sync_interval, (int, float)) \
                or not 0.05 <= sync_interval <= 3600:
            raise ConfigError(f"invalid sync_interval {sync_interval!r}: expected seconds "
                              "between 0.05 and 3600")
        self.inner = inner
        self.sync_interval = float(sync_interval)
        self._jobs: dict[str, Any] = {}
        self._definitions: dict[str, bytes] = {}
        #: Job id → its trigger (pickled) as last checked here, to tell a new one apart.
        self._checked: dict[str, bytes] = {}
        self._lock = threading.RLock()
        self._synced_at = float("-inf")

    # ------------------------------------------------------------------ lifecycle

    def start(self, scheduler: Any, alias: str) -> None:
        """Start the inner store and read every job from it."""
        super().start(scheduler, alias)
        self.inner.start(scheduler, alias)
        self._sync(force=True)

    def shutdown(self) -> None:
        """Shut the inner store down."""
        self.inner.shutdown()

    # ------------------------------------------------------------------ following others

    def _first_run_time(self, job: Any, now: datetime) -> datetime | None:
        """Where a job seen for the first time (or rescheduled elsewhere) starts here."""
        stored = job.next_run_time
        if stored is None:
            return None
        grace = job.misfire_grace_time
        grace_ms = UNLIMITED_GRACE_MS if grace is None else round(float(grace) * 1000)
        horizon = now - timedelta(milliseconds=grace_ms + lateness_allowance_ms(job.trigger))
        if stored >= horizon:
            first: datetime = stored
            return first
        nxt: datetime | None = job.trigger.get_next_fire_time(None, horizon)
        return nxt

    def _sync(self, *, force: bool = False) -> None:
        with self._lock:
            if not force and time.monotonic() - self._synced_at < self.sync_interval:
                return
            self._synced_at = time.monotonic()
            try:
                stored = self.inner.get_all_jobs()
            except Exception as exc:  # noqa: BLE001 - any store's error: keep what we know
                log.warning("reading jobs from %r failed: %s; retrying in %.1fs", self.inner,
                            exc, self.sync_interval)
                return
            now = datetime.now(UTC)
            seen = set()
            for job in stored:
                seen.add(job.id)
                definition = _definition(job)
                local = self._jobs.get(job.id)
                if local is not None and self._definitions.get(job.id) == definition:
                    continue
                if local is None:
                    log.info("job %s: added on another process", job)
                    next_run = self._first_run_time(job, now)
                elif _timing(local) != _timing(job):
                    log.info("job %s: rescheduled or paused on another process", job)
                    next_run = self._first_run_time(job, now)
                else:
                    log.info("job %s: modified on another process", job)
                    next_run = local.next_run_time
                job.next_run_time = next_run
                self._jobs[job.id] = job
                self._definitions[job.id] = definition
            for job_id in [j for j in self._jobs if j not in seen]:
                log.info("job %s: removed on another process", job_id)
                del self._jobs[job_id]
                self._definitions.pop(job_id, None)

    # ------------------------------------------------------------------ reading

    def lookup_job(self, job_id: str) -> Any:
        """The job with this id, or None."""
        self._sync()
        with self._lock:
            return self._jobs.get(job_id)

    def get_due_jobs(self, now: datetime) -> list[Any]:
        """The jobs whose next run time (kept by this process) is at or before ``now``."""
        self._sync()
        with self._lock:
            due = [j for j in self._jobs.values()
                   if j.next_run_time is not None and j.next_run_time <= now]
        return sorted(due, key=lambda j: j.next_run_time)

    def get_next_run_time(self) -> datetime | None:
        """The earliest next run time, but no later than the next read of the shared store."""
        self._sync()
        with self._lock:
            times = [j.next_run_time for j in self._jobs.values() if j.next_run_time]
        wake: datetime = datetime.now(UTC) + timedelta(seconds=self.sync_interval)
        earliest: datetime = min([*times, wake])
        return earliest

    def get_all_jobs(self) -> list[Any]:
        """Every job, by next run time (paused jobs last)."""
        self._sync()
        with self._lock:
            jobs = sorted((j for j in self._jobs.values() if j.next_run_time is not None),
                          key=lambda j: j.next_run_time)
            jobs.extend(j for j in self._jobs.values() if j.next_run_time is None)
        return jobs

    # ------------------------------------------------------------------ writing

    def _check(self, job: Any, *, new: bool) -> None:
        """ConfigError if ``job`` cannot run alike on every process (see check_trigger)."""
        executor = getattr(self._scheduler, "_executors", {}).get(job.executor)
        if isinstance(executor, AnarchonExecutor):
            executor.check_job(job, new=new)
        else:
            check_trigger(job.id, job.trigger, new=new)

    def add_job(self, job: Any) -> None:
        """Add a job for every process; ConfigError if it cannot run alike on each.

        The checks are :meth:`AnarchonExecutor.check_job` (its trigger, its id, its
        ``misfire_grace_time`` on this store) when the job's executor is one.
        """
        self._check(job, new=True)
        with self._lock:
            if job.id in self._jobs:
                raise ConflictingIdError(job.id)
            self.inner.add_job(job)
            self._jobs[job.id] = job
            self._definitions[job.id] = _definition(job)
            self._checked[job.id] = pickle.dumps(job.trigger, protocol=4)

    def update_job(self, job: Any) -> None:
        """Keep a new next run time here; write any other change for every process."""
        definition = _definition(job)
        with self._lock:
            if job.id in self._jobs and self._definitions.get(job.id) == definition:
                self._jobs[job.id] = job
                return
            trigger = pickle.dumps(job.trigger, protocol=4)
            self._check(job, new=self._checked.get(job.id) != trigger)
            try:
                self.inner.update_job(job)
            except JobLookupError:
                if job.id in self._jobs:  # removed elsewhere since we last looked
                    del self._jobs[job.id]
                    self._definitions.pop(job.id, None)
                raise
            self._jobs[job.id] = job
            self._definitions[job.id] = definition
            self._checked[job.id] = trigger

    def remove_job(self, job_id: str) -> None:
        """Remove a job for every process."""
        with self._lock:
            known = self._jobs.pop(job_id, None) is not None
            self._definitions.pop(job_id, None)
            self._checked.pop(job_id, None)
            try:
                self.inner.remove_job(job_id)
            except JobLookupError:
                if not known:
                    raise

    def remove_all_jobs(self) -> None:
        """Remove every job for every process."""
        with self._lock:
            self.inner.remove_all_jobs()
            self._jobs.clear()
            self._definitions.clear()
            self._checked.clear()

    def __repr__(self) -> str:
        return f"<AnarchonJobStore inner={self.inner!r}>"
