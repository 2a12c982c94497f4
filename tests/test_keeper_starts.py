"""Lease keepers of many handles won together start from a few shared timers."""

from __future__ import annotations

import asyncio
import random

from anarchon_core.keeperstarts import GRAIN_S, KeeperStarts


class _Handle:
    def __init__(self, due: float) -> None:
        self.due = due
        self.started_at: float | None = None

    def _start_keeper(self) -> None:
        self.started_at = asyncio.get_running_loop().time()


async def test_keepers_due_together_share_timers_and_start_never_late() -> None:
    loop = asyncio.get_running_loop()
    starts = KeeperStarts.for_loop(loop)
    assert KeeperStarts.for_loop(loop) is starts
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]
    now = loop.time()
    handles = [_Handle(random.uniform(0.10, 0.20)) for _ in range(1_000)]
    sets = [starts.add(h, h.due) for h in handles]
    new_timers = len(loop._scheduled) - timers_before  # type: ignore[attr-defined]
    assert new_timers <= round(0.10 / GRAIN_S) + 2
    # Handles that end first leave their set: their keeper never starts.
    ended = handles[::2]
    for handle, handles_set in zip(handles[::2], sets[::2], strict=True):
        handles_set.discard(handle)
    await asyncio.sleep(0.45)
    assert all(h.started_at is None for h in ended)
    for handle in handles[1::2]:
        assert handle.started_at is not None
        # Early by at most one grain (plus the loop's own slack), never late.
        assert now + handle.due - GRAIN_S - 0.01 <= handle.started_at
        assert handle.started_at <= now + handle.due + 0.2  # a busy machine's loop lag
