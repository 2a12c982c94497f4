"""``Backend.add_meta``: facts added to an ended attempt's meta, on every lease store.

A scheduled Django task's outcome arrives after its run ended (``task_status``); every
lease store merges it into that attempt's stored meta, and only that attempt's. Claim-only
stores refuse it, saying which stores can.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from anarchon_core import ConfigError, ReadOnlyError, StoreUnavailable, UnsupportedStrategyError
from anarchon_core.backend import Backend
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis.keys import redis_key
from anarchon_core.backends.redis.lease import run_score
from anarchon_core.models import META_MAX_VALUE_CHARS, ClaimOutcome, RunRef

from ..stores import StoreHandle, StoreSpec, unavailable
from ..stores import redis as redis_store
from .test_lease_contract import LEASE, ref, req, sleep_past_lease, slot_now

pytestmark = pytest.mark.timeout(60)


def ended(run_ref: RunRef) -> RunRef:
    """The reference a late fact comes with: no token (an ended attempt has none to hold)."""
    return RunRef(run_ref.job, run_ref.slot, "", run_ref.attempt, run_ref.manual)


async def metas(backend: Backend) -> dict[tuple[int, int], dict[str, str]]:
    return {(r.slot, r.attempt): r.meta for r in await backend.history("job", 50)}


async def test_meta_is_merged_into_an_ended_attempt(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot)
    assert (await lease_backend.claim(r)).won
    assert await lease_backend.finish(ref(r, 1), "success", meta={"task_id": "t1", "n": "1"})
    assert await lease_backend.add_meta(ended(ref(r, 1)), {"task_status": "READY"})
    assert await lease_backend.add_meta(ended(ref(r, 1)), {"task_status": "SUCCESSFUL"})
    [run] = await lease_backend.history("job")
    assert (run.status, run.meta) == ("success", {"task_id": "t1", "n": "1",
                                                  "task_status": "SUCCESSFUL"})
    # the same again changes nothing and still finds the attempt
    assert await lease_backend.add_meta(ended(ref(r, 1)), {"task_status": "SUCCESSFUL"})
    assert (await metas(lease_backend))[(slot, 1)]["task_status"] == "SUCCESSFUL"


async def test_an_attempt_that_ended_without_meta_gets_some(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot)
    assert (await lease_backend.claim(r)).won
    assert await lease_backend.finish(ref(r, 1), "failed", "boom")
    assert await lease_backend.add_meta(ended(ref(r, 1)), {"task_status": "FAILED"})
    [run] = await lease_backend.history("job")
    assert (run.status, run.error, run.meta) == ("failed", "boom", {"task_status": "FAILED"})


async def test_no_ended_attempt_no_meta(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot)
    assert not await lease_backend.add_meta(ended(ref(r, 1)), {"k": "v"})  # no run at all
    assert (await lease_backend.claim(r)).won
    # running: its end record will write its meta, so nothing is added now
    assert not await lease_backend.add_meta(ended(ref(r, 1)), {"k": "v"})
    assert await lease_backend.finish(ref(r, 1), "success", meta={"own": "1"})
    assert not await lease_backend.add_meta(ended(ref(r, 2)), {"k": "v"})  # no such attempt
    other = RunRef("job", slot, "", 1, manual=True)
    assert not await lease_backend.add_meta(other, {"k": "v"})  # not the manual run
    assert not await lease_backend.add_meta(RunRef("other", slot, "", 1), {"k": "v"})
    assert (await metas(lease_backend))[(slot, 1)] == {"own": "1"}


async def test_only_the_named_attempt_gets_the_meta(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    first, second = req(slot, "a"), req(slot, "b")
    assert (await lease_backend.claim(first)).won
    await lease_backend.heartbeat(ref(first, 1), LEASE)
    await sleep_past_lease()
    taken = await lease_backend.claim(second)  # attempt 1 interrupted, attempt 2 running
    assert (taken.won, taken.attempt) == (True, 2)
    assert await lease_backend.add_meta(ended(ref(first, 1)), {"task_status": "FAILED"})
    assert not await lease_backend.add_meta(ended(ref(second, 2)), {"task_status": "X"})
    assert await lease_backend.finish(ref(second, 2), "success", meta={"task_id": "t2"})
    assert await lease_backend.add_meta(ended(ref(second, 2)), {"task_status": "SUCCESSFUL"})
    runs = {r.attempt: r for r in await lease_backend.history("job")}
    assert runs[1].status == "interrupted"
    assert runs[1].meta == {"task_status": "FAILED"}
    assert runs[2].meta == {"task_id": "t2", "task_status": "SUCCESSFUL"}


async def test_a_skipped_run_and_a_manual_run_take_meta(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    assert (await lease_backend.claim(req(slot, "a"))).won
    skipped = req(slot + 1, "b")  # the first slot still runs: overlap off, skipped
    assert (await lease_backend.claim(skipped)).outcome is ClaimOutcome.OVERLAP
    assert await lease_backend.add_meta(ended(ref(skipped, 1)), {"why": "busy"})
    manual = req(slot, "c", manual=True, overlap=True)
    assert (await lease_backend.claim(manual)).won
    assert await lease_backend.finish(ref(manual, 1), "success")
    assert await lease_backend.add_meta(ended(ref(manual, 1)), {"task_status": "READY"})
    by_run = {(r.slot, r.manual): r for r in await lease_backend.history("job")}
    assert by_run[(slot + 1, False)].status == "skipped"
    assert by_run[(slot + 1, False)].meta == {"why": "busy"}
    assert by_run[(slot, True)].meta == {"task_status": "READY"}
    assert by_run[(slot, False)].meta == {}


async def test_concurrent_additions_all_land(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot)
    assert (await lease_backend.claim(r)).won
    assert await lease_backend.finish(ref(r, 1), "success")
    added = await asyncio.gather(*(lease_backend.add_meta(ended(ref(r, 1)), {f"k{i}": str(i)})
                                   for i in range(4)))
    assert added == [True] * 4
    assert (await metas(lease_backend))[(slot, 1)] == {f"k{i}": str(i) for i in range(4)}


async def test_a_merge_past_the_meta_limits_is_refused(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot)
    assert (await lease_backend.claim(r)).won
    big = "x" * META_MAX_VALUE_CHARS
    assert await lease_backend.finish(ref(r, 1), "success", meta={"a": big, "b": big})
    with pytest.raises(ConfigError, match="characters"):
        await lease_backend.add_meta(ended(ref(r, 1)), {"c": big, "d": big, "e": big})
    with pytest.raises(ConfigError):
        await lease_backend.add_meta(ended(ref(r, 1)), {"k": 1})  # type: ignore[dict-item]
    assert (await metas(lease_backend))[(slot, 1)] == {"a": big, "b": big}


async def test_a_reader_refuses_to_add_meta(
        persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    writer = persistent_lease_store[1].backend(namespace)
    await writer.start()
    try:
        slot = await writer.clock_ms()
        r = req(slot)
        assert (await writer.claim(r)).won
        assert await writer.finish(ref(r, 1), "success", meta={"own": "1"})
        reader = persistent_lease_store[1].read_only(namespace)
        await reader.start()
        try:
            with pytest.raises(ReadOnlyError):
                await reader.add_meta(ended(ref(r, 1)), {"k": "v"})
        finally:
            await reader.stop()
        assert (await metas(writer))[(slot, 1)] == {"own": "1"}
    finally:
        await writer.stop()


async def test_claim_only_stores_refuse_and_name_the_stores_that_can(
        claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    r = req(slot)
    assert (await claim_backend.claim(r)).won
    assert await claim_backend.finish(ref(r, 1), "success", meta={"own": "1"})
    with pytest.raises(UnsupportedStrategyError,
                       match=r"cannot add meta to an ended run: .*the lease stores can"):
        await claim_backend.add_meta(ended(ref(r, 1)), {"task_status": "SUCCESSFUL"})
    [run] = await claim_backend.history("job")
    assert run.meta == {"own": "1"}


async def test_redis_leaves_records_it_cannot_read_alone(namespace: str) -> None:
    """Foreign members at the run's results score and a hostile meta never stop the merge."""
    backend = RedisBackend(redis_store.SHARED_URL, prefix=f"{namespace}:")
    try:
        await backend.start()
    except StoreUnavailable as exc:
        unavailable("Redis (shared)", str(exc))
    try:
        slot = await backend.clock_ms()
        r = req(slot)
        assert (await backend.claim(r)).won
        assert await backend.finish(ref(r, 1), "success", meta={"own": "1"})
        results = redis_key(f"{namespace}:", "results", "job", tagged=True)
        score = run_score(slot, False)
        foreign = ["\xff{ not json", json.dumps({"a": "2", "s": "success", "m": "{}"}),
                   json.dumps({"a": "1", "s": "running"}), "[1, 2]"]
        with redis.Redis.from_url(redis_store.SHARED_URL) as client:
            client.zadd(results, dict.fromkeys(foreign, score))
            assert await backend.add_meta(ended(ref(r, 1)), {"task_status": "SUCCESSFUL"})
            members = {m.decode(errors="surrogateescape")
                       for m in client.zrangebyscore(results, score, score)}
            state = client.hget(redis_key(f"{namespace}:", "state", "job", tagged=True),
                                str(slot))
        [ours] = members - set(foreign)  # the others untouched
        merged = {"own": "1", "task_status": "SUCCESSFUL"}
        assert json.loads(json.loads(ours)["m"]) == merged
        assert json.loads(json.loads(state)["m"]) == merged
    finally:
        await backend.stop()
