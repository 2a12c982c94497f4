"""Settings of the bench project; the bench passes everything it varies in the environment.

* ``BENCH_DATABASE_URL``: the dedicated PostgreSQL (``postgresql://user@host:port/db``).
* ``BENCH_DATABASE_SCHEDULES``: ``1`` (default) runs the ``Schedule`` table's rows, ``0``
  leaves it out (the run with code-declared jobs).
* ``BENCH_CODE_JOBS``, ``BENCH_PERIOD_S``, ``BENCH_CODE_CRON``: how many jobs
  :mod:`bench.dbproject.jobs` declares in code, and their interval (or cron expression).
* ``BENCH_BROKER``: the Celery broker of the beat (a dedicated redis-server).
* ``BENCH_POLL_MS``, ``BENCH_BEAT_MAX_LOOP_S``: the workers' ``SCHEDULES_POLL_MS`` and
  beat's ``beat_max_loop_interval`` (empty: their defaults, 2 s and 5 s); the smoke run
  shortens them.

Log lines carry the epoch time with milliseconds: the bench reads them (a source's
"N job(s) put" line, beat's "Sending due task" lines).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_db = urlsplit(os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "anarchon_django",
    "django_celery_beat",
    "bench.dbproject",
]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": _db.path.lstrip("/") or "postgres",
    "USER": _db.username or "postgres",
    "PASSWORD": _db.password or "",
    "HOST": _db.hostname or "127.0.0.1",
    "PORT": str(_db.port or 5432),
}}
ANARCHON = {
    "BACKEND": "default",
    "DATABASE_SCHEDULES": os.environ.get("BENCH_DATABASE_SCHEDULES", "1") == "1",
    **({"SCHEDULES_POLL_MS": int(os.environ["BENCH_POLL_MS"])}
       if os.environ.get("BENCH_POLL_MS") else {}),
}

CELERY_BROKER_URL = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/15")
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_LOG_FORMAT = "%(created).3f %(process)d %(name)s %(levelname)s %(message)s"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
if os.environ.get("BENCH_BEAT_MAX_LOOP_S"):
    CELERY_BEAT_MAX_LOOP_INTERVAL = int(os.environ["BENCH_BEAT_MAX_LOOP_S"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"epoch": {"format": CELERY_WORKER_LOG_FORMAT}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "epoch"}},
    "loggers": {"anarchon": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
}
