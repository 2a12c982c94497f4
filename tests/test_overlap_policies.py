"""The overlap policies on one scheduler's timeline (controlled time, an in-memory store).

A job whose runs outlast the gap between its slots: ``skip`` drops the slots due while a
run goes on, ``allow`` runs them beside it, ``buffer_one`` runs one of them as soon as the
run ends, and ``cancel_other`` stops the run for the newest slot. Only ``allow`` ever runs
two at once.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from anarchon_core import ConfigError, JobContext, Scheduler
from anarchon_core.testing import MemoryBackend
from tests.support.clock import LoopClock

pytestmark = pytest.mark.looptime


class Timeline:
    """Handlers that last ``seconds`` (cancellable), and what ran when."""

    def __init__(self, clock: LoopClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.running = 0
        self.most = 0
        self.starts: list[tuple[int, float]] = []
        self.ends: list[tuple[int, float]] = []

    async def run(self, ctx: JobContext) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        self.starts.append((ctx.slot, self.clock.monotonic()))
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.running -= 1
            self.ends.append((ctx.slot, self.clock.monotonic()))


async def run_fleet(policy: str, seconds: float, *, instances: int = 2,
                    run_for: float = 30.0) -> tuple[Timeline, Counter[tuple[str, str]]]:
    clock = LoopClock()
    store = MemoryBackend(clock.store_ms)
    timeline = Timeline(clock, seconds)
    fleet = [Scheduler(store, instance_id=f"i{n}", clock=clock, lease_ms=3_000,
                       heartbeat_ms=500) for n in range(instances)]
    for s in fleet:
        s.every("job", "2s", timeline.run, jitter_ms=0, overlap=policy)
    for s in fleet:
        await s.start()
    await asyncio.sleep(run_for)
    for s in fleet:
        await s.stop(grace_ms=0)
    history = await fleet[0].history("job", 1_000)
    outcomes = Counter((r.status, (r.error or "").split(":")[0]) for r in history)
    return timeline, outcomes


async def test_skip_runs_one_at_a_time_and_skips_the_slots_due_meanwhile() -> None:
    timeline, outcomes = await run_fleet("skip", 5.0)
    assert timeline.most == 1
    assert outcomes[("skipped", "overlap")] >= 5


async def test_allow_runs_beside_the_run_going_on() -> None:
    timeline, _ = await run_fleet("allow", 5.0)
    assert timeline.most >= 2


async def test_buffer_one_runs_one_slot_right_after_the_run_before_it() -> None:
    timeline, outcomes = await run_fleet("buffer_one", 5.0)
    assert timeline.most == 1
    assert outcomes[("skipped", "overlap")] >= 3  # a third slot finds one buffered already
    starts = sorted(t for _, t in timeline.starts)
    ends = sorted(t for _, t in timeline.ends)
    # Each run after the first starts within a poll of the run before it ending.
    for start, before_end in zip(starts[1:], ends, strict=False):
        assert 0 <= start - before_end <= 0.6, timeline.starts
    starts = timeline.starts
    assert len({s for s, _ in starts}) == len(starts)  # each slot once


async def test_cancel_other_stops_the_run_for_the_newest_slot() -> None:
    timeline, outcomes = await run_fleet("cancel_other", 30.0)
    assert timeline.most == 1
    assert outcomes[("interrupted", "cancelled")] >= 5
    # Every slot starts (15 in 30 s), within a heartbeat and a poll of its time.
    assert len(timeline.starts) >= 14, timeline.starts
    for slot, start in timeline.starts[1:]:
        local_slot = slot / 1000 - timeline.clock.wall_at_zero
        assert start - local_slot <= 1.2, (slot, start)


def test_policies_are_checked_by_name() -> None:
    scheduler = Scheduler(MemoryBackend())
    with pytest.raises(ConfigError, match="invalid overlap 'sometimes'"):
        scheduler.every("x", "1s", lambda ctx: None, overlap="sometimes")
    with pytest.raises(ConfigError, match="buffer_all' is not offered"):
        scheduler.every("x", "1s", lambda ctx: None, overlap="buffer_all")
    with pytest.raises(ConfigError, match="needs on_takeover"):
        scheduler.define("y", overlap="buffer_one")
    assert scheduler.every("z", "1s", lambda ctx: None, overlap=True) is not None
    assert {j.name: j.options["overlap"] for j in scheduler.jobs()} == {"z": "allow"}
