"""A run's end record that never gets an answer is cut and sent again.

The code has returned, so a late end record is still useful, but a hung client must not
hold the run forever: past its bound (at least a second, or the rest of the lease) the
call is cut, the run's task is left uncancelled, and the record is retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import pytest

from anarchon_core import JobContext, Scheduler
from anarchon_core.models import RunRef
from anarchon_core.testing import MemoryBackend

pytestmark = pytest.mark.timeout(60)


class HungFinishes(MemoryBackend):
    """A memory store whose first end record never answers (until it is cut)."""

    def __init__(self) -> None:
        super().__init__()
        self.finishes = 0
        self.cut = 0

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        self.finishes += 1
        if self.finishes == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cut += 1
                raise
        return await super().finish(ref, status, error, meta)


async def test_a_hung_end_record_is_cut_and_sent_again(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="anarchon")
    store = HungFinishes()
    scheduler = Scheduler(store, instance_id="host:1", lease_ms=1_000, heartbeat_ms=300)

    @scheduler.every("quick", "1h")
    async def quick(ctx: JobContext) -> None:
        pass

    try:
        # The first end record would hang forever: only its cut lets the run return.
        run = await asyncio.wait_for(scheduler.run_now("quick"), 30)
        assert run.status == "success"
        assert (store.finishes, store.cut) == (2, 1)
        # Cut at its bound: a second here (the lease is 1 s, the heartbeat 0.3 s).
        cuts = [r.getMessage() for r in caplog.records if "got no answer in" in r.getMessage()]
        assert cuts, [r.getMessage() for r in caplog.records]
        assert all("recording the end got no answer in 1.0s" in m for m in cuts), cuts
        (entry,) = await scheduler.history("quick")
        assert entry.status == "success"
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
        await asyncio.sleep(0.01)  # the cut left no cancellation behind
    finally:
        await scheduler.stop()
