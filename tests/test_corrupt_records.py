"""A corrupt record in a store is reported once, skipped, and never blocks a job or makes
a run start twice. Each test writes garbage into its own namespace of a real store."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import aio_pika
import psycopg
import pytest
import redis
from psycopg import sql

from anarchon_core.backend import Backend, new_token
from anarchon_core.backends.nats import NatsBackend
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from .stores import StoreHandle
from .stores.postgres import POSTGRES_URL
from .stores.redis import SHARED_URL

pytestmark = pytest.mark.timeout(60)


def req(slot: int, job: str = "job", runner: str = "a", **kw: object) -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner, lease_ms=5_000,
                        overlap=bool(kw.pop("overlap", False)))


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING and text in r.message)


async def assert_jobs_keep_working(backend: Backend, slot: int) -> None:
    """Claims of the corrupted job and of another job still work; history answers."""
    for job in ("job", "other"):
        r = req(slot - 7_000, job, overlap=True)
        result = await backend.claim(r)
        assert result.won, (job, result)
        assert await backend.finish(RunRef(job, r.slot, r.token, result.attempt), "success")
        runs = await backend.history(job)
        assert (r.slot, "success") in [(x.slot, x.status) for x in runs]


# -- Redis (lease) ------------------------------------------------------------------------


@pytest.fixture
async def redis_lease(namespace: str) -> RedisBackend:
    backend = RedisBackend(SHARED_URL, prefix=f"{namespace}:")
    await backend.start()
    yield backend  # type: ignore[misc]
    await backend.stop()
    with redis.Redis.from_url(SHARED_URL) as client:
        keys = client.keys(f"*{namespace}*")
        if keys:
            client.delete(*keys)


async def test_redis_garbage_in_the_active_set_never_blocks_the_job(
    redis_lease: RedisBackend, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    slot = await redis_lease.clock_ms()
    tag = f"{{{namespace}:job}}"
    with redis.Redis.from_url(SHARED_URL) as client:
        client.sadd(f"{tag}:active", "garbage", "12345")            # members without state
        client.sadd(f"{tag}:active", "777")
        client.hset(f"{tag}:state", "777", "{not json")              # a state that is not JSON
        client.zadd(f"{tag}:slots", {"777": 777})
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        first = await redis_lease.claim(req(slot))
        assert first.won, "garbage must not make the slot overlap or fail"
        assert await redis_lease.finish(RunRef("job", slot, first.token or "", 1), "success")
        await assert_jobs_keep_working(redis_lease, slot)
        # The corrupt run itself is never started.
        assert (await redis_lease.claim(req(777))).outcome is ClaimOutcome.DONE
        assert (await redis_lease.claim(req(777))).outcome is ClaimOutcome.DONE
        await redis_lease.expired_runs("job")
        history = await redis_lease.history("job")
    assert slot in [r.slot for r in history]
    assert 777 not in [r.slot for r in history]
    assert warnings_about(caplog, "field 777") == 1, "reported once, with its key"
    assert any(f"{tag}:state" in r.message for r in caplog.records)
    with redis.Redis.from_url(SHARED_URL) as client:
        assert not client.sismember(f"{tag}:active", "garbage"), "a stateless member is dropped"


def _write_running_state(tag: str, slot: int, state: dict[str, object]) -> None:
    """Write ``state`` as slot ``slot``'s state, listed active, as the lease script would."""
    with redis.Redis.from_url(SHARED_URL) as client:
        client.hset(f"{tag}:state", str(slot), json.dumps(state))
        client.sadd(f"{tag}:active", str(slot))
        client.zadd(f"{tag}:slots", {str(slot): slot})


async def test_redis_unknown_status_is_never_taken_over(
    redis_lease: RedisBackend, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    slot = await redis_lease.clock_ms() - 60_000
    tag = f"{{{namespace}:job}}"
    state = {"a": "1", "s": "zombie", "t": "x", "r": "old", "b": "1", "l": "1"}
    _write_running_state(tag, slot, state)
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        for _ in range(3):
            result = await redis_lease.claim(req(slot))
            assert result.outcome is ClaimOutcome.DONE, result
        assert await redis_lease.expired_runs("job") == []
        await assert_jobs_keep_working(redis_lease, slot + 60_000)
    assert warnings_about(caplog, f"field {slot}") == 1


@pytest.mark.parametrize("lease", ["soon", None, ["1"]], ids=["text", "null", "list"])
async def test_redis_a_running_state_with_a_lease_that_is_no_number_answers_done(
    redis_lease: RedisBackend, namespace: str, caplog: pytest.LogCaptureFixture,
    lease: object,
) -> None:
    """Its claims answer ``done`` and report it (as SQL does), never a script error."""
    slot = await redis_lease.clock_ms() - 60_000
    tag = f"{{{namespace}:job}}"
    state = {"a": "1", "s": "running", "t": "x", "r": "old", "b": "1", "l": lease}
    _write_running_state(tag, slot, state)
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        for _ in range(3):
            result = await redis_lease.claim(req(slot))
            assert result.outcome is ClaimOutcome.DONE, result
        await assert_jobs_keep_working(redis_lease, slot + 60_000)
    assert warnings_about(caplog, f"field {slot}") == 1


async def test_redis_garbage_history_entries_are_skipped(
    redis_lease: RedisBackend, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    slot = await redis_lease.clock_ms()
    r = req(slot)
    assert (await redis_lease.claim(r)).won
    assert await redis_lease.finish(RunRef("job", slot, r.token, 1), "failed", "boom")
    tag = f"{{{namespace}:job}}"
    with redis.Redis.from_url(SHARED_URL) as client:
        client.zadd(f"{tag}:results", {"garbage": slot * 2, '{"a": "x"}': slot * 2})
        client.zadd(f"{tag}:slots", {"99999999999999999999": 1e19})
        client.hset(f"{tag}:state", "99999999999999999999", json.dumps(
            {"a": "1", "s": "success", "b": "99999999999999999999"}))
        client.xadd(f"{tag}:runs", {"garbage": "1"})
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        runs = await redis_lease.history("job")
        await redis_lease.history("job")
    assert [(x.slot, x.status, x.error) for x in runs] == [(slot, "failed", "boom")]
    assert warnings_about(caplog, "garbage") == 1
    await assert_jobs_keep_working(redis_lease, slot)


# -- Redis (claim-only) -------------------------------------------------------------------


async def test_redis_claim_only_garbage_entries_are_skipped(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"{namespace}:"
    backend = RedisBackend(SHARED_URL, prefix=prefix, strategy="stream-id")
    await backend.start()
    try:
        slot = await backend.clock_ms()
        with redis.Redis.from_url(SHARED_URL) as client:
            client.xadd(f"{prefix}job:runs", {"garbage": "1"}, id=f"{slot - 5_000}-0")
            client.xadd(f"{prefix}job:runs", {"slot": "x", "token": "t"},
                        id=f"{slot - 4_000}-0")
        r = req(slot)
        assert (await backend.claim(r)).won
        with redis.Redis.from_url(SHARED_URL) as client:
            client.zadd(f"{prefix}job:results", {"{broken": slot * 2})
        with caplog.at_level(logging.WARNING, logger="anarchon"):
            runs = await backend.history("job")
        assert [(x.slot, x.status) for x in runs] == [(slot, "running")]
        assert warnings_about(caplog, "skipping a corrupt record") >= 2
        # The garbage holds that run's one result slot; later runs record theirs.
        assert not await backend.finish(RunRef("job", slot, r.token), "success")
        for job in ("job", "other"):
            r2 = req(slot + 1_000, job)
            assert (await backend.claim(r2)).won
            assert await backend.finish(RunRef(job, r2.slot, r2.token), "success")
            assert (await backend.history(job))[0].status == "success"
    finally:
        await backend.stop()
        with redis.Redis.from_url(SHARED_URL) as client:
            keys = client.keys(f"{prefix}*")
            if keys:
                client.delete(*keys)


# -- SQL ----------------------------------------------------------------------------------


async def sql_corruption(backend: Backend, execute: Callable[[str, tuple[object, ...]], None],
                         table: str, caplog: pytest.LogCaptureFixture, *, marker: str) -> None:
    await backend.start()
    slot = await backend.clock_ms() - 60_000
    columns = ("job, slot, manual, attempt, token, status, runner, lease_until, started_at, "
               "finished_at, error")
    execute(f"INSERT INTO {table} ({columns}) VALUES "
            f"('job', {marker}, 0, 1, 't', 'zombie', 'old', 1, 1, NULL, NULL)", (slot,))
    execute(f"INSERT INTO {table} ({columns}) VALUES "
            f"('job', {marker}, 0, 1, 't', 'success', 'old', NULL, 99999999999999999, "
            "1, NULL)", (slot - 1_000,))
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        for _ in range(2):
            result = await backend.claim(req(slot))
            assert result.outcome is ClaimOutcome.DONE, "an unknown status is never taken over"
        assert await backend.expired_runs("job") == []
        runs = await backend.history("job")
        assert slot not in [r.slot for r in runs]
        await assert_jobs_keep_working(backend, slot + 60_000)
    assert warnings_about(caplog, "unknown status") >= 1
    assert warnings_about(caplog, "skipping a corrupt record") >= 2


async def test_sqlite_rows_with_a_bad_status_or_value_are_skipped(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlite3  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(str(tmp_path)) / "cron.db"
    backend = SqliteBackend(path, table="runs")

    def execute(statement: str, params: tuple[object, ...]) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(statement, params)

    try:
        await sql_corruption(backend, execute, '"runs"', caplog, marker="?")
    finally:
        await backend.stop()


async def test_postgres_rows_with_a_bad_status_or_value_are_skipped(
    store_handles: Callable[[str], StoreHandle], namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = store_handles("postgres").backend(namespace)
    table = sql.Identifier(namespace).as_string()

    def execute(statement: str, params: tuple[object, ...]) -> None:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(statement.encode(), params)  # type: ignore[arg-type]

    try:
        await sql_corruption(backend, execute, table, caplog, marker="%s")
    finally:
        await backend.stop()


# -- brokers ------------------------------------------------------------------------------


async def test_rabbitmq_messages_that_are_not_records_are_skipped(
    store_handles: Callable[[str], StoreHandle], namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = store_handles("rabbitmq").backend(namespace)
    assert isinstance(backend, RabbitMQBackend)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        r = req(slot)
        assert (await backend.claim(r)).won
        conn = await backend._connection()
        channel = await conn.channel()
        for body in (b"\xff not json", b'{"v": "1", "kind": "claim"}', b"[1, 2]"):
            await channel.default_exchange.publish(
                aio_pika.Message(body), routing_key=backend.history_stream("job"))
        await channel.close()
        with caplog.at_level(logging.WARNING, logger="anarchon"):
            runs = await backend.history("job")
            await backend.history("job")
        assert [(x.slot, x.status) for x in runs] == [(slot, "running")]
        assert warnings_about(caplog, "skipping a corrupt record") == 3, "once per record"
        assert await backend.finish(RunRef("job", slot, r.token), "success")
        assert [x.status for x in await backend.history("job")] == ["success"]
        assert (await backend.claim(req(slot, "other"))).won
    finally:
        await backend.stop()


async def test_nats_messages_that_are_not_records_are_skipped(
    store_handles: Callable[[str], StoreHandle], namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = store_handles("nats").backend(namespace)
    assert isinstance(backend, NatsBackend)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        js = (await backend._client()).jetstream()
        await js.publish(backend.claim_subject("job", slot - 1_000), b"garbage",
                         stream=backend.stream)
        await js.publish(backend.result_subject("job", slot - 2_000), b'{"v": "9"}',
                         stream=backend.stream)
        r = req(slot)
        assert (await backend.claim(r)).won
        with caplog.at_level(logging.WARNING, logger="anarchon"):
            runs = await backend.history("job")
        assert [(x.slot, x.status) for x in runs] == [(slot, "running")]
        assert warnings_about(caplog, "skipping a corrupt record") == 2
        # The subject holding garbage still decides its run: taken, never run.
        assert (await backend.claim(req(slot - 1_000))).outcome is ClaimOutcome.TAKEN
        assert await backend.finish(RunRef("job", slot, r.token), "success")
        assert (await backend.claim(req(slot, "other"))).won
    finally:
        await backend.stop()


# -- the downtime scan --------------------------------------------------------------------


async def missed_slots_are_recorded_despite(backend: Backend,
                                            corrupt: Callable[[int], object]) -> None:
    """Job ``a`` holds a corrupt record of its newest slot; job ``b``'s downtime is recorded."""
    from anarchon_core import Scheduler  # noqa: PLC0415

    await backend.start()
    now = await backend.clock_ms()
    last = now - now % 1_000 - 8_000
    r = req(last, "b")
    assert (await backend.claim(ClaimRequest(job="b", slot=last, token=r.token, runner="a",
                                             lease_ms=5_000, max_late_ms=10**9))).won
    assert await backend.finish(RunRef("b", last, r.token, 1), "success")
    await backend.claim(ClaimRequest(job="a", slot=last, token=new_token(), runner="a",
                                     lease_ms=5_000, max_late_ms=10**9))
    corrupt(last)
    scheduler = Scheduler(backend)
    for job in ("a", "b"):
        scheduler.every(job, "1s", lambda ctx: None, max_late_ms=300, jitter_ms=0)
    await scheduler.start()
    try:
        missed: list[int] = []
        for _ in range(100):
            missed = [x.slot for x in await backend.history("b", 50) if x.status == "missed"]
            if missed:
                break
            await asyncio.sleep(0.1)
        assert missed, "job b's downtime was never recorded"
        assert min(missed) == last + 1_000
    finally:
        await scheduler.stop()
        await backend.stop()


async def test_sqlite_a_row_with_a_text_slot_never_stops_the_downtime_scan(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlite3  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(str(tmp_path)) / "cron.db"

    def corrupt(slot: int) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE runs SET slot = 'abc' WHERE job = 'a'")

    with caplog.at_level(logging.WARNING, logger="anarchon"):
        await missed_slots_are_recorded_despite(SqliteBackend(path, table="runs"), corrupt)
    assert warnings_about(caplog, "unreadable newest slot") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_redis_a_slot_member_that_is_no_number_never_stops_the_downtime_scan(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    def corrupt(slot: int) -> None:
        with redis.Redis.from_url(SHARED_URL) as client:
            client.zadd(f"{{{namespace}:a}}:slots", {"\u00b2": slot + 10**6})  # isdigit()

    backend = RedisBackend(SHARED_URL, prefix=f"{namespace}:")
    try:
        with caplog.at_level(logging.WARNING, logger="anarchon"):
            await missed_slots_are_recorded_despite(backend, corrupt)
    finally:
        with redis.Redis.from_url(SHARED_URL) as client:
            keys = client.keys(f"*{namespace}*")
            if keys:
                client.delete(*keys)
    assert warnings_about(caplog, "unreadable slot") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_unreadable_meta_is_reported_once_however_often_it_is_read(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlite3  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(str(tmp_path)) / "cron.db"
    backend = SqliteBackend(path, table="runs")
    await backend.start()
    try:
        slot = await backend.clock_ms()
        r = req(slot)
        assert (await backend.claim(r)).won
        assert await backend.finish(RunRef("job", slot, r.token, 1), "success",
                                    meta={"task": "1"})
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE runs SET meta = ? WHERE job = 'job'", (f"{{{path}",))
        with caplog.at_level(logging.WARNING, logger="anarchon"):
            for _ in range(3):
                [run] = await backend.history("job")
                assert (run.status, run.meta) == ("success", {})
    finally:
        await backend.stop()
    assert warnings_about(caplog, "meta") == 1
