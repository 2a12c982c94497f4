"""Is the store reachable? One log line when an outage starts and one when it ends.

Every part of a scheduler that calls the store (claims, backups' checks, heartbeats, end
records, the clock) reports each call's success or failure here. During an outage each
call still retries on its own, but only this tracker logs: the first failure (a warning
naming the call and the error) and the first success after it (with the outage's length,
how many calls failed and how many slots went unrun meanwhile). A scale run with
thousands of calls a second thus logs two lines per outage, not one per call.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .clocks import SYSTEM_CLOCK, Clock
from .errors import StoreUnavailable
from .events import EventBus, EventKind

T = TypeVar("T")

__all__ = ["StoreHealth"]

log = logging.getLogger("anarchon.store")
#: Slots not run during one outage that are remembered (to be recorded ``missed``).
MAX_MISSED_KEPT = 10_000
#: After an outage ends, failures within this many seconds (stale connections of the
#: outage) start a new outage quietly; it is logged only if it lasts this long.
SETTLE_S = 10.0


class StoreHealth:
    """Tracks whether the store answers, for one scheduler."""

    def __init__(self, events: EventBus, describe: str,
                 on_recovered: Callable[[list[tuple[str, int]]], None] | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        #: The local clocks the tracker times calls on.
        self.clock = clock
        self._events = events
        self._describe = describe
        #: Called after an outage with the (job, slot) pairs not run meanwhile.
        self.on_recovered = on_recovered
        self._missed_slots: list[tuple[str, int]] = []
        #: A failure before this instant (monotonic) follows a recovery closely: the stale
        #: pooled connections of the outage failing one by one, not a new outage worth a
        #: line. Such a blip is logged at DEBUG unless it lasts.
        self._settling_until = 0.0
        self._quiet = False
        #: The monotonic instant of the first failure of the current outage (None: up).
        self.down_since: float | None = None
        self._failed_calls = 0
        self._missed: Counter[str] = Counter()

    @property
    def down(self) -> bool:
        """True from a failed store call until the next successful one."""
        return self.down_since is not None

    async def timed(self, call: str, request: Awaitable[T]) -> T:
        """Await one store call and report it: its duration, and a failure or a success.

        :class:`~anarchon_core.StoreUnavailable` is reported and raised again; any other
        answer (whatever it says) counts as the store answering.
        """
        started = self.clock.monotonic()
        try:
            answer = await request
        except StoreUnavailable as exc:
            self.failed(call, exc, started)
            raise
        self.succeeded(call, started)
        return answer

    def call_done(self, call: str, started: float, error: BaseException | None = None
                  ) -> None:
        """Report a store call that started at ``started`` (the clock's monotonic time)."""
        if error is None:
            self.succeeded(call, started)
        else:
            self.failed(call, error, started)

    def succeeded(self, call: str, started: float | None = None) -> None:
        """A store call answered (whatever the answer)."""
        events = self._events
        if events and started is not None:
            events.emit(EventKind.STORE_CALL, call=call,
                        duration_ms=(self.clock.monotonic() - started) * 1000)
        if self.down_since is None:
            return
        length = self.clock.monotonic() - self.down_since
        failed, missed, slots = self._failed_calls, self._missed, self._missed_slots
        self.down_since, self._failed_calls, self._missed = None, 0, Counter()
        self._missed_slots = []
        unrun = ""
        if missed:
            jobs = ", ".join(f"{job} ×{n}" for job, n in missed.most_common(5))
            more = f" and {len(missed) - 5} more job(s)" if len(missed) > 5 else ""
            unrun = f"; {sum(missed.values())} slot(s) not run meanwhile: {jobs}{more}"
        quiet, self._quiet = self._quiet and length < SETTLE_S, False
        log.log(logging.DEBUG if quiet else logging.WARNING,
                "store %s reachable again after %.1f s (%d call(s) failed%s)",
                self._describe, length, failed, unrun,
                extra={"outage_s": round(length, 3), "failed_calls": failed})
        self._settling_until = self.clock.monotonic() + SETTLE_S
        events.emit(EventKind.STORE_RECOVERED, call=call, duration_ms=length * 1000)
        if slots and self.on_recovered is not None:
            self.on_recovered(slots)

    def failed(self, call: str, error: BaseException, started: float | None = None) -> bool:
        """A store call failed; True if this failure starts an outage (and was logged)."""
        events = self._events
        if events and started is not None:
            events.emit(EventKind.STORE_CALL, call=call,
                        duration_ms=(self.clock.monotonic() - started) * 1000,
                        error=str(error))
        self._failed_calls += 1
        if self.down_since is not None:
            if self._quiet and self.clock.monotonic() - self.down_since >= SETTLE_S:
                # The blip lasts: it is an outage after all, say so once.
                self._quiet = False
                log.warning("store %s unreachable (%s: %s); calls are retried, the next "
                            "line comes when it answers again", self._describe, call, error,
                            extra={"call": call})
            return False
        self.down_since = self.clock.monotonic()
        self._quiet = self.down_since < self._settling_until
        log.log(logging.DEBUG if self._quiet else logging.WARNING,
                "store %s unreachable (%s: %s); calls are retried, the next line comes "
                "when it answers again", self._describe, call, error, extra={"call": call})
        events.emit(EventKind.STORE_ERROR, call=call, error=str(error))
        return True

    def slot_missed(self, job: str, slot: int) -> bool:
        """A slot of ``job`` was not run because the store could not be reached in time.

        True if it was counted for the recovery line (the store is down); False if the
        caller should log it itself.
        """
        if self.down_since is None:
            return False
        self._missed[job] += 1
        if len(self._missed_slots) < MAX_MISSED_KEPT:
            self._missed_slots.append((job, slot))
        return True
