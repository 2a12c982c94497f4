"""From APScheduler's ``CronTrigger`` to the ``CronScheduleTrigger`` of the same times.

The table pins down the expression each spelling becomes (weekdays by name: APScheduler
counts Monday as 0, cron Sunday); the walks check that both triggers fire at the same
instants in UTC, where no DST rule can tell them apart. What cannot be carried is refused
with the reason.
"""

from __future__ import annotations

import pickle
import random
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from anarchon_apscheduler import EPOCH, CronScheduleTrigger
from anarchon_apscheduler.triggers import follows_dst, translate_trigger
from anarchon_core import ConfigError

#: CronTrigger keywords → the expression, and whether cron(8) counts it a wildcard job.
TABLE: list[tuple[dict[str, Any], str, bool]] = [
    ({"hour": 3}, "0 3 * * *", False),
    ({"hour": 3, "minute": 30}, "30 3 * * *", False),
    ({"minute": "*/15"}, "*/15 * * * *", True),
    ({"minute": 0}, "0 * * * *", True),               # the hour APScheduler filled in is '*'
    ({"minute": "0-59"}, "0-59 * * * *", True),
    ({"minute": "0-59", "hour": 3}, "0-59 3 * * *", False),
    ({"minute": "7,*/15", "hour": 3}, "7,*/15 3 * * *", False),
    ({"minute": "*/20,7", "hour": 3}, "*/20,7 3 * * *", True),
    ({"minute": "5/15"}, "5/15 * * * *", True),
    ({"hour": "9-17/2", "minute": 30}, "30 9-17/2 * * *", False),
    ({"hour": "*/6"}, "0 */6 * * *", True),
    ({"second": "*/10"}, "*/10 * * * * *", True),
    ({"second": 30, "minute": 5, "hour": 4}, "30 5 4 * * *", False),
    ({"day_of_week": 0, "hour": 8}, "0 8 * * mon", False),
    ({"day_of_week": "6", "hour": 8}, "0 8 * * sun", False),
    ({"day_of_week": "0-4", "hour": 8}, "0 8 * * mon-fri", False),
    ({"day_of_week": "mon-fri", "hour": 8}, "0 8 * * mon-fri", False),
    ({"day_of_week": "5,6"}, "0 0 * * sun,sat", False),
    ({"day_of_week": "sat,sun"}, "0 0 * * sun,sat", False),
    ({"day_of_week": "sun,mon,tue,wed"}, "0 0 * * sun-wed", False),
    ({"day_of_week": "fri-sun", "minute": "*/30"}, "*/30 * * * sun,fri,sat", True),
    ({"day_of_week": "*/2"}, "0 0 * * sun,mon,wed,fri", False),
    ({"day_of_week": "1-5/2"}, "0 0 * * tue,thu,sat", False),
    ({"day_of_week": "2/2"}, "0 0 * * sun,wed,fri", False),     # wed, fri, sun
    ({"day_of_week": "0-6"}, "0 0 * * *", False),
    ({"day_of_week": "tue", "day": "*"}, "0 0 * * tue", False),
    ({"day_of_week": "mon", "day": "1-31"}, "0 0 * * mon", False),
    ({"day": 1}, "0 0 1 * *", False),
    ({"day": "1-7"}, "0 0 1-7 * *", False),
    ({"day": "*/2"}, "0 0 */2 * *", False),
    ({"day": "3/7", "hour": 12}, "0 12 3/7 * *", False),
    ({"day": "last"}, "0 0 L * *", False),
    ({"day": "1,15,last", "hour": 2}, "0 2 1,15,L * *", False),
    ({"day": "*,last"}, "0 0 * * *", False),
    ({"month": "jan-mar,jun", "day": 1}, "0 0 1 1-3,6 *", False),
    ({"month": "*/3"}, "0 0 1 */3 *", False),
    ({"month": "feb,1-12"}, "0 0 1 * *", False),
    ({"month": 2, "day": 29, "hour": 6}, "0 6 29 2 *", False),
    ({"year": "*", "week": "*", "hour": 1}, "0 1 * * *", False),
]


def walk(trigger: Any, start: datetime, count: int) -> list[datetime]:
    """The first ``count`` fire times from ``start``, as APScheduler asks for them."""
    out: list[datetime] = []
    previous = None
    for _ in range(count):
        previous = trigger.get_next_fire_time(previous, start if previous is None else previous)
        if previous is None:
            break
        out.append(previous.astimezone(UTC))
    return out


@pytest.mark.parametrize(("fields", "expression", "wildcard"), TABLE,
                         ids=[str(f) for f, _, _ in TABLE])
def test_each_spelling_becomes_its_cron_expression(fields: dict[str, Any], expression: str,
                                                   wildcard: bool) -> None:
    trigger = CronTrigger(timezone="Europe/Athens", **fields)
    translated = CronScheduleTrigger.from_cron_trigger(trigger)
    assert translated.schedule.expression == expression
    assert translated.schedule.tz == "Europe/Athens"
    assert translated.schedule.wildcard is wildcard
    assert not translated.schedule.dst_given
    assert str(translated) == f"cron {expression} Europe/Athens"
    assert translate_trigger(trigger).__getstate__() == translated.__getstate__()


@pytest.mark.parametrize(("fields", "expression", "wildcard"), TABLE,
                         ids=[str(f) for f, _, _ in TABLE])
def test_both_fire_at_the_same_instants_where_no_dst_rule_applies(
        fields: dict[str, Any], expression: str, wildcard: bool) -> None:
    trigger = CronTrigger(timezone="UTC", **fields)
    translated = CronScheduleTrigger.from_cron_trigger(trigger)
    for start in (datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 2, 27, 13, 7, 9, tzinfo=UTC)):
        assert walk(translated, start, 150) == walk(trigger, start, 150), expression


def _spelling(rng: random.Random, low: int, high: int, extra: list[str]) -> str:
    first = rng.randint(low, high)
    last = rng.randint(first, high)
    step = rng.randint(1, max(1, (high - low) // 3))
    forms = ["*", f"*/{step}", str(first), f"{first}-{last}", *extra]
    if high - first >= step:
        forms.append(f"{first}/{step}")
    if last - first >= step:
        forms.append(f"{first}-{last}/{step}")
    return ",".join(rng.choice(forms) for _ in range(rng.choice((1, 1, 2))))


def test_random_spellings_fire_alike_in_utc() -> None:
    """A seeded sweep over spellings the table does not list (lists of ranges, steps)."""
    rng = random.Random(20260329)
    checked = 0
    for _ in range(150):
        fields = {"second": rng.choice(["0", "0", _spelling(rng, 0, 59, [])]),
                  "minute": _spelling(rng, 0, 59, []),
                  "hour": _spelling(rng, 0, 23, []),
                  "month": rng.choice(["*", _spelling(rng, 1, 12, ["jan-mar", "dec"])])}
        if rng.random() < 0.5:
            fields["day"] = _spelling(rng, 1, 31, ["last", "1,last"])
        else:
            fields["day_of_week"] = _spelling(rng, 0, 6, ["mon-fri", "sat,sun", "wed-sun"])
        trigger = CronTrigger(timezone="UTC", **fields)
        translated = CronScheduleTrigger.from_cron_trigger(trigger)
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=rng.randint(0, 700))
        assert walk(translated, start, 40) == walk(trigger, start, 40), \
            (fields, translated.schedule.expression)
        checked += 1
    assert checked == 150


def test_from_crontab_keeps_apschedulers_weekday_numbers() -> None:
    """APScheduler 3 reads ``0`` in from_crontab() as Monday: the translation follows it."""
    trigger = CronTrigger.from_crontab("0 3 * * 0", timezone="UTC")
    translated = CronScheduleTrigger.from_cron_trigger(trigger)
    assert translated.schedule.expression == "0 3 * * mon"
    start = datetime(2026, 5, 1, tzinfo=UTC)
    assert walk(translated, start, 10) == walk(trigger, start, 10)
    assert {t.strftime("%a") for t in walk(translated, start, 10)} == {"Mon"}


ATHENS = "Europe/Athens"


@pytest.mark.parametrize(("trigger", "reason"), [
    (CronTrigger(year=2027, hour=3, timezone=ATHENS), "year='2027': cron has no year field"),
    (CronTrigger(year="2026-2030", hour=3, timezone=ATHENS), "year='2026-2030'"),
    (CronTrigger(week="1-10", hour=3, timezone=ATHENS),
     "week='1-10': cron has no ISO week field"),
    (CronTrigger(day="2nd fri", hour=3, timezone=ATHENS),
     "day='2nd fri': a weekday's position in the month ('2nd fri') is not translated"),
    (CronTrigger(day="1,last sun", timezone=ATHENS), "('last sun')"),
    (CronTrigger(day="1-7", day_of_week="mon", timezone=ATHENS),
     "day='1-7' and day_of_week='mon' both restrict the day: APScheduler fires on days "
     "matching both, cron on days matching either"),
    (CronTrigger(day="last", day_of_week="fri", timezone=ATHENS), "both restrict the day"),
    (CronTrigger(hour=3, jitter=30, timezone=ATHENS), "jitter=30 would be lost"),
    (CronTrigger(hour=3, timezone=timezone(timedelta(hours=2))), "has no IANA name"),
])
def test_what_cannot_be_carried_is_refused_with_the_reason(trigger: Any, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(reason)):
        translate_trigger(trigger)


def test_other_triggers_are_left_alone_and_combined_cron_triggers_refused() -> None:
    assert translate_trigger(IntervalTrigger(seconds=5, start_date=EPOCH)) is None
    assert translate_trigger(CronScheduleTrigger("0 3 * * *", "Europe/Athens")) is None

    class Mine(CronTrigger):
        pass

    with pytest.raises(ConfigError, match=r"^it is a Mine, a subclass of CronTrigger$"):
        translate_trigger(Mine(hour=3, timezone="UTC"))
    with pytest.raises(ConfigError, match="combined in an OrTrigger"):
        translate_trigger(OrTrigger([CronTrigger(hour=1, timezone="UTC"),
                                     IntervalTrigger(seconds=5, start_date=EPOCH)]))
    with pytest.raises(ConfigError, match="is not a CronTrigger"):
        CronScheduleTrigger.from_cron_trigger(IntervalTrigger(seconds=5, start_date=EPOCH))


def test_only_zones_with_daylight_saving_time_make_the_rule_matter() -> None:
    assert follows_dst(CronTrigger(hour=3, timezone="Europe/Athens"))
    assert not follows_dst(CronTrigger(hour=3, timezone="UTC"))
    assert not follows_dst(CronTrigger(hour=3, timezone="Asia/Kolkata"))
    assert not follows_dst(CronTrigger(hour=3, timezone=timezone(timedelta(hours=2))))
    assert follows_dst(OrTrigger([CronTrigger(hour=3, timezone="UTC"),
                                  CronTrigger(hour=4, timezone="America/New_York")]))
    assert not follows_dst(IntervalTrigger(seconds=5, start_date=EPOCH))


def test_start_and_end_dates_are_carried() -> None:
    trigger = CronTrigger(hour=3, minute=30, timezone="Europe/Athens",
                          start_date="2026-05-10 03:30:00", end_date="2026-05-20")
    translated = CronScheduleTrigger.from_cron_trigger(trigger)
    assert translated.start_date == trigger.start_date
    assert translated.end_date == trigger.end_date
    for start in (datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 5, 15, tzinfo=UTC),
                  datetime(2026, 6, 1, tzinfo=UTC)):
        assert walk(translated, start, 30) == walk(trigger, start, 30)
    times = walk(translated, datetime(2026, 5, 1, tzinfo=UTC), 30)
    assert times[0] == datetime(2026, 5, 10, 0, 30, tzinfo=UTC)  # start_date is included
    assert len(times) == 10                                      # 10th to 19th
    assert walk(translated, datetime(2026, 6, 1, tzinfo=UTC), 3) == []


def test_dates_of_the_trigger_itself_are_read_in_its_zone_and_checked() -> None:
    trigger = CronScheduleTrigger("0 3 * * *", "Europe/Athens", start_date="2026-05-10",
                                  end_date=datetime(2026, 5, 12, 3, 0))
    assert trigger.start_date == datetime(2026, 5, 10, tzinfo=trigger.timezone)
    assert walk(trigger, datetime(2026, 1, 1, tzinfo=UTC), 5) == [
        datetime(2026, 5, d, 0, 0, tzinfo=UTC) for d in (10, 11, 12)]
    with pytest.raises(ConfigError, match=r"invalid end_date .* before start_date"):
        CronScheduleTrigger("0 3 * * *", "UTC", start_date="2026-05-10", end_date="2026-05-01")
    with pytest.raises(ConfigError, match="invalid start_date 'soon'"):
        CronScheduleTrigger("0 3 * * *", "UTC", start_date="soon")


def test_the_dates_pickle_as_optional_keys_of_version_1() -> None:
    trigger = CronScheduleTrigger("0 3 * * *", "Europe/Athens", start_date="2026-05-10",
                                  end_date="2026-05-20")
    state = trigger.__getstate__()
    assert state["version"] == 1
    assert state["start_date"] == trigger.start_date
    copied = pickle.loads(pickle.dumps(trigger))
    assert (copied.start_date, copied.end_date) == (trigger.start_date, trigger.end_date)
    assert "start_date='2026-05-10T00:00:00+03:00'" in repr(trigger)
    assert "end_date='2026-05-20T00:00:00+03:00'" in repr(trigger)
    assert str(trigger) == "cron 0 3 * * * Europe/Athens"
    plain = CronScheduleTrigger("0 3 * * *", "Europe/Athens")
    assert set(plain.__getstate__()) == {"version", "expression", "timezone", "dst"}
    assert pickle.loads(pickle.dumps(plain)).start_date is None
