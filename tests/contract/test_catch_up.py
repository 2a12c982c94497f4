"""Catch-up after downtime, on every lease store: ``catch_up="newest"``, ``"all"``, ``"none"``.

The fleet was down: the job's newest record in the store is a few slots old. Two instances
start together; the slots missed within ``catch_up_ms`` are run by the policy, each once
across both, and the run that catches up says how many slots it stands for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from anarchon_core import JobContext, Scheduler
from anarchon_core.backend import Backend, new_token
from anarchon_core.models import ClaimRequest, Run, RunRef
from tests.support.helpers import await_until

pytestmark = pytest.mark.timeout(90)

GAP_MS = 2_000
MISSED = 4


async def seed_last_run(backend: Backend) -> int:
    """Record a success of ``job`` ``MISSED`` slots ago; its slot (the others were missed).

    It waits for the start of a slot first, so the fleet starts before the next slot is
    due: otherwise the newest missed slot could be one later than the test expects.
    """
    now = await backend.clock_ms()
    if now % GAP_MS > GAP_MS // 4:
        await asyncio.sleep((GAP_MS - now % GAP_MS) / 1000 + 0.01)
        now = await backend.clock_ms()
    last = now - now % GAP_MS - MISSED * GAP_MS
    request = ClaimRequest(job="job", slot=last, token=new_token(), runner="before",
                           lease_ms=2_000, max_late_ms=None)
    assert (await backend.claim(request)).won
    assert await backend.finish(RunRef("job", last, request.token, 1), "success")
    return last


@pytest.fixture
async def fleet(lease_backend: Backend) -> AsyncIterator[list[Scheduler]]:
    schedulers = [Scheduler(lease_backend, instance_id=f"i{n}", lease_ms=3_000,
                            heartbeat_ms=1_000) for n in range(2)]
    yield schedulers
    for s in schedulers:
        await s.stop()


async def start(fleet: list[Scheduler], seen: list[tuple[int, int]], **options: object) -> None:
    async def job(ctx: JobContext) -> None:
        seen.append((ctx.slot, ctx.missed_count))
        await asyncio.sleep(0.01)

    for s in fleet:
        s.every("job", f"{GAP_MS}ms", job, jitter_ms=0, catch_up_ms=20_000, **options)
    await asyncio.gather(*(s.start() for s in fleet))


def successes(history: list[Run]) -> dict[int, list[Run]]:
    out: dict[int, list[Run]] = {}
    for run in history:
        if run.status == "success":
            out.setdefault(run.slot, []).append(run)
    return out


async def test_all_runs_every_missed_slot_once_oldest_first(
        lease_backend: Backend, fleet: list[Scheduler]) -> None:
    last = await seed_last_run(lease_backend)
    missed = [last + k * GAP_MS for k in range(1, MISSED + 1)]
    seen: list[tuple[int, int]] = []
    await start(fleet, seen, catch_up="all")
    await await_until(lambda: all(s in dict(seen) for s in missed), 15, "the missed slots")
    await asyncio.sleep(0.5)
    history = await fleet[0].history("job", 100)
    done = successes(history)
    for slot in missed:
        assert len(done[slot]) == 1, (slot, done.get(slot))
        assert done[slot][0].meta == {"catch_up": "all", "missed_count": "1"}
    caught = sorted((done[s][0].started_at, s) for s in missed)
    assert [s for _, s in caught] == missed  # oldest first
    assert [n for s, n in seen if s in missed] == [1] * MISSED
    assert not [r for r in history if r.slot in missed and r.status != "success"]


async def test_newest_runs_the_newest_missed_slot_standing_for_all(
        lease_backend: Backend, fleet: list[Scheduler]) -> None:
    last = await seed_last_run(lease_backend)
    newest = last + MISSED * GAP_MS
    seen: list[tuple[int, int]] = []
    await start(fleet, seen)
    await await_until(lambda: newest in dict(seen), 15, "the newest missed slot")
    await asyncio.sleep(0.5)
    done = successes(await fleet[0].history("job", 100))
    assert [r.meta for r in done[newest]] == [{"catch_up": "newest",
                                               "missed_count": str(MISSED)}]
    assert dict(seen)[newest] == MISSED
    assert not [s for s in done if last < s < newest]


async def test_none_runs_no_missed_slot(lease_backend: Backend, fleet: list[Scheduler]) -> None:
    last = await seed_last_run(lease_backend)
    seen: list[tuple[int, int]] = []
    await start(fleet, seen, catch_up="none")
    await asyncio.sleep(1.5)
    now = await lease_backend.clock_ms()
    done = successes(await fleet[0].history("job", 100))
    assert not [s for s in done if last < s <= now - GAP_MS]
    assert all(n == 0 for _, n in seen)
