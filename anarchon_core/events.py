"""What a scheduler does, as events for listeners: metrics, logging, alerting.

``scheduler.add_listener(listener)`` registers a callable that receives every
:class:`Event` (or only the ``kinds`` asked for). Listeners run on the scheduler's event
loop, right where the thing happened, so they see events in order:

* A plain function is called inline and must return quickly (a counter, a log line, a
  queue put). An exception it raises is logged (``anarchon.events``) and the scheduler goes
  on; the other listeners still get the event.
* A coroutine function gets a task per event; at most :data:`MAX_PENDING` such tasks are
  pending per scheduler, beyond that events for it are dropped and counted
  (:attr:`EventBus.dropped`), never queued without bound.

With no listener an event costs a truthiness test: nothing is built.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["MAX_PENDING", "Event", "EventBus", "EventKind", "Listener", "run_fields"]

log = logging.getLogger("anarchon.events")

#: Most tasks of coroutine listeners pending at once, per scheduler.
MAX_PENDING = 1_000


class EventKind(str, enum.Enum):
    """What happened. The value is the name used in logs and metrics labels."""

    #: This instance won attempt 1 of a slot (``lateness_ms``: claim answered − slot).
    CLAIM_WON = "claim_won"
    #: Another instance has the slot: ``outcome`` is ``taken``, ``running`` (this instance
    #: becomes a backup) or ``done``.
    CLAIM_TAKEN = "claim_taken"
    #: The slot is skipped fleet-wide: ``outcome`` ``overlap``, ``reason`` says why.
    CLAIM_SKIPPED = "claim_skipped"
    #: Not run here because it is too late: past ``max_late_ms`` by the store's clock, or
    #: the store was unreachable until then (``reason``).
    LATE = "late"
    #: The store's clock said the slot has not come yet; this instance re-syncs its clock.
    EARLY = "early"
    #: This instance recorded a slot ``missed``: due, but claimed by no instance in time
    #: (``reason``: every instance was down, or the store unreachable).
    MISSED = "missed"
    #: This instance won a later attempt of a run whose runner is gone (``attempt`` > 1).
    TAKEOVER = "takeover"
    #: The handler started (``lateness_ms``: start − slot, by the store's clock).
    ATTEMPT_STARTED = "attempt_started"
    #: The attempt ended and was recorded (``status``, ``error``, ``duration_ms``).
    ATTEMPT_ENDED = "attempt_ended"
    #: The runner lost its lease (another attempt took over, or it could not be confirmed
    #: in time): the handler is cancelled and nothing more is recorded by it.
    FENCED = "fenced"
    #: The run's lease was ended early so a backup takes the next attempt at once.
    HANDED_OVER = "handed_over"
    #: One store call: ``call``, ``duration_ms``, ``error`` (None when it succeeded).
    STORE_CALL = "store_call"
    #: The store became unreachable (``call`` and ``error`` of the first failure).
    STORE_ERROR = "store_error"
    #: The store answers again (``duration_ms``: how long it was unreachable).
    STORE_RECOVERED = "store_recovered"
    #: The offset of the store's clock from this instance's changed (``offset_ms``).
    CLOCK_OFFSET = "clock_offset"


@dataclass(frozen=True)
class Event:
    """One event. Fields that do not apply to its kind are ``None``.

    ``at_ms`` is this instance's wall clock (ms since the epoch) when it happened;
    ``instance`` the scheduler's ``instance_id``.
    """

    kind: EventKind
    instance: str
    at_ms: float
    job: str | None = None
    slot: int | None = None
    attempt: int | None = None
    manual: bool = False
    #: A claim's answer: ``won``, ``taken``, ``running``, ``overlap``, ``done``, ``late``...
    outcome: str | None = None
    reason: str | None = None
    #: An ended attempt's status: ``success``, ``failed``, ``interrupted``.
    status: str | None = None
    error: str | None = None
    lateness_ms: float | None = None
    duration_ms: float | None = None
    #: The store call (``claim``, ``heartbeat``, ``finish``, ``release``, ``clock``...).
    call: str | None = None
    offset_ms: float | None = None


Listener = Callable[[Event], Awaitable[Any] | None]


class EventBus:
    """A scheduler's listeners, and the one way its parts report events to them.

    Adding and removing listeners is thread-safe; events are emitted on the scheduler's
    event loop.
    """

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._listeners: tuple[tuple[Listener, frozenset[EventKind] | None], ...] = ()
        self._lock = threading.Lock()
        self._pending: set[asyncio.Future[Any]] = set()
        #: Events not given to a coroutine listener because too many were pending.
        self.dropped = 0

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def add(self, listener: Listener, kinds: Iterable[EventKind | str] | None = None
            ) -> None:
        """Call ``listener(event)`` for every event, or only for those of ``kinds``."""
        if not callable(listener):
            raise ConfigError(f"invalid listener {listener!r}: not callable")
        wanted = None if kinds is None else frozenset(_kind(k) for k in kinds)
        with self._lock:
            self._listeners = (*self._listeners, (listener, wanted))

    def remove(self, listener: Listener) -> bool:
        """Stop calling ``listener``; False if it was not registered."""
        with self._lock:
            kept = tuple(entry for entry in self._listeners if entry[0] is not listener)
            found = len(kept) != len(self._listeners)
            self._listeners = kept
        return found

    def emit(self, kind: EventKind, **fields: Any) -> None:
        """Give an event to the listeners that want it (nothing happens without one)."""
        listeners = self._listeners
        if not listeners:
            return
        event = Event(kind, self.instance, time.time() * 1000, **fields)
        for listener, kinds in listeners:
            if kinds is not None and kind not in kinds:
                continue
            try:
                result = listener(event)
                if inspect.isawaitable(result):
                    self._schedule(result)
            except Exception:
                log.exception("event listener %r failed on %s", listener, kind.value)

    def _schedule(self, awaitable: Awaitable[Any]) -> None:
        if len(self._pending) >= MAX_PENDING:
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("coroutine event listeners are behind: %d events dropped",
                            self.dropped)
            return
        task = asyncio.ensure_future(awaitable)
        self._pending.add(task)
        task.add_done_callback(self._listener_done)

    def _listener_done(self, task: asyncio.Future[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("event listener failed", exc_info=task.exception())


def run_fields(job: str, slot: int, attempt: int | None, instance: str) -> dict[str, Any]:
    """A run's identity as ``extra`` for a log record (``record.job``, ``record.slot``...)."""
    return {"job": job, "slot": slot, "attempt": attempt, "instance": instance}


def _kind(value: EventKind | str) -> EventKind:
    try:
        return EventKind(value)
    except ValueError:
        raise ConfigError(f"invalid event kind {value!r}: expected one of "
                          f"{', '.join(k.value for k in EventKind)}") from None
