"""Settings of the task site, from the environment the test gives each process.

* ``TASKSITE_DB``: ``sqlite:///path`` or a ``postgresql://`` URL (the project database,
  which holds both anarchon's runs table and django-tasks-db's task rows).
* ``TASKSITE_FAULT``: ``between:N`` kills the process (SIGKILL) on its N-th enqueue, after
  the task row is written and before the run's end; ``after:N`` right after that commit.
* ``TASKSITE_RQ``: a ``redis://`` URL: the tasks go to ``django-tasks-rq`` on that Redis
  (queue ``default``, run by ``manage.py rqworker``) and anarchon's store is that Redis
  too (strategy ``lease``), instead of ``django-tasks-db`` and the project database.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any
from urllib.parse import unquote, urlsplit

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
RQ_URL = os.environ.get("TASKSITE_RQ", "")
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    *([] if importlib.util.find_spec("django.tasks") else ["django_tasks"]),
    "django_rq" if RQ_URL else "django_tasks_db",
    "anarchon_django",
    "tests.django.tasksite.shop",
]


def _database(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": url.split(":///", 1)[1],
                "OPTIONS": {"timeout": 30}}
    return {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
            "USER": unquote(parts.username or ""), "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "", "PORT": str(parts.port or "")}


DATABASES = {"default": _database(os.environ.get("TASKSITE_DB", "sqlite:///tasksite.db"))}
TASKS = {"default": {"BACKEND": "django_tasks_rq.RQBackend" if RQ_URL
                     else "django_tasks_db.DatabaseBackend"}}
RQ_QUEUES = {"default": {"URL": RQ_URL}} if RQ_URL else {}
ANARCHON = {
    "BACKEND": RQ_URL or "default",
    "LEASE_MS": int(os.environ.get("TASKSITE_LEASE_MS", "1500")),
    "STOP_GRACE_MS": 1_000,
    # Chains of kills must not use up a slot's attempts, and a killed slot's live lease
    # must not make the next slot skip (overlap): every slot runs.
    "JOB_DEFAULTS": {"max_attempts": 50, "jitter_ms": 200, "overlap": True},
}
LOGGING = {
    "version": 1,
    "handlers": {"err": {"class": "logging.StreamHandler"}},
    "loggers": {"anarchon": {"handlers": ["err"], "level": "INFO"}},
}
