"""The timer heap on controlled time: order, coalescing, stale entries, a moved clock."""

from __future__ import annotations

import asyncio
import contextlib

from anarchon_core.supervision import LoopGuard
from anarchon_core.timers import COALESCE_MS, SlotTimers


async def run_once(timers: SlotTimers, current: dict[str, int],
                   rearm_all: list[int] | None = None) -> list[tuple[str, int]]:
    """One wake-up of the loop that fires something: what it fired."""
    fired: list[tuple[str, int]] = []
    done = asyncio.Event()

    def fire(name: str, seq: int, slot: int, now: float) -> bool:
        if current.get(name) != seq:
            return False
        fired.append((name, slot))
        return True

    def rearm() -> None:
        if rearm_all is not None:
            rearm_all.append(1)

    guard = LoopGuard("timer", lambda: not done.is_set())
    loop = asyncio.ensure_future(timers.run(guard, stopping=done.is_set, fire=fire,
                                            due=done.set, rearm_all=rearm))
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    return fired


async def test_due_entries_fire_in_order_and_stale_ones_are_dropped() -> None:
    now = 10_000.0
    timers = SlotTimers(lambda: now)
    timers.open()
    current = {"a": timers.arm("a", 10_000, 10_000.0)}
    timers.arm("b", 9_000, 9_000.0)                         # re-armed below: stale
    current["b"] = timers.arm("b", 9_500, 9_600.0)
    # Due a few ms from now with its slot already come (jitter): fires with the others.
    current["c"] = timers.arm("c", 9_990, 10_000.0 + COALESCE_MS / 2)
    # Its slot has not come: waits, however close.
    current["d"] = timers.arm("d", 10_015, 10_015.0)
    assert await run_once(timers, current) == [("b", 9_500), ("a", 10_000), ("c", 9_990)]
    now = 10_016.0
    assert await run_once(timers, current) == [("d", 10_015)]


async def test_a_moved_clock_rearms_every_job_first() -> None:
    timers = SlotTimers(lambda: 1_000.0)
    timers.open()
    current = {"a": timers.arm("a", 1_000, 1_000.0)}
    timers.clock_moved()
    rearmed: list[int] = []
    assert await run_once(timers, current, rearmed) == [("a", 1_000)]
    assert rearmed == [1]
