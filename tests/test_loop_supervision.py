"""No background loop of a scheduler dies silently: one item's failure is logged and
skipped, a loop that fails is logged at ERROR and started again.

On the event loop's time (``looptime``; the scheduler on a
:class:`~tests.support.clock.LoopClock`): the scan periods and the restart's back-off take no
real time.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from anarchon_core import Scheduler
from anarchon_core.models import ExpiredRun
from anarchon_core.supervision import LoopGuard
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

pytestmark = [pytest.mark.timeout(60), pytest.mark.looptime]


class FailingScans(MemoryBackend):
    """A store whose orphan scan of job ``bad`` fails with an error nobody expects."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(clock.store_ms)
        self.scanned: list[str] = []

    async def expired_runs(self, job: str, limit: int = 100) -> list[ExpiredRun]:
        self.scanned.append(job)
        if job == "bad":
            raise RuntimeError("a bug in one job's scan")
        return await super().expired_runs(job, limit)


async def test_one_jobs_failing_orphan_scan_never_stops_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = LoopClock()
    backend = FailingScans(clock)
    scheduler = Scheduler(backend, lease_ms=1_000, heartbeat_ms=300, clock=clock)
    for job in ("bad", "good"):
        scheduler.every(job, "1h", lambda ctx: None)
    with caplog.at_level(logging.ERROR, logger="anarchon"):
        await scheduler.start()
        try:
            for _ in range(100):  # each period scans both jobs; a dead loop scans no more
                if backend.scanned.count("good") >= 3:
                    break
                await asyncio.sleep(0.1)
        finally:
            await scheduler.stop()
    assert backend.scanned.count("good") >= 3, backend.scanned
    assert backend.scanned.count("bad") >= 3, backend.scanned  # failed again and again
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]  # once a minute at most
    assert "orphan recovery loop: job 'bad' failed" in errors[0].getMessage()


async def test_a_failed_loop_is_logged_and_started_again(
        caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    started_at: list[float] = []

    async def body(guard: LoopGuard) -> None:
        runs.append(len(runs))
        started_at.append(asyncio.get_running_loop().time())
        if len(runs) == 1:
            raise RuntimeError("boom")

    guard = LoopGuard("test", lambda: True)
    with caplog.at_level(logging.ERROR, logger="anarchon"):
        await asyncio.wait_for(guard.run(body), 10)
    assert runs == [0, 1]
    assert started_at[1] - started_at[0] == pytest.approx(1.0)  # the first back-off
    assert guard.restarts == 1
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "the test loop failed; restarting it in 1 s" in error.getMessage()
    assert error.exc_info is not None


async def test_a_loop_is_not_started_again_once_the_scheduler_stops() -> None:
    running = [True]

    async def body(guard: LoopGuard) -> None:
        running[0] = False
        raise RuntimeError("failed while stopping")

    await asyncio.wait_for(LoopGuard("test", lambda: running[0]).run(body), 5)
