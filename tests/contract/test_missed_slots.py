"""``ClaimRequest(missed=reason)``: accounting for a slot nobody claimed, on every store.

The first such request for a run with no record writes one ``missed`` record with the
reason and answers ``late``; every later request (missed or not) finds the record and
never runs the slot. A missed request never touches a run that exists: a running run is
neither taken over nor marked.
"""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core.backend import Backend, new_token
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

pytestmark = pytest.mark.timeout(60)

REASON = "missed: no instance claimed it within max_late_ms (all down?)"


def missed(slot: int, runner: str, job: str = "job") -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner, lease_ms=2_000,
                        max_late_ms=60_000, missed=REASON)


def normal(slot: int, runner: str, job: str = "job") -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner, lease_ms=500,
                        max_late_ms=10 ** 9)


async def assert_recorded_once(backend: Backend, slot: int, runners: set[str]) -> None:
    history = [r for r in await backend.history("job", 50) if r.slot == slot]
    assert len(history) == 1, history
    [run] = history
    assert (run.status, run.error, run.attempt) == ("missed", REASON, 1)
    assert run.runner in runners


async def test_a_missed_slot_is_recorded_once_by_the_first_instance(
        lease_backend: Backend) -> None:
    backend = lease_backend
    slot = await backend.clock_ms() - 120_000
    answers = await asyncio.gather(*(backend.claim(missed(slot, f"i{n}")) for n in range(3)))
    assert sorted(a.outcome.value for a in answers) == ["done", "done", "late"]
    await assert_recorded_once(backend, slot, {"i0", "i1", "i2"})
    late_claim = await backend.claim(normal(slot, "z"))
    assert late_claim.outcome is ClaimOutcome.DONE  # never run after it was recorded
    await assert_recorded_once(backend, slot, {"i0", "i1", "i2"})


async def finish_one_and_leave_one_running(backend: Backend, finished: ClaimRequest,
                                           running: ClaimRequest) -> None:
    """Win ``finished`` and record its success; win ``running`` and leave it running."""
    assert (await backend.claim(finished)).won
    assert await backend.finish(RunRef(finished.job, finished.slot, finished.token, 1),
                                "success")
    assert (await backend.claim(running)).won


async def test_a_missed_request_leaves_existing_runs_alone(lease_backend: Backend) -> None:
    backend = lease_backend
    now = await backend.clock_ms()
    running, finished = normal(now - 5_000, "a"), normal(now - 10_000, "a")
    await finish_one_and_leave_one_running(backend, finished, running)
    assert (await backend.claim(missed(running.slot, "b"))).outcome is ClaimOutcome.RUNNING
    assert (await backend.claim(missed(finished.slot, "b"))).outcome is ClaimOutcome.DONE
    await asyncio.sleep(0.7)  # the running run's lease lapses: still not taken over
    assert (await backend.claim(missed(running.slot, "b"))).outcome is ClaimOutcome.RUNNING
    statuses = {r.slot: r.status for r in await backend.history("job", 50)}
    assert statuses == {running.slot: "interrupted", finished.slot: "success"}
    takeover = await backend.claim(normal(running.slot, "c"))
    assert (takeover.outcome, takeover.attempt) == (ClaimOutcome.WON, 2)


async def test_claim_only_stores_record_a_missed_slot_once(claim_backend: Backend) -> None:
    backend = claim_backend
    slot = await backend.clock_ms() - 60_000
    answers = [await backend.claim(missed(slot, f"i{n}")) for n in range(3)]
    assert [a.outcome.value for a in answers] == ["late", "taken", "taken"]
    await assert_recorded_once(backend, slot, {"i0"})
    assert (await backend.claim(normal(slot, "z"))).outcome is ClaimOutcome.TAKEN


async def test_newest_slots_name_each_jobs_newest_scheduled_slot(lease_backend: Backend) -> None:
    backend = lease_backend
    now = await backend.clock_ms()
    old, newer = normal(now - 20_000, "a"), normal(now - 10_000, "a")
    await finish_one_and_leave_one_running(backend, old, newer)
    manual = ClaimRequest(job="job", slot=now - 1_000, token=new_token(), runner="a",
                          manual=True, overlap=True, max_attempts=1)
    assert (await backend.claim(manual)).won  # a manual run is not a scheduled slot
    assert (await backend.claim(normal(now - 5_000, "a", job="other"))).won
    assert await backend.newest_slots(["job", "other", "never-ran"]) == {
        "job": newer.slot, "other": now - 5_000, "never-ran": None}
