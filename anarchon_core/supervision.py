"""Supervision of a scheduler's background loops: none of them dies silently.

Every background loop of a scheduler (the timer, the store clock, the fleet registry and
paused jobs, orphan recovery, the downtime scan) runs under :meth:`LoopGuard.run`:

* A failure of one item of a loop (one job's orphan scan, one chunk of the downtime scan,
  one refresh of the paused jobs) is caught by :meth:`LoopGuard.item`, logged at ERROR
  (at most once a minute per item) and skipped: the loop goes on with the next item.
* A loop that raises is logged at ERROR with its traceback and started again after a
  back-off (1 s, doubling up to 60 s; back to 1 s once it has run a minute), for as long
  as the scheduler runs. A loop that returns has finished its work.

Failures the loops expect (a store that is unreachable) are handled by the loops
themselves; this is for everything else, so that one bad record or one bug never leaves
an instance running with half its machinery stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

__all__ = ["LoopGuard"]

log = logging.getLogger("anarchon.scheduler")

_FIRST_DELAY_S = 1.0
_MAX_DELAY_S = 60.0
#: A loop that ran this long before failing is restarted after the first delay again.
_HEALTHY_S = 60.0
#: An item failing again is logged at ERROR at most this often; DEBUG in between.
_ITEM_REPEAT_S = 60.0
_MAX_ITEMS = 10_000


class LoopGuard:
    """Supervises one background loop named ``name`` while ``running()`` is true."""

    def __init__(self, name: str, running: Callable[[], bool]) -> None:
        self.name = name
        self._running = running
        self._item_logged: dict[str, float] = {}
        #: How many times the loop failed and was restarted (for tests and health).
        self.restarts = 0

    async def run(self, body: Callable[[LoopGuard], Coroutine[Any, Any, None]]) -> None:
        """Run ``body(self)``; if it raises, log it and run it again after a back-off."""
        delay = _FIRST_DELAY_S
        while self._running():
            started = time.monotonic()
            try:
                await body(self)
            except Exception:
                if not self._running():
                    return
                if time.monotonic() - started >= _HEALTHY_S:
                    delay = _FIRST_DELAY_S
                self.restarts += 1
                log.exception("the %s loop failed; restarting it in %.0f s", self.name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY_S)
            else:
                return

    def item(self, what: str) -> _Item:
        """``with guard.item("orphan scan of sync"):`` logs and swallows what the block raises.

        ``BaseException`` (cancellation, ``KeyboardInterrupt``) is never swallowed.
        """
        return _Item(self, what)

    def _failed(self, what: str, exc: Exception) -> None:
        now = time.monotonic()
        last = self._item_logged.get(what)
        if last is not None and now - last < _ITEM_REPEAT_S:
            log.debug("%s loop: %s failed again: %r", self.name, what, exc)
            return
        if len(self._item_logged) >= _MAX_ITEMS:
            self._item_logged.clear()
        self._item_logged[what] = now
        log.error("%s loop: %s failed; going on with the rest", self.name, what,
                  exc_info=exc)


class _Item:
    __slots__ = ("_guard", "_what")

    def __init__(self, guard: LoopGuard, what: str) -> None:
        self._guard = guard
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if isinstance(exc, Exception):
            self._guard._failed(self._what, exc)
            return True
        return False
