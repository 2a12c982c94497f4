"""Slots of every() and cron() schedules: the epoch grid, time zones and the DST rule."""

from __future__ import annotations

import functools
import itertools
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anarchon_core.errors import ConfigError
from anarchon_core.schedules import (
    FALL_BACK,
    SPRING_FORWARD,
    CronSchedule,
    DstRule,
    EverySchedule,
    Schedule,
    ms_to_datetime,
)


def ms(iso: str) -> int:
    """ISO 8601 with an offset → ms since the epoch."""
    moment = datetime.fromisoformat(iso)
    assert moment.tzinfo is not None
    return round(moment.timestamp() * 1000)


def local(slot: int, tz: str) -> str:
    return ms_to_datetime(slot).astimezone(ZoneInfo(tz)).isoformat()


def firings(schedule: CronSchedule, start: str, end: str) -> list[str]:
    """The slots in [start, end), as local ISO times."""
    out: list[str] = []
    at = ms(start) - 1
    while (at := schedule.next_after(at)) < ms(end):
        out.append(local(at, schedule.tz))
    return out


def walk_back(schedule: Schedule, start: str, end: str) -> list[int]:
    """The same slots found backwards with latest_at_or_before, oldest first."""
    out: list[int] = []
    at = ms(end) - 1
    while (at := schedule.latest_at_or_before(at)) >= ms(start):
        out.append(at)
        at -= 1
    return out[::-1]


# ------------------------------------------------------------------ every()


class TestEvery:
    @pytest.mark.parametrize("now", ["2026-01-01T12:00:00.001+00:00",
                                     "2026-01-01T12:00:03.250+00:00",
                                     "2026-01-01T12:00:09.999+00:00"])
    def test_grid_from_the_epoch_whatever_now_is(self, now: str) -> None:
        schedule = EverySchedule("10s")
        assert [local(s, "UTC") for s in schedule.upcoming(ms(now), 3)] == [
            "2026-01-01T12:00:10+00:00", "2026-01-01T12:00:20+00:00",
            "2026-01-01T12:00:30+00:00"]
        assert local(schedule.latest_at_or_before(ms(now)), "UTC") == "2026-01-01T12:00:00+00:00"

    def test_next_after_is_strict_and_latest_is_inclusive(self) -> None:
        schedule = EverySchedule("10s")
        on_grid = ms("2026-01-01T12:00:10+00:00")
        assert schedule.next_after(on_grid) == on_grid + 10_000
        assert schedule.next_after(on_grid - 1) == on_grid
        assert schedule.latest_at_or_before(on_grid) == on_grid
        assert schedule.latest_at_or_before(on_grid - 1) == on_grid - 10_000

    def test_offset_shifts_the_grid(self) -> None:
        schedule = EverySchedule("1h", offset="15m")
        assert local(schedule.next_after(ms("2026-05-05T12:20:00+00:00")), "UTC") == \
            "2026-05-05T13:15:00+00:00"
        assert local(schedule.next_after(ms("2026-05-05T12:14:59+00:00")), "UTC") == \
            "2026-05-05T12:15:00+00:00"
        at = ms("2026-05-05T12:15:00+00:00")
        assert schedule.latest_at_or_before(at) == at
        assert schedule.describe() == "every 1h offset 15m"

    @pytest.mark.parametrize(
        ("interval", "grid_ms", "text"),
        [("500ms", 500, "every 500ms"), ("1d", 86_400_000, "every 1d"),
         ("1h30m", 5_400_000, "every 1h30m"), (timedelta(minutes=5), 300_000, "every 5m"),
         (90, 90_000, "every 1m30s"), (0.25, 250, "every 250ms")],
    )
    def test_interval_forms(self, interval: object, grid_ms: int, text: str) -> None:
        schedule = EverySchedule(interval)  # type: ignore[arg-type]
        slots = schedule.upcoming(ms("2026-07-01T10:11:12.345+00:00"), 5)
        assert all(s % grid_ms == 0 for s in slots)
        assert [b - a for a, b in itertools.pairwise(slots)] == [grid_ms] * 4
        assert schedule.describe() == text
        assert schedule.typical_gap_ms(slots[0]) == grid_ms

    def test_one_day_is_midnight_utc(self) -> None:
        slot = EverySchedule("1d").next_after(ms("2026-03-08T06:30:00+00:00"))
        assert local(slot, "UTC") == "2026-03-09T00:00:00+00:00"

    def test_before_the_epoch_and_float_instants(self) -> None:
        schedule = EverySchedule("10s")
        assert schedule.latest_at_or_before(-1) == -10_000
        assert schedule.next_after(-10_000) == 0
        # A float "now" (time.time() * 1000) still yields integer slots.
        slot = schedule.next_after(1_767_225_603_250.5)
        assert isinstance(slot, int)
        assert slot == 1_767_225_610_000
        assert isinstance(schedule.latest_at_or_before(1_767_225_603_250.5), int)

    def test_offset_must_be_smaller_than_the_interval(self) -> None:
        with pytest.raises(ConfigError, match=r"invalid offset '1h'.*smaller than the interval"):
            EverySchedule("1h", offset="1h")
        with pytest.raises(ConfigError, match=r"invalid offset '-5m'"):
            EverySchedule("1h", offset="-5m")


# ------------------------------------------------------------------ cron() and DST


class TestCronDST:
    """cron(8)'s rule by default: wildcard jobs follow the wall clock, fixed-time jobs run once."""

    def test_new_york_spring_forward_2026(self) -> None:
        # 2026-03-08: clocks jump from 02:00 EST to 03:00 EDT (07:00Z).
        day = ("2026-03-07T12:00:00+00:00", "2026-03-10T12:00:00+00:00")
        assert firings(CronSchedule("30 2 * * *", "America/New_York"), *day) == [
            "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00",
            "2026-03-10T02:30:00-04:00"]
        assert firings(CronSchedule("0 3 * * *", "America/New_York"), *day) == [
            "2026-03-08T03:00:00-04:00", "2026-03-09T03:00:00-04:00",
            "2026-03-10T03:00:00-04:00"]
        night = ("2026-03-08T05:00:00+00:00", "2026-03-08T08:30:00+00:00")
        # A wildcard job: 02:00 and 02:30 do not occur, so they do not fire.
        assert firings(CronSchedule("*/30 * * * *", "America/New_York"), *night) == [
            "2026-03-08T00:00:00-05:00", "2026-03-08T00:30:00-05:00",
            "2026-03-08T01:00:00-05:00", "2026-03-08T01:30:00-05:00",
            "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00",
            "2026-03-08T04:00:00-04:00"]

    def test_new_york_fall_back_2026(self) -> None:
        # 2026-11-01: clocks go from 02:00 EDT back to 01:00 EST (06:00Z); 01:xx twice.
        days = ("2026-10-31T12:00:00+00:00", "2026-11-02T12:00:00+00:00")
        assert firings(CronSchedule("30 1 * * *", "America/New_York"), *days) == [
            "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]
        assert firings(CronSchedule("30 2 * * *", "America/New_York"), *days) == [
            "2026-11-01T02:30:00-05:00", "2026-11-02T02:30:00-05:00"]
        assert firings(CronSchedule("0 3 * * *", "America/New_York"), *days) == [
            "2026-11-01T03:00:00-05:00", "2026-11-02T03:00:00-05:00"]
        night = ("2026-11-01T04:00:00+00:00", "2026-11-01T08:30:00+00:00")
        # A wildcard job fires on both passes of 01:xx.
        assert firings(CronSchedule("*/30 * * * *", "America/New_York"), *night) == [
            "2026-11-01T00:00:00-04:00", "2026-11-01T00:30:00-04:00",
            "2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00",
            "2026-11-01T01:00:00-05:00", "2026-11-01T01:30:00-05:00",
            "2026-11-01T02:00:00-05:00", "2026-11-01T02:30:00-05:00",
            "2026-11-01T03:00:00-05:00"]

    def test_athens_spring_forward_2026(self) -> None:
        # 2026-03-29: clocks jump from 03:00 EET to 04:00 EEST (01:00Z).
        days = ("2026-03-28T12:00:00+00:00", "2026-03-30T12:00:00+00:00")
        assert firings(CronSchedule("30 2 * * *", "Europe/Athens"), *days) == [
            "2026-03-29T02:30:00+02:00", "2026-03-30T02:30:00+03:00"]
        assert firings(CronSchedule("0 3 * * *", "Europe/Athens"), *days) == [
            "2026-03-29T04:00:00+03:00", "2026-03-30T03:00:00+03:00"]
        night = ("2026-03-28T23:45:00+00:00", "2026-03-29T02:15:00+00:00")
        assert firings(CronSchedule("*/30 * * * *", "Europe/Athens"), *night) == [
            "2026-03-29T02:00:00+02:00", "2026-03-29T02:30:00+02:00",
            "2026-03-29T04:00:00+03:00", "2026-03-29T04:30:00+03:00",
            "2026-03-29T05:00:00+03:00"]

    def test_athens_fall_back_2026(self) -> None:
        # 2026-10-25: clocks go from 04:00 EEST back to 03:00 EET (01:00Z); 03:xx twice.
        days = ("2026-10-24T12:00:00+00:00", "2026-10-26T12:00:00+00:00")
        assert firings(CronSchedule("0 3 * * *", "Europe/Athens"), *days) == [
            "2026-10-25T03:00:00+03:00", "2026-10-26T03:00:00+02:00"]
        assert firings(CronSchedule("30 2 * * *", "Europe/Athens"), *days) == [
            "2026-10-25T02:30:00+03:00", "2026-10-26T02:30:00+02:00"]
        night = ("2026-10-24T23:15:00+00:00", "2026-10-25T02:45:00+00:00")
        # The example of docs/schedules.md: no 90-minute hole, 03:00 and 03:30 twice.
        assert firings(CronSchedule("*/30 * * * *", "Europe/Athens"), *night) == [
            "2026-10-25T02:30:00+03:00", "2026-10-25T03:00:00+03:00",
            "2026-10-25T03:30:00+03:00", "2026-10-25T03:00:00+02:00",
            "2026-10-25T03:30:00+02:00", "2026-10-25T04:00:00+02:00",
            "2026-10-25T04:30:00+02:00"]

    def test_six_fields_seconds_first_across_the_gap(self) -> None:
        night = ("2026-03-08T06:30:00+00:00", "2026-03-08T07:30:00+00:00")
        # The hour field is "*": a wildcard job, the seconds field does not count.
        assert firings(CronSchedule("30 */20 * * * *", "America/New_York"), *night) == [
            "2026-03-08T01:40:30-05:00", "2026-03-08T03:00:30-04:00",
            "2026-03-08T03:20:30-04:00"]
        shifted = CronSchedule("30 */20 * * * *", "America/New_York", dst="shift")
        assert firings(shifted, *night) == [
            "2026-03-08T01:40:30-05:00",
            "2026-03-08T03:00:00-04:00",  # 02:00:30, 02:20:30, 02:40:30 coalesced
            "2026-03-08T03:00:30-04:00", "2026-03-08T03:20:30-04:00"]
        athens = CronSchedule("15 0 3 * * *", "Europe/Athens")
        assert firings(athens, "2026-10-24T12:00:00+00:00", "2026-10-26T12:00:00+00:00") == [
            "2026-10-25T03:00:15+03:00", "2026-10-26T03:00:15+02:00"]

    @pytest.mark.parametrize(
        ("expression", "tz", "start", "end", "expected"),
        [
            ("30 2 * * *", "America/New_York", "2027-03-13T12:00:00+00:00",
             "2027-03-15T12:00:00+00:00",
             ["2027-03-14T03:00:00-04:00", "2027-03-15T02:30:00-04:00"]),
            ("30 1 * * *", "America/New_York", "2027-11-06T12:00:00+00:00",
             "2027-11-08T12:00:00+00:00",
             ["2027-11-07T01:30:00-04:00", "2027-11-08T01:30:00-05:00"]),
            ("0 3 * * *", "Europe/Athens", "2027-03-27T12:00:00+00:00",
             "2027-03-29T12:00:00+00:00",
             ["2027-03-28T04:00:00+03:00", "2027-03-29T03:00:00+03:00"]),
            ("30 3 * * *", "Europe/Athens", "2027-10-30T12:00:00+00:00",
             "2027-11-01T12:00:00+00:00",
             ["2027-10-31T03:30:00+03:00", "2027-11-01T03:30:00+02:00"]),
        ],
    )
    def test_2027_changes(self, expression: str, tz: str, start: str, end: str,
                          expected: list[str]) -> None:
        assert firings(CronSchedule(expression, tz), start, end) == expected

    @pytest.mark.parametrize(
        ("expression", "tz", "start", "end"),
        [("*/30 * * * *", "America/New_York", "2026-03-08T04:00:00+00:00",
          "2026-03-08T09:00:00+00:00"),
         ("*/30 * * * *", "America/New_York", "2026-11-01T04:00:00+00:00",
          "2026-11-01T09:00:00+00:00"),
         ("*/30 * * * *", "Europe/Athens", "2026-03-28T23:00:00+00:00",
          "2026-03-29T03:00:00+00:00"),
         ("*/30 * * * *", "Europe/Athens", "2026-10-24T23:00:00+00:00",
          "2026-10-25T03:00:00+00:00"),
         ("0 3 * * *", "Europe/Athens", "2026-10-20T00:00:00+00:00",
          "2026-10-30T00:00:00+00:00"),
         ("*/30 * * * *", "Australia/Lord_Howe", "2026-04-04T12:00:00+00:00",
          "2026-04-04T18:00:00+00:00"),
         ("*/30 * * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00+00:00",
          "2026-10-03T18:00:00+00:00")],
    )
    def test_backwards_finds_the_same_slots(self, expression: str, tz: str, start: str,
                                            end: str) -> None:
        schedule = CronSchedule(expression, tz)
        forward = firings(schedule, start, end)
        assert [local(s, tz) for s in walk_back(schedule, start, end)] == forward

    def test_latest_inside_the_repeated_hour(self) -> None:
        schedule = CronSchedule("0 3 * * *", "Europe/Athens")
        first = ms("2026-10-25T03:00:00+03:00")
        assert schedule.latest_at_or_before(first) == first
        # 03:10 on the second pass (EET): the 03:00 firing happened on the first pass.
        assert schedule.latest_at_or_before(ms("2026-10-25T03:10:00+02:00")) == first
        assert schedule.next_after(ms("2026-10-25T03:10:00+02:00")) == \
            ms("2026-10-26T03:00:00+02:00")
        # 03:00 EET (second occurrence) itself is not a slot.
        assert schedule.next_after(first) == ms("2026-10-26T03:00:00+02:00")

    def test_lord_howe_half_hour_shift(self) -> None:
        # 2026-10-04 02:00 → 02:30 (+10:30 → +11); 2026-04-05 02:00 → 01:30 (+11 → +10:30).
        spring = CronSchedule("15 2 * * *", "Australia/Lord_Howe")
        assert firings(spring, "2026-10-03T00:00:00+00:00", "2026-10-05T00:00:00+00:00") == [
            "2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"]
        fall = CronSchedule("45 1 * * *", "Australia/Lord_Howe")
        assert firings(fall, "2026-04-04T00:00:00+00:00", "2026-04-06T00:00:00+00:00") == [
            "2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"]

    def test_utc_and_describe(self) -> None:
        schedule = CronSchedule("0  8 * * 1-5")
        assert schedule.describe() == "cron 0 8 * * 1-5 UTC"
        assert repr(schedule) == "<CronSchedule cron 0 8 * * 1-5 UTC>"
        # 2026-01-02 is a Friday: the next weekday 08:00 after it is Monday the 5th.
        assert firings(schedule, "2026-01-02T09:00:00+00:00", "2026-01-06T00:00:00+00:00") == [
            "2026-01-05T08:00:00+00:00"]

    def test_typical_gap(self) -> None:
        assert CronSchedule("*/30 * * * *").typical_gap_ms(ms("2026-01-01T00:00:00+00:00")) \
            == 1_800_000
        assert CronSchedule("0 8 * * *", "Europe/Athens").typical_gap_ms(
            ms("2026-01-01T00:00:00+00:00")) == 86_400_000


# ------------------------------------------------------------------ dst= choices


ATHENS_FALL = ("2026-10-24T23:15:00+00:00", "2026-10-25T02:15:00+00:00")
ATHENS_SPRING = ("2026-03-28T23:45:00+00:00", "2026-03-29T02:15:00+00:00")


class TestDstChoices:
    @pytest.mark.parametrize(
        ("expression", "wildcard"),
        [("*/30 * * * *", True), ("0 * * * *", True), ("15 * * * *", True),
         ("* 3 * * *", True), ("*/7 1-3 * * *", True), ("0 */2 * * *", True),
         ("30 */20 * * * *", True), ("@hourly", True), ("@HOURLY", True),
         ("0 3 * * *", False), ("30 2 * * *", False), ("0-59 0-23 * * *", False),
         ("0,30 2 * * *", False), ("* 0 3 * * *", False), ("@daily", False),
         ("@midnight", False), ("@weekly", False), ("@monthly", False), ("@yearly", False)],
    )
    def test_wildcard_jobs_as_cron8_counts_them(self, expression: str, wildcard: bool) -> None:
        # The first character of the minute or hour field, as Vixie cron's MIN_STAR and
        # HR_STAR; "0-59" is every minute but not a wildcard.
        schedule = CronSchedule(expression, "Europe/Athens")
        assert schedule.wildcard is wildcard
        assert schedule.dst == (DstRule("both", "skip") if wildcard
                                else DstRule("once_first", "shift"))

    @pytest.mark.parametrize(
        ("dst", "fixed", "wildcard"),
        [(None, "once_first,shift", "both,skip"),
         ("once_last", "once_last,shift", "once_last,skip"),
         ("both", "both,shift", "both,skip"),
         ("skip", "once_first,skip", "both,skip"),
         ("shift", "once_first,shift", "both,shift"),
         ("once_last,skip", "once_last,skip", "once_last,skip"),
         (" skip , once_first ", "once_first,skip", "once_first,skip"),
         (("both", "shift"), "both,shift", "both,shift"),
         (["once_last"], "once_last,shift", "once_last,skip"),
         ({"fall_back": "once_last"}, "once_last,shift", "once_last,skip"),
         ({"spring_forward": "skip", "fall_back": "both"}, "both,skip", "both,skip")],
    )
    def test_forms_of_dst(self, dst: object, fixed: str, wildcard: str) -> None:
        assert str(CronSchedule("0 3 * * *", dst=dst).dst) == fixed
        assert str(CronSchedule("*/30 * * * *", dst=dst).dst) == wildcard

    @pytest.mark.parametrize(
        "dst", ["", "first", "ONCE_FIRST", "once_first,once_last", "skip,shift", "both,",
                "both,skip,shift", (), ("both", "skip", "shift"), ("both", 3), 1, True,
                {}, {"fall_back": "skip"}, {"spring": "skip"}, {"fall_back": None},
                {"once_first"}, b"both"])
    def test_anything_else_is_refused_naming_the_value_and_the_choices(self,
                                                                       dst: object) -> None:
        with pytest.raises(ConfigError) as info:
            CronSchedule("0 3 * * *", "Europe/Athens", dst=dst)
        text = str(info.value)
        assert text.startswith(f"invalid dst {dst!r}: expected None")
        assert all(choice in text for choice in (*FALL_BACK, *SPRING_FORWARD))

    def test_describe_shows_dst_only_when_given(self) -> None:
        assert CronSchedule("0 3 * * *", "Europe/Athens").describe() == \
            "cron 0 3 * * * Europe/Athens"
        assert CronSchedule("0 3 * * *", "Europe/Athens", dst="both").describe() == \
            "cron 0 3 * * * Europe/Athens dst=both,shift"
        # Given, even as the default: the definition says so, and differs in a fleet.
        assert CronSchedule("*/5 * * * *", dst=("both", "skip")).describe() == \
            "cron */5 * * * * UTC dst=both,skip"

    @pytest.mark.parametrize(
        ("expression", "dst", "fall", "spring"),
        [("*/30 * * * *", None,
          ["02:30+03:00", "03:00+03:00", "03:30+03:00", "03:00+02:00", "03:30+02:00",
           "04:00+02:00"],
          ["02:00+02:00", "02:30+02:00", "04:00+03:00", "04:30+03:00", "05:00+03:00"]),
         ("*/30 * * * *", "once_first",
          ["02:30+03:00", "03:00+03:00", "03:30+03:00", "04:00+02:00"],
          ["02:00+02:00", "02:30+02:00", "04:00+03:00", "04:30+03:00", "05:00+03:00"]),
         ("*/30 * * * *", "once_last,shift",
          ["02:30+03:00", "03:00+02:00", "03:30+02:00", "04:00+02:00"],
          # 03:00, 03:30 and 04:00 are one instant: one slot.
          ["02:00+02:00", "02:30+02:00", "04:00+03:00", "04:30+03:00", "05:00+03:00"]),
         ("0 3 * * *", None, ["03:00+03:00"], ["04:00+03:00"]),
         ("0 3 * * *", "once_last", ["03:00+02:00"], ["04:00+03:00"]),
         ("0 3 * * *", "both,skip", ["03:00+03:00", "03:00+02:00"], []),
         ("0 3 * * *", "both", ["03:00+03:00", "03:00+02:00"], ["04:00+03:00"]),
         ("0 3 * * *", "skip", ["03:00+03:00"], []),
         ("30 3 * * *", {"spring_forward": "skip"}, ["03:30+03:00"], []),
         ("30 3 * * *", "once_last,skip", ["03:30+02:00"], []),
         ("30 3 * * *", None, ["03:30+03:00"], ["04:00+03:00"]),
         ("*/30 3 * * *", None, ["03:00+03:00", "03:30+03:00", "03:00+02:00", "03:30+02:00"],
          []),
         ("*/30 3 * * *", "shift",
          ["03:00+03:00", "03:30+03:00", "03:00+02:00", "03:30+02:00"], ["04:00+03:00"])],
    )
    def test_athens_2026(self, expression: str, dst: object, fall: list[str],
                         spring: list[str]) -> None:
        """The worked table of docs/schedules.md."""
        schedule = CronSchedule(expression, "Europe/Athens", dst=dst)
        assert [t[11:16] + t[19:] for t in firings(schedule, *ATHENS_FALL)] == fall
        assert [t[11:16] + t[19:] for t in firings(schedule, *ATHENS_SPRING)] == spring
        for window in (ATHENS_FALL, ATHENS_SPRING):
            assert [local(t, schedule.tz) for t in walk_back(schedule, *window)] == \
                firings(schedule, *window)

    def test_new_york_2026(self) -> None:
        fixed = CronSchedule("30 1 * * *", "America/New_York", dst="both")
        assert firings(fixed, "2026-11-01T04:00:00+00:00", "2026-11-01T08:00:00+00:00") == [
            "2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00"]
        skipping = CronSchedule("30 2 * * *", "America/New_York", dst="skip")
        assert firings(skipping, "2026-03-07T12:00:00+00:00", "2026-03-10T12:00:00+00:00") \
            == ["2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"]  # not 8 March
        wild = CronSchedule("*/30 * * * *", "America/New_York", dst="shift")
        assert firings(wild, "2026-03-08T06:00:00+00:00", "2026-03-08T08:00:00+00:00") == [
            "2026-03-08T01:00:00-05:00", "2026-03-08T01:30:00-05:00",
            "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00"]

    def test_a_whole_second_pass_is_found_from_inside_the_first(self) -> None:
        schedule = CronSchedule("* * * * *", "Europe/Athens", dst="once_last")
        inside = ms("2026-10-25T03:20:30+03:00")  # first pass: no slot until the second
        assert local(schedule.next_after(inside), "Europe/Athens") == \
            "2026-10-25T03:00:00+02:00"
        assert local(schedule.latest_at_or_before(inside), "Europe/Athens") == \
            "2026-10-25T02:59:00+03:00"
        first = CronSchedule("* * * * *", "Europe/Athens", dst="once_first")
        second = ms("2026-10-25T03:20:30+02:00")  # second pass: no slot until 04:00
        assert local(first.next_after(second), "Europe/Athens") == "2026-10-25T04:00:00+02:00"
        assert local(first.latest_at_or_before(second), "Europe/Athens") == \
            "2026-10-25T03:59:00+03:00"

    @pytest.mark.parametrize(
        ("expression", "dst", "at", "note"),
        [("*/30 * * * *", None, "2026-10-25T03:30:00+03:00",
          "DST fall-back, first pass (both: the wildcard default)"),
         ("*/30 * * * *", "both", "2026-10-25T03:00:00+02:00",
          "DST fall-back, second pass (both)"),
         ("0 3 * * *", None, "2026-10-25T03:00:00+03:00",
          "DST fall-back, first pass (once_first: the fixed-time default)"),
         ("0 3 * * *", "once_last", "2026-10-25T03:00:00+02:00",
          "DST fall-back, second pass (once_last)"),
         ("30 3 * * *", "shift", "2026-03-29T04:00:00+03:00",
          "DST spring-forward gap: 03:30 shifted to 04:00 (shift)"),
         ("0,20,40 3 * * *", None, "2026-03-29T04:00:00+03:00",
          "DST spring-forward gap: 03:00, 03:20, 03:40 shifted to 04:00 "
          "(shift: the fixed-time default)"),
         ("*/10 * * * *", "shift", "2026-03-29T04:00:00+03:00",
          "DST spring-forward gap: 03:00, 03:10, 03:20 and 3 more shifted to 04:00 (shift)"),
         ("*/30 * * * *", None, "2026-03-29T04:00:00+03:00",
          "DST spring-forward gap: 03:00, 03:30 skipped (skip: the wildcard default)"),
         ("30 3 * * *", "skip", "2026-03-30T03:30:00+03:00",
          "DST spring-forward gap: 03:30 skipped (skip)"),
         ("*/30 * * * *", None, "2026-03-29T04:30:00+03:00", None),
         ("*/30 * * * *", None, "2026-10-25T04:00:00+02:00", None),
         ("0 8 * * *", None, "2026-10-25T08:00:00+02:00", None)],
    )
    def test_dst_notes(self, expression: str, dst: object, at: str, note: str | None) -> None:
        schedule = CronSchedule(expression, "Europe/Athens", dst=dst)
        assert schedule.latest_at_or_before(ms(at)) == ms(at)  # a slot
        assert schedule.dst_note(ms(at)) == note


# ------------------------------------------------------------------ properties

ZONES = ["UTC", "Europe/Athens", "America/New_York", "Australia/Lord_Howe"]
EXPRESSIONS = ["*/30 * * * *", "30 2 * * *", "0 3 * * *", "45 1 * * *", "15 2 * * 0",
               "0 0 1 * *", "*/7 1-3 * * *", "30 */20 * * * *", "0 9 * * 1-5"]
EVERY = [("10s", 0), ("7m", 0), ("1h", "15m"), ("1d", 0), ("500ms", 0), ("1h30m", "1m")]
DSTS = [None, "once_first", "once_last", "both", "shift", "skip", "once_last,skip"]
LOW, HIGH = ms("2020-01-01T00:00:00+00:00"), ms("2030-12-31T00:00:00+00:00")


@functools.cache
def transitions(tz: str) -> tuple[int, ...]:
    """The UTC instants (ms) at which ``tz`` changes its offset, 2020-2030."""
    zone = ZoneInfo(tz)
    out: list[int] = []
    day = 86_400_000

    def offset(at: int) -> timedelta | None:
        return ms_to_datetime(at).astimezone(zone).utcoffset()

    for start in range(LOW, HIGH, day):
        if offset(start) != offset(start + day):
            lo, hi = start, start + day  # offset(lo) != offset(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == offset(lo) else (lo, mid)
            out.append(hi)
    return tuple(out)


Spec = tuple[str, str, object, object]


def make(spec: Spec) -> Schedule:
    kind, a, b, dst = spec
    if kind == "every":
        return EverySchedule(a, b)  # type: ignore[arg-type]
    return CronSchedule(a, str(b), dst=dst)


schedules = st.one_of(
    st.tuples(st.just("cron"), st.sampled_from(EXPRESSIONS), st.sampled_from(ZONES),
              st.sampled_from(DSTS)),
    st.sampled_from([("every", i, o, None) for i, o in EVERY]),
)
# Half the instants land within 3 hours of a DST change, where the rule matters.
near_changes = st.tuples(st.sampled_from(ZONES[1:]), st.integers(0, 60),
                         st.integers(-3 * 3_600_000, 3 * 3_600_000)).map(
    lambda t: transitions(t[0])[t[1] % len(transitions(t[0]))] + t[2])
instants = st.integers(LOW, HIGH) | near_changes
PROPS = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(spec=schedules, t=instants)
def test_next_and_latest_bracket_t(spec: Spec, t: int) -> None:
    schedule = make(spec)
    after = schedule.next_after(t)
    before = schedule.latest_at_or_before(t)
    assert isinstance(after, int)
    assert isinstance(before, int)
    assert before <= t < after
    assert schedule.next_after(before) == after  # no slot lies between before and after
    assert schedule.latest_at_or_before(after) == after
    assert schedule.latest_at_or_before(after - 1) == before


@PROPS
@given(spec=schedules, t=instants)
def test_upcoming_strictly_increases_and_is_deterministic(spec: Spec, t: int) -> None:
    slots = make(spec).upcoming(t, 8)
    assert all(a < b for a, b in itertools.pairwise(slots))
    assert slots[0] > t
    assert make(spec).upcoming(t, 8) == slots  # a fresh instance computes the same


@PROPS
@given(expression=st.sampled_from(EXPRESSIONS), tz=st.sampled_from(ZONES),
       dst=st.sampled_from(DSTS), t=instants)
def test_cron_slots_are_wall_times_the_rule_allows(expression: str, tz: str, dst: object,
                                                   t: int) -> None:
    """Each slot is a matching wall time on a pass the rule allows, or a shifted gap's end."""
    schedule = CronSchedule(expression, tz, dst=dst)
    zone = ZoneInfo(tz)
    for slot in schedule.upcoming(t, 6):
        wall = ms_to_datetime(slot).astimezone(zone)
        twice = wall.replace(fold=0).utcoffset() != wall.replace(fold=1).utcoffset()
        if croniter.match(expression, wall.replace(tzinfo=None), second_at_beginning=True):
            if twice:
                allowed = {"once_first": {0}, "once_last": {1}, "both": {0, 1}}
                assert wall.fold in allowed[schedule.dst.fall_back], local(slot, tz)
            continue
        # Only a firing that fell into a spring-forward gap moves, and only to the
        # gap's end: the transition instant itself, where the offset grows.
        assert schedule.dst.spring_forward == "shift", local(slot, tz)
        assert slot in transitions(tz), local(slot, tz)
        before = ms_to_datetime(slot - 1).astimezone(zone).utcoffset()
        assert before is not None
        assert wall.utcoffset() is not None
        assert wall.utcoffset() > before  # type: ignore[operator]


def test_cron_fields_read_as_the_schedule_reads_them() -> None:
    fields = CronSchedule("*/15 8-10 L,3 1,6 mon-fri").fields()
    assert fields.minute == {0, 15, 30, 45}
    assert fields.hour == {8, 9, 10}
    assert fields.day == {3}
    assert fields.last_day
    assert fields.month == {1, 6}
    assert fields.day_of_week == {1, 2, 3, 4, 5}
    assert fields.second == {0}
    assert not fields.weekday_positions
    six = CronSchedule("5 0 0 * * 7").fields()
    assert (six.second, six.day_of_week, len(six.day)) == ({5}, {0}, 31)
    assert CronSchedule("0 0 * * 5#2").fields().weekday_positions


@pytest.mark.parametrize(("expression", "minutes", "hours"), [
    ("5-5 3 * * *", {5}, {3}),
    ("* 0-0 * * *", set(range(60)), {0}),
    ("1-1/2,30 * * * *", {1, 30}, set(range(24))),
    ("7,40-40/5 12-12/3 * * *", {7, 40}, {12}),
])
def test_a_range_of_one_value_is_that_value(expression: str, minutes: set[int],
                                            hours: set[int]) -> None:
    """As in cron(8): croniter alone reads ``5-5`` as ``*`` and ``1-1/2`` as ``*/2``."""
    schedule = CronSchedule(expression)
    fields = schedule.fields()
    assert (fields.minute, fields.hour) == (minutes, hours)
    day = 1_800_000_000_000 - 1_800_000_000_000 % 86_400_000
    at, seen = day - 1, []
    while (at := schedule.next_after(at)) < day + 86_400_000:
        seen.append(at)
    assert seen == sorted(day + (h * 60 + m) * 60_000 for h in hours for m in minutes)
    assert CronSchedule("0 9 * * mon-mon").fields().day_of_week == {1}
    assert schedule.expression == expression  # shown as it was written
