"""An async handler is awaited in its run's own task: its cancellations stay its own.

A timeout, a lost lease or the end of the stop grace cancel the handler; the run then
records its end as usual. A cancellation the handler swallowed, or one asked for by the
handler's own code (a ``check_lease`` that fences), must not reach the run's end record
or the caller of ``run_now``. A cancellation from outside (the caller of ``run_now`` gives
up) still cancels the handler and goes on up.

Most tests run on the event loop's time (``looptime``, a
:class:`~tests.support.clock.LoopClock` and a memory store); the one whose handler blocks
the loop needs real time, which goes on while the loop's stands still.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

import pytest

from anarchon_core import JobContext, LeaseLost, Scheduler
from anarchon_core.testing import MemoryBackend

from .support.clock import LoopClock
from .support.helpers import make_scheduler

make = functools.partial(make_scheduler, table="runs")


def on_loop_time(**options: Any) -> tuple[Scheduler, LoopClock]:
    """A scheduler and its memory store on the loop's time (for ``looptime`` tests)."""
    clock = LoopClock()
    return Scheduler(MemoryBackend(clock.store_ms), instance_id="host:1", clock=clock,
                     **options), clock


def cancellations_pending() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


@pytest.mark.looptime
async def test_a_handler_that_swallows_its_timeout_is_recorded_failed() -> None:
    scheduler, _ = on_loop_time()
    seen: list[str] = []

    @scheduler.every("stubborn", "1h", timeout_ms=100)
    async def stubborn(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append(f"cancelled ({ctx.cancel_reason})")
        await asyncio.sleep(0.05)  # goes on after its cancellation, then returns

    try:
        run = await scheduler.run_now("stubborn")
        assert seen == ["cancelled (timeout)"]
        assert (run.status, run.error) == ("failed", "timeout")
        (entry,) = await scheduler.history("stubborn")
        assert (entry.status, entry.error) == ("failed", "timeout")
        assert entry.finished_at is not None
        assert cancellations_pending() == 0
        await asyncio.sleep(0.01)  # no cancellation left behind for the caller
    finally:
        await scheduler.stop()


async def test_a_fence_seen_by_the_handlers_own_check_lease_stays_in_the_handler(
        tmp_path: Path) -> None:
    """The handler blocks the loop past its lease, then checks it: fenced from inside."""
    scheduler = make(tmp_path, lease_ms=600, heartbeat_ms=200)
    raised: list[type[BaseException]] = []

    @scheduler.every("blocking", "1h")
    async def blocking(ctx: JobContext) -> None:
        time.sleep(0.7)  # noqa: ASYNC251 - holds the loop so no heartbeat can go out
        try:
            await ctx.acheck_lease()
        except BaseException as exc:
            raised.append(type(exc))
            raise

    try:
        run = await scheduler.run_now("blocking")
        assert raised == [LeaseLost]
        assert (run.status, run.error) == ("interrupted", "lease lost")
        assert cancellations_pending() == 0
        await asyncio.sleep(0.05)  # the fence's cancellation never reaches run_now's caller
    finally:
        await scheduler.stop()


@pytest.mark.looptime
async def test_cancelling_run_now_cancels_the_handler() -> None:
    scheduler, _ = on_loop_time()
    started = asyncio.Event()
    seen: list[str] = []

    @scheduler.every("waits", "1h")
    async def waits(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    try:
        caller = asyncio.ensure_future(scheduler.run_now("waits"))
        await asyncio.wait_for(started.wait(), 5)
        caller.cancel()
        done, _ = await asyncio.wait({caller}, timeout=5)
        assert caller in done
        assert caller.cancelled()
        assert seen == ["cancelled"]
        # Nothing was recorded for the abandoned attempt: its lease runs out on its own.
        (entry,) = await scheduler.history("waits")
        assert entry.status == "running"
    finally:
        await scheduler.stop()


@pytest.mark.looptime
async def test_an_async_handler_asked_to_stop_is_cancelled_after_the_grace() -> None:
    scheduler, clock = on_loop_time(stop_grace_ms=100)
    started = asyncio.Event()
    seen: list[tuple[str, float]] = []

    @scheduler.every("long", "1h")
    async def long(ctx: JobContext) -> None:
        started.set()
        begin = clock.monotonic()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append((str(ctx.cancel_reason), clock.monotonic() - begin))
            raise

    caller = asyncio.ensure_future(scheduler.run_now("long"))
    await asyncio.wait_for(started.wait(), 5)
    await scheduler.stop()
    run = await asyncio.wait_for(caller, 5)
    assert [reason for reason, _ in seen] == ["stopping"]
    assert seen[0][1] == pytest.approx(0.1, abs=1e-6)  # the grace, no sooner and no later
    assert (run.status, run.error) == ("interrupted", "stopping")
