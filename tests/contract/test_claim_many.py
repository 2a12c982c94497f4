"""``Backend.claim_many``: the claims of one instant sent together, each decided on its own.

The scheduler claims every slot its timer finds due at once through ``claim_many``; a
store may send them in one round trip, but every request must get exactly the answer the
decision table gives it, in order, with a failed request's error in its place.
"""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core.backend import Backend
from anarchon_core.models import ClaimOutcome, ClaimResult, RunRef

from ..stores import StoreHandle, StoreSpec
from .test_lease_contract import req, sleep_past_lease, slot_now

pytestmark = pytest.mark.timeout(90)

JOBS = 300


def results_of(answers: list[ClaimResult | BaseException]) -> list[ClaimResult]:
    failed = [a for a in answers if isinstance(a, BaseException)]
    assert not failed, failed[:3]
    return [a for a in answers if isinstance(a, ClaimResult)]


async def test_two_instances_claiming_many_jobs_at_once_win_each_slot_once(
        lease_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    first, second = (lease_store[1].backend(namespace) for _ in range(2))
    await first.start()
    await second.start()
    try:
        slot = await slot_now(first)
        a = [req(slot, "a", job=f"j{i}") for i in range(JOBS)]
        b = [req(slot, "b", job=f"j{i}") for i in range(JOBS)]
        got_a, got_b = await asyncio.gather(first.claim_many(a), second.claim_many(b))
        for i, (x, y) in enumerate(zip(results_of(got_a), results_of(got_b), strict=True)):
            assert sorted([x.outcome.value, y.outcome.value]) == ["running", "won"], i
        winners = {f"j{i}": "a" if x.won else "b" for i, x in enumerate(results_of(got_a))}
        for job in ("j0", f"j{JOBS // 2}", f"j{JOBS - 1}"):
            [run] = await first.history(job)
            assert (run.runner, run.status, run.attempt) == (winners[job], "running", 1)
    finally:
        await first.stop()
        await second.stop()


async def test_each_request_of_a_batch_gets_the_decision_tables_answer(
        lease_backend: Backend) -> None:
    backend = lease_backend
    now = await slot_now(backend)
    # Before the batch: a finished run, a run whose lease lapses, a live run of "busy".
    finished = req(now, "x", job="finished")
    lapsing = req(now, "x", job="lapsing", max_attempts=2)
    for r in (finished, lapsing):
        assert (await backend.claim(r)).won
    assert await backend.finish(RunRef("finished", now, finished.token, 1), "success")
    await sleep_past_lease()
    now = await slot_now(backend)
    live = req(now - 10, "x", job="busy", lease_ms=30_000)
    assert (await backend.claim(live)).won

    fresh = req(now, "b", job="fresh")
    same_again = req(now, "c", job="fresh")
    batch = [
        fresh,
        same_again,                                            # same run, other token
        req(now + 3_600_000, "b", job="early"),                # an hour ahead
        req(now - 120_000, "b", job="late", max_late_ms=1_000),
        req(now + 500, "b", job="busy", overlap=False),        # busy's other run is live
        req(finished.slot, "b", job="finished"),               # already ended
        req(lapsing.slot, "b", job="lapsing", max_attempts=2),  # lease expired: takeover
        req(live.slot, "b", job="busy"),                       # live lease elsewhere
    ]
    got = results_of(await backend.claim_many(batch))
    assert [r.outcome for r in got] == [
        ClaimOutcome.WON, ClaimOutcome.RUNNING, ClaimOutcome.EARLY, ClaimOutcome.LATE,
        ClaimOutcome.OVERLAP, ClaimOutcome.DONE, ClaimOutcome.WON, ClaimOutcome.RUNNING,
    ]
    assert got[0].token == fresh.token
    assert got[0].attempt == 1
    assert got[6].attempt == 2
    assert got[6].token == batch[6].token
    # The same requests again (answers lost, retried with their tokens): the same winners.
    again = results_of(await backend.claim_many([fresh, batch[6]]))
    assert [(r.outcome, r.attempt) for r in again] == [(ClaimOutcome.WON, 1),
                                                       (ClaimOutcome.WON, 2)]
    [late] = await backend.history("late")
    assert late.status == "skipped"
    assert "late" in (late.error or "")


async def test_an_empty_batch_answers_nothing(lease_backend: Backend) -> None:
    assert await lease_backend.claim_many([]) == []


async def test_claim_only_stores_give_each_slot_one_winner(
        claim_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    first, second = (claim_store[1].backend(namespace) for _ in range(2))
    await first.start()
    await second.start()
    try:
        slot = await first.clock_ms()
        jobs = 100
        a = [req(slot, "a", job=f"c{i}") for i in range(jobs)]
        b = [req(slot, "b", job=f"c{i}") for i in range(jobs)]
        got_a, got_b = await asyncio.gather(first.claim_many(a), second.claim_many(b))
        for x, y in zip(results_of(got_a), results_of(got_b), strict=True):
            assert x.won != y.won, (x, y)
    finally:
        await first.stop()
        await second.stop()
