"""``anarchon_database_schedules``: the beat also sends the Celery-task rows of the Django table.

With the setting on, a beat in a Django project keeps its jobs in step with the
``anarchon_django.Schedule`` rows whose target is a Celery task (``target_kind`` ``celery``,
or ``auto`` resolving to one): the core :class:`~anarchon_core.sources.SourceSync` polls
:class:`~anarchon_django.dbschedules.DatabaseSchedules` every ``ANARCHON["SCHEDULES_POLL_MS"]``
(only the rows changed lately, never the whole table on a quiet poll), and
:class:`BeatRows` adds, replaces and removes the beat's jobs. Each row's job is claimed
like a ``beat_schedule`` entry's, so every beat is active and each slot is sent once.

A row is sent as an entry would be: its ``target`` task with its ``args``, ``kwargs`` and
``task_options`` (``queue``, ``exchange``, ``routing_key``, ``priority``, ``headers``,
``expires``...) as the publish options, plus anarchon's slot headers. Its job options
(``jitter_ms``, ``max_late_ms``, ``overlap``...) left empty take the beat's
``anarchon_*`` settings.

Rows whose target is not a Celery task are not the beat's (the Django workers run them)
and are left out without a word. A row the beat cannot schedule (an option it refuses, a
name a ``beat_schedule`` entry has) is a warning naming it; the other rows go on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from anarchon_core import ConfigError, JobContext
from anarchon_core.sources import SourceChanges, SourcedJob, SourceSync
from anarchon_django.dbschedules import DatabaseSchedules, ScheduleTarget

from .entries import ENTRY_OPTIONS_KEY

if TYPE_CHECKING:
    from anarchon_core import Scheduler as CoreScheduler

__all__ = ["BeatRows", "CeleryTaskRows", "poll_interval_s", "row_entry", "sync_for"]

log = logging.getLogger("anarchon.celery")

#: What a row's job sends: ``send(ctx, entry, digest)`` (the beat's publish path).
Send = Callable[[JobContext, Any, str], Any]


def poll_interval_s() -> float:
    """``ANARCHON["SCHEDULES_POLL_MS"]`` in seconds; ConfigError when Django is not set up.

    Sets Django up (``django.setup()``) if its settings are configured but its apps are
    not loaded yet, as Celery's Django fix-up does for a worker.
    """
    import django  # noqa: PLC0415 - only with the setting on
    from django.apps import apps  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415
    from django.core.exceptions import ImproperlyConfigured  # noqa: PLC0415

    if not settings.configured:
        raise ConfigError("anarchon_database_schedules needs a Django project: set "
                          "DJANGO_SETTINGS_MODULE before the Celery app is created")
    if not apps.ready:
        django.setup()
    if not apps.is_installed("anarchon_django"):
        raise ConfigError("anarchon_database_schedules reads the anarchon_django Schedule "
                          "table: add 'anarchon_django' to INSTALLED_APPS")
    from anarchon_django import conf  # noqa: PLC0415 - needs the app registry

    try:
        parsed = conf.load()
    except ImproperlyConfigured as exc:
        raise ConfigError(f"anarchon_database_schedules: the ANARCHON setting: {exc}") \
            from None
    return parsed.schedules_poll_ms / 1000


class CeleryTaskRows(DatabaseSchedules):
    """The ``Schedule`` table as a job source holding only the rows a beat sends.

    A row whose target is a handler or a ``django.tasks`` task is left out as if
    disabled: a beat that had it drops it when it is changed to one.
    """

    def __init__(self, *, defaults: Mapping[str, Any] | None = None) -> None:
        super().__init__(defaults=defaults, kinds=("celery",),
                         description="the anarchon_django Schedule table (Celery tasks)")


def row_entry(job: SourcedJob) -> SimpleNamespace:
    """What the beat publishes for a row: the fields of a ``ScheduleEntry`` Celery reads."""
    target: ScheduleTarget = job.target
    options = dict(target.task_options)
    if ENTRY_OPTIONS_KEY in options:
        raise ConfigError(f"task_options[{ENTRY_OPTIONS_KEY!r}] is not a task option (the "
                          "job options are the row's own fields)")
    return SimpleNamespace(name=job.name, task=target.target, args=list(target.args),
                           kwargs=dict(target.kwargs), options=options)


def _disable(pk: int) -> None:
    from django.db import close_old_connections  # noqa: PLC0415

    from anarchon_django.models import Schedule  # noqa: PLC0415

    close_old_connections()
    try:
        Schedule.objects.filter(pk=pk).update(enabled=False)
    finally:
        close_old_connections()


class BeatRows:
    """Applies the table's changes to a beat's core scheduler: adds, replaces, removes jobs.

    ``taken()`` gives the names of the beat's ``beat_schedule`` entries: a row with one
    of them is a warning and not scheduled (the entry wins) until the entry goes
    (:meth:`entries_changed`). ``lock`` is the beat's, held while either side registers.
    """

    def __init__(self, core: CoreScheduler, send: Send, taken: Callable[[], Collection[str]],
                 lock: threading.RLock, description: str) -> None:
        self._core = core
        self._send = send
        self._taken = taken
        self._lock = lock
        self._description = description
        #: The rows scheduled now, by key (row id).
        self.held: dict[str, SourcedJob] = {}
        #: Rows not scheduled because an entry of ``beat_schedule`` has their name.
        self.shadowed: dict[str, SourcedJob] = {}

    def __call__(self, changes: SourceChanges) -> None:
        """Apply ``changes``: drop first (a rename frees its old name), then put."""
        with self._lock:
            for key in [*changes.dropped, *(job.key for job in changes.put)]:
                self.shadowed.pop(key, None)
                held = self.held.pop(key, None)
                if held is not None:
                    self._core.remove(held.name)
            taken = set(self._taken())
            for job in changes.put:
                if job.name in taken:
                    self.shadowed[job.key] = job
                    log.warning("%s: schedule %r (id %s) is not sent by this beat: a "
                                "beat_schedule entry has that name", self._description,
                                job.name, job.key)
                    continue
                self._put(job)

    def _put(self, job: SourcedJob) -> None:
        try:
            entry = row_entry(job)
            options = dict(job.options)
            if options.get("overlap") == "cancel_other":
                raise ConfigError("overlap='cancel_other' cannot stop a task already sent "
                                  "to a worker; use 'skip', 'buffer_one' (with "
                                  "anarchon_track_tasks) or 'allow'")
            self._core.add(job.name, job.schedule, self._handler(job, entry), **options)
        except ConfigError as exc:
            log.warning("%s: schedule %r (id %s) is not sent by this beat: %s",
                        self._description, job.name, job.key, exc)
            return
        self.held[job.key] = job

    def _handler(self, job: SourcedJob, entry: Any) -> Callable[[JobContext], Any]:
        target: ScheduleTarget = job.target
        digest = f"row:{job.key}:{job.revision}"
        send = self._send

        async def send_row(ctx: JobContext) -> None:
            await send(ctx, entry, digest)
            if target.one_off:
                await asyncio.to_thread(_disable, target.pk)
                # Not sent again by this beat; the others see the row disabled on a poll.
                self._forget(job)

        send_row.__qualname__ = f"schedule {job.name}"
        return send_row

    def _forget(self, job: SourcedJob) -> None:
        with self._lock:
            if self.held.get(job.key) is job:
                del self.held[job.key]
                self._core.remove(job.name)

    def yield_name(self, name: str) -> None:
        """A ``beat_schedule`` entry now has ``name``: unschedule the row holding it."""
        with self._lock:
            key = next((k for k, job in self.held.items() if job.name == name), None)
            if key is None:
                return
            self.shadowed[key] = self.held.pop(key)
            self._core.remove(name)
            log.warning("%s: schedule %r (id %s) is no longer sent by this beat: a "
                        "beat_schedule entry has that name now", self._description, name, key)

    def entries_changed(self) -> None:
        """Schedule the shadowed rows whose name no ``beat_schedule`` entry has any more."""
        with self._lock:
            taken = set(self._taken())
            for key, job in list(self.shadowed.items()):
                if job.name not in taken:
                    del self.shadowed[key]
                    self._put(job)


def sync_for(core: CoreScheduler, send: Send, taken: Callable[[], Collection[str]],
             lock: threading.RLock, defaults: Mapping[str, Any]) -> tuple[SourceSync, BeatRows]:
    """The poller of the table and the consumer it feeds (nothing is read yet)."""
    source = CeleryTaskRows(defaults={k: v for k, v in defaults.items() if v is not None})
    consumer = BeatRows(core, send, taken, lock, source.description)
    return SourceSync(source, consumer, interval_s=poll_interval_s()), consumer
