"""Django integration for anarchon: jobs in each app's ``jobs.py``, run by every instance.

::

    INSTALLED_APPS += ["anarchon_django"]
    ANARCHON = {"BACKEND": "default"}        # the project's own database (or a store URL)

    # shop/jobs.py
    import anarchon_django

    @anarchon_django.every("expire-carts", "5m")
    def expire_carts(ctx):
        Cart.objects.filter(expires_at__lt=timezone.now()).delete()

Run ``python manage.py anarchon`` on as many machines as you like (each slot runs once),
or :func:`start`/:func:`stop` inside a process you already run. See docs/django.md.
"""

from __future__ import annotations

from .registry import cron, every, handler
from .runtime import (
    astart,
    astop,
    build_scheduler,
    get_reader,
    get_scheduler,
    requested_by,
    start,
    stop,
)
from .tasks import schedule
from .transactions import atomic

__all__ = [
    "astart",
    "astop",
    "atomic",
    "build_scheduler",
    "cron",
    "every",
    "get_reader",
    "get_scheduler",
    "handler",
    "requested_by",
    "schedule",
    "start",
    "stop",
]
