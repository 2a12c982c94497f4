"""When the lease keepers of claim handles start: one timer per instant, not per handle.

A :class:`~anarchon_core.claim.ClaimHandle` heartbeats from a keeper task that starts at
its first heartbeat (most runs end before). Thousands of runs won at one instant would
each put a timer on the event loop's heap and take it off again; here handles due within
the same :data:`GRAIN_S` share one timer, and a handle that ended leaves its set.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import ClassVar, Protocol

__all__ = ["GRAIN_S", "KeeperStarts"]

#: Handles whose keeper is due within this many seconds share a timer; each starts at the
#: beginning of its grain (early, never late).
GRAIN_S = 0.05


class _Keeps(Protocol):
    def _start_keeper(self) -> None: ...


class KeeperStarts:
    """The keeper starts pending on one event loop (see :meth:`for_loop`)."""

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, KeeperStarts]] = \
        weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Only a weak reference: the table of loops holds this object strongly, and a
        # strong one back would keep every loop that ever had a handle alive.
        self._loop = weakref.ref(loop)
        self._due: dict[int, set[_Keeps]] = {}

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> KeeperStarts:
        """The pending starts of ``loop`` (made on first use)."""
        starts = cls._by_loop.get(loop)
        if starts is None:
            starts = cls._by_loop[loop] = cls(loop)
        return starts

    def add(self, handle: _Keeps, delay_s: float) -> set[_Keeps]:
        """Start ``handle``'s keeper in about ``delay_s``; the set to leave if it ends first."""
        loop = self._loop()
        assert loop is not None  # called on its loop
        grain = math.floor((loop.time() + max(0.0, delay_s)) / GRAIN_S)
        handles = self._due.get(grain)
        if handles is None:
            handles = self._due[grain] = set()
            loop.call_at(grain * GRAIN_S, self._start, grain)
        handles.add(handle)
        return handles

    def _start(self, grain: int) -> None:
        for handle in self._due.pop(grain, ()):
            handle._start_keeper()
