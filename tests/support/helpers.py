"""What many tests need: free ports, waits, dedicated servers and scheduler factories.

* :func:`free_port`: a free loopback port (with ``bus=True`` also port + 10000, for a Redis
  Cluster node's bus). It is the chaos harness's, so tests and chaos runs pick ports alike.
* :func:`wait_for` (blocking) and :func:`await_until` (asyncio): poll a predicate until it
  returns something truthy, and return that; fail naming what was awaited after a timeout.
* The dedicated servers a test may crash or restart (:class:`RedisServer`,
  :class:`NatsServer`, :class:`PostgresServer`, :class:`RabbitMQServer`,
  :class:`RedisClusterServer`): the chaos harness's, on free ports in their own directory.
* :func:`make_scheduler`: a :class:`~anarchon_core.Scheduler` on a backend, or on a SQLite
  file in a directory, with the lease timings a test file picks once
  (``make = functools.partial(make_scheduler, **QUICK_LEASE)``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from anarchon_core import Scheduler
from anarchon_core.backend import Backend
from anarchon_core.backends.sqlite import SqliteBackend
from chaos.servers import (
    NatsServer,
    PostgresServer,
    RabbitMQServer,
    RedisClusterServer,
    RedisServer,
    free_port,
)

T = TypeVar("T")

__all__ = [
    "QUICK_LEASE",
    "STEADY_LEASE",
    "NatsServer",
    "PostgresServer",
    "RabbitMQServer",
    "RedisClusterServer",
    "RedisServer",
    "await_until",
    "free_port",
    "make_scheduler",
    "wait_for",
]

#: A lease that expires within a second: takeovers and fencing without long waits.
QUICK_LEASE: dict[str, Any] = {"lease_ms": 600, "heartbeat_ms": 150}
#: A lease that outlives a test's steps: nothing is taken over unless the test makes it.
STEADY_LEASE: dict[str, Any] = {"lease_ms": 3_000, "heartbeat_ms": 1_000}


def wait_for(predicate: Callable[[], T | None], timeout: float = 10.0, what: str = "",
             poll: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy and return it.

    Fails after ``timeout`` seconds naming ``what`` (or the predicate).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


async def await_until(predicate: Callable[[], T | None], timeout: float = 10.0,
                      what: str = "", poll: float = 0.02) -> T:
    """The asyncio twin of :func:`wait_for`: poll ``predicate`` without blocking the loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def make_scheduler(store: Backend | Path, instance_id: str = "host:1", *,
                   table: str | None = None, **kwargs: Any) -> Scheduler:
    """A scheduler on ``store``: a backend, or a directory holding the SQLite ``store.db``.

    ``table`` names the SQLite table (the backend's default when None); every other keyword
    goes to :class:`~anarchon_core.Scheduler`.
    """
    if isinstance(store, Backend):
        backend = store
    elif table is None:
        backend = SqliteBackend(store / "store.db")
    else:
        backend = SqliteBackend(store / "store.db", table=table)
    return Scheduler(backend, instance_id=instance_id, **kwargs)
