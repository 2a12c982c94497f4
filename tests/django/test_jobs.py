"""Jobs at run time: the ORM in sync and async handlers, connections, in-process start/stop."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connections

import anarchon_django
from anarchon_core import JobContext
from anarchon_django import registry, views
from tests.django.conftest import Store
from tests.django.testapp.models import Note

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])


def notes_alias(store: Store) -> str:
    return store.alias or "default"


def test_sync_job_uses_the_orm(db_store: Store) -> None:
    run = anarchon_django.get_scheduler().sync.run_now("testapp.note", timeout=30)
    assert run.status == "success", run.error
    note = Note.objects.using(notes_alias(db_store)).get()
    assert (note.job, note.slot, note.manual) == ("testapp.note", run.slot, True)
    # The handler ran on a worker thread with its own connection, not the test's.
    assert note.thread != threading.current_thread().name
    [recorded] = anarchon_django.get_reader().sync.history("testapp.note")
    assert recorded.meta["notes"] == "1"


def test_async_job_uses_the_async_orm(db_store: Store) -> None:
    run = anarchon_django.get_scheduler().sync.run_now("testapp.async_note", timeout=30)
    assert run.status == "success", run.error
    assert Note.objects.using(notes_alias(db_store)).filter(job="testapp.async_note",
                                                            slot=run.slot).count() == 1


def test_connections_are_closed_after_each_run(db_store: Store) -> None:
    """CONN_MAX_AGE=0, as around a request: the job thread's connection is closed."""
    alias = notes_alias(db_store)
    seen: list[Any] = []

    def handler(ctx: JobContext) -> None:
        Note.objects.using(alias).create(job=ctx.job, slot=ctx.slot, runner="x")
        seen.append(connections[alias])
        assert connections[alias].connection is not None

    name = f"testapp.conn-{uuid.uuid4().hex[:6]}"
    anarchon_django.every(name, "1h", handler)
    try:
        run = anarchon_django.get_scheduler().sync.run_now(name, timeout=30)
    finally:
        registry.forget(name)
    assert run.status == "success", run.error
    [wrapper] = seen
    assert wrapper.connection is None


def test_failed_job_is_recorded_failed(db_store: Store) -> None:
    run = anarchon_django.get_scheduler().sync.run_now("testapp.fail", timeout=30)
    assert run.status == "failed"
    assert "the report server said no" in (run.error or "")


def test_run_now_records_who_asked(store: Store) -> None:
    result = views.run_now("testapp.note", who="alice")
    assert result.run is not None
    assert result.run.status == "success"
    [run] = anarchon_django.get_reader().sync.history("testapp.note")
    assert run.manual is True
    assert run.meta["requested_by"] == "alice"
    # A scheduled (non-manual) run never carries it.
    assert "requested_by" not in run.meta or run.manual


def test_start_and_stop_inside_this_process(store: Store) -> None:
    """The documented in-process mode: start(), jobs run on schedule, stop() hands over."""
    ran: list[int] = []

    def tick(ctx: JobContext) -> None:
        Note.objects.create(job=ctx.job, slot=ctx.slot, runner=ctx.instance_id)
        ran.append(ctx.slot)

    name = f"testapp.tick-{uuid.uuid4().hex[:6]}"
    anarchon_django.every(name, "1s", tick, jitter_ms=0)
    try:
        scheduler = anarchon_django.start()
        assert scheduler.running
        assert anarchon_django.start() is scheduler  # a second start does nothing
        deadline = time.monotonic() + 15
        while len(ran) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        anarchon_django.stop()
        assert not scheduler.running
    finally:
        registry.forget(name)
    assert len(ran) >= 3, ran
    assert len(set(ran)) == len(ran)
    history = anarchon_django.get_reader().sync.history(name, 50)
    assert {r.slot for r in history if r.status == "success"} >= set(ran)
    assert Note.objects.filter(job=name).count() == len(ran)


def test_a_second_ready_does_not_register_declarations_twice(store: Store) -> None:
    """INSTALLED_APPS changed under a test runner runs AppConfig.ready() again."""
    from anarchon_django import runtime  # noqa: PLC0415

    runtime.mark_ready()
    scheduler = anarchon_django.get_scheduler()
    name = f"testapp.twice-{uuid.uuid4().hex[:6]}"
    try:
        anarchon_django.every(name, "1h", lambda ctx: None)
        assert [j.name for j in scheduler.jobs()].count(name) == 1
    finally:
        registry.forget(name)


def test_policies_given_to_a_decorator_reach_the_scheduler(store: Store) -> None:
    def handler(ctx: JobContext) -> None:
        pass

    name = f"testapp.policies-{uuid.uuid4().hex[:6]}"
    anarchon_django.cron(name, "*/30 * * * *", handler, tz="Europe/Athens", dst="both,skip",
                         overlap="buffer_one", catch_up="all", catch_up_ms=3_600_000)
    try:
        [info] = [j for j in anarchon_django.get_scheduler().jobs() if j.name == name]
    finally:
        registry.forget(name)
    assert (info.options["overlap"], info.options["catch_up"], info.options["catch_up_ms"]) \
        == ("buffer_one", "all", 3_600_000)
    assert "dst=both,skip" in info.schedule
