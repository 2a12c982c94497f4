"""Property-based: any input is either refused with ConfigError or really works.

Durations, cron strings and zones, job names, instance ids, option values and URL parts
are generated at random (including huge numbers, NULs, surrogates, unencoded URL
characters). Registration and construction may only answer ``ConfigError``; what they
accept must then work: the next slot is computable, the backend describes itself without
its password, and for some registrations a claim, finish and history read on SQLite.
"""

from __future__ import annotations

import asyncio
import itertools
import string
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from anarchon_core import ClaimRequest, ConfigError, RunRef, Scheduler, backend_from_url
from anarchon_core.backend import new_token
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.durations import MAX_DURATION_MS
from anarchon_core.naming import validate_instance_id
from anarchon_core.options import validate_history, validate_lease_timings
from anarchon_core.schedules import CronSchedule, EverySchedule

PROFILE = settings(max_examples=300, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])

# Every character, surrogates and controls included.
any_char = st.characters(codec=None, categories=None)
any_text = st.text(any_char, max_size=40)
huge_ints = st.integers(min_value=-(10**30), max_value=10**30)
numbers = st.one_of(huge_ints, st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(min_value=-5, max_value=10**13))
units = st.sampled_from(["ms", "s", "m", "h", "d", "w", "x", ""])
duration_texts = st.one_of(
    st.builds("".join,
              st.lists(st.builds(lambda n, u: f"{n}{u}",
                                 st.one_of(st.integers(0, 10**25), st.decimals(
                                     0, 10**12, allow_nan=False, places=3)), units),
                       min_size=1, max_size=4)),
    any_text)
durations = st.one_of(
    duration_texts, numbers, st.booleans(), st.none(),
    st.builds(timedelta, microseconds=st.integers(-(10**18), 10**18)),
)
option_values = st.one_of(
    huge_ints, st.integers(0, 10**12), st.booleans(), st.none(), any_text,
    st.floats(), st.builds(timedelta, milliseconds=st.integers(-(10**12), 10**12)))
cron_tokens = st.sampled_from(
    ["*", "*/5", "0", "1", "7", "12", "23", "29", "30", "31", "59", "60", "61", "1-5", "5-1",
     "0-59/15", "mon", "JAN", "mon-fri", "L", "1#2", "?", "H", "-", ",", "1,2", "*/0",
     "99999999999999999999", "\x00", "é"])
cron_strings = st.one_of(
    st.lists(cron_tokens, min_size=1, max_size=7).map(" ".join),
    st.sampled_from(["@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@reboot", "@"]),
    any_text)
zones = st.one_of(
    st.sampled_from(["UTC", "Europe/Athens", "America/New_York", "Australia/Lord_Howe",
                     "Asia/Kathmandu", "Pacific/Chatham", "Etc/GMT+12", "Europe", "../x",
                     "", "UTC\x00", "Mars/Base", "/etc/localtime"]),
    any_text)
names = st.one_of(
    any_text, st.text(string.printable, max_size=30),
    st.text(any_char, min_size=190, max_size=260), st.sampled_from(["eu:sync", "a b", "Σ ✓"]))


_SLOTS = itertools.count(1)


def _handler(ctx: Any) -> None:
    pass


def _now_ms() -> int:
    return int(time.time() * 1000)


@PROFILE
@given(interval=durations, offset=st.one_of(st.just(0), durations))
def test_every_intervals(tmp_path: Path, interval: Any, offset: Any) -> None:
    scheduler = Scheduler(SqliteBackend(tmp_path / "p.db"))
    try:
        scheduler.every("job", interval, _handler, offset=offset)
    except ConfigError:
        assert scheduler.jobs() == []
        return
    (info,) = scheduler.jobs()
    schedule = EverySchedule(interval, offset)
    assert 1 <= schedule.interval_ms <= MAX_DURATION_MS
    assert info.next_slot > _now_ms() - 1_000
    assert info.next_run_at.year < 9000
    slots = schedule.upcoming(info.next_slot, 3)
    assert slots[1] - slots[0] == schedule.interval_ms


@PROFILE
@given(expression=cron_strings, tz=zones)
def test_cron_expressions_and_zones(tmp_path: Path, expression: Any, tz: Any) -> None:
    scheduler = Scheduler(SqliteBackend(tmp_path / "p.db"))
    try:
        scheduler.cron("job", expression, _handler, tz=tz)
    except ConfigError:
        assert scheduler.jobs() == []
        return
    (info,) = scheduler.jobs()
    assert info.next_run_at.year < 9000
    schedule = CronSchedule(expression, tz)
    slots = schedule.upcoming(info.next_slot - 1, 4)
    assert slots[0] == info.next_slot
    assert slots == sorted(set(slots))


@PROFILE
@given(options=st.dictionaries(
    st.sampled_from(["timeout_ms", "jitter_ms", "max_late_ms", "overlap", "max_attempts",
                     "catch_up_ms"]), option_values, max_size=4),
       interval=st.sampled_from(["500ms", "10s", "1h", "1d"]))
def test_option_values(tmp_path: Path, options: dict[str, Any], interval: str) -> None:
    scheduler = Scheduler(SqliteBackend(tmp_path / "p.db"))
    try:
        scheduler.every("job", interval, _handler, **options)
    except ConfigError:
        assert scheduler.jobs() == []
        return
    (info,) = scheduler.jobs()
    opts = info.options
    assert opts["jitter_ms"] < EverySchedule(interval).interval_ms
    assert opts["max_late_ms"] >= opts["jitter_ms"]
    for key in ("jitter_ms", "max_late_ms", "catch_up_ms"):
        assert 0 <= opts[key] <= MAX_DURATION_MS
    assert 1 <= opts["max_attempts"] <= 1000


@PROFILE
@given(lease=option_values, heartbeat=st.one_of(st.none(), option_values),
       size=option_values, ttl=st.one_of(st.none(), option_values))
def test_scheduler_settings(lease: Any, heartbeat: Any, size: Any, ttl: Any) -> None:
    try:
        lease_ms, heartbeat_ms = validate_lease_timings(lease, heartbeat)
    except ConfigError:
        pass
    else:
        assert 100 <= lease_ms <= 86_400_000
        assert 10 <= heartbeat_ms < lease_ms
    try:
        history_size, history_ttl = validate_history(size, ttl)
    except ConfigError:
        pass
    else:
        assert 1 <= history_size <= 1_000_000
        assert history_ttl is None or 1 <= history_ttl <= MAX_DURATION_MS


async def _claim_on_sqlite(backend: SqliteBackend, name: str, runner: str, lease_ms: int,
                           max_attempts: int) -> None:
    slot = _now_ms() + next(_SLOTS)  # each example its own slot (one file for all)
    request = ClaimRequest(job=name, slot=slot, token=new_token(), runner=runner,
                           lease_ms=lease_ms, max_attempts=max_attempts, max_late_ms=60_000)
    result = await backend.claim(request)
    assert result.won, result
    assert await backend.heartbeat(RunRef(name, slot, request.token, result.attempt), lease_ms)
    assert await backend.finish(RunRef(name, slot, request.token, result.attempt), "success")
    run = (await backend.history(name, 5))[0]
    assert (run.job, run.slot, run.runner, run.status) == (name, slot, runner, "success")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=names, instance_id=st.one_of(any_text, st.just("host:1")),
       lease=st.one_of(st.integers(-5, 10**20), st.just(30_000)),
       attempts=st.one_of(st.integers(-5, 10**20), st.just(3)))
def test_what_registration_accepts_claims_on_sqlite(tmp_path: Path, name: Any,
                                                    instance_id: Any, lease: int,
                                                    attempts: int) -> None:
    try:
        runner = validate_instance_id(instance_id)
        lease_ms, _ = validate_lease_timings(lease, None)
        scheduler = Scheduler(SqliteBackend(tmp_path / "claims.db"))
        scheduler.every(name, "10s", _handler, max_attempts=attempts)
    except ConfigError:
        return
    backend = SqliteBackend(tmp_path / "claims.db")

    async def claim() -> None:
        try:
            await _claim_on_sqlite(backend, name, runner, lease_ms, attempts)
        finally:
            await backend.stop()

    asyncio.run(claim())


url_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
SECRET = "pwZq9"


@PROFILE
@given(
    scheme=st.sampled_from(["redis", "rediss", "valkey", "postgresql", "postgres", "amqp",
                            "amqps", "nats", "tls"]),
    user=st.one_of(st.just(""), st.text(string.ascii_letters, min_size=1, max_size=6)),
    password=url_text, encode=st.booleans(),
    host=st.one_of(st.sampled_from(["127.0.0.1", "localhost", "[::1]", "", "[::1", "h h"]),
                   url_text),
    port=st.one_of(st.none(), st.integers(-5, 70_000).map(str), url_text),
    path=st.one_of(st.sampled_from(["", "/", "/0", "/15", "/abc", "/test", "/%2F"]),
                   url_text.map(lambda t: "/" + t)),
    query=st.lists(st.tuples(
        st.one_of(st.sampled_from(["prefix", "table", "stream", "strategy", "db",
                                   "socket_timeout", "sslmode", "connect_timeout", "heartbeat",
                                   "foo", "password", "token", "sslpassword"]), url_text),
        url_text), max_size=3),
    token_only=st.booleans(),
)
def test_url_parts(scheme: str, user: str, password: str, encode: bool, host: str,
                   port: str | None, path: str, query: list[tuple[str, str]],
                   token_only: bool) -> None:
    # A lone userinfo is a token for NATS and Redis; for PostgreSQL and AMQP the user name.
    token_only = token_only and scheme in ("redis", "rediss", "valkey", "nats", "tls")
    secret = SECRET + password
    written = quote(secret, safe="") if encode else secret
    assume(not token_only or ":" not in written)  # "a:b@" is a user name and a password
    userinfo = f"{written}@" if token_only else f"{user}:{written}@"
    netloc = f"{userinfo}{host}" + (f":{port}" if port is not None else "")
    pairs = "&".join(f"{k}={v}" for k, v in query)
    url = f"{scheme}://{netloc}{path}" + (f"?{pairs}" if pairs else "")
    assume(SECRET not in url.replace(written, ""))  # the secret sits only in the userinfo
    try:
        backend = backend_from_url(url)
    except ConfigError as exc:
        refused = str(exc)
        assert SECRET not in refused, (url, refused)
        return
    for text in (repr(backend), backend.describe()):
        assert SECRET not in text, (url, text)


def test_property_tests_have_teeth() -> None:
    # The generators reach both outcomes; a test that could only pass would be worthless.
    with pytest.raises(ConfigError):
        backend_from_url(f"redis://u:{SECRET}/x@127.0.0.1/0")
    assert SECRET not in repr(backend_from_url(f"nats://{SECRET}@127.0.0.1:4222"))
