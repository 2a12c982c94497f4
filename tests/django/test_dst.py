"""dst= on Django cron jobs: declared in jobs.py or in ANARCHON['TASKS'], and refused when bad."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import anarchon_django
from anarchon_core import ConfigError, JobContext, Scheduler
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_django import registry, runtime, tasks

NAMES = ("testapp.dst-late", "testapp.dst-tick", "testapp.dst-task", "testapp.dst-bad")


def handler(ctx: JobContext) -> None:
    pass


@pytest.fixture(autouse=True)
def forget() -> Iterator[None]:
    yield
    for name in NAMES:
        registry.forget(name)
        tasks.forget(name)


def registered(tmp_path: Path, name: str) -> str:
    """The schedule text of declared job ``name`` once registered on a scheduler."""
    scheduler = Scheduler(SqliteBackend(tmp_path / "dst.db"))
    [declaration] = [d for d in registry.declarations() if d.name == name]
    runtime.register_job(scheduler, declaration, {})
    return {job.name: job.schedule for job in scheduler.jobs()}[name]


def test_a_declared_cron_job_takes_dst(tmp_path: Path) -> None:
    anarchon_django.cron("testapp.dst-late", "0 3 * * *", handler, tz="Europe/Athens",
                         dst="once_last")

    @anarchon_django.cron("testapp.dst-tick", "*/30 * * * *", tz="Europe/Athens",
                          dst={"spring_forward": "shift"})
    def tick(ctx: JobContext) -> None:
        pass

    assert registered(tmp_path, "testapp.dst-late") == \
        "cron 0 3 * * * Europe/Athens dst=once_last,shift"
    assert registered(tmp_path, "testapp.dst-tick") == \
        "cron */30 * * * * Europe/Athens dst=both,shift"


def test_a_bad_dst_is_refused_when_declared() -> None:
    with pytest.raises(ConfigError, match=r"invalid dst 'twice': expected None"):
        anarchon_django.cron("testapp.dst-bad", "0 3 * * *", handler, dst="twice")
    assert "testapp.dst-bad" not in {d.name for d in registry.declarations()}


def test_a_settings_task_entry_takes_dst(tmp_path: Path) -> None:
    problems = tasks.declare_from_settings({
        "testapp.dst-task": {"task": "tests.django.test_tasks.report", "cron": "30 2 * * *",
                             "tz": "America/New_York", "dst": "skip",
                             "kwargs": {"kind": "nightly"}},
        "testapp.dst-bad": {"task": "tests.django.test_tasks.report", "cron": "30 2 * * *",
                            "dst": "sometimes", "kwargs": {"kind": "nightly"}},
    })
    assert len(problems) == 1
    assert problems[0].startswith("ANARCHON['TASKS']['testapp.dst-bad']: invalid dst "
                                  "'sometimes'")
    assert registered(tmp_path, "testapp.dst-task") == \
        "cron 30 2 * * * America/New_York dst=once_first,skip"
