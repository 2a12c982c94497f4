"""Scheduling by the store's clock: skewed and stepped instance clocks run nothing early.

On the event loop's time (``looptime`` and a :class:`~tests.support.clock.LoopClock`): the
store's clock is the instance's, 30 s behind, and a start is compared with its slot exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from anarchon_core import JobContext, Scheduler
from anarchon_core.decision import EARLY_TOLERANCE_MS
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

pytestmark = pytest.mark.looptime

SKEW_MS = 30_000


def behind(clock: LoopClock) -> Callable[[], int]:
    """The store's clock: 30 s behind the instance's (as if every instance ran ahead)."""
    return lambda: clock.store_ms() - SKEW_MS


async def test_a_skewed_instance_runs_slots_at_the_stores_time() -> None:
    clock = LoopClock()
    store_clock = behind(clock)
    scheduler = Scheduler(MemoryBackend(clock=store_clock), lease_ms=3_000, clock=clock)
    started: list[tuple[int, int]] = []

    @scheduler.every("tick", "1s", jitter_ms=0)
    async def tick(ctx: JobContext) -> None:
        started.append((ctx.slot, store_clock()))

    async with scheduler:
        await asyncio.sleep(2.5)
    assert started
    assert all(at >= slot for slot, at in started), started


async def test_a_clock_step_after_start_is_refused_by_the_store_and_corrected() -> None:
    clock = LoopClock()
    store_clock = behind(clock)
    scheduler = Scheduler(MemoryBackend(clock=store_clock), lease_ms=3_000, clock=clock)
    started: list[tuple[int, int]] = []

    @scheduler.every("tick", "1s", jitter_ms=0)
    async def tick(ctx: JobContext) -> None:
        started.append((ctx.slot, store_clock()))

    async with scheduler:
        await asyncio.sleep(1.2)
        scheduler._clock.offset_ms += SKEW_MS  # the instance's clock steps 30 s ahead
        await asyncio.sleep(3)
    # The store accepts a claim at most EARLY_TOLERANCE_MS ahead of its clock (a clock's
    # error); the slot 30 s ahead is refused, the clock re-measured and slots recomputed.
    early = [(slot, at) for slot, at in started if at < slot - EARLY_TOLERANCE_MS]
    assert not early, f"slots started before their time by the store's clock: {early}"
    assert len(started) >= 3
    history = await MemoryBackend(clock=store_clock).history("tick")
    assert history == []  # a fresh store: the refused claims were never recorded elsewhere
