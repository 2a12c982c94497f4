"""Operating a fleet: pause/resume, the fleet view, backfill, the dead-man check, metrics
over HTTP, and log volume during a store outage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from anarchon_core import (
    ClaimOutcome,
    ClaimRequest,
    ConfigError,
    JobContext,
    NotClaimed,
    RunRef,
    Scheduler,
    new_token,
)
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.deadman import judge_silence
from anarchon_core.models import Run
from anarchon_core.schedules import EverySchedule, ms_to_datetime
from anarchon_core.testing import MemoryBackend

from .stores import StoreHandle
from .support.clock import LoopClock
from .support.helpers import free_port, start_redis
from .support.procs import (
    InstanceJob,
    await_until,
    now_ms,
    read_history,
    start_instances,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def anarchon(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "anarchon_core", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, check=False)



# ------------------------------------------------------------------------- pause

@pytest.mark.looptime
async def test_a_paused_job_is_recorded_skipped_once_per_slot_and_resumes() -> None:
    clock = LoopClock()  # virtual time: the pause, the skipped slots, the resume
    store = MemoryBackend(clock.store_ms)
    scheduler = Scheduler(store, instance_id="a", lease_ms=2_000, clock=clock)
    operator = Scheduler(store.reader(), instance_id="ops", clock=clock)
    ran: list[int] = []

    @scheduler.every("tick", "200ms", jitter_ms=0)
    async def tick(ctx: JobContext) -> None:
        ran.append(ctx.slot)

    scheduler.define("sent-by-caller")
    await scheduler.start()
    try:
        await await_until(lambda: ran, 5, "a run")
        # A read-only operator cannot pause; the scheduler itself can.
        with pytest.raises(Exception, match="read"):
            await operator.pause("tick")
        info = await scheduler.pause("tick", reason="maintenance")
        assert (info.job, info.by, info.reason) == ("tick", "a", "maintenance")
        assert set(await operator.paused()) == {"tick"}
        count = len(ran)
        await asyncio.sleep(0.6)
        assert len(ran) == count, "a paused job ran"
        await scheduler.pause("sent-by-caller")
        slot = round(clock.time() * 1000)
        refused = await scheduler.try_claim("sent-by-caller", slot)
        assert isinstance(refused, NotClaimed)
        assert refused.outcome is ClaimOutcome.PAUSED
        assert "paused by a" in refused.reason
        assert await scheduler.resume("tick") is True
        assert await scheduler.resume("tick") is False
        await await_until(lambda: len(ran) > count, 5, "runs after resume")
    finally:
        await scheduler.stop()
    history = await operator.history("tick", 1_000)
    skipped = [r for r in history if r.status == "skipped"]
    assert skipped, "paused slots are recorded"
    assert {r.error for r in skipped} == {"paused"}
    assert max(Counter(r.slot for r in history).values()) == 1
    [caller] = await operator.history("sent-by-caller")
    assert (caller.slot, caller.status, caller.error) == (slot, "skipped", "paused")


def test_pause_and_status_across_three_processes(store_handles: Callable[[str], StoreHandle],
                                                 namespace: str, tmp_path: Path) -> None:
    handle = store_handles("redis")
    assert handle.url is not None
    url = handle.url(namespace)
    same = [InstanceJob("tick", every="1s", sleep_s=0.05, options={"jitter_ms": 300})]
    other = [InstanceJob("tick", every="2s", sleep_s=0.05, options={"jitter_ms": 300})]
    with start_instances(url, same, 2, tmp_path / "same") as pair, \
            start_instances(url, other, 1, tmp_path / "other") as odd:
        pair.wait_ready()
        odd.wait_ready()
        status = wait_for(lambda: (out := anarchon("status", "--backend", url)).stdout.count(
            "version") == 3 and out, 15, "3 instances in status")
        assert status.returncode == 0, status.stderr
        ids = [str(i.pid) for i in (*pair.instances, *odd.instances)]
        assert all(f":{pid}" in status.stdout for pid in ids), status.stdout
        assert "DEFINITIONS DIFFER" in status.stdout
        assert "every 2s on" in status.stdout
        assert "every 1s on" in status.stdout

        paused = anarchon("pause", "tick", "--backend", url, "--reason", "deploy")
        assert paused.returncode == 0, paused.stderr
        time.sleep(2.6)  # every instance re-reads the paused jobs within 2.4 s
        begin = now_ms()
        time.sleep(4)
        end = now_ms()
        resumed = anarchon("resume", "tick", "--backend", url)
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed" in resumed.stdout
        time.sleep(4.5)
        pair.stop_all()
        odd.stop_all()
        entries = pair.ledger() + odd.ledger()
    history = read_history(url, "tick")
    window = [r for r in history if begin <= r.slot <= end]
    assert {(r.status, r.error) for r in window} == {("skipped", "paused")}, window
    assert sorted(r.slot for r in window) == sorted({r.slot for r in window}), "twice"
    assert len(window) >= 3
    assert not [e for e in entries if e.event == "start" and begin <= e.slot <= end]
    after = [r for r in history if r.slot > end + 2_600 and r.status == "success"]
    assert after, "runs resume after resume"


# ---------------------------------------------------------------------- backfill

async def test_backfill_runs_each_past_slot_once_across_two_instances(tmp_path: Path) -> None:
    ran: Counter[int] = Counter()
    schedulers = []
    for name in ("a", "b"):
        scheduler = Scheduler(SqliteBackend(tmp_path / "store.db"), instance_id=name,
                              lease_ms=2_000)

        @scheduler.every("hourly", "1h")
        def hourly(ctx: JobContext) -> None:
            assert ctx.manual
            ran[ctx.slot] += 1

        schedulers.append(scheduler)
    a, b = schedulers
    grid = EverySchedule("1h")
    last = grid.latest_at_or_before(round(time.time() * 1000)) - 3_600_000
    slots = [last - i * 3_600_000 for i in range(6)][::-1]
    # One slot already succeeded as scheduled: backfill leaves it alone.
    await a.history("hourly")  # opens the store
    token = new_token()
    won = await a.backend.claim(ClaimRequest(job="hourly", slot=slots[2], token=token,
                                             runner="a", lease_ms=2_000, max_late_ms=None))
    assert won.won
    assert await a.backend.finish(RunRef("hourly", slots[2], token, 1), "success")
    start, end = ms_to_datetime(slots[0]), ms_to_datetime(slots[-1]) + timedelta(minutes=1)
    got = await asyncio.gather(a.backfill("hourly", start, end),
                               b.backfill("hourly", start, end))
    expected = sorted(s for s in slots if s != slots[2])
    assert sorted(r.slot for runs in got for r in runs) == expected
    assert sorted(ran) == sorted(s for s in slots if s != slots[2])
    assert set(ran.values()) == {1}
    assert await a.backfill("hourly", start, end) == []
    history = await a.history("hourly", 100)
    manual = sorted(r.slot for r in history if r.manual and r.status == "success")
    assert manual == sorted(ran)
    with pytest.raises(ConfigError, match="more than 2 slots"):
        await a.backfill("hourly", start, end, limit=2)
    with pytest.raises(ConfigError, match="start ≤ end ≤ now"):
        await a.backfill("hourly", end, start)
    with pytest.raises(ConfigError, match="naive"):
        await a.backfill("hourly", datetime(2020, 1, 1), end)
    for scheduler in schedulers:
        await scheduler.stop()


# ------------------------------------------------------------------ dead-man check

def run_at(slot: int, status: str = "success", manual: bool = False) -> Run:
    return Run(job="sync", slot=slot, attempt=1, status=status, runner="h:1",
               started_at=ms_to_datetime(slot), finished_at=ms_to_datetime(slot + 10),
               manual=manual)


def test_silence_is_judged_in_slots_or_as_a_duration() -> None:
    every = EverySchedule("10s")
    now = 1_000_000_000_000 + 5_000
    runs = [run_at(1_000_000_000_000 - 20_000, "failed"),
            run_at(1_000_000_000_000 - 30_000), run_at(now - 1, manual=True)]
    ok = judge_silence("sync", runs, max_silence=3, now_ms=now, schedule=every)
    assert (ok.exit_code, ok.state) == (0, "ok")
    assert "3 slot(s) since, within 3 (every 10s)" in ok.reason
    silent = judge_silence("sync", runs, max_silence=2, now_ms=now, schedule=every)
    assert (silent.exit_code, silent.state) == (1, "silent")
    inferred = judge_silence("sync", runs, max_silence="2", now_ms=now)
    assert inferred.exit_code == 1
    assert "inferred from history" in inferred.reason
    assert judge_silence("sync", runs, max_silence="1m", now_ms=now).exit_code == 0
    assert judge_silence("sync", runs, max_silence="30s", now_ms=now).exit_code == 1
    none_ok = judge_silence("sync", [run_at(now - 1_000, "failed")], max_silence=5,
                            now_ms=now, schedule=every)
    assert none_ok.exit_code == 1
    assert "no success" in none_ok.reason
    unknown = judge_silence("sync", [run_at(now, manual=True)], max_silence=1, now_ms=now)
    assert unknown.exit_code == 2
    assert "no scheduled run" in unknown.reason
    with pytest.raises(ConfigError, match="max_silence"):
        judge_silence("sync", runs, max_silence=0, now_ms=now)
    with pytest.raises(ConfigError, match="max_silence"):
        judge_silence("sync", runs, max_silence="soon", now_ms=now)


def test_check_command_exit_codes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"

    async def seed() -> None:
        scheduler = Scheduler(url, instance_id="h:1")
        scheduler.define("hourly", max_late_ms=10 ** 9)
        hour = 3_600_000
        latest = EverySchedule("1h").latest_at_or_before(round(time.time() * 1000))
        for slot in (latest - 4 * hour, latest - 3 * hour):
            handle = await scheduler.claim("hourly", slot)
            assert handle is not None
            await handle.finish("success")
        await scheduler.stop()

    asyncio.run(seed())
    ok = anarchon("check", "hourly", "--max-silence", "5", "--every", "1h", "--backend", url)
    assert (ok.returncode, ok.stdout.split(":")[0]) == (0, "ok"), ok
    assert ok.stdout.count("\n") == 1
    silent = anarchon("check", "hourly", "--max-silence", "1", "--every", "1h",
                      "--backend", url)
    assert silent.returncode == 1
    assert silent.stdout.startswith("silent: hourly: last success")
    assert anarchon("check", "hourly", "--max-silence", "1d", "--backend", url).returncode == 0
    unknown = anarchon("check", "nightly", "--max-silence", "1", "--backend", url)
    assert unknown.returncode == 2
    assert "no scheduled run of 'nightly'" in unknown.stdout
    down = anarchon("check", "hourly", "--max-silence", "1", "--timeout", "3",
                    "--backend", "postgresql://127.0.0.1:1/none")
    assert down.returncode == 2
    assert down.stdout.startswith("unknown: hourly: cannot read")
    bad = anarchon("check", "hourly", "--max-silence", "never", "--backend", url)
    assert bad.returncode == 2
    assert "invalid max_silence 'never'" in bad.stderr


# ----------------------------------------------------------------------- metrics

def test_metrics_are_served_over_http_by_anarchon_run(tmp_path: Path) -> None:
    (tmp_path / "metricjobs.py").write_text(textwrap.dedent(f"""
        from anarchon_core import Scheduler
        scheduler = Scheduler("sqlite:///{tmp_path / 'store.db'}", lease_ms=3000)

        @scheduler.every("tick", "1s", jitter_ms=0)
        async def tick(ctx):
            pass
    """))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen([PYTHON, "-m", "anarchon_core", "run", "metricjobs:scheduler",
                             "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        def scrape() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=2) as reply:
                    body: str = reply.read().decode()
            except OSError:
                return None
            return body if 'anarchon_runs_total{job="tick",status="success"}' in body else None

        body = wait_for(scrape, 20, "a successful run in /metrics")
        assert "anarchon_store_up 1.0" in body
        assert 'anarchon_claims_total{job="tick",outcome="won"}' in body
        assert "anarchon_start_lateness_seconds_bucket" in body
        taken = subprocess.run([PYTHON, "-m", "anarchon_core", "run", "metricjobs:scheduler",
                                "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"],
                               cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=30, check=False)
        assert taken.returncode == 2
        assert f"cannot serve metrics on 127.0.0.1:{port}" in taken.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "serving Prometheus metrics" in out


# --------------------------------------------------------------- outage logging

def test_a_store_outage_logs_a_handful_of_lines(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    server = start_redis(tmp_path / "redis")
    ran: list[int] = []

    async def main() -> None:
        scheduler = Scheduler(server.url, instance_id="h:1", lease_ms=3_000)
        for name in ("tick", "tock"):
            scheduler.every(name, "1s", lambda ctx: ran.append(ctx.slot), jitter_ms=100)

        @scheduler.every("long", "1h")
        async def long(ctx: JobContext) -> None:
            await asyncio.sleep(120)

        await scheduler.start()
        try:
            await await_until(lambda: len(ran) >= 2, 10, "runs before the outage")
            long_run = asyncio.ensure_future(scheduler.run_now("long"))
            await asyncio.sleep(0.5)
            mark = len(caplog.records)
            server.halt(crash=True)
            await asyncio.sleep(15)
            server.start()
            await await_until(lambda: any("reachable again" in r.getMessage()
                                    for r in caplog.records[mark:]), 20, "the recovery line")
            count = len(ran)
            await await_until(lambda: len(ran) > count, 10, "runs after the outage")
            lines = [r for r in caplog.records[mark:] if r.levelno >= logging.INFO
                     and r.name.startswith("anarchon") and "started on" not in r.getMessage()
                     and not r.getMessage().endswith(": success")]
            text = "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in lines)
            assert len(lines) <= 8, text
            [down, up] = [r for r in lines if r.name == "anarchon.store"]
            assert "unreachable (" in down.getMessage()
            assert "reachable again" in up.getMessage()
            assert [r for r in lines if "fenced" in r.getMessage()], "the long run was fenced"
            assert up.outage_s >= 12  # type: ignore[attr-defined]
            assert "slot(s) not run meanwhile: t" in up.getMessage()
            assert down.levelno == up.levelno == logging.WARNING
            assert scheduler.store_down is False
            long_run.cancel()
        finally:
            await scheduler.stop(grace_ms=0)

    try:
        with caplog.at_level(logging.INFO):
            asyncio.run(main())
    finally:
        server.halt(crash=True)
    assert datetime.now(UTC)  # the run above finished inside the timeout


# ----------------------------------------------------------------- missed slots

def test_slots_due_while_every_instance_was_down_are_recorded_missed_once(
        store_handles: Callable[[str], StoreHandle], namespace: str, tmp_path: Path) -> None:
    handle = store_handles("postgres")
    assert handle.url is not None
    url = handle.url(namespace)
    jobs = [InstanceJob("tick", every="1s", sleep_s=0.05, options={"jitter_ms": 200})]
    with start_instances(url, jobs, 3, tmp_path / "before") as before:
        before.wait_ready()
        wait_for(lambda: len([e for e in before.ledger() if e.event == "end"]) >= 2, 15,
                 "runs before the outage")
        before.stop_all()
    down_at = now_ms()
    time.sleep(3.5)  # every instance is down for at least 3 slots
    with start_instances(url, jobs, 3, tmp_path / "after") as after:
        after.wait_ready()
        up_at = now_ms()
        # A slot is recorded once its claim window (max_late_ms + jitter + 1 s) has closed.
        wait_for(lambda: [r for r in read_history(url, "tick") if r.status == "missed"],
                 15, "missed records")
        time.sleep(max(0.0, (up_at + 3_500 - now_ms()) / 1000))  # the last windows close
        after.stop_all()
        restarted = {e.instance for e in after.ledger()}
    history = read_history(url, "tick")
    per_slot = Counter(r.slot for r in history)
    assert max(per_slot.values()) == 1, [s for s, n in per_slot.items() if n > 1]
    last_before = max(r.slot for r in history if r.status == "success" and r.slot < down_at)
    first_after = min(r.slot for r in history if r.status == "success" and r.slot > down_at)
    gap = list(range(last_before + 1_000, first_after, 1_000))
    assert len(gap) >= 3
    records = {r.slot: r for r in history}
    assert all(s in records for s in gap), [s for s in gap if s not in records]
    missed = [records[s] for s in gap]
    assert {r.status for r in missed} == {"missed"}, missed
    assert {r.error for r in missed} == {
        "missed: no instance claimed it in time (every instance was down or could not reach "
        "the store)"}
    assert {r.runner for r in missed} <= restarted | {r.runner for r in missed}


def test_backfill_command_runs_the_range_and_reports_it(tmp_path: Path) -> None:
    (tmp_path / "filljobs.py").write_text(textwrap.dedent(f"""
        from anarchon_core import Scheduler
        scheduler = Scheduler("sqlite:///{tmp_path / 'store.db'}", instance_id="ops:1")

        @scheduler.every("daily", "1d")
        def daily(ctx):
            pass
    """))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}

    def backfill(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, "-m", "anarchon_core", "backfill", "filljobs:scheduler",
                               "daily", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    first = backfill("--from", "2026-01-01", "--to", "2026-01-03T12:00")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("(manual)") == 3
    assert "2026-01-02T00:00:00.000Z" in first.stdout
    again = backfill("--from", "2026-01-01", "--to", "2026-01-03T12:00")
    assert again.returncode == 0
    assert "nothing to backfill" in again.stdout
    wrong = backfill("--from", "yesterday", "--to", "2026-01-03")
    assert wrong.returncode == 2
    assert "expected an ISO 8601 date-time, got 'yesterday'" in wrong.stderr
