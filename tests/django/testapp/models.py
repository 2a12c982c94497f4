from __future__ import annotations

from django.db import models


class Note(models.Model):
    """A row a job writes through the ORM."""

    job = models.CharField(max_length=200)
    slot = models.BigIntegerField()
    manual = models.BooleanField(default=False)
    runner = models.CharField(max_length=200)
    thread = models.CharField(max_length=200, default="")
