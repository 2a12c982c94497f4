"""Schedules: the pure computation of slots (integer ms since the Unix epoch, UTC).

Every instance computes the same slots from the same schedule without talking to the
others, so everything here is deterministic and independent of when a process started.

Cron expressions are evaluated on the wall clock of their IANA time zone. At
daylight-saving changes the default rule is cron(8)'s (Vixie cron, cronie):

* A **wildcard** job (``*`` first in the minute or hour field, e.g. ``*/30 * * * *`` or
  ``0 * * * *``, and ``@hourly``) follows the wall clock: it fires on both passes of a
  repeated hour, and a wall time a spring-forward gap skips does not occur.
* A **fixed-time** job (neither field starts with ``*``; ``@daily``, ``@weekly``,
  ``@monthly``, ``@yearly``) runs once: in a repeated hour at the first pass, and a time
  skipped by a gap once, right after the gap (at the change itself). Several of its
  times inside one gap are one slot.

A job's ``dst=`` overrides either side: :data:`FALL_BACK` (``once_first``,
``once_last``, ``both``) and :data:`SPRING_FORWARD` (``shift``, ``skip``).
"""

from __future__ import annotations

import abc
import copy
import functools
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from .durations import Duration, format_ms, parse_duration_ms, shown
from .errors import ConfigError

__all__ = [
    "CRON_FIELD_RANGES",
    "FALL_BACK",
    "SPRING_FORWARD",
    "CronFields",
    "CronSchedule",
    "Dst",
    "DstRule",
    "EverySchedule",
    "Schedule",
    "cron_list",
    "cron_schedule",
    "is_wildcard",
    "ms_to_datetime",
    "zone_name",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
# Bounds the walk over wall-clock times around a DST change; a 6-field cron firing every
# second across a 2-hour shift needs 7,200 steps.
_MAX_STEPS = 20_000
#: Longest cron expression and time zone name accepted (both far above any real one).
MAX_EXPRESSION = 200
MAX_ZONE_NAME = 100
#: What a cron job does with a wall time that occurs twice (clocks go back).
FALL_BACK = ("once_first", "once_last", "both")
#: What a cron job does with a wall time that does not occur (clocks go forward).
SPRING_FORWARD = ("shift", "skip")
#: What ``dst=`` accepts (see :meth:`DstRule.parse`).
Dst = str | tuple[str, ...] | list[str] | Mapping[str, str] | None
#: The @-shortcuts that are wildcard jobs: cron(8) gives ``@hourly`` a ``*`` hour.
_WILDCARD_MACROS = ("@hourly",)
#: Most skipped wall times a DST note names before it counts the rest.
_NOTE_TIMES = 3


def ms_to_datetime(ms: int) -> datetime:
    """Return the aware UTC datetime of ``ms`` (exact to the millisecond)."""
    return _EPOCH + timedelta(milliseconds=ms)


def _datetime_to_ms(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


class Schedule(abc.ABC):
    """A rule that yields slots. Subclasses are immutable and deterministic."""

    @abc.abstractmethod
    def next_after(self, ms: int) -> int:
        """Return the first slot strictly after ``ms``."""

    @abc.abstractmethod
    def latest_at_or_before(self, ms: int) -> int:
        """Return the last slot at or before ``ms``."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Return the schedule as text, e.g. ``"every 10s"``."""

    def upcoming(self, after_ms: int, count: int) -> list[int]:
        """Return the next ``count`` slots strictly after ``after_ms``, in order."""
        out: list[int] = []
        at = after_ms
        for _ in range(count):
            at = self.next_after(at)
            out.append(at)
        return out

    def typical_gap_ms(self, around_ms: int) -> int:
        """Return the smallest gap between the slots that follow ``around_ms``.

        Used for defaults that scale with the schedule (jitter, lateness).
        """
        slots = self.upcoming(around_ms, 6)
        return min(b - a for a, b in itertools.pairwise(slots))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class EverySchedule(Schedule):
    """Slots on a fixed grid counted from 1970-01-01T00:00:00Z, shifted by ``offset``."""

    def __init__(self, interval: Duration, offset: Duration = 0) -> None:
        self.interval_ms = parse_duration_ms(interval, what="interval")
        self.offset_ms = parse_duration_ms(offset, what="offset", allow_zero=True)
        if self.offset_ms >= self.interval_ms:
            raise ConfigError(
                f"invalid offset {shown(offset)}: must be smaller than the interval "
                f"{shown(interval)}"
            )

    def next_after(self, ms: int) -> int:
        """Return the first grid point strictly after ``ms``."""
        return self.latest_at_or_before(ms) + self.interval_ms

    def latest_at_or_before(self, ms: int) -> int:
        """Return the last grid point at or before ``ms``."""
        k = (math.floor(ms) - self.offset_ms) // self.interval_ms  # slots stay ints
        return k * self.interval_ms + self.offset_ms

    def typical_gap_ms(self, around_ms: int) -> int:
        """Return the interval."""
        return self.interval_ms

    def describe(self) -> str:
        """Return e.g. ``"every 1h offset 15m"``."""
        text = f"every {format_ms(self.interval_ms)}"
        return f"{text} offset {format_ms(self.offset_ms)}" if self.offset_ms else text


def zone_name(tz: object) -> object:
    """The IANA name of ``tz`` when it is a zone object that has one, else ``tz`` unchanged.

    Takes a :class:`~zoneinfo.ZoneInfo` (as Django's and Celery's settings give), UTC
    (``datetime.UTC``) and pytz zones. A fixed offset has no name, and no DST rule, so it
    stays an object and is refused.
    """
    if isinstance(tz, ZoneInfo):
        return tz.key if tz.key is not None else tz
    if tz is UTC:
        return "UTC"
    name = getattr(tz, "zone", None)  # pytz
    if isinstance(tz, tzinfo) and isinstance(name, str):
        return name
    return tz


@dataclass(frozen=True)
class DstRule:
    """What a cron job does at a daylight-saving change: one choice per direction.

    ``fall_back`` (clocks go back, a wall time occurs twice): ``once_first`` fires at
    its first occurrence, ``once_last`` at its second, ``both`` at each.
    ``spring_forward`` (clocks go forward, a wall time does not occur): ``shift`` fires
    once at the change, the first instant after the gap; ``skip`` does not fire.
    """

    fall_back: str
    spring_forward: str

    @classmethod
    def default(cls, *, wildcard: bool) -> DstRule:
        """cron(8)'s rule: ``both,skip`` for a wildcard job, ``once_first,shift`` otherwise."""
        return cls("both", "skip") if wildcard else cls("once_first", "shift")

    @classmethod
    def parse(cls, dst: object, *, wildcard: bool) -> DstRule:
        """The rule ``dst`` asks for, the default for any side it leaves out.

        ``dst`` is None (the default rule), one choice (``"once_last"``: that side), two
        (one per side) as ``"once_last,skip"`` or a tuple or list, or a mapping
        ``{"fall_back": ..., "spring_forward": ...}`` with one or both keys. Anything
        else is a :class:`ConfigError` naming the value and the choices.
        """
        rule = cls.default(wildcard=wildcard)
        if dst is None:
            return rule
        names: list[object]
        if isinstance(dst, str):
            names = [part.strip() for part in dst.split(",")]
        elif isinstance(dst, tuple | list) and 1 <= len(dst) <= 2:
            names = list(dst)
        elif isinstance(dst, Mapping) and dst and set(dst) <= {"fall_back", "spring_forward"}:
            fall = dst.get("fall_back", rule.fall_back)
            spring = dst.get("spring_forward", rule.spring_forward)
            if _choice(fall, FALL_BACK) and _choice(spring, SPRING_FORWARD):
                return cls(fall, spring)
            raise _bad_dst(dst)
        else:
            raise _bad_dst(dst)
        fall, spring, sides = rule.fall_back, rule.spring_forward, set()
        for name in names:
            if _choice(name, FALL_BACK) and "fall" not in sides:
                fall = name
                sides.add("fall")
            elif _choice(name, SPRING_FORWARD) and "spring" not in sides:
                spring = name
                sides.add("spring")
            else:
                raise _bad_dst(dst)
        return cls(fall, spring)

    def __str__(self) -> str:
        return f"{self.fall_back},{self.spring_forward}"


def _choice(name: object, choices: tuple[str, ...]) -> bool:
    return isinstance(name, str) and name in choices


def _bad_dst(dst: object) -> ConfigError:
    return ConfigError(
        f"invalid dst {shown(dst)}: expected None, a choice for the repeated hour when "
        f"clocks go back ({', '.join(FALL_BACK)}) or for the gap when they go forward "
        f"({', '.join(SPRING_FORWARD)}), one of each as 'once_last,skip' or a tuple, or "
        "a mapping {'fall_back': ..., 'spring_forward': ...}")


def is_wildcard(expression: str) -> bool:
    """Whether cron(8) treats ``expression`` as a wildcard job at DST changes.

    That is a minute or hour field whose first character is ``*`` (``*``, ``*/30``), as
    Vixie cron's ``MIN_STAR``/``HR_STAR``, and ``@hourly``. ``@daily``, ``@weekly``,
    ``@monthly`` and ``@yearly`` are fixed-time jobs (midnight), as in cron(8). With 6
    fields the leading seconds field does not count.
    """
    fields = expression.split()
    if len(fields) == 1:
        return fields[0].lower() in _WILDCARD_MACROS
    minute, hour = fields[-5], fields[-4]
    return minute.startswith("*") or hour.startswith("*")


_ONE_VALUE_RANGE = re.compile(r"^(\w+)-(\w+)(/\d+)?$")


def _croniter_spelling(expression: str) -> str:
    """``expression`` with each range of one value (``5-5``, ``5-5/10``) as that value.

    croniter reads such a range as ``*`` (or as ``*/n``), cron(8) as the value.
    """
    if expression.startswith("@"):
        return expression
    fields = []
    for field in expression.split(" "):
        parts = []
        for part in field.split(","):
            match = _ONE_VALUE_RANGE.match(part)
            parts.append(match[1] if match and match[1].lower() == match[2].lower() else part)
        fields.append(",".join(parts))
    return " ".join(fields)


#: The values each field of a cron expression can take, in cron's numbers (Sunday is 0).
CRON_FIELD_RANGES: Mapping[str, tuple[int, int]] = {
    "second": (0, 59), "minute": (0, 59), "hour": (0, 23), "day": (1, 31), "month": (1, 12),
    "day_of_week": (0, 6),
}
#: How long a cron schedule keeps its typical gap (ms).
_GAP_KEPT_MS = 60_000
#: The fields in the order cron's expansion lists them (seconds last).
_EXPANSION_ORDER = ("minute", "hour", "day", "month", "day_of_week", "second")


@dataclass(frozen=True)
class CronFields:
    """What a cron expression matches, field by field, as the schedule reads it.

    ``last_day``: the day field holds ``L`` (the month's last day, beside ``day``);
    ``weekday_positions``: the weekday field holds ``fri#2``-style positions.
    """

    second: frozenset[int]
    minute: frozenset[int]
    hour: frozenset[int]
    day: frozenset[int]
    month: frozenset[int]
    day_of_week: frozenset[int]
    last_day: bool
    weekday_positions: bool

    def values(self, name: str) -> frozenset[int]:
        """The values of the field ``name`` (``"minute"``, ``"day_of_week"``...)."""
        return frozenset(getattr(self, name))


class CronSchedule(Schedule):
    """A 5-field (or 6-field, seconds first) cron expression in an IANA time zone.

    ``dst`` chooses what happens at daylight-saving changes (see :class:`DstRule`); by
    default the rule of cron(8): wildcard jobs follow the wall clock, fixed-time jobs
    run once.
    """

    def __init__(self, expression: str, tz: str | tzinfo = "UTC", dst: Dst = None) -> None:
        if not isinstance(expression, str) or not expression.strip():
            raise ConfigError(
                f"invalid cron expression {shown(expression)}: expected a string")
        if len(expression) > MAX_EXPRESSION or not expression.isprintable():
            raise ConfigError(
                f"invalid cron expression {shown(expression)}: expected at most "
                f"{MAX_EXPRESSION} printable characters")
        self.expression = " ".join(expression.split())
        fields = self.expression.split(" ")
        self._with_seconds = len(fields) == 6
        if not self.expression.startswith("@") and len(fields) not in (5, 6):
            raise ConfigError(
                f"invalid cron expression {shown(expression)}: expected 5 fields "
                "(minute hour day month weekday) or 6 with seconds first"
            )
        try:
            template = croniter(_croniter_spelling(self.expression), datetime(2000, 1, 1),
                                second_at_beginning=True)
        except (CroniterError, ValueError, KeyError, TypeError, IndexError,
                OverflowError) as exc:
            raise ConfigError(f"invalid cron expression {shown(expression)}: {exc}") from None
        self._template = template
        self._gap: tuple[int, int] | None = None
        name = zone_name(tz)
        if not isinstance(name, str) or not name or len(name) > MAX_ZONE_NAME or \
                not name.isprintable():
            raise ConfigError(
                f"invalid time zone {shown(tz)}: expected an IANA name like 'UTC' or "
                "'Europe/Athens' (or a ZoneInfo of one: a fixed offset follows no DST rule)")
        try:
            self.zone = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise ConfigError(f"invalid time zone {shown(tz)}: {exc}") from None
        self.tz = name
        #: Whether cron(8) counts the job as a wildcard job (see :func:`is_wildcard`).
        self.wildcard = is_wildcard(self.expression)
        #: The rule in effect, ``dst`` over the default.
        self.dst = DstRule.parse(dst, wildcard=self.wildcard)
        #: Whether ``dst`` was given (then :meth:`describe` shows the rule).
        self.dst_given = dst is not None
        # Checked from the epoch and from now: what registration accepts, jobs() and the
        # job loop can compute.
        now = int(datetime.now(UTC).timestamp() * 1000)
        for start in (0, now):
            try:
                self.next_after(start)
            except (CroniterError, ValueError, OverflowError):  # e.g. "0 8 31 2 *"
                raise ConfigError(
                    f"invalid cron expression {shown(expression)}: it never fires"
                ) from None

    @property
    def with_seconds(self) -> bool:
        """Whether the expression has a leading seconds field (6 fields)."""
        return self._with_seconds

    def fields(self) -> CronFields:
        """The values each field of the expression matches (an adapter checks a translation)."""
        expanded: list[list[object]] = [list(v) for v in self._template.expanded]
        if len(expanded) == 5:
            expanded.append([0])
        values: dict[str, frozenset[int]] = {}
        for name, read in zip(_EXPANSION_ORDER, expanded, strict=True):
            low, high = CRON_FIELD_RANGES[name]
            values[name] = frozenset(range(low, high + 1)) if "*" in read else \
                frozenset(v for v in read if isinstance(v, int))  # "l" aside
        return CronFields(**values, last_day="l" in expanded[2],
                          weekday_positions=bool(self._template.nth_weekday_of_month))

    def typical_gap_ms(self, around_ms: int) -> int:
        """The smallest gap between the slots that follow ``around_ms``, kept a minute.

        Registering 100,000 jobs on one shared schedule asks it for each job; six cron
        steps each time were most of the registration.
        """
        bucket = around_ms // _GAP_KEPT_MS
        kept = self._gap
        if kept is not None and kept[0] == bucket:
            return kept[1]
        gap = super().typical_gap_ms(around_ms)
        self._gap = (bucket, gap)
        return gap

    def describe(self) -> str:
        """Return e.g. ``"cron 0 8 * * * Europe/Athens"`` (``" dst=both,skip"`` if given)."""
        text = f"cron {self.expression} {self.tz}"
        return f"{text} dst={self.dst}" if self.dst_given else text

    def _iter(self, wall: datetime) -> croniter:
        it = copy.copy(self._template)  # parsed once; each walk has its own position
        it.set_current(wall, force=True)
        return it

    def _wall(self, ms: int) -> datetime:
        return ms_to_datetime(ms).astimezone(self.zone)

    def _readings(self, wall: datetime) -> tuple[int, int]:
        """The instants of the naive ``wall`` read with the offsets of fold 0 and fold 1.

        Equal: the wall time occurs once. ``early < late``: it occurs twice (fold 0 is
        the first occurrence). ``early > late``: it is in a gap, whose change lies in
        ``(late, early]``: fold 0 reads it with the offset before the change.
        """
        return (_datetime_to_ms(wall.replace(tzinfo=self.zone, fold=0)),
                _datetime_to_ms(wall.replace(tzinfo=self.zone, fold=1)))

    def _instant_ms(self, early: int, late: int, *, last: bool) -> int | None:
        """The slot of a wall time on one pass (its readings), by the job's rule.

        A wall time that occurs twice gives its first occurrence (``last`` False) or its
        second; one in a gap gives the change (``shift``) or None (``skip``). On either
        pass the slots follow the order of the wall times, so a walk over the wall times
        can stop at the first that fits; the schedule is the union of its passes.
        """
        if early == late:
            return early
        if early < late:
            return late if last else early
        return self._change_ms(late, early) if self.dst.spring_forward == "shift" else None

    def _change_ms(self, lo_ms: int, hi_ms: int) -> int:
        """The instant (whole second) in ``(lo_ms, hi_ms]`` where the offset changes."""
        before = self._wall(lo_ms).utcoffset()
        lo, hi = lo_ms // 1000, -(-hi_ms // 1000)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._wall(mid * 1000).utcoffset() != before:
                hi = mid
            else:
                lo = mid + 1
        return lo * 1000

    def next_after(self, ms: int) -> int:
        """Return the first slot strictly after ``ms``."""
        fall = self.dst.fall_back
        slot, twice = self._next_on(ms, last=fall == "once_last")
        if fall == "both" and twice:
            slot = min(slot, self._next_on(ms, last=True)[0])
        return slot

    def latest_at_or_before(self, ms: int) -> int:
        """Return the last slot at or before ``ms``."""
        fall = self.dst.fall_back
        slot, twice = self._latest_on(ms, last=fall == "once_last")
        if fall == "both" and twice:
            slot = max(slot, self._latest_on(ms, last=True)[0])
        return slot

    def _repeated(self, here: datetime) -> tuple[datetime, datetime] | None:
        """The naive wall times ``[start, end)`` that occur twice, if ``here`` is one."""
        before = _offset(here.replace(fold=0))
        after = _offset(here.replace(fold=1))
        if before == after:
            return None
        ms = _datetime_to_ms(here)
        span = (before - after) // timedelta(milliseconds=1)
        # The change is within one span of ms: after it on the first pass, before it
        # (or at it) on the second.
        change = self._change_ms(ms - span, ms) if here.fold else self._change_ms(ms, ms + span)
        at = ms_to_datetime(change).replace(tzinfo=None)
        return at + after, at + before

    def _next_on(self, ms: int, *, last: bool) -> tuple[int, bool]:
        """The first slot after ``ms`` on one pass, and whether a repeated hour was met.

        Without one, both passes give the same slot.
        """
        here = self._wall(ms)
        wall = here.replace(tzinfo=None)
        repeated = self._repeated(here)
        if repeated is not None and last and not here.fold:
            wall = repeated[0] - _US  # the second passes of the whole repeated hour are ahead
        elif repeated is not None and not last and here.fold:
            wall = repeated[1] - _US  # the first passes of the rest of it are behind
        it = self._iter(wall)
        twice = repeated is not None
        for _ in range(_MAX_STEPS):
            early, late = self._readings(it.get_next(datetime))
            twice = twice or early < late
            slot = self._instant_ms(early, late, last=last)
            if slot is not None and slot > ms:
                return slot, twice
        raise ConfigError(f"cron {self.expression!r} in {self.tz}: no slot found after {ms}")

    def _latest_on(self, ms: int, *, last: bool) -> tuple[int, bool]:
        """The last slot at or before ``ms`` on one pass, and whether a repeated hour was met."""
        here = self._wall(ms)
        wall = here.replace(tzinfo=None)
        repeated = self._repeated(here)
        if repeated is not None and not last and here.fold:
            wall = repeated[1] - _US  # the first passes of the whole repeated hour are behind
        elif repeated is not None and last and not here.fold:
            wall = repeated[0] - _US  # the second passes of all of it are ahead
        it = self._iter(wall + _US)
        twice = repeated is not None
        for _ in range(_MAX_STEPS):
            early, late = self._readings(it.get_prev(datetime))
            twice = twice or early < late
            slot = self._instant_ms(early, late, last=last)
            if slot is not None and slot <= ms:
                return slot, twice
        raise ConfigError(f"cron {self.expression!r} in {self.tz}: no slot found before {ms}")

    def dst_note(self, slot: int) -> str | None:
        """Why ``slot`` is where it is if a daylight-saving change decided it, else None.

        E.g. ``"DST fall-back, second pass (both)"`` or ``"DST spring-forward gap: 02:30
        shifted to 03:00 (shift)"``; a slot right after a gap whose times were skipped
        says so. ``anarchon next`` prints it beside the slot.
        """
        rule = self._rule_text
        notes = []
        previous = self._latest_before(slot)
        gaps = self._gap_times(previous, slot)
        if gaps:
            times = _times(gaps)
            if self.dst.spring_forward == "shift" and self._is_change(slot):
                notes.append(f"DST spring-forward gap: {times} shifted to "
                             f"{_clock(self._wall(slot))} ({rule('spring_forward')})")
            else:
                notes.append(f"DST spring-forward gap: {times} skipped "
                             f"({rule('spring_forward')})")
        here = self._wall(slot)
        if _offset(here.replace(fold=0)) != _offset(here.replace(fold=1)):
            which = "second" if here.fold else "first"
            notes.append(f"DST fall-back, {which} pass ({rule('fall_back')})")
        return "; ".join(notes) or None

    def _rule_text(self, side: str) -> str:
        choice = getattr(self.dst, side)
        if self.dst_given:
            return str(choice)
        return f"{choice}: the {'wildcard' if self.wildcard else 'fixed-time'} default"

    def _latest_before(self, slot: int) -> int | None:
        try:
            return self.latest_at_or_before(slot - 1)
        except ConfigError:
            return None

    def _is_change(self, ms: int) -> bool:
        return self._wall(ms - 1).utcoffset() != self._wall(ms).utcoffset()

    def _gap_times(self, previous: int | None, slot: int) -> list[datetime]:
        """The wall times of the expression skipped by a gap in ``(previous, slot]``.

        The gap is the change at ``slot`` (a shifted slot) or, when the job skips gaps,
        a change between the two slots whose times did not fire.
        """
        change = slot if self._is_change(slot) else None
        if change is None and self.dst.spring_forward == "skip" and previous is not None:
            twin = CronSchedule(self.expression, self.tz, (self.dst.fall_back, "shift"))
            shifted = twin.next_after(previous)
            change = shifted if shifted < slot and twin._is_change(shifted) else None
        if change is None:
            return []
        before = _offset(self._wall(change - 1))
        after = _offset(self._wall(change))
        if after <= before:
            return []
        start = self._wall(change).replace(tzinfo=None) - (after - before)
        end = self._wall(change).replace(tzinfo=None)
        it = self._iter(start - _US)
        found: list[datetime] = []
        for _ in range(_MAX_STEPS):
            wall = it.get_next(datetime)
            if wall >= end:
                break
            found.append(wall)
        return found


def _offset(moment: datetime) -> timedelta:
    return moment.utcoffset() or timedelta()


def _clock(wall: datetime) -> str:
    return wall.strftime("%H:%M:%S" if wall.second else "%H:%M")


def _times(walls: list[datetime]) -> str:
    shown_walls = ", ".join(_clock(w) for w in walls[:_NOTE_TIMES])
    more = len(walls) - _NOTE_TIMES
    return f"{shown_walls} and {more} more" if more > 0 else shown_walls


@functools.lru_cache(maxsize=1024, typed=True)
def _shared_every(interval: Duration, offset: Duration) -> EverySchedule:
    return EverySchedule(interval, offset)


def every_schedule(interval: Duration, offset: Duration = 0) -> EverySchedule:
    """An :class:`EverySchedule`, shared by every job of the same interval and offset.

    It never changes once made, and thousands of jobs on one grid need not each keep
    one for the garbage collector to scan.
    """
    try:
        return _shared_every(interval, offset)
    except TypeError:  # unhashable: the schedule itself says what is wrong with it
        return EverySchedule(interval, offset)


@functools.lru_cache(maxsize=4096, typed=True)
def _shared_cron(expression: str, tz: str | tzinfo, dst: Dst) -> CronSchedule:
    return CronSchedule(expression, tz, dst)


def cron_schedule(expression: str, tz: str | tzinfo = "UTC", dst: Dst = None) -> CronSchedule:
    """A :class:`CronSchedule`, shared by every job of the same expression, zone and rule.

    Parsing an expression and checking that it fires takes about a millisecond: 100,000
    jobs on a few expressions parse each once.
    """
    try:
        return _shared_cron(expression, tz, dst)  # type: ignore[arg-type]
    except TypeError:  # unhashable: the schedule itself says what is wrong with it
        return CronSchedule(expression, tz, dst)


def cron_list(values: Iterable[int], names: Sequence[str] | None = None, *,
              min_range: int = 2) -> str:
    """A set of numbers as a cron field list: ``{0, 1, 2, 5}`` → ``"0-2,5"``.

    Runs of ``min_range`` or more values become ranges; ``names`` spells each value
    (``names[v]``, e.g. weekday names) instead of its number.
    """
    ordered = sorted(set(values))
    if not ordered:
        raise ValueError("cron_list() needs at least one value")
    spell = (lambda v: names[v]) if names is not None else str
    parts: list[str] = []
    first = previous = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        run = [spell(v) for v in range(first, previous + 1)]
        parts.append(f"{run[0]}-{run[-1]}" if len(run) >= min_range else ",".join(run))
        if value is not None:
            first = previous = value
    return ",".join(parts)
