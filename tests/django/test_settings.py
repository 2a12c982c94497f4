"""Settings parsing, every system check, jobs.py discovery, readiness and the migration."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import AppRegistryNotReady, ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections

import anarchon_django
from anarchon_core import ConfigError, PostgresBackend, SqliteBackend
from anarchon_django import conf, registry, runtime
from anarchon_django.checks import TAG as ANARCHON_CHECKS

pytestmark = pytest.mark.usefixtures("anarchon_reset")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django"


def anarchon_ids(settings: Any, value: object) -> list[str]:
    settings.ANARCHON = value
    return [m.id for m in checks.run_checks(tags=["anarchon"])]


# ------------------------------------------------------------------ parsing


def test_defaults_use_the_default_database(settings: Any) -> None:
    settings.ANARCHON = {}
    parsed = conf.load()
    assert parsed.database == conf.DatabaseTarget("default", "sqlite", "anarchon_runs")
    assert parsed.history_size == 1000
    assert parsed.stop_grace_ms == 5000
    assert parsed.admin_read_only is True
    backend = conf.build_backend(parsed)
    assert isinstance(backend, SqliteBackend)
    assert backend.path == connections["default"].settings_dict["NAME"]


def test_every_setting_reaches_the_scheduler(settings: Any) -> None:
    settings.ANARCHON = {
        "BACKEND": "default", "TABLE": "shop_runs", "LEASE_MS": 9_000, "HEARTBEAT_MS": 1_000,
        "HISTORY_SIZE": 50, "HISTORY_TTL_MS": 86_400_000, "INSTANCE_ID": "web-1",
        "STOP_GRACE_MS": 250, "HANDLER_THREADS": 4,
        "JOB_DEFAULTS": {"timeout_ms": 60_000, "max_attempts": 2},
    }
    scheduler = anarchon_django.get_scheduler()
    assert (scheduler.lease_ms, scheduler.heartbeat_ms) == (9_000, 1_000)
    assert (scheduler.history_size, scheduler.history_ttl_ms) == (50, 86_400_000)
    assert scheduler.instance_id == "web-1"
    assert (scheduler.stop_grace_ms, scheduler.handler_threads) == (250, 4)
    assert isinstance(scheduler.backend, SqliteBackend)
    assert scheduler.backend.table == "shop_runs"
    options = {j.name: j.options for j in scheduler.jobs()}
    # JOB_DEFAULTS apply to every job; a decorator's own option wins.
    assert options["testapp.note"]["timeout_ms"] == 60_000
    assert options["testapp.note"]["max_attempts"] == 2
    assert options["testapp.async_note"]["timeout_ms"] == 30_000


def test_postgres_alias_uses_django_connection_settings(settings: Any) -> None:
    settings.ANARCHON = {"BACKEND": "pg", "TABLE": "shipping.cron_runs"}
    backend = conf.build_backend(conf.load())
    assert isinstance(backend, PostgresBackend)
    assert backend.table == "shipping.cron_runs"
    name = connections["pg"].settings_dict["NAME"]
    assert f"dbname={name}" in backend.describe()


def test_url_backend_with_prefix(settings: Any) -> None:
    settings.ANARCHON = {"BACKEND": "redis://127.0.0.1:6379/0", "PREFIX": "shop:cron:",
                         "BACKEND_OPTIONS": {"strategy": "stream-id"}}
    backend = conf.build_backend(conf.load())
    assert backend.prefix == "shop:cron:"  # type: ignore[attr-defined]
    assert not backend.supports_leases
    reader = conf.build_backend(conf.load(), read_only=True)
    assert reader.read_only is True  # type: ignore[attr-defined]


def test_bad_settings_raise_improperly_configured_when_used(settings: Any) -> None:
    settings.ANARCHON = {"BACKEND": "nope"}
    with pytest.raises(ImproperlyConfigured, match=r"'nope'.*anarchon\.E003"):
        anarchon_django.get_scheduler()


# ------------------------------------------------------------------ system checks


@pytest.mark.parametrize(("value", "expected"), [
    ([], "anarchon.E001"),
    ({"LEASE": 1000}, "anarchon.E002"),
    ({"BACKEND": "nope"}, "anarchon.E003"),
    ({"BACKEND": 42}, "anarchon.E003"),
    ({"BACKEND": "other"}, "anarchon.E004"),
    ({"BACKEND": "memory"}, "anarchon.E005"),
    ({"BACKEND": "mongodb://localhost"}, "anarchon.E006"),
    ({"BACKEND": "redis://127.0.0.1:6379/0", "PREFIX": "no-colon"}, "anarchon.E006"),
    ({"BACKEND": "default", "TABLE": "bad table; drop"}, "anarchon.E006"),
    ({"BACKEND": "redis://127.0.0.1:6379/0", "BACKEND_OPTIONS": "strategy=lease"},
     "anarchon.E006"),
    ({"BACKEND": "default", "PREFIX": "cron:"}, "anarchon.E007"),
    ({"BACKEND": "redis://127.0.0.1:6379/0", "TABLE": "runs"}, "anarchon.E007"),
    ({"BACKEND": "sqlite:///x.db", "PREFIX": "cron:"}, "anarchon.E007"),
    ({"LEASE_MS": -5}, "anarchon.E008"),
    ({"LEASE_MS": 1_000, "HEARTBEAT_MS": 1_000}, "anarchon.E008"),
    ({"INSTANCE_ID": ""}, "anarchon.E008"),
    ({"HISTORY_SIZE": True}, "anarchon.E008"),
    ({"BACKEND": "redis://127.0.0.1:6379/0", "BACKEND_OPTIONS": {"strategy": "stream-id"},
      "LEASE_MS": 5_000}, "anarchon.E008"),
    ({"JOB_DEFAULTS": ["timeout_ms"]}, "anarchon.E009"),
    ({"JOB_DEFAULTS": {"timeout": 5}}, "anarchon.E009"),
    ({"BACKEND": "redis://127.0.0.1:6379/0", "BACKEND_OPTIONS": {"strategy": "stream-id"},
      "JOB_DEFAULTS": {"overlap": True}}, "anarchon.E009"),
    ({"ADMIN_READ_ONLY": "yes"}, "anarchon.E011"),
    ({"ADMIN_RUN_NOW_WAIT_MS": -1}, "anarchon.E008"),
])
def test_each_bad_setting_has_its_check(settings: Any, value: object, expected: str) -> None:
    ids = anarchon_ids(settings, value)
    assert expected in ids, ids


def test_good_settings_pass_every_check(settings: Any) -> None:
    for value in ({}, {"BACKEND": "pg", "TABLE": "shipping.cron_runs"},
                  {"BACKEND": "redis://127.0.0.1:6379/0", "PREFIX": "shop:"},
                  {"BACKEND": "nats://127.0.0.1:4222", "PREFIX": "shop."}):
        assert anarchon_ids(settings, value) == [], value


def test_checks_give_hints(settings: Any) -> None:
    settings.ANARCHON = {"LEASE": 1000}
    [message] = checks.run_checks(tags=["anarchon"])
    assert message.hint == "Did you mean 'LEASE_MS'?"
    settings.ANARCHON = {"BACKEND": "nope"}
    [message] = checks.run_checks(tags=["anarchon"])
    assert "'default'" in message.hint
    assert "redis://" in message.hint


@pytest.mark.parametrize(("key", "value", "hint"), [
    ("LEASE_MS", -5, "whole milliseconds"),
    ("STOP_GRACE_MS", "5s", "whole milliseconds"),
    ("HISTORY_SIZE", 0, "number of runs kept per job"),
    ("HANDLER_THREADS", 0, "number of threads"),
])
def test_a_bad_number_gets_the_hint_of_its_setting(settings: Any, key: str, value: object,
                                                    hint: str) -> None:
    settings.ANARCHON = {key: value}
    [message] = checks.run_checks(tags=["anarchon"])
    assert message.id == "anarchon.E008"
    assert key in message.msg
    assert hint in (message.hint or "")
    if "milliseconds" not in hint:
        assert "milliseconds" not in (message.hint or "")


def test_secret_in_a_bad_url_never_shows(settings: Any) -> None:
    settings.ANARCHON = {"BACKEND": "redis://user:hunter2@127.0.0.1:6379/0?strategy=nope"}
    messages = checks.run_checks(tags=["anarchon"])
    assert [m.id for m in messages] == ["anarchon.E006"]
    assert "hunter2" not in messages[0].msg


def test_a_job_refused_by_the_settings_is_e010(settings: Any) -> None:
    def handler(ctx: object) -> None:
        pass

    anarchon_django.every("testapp.bad-jitter", "1m", handler, jitter_ms=10 * 60_000)
    try:
        [message] = checks.run_checks(tags=["anarchon"])
        assert message.id == "anarchon.E010"
        assert "testapp.bad-jitter" in message.msg
        assert "jitter" in message.msg
    finally:
        registry.forget("testapp.bad-jitter")
    # A lease-only option is fine on a lease backend and refused on a claim-only one.
    anarchon_django.every("testapp.overlapping", "1m", handler, overlap=True)
    try:
        assert anarchon_ids(settings, {}) == []
        ids = anarchon_ids(settings, {"BACKEND": "redis://127.0.0.1:6379/0",
                                      "BACKEND_OPTIONS": {"strategy": "stream-id"}})
        assert ids == ["anarchon.E010"]
    finally:
        registry.forget("testapp.overlapping")


def test_manage_py_check_fails_on_errors(settings: Any) -> None:
    settings.ANARCHON = {"BACKEND": "memory"}
    # anarchon's checks only: Django 6.1's model checks ask each database about JSON
    # fields, and this test has no database.
    with pytest.raises(SystemCheckError, match=r"anarchon\.E005"):
        call_command("check", tags=[ANARCHON_CHECKS])


# ------------------------------------------------------------------ discovery


def test_jobs_py_of_installed_apps_are_discovered() -> None:
    declared = {d.name: d for d in registry.declarations()}
    assert {"testapp.note", "testapp.async_note", "testapp.report", "testapp.utc",
            "testapp.fail"} <= set(declared)
    assert declared["testapp.note"].module == "tests.django.testapp.jobs"
    jobs = {j.name: j for j in anarchon_django.get_scheduler().jobs()}
    assert jobs["testapp.note"].schedule == "every 1h"
    # cron jobs follow TIME_ZONE unless they name a zone.
    assert jobs["testapp.report"].schedule == "cron 0 8 * * * Europe/Athens"
    assert jobs["testapp.utc"].schedule == "cron 30 2 * * * UTC"
    assert jobs["testapp.report"].next_run_at.astimezone().hour is not None


def test_time_zone_change_rebuilds_the_scheduler(settings: Any) -> None:
    first = anarchon_django.get_scheduler()
    settings.TIME_ZONE = "America/New_York"
    second = anarchon_django.get_scheduler()
    assert second is not first
    jobs = {j.name: j.schedule for j in second.jobs()}
    assert jobs["testapp.report"] == "cron 0 8 * * * America/New_York"


def test_declarations_are_validated_at_once() -> None:
    def handler(ctx: object) -> None:
        pass

    with pytest.raises(ConfigError, match="10 parsecs"):
        anarchon_django.every("testapp.bad", "10 parsecs", handler)
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        anarchon_django.cron("testapp.bad", "0 8 * * *", handler, tz="Mars/Olympus")
    with pytest.raises(ConfigError, match="job name"):
        anarchon_django.every("bad\nname", "1m", handler)
    assert "testapp.bad" not in {d.name for d in registry.declarations()}


def test_a_name_declared_twice_is_refused() -> None:
    def other(ctx: object) -> None:
        pass

    with pytest.raises(ConfigError, match=r"declared twice.*tests\.django\.testapp\.jobs"):
        anarchon_django.every("testapp.note", "1h", other)


def test_a_job_declared_later_joins_the_built_scheduler() -> None:
    scheduler = anarchon_django.get_scheduler()

    def late(ctx: object) -> None:
        pass

    name = f"testapp.late-{uuid.uuid4().hex[:6]}"
    anarchon_django.every(name, "5m", late)
    try:
        assert name in {j.name for j in scheduler.jobs()}
    finally:
        registry.forget(name)


def test_too_early_use_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_ready", False)
    with pytest.raises(AppRegistryNotReady, match=r"not ready yet.*jobs\.py"):
        anarchon_django.get_scheduler()


def test_setup_connects_to_nothing(tmp_path: Path) -> None:
    """django.setup() and the checks with an unreachable store: fast, no error."""
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "shop.settings",
           "EXAMPLE_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
           "ANARCHON_BACKEND": "redis://127.0.0.1:9/0", "ANARCHON_PREFIX": "x:"}
    code = ("import django, time; t = time.monotonic(); django.setup(); "
            "from django.core import checks; import anarchon_django; "
            "s = anarchon_django.get_scheduler(); "
            "print(len(checks.run_checks(tags=['anarchon'])), len(s.jobs()), "
            "round(time.monotonic() - t, 1))")
    out = subprocess.run([sys.executable, "-c", code], cwd=EXAMPLE, env=env, text=True,
                         capture_output=True, timeout=60, check=True)
    errors, jobs, seconds = out.stdout.split()
    assert (errors, jobs) == ("0", "4"), out.stderr
    assert float(seconds) < 10


# ------------------------------------------------------------------ migration


@pytest.mark.django_db(transaction=True, databases=["default", "pg"])
@pytest.mark.parametrize("alias", ["default", "pg"])
def test_migration_creates_the_runs_table_on_the_backend_alias(settings: Any,
                                                               alias: str) -> None:
    table = f"t{uuid.uuid4().hex[:10]}"
    settings.ANARCHON = {"BACKEND": alias, "TABLE": table}
    other = "pg" if alias == "default" else "default"

    def tables(db: str) -> set[str]:
        with connections[db].cursor() as cursor:
            return set(connections[db].introspection.table_names(cursor))

    call_command("migrate", "anarchon_django", "zero", database=alias, verbosity=0)
    assert table not in tables(alias)
    call_command("migrate", "anarchon_django", database=alias, verbosity=0)
    assert {table, f"{table}_meta"} <= tables(alias)
    call_command("migrate", "anarchon_django", "zero", database=other, verbosity=0)
    call_command("migrate", "anarchon_django", database=other, verbosity=0)
    assert table not in tables(other)  # only the BACKEND alias holds the table
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT value FROM {table}_meta WHERE name = 'format'")
        assert cursor.fetchone() == ("1",)
    # The backend finds the table ready and writes to it.
    run = anarchon_django.get_scheduler().sync.run_now("testapp.fail", timeout=30)
    assert run.status == "failed"
    assert "said no" in (run.error or "")
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT job, status FROM {table}")
        assert cursor.fetchall() == [("testapp.fail", "failed")]
    anarchon_django.stop()
    call_command("migrate", "anarchon_django", "zero", database=alias, verbosity=0)
    assert table not in tables(alias)
    call_command("migrate", "anarchon_django", database=alias, verbosity=0)
