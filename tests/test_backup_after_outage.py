"""A backup leaves the runner one lease to catch up after the store was unreachable.

While the store is down the runner can neither heartbeat nor record its end, so its lease
may run out meanwhile; a backup whose first check after the outage took the run over would
run it a second time although it had ended. Here the "runner" is another instance's claim
made straight on the store, the backup a real scheduler, the store an in-memory one that
can be switched off, all on the event loop's time (``looptime`` and a
:class:`~tests.support.clock.LoopClock`): the outage and the lease expiries take no real time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from anarchon_core import JobContext, Scheduler
from anarchon_core.backend import new_token
from anarchon_core.errors import StoreUnavailable
from anarchon_core.models import ClaimRequest, ClaimResult, RunRef
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

pytestmark = [pytest.mark.timeout(60), pytest.mark.looptime]

LEASE_MS, HEARTBEAT_MS, EVERY_MS = 1_500, 250, 20_000


class Switchable(MemoryBackend):
    """A memory store whose lease calls fail as unreachable while ``down``."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("store down (test)")

    async def clock_ms(self) -> int:
        self._check()
        return await super().clock_ms()

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        self._check()
        return await super().claim(request)

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        self._check()
        return await super().heartbeat(ref, lease_ms)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Any = None) -> bool:
        self._check()
        return await super().finish(ref, status, error, meta)


async def sleep_until(clock: LoopClock, wall_ms: float) -> None:
    await asyncio.sleep(max(0.0, wall_ms / 1000 - clock.time()))


async def outage_while_another_instance_runs(runner_finishes_after_s: float | None
                                             ) -> tuple[list[int], list[Any]]:
    """The other instance claims slot S, the backup watches it, the store is down for
    longer than the lease; the runner records its end ``runner_finishes_after_s`` after the
    store is back (None: never, it died). The backup's own runs of S, and S's history."""
    clock = LoopClock()
    store = Switchable(clock.store_ms)
    ran: list[int] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.slot)

    slot = (clock.time() * 1000 // 1000 + 2) * 1000  # 1-2 s from now; the next 20 s later
    backup = Scheduler(store, instance_id="backup", lease_ms=LEASE_MS,
                       heartbeat_ms=HEARTBEAT_MS, clock=clock)
    backup.every("job", f"{EVERY_MS}ms", handler, offset=f"{int(slot % EVERY_MS)}ms",
                 jitter_ms=0)
    await backup.start()
    try:
        await sleep_until(clock, slot - 500)
        theirs = ClaimRequest(job="job", slot=int(slot), token=new_token(), runner="runner",
                              lease_ms=LEASE_MS)
        assert (await store.claim(theirs)).won
        await sleep_until(clock, slot + 300)  # the backup's claim found it running: it watches
        store.down = True
        await asyncio.sleep(LEASE_MS / 1000 + 0.7)  # the runner's lease runs out meanwhile
        store.down = False
        if runner_finishes_after_s is not None:
            await asyncio.sleep(runner_finishes_after_s)
            assert await store.finish(RunRef("job", int(slot), theirs.token), "success")
        await asyncio.sleep(LEASE_MS / 1000 + 4 * HEARTBEAT_MS / 1000 + 0.5)
        history = [r for r in await store.history("job", 50) if r.slot == slot]
        return [s for s in ran if s == slot], history
    finally:
        await backup.stop()


async def test_a_run_that_ended_during_an_outage_is_not_run_again() -> None:
    # The runner's end comes 0.8 s after the store is back: later than the backup's next
    # check (every 0.25-0.5 s), sooner than a lease.
    ran, history = await outage_while_another_instance_runs(0.8)
    assert ran == [], "the backup ran the slot again"
    assert [(r.attempt, r.status, r.runner) for r in history] == [(1, "success", "runner")]


async def test_a_runner_that_died_during_an_outage_is_still_taken_over() -> None:
    ran, history = await outage_while_another_instance_runs(None)
    assert len(ran) == 1, "the backup did not take the run over"
    assert sorted((r.attempt, r.status, r.runner) for r in history) == [
        (1, "interrupted", "runner"), (2, "success", "backup")]
