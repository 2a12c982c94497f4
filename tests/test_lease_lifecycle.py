"""An attempt's lease is held until its code has stopped: real processes, real stores.

The handlers here ignore their cancellation ("stubborn"), the hardest case: a stop or a
timeout asks them to stop and they go on. The fsynced ledger records when each attempt's
code started and when it returned (``exit``); no two attempts of one slot, and no two
slots of an ``overlap=False`` job, may have run at the same time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .stores import StoreHandle
from .support.procs import (
    InstanceJob,
    LedgerEntry,
    assert_no_concurrent_execution,
    now_ms,
    read_history,
    start_instances,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, store_handles: Callable[[str], StoreHandle],
              namespace: str) -> str:
    handle = store_handles(request.param)
    assert handle.url is not None
    return handle.url(namespace)



def first(entries: list[LedgerEntry], job: str, event: str, attempt: int = 1
          ) -> LedgerEntry | None:
    return next((e for e in entries if e.job == job and e.event == event
                 and e.attempt == attempt), None)


def test_stop_keeps_the_lease_of_a_handler_that_ignores_it(store_url: str,
                                                             tmp_path: Path) -> None:
    """SIGTERM with a 100 ms grace while a stubborn handler works: no hand-over until the
    code is gone; the backup's attempt 2 starts only after attempt 1's code ended."""
    offset_ms = (now_ms() + 4_000) % 20_000  # the first slot 4 s from now, the next later
    jobs = [InstanceJob("long", every="20s", sleep_s=3.0, sync=True, stubborn=True,
                    options={"offset": f"{offset_ms}ms"})]
    with start_instances(store_url, jobs, 2, tmp_path, lease_ms=2_000, heartbeat_ms=400,
                         grace_ms=100) as cluster:
        cluster.wait_ready()
        start = wait_for(lambda: first(cluster.ledger(), "long", "start"), 30,
                         "a run to start")
        runner = next(i for i in cluster.instances if i.pid == start.pid)
        time.sleep(0.5)
        assert runner.terminate() == 0
        gone_ns = time.monotonic_ns()
        second = wait_for(lambda: first(cluster.ledger(), "long", "start", attempt=2), 15,
                          "the takeover after the lease ran out")
        cluster.stop_all()
        entries = cluster.ledger()
    assert second.slot == start.slot
    # The stubborn handler's thread died with its process; the backup began after that.
    assert second.mono_ns is not None
    assert second.mono_ns > gone_ns
    assert_no_concurrent_execution(entries, "long", deaths={runner.pid: gone_ns},
                                   across_slots=True)
    assert "ignores its cancellation" in runner.log() or "still running" in runner.log()


def test_timeout_holds_the_overlap_guard_until_the_code_returns(store_url: str,
                                                                tmp_path: Path) -> None:
    """``timeout_ms`` 500 on a handler that works 2.6 s every 2 s: the run fails with
    ``timeout`` only once its code returned, and the next slot is skipped (overlap) while
    the code still runs — never started beside it."""
    jobs = [InstanceJob("slow", every="2s", sleep_s=2.6, sync=True, stubborn=True,
                    options={"timeout_ms": 500})]
    with start_instances(store_url, jobs, 3, tmp_path, lease_ms=1_500,
                         heartbeat_ms=300) as cluster:
        cluster.wait_ready()
        begin = now_ms()
        time.sleep(11)
        cluster.stop_all()
        entries = cluster.ledger()
    assert_no_concurrent_execution(entries, "slow", across_slots=True)
    history = [r for r in read_history(store_url, "slow") if r.slot >= begin]
    failed = [r for r in history if r.status == "failed"]
    skipped = [r for r in history if r.status == "skipped"]
    assert failed, history
    assert all(r.error == "timeout" for r in failed), history
    assert skipped, history
    assert all("overlap" in (r.error or "") for r in skipped), history
    # Recorded once the code had returned (its ledger ``exit`` line): a run cut at its
    # timeout would be recorded about 2 s (2.6 s of work less the 0.5 s timeout) before.
    exits = {(e.slot, e.attempt): e.time_ms for e in entries
             if e.job == "slow" and e.event == "exit"}
    for run in failed:
        assert run.finished_at is not None
        returned_ms = exits.get((run.slot, run.attempt))
        assert returned_ms is not None, f"slot {run.slot}: no exit line for {run}"
        recorded_ms = run.finished_at.timestamp() * 1000
        assert recorded_ms >= returned_ms - 1_000, (
            f"slot {run.slot} recorded its end {returned_ms - recorded_ms:.0f} ms before its "
            f"code returned: {run}")


def test_rolling_deploy_recovers_an_orphaned_run(store_url: str, tmp_path: Path) -> None:
    """Three old instances are replaced by three new ones while a long run goes on; its
    runner is SIGKILLed last. Nobody who saw the claim is left, yet a new instance finds
    the orphaned run and takes it over as attempt 2."""
    # A slot every 30 s (no second slot during the test), the first one 4 s from now.
    offset_ms = (now_ms() + 4_000) % 30_000
    jobs = [InstanceJob("long", every="30s", sleep_s=6.0, options={"offset": f"{offset_ms}ms"})]
    old = start_instances(store_url, jobs, 3, tmp_path / "old", lease_ms=3_000,
                          heartbeat_ms=1_000)
    with old:
        old.wait_ready()
        start = wait_for(lambda: first(old.ledger(), "long", "start"), 40, "a run to start")
        new = start_instances(store_url, jobs, 3, tmp_path / "new", lease_ms=3_000,
                              heartbeat_ms=1_000)
        with new:
            new.wait_ready()
            runner = next(i for i in old.instances if i.pid == start.pid)
            for instance in old.instances:
                if instance is not runner:
                    assert instance.terminate() == 0
            runner.kill()
            second = wait_for(lambda: first(new.ledger(), "long", "start", attempt=2), 25,
                              "a new instance to take the orphaned run over")
            wait_for(lambda: first(new.ledger(), "long", "end", attempt=2), 15,
                     "attempt 2 to finish")
            new.stop_all()
    assert second.slot == start.slot
    runs = [r for r in read_history(store_url, "long") if r.slot == start.slot]
    assert [(r.attempt, r.status) for r in runs] == [(2, "success"), (1, "interrupted")]
    assert runs[0].runner == second.instance
