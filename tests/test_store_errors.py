"""The error layer of every backend: transient failures are StoreUnavailable, other store
failures StoreError, programming errors propagate unchanged; and start() is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from anarchon_core.backend import Backend, new_token
from anarchon_core.backends.nats import NatsBackend
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis.clients import classify as redis_classify
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.backends.storeerrors import StoreErrors, scrub
from anarchon_core.errors import ConfigError, StoreError, StoreUnavailable
from anarchon_core.models import ClaimRequest

from .stores import unavailable
from .stores.postgres import POSTGRES_URL
from .stores.redis import SHARED_URL
from .support.helpers import free_port

pytestmark = pytest.mark.timeout(60)


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    return free_port()


def req(slot: int = 1_000_000, job: str = "job") -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner="r", lease_ms=5_000)


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A TCP server that accepts connections and never answers (a hung store)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


def unreachable_backends(port: int, tmp_path: Path) -> dict[str, Backend]:
    return {
        "redis": RedisBackend(f"redis://127.0.0.1:{port}/0", prefix="x:"),
        "redis-cluster": RedisBackend(f"redis://127.0.0.1:{port}/0?cluster=true",
                                      prefix="x:"),
        "postgres": PostgresBackend(f"postgresql://postgres:s3cret@127.0.0.1:{port}/test"),
        "rabbitmq": RabbitMQBackend(f"amqp://guest:s3cret@127.0.0.1:{port}/", timeout_s=3),
        "nats": NatsBackend(f"nats://127.0.0.1:{port}", timeout_s=1),
    }


@pytest.mark.parametrize("kind", ["redis", "redis-cluster", "postgres", "rabbitmq", "nats"])
async def test_a_closed_port_is_store_unavailable(kind: str, tmp_path: Path) -> None:
    port = closed_port()
    backend = unreachable_backends(port, tmp_path)[kind]
    try:
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(backend.start(), 30)
        text = str(caught.value)
        assert type(backend).__name__.replace("ClaimOnly", "") in text
        assert "s3cret" not in text
        assert caught.value.__cause__ is not None, "the driver's exception is the cause"
        # A call after a failed start fails the same way (and is retried by the scheduler).
        with pytest.raises(StoreUnavailable):
            await backend.claim(req())
    finally:
        with contextlib.suppress(Exception):
            await backend.stop()


async def test_sqlite_missing_folder_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "no-such-dir" / "cron.db"
    backend = SqliteBackend(path)
    with pytest.raises(StoreError) as caught:
        await backend.start()
    assert not isinstance(caught.value, StoreUnavailable)
    assert str(tmp_path / "no-such-dir") in str(caught.value)
    await backend.stop()


async def test_sqlite_lock_held_by_another_process_is_store_unavailable(
    tmp_path: Path,
) -> None:
    import sqlite3  # noqa: PLC0415

    path = tmp_path / "cron.db"
    backend = SqliteBackend(path, busy_timeout_ms=200)
    await backend.start()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable) as caught:
            await backend.claim(req(await backend.clock_ms()))
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        holder.execute("ROLLBACK")
        assert (await backend.claim(req(await backend.clock_ms()))).won
    finally:
        holder.close()
        await backend.stop()


async def test_sqlite_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "cron.db"
    path.write_bytes(b"this is not a database file at all, " * 100)
    backend = SqliteBackend(path)
    with pytest.raises(StoreError) as caught:
        await backend.start()
    assert not isinstance(caught.value, StoreUnavailable)
    assert "cron.db" in str(caught.value)
    await backend.stop()


def connect_timed_out(exc: BaseException | None) -> bool:
    """A connect ended by ``connect_timeout`` or by the backend's own bound (not refused)."""
    return isinstance(exc, psycopg.OperationalError) and (
        "timeout expired" in str(exc) or "no answer from the server" in str(exc))


async def test_postgres_start_against_a_silent_server_is_bounded(tmp_path: Path) -> None:
    """A host that accepts TCP and never answers: start() gives up at its bound (the
    silent server never answers, so only the bound ends the wait)."""
    with silent_server() as port:
        backend = PostgresBackend(f"postgresql://postgres@127.0.0.1:{port}/test")
        backend.tune_timeouts(30_000)
        assert backend.connect_bound_s <= 6
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(backend.start(), 30)
        assert connect_timed_out(caught.value.__cause__), caught.value.__cause__
        await backend.stop()


async def test_postgres_short_lease_shrinks_the_bound(tmp_path: Path) -> None:
    with silent_server() as port:
        backend = PostgresBackend(f"postgresql://postgres@127.0.0.1:{port}/test")
        default = backend._source.extra["connect_timeout"]  # type: ignore[attr-defined]
        backend.tune_timeouts(3_000)
        assert backend.connect_bound_s == 3
        # libpq's own timeout shrinks with the lease too, below the bound.
        shrunk = backend._source.extra["connect_timeout"]  # type: ignore[attr-defined]
        assert shrunk < backend.connect_bound_s < default, (shrunk, default)
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(backend.start(), 30)
        assert connect_timed_out(caught.value.__cause__), caught.value.__cause__
        await backend.stop()


async def test_redis_silent_server_is_store_unavailable_within_the_lease() -> None:
    """Connect and read timeouts under the lease end the call the silent server never
    answers."""
    with silent_server() as port:
        backend = RedisBackend(f"redis://127.0.0.1:{port}/0", prefix="x:")
        backend.tune_timeouts(3_000)
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(backend.start(), 30)
        assert isinstance(caught.value.__cause__, redis.TimeoutError), caught.value.__cause__
        own = backend._conn.client.connection_pool.connection_kwargs  # type: ignore[union-attr]
        assert own["socket_timeout"] < 3, own
        assert own["socket_connect_timeout"] < 3, own
        await backend.stop()


async def test_postgres_lock_timeout_is_store_unavailable(namespace: str) -> None:
    backend = PostgresBackend(POSTGRES_URL, table=namespace, timeout_ms=300)
    await backend.start()
    holder = psycopg.connect(POSTGRES_URL, autocommit=True)
    try:
        holder.execute("BEGIN")
        holder.execute(backend._sql["lock_job"], {"lock_key": "job"})
        with pytest.raises(StoreUnavailable) as caught:
            await backend.claim(req(await backend.clock_ms()))
        assert isinstance(caught.value.__cause__, psycopg.errors.LockNotAvailable)
        holder.execute("ROLLBACK")
    finally:
        holder.close()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP TABLE IF EXISTS "{namespace}", "{namespace}_meta"')
        await backend.stop()


async def test_postgres_value_out_of_range_is_a_store_error_not_transient(
    namespace: str,
) -> None:
    backend = PostgresBackend(POSTGRES_URL, table=namespace)
    await backend.start()
    try:
        bad = ClaimRequest(job="job", slot=await backend.clock_ms(), token=new_token(),
                           runner="r", lease_ms=10**20)
        with pytest.raises(StoreError) as caught:
            await backend.claim(bad)
        assert not isinstance(caught.value, StoreUnavailable)
        assert isinstance(caught.value.__cause__, psycopg.Error)
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP TABLE IF EXISTS "{namespace}", "{namespace}_meta"')
        await backend.stop()


async def test_redis_wrong_type_format_key_names_the_key(namespace: str) -> None:
    prefix = f"{namespace}:"
    with redis.Redis.from_url(SHARED_URL) as client:
        client.rpush(f"{prefix}format", "not a string")
        try:
            backend = RedisBackend(SHARED_URL, prefix=prefix)
            with pytest.raises(StoreError) as caught:
                await backend.start()
            assert not isinstance(caught.value, StoreUnavailable)
            assert f"{prefix}format" in str(caught.value)
            await backend.stop()
        finally:
            client.delete(f"{prefix}format")


async def test_redis_wrong_type_job_key_is_a_store_error_naming_it(namespace: str) -> None:
    prefix = f"{namespace}:"
    backend = RedisBackend(SHARED_URL, prefix=prefix)
    await backend.start()
    with redis.Redis.from_url(SHARED_URL) as client:
        client.set(f"{{{prefix}job}}:state", "a string, not a hash")
        try:
            with pytest.raises(StoreError) as caught:
                await backend.claim(req(await backend.clock_ms()))
            assert f"{{{prefix}job}}:state" in str(caught.value)
            # Other jobs are not affected.
            assert (await backend.claim(req(await backend.clock_ms(), "other"))).won
        finally:
            client.delete(*client.keys(f"*{namespace}*"))
            await backend.stop()


class BrokenClient:
    """A user's client whose execute_command has a bug (or misbehaves)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def execute_command(self, *args: Any) -> Any:
        raise self.error


@pytest.mark.parametrize("error", [TypeError("bug"), AttributeError("bug"),
                                   AssertionError("bug"), ConfigError("bad option")])
async def test_a_programming_error_is_not_wrapped(error: BaseException) -> None:
    backend = RedisBackend(BrokenClient(error), prefix="x:")
    with pytest.raises(type(error)) as caught:
        await backend.claim(req())
    assert caught.value is error


async def test_a_client_connection_error_is_store_unavailable() -> None:
    backend = RedisBackend(BrokenClient(ConnectionResetError("reset by peer")), prefix="x:")
    with pytest.raises(StoreUnavailable) as caught:
        await backend.claim(req())
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    assert "RedisBackend" in str(caught.value)


async def test_a_programming_error_in_sqlite_is_not_wrapped(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "cron.db")
    await backend.start()
    try:
        with pytest.raises((TypeError, AttributeError)) as caught:
            await backend.claim("not a request")  # type: ignore[arg-type]
        assert not isinstance(caught.value, StoreError)
    finally:
        await backend.stop()


@pytest.mark.parametrize(("reply", "kind"), [
    ("LOADING Redis is loading the dataset in memory", "transient"),
    ("TRYAGAIN Multiple keys request during rehashing of slot", "transient"),
    ("CLUSTERDOWN The cluster is down", "transient"),
    ("MOVED 3999 127.0.0.1:6381", "transient"),
    ("READONLY You can't write against a read only replica.", "transient"),
    ("MASTERDOWN Link with MASTER is down", "transient"),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", "store"),
    ("ERR Error running script", "store"),
])
def test_redis_error_replies_are_classified(reply: str, kind: str) -> None:
    assert redis_classify(redis.exceptions.ResponseError(reply)) == kind


@pytest.mark.parametrize(("error", "kind"), [
    (redis.exceptions.ConnectionError("refused"), "transient"),
    (redis.exceptions.TimeoutError("timed out"), "transient"),
    (redis.exceptions.BusyLoadingError("loading"), "transient"),
    (redis.exceptions.ClusterDownError("down"), "transient"),
    (redis.exceptions.TryAgainError("again"), "transient"),
    (redis.exceptions.MaxConnectionsError("too many"), "transient"),
    (redis.exceptions.ReadOnlyError("read only"), "transient"),
    (redis.exceptions.ClusterError("TTL exhausted."), "transient"),
    (redis.exceptions.AuthenticationError("invalid password"), "store"),
    (redis.exceptions.DataError("bad argument"), None),
])
def test_redis_client_exceptions_are_classified(error: BaseException, kind: str | None) -> None:
    assert redis_classify(error) == kind


def test_glide_exceptions_are_classified() -> None:
    try:
        glide = importlib.import_module("glide")
    except ImportError as exc:  # a dev dependency: missing means a broken install
        unavailable("valkey-glide", str(exc))
    assert redis_classify(glide.ClosingError("closed")) == "transient"
    assert redis_classify(glide.TimeoutError("timed out")) == "transient"
    assert redis_classify(glide.RequestError("ERR unknown command")) == "store"


def test_error_messages_mask_credentials() -> None:
    errors = StoreErrors(lambda: "B", lambda exc: "transient")
    error = errors.translate(OSError("cannot reach amqp://guest:p4ss@h/ or nats://T0KEN@h"),
                             "claim")
    assert error is not None
    assert "p4ss" not in str(error)
    assert "T0KEN" not in str(error)
    assert scrub("redis://user:pa/ss#x@host:1/0") == "redis://user:***@host:1/0"


async def test_the_callers_cancellation_is_never_wrapped() -> None:
    errors = StoreErrors(lambda: "B", lambda exc: "transient")
    entered = asyncio.Event()

    async def claim() -> None:
        with errors.guard("claim"):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.ensure_future(claim())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_a_cancellation_the_driver_made_is_store_unavailable() -> None:
    # A connection closing under calls in flight cancels their futures (aiormq does): the
    # call's task was not cancelled, so this is the store failing, not the caller leaving.
    errors = StoreErrors(lambda: "B", lambda exc: "transient")
    loop = asyncio.get_running_loop()

    async def claim(future: asyncio.Future[None]) -> None:
        with errors.guard("claim"):
            await future

    future: asyncio.Future[None] = loop.create_future()
    task = asyncio.ensure_future(claim(future))
    await asyncio.sleep(0)
    future.cancel()  # the driver's future, not the task
    with pytest.raises(StoreUnavailable, match=r"B is unavailable \(claim\)") as caught:
        await task
    assert isinstance(caught.value.__cause__, asyncio.CancelledError)


def test_tune_timeouts_fits_redis_connection_to_the_lease() -> None:
    from anarchon_core.backends.redis.clients import own_timeouts  # noqa: PLC0415

    short = own_timeouts(2_000)
    assert short["socket_timeout"] < 2
    assert short["socket_connect_timeout"] < 2
    assert short["socket_keepalive"] is True
    assert own_timeouts()["socket_timeout"] == 10.0


async def test_tune_timeouts_is_applied_to_the_owned_redis_connection() -> None:
    backend = RedisBackend(SHARED_URL, prefix="tune:")
    backend.tune_timeouts(6_000)
    backend.tune_timeouts(60_000)  # the shortest lease wins
    await backend.start()
    try:
        client = backend._conn._send.args[0]  # type: ignore[union-attr]
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 2.0
        assert kwargs["socket_keepalive"] is True
    finally:
        await backend.stop()


def test_tune_timeouts_fits_the_other_backends() -> None:
    pg = PostgresBackend(POSTGRES_URL)
    pg.tune_timeouts(6_000)
    extra = pg._source.extra  # type: ignore[attr-defined]
    assert extra["connect_timeout"] == 2
    assert extra["keepalives"] == 1
    assert extra["tcp_user_timeout"] == 3_000
    # A value given in the conninfo wins.
    given = PostgresBackend(f"{POSTGRES_URL}?connect_timeout=4")
    given.tune_timeouts(6_000)
    assert "connect_timeout" not in given._source.extra  # type: ignore[attr-defined]
    rabbit = RabbitMQBackend("amqp://guest:guest@127.0.0.1:5672/", timeout_s=10)
    rabbit.tune_timeouts(8_000)
    assert rabbit._connect_options() == {"heartbeat": 2}
    assert rabbit.timeout_s == 4
    nats = NatsBackend("nats://127.0.0.1:4222", timeout_s=5)
    nats.tune_timeouts(8_000)
    assert nats._ping_s == 2
    assert nats.timeout_s == 4
    lite = SqliteBackend("x.db")
    lite.tune_timeouts(4_000)
    assert lite._busy_ms == 2_000
