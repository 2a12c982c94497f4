"""Smoke of the installed wheel (run by .ci/wheel-smoke with the venv's python, -I).

Each part uses files only the package data brings: the Redis Lua scripts, the SQL
files, the Django migrations and admin templates; Celery's Redis transport must import;
APScheduler runs one firing. Every name it creates in the shared servers is unique and
removed at the end.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import tempfile
import time
from pathlib import Path

VENV = Path(sys.argv[1]).resolve()
TAG = f"wheelsmoke{secrets.token_hex(4)}"


def say(text: str) -> None:
    print(f"  {text}", flush=True)


def installed(module: object) -> None:
    path = Path(str(getattr(module, "__file__", ""))).resolve()
    assert VENV in path.parents, f"{module} comes from {path}, not from the installed wheel"


async def one_run(url: str) -> str:
    from anarchon_core import Scheduler

    scheduler = Scheduler(url)
    scheduler.every("smoke", "1h", lambda ctx: None)
    try:
        run = await scheduler.run_now("smoke")
        history = await scheduler.history("smoke", 5)
    finally:
        await scheduler.stop()
    assert run.status == "success", run
    assert [r.status for r in history] == ["success"], history
    return scheduler.backend.describe()


def core() -> None:
    import psycopg
    import redis

    import anarchon_core

    installed(anarchon_core)
    say(asyncio.run(one_run(f"redis://127.0.0.1:6379/0?prefix={TAG}:")) + ": ok (Lua)")
    keys = redis.Redis(host="127.0.0.1", port=6379).keys(f"*{TAG}*")
    if keys:
        redis.Redis(host="127.0.0.1", port=6379).delete(*keys)
    url = f"postgresql://postgres@127.0.0.1:5432/test?table={TAG}"
    try:
        say(asyncio.run(one_run(url)) + ": ok (SQL)")
    finally:
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test",
                             autocommit=True) as conn:
            rows = conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s",
                                (f"{TAG}%",)).fetchall()
            for (name,) in rows:
                conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
            functions = conn.execute(
                "SELECT p.oid::regprocedure FROM pg_proc p WHERE p.proname LIKE %s",
                (f"%{TAG}%",)).fetchall()
            for (signature,) in functions:
                conn.execute(f"DROP FUNCTION IF EXISTS {signature} CASCADE")


def django(tmp: Path) -> None:
    import django as dj
    from django.conf import settings
    from django.core.management import call_command
    from django.template.loader import get_template

    import anarchon_django

    installed(anarchon_django)
    settings.configure(
        DEBUG=False, SECRET_KEY="wheel-smoke", USE_TZ=True, ROOT_URLCONF=__name__,
        INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth",
                        "django.contrib.contenttypes", "django.contrib.sessions",
                        "django.contrib.messages", "anarchon_django"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                               "NAME": str(tmp / "django.sqlite3")}},
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True, "OPTIONS": {"context_processors": []}}],
        ANARCHON={"BACKEND": "default"},
    )
    dj.setup()
    call_command("migrate", verbosity=0)  # anarchon_django's migrations create its table
    for name in ("history", "jobs", "schedule/change_list", "schedule/change_form"):
        get_template(f"admin/anarchon_django/{name}.html")
    call_command("anarchon", "check")
    say("anarchon_django: ok (migrations, templates, manage.py anarchon check)")


urlpatterns: list[object] = []


def celery() -> None:
    import kombu.transport.redis  # noqa: F401 - the [celery] extra brings its dependencies
    from celery import Celery

    import anarchon_celery

    installed(anarchon_celery)
    app = Celery("smoke", broker="redis://127.0.0.1:6379/0")
    app.conf.anarchon_prefix = f"{TAG}:beat:"
    scheduler = anarchon_celery.Settings.from_app(app).make_scheduler("reader")
    say(f"anarchon_celery: ok ({scheduler.backend.describe()})")


def apscheduler(tmp: Path) -> None:
    from apscheduler.schedulers.background import BackgroundScheduler

    import anarchon_apscheduler
    from anarchon_apscheduler import EPOCH, AnarchonExecutor

    installed(anarchon_apscheduler)
    ran: list[int] = []
    executor = AnarchonExecutor(backend=f"sqlite:///{tmp / 'aps.db'}")
    scheduler = BackgroundScheduler(executors={"default": executor}, timezone="UTC")
    scheduler.add_job(lambda: ran.append(1), "interval", seconds=1, start_date=EPOCH,
                      id="smoke")
    scheduler.start()
    try:
        deadline = time.monotonic() + 10
        while not ran and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        scheduler.shutdown()
    assert ran, "no firing ran within 10 s"
    say("anarchon_apscheduler: ok (a firing ran)")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        core()
        django(Path(tmp))
        celery()
        apscheduler(Path(tmp))


if __name__ == "__main__":
    main()
