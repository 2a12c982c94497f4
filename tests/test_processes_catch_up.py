"""Catch-up after the whole fleet was down, with real processes on every lease store.

Two instances run a job ``every 2s`` with ``catch_up_ms`` 30 s, then both are stopped
(SIGTERM) for 7 s, and two new instances start. Each policy runs at once in its own
namespace:

* ``all``: every slot missed while the fleet was down runs once across the new
  instances, oldest first, each with ``missed_count`` 1; with the slots after it, every
  slot from the last one run before the stop on has exactly one success.
* ``newest``: only the newest missed slot runs, standing for all of them
  (``missed_count``); the older ones never run.
* ``none``: no missed slot runs.

Judged by the ledger the handlers write and the store's ``history()``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anarchon_core import Run

from .stores import StoreHandle, all_specs
from .support.procs import (
    Cluster,
    InstanceJob,
    assert_exactly_once,
    grid_slots,
    now_ms,
    read_history,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

GAP_MS = 2_000
DOWN_S = 7.0
#: How long the new instances run after they are ready.
AFTER_S = 6.0
JOB = "job"
POLICIES = ("all", "newest", "none")
STORE_IDS = [s.id for s in all_specs() if s.leases and s.persistent]


def catch_up_job(policy: str) -> InstanceJob:
    return InstanceJob(JOB, every="2s", options={"catch_up": policy, "catch_up_ms": 30_000,
                                                 "jitter_ms": 0})


def successes(history: list[Run]) -> dict[int, list[Run]]:
    out: dict[int, list[Run]] = {}
    for run in history:
        if run.status == "success" and not run.manual:
            out.setdefault(run.slot, []).append(run)
    return out


@pytest.mark.parametrize("store_id", STORE_IDS)
def test_each_policy_after_the_fleet_was_down(
        store_id: str, store_handles: Callable[[str], StoreHandle], namespace: str,
        tmp_path: Path) -> None:
    handle = store_handles(store_id)
    assert handle.url is not None
    urls = {p: handle.url(f"{namespace}{p}") for p in POLICIES}
    with contextlib.ExitStack() as stack:
        clusters = {p: stack.enter_context(Cluster(urls[p], [catch_up_job(p)], tmp_path / p,
                                                   lease_ms=6_000, heartbeat_ms=2_000))
                    for p in POLICIES}
        for cluster in clusters.values():
            cluster.add()
            cluster.add()
        for cluster in clusters.values():
            cluster.wait_ready()
        deadline = time.monotonic() + 20
        while not all(any(e.event == "end" for e in c.ledger()) for c in clusters.values()):
            assert time.monotonic() < deadline, "no run ended before the stop"
            time.sleep(0.05)
        for cluster in clusters.values():
            cluster.stop_all()
        last_before = {p: max(e.slot for e in c.ledger() if e.event == "start")
                       for p, c in clusters.items()}
        time.sleep(DOWN_S)
        restarted = now_ms()
        for cluster in clusters.values():
            cluster.add()
            cluster.add()
        for cluster in clusters.values():
            cluster.wait_ready()
        ready = now_ms()
        time.sleep(AFTER_S)
        for cluster in clusters.values():
            cluster.stop_all()
        ended = now_ms()
        ledgers = {p: c.ledger() for p, c in clusters.items()}
    histories = {p: read_history(urls[p], JOB) for p in POLICIES}

    # all: every slot from the stop on, once; the missed ones caught up oldest first.
    last, history = last_before["all"], histories["all"]
    assert_exactly_once(ledgers["all"], JOB, history=history)
    done = successes(history)
    never = [s for s in grid_slots(GAP_MS, last + 1, ended - 2 * GAP_MS) if s not in done]
    assert not never, (f"slots that never ran: {never}; last {last}, restarted {restarted}, "
                       f"ready {ready}, ended {ended}: "
                       f"{[(r.slot, r.status, r.error) for r in history if r.slot in never]}")
    missed = grid_slots(GAP_MS, last + 1, restarted)
    assert len(missed) >= 3, missed
    for slot in missed:
        [run] = done[slot]
        assert run.meta.get("catch_up") == "all", (slot, run.meta)
        assert run.meta.get("missed_count") == "1", (slot, run.meta)
    started = sorted((min(r.started_at for r in done[s] if r.started_at), s) for s in missed)
    assert [s for _, s in started] == missed, "not caught up oldest first"

    # newest: one run stands for the slots missed before it; they never run.
    last, done = last_before["newest"], successes(histories["newest"])
    caught = [s for s, runs in done.items()
              if s > last and runs[0].meta.get("catch_up") == "newest"]
    assert len(caught) == 1, {s: [r.meta for r in done[s]] for s in done if s > last}
    [newest] = caught
    assert restarted - GAP_MS < newest <= ready, (newest, restarted, ready)
    count = len(grid_slots(GAP_MS, last + 1, newest))
    assert done[newest][0].meta.get("missed_count") == str(count)
    assert not [s for s in done if last < s < newest]
    assert all(len(runs) == 1 for runs in done.values())

    # none: nothing missed runs; the job goes on from its next slot.
    last, done = last_before["none"], successes(histories["none"])
    assert not [s for s in done if last < s <= restarted - GAP_MS], sorted(done)
    assert not [r for runs in done.values() for r in runs if "catch_up" in r.meta]
    assert [s for s in done if s > ready], "the job did not go on after the start"
