"""The DST rule of cron schedules in every IANA zone with a change in 2020-2040.

The expected slots come from an oracle written here from first principles, not from the
code under test: the zone is reduced to its UTC offsets (asked of ``zoneinfo`` one
instant at a time, never a wall time), the expression to the sets of values of its
fields (parsed here), and each matching wall time ``w`` of a window around a change at
``T`` (offset ``before`` → ``after``) occurs at ``w - before`` if that is before ``T``
and at ``w - after`` if that is at or after ``T``. Two occurrences: a repeated hour, the
fall-back choice decides; none: a gap, the spring-forward choice decides (``shift``:
``T``). cron(8)'s default: ``both,skip`` for a wildcard job, ``once_first,shift`` for a
fixed-time one.

Every zone is swept over all its changes, each change with a few (expression, dst)
pairs in turn so that every pair meets every kind of change across the sweep; a few
zones chosen for their oddities (30-minute shifts, negative DST, changes at midnight)
get every pair at every change of 2026 and 2027. A property test then draws zones,
changes, expressions written field by field and dst choices at random.
"""

from __future__ import annotations

import functools
import itertools
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anarchon_core.schedules import CronSchedule

HOUR = 3_600_000
#: The window around each change, each side: more than the largest shift (2 h) plus the
#: gap between two slots of any expression below.
WINDOW = 4 * HOUR
LOW = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp()) * 1000
HIGH = int(datetime(2041, 1, 1, tzinfo=UTC).timestamp()) * 1000
WEEK = 7 * 86_400_000

FIXED = ["30 2 * * *", "0 3 * * *", "30 1 * * *", "0 0 * * *", "45 23 * * *",
         "0,30 2 * * *", "15 2 * * 0", "@daily"]
WILDCARD = ["*/30 * * * *", "0 * * * *", "15 * * * *", "*/20 1-3 * * *", "0 */2 * * *",
            "@hourly"]
#: dst values and the rule each gives (None: the default, decided per expression).
DST = [None, "once_first", "once_last", "both", "shift", "skip", "once_last,skip",
       ("both", "shift"), {"fall_back": "once_first", "spring_forward": "skip"}]
PAIRS = [(e, d) for e in FIXED + WILDCARD for d in DST]
#: Zones checked with every pair at every change: a 30-minute shift, negative DST
#: (winter is the saved time), changes at midnight (whose gap or repeat crosses the
#: date) and the two zones of the worked examples in docs/schedules.md.
ODD = ["Australia/Lord_Howe", "Europe/Dublin", "America/Havana", "America/Santiago",
       "Asia/Beirut", "Europe/Athens", "America/New_York"]
#: Pairs per change in the sweep of every zone.
PER_CHANGE = 3


# ------------------------------------------------------------------ the oracle


def offset_ms(zone: ZoneInfo, at_ms: int) -> int:
    """The UTC offset of ``zone`` at the instant ``at_ms`` (ms)."""
    moment = datetime.fromtimestamp(at_ms / 1000, UTC).astimezone(zone)
    delta = moment.utcoffset()
    assert delta is not None
    return delta // timedelta(milliseconds=1)


@functools.cache
def changes(tz: str) -> tuple[tuple[int, int, int], ...]:
    """``(instant, offset before, offset after)`` of every change of ``tz``, 2020-2040.

    Offsets are sampled a week apart and each difference is bisected to the second;
    a week where they differ is also sampled daily, for two changes inside one week.
    """
    zone = ZoneInfo(tz)
    found = []
    for start in range(LOW, HIGH, WEEK):
        if offset_ms(zone, start) == offset_ms(zone, start + WEEK):
            continue
        for day in range(start, start + WEEK, 86_400_000):
            lo, hi = day, day + 86_400_000
            before, after = offset_ms(zone, lo), offset_ms(zone, hi)
            if before == after:
                continue
            while hi - lo > 1000:
                mid = (lo + hi) // 2 // 1000 * 1000
                lo, hi = (mid, hi) if offset_ms(zone, mid) == before else (lo, mid)
            found.append((hi, before, after))
    return tuple(found)


def dst_zones() -> list[str]:
    """Every zone whose offset changes in 2020-2040 (DST, or a change of standard time)."""
    return [tz for tz in sorted(zoneinfo.available_timezones()) if changes(tz)]


def values(field: str, low: int, high: int) -> set[int]:
    """The values of one cron field: ``*``, ``*/n``, ``a``, ``a-b``, ``a-b/n``, lists."""
    out: set[int] = set()
    for part in field.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = map(int, span.split("-"))
        else:
            first = last = int(span)
        out.update(range(first, last + 1, int(step) if step else 1))
    return out


MACROS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *"}


@functools.cache
def parsed(expression: str) -> tuple[set[int], set[int], set[int], set[int], bool]:
    """Minutes, hours, days of the week (0 = Sunday) and seconds; and wildcard or not."""
    fields = MACROS.get(expression, expression).split()
    seconds = values(fields.pop(0), 0, 59) if len(fields) == 6 else {0}
    minute, hour, dom, month, dow = fields
    assert dom == "*", "the oracle knows only * for the day of the month"
    assert month == "*", "the oracle knows only * for the month"
    wildcard = expression == "@hourly" or minute[0] == "*" or hour[0] == "*"
    weekdays = {d % 7 for d in values(dow, 0, 7)}
    return values(minute, 0, 59), values(hour, 0, 23), weekdays, seconds, wildcard


def rule(dst: object, wildcard: bool) -> tuple[str, str]:
    """The (fall-back, spring-forward) choices ``dst`` means, written out by hand."""
    fall, spring = ("both", "skip") if wildcard else ("once_first", "shift")
    if isinstance(dst, dict):
        return dst.get("fall_back", fall), dst.get("spring_forward", spring)
    names = dst.split(",") if isinstance(dst, str) else list(dst) \
        if isinstance(dst, tuple | list) else []
    for name in names:
        if name in ("once_first", "once_last", "both"):
            fall = name
        else:
            spring = name
    return fall, spring


def wall_times(expression: str, lo_wall: int, hi_wall: int) -> Iterator[int]:
    """Matching wall times in ``[lo_wall, hi_wall)``, as ms of a naive epoch clock."""
    minutes, hours, weekdays, seconds, _ = parsed(expression)
    day_ms = 86_400_000
    for day in range(lo_wall // day_ms, hi_wall // day_ms + 1):
        # 1970-01-01 was a Thursday (4).
        if (day + 4) % 7 not in weekdays:
            continue
        for h, m, s in itertools.product(sorted(hours), sorted(minutes), sorted(seconds)):
            wall = day * day_ms + ((h * 60 + m) * 60 + s) * 1000
            if lo_wall <= wall < hi_wall:
                yield wall


def expected(expression: str, dst: object, change: tuple[int, int, int],
             window: int = WINDOW) -> list[int]:
    """The slots in ``[T - window, T + window)`` by the rule, from first principles."""
    at, before, after = change
    fall, spring = rule(dst, parsed(expression)[4])
    lo, hi = at - window, at + window
    slots: set[int] = set()
    for wall in wall_times(expression, lo + min(before, after), hi + max(before, after)):
        occurrences = [u for u in (wall - before,) if u < at] + \
                      [u for u in (wall - after,) if u >= at]
        if len(occurrences) == 2:
            first, second = sorted(occurrences)
            slots.update({"once_first": [first], "once_last": [second],
                          "both": [first, second]}[fall])
        elif occurrences:
            slots.add(occurrences[0])
        elif spring == "shift":
            slots.add(at)
    return sorted(s for s in slots if lo <= s < hi)


# ------------------------------------------------------------------ the comparison


def check(tz: str, expression: str, dst: object, change: tuple[int, int, int],
          window: int = WINDOW) -> None:
    """The schedule's slots around ``change``, found forwards and backwards, are the oracle's."""
    schedule = CronSchedule(expression, tz, dst=dst)
    want = expected(expression, dst, change, window)
    lo, hi = change[0] - window, change[0] + window
    forward = []
    at = lo - 1
    while (at := schedule.next_after(at)) < hi:
        forward.append(at)
    backward = []
    at = hi - 1
    while (at := schedule.latest_at_or_before(at)) >= lo:
        backward.append(at)
        at -= 1
    where = (f"{expression!r} dst={dst!r} in {tz} around "
             f"{datetime.fromtimestamp(change[0] / 1000, UTC).isoformat()}")
    assert forward == want, where
    assert backward[::-1] == want, where


def test_the_sweep_covers_every_zone_and_kind_of_change() -> None:
    zones = dst_zones()
    assert len(zones) > 100
    assert set(ODD) <= set(zones)
    steps = {after - before for tz in zones for _, before, after in changes(tz)}
    assert {-HOUR, HOUR, -HOUR // 2, HOUR // 2} <= steps  # Lord Howe: 30 minutes
    # Two changes closer than the window would make the oracle's single change wrong.
    for tz in zones:
        for (a, _, _), (b, _, _) in itertools.pairwise(changes(tz)):
            assert b - a > 2 * WINDOW, tz
    # Negative DST: Dublin's winter offset (GMT) is its saved time, summer (IST) standard.
    dublin = ZoneInfo("Europe/Dublin")
    winter = datetime(2026, 1, 15, tzinfo=dublin)
    saved = winter.dst()
    assert saved is not None
    assert saved < timedelta(0)
    # Midnight changes: the gap or the repeated hour starts or ends at 00:00.
    for tz in ("America/Havana", "America/Santiago", "Asia/Beirut"):
        walls = {(at + min(before, after)) % 86_400_000 for at, before, after in changes(tz)}
        assert walls & {0, 23 * HOUR}, tz


@functools.cache
def twins(tz: str) -> tuple[str, ...]:
    """The zones with exactly the changes of ``tz`` (links such as US/Eastern, and zones
    that share their rules), ``tz`` included, in order."""
    return tuple(z for z in dst_zones() if changes(z) == changes(tz))


@pytest.mark.parametrize("tz", dst_zones())
def test_every_change_of_every_zone(tz: str) -> None:
    """Each change with PER_CHANGE pairs, shared out among zones with the same changes.

    Zones with the same changes behave alike, so each of them takes other pairs: the
    group meets PER_CHANGE (or more) pairs at each change, every zone at least one.
    """
    group = twins(tz)
    member = group.index(tz)
    per_zone = max(1, -(-PER_CHANGE // len(group)))
    start = sum(map(ord, group[0]))  # each group starts elsewhere in the pairs
    for index, change in enumerate(changes(tz)):
        for k in range(per_zone):
            pair = start + (index * len(group) + member) * per_zone + k
            check(tz, *PAIRS[pair % len(PAIRS)], change)


def in_years(tz: str, first: int, last: int) -> list[tuple[int, int, int]]:
    """The changes of ``tz`` in the years ``first`` to ``last``."""
    return [c for c in changes(tz)
            if first <= datetime.fromtimestamp(c[0] / 1000, UTC).year <= last]


@pytest.mark.parametrize("tz", ODD)
def test_every_pair_at_the_changes_of_the_odd_zones(tz: str) -> None:
    for change in in_years(tz, 2026, 2027):
        for expression, dst in PAIRS:
            check(tz, expression, dst, change)


@pytest.mark.parametrize("tz", ["Europe/Athens", "Australia/Lord_Howe", "America/Santiago"])
def test_every_minute_and_every_second_jobs(tz: str) -> None:
    for change in in_years(tz, 2026, 2026):
        for dst in (None, "once_first", "once_last", "shift"):
            check(tz, "* * * * *", dst, change, window=2 * HOUR)
            check(tz, "*/10 30-59 * * * *", dst, change, window=HOUR + HOUR // 2)


def cron_field(low: int, high: int) -> st.SearchStrategy[str]:
    """One cron field the oracle reads: ``*``, ``*/n``, ``a``, ``a-b``, ``a-b/n`` or a list."""
    value = st.integers(low, high)
    span = st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}")
    step = st.integers(2, max(2, (high - low) // 2))
    part = st.one_of(value.map(str), span,
                     st.tuples(span, step).map(lambda sn: f"{sn[0]}/{sn[1]}"))
    listed = st.lists(part, min_size=1, max_size=3).map(",".join)
    return st.one_of(st.just("*"), step.map(lambda n: f"*/{n}"), listed)


EXPRESSIONS = st.tuples(cron_field(0, 59), cron_field(0, 23),
                        st.one_of(st.just("*"), cron_field(0, 6))).map(
    lambda mhd: f"{mhd[0]} {mhd[1]} * * {mhd[2]}")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), expression=EXPRESSIONS, dst=st.sampled_from(DST))
def test_random_expressions_at_random_changes_of_random_zones(
        data: st.DataObject, expression: str, dst: object) -> None:
    tz = data.draw(st.sampled_from(dst_zones()), label="zone")
    change = data.draw(st.sampled_from(changes(tz)), label="change")
    check(tz, expression, dst, change)
