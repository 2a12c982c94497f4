"""What thousands of jobs and runs leave for Python's garbage collector to scan.

A full collection scans every object the collector tracks, and thousands of runs at one
instant trigger several (docs/operations.md, "Thousands of jobs on one instant"):

* a finished run of any kind (quick, long enough to heartbeat, failing, timed out, in a
  thread) is freed by reference counting: no cycle holds its handle, attempt or context;
* a registered job costs the collector two objects (the job and its timer entry): jobs of
  one interval and the same options share those, which never change.
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from anarchon_core import JobContext, Scheduler
from anarchon_core.claim import ClaimHandle
from anarchon_core.context import JobContext as Context
from anarchon_core.execution import Attempt
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

_RUN_OBJECTS = (ClaimHandle, Attempt, Context)


@contextmanager
def _cyclic_garbage() -> Iterator[Counter[str]]:
    """Collect what the block leaves only the collector could free, by type name."""
    found: Counter[str] = Counter()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.update(type(o).__name__ for o in gc.garbage if isinstance(o, _RUN_OBJECTS))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.looptime
async def test_finished_runs_leave_no_reference_cycle() -> None:
    clock = LoopClock()  # virtual time for the heartbeats and the timeout
    scheduler = Scheduler(MemoryBackend(clock.store_ms), lease_ms=300, heartbeat_ms=50,
                          clock=clock)

    async def quick(ctx: JobContext) -> None:
        pass

    async def heartbeats(ctx: JobContext) -> None:
        await asyncio.sleep(0.2)  # past several heartbeats: the lease keeper ran

    async def fails(ctx: JobContext) -> None:
        raise ValueError("boom")

    async def too_slow(ctx: JobContext) -> None:
        await asyncio.sleep(5)

    def in_a_thread(ctx: JobContext) -> None:
        pass

    scheduler.every("quick", "1h", quick)
    scheduler.every("heartbeats", "1h", heartbeats)
    scheduler.every("fails", "1h", fails)
    scheduler.every("too_slow", "1h", too_slow, timeout_ms=100)
    scheduler.every("in_a_thread", "1h", in_a_thread)
    await scheduler.start()
    try:
        with _cyclic_garbage() as left:
            statuses = {name: (await scheduler.run_now(name)).status
                        for name in ("quick", "heartbeats", "fails", "too_slow", "in_a_thread")}
    finally:
        await scheduler.stop()
    assert statuses == {"quick": "success", "heartbeats": "success", "fails": "failed",
                        "too_slow": "failed", "in_a_thread": "success"}
    assert not left, f"run objects freed only by the garbage collector: {dict(left)}"


async def test_jobs_on_one_grid_share_their_schedule_and_options() -> None:
    scheduler = Scheduler(MemoryBackend())

    async def handler(ctx: JobContext) -> None:
        pass

    scheduler.every("first", "1m", handler)
    await scheduler.start()
    try:
        gc.collect()
        before = len(gc.get_objects())
        for i in range(2_000):
            scheduler.every(f"tenant{i:05d}", "1m", handler)
        gc.collect()
        per_job = (len(gc.get_objects()) - before) / 2_000
        infos = {i.name: i for i in scheduler.jobs()}
    finally:
        await scheduler.stop()
    # The job itself; its timer entry holds only numbers and its name (untracked).
    assert per_job <= 1.1, f"{per_job:.2f} objects tracked by the collector per job"
    # Shared, yet each job still reports its own schedule and options.
    assert infos["tenant00007"].schedule == infos["first"].schedule
    assert infos["tenant00007"].options == infos["first"].options
