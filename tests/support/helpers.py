"""What many tests need: free ports, waits, dedicated servers and scheduler factories.

* :func:`free_port`: a free loopback port (with ``bus=True`` also port + 10000, for a Redis
  Cluster node's bus). It is the chaos harness's, so tests and chaos runs pick ports alike.
* :func:`wait_for` (blocking) and :func:`await_until` (asyncio): poll a predicate until it
  returns something truthy, and return that; fail naming what was awaited after a timeout.
* The dedicated servers a test may crash or restart (:class:`RedisServer`,
  :class:`NatsServer`, :class:`PostgresServer`, :class:`RabbitMQServer`,
  :class:`RedisClusterServer`): the chaos harness's, on free ports in their own directory.
  :func:`started` makes and starts one (a missing binary is
  :func:`~tests.stores.unavailable`: a skip, a failure under CI=true); :func:`start_redis`
  is the common case. ``halt(crash=True)`` crashes a server (SIGKILL, or PostgreSQL's
  immediate shutdown), ``halt(crash=False)`` stops it cleanly, ``start()`` brings it back
  on the same port and directory, ``stop()`` ends it for good.
* :func:`call_within`: a blocking call that must return (not hang), run where a bound
  can fail the test naming what hung.
* :func:`make_scheduler`: a :class:`~anarchon_core.Scheduler` on a backend, or on a SQLite
  file in a directory, with the lease timings a test file picks once
  (``make = functools.partial(make_scheduler, **QUICK_LEASE)``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from anarchon_core import Scheduler
from anarchon_core.backend import Backend
from anarchon_core.backends.sqlite import SqliteBackend
from chaos.servers import (
    MissingBinaryError,
    NatsServer,
    PostgresServer,
    RabbitMQServer,
    RedisClusterServer,
    RedisServer,
    StoreServer,
    free_port,
)

from ..stores import unavailable

T = TypeVar("T")
S = TypeVar("S", bound=StoreServer)

__all__ = [
    "QUICK_LEASE",
    "STEADY_LEASE",
    "NatsServer",
    "PostgresServer",
    "RabbitMQServer",
    "RedisClusterServer",
    "RedisServer",
    "await_until",
    "call_within",
    "free_port",
    "make_scheduler",
    "start_redis",
    "started",
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
    """The asyncio twin of :func:`wait_for`: poll ``predicate`` without blocking the loop.

    ``timeout`` is on the running loop's clock: the machine's monotonic clock, or the
    virtual time of a test under ``looptime``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def call_within(timeout: float, call: Callable[[], T], what: str = "") -> T:
    """Run the blocking ``call`` and return its result; fail if it has not returned after
    ``timeout`` seconds (its thread is a daemon, left behind).

    For a call that must not wait on something that never comes (a store that is down):
    pick a bound that only a hung call exceeds.
    """
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=f"call_within {what or call}", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        raise AssertionError(f"{what or call} did not return within {timeout}s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def started(make: Callable[[], S]) -> S:
    """A dedicated server made by ``make`` and started.

    A missing binary is :func:`~tests.stores.unavailable` (a skip; under CI=true a
    failure); a server that does not come up raises, and is stopped first.
    """
    try:
        server = make()
    except MissingBinaryError as exc:
        unavailable(exc.binary, str(exc))
        raise
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server


def start_redis(workdir: Path | None = None, *, valkey: bool = False, durable: bool = False,
                args: Sequence[str] = (), port: int | None = None) -> RedisServer:
    """A started dedicated redis-server (valkey-server with ``valkey``).

    Nothing on disk unless ``durable`` (then an append-only file fsynced on every write):
    a crash or restart of a non-durable server starts it empty.
    """
    return started(lambda: RedisServer(workdir, valkey=valkey, durable=durable, args=args,
                                       port=port))


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
