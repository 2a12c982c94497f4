"""Settings of the Django test project (pytest-django; ``tests/django/conftest.py``).

The SQLite databases are files (an in-memory database cannot be shared with anarchon's
own connection); ``pg`` is the shared PostgreSQL server, where the test runner creates a
database of its own for this pytest session and drops it at the end.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import uuid
from pathlib import Path

from tests.stores.postgres import POSTGRES_URL

WORKDIR = Path(os.environ.get("ANARCHON_DJANGO_TEST_DIR") or
               tempfile.mkdtemp(prefix="anarchon-django-tests-"))
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "Europe/Athens"
ROOT_URLCONF = "tests.django.urls"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STATIC_URL = "/static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "anarchon_django",
    "tests.django.testapp",
]


def _python_crontab() -> None:
    """Bind the import name ``crontab`` to python-crontab's module, which django-celery-beat
    imports.

    rq-scheduler (required by django-tasks-rq) requires the ``crontab`` distribution,
    whose ``crontab`` package has the same import name and wins over python-crontab's
    ``crontab.py``. No test uses rq-scheduler's cron-string jobs, the only code of it that
    needs its own module.
    """
    spec = importlib.util.find_spec("crontab")
    try:
        path = importlib.metadata.distribution("python-crontab").locate_file("crontab.py")
    except importlib.metadata.PackageNotFoundError:
        return
    if spec is None or spec.origin == str(path):
        return
    own = importlib.util.spec_from_file_location("crontab", str(path))
    assert own is not None
    assert own.loader is not None
    module = importlib.util.module_from_spec(own)
    sys.modules["crontab"] = module
    own.loader.exec_module(module)


# django-celery-beat (for import-celery-beat) is not installed beside Django 6.1.
if importlib.util.find_spec("django_celery_beat") is not None:
    _python_crontab()
    INSTALLED_APPS.append("django_celery_beat")
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
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


def _pg() -> dict[str, object]:
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    params = conninfo_to_dict(POSTGRES_URL)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname", "test"), "USER": params.get("user", "postgres"),
        "PASSWORD": params.get("password", ""), "HOST": params.get("host", "127.0.0.1"),
        "PORT": params.get("port", "5432"),
        # A database of the pytest session's own, created and dropped by the test runner.
        "TEST": {"NAME": f"anarchon_django_{uuid.uuid4().hex[:10]}"},
    }


DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(WORKDIR / "main.sqlite3"),
        "OPTIONS": {"timeout": 30},
        "TEST": {"NAME": str(WORKDIR / "test.sqlite3")},
    },
    "pg": _pg(),
    # For the system checks: an engine anarchon cannot use, and an in-memory SQLite.
    "other": {"ENGINE": "django.db.backends.dummy"},
    "memory": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
ANARCHON = {"BACKEND": "default", "LEASE_MS": 3_000}
