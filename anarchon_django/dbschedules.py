"""Schedules in the database: the :class:`~anarchon_django.models.Schedule` rows as jobs.

:class:`DatabaseSchedules` is the table as a :class:`~anarchon_core.JobSource`: a poll
asks for the rows changed in the last minute (an index on ``updated_at``) and for the
count of rows, never for the whole table, unless the count says a row was deleted.
:func:`validate` holds the checks a row gets in the admin and in ``full_clean()``: the
same as a job declared in code. :func:`handler_for` turns a row's target into the handler
a worker runs; :func:`attach` adds the table to a scheduler.
"""

from __future__ import annotations

import functools
import inspect
import logging
import zoneinfo
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from anarchon_core import ConfigError, JobContext, Schedule
from anarchon_core.naming import validate_job_name
from anarchon_core.options import JobOptions
from anarchon_core.schedules import cron_schedule, every_schedule
from anarchon_core.sources import SourcedJob, SourceSync

from . import registry, tasks

if TYPE_CHECKING:
    from anarchon_core import Scheduler

    from .models import Schedule as ScheduleRow

__all__ = ["JOB_OPTION_FIELDS", "DatabaseSchedules", "ScheduleTarget", "attach",
           "handler_for", "job_for", "resolve", "validate"]

log = logging.getLogger("anarchon.django.schedules")

#: The job options a row holds, each a field of the same name (empty: the default).
JOB_OPTION_FIELDS = ("timeout_ms", "jitter_ms", "max_late_ms", "overlap", "max_attempts",
                     "catch_up_ms", "catch_up")
#: How far back a poll looks for changed rows (s): a row saved in a transaction that
#: commits later than this is found by the next count check or full listing.
LOOKBACK_S = 60.0
#: Rows loaded per query.
_CHUNK = 500


@dataclass(frozen=True)
class ScheduleTarget:
    """What a row runs: its target, found by kind, with the arguments and task options."""

    pk: int
    kind: str
    target: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    task_options: Mapping[str, Any] = field(default_factory=dict)
    one_off: bool = False


def resolve(kind: str, target: str) -> tuple[str, Any]:
    """``(kind, what)`` for a row's target: a handler, a ``Task``, or a Celery task name.

    ``auto`` tries a registered handler, then a ``django.tasks`` task path, then a task
    of the current Celery app. Raises :class:`ConfigError` saying what was not found.
    """
    if kind in ("auto", "handler"):
        handler = registry.handlers().get(target)
        if handler is not None:
            return "handler", handler
        if kind == "handler":
            raise ConfigError(f"no handler named {target!r}: register one with "
                              "@anarchon_django.handler(...) in an app's jobs.py")
    if kind in ("auto", "task"):
        task = _import_task(target)
        if task is not None:
            return "task", task
        if kind == "task":
            raise ConfigError(f"{target!r} is not a django.tasks task (a dotted path to a "
                              "function decorated with @task)")
    if kind in ("auto", "celery"):
        celery_task = _celery_task(target)
        if celery_task is not None or kind == "celery":
            # A Celery task may live in other workers only: sent by name all the same.
            return "celery", celery_task
        raise ConfigError(f"no handler, django.tasks task or Celery task named {target!r}")
    raise ConfigError(f"invalid target kind {kind!r}: expected auto, handler, task or celery")


def _import_task(path: str) -> Any:
    if "." not in path:
        return None
    try:
        obj = import_string(path)
    except ImportError:
        return None
    return obj if tasks.is_task(obj) else None


def _celery_task(name: str) -> Any:
    try:
        from celery import current_app  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        return None
    return current_app.tasks.get(name)


@functools.lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _check_arguments(kind: str, what: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    func = {"handler": what, "task": getattr(what, "func", None),
            "celery": getattr(what, "run", None)}.get(kind)
    if func is None:
        return
    signature = _signature(func)
    if signature is None:
        return
    bound_args: list[Any] = [None, *args] if kind == "handler" else list(args)
    try:
        signature.bind(*bound_args, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"the arguments do not fit {getattr(func, '__qualname__', func)}"
                          f"{signature}: {exc}") from None


def _zone(row: ScheduleRow) -> str:
    from django.conf import settings  # noqa: PLC0415

    return row.tz or getattr(settings, "TIME_ZONE", None) or "UTC"


def _schedule(row: ScheduleRow) -> Schedule:
    if bool(row.every) == bool(row.cron):
        raise ValidationError("give either every (an interval) or cron (an expression), "
                              "not both and not neither", code="timing")
    if row.every:
        if row.tz or row.dst:
            raise ValidationError({"tz" if row.tz else "dst": "only for cron"})
        try:
            return every_schedule(row.every)
        except ConfigError as exc:
            raise ValidationError({"every": str(exc)}) from None
    zone = _zone(row)
    try:
        zoneinfo.ZoneInfo(zone)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise ValidationError({"tz": f"unknown time zone {zone!r}: expected an IANA name "
                                     "like Europe/Athens"}) from None
    try:
        cron_schedule(row.cron, zone)
    except ConfigError as exc:
        raise ValidationError({"cron": str(exc)}) from None
    try:
        return cron_schedule(row.cron, zone, row.dst or None)
    except ConfigError as exc:
        raise ValidationError({"dst": str(exc)}) from None


def row_options(row: ScheduleRow) -> dict[str, Any]:
    """The job options the row sets (the empty ones left out)."""
    out: dict[str, Any] = {}
    for name in JOB_OPTION_FIELDS:
        value = getattr(row, name)
        if value is not None and value != "":
            out[name] = value
    return out


def validate(row: ScheduleRow, defaults: Mapping[str, Any] | None = None) -> Schedule:
    """Check ``row`` as a job declared in code is checked; its schedule.

    Raises :class:`~django.core.exceptions.ValidationError` with each error on its
    field: a bad cron expression on ``cron``, an unknown handler on ``target``, an
    option out of range on that option.
    """
    try:
        validate_job_name(row.name)
    except ConfigError as exc:
        raise ValidationError({"name": str(exc)}) from None
    schedule = _schedule(row)
    given = row_options(row)
    try:
        JobOptions.build(schedule, {**(defaults or {}), **given}, leases=True,
                         now_ms=round(timezone.now().timestamp() * 1000))
    except ConfigError as exc:
        text = str(exc)
        named = [n for n in given if n in text]
        raise ValidationError({named[0]: text} if named else text) from None
    if not isinstance(row.args, list):
        raise ValidationError({"args": "expected a JSON list"})
    if not isinstance(row.kwargs, dict) or not all(isinstance(k, str) for k in row.kwargs):
        raise ValidationError({"kwargs": "expected a JSON object"})
    if not isinstance(row.task_options, dict):
        raise ValidationError({"task_options": "expected a JSON object"})
    if row.start_at and row.expires_at and row.expires_at <= row.start_at:
        raise ValidationError({"expires_at": "must be after start_at"})
    try:
        kind, what = resolve(row.target_kind, row.target)
    except ConfigError as exc:
        raise ValidationError({"target": str(exc)}) from None
    try:
        _check_arguments(kind, what, row.args, row.kwargs)
        if kind == "task":
            _task_target(row.pk or 0, what, row.args, row.kwargs, row.task_options
                         ).validate(row.name)
    except ConfigError as exc:
        raise ValidationError({"kwargs" if row.kwargs else "args": str(exc)}) from None
    return schedule


def _task_target(pk: int, task: Any, args: list[Any], kwargs: Mapping[str, Any],
                 options: Mapping[str, Any]) -> tasks.TaskTarget:
    unknown = sorted(set(options) - {"queue_name", "priority", "backend"})
    if unknown:
        raise ConfigError(f"unknown task option(s) {', '.join(unknown)} for a django.tasks "
                          "task: expected queue_name, priority, backend")
    return tasks.TaskTarget(task, tuple(args), dict(kwargs), **options)


def _ms(moment: datetime | None) -> int | None:
    return None if moment is None else round(moment.timestamp() * 1000)


def job_for(row: ScheduleRow, defaults: Mapping[str, Any]) -> SourcedJob:
    """The row as a :class:`~anarchon_core.SourcedJob` (ValidationError if it is not one)."""
    schedule = validate(row, defaults)
    target = ScheduleTarget(row.pk, row.target_kind, row.target, tuple(row.args),
                            dict(row.kwargs), dict(row.task_options), row.one_off)
    return SourcedJob(str(row.pk), row.name, row.revision, schedule,
                      {**defaults, **row_options(row)}, target,
                      starts_at_ms=_ms(row.start_at), ends_at_ms=_ms(row.expires_at))


def _problem(row: ScheduleRow, exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        text = "; ".join(f"{name}: {' '.join(str(m) for m in messages)}"
                         for name, messages in exc.message_dict.items())
    else:
        text = " ".join(exc.messages)
    return f"schedule {row.name!r} (id {row.pk}) is not scheduled: {text}"


class DatabaseSchedules:
    """The ``Schedule`` table as a :class:`~anarchon_core.JobSource`.

    Each call closes the connections Django would close after a request.
    """

    def __init__(self, *, defaults: Mapping[str, Any] | None = None,
                 using: str | None = None, lookback_s: float = LOOKBACK_S,
                 kinds: Collection[str] | None = None,
                 description: str = "the anarchon_django Schedule table") -> None:
        self.description = description
        self.defaults = dict(defaults or {})
        self.using = using
        self.lookback_s = lookback_s
        #: The target kinds taken (``handler``, ``task``, ``celery``); None: all. A row of
        #: another kind is left out as if disabled.
        self.kinds = None if kinds is None else frozenset(kinds)

    def _rows(self) -> Any:
        from .models import Schedule as ScheduleRow  # noqa: PLC0415 - needs the app registry

        manager = ScheduleRow.objects
        return manager.using(self.using) if self.using else manager.all()

    def changed_since(self, since_ms: float | None) -> dict[str, str]:
        """``{pk: revision}`` of the rows changed since ``since_ms`` less the look-back."""
        close_old_connections()
        rows = self._rows()
        if since_ms is not None:
            since = datetime.fromtimestamp(since_ms / 1000, tz=UTC)
            rows = rows.filter(updated_at__gte=since - timedelta(seconds=self.lookback_s))
        return {str(pk): revision for pk, revision in rows.values_list("pk", "revision")}

    def count(self) -> int:
        """How many rows the table holds."""
        return int(self._rows().count())

    def load(self, keys: Collection[str]) -> list[SourcedJob | str]:
        """The enabled rows of ``keys`` as jobs; a warning text for each invalid one."""
        out: list[SourcedJob | str] = []
        wanted = [int(k) for k in keys if k.isdigit()]
        for start in range(0, len(wanted), _CHUNK):
            for row in self._rows().filter(pk__in=wanted[start:start + _CHUNK], enabled=True):
                try:
                    job = job_for(row, self.defaults)
                    if self.kinds is None or resolve(row.target_kind, row.target)[0] \
                            in self.kinds:
                        out.append(job)
                except ValidationError as exc:
                    out.append(_problem(row, exc))
                except Exception as exc:  # noqa: BLE001 - a hostile row must not stop the others
                    out.append(f"schedule {row.name!r} (id {row.pk}) is not scheduled: "
                               f"{type(exc).__name__}: {exc}")
        close_old_connections()
        return out

    def by_name(self, name: str) -> SourcedJob | str | None:
        """The enabled row named ``name`` as a job, a text if it is not one, or None."""
        row = self._rows().filter(name=name, enabled=True).first()
        close_old_connections()
        if row is None:
            return None
        found = self.load([str(row.pk)])
        return found[0] if found else None


def handler_for(job: SourcedJob) -> Callable[[JobContext], Any]:
    """The handler a worker runs for a row: call the handler, enqueue or send the task."""
    target: ScheduleTarget = job.target
    kind, what = resolve(target.kind, target.target)
    run: Callable[[JobContext], Any]
    if kind == "handler":
        run = _bound_handler(what, target)
    elif kind == "task":
        run = tasks.task_handler(_task_target(target.pk, what, list(target.args),
                                              target.kwargs, target.task_options))
    else:
        run = _celery_sender(target)
    if target.one_off:
        run = _one_off(run, target.pk)
    from .runtime import wrap_handler  # noqa: PLC0415 - runtime imports this module

    return wrap_handler(run)


def _bound_handler(func: Callable[..., Any],
                   target: ScheduleTarget) -> Callable[[JobContext], Any]:
    if inspect.iscoroutinefunction(func):
        async def run_async(ctx: JobContext) -> Any:
            return await func(ctx, *target.args, **target.kwargs)

        return run_async

    def run(ctx: JobContext) -> Any:
        return func(ctx, *target.args, **target.kwargs)

    return run


def _celery_sender(target: ScheduleTarget) -> Callable[[JobContext], None]:
    def send(ctx: JobContext) -> None:
        from celery import current_app  # noqa: PLC0415

        result = current_app.send_task(target.target, args=list(target.args),
                                       kwargs=dict(target.kwargs), **target.task_options)
        ctx.meta["task_id"] = str(result.id)
        ctx.meta["task_name"] = target.target

    return send


def _one_off(run: Callable[[JobContext], Any], pk: int) -> Callable[[JobContext], Any]:
    def once(ctx: JobContext) -> Any:
        result = run(ctx)
        from .models import Schedule as ScheduleRow  # noqa: PLC0415

        ScheduleRow.objects.filter(pk=pk).update(enabled=False)
        return result

    return once


def attach(scheduler: Scheduler, *, defaults: Mapping[str, Any], interval_s: float,
           kinds: Collection[str] | None = None) -> SourceSync:
    """Keep ``scheduler``'s jobs in step with the ``Schedule`` table (rows of ``kinds``)."""
    return scheduler.add_source(DatabaseSchedules(defaults=defaults, kinds=kinds),
                                handler_for, interval_s=interval_s)
