"""Parsing of human durations: every accepted form, and clear errors for the rest."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import pytest

from anarchon_core.durations import MAX_DURATION_MS, format_ms, parse_duration_ms
from anarchon_core.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("10s", 10_000),
        ("5m", 300_000),
        ("1h30m", 5_400_000),
        ("500ms", 500),
        ("1d", 86_400_000),
        ("2w", 1_209_600_000),
        ("1h 30m", 5_400_000),
        ("  10S ", 10_000),
        ("1.5s", 1_500),
        ("0.5h", 1_800_000),
        ("1d2h3m4s5ms", 93_784_005),
        (timedelta(minutes=5), 300_000),
        (timedelta(milliseconds=250), 250),
        (10, 10_000),
        (0.5, 500),
        (1.001, 1_001),
        (0.001, 1),
    ],
)
def test_accepted_forms(value: object, ms: int) -> None:
    assert parse_duration_ms(value) == ms


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("10", "expected a number with a unit"),
        ("10x", "expected a number with a unit"),
        ("-5s", "expected a number with a unit"),
        ("", "expected a number with a unit"),
        ("s", "expected a number with a unit"),
        ("1h30", "expected a number with a unit"),
        ("ten seconds", "expected a number with a unit"),
        (None, "expected a string like '10s'"),
        ([10], "expected a string like '10s'"),
        (True, "expected e.g. '10s'"),
        (False, "expected e.g. '10s'"),
        (0, "must be > 0"),
        ("0s", "must be > 0"),
        (timedelta(0), "must be > 0"),
        (-1, "must be > 0"),
        (timedelta(seconds=-1), "must be > 0"),
        (math.nan, "finite"),
        (math.inf, "finite"),
        ("1.5ms", "whole number of milliseconds"),
        (0.0001, "whole number of milliseconds"),
        (timedelta(microseconds=1500), "whole number of milliseconds"),
    ],
)
def test_rejected_forms_name_the_value(value: object, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"invalid interval {value!r}")) as info:
        parse_duration_ms(value, what="interval")
    assert reason in str(info.value)


def test_rejections_are_value_errors_too() -> None:
    # ConfigError subclasses ValueError: code catching ValueError around config still works.
    with pytest.raises(ValueError, match="'10x'"):
        parse_duration_ms("10x")


def test_zero_only_where_allowed() -> None:
    assert parse_duration_ms(0, allow_zero=True) == 0
    assert parse_duration_ms("0s", allow_zero=True) == 0
    with pytest.raises(ConfigError, match=r"invalid offset '-1s'"):
        parse_duration_ms("-1s", what="offset", allow_zero=True)
    with pytest.raises(ConfigError, match=r"invalid offset -1: must be ≥ 0"):
        parse_duration_ms(-1, what="offset", allow_zero=True)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0ms"), (500, "500ms"), (10_000, "10s"), (5_400_000, "1h30m"),
     (86_400_000, "1d"), (93_784_005, "1d2h3m4s5ms")],
)
def test_format_ms_round_trips(ms: int, text: str) -> None:
    assert format_ms(ms) == text
    if ms:
        assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "value",
    ["99999999999999999999d", "9" * 60 + "ms", 10**30, 1e300, 3_650 * 86_400 + 1,
     timedelta.max, "3651d", "3650d1ms", "522w"],
)
def test_durations_beyond_the_limit_are_refused_before_any_overflow(value: object) -> None:
    with pytest.raises(ConfigError, match=r"invalid interval .*(at most 3650d|expected)"):
        parse_duration_ms(value, what="interval")


def test_the_limit_itself_and_exact_decimals() -> None:
    assert parse_duration_ms("3650d") == MAX_DURATION_MS == 315_360_000_000
    assert parse_duration_ms(timedelta(days=3650)) == MAX_DURATION_MS
    assert parse_duration_ms("0.1s") == 100  # exact: no float rounding on strings
    assert parse_duration_ms("0.001s") == 1
    with pytest.raises(ConfigError, match="whole number of milliseconds"):
        parse_duration_ms("1.0001s")
    assert parse_duration_ms("2s", maximum=5_000) == 2_000
    with pytest.raises(ConfigError, match=r"invalid lease '6s': at most 5s \(5000 ms\)"):
        parse_duration_ms("6s", what="lease", maximum=5_000)


def test_long_values_are_named_but_cut_in_messages() -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration_ms("1s" * 1000, what="interval")
    assert str(info.value).startswith("invalid interval '1s1s1s")
    assert len(str(info.value)) < 250
