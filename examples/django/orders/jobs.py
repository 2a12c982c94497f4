"""The shop's scheduled jobs. Every instance declares the same; each slot runs once.

Start as many workers as you like (``python manage.py anarchon``), on one machine or many.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

import anarchon_django
from anarchon_core import JobContext

from .models import Cart, Order, Tick

log = logging.getLogger("orders.jobs")


@anarchon_django.every("expire-carts", "1m")
def expire_carts(ctx: JobContext) -> None:
    """Delete carts past their expiry (the ORM in a plain ``def`` job)."""
    deleted, _ = Cart.objects.filter(expires_at__lt=timezone.now()).delete()
    ctx.meta["deleted"] = str(deleted)


@anarchon_django.cron("daily-report", "0 8 * * *")  # 08:00 in TIME_ZONE (Europe/Athens)
def daily_report(ctx: JobContext) -> None:
    """Count yesterday's orders; the count is kept with the run (``meta``)."""
    since = ctx.scheduled_at - timedelta(days=1)
    ctx.meta["orders"] = str(Order.objects.filter(placed_at__gte=since).count())


@anarchon_django.every("ping-partner", "5m", timeout_ms=30_000)
async def ping_partner(ctx: JobContext) -> None:
    """An async job: awaits instead of blocking a thread (here it only waits)."""
    await asyncio.sleep(0.05)
    ctx.meta["carts"] = str(await Cart.objects.acount())


@anarchon_django.every("tick", settings.EXAMPLE_TICK_EVERY)
def tick(ctx: JobContext) -> None:
    """Record each run in the Tick table: the admin shows who ran which slot."""
    deadline = time.monotonic() + settings.EXAMPLE_TICK_SLEEP_MS / 1000
    while time.monotonic() < deadline:  # some work, stopping early if asked to
        ctx.raise_if_cancelled()
        time.sleep(0.02)
    ctx.check_lease()  # still ours? (raises LeaseLost if another instance took over)
    Tick.objects.create(slot=ctx.slot, attempt=ctx.attempt, runner=ctx.instance_id)


@anarchon_django.handler("send-newsletter")
def send_newsletter(ctx: JobContext, tenant: str, segment: str = "all") -> None:
    """A target for schedules kept in the database: one ``Schedule`` row per tenant.

    Created in the admin ("Schedules") or by code, e.g. when a tenant signs up::

        Schedule.objects.create(name=f"newsletter-{tenant}", target="send-newsletter",
                                cron="0 9 * * 1", kwargs={"tenant": tenant})
    """
    ctx.meta["tenant"] = tenant
    ctx.meta["segment"] = segment
