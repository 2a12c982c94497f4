"""Every bad schedule or job option is a ConfigError naming the value, raised where it is given."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from datetime import UTC, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from anarchon_core import (
    AnarchonError,
    Cancelled,
    ClaimOnlyBackend,
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ConfigError,
    LeaseLost,
    Run,
    RunRef,
    Scheduler,
    StoreError,
    StoreFormatError,
    UnsupportedStrategyError,
    backend_from_url,
)
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.durations import MAX_DURATION_MS
from anarchon_core.naming import validate_instance_id
from anarchon_core.options import (
    MAX_HISTORY_SIZE,
    MAX_LEASE_MS,
    validate_history,
    validate_lease_timings,
)


class ClaimOnly(ClaimOnlyBackend):
    """An in-memory claim-only store: first claim wins (enough for option checks)."""

    def __init__(self) -> None:
        self.claimed: set[tuple[str, int]] = set()

    async def clock_ms(self) -> int:
        return 0

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        key = (request.job, request.slot)
        if key in self.claimed:
            return ClaimResult(ClaimOutcome.TAKEN)
        self.claimed.add(key)
        return ClaimResult(ClaimOutcome.WON, attempt=1, token=request.token)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        return True

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        return []


def handler(ctx: Any) -> None:
    pass


@pytest.fixture
def scheduler(tmp_path: Path) -> Scheduler:
    return Scheduler(SqliteBackend(tmp_path / "cfg.db"), instance_id="test:1")


def raises(fragment: str) -> Any:
    return pytest.raises(ConfigError, match=re.escape(fragment))


# ------------------------------------------------------------------ schedules at registration


@pytest.mark.parametrize("interval", ["10", "10x", "-5s", "", None, True, 0, float("nan"),
                                      "1.5ms"])
def test_invalid_interval_names_the_value(scheduler: Scheduler, interval: Any) -> None:
    with raises(f"invalid interval {interval!r}"):
        scheduler.every("job", interval, handler)
    with raises(f"invalid interval {interval!r}"):  # the decorator form fails at once too
        scheduler.every("job", interval)
    assert scheduler.jobs() == []


def test_invalid_offset(scheduler: Scheduler) -> None:
    with raises("invalid offset '2h'"):
        scheduler.every("job", "1h", handler, offset="2h")
    with raises("invalid offset 'soon'"):
        scheduler.every("job", "1h", handler, offset="soon")


@pytest.mark.parametrize(
    ("expression", "reason"),
    [("61 * * * *", "out of range"), ("* * *", "expected 5 fields"),
     ("not a cron", "expected 5 fields"), ("* * * * * * *", "expected 5 fields"),
     ("", "expected a string"), (None, "expected a string"), ("0 8 * * 8", "out of range"),
     ("@every 5m", ""), ("0 8 31 2 *", "never fires")],
)
def test_invalid_cron_expression_names_the_value(scheduler: Scheduler, expression: Any,
                                                 reason: str) -> None:
    with raises(f"invalid cron expression {expression!r}") as info:
        scheduler.cron("job", expression, handler)
    assert reason in str(info.value)
    assert scheduler.jobs() == []


@pytest.mark.parametrize("tz", ["Mars/Base", "", None, "../etc/passwd", "Europe/Atlantis", 3])
def test_invalid_zone_names_the_value(scheduler: Scheduler, tz: Any) -> None:
    with raises(f"invalid time zone {tz!r}"):
        scheduler.cron("job", "0 8 * * *", handler, tz=tz)
    assert scheduler.jobs() == []


class _PytzLike(tzinfo):
    """A zone as pytz makes them: a tzinfo whose ``zone`` attribute is its IANA name."""

    zone = "America/New_York"


@pytest.mark.parametrize(("tz", "name"), [
    (ZoneInfo("Europe/Athens"), "Europe/Athens"), (UTC, "UTC"),
    (_PytzLike(), "America/New_York")])
def test_a_zone_object_with_an_iana_name_is_taken_by_its_name(
        scheduler: Scheduler, tz: tzinfo, name: str) -> None:
    scheduler.cron("job", "0 8 * * *", handler, tz=tz)
    assert scheduler.jobs()[0].schedule == f"cron 0 8 * * * {name}"


@pytest.mark.parametrize("tz", [timezone(timedelta(hours=2)), timezone.min])
def test_a_fixed_offset_zone_is_refused(scheduler: Scheduler, tz: tzinfo) -> None:
    with raises("invalid time zone") as info:
        scheduler.cron("job", "0 8 * * *", handler, tz=tz)
    assert "fixed offset follows no DST rule" in str(info.value)
    assert scheduler.jobs() == []


def test_valid_schedules_register(scheduler: Scheduler) -> None:
    scheduler.cron("a", "@hourly", handler)
    scheduler.cron("b", "0 0 29 2 *", handler, tz="Australia/Lord_Howe")
    scheduler.cron("c", "*/5 * * * * *", handler)
    assert [j.schedule for j in scheduler.jobs()] == [
        "cron @hourly UTC", "cron 0 0 29 2 * Australia/Lord_Howe", "cron */5 * * * * * UTC"]


# ------------------------------------------------------------------ names, duplicates, options


@pytest.mark.parametrize(
    ("name", "reason"),
    [("", "non-empty string"), ("   ", "non-empty string"), (None, "non-empty string"),
     (42, "non-empty string"), ("x" * 70, None), ("\x00", "NUL character"),
     ("a\x00b", "NUL character at position 1"), ("x\ud800", "lone surrogate"),
     ("zero\u200bwidth", "invisible character"), ("line\u2028sep", "invisible character"),
     ("a\nb", "no control characters"), ("tab\there", "no control characters"),
     (" padded", "surrounding spaces"), ("padded ", "surrounding spaces")],
)
def test_bad_job_names(scheduler: Scheduler, name: Any, reason: str | None) -> None:
    if reason is None:
        scheduler.every(name, "10s", handler)
        return
    with raises(f"invalid job name {name!r}") as info:
        scheduler.every(name, "10s", handler)
    assert reason in str(info.value)
    assert scheduler.jobs() == []


def test_overlong_job_name_is_refused_with_its_length(scheduler: Scheduler) -> None:
    with raises("invalid job name 'xxxxxxxx") as info:
        scheduler.every("x" * 10_000, "10s", handler)
    assert "10000 characters, longer than 200" in str(info.value)
    assert len(str(info.value)) < 200  # the value is named, not pasted whole


def test_good_job_names(scheduler: Scheduler) -> None:
    for name in ("sync", "billing:invoices.daily", "x" * 200, "ünïcode job"):
        scheduler.every(name, "10s", handler)
    assert len(scheduler.jobs()) == 4


def test_duplicate_name_then_remove_and_register_again(scheduler: Scheduler) -> None:
    scheduler.every("sync", "10s", handler)
    with raises("job 'sync' is already registered; remove('sync') first"):
        scheduler.every("sync", "5s", handler)
    with raises("job 'sync' is already registered"):
        scheduler.cron("sync", "* * * * *")
    assert [j.schedule for j in scheduler.jobs()] == ["every 10s"]
    assert scheduler.remove("sync") is True
    assert scheduler.remove("sync") is False
    scheduler.every("sync", "5s", handler)
    assert [j.schedule for j in scheduler.jobs()] == ["every 5s"]


def test_duplicate_through_two_pending_decorators(scheduler: Scheduler) -> None:
    first = scheduler.every("sync", "10s")
    second = scheduler.every("sync", "10s")
    first(handler)
    with raises("job 'sync' is already registered"):
        second(handler)


def test_handler_must_be_callable(scheduler: Scheduler) -> None:
    with raises("invalid handler 42 for job 'x': not callable"):
        scheduler.every("x", "10s", 42)  # type: ignore[call-overload]
    assert scheduler.jobs() == []


def test_unknown_option(scheduler: Scheduler) -> None:
    with raises("unknown job option(s) retries, timeout; valid: timeout_ms, jitter_ms"):
        scheduler.every("x", "10s", handler, timeout=5, retries=3)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("jitter_ms", "1s", "invalid jitter_ms '1s': expected whole milliseconds (an int)"),
     ("jitter_ms", 1.5, "invalid jitter_ms 1.5: expected whole milliseconds"),
     ("jitter_ms", -1, "invalid jitter_ms -1: must be ≥ 0"),
     ("jitter_ms", True, "invalid jitter_ms True"),
     ("max_late_ms", "late", "invalid max_late_ms 'late'"),
     ("max_late_ms", -5, "invalid max_late_ms -5: must be ≥ 0"),
     ("timeout_ms", 0, "invalid timeout_ms 0: must be > 0"),
     ("timeout_ms", "5s", "invalid timeout_ms '5s'"),
     ("timeout_ms", 2.5, "invalid timeout_ms 2.5"),
     ("overlap", "yes", "invalid overlap 'yes': expected one of 'skip', 'allow', "
      "'buffer_one', 'cancel_other'"),
     ("max_attempts", 0, "invalid max_attempts 0: expected an int ≥ 1"),
     ("max_attempts", True, "invalid max_attempts True"),
     ("catch_up_ms", -1, "invalid catch_up_ms -1"),
     ("catch_up", "oldest", "invalid catch_up 'oldest': expected one of 'newest', 'all', "
      "'none'"),
     ("catch_up", True, "invalid catch_up True"),
     ("catch_up", "all", "catch_up='all' needs catch_up_ms")],
)
def test_bad_option_values(scheduler: Scheduler, option: str, value: Any,
                           message: str) -> None:
    with raises(message):
        scheduler.every("x", "10s", handler, **{option: value})
    assert scheduler.jobs() == []


def test_max_late_below_jitter(scheduler: Scheduler) -> None:
    with raises("invalid max_late_ms 100: must be at least jitter_ms (500)"):
        scheduler.every("x", "10s", handler, jitter_ms=500, max_late_ms=100)


def test_timedelta_options_are_accepted(scheduler: Scheduler) -> None:
    scheduler.every("x", "10s", handler, timeout_ms=timedelta(seconds=2),
                    jitter_ms=timedelta(milliseconds=50))
    (info,) = scheduler.jobs()
    assert (info.options["timeout_ms"], info.options["jitter_ms"]) == (2000, 50)


# ------------------------------------------------------------------ Scheduler(...) arguments


def test_heartbeat_must_be_below_lease(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    with raises("invalid heartbeat_ms 1000: must be smaller than lease_ms (1000)"):
        Scheduler(backend, lease_ms=1000, heartbeat_ms=1000)
    with raises("invalid heartbeat_ms 5000: must be smaller than lease_ms (1000)"):
        Scheduler(backend, lease_ms=1000, heartbeat_ms=5000)
    scheduler = Scheduler(backend, lease_ms=900)
    assert (scheduler.lease_ms, scheduler.heartbeat_ms) == (900, 300)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"lease_ms": 0}, "invalid lease_ms 0"), ({"lease_ms": "30s"}, "invalid lease_ms '30s'"),
     ({"heartbeat_ms": -1}, "invalid heartbeat_ms -1"),
     ({"instance_id": ""}, "invalid instance_id ''"),
     ({"instance_id": "  "}, "invalid instance_id '  '"),
     ({"instance_id": 7}, "invalid instance_id 7"),
     ({"history_size": 0}, "invalid history_size 0: expected an int ≥ 1"),
     ({"history_size": True}, "invalid history_size True"),
     ({"history_size": "many"}, "invalid history_size 'many'"),
     ({"history_ttl_ms": 0}, "invalid history_ttl_ms 0")],
)
def test_bad_scheduler_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with raises(message):
        Scheduler(SqliteBackend(tmp_path / "x.db"), **kwargs)


def test_bad_backend_argument() -> None:
    with raises("invalid backend 42: expected a Backend, a URL string or None"):
        Scheduler(42)  # type: ignore[arg-type]


# ------------------------------------------------------------------ claim-only backends


def test_the_signature_shows_the_default_lease() -> None:
    assert inspect.signature(Scheduler).parameters["lease_ms"].default == 30_000
    assert Scheduler(ClaimOnly()).backend.supports_leases is False  # the default is no lease


@pytest.mark.parametrize(
    ("kwargs", "given"),
    [({"lease_ms": 10_000}, "lease_ms"), ({"heartbeat_ms": 1_000}, "heartbeat_ms"),
     ({"lease_ms": 10_000, "heartbeat_ms": 1_000}, "lease_ms, heartbeat_ms"),
     ({"lease_ms": 30_000}, "lease_ms")],  # the default's value, given
)
def test_lease_settings_on_claim_only_backend(kwargs: dict[str, Any], given: str) -> None:
    with raises(f"{given} need a lease backend") as info:
        Scheduler(ClaimOnly(), **kwargs)
    assert "ClaimOnly only claims" in str(info.value)


@pytest.mark.parametrize(("option", "value"),
                         [("overlap", True), ("overlap", False), ("max_attempts", 5),
                          ("catch_up_ms", 60_000), ("catch_up", "all")])
def test_lease_only_options_on_claim_only_backend(option: str, value: Any) -> None:
    scheduler = Scheduler(ClaimOnly())
    named = f"{option}={value!r}" if option in ("overlap", "catch_up") else option
    with raises(f"option(s) {named} need a lease backend"):
        scheduler.every("x", "10s", handler, **{option: value})
    with raises(f"option(s) {named} need a lease backend"):
        scheduler.cron("x", "* * * * *", **{option: value})
    assert scheduler.jobs() == []


def test_claim_only_backend_accepts_the_other_options() -> None:
    scheduler = Scheduler(ClaimOnly())
    scheduler.every("x", "10s", handler, timeout_ms=500, jitter_ms=10, max_late_ms=2000)
    (info,) = scheduler.jobs()
    assert info.options["timeout_ms"] == 500


# ------------------------------------------------------------------ SQLite and URLs


@pytest.mark.parametrize("table", ["x; drop table y", "a.b", "", "1runs", "x" * 64,
                                   'runs"', "runs-2", None])
def test_sqlite_table_names(tmp_path: Path, table: Any) -> None:
    with raises(f"invalid table {table!r}"):
        SqliteBackend(tmp_path / "x.db", table=table)


def test_sqlite_table_name_in_url(tmp_path: Path) -> None:
    with raises("invalid table 'a.b'"):
        backend_from_url(f"sqlite:///{tmp_path}/x.db?table=a.b")
    with raises("unknown parameter 'prefix'"):
        backend_from_url(f"sqlite:///{tmp_path}/x.db?prefix=p")
    with raises("invalid SQLite URL 'sqlite://relative.db'"):
        backend_from_url("sqlite://relative.db")
    backend = backend_from_url(f"sqlite:///{tmp_path}/x.db?table=cron_runs")
    assert isinstance(backend, SqliteBackend)
    assert (backend.path, backend.table) == (f"{tmp_path}/x.db", "cron_runs")


@pytest.mark.parametrize("url", ["mysql://u:p@localhost/db", "http://example.com",
                                 "file:///tmp/x"])
def test_unknown_scheme(url: str) -> None:
    scheme = url.split(":", 1)[0]
    with raises(f"unknown backend URL scheme {scheme!r}") as info:
        backend_from_url(url)
    assert "known: amqp, amqps, nats" in str(info.value)
    assert ":p@" not in str(info.value)


@pytest.mark.parametrize("url", ["", "localhost:6379", "not a url", "redis:/x"])
def test_malformed_url(url: str) -> None:
    with raises(f"invalid backend URL {url!r}: expected scheme://..."):
        backend_from_url(url)


def test_malformed_url_does_not_leak_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        backend_from_url("mysql://admin:hunter2@db:abc/x")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        backend_from_url(123)  # type: ignore[arg-type]
    assert "invalid backend URL '123'" in str(info.value)


def test_scheduler_with_bad_url_string() -> None:
    with raises("unknown backend URL scheme 'mongodb'"):
        Scheduler("mongodb://localhost")


# ------------------------------------------------------------------ raised early, never later


async def test_errors_come_at_registration_not_at_start(tmp_path: Path) -> None:
    scheduler = Scheduler(SqliteBackend(tmp_path / "x.db"))
    for bad in (lambda: scheduler.every("a", "10x", handler),
                lambda: scheduler.cron("a", "0 25 * * *", handler),
                lambda: scheduler.every("a", "10s", handler, jitter_ms="x")):
        with pytest.raises(ConfigError):
            bad()
    scheduler.every("a", "1h", handler)
    await scheduler.start()  # nothing left to complain about
    try:
        # Registration while running validates the same way.
        with raises("invalid cron expression '* *'"):
            scheduler.cron("b", "* *", handler)
        scheduler.cron("b", "0 8 * * *", handler, tz="Europe/Athens")
        assert [j.name for j in scheduler.jobs()] == ["a", "b"]
    finally:
        await scheduler.stop()


# ------------------------------------------------------------------ the error classes


def test_error_hierarchy() -> None:
    for cls in (ConfigError, UnsupportedStrategyError, StoreFormatError, StoreError,
                Cancelled, LeaseLost):
        assert issubclass(cls, AnarchonError)
    assert issubclass(LeaseLost, Cancelled)
    assert issubclass(ConfigError, ValueError)
    assert not issubclass(Cancelled, ConfigError)


def test_store_format_error() -> None:
    error = StoreFormatError(7, 1)
    assert error.code == "ANARCHON_STORE_FORMAT"
    assert StoreFormatError.code == "ANARCHON_STORE_FORMAT"
    assert (error.found, error.supported) == (7, 1)
    assert str(error).startswith("ANARCHON_STORE_FORMAT: the store has format 7")
    assert "reads up to 1" in str(error)


# ------------------------------------------------------------------ accepted, then broken later


@pytest.mark.parametrize(
    ("interval", "offset", "message"),
    [("99999999999999999999d", 0, "invalid interval '99999999999999999999d': at most 3650d"),
     ("9" * 300 + "s", 0, "invalid interval '9999"),
     (10**30, 0, "invalid interval 1000000000000000000000000000000: at most 3650d"),
     (1e300, 0, "invalid interval 1e+300: at most"),
     (timedelta.max, 0, "at most 3650d"),
     ("3651d", 0, "invalid interval '3651d': at most 3650d (315360000000 ms)"),
     ("1d", 10**20, "invalid offset 100000000000000000000: at most")],
)
def test_intervals_and_offsets_beyond_what_datetimes_hold(
        scheduler: Scheduler, interval: Any, offset: Any, message: str) -> None:
    with raises(message):
        scheduler.every("x", interval, handler, offset=offset)
    assert scheduler.jobs() == []


def test_the_longest_interval_still_works(scheduler: Scheduler) -> None:
    scheduler.every("decade", "3650d", handler, offset="3649d")
    (info,) = scheduler.jobs()
    assert info.next_run_at.year < 2100
    assert info.next_slot % 86_400_000 == 0


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("timeout_ms", 10**20, "invalid timeout_ms 100000000000000000000: at most 315360000000"),
     ("jitter_ms", 10**20, "invalid jitter_ms 100000000000000000000: at most"),
     ("max_late_ms", 10**20, "invalid max_late_ms 100000000000000000000: at most"),
     ("catch_up_ms", 10**20, "invalid catch_up_ms 100000000000000000000: at most"),
     ("max_attempts", 10**20, "invalid max_attempts 100000000000000000000: expected an int"),
     ("max_attempts", 1001, "≤ 1000"),
     ("timeout_ms", timedelta(microseconds=1500), "must be whole milliseconds")],
)
def test_option_values_beyond_the_limits(scheduler: Scheduler, option: str, value: Any,
                                         message: str) -> None:
    with raises(message):
        scheduler.every("x", "1d", handler, **{option: value})
    assert scheduler.jobs() == []


@pytest.mark.parametrize(
    ("register", "message"),
    [(lambda s: s.every("x", "10s", handler, jitter_ms=10_000, max_late_ms=20_000),
      "invalid jitter_ms 10000: must be smaller than the smallest gap between slots of "
      "'every 10s' (10000 ms)"),
     (lambda s: s.every("x", "500ms", handler, jitter_ms=600, max_late_ms=2_000),
      "invalid jitter_ms 600"),
     (lambda s: s.cron("x", "*/5 * * * *", handler, jitter_ms=300_000, max_late_ms=400_000),
      "(300000 ms)"),
     (lambda s: s.cron("x", "0 0,1 * * *", handler, jitter_ms=3_600_000,
                       max_late_ms=4_000_000), "(3600000 ms)"),
     # Daylight saving brings 01:59 and the coalesced 02:59 (= 03:00) one minute apart.
     (lambda s: s.cron("x", "59 1,2 * * *", handler, tz="America/New_York",
                       jitter_ms=120_000, max_late_ms=200_000), "(60000 ms)")],
)
def test_jitter_that_reaches_the_next_slot_is_refused(scheduler: Scheduler, register: Any,
                                                      message: str) -> None:
    with raises(message) as info:
        register(scheduler)
    assert "skip" in str(info.value)
    assert scheduler.jobs() == []


def test_jitter_just_below_the_gap_is_accepted(scheduler: Scheduler) -> None:
    scheduler.every("x", "10s", handler, jitter_ms=9_999, max_late_ms=10_000)
    scheduler.cron("y", "59 1,2 * * *", handler, tz="America/New_York", jitter_ms=59_999)
    assert [j.options["jitter_ms"] for j in scheduler.jobs()] == [9_999, 59_999]


def test_default_jitter_never_reaches_the_next_slot(scheduler: Scheduler) -> None:
    # 6 fields in New York: at the spring change 01:59:59 and the coalesced 02:00:30
    # (= 03:00:00) are 1 s apart, closer than any two slots of an ordinary day.
    scheduler.cron("y", "59,30 59,0 1,2 * * *", handler, tz="America/New_York")
    (info,) = scheduler.jobs()
    assert 0 < info.options["jitter_ms"] < 1_000


@pytest.mark.parametrize(
    ("lease", "heartbeat", "message"),
    [(10**20, None, "invalid lease_ms 100000000000000000000: at most 86400000 (1d)"),
     (86_400_001, None, "invalid lease_ms 86400001: at most 86400000"),
     (50, None, "invalid lease_ms 50: must be at least 100"),
     (0, None, "invalid lease_ms 0: must be > 0"),
     ("30s", None, "invalid lease_ms '30s': expected whole milliseconds"),
     (True, None, "invalid lease_ms True"),
     (1_000, 5, "invalid heartbeat_ms 5: must be at least 10"),
     (1_000, 10**20, "invalid heartbeat_ms 100000000000000000000: at most"),
     (1_000, 1_000, "invalid heartbeat_ms 1000: must be smaller than lease_ms (1000)")],
)
def test_lease_timing_limits(lease: Any, heartbeat: Any, message: str) -> None:
    with raises(message):
        validate_lease_timings(lease, heartbeat)


def test_lease_timing_defaults_and_timedeltas() -> None:
    assert validate_lease_timings(None, None) == (30_000, 10_000)
    assert validate_lease_timings(timedelta(seconds=3), 1_000) == (3_000, 1_000)
    assert validate_lease_timings(MAX_LEASE_MS, None) == (MAX_LEASE_MS, MAX_LEASE_MS // 3)


@pytest.mark.parametrize(
    ("size", "ttl", "message"),
    [(10**20, None, "invalid history_size 100000000000000000000: expected an int ≥ 1 and ≤ "
      "1000000"), (0, None, "invalid history_size 0"), (10, 10**20, "invalid history_ttl_ms"),
     (10, 0, "invalid history_ttl_ms 0: must be > 0")],
)
def test_history_limits(size: Any, ttl: Any, message: str) -> None:
    with raises(message):
        validate_history(size, ttl)
    assert validate_history(MAX_HISTORY_SIZE, MAX_DURATION_MS) == (MAX_HISTORY_SIZE,
                                                                   MAX_DURATION_MS)


@pytest.mark.parametrize(
    ("instance_id", "message"),
    [("host\x00:1", "invalid instance_id 'host\\x00:1': a NUL character at position 4"),
     ("host\n1", "control or invisible character '\\n'"), ("h\ud800", "lone surrogate"),
     ("x" * 201, "201 characters, longer than 200"), (" host:1", "no surrounding spaces"),
     ("", "expected a non-empty string"), (None, "expected a non-empty string")],
)
def test_instance_id_limits(instance_id: Any, message: str) -> None:
    with raises(message):
        validate_instance_id(instance_id)
    assert validate_instance_id("web-1.example.com:4242") == "web-1.example.com:4242"
    assert validate_instance_id("κόμβος:7") == "κόμβος:7"


@pytest.mark.parametrize(
    ("expression", "tz", "message"),
    [("* " * 150, "UTC", "expected at most 200 printable characters"),
     ("0 8 * * *\x00", "UTC", "printable"),
     ("0 8 * * *", "UTC\x00", "invalid time zone 'UTC\\x00'"),
     ("0 8 * * *", "A" * 5_000, "invalid time zone 'AAAA"),
     ("0 8 * * *", "Europe", "invalid time zone 'Europe'"),
     ("0 8 * * *", "/etc/passwd", "invalid time zone '/etc/passwd'")],
)
def test_cron_strings_no_store_or_zoneinfo_can_take(scheduler: Scheduler, expression: str,
                                                    tz: str, message: str) -> None:
    with raises(message):
        scheduler.cron("x", expression, handler, tz=tz)
    assert scheduler.jobs() == []
