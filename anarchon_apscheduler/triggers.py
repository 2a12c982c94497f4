"""From APScheduler run times to anarchon slots: the same slot on every process.

APScheduler computes each job's run times in every process on its own. Two things make
them differ between processes, and both are handled here:

* **Jitter.** A trigger with ``jitter`` adds a random delay, drawn by each process. The slot
  is the trigger's time *without* the jitter: the latest time the same trigger without
  jitter fires at or before the run time. An ``IntervalTrigger`` with jitter also drifts
  (APScheduler adds the next interval to the jittered time), so its run times are mapped
  to the cell of its grid (``start_date + k × interval``) they fall in.
* **An ``IntervalTrigger`` without a fixed ``start_date``.** APScheduler then starts it at
  "now + interval" in each process, so the processes' run times never meet. Such a
  trigger is refused (:func:`check_trigger`) with an error naming the job: a start taken
  from the clock has a fraction of a second, a ``start_date`` someone wrote has none.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.triggers.combining import (  # type: ignore[import-untyped]
    BaseCombiningTrigger,
)
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]

from anarchon_core import ConfigError, slot_from_datetime

__all__ = ["EPOCH", "check_trigger", "lateness_allowance_ms", "slot_for"]

#: 1970-01-01T00:00:00Z: a fixed ``start_date`` that puts an interval on the epoch grid
#: (``IntervalTrigger(seconds=10, start_date=EPOCH)`` fires at :00, :10, :20 ...).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: Float rounding in APScheduler's interval arithmetic moves a run time by a microsecond
#: or so; anything this close to a grid point is that grid point.
_TOLERANCE_US = 1_000
#: Fire times looked at when searching the un-jittered time of a run time.
_MAX_STEPS = 10_000


def _triggers(trigger: Any) -> list[Any]:
    """The trigger and every trigger combined inside it."""
    found = [trigger]
    if isinstance(trigger, BaseCombiningTrigger):
        for inner in trigger.triggers:
            found.extend(_triggers(inner))
    return found


def check_trigger(job_id: str, trigger: Any) -> None:
    """Raise :class:`ConfigError` if ``trigger`` gives each process different run times.

    That is an ``IntervalTrigger`` (alone or inside an ``OrTrigger``/``AndTrigger``)
    whose ``start_date`` was not given: APScheduler sets it to the moment the trigger was
    made plus the interval, which differs in every process, so anarchon could not tell
    that two processes' run times are the same firing.
    """
    for inner in _triggers(trigger):
        if isinstance(inner, IntervalTrigger) and inner.start_date.microsecond:
            raise ConfigError(
                f"job {job_id!r}: its trigger {inner} has no fixed start_date; APScheduler "
                f"started it at {inner.start_date.isoformat()} in this process, so every "
                "process computes different run times and each would run its own firings. "
                "Give it a fixed start_date on a whole second, e.g. "
                "add_job(..., 'interval', seconds=10, start_date='2000-01-01 00:00:00+00:00')"
                " or IntervalTrigger(seconds=10, start_date=anarchon_apscheduler.EPOCH)"
            )


def _jitter_s(trigger: Any) -> float:
    """The largest total jitter ``trigger`` can add, in seconds."""
    own = float(getattr(trigger, "jitter", None) or 0)
    if isinstance(trigger, BaseCombiningTrigger):
        own += max((_jitter_s(t) for t in trigger.triggers), default=0.0)
    return own


def lateness_allowance_ms(trigger: Any) -> int:
    """How much later than its slot a run time of ``trigger`` may come, by design.

    The jitter, plus, for a jittered ``IntervalTrigger``, one interval (its run times
    drift through the cells of its grid).
    """
    allowance = _jitter_s(trigger)
    for inner in _triggers(trigger):
        if isinstance(inner, IntervalTrigger) and inner.jitter:
            allowance += inner.interval_length
    return round(allowance * 1000)


def _us(moment: datetime) -> int:
    return (moment - EPOCH) // _US


def _nearest_ms(moment: datetime) -> int:
    return slot_from_datetime(moment + timedelta(microseconds=500))


def _interval_slot(trigger: Any, run_time: datetime) -> int:
    start = _us(trigger.start_date)
    step = trigger.interval // _US
    run = _us(run_time)
    cells = (run - start + _TOLERANCE_US) // step
    point = start + cells * step
    if cells < 0 or (not trigger.jitter and abs(run - point) > _TOLERANCE_US):
        # Not one of the trigger's own times (e.g. next_run_time set by hand): as it is.
        return _nearest_ms(run_time)
    slot: int = (point + 500) // 1000
    return slot


def _without_jitter(trigger: Any) -> Any:
    stripped = copy.deepcopy(trigger)
    for inner in _triggers(stripped):
        if hasattr(inner, "jitter"):
            inner.jitter = None
    return stripped


def slot_for(trigger: Any, run_time: datetime) -> int:
    """The slot (ms since the epoch) of ``run_time``, a run time ``trigger`` produced.

    Without jitter it is the run time itself (to the nearest millisecond). With jitter it
    is the time the trigger would have fired without it, so every process gets the same
    slot although each drew its own delay. A run time the trigger never produces (a
    ``next_run_time`` set by hand) is its own slot.
    """
    if isinstance(trigger, IntervalTrigger):
        return _interval_slot(trigger, run_time)
    jitter = _jitter_s(trigger)
    if not jitter:
        return _nearest_ms(run_time)
    stripped = _without_jitter(trigger)
    window = timedelta(milliseconds=lateness_allowance_ms(trigger) + 1)
    limit = run_time + timedelta(microseconds=_TOLERANCE_US)
    best: datetime | None = None
    fire = stripped.get_next_fire_time(None, run_time - window)
    for _ in range(_MAX_STEPS):
        if fire is None or fire > limit:
            break
        best = fire
        fire = stripped.get_next_fire_time(fire, fire)
        if fire is not None and best is not None and fire <= best:
            break
    return _nearest_ms(best if best is not None else run_time)
