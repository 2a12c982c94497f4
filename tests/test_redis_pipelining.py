"""Redis: calls due together go out in pipelines, and each keeps its own answer or error.

On a standalone server, claims (and heartbeats, finishes, releases) made together also run
as one batched script per :data:`SCRIPT_BATCH` calls: still one decision per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis

from anarchon_core.backend import new_token
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis.clients import (
    PIPELINE_SIZE,
    SCRIPT_BATCH,
    Commands,
    LuaScript,
)
from anarchon_core.backends.redis.keys import redis_key
from anarchon_core.errors import StoreError, StoreUnavailable
from anarchon_core.models import ClaimOutcome, ClaimRequest, ClaimResult, RunRef

from .stores.redis import SHARED_URL
from .support.helpers import start_redis

pytestmark = [pytest.mark.timeout(60), pytest.mark.service("redis")]

BURST = 600


def req(slot: int, job: str, runner: str = "a") -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner,
                        max_late_ms=60_000)


Started = tuple[RedisBackend, Commands]


@pytest.fixture
async def started(namespace: str) -> AsyncIterator[Started]:
    """A started backend on the shared Redis (a prefix of its own) and its connection.

    The claim scripts are loaded first: a server that has not run them yet (one just
    started) answers ``NOSCRIPT`` once per batch, which is sent again with its source, and
    the tests that count round trips count the batching, not the server's script cache.
    """
    backend = RedisBackend(SHARED_URL, prefix=f"{namespace}:")
    await backend.start()
    try:
        conn = backend._conn
        assert conn is not None
        for script in (LuaScript.load("lease_claim"), LuaScript.batched("lease_claim")):
            await conn.call("SCRIPT", "LOAD", script.source)
        yield backend, conn
    finally:
        await backend.stop()


def count_pipelines(conn: Commands, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the size of every round trip the connection makes from now on."""
    sizes: list[int] = []
    send = conn._pipeline

    async def counted(batch: Any) -> list[Any]:
        sizes.append(len(batch))
        return await send(batch)

    monkeypatch.setattr(conn, "_pipeline", counted)
    return sizes


async def test_a_burst_of_claims_takes_a_few_pipelines_not_one_call_each(
        started: Started) -> None:
    backend, conn = started
    batcher = conn.batcher
    assert batcher is not None
    slot = await backend.clock_ms()
    batches, calls = batcher.batches, batcher.calls
    results = await asyncio.gather(*(backend.claim(req(slot, f"j{i}"))
                                     for i in range(BURST)))
    assert all(r.outcome is ClaimOutcome.WON for r in results)
    # Each job's first claim also lists the job (one command per job); the claims
    # themselves run as a few batched scripts.
    scripts = conn.script_batcher(LuaScript.load("lease_claim"))
    assert scripts is not None
    assert scripts.calls == BURST
    assert scripts.batches <= -(-BURST // SCRIPT_BATCH) + 2
    assert batcher.calls - calls == BURST + scripts.batches
    assert batcher.batches - batches <= BURST // PIPELINE_SIZE + 4
    again = await asyncio.gather(*(backend.claim(req(slot, f"j{i}", "b"))
                                   for i in range(BURST)))
    assert all(r.outcome is ClaimOutcome.RUNNING for r in again)


async def test_claim_many_sends_its_claims_in_pipelines_of_a_bounded_size(
        started: Started, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, conn = started
    sizes = count_pipelines(conn, monkeypatch)
    batcher = conn.batcher
    assert batcher is not None
    slot = await backend.clock_ms()
    calls, batches = batcher.calls, batcher.batches
    results = await backend.claim_many([req(slot, f"j{i}") for i in range(BURST)])
    assert all(isinstance(r, ClaimResult) and r.won for r in results)
    # The job list: one SADD of up to 500 jobs, the two of them in one pipeline.
    assert sizes == [-(-BURST // 500)]
    # The claims: one batched script per SCRIPT_BATCH claims, all in one pipeline.
    claim_scripts = -(-BURST // SCRIPT_BATCH)
    assert (batcher.calls - calls, batcher.batches - batches) == (claim_scripts, 1)
    sizes.clear()
    calls, batches = batcher.calls, batcher.batches
    results = await backend.claim_many([req(slot, f"j{i}", "b") for i in range(BURST)])
    assert all(isinstance(r, ClaimResult) and r.outcome is ClaimOutcome.RUNNING
               for r in results)
    assert (batcher.calls - calls, batcher.batches - batches) == (claim_scripts, 1)
    assert sizes == []  # jobs listed already
    assert set(await backend.job_names()) == {f"j{i}" for i in range(BURST)}


async def test_a_bad_key_fails_only_its_own_claim_in_a_pipeline(namespace: str) -> None:
    prefix = f"{namespace}:"
    backend = RedisBackend(SHARED_URL, prefix=prefix)
    await backend.start()
    try:
        with redis.Redis.from_url(SHARED_URL) as client:
            client.set(redis_key(prefix, "state", "broken", tagged=True), "not a hash")
        slot = await backend.clock_ms()
        batch = [req(slot, "ok1"), req(slot, "broken"), req(slot, "ok2")]
        results = await backend.claim_many(batch)
        assert isinstance(results[0], ClaimResult)
        assert results[0].won
        assert isinstance(results[2], ClaimResult)
        assert results[2].won
        assert isinstance(results[1], StoreError)
        assert not isinstance(results[1], StoreUnavailable)
        assert "WRONGTYPE" in str(results[1])
        # The same through concurrent single claims (the pipelining batcher).
        singles = await asyncio.gather(*(backend.claim(req(slot + 1, j)) for j in
                                         ("ok3", "broken", "ok4")), return_exceptions=True)
        assert isinstance(singles[1], StoreError)
        assert "WRONGTYPE" in str(singles[1])
        assert [type(r) for r in (singles[0], singles[2])] == [ClaimResult, ClaimResult]
    finally:
        await backend.stop()
        with redis.Redis.from_url(SHARED_URL) as client:
            client.delete(redis_key(prefix, "state", "broken", tagged=True))


async def test_scripts_flushed_from_the_server_are_loaded_again(tmp_path: Path) -> None:
    server = start_redis(tmp_path)
    backend = RedisBackend(server.url, prefix="flush:")
    try:
        await backend.start()
        slot = await backend.clock_ms()
        assert all(isinstance(r, ClaimResult) and r.won
                   for r in await backend.claim_many([req(slot, "a"), req(slot, "b")]))
        with redis.Redis(port=server.port) as admin:
            admin.script_flush()
        results = await backend.claim_many([req(slot, "a", "x"), req(slot, "c")])
        assert [r.outcome for r in results if isinstance(r, ClaimResult)] == [
            ClaimOutcome.RUNNING, ClaimOutcome.WON]
        with redis.Redis(port=server.port) as admin:
            admin.script_flush()
        many = await asyncio.gather(*(backend.claim(req(slot, f"d{i}")) for i in range(20)))
        assert all(r.won for r in many)
        with redis.Redis(port=server.port) as admin:
            admin.script_flush()
        assert (await backend.claim(req(slot, "e", "alone"))).won  # a lone call, unbatched
    finally:
        await backend.stop()
        server.stop()


async def test_a_server_gone_mid_burst_fails_every_claim_as_unavailable(
        tmp_path: Path) -> None:
    server = start_redis(tmp_path)
    backend = RedisBackend(server.url, prefix="gone:")
    try:
        await backend.start()
        slot = await backend.clock_ms()
        server.halt(crash=True)
        results = await backend.claim_many([req(slot, f"j{i}") for i in range(300)])
        assert len(results) == 300
        assert all(isinstance(r, StoreUnavailable) for r in results), results[:2]
        singles = await asyncio.gather(*(backend.claim(req(slot, f"k{i}")) for i in range(50)),
                                       return_exceptions=True)
        assert all(isinstance(r, StoreUnavailable) for r in singles), singles[:2]
    finally:
        await backend.stop()
        server.stop()


async def test_ends_made_together_share_batched_scripts_and_keep_their_own_answer(
        started: Started) -> None:
    backend, conn = started
    slot = await backend.clock_ms()
    requests = [req(slot, f"e{i}") for i in range(300)]
    assert all(isinstance(r, ClaimResult) and r.won
               for r in await backend.claim_many(requests))
    refs = [RunRef(r.job, r.slot, r.token) for r in requests]
    refs[7] = RunRef(refs[7].job, slot, "not-the-token")  # fenced: refused alone
    updates = conn.script_batcher(LuaScript.load("lease_update"))
    assert updates is not None
    calls, batches = updates.calls, updates.batches
    answers = await asyncio.gather(*(backend.finish(ref, "success") for ref in refs))
    assert answers == [i != 7 for i in range(300)]
    assert updates.calls - calls == 300
    assert updates.batches - batches <= -(-300 // SCRIPT_BATCH) + 2
    [ended] = await backend.history("e0")
    assert ended.status == "success"
    [still] = await backend.history("e7")
    assert still.status == "running"


async def test_a_server_refusing_scripts_over_many_slots_gets_one_script_per_call(
        started: Started, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, conn = started
    real_run = LuaScript.run

    async def proxy(self: LuaScript, conn: Commands, keys: Any, args: Any,
                    **kwargs: Any) -> Any:
        if self.name.endswith("[batched]"):  # as a proxy over several servers answers
            raise StoreError("CROSSSLOT Keys in request don't hash to the same slot")
        return await real_run(self, conn, keys, args, **kwargs)

    monkeypatch.setattr(LuaScript, "run", proxy)
    slot = await backend.clock_ms()
    results = await backend.claim_many([req(slot, f"x{i}") for i in range(20)])
    assert all(isinstance(r, ClaimResult) and r.won for r in results)
    assert conn.batch_scripts is False
    again = await asyncio.gather(*(backend.claim(req(slot, f"x{i}", "b"))
                                   for i in range(20)))
    assert all(r.outcome is ClaimOutcome.RUNNING for r in again)
