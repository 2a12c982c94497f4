"""Job sources (``anarchon_core.sources``): what a poll reads, and the jobs it keeps.

A fake source counts its calls: a quiet poll reads the recent changes and the count only,
a deleted record is found by the count, a record's time window holds its job back, and a
record the source cannot read is a warning while the others go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path

import pytest

from anarchon_core import ConfigError, EverySchedule, JobContext, Scheduler, SourcedJob
from anarchon_core.sources import SourceChanges, SourceSync
from tests.support.helpers import await_until, make_scheduler


class FakeSource:
    """Records ``{key: (name, revision, every, enabled)}``; counts what is asked."""

    description = "the fake source"

    def __init__(self) -> None:
        self.records: dict[str, dict[str, object]] = {}
        self.changed_at: dict[str, float] = {}
        #: The epoch ms a record is changed at (a scheduler's sync reads the real clock).
        self.now = time.time() * 1000 + 60_000
        self.calls: list[str] = []
        self.loaded: list[str] = []

    def put(self, key: str, name: str, revision: str, every: str = "1h", *,
            enabled: bool = True, **extra: object) -> None:
        self.records[key] = {"name": name, "revision": revision, "every": every,
                             "enabled": enabled, **extra}
        self.changed_at[key] = self.now

    def changed_since(self, since_ms: float | None) -> dict[str, str]:
        self.calls.append("all" if since_ms is None else "recent")
        return {k: str(r["revision"]) for k, r in self.records.items()
                if since_ms is None or self.changed_at[k] >= since_ms}

    def count(self) -> int:
        self.calls.append("count")
        return len(self.records)

    def load(self, keys: Collection[str]) -> list[SourcedJob | str]:
        out: list[SourcedJob | str] = []
        for key in keys:
            self.loaded.append(key)
            record = self.records.get(key)
            if record is None or not record["enabled"]:
                continue
            if record["every"] == "bad":
                out.append(f"record {key} is not a job: bad interval")
                continue
            out.append(SourcedJob(key, str(record["name"]), str(record["revision"]),
                                  EverySchedule(str(record["every"])),
                                  {"jitter_ms": 0},
                                  starts_at_ms=record.get("starts"),  # type: ignore[arg-type]
                                  ends_at_ms=record.get("ends")))  # type: ignore[arg-type]
        return out


class Applied:
    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}

    def __call__(self, changes: SourceChanges) -> None:
        for key in changes.dropped:
            self.jobs.pop(key, None)
        for job in changes.put:
            self.jobs[job.key] = job.revision


def make_sync(source: FakeSource, **kwargs: object) -> tuple[SourceSync, Applied]:
    applied = Applied()
    return SourceSync(source, applied, clock=lambda: source.now, **kwargs), applied  # type: ignore[arg-type]


def test_a_quiet_poll_reads_the_recent_changes_and_the_count_only() -> None:
    source = FakeSource()
    for n in range(50):
        source.put(str(n), f"job-{n}", "r1")
    sync, applied = make_sync(source)
    sync.poll_now()
    assert len(applied.jobs) == 50
    assert source.calls == ["all"]
    source.calls.clear()
    source.loaded.clear()
    source.now += 2_000
    for _ in range(5):
        assert not sync.poll_now()
    assert source.calls == ["recent", "count"] * 5
    assert source.loaded == []
    assert sync.full_listings == 1


def test_a_change_loads_that_record_only() -> None:
    source = FakeSource()
    for n in range(10):
        source.put(str(n), f"job-{n}", "r1")
    sync, applied = make_sync(source)
    sync.poll_now()
    source.loaded.clear()
    source.now += 2_000
    source.put("3", "job-3", "r2")
    changes = sync.poll_now()
    assert [j.key for j in changes.put] == ["3"]
    assert source.loaded == ["3"]
    assert applied.jobs["3"] == "r2"
    # Seen again by the next poll (the look-back), but not loaded again: same revision.
    source.now += 10
    assert not sync.poll_now()
    assert source.loaded == ["3"]


def test_disable_and_enable_drop_and_put_the_job() -> None:
    source = FakeSource()
    source.put("1", "a", "r1")
    sync, applied = make_sync(source)
    sync.poll_now()
    source.now += 1
    source.put("1", "a", "r2", enabled=False)
    assert sync.poll_now().dropped == ["1"]
    assert applied.jobs == {}
    source.now += 1
    source.put("1", "a", "r3")
    assert [j.key for j in sync.poll_now().put] == ["1"]


def test_a_delete_is_found_by_the_count() -> None:
    source = FakeSource()
    for n in range(5):
        source.put(str(n), f"job-{n}", "r1")
    sync, applied = make_sync(source)
    sync.poll_now()
    source.now += 1
    del source.records["2"]
    changes = sync.poll_now()
    assert changes.dropped == ["2"]
    assert "2" not in applied.jobs
    assert sync.full_listings == 2


def test_an_add_and_a_delete_in_one_poll_are_both_found() -> None:
    source = FakeSource()
    for n in range(5):
        source.put(str(n), f"job-{n}", "r1")
    sync, applied = make_sync(source)
    sync.poll_now()
    source.now += 1
    del source.records["0"]
    source.put("9", "job-9", "r1")
    changes = sync.poll_now()
    assert changes.dropped == ["0"]
    assert [j.key for j in changes.put] == ["9"]
    assert sorted(applied.jobs) == ["1", "2", "3", "4", "9"]


def test_full_every_lists_everything_whatever_the_count() -> None:
    source = FakeSource()
    source.put("1", "a", "r1")
    sync, _ = make_sync(source, full_every_s=0)
    sync.poll_now()
    sync.poll_now()
    assert source.calls == ["all", "all"]


def test_a_time_window_holds_the_job_back_then_drops_it() -> None:
    source = FakeSource()
    source.put("1", "a", "r1", starts=source.now + 5_000, ends=source.now + 10_000)
    sync, applied = make_sync(source)
    sync.poll_now()
    assert applied.jobs == {}
    source.now += 5_000
    assert [j.key for j in sync.poll_now().put] == ["1"]
    assert sync.active_names() == {"a"}
    source.now += 5_000
    assert sync.poll_now().dropped == ["1"]
    assert applied.jobs == {}
    source.now += 5_000
    assert not sync.poll_now()


def test_a_record_that_is_not_a_job_is_a_warning_naming_it(
        caplog: pytest.LogCaptureFixture) -> None:
    source = FakeSource()
    source.put("1", "good", "r1")
    source.put("2", "bad", "r1", every="bad")
    sync, applied = make_sync(source)
    with caplog.at_level(logging.WARNING, logger="anarchon.sources"):
        changes = sync.poll_now()
    assert changes.problems == ["record 2 is not a job: bad interval"]
    assert list(applied.jobs) == ["1"]
    assert "the fake source: record 2 is not a job" in caplog.text


# ---------------------------------------------------------------- on a scheduler


def noop(ctx: JobContext) -> None:
    pass


def test_scheduler_jobs_follow_the_source_renames_included(tmp_path: Path) -> None:
    scheduler = make_scheduler(tmp_path)
    source = FakeSource()
    source.put("1", "first", "r1")
    sync = scheduler.add_source(source, lambda job: noop)
    sync.poll_now()
    assert [j.name for j in scheduler.jobs()] == ["first"]
    source.now += 1
    source.put("1", "renamed", "r2", every="5m")
    sync.poll_now()
    [info] = scheduler.jobs()
    assert (info.name, info.schedule) == ("renamed", "every 5m")


def test_a_code_job_keeps_its_name_and_a_refused_job_is_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scheduler = make_scheduler(tmp_path)
    scheduler.every("report", "1h", noop)
    source = FakeSource()
    source.put("1", "report", "r1", every="1m")
    source.put("2", "other", "r1")
    source.put("3", "refused", "r1")

    def handler_for(job: SourcedJob) -> Callable[[JobContext], None]:
        if job.name == "refused":
            raise ConfigError("no handler for it")
        return noop

    sync = scheduler.add_source(source, handler_for)
    with caplog.at_level(logging.WARNING, logger="anarchon.sources"):
        sync.poll_now()
    assert sorted(j.name for j in scheduler.jobs()) == ["other", "report"]
    [report] = [j for j in scheduler.jobs() if j.name == "report"]
    assert report.schedule == "every 1h"
    assert "'report' is not scheduled: a job of that name is declared in code" in caplog.text
    assert "'refused' is not scheduled: no handler for it" in caplog.text


def test_add_refuses_what_is_not_a_schedule(tmp_path: Path) -> None:
    scheduler = make_scheduler(tmp_path)
    with pytest.raises(ConfigError, match="expected a Schedule"):
        scheduler.add("x", "1m", noop)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="expected a JobSource"):
        scheduler.add_source(object(), lambda job: noop)  # type: ignore[arg-type]


async def test_a_running_scheduler_loads_the_source_at_start_then_follows_it(
        tmp_path: Path) -> None:
    scheduler: Scheduler = make_scheduler(tmp_path)
    source = FakeSource()
    source.put("1", "from-start", "r1", every="100ms")
    ran: list[str] = []
    scheduler.add_source(source, lambda job: lambda ctx: ran.append(ctx.job),
                         interval_s=0.05)
    await scheduler.start()
    try:
        assert [j.name for j in scheduler.jobs()] == ["from-start"]
        await await_until(lambda: "from-start" in ran, 10, "a run of the first job")
        source.now += 1
        source.put("2", "added", "r1", every="100ms")
        await await_until(lambda: "added" in ran, 10, "a run of the added job")
        del source.records["1"]
        await await_until(lambda: [j.name for j in scheduler.jobs()] == ["added"], 10,
                          "the deleted job gone")
    finally:
        await scheduler.stop()
    await asyncio.sleep(0)
