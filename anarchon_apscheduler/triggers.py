"""From APScheduler run times to anarchon slots: the same slot on every process.

APScheduler computes each job's run times in every process on its own. Two things make
them differ between processes, and both are handled here:

* **Jitter.** A trigger with ``jitter`` adds a random delay, drawn by each process. The slot
  is the trigger's time *without* the jitter: the latest time the same trigger without
  jitter fires at or before the run time. An ``IntervalTrigger`` with jitter also drifts
  (APScheduler adds the next interval to the jittered time), so its run times are mapped
  to the cell of its grid (``start_date + k × interval``) they fall in.
* **An ``IntervalTrigger`` whose run times are off its grid.** APScheduler computes each
  run time as the previous one plus the interval, so a first run time set by hand
  (``next_run_time=datetime.now(...)``, ``modify_job(next_run_time=...)``) moves every
  later one by the same amount, and each process by its own. Every run time of an
  ``IntervalTrigger`` is therefore mapped to the grid point ``start_date + k × interval``
  at or before it: all processes' firings within one interval are one slot.
  :func:`lag_ms` says how far after its slot such a run time comes, so that the claim is
  not judged late for it.
* **An ``IntervalTrigger`` without a fixed ``start_date``.** APScheduler then starts it at
  "now + interval" in each process, so the processes' grids never meet. Such a trigger is
  refused (:func:`check_trigger`) with an error naming the job: a start taken from the
  clock has a fraction of a second, a ``start_date`` someone wrote has none.
* **A ``CalendarIntervalTrigger`` without ``start_date``.** It then starts on the day the
  process made it, so processes started on different days fire on different days. Made
  today, it cannot be told from one given today's date, so one whose ``start_date`` is
  today is refused when the job is added (see :func:`check_trigger`).
"""

from __future__ import annotations

import copy
from datetime import UTC, date, datetime, timedelta
from typing import Any

from apscheduler.triggers.combining import (  # type: ignore[import-untyped]
    BaseCombiningTrigger,
)
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]

try:  # APScheduler 3.11 and later
    from apscheduler.triggers.calendarinterval import (  # type: ignore[import-untyped]
        CalendarIntervalTrigger,
    )
except ImportError:  # pragma: no cover - APScheduler 3.10 has no calendar intervals
    CalendarIntervalTrigger = None

from anarchon_core import ConfigError, slot_from_datetime

__all__ = ["EPOCH", "check_trigger", "lag_ms", "lateness_allowance_ms", "slot_for"]

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


def check_trigger(job_id: str, trigger: Any, *, new: bool = True) -> None:
    """Raise :class:`ConfigError` if ``trigger`` gives each process different run times.

    That is an ``IntervalTrigger`` (alone or inside an ``OrTrigger``/``AndTrigger``)
    whose ``start_date`` was not given: APScheduler sets it to the moment the trigger was
    made plus the interval, which differs in every process, so anarchon could not tell
    that two processes' run times are the same firing.

    With ``new`` (the job is being added), also a ``CalendarIntervalTrigger`` longer than
    one day whose ``start_date`` is today: without ``start_date`` it starts on the day it
    was made, so processes started on different days would fire on different days. Pass
    ``new=False`` for a trigger made earlier (its start day may be today by design).
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
        if new and CalendarIntervalTrigger is not None and \
                isinstance(inner, CalendarIntervalTrigger) and _starts_today(inner):
            raise ConfigError(
                f"job {job_id!r}: its trigger {inner} starts today ({inner.start_date}); "
                "without start_date a CalendarIntervalTrigger starts on the day each "
                "process made it, so processes started on different days would fire on "
                "different days and each would run its own firings. Give it a fixed "
                "start_date that is not today, e.g. add_job(..., 'calendarinterval', "
                "weeks=1, hour=8, start_date='2024-01-01') (a Monday: every Monday)"
            )


def _starts_today(trigger: Any) -> bool:
    """True if a calendar interval longer than one day has today as its start date."""
    if (trigger.years, trigger.months, trigger.weeks, trigger.days) == (0, 0, 0, 1):
        return False  # every day, whichever day it started
    # APScheduler's default is the machine's local date; the trigger's zone may differ.
    today = {date.today(), datetime.now(trigger.timezone).date()}
    return trigger.start_date in today


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


def _interval_point_us(trigger: Any, run_time: datetime) -> int:
    """The grid point (``start_date + k × interval``) at or before ``run_time``, in µs."""
    start = _us(trigger.start_date)
    step = trigger.interval // _US
    cells = (_us(run_time) - start + _TOLERANCE_US) // step
    point: int = start + cells * step
    return point


def _interval_slot(trigger: Any, run_time: datetime) -> int:
    slot: int = (_interval_point_us(trigger, run_time) + 500) // 1000
    return slot


def lag_ms(trigger: Any, run_time: datetime) -> int:
    """How long after its slot ``run_time`` comes because it is off its trigger's grid.

    Non-zero only for an ``IntervalTrigger`` without jitter whose run times were moved off
    its grid (a ``next_run_time`` set by hand): each is up to one interval after its
    slot. A jittered interval's drift is in :func:`lateness_allowance_ms` already.
    """
    if not isinstance(trigger, IntervalTrigger) or trigger.jitter:
        return 0
    behind = _us(run_time) - _interval_point_us(trigger, run_time)
    return max(0, -(-behind // 1000))


def _without_jitter(trigger: Any) -> Any:
    stripped = copy.deepcopy(trigger)
    for inner in _triggers(stripped):
        if hasattr(inner, "jitter"):
            inner.jitter = None
    return stripped


def slot_for(trigger: Any, run_time: datetime) -> int:
    """The slot (ms since the epoch) of ``run_time``, a run time ``trigger`` produced.

    For an ``IntervalTrigger`` it is the grid point ``start_date + k × interval`` at or
    before the run time, whatever moved the run time off the grid (jitter, or a
    ``next_run_time`` set by hand): each interval is one firing on every process. For
    other triggers, without jitter it is the run time itself (to the nearest millisecond);
    with jitter it is the time the trigger would have fired without it, so every process
    gets the same slot although each drew its own delay. A run time such a trigger never
    produces (a ``next_run_time`` set by hand) is its own slot.
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
