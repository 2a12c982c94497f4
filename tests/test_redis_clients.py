"""Every kind of Redis/Valkey client a user may pass drives a real claim.

redis-py and valkey-py (sync and asyncio, standalone and cluster), Valkey GLIDE (async and
sync, standalone and cluster) and a plain object with ``execute_command``, against the
shared Redis 7, the dedicated Valkey 8.1 and the local Redis Cluster. A client the user
passed stays open after ``stop()``; anarchon's own connection is closed.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import valkey
import valkey.asyncio
import valkey.asyncio.cluster
import valkey.cluster

from anarchon_core.backend import new_token
from anarchon_core.backends.redis import RedisBackend, ValkeyBackend
from anarchon_core.backends.redis.clients import hiredis_packing
from anarchon_core.errors import ConfigError
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from .stores import StoreHandle, unavailable
from .stores.redis import SHARED_URL


def require(module: str) -> Any:
    """Import a client library; a missing one skips loudly, and fails under CI=true."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        unavailable(f"the {module} client", str(exc))
        raise


pytestmark = pytest.mark.timeout(90)

Getter = Callable[[str], StoreHandle]


async def claim_twice(backend: RedisBackend) -> None:
    """One claim wins, the next sees it running, finish and history work."""
    await backend.start()
    try:
        slot = await backend.clock_ms()
        first = ClaimRequest("job", slot, new_token(), "a")
        assert (await backend.claim(first)).won
        second = await backend.claim(ClaimRequest("job", slot, new_token(), "b"))
        assert second.outcome in (ClaimOutcome.RUNNING, ClaimOutcome.TAKEN)
        assert await backend.finish(RunRef("job", slot, first.token, 1), "success")
        [run] = await backend.history("job")
        assert (run.slot, run.status, run.runner) == (slot, "success", "a")
    finally:
        await backend.stop()


def valkey_port(store_handles: Getter) -> int:
    return int(store_handles("valkey").extra.port)


def cluster_port(store_handles: Getter) -> int:
    return int(store_handles("redis-cluster").extra.port)


# ---------------------------------------------------------------- redis-py / valkey-py

SYNC_FACTORIES: dict[str, Callable[[Getter], Any]] = {
    "redis.Redis": lambda g: redis.Redis(port=6379),
    "redis.cluster.RedisCluster": lambda g: redis.cluster.RedisCluster(
        host="127.0.0.1", port=cluster_port(g)),
    "valkey.Valkey": lambda g: valkey.Valkey(port=valkey_port(g)),
    "valkey.cluster.ValkeyCluster": lambda g: valkey.cluster.ValkeyCluster(
        host="127.0.0.1", port=cluster_port(g)),
}
ASYNC_FACTORIES: dict[str, Callable[[Getter], Any]] = {
    "redis.asyncio.Redis": lambda g: redis.asyncio.Redis(port=6379),
    "redis.asyncio.Redis(decode_responses)": lambda g: redis.asyncio.Redis(
        port=6379, decode_responses=True),
    "redis.asyncio.RedisCluster": lambda g: redis.asyncio.cluster.RedisCluster(
        host="127.0.0.1", port=cluster_port(g)),
    "valkey.asyncio.Valkey": lambda g: valkey.asyncio.Valkey(port=valkey_port(g)),
    "valkey.asyncio.ValkeyCluster": lambda g: valkey.asyncio.cluster.ValkeyCluster(
        host="127.0.0.1", port=cluster_port(g)),
}


@pytest.mark.parametrize("kind", sorted(SYNC_FACTORIES))
async def test_sync_client_claims_and_stays_open(kind: str, store_handles: Getter,
                                                 namespace: str) -> None:
    client = SYNC_FACTORIES[kind](store_handles)
    try:
        backend = RedisBackend(client, prefix=f"{namespace}:")
        assert kind.rsplit(".", maxsplit=1)[-1] in backend.describe()
        await claim_twice(backend)
        assert client.ping()  # the user's client is still open
    finally:
        client.close()


@pytest.mark.parametrize("kind", sorted(ASYNC_FACTORIES))
async def test_asyncio_client_claims_and_stays_open(kind: str, store_handles: Getter,
                                                    namespace: str) -> None:
    client = ASYNC_FACTORIES[kind](store_handles)
    try:
        for strategy in ("lease", "stream-id", "script"):
            await claim_twice(RedisBackend(client, strategy=strategy,
                                           prefix=f"{namespace}{strategy}:"))
        assert await client.ping()
    finally:
        await client.aclose()


async def test_valkey_backend_with_a_valkey_client(store_handles: Getter,
                                                   namespace: str) -> None:
    client = valkey.asyncio.Valkey(port=valkey_port(store_handles))
    try:
        await claim_twice(ValkeyBackend(client, prefix=f"{namespace}:"))
    finally:
        await client.aclose()


# ---------------------------------------------------------------- Valkey GLIDE

def glide_config(cluster: bool, port: int) -> Any:
    glide = require("glide")
    address = [glide.NodeAddress("127.0.0.1", port)]
    if cluster:
        return glide.GlideClusterClientConfiguration(address)
    return glide.GlideClientConfiguration(address)


@pytest.mark.parametrize(("server", "cluster"),
                         [("redis", False), ("valkey", False), ("redis", True)],
                         ids=["redis", "valkey", "redis-cluster"])
async def test_glide_async_client(cluster: bool, server: str, store_handles: Getter,
                                  namespace: str) -> None:
    glide = require("glide")
    port = cluster_port(store_handles) if cluster else (
        6379 if server == "redis" else valkey_port(store_handles))
    cls = glide.GlideClusterClient if cluster else glide.GlideClient
    client = await cls.create(glide_config(cluster, port))
    try:
        backend_cls = ValkeyBackend if server == "valkey" else RedisBackend
        for strategy in ("lease", "stream-id", "script"):
            await claim_twice(backend_cls(client, strategy=strategy,
                                          prefix=f"{namespace}{strategy}:"))
        assert await client.custom_command(["PING"]) in (b"PONG", "PONG")
    finally:
        await client.close()


@pytest.mark.parametrize("cluster", [False, True], ids=["standalone", "cluster"])
async def test_glide_sync_client(cluster: bool, store_handles: Getter,
                                 namespace: str) -> None:
    glide_sync = require("glide_sync")
    port = cluster_port(store_handles) if cluster else 6379
    cls = glide_sync.GlideClusterClient if cluster else glide_sync.GlideClient
    client = cls.create(glide_config(cluster, port))
    try:
        await claim_twice(RedisBackend(client, prefix=f"{namespace}:"))
        assert client.custom_command(["PING"]) in (b"PONG", "PONG")
    finally:
        client.close()


# ---------------------------------------------------------------- any execute_command

class SlowSyncClient:
    """A sync client of our own: forwards to redis-py, slowly, recording threads."""

    def __init__(self, delay: float) -> None:
        self.inner = redis.Redis(port=6379)
        self.delay = delay
        self.calls = 0
        self.threads: set[int] = set()
        self.in_flight = 0

    def execute_command(self, *args: Any) -> Any:
        self.calls += 1
        self.threads.add(threading.get_ident())
        self.in_flight += 1
        try:
            time.sleep(self.delay)
            return self.inner.execute_command(*args)
        finally:
            self.in_flight -= 1


class AwaitableClient:
    """An object whose execute_command returns an awaitable (not a coroutine function)."""

    def __init__(self) -> None:
        self.inner = redis.asyncio.Redis(port=6379)

    def execute_command(self, *args: Any) -> Awaitable[Any]:
        return self.inner.execute_command(*args)


async def test_sync_execute_command_never_blocks_the_event_loop(namespace: str) -> None:
    client = SlowSyncClient(delay=0.2)
    ticked = asyncio.Event()

    async def ticker() -> None:
        # Sees a slow call in flight only if that call is off the loop.
        for _ in range(10_000):
            await asyncio.sleep(0.005)
            if client.in_flight:
                ticked.set()
                return

    task = asyncio.ensure_future(ticker())
    try:
        await claim_twice(RedisBackend(client, prefix=f"{namespace}:"))
    finally:
        task.cancel()
        client.inner.close()
    assert client.calls >= 5
    # Every call of the sync client ran in a worker thread, never on the loop's thread,
    # and the loop went on meanwhile.
    assert threading.get_ident() not in client.threads
    assert ticked.is_set()


async def test_object_returning_awaitables(namespace: str) -> None:
    client = AwaitableClient()
    assert not inspect.iscoroutinefunction(client.execute_command)
    try:
        await claim_twice(RedisBackend(client, prefix=f"{namespace}:"))
    finally:
        await client.inner.aclose()


def test_an_unusable_client_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unsupported Redis client"):
        RedisBackend(object())


# ---------------------------------------------------------------- anarchon's own connection

@pytest.mark.parametrize("target", [SHARED_URL, {"host": "127.0.0.1", "port": 6379, "db": 0}],
                         ids=["url", "options"])
async def test_own_connection_is_closed_by_stop(target: Any, namespace: str) -> None:
    backend = RedisBackend(target, prefix=f"{namespace}:")
    assert "6379" in backend.describe()
    await claim_twice(backend)
    assert backend._conn is None, "stop() must drop the connection it opened"
    # and it reconnects on the next start
    await backend.start()
    try:
        assert len(await backend.history("job")) == 1
    finally:
        await backend.stop()


async def test_owned_connection_really_disconnects(namespace: str) -> None:
    name = f"anarchon-{namespace}"
    backend = RedisBackend(f"{SHARED_URL}?client_name={name}", prefix=f"{namespace}:")
    await backend.start()
    await backend.clock_ms()
    with redis.Redis(port=6379) as admin:
        def connected() -> bool:
            return any(c.get("name") == name for c in admin.client_list())
        assert connected()
        await backend.stop()
        deadline = time.monotonic() + 5
        while connected() and time.monotonic() < deadline:  # noqa: ASYNC110 - polls Redis
            await asyncio.sleep(0.05)
        assert not connected()


def test_shared_redis_is_there() -> None:
    try:
        with redis.Redis(port=6379, socket_timeout=2) as client:
            client.ping()
    except redis.RedisError as exc:
        unavailable("Redis 7 (shared)", str(exc))


@pytest.mark.parametrize("args", [
    ("EVALSHA", "0" * 40, 2, "{ns:job}:state", "{ns:job}:active", "tok", "host:1", "1 0 30"),
    ("SET", "k", "välue ünïcode", "NX", "PX", 30000),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT LIST",),
    ("SET", b"\x00\xffbinary", b"", "PX", -1),
])
def test_own_connections_pack_commands_as_redis_py_does(args: tuple[Any, ...]) -> None:
    plain = redis.asyncio.Connection(host="127.0.0.1")
    packing = hiredis_packing(redis.asyncio.Connection)(host="127.0.0.1")
    assert type(packing).__name__ == "HiredisConnection"
    assert b"".join(packing.pack_command(*args)) == b"".join(plain.pack_command(*args))


async def test_own_standalone_client_packs_with_hiredis(namespace: str) -> None:
    backend = RedisBackend(SHARED_URL, prefix=f"{namespace}:")
    await backend.start()
    try:
        pool = backend._conn.client.connection_pool  # type: ignore[union-attr]
        assert pool.connection_class.__name__ == "HiredisConnection"
        request = ClaimRequest(job="packed", slot=int(time.time() * 1000) // 1000 * 1000,
                               token=new_token(), runner="packer")
        assert (await backend.claim(request)).won
        assert await backend.finish(RunRef("packed", request.slot, request.token), "success")
        assert [r.status for r in await backend.history("packed")] == ["success"]
    finally:
        await backend.stop()
