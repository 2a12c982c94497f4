"""Lease keepers and end-record deadlines of many handles share a few timers."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref

from anarchon_core.sharedtimers import GRAIN_S, EndDeadlines, KeeperStarts


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
    kept = handles[1::2]
    for _ in range(300):  # bounded: 3 s at most
        if all(h.started_at is not None for h in kept):
            break
        await asyncio.sleep(0.01)
    assert all(h.started_at is None for h in ended)
    for handle in kept:
        assert handle.started_at is not None
        # Early by at most one grain (plus the loop's own slack), never late by more than
        # a busy machine's event loop lags.
        assert now + handle.due - GRAIN_S - 0.01 <= handle.started_at
        assert handle.started_at <= now + handle.due + 1.0


def test_a_finished_event_loop_is_not_kept_alive() -> None:
    async def one_handle() -> weakref.ref[asyncio.AbstractEventLoop]:
        loop = asyncio.get_running_loop()
        KeeperStarts.for_loop(loop).add(_Handle(0.0), 0.0)
        await asyncio.sleep(0.1)
        return weakref.ref(loop)

    loop_ref = asyncio.run(one_handle())
    gc.collect()
    assert loop_ref() is None


class _EndRecord:
    def __init__(self) -> None:
        self.cut_at: float | None = None

    def _cut_end(self) -> None:
        self.cut_at = asyncio.get_running_loop().time()


async def test_end_deadlines_share_timers_apart_from_keeper_starts() -> None:
    loop = asyncio.get_running_loop()
    deadlines = EndDeadlines.for_loop(loop)
    assert deadlines is not KeeperStarts.for_loop(loop)
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]
    now = loop.time()
    records = [_EndRecord() for _ in range(500)]
    sets = [deadlines.add(r, 0.2 + i / 10_000) for i, r in enumerate(records)]  # 0.20-0.25 s
    assert len(loop._scheduled) - timers_before <= 3  # type: ignore[attr-defined]
    answered = records[::2]
    for record, record_set in zip(answered, sets[::2], strict=True):
        record_set.discard(record)  # its call was answered in time
    for _ in range(300):  # bounded: 3 s at most
        if all(r.cut_at is not None for r in records[1::2]):
            break
        await asyncio.sleep(0.01)
    assert all(r.cut_at is None for r in answered)
    for record in records[1::2]:
        assert record.cut_at is not None
        assert now + 0.2 - GRAIN_S - 0.01 <= record.cut_at <= now + 0.25 + 1.0
