"""Contender sets with real processes, on every lease store.

A slot's contenders are computed here as every instance computes them (rendezvous ranks
over the live members): the first ones are SIGKILLed or SIGSTOPped just before the slot,
and the next contender must start it within the job's jitter + 1 s. Instances leaving and
joining in turn (a rolling deploy) must not cost a slot. Each slot still runs exactly once
(ledger and history).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from anarchon_core.contenders import FleetView

from .stores import StoreHandle, StoreSpec
from .support.procs import (
    Cluster,
    InstanceJob,
    LedgerEntry,
    assert_exactly_once,
    grid_slots,
    now_ms,
    read_history,
    start_instances,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

JITTER_MS = 200  # every("2s"): 10 % of the gap
#: A loaded test machine (two test processes per core) may start a run this much later.
LOAD_MS = 250
#: Long enough for every instance to have read the registry with every other in it.
SETTLE_S = 7.0


def url_of(store: tuple[StoreSpec, StoreHandle], namespace: str) -> str:
    handle = store[1]
    assert handle.url is not None
    return handle.url(namespace)


def ranked(ids: Iterable[str], job: str, slot: int) -> list[str]:
    """The members in their rank order for the slot, as each instance computes it."""
    members = tuple(sorted(ids))
    return sorted(members, key=lambda m: FleetView(m, members).rank(job, slot))


def instance_ids(cluster: Cluster) -> dict[int, str]:
    return {i.pid: (cluster.ledger_dir / f"{i.pid}.ready").read_text()
            for i in cluster.instances if i.alive}


def first_start(cluster: Cluster, job: str, slot: int) -> LedgerEntry | None:
    return next((e for e in cluster.ledger()
                 if e.job == job and e.slot == slot and e.event == "start"), None)


@pytest.mark.parametrize("fault", ["kill", "pause", "kill-two"])
def test_the_next_contender_starts_a_slot_whose_first_ones_are_gone(
        persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str,
        tmp_path: Path, fault: str) -> None:
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("tick", every="2s", sleep_s=0.05)]
    with start_instances(url, jobs, 4, tmp_path, lease_ms=3_000, heartbeat_ms=1_000) as cluster:
        cluster.wait_ready()
        time.sleep(SETTLE_S)
        ids = instance_ids(cluster)
        slot = -(-(now_ms() + 1_500) // 2_000) * 2_000
        order = ranked(ids.values(), "tick", slot)
        gone = order[:2] if fault == "kill-two" else order[:1]
        victims = [i for i in cluster.instances if ids.get(i.pid) in gone]
        time.sleep(max(0.0, (slot - 300 - now_ms()) / 1000))
        for victim in victims:
            victim.pause() if fault == "pause" else victim.kill()
        start = wait_for(lambda: first_start(cluster, "tick", slot), 10, "the slot to start")
        wait_for(lambda: any(e.slot == slot and e.event == "end" for e in cluster.ledger()), 10,
                 "the slot's run to end")
        if fault == "pause":
            time.sleep(2)
            for victim in victims:
                victim.resume()
            time.sleep(3)
        cluster.stop_all()
        entries = cluster.ledger()
    members = tuple(sorted(ids.values()))
    jitter = FleetView(members[0], members).jitter("tick", slot, JITTER_MS)
    assert start.instance not in gone
    assert start.instance == order[len(gone)], (start.instance, order)
    late = start.time_ms - slot
    assert late <= jitter + 1_000 + LOAD_MS, f"started {late} ms after the slot ({fault})"
    history = read_history(url, "tick")
    assert [r.status for r in history if r.slot == slot] == ["success"]
    assert_exactly_once(entries, "tick", history=history)


def test_a_rolling_deploy_misses_no_slot(
        persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str,
        tmp_path: Path) -> None:
    url = url_of(persistent_lease_store, namespace)
    jobs = [InstanceJob("tick", every="1s", sleep_s=0.05)]
    with start_instances(url, jobs, 3, tmp_path, lease_ms=3_000, heartbeat_ms=1_000) as cluster:
        cluster.wait_ready()
        time.sleep(SETTLE_S)
        begin = now_ms()
        for turn in range(4):
            cluster.instances[turn].terminate()
            cluster.add()
            wait_for(lambda: sum(i.ready for i in cluster.instances if i.alive) == 3, 30,
                     "the new instance to start")
            time.sleep(2.5)
        time.sleep(3)
        end = now_ms() - 2_000
        cluster.stop_all()
        entries = cluster.ledger()
    history = read_history(url, "tick")
    ran = {r.slot for r in history if r.status == "success"}
    assert [s for s in grid_slots(1_000, begin, end) if s not in ran] == []
    assert_exactly_once(entries, "tick", history=history)
