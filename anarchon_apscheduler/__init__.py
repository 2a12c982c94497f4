"""APScheduler 3 integration: run the same APScheduler setup on N processes, each firing once.

Wrap the executor (and, to add jobs at run time, the job store)::

    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler
    from anarchon_apscheduler import AnarchonExecutor

    scheduler = BackgroundScheduler(executors={
        "default": AnarchonExecutor(ThreadPoolExecutor(10), backend="redis://localhost:6379"),
    })

See docs/apscheduler.md for what is guaranteed, the events, and the interval rule.
"""

from __future__ import annotations

from .context import RunContext, current_run
from .executor import UNLIMITED_GRACE_MS, AnarchonExecutor
from .jobstore import AnarchonJobStore
from .triggers import EPOCH, CronScheduleTrigger, check_trigger, slot_for

__all__ = [
    "EPOCH",
    "UNLIMITED_GRACE_MS",
    "AnarchonExecutor",
    "AnarchonJobStore",
    "CronScheduleTrigger",
    "RunContext",
    "check_trigger",
    "current_run",
    "slot_for",
]
