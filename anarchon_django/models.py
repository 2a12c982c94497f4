"""The schedules kept in the database, and the admin's entries for jobs and runs.

:class:`Schedule` is a job kept in a table: edited in the admin or created by application
code (one per tenant...), and picked up by every worker (see "Schedules in the database"
in docs/django.md).

anarchon keeps runs in its store (Redis, PostgreSQL, SQLite...), never in Django models.
The unmanaged models :class:`Job` and :class:`Run` only give the admin its two entries
("Jobs", "Run history") and the permissions that guard them: ``anarchon_django.view_job``,
``anarchon_django.view_run``, ``anarchon_django.run_job`` ("run now") and
``anarchon_django.pause_job`` ("pause" and "resume", for every worker). They are never
queried.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from django.db import models
from django.utils import timezone

from anarchon_core.models import OVERLAP_POLICIES
from anarchon_core.options import CATCH_UP_POLICIES

__all__ = ["TARGET_KINDS", "Job", "Run", "Schedule", "ScheduleQuerySet", "new_revision"]

if TYPE_CHECKING:
    _Text: TypeAlias = models.CharField[str, str]
    _LongText: TypeAlias = models.TextField[str, str]
    _Json: TypeAlias = models.JSONField[Any, Any]
    _Ms: TypeAlias = models.PositiveBigIntegerField[int | None, int | None]
    _Count: TypeAlias = models.PositiveIntegerField[int | None, int | None]
    _Flag: TypeAlias = models.BooleanField[bool, bool]
    _Moment: TypeAlias = models.DateTimeField[datetime | None, datetime | None]
    _Stamp: TypeAlias = models.DateTimeField[datetime, datetime]

#: How a :class:`Schedule` finds its ``target``.
TARGET_KINDS = [
    ("auto", "auto: a handler, else a django.tasks task, else a Celery task"),
    ("handler", "a handler (@anarchon_django.handler)"),
    ("task", "a django.tasks task"),
    ("celery", "a Celery task"),
]


class Job(models.Model):
    """The admin's job list (schedule, next run, last status, recent slots, actions)."""

    class Meta:
        """No table; view, run and pause permissions only."""

        managed = False
        db_table = "anarchon_django_job_no_table"
        default_permissions = ("view",)
        permissions = (("run_job", "Can run a job now"),
                       ("pause_job", "Can pause and resume a job for every worker"))
        verbose_name = "job"
        verbose_name_plural = "jobs"


class Run(models.Model):
    """The admin's run history, read from the store (read-only)."""

    class Meta:
        """No table; the view permission only."""

        managed = False
        db_table = "anarchon_django_run_no_table"
        default_permissions = ("view",)
        verbose_name = "run"
        verbose_name_plural = "run history"


def new_revision() -> str:
    """A fresh revision: workers compare it with the one they hold to see a change."""
    return secrets.token_hex(8)


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    """``update()`` marks the rows changed, so that every worker picks the change up."""

    def update(self, **kwargs: Any) -> int:
        """Update the rows, with a new ``revision`` and ``updated_at``."""
        kwargs.setdefault("revision", new_revision())
        kwargs.setdefault("updated_at", timezone.now())
        return super().update(**kwargs)

    update.alters_data = True  # type: ignore[attr-defined]

    def enabled(self) -> ScheduleQuerySet:
        """The schedules that run."""
        return self.filter(enabled=True)


class Schedule(models.Model):
    """A job kept in the database: edited in the admin or by code, run by every worker.

    Exactly one of ``every`` (``"5m"``, ``"1h30m"``) and ``cron`` (5 fields, or 6 with
    seconds first, read in ``tz``, by default ``TIME_ZONE``) gives the timing. ``target``
    is what runs, found by ``target_kind``: a handler registered with
    :func:`anarchon_django.handler`, a ``django.tasks`` task path (each slot enqueues it
    once) or a Celery task name (each slot sends it once); ``auto`` tries them in that
    order. The job options left empty take ``ANARCHON['JOB_DEFAULTS']``.

    Changes made through the admin, ``save()``, ``Schedule.objects.create/update/delete``
    (inside a transaction too: a row rolled back never runs) are live on every worker
    within ``ANARCHON['SCHEDULES_POLL_MS']``. Raw SQL must set a new ``revision``.
    """

    name: _Text = models.CharField(
        max_length=200, unique=True,
        help_text="Unique across the project, like a job declared in code.")
    target_kind: _Text = models.CharField("target kind", max_length=10, choices=TARGET_KINDS,
                                          default="auto")
    target: _Text = models.CharField(
        max_length=300,
        help_text="A handler's name (@anarchon_django.handler), a django.tasks task path "
                  "(shop.tasks.send_report) or a Celery task name.")
    every: _Text = models.CharField(
        max_length=40, blank=True,
        help_text='An interval on the epoch grid: "30s", "5m", "1h30m".')
    cron: _Text = models.CharField(max_length=200, blank=True,
                                   help_text='A cron expression: "0 8 * * 1-5".')
    tz: _Text = models.CharField(
        "time zone", max_length=64, blank=True,
        help_text="An IANA zone for cron (empty: the TIME_ZONE setting).")
    dst: _Text = models.CharField(
        "DST rule", max_length=40, blank=True,
        help_text='For cron: once_first/once_last/both and shift/skip, e.g. "once_last" '
                  "(empty: cron(8)'s rule).")
    args: _Json = models.JSONField(default=list, blank=True, help_text="A JSON list.")
    kwargs: _Json = models.JSONField(default=dict, blank=True, help_text="A JSON object.")
    task_options: _Json = models.JSONField(
        "task options", default=dict, blank=True,
        help_text="For a django.tasks task: queue_name, priority, backend. For a Celery "
                  "task: queue, exchange, routing_key, priority, headers, expires.")
    timeout_ms: _Ms = models.PositiveBigIntegerField(null=True, blank=True)
    jitter_ms: _Ms = models.PositiveBigIntegerField(null=True, blank=True)
    max_late_ms: _Ms = models.PositiveBigIntegerField(null=True, blank=True)
    overlap: _Text = models.CharField(max_length=20, blank=True,
                                      choices=[(p, p) for p in OVERLAP_POLICIES])
    max_attempts: _Count = models.PositiveIntegerField(null=True, blank=True)
    catch_up_ms: _Ms = models.PositiveBigIntegerField(null=True, blank=True)
    catch_up: _Text = models.CharField(max_length=10, blank=True,
                                       choices=[(p, p) for p in CATCH_UP_POLICIES])
    enabled: _Flag = models.BooleanField(default=True)
    one_off: _Flag = models.BooleanField(
        "one-off", default=False, help_text="Disabled after its first successful run.")
    start_at: _Moment = models.DateTimeField(null=True, blank=True,
                                             help_text="No slot before this time.")
    expires_at: _Moment = models.DateTimeField(null=True, blank=True,
                                               help_text="No slot from this time on.")
    description: _LongText = models.TextField(blank=True)
    created_at: _Stamp = models.DateTimeField(auto_now_add=True)
    updated_at: _Stamp = models.DateTimeField(auto_now=True, db_index=True)
    revision: _Text = models.CharField(max_length=32, default=new_revision, editable=False)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        """Permissions beyond the default four: run now."""

        ordering = ("name",)
        verbose_name = "schedule"
        verbose_name_plural = "schedules"
        permissions = (("run_schedule", "Can run a schedule now"),)

    def __str__(self) -> str:
        return str(self.name)

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save with a new ``revision``, so that every worker picks the change up."""
        self.revision = new_revision()
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "revision", "updated_at"}
        super().save(*args, **kwargs)

    def clean(self) -> None:
        """The checks a job declared in code gets, each error on its field."""
        from .dbschedules import validate  # noqa: PLC0415 - imports the core's schedules

        validate(self)
