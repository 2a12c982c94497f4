"""A Celery app whose beat runs on anarchon: start as many beats as you like.

    celery -A proj worker -l info
    celery -A proj beat -S anarchon_celery:Scheduler -l info     # on every host, any number

Needs Redis on localhost (the broker, and by default the anarchon store too).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab

import anarchon_celery  # noqa: F401 - connects the worker signals of anarchon_track_tasks

app = Celery("proj", broker="redis://localhost:6379/0")
app.conf.update(
    timezone="Europe/Athens",
    beat_scheduler="anarchon_celery:Scheduler",
    anarchon_prefix="proj:beat:",
    anarchon_lease_ms=10_000,
)
app.conf.beat_schedule = {
    # every 30 s on the epoch grid: :00 and :30 of every minute, on whichever beat wins
    "ping": {"task": "proj.ping", "schedule": timedelta(seconds=30)},
    # 08:00 Athens time on weekdays, with args, a queue and a priority
    "report": {
        "task": "proj.report",
        "schedule": crontab(minute=0, hour=8, day_of_week="mon-fri"),
        "args": ("daily",),
        "options": {"queue": "celery", "priority": 5, "expires": 3600,
                    # anarchon's own per-entry options (never published)
                    "anarchon": {"catch_up_ms": 3_600_000}},
    },
}


@app.task(name="proj.ping", bind=True)
def ping(self: Any) -> str:
    """Shows the slot headers a consumer can deduplicate on."""
    return f"{getattr(self.request, 'anarchon_id', None)} attempt " \
           f"{getattr(self.request, 'anarchon_attempt', None)}"


@app.task(name="proj.report")
def report(kind: str) -> str:
    """A long task; set anarchon_track_tasks=True to never start two at once."""
    return kind
