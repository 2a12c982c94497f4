"""The local clocks every time-keeping part of the scheduler reads, as one injectable object.

A :class:`Scheduler` reads wall and monotonic time only through its ``clock`` (by default
:data:`SYSTEM_CLOCK`), so its logic can be tested on controlled time, e.g. a clock that
follows a fast-forwarded event loop.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    """The local clocks: wall time and monotonic time, in seconds."""

    def time(self) -> float:
        """Seconds since the epoch (``time.time()``)."""
        ...

    def monotonic(self) -> float:
        """A clock that never goes back (``time.monotonic()``)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def time(self) -> float:
        """``time.time()``."""
        return time.time()

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()


#: The clock a scheduler reads unless given another.
SYSTEM_CLOCK = SystemClock()
