"""Jobs of the test app, found by autodiscovery (``jobs.py`` of an installed app)."""

from __future__ import annotations

import threading

from django.conf import settings

import anarchon_django
from anarchon_core import JobContext

from .models import Note


def _alias() -> str:
    """The database the runs live in: jobs here write their notes beside them."""
    backend = settings.ANARCHON.get("BACKEND", "default")
    return backend if "://" not in backend else "default"


@anarchon_django.every("testapp.note", "1h")
def note(ctx: JobContext) -> None:
    """A sync job using the ORM."""
    Note.objects.using(_alias()).create(job=ctx.job, slot=ctx.slot, manual=ctx.manual,
                                        runner=ctx.instance_id,
                                        thread=threading.current_thread().name)
    ctx.meta["notes"] = str(Note.objects.using(_alias()).count())


@anarchon_django.every("testapp.async_note", "1h", timeout_ms=30_000)
async def async_note(ctx: JobContext) -> None:
    """An async job using the async ORM."""
    await Note.objects.using(_alias()).acreate(job=ctx.job, slot=ctx.slot, manual=ctx.manual,
                                               runner=ctx.instance_id)


@anarchon_django.cron("testapp.report", "0 8 * * *")
def report(ctx: JobContext) -> None:
    """A cron job in the project's TIME_ZONE."""


@anarchon_django.cron("testapp.utc", "30 2 * * *", tz="UTC")
def utc(ctx: JobContext) -> None:
    """A cron job with its own zone."""


@anarchon_django.every("testapp.fail", "1d")
def fail(ctx: JobContext) -> None:
    """A job that fails."""
    raise RuntimeError("the report server said no")


@anarchon_django.handler("testapp.greet")
def greet(ctx: JobContext, who: str = "world", times: int = 1) -> None:
    """A target of database schedules: one note per call, its runner the argument."""
    for _ in range(times):
        Note.objects.create(job=ctx.job, slot=ctx.slot, manual=ctx.manual,
                            runner=f"{who}")
