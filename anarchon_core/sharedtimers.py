"""Timers shared by the claim handles due at one instant: one timer per grain, not per handle.

A :class:`~anarchon_core.claim.ClaimHandle` heartbeats from a keeper task that starts at
its first heartbeat (most runs end before), and bounds the wait for its end record.
Thousands of runs won at one instant would each put a timer on the event loop's heap and
take it off again; here handles due within the same :data:`GRAIN_S` share one timer, and
a handle that no longer needs it leaves its set.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import Any, ClassVar, Generic, Protocol, TypeVar

__all__ = ["GRAIN_S", "EndDeadlines", "KeeperStarts"]

#: Handles whose keeper is due within this many seconds share a timer; each starts at the
#: beginning of its grain (early, never late).
GRAIN_S = 0.05


class _Keeps(Protocol):
    def _start_keeper(self) -> None: ...


class _Cuts(Protocol):
    def _cut_end(self) -> None: ...


_Item = TypeVar("_Item")
_Timers = TypeVar("_Timers", bound="_GrainTimers[Any]")


class _GrainTimers(Generic[_Item]):
    """Items due within the same grain on one event loop share one timer."""

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]]

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Only a weak reference: the table of loops holds this object strongly, and a
        # strong one back would keep every loop that ever had a handle alive.
        self._loop = weakref.ref(loop)
        self._due: dict[int, set[_Item]] = {}

    @classmethod
    def for_loop(cls: type[_Timers], loop: asyncio.AbstractEventLoop) -> _Timers:
        """The pending items of ``loop`` (made on first use)."""
        timers: _Timers | None = cls._by_loop.get(loop)
        if timers is None:
            timers = cls._by_loop[loop] = cls(loop)
        return timers

    def add(self, item: _Item, delay_s: float) -> set[_Item]:
        """Fire ``item`` in about ``delay_s`` (early by up to a grain, never late).

        Returns the set to leave (``discard``) if it is no longer wanted.
        """
        loop = self._loop()
        assert loop is not None  # called on its loop
        grain = math.floor((loop.time() + max(0.0, delay_s)) / GRAIN_S)
        items = self._due.get(grain)
        if items is None:
            items = self._due[grain] = set()
            loop.call_at(grain * GRAIN_S, self._fire_grain, grain)
        items.add(item)
        return items

    def _fire_grain(self, grain: int) -> None:
        for item in self._due.pop(grain, ()):
            self._fire(item)

    def _fire(self, item: _Item) -> None:
        raise NotImplementedError


class KeeperStarts(_GrainTimers[_Keeps]):
    """The keeper starts pending on one event loop (see :meth:`for_loop`)."""

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]] = \
        weakref.WeakKeyDictionary()

    def _fire(self, item: _Keeps) -> None:
        item._start_keeper()


class EndDeadlines(_GrainTimers[_Cuts]):
    """End records still unanswered at their deadline, cut from one timer per grain.

    A run's end record is bounded so that a hung client cannot hold the run forever; the
    bound is a second or more, so being early by up to a grain does not matter, and
    thousands of end records at one instant then share a few timers instead of a timer
    and a timeout object each.
    """

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]] = \
        weakref.WeakKeyDictionary()

    def _fire(self, item: _Cuts) -> None:
        item._cut_end()
