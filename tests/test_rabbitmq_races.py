"""RabbitMQBackend under broker-side failures that concurrent first declarations cause.

RabbitMQ 3.10 closes a whole connection (INTERNAL_ERROR, or RESOURCE_ERROR "Stream not
found") when a channel publishes to a stream another client is still creating, and closes
a channel (NOT_FOUND, "home node ... is down or inaccessible") when two clients' first
declarations of one queue meet. Both are timing races; these tests cause the same
closures on purpose, at a chosen moment.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import ChannelNotFoundEntity
from aiormq.exceptions import ConnectionInternalError

from anarchon_core.backend import new_token
from anarchon_core.backends.rabbitmq import RabbitMQBackend
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
