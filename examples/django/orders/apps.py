"""The orders app."""

from __future__ import annotations

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    """Carts, orders, and the jobs that look after them (``jobs.py``)."""

    name = "orders"
    default_auto_field = "django.db.models.BigAutoField"
