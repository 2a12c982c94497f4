"""Controlled time for logic tests: a clock that moves only when the test says so.

:class:`FakeClock` satisfies :class:`anarchon_core.clocks.Clock`; pass it as
``Scheduler(clock=...)``, ``StoreHealth(clock=...)`` or ``ClaimHandle(clock=...)`` and
move it with :meth:`FakeClock.advance`. Its wall time and monotonic time move together.
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["FakeClock", "LoopClock"]


class FakeClock:
    """Wall and monotonic time that stand still until :meth:`advance`."""

    def __init__(self, wall: float = 1_800_000_000.0, monotonic: float = 1_000.0) -> None:
        self.wall = wall
        self.mono = monotonic

    def time(self) -> float:
        """The fake wall clock (seconds since the epoch)."""
        return self.wall

    def monotonic(self) -> float:
        """The fake monotonic clock (seconds)."""
        return self.mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        self.wall += seconds
        self.mono += seconds

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock alone (an NTP correction, a VM resumed): a jump."""
        self.wall += seconds


class LoopClock:
    """Clocks that follow the running event loop's time, for tests under ``looptime``.

    With ``@pytest.mark.looptime`` the loop's time is fast-forwarded whenever every task
    sleeps, so a scheduler given this clock (and a :class:`~anarchon_core.testing.MemoryBackend`
    on :meth:`store_ms`) lives through minutes of leases, heartbeats and takeovers in
    milliseconds, deterministically. Only async handlers belong there: a thread does not
    follow the loop's time.

    Like a real clock, it has moved on by the next reading: readings at one instant of the
    loop are 1 ns apart. Code that re-arms a timer for an instant a rounding error past the
    loop's (``0.1 + 0.05 > 0.15``: a heartbeat due at ``sent + period``) would otherwise
    find it not come yet, forever: asyncio runs that timer at once (it is due within the
    clock's resolution) and the loop's time does not move while callbacks are ready.
    """

    #: How far a reading moves on from the last one at the same instant of the loop (s).
    TICK_S = 1e-9

    def __init__(self, wall_at_zero: float = 1_800_000_000.0) -> None:
        self.wall_at_zero = wall_at_zero
        self._last = -math.inf

    def monotonic(self) -> float:
        """The running loop's time (1 ns past the last reading if the loop's has not moved)."""
        now = max(asyncio.get_running_loop().time(), self._last + self.TICK_S)
        self._last = now
        return now

    def time(self) -> float:
        """A wall clock that moves with the loop's time."""
        return self.wall_at_zero + self.monotonic()

    def store_ms(self) -> int:
        """The store's clock on the same time line, for ``MemoryBackend(clock=...)``."""
        return round(self.time() * 1000)
