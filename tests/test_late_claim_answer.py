"""A claim won, but answered after its lease could be confirmed, never starts its code.

The store committed the claim, but its answer reached the instance late (a network
partition that froze the reply, a paused process): by then the lease may have expired and
a backup may run the slot. Starting the handler then would run the slot twice at once, so
the handle fences itself instead, nothing is recorded, and a backup takes the run over.
Found by the chaos harness on PostgreSQL (seed 20261211: a partition began 7 ms after a
claim was sent, the handler started 3.7 s later, after the takeover).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from anarchon_core import ClaimOutcome, JobContext, NotClaimed, Scheduler
from anarchon_core.models import ClaimRequest, ClaimResult
from anarchon_core.scheduler import LATE_ANSWER
from anarchon_core.testing import MemoryBackend

pytestmark = pytest.mark.timeout(60)

LEASE_MS, HEARTBEAT_MS = 400, 100


class LateAnswers(MemoryBackend):
    """A memory store whose claim answers reach some runners only after a delay."""

    def __init__(self) -> None:
        super().__init__()
        self.delay_s: dict[str, float] = {}
        #: Answer only this many more claims of a runner late (None: all of them).
        self.late_claims: dict[str, int] = {}

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        result = await super().claim(request)  # committed at once, answered late
        left = self.late_claims.get(request.runner)
        if left is None or left > 0:
            if left is not None:
                self.late_claims[request.runner] = left - 1
            await asyncio.sleep(self.delay_s.get(request.runner, 0.0))
        return result


async def next_slot_alone() -> int:
    """Wait until just after a 2 s boundary; the next one, the first slot claimed after it."""
    boundary = (int(time.time() * 1000) // 2_000 + 1) * 2_000
    await asyncio.sleep(max(0.0, boundary / 1000 - time.time()) + 0.1)
    return boundary + 2_000


async def test_run_now_answered_late_does_not_run_the_handler() -> None:
    store = LateAnswers()
    ran: list[int] = []
    scheduler = Scheduler(store, instance_id="late", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS)
    scheduler.every("job", "1h", lambda ctx: ran.append(ctx.attempt))
    await scheduler.start()
    try:
        store.delay_s["late"] = LEASE_MS / 1000 * 1.5
        run = await scheduler.run_now("job")
        assert (run.status, run.error, ran) == ("interrupted", "lease lost", [])
        store.delay_s["late"] = 0.0
        run = await scheduler.run_now("job")
        assert (run.status, ran) == ("success", [1])
    finally:
        await scheduler.stop()


async def test_try_claim_answered_late_is_not_claimed() -> None:
    store = LateAnswers()
    scheduler = Scheduler(store, instance_id="late", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS)
    scheduler.define("job")
    await scheduler.start()
    try:
        slot = int(time.time() * 1000)
        store.delay_s["late"] = LEASE_MS / 1000 * 1.5
        outcome = await scheduler.try_claim("job", slot)
        assert isinstance(outcome, NotClaimed)
        assert (outcome.outcome, outcome.reason) == (ClaimOutcome.RUNNING, LATE_ANSWER)
        # A prompt answer still wins the next slot.
        store.delay_s["late"] = 0.0
        handle = await scheduler.try_claim("job", slot + 1)
        assert handle
        await handle.finish()
    finally:
        await scheduler.stop()


async def test_scheduled_slot_answered_late_is_run_once_by_a_backup() -> None:
    store = LateAnswers()
    ran: list[tuple[str, int, int]] = []

    def make(instance: str) -> Scheduler:
        scheduler = Scheduler(store, instance_id=instance, lease_ms=LEASE_MS,
                              heartbeat_ms=HEARTBEAT_MS)

        async def handler(ctx: JobContext) -> None:
            ran.append((instance, ctx.slot, ctx.attempt))

        scheduler.every("job", "2s", handler, jitter_ms=0)
        return scheduler

    store.delay_s["late"] = LEASE_MS / 1000 * 1.5
    late = make("late")
    slot = await next_slot_alone()
    await late.start()
    backup: Scheduler | None = None
    try:
        # The late instance claims the slot alone; then a prompt backup starts.
        await asyncio.sleep(max(0.0, slot / 1000 - time.time()) + 0.05)
        backup = make("backup")
        await backup.start()
        for _ in range(100):  # 5 s at most: the late answer, the expiry, the takeover
            if any(s == slot for _, s, _ in ran):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
    finally:
        if backup is not None:
            await backup.stop()
        await late.stop()
    # The late instance's own takeovers are answered late too: only the backup runs it.
    [(who, attempt)] = [(who, attempt) for who, s, attempt in ran if s == slot]
    assert who == "backup"
    assert attempt >= 2
    history = await store.history("job")
    attempts = sorted((r.attempt, r.runner, r.status) for r in history if r.slot == slot)
    assert attempts[0] == (1, "late", "interrupted")
    assert attempts[-1] == (attempt, "backup", "success")
    assert all((runner, status) == ("late", "interrupted") for _, runner, status in attempts[:-1])


async def test_a_lone_instance_answered_late_takes_its_own_run_over() -> None:
    store = LateAnswers()
    ran: list[tuple[int, int]] = []
    scheduler = Scheduler(store, instance_id="late", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS)

    async def handler(ctx: JobContext) -> None:
        ran.append((ctx.slot, ctx.attempt))

    scheduler.every("job", "2s", handler, jitter_ms=0)
    store.delay_s["late"] = LEASE_MS / 1000 * 1.5
    store.late_claims["late"] = 1  # its first claim, of this slot
    slot = await next_slot_alone()
    await scheduler.start()
    try:
        for _ in range(100):  # 5 s at most
            if any(s == slot for s, _ in ran):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
    finally:
        await scheduler.stop()
    assert [attempt for s, attempt in ran if s == slot] == [2]
