"""The Celery app of the bench's beat: Django settings under ``CELERY_``, one no-op task.

Run as ``celery -A bench.dbproject.celeryapp beat -S
django_celery_beat.schedulers:DatabaseScheduler``; nothing consumes the task messages.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery  # type: ignore[import-untyped]
from celery.signals import after_setup_logger  # type: ignore[import-untyped]

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.dbproject.settings")

app = Celery("benchbeat")
app.config_from_object("django.conf:settings", namespace="CELERY")




class _WakeUps(logging.Filter):
    """Beat's INFO lines and its DEBUG "beat: Waking up" line, no other DEBUG line.

    The first wake-up says the schedule is loaded (the first tick is over); the first
    after "Schedule changed." says an edit is live.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.INFO or str(record.msg).startswith("beat: Waking up")


@after_setup_logger.connect  # type: ignore[untyped-decorator]
def _log_wake_ups(**_: Any) -> None:
    beat = logging.getLogger("celery.beat")
    beat.setLevel(logging.DEBUG)
    beat.addFilter(_WakeUps())


@app.task(name="bench.noop")  # type: ignore[untyped-decorator]
def noop() -> None:
    """Never run: the bench measures the beat's sends."""
