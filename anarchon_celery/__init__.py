"""Celery beat on anarchon: run many beats, every one active, each slot's task sent once.

    app.conf.beat_scheduler = "anarchon_celery:Scheduler"
    # or: celery -A proj beat -S anarchon_celery:Scheduler

Settings are ``anarchon_*`` keys on ``app.conf`` (see docs/celery.md). Importing this
package also connects the worker-side task signals of ``anarchon_track_tasks``.
"""

from __future__ import annotations

from .entries import ENTRY_OPTIONS_KEY, JobSpec, cron_expression, job_spec
from .scheduler import (
    HEADER_ATTEMPT,
    HEADER_ID,
    HEADER_JOB,
    HEADER_RUNNER,
    HEADER_SLOT,
    Scheduler,
)
from .settings import Settings
from .tracking import TASK_SUFFIX, task_job

__all__ = [
    "ENTRY_OPTIONS_KEY",
    "HEADER_ATTEMPT",
    "HEADER_ID",
    "HEADER_JOB",
    "HEADER_RUNNER",
    "HEADER_SLOT",
    "TASK_SUFFIX",
    "JobSpec",
    "Scheduler",
    "Settings",
    "cron_expression",
    "job_spec",
    "task_job",
]
