"""``manage.py anarchon`` subcommands: jobs, history, run, check, and usage errors."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

import anarchon_django
from tests.django.conftest import Store

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])


def anarchon(capsys: pytest.CaptureFixture[str], *args: str, **options: Any) -> str:
    call_command("anarchon", *args, **options)
    return capsys.readouterr().out


def test_jobs_lists_schedule_next_run_and_last_result(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    out = anarchon(capsys, "jobs")
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "next run (Europe/Athens)" in out.splitlines()[0]
    assert "cron 0 8 * * * Europe/Athens" in lines["testapp.report"]
    assert " 08:00:00 " in lines["testapp.report"]  # next run in the project's zone
    assert lines["testapp.note"].endswith("never ran")
    anarchon(capsys, "run", "testapp.note")
    out = anarchon(capsys, "jobs")
    line = next(ln for ln in out.splitlines() if ln.startswith("testapp.note "))
    assert " success " in line
    assert anarchon_django.get_scheduler().instance_id in line


def test_history_filters(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert anarchon(capsys, "history").strip() == "no runs"
    anarchon(capsys, "run", "testapp.note")
    with pytest.raises(CommandError):
        anarchon(capsys, "run", "testapp.fail")
    anarchon(capsys, "run", "testapp.note")
    capsys.readouterr()
    rows = anarchon(capsys, "history").splitlines()[1:]
    assert len(rows) == 3
    assert [r.split()[2] for r in rows] == ["testapp.note", "testapp.fail", "testapp.note"]
    assert all("(manual)" in r for r in rows)
    assert len(anarchon(capsys, "history", "testapp.note").splitlines()[1:]) == 2
    assert len(anarchon(capsys, "history", "-n", "1").splitlines()[1:]) == 1
    failed = anarchon(capsys, "history", "--status", "failed").splitlines()[1:]
    assert len(failed) == 1
    assert "the report server said no" in failed[0]
    runner = anarchon_django.get_scheduler().instance_id
    assert len(anarchon(capsys, "history", "--runner", runner).splitlines()[1:]) == 3
    assert anarchon(capsys, "history", "--runner", "elsewhere:1").strip() == "no runs"


def test_run_exit_status_follows_the_result(db_store: Store,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = anarchon(capsys, "run", "testapp.note")
    assert " success " in out
    assert "requested_by=manage.py anarchon run" in out
    with pytest.raises(CommandError,
                       match="failed: RuntimeError: the report server said no") as failed:
        call_command("anarchon", "run", "testapp.fail")
    assert failed.value.returncode == 1
    with pytest.raises(CommandError, match="unknown job 'nope'; declared: ") as unknown:
        call_command("anarchon", "run", "nope")
    assert unknown.value.returncode == 2


def test_usage_errors(store: Store) -> None:
    with pytest.raises(CommandError, match="expected 1 to 10000, got 0"):
        call_command("anarchon", "history", "-n", "0")
    with pytest.raises(CommandError, match="invalid choice: 'weird'"):
        call_command("anarchon", "history", "--status", "weird")
    with pytest.raises(CommandError, match="invalid choice: 'nonsense'"):
        call_command("anarchon", "nonsense")


def test_check_reports_ok(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    anarchon(capsys, "run", "testapp.note")  # the store is set up by a first write
    out = anarchon(capsys, "check")
    assert "settings: ok (" in out
    assert "format: ok" in out
    assert "store: ok, " in out
    assert "clock: this machine is" in out


def test_check_reports_a_missing_table(db_store: Store, settings: Any) -> None:
    settings.ANARCHON = {**db_store.anarchon, "TABLE": "never_migrated"}
    with pytest.raises(CommandError, match=r"run manage\.py migrate") as error:
        call_command("anarchon", "check")
    assert error.value.returncode == 1


def test_check_reports_a_newer_store_format(db_store: Store,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    anarchon(capsys, "run", "testapp.note")
    table = db_store.anarchon["TABLE"]
    assert db_store.alias is not None
    with connections[db_store.alias].cursor() as cursor:
        cursor.execute(f"UPDATE {table}_meta SET value = '99' WHERE name = 'format'")
    with pytest.raises(CommandError,
                       match=r"store format: .*has format 99, this anarchon reads up to 1"
                       ) as error:
        call_command("anarchon", "check")
    assert error.value.returncode == 1


def test_check_reports_an_unreachable_store(settings: Any, anarchon_reset: None) -> None:
    settings.ANARCHON = {"BACKEND": "redis://127.0.0.1:9/0", "PREFIX": "unreachable:"}
    with pytest.raises(CommandError, match="store unreachable") as error:
        call_command("anarchon", "check", "--timeout", "5")
    assert error.value.returncode == 1


def test_check_reports_bad_settings(settings: Any, anarchon_reset: None,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    settings.ANARCHON = {"BACKEND": "memory"}
    with pytest.raises(CommandError, match="settings: 1 error"):
        call_command("anarchon", "check")
    assert "anarchon.E005" in capsys.readouterr().err
