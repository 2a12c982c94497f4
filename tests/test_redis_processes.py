"""Real instance processes on a dedicated Redis that is restarted mid-run.

Exactly-once, takeover after SIGKILL, fencing after SIGSTOP, hand-over, overlap and
lateness on Redis, Valkey and the Redis Cluster (lease) and on stream-id/script
(claim-only) are in tests/test_processes_lease.py and tests/test_processes_claim_only.py,
which run on every store of tests/stores/.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from .support.helpers import start_redis
from .support.procs import (
    InstanceJob,
    now_ms,
    read_history,
    start_instances,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.mark.parametrize("strategy", ["lease", "script"])
def test_scheduler_reconnects_after_the_store_restarts(strategy: str, namespace: str,
                                                       tmp_path: Path) -> None:
    # Persistent on purpose: a restart must not forget which runs were claimed.
    server = start_redis(tmp_path / "redis", durable=True)
    try:
        url = f"{server.url}?prefix={namespace}:&strategy={strategy}"
        jobs = [InstanceJob("tick", every="1s", sleep_s=0.05)]
        with start_instances(url, jobs, 3, tmp_path / "fleet") as cluster:
            cluster.wait_ready()
            time.sleep(4)
            server.halt(crash=False)
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
