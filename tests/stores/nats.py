"""The shared NATS JetStream (127.0.0.1:4222, or ANARCHON_TEST_NATS): one stream and
prefix per namespace, deleted when the session ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import nats

from anarchon_core.backends.nats import NatsBackend

from . import StoreHandle, StoreSpec, unavailable

URL = os.environ.get("ANARCHON_TEST_NATS", "nats://127.0.0.1:4222")
T = TypeVar("T")


def run_sync(make: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop."""

    async def main() -> T:
        return await make()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result(timeout)


def stream_of(ns: str) -> str:
    return ns.upper()


async def delete_streams(url: str, names: list[str]) -> None:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        for name in names:
            with contextlib.suppress(Exception):
                await js.delete_stream(name)
    finally:
        await nc.close()


async def write_format(url: str, stream: str, value: str) -> None:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        await js.update_stream(info.config.evolve(description=f"anarchon-format={value}"))
    finally:
        await nc.close()


@contextmanager
def _open() -> Iterator[StoreHandle]:
    async def ping() -> None:
        nc = await asyncio.wait_for(nats.connect(URL, allow_reconnect=False), 5)
        await nc.jetstream().account_info()
        await nc.close()

    try:
        run_sync(ping, timeout=10)
    except Exception as exc:  # noqa: BLE001 - any failure means "not there"
        unavailable(f"NATS JetStream at {URL}", f"{type(exc).__name__}: {exc}")
    streams: set[str] = set()

    def backend(ns: str) -> NatsBackend:
        streams.add(stream_of(ns))
        return NatsBackend(URL, prefix=f"{ns}.", stream=stream_of(ns))

    def url(ns: str) -> str:
        streams.add(stream_of(ns))
        return f"{URL}?prefix={ns}.&stream={stream_of(ns)}"

    try:
        yield StoreHandle(
            backend=backend, url=url,
            set_format=lambda ns, value: run_sync(
                lambda: write_format(URL, stream_of(ns), value)),
            extra=streams,
        )
    finally:
        if streams:
            run_sync(lambda: delete_streams(URL, sorted(streams)))


STORES = [StoreSpec("nats", leases=False, open=_open)]
