"""The example's data: carts that expire, orders, and the ticks of the ``tick`` job."""

from __future__ import annotations

from django.db import models


class Cart(models.Model):
    """A shopping cart; the ``expire-carts`` job deletes it after ``expires_at``."""

    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()


class Order(models.Model):
    """A placed order; the ``daily-report`` job counts yesterday's."""

    placed_at = models.DateTimeField(auto_now_add=True)
    total_cents = models.PositiveIntegerField()


class Tick(models.Model):
    """One run of the ``tick`` job: which slot, which attempt, which instance."""

    slot = models.BigIntegerField(db_index=True)
    attempt = models.PositiveIntegerField()
    runner = models.CharField(max_length=200)
    done_at = models.DateTimeField(auto_now_add=True)
