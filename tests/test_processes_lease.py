"""Real processes racing on every lease store: exactly once, takeover, fencing, hand-over.

Each test starts instance processes (``anarchon_core.cli.instance``) on one store and
judges by two independent records: the ledger the handlers write (fsynced) and the
store's ``history()``.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from .stores import StoreHandle, StoreSpec
from .support.procs import (
    Cluster,
    InstanceJob,
    LedgerEntry,
    assert_exactly_once,
    check_every_slot_runs_once,
    now_ms,
    read_history,
    start_instances,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def url_of(store: tuple[StoreSpec, StoreHandle], namespace: str) -> str:
    handle = store[1]
    assert handle.url is not None
    return handle.url(namespace)



def started(cluster: Cluster, job: str, attempt: int = 1) -> LedgerEntry | None:
    return next((e for e in cluster.ledger() if e.job == job and e.event == "start"
                 and e.attempt == attempt), None)


def test_four_processes_run_every_slot_exactly_once(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path
) -> None:
    check_every_slot_runs_once(url_of(persistent_lease_store, namespace), tmp_path)


def test_takeover_after_sigkill(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path
) -> None:
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("long", every="6s", sleep_s=3.0)]
    with start_instances(url, jobs, 3, tmp_path, lease_ms=1_500, heartbeat_ms=500) as cluster:
        cluster.wait_ready()
        first = wait_for(lambda: started(cluster, "long"), 15, "a run to start")
        victim = next(i for i in cluster.instances if i.pid == first.pid)
        time.sleep(0.5)
        victim.kill()
        killed_at = now_ms()
        second = wait_for(lambda: started(cluster, "long", attempt=2), 10, "the takeover")
        assert second.slot == first.slot
        assert second.pid != first.pid
        wait_for(lambda: any(e.event == "end" and e.attempt == 2 for e in cluster.ledger()),
                 10, "attempt 2 to finish")
        cluster.stop_all()
        entries = cluster.ledger()
    delay = second.time_ms - killed_at
    assert delay < 1_500 + 2 * 500 * 2 + 1_000, f"takeover took {delay} ms"
    runs = [r for r in read_history(url, "long") if r.slot == first.slot]
    assert [(r.attempt, r.status) for r in runs] == [(2, "success"), (1, "interrupted")]
    assert runs[1].runner == first.instance
    assert runs[0].runner == second.instance
    assert_exactly_once(entries, "long", history=read_history(url, "long"))


def test_paused_runner_is_fenced_after_takeover(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path
) -> None:
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("long", every="8s", sleep_s=2.5)]
    with start_instances(url, jobs, 3, tmp_path, lease_ms=1_500, heartbeat_ms=500) as cluster:
        cluster.wait_ready()
        first = wait_for(lambda: started(cluster, "long"), 15, "a run to start")
        zombie = next(i for i in cluster.instances if i.pid == first.pid)
        time.sleep(0.3)
        zombie.pause()
        wait_for(lambda: started(cluster, "long", attempt=2), 10, "the takeover")
        zombie.resume()  # its handler wakes up past its lease: it must do nothing more
        wait_for(lambda: any(e.event == "end" and e.slot == first.slot
                             for e in cluster.ledger()), 10, "attempt 2 to finish")
        time.sleep(1.5)
        cluster.stop_all()
        entries = cluster.ledger()
    ends = [e for e in entries if e.slot == first.slot and e.event == "end"]
    assert [(e.attempt, e.pid) for e in ends] == [(2, ends[0].pid)]
    assert ends[0].pid != zombie.pid
    assert "fenced" in zombie.log() or "took over" in zombie.log()
    runs = [r for r in read_history(url, "long") if r.slot == first.slot]
    assert [(r.attempt, r.status) for r in runs] == [(2, "success"), (1, "interrupted")]
    assert_exactly_once(entries, "long", history=read_history(url, "long"))


def exited(cluster: Cluster, job: str, attempt: int = 1) -> LedgerEntry | None:
    return next((e for e in cluster.ledger() if e.job == job and e.event == "exit"
                 and e.attempt == attempt), None)


#: How soon a backup starts attempt 2 after the runner's handler returned, at most: its
#: next check, every 1–2 heartbeats (jitter_ms is 0 here).
HAND_OVER_HEARTBEAT_MS = 400
HAND_OVER_BOUND_MS = 1_000


@pytest.mark.parametrize("sync", [False, True], ids=["async-cancelled", "sync-returns"])
def test_sigterm_hands_a_long_run_over_at_once(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path,
    sync: bool,
) -> None:
    """SIGTERM the runner of a long run: a backup starts attempt 2 right after its handler
    returns (an async handler cancelled after the stop grace, or a sync one that returns on
    ``ctx.cancelled``), long before the 20 s lease would have expired."""
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("long", every="10s", sleep_s=60.0, sync=sync,
                    options={"jitter_ms": 0, "overlap": True})]
    with start_instances(url, jobs, 3, tmp_path, lease_ms=20_000,
                         heartbeat_ms=HAND_OVER_HEARTBEAT_MS, grace_ms=1_000) as cluster:
        cluster.wait_ready()
        first = wait_for(lambda: started(cluster, "long"), 15, "a run to start")
        runner = next(i for i in cluster.instances if i.pid == first.pid)
        time.sleep(1.0)
        assert runner.terminate() == 0
        returned = wait_for(lambda: exited(cluster, "long"), 5, "the handler to return")
        second = wait_for(lambda: started(cluster, "long", attempt=2), 10, "the hand-over")
        cluster.stop_all()
    assert second.slot == first.slot
    assert second.pid != first.pid
    assert returned.cancelled == "stopping"
    delay = second.time_ms - returned.time_ms
    assert delay <= HAND_OVER_BOUND_MS, (
        f"attempt 2 started {delay} ms after the handler returned; the lease alone is 20 s")
    runs = [r for r in read_history(url, "long") if r.slot == first.slot]
    assert [r.attempt for r in runs][-2:] == [2, 1]
    assert runs[-1].status == "interrupted"
    assert "handed over" in (runs[-1].error or "")


def test_overlapping_slots_are_skipped(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path
) -> None:
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("slow", every="1s", sleep_s=2.5, options={"jitter_ms": 100})]
    with start_instances(url, jobs, 2, tmp_path, lease_ms=1_500, heartbeat_ms=300) as cluster:
        cluster.wait_ready()
        time.sleep(9)
        cluster.stop_all()
        entries = cluster.ledger()
    spans = sorted((s.time_ms, e.time_ms) for s in entries for e in entries
                   if s.event == "start" and e.event == "end" and s.token == e.token)
    assert len(spans) >= 2
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 50, f"runs overlapped: one ended at {end}, next began {start}"
    history = read_history(url, "slow")
    skipped = [r for r in history if r.status == "skipped"]
    assert skipped, "slots during a run must be recorded as skipped"
    assert all("overlap" in (r.error or "") for r in skipped)
    assert len({r.slot for r in skipped}) == len(skipped), "a skipped slot recorded twice"


def test_max_attempts_then_interrupted_for_good(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path
) -> None:
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("fragile", every="8s", sleep_s=3.0, options={"max_attempts": 1})]
    with start_instances(url, jobs, 2, tmp_path, lease_ms=1_000, heartbeat_ms=300) as cluster:
        cluster.wait_ready()
        first = wait_for(lambda: started(cluster, "fragile"), 15, "a run to start")
        next(i for i in cluster.instances if i.pid == first.pid).kill()
        time.sleep(3.5)
        cluster.stop_all()
        entries = cluster.ledger()
    assert not any(e.slot == first.slot and e.attempt > 1 for e in entries)
    runs = [r for r in read_history(url, "fragile") if r.slot == first.slot]
    assert [(r.attempt, r.status) for r in runs] == [(1, "interrupted")]
    assert "max_attempts" in (runs[0].error or "")


def test_paused_instance_skips_a_slot_it_claims_too_late(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path
) -> None:
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("prompt", every="2s", options={"max_late_ms": 300, "jitter_ms": 0})]
    with start_instances(url, jobs, 1, tmp_path) as cluster:
        cluster.wait_ready()
        wait_for(lambda: started(cluster, "prompt"), 10, "a first run")
        (instance,) = cluster.instances
        paused_at = now_ms()
        instance.pause()
        time.sleep(3)
        instance.resume()
        resumed_at = now_ms()
        time.sleep(2.5)
        cluster.stop_all()
        entries = cluster.ledger()
    history = read_history(url, "prompt")
    late = [r for r in history if r.status == "skipped" and paused_at < r.slot < resumed_at]
    assert late, f"no late slot recorded: {[(r.slot, r.status) for r in history]}"
    assert all("late" in (r.error or "") for r in late)
    ran = {e.slot for e in entries if e.event == "start"}
    assert not ran & {r.slot for r in late}
