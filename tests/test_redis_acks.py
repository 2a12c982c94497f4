"""``min_replicas_acks``: lease writes followed by ``WAIT`` on their own connection."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from anarchon_core import backend_from_url
from anarchon_core.backends.redis import RedisBackend, ValkeyBackend
from anarchon_core.errors import ConfigError, StoreUnavailable
from anarchon_core.models import ClaimOutcome, ClaimRequest

from .support.helpers import start_redis

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("bad", [-1, 17, "two", 1.5, True])
def test_bad_values_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError, match="min_replicas_acks"):
        RedisBackend("redis://127.0.0.1:6379/0", min_replicas_acks=bad)  # type: ignore[arg-type]


def test_url_parameter_and_describe() -> None:
    backend = backend_from_url("redis://127.0.0.1:6379/0?prefix=x:&min_replicas_acks=2")
    assert isinstance(backend, RedisBackend)
    assert backend.min_replicas_acks == 2
    assert "min_replicas_acks=2" in backend.describe()
    assert ValkeyBackend("valkey://127.0.0.1:1/0", min_replicas_acks=1).min_replicas_acks == 1
    assert RedisBackend("redis://127.0.0.1:6379/0").min_replicas_acks == 0
    with pytest.raises(ConfigError, match="min_replicas_acks"):
        backend_from_url("redis://127.0.0.1:6379/0?min_replicas_acks=x")


def test_a_client_that_cannot_pipeline_is_refused() -> None:
    with pytest.raises(ConfigError, match="min_replicas_acks needs"):
        RedisBackend(redis.Redis(), min_replicas_acks=1)  # sync: WAIT could not follow


def _request() -> ClaimRequest:
    now = int(time.time() * 1000)
    return ClaimRequest(job="acks", slot=now - now % 1000, token=f"t{time.time_ns()}",
                        runner="test", lease_ms=5_000, overlap=True, max_attempts=3,
                        max_late_ms=60_000)


def test_claim_waits_for_a_replica(tmp_path: Path) -> None:
    """No replica: the claim is not won (transient error). With one: it is won."""
    primary = start_redis(tmp_path / "primary")
    replica = None
    try:
        async def claim() -> ClaimOutcome:
            backend = RedisBackend(primary.url, prefix=f"acks{time.time_ns()}:",
                                   min_replicas_acks=1)
            try:
                await backend.start()
                return (await backend.claim(_request())).outcome
            finally:
                await backend.stop()

        with pytest.raises(StoreUnavailable, match="acknowledged by 0 replicas"):
            asyncio.run(claim())
        replica = start_redis(tmp_path / "replica",
                              args=["--replicaof", "127.0.0.1", str(primary.port)])
        deadline = time.monotonic() + 30
        with redis.Redis(port=replica.port) as r:
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never linked"
                time.sleep(0.1)
        assert asyncio.run(claim()) is ClaimOutcome.WON
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()
