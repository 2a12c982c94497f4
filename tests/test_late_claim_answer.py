"""A claim won, but answered after its lease could be confirmed, never starts its code.

The store committed the claim, but its answer reached the instance late (a network
partition that froze the reply, a paused process): by then the lease may have expired and
a backup may run the slot. Starting the handler then would run the slot twice at once, so
the handle fences itself instead, nothing is recorded, and a backup takes the run over.
Found by the chaos harness on PostgreSQL (seed 20261211: a partition began 7 ms after a
claim was sent, the handler started 3.7 s later, after the takeover).

A claim committed but whose answer was lost is won again by the retry with the same
token, with the lease the first commit set: the handle's lease ends at that lease's
expiry by the store's clock, not a whole lease after the retry. Found by the chaos
harness on a Redis Cluster with min_replicas_acks (seed 935434490: claims committed on a
promoted primary with no replica yet failed their WAIT until it had one; the retry won
1.6 s later and started the handler 20 ms before a backup took the expired run over).

The schedulers and stores here run on the event loop's time (``looptime`` and a
:class:`~tests.support.clock.LoopClock`): the late answers, expiries and takeovers are
deterministic and take no real time.
"""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core import ClaimHandle, ClaimOutcome, JobContext, NotClaimed, Scheduler
from anarchon_core.claiming import LATE_ANSWER
from anarchon_core.errors import StoreUnavailable
from anarchon_core.models import ClaimRequest, ClaimResult
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

pytestmark = [pytest.mark.timeout(60), pytest.mark.looptime]

LEASE_MS, HEARTBEAT_MS = 400, 100


class LateAnswers(MemoryBackend):
    """A memory store whose claim answers reach some runners only after a delay."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(clock.store_ms)
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


class LostAnswers(MemoryBackend):
    """A memory store that commits some won claims but loses their answers."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(clock.store_ms)
        #: How many more won claims of a runner lose their answer, and after how long.
        self.lose_wins: dict[str, int] = {}
        self.delay_s = 0.0

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        result = await super().claim(request)  # committed
        if result.won and self.lose_wins.get(request.runner, 0) > 0:
            self.lose_wins[request.runner] -= 1
            await asyncio.sleep(self.delay_s)
            raise StoreUnavailable("the claim's answer was lost")
        return result


async def next_slot_alone(clock: LoopClock) -> int:
    """Wait until just after a 2 s boundary; the next one, the first slot claimed after it."""
    boundary = (int(clock.time() * 1000) // 2_000 + 1) * 2_000
    await asyncio.sleep(max(0.0, boundary / 1000 - clock.time()) + 0.1)
    return boundary + 2_000


def every_2s(store: MemoryBackend, instance: str,
             clock: LoopClock) -> tuple[Scheduler, list[tuple[int, int]]]:
    """A scheduler with one no-jitter job every 2 s, and the (slot, attempt) it ran."""
    ran: list[tuple[int, int]] = []
    scheduler = Scheduler(store, instance_id=instance, lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS, clock=clock)

    async def handler(ctx: JobContext) -> None:
        ran.append((ctx.slot, ctx.attempt))

    scheduler.every("job", "2s", handler, jitter_ms=0)
    return scheduler, ran


async def until_ran(ran: list[tuple[int, int]], slot: int, tries: int = 100) -> None:
    """Wait until ``slot`` ran (0.05 s per try), then a little more for a second run."""
    for _ in range(tries):
        if any(s == slot for s, _ in ran):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


async def test_run_now_answered_late_does_not_run_the_handler() -> None:
    clock = LoopClock()
    store = LateAnswers(clock)
    ran: list[int] = []
    scheduler = Scheduler(store, instance_id="late", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS, clock=clock)
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
    clock = LoopClock()
    store = LateAnswers(clock)
    scheduler = Scheduler(store, instance_id="late", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS, clock=clock)
    scheduler.define("job")
    await scheduler.start()
    try:
        slot = int(clock.time() * 1000)
        store.delay_s["late"] = LEASE_MS / 1000 * 1.5
        outcome = await scheduler.try_claim("job", slot)
        assert isinstance(outcome, NotClaimed)
        assert (outcome.outcome, outcome.reason) == (ClaimOutcome.RUNNING, LATE_ANSWER)
        # A prompt answer still wins the next slot.
        store.delay_s["late"] = 0.0
        handle = await scheduler.try_claim("job", slot + 1)
        assert isinstance(handle, ClaimHandle)
        await handle.finish()
    finally:
        await scheduler.stop()


async def test_scheduled_slot_answered_late_is_run_once_by_a_backup() -> None:
    clock = LoopClock()
    store = LateAnswers(clock)
    ran: list[tuple[str, int, int]] = []

    def make(instance: str) -> Scheduler:
        scheduler = Scheduler(store, instance_id=instance, lease_ms=LEASE_MS,
                              heartbeat_ms=HEARTBEAT_MS, clock=clock)

        async def handler(ctx: JobContext) -> None:
            ran.append((instance, ctx.slot, ctx.attempt))

        scheduler.every("job", "2s", handler, jitter_ms=0)
        return scheduler

    store.delay_s["late"] = LEASE_MS / 1000 * 1.5
    late = make("late")
    slot = await next_slot_alone(clock)
    await late.start()
    backup: Scheduler | None = None
    try:
        # The late instance claims the slot alone; then a prompt backup starts.
        await asyncio.sleep(max(0.0, slot / 1000 - clock.time()) + 0.05)
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
    clock = LoopClock()
    store = LateAnswers(clock)
    scheduler, ran = every_2s(store, "late", clock)
    store.delay_s["late"] = LEASE_MS / 1000 * 1.5
    store.late_claims["late"] = 1  # its first claim, of this slot
    slot = await next_slot_alone(clock)
    await scheduler.start()
    try:
        await until_ran(ran, slot)  # 5 s at most
    finally:
        await scheduler.stop()
    assert [attempt for s, attempt in ran if s == slot] == [2]


async def test_a_claim_won_again_by_its_retry_keeps_the_lease_its_first_commit_set() -> None:
    clock = LoopClock()
    store = LostAnswers(clock)
    scheduler = Scheduler(store, instance_id="lost", lease_ms=LEASE_MS,
                          heartbeat_ms=HEARTBEAT_MS, clock=clock)
    scheduler.define("job")
    await scheduler.start()
    try:
        slot = int(clock.time() * 1000)
        # The first try's answer is lost after 1.5 leases; the retry wins that commit, whose
        # lease has expired by then: not claimed, a backup takes the run over.
        store.lose_wins["lost"], store.delay_s = 1, LEASE_MS / 1000 * 1.5
        outcome = await scheduler.try_claim("job", slot)
        assert isinstance(outcome, NotClaimed)
        assert (outcome.outcome, outcome.reason) == (ClaimOutcome.RUNNING, LATE_ANSWER)
        # An answer lost at once: the retry's win keeps nearly the whole lease.
        store.lose_wins["lost"], store.delay_s = 1, 0.0
        handle = await scheduler.try_claim("job", slot + 1)
        assert isinstance(handle, ClaimHandle)
        assert handle.attempt == 1
        await handle.finish()
    finally:
        await scheduler.stop()


async def test_a_scheduled_claim_whose_answer_was_lost_is_not_run_on_an_expired_lease() -> None:
    clock = LoopClock()
    store = LostAnswers(clock)
    scheduler, ran = every_2s(store, "lost", clock)
    slot = await next_slot_alone(clock)
    store.lose_wins["lost"], store.delay_s = 1, LEASE_MS / 1000 * 1.5
    await scheduler.start()
    try:
        await until_ran(ran, slot)  # 5 s at most: the lost answer, the expiry, the takeover
    finally:
        await scheduler.stop()
    # Attempt 1 is committed but never runs (its lease expired before the retry won it).
    assert [attempt for s, attempt in ran if s == slot] == [2]


async def test_a_backup_takeover_whose_answer_was_lost_is_not_run_on_an_expired_lease(
) -> None:
    clock = LoopClock()
    store = LostAnswers(clock)
    backup, ran = every_2s(store, "backup", clock)
    slot = await next_slot_alone(clock)
    # A runner that never heartbeats holds the slot until a second after it is due.
    await asyncio.sleep(max(0.0, slot / 1000 - clock.time() - 0.5))
    ghost = await store.claim(ClaimRequest(job="job", slot=slot, token="ghost",
                                           runner="ghost", lease_ms=1_500))
    assert ghost.won
    # The backup's first takeover is committed but its answer is lost; its next poll
    # wins it again with that takeover's lease, expired by then.
    store.lose_wins["backup"] = 1
    await backup.start()
    try:
        await until_ran(ran, slot, tries=120)  # 6 s at most
    finally:
        await backup.stop()
    assert [attempt for s, attempt in ran if s == slot] == [3]
    history = await store.history("job")
    attempts = sorted((r.attempt, r.runner, r.status) for r in history if r.slot == slot)
    assert attempts[:2] == [(1, "ghost", "interrupted"), (2, "backup", "interrupted")]
    assert attempts[2] == (3, "backup", "success")
