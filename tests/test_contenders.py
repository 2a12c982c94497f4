"""Contender sets: the ranks every member agrees on, the view's life, and a fleet using them.

The ranks and the view are pure logic (a fake clock). The fleet tests run several
schedulers on one :class:`~anarchon_core.testing.MemoryBackend` on the event loop's time
(``looptime``), counting the store calls they make.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from anarchon_core import ClaimHandle, JobContext, Scheduler
from anarchon_core.contenders import (
    CONTENDERS,
    LOOK_GRID_MS,
    RANK_DELAY_MS,
    VIEW_STALE_S,
    Contenders,
    FleetView,
    group_digest,
    look_at,
)
from anarchon_core.fleet import INSTANCE, InstanceInfo
from anarchon_core.models import ClaimRequest, ClaimResult
from anarchon_core.testing import MemoryBackend

from .support.clock import FakeClock, LoopClock

MEMBERS = tuple(f"web-{i}:{1000 + i}" for i in range(8))


def views(members: Sequence[str]) -> list[FleetView]:
    ordered = tuple(sorted(members))
    return [FleetView(m, ordered) for m in ordered]


def test_every_member_agrees_on_one_member_per_rank() -> None:
    fleet = views(MEMBERS)
    for slot in range(0, 2_000 * 5_000, 5_000):
        ranks = sorted(v.rank("report", slot) for v in fleet)
        assert ranks[:CONTENDERS] == list(range(CONTENDERS)), slot
        assert all(r == CONTENDERS for r in ranks[CONTENDERS:]), slot


def test_first_ranks_are_spread_evenly_over_members() -> None:
    fleet = views(MEMBERS)
    firsts = Counter(v.me for slot in range(0, 8_000 * 1_000, 1_000) for v in fleet
                     if v.rank("tick", slot) == 0)
    assert sum(firsts.values()) == 8_000
    assert min(firsts.values()) > 0.85 * 1_000
    assert max(firsts.values()) < 1.15 * 1_000


def test_a_member_joining_takes_over_only_slots_where_it_ranks_first() -> None:
    """Rendezvous hashing: the order of the others is untouched by a newcomer."""
    before, after = views(MEMBERS[:5]), views(MEMBERS[:6])
    moved = 0
    for slot in range(0, 3_000 * 1_000, 1_000):
        first_before = next(v.me for v in before if v.rank("j", slot) == 0)
        first_after = next(v.me for v in after if v.rank("j", slot) == 0)
        if first_after != first_before:
            assert first_after == MEMBERS[5]
            moved += 1
    assert 0.1 * 3_000 < moved < 0.25 * 3_000  # about one slot in six


def test_a_lone_member_is_first_for_every_slot() -> None:
    [alone] = views(MEMBERS[:1])
    assert {alone.rank("j", slot) for slot in range(0, 100_000, 1_000)} == {0}


def test_the_jitter_is_drawn_alike_within_the_jobs_jitter_on_a_grid() -> None:
    fleet = views(MEMBERS)
    for slot in range(0, 500 * 5_000, 5_000):
        drawn = {v.jitter("j", slot, 500) for v in fleet}
        assert len(drawn) == 1
        [value] = drawn
        assert 0 <= value < 500
        assert value % 160 == 0
    assert fleet[0].jitter("j", 0, 0) == 0


def test_later_ranks_look_on_the_grid_within_the_lateness_bound() -> None:
    at = look_at(10_010.0, 1, 60_000)
    assert at % LOOK_GRID_MS == 0
    assert 10_010 + RANK_DELAY_MS <= at < 10_010 + RANK_DELAY_MS \
        + LOOK_GRID_MS
    assert look_at(10_010.0, 2, 60_000) >= 10_010 + 2 * RANK_DELAY_MS
    # A lateness bound too short for the grid: the delays alone, within the bound.
    assert look_at(10_010.0, 2, 900) == 10_010 + 2 * 300
    assert look_at(10_010.0, 2, 300) == 10_010 + 2 * 100


def test_groups_differ_by_job_or_definition_not_by_order() -> None:
    assert group_digest([("a", "1"), ("b", "2")]) == group_digest([("b", "2"), ("a", "1")])
    assert group_digest([("a", "1")]) != group_digest([("a", "2")])
    assert group_digest([("a", "1")]) != group_digest([("a", "1"), ("b", "2")])


def test_the_view_applies_while_fresh_and_says_when_it_changes() -> None:
    clock = FakeClock()
    changes: list[int] = []
    contenders = Contenders("me", enabled=True, clock=clock,
                            on_change=lambda: changes.append(1))
    assert contenders.view() is None
    assert contenders.rank("j", 0) is None
    contenders.update(["a", "b"])
    view = contenders.view()
    assert view is not None
    assert view.members == ("a", "b", "me")
    assert len(changes) == 1
    contenders.update(["b", "a", "me"])  # the same members: nothing to re-arm
    assert len(changes) == 1
    contenders.update(["a"])
    assert len(changes) == 2
    clock.advance(VIEW_STALE_S + 0.1)
    contenders.check()
    assert contenders.view() is None
    assert len(changes) == 3
    contenders.update(["a"])
    assert contenders.view() is not None
    assert len(changes) == 4


def test_disabled_contenders_never_rank() -> None:
    contenders = Contenders("me", enabled=False, clock=FakeClock())
    contenders.update(["a", "b"])
    assert contenders.view() is None


# A fleet on one store, on the loop's time.


class CountingStore(MemoryBackend):
    """A memory store that counts the claims and slot reads it answers.

    (``claim_many`` claims each request through :meth:`claim`.)
    """

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(clock.store_ms)
        self.claims: Counter[tuple[str, int]] = Counter()
        self.reads = 0

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        if not request.manual:
            self.claims[(request.job, request.slot)] += 1
        return await super().claim(request)

    async def slot_states(self, slots: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], str] | None:
        self.reads += 1
        return await super().slot_states(slots)


async def _fleet(store: CountingStore, clock: LoopClock, names: Sequence[str], *,
                 jobs: Sequence[str], ran: Counter[tuple[str, int]], **options: Any
                 ) -> list[Scheduler]:
    async def handler(ctx: JobContext) -> None:
        ran[(ctx.job, ctx.slot)] += 1

    fleet = []
    for name in names:
        scheduler = Scheduler(store, instance_id=name, clock=clock, **options)
        for job in jobs:
            scheduler.every(job, "1s", handler)
        fleet.append(scheduler)
    return fleet


@pytest.mark.looptime
@pytest.mark.timeout(60)
async def test_a_settled_fleet_claims_each_slot_about_once_and_runs_it_once() -> None:
    clock = LoopClock()
    store = CountingStore(clock)
    ran: Counter[tuple[str, int]] = Counter()
    jobs = [f"job{i}" for i in range(20)]
    fleet = await _fleet(store, clock, [f"i{n}" for n in range(6)], jobs=jobs, ran=ran)
    for scheduler in fleet:
        await scheduler.start()
    await asyncio.sleep(10)  # every view settled (a refresh every ~2 s)
    settled_ms = clock.store_ms() + 2_000
    await asyncio.sleep(30)
    end_ms = clock.store_ms() - 3_000
    for scheduler in fleet:
        await scheduler.stop()
    window = [(job, slot) for job in jobs for slot in range(settled_ms // 1000 * 1000 + 1000,
                                                             end_ms, 1000)]
    assert all(ran[key] == 1 for key in window), [k for k in window if ran[k] != 1][:5]
    claims = [store.claims[key] for key in window]
    assert sum(claims) / len(claims) < 1.1, Counter(claims)
    assert store.reads > 0


@pytest.mark.looptime
@pytest.mark.timeout(60)
async def test_members_leaving_and_joining_miss_no_slot() -> None:
    clock = LoopClock()
    store = CountingStore(clock)
    ran: Counter[tuple[str, int]] = Counter()
    jobs = [f"job{i}" for i in range(10)]
    names = (f"i{n}" for n in itertools.count())
    fleet = await _fleet(store, clock, [next(names) for _ in range(4)], jobs=jobs, ran=ran)
    for scheduler in fleet:
        await scheduler.start()
    await asyncio.sleep(8)
    begin_ms = clock.store_ms()
    for _ in range(5):  # a rolling deploy: one leaves, a new one joins, in turn
        leaving = fleet.pop(0)
        await leaving.stop()
        [joining] = await _fleet(store, clock, [next(names)], jobs=jobs, ran=ran)
        await joining.start()
        fleet.append(joining)
        await asyncio.sleep(3)
    await asyncio.sleep(5)
    end_ms = clock.store_ms() - 3_000
    for scheduler in fleet:
        await scheduler.stop()
    window = [(job, slot) for job in jobs
              for slot in range(begin_ms // 1000 * 1000 + 1000, end_ms, 1000)]
    assert [k for k in window if ran[k] != 1] == []


@pytest.mark.looptime
@pytest.mark.timeout(60)
async def test_instances_firing_different_jobs_each_keep_theirs() -> None:
    """Groups: an instance ranks only among those firing the same jobs as it."""
    clock = LoopClock()
    store = CountingStore(clock)
    ran: Counter[tuple[str, int]] = Counter()
    both = await _fleet(store, clock, ["a1", "a2", "a3"], jobs=["shared", "mine"], ran=ran)
    other = await _fleet(store, clock, ["b1", "b2", "b3"], jobs=["shared"], ran=ran)
    for scheduler in both + other:
        await scheduler.start()
    await asyncio.sleep(10)
    begin_ms = clock.store_ms()
    await asyncio.sleep(20)
    end_ms = clock.store_ms() - 3_000
    for scheduler in both + other:
        await scheduler.stop()
    for job in ("shared", "mine"):
        window = [(job, s) for s in range(begin_ms // 1000 * 1000 + 1000, end_ms, 1000)]
        assert [k for k in window if ran[k] != 1] == [], job


@pytest.mark.looptime
@pytest.mark.timeout(60)
async def test_contenders_false_claims_every_slot_here() -> None:
    clock = LoopClock()
    store = CountingStore(clock)
    ran: Counter[tuple[str, int]] = Counter()
    fleet = await _fleet(store, clock, ["x1", "x2", "x3"], jobs=["j"], ran=ran,
                         contenders=False)
    for scheduler in fleet:
        await scheduler.start()
    await asyncio.sleep(10)
    begin_ms = clock.store_ms()
    await asyncio.sleep(10)
    end_ms = clock.store_ms() - 3_000
    for scheduler in fleet:
        await scheduler.stop()
    window = [("j", s) for s in range(begin_ms // 1000 * 1000 + 1000, end_ms, 1000)]
    assert {store.claims[k] for k in window} == {3}
    assert store.reads == 0


@pytest.mark.looptime
@pytest.mark.timeout(60)
async def test_unreadable_or_hostile_fleet_records_are_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    """A corrupt record is a warning naming it, once; one claiming to be seen
    far in the future is not believed. Contender sets stay on for the live members."""
    clock = LoopClock()
    store = CountingStore(clock)
    ran: Counter[tuple[str, int]] = Counter()
    fleet = await _fleet(store, clock, ["h1", "h2"], jobs=["j"], ran=ran)
    for scheduler in fleet:
        await scheduler.start()
    await asyncio.sleep(5)
    [own] = [InstanceInfo.decode("h1", text) for name, text in
             (await store.read_controls(INSTANCE)).items() if name == INSTANCE + "h1"]
    now = clock.store_ms()
    ghost = InstanceInfo("ghost", "9.9", now, now + 3_600_000, now + 3_630_000, 1, own.group)
    await store.write_control(INSTANCE + "ghost", ghost.encode())
    await store.write_control(INSTANCE + "evil", "{not json")
    with caplog.at_level(logging.WARNING, logger="anarchon.fleet"):
        await asyncio.sleep(10)
    view = fleet[0]._contenders.view()
    for scheduler in fleet:
        await scheduler.stop()
    assert view is not None
    assert view.members == ("h1", "h2")
    warned = [r.getMessage() for r in caplog.records if "instance:evil" in r.getMessage()]
    assert len(warned) == 1  # once per record and process
    assert "corrupt record in control record instance:evil" in warned[0]


@pytest.mark.looptime
@pytest.mark.timeout(60)
async def test_callers_claiming_from_their_own_timers_ask_the_store_about_once_a_slot() -> None:
    """``define(contenders=True)``: every instance claims each slot from its own timer (as
    the APScheduler executor does); the non-contenders are answered without a store call."""
    clock = LoopClock()
    store = CountingStore(clock)
    fleet = [Scheduler(store, instance_id=f"c{n}", clock=clock) for n in range(5)]
    for scheduler in fleet:
        scheduler.define("ap", contenders=True)
        await scheduler.start()
    await asyncio.sleep(10)
    won: Counter[int] = Counter()
    outcomes: Counter[str] = Counter()
    begin = clock.store_ms() // 1000 * 1000 + 1000
    slots = list(range(begin, begin + 20_000, 1000))
    for slot in slots:
        await asyncio.sleep(max(0.0, (slot - clock.store_ms()) / 1000))
        answers = await asyncio.gather(*(s.try_claim("ap", slot) for s in fleet))
        for answer in answers:
            if isinstance(answer, ClaimHandle):
                won[slot] += 1
                await answer.finish("success")
            else:
                outcomes[answer.outcome.value] += 1
    for scheduler in fleet:
        await scheduler.stop()
    assert all(won[slot] == 1 for slot in slots), won
    assert sum(store.claims[("ap", s)] for s in slots) / len(slots) < 1.1
    assert outcomes["taken"] >= 2 * len(slots)  # the two non-contenders of each slot
