"""Real instance processes racing on the shared NATS JetStream: every slot runs exactly once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .stores import StoreHandle
from .support.procs import (
    JobSpec,
    assert_exactly_once,
    grid_slots,
    now_ms,
    read_history,
    start_instances,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_four_processes_run_every_slot_exactly_once(
    store_handles: Callable[[str], StoreHandle], namespace: str, tmp_path: Path
) -> None:
    handle = store_handles("nats")
    assert handle.url is not None
    url = handle.url(namespace)
    jobs = [JobSpec("tick", every="1s", sleep_s=0.2),
            JobSpec("tock", every="1s", sleep_s=0.3, sync=True)]
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
        assert not missing, f"{job}: slots that never ran: {missing}"
        runners = {e.instance for e in entries if e.job == job and e.event == "end"}
        assert len(runners) >= 2, f"{job}: jitter should spread runs, all ran on {runners}"
        assert all(r.attempt == 1 for r in history), "claim-only runs have one attempt"
