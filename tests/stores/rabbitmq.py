"""A RabbitMQ node of the test session (or ANARCHON_TEST_AMQP); a prefix per namespace.

Run queues expire by themselves; the format queue, the jobs stream and the history streams
a namespace made are deleted when the session ends (the handle remembers them).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import aio_pika

from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.url import mask_url
from chaos.servers import RabbitMQServer

from . import StoreHandle, StoreSpec, unavailable

SHARED_URL = "amqp://guest:guest@127.0.0.1:5672/"


def _dedicated_url() -> str:
    """A RabbitMQ node of the test session's own (started once, stopped at exit).

    Tests declare and crash many queues and streams; on a node of their own nothing they do
    can degrade the machine's shared broker. ``ANARCHON_TEST_AMQP`` points them elsewhere.
    """
    given = os.environ.get("ANARCHON_TEST_AMQP")
    if given:
        return given
    try:
        server = RabbitMQServer()
        server.start()
    except (RuntimeError, OSError, LookupError) as exc:
        print(f"no dedicated RabbitMQ node ({exc}); the tests use {SHARED_URL}")
        return SHARED_URL
    atexit.register(server.stop)
    os.environ["ANARCHON_TEST_AMQP"] = server.url
    return server.url


URL = _dedicated_url()
T = TypeVar("T")


def run_sync(make: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop."""

    async def main() -> T:
        return await make()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result(timeout)


class Namespaces:
    """Remembers the queues the tests made, and deletes them."""

    def __init__(self) -> None:
        self.queues: set[str] = set()

    def prefix(self, ns: str) -> str:
        prefix = f"{ns}."
        self.queues.update((f"{prefix}format", f"{prefix}jobs"))
        return prefix

    def track(self, ns: str, jobs: list[str]) -> None:
        """Remember the history streams of ``jobs`` run through a URL (subprocesses)."""
        names = RabbitMQBackend(URL, prefix=self.prefix(ns))
        self.queues.update(names.history_stream(job) for job in jobs)

    def drop_all(self) -> None:
        queues, self.queues = sorted(self.queues), set()
        if queues:
            run_sync(lambda: delete_queues(queues))


async def delete_queues(names: list[str]) -> None:
    conn = await aio_pika.connect(URL)
    try:
        for name in names:
            channel = await conn.channel()
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
            if not channel.is_closed:
                await channel.close()
    finally:
        await conn.close()


async def write_format(prefix: str, value: str) -> None:
    conn = await aio_pika.connect(URL)
    try:
        channel = await conn.channel()
        await channel.queue_delete(f"{prefix}format")
        await channel.declare_queue(f"{prefix}format", durable=True,
                                    arguments={"x-max-length": int(value)})
    finally:
        await conn.close()


def tracked_backend(spaces: Namespaces, ns: str, **options: Any) -> RabbitMQBackend:
    """A backend whose history streams are deleted at the end of the session."""

    class Tracked(RabbitMQBackend):
        async def _append(self, job: str, record: dict[str, str],
                          arguments: dict[str, Any] | None = None) -> None:
            spaces.queues.add(self.history_stream(job))
            await super()._append(job, record, arguments)

    return Tracked(URL, prefix=spaces.prefix(ns), **{"run_expires_ms": 150_000, **options})


@contextmanager
def _open() -> Iterator[StoreHandle]:
    async def ping() -> None:
        conn = await asyncio.wait_for(aio_pika.connect(URL), 5)
        await conn.close()

    try:
        run_sync(ping, timeout=10)
    except Exception as exc:  # noqa: BLE001 - any failure means "not there"
        unavailable(f"RabbitMQ at {mask_url(URL)}", f"{type(exc).__name__}: {exc}")
    spaces = Namespaces()
    try:
        yield StoreHandle(
            backend=lambda ns: tracked_backend(spaces, ns),
            url=lambda ns: f"{URL}?prefix={spaces.prefix(ns)}",
            set_format=lambda ns, value: run_sync(lambda: write_format(f"{ns}.", value)),
            extra=spaces,
        )
    finally:
        spaces.drop_all()


STORES = [StoreSpec("rabbitmq", leases=False, open=_open)]
