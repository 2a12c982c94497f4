"""The Scheduler's public API on a real SQLite file, in process, with short times."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from anarchon_core import ConfigError, JobContext, Run, Scheduler
from anarchon_core.backends.sqlite import SqliteBackend

from .support.helpers import STEADY_LEASE, await_until, make_scheduler

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]


make = functools.partial(make_scheduler, table="runs", **STEADY_LEASE)


def noop(ctx: JobContext) -> None:
    pass


# ------------------------------------------------------------------ registration and jobs()


def test_decorator_and_call_forms_return_the_handler(tmp_path: Path) -> None:
    scheduler = make(tmp_path)

    @scheduler.every("a", "10s")
    async def a(ctx: JobContext) -> None:
        pass

    @scheduler.cron("b", "0 8 * * *", tz="Europe/Athens")
    def b(ctx: JobContext) -> None:
        pass

    def c(ctx: JobContext) -> None:
        pass

    assert scheduler.every("c", "1m", c) is c
    assert scheduler.cron("d", "*/5 * * * *", c, timeout_ms=1000) is c
    assert asyncio.iscoroutinefunction(a)
    assert callable(b)
    assert [j.name for j in scheduler.jobs()] == ["a", "b", "c", "d"]


def test_jobs_report_schedule_next_slot_and_option_defaults(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    scheduler.every("ten", "10s", noop)
    scheduler.every("one", "1s", noop)
    scheduler.every("half", "500ms", noop)
    scheduler.every("hourly", "1h", noop, offset="15m")
    scheduler.cron("five", "*/5 * * * *", noop)
    scheduler.cron("athens", "0 8 * * *", noop, tz="Europe/Athens", timeout_ms=60_000,
                   jitter_ms=0, max_late_ms=5_000, overlap=True, max_attempts=2,
                   catch_up_ms=3_600_000)
    now = time.time() * 1000
    info = {j.name: j for j in scheduler.jobs()}

    ten = info["ten"]
    assert ten.schedule == "every 10s"
    assert isinstance(ten.next_slot, int)
    assert ten.next_slot % 10_000 == 0
    assert now - 1_000 < ten.next_slot <= now + 10_000
    assert ten.next_run_at == datetime.fromtimestamp(ten.next_slot / 1000, UTC)
    assert ten.options == {"timeout_ms": None, "jitter_ms": 1_000, "max_late_ms": 10_000,
                           "overlap": "skip", "max_attempts": 3, "catch_up_ms": 0,
                           "catch_up": "newest"}
    # The jitter default: at most 1 s and at most 10 % of the gap between slots.
    assert info["one"].options["jitter_ms"] == 100
    assert info["one"].options["max_late_ms"] == 1_100  # never below jitter + 1 s
    assert info["half"].options["jitter_ms"] == 50
    assert info["five"].options["jitter_ms"] == 1_000
    assert info["five"].options["max_late_ms"] == 60_000
    assert info["hourly"].schedule == "every 1h offset 15m"
    assert info["hourly"].next_slot % 3_600_000 == 900_000
    for name, gap in (("ten", 10_000), ("one", 1_000), ("half", 500), ("five", 300_000),
                      ("hourly", 3_600_000)):
        jitter = info[name].options["jitter_ms"]
        assert jitter <= 1_000
        assert jitter <= gap // 10
    athens = info["athens"]
    assert athens.schedule == "cron 0 8 * * * Europe/Athens"
    local = datetime.fromtimestamp(athens.next_slot / 1000, UTC).astimezone(
        ZoneInfo("Europe/Athens"))
    assert (local.hour, local.minute, local.second) == (8, 0, 0)
    assert athens.options == {"timeout_ms": 60_000, "jitter_ms": 0, "max_late_ms": 5_000,
                              "overlap": "allow", "max_attempts": 2, "catch_up_ms": 3_600_000,
                              "catch_up": "newest"}


# ------------------------------------------------------------------ run_now and history


async def test_run_now_is_manual_and_history_is_newest_first(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    seen: list[JobContext] = []

    @scheduler.every("report", "1h")
    async def report(ctx: JobContext) -> None:
        seen.append(ctx)

    try:
        first = await scheduler.run_now("report")
        await asyncio.sleep(0.01)
        second = await scheduler.run_now("report")
        assert isinstance(first, Run)
        for run in (first, second):
            assert (run.job, run.status, run.manual, run.attempt) == ("report", "success",
                                                                      True, 1)
            assert run.runner == "host:1"
            assert run.error is None
            assert run.duration_ms is not None
            assert run.duration_ms >= 0
        assert second.slot > first.slot
        history = await scheduler.history("report")
        assert [(r.slot, r.status, r.manual) for r in history] == [
            (second.slot, "success", True), (first.slot, "success", True)]
        assert all(ctx.manual for ctx in seen)
        assert len(await scheduler.history("report", limit=1)) == 1
        with pytest.raises(ConfigError, match="invalid limit 0"):
            await scheduler.history("report", limit=0)
        with pytest.raises(ConfigError, match=r"unknown job 'nope'; registered: \['report'\]"):
            await scheduler.run_now("nope")
    finally:
        await scheduler.stop()


async def test_history_from_a_reader_with_no_jobs(tmp_path: Path) -> None:
    writer = make(tmp_path)
    writer.every("report", "1h", noop)
    try:
        run = await writer.run_now("report")
    finally:
        await writer.stop()
    reader = make(tmp_path, instance_id="reader:1")
    try:
        history = await reader.history("report")
        assert [(r.slot, r.status, r.runner) for r in history] == [
            (run.slot, "success", "host:1")]
        assert await reader.history("never-registered") == []
    finally:
        await reader.stop()


async def test_ctx_fields_for_manual_and_scheduled_runs(tmp_path: Path) -> None:
    scheduler = make(tmp_path, instance_id="ctx:7")
    seen: list[JobContext] = []

    @scheduler.every("tick", "1s")
    async def tick(ctx: JobContext) -> None:
        seen.append(ctx)

    try:
        run = await scheduler.run_now("tick")
        manual = seen[0]
        assert manual.manual is True
        assert manual.slot == run.slot
        await scheduler.start()
        scheduled = await await_until(lambda: next((c for c in seen if not c.manual), None), 5,
                                   "a scheduled run")
        # Its end recorded before stop(): a stop meanwhile would cancel it (cancelled=True).
        deadline = time.monotonic() + 5
        while not any(r.slot == scheduled.slot and r.status == "success"
                      for r in await scheduler.backend.history("tick", 50)):
            assert time.monotonic() < deadline, "the scheduled run's end was not recorded"
            await asyncio.sleep(0.02)
    finally:
        await scheduler.stop()
    for ctx in (manual, scheduled):
        assert ctx.job == "tick"
        assert isinstance(ctx.slot, int)
        assert ctx.scheduled_at == datetime.fromtimestamp(ctx.slot / 1000, UTC)
        assert ctx.scheduled_at.utcoffset() == timedelta(0)
        assert ctx.attempt == 1
        assert ctx.instance_id == "ctx:7"
        assert isinstance(ctx.token, str)
        assert len(ctx.token) >= 16
        assert ctx.cancelled is False
    assert manual.token != scheduled.token
    assert scheduled.manual is False
    assert scheduled.slot % 1000 == 0


# ------------------------------------------------------------------ failures and timeouts


async def test_raising_handlers_fail_with_the_exception_text(tmp_path: Path) -> None:
    scheduler = make(tmp_path)

    @scheduler.every("async-boom", "1h")
    async def async_boom(ctx: JobContext) -> None:
        raise ValueError("boom: disk full")

    @scheduler.every("sync-boom", "1h")
    def sync_boom(ctx: JobContext) -> None:
        raise KeyError("missing")

    try:
        run = await scheduler.run_now("async-boom")
        assert (run.status, run.error) == ("failed", "ValueError: boom: disk full")
        run = await scheduler.run_now("sync-boom")
        assert (run.status, run.error) == ("failed", "KeyError: 'missing'")
        (entry,) = await scheduler.history("async-boom")
        assert (entry.status, entry.error) == ("failed", "ValueError: boom: disk full")
        (entry,) = await scheduler.history("sync-boom")
        assert (entry.status, entry.error) == ("failed", "KeyError: 'missing'")
    finally:
        await scheduler.stop()


async def test_timeout_fails_async_and_sync_handlers(tmp_path: Path) -> None:
    """The async and the cooperative handler would work for 2 minutes: the timeout ends
    them (the run returns long before). The stubborn one ignores the flag: its run ends
    once its code returns, failed all the same."""
    scheduler = make(tmp_path)

    @scheduler.every("async-slow", "1h", timeout_ms=200)
    async def async_slow(ctx: JobContext) -> None:
        await asyncio.sleep(120)

    @scheduler.every("sync-cooperative", "1h", timeout_ms=200)
    def sync_cooperative(ctx: JobContext) -> None:
        for _ in range(12_000):
            ctx.raise_if_cancelled()
            time.sleep(0.01)

    @scheduler.every("sync-stubborn", "1h", timeout_ms=200)
    def sync_stubborn(ctx: JobContext) -> None:
        time.sleep(1.5)  # ignores the flag: the run waits for the code to return

    try:
        for name in ("async-slow", "sync-cooperative", "sync-stubborn"):
            run = await asyncio.wait_for(scheduler.run_now(name), 30)
            assert (run.status, run.error) == ("failed", "timeout"), name
            (entry,) = await scheduler.history(name)
            assert (entry.status, entry.error) == ("failed", "timeout"), name
    finally:
        await scheduler.stop()


async def test_timeout_of_a_sync_handler_that_returns_when_flagged(tmp_path: Path) -> None:
    scheduler = make(tmp_path)

    @scheduler.every("sync-returns", "1h", timeout_ms=200)
    def sync_returns(ctx: JobContext) -> None:
        ctx.cancel_event.wait(5)

    try:
        run = await scheduler.run_now("sync-returns")
        assert (run.status, run.error) == ("failed", "timeout")
    finally:
        await scheduler.stop()


async def test_stop_sets_the_cancel_flag_of_a_sync_handler(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    started = threading.Event()
    observed: dict[str, Any] = {}

    @scheduler.every("long", "1s", jitter_ms=0)
    def long(ctx: JobContext) -> None:
        started.set()
        observed["flag_seen"] = ctx.cancel_event.wait(10)
        observed["cancelled"] = ctx.cancelled
        observed["slot"] = ctx.slot
        ctx.raise_if_cancelled()

    await scheduler.start()
    try:
        assert await asyncio.to_thread(started.wait, 5)
    finally:
        # Returns once the handler has (it saw the flag), not at the end of the grace.
        await asyncio.wait_for(scheduler.stop(grace_ms=60_000), 20)
    assert observed["flag_seen"] is True
    assert observed["cancelled"] is True
    reader = make(tmp_path, instance_id="reader:1")
    try:
        history = await reader.history("long")
        entry = next(r for r in history if r.slot == observed["slot"])
        assert entry.status == "interrupted"  # handed over, not success
    finally:
        await reader.stop()


# ------------------------------------------------------------------ lifecycle


async def test_async_with_starts_and_stops(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    ran = asyncio.Event()

    @scheduler.every("tick", "1s")
    async def tick(ctx: JobContext) -> None:
        ran.set()

    assert not scheduler.running
    async with scheduler as entered:
        assert entered is scheduler
        assert scheduler.running
        await asyncio.wait_for(ran.wait(), 5)
    assert not scheduler.running


async def test_sync_twin_inside_the_running_loop_raises(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    scheduler.every("tick", "1h", noop)
    await scheduler.start()
    try:
        with pytest.raises(RuntimeError, match="await the coroutine method instead"):
            scheduler.sync.history("tick")
        with pytest.raises(RuntimeError, match="await the coroutine method instead"):
            scheduler.sync.run_now("tick")
    finally:
        await scheduler.stop()


def test_sync_twins_from_plain_threads(tmp_path: Path) -> None:
    scheduler = make(tmp_path)
    ticks: list[int] = []

    @scheduler.every("tick", "1s")
    def tick(ctx: JobContext) -> None:
        if not ctx.manual:
            ticks.append(ctx.slot)

    scheduler.sync.start()
    try:
        assert scheduler.running
        run = scheduler.sync.run_now("tick", timeout=10)
        assert (run.status, run.manual) == ("success", True)
        results: dict[str, Any] = {}

        def from_a_thread() -> None:
            results["run"] = scheduler.sync.run_now("tick", timeout=10)
            results["history"] = scheduler.sync.history("tick", 50)

        worker = threading.Thread(target=from_a_thread)
        worker.start()
        worker.join(15)
        assert not worker.is_alive()
        assert results["run"].status == "success"
        assert results["run"].slot in [r.slot for r in results["history"]]
        deadline = time.monotonic() + 5
        while not ticks and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ticks, "the scheduler thread did not run the scheduled job"
    finally:
        scheduler.sync.stop()
    assert not scheduler.running
    history = scheduler.sync.history("tick", 50)  # a reader again, on a fresh loop thread
    try:
        assert {r.slot for r in history if not r.manual} >= {ticks[0]}
        assert sum(r.manual for r in history) == 2
    finally:
        scheduler.sync.stop()


def test_run_forever_stops_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "service.py"
    marker = tmp_path / "ran.txt"
    script.write_text(textwrap.dedent("""
        import pathlib
        import sys

        from anarchon_core import Scheduler
        from anarchon_core.backends.sqlite import SqliteBackend

        marker = pathlib.Path(sys.argv[2])
        scheduler = Scheduler(SqliteBackend(sys.argv[1]), instance_id="sig:1")

        @scheduler.every("beat", "1s")
        def beat(ctx):
            marker.write_text(str(ctx.slot))

        scheduler.run_forever()
        print("stopped cleanly", flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "sig.db"),
                             str(marker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 15
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.stderr.read() if proc.poll() is not None else "no run"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, err
    assert "stopped cleanly" in out


# ------------------------------------------------------------------ catch-up


def offset_for(ago_ms: int) -> str:
    """An hourly grid offset whose latest slot was ``ago_ms`` before now."""
    return f"{(round(time.time() * 1000) - ago_ms) % 3_600_000}ms"


async def test_catch_up_runs_the_missed_slot_once(tmp_path: Path) -> None:
    offset = offset_for(5_000)
    first_runs: list[int] = []
    first = make(tmp_path, instance_id="first:1")

    @first.every("nightly", "1h", offset=offset, catch_up_ms=60_000)
    async def nightly(ctx: JobContext) -> None:
        first_runs.append(ctx.slot)

    missed = first._jobs["nightly"].schedule.latest_at_or_before(round(time.time() * 1000))
    async with first:
        await await_until(lambda: first_runs, 5, "the catch-up run")
        await asyncio.sleep(0.3)
    assert first_runs == [missed]

    later_runs: list[int] = []
    later = make(tmp_path, instance_id="later:1")
    later.every("nightly", "1h", lambda ctx: later_runs.append(ctx.slot), offset=offset,
                catch_up_ms=60_000)
    async with later:
        await asyncio.sleep(1.0)
        history = await later.history("nightly")
    assert later_runs == []
    assert [(r.slot, r.status, r.runner, r.manual) for r in history] == [
        (missed, "success", "first:1", False)]


async def test_no_catch_up_beyond_the_window_or_without_the_option(tmp_path: Path) -> None:
    runs: list[str] = []
    scheduler = make(tmp_path)
    scheduler.every("old", "1h", lambda ctx: runs.append("old"), offset=offset_for(1_800_000),
                    catch_up_ms=600_000)
    scheduler.every("no-option", "1h", lambda ctx: runs.append("no-option"),
                    offset=offset_for(5_000))
    async with scheduler:
        await asyncio.sleep(1.0)
        assert await scheduler.history("old") == []
        assert await scheduler.history("no-option") == []
    assert runs == []


# ------------------------------------------------------------------ choosing the backend


async def test_anarchon_url_selects_the_backend(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANARCHON_URL", f"sqlite:///{tmp_path}/env.db?table=env_runs")
    scheduler = Scheduler(instance_id="env:1")
    assert isinstance(scheduler.backend, SqliteBackend)
    assert (scheduler.backend.path, scheduler.backend.table) == (f"{tmp_path}/env.db",
                                                                 "env_runs")
    scheduler.every("job", "1h", noop)
    try:
        run = await scheduler.run_now("job")
    finally:
        await scheduler.stop()
    # The run landed in that file and table, as an explicitly built backend reads it.
    monkeypatch.delenv("ANARCHON_URL")
    reader = Scheduler(f"sqlite:///{tmp_path}/env.db?table=env_runs")
    try:
        assert [r.slot for r in await reader.history("job")] == [run.slot]
    finally:
        await reader.stop()
