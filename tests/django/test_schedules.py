"""Schedules in the database: validated like code, picked up by a running worker, each
change (add, edit, disable, delete) live within the poll interval."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

import anarchon_django
from anarchon_core import Scheduler
from anarchon_django import runtime
from anarchon_django.models import Schedule
from tests.django.conftest import Store
from tests.django.testapp.models import Note

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

POLL_MS = 200


def unique(prefix: str = "db") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def notes(job: str) -> list[Note]:
    return list(Note.objects.filter(job=job).order_by("slot"))


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def worker(store: Store, settings: Any) -> Iterator[Scheduler]:
    settings.ANARCHON = {**store.anarchon, "SCHEDULES_POLL_MS": POLL_MS}
    runtime.reset()
    scheduler = anarchon_django.start()
    yield scheduler
    anarchon_django.stop(0)


def job_names(scheduler: Scheduler) -> set[str]:
    return {j.name for j in scheduler.jobs()}


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(("fields", "field", "text"), [
    ({"cron": "61 * * * *"}, "cron", "61"),
    ({"every": "5 parsecs"}, "every", "5 parsecs"),
    ({"cron": "0 8 * * *", "tz": "Mars/Olympus"}, "tz", "Mars/Olympus"),
    ({"cron": "0 8 * * *", "dst": "sometimes"}, "dst", "sometimes"),
    ({"every": "1m", "target": "no.such.target"}, "target", "no.such.target"),
    ({"every": "1m", "kwargs": {"nobody": 1}}, "kwargs", "nobody"),
    ({"every": "1m", "overlap": "twice"}, "overlap", "twice"),
    ({"every": "1m", "catch_up": "all"}, "catch_up", "catch_up_ms"),
    ({"every": "1m", "name": "bad\nname"}, "name", "name"),
])
def test_every_value_is_checked_as_code_checks_it(fields: dict[str, Any], field: str,
                                                  text: str) -> None:
    values = {"name": unique(), "target": "testapp.greet", **fields}
    with pytest.raises(ValidationError) as caught:
        Schedule(**values).full_clean()
    errors = caught.value.message_dict
    assert field in errors, errors
    assert text in " ".join(errors[field]), errors


def test_every_or_cron_not_both() -> None:
    for values in ({}, {"every": "1m", "cron": "* * * * *"}):
        with pytest.raises(ValidationError, match="either every"):
            Schedule(name=unique(), target="testapp.greet", **values).full_clean()


def test_a_valid_row_passes() -> None:
    Schedule(name=unique(), target="testapp.greet", cron="0 8 * * 1-5",
             tz="Europe/Athens", dst="once_last", kwargs={"who": "ana"},
             overlap="buffer_one", max_attempts=3).full_clean()


def test_save_and_update_change_the_revision() -> None:
    row = Schedule.objects.create(name=unique(), target="testapp.greet", every="1m")
    first = row.revision
    row.description = "x"
    row.save()
    assert row.revision != first
    Schedule.objects.filter(pk=row.pk).update(enabled=False)
    assert Schedule.objects.get(pk=row.pk).revision != row.revision


# ---------------------------------------------------------------- a running worker


def test_add_edit_disable_delete_are_live_within_the_poll(worker: Scheduler) -> None:
    name = unique()
    row = Schedule.objects.create(name=name, target="testapp.greet", every="1s",
                                  jitter_ms=0, kwargs={"who": "first"})
    wait_until(lambda: name in job_names(worker), 3, "the new schedule")
    wait_until(lambda: any(n.runner == "first" for n in notes(name)), 5, "a first run")

    row.kwargs = {"who": "second"}
    row.save()
    wait_until(lambda: any(n.runner == "second" for n in notes(name)), 5, "the edit")

    Schedule.objects.filter(pk=row.pk).update(enabled=False)
    wait_until(lambda: name not in job_names(worker), 3, "the disable")
    Schedule.objects.filter(pk=row.pk).update(enabled=True)
    wait_until(lambda: name in job_names(worker), 3, "enabled again")

    row.delete()
    wait_until(lambda: name not in job_names(worker), 3, "the delete")
    time.sleep(0.5)  # a run already claimed may still end
    count = len(notes(name))
    time.sleep(2.5)
    assert len(notes(name)) == count


def test_a_rename_keeps_one_job(worker: Scheduler) -> None:
    old, new = unique("old"), unique("new")
    row = Schedule.objects.create(name=old, target="testapp.greet", every="1h")
    wait_until(lambda: old in job_names(worker), 3, "the schedule")
    row.name = new
    row.save()
    wait_until(lambda: new in job_names(worker) and old not in job_names(worker), 3,
               "the rename")


def test_a_rolled_back_schedule_never_runs(worker: Scheduler) -> None:
    name = unique()

    class RollbackError(Exception):
        pass

    def create_then_fail() -> None:
        with transaction.atomic():
            Schedule.objects.create(name=name, target="testapp.greet", every="1s")
            raise RollbackError

    with pytest.raises(RollbackError):
        create_then_fail()
    time.sleep(POLL_MS / 1000 * 5)
    assert name not in job_names(worker)
    assert not notes(name)


def test_a_hostile_row_is_a_warning_and_the_others_run(
        worker: Scheduler, caplog: pytest.LogCaptureFixture) -> None:
    bad, good = unique("bad"), unique("good")
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        # Written past the validation, as raw SQL or an old release could.
        Schedule.objects.bulk_create([
            Schedule(name=bad, target="testapp.greet", cron="99 * * * *"),
            Schedule(name=good, target="testapp.greet", every="1s", jitter_ms=0)])
        wait_until(lambda: notes(good), 5, "the good schedule's run")
    assert bad not in job_names(worker)
    warned = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    assert warned
    assert "cron" in warned[0], warned
    assert all(t.done() is False for t in worker._tasks)


def test_a_code_job_keeps_its_name(worker: Scheduler,
                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        Schedule.objects.create(name="testapp.note", target="testapp.greet", every="1s")
        wait_until(lambda: any("declared in code" in r.getMessage()
                               for r in caplog.records), 3, "the warning")
    [info] = [j for j in worker.jobs() if j.name == "testapp.note"]
    assert info.schedule == "every 1h"


def test_one_off_runs_once_then_is_disabled(worker: Scheduler) -> None:
    name = unique()
    row = Schedule.objects.create(name=name, target="testapp.greet", every="1s",
                                  jitter_ms=0, one_off=True)
    wait_until(lambda: not Schedule.objects.get(pk=row.pk).enabled, 6, "the disable")
    wait_until(lambda: name not in job_names(worker), 3, "the job gone")
    time.sleep(1.5)
    assert len(notes(name)) == 1


def test_start_and_expiry_bound_the_slots(worker: Scheduler) -> None:
    later, over = unique("later"), unique("over")
    now = timezone.now()
    Schedule.objects.create(name=later, target="testapp.greet", every="1s", jitter_ms=0,
                            start_at=now + timedelta(seconds=2))
    Schedule.objects.create(name=over, target="testapp.greet", every="1s",
                            expires_at=now - timedelta(seconds=1))
    time.sleep(1)
    assert later not in job_names(worker)
    wait_until(lambda: notes(later), 6, "the run after start_at")
    assert all(n.slot >= (now + timedelta(seconds=2)).timestamp() * 1000 - 1000
               for n in notes(later))
    assert over not in job_names(worker)
    assert not notes(over)


def test_run_now_from_a_process_that_does_not_run_the_scheduler(store: Store) -> None:
    from anarchon_django import views  # noqa: PLC0415

    name = unique()
    Schedule.objects.create(name=name, target="testapp.greet", every="1d",
                            args=["admin"], kwargs={"times": 2})
    result = views.run_now(name, who="alice")
    assert result.run is not None, result
    assert result.run.status == "success", result
    assert [n.runner for n in notes(name)] == ["admin", "admin"]


def test_database_schedules_can_leave_some_kinds_out(store: Store, settings: Any) -> None:
    settings.ANARCHON = {**store.anarchon, "DATABASE_SCHEDULES": ["task", "celery"]}
    runtime.reset()
    name = unique()
    Schedule.objects.create(name=name, target="testapp.greet", every="1h")
    scheduler = runtime.load_schedules()
    assert name not in job_names(scheduler)
    settings.ANARCHON = {**store.anarchon, "DATABASE_SCHEDULES": ["handler"]}
    runtime.reset()
    assert name in job_names(runtime.load_schedules())


@pytest.mark.parametrize("value", ["yes", [], ["handlers"]])
def test_database_schedules_refuses_what_is_not_a_choice(value: object) -> None:
    from anarchon_django import conf  # noqa: PLC0415

    _, problems = conf.parse({"BACKEND": "default", "DATABASE_SCHEDULES": value})
    assert [p.id for p in problems] == ["anarchon.E011"], problems


def test_run_now_reads_the_row_again_and_never_replaces_a_code_job(store: Store) -> None:
    from anarchon_django import views  # noqa: PLC0415

    name = unique()
    row = Schedule.objects.create(name=name, target="testapp.greet", every="1d",
                                  kwargs={"who": "before"})
    assert views.run_now(name, who="alice").run is not None
    row.kwargs = {"who": "after"}
    row.save()
    assert views.run_now(name, who="alice").run is not None
    assert [n.runner for n in notes(name)] == ["before", "after"]
    Schedule.objects.create(name="testapp.fail", target="testapp.greet", every="1d")
    result = views.run_now("testapp.fail", who="alice")
    assert result.run is not None
    assert result.run.status == "failed"  # the code's job ran, not the row
    row.delete()
    assert views.run_now(name, who="alice").run is None
