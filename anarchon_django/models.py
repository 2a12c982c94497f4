"""Admin entries and permissions: two models without tables.

anarchon keeps runs in its store (Redis, PostgreSQL, SQLite...), never in Django models.
These unmanaged models only give the admin its two entries ("Jobs", "Run history") and the
permissions that guard them: ``anarchon_django.view_job``, ``anarchon_django.view_run``,
``anarchon_django.run_job`` ("run now") and ``anarchon_django.pause_job`` ("pause" and
"resume", for every worker). They are never queried.
"""

from __future__ import annotations

from django.db import models

__all__ = ["Job", "Run"]


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
