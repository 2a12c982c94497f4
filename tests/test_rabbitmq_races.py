"""RabbitMQBackend under connections and channels that die under calls in flight.

RabbitMQ 3.10 closes a whole connection (INTERNAL_ERROR, or RESOURCE_ERROR "Stream not
found") when a channel publishes to a stream another client is still creating, and closes
a channel (NOT_FOUND, "home node ... is down or inaccessible") when two clients' first
declarations of one queue meet. Both are timing races; these tests cause the same
closures on purpose, at a chosen moment. So they do with the claims connection itself,
cut as a network failure cuts it, or closed by the driver without a reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import ChannelNotFoundEntity
from aiormq.exceptions import ConnectionInternalError

from anarchon_core.backend import new_token
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.errors import StoreUnavailable
from anarchon_core.models import ClaimRequest, ClaimResult

from .stores import StoreHandle
from .stores.rabbitmq import tracked_backend

pytestmark = pytest.mark.timeout(60)

#: Each job gets a history stream, which holds files open on the session's node until the
#: session ends: keep the jobs of these tests few.
JOBS = 20


@pytest.fixture
def handle(store_handles: Callable[[str], StoreHandle]) -> StoreHandle:
    return store_handles("rabbitmq")


def req(slot: int, runner: str, job: str) -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner)


def results(answers: list[ClaimResult | BaseException]) -> list[ClaimResult]:
    failed = [a for a in answers if isinstance(a, BaseException)]
    assert not failed, failed[:3]
    return [a for a in answers if isinstance(a, ClaimResult)]


def kill_history_connection_at_publish(backend: RabbitMQBackend, nth: int) -> list[object]:
    """Close the history connection as its ``nth`` record is published, as the broker does.

    Every operation in flight on it fails with INTERNAL_ERROR, and aio-pika still reports
    the connection open while the AMQP connection under it is gone.
    """
    link = backend._history_link
    real = link.channel
    calls: list[object] = []

    async def channel(publish: bool) -> AbstractChannel:
        chosen = await real(publish)
        if publish:
            calls.append(link.conn)
            if len(calls) == nth:
                assert link.conn is not None
                assert link.conn.transport is not None
                await link.conn.transport.connection.close(
                    ConnectionInternalError("INTERNAL_ERROR"))
        return chosen

    link.channel = channel  # type: ignore[method-assign]
    return calls


async def test_a_history_connection_that_dies_fails_no_claim(
    handle: StoreHandle, namespace: str
) -> None:
    # An operation caught on the dying connection may wait for its timeout.
    backend = tracked_backend(handle.extra, namespace, timeout_s=3)
    await backend.start()
    try:
        claims_connection = backend._conn
        publishes = kill_history_connection_at_publish(backend, nth=5)
        slot = await backend.clock_ms()
        got = results(await backend.claim_many([req(slot, "a", f"h{i}") for i in range(JOBS)]))
        assert all(r.won for r in got)
        assert backend._conn is claims_connection
        assert len(set(map(id, publishes))) == 2, "the history connection was reopened"
        # The records in flight when it died were written again on the new connection.
        for i in range(JOBS):
            [run] = await backend.history(f"h{i}")
            assert (run.runner, run.status) == ("a", "running")
    finally:
        await backend.stop()


async def test_declarations_whose_channel_the_broker_closed_are_tried_again(
    handle: StoreHandle, namespace: str
) -> None:
    backend = tracked_backend(handle.extra, namespace)
    await backend.start()
    link = backend._claim_link
    real = link.channel
    closed: list[AbstractChannel] = []

    async def channel(publish: bool) -> AbstractChannel:
        chosen = await real(publish)
        if not publish and len(closed) < 2:
            closed.append(chosen)
            with pytest.raises(ChannelNotFoundEntity):  # the broker closes the channel
                await chosen.declare_queue(f"{namespace}.missing", passive=True)
        return chosen

    link.channel = channel  # type: ignore[method-assign]
    try:
        slot = await backend.clock_ms()
        got = results(await backend.claim_many([req(slot, "a", f"d{i}") for i in range(JOBS // 2)]))
        assert all(r.won for r in got)
        assert len(closed) == 2
        assert all(c.is_closed for c in closed)
    finally:
        await backend.stop()


async def cut_claims_connection(backend: RabbitMQBackend, how: str) -> None:
    """Kill the claims connection: its TCP link reset, or closed by aiormq with no reason.

    The connection cut by the round before may not be replaced yet (the claims open the
    next one): this waits for a live one first, at most 5 s.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:
        conn = backend._conn
        if conn is not None and conn.transport is not None \
                and conn.transport.connection.is_opened:
            break
        assert loop.time() < deadline, "no live claims connection within 5 s"
        await asyncio.sleep(0.001)
    amqp = conn.transport.connection
    if how == "reset":
        # The writer task holds the stream writer; aborting its transport is a reset link.
        writer = amqp._writer_task.get_coro().cr_frame.f_locals["writer"]
        writer.transport.abort()
    else:
        await amqp.close()


@pytest.mark.parametrize("how", ["reset", "closed without a reason"])
async def test_claims_caught_on_a_dying_claims_connection_are_store_unavailable(
    handle: StoreHandle, namespace: str, how: str
) -> None:
    # aiormq ends such calls with a bare Exception, a RuntimeError ("... closed") or a
    # CancelledError of its own: each must reach the scheduler as StoreUnavailable (which
    # it retries), never as a bug or as its own cancellation.
    backend = tracked_backend(handle.extra, namespace, timeout_s=3)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        answers: list[ClaimResult | BaseException] = []
        for n in range(4):
            claims = [asyncio.ensure_future(backend.claim(req(slot + n, "a", f"c{i}")))
                      for i in range(JOBS)]
            await asyncio.sleep(0.002 * n)
            await cut_claims_connection(backend, how)
            answers += await asyncio.gather(*claims, return_exceptions=True)
        wrong = [a for a in answers
                 if isinstance(a, BaseException) and not isinstance(a, StoreUnavailable)]
        assert not wrong, [f"{type(a).__name__}: {a}" for a in wrong[:3]]
        assert any(isinstance(a, StoreUnavailable) for a in answers)
        # The next claims open a new connection and are won.
        assert all(r.won for r in results(await backend.claim_many(
            [req(slot + 10, "a", f"c{i}") for i in range(JOBS)])))
    finally:
        await backend.stop()
