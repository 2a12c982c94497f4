"""A lease lost while a stopping instance waits out its grace cancels the handler at once.

``stop(grace_ms)`` only asks a handler to stop and cancels an async one after the grace.
If the lease is lost meanwhile (the store unreachable, or another attempt took over), a
backup may already run the slot: waiting out the grace would run it twice at once. Found
by the chaos harness on Redis Cluster (seed 15419550: an instance was stopping while a
failover held up its heartbeats; its handler ran on 347 ms after the backup's began).

On the event loop's time (``looptime`` and a :class:`~tests.support.clock.LoopClock`): the
cancellation's delay after the loss is measured exactly, not against the machine's speed.
"""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core import JobContext, LeaseLost, Scheduler, StoreUnavailable
from anarchon_core.models import RunRef
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

pytestmark = [pytest.mark.timeout(60), pytest.mark.looptime]

LEASE_MS, HEARTBEAT_MS = 600, 150
GRACE_MS = 20_000


class Heartbeats(MemoryBackend):
    """A memory store whose heartbeats can be made to fail or to be refused."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(clock.store_ms)
        self.answer: str = "normal"

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        if self.answer == "unreachable":
            raise StoreUnavailable("the store is unreachable (test)")
        if self.answer == "refused":
            return False
        return await super().heartbeat(ref, lease_ms)

    async def release(self, ref: RunRef) -> bool:
        # A store that refuses an attempt's heartbeat refuses its release too (another
        # attempt holds the run): only a cancelled run's release is taken.
        if self.answer == "refused":
            return False
        return await super().release(ref)


@pytest.mark.parametrize("answer", ["unreachable", "refused"])
async def test_a_lease_lost_during_the_stop_grace_cancels_the_handler_at_once(
        answer: str) -> None:
    clock = LoopClock()
    store = Heartbeats(clock)
    started = asyncio.Event()
    contexts: list[JobContext] = []
    cancelled_at: list[float] = []

    async def long(ctx: JobContext) -> None:
        contexts.append(ctx)
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled_at.append(clock.monotonic())
            raise

    scheduler = Scheduler(store, instance_id="stopping", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS, clock=clock)
    scheduler.every("long", "1h", long)
    await scheduler.start()
    run = asyncio.ensure_future(scheduler.run_now("long"))
    await asyncio.wait_for(started.wait(), 10)
    stop = asyncio.ensure_future(scheduler.stop(grace_ms=GRACE_MS))
    await asyncio.sleep(0.05)
    [ctx] = contexts
    assert ctx.cancel_reason == "stopping"
    assert not cancelled_at, "an async handler is cancelled only after the stop grace"

    lost_at = clock.monotonic()
    store.answer = answer
    await asyncio.wait_for(stop, 10)
    result = await asyncio.wait_for(run, 10)

    assert cancelled_at, "the handler was not cancelled"
    # Unreachable: fenced before the lease (600 ms) could run out; refused: at the next
    # heartbeat. Either way long before the 20 s grace.
    bound_ms = LEASE_MS if answer == "unreachable" else HEARTBEAT_MS
    assert cancelled_at[0] - lost_at < bound_ms / 1000
    assert ctx.cancel_reason == "lease lost"
    with pytest.raises(LeaseLost):
        ctx.raise_if_cancelled()
    assert (result.status, result.error) == ("interrupted", "lease lost")
    # Fenced: nothing is recorded, the attempt stays running for a backup to take over.
    [recorded] = await store.history("long")
    assert recorded.status == "running"


async def test_a_lost_lease_overrides_a_softer_reason_and_is_never_replaced() -> None:
    clock = LoopClock()
    store = Heartbeats(clock)
    scheduler = Scheduler(store, instance_id="one", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS, clock=clock)
    scheduler.define("job")
    await scheduler.start()
    try:
        handle = await scheduler.claim("job", int(clock.time() * 1000))
        assert handle is not None
        reasons: list[str] = []
        handle.add_cancel_callback(reasons.append)
        handle.cancel("stopping")
        handle.cancel("timeout")
        assert (handle.cancel_reason, reasons) == ("stopping", ["stopping"])
        store.answer = "refused"
        for _ in range(100):  # the keeper's next heartbeat is refused: fenced
            if handle.fenced:
                break
            await asyncio.sleep(0.05)
        assert handle.fenced
        handle.cancel("stopping")
        handle.cancel("timeout")
        assert (handle.cancel_reason, reasons) == ("lease lost", ["stopping", "lease lost"])
    finally:
        await scheduler.stop()
