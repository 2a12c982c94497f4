"""Settings of the example shop: anarchon's jobs in ``orders/jobs.py``.

Everything that differs between a laptop and a cluster comes from the environment:

* ``EXAMPLE_DATABASE_URL``: ``sqlite:///path/to.db`` (default ``db.sqlite3`` here) or
  ``postgresql://user:password@host:5432/name``.
* ``ANARCHON_BACKEND``: ``default`` (the database above, the default) or a store URL such
  as ``redis://localhost:6379/0``; ``ANARCHON_TABLE`` / ``ANARCHON_PREFIX`` its namespace.
* ``ANARCHON_LEASE_MS`` / ``ANARCHON_HEARTBEAT_MS``: lease timings (default 30 s / 10 s).
* ``EXAMPLE_TICK_EVERY`` / ``EXAMPLE_TICK_SLEEP_MS``: how often the ``tick`` job runs and
  how long it works.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "anarchon_django",
    "orders",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "shop.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
WSGI_APPLICATION = "shop.wsgi.application"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "Europe/Athens"      # cron jobs without tz= follow it
USE_I18N = True
USE_TZ = True


def database_from_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry from ``sqlite:///path`` or ``postgresql://...``."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = url.split(":///", 1)[1]
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path,
                # Several worker processes write to one file: wait for the lock.
                "OPTIONS": {"timeout": 30}}
    if parts.scheme in ("postgres", "postgresql"):
        return {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                "USER": unquote(parts.username or ""), "PASSWORD": unquote(parts.password or ""),
                "HOST": parts.hostname or "", "PORT": str(parts.port or "")}
    raise ValueError(f"EXAMPLE_DATABASE_URL: unsupported scheme {parts.scheme!r}")


DATABASES = {"default": {
    **database_from_url(os.environ.get("EXAMPLE_DATABASE_URL",
                                       f"sqlite:///{BASE_DIR / 'db.sqlite3'}")),
    # Connections of job threads are closed after each run unless kept; a kept connection
    # that broke (a database restart) is replaced before the next run.
    "CONN_MAX_AGE": int(os.environ.get("EXAMPLE_CONN_MAX_AGE", "0")),
    "CONN_HEALTH_CHECKS": True,
}}

ANARCHON: dict[str, Any] = {
    "BACKEND": os.environ.get("ANARCHON_BACKEND", "default"),
    "LEASE_MS": int(os.environ.get("ANARCHON_LEASE_MS", "30000")),
    "HEARTBEAT_MS": int(os.environ["ANARCHON_HEARTBEAT_MS"])
    if os.environ.get("ANARCHON_HEARTBEAT_MS") else None,
    "JOB_DEFAULTS": {"timeout_ms": 10 * 60 * 1000},
}
if os.environ.get("ANARCHON_TABLE"):
    ANARCHON["TABLE"] = os.environ["ANARCHON_TABLE"]
if os.environ.get("ANARCHON_PREFIX"):
    ANARCHON["PREFIX"] = os.environ["ANARCHON_PREFIX"]

EXAMPLE_TICK_EVERY = os.environ.get("EXAMPLE_TICK_EVERY", "10s")
EXAMPLE_TICK_SLEEP_MS = int(os.environ.get("EXAMPLE_TICK_SLEEP_MS", "200"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"anarchon": {"handlers": ["console"], "level": "INFO"},
                "orders": {"handlers": ["console"], "level": "INFO"}},
}
