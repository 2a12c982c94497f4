"""The executor and job store in one process: slots, refusals, and the events users see.

Two BackgroundSchedulers in one process, each with its own AnarchonExecutor (its own
anarchon scheduler and connection) on one SQLite store, behave as two processes would.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from apscheduler.events import (
    EVENT_ALL,
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers import SchedulerNotRunningError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED
from apscheduler.triggers.calendarinterval import CalendarIntervalTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from anarchon_apscheduler import (
    EPOCH,
    AnarchonExecutor,
    AnarchonJobStore,
    check_trigger,
    current_run,
    slot_for,
)
from anarchon_core import ConfigError, slot_from_datetime
from anarchon_core.claim import SyncClaimHandle
from tests.stores import StoreHandle
from tests.support.procs import read_history

START = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def _run_times(trigger: Any, count: int, now: datetime = START) -> list[datetime]:
    out, previous = [], None
    for _ in range(count):
        previous = trigger.get_next_fire_time(previous, now if previous is None else previous)
        out.append(previous)
    return out


# ---------------------------------------------------------------------- slots


def test_cron_with_jitter_maps_every_process_to_the_same_slots() -> None:
    trigger = CronTrigger(second="*/5", jitter=2, timezone="UTC")
    processes = [[slot_for(trigger, t) for t in _run_times(trigger, 100)] for _ in range(3)]
    expected = [slot_from_datetime(START + timedelta(seconds=5 * i)) for i in range(100)]
    assert processes == [expected] * 3


def test_interval_with_jitter_drifts_through_its_grid_without_doubling_a_cell() -> None:
    trigger = IntervalTrigger(seconds=10, start_date=EPOCH, jitter=4)
    slots = [slot_for(trigger, t) for t in _run_times(trigger, 200)]
    assert all(s % 10_000 == 0 for s in slots)
    assert len(slots) == len(set(slots)), "two run times of one process in one cell"


def test_interval_without_jitter_is_its_run_time_despite_float_rounding() -> None:
    trigger = IntervalTrigger(seconds=0.1, start_date=EPOCH)
    for run_time in _run_times(trigger, 50):
        assert slot_for(trigger, run_time) % 100 == 0
    by_hand = START + timedelta(milliseconds=3_456)
    assert slot_for(trigger, by_hand) == slot_from_datetime(START) + 3_400


def test_interval_run_times_off_the_grid_map_to_the_grid_point_before_them() -> None:
    """``next_run_time`` set by hand: APScheduler adds the interval to it from then on."""
    from anarchon_apscheduler.triggers import lag_ms  # noqa: PLC0415

    trigger = IntervalTrigger(seconds=3, start_date=EPOCH)
    grid_ms = [slot_from_datetime(START) + 3_000 * k for k in range(20)]
    for offset_ms in (1, 1_300, 1_750, 2_998):
        first = START + timedelta(milliseconds=offset_ms)
        run_times = [first]
        for _ in range(19):
            run_times.append(trigger.get_next_fire_time(run_times[-1], run_times[-1]))
        assert [slot_for(trigger, t) for t in run_times] == grid_ms, offset_ms
        assert {lag_ms(trigger, t) for t in run_times} == {offset_ms}
    assert lag_ms(trigger, START) == 0
    assert lag_ms(IntervalTrigger(seconds=3, start_date=EPOCH, jitter=1), first) == 0


def test_or_trigger_with_jitter_and_date_trigger() -> None:
    trigger = OrTrigger([CronTrigger(second="7", timezone="UTC"),
                         CronTrigger(second="37", timezone="UTC")], jitter=3)
    assert [slot_for(trigger, t) % 60_000 for t in _run_times(trigger, 6)] == \
        [7_000, 37_000] * 3
    date = DateTrigger(run_date=START + timedelta(microseconds=1_400))
    assert slot_for(date, date.run_date) == slot_from_datetime(START) + 1


def test_interval_without_start_date_is_refused_naming_the_job() -> None:
    with pytest.raises(ConfigError) as info:
        check_trigger("sync-orders", IntervalTrigger(minutes=5))
    message = str(info.value)
    assert "job 'sync-orders'" in message
    assert "no fixed start_date" in message
    assert "start_date=" in message
    check_trigger("fine", IntervalTrigger(minutes=5, start_date="2024-01-01 00:00:00"))
    with pytest.raises(ConfigError, match="job 'combined'"):
        check_trigger("combined", OrTrigger([CronTrigger(hour=1),
                                             IntervalTrigger(seconds=30)]))


# ---------------------------------------------------------------------- schedulers


class Pair:
    """Two APScheduler schedulers ("processes") on one store, with their events."""

    def __init__(self, url: str, **executor_options: Any) -> None:
        self.events: dict[str, list[Any]] = {"a": [], "b": []}
        self.schedulers: dict[str, BackgroundScheduler] = {}
        self.triggers: dict[str, Any] = {}
        for name in ("a", "b"):
            executor = AnarchonExecutor(ThreadPoolExecutor(4), backend=url, instance_id=name,
                                        **executor_options)
            scheduler = BackgroundScheduler(executors={"default": executor}, timezone="UTC")
            scheduler.add_listener(self.events[name].append, EVENT_ALL)
            self.schedulers[name] = scheduler

    def add_job(self, *args: Any, **kwargs: Any) -> None:
        for scheduler in self.schedulers.values():
            self.triggers[kwargs["id"]] = scheduler.add_job(*args, **kwargs).trigger

    def run(self, seconds: float) -> None:
        for scheduler in self.schedulers.values():
            scheduler.start()
        time.sleep(seconds)
        for scheduler in self.schedulers.values():
            scheduler.shutdown()

    def by_slot(self, job: str, code: int) -> dict[int, list[tuple[str, Any]]]:
        """Slot → (scheduler, event) of every event ``code`` of ``job``."""
        trigger = self.triggers[job]
        out: dict[int, list[tuple[str, Any]]] = defaultdict(list)
        for name, events in self.events.items():
            for event in events:
                if event.code != code or getattr(event, "job_id", None) != job:
                    continue
                times = getattr(event, "scheduled_run_times", None) or \
                    [event.scheduled_run_time]
                for run_time in times:
                    out[slot_for(trigger, run_time)].append((name, event))
        return out


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


RAN: list[tuple[str, int, int]] = []
LOCK = threading.Lock()


def ok() -> int:
    run = current_run()
    assert run is not None
    with LOCK:
        RAN.append((run.job_id, run.slot, run.attempt))
    return 42


def bad() -> None:
    raise ValueError("boom")


def slow() -> None:
    with LOCK:
        RAN.append(("slow-start", time.monotonic_ns(), 0))
    time.sleep(2.2)
    with LOCK:
        RAN.append(("slow-end", time.monotonic_ns(), 0))


def test_events_come_from_the_process_that_ran_the_firing(url: str) -> None:
    RAN.clear()
    pair = Pair(url)
    pair.add_job(ok, "cron", second="*", id="ok", jitter=0.3)
    pair.add_job(bad, "cron", second="*", id="bad")
    pair.run(4.5)
    ran = Counter(slot for job, slot, _ in RAN if job == "ok")
    assert ran, "nothing ran"
    assert set(ran.values()) == {1}, ran
    submitted = pair.by_slot("ok", EVENT_JOB_SUBMITTED)
    executed = pair.by_slot("ok", EVENT_JOB_EXECUTED)
    assert set(submitted) == set(executed) == set(ran)
    for slot in ran:
        (who_s, _), = submitted[slot]
        (who_e, event), = executed[slot]
        assert who_s == who_e
        assert event.retval == 42
    errors = pair.by_slot("bad", EVENT_JOB_ERROR)
    assert errors, "no error events"
    assert all(len(v) == 1 for v in errors.values()), errors
    assert all(isinstance(v[0][1].exception, ValueError) for v in errors.values())
    failed = [r for r in read_history(url, "bad") if r.status == "failed"]
    assert {r.slot for r in failed} == set(errors)
    assert all(r.error == "ValueError: boom" for r in failed)


def test_missed_and_max_instances_are_emitted_once_per_firing(url: str) -> None:
    RAN.clear()
    pair = Pair(url)
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=6)
    pair.add_job(ok, "cron", second="*", id="late", coalesce=False, misfire_grace_time=1,
                 next_run_time=past)
    pair.add_job(slow, "cron", second="*", id="slow", max_instances=1)
    pair.run(4.5)
    missed = pair.by_slot("late", EVENT_JOB_MISSED)
    assert len(missed) >= 4, missed
    assert all(len(v) == 1 for v in missed.values()), missed
    first = slot_from_datetime(past)
    assert first in missed
    skipped = {r.slot for r in read_history(url, "late") if r.status == "skipped"}
    assert skipped == set(missed)
    ran = [slot for job, slot, _ in RAN if job == "late"]
    assert not set(ran) & set(missed)
    assert len(ran) == len(set(ran))
    overlapping = pair.by_slot("slow", EVENT_JOB_MAX_INSTANCES)
    assert overlapping, "no max-instances events"
    assert all(len(v) == 1 for v in overlapping.values()), overlapping
    marks = [job for job, _, _ in sorted(RAN, key=lambda r: r[1]) if job.startswith("slow")]
    assert marks[:2] == ["slow-start", "slow-end"], marks
    assert all(a != b for a, b in itertools.pairwise(marks)), marks


def test_buffer_one_runs_a_firing_due_meanwhile_once_the_run_ends(url: str) -> None:
    """``overlap="buffer_one"``: the firing due while ``slow`` runs waits, then runs at once;
    never two runs at a time, and a firing is skipped only when one is waiting already."""
    RAN.clear()
    pair = Pair(url, overlap="buffer_one")
    pair.add_job(slow, "cron", second="*", id="slow")
    pair.run(7.5)
    marks = sorted((at, job) for job, at, _ in RAN if job.startswith("slow"))
    kinds = [job for _, job in marks]
    assert all(a != b for a, b in itertools.pairwise(kinds)), kinds
    assert kinds.count("slow-start") >= 3, kinds
    # Each buffered run starts as its predecessor ends, not at the next firing.
    gaps_s = [(b[0] - a[0]) / 1e9 for a, b in itertools.pairwise(marks)
              if (a[1], b[1]) == ("slow-end", "slow-start")]
    assert gaps_s, marks
    assert max(gaps_s) < 0.8, gaps_s
    history = read_history(url, "slow")
    assert {r.status for r in history} <= {"success", "skipped", "running", "interrupted"}
    assert any(r.status == "skipped" for r in history), "no firing found one waiting"


def test_cancel_other_is_refused_as_apscheduler_cannot_cancel_a_function(url: str) -> None:
    with pytest.raises(ConfigError, match="overlap='cancel_other' does not apply"):
        AnarchonExecutor(backend=url, overlap="cancel_other")
    with pytest.raises(ConfigError, match="invalid overlap 'sometimes'"):
        AnarchonExecutor(backend=url, overlap="sometimes")


def _anarchon_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("anarchon")}


def test_refused_interval_added_before_start_makes_start_raise_and_nothing_runs(
        url: str) -> None:
    before = _anarchon_threads()
    scheduler = BackgroundScheduler(executors={"default": AnarchonExecutor(backend=url)},
                                    timezone="UTC")
    scheduler.add_job(ok, "interval", seconds=1, id="drifting")
    with pytest.raises(ConfigError, match=r"job 'drifting'.*no fixed start_date"):
        scheduler.start()
    assert scheduler.state == STATE_STOPPED
    assert _anarchon_threads() <= before, "start() failed but left threads running"
    scheduler.remove_job("drifting")
    scheduler.start()
    scheduler.shutdown()


def test_refused_interval_added_after_start_is_logged_at_once_and_never_runs(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    RAN.clear()
    scheduler = BackgroundScheduler(executors={"default": AnarchonExecutor(backend=url)},
                                    timezone="UTC")
    scheduler.start()
    try:
        with caplog.at_level(logging.ERROR):
            scheduler.add_job(ok, "interval", seconds=1, id="drifting")
            assert "job 'drifting'" in caplog.text
            assert "no fixed start_date" in caplog.text
            time.sleep(2.5)
    finally:
        scheduler.shutdown()
    assert not RAN


def test_calendar_interval_starting_today_is_refused() -> None:
    weekly = CalendarIntervalTrigger(weeks=1, hour=8, timezone="UTC")
    with pytest.raises(ConfigError) as info:
        check_trigger("weekly", weekly)
    message = str(info.value)
    assert "job 'weekly'" in message
    assert "starts today" in message
    assert "start_date=" in message
    with pytest.raises(ConfigError, match="job 'either'"):
        check_trigger("either", OrTrigger([CronTrigger(hour=1), weekly]))
    # Made earlier (a firing on its start day), written by hand, or every day: accepted.
    check_trigger("weekly", weekly, new=False)
    check_trigger("fixed", CalendarIntervalTrigger(weeks=1, start_date="2024-01-01",
                                                   timezone="UTC"))
    check_trigger("daily", CalendarIntervalTrigger(days=1, hour=8, timezone="UTC"))


def test_calendar_interval_without_start_date_never_runs_silently(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Added after start with a firing 2 s from now today: refused, logged, not run."""
    RAN.clear()
    scheduler = BackgroundScheduler(executors={"default": AnarchonExecutor(backend=url)},
                                    timezone="UTC")
    scheduler.start()
    fire = datetime.now(UTC) + timedelta(seconds=2)
    try:
        with caplog.at_level(logging.ERROR):
            scheduler.add_job(ok, "calendarinterval", weeks=1, hour=fire.hour,
                              minute=fire.minute, second=fire.second, timezone="UTC",
                              id="weekly")
            assert "job 'weekly'" in caplog.text
            assert "starts today" in caplog.text
            time.sleep(3.5)
    finally:
        scheduler.shutdown()
    assert not RAN, RAN
    pending = BackgroundScheduler(executors={"default": AnarchonExecutor(backend=url)},
                                  timezone="UTC")
    pending.add_job(ok, "calendarinterval", weeks=2, id="fortnightly")
    with pytest.raises(ConfigError, match=r"job 'fortnightly'.*starts today"):
        pending.start()
    stored = BackgroundScheduler(jobstores={"default": AnarchonJobStore(MemoryJobStore())},
                                 executors={"default": AnarchonExecutor(backend=url)},
                                 timezone="UTC")
    stored.start(paused=True)
    try:
        with pytest.raises(ConfigError, match=r"job 'monthly'.*starts today"):
            stored.add_job(ok, "calendarinterval", months=1, id="monthly")
        assert stored.get_jobs() == []
    finally:
        stored.shutdown()


def test_job_store_refusal_of_a_job_added_before_start_comes_from_start(url: str) -> None:
    before = _anarchon_threads()
    scheduler = BackgroundScheduler(jobstores={"default": AnarchonJobStore(MemoryJobStore())},
                                    executors={"default": AnarchonExecutor(backend=url)},
                                    timezone="UTC")
    scheduler.add_job(ok, "interval", seconds=1, id="drifting")  # pending: not checked yet
    with pytest.raises(ConfigError, match="job 'drifting'"):
        scheduler.start()
    assert scheduler.state == STATE_STOPPED
    assert _anarchon_threads() <= before, "start() failed but left threads running"
    with pytest.raises(SchedulerNotRunningError):
        scheduler.shutdown()
    scheduler.remove_job("drifting")
    scheduler.add_job(ok, "interval", seconds=1, id="fixed", start_date=EPOCH)
    scheduler.start()
    try:
        assert [j.id for j in scheduler.get_jobs()] == ["fixed"]
    finally:
        scheduler.shutdown()


def test_job_store_refuses_it_when_the_job_is_added() -> None:
    scheduler = BackgroundScheduler(jobstores={"default": AnarchonJobStore(MemoryJobStore())},
                                    timezone="UTC")
    scheduler.start(paused=True)
    try:
        with pytest.raises(ConfigError, match="job 'drifting'"):
            scheduler.add_job(ok, "interval", seconds=1, id="drifting")
        scheduler.add_job(ok, "interval", seconds=1, id="fixed", start_date=EPOCH)
        assert [j.id for j in scheduler.get_jobs()] == ["fixed"]
    finally:
        scheduler.shutdown()


def test_bad_options_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="trigger a jitter"):
        AnarchonExecutor(backend=url, jitter_ms=100)
    with pytest.raises(ConfigError, match="unknown job option 'retries'"):
        AnarchonExecutor(backend=url, retries=3)
    with pytest.raises(ConfigError, match="inner executor"):
        AnarchonExecutor(object(), backend=url)
    with pytest.raises(ConfigError, match="max_late_ms"):
        AnarchonExecutor(backend=url, max_late_ms=-1)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), "abc", -1, 0, True, None,
                                     1e300])
def test_a_bad_claim_timeout_is_refused_at_construction(url: str, timeout: Any) -> None:
    with pytest.raises(ConfigError, match=r"^invalid claim_timeout_s .*: expected a number"):
        AnarchonExecutor(backend=url, claim_timeout_s=timeout)


def test_a_misfire_grace_time_out_of_range_names_the_job_and_the_option(url: str) -> None:
    scheduler = BackgroundScheduler(executors={"default": AnarchonExecutor(backend=url)},
                                    timezone="UTC")
    scheduler.add_job(ok, "cron", second="*", id="huge", misfire_grace_time=10**12)
    with pytest.raises(ConfigError) as info:
        scheduler.start()
    message = str(info.value)
    assert message.startswith("job 'huge': misfire_grace_time=1000000000000 s"), message
    assert "give it a smaller misfire_grace_time" in message
    assert scheduler.state == STATE_STOPPED


# ---------------------------------------------------------------------- limited stores


@pytest.mark.parametrize("store", ["rabbitmq", "redis-script"])
def test_unlimited_grace_on_a_store_with_a_limited_window_fails_at_start(
        store: str, store_handles: Callable[[str], StoreHandle], namespace: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """``misfire_grace_time=None`` asks for a claim window of an hour, which these stores
    cannot keep: ``start()`` says so (naming the way out) instead of every firing failing."""
    handle = store_handles(store)
    before = _anarchon_threads()
    scheduler = BackgroundScheduler(
        executors={"default": AnarchonExecutor(backend=handle.backend(namespace))},
        job_defaults={"misfire_grace_time": None}, timezone="UTC")
    scheduler.add_job(ok, "cron", second="*", id="every-second")
    with pytest.raises(ConfigError) as info:
        scheduler.start()
    message = str(info.value)
    assert "misfire_grace_time=None" in message
    assert "job_defaults" in message
    assert "AnarchonExecutor(..., max_late_ms=...)" in message
    assert scheduler.state == STATE_STOPPED
    assert _anarchon_threads() <= before, "start() failed but left threads running"

    one_job = BackgroundScheduler(
        executors={"default": AnarchonExecutor(backend=handle.backend(namespace))},
        timezone="UTC")
    one_job.add_job(ok, "cron", second="*", id="unlimited", misfire_grace_time=None)
    with pytest.raises(ConfigError, match=r"job 'unlimited'.*misfire_grace_time=None"):
        one_job.start()

    stored = BackgroundScheduler(
        jobstores={"default": AnarchonJobStore(MemoryJobStore())},
        executors={"default": AnarchonExecutor(backend=handle.backend(namespace))},
        timezone="UTC")
    stored.start(paused=True)
    try:
        with pytest.raises(ConfigError, match="misfire_grace_time=None"):
            stored.add_job(ok, "cron", second="*", id="unlimited", misfire_grace_time=None)
        assert stored.get_jobs() == []
    finally:
        stored.shutdown()

    # Added after start to a plain job store: APScheduler gives the executor no say, so
    # the refusal is logged when the job is added (and each firing is refused).
    plain = BackgroundScheduler(
        executors={"default": AnarchonExecutor(backend=handle.backend(namespace))},
        timezone="UTC")
    plain.start(paused=True)
    try:
        with caplog.at_level(logging.ERROR):
            plain.add_job(ok, "cron", second="*", id="unlimited", misfire_grace_time=None)
        assert "job 'unlimited'" in caplog.text
        assert "misfire_grace_time=None" in caplog.text
    finally:
        plain.shutdown()

    # The way out: a limit for every job; then the job runs.
    RAN.clear()
    fixed = BackgroundScheduler(
        executors={"default": AnarchonExecutor(backend=handle.backend(namespace),
                                               max_late_ms=30_000)},
        job_defaults={"misfire_grace_time": None}, timezone="UTC")
    fixed.add_job(ok, "cron", second="*", id="every-second")
    fixed.start()
    try:
        time.sleep(2.5)
    finally:
        fixed.shutdown()
    assert [job for job, _, _ in RAN].count("every-second") >= 1, RAN


def test_shutdown_returns_only_once_the_last_runs_end_is_recorded(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The last run's end stops anarchon from a thread of its own while shutdown() stops it
    # too: shutdown() must not return (and let the process exit, which refuses new work to
    # every thread pool) while that thread still records the end.
    real_finish = SyncClaimHandle.finish
    recorded = threading.Event()

    def slow_finish(self: SyncClaimHandle, *args: Any, **kwargs: Any) -> bool:
        time.sleep(0.5)
        accepted = real_finish(self, *args, **kwargs)
        recorded.set()
        return accepted

    monkeypatch.setattr(SyncClaimHandle, "finish", slow_finish)
    started = threading.Event()

    def short() -> None:
        started.set()
        time.sleep(0.3)

    scheduler = BackgroundScheduler(timezone="UTC", executors={
        "default": AnarchonExecutor(ThreadPoolExecutor(4), backend=url)})
    scheduler.add_job(short, "interval", seconds=5, start_date=EPOCH, id="short",
                      next_run_time=datetime.now(UTC))
    scheduler.start()
    try:
        assert started.wait(10), "the job never started"
    finally:
        scheduler.shutdown(wait=True)
    assert recorded.is_set(), "shutdown() returned before the run's end was recorded"
    [run] = read_history(url, "short")
    assert run.status == "success"


def test_the_fleet_sees_each_jobs_trigger_and_the_start_counts_its_jobs(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    executor = AnarchonExecutor(backend=url)
    scheduler = BackgroundScheduler(executors={"default": executor}, timezone="UTC")
    scheduler.add_job(ok, "interval", seconds=30, start_date=EPOCH, id="sync")
    scheduler.add_job(ok, "cron", hour=8, id="report")
    with caplog.at_level(logging.INFO, logger="anarchon"):
        scheduler.start()
    try:
        scheduler.add_job(ok, "cron", minute="*/5", id="later")
        assert "started with 2 job(s)" in caplog.text
        jobs = {j.name: j.schedule for j in executor.scheduler.jobs()}
        assert jobs["sync"] == "APScheduler interval[0:00:30]"
        assert jobs["report"] == "APScheduler cron 0 8 * * * UTC"
        assert jobs["later"] == "APScheduler cron */5 * * * * UTC"
        deadline = time.monotonic() + 20  # the registry notices a new job within seconds
        while True:
            view = executor.scheduler.sync.status()
            shown = {j.name: j.schedule for j in view.jobs}
            if shown == jobs or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        scheduler.shutdown()
    assert shown == jobs
    assert "(claimed by its caller)" not in view.format()
