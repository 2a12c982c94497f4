"""System checks (``manage.py check``): the ``ANARCHON`` settings and the declared jobs.

======================  ==========================================================
id                      problem
======================  ==========================================================
``anarchon.E001``       ``ANARCHON`` is not a dict
``anarchon.E002``       an unknown key in ``ANARCHON`` (with the closest valid one)
``anarchon.E003``       ``BACKEND`` is neither a store URL nor a ``DATABASES`` alias
``anarchon.E004``       ``BACKEND`` names a database whose engine is not PostgreSQL/SQLite
``anarchon.E005``       ``BACKEND`` names an in-memory SQLite database
``anarchon.W005``       the same, made so by the test runner (no ``TEST`` ``NAME`` file):
                        a warning, so that the tests that do not use anarchon still run
``anarchon.E006``       the backend cannot be built (bad URL, TABLE, PREFIX, options)
``anarchon.E007``       ``PREFIX`` given for a SQL backend, or ``TABLE`` for another
``anarchon.E008``       a bad scheduler setting (lease timings, history, instance id...)
``anarchon.E009``       ``JOB_DEFAULTS`` is not a dict, or has unknown/unusable options
``anarchon.E010``       a declared job is invalid with these settings
``anarchon.E011``       a bad ``ADMIN_READ_ONLY`` or ``DATABASE_SCHEDULES``
``anarchon.E012``       a bad ``TASKS`` entry (the message names it)
======================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning

from anarchon_core import ConfigError, Scheduler

from . import conf, registry, runtime, tasks

__all__ = ["check_jobs", "check_settings"]

TAG = "anarchon"


@register(TAG)
def check_settings(app_configs: Sequence[AppConfig] | None = None,
                   **kwargs: Any) -> list[CheckMessage]:
    """Report every problem of ``settings.ANARCHON`` (E001–E009, E011, W005)."""
    _, problems = conf.parse()
    return [(CheckWarning if p.warning else Error)(
        p.msg, hint=p.hint, id=p.id, obj="settings.ANARCHON") for p in problems]


@register(TAG)
def check_tasks(app_configs: Sequence[AppConfig] | None = None,
                **kwargs: Any) -> list[CheckMessage]:
    """Report every bad ``ANARCHON['TASKS']`` entry, its name in the message (E012)."""
    raw = conf.settings_tasks()
    return [Error(problem, id="anarchon.E012", obj="settings.ANARCHON",
                  hint="Each entry: {'task': 'app.tasks.name', 'cron': '0 2 * * *'} or "
                       "'every': '10m', with JSON 'args'/'kwargs' the task accepts.")
            for problem in tasks.declare_from_settings(raw)]


@register(TAG)
def check_jobs(app_configs: Sequence[AppConfig] | None = None,
               **kwargs: Any) -> list[CheckMessage]:
    """Register every declared job on a scratch scheduler; report those refused (E010)."""
    parsed, problems = conf.parse()
    if parsed is None or problems:
        return []  # the settings errors come first; jobs are checked once they are fixed
    scheduler = Scheduler(conf.build_backend(parsed), **parsed.scheduler_options())
    errors: list[CheckMessage] = []
    for declaration in registry.declarations():
        try:
            runtime.register_job(scheduler, declaration, parsed.job_defaults)
        except ConfigError as exc:
            errors.append(Error(str(exc), id="anarchon.E010", obj=declaration.handler,
                                hint="Fix the job's options (or ANARCHON['JOB_DEFAULTS'])."))
    return errors
