"""A job as a scheduler holds it once registered (``every``, ``cron``, ``define``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .claim import ClaimHandle
    from .execution import Handler
    from .options import JobOptions
    from .schedules import Schedule

__all__ = ["RegisteredJob"]


@dataclass
class RegisteredJob:
    """A job as one scheduler holds it: its schedule, handler, options and timer state."""

    name: str
    schedule: Schedule | None
    handler: Handler | None
    options: JobOptions
    #: The sequence number of the job's pending timer entry; changed to invalidate it
    #: (re-armed or stopped).
    generation: int = 0
    #: False for ``define()``d jobs: their caller claims their slots, the timer never does.
    fires: bool = True
    #: ``define(on_takeover=...)``: given the handle of a run this instance took over.
    on_takeover: Callable[[ClaimHandle], Any] | None = None
    #: ``define(schedule_text=...)``: what decides the timing of a job without a schedule.
    schedule_text: str | None = None
    #: ``define(contenders=True)``: every instance of the fleet claims the job's slots from
    #: its own timer, and contender sets decide which of them ask the store.
    contends: bool = False
    #: The (slot, manual) runs this instance watches as a backup; made when first needed
    #: (thousands of jobs: one object fewer each for the collector to scan).
    watching: set[tuple[int, bool]] | None = None
    #: Every slot up to this instant (store ms) was fired here, or left to catch-up at
    #: start: re-arming after a change of contenders goes on from it, so no slot is
    #: claimed twice here or passed over.
    handled_ms: int | None = None
    #: ``catch_up="all"`` goes through the missed slots: the job's timer is armed when it
    #: is done, so no slot of its own comes due beside a catch-up run (and is skipped).
    catching_up: bool = False

    def is_watching(self, key: tuple[int, bool]) -> bool:
        """Whether this instance already watches that run as a backup."""
        return self.watching is not None and key in self.watching
