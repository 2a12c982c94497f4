"""Real APScheduler processes on real stores: each firing runs once, crashes are taken over.

Each worker (tests.apscheduler.worker) is a full APScheduler setup with an
AnarchonExecutor; job functions append to an fsynced ledger, and each worker's listener
appends the APScheduler events it received, so the tests count what users would see.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

from tests.stores import StoreHandle
from tests.support.procs import read_history

from .fleet import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    Fleet,
    cron,
    ends,
    events,
    grid,
    interval,
    now_ms,
)

pytestmark = pytest.mark.slow

#: (store, scheduler, inner executor): each store runs another APScheduler flavour.
SETUPS = [("sqlite", "background", "threadpool"), ("redis", "asyncio", "asyncio"),
          ("postgres", "blocking", "threadpool")]


def _mixed(index: int) -> dict[str, Any]:
    """One job id whose definition differs per process (a rolling deploy), same firings."""
    if index == 0:
        return cron("mixed", "*/2", grid_ms=2000)
    if index == 1:
        return interval("mixed", 2, options={"misfire_grace_time": 5, "max_instances": 3})
    return {**cron("mixed", "*/2", grid_ms=2000), "args": {"second": "*/2", "jitter": 0.8},
            "options": {"misfire_grace_time": 2}}


def _assert_once(ledger: list[dict[str, Any]], job: str, step_ms: int, lo: int, hi: int,
                 label: str) -> None:
    done = ends(ledger, job)
    twice = {s: n for s, n in done.items() if n > 1}
    assert not twice, f"{label} {job}: firings that ran twice: {twice}"
    missing = [s for s in grid(step_ms, lo, hi) if done[s] != 1]
    assert not missing, f"{label} {job}: firings that never ran: {missing}"
    for code in (EVENT_JOB_SUBMITTED, EVENT_JOB_EXECUTED):
        emitted = events(ledger, job, code)
        wrong = {s: who for s, who in emitted.items() if len(who) != 1}
        assert not wrong, f"{label} {job}: event {code} emitted by several processes: {wrong}"
        absent = [s for s in grid(step_ms, lo, hi) if s not in emitted]
        assert not absent, f"{label} {job}: no event {code} for {absent}"
    # Judged inside the window: the stop at its end cancels the runs still going (an
    # asyncio scheduler reports those as errors), as APScheduler does on any shutdown.
    for code in (EVENT_JOB_ERROR, EVENT_JOB_MISSED):
        wrong = {s: who for s, who in events(ledger, job, code).items() if lo <= s <= hi}
        assert not wrong, f"{label} {job}: unexpected event {code}: {wrong}"


def test_three_processes_run_each_firing_once_on_three_stores(
        store_handles: Callable[[str], StoreHandle], namespace: str, tmp_path: Path) -> None:
    """3 processes per store, interval (fixed start) + cron with seconds and jitter, ~20 s."""
    urls = {store: store_handles(store).url(f"{namespace}_{store[:2]}")  # type: ignore[misc]
            for store, _, _ in SETUPS}
    fleets = {store: Fleet(tmp_path / store) for store, _, _ in SETUPS}
    try:
        for store, kind, executor in SETUPS:
            for index in range(3):
                jobs = [interval("tick", 1, sleep_s=0.2),
                        {**cron("cron", "*/2", grid_ms=2000),
                         "args": {"second": "*/2", "jitter": 0.5}},
                        _mixed(index)]
                fleets[store].start(f"{store}-{index}", {
                    "backend": urls[store], "scheduler": kind, "executor": executor,
                    "jobs": jobs})
        for fleet in fleets.values():
            fleet.wait_ready(60)
        lo = now_ms() + 2_000
        time.sleep(20)
        hi = now_ms() - 2_000
        for fleet in fleets.values():
            fleet.stop_all()
        for store, _, _ in SETUPS:
            fleet = fleets[store]
            ledger = fleet.ledger()
            label = f"[{store}]"
            try:
                _assert_once(ledger, "tick", 1000, lo, hi, label)
                _assert_once(ledger, "cron", 2000, lo, hi, label)
                _assert_once(ledger, "mixed", 2000, lo, hi, label)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{fleet.logs()}") from None
            runners = {e["instance"] for e in ledger if e["event"] == "end" and
                       e.get("job") == "cron"}
            assert len(runners) >= 2, f"{label} APScheduler's jitter should spread the " \
                                      f"cron firings, all ran on {runners}"
            history = read_history(urls[store], "tick")
            successes = [r.slot for r in history if r.status == "success"]
            assert len(successes) == len(set(successes)), f"{label} two successes for a slot"
            assert set(successes) == set(ends(ledger, "tick")), f"{label} history ≠ ledger"
    finally:
        for fleet in fleets.values():
            fleet.kill_all()


def test_sigkill_mid_run_the_others_go_on_and_take_the_run_over(
        store_handles: Callable[[str], StoreHandle], namespace: str, tmp_path: Path) -> None:
    url = store_handles("sqlite").url(namespace)  # type: ignore[misc]
    with Fleet(tmp_path) as fleet:
        for index in range(3):
            fleet.start(f"w{index}", {
                "backend": url, "scheduler_options": {"lease_ms": 1500},
                "jobs": [interval("long", 8, sleep_s=4.0), interval("tick", 1)]})
        fleet.wait_ready(60)
        lo = now_ms() + 1_000
        deadline = time.monotonic() + 20
        victim = None
        while victim is None and time.monotonic() < deadline:
            starts = [e for e in fleet.ledger() if e["event"] == "start" and
                      e.get("job") == "long" and e["slot"] >= lo]
            if starts:
                victim = starts[0]
            time.sleep(0.1)
        assert victim is not None, f"no run of 'long' started\n{fleet.logs()}"
        time.sleep(1.0)
        fleet.workers[victim["instance"]].kill()
        killed_at = now_ms()
        time.sleep(9)
        hi = now_ms() - 1_500
        fleet.stop_all()
        ledger = fleet.ledger()
    slot = victim["slot"]
    runs = [e for e in ledger if e.get("job") == "long" and e.get("slot") == slot]
    finished = [e for e in runs if e["event"] == "end"]
    assert len(finished) == 1, f"slot {slot}: {runs}\n{fleet.logs()}"
    taker = finished[0]
    assert taker["instance"] != victim["instance"], runs
    assert taker["attempt"] == 2, runs
    started = min(e["t"] for e in runs if e["event"] == "start" and e["attempt"] == 2)
    assert started * 1000 - killed_at < 4_000, "the takeover should follow the lease (1.5 s)"
    submitted = events(ledger, "long", EVENT_JOB_SUBMITTED)[slot]
    executed = events(ledger, "long", EVENT_JOB_EXECUTED)[slot]
    assert executed == [taker["instance"]], executed
    assert victim["instance"] in submitted, submitted
    assert taker["instance"] in submitted, submitted
    done = ends(ledger, "tick")
    assert not {s: n for s, n in done.items() if n > 1}, "a tick ran twice"
    missing = [s for s in grid(1000, lo, hi) if done[s] != 1]
    assert not missing, f"ticks that never ran after the kill: {missing}\n{fleet.logs()}"
    history = read_history(url, "long")
    attempts = {r.attempt: r.status for r in history if r.slot == slot}
    assert attempts == {1: "interrupted", 2: "success"}, attempts


def test_process_pool_inner_executor(store_handles: Callable[[str], StoreHandle],
                                     namespace: str, tmp_path: Path) -> None:
    url = store_handles("redis").url(namespace)  # type: ignore[misc]
    with Fleet(tmp_path) as fleet:
        for index in range(2):
            fleet.start(f"p{index}", {"backend": url, "executor": "processpool",
                                      "jobs": [interval("pp", 2, sleep_s=0.1)]})
        fleet.wait_ready(60)
        lo = now_ms() + 4_000
        time.sleep(14)
        hi = now_ms() - 2_000
        fleet.stop_all()
        ledger = fleet.ledger()
    pids = {e["pid"] for e in ledger if e["event"] == "end"}
    workers = {w.proc.pid for w in fleet.workers.values()}
    assert pids, "nothing ran"
    assert not pids & workers, "the job should run in the pools' processes"
    try:
        _assert_once(ledger, "pp", 2000, lo, hi, "[process pool]")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet.logs()}") from None


def test_job_added_at_run_time_runs_once_although_its_adder_is_down(
        store_handles: Callable[[str], StoreHandle], namespace: str, tmp_path: Path) -> None:
    url = store_handles("postgres").url(namespace)  # type: ignore[misc]
    jobstore = f"sqlite:///{tmp_path / 'jobs.db'}"
    # Processes starting together would race to create the table (APScheduler's own race).
    inner = SQLAlchemyJobStore(url=jobstore, tablename=f"{namespace}_jobs")
    inner.jobs_t.create(inner.engine, checkfirst=True)
    inner.engine.dispose()
    with Fleet(tmp_path) as fleet:
        for index in range(3):
            fleet.start(f"s{index}", {"backend": url, "jobstore": jobstore,
                                      "jobstore_table": f"{namespace}_jobs",
                                      "sync_interval": 0.5})
        fleet.wait_ready(60)
        run_date = datetime.now(UTC) + timedelta(seconds=5)
        fleet.command("s0", op="add", job={"id": "once", "trigger": "date",
                                           "args": {"run_date": run_date.isoformat()}})
        fleet.command("s0", op="add", job=cron("added", "*"))
        added_at = now_ms()
        time.sleep(2.5)
        fleet.workers["s0"].kill()
        time.sleep(5.5)
        fleet.command("s1", op="pause", id="added")
        time.sleep(4)
        fleet.stop_all()
        ledger = fleet.ledger()
    logs = fleet.logs()
    once = [e for e in ledger if e.get("job") == "once" and e["event"] == "end"]
    assert len(once) == 1, f"{once}\n{logs}"
    assert once[0]["instance"] != "s0", once
    paused = [e["t"] for e in ledger if e["event"] == "control" and e["op"] == "pause"]
    assert paused, logs
    paused_ms = int(paused[0] * 1000)
    done = ends(ledger, "added")
    assert not {s: n for s, n in done.items() if n > 1}, f"'added' ran twice: {done}"
    missing = [s for s in grid(1000, added_at + 1_500, paused_ms - 500) if done[s] != 1]
    assert not missing, f"'added' firings that never ran: {missing}\n{logs}"
    after = [s for s in done if s > paused_ms + 1_500]
    assert not after, f"'added' ran after it was paused on another process: {after}"
    assert any(e["instance"] != "s0" for e in ledger if e["event"] == "end" and
               e.get("job") == "added"), "the survivors should run the job s0 added"


def test_interval_with_a_first_run_time_set_by_hand_runs_each_interval_once(
        store_handles: Callable[[str], StoreHandle], namespace: str, tmp_path: Path) -> None:
    """``add_job(..., next_run_time=now)``: each process's run times are off the grid by
    its own amount, and all of them fall in one slot per interval."""
    url = store_handles("postgres").url(namespace)  # type: ignore[misc]
    with Fleet(tmp_path) as fleet:
        for index in range(3):
            fleet.start(f"n{index}", {"backend": url, "jobs": [
                {**interval("sync", 3, sleep_s=0.1), "first_run_now": True}]})
            time.sleep(0.4)
        fleet.wait_ready(60)
        lo = now_ms() + 3_000
        time.sleep(18)
        hi = now_ms() - 3_000
        fleet.stop_all()
        ledger = fleet.ledger()
    logs = fleet.logs()
    # By the real time each run started: one run per interval, whichever process it was.
    started = [e for e in ledger if e["event"] == "start" and e.get("job") == "sync"]
    cells = grid(3000, lo, hi - 3000)
    assert len(cells) >= 3, (lo, hi)
    per_cell = {cell: [e["instance"] for e in started if cell <= e["t"] * 1000 < cell + 3000]
                for cell in cells}
    wrong = {cell: who for cell, who in per_cell.items() if len(who) != 1}
    assert not wrong, f"intervals not run exactly once (interval → runners): {wrong}\n{logs}"
    assert all(e["slot"] % 3000 == 0 for e in started), [e["slot"] for e in started]
    done = ends(ledger, "sync")
    assert not {s: n for s, n in done.items() if n > 1}, f"a slot ran twice: {done}"
    missed = [e for e in ledger if e["event"] == "aps" and e.get("job") == "sync"
              and e["code"] in (EVENT_JOB_MISSED, EVENT_JOB_ERROR)]
    assert not missed, f"the off-grid run times were judged late or failed: {missed}\n{logs}"
