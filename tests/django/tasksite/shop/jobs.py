"""A task scheduled every second; it takes the slot key, so its row says which slot."""

from __future__ import annotations

import anarchon_django

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@anarchon_django.every("tasksite.tick", "1s")
@task
def tick(slot_key: str) -> str:
    """Return the slot key (stored with the task row)."""
    return slot_key
