"""Schedules: the pure computation of slots (integer ms since the Unix epoch, UTC).

Every instance computes the same slots from the same schedule without talking to the
others, so everything here is deterministic and independent of when a process started.

Cron expressions are evaluated on the wall clock of their IANA time zone. The rule at
daylight-saving changes (the same as Vixie cron and cronie):

* A wall-clock time that does not exist (spring forward, e.g. 02:30 when clocks jump
  from 02:00 to 03:00) fires once, at the first valid instant after the gap (03:00).
  Several firings inside one gap coalesce into that one slot.
* A wall-clock time that occurs twice (fall back, e.g. 01:30 when clocks go from
  02:00 back to 01:00) fires once, at its first occurrence.
"""

from __future__ import annotations

import abc
import functools
import itertools
import math
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from .durations import Duration, format_ms, parse_duration_ms, shown
from .errors import ConfigError

__all__ = ["CronSchedule", "EverySchedule", "Schedule", "ms_to_datetime", "zone_name"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Bounds the walk over wall-clock times around a DST change; a 6-field cron firing every
# second across a 2-hour shift needs 7,200 steps.
_MAX_STEPS = 20_000
#: Longest cron expression and time zone name accepted (both far above any real one).
MAX_EXPRESSION = 200
MAX_ZONE_NAME = 100


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


class CronSchedule(Schedule):
    """A 5-field (or 6-field, seconds first) cron expression in an IANA time zone."""

    def __init__(self, expression: str, tz: str | tzinfo = "UTC") -> None:
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
            croniter(self.expression, datetime(2000, 1, 1), second_at_beginning=True)
        except (CroniterError, ValueError, KeyError, TypeError, IndexError,
                OverflowError) as exc:
            raise ConfigError(f"invalid cron expression {shown(expression)}: {exc}") from None
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

    def describe(self) -> str:
        """Return e.g. ``"cron 0 8 * * * Europe/Athens"``."""
        return f"cron {self.expression} {self.tz}"

    def _iter(self, wall: datetime, *, backwards: bool = False) -> croniter:
        return croniter(self.expression, wall, is_prev=backwards, second_at_beginning=True)

    def _wall(self, ms: int) -> datetime:
        return ms_to_datetime(ms).astimezone(self.zone)

    def _instant_ms(self, wall: datetime) -> int:
        """Map a naive wall-clock time to its slot by the module's DST rule."""
        first = wall.replace(tzinfo=self.zone, fold=0)
        if first.astimezone(UTC).astimezone(self.zone).replace(tzinfo=None) == wall:
            return _datetime_to_ms(first)  # exists; the first occurrence if it occurs twice
        # In a gap: the first valid instant is the transition itself, the smallest instant
        # whose wall time is past ``wall``. It lies between the two readings of ``wall``.
        lo = _datetime_to_ms(wall.replace(tzinfo=self.zone, fold=1)) // 1000
        hi = -(-_datetime_to_ms(first) // 1000)
        lo, hi = min(lo, hi), max(lo, hi)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._wall(mid * 1000).replace(tzinfo=None) > wall:
                hi = mid
            else:
                lo = mid + 1
        return lo * 1000

    def next_after(self, ms: int) -> int:
        """Return the first slot strictly after ``ms``."""
        it = self._iter(self._wall(ms).replace(tzinfo=None))
        for _ in range(_MAX_STEPS):
            slot = self._instant_ms(it.get_next(datetime))
            if slot > ms:
                return slot
        raise ConfigError(f"cron {self.expression!r} in {self.tz}: no slot found after {ms}")

    def latest_at_or_before(self, ms: int) -> int:
        """Return the last slot at or before ``ms``."""
        here = self._wall(ms)
        wall = here.replace(tzinfo=None)
        if here.fold:
            # ms is in the repeated hour: wall times up to the end of it fired earlier.
            shift = here.replace(fold=0).utcoffset() or timedelta()
            wall += shift - (here.utcoffset() or timedelta())
        it = self._iter(wall + timedelta(microseconds=1), backwards=True)
        for _ in range(_MAX_STEPS):
            slot = self._instant_ms(it.get_prev(datetime))
            if slot <= ms:
                return slot
        raise ConfigError(f"cron {self.expression!r} in {self.tz}: no slot found before {ms}")


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
