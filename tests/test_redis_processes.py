"""Real instance processes on Redis: every strategy exactly once, and a store restart.

Takeover after SIGKILL, fencing after SIGSTOP, hand-over, overlap and lateness on Redis,
Valkey and the Redis Cluster are in tests/test_processes_lease.py, which runs on every
lease store of tests/stores/ (this package's ``redis``, ``valkey`` and ``redis-cluster``).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from .stores.redis import SHARED_URL, start_server
from .support.procs import (
    JobSpec,
    assert_exactly_once,
    grid_slots,
    now_ms,
    read_history,
    start_instances,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.mark.parametrize("strategy", ["lease", "stream-id", "script"])
def test_four_processes_run_every_slot_exactly_once(strategy: str, namespace: str,
                                                    tmp_path: Path) -> None:
    url = f"{SHARED_URL}?prefix={namespace}:&strategy={strategy}"
    jobs = [JobSpec("tick", every="1s", sleep_s=0.2),
            JobSpec("tock", every="1s", sleep_s=0.1, sync=True)]
    with start_instances(url, jobs, 4, tmp_path) as cluster:
        cluster.wait_ready()
        begin = now_ms() + 1_500
        time.sleep(15)
        end = now_ms() - 1_500
        cluster.stop_all()
        entries = cluster.ledger()
    for job in ("tick", "tock"):
        history = read_history(url, job)
        report = assert_exactly_once(entries, job, history=history, between=(begin, end))
        missing = sorted(set(grid_slots(1_000, begin, end)) - set(report.slots))
        assert not missing, f"{strategy} {job}: slots that never ran: {missing}"
        runners = {e.instance for e in entries if e.job == job and e.event == "end"}
        assert len(runners) >= 2, f"{strategy} {job}: jitter should spread the runs"
        assert {r.status for r in history if begin <= r.slot <= end} == {"success"}


@pytest.mark.parametrize("strategy", ["lease", "script"])
def test_scheduler_reconnects_after_the_store_restarts(strategy: str, namespace: str,
                                                       tmp_path: Path) -> None:
    # Persistent on purpose: a restart must not forget which runs were claimed.
    server = start_server(tmp_path / "redis", args=["--appendonly", "yes",
                                                    "--appendfsync", "always"])
    try:
        url = f"{server.url}?prefix={namespace}:&strategy={strategy}"
        jobs = [JobSpec("tick", every="1s", sleep_s=0.05)]
        with start_instances(url, jobs, 3, tmp_path / "fleet") as cluster:
            cluster.wait_ready()
            time.sleep(4)
            server.stop()
            down_at = now_ms()
            time.sleep(2)
            server.start()
            up_at = now_ms()
            time.sleep(7)
            alive = [i.alive for i in cluster.instances]
            cluster.stop_all()
            entries = cluster.ledger()
        history = read_history(url, "tick")
    finally:
        server.stop()
    assert all(alive), "an instance died when the store went away"
    successes = Counter(r.slot for r in history if r.status == "success" and not r.manual)
    doubled = {slot: n for slot, n in successes.items() if n > 1}
    assert not doubled, f"slots with two successes: {doubled}"
    before = [s for s in successes if s < down_at]
    after = [s for s in successes if s > up_at + 1_000]
    assert len(before) >= 2, "runs before the restart are kept (AOF)"
    assert len(after) >= 4, f"the scheduler did not go on after the restart: {sorted(successes)}"
    # every slot the handlers finished after the restart is recorded exactly once
    ended_after = Counter(e.slot for e in entries if e.event == "end" and e.slot > up_at + 1_000)
    assert all(n == 1 for n in ended_after.values()), ended_after
    assert set(ended_after) == set(after)
