"""Store faults: a dedicated PostgreSQL server is restarted (or crashes) under the scheduler.

The server is our own (``initdb`` in a temporary directory, a free loopback port), never the
shared one. ``initdb`` and ``postgres`` refuse to run as root, so as root they run as the
``postgres`` OS user through ``runuser``. A restart is ``pg_ctl stop -m fast``; a crash is
``-m immediate`` (no shutdown checkpoint: WAL recovery on the next start).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from anarchon_core.backend import new_token
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.errors import StoreUnavailable
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from .support.helpers import PostgresServer, started
from .support.procs import InstanceJob, grid_slots, now_ms, read_history, start_instances

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def dedicated() -> Iterator[PostgresServer]:
    server = started(PostgresServer)
    try:
        yield server
    finally:
        server.stop()


def req(slot: int, runner: str, **kw: object) -> ClaimRequest:
    return ClaimRequest(job="job", slot=slot, token=new_token(), runner=runner,
                        lease_ms=60_000, **kw)  # type: ignore[arg-type]


async def test_backend_rides_over_a_server_restart(
    dedicated: PostgresServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = PostgresBackend(dedicated.url, table=namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        r = req(slot, "a")
        assert (await backend.claim(r)).won
        ref = RunRef("job", slot, r.token, 1)
        await asyncio.to_thread(dedicated.halt, crash=False)
        await asyncio.to_thread(dedicated.start)
        # The old connection is dead: the first call fails as transient (the scheduler's
        # retry policy, not the backend's); the next opens a new one, the lease intact.
        with pytest.raises(StoreUnavailable):
            await backend.heartbeat(ref, 60_000)
        assert await backend.heartbeat(ref, 60_000)
        assert (await backend.claim(req(slot, "b"))).outcome is ClaimOutcome.RUNNING
        assert await backend.finish(ref, "success")
        assert [(x.attempt, x.status) for x in await backend.history("job")] == [(1, "success")]
    finally:
        await backend.stop()


async def test_claim_during_an_outage_waits_for_the_server_or_fails_cleanly(
    dedicated: PostgresServer, namespace: str
) -> None:
    backend = PostgresBackend(dedicated.url, table=namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        await asyncio.to_thread(dedicated.halt, crash=True)
        claim = req(slot, "a")
        # Fails (bounded by the connect bound), never waits for the server to come back.
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(backend.claim(claim), 30)
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        await asyncio.to_thread(dedicated.start)
        # The caller retries the same claim (same token) once the server is back.
        result = await backend.claim(claim)
        assert (result.outcome, result.attempt) == (ClaimOutcome.WON, 1)

        # During an outage a claim raises, it never reports won.
        impatient = PostgresBackend(dedicated.url, table=namespace)
        await impatient.start()
        await asyncio.to_thread(dedicated.halt, crash=False)
        with pytest.raises(StoreUnavailable):
            await impatient.claim(req(slot + 1, "b", overlap=True))
        await asyncio.to_thread(dedicated.start)
        assert (await impatient.claim(req(slot + 1, "b", overlap=True))).won
        await impatient.stop()
        # The first backend's connection died with the server: one transient failure,
        # then a new connection.
        with pytest.raises(StoreUnavailable):
            await backend.history("job")
        assert [(x.slot, x.runner) for x in await backend.history("job")] == [
            (slot + 1, "b"), (slot, "a")]
    finally:
        await backend.stop()


@pytest.mark.slow
@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash"])
def test_scheduler_recovers_from_a_store_restart_without_double_success(
    dedicated: PostgresServer, namespace: str, tmp_path: Path, crash: bool
) -> None:
    url = f"{dedicated.url}?table={namespace}"
    jobs = [InstanceJob("tick", every="1s", sleep_s=0.3)]
    with start_instances(url, jobs, 3, tmp_path, lease_ms=3_000, heartbeat_ms=1_000) as cluster:
        cluster.wait_ready()
        time.sleep(4)
        dedicated.halt(crash=crash)
        time.sleep(0.5)
        dedicated.start()
        back_at = now_ms()
        time.sleep(8)
        end = now_ms() - 1_500
        cluster.stop_all()
        entries = cluster.ledger()
        logs = "".join(i.log() for i in cluster.instances)
    history = read_history(url, "tick")
    successes = Counter(r.slot for r in history if r.status == "success" and not r.manual)
    doubled = {slot: n for slot, n in successes.items() if n > 1}
    assert not doubled, f"slots with two successes: {doubled}"
    # One line when the outage starts, one when it ends (not one per failed call).
    assert "unreachable (" in logs, "the outage went unnoticed: the test did not exercise it"
    assert "reachable again after" in logs
    # Recovered: after the server is back, every slot runs, once.
    window = grid_slots(1_000, back_at + 2_000, end)
    assert len(window) >= 4
    missing = [s for s in window if successes[s] != 1]
    assert not missing, f"slots without exactly one success after recovery: {missing}"
    ends = Counter(e.slot for e in entries if e.event == "end" and e.slot >= back_at + 2_000)
    assert all(n == 1 for n in ends.values()), f"handlers ran twice after recovery: {ends}"
