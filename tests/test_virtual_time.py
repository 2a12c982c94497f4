"""The scheduler on controlled time: hours of slots, leases and stops in a fraction of a second.

These tests give the scheduler a :class:`~tests.support.clock.LoopClock` and an in-memory
store on the same clock, under ``looptime`` (the event loop's time jumps ahead whenever
every task sleeps): nothing waits in real time and nothing depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from anarchon_core import JobContext, Scheduler
from anarchon_core.downtime import CATCH_UP_ALL_MAX
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

pytestmark = pytest.mark.looptime


def fleet(n: int, clock: LoopClock, store: MemoryBackend) -> list[Scheduler]:
    return [Scheduler(store, instance_id=f"i{k}", clock=clock, lease_ms=3_000,
                      heartbeat_ms=1_000) for k in range(n)]


async def test_three_instances_run_each_slot_of_an_hour_once() -> None:
    clock = LoopClock()
    store = MemoryBackend(clock.store_ms)
    ran: Counter[int] = Counter()

    async def job(ctx: JobContext) -> None:
        ran[ctx.slot] += 1
        await asyncio.sleep(0.3)

    schedulers = fleet(3, clock, store)
    for s in schedulers:
        s.every("tick", "10s", job)
    for s in schedulers:
        await s.start()
    await asyncio.sleep(3_600)
    for s in schedulers:
        await s.stop()
    assert 359 <= len(ran) <= 361
    assert set(ran.values()) == {1}


async def test_a_stopped_runner_hands_its_long_run_over_at_once() -> None:
    clock = LoopClock()
    store = MemoryBackend(clock.store_ms)
    starts: list[tuple[str, int, float]] = []

    async def job(ctx: JobContext) -> None:
        starts.append((ctx.instance_id, ctx.attempt, clock.monotonic()))
        await asyncio.sleep(600 if ctx.attempt == 1 else 1)  # attempt 1: cancelled by stop

    a, b = fleet(2, clock, store)
    a.every("long", "1h", job, jitter_ms=0)
    b.every("long", "1h", job, jitter_ms=0)
    await a.start()
    await b.start()
    await asyncio.sleep(3_600 - clock.time() % 3_600 + 1)
    runner = next(s for s in (a, b) if s.instance_id == starts[0][0])
    stopped_at = clock.monotonic()
    await runner.stop(grace_ms=500)
    await asyncio.sleep(5)
    for s in (a, b):
        await s.stop()
    first = (await a.history("long"))[-1]
    assert (first.status, first.error) == ("interrupted", "handed over: the runner was stopping")
    assert [(n, attempt) for n, attempt, _ in starts][:2] == [
        (runner.instance_id, 1), (next(s for s in (a, b) if s is not runner).instance_id, 2)]
    # The backup's next poll (every 1–2 heartbeats) finds the hand-over after the grace:
    # within 2.5 s of the stop, where a lease expiry would take 3 s and more.
    assert starts[1][2] - stopped_at <= 2.5


async def test_catch_up_all_runs_at_most_the_newest_thousand_slots_oldest_first() -> None:
    clock = LoopClock()
    store = MemoryBackend(clock.store_ms)
    seen: list[tuple[int, int]] = []

    async def job(ctx: JobContext) -> None:
        seen.append((ctx.slot, ctx.missed_count))

    (s,) = fleet(1, clock, store)
    # 1,500 one-second slots in the window, none of them run: the newest 1,000 are caught up.
    s.every("tick", "1s", job, jitter_ms=0, catch_up_ms=1_500_000, catch_up="all")
    started = clock.store_ms()
    await s.start()
    await asyncio.sleep(60)
    await s.stop()
    caught = [slot for slot, _ in seen if slot <= started]
    assert len(caught) == CATCH_UP_ALL_MAX
    assert caught == sorted(caught)
    newest = started - started % 1_000
    assert caught == [newest - k * 1_000 for k in range(CATCH_UP_ALL_MAX)][::-1]
    assert {count for slot, count in seen if slot <= started} == {1}
    assert Counter(slot for slot, _ in seen).most_common(1)[0][1] == 1
