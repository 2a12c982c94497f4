"""RabbitMQBackend specifics: options, names, the run queue, reconnects, secrets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aio_pika
import pytest
from aio_pika.exceptions import DeliveryError
from hypothesis import given
from hypothesis import strategies as st
from pamqp.constants import DOMAIN_REGEX

from anarchon_core import Scheduler, backend_from_url
from anarchon_core.backend import new_token
from anarchon_core.backends.rabbitmq import RabbitMQBackend, queue_token
from anarchon_core.errors import ConfigError, StoreError, StoreFormatError
from anarchon_core.models import ClaimOutcome, ClaimRequest

from .stores import StoreHandle
from .stores.rabbitmq import URL, delete_queues, tracked_backend

pytestmark = pytest.mark.timeout(60)


def req(slot: int, runner: str = "a", **kw: object) -> ClaimRequest:
    return ClaimRequest(job=str(kw.pop("job", "job")), slot=slot, token=new_token(),
                        runner=runner, **kw)  # type: ignore[arg-type]


def test_from_url_reads_the_prefix_and_masks_the_password() -> None:
    backend = backend_from_url("amqp://app:s3cret@rabbit:5672/prod?prefix=billing.cron.")
    assert isinstance(backend, RabbitMQBackend)
    assert backend.prefix == "billing.cron."
    assert "s3cret" not in repr(backend)
    assert "app:***@rabbit:5672/prod" in repr(backend)
    assert backend_from_url("amqps://h/").prefix == "cron."  # type: ignore[attr-defined]


@pytest.mark.parametrize("url", ["amqp://h/?table=x", "amqp://h/?stream=S"])
def test_from_url_refuses_other_namespace_params(url: str) -> None:
    with pytest.raises(ConfigError, match="unknown parameter"):
        backend_from_url(url)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"prefix": "amq.cron."}, "reserved"),
    ({"prefix": "cron jobs"}, "invalid prefix"),
    ({"prefix": ""}, "invalid prefix"),
    ({"run_expires_ms": 500}, "run_expires_ms"),
    ({"channels": 0}, "channels"),
    ({"url": "redis://localhost"}, "expected amqp"),
])
def test_bad_options_are_config_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RabbitMQBackend(**kwargs)  # type: ignore[arg-type]


def test_queue_names() -> None:
    backend = RabbitMQBackend(prefix="p.")
    assert backend.run_queue("sync", 1000) == "p.sync.1000"
    assert backend.run_queue("sync", 1000, manual=True) == "p.sync.1000.manual"
    assert backend.history_stream("sync") == "p.sync.history"
    assert backend.format_queue == "p.format"
    assert queue_token("bericht-ü+1") == "bericht-+C3+BC+2B1"
    assert queue_token("a") != queue_token("+61")
    long = backend.run_queue("ü" * 200, 1795953000000, manual=True)
    assert len(long.encode()) <= 255
    assert long != backend.run_queue("ü" * 199, 1795953000000, manual=True)


@given(job=st.text(min_size=1, max_size=300), prefix=st.sampled_from(["cron.", "a_b:c-d."]))
def test_every_queue_name_passes_the_amqp_librarys_own_check(job: str, prefix: str) -> None:
    # pamqp validates a queue name before it goes out (pamqp 3, under aio-pika 9, refused
    # the "+" of the escapes: every job name with one failed to claim).
    valid = DOMAIN_REGEX["queue-name"]
    backend = RabbitMQBackend(prefix=prefix)
    for name in (backend.run_queue(job, 1795953000000), backend.history_stream(job),
                 backend.run_queue(job, 1795953000000, manual=True)):
        assert valid.fullmatch(name), name
        assert len(name.encode()) <= 255


def test_job_whose_late_claims_outlive_its_queues_is_refused() -> None:
    scheduler = Scheduler(RabbitMQBackend(URL, run_expires_ms=60_000))
    with pytest.raises(ConfigError, match="run_expires_ms"):
        scheduler.every("slowpoke", "10m", lambda ctx: None, max_late_ms=45_000)
    scheduler.every("fine", "10m", lambda ctx: None, max_late_ms=20_000)


@pytest.fixture
def handle(store_handles: Callable[[str], StoreHandle]) -> StoreHandle:
    return store_handles("rabbitmq")


async def test_run_queue_holds_one_message_and_refuses_more(
    handle: StoreHandle, namespace: str
) -> None:
    backend = tracked_backend(handle.extra, namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        assert (await backend.claim(req(slot))).won
        name = backend.run_queue("job", slot)
        conn = await aio_pika.connect(URL)
        try:
            channel = await conn.channel(publisher_confirms=True)
            queue = await channel.declare_queue(name, passive=True)
            assert queue.declaration_result.message_count == 1
            with pytest.raises(DeliveryError):
                await channel.default_exchange.publish(aio_pika.Message(b"x"),
                                                       routing_key=name)
        finally:
            await conn.close()
        assert (await backend.claim(req(slot, "b"))).outcome is ClaimOutcome.TAKEN
    finally:
        await backend.stop()


async def test_a_dropped_connection_is_reopened(handle: StoreHandle, namespace: str) -> None:
    backend = tracked_backend(handle.extra, namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        assert (await backend.claim(req(slot))).won
        conn = await backend._connection()
        await conn.close()
        assert (await backend.claim(req(slot, "b"))).outcome is ClaimOutcome.TAKEN
        assert (await backend.claim(req(slot + 1000, "b"))).won
        assert [r.runner for r in await backend.history("job")] == ["b", "a"]
    finally:
        await backend.stop()


async def test_concurrent_history_readers_see_everything(
    handle: StoreHandle, namespace: str
) -> None:
    backend = tracked_backend(handle.extra, namespace)
    await backend.start()
    try:
        base = await backend.clock_ms()
        for i in range(30):
            assert (await backend.claim(req(base + i))).won
        results = await asyncio.gather(*(backend.history("job", limit=100) for _ in range(6)))
        assert all(len(r) == 30 for r in results)
    finally:
        await backend.stop()


async def test_foreign_format_queue_is_refused(namespace: str) -> None:
    conn = await aio_pika.connect(URL)
    try:
        channel = await conn.channel()
        await channel.declare_queue(f"{namespace}.format", durable=True)
        with pytest.raises(StoreFormatError):
            await RabbitMQBackend(URL, prefix=f"{namespace}.").start()
    finally:
        await conn.close()
        await delete_queues([f"{namespace}.format"])


async def test_wrong_password_is_a_store_error_without_the_password() -> None:
    backend = RabbitMQBackend(URL.replace("guest:guest", "guest:wrong-s3cret"), timeout_s=5)
    with pytest.raises(StoreError) as info:
        await backend.start()
    assert "wrong-s3cret" not in str(info.value)
    assert "***" in str(info.value)


async def test_run_now_through_the_scheduler(handle: StoreHandle, namespace: str) -> None:
    calls: list[bool] = []

    async def work(ctx: object) -> None:
        calls.append(ctx.manual)  # type: ignore[attr-defined]

    scheduler = Scheduler(tracked_backend(handle.extra, namespace), instance_id="me")
    scheduler.every("report", "1h", work)
    try:
        run = await scheduler.run_now("report")
        assert (run.manual, run.status, run.runner) == (True, "success", "me")
        assert calls == [True]
        [stored] = await scheduler.history("report")
        assert (stored.slot, stored.manual, stored.status) == (run.slot, True, "success")
    finally:
        await scheduler.stop()


async def test_reconnects_when_the_amqp_connection_dies_under_aio_pika(
    handle: StoreHandle, namespace: str
) -> None:
    # What a broker-side close (e.g. INTERNAL_ERROR 541) leaves behind: aio-pika still
    # reports the connection open while the AMQP connection under it is gone.
    backend = tracked_backend(handle.extra, namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        assert (await backend.claim(req(slot))).won
        dead = backend._conn
        assert dead is not None
        await dead.transport.connection.close()
        assert not dead.is_closed
        assert (await backend.claim(req(slot + 1))).won
        assert backend._conn is not dead
    finally:
        await backend.stop()
