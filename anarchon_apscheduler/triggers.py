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

APScheduler's ``CronTrigger`` has a DST rule of its own (every time of a repeated hour
fires twice; the first time of a job inside a gap fires moved later by the gap's length,
its others there not at all). :class:`CronScheduleTrigger` fires at the slots of an
anarchon cron schedule instead: cron(8)'s rule, or the job's ``dst=`` choice.
:meth:`CronScheduleTrigger.from_cron_trigger` gives the one that fires where a
``CronTrigger`` does on every other day (``AnarchonExecutor`` puts it in the job's place).
"""

from __future__ import annotations

import copy
import functools
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any

from apscheduler.triggers.base import BaseTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.calendarinterval import (  # type: ignore[import-untyped]
    CalendarIntervalTrigger,
)
from apscheduler.triggers.combining import (  # type: ignore[import-untyped]
    BaseCombiningTrigger,
)
from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.cron.expressions import (  # type: ignore[import-untyped]
    AllExpression,
    LastDayOfMonthExpression,
    RangeExpression,
    WeekdayPositionExpression,
)
from apscheduler.triggers.cron.fields import (  # type: ignore[import-untyped]
    MAX_VALUES,
    MIN_VALUES,
)
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]
from apscheduler.util import convert_to_datetime  # type: ignore[import-untyped]

from anarchon_core import ConfigError, slot_from_datetime
from anarchon_core.schedules import CronSchedule, Dst, cron_list, ms_to_datetime, zone_name

__all__ = ["EPOCH", "CronScheduleTrigger", "check_trigger", "follows_dst", "lag_ms",
           "lateness_allowance_ms", "slot_for", "translate_trigger"]

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
        if new and isinstance(inner, CalendarIntervalTrigger) and _starts_today(inner):
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


class CronScheduleTrigger(BaseTrigger):  # type: ignore[misc]
    """An APScheduler trigger firing at the slots of an anarchon cron schedule.

    ``CronScheduleTrigger("*/30 * * * *", "Europe/Athens")`` fires where
    ``Scheduler.cron("...", "*/30 * * * *", tz="Europe/Athens")`` would: the expression
    (5 fields, or 6 with seconds first) on the zone's wall clock, and at daylight-saving
    changes cron(8)'s rule or the ``dst`` choice (see
    :class:`~anarchon_core.schedules.DstRule`). ``start_date`` and ``end_date`` bound
    its fire times as a ``CronTrigger``'s do (both included; a naive datetime or a string
    is read in the zone). A bad expression, zone, ``dst`` or date is a
    :class:`~anarchon_core.ConfigError` at once. It pickles by its arguments, so it works
    in any job store.
    """

    def __init__(self, expression: str, timezone: Any = "UTC", dst: Dst = None, *,
                 start_date: Any = None, end_date: Any = None) -> None:
        self.schedule = _cron_schedule(expression, timezone, dst)
        self.start_date = _moment(start_date, self.schedule.zone, "start_date")
        self.end_date = _moment(end_date, self.schedule.zone, "end_date")
        if self.start_date is not None and self.end_date is not None and \
                self.end_date < self.start_date:
            raise ConfigError(f"invalid end_date {self.end_date.isoformat()}: before "
                              f"start_date {self.start_date.isoformat()}")

    @classmethod
    def from_cron_trigger(cls, trigger: Any) -> CronScheduleTrigger:
        """The trigger firing where ``trigger``, an APScheduler ``CronTrigger``, does.

        Its expression has the trigger's fields (seconds first when they are not ``0``),
        its zone and ``start_date``/``end_date`` are the trigger's, and its DST rule is
        cron(8)'s: a minute or hour spelled with ``*`` first (``minute="*/15"``, a ``*``
        APScheduler filled in) makes a wildcard job, anything else a fixed-time one.
        Weekdays are carried by name (APScheduler counts Monday as 0, cron Sunday).

        A :class:`~anarchon_core.ConfigError` says why there is none: a ``year`` or
        ``week`` other than ``*``, a weekday position in ``day`` (``"2nd fri"``), both
        ``day`` and ``day_of_week`` restricted (APScheduler fires on days matching both,
        cron on days matching either), a ``jitter``, or a zone without an IANA name.
        """
        if type(trigger) is not CronTrigger:
            raise ConfigError(f"{type(trigger).__name__} is not a CronTrigger")
        if trigger.jitter:
            raise ConfigError(f"jitter={trigger.jitter} would be lost (CronScheduleTrigger "
                              "has none)")
        zone = zone_name(trigger.timezone)
        if not isinstance(zone, str):
            raise ConfigError(f"its time zone {trigger.timezone!r} has no IANA name")
        expression = cron_expression(trigger)
        return cls(expression, zone, start_date=trigger.start_date, end_date=trigger.end_date)

    @property
    def timezone(self) -> Any:
        """The zone the expression is read in (a :class:`~zoneinfo.ZoneInfo`)."""
        return self.schedule.zone

    def get_next_fire_time(self, previous_fire_time: datetime | None,
                           now: datetime) -> datetime | None:
        """The first slot after ``previous_fire_time``, or at or after ``now`` without one.

        With a previous fire time ``now`` does not matter: APScheduler asks for the run
        times after it up to ``now`` to count the ones it missed. Without one the search
        starts at ``start_date`` if that is later; a slot after ``end_date`` is None.
        """
        if previous_fire_time is None:
            start = now if self.start_date is None else max(now, self.start_date)
        else:
            # In UTC: a local time plus a microsecond loses its fold (the second pass).
            start = previous_fire_time.astimezone(UTC) + _US
        first_ms = -(-(start - EPOCH) // timedelta(milliseconds=1))  # at or after start
        fire = ms_to_datetime(self.schedule.next_after(first_ms - 1)).astimezone(
            self.schedule.zone)
        if self.end_date is not None and fire > self.end_date:
            return None
        return fire

    def __getstate__(self) -> dict[str, Any]:
        """Version 1; ``start_date``/``end_date`` only when given, as optional keys."""
        schedule = self.schedule
        state: dict[str, Any] = {
            "version": 1, "expression": schedule.expression, "timezone": schedule.tz,
            "dst": str(schedule.dst) if schedule.dst_given else None}
        if self.start_date is not None:
            state["start_date"] = self.start_date
        if self.end_date is not None:
            state["end_date"] = self.end_date
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("version", 1) > 1:
            raise ValueError(f"got a serialized CronScheduleTrigger of version "
                             f"{state['version']}; this anarchon reads version 1")
        self.schedule = _cron_schedule(state["expression"], state["timezone"], state["dst"])
        self.start_date = state.get("start_date")
        self.end_date = state.get("end_date")

    def __str__(self) -> str:
        return self.schedule.describe()

    def __repr__(self) -> str:
        bounds = "".join(f", {name}={moment.isoformat()!r}" for name, moment in (
            ("start_date", self.start_date), ("end_date", self.end_date))
            if moment is not None)
        return f"<{type(self).__name__} ({self.schedule.describe()}{bounds})>"


@functools.lru_cache(maxsize=1024)
def _shared_schedule(expression: str, timezone: Any, dst: Any) -> CronSchedule:
    return CronSchedule(expression, timezone, dst)


def _cron_schedule(expression: str, timezone: Any, dst: Any) -> CronSchedule:
    """The schedule, shared by every trigger of the same arguments.

    A job store unpickles a job's trigger each time it reads the job (``AnarchonJobStore``
    every ``sync_interval``): checking the same expression again each time would cost
    more than the read. A schedule never changes once made.
    """
    try:
        return _shared_schedule(expression, timezone, dst)
    except TypeError:  # unhashable: the schedule itself says what is wrong with it
        return CronSchedule(expression, timezone, dst)


def _moment(value: Any, zone: Any, name: str) -> datetime | None:
    """``value`` (a datetime, date or string; naive ones read in ``zone``) as aware."""
    try:
        moment: datetime | None = convert_to_datetime(value, zone, name)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid {name} {value!r}: {exc}") from None
    return moment


# ------------------------------------------------------------------ CronTrigger → cron

#: Weekday names by cron's numbers (``sun`` is 0; APScheduler's 0 is ``mon``).
_CRON_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _values(field: Any) -> set[int]:
    """Every value a field of ``*``, numbers and ranges (steps included) matches.

    ConfigError for a field with another kind of expression (``last``, ``2nd fri``).
    """
    low, high = MIN_VALUES[field.name], MAX_VALUES[field.name]
    values: set[int] = set()
    for expr in field.expressions:
        if type(expr) is AllExpression:  # the others below derive from it
            first, last = low, high
        elif isinstance(expr, RangeExpression):  # month and weekday names too
            first, last = expr.first, high if expr.last is None else expr.last
        else:
            raise ConfigError(f"{field.name}='{field}' uses '{expr}', which has no cron "
                              "spelling that keeps its meaning")
        values.update(range(first, last + 1, expr.step or 1))
    return values


def _spelled(field: Any, expressions: list[Any]) -> str:
    """``expressions`` of ``field`` in cron: ``*`` if they match every value, else as given.

    Month names become numbers; the values are checked by :func:`_check_expansion`.
    """
    copied = copy.copy(field)
    copied.expressions = expressions
    if _values(copied) >= set(range(MIN_VALUES[field.name], MAX_VALUES[field.name] + 1)):
        return "*"
    return ",".join(str(e) if type(e) is AllExpression else RangeExpression.__str__(e)
                    for e in expressions)


def _day(field: Any) -> tuple[str, set[int], bool]:
    """The day-of-month field: its cron spelling, its days, whether ``last`` is one."""
    last = any(isinstance(expr, LastDayOfMonthExpression) for expr in field.expressions)
    plain = [expr for expr in field.expressions
             if not isinstance(expr, LastDayOfMonthExpression)]
    for expr in plain:
        if isinstance(expr, WeekdayPositionExpression):
            raise ConfigError(f"day='{field}': a weekday's position in the month ('{expr}') "
                              "is not translated")
    if not plain:
        return "L", set(), True
    copied = copy.copy(field)
    copied.expressions = plain
    spelled = _spelled(field, plain)
    if spelled == "*":
        return "*", _values(copied), False
    return f"{spelled},L" if last else spelled, _values(copied), last


def cron_expression(trigger: Any) -> str:
    """The cron expression (seconds first unless they are ``0``) of a ``CronTrigger``.

    Seconds, minutes and hours keep the trigger's spelling, which decides the DST rule
    (see :func:`~anarchon_core.schedules.is_wildcard`); days, months and weekdays are
    the values the trigger matches, weekdays by name. ConfigError saying why for a
    trigger no expression fires alike (see :meth:`CronScheduleTrigger.from_cron_trigger`);
    it checks that the core's cron schedule reads the expression as the trigger's values.
    """
    fields = {field.name: field for field in trigger.fields}
    for name, meaning in (("year", "cron has no year field"),
                          ("week", "cron has no ISO week field")):
        if str(fields[name]) != "*":
            raise ConfigError(f"{name}='{fields[name]}': {meaning}")
    day, days, last = _day(fields["day"])
    month = _spelled(fields["month"], fields["month"].expressions)
    weekdays = {(v + 1) % 7 for v in _values(fields["day_of_week"])}  # mon=0 → mon=1
    weekday = "*" if len(weekdays) == 7 else cron_list(weekdays, _CRON_WEEKDAYS, min_range=3)
    if day != "*" and weekday != "*":
        raise ConfigError(
            f"day='{fields['day']}' and day_of_week='{fields['day_of_week']}' both restrict "
            "the day: APScheduler fires on days matching both, cron on days matching either")
    spelled = {name: str(fields[name]) for name in ("second", "minute", "hour")}
    expression = " ".join((spelled["minute"], spelled["hour"], day, month, weekday))
    if spelled["second"] != "0":
        expression = f"{spelled['second']} {expression}"
    expected = {name: _values(fields[name]) for name in ("second", "minute", "hour", "month")}
    expected.update(day=days, day_of_week=weekdays)
    _check_expansion(expression, expected, last=last)
    return expression


def _check_expansion(expression: str, expected: dict[str, set[int]], *, last: bool) -> None:
    """ConfigError unless the core's cron schedule reads ``expression`` as ``expected``.

    ``last``: whether the day field holds ``L`` (the last day of the month).
    """
    try:
        read = CronSchedule(expression).fields()
    except ConfigError as exc:
        raise ConfigError(f"the cron schedule does not accept {expression!r}: {exc}") \
            from None
    for name, values in expected.items():
        if set(read.values(name)) != values:
            raise ConfigError(f"the cron schedule reads the {name} of {expression!r} as "
                              f"{sorted(read.values(name))}, not {sorted(values)}")
    if read.last_day != last:
        raise ConfigError(f"the cron schedule reads the last day of {expression!r} "
                          f"{'in' if read.last_day else 'out'}")
    if read.weekday_positions:
        raise ConfigError(f"the cron schedule reads weekday positions in {expression!r}")


def translate_trigger(trigger: Any) -> CronScheduleTrigger | None:
    """``trigger`` as a :class:`CronScheduleTrigger` if it is a ``CronTrigger``, else None.

    ConfigError saying why a ``CronTrigger`` (or one combined in an ``OrTrigger`` or
    ``AndTrigger``) is not translated.
    """
    if isinstance(trigger, CronTrigger):
        if type(trigger) is not CronTrigger:
            raise ConfigError(f"it is a {type(trigger).__name__}, a subclass of CronTrigger")
        return CronScheduleTrigger.from_cron_trigger(trigger)
    if any(isinstance(inner, CronTrigger) for inner in _triggers(trigger)[1:]):
        raise ConfigError(f"a CronTrigger combined in an {type(trigger).__name__} is not "
                          "translated (combine CronScheduleTriggers instead)")
    return None


def follows_dst(trigger: Any) -> bool:
    """Whether a ``CronTrigger`` in ``trigger`` reads a zone whose offset changes.

    Looked up over the next two years: in a zone without daylight-saving time (UTC, a
    fixed offset) APScheduler's DST rule and anarchon's never differ.
    """
    now = datetime.now(UTC)
    moments = [datetime(now.year + k // 12, k % 12 + 1, 1, tzinfo=UTC) for k in range(24)]
    for inner in _triggers(trigger):
        zone = getattr(inner, "timezone", None)
        if not isinstance(inner, CronTrigger):
            continue
        if not isinstance(zone, tzinfo):
            return True
        if len({moment.astimezone(zone).utcoffset() for moment in moments}) > 1:
            return True
    return False
