"""One timer for every job of a scheduler: a heap of (fire at, slot, job), not a task per job.

Each entry holds only numbers and a name, so thousands of jobs cost the collector nothing
to track. An entry carries the sequence number it was armed with: a job re-armed or
removed since simply no longer matches, and its old entry is dropped when it comes up.
Times are on the store's clock (see :mod:`anarchon_core.storeclock`); when that clock is
re-measured and has moved, the owner re-arms every job (:meth:`SlotTimers.clock_moved`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from .supervision import LoopGuard

__all__ = ["COALESCE_MS", "MAX_SLEEP_S", "SlotTimers"]

#: Timers due this soon (ms) fire with the current ones once their slot has come.
COALESCE_MS = 20
#: Long waits are cut so that clock corrections apply (s).
MAX_SLEEP_S = 30.0


class SlotTimers:
    """The timer heap and the loop that fires it.

    :param now_ms: the store's clock now (ms).
    """

    def __init__(self, now_ms: Callable[[], float]) -> None:
        self._now_ms = now_ms
        self._heap: list[tuple[float, int, int, str]] = []
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._moved = False

    def arm(self, name: str, slot: int, fire_at: float) -> int:
        """Fire ``slot`` of job ``name`` at ``fire_at``; the entry's sequence number."""
        seq = next(self._seq)
        entry = (fire_at, seq, slot, name)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry and self._wake is not None:
            self._wake.set()
        return seq

    def clear(self) -> None:
        """Drop every entry (on stop, and before re-arming every job)."""
        self._heap.clear()

    def clock_moved(self) -> None:
        """The store clock's offset moved: the loop calls its ``rearm_all`` first."""
        if self._wake is not None:
            self._moved = True
            self._wake.set()

    def open(self) -> None:
        """Ready the loop's wake-up (on the event loop that will run :meth:`run`)."""
        self._wake = asyncio.Event()

    async def run(self, guard: LoopGuard, *, stopping: Callable[[], bool],
                  fire: Callable[[str, int, int, float], bool],
                  due: Callable[[], None], rearm_all: Callable[[], None]) -> None:
        """Fire the entries as they come, until ``stopping()``.

        ``fire(name, seq, slot, now)`` is called for each entry that comes up (True if it
        was still current, the owner having queued its claim and re-armed the job); then
        ``due()`` once per wake-up that fired any.
        """
        wake = self._wake
        assert wake is not None, "open() first"
        heap = self._heap
        while not stopping():
            if self._moved:
                self._moved = False
                rearm_all()
            now = self._now_ms()
            # Timers due within a few ms go now if their slot has come (their jitter is
            # random anyway): fewer wake-ups, and their claims share round trips.
            soon = now + COALESCE_MS
            fired = False
            while heap and (heap[0][0] <= now or (heap[0][0] <= soon and heap[0][2] <= now)):
                _, seq, slot, name = heapq.heappop(heap)
                with guard.item(f"job {name!r}"):
                    fired = fire(name, seq, slot, now) or fired
            if fired:
                due()
            wait_s = min((heap[0][0] - now) / 1000, MAX_SLEEP_S) if heap else MAX_SLEEP_S
            wake.clear()
            alarm = asyncio.get_running_loop().call_later(max(0.0, wait_s), wake.set)
            try:
                await wake.wait()
            finally:
                alarm.cancel()
