"""Scheduled Django tasks in this process: Django's own task backends, the settings form,
their system checks, and ``anarchon_django.atomic(ctx)`` on SQLite and PostgreSQL.

Real workers of the DB task backend are in ``test_task_workers.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import checks
from django.db import connections

import anarchon_django
from anarchon_core import ConfigError, JobContext, LeaseLost
from anarchon_django import registry, taskresults, tasks
from tests.django.conftest import Store
from tests.django.testapp.models import Note

if importlib.util.find_spec("django.tasks"):
    from django.tasks import task
    TASKS_MODULE = "django.tasks"
else:
    from django_tasks import task
    TASKS_MODULE = "django_tasks"

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])
SEEN: list[dict[str, Any]] = []


@task
def report(kind: str, slot_key: str = "") -> str:
    """A task that opts into the slot key (tasks live at module level, as Django 6 wants)."""
    SEEN.append({"kind": kind, "slot_key": slot_key})
    return kind


@task
def broken(kind: str) -> None:
    """A task that fails."""
    raise RuntimeError(f"no {kind}")


@pytest.fixture
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    """TASKS with one of Django's own backends (``immediate`` by default)."""
    name = getattr(request, "param", "immediate")
    cls = {"immediate": "ImmediateBackend", "dummy": "DummyBackend"}[name]
    settings.TASKS = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.{name}.{cls}"}}
    SEEN.clear()
    return name


@pytest.fixture
def job_name() -> Iterator[str]:
    name = f"tasks.{uuid.uuid4().hex[:8]}"
    yield name
    registry.forget(name)
    tasks.forget(name)


def _run(name: str) -> Any:
    return anarchon_django.get_scheduler().sync.run_now(name, timeout=30)


def test_every_stacked_on_task_enqueues_it_and_records_the_result(
        db_store: Store, backend: str, job_name: str) -> None:
    decorated = anarchon_django.every(job_name, "1h", kwargs={"kind": "daily"})(report)
    assert tasks.is_task(decorated)  # the decorator gives the Task back
    run = _run(job_name)
    assert run.status == "success", run.error
    assert [{"kind": "daily", "slot_key": f"{job_name}@{run.slot}"}] == SEEN
    [recorded] = anarchon_django.get_reader().sync.history(job_name)
    assert recorded.meta["task_name"] == f"{__name__}.report"
    assert recorded.meta["task_backend"] == "default"
    assert recorded.meta["task_status"] == "SUCCESSFUL"
    assert recorded.meta["task_id"]


def test_a_failing_task_is_the_task_s_outcome_not_the_run_s(
        db_store: Store, backend: str, job_name: str) -> None:
    anarchon_django.schedule(broken, cron="0 2 * * *", name=job_name,
                             kwargs={"kind": "report"})
    run = _run(job_name)
    assert run.status == "success", run.error
    assert run.meta["task_status"] == "FAILED"


@pytest.mark.parametrize("backend", ["dummy"], indirect=True)
def test_dummy_backend_keeps_the_enqueued_task(db_store: Store, backend: str,
                                               job_name: str) -> None:
    signals = importlib.import_module(f"{TASKS_MODULE}.signals")
    enqueued: list[Any] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        enqueued.append(task_result)

    # The backend's results are per thread: the run's enqueue is seen through the signal.
    signals.task_enqueued.connect(on_enqueued)
    target = report
    anarchon_django.schedule(target, every="10m", name=job_name, args=["weekly"])
    try:
        run = _run(job_name)
    finally:
        signals.task_enqueued.disconnect(on_enqueued)
    assert run.status == "success", run.error
    [result] = enqueued
    assert str(result.id) == run.meta["task_id"]
    assert result.args == ["weekly"]
    assert result.kwargs == {"slot_key": f"{job_name}@{run.slot}"}
    assert "task_status" not in run.meta  # not run yet
    assert SEEN == []


@pytest.mark.parametrize("backend", ["dummy"], indirect=True)
def test_a_task_finished_before_its_run_ended_still_reaches_the_run(
        store: Store, backend: str, job_name: str) -> None:
    """A queue's worker (django-tasks-rq) can finish the task before the run's end is written."""
    module = importlib.import_module(TASKS_MODULE)
    signals = importlib.import_module(f"{TASKS_MODULE}.signals")
    reporters: list[threading.Thread] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished = dataclasses.replace(task_result, status=module.TaskResultStatus.SUCCESSFUL)
        reporter = threading.Thread(target=taskresults.on_task_finished, args=(sender,),
                                    kwargs={"task_result": finished})
        reporter.start()
        reporters.append(reporter)
        time.sleep(0.5)  # the worker reports the task while the run still runs

    signals.task_enqueued.connect(on_enqueued)
    anarchon_django.schedule(report, every="10m", name=job_name, args=["weekly"])
    try:
        run = _run(job_name)
    finally:
        signals.task_enqueued.disconnect(on_enqueued)
    for reporter in reporters:
        reporter.join(20)
    assert run.status == "success", run.error
    [recorded] = anarchon_django.get_reader().sync.history(job_name)
    assert recorded.meta["task_id"] == run.meta["task_id"]
    assert recorded.meta["task_status"] == "SUCCESSFUL"


def test_schedule_refuses_arguments_the_task_cannot_take(backend: str, job_name: str) -> None:
    target = report
    with pytest.raises(ConfigError, match="JSON"):
        anarchon_django.schedule(target, every="1h", name=job_name, args=[object()])
    with pytest.raises(ConfigError, match="does not accept"):
        anarchon_django.schedule(target, every="1h", name=job_name, kwargs={"nope": 1})
    with pytest.raises(ConfigError, match="exactly one of every= and cron="):
        anarchon_django.schedule(target, name=job_name)
    with pytest.raises(ConfigError, match="given by anarchon"):
        anarchon_django.schedule(target, every="1h", name=job_name,
                                 kwargs={"kind": "x", "slot_key": "mine"})
    with pytest.raises(ConfigError, match=r"takes a django\.tasks Task"):
        anarchon_django.schedule(report.func, every="1h", name=job_name)
    assert job_name not in {d.name for d in registry.declarations()}


def test_settings_entries_are_checked_with_their_names(settings: Any, backend: str,
                                                        anarchon_reset: None) -> None:
    settings.ANARCHON = {**settings.ANARCHON, "TASKS": {
        "no-task": {"cron": "0 2 * * *"},
        "bad-path": {"task": "tests.django.nowhere.report", "every": "1h"},
        "not-a-task": {"task": "tests.django.test_tasks.SEEN", "every": "1h"},
        "typo": {"task": "tests.django.test_tasks.report", "crn": "0 2 * * *"},
        "bad-cron": {"task": "tests.django.test_tasks.report", "cron": "0 25 * * *",
                     "kwargs": {"kind": "x"}},
        "bad-kwargs": {"task": "tests.django.test_tasks.report", "every": "1h",
                       "kwargs": {"when": "now"}},
    }}
    found = [m for m in checks.run_checks(tags=["anarchon"]) if m.id == "anarchon.E012"]
    by_name = {name: [m.msg for m in found if f"[{name!r}]" in m.msg]
               for name in settings.ANARCHON["TASKS"]}
    assert all(len(msgs) == 1 for msgs in by_name.values()), by_name
    assert "needs 'task'" in by_name["no-task"][0]
    assert "cannot import" in by_name["bad-path"][0]
    assert "not a django.tasks Task" in by_name["not-a-task"][0]
    assert "did you mean 'cron'" in by_name["typo"][0]
    assert "0 25 * * *" in by_name["bad-cron"][0]
    assert "does not accept" in by_name["bad-kwargs"][0]
    with pytest.raises(Exception, match=r"anarchon\.E012"):
        anarchon_django.get_scheduler()


def test_settings_entry_is_scheduled(db_store: Store, settings: Any, backend: str) -> None:
    name = f"nightly-{uuid.uuid4().hex[:6]}"
    settings.ANARCHON = {**settings.ANARCHON, "TASKS": {name: {
        "task": "tests.django.test_tasks.report", "cron": "0 2 * * *",
        "tz": "Europe/Athens", "kwargs": {"kind": "nightly"}, "max_late_ms": 60_000}}}
    try:
        assert [m for m in checks.run_checks(tags=["anarchon"]) if m.level >= checks.ERROR] == []
        [job] = [j for j in anarchon_django.get_scheduler().jobs() if j.name == name]
        assert "Europe/Athens" in job.schedule
        run = _run(name)
        assert run.status == "success", run.error
        assert SEEN[-1] == {"kind": "nightly", "slot_key": f"{name}@{run.slot}"}
    finally:
        registry.forget(name)
        tasks.forget(name)


# ------------------------------------------------------------------ atomic(ctx)


def _takeover(store: Store, ctx: JobContext) -> None:
    """Another attempt's token on this run's row, as a takeover leaves it."""
    table = store.anarchon["TABLE"]
    with connections[store.alias or "default"].cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET token = 'someone-else' WHERE job = %s AND slot = %s",
                       [ctx.job, ctx.slot])


@pytest.mark.parametrize("taken_over", [False, True])
def test_atomic_commits_the_writes_with_the_run_only_while_it_holds(
        db_store: Store, job_name: str, taken_over: bool) -> None:
    alias = db_store.alias or "default"
    seen: list[BaseException] = []

    def handler(ctx: JobContext) -> None:
        try:
            with anarchon_django.atomic(ctx):
                Note.objects.using(alias).create(job=ctx.job, slot=ctx.slot, runner="x")
                ctx.meta["wrote"] = "1"
                if taken_over:
                    _takeover(db_store, ctx)
        except LeaseLost as exc:
            seen.append(exc)
            raise

    anarchon_django.every(job_name, "1h", handler)
    run = _run(job_name)
    notes = Note.objects.using(alias).filter(job=job_name).count()
    [recorded] = anarchon_django.get_reader().sync.history(job_name)
    if taken_over:
        assert notes == 0  # rolled back with the refused end record
        assert seen
        assert run.status == "interrupted"
        assert recorded.status != "success"
    else:
        assert notes == 1
        assert run.status == "success"
        assert (recorded.status, recorded.meta) == ("success", {"wrote": "1"})


def test_atomic_rolls_back_on_an_error_and_the_run_fails(db_store: Store,
                                                         job_name: str) -> None:
    alias = db_store.alias or "default"

    def handler(ctx: JobContext) -> None:
        with anarchon_django.atomic(ctx):
            Note.objects.using(alias).create(job=ctx.job, slot=ctx.slot, runner="x")
            raise ValueError("half done")

    anarchon_django.every(job_name, "1h", handler)
    run = _run(job_name)
    assert run.status == "failed"
    assert "half done" in (run.error or "")
    assert Note.objects.using(alias).filter(job=job_name).count() == 0


def test_atomic_needs_the_project_database(url_store: Store, job_name: str) -> None:

    def handler(ctx: JobContext) -> None:
        with anarchon_django.atomic(ctx):
            pass

    anarchon_django.every(job_name, "1h", handler)
    run = _run(job_name)
    assert run.status == "failed"
    assert "database alias" in (run.error or "")

