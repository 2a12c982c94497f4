"""A NATS server that goes away mid-run and comes back: instances reconnect, and no slot
runs twice. Uses its own nats-server (free port, JetStream store in a temp dir), stopped
cleanly (SIGTERM) each time: nats-server fsyncs JetStream only periodically, so a crash
could lose acknowledged claims (the server's caveat)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_core.backend import new_token
from anarchon_core.backends.claimrecords import claim_record, encode_json
from anarchon_core.backends.nats import NatsBackend
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from .support.helpers import NatsServer, started
from .support.procs import InstanceJob, grid_slots, now_ms, read_history, start_instances

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = started(lambda: NatsServer(tmp_path / "nats"))
    try:
        yield server
    finally:
        server.stop()


async def test_backend_survives_a_server_restart(nats_server: NatsServer) -> None:
    backend = NatsBackend(nats_server.url, prefix="r.", stream="RESTART")
    await backend.start()
    try:
        slot = await backend.clock_ms()
        first = ClaimRequest("job", slot, new_token(), "a", max_late_ms=60_000)
        assert (await backend.claim(first)).won
        await asyncio.to_thread(nats_server.halt, crash=False)
        await asyncio.to_thread(nats_server.start)
        outcome = None
        for _ in range(100):  # JetStream needs a moment to recover its streams
            try:
                outcome = (await backend.claim(
                    ClaimRequest("job", slot, new_token(), "b", max_late_ms=60_000))).outcome
                break
            except Exception:  # noqa: BLE001 - retry while the server comes back
                await asyncio.sleep(0.1)
        assert outcome is ClaimOutcome.TAKEN, "the claim made before the restart is kept"
        assert await backend.finish(RunRef("job", slot, first.token), "success")
        [run] = await backend.history("job")
        assert (run.status, run.runner) == ("success", "a")
    finally:
        await backend.stop()


async def test_lost_acknowledgement_is_recognised_on_retry(nats_server: NatsServer) -> None:
    """A claim stored by the server whose answer never arrived is the caller's own."""
    backend = NatsBackend(nats_server.url, prefix="r.", stream="RETRY")
    other = NatsBackend(nats_server.url, prefix="r.", stream="RETRY")
    await backend.start()
    await other.start()
    try:
        slot = await backend.clock_ms()
        mine = ClaimRequest("job", slot, new_token(), "a", max_late_ms=60_000)
        # The same publish the backend makes, as if its acknowledgement had been lost:
        js = (await backend._client()).jetstream()
        await js.publish(backend.claim_subject("job", slot), encode_json(claim_record(mine, 0)),
                         headers={"Nats-Expected-Last-Subject-Sequence": "0",
                                  "Nats-Msg-Id": mine.token})
        backend._uncertain.add(mine.token)
        theirs = ClaimRequest("job", slot, new_token(), "b", max_late_ms=60_000)
        assert (await other.claim(theirs)).outcome is ClaimOutcome.TAKEN
        assert (await backend.claim(mine)).won, "the retry must find its own claim"
    finally:
        await backend.stop()
        await other.stop()


@pytest.mark.slow
def test_instances_reconnect_and_no_slot_runs_twice(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    url = f"{nats_server.url}?prefix=drop.&stream=DROP"
    jobs = [InstanceJob("tick", every="1s", sleep_s=0.6)]
    with start_instances(url, jobs, 3, tmp_path / "fleet") as cluster:
        cluster.wait_ready()
        time.sleep(4)
        nats_server.halt(crash=False)  # every connection drops, runs are mid-way
        time.sleep(3)
        nats_server.start()
        back = now_ms()
        time.sleep(9)
        end = now_ms() - 1_500
        assert all(i.alive for i in cluster.instances), "an instance died of the outage"
        cluster.stop_all()
        entries = cluster.ledger()
        logs = "".join(i.log() for i in cluster.instances)
    starts = Counter(e.slot for e in entries if e.job == "tick" and e.event == "start")
    twice = {slot: n for slot, n in starts.items() if n > 1}
    assert not twice, f"slots started twice: {twice}"
    history = read_history(url, "tick")
    successes = Counter(r.slot for r in history if r.status == "success")
    assert max(successes.values()) == 1
    # After the server is back (and JetStream has recovered), every slot runs again.
    recovered = grid_slots(1_000, back + 3_000, end)
    assert recovered, "the test window is too short"
    missing = [s for s in recovered if s not in starts]
    assert not missing, f"slots after the reconnect that never ran: {missing}\n{logs[-3000:]}"
    assert "reconnected to NATS" in logs
