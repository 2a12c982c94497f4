"""The run ↔ task link of the run history: which Django task a run enqueued, and its outcome.

A run that enqueued a task keeps in its meta ``task_id`` (the ``TaskResult`` id),
``task_backend`` (its alias in ``TASKS``), ``task_name`` (the task's module path) and,
once the backend reports it, ``task_status``. When that backend is django-tasks-db and
its admin is registered on the same admin site, the id links to the task's admin page;
otherwise the id and status are shown as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.admin import AdminSite
from django.urls import NoReverseMatch, reverse

__all__ = ["TASK_KEYS", "TaskLink", "task_link"]

#: The meta keys that describe a run's task (shown as the task, not as plain meta).
TASK_KEYS = ("task_id", "task_backend", "task_name", "task_status")
_DB_APP = "django_tasks_db"
_DB_MODEL = "DBTaskResult"


@dataclass(frozen=True)
class TaskLink:
    """A run's task: its id, name, backend alias and status; ``url`` its admin page."""

    id: str
    name: str
    backend: str
    status: str
    url: str | None = None


def task_link(meta: Mapping[str, str], site: AdminSite) -> TaskLink | None:
    """The task a run's meta names, or None when the run enqueued no task."""
    task_id = meta.get("task_id")
    if not task_id:
        return None
    backend = meta.get("task_backend") or "default"
    return TaskLink(task_id, meta.get("task_name", ""), backend, meta.get("task_status", ""),
                    _admin_url(task_id, backend, site))


def _admin_url(task_id: str, backend: str, site: AdminSite) -> str | None:
    config = next((c for c in apps.get_app_configs() if c.name == _DB_APP), None)
    if config is None:
        return None
    tasks: Any = getattr(settings, "TASKS", None) or {}
    entry = tasks.get(backend) if isinstance(tasks, Mapping) else None
    path = str(entry.get("BACKEND", "")) if isinstance(entry, Mapping) else ""
    if not path.startswith(f"{_DB_APP}."):
        return None  # another backend's ids mean nothing to the database backend's admin
    try:
        model = config.get_model(_DB_MODEL)
    except LookupError:
        return None
    if not site.is_registered(model):
        return None
    opts = model._meta
    try:
        return reverse(f"{site.name}:{opts.app_label}_{opts.model_name}_change", args=[task_id])
    except NoReverseMatch:
        return None
