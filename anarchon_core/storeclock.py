"""The store's clock as one instance sees it: its own clock plus a measured offset.

Every instance schedules by the store's clock, so instances whose clocks disagree still
compute the same slot at the same instant. :class:`StoreClock` measures the offset (three
reads, the one with the shortest round trip wins), re-measures it every minute and at once
when the local clock jumps, and tells its owner when the offset moved enough to recompute
timers. The local clocks come from a :class:`Clock`, so logic can be tested on controlled
time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .backend import Backend
from .clocks import SYSTEM_CLOCK, Clock, SystemClock
from .errors import StoreUnavailable
from .events import EventBus, EventKind
from .health import StoreHealth
from .supervision import LoopGuard

__all__ = ["SYSTEM_CLOCK", "Clock", "StoreClock", "SystemClock"]

log = logging.getLogger("anarchon.scheduler")

#: How often the offset is measured again (s), and how often the local clock is checked
#: for a jump (s).
REFRESH_S = 60.0
CHECK_S = 2.0
#: The wall clock moved this much more (or less) than the monotonic clock: re-sync now.
JUMP_MS = 500
#: Clock reads per measurement.
SAMPLES = 3
#: An offset this large is worth a warning (ms).
WARN_OFFSET_MS = 1_000




class StoreClock:
    """The store's time in ms, from the local clock and a measured offset.

    ``on_moved`` is called when a measurement moved the offset by :data:`JUMP_MS` or
    more (the owner recomputes its timers).
    """

    def __init__(self, backend: Backend, health: StoreHealth, events: EventBus, *,
                 on_moved: Callable[[], None] | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._backend = backend
        self._health = health
        self._events = events
        self._on_moved = on_moved
        self.clock = clock
        #: Store clock minus local clock (ms), from the last measurement.
        self.offset_ms = 0.0
        self.measured = False

    def now_ms(self) -> float:
        """The store's clock now, as far as this instance can tell (ms since the epoch)."""
        return self.clock.time() * 1000 + self.offset_ms

    async def read_store_ms(self) -> int:
        """One read of the store's clock (reported to the store's health)."""
        return await self._health.timed("clock", self._backend.clock_ms())

    async def refresh(self) -> None:
        """Measure the offset again; raises :class:`StoreUnavailable` (the last one stays)."""
        # The sample with the shortest round trip bounds the error best: a reply delayed
        # on one side only (a busy connection, a paused process) skews the midpoint.
        samples = []
        for _ in range(SAMPLES):
            before = self.clock.time() * 1000
            store = await self.read_store_ms()
            after = self.clock.time() * 1000
            samples.append((after - before, store - (before + after) / 2))
        offset = min(samples)[1]
        moved = abs(offset - self.offset_ms) >= JUMP_MS
        if abs(offset - self.offset_ms) >= 1 or not self.measured:
            self._events.emit(EventKind.CLOCK_OFFSET, offset_ms=offset)
        self.measured = True
        self.offset_ms = offset
        if moved and self._on_moved is not None:
            self._on_moved()
        if abs(offset) > WARN_OFFSET_MS:
            log.warning("this instance's clock is %.0f ms off the store's; scheduling by "
                        "the store's clock", -offset)

    async def loop(self, guard: LoopGuard) -> None:
        """Re-measure every :data:`REFRESH_S`, and at once when the local clock jumps."""
        clock = self.clock
        last_sync = clock.monotonic()
        wall, mono = clock.time(), clock.monotonic()
        while True:
            await asyncio.sleep(CHECK_S)
            jump_ms = ((clock.time() - wall) - (clock.monotonic() - mono)) * 1000
            wall, mono = clock.time(), clock.monotonic()
            if abs(jump_ms) < JUMP_MS and mono - last_sync < REFRESH_S:
                continue
            if abs(jump_ms) >= JUMP_MS:
                log.warning("this instance's clock jumped by %.0f ms; re-syncing", jump_ms)
            with guard.item("the clock refresh"):
                try:
                    await self.refresh()
                    last_sync = clock.monotonic()
                except StoreUnavailable as exc:  # keep the last offset
                    log.debug("clock refresh failed: %s", exc)
