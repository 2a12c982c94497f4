"""The public claim handle (``Scheduler.claim``) on every store.

Lease stores: the handle's heartbeats keep the run, a takeover fences it and gives the
new attempt its own handle, a store that stops answering makes the handle fence itself
before any other instance could take over. Claim-only stores: won or taken.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from anarchon_core import (
    Backend,
    ClaimHandle,
    ClaimOutcome,
    LeaseLost,
    NotClaimed,
    Scheduler,
)
from anarchon_core.models import RunRef

from ..stores import StoreHandle, StoreSpec
from ..support.procs import await_until

pytestmark = pytest.mark.timeout(60)

LEASE_MS, HEARTBEAT_MS = 900, 300


def scheduler(backend: Backend, name: str, **kwargs: Any) -> Scheduler:
    if backend.supports_leases:
        kwargs.setdefault("lease_ms", LEASE_MS)
        kwargs.setdefault("heartbeat_ms", HEARTBEAT_MS)
    s = Scheduler(backend, instance_id=name, **kwargs)
    s.define("job", max_late_ms=60_000)
    return s


def past_slot() -> int:
    return round(time.time() * 1000) - 500



class Unanswering(Backend):
    """Delegates to a real backend, but its heartbeats can be made to hang forever."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.hang = asyncio.Event()

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def clock_ms(self) -> int:
        return await self.inner.clock_ms()

    async def claim(self, request: Any) -> Any:
        return await self.inner.claim(request)

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        if self.hang.is_set():
            await asyncio.Event().wait()  # a half-open connection: no answer, ever
        return await self.inner.heartbeat(ref, lease_ms)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Any = None) -> bool:
        return await self.inner.finish(ref, status, error, meta)

    async def release(self, ref: RunRef) -> bool:
        return await self.inner.release(ref)

    async def history(self, job: str, limit: int = 20) -> Any:
        return await self.inner.history(job, limit)

    async def runs(self, query: Any) -> Any:
        return await self.inner.runs(query)


# ------------------------------------------------------------------ lease stores


async def test_heartbeats_keep_the_handle_and_finish_records_meta(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    a = scheduler(lease_store[1].backend(namespace), "a")
    b = scheduler(lease_store[1].backend(namespace), "b")
    try:
        slot = past_slot()
        handle = await a.claim("job", slot)
        assert isinstance(handle, ClaimHandle)
        assert (handle.job, handle.slot, handle.attempt) == ("job", slot, 1)
        await asyncio.sleep(LEASE_MS * 3 / 1000)  # three leases: only heartbeats keep it
        lost = await b.try_claim("job", slot)
        assert isinstance(lost, NotClaimed)
        assert not lost
        assert lost.outcome is ClaimOutcome.RUNNING
        assert "running" in lost.reason
        assert await b.claim("job", slot) is None
        await handle.check_lease()
        assert not handle.cancelled
        assert await handle.finish("success", meta={"task_id": "abc-123"})
        runs = [r for r in await a.history("job") if r.slot == slot]
        assert [(r.attempt, r.status, r.runner, r.meta) for r in runs] == [
            (1, "success", "a", {"task_id": "abc-123"})]
        assert isinstance(await b.try_claim("job", slot), NotClaimed)
    finally:
        await a.stop()
        await b.stop()


async def test_a_takeover_fences_the_old_handle_and_gets_its_own(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    a = scheduler(lease_store[1].backend(namespace), "a")
    b = scheduler(lease_store[1].backend(namespace), "b")
    try:
        slot = past_slot()
        old = await a.claim("job", slot)
        assert old is not None
        old.abandon()  # its runner stops heartbeating, as if paused
        await asyncio.sleep(LEASE_MS * 1.5 / 1000)
        new = await b.claim("job", slot)
        assert new is not None
        assert (new.attempt, new.runner) == (2, "b")
        assert new.token != old.token
        with pytest.raises(LeaseLost):
            await old.check_lease()
        assert old.fenced
        assert old.cancel_reason == "lease lost"
        assert not await old.finish("success")
        async with new:
            await new.check_lease()
        runs = [r for r in await b.history("job") if r.slot == slot]
        assert [(r.attempt, r.status) for r in runs] == [(2, "success"), (1, "interrupted")]
    finally:
        await a.stop()
        await b.stop()


async def test_a_heartbeat_that_never_returns_still_fences_before_the_lease_ends(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    hanging = Unanswering(lease_store[1].backend(namespace))
    a = scheduler(hanging, "a")
    b = scheduler(lease_store[1].backend(namespace), "b")
    try:
        slot = past_slot()
        handle = await a.claim("job", slot)
        assert handle is not None
        hanging.hang.set()
        frozen_at = time.monotonic()
        taken: list[float] = []
        cancelled: list[float] = []
        handle.add_cancel_callback(lambda reason: cancelled.append(time.monotonic()))

        async def backup() -> None:
            while not taken:
                if await b.claim("job", slot) is not None:
                    taken.append(time.monotonic())
                await asyncio.sleep(0.03)

        watcher = asyncio.ensure_future(backup())
        await await_until(lambda: taken, 10, "the backup's takeover")
        watcher.cancel()
        assert cancelled, "the frozen holder was never told it lost its lease"
        assert cancelled[0] < taken[0]
        assert cancelled[0] - frozen_at < LEASE_MS / 1000
        assert handle.fenced
        assert handle.cancel_reason == "lease lost"
        assert not await handle.finish("success")
    finally:
        hanging.hang.clear()
        await a.stop()
        await b.stop()


async def test_async_with_records_a_failure_with_its_exception(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    a = scheduler(lease_store[1].backend(namespace), "a")
    try:
        slot = past_slot()
        handle = await a.claim("job", slot)
        assert handle is not None
        with pytest.raises(RuntimeError, match="boom"):
            async with handle:
                raise RuntimeError("boom")
        runs = [r for r in await a.history("job") if r.slot == slot]
        assert [(r.status, r.error) for r in runs] == [("failed", "RuntimeError: boom")]
    finally:
        await a.stop()


# ------------------------------------------------------------------ claim-only stores


async def test_claim_only_handle_is_won_once_and_records_its_end(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    a = scheduler(claim_store[1].backend(namespace), "a")
    b = scheduler(claim_store[1].backend(namespace), "b")
    try:
        slot = past_slot()
        handle = await a.claim("job", slot)
        assert handle is not None
        assert handle.attempt == 1
        lost = await b.try_claim("job", slot)
        assert isinstance(lost, NotClaimed)
        assert lost.outcome in (ClaimOutcome.TAKEN, ClaimOutcome.DONE)
        await handle.check_lease()  # no lease to confirm: it only checks cancellation
        assert await handle.finish("success", meta={"task_id": "t-1"})
        runs = [r for r in await a.history("job") if r.slot == slot]
        assert [(r.status, r.runner, r.meta) for r in runs] == [
            ("success", "a", {"task_id": "t-1"})]
    finally:
        await a.stop()
        await b.stop()


async def test_on_takeover_makes_the_scheduler_a_backup_of_a_defined_job(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    a = scheduler(lease_store[1].backend(namespace), "a")
    b = Scheduler(lease_store[1].backend(namespace), instance_id="b", lease_ms=LEASE_MS,
                  heartbeat_ms=HEARTBEAT_MS)
    taken: list[ClaimHandle] = []

    async def on_takeover(handle: ClaimHandle) -> None:
        taken.append(handle)
        await handle.finish("success", meta={"by": "takeover"})

    b.define("job", max_late_ms=60_000, on_takeover=on_takeover)
    await b.start()
    try:
        slot = past_slot()
        first = await a.claim("job", slot)
        assert first is not None
        lost = await b.try_claim("job", slot)  # running elsewhere: b now watches it
        assert isinstance(lost, NotClaimed)
        assert lost.outcome is ClaimOutcome.RUNNING
        first.abandon()  # the runner dies
        await await_until(lambda: taken, 10, "b to take the run over")
        assert (taken[0].slot, taken[0].attempt, taken[0].runner) == (slot, 2, "b")
        await await_until(lambda: taken[0].ended, 5, "the takeover to record its end")
        runs = [r for r in await b.history("job") if r.slot == slot]
        assert [(r.attempt, r.status, r.meta) for r in runs] == [
            (2, "success", {"by": "takeover"}), (1, "interrupted", {})]
    finally:
        await a.stop()
        await b.stop()
