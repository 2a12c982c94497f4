"""Daylight-saving changes under APScheduler: CronTrigger's own rule, and CronScheduleTrigger.

APScheduler decides when its triggers fire; anarchon claims each firing. The first tests
pin down what APScheduler 3's ``CronTrigger`` does at the changes of 2026 in Athens (as
docs/apscheduler.md says), so an APScheduler release that changes it is noticed. The
others check that :class:`CronScheduleTrigger` fires at the slots of anarchon's rule, and
that ``AnarchonExecutor`` gives a job's ``CronTrigger`` its place (``dst_rule``).
"""

from __future__ import annotations

import logging
import pickle
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.events import EVENT_JOB_ADDED, EVENT_JOB_MODIFIED
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from anarchon_apscheduler import (
    AnarchonExecutor,
    AnarchonJobStore,
    CronScheduleTrigger,
    check_trigger,
    slot_for,
)
from anarchon_apscheduler import executor as executor_module
from anarchon_core import ConfigError, CronSchedule, slot_from_datetime

ATHENS = ZoneInfo("Europe/Athens")
#: 2026-10-25 04:00 EEST → 03:00 EET; 2026-03-29 03:00 EET → 04:00 EEST (both 01:00Z).
FALL = datetime(2026, 10, 24, 23, 0, tzinfo=UTC)
SPRING = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)


def fire_times(trigger: Any, start: datetime, hours: int = 4) -> list[str]:
    """The trigger's fire times in ``[start, start + hours)``, as APScheduler walks them."""
    out: list[str] = []
    previous = None
    end = start + timedelta(hours=hours)
    for _ in range(500):
        previous = trigger.get_next_fire_time(previous, start if previous is None else previous)
        if previous is None or previous >= end:
            break
        out.append(previous.astimezone(UTC).astimezone(ATHENS).strftime("%H:%M%z"))
    return out


def slots(expression: str, dst: Any, start: datetime, hours: int = 4) -> list[str]:
    schedule = CronSchedule(expression, "Europe/Athens", dst)
    at = slot_from_datetime(start) - 1
    out = []
    while (at := schedule.next_after(at)) < slot_from_datetime(start + timedelta(hours=hours)):
        out.append(datetime.fromtimestamp(at / 1000, ATHENS).strftime("%H:%M%z"))
    return out


# ------------------------------------------------------------------ APScheduler's CronTrigger


@pytest.mark.parametrize(
    ("expression", "fall", "spring"),
    [("*/30 * * * *",
      ["02:00+0300", "02:30+0300", "03:00+0300", "03:30+0300", "03:00+0200", "03:30+0200",
       "04:00+0200", "04:30+0200"],
      ["01:00+0200", "01:30+0200", "02:00+0200", "02:30+0200", "04:00+0300", "04:30+0300",
       "05:00+0300", "05:30+0300"]),
     # A fixed-time job runs on both passes of the repeated hour too (cron(8): once).
     ("0 3 * * *", ["03:00+0300", "03:00+0200"], ["04:00+0300"]),
     # In the gap the first of the job's times is moved by the gap's length (03:30 to
     # 04:30, cron(8): 04:00), and the others there do not run.
     ("30 3 * * *", ["03:30+0300", "03:30+0200"], ["04:30+0300"]),
     ("15,45 3 * * *", ["03:15+0300", "03:45+0300", "03:15+0200", "03:45+0200"],
      ["04:15+0300"]),
     ("*/20 3 * * *", ["03:00+0300", "03:20+0300", "03:40+0300", "03:00+0200", "03:20+0200",
                       "03:40+0200"], ["04:00+0300"])],
)
def test_apschedulers_cron_trigger_keeps_a_rule_of_its_own(expression: str, fall: list[str],
                                                          spring: list[str]) -> None:
    trigger = CronTrigger.from_crontab(expression, timezone=ATHENS)
    assert fire_times(trigger, FALL) == fall
    assert fire_times(trigger, SPRING) == spring


@pytest.mark.parametrize(
    ("expression", "same_fall", "same_spring"),
    [("*/30 * * * *", True, True),   # a wildcard job: both passes; the moved time is 04:00
     ("0 3 * * *", False, True),     # twice in October; in March 03:00 moves to the change
     ("30 3 * * *", False, False),   # twice; in March 04:30, not 04:00
     ("15,45 3 * * *", False, False),
     ("*/20 3 * * *", True, False)],  # wildcard: both passes; in March 04:00, not nothing
)
def test_what_differs_from_anarchons_rule(expression: str, same_fall: bool,
                                          same_spring: bool) -> None:
    """docs/apscheduler.md, "Daylight-saving time", for the jobs above."""
    trigger = CronTrigger.from_crontab(expression, timezone=ATHENS)
    assert (fire_times(trigger, FALL) == slots(expression, None, FALL)) is same_fall
    assert (fire_times(trigger, SPRING) == slots(expression, None, SPRING)) is same_spring
    # In the repeated hour CronTrigger is dst="both" for every job.
    assert fire_times(trigger, FALL) == slots(expression, "both", FALL)


# ------------------------------------------------------------------ CronScheduleTrigger


@pytest.mark.parametrize("expression", ["*/30 * * * *", "0 3 * * *", "30 3 * * *",
                                        "15,45 3 * * *", "*/20 3 * * *", "30 0 3 * * *"])
@pytest.mark.parametrize("dst", [None, "once_last", "both", "skip", "shift"])
def test_the_trigger_fires_at_the_schedules_slots(expression: str, dst: Any) -> None:
    trigger = CronScheduleTrigger(expression, "Europe/Athens", dst=dst)
    for start in (FALL, SPRING):
        assert fire_times(trigger, start) == slots(expression, dst, start)


def test_the_default_rule_is_cron8s() -> None:
    assert fire_times(CronScheduleTrigger("0 3 * * *", ATHENS), FALL) == ["03:00+0300"]
    assert fire_times(CronScheduleTrigger("30 3 * * *", ATHENS), SPRING) == ["04:00+0300"]
    assert fire_times(CronScheduleTrigger("*/30 * * * *", ATHENS), FALL) == \
        fire_times(CronTrigger.from_crontab("*/30 * * * *", timezone=ATHENS), FALL)


def test_next_fire_time_as_apscheduler_asks_for_it() -> None:
    trigger = CronScheduleTrigger("*/30 * * * *", "UTC")
    slot = datetime(2026, 5, 1, 12, 30, tzinfo=UTC)
    # Without a previous fire time: at or after now.
    assert trigger.get_next_fire_time(None, slot) == slot
    assert trigger.get_next_fire_time(None, slot + timedelta(microseconds=1)) == \
        slot + timedelta(minutes=30)
    # With one: the next after it, even when now is later (missed run times are counted).
    assert trigger.get_next_fire_time(slot, slot + timedelta(hours=2)) == \
        slot + timedelta(minutes=30)
    assert trigger.get_next_fire_time(slot, slot) == slot + timedelta(minutes=30)
    fired = trigger.get_next_fire_time(None, slot)
    assert fired is not None
    assert fired.tzinfo == ZoneInfo("UTC")
    assert slot_for(trigger, fired) == slot_from_datetime(slot)


def test_the_trigger_pickles_by_its_arguments_and_says_what_it_is() -> None:
    trigger = CronScheduleTrigger("0 3 * * *", ATHENS, dst="once_last")
    state = trigger.__getstate__()
    assert state == {"version": 1, "expression": "0 3 * * *", "timezone": "Europe/Athens",
                     "dst": "once_last,shift"}
    copy = pickle.loads(pickle.dumps(trigger))
    assert fire_times(copy, FALL) == fire_times(trigger, FALL) == ["03:00+0200"]
    assert str(trigger) == "cron 0 3 * * * Europe/Athens dst=once_last,shift"
    assert repr(trigger) == \
        "<CronScheduleTrigger (cron 0 3 * * * Europe/Athens dst=once_last,shift)>"
    assert CronScheduleTrigger("0 3 * * *").__getstate__()["dst"] is None
    with pytest.raises(ValueError, match="version 2"):
        CronScheduleTrigger.__new__(CronScheduleTrigger).__setstate__({**state, "version": 2})
    with pytest.raises(ConfigError, match="invalid dst 'twice'"):
        CronScheduleTrigger("0 3 * * *", ATHENS, dst="twice")
    check_trigger("report", trigger)


def test_a_job_on_the_trigger_is_claimed_like_any_other(tmp_path: Path) -> None:
    executor = AnarchonExecutor(ThreadPoolExecutor(2), backend=f"sqlite:///{tmp_path / 'r.db'}")
    scheduler = BackgroundScheduler(executors={"default": executor}, timezone="UTC")
    scheduler.add_job(print, CronScheduleTrigger("*/30 * * * *", "Europe/Athens", dst="skip"),
                      id="tick")
    scheduler.start()
    try:
        jobs = {j.name: j.schedule for j in executor.scheduler.jobs()}
        assert jobs["tick"] == "APScheduler cron */30 * * * * Europe/Athens dst=both,skip"
        job = scheduler.get_job("tick")
        assert job is not None
        assert job.next_run_time.minute in (0, 30)
    finally:
        scheduler.shutdown(wait=True)


# ------------------------------------------------------------------ CronTrigger jobs


def tick() -> None:
    """A job function a persistent job store can find by reference."""


#: Job id → (CronTrigger keywords, the equivalent expression for Scheduler.cron()).
CRON_JOBS: dict[str, tuple[dict[str, Any], str]] = {
    "fixed": ({"hour": 3}, "0 3 * * *"),
    "backup": ({"hour": 3, "minute": 30}, "30 3 * * *"),
    "poll": ({"minute": "*/30"}, "*/30 * * * *"),
    "burst": ({"minute": "*/20", "hour": 3}, "*/20 3 * * *"),
}


def _jobstore(kind: str, tmp_path: Path) -> Any:
    if kind == "memory":
        return MemoryJobStore()
    stored = SQLAlchemyJobStore(url=f"sqlite:///{tmp_path / 'jobs.db'}")
    return stored if kind == "sqlalchemy" else AnarchonJobStore(stored, sync_interval=0.1)


def _scheduler(tmp_path: Path, store: str = "memory", **options: Any) -> BackgroundScheduler:
    executor = AnarchonExecutor(ThreadPoolExecutor(2), backend=f"sqlite:///{tmp_path / 'r.db'}",
                                **options)
    return BackgroundScheduler(executors={"default": executor},
                               jobstores={"default": _jobstore(store, tmp_path)},
                               timezone="UTC")


def _add(scheduler: BackgroundScheduler, job_id: str, **fields: Any) -> None:
    scheduler.add_job(tick, "cron", id=job_id, replace_existing=True,
                      timezone="Europe/Athens", **fields)


@pytest.mark.parametrize("store", ["memory", "sqlalchemy", "anarchon"])
def test_cron_trigger_jobs_fire_where_scheduler_cron_does(store: str, tmp_path: Path) -> None:
    """Added before and after start(), in any job store: the slots of CronSchedule."""
    scheduler = _scheduler(tmp_path, store)
    _add(scheduler, "fixed", **CRON_JOBS["fixed"][0])
    _add(scheduler, "poll", **CRON_JOBS["poll"][0])
    scheduler.start(paused=True)
    try:
        _add(scheduler, "backup", **CRON_JOBS["backup"][0])
        _add(scheduler, "burst", **CRON_JOBS["burst"][0])
        for job_id, (fields, expression) in CRON_JOBS.items():
            job = scheduler.get_job(job_id)
            assert job is not None
            assert isinstance(job.trigger, CronScheduleTrigger), job_id
            assert str(job.trigger) == f"cron {expression} Europe/Athens"
            for start in (FALL, SPRING):
                assert fire_times(job.trigger, start) == slots(expression, None, start), \
                    (job_id, start)
            cron_trigger = CronTrigger(timezone=ATHENS, **fields)
            assert job.next_run_time == cron_trigger.get_next_fire_time(
                None, datetime.now(UTC))
        # What changed: the fixed-time jobs run once in the repeated hour, 03:30 in the
        # gap at the change, the wildcard job in the gap not at all.
        assert fire_times(scheduler.get_job("fixed").trigger, FALL) == ["03:00+0300"]
        assert fire_times(scheduler.get_job("backup").trigger, SPRING) == ["04:00+0300"]
        assert fire_times(scheduler.get_job("burst").trigger, SPRING) == []
    finally:
        scheduler.shutdown()


def test_the_opt_out_keeps_apschedulers_rule_and_says_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scheduler = _scheduler(tmp_path, dst_rule="apscheduler")
    assert scheduler._executors["default"].dst_rule == "apscheduler"
    _add(scheduler, "fixed", hour=3)
    with caplog.at_level(logging.WARNING, logger="anarchon.apscheduler"):
        scheduler.start(paused=True)
        try:
            _add(scheduler, "backup", hour=3, minute=30)
            _add(scheduler, "yearly", year=2030, hour=3)
            for job_id, expression in (("fixed", "0 3 * * *"), ("backup", "30 3 * * *")):
                job = scheduler.get_job(job_id)
                assert type(job.trigger) is CronTrigger
                for start in (FALL, SPRING):
                    assert fire_times(job.trigger, start) == fire_times(
                        CronTrigger.from_crontab(expression, timezone=ATHENS), start)
        finally:
            scheduler.shutdown()
    assert caplog.records == []


@pytest.mark.parametrize("value", ["cron8", "APScheduler", None, 1])
def test_a_bad_dst_rule_is_refused_at_construction(value: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"invalid dst_rule .*expected 'anarchon'"):
        AnarchonExecutor(backend=f"sqlite:///{tmp_path / 'r.db'}", dst_rule=value)


def test_one_warning_per_job_that_keeps_apschedulers_rule(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scheduler = _scheduler(tmp_path)
    _add(scheduler, "yearly", year=2030, hour=3)
    with caplog.at_level(logging.WARNING, logger="anarchon.apscheduler"):
        scheduler.start(paused=True)
        try:
            _add(scheduler, "second-friday", day="2nd fri", hour=3)
            _add(scheduler, "jittered", hour=3, jitter=60)
            scheduler.add_job(tick, "cron", year=2030, hour=3, timezone="UTC", id="utc")
            scheduler.modify_job("yearly", name="renamed")
            scheduler.modify_job("second-friday", name="renamed")
            _add(scheduler, "yearly", year=2030, hour=3)  # the same again, replaced
            for job_id in ("yearly", "second-friday", "jittered", "utc"):
                assert type(scheduler.get_job(job_id).trigger) is CronTrigger
        finally:
            scheduler.shutdown()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, warned
    assert warned[0].startswith(
        "job 'yearly' (cron[year='2030', hour='3']) keeps APScheduler's DST rule: "
        "year='2030': cron has no year field.")
    assert "CronScheduleTrigger" in warned[0]
    assert "dst_rule='apscheduler'" in warned[0]
    assert warned[1].startswith("job 'second-friday' (cron[day='2nd fri', hour='3']) keeps "
                                "APScheduler's DST rule: day='2nd fri': a weekday's position")
    assert warned[2].startswith("job 'jittered' (cron[hour='3']) keeps APScheduler's DST "
                                "rule: jitter=60 would be lost")


def test_the_translation_is_one_modification_after_the_add(tmp_path: Path) -> None:
    scheduler = _scheduler(tmp_path, "anarchon")
    events: list[tuple[int, str]] = []
    scheduler.add_listener(lambda e: events.append((e.code, e.job_id)),
                           EVENT_JOB_ADDED | EVENT_JOB_MODIFIED)
    _add(scheduler, "fixed", hour=3)
    scheduler.start(paused=True)
    try:
        _add(scheduler, "backup", hour=3, minute=30)
        scheduler.modify_job("backup", name="nightly backup")
        scheduler.reschedule_job("backup", trigger="cron", hour=4, timezone="Europe/Athens")
        assert str(scheduler.get_job("backup").trigger) == "cron 0 4 * * * Europe/Athens"
    finally:
        scheduler.shutdown()
    assert events == [(EVENT_JOB_ADDED, "fixed"),
                      (EVENT_JOB_ADDED, "backup"), (EVENT_JOB_MODIFIED, "backup"),
                      (EVENT_JOB_MODIFIED, "backup"),
                      (EVENT_JOB_MODIFIED, "backup"), (EVENT_JOB_MODIFIED, "backup")]


def test_jobs_already_in_a_persistent_store_are_translated_at_start(tmp_path: Path) -> None:
    before = _scheduler(tmp_path, "sqlalchemy", dst_rule="apscheduler")
    before.start(paused=True)
    _add(before, "backup", hour=3, minute=30)
    before.shutdown()
    after = _scheduler(tmp_path, "sqlalchemy")
    after.start(paused=True)
    try:
        assert str(after.get_job("backup").trigger) == "cron 30 3 * * * Europe/Athens"
    finally:
        after.shutdown()
    reader = SQLAlchemyJobStore(url=f"sqlite:///{tmp_path / 'jobs.db'}")
    [stored] = reader.get_all_jobs()
    assert isinstance(stored.trigger, CronScheduleTrigger)
    reader.shutdown()


def test_a_next_run_time_the_cron_trigger_computed_is_computed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Half an hour before the gap of 29 March: 03:30 runs at 04:00, not APScheduler's 04:30."""
    now = SPRING + timedelta(hours=1, minutes=30)  # 2026-03-29 02:30 EET
    monkeypatch.setattr(executor_module, "_now", lambda: now)
    by_cron_trigger = CronTrigger(hour=3, minute=30, timezone=ATHENS).get_next_fire_time(
        None, now)
    assert by_cron_trigger.astimezone(UTC).astimezone(ATHENS).strftime("%H:%M%z") == \
        "04:30+0300"
    scheduler = _scheduler(tmp_path)
    scheduler.start(paused=True)
    try:
        _add(scheduler, "computed", hour=3, minute=30, next_run_time=by_cron_trigger)
        by_hand = now + timedelta(minutes=7)
        _add(scheduler, "by-hand", hour=3, minute=30, next_run_time=by_hand)
        _add(scheduler, "paused", hour=3, minute=30, next_run_time=None)
        computed = scheduler.get_job("computed").next_run_time
        assert computed.astimezone(ATHENS).strftime("%d %H:%M%z") == "29 04:00+0300"
        assert scheduler.get_job("by-hand").next_run_time == by_hand
        assert scheduler.get_job("paused").next_run_time is None
        for job_id in ("computed", "by-hand", "paused"):
            assert isinstance(scheduler.get_job(job_id).trigger, CronScheduleTrigger)
    finally:
        scheduler.shutdown()


def test_a_job_added_on_one_process_is_translated_for_all(tmp_path: Path) -> None:
    """AnarchonJobStore: the shared store holds the translated trigger; the others follow."""
    one, two = _scheduler(tmp_path, "anarchon"), _scheduler(tmp_path, "anarchon")
    one.start(paused=True)
    two.start(paused=True)
    try:
        _add(one, "backup", hour=3, minute=30)
        deadline = time.monotonic() + 10
        while (job := two.get_job("backup")) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job is not None
        assert str(job.trigger) == "cron 30 3 * * * Europe/Athens"
        assert job.next_run_time == one.get_job("backup").next_run_time
    finally:
        one.shutdown()
        two.shutdown()
