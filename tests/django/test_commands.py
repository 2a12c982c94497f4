"""``manage.py anarchon`` subcommands: jobs, history, run, check, and usage errors."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

import anarchon_django
from anarchon_django import registry
from anarchon_django.management.commands.anarchon import _ensure_logging
from tests.django.conftest import Store, namespace_exists, set_up, typo

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django"
REPO = EXAMPLE.parents[1]


def anarchon(capsys: pytest.CaptureFixture[str], *args: str, **options: Any) -> str:
    call_command("anarchon", *args, **options)
    return capsys.readouterr().out


def test_jobs_lists_schedule_next_run_and_last_result(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    set_up(store)
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
    set_up(store)
    assert anarchon(capsys, "history").strip() == "no runs"
    anarchon(capsys, "run", "testapp.note")
    with pytest.raises(CommandError):
        anarchon(capsys, "run", "testapp.fail")
    anarchon(capsys, "run", "testapp.note")
    capsys.readouterr()
    rows = anarchon(capsys, "history").splitlines()[1:]
    assert len(rows) == 3
    assert [r.split()[1] for r in rows] == ["testapp.note", "testapp.fail", "testapp.note"]
    assert all("(manual)" in r for r in rows)
    assert len(anarchon(capsys, "history", "testapp.note").splitlines()[1:]) == 2
    assert len(anarchon(capsys, "history", "-n", "1").splitlines()[1:]) == 1
    failed = anarchon(capsys, "history", "--status", "failed").splitlines()[1:]
    assert len(failed) == 1
    assert "the report server said no" in failed[0]
    runner = anarchon_django.get_scheduler().instance_id
    assert len(anarchon(capsys, "history", "--runner", runner).splitlines()[1:]) == 3
    assert anarchon(capsys, "history", "--runner", "elsewhere:1").strip() == \
        "no runs by runner 'elsewhere:1'"
    with pytest.raises(CommandError, match="no runs of 'nope'; the store holds runs of 2 "
                                           "job") as unknown:
        call_command("anarchon", "history", "nope")
    assert unknown.value.returncode == 2


def test_history_is_the_core_table(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    anarchon(capsys, "run", "testapp.note")
    header, row = anarchon(capsys, "history", "--limit", "1").splitlines()
    assert header.split() == ["scheduled", "(UTC)", "job", "attempt", "status", "ms",
                              "runner", "/", "error", "/", "meta"]
    assert row.split()[0].endswith("Z")


def test_log_format_json_writes_one_object_per_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("anarchon")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    try:
        _ensure_logging(1, "json")
        logging.getLogger("anarchon.lease").info(
            "note slot 1 attempt 1: success", extra={"job": "note", "slot": 1, "attempt": 1,
                                                     "instance": "w:1", "status": "success",
                                                     "duration_ms": 5})
        (line,) = capsys.readouterr().err.splitlines()
    finally:
        logger.handlers[:] = saved[0]
        logger.propagate, logger.level = saved[1], saved[2]
    record = json.loads(line)
    assert {k: record[k] for k in ("job", "slot", "attempt", "runner", "status",
                                   "duration_ms")} == {
        "job": "note", "slot": 1, "attempt": 1, "runner": "w:1", "status": "success",
        "duration_ms": 5}


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


@pytest.mark.parametrize("args", [("history",), ("history", "testapp.note"), ("jobs",),
                                  ("check",)])
def test_reads_of_a_namespace_with_no_store_exit_1_and_create_nothing(
        store: Store, settings: Any, capsys: pytest.CaptureFixture[str],
        args: tuple[str, ...]) -> None:
    key, name = typo(store)
    settings.ANARCHON = {**store.anarchon, key: name}
    with pytest.raises(CommandError, match=f"no anarchon store in .*{re.escape(name)}") as error:
        call_command("anarchon", *args)
    assert error.value.returncode == 1
    assert "\n" not in str(error.value)
    assert "ANARCHON's TABLE or PREFIX names it" in str(error.value)
    if args == ("jobs",):  # the declared jobs still show, then why their results do not
        assert "testapp.note" in capsys.readouterr().out
    assert not namespace_exists(store, name)


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
    with pytest.raises(CommandError, match="settings: 1 error") as error:
        call_command("anarchon", "check")
    assert error.value.returncode == 2
    assert "anarchon.E005" in capsys.readouterr().err


# ------------------------------------------------------------------ configuration errors


@pytest.mark.parametrize("args", [(), ("jobs",), ("history",), ("run", "testapp.note"),
                                  ("check",)])
def test_bad_settings_are_a_one_line_usage_error(settings: Any, anarchon_reset: None,
                                                 args: tuple[str, ...]) -> None:
    settings.ANARCHON = {"BACKEND": "nope"}
    with pytest.raises(CommandError) as error:
        call_command("anarchon", *args)
    assert error.value.returncode == 2
    if args != ("check",):  # check lists every problem on stderr, then counts them
        assert "ANARCHON['BACKEND'] is 'nope'" in str(error.value)
        assert "anarchon.E003" in str(error.value)
        assert "\n" not in str(error.value)


def test_a_secret_in_bad_settings_is_masked(settings: Any, anarchon_reset: None) -> None:
    settings.ANARCHON = {"BACKEND": "redis://user:hunter2@127.0.0.1:6379/0?strategy=nope"}
    with pytest.raises(CommandError) as error:
        call_command("anarchon", "jobs")
    assert error.value.returncode == 2
    assert "anarchon.E006" in str(error.value)
    assert "hunter2" not in str(error.value)


@pytest.mark.parametrize("args", [(), ("jobs",), ("run", "testapp.note")])
def test_a_job_the_settings_refuse_is_a_one_line_usage_error(
        settings: Any, anarchon_reset: None, args: tuple[str, ...]) -> None:
    def handler(ctx: object) -> None:
        pass

    settings.ANARCHON = {"BACKEND": "amqp://guest:secret@127.0.0.1:5672/",
                         "PREFIX": f"t{uuid.uuid4().hex[:10]}."}
    anarchon_django.every("testapp.needs-lease", "1m", handler, max_attempts=5)
    try:
        with pytest.raises(CommandError) as error:
            call_command("anarchon", *args)
    finally:
        registry.forget("testapp.needs-lease")
    assert error.value.returncode == 2
    text = str(error.value)
    assert "job 'testapp.needs-lease'" in text
    assert "max_attempts" in text
    assert "secret" not in text


def test_manage_py_prints_bad_settings_without_a_traceback() -> None:
    env = {**os.environ, "ANARCHON_BACKEND": "redis://u:hunter2@127.0.0.1:6379/0?strategy=x",
           "DJANGO_SETTINGS_MODULE": "shop.settings", "PYTHONPATH": str(REPO)}
    for args in ([], ["jobs"]):
        done = subprocess.run([sys.executable, "manage.py", "anarchon", *args], cwd=EXAMPLE,
                              env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("CommandError: configuration: ANARCHON['BACKEND']")
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert "hunter2" not in done.stderr
