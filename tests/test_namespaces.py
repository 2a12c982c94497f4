"""Namespaces never collide: a prefix and a job name can never combine into another
namespace's key, queue or subject; and every name registration accepts works."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from anarchon_core.backend import Backend, new_token
from anarchon_core.backends.nats import NatsBackend
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis.keys import job_from_key_part, job_key_part, redis_key
from anarchon_core.errors import ConfigError
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from .stores import StoreHandle
from .stores.nats import URL as NATS_URL
from .stores.redis import SHARED_URL

pytestmark = pytest.mark.timeout(60)


def req(slot: int, job: str, runner: str = "a") -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner, lease_ms=5_000,
                        overlap=True)


async def assert_isolated(a: Backend, b: Backend, job_a: str, job_b: str) -> None:
    """Both namespaces win the same slot of their own job and see only their own runs."""
    for backend in (a, b):
        await backend.start()
    try:
        slot = await a.clock_ms()
        won_a = await a.claim(req(slot, job_a, "in-a"))
        won_b = await b.claim(req(slot, job_b, "in-b"))
        assert won_a.won, won_a
        assert won_b.won, won_b
        assert await a.finish(RunRef(job_a, slot, won_a.token or ""), "success")
        assert [r.runner for r in await a.history(job_a)] == ["in-a"]
        assert [(r.runner, r.status) for r in await b.history(job_b)] == [("in-b", "running")]
    finally:
        for backend in (a, b):
            await backend.stop()


@pytest.mark.parametrize("strategy", ["lease", "stream-id", "script"])
async def test_redis_prefix_and_job_never_combine_into_another_namespace(
    namespace: str, strategy: str
) -> None:
    a = RedisBackend(SHARED_URL, prefix=f"{namespace}:", strategy=strategy)
    b = RedisBackend(SHARED_URL, prefix=f"{namespace}:eu:", strategy=strategy)
    try:
        await assert_isolated(a, b, "eu:sync", "sync")
    finally:
        with redis.Redis.from_url(SHARED_URL) as client:
            keys = client.keys(f"*{namespace}*")
            if keys:
                client.delete(*keys)


def test_redis_keys_keep_the_layout_for_ordinary_names_and_escape_the_rest() -> None:
    assert redis_key("cron:", "state", "sync", tagged=True) == "{cron:sync}:state"
    assert redis_key("cron:", "runs", "report-daily") == "cron:report-daily:runs"
    assert redis_key("P:", "state", "eu:sync", tagged=True) == "{P:eu%3Async}:state"
    assert redis_key("P:eu:", "state", "sync", tagged=True) == "{P:eu:sync}:state"
    for job in ("eu:sync", "a{b}c", "100%", "%3A", "plain", "ü:{%}"):
        assert job_from_key_part(job_key_part(job)) == job
        assert ":" not in job_key_part(job)
        assert "{" not in job_key_part(job)
    assert len({job_key_part(j) for j in ("%3A", ":", "%253A")}) == 3


def test_redis_prefix_must_end_with_a_colon() -> None:
    with pytest.raises(ConfigError, match="must end with ':'"):
        RedisBackend(SHARED_URL, prefix="cron")


async def test_rabbitmq_prefix_and_job_never_combine_into_another_namespace(
    store_handles: Callable[[str], StoreHandle], namespace: str
) -> None:
    handle = store_handles("rabbitmq")
    a = handle.backend(namespace)
    b = handle.backend(f"{namespace}.eu")
    assert isinstance(a, RabbitMQBackend)
    assert isinstance(b, RabbitMQBackend)
    assert a.run_queue("eu.sync", 1) != b.run_queue("sync", 1)
    assert a.history_stream("eu.sync") != b.history_stream("sync")
    await assert_isolated(a, b, "eu.sync", "sync")


def test_rabbitmq_prefix_must_end_with_a_dot() -> None:
    with pytest.raises(ConfigError, match=r"must end with '\.'"):
        RabbitMQBackend("amqp://guest:guest@127.0.0.1:5672/", prefix="cron")


@pytest.mark.parametrize("job", [
    "ü" * 48,                       # the name RabbitMQ once refused (hashed, too long)
    "報告" * 100,                     # 200 characters, far beyond 255 bytes escaped
    "job with spaces, #tags/and:colons@x",
    "a.b+c~d",
])
async def test_rabbitmq_holds_every_name_registration_accepts(
    store_handles: Callable[[str], StoreHandle], namespace: str, job: str
) -> None:
    backend = store_handles("rabbitmq").backend(namespace)
    assert isinstance(backend, RabbitMQBackend)
    for name in (backend.run_queue(job, 1), backend.history_stream(job)):
        assert len(name.encode()) <= 255
    await backend.start()
    try:
        slot = await backend.clock_ms()
        first = await backend.claim(req(slot, job))
        assert first.won
        assert (await backend.claim(req(slot, job, "b"))).outcome is ClaimOutcome.TAKEN
        assert await backend.finish(RunRef(job, slot, first.token or ""), "success")
        assert [(r.job, r.status) for r in await backend.history(job)] == [(job, "success")]
    finally:
        await backend.stop()


async def test_nats_prefix_and_job_never_combine_into_another_namespace(
    namespace: str,
) -> None:
    stream = namespace.upper()
    a = NatsBackend(NATS_URL, prefix=f"{namespace}.", stream=stream)
    b = NatsBackend(NATS_URL, prefix=f"{namespace}.res.", stream=stream)
    c = NatsBackend(NATS_URL, prefix=f"{namespace}.eu.", stream=stream)
    try:
        await assert_isolated(a, c, "eu.sync", "sync")
        # A prefix that extends another one with a subject kind: "run" in one namespace
        # and "res.run" in the other never read each other's records.
        await assert_isolated(a, b, "run", "run")
    finally:
        import nats  # noqa: PLC0415

        nc = await nats.connect(NATS_URL, allow_reconnect=False)
        try:
            await nc.jetstream().delete_stream(stream)
        finally:
            await nc.close()
