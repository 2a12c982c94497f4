"""The lease-backend contract: the decision table (docs/concepts.md) on every lease store.

Every test drives the backend directly (no scheduler), with short leases and the store's
own clock, so what is checked is the store's behaviour, not the scheduler's timing.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from anarchon_core.backend import Backend, Retention, new_token
from anarchon_core.errors import StoreFormatError
from anarchon_core.models import ClaimOutcome, ClaimRequest, HistoryQuery, RunRef
from anarchon_core.readmodel import EXPIRED_READ

from ..stores import StoreHandle, StoreSpec
from . import readmodel_cases as cases

pytestmark = pytest.mark.timeout(60)

LEASE = 600


def req(slot: int, runner: str = "a", **kw: object) -> ClaimRequest:
    return ClaimRequest(job=str(kw.pop("job", "job")), slot=slot, token=new_token(),
                        runner=runner, lease_ms=int(kw.pop("lease_ms", LEASE)), **kw)  # type: ignore[arg-type]


async def slot_now(backend: Backend) -> int:
    return await backend.clock_ms()


async def sleep_past_lease(extra: float = 0.25) -> None:
    await asyncio.sleep(LEASE / 1000 + extra)


def ref(request: ClaimRequest, attempt: int) -> RunRef:
    return RunRef(request.job, request.slot, request.token, attempt, request.manual)


async def test_first_claim_wins_and_others_see_it_running(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    first = await lease_backend.claim(req(slot, "a"))
    assert first.outcome is ClaimOutcome.WON
    assert first.attempt == 1
    second = await lease_backend.claim(req(slot, "b"))
    assert second.outcome is ClaimOutcome.RUNNING
    assert second.attempt == 1
    [run] = await lease_backend.history("job")
    assert (run.slot, run.attempt, run.status, run.runner) == (slot, 1, "running", "a")


async def test_a_retried_claim_with_the_same_token_still_wins(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot, "a")
    assert (await lease_backend.claim(r)).won
    again = await lease_backend.claim(r)  # as if the first answer was lost on the way
    assert (again.outcome, again.attempt) == (ClaimOutcome.WON, 1)
    assert (await lease_backend.claim(req(slot, "b"))).outcome is ClaimOutcome.RUNNING
    assert len(await lease_backend.history("job")) == 1


async def test_concurrent_claims_have_exactly_one_winner(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    backends = [lease_store[1].backend(namespace) for _ in range(4)]
    for b in backends:
        await b.start()
    try:
        slot = await backends[0].clock_ms()
        claims = [b.claim(req(slot, f"r{i}-{j}")) for j in range(5)
                  for i, b in enumerate(backends)]
        results = await asyncio.gather(*claims)
        outcomes = [r.outcome for r in results]
        assert outcomes.count(ClaimOutcome.WON) == 1
        assert set(outcomes) == {ClaimOutcome.WON, ClaimOutcome.RUNNING}
    finally:
        for b in backends:
            await b.stop()


async def test_finished_run_answers_done_and_is_in_history(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot, "a")
    assert (await lease_backend.claim(r)).won
    assert await lease_backend.finish(ref(r, 1), "success")
    assert (await lease_backend.claim(req(slot, "b"))).outcome is ClaimOutcome.DONE
    [run] = await lease_backend.history("job")
    assert run.status == "success"
    assert run.error is None
    assert run.finished_at is not None
    assert run.duration_ms is not None
    assert run.duration_ms >= 0
    assert not await lease_backend.finish(ref(r, 1), "failed"), "finishing twice must fail"


async def test_failed_run_keeps_its_error(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot)
    await lease_backend.claim(r)
    assert await lease_backend.finish(ref(r, 1), "failed", "ValueError: boom")
    [run] = await lease_backend.history("job")
    assert (run.status, run.error) == ("failed", "ValueError: boom")


async def test_expired_lease_is_taken_over_and_old_runner_is_fenced(
    lease_backend: Backend,
) -> None:
    slot = await slot_now(lease_backend)
    old = req(slot, "a")
    assert (await lease_backend.claim(old)).won
    await sleep_past_lease()
    new = req(slot, "b")
    taken = await lease_backend.claim(new)
    assert (taken.outcome, taken.attempt) == (ClaimOutcome.WON, 2)
    assert not await lease_backend.heartbeat(ref(old, 1), LEASE)
    assert not await lease_backend.finish(ref(old, 1), "success")
    assert not await lease_backend.release(ref(old, 1))
    assert await lease_backend.heartbeat(ref(new, 2), LEASE)
    assert await lease_backend.finish(ref(new, 2), "success")
    second, first = await lease_backend.history("job")
    assert (second.attempt, second.status, second.runner) == (2, "success", "b")
    assert (first.attempt, first.status, first.runner) == (1, "interrupted", "a")
    assert first.error


async def test_heartbeat_keeps_the_lease_alive(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot, "a")
    await lease_backend.claim(r)
    for _ in range(4):
        await asyncio.sleep(LEASE / 1000 / 3)
        assert await lease_backend.heartbeat(ref(r, 1), LEASE)
    assert (await lease_backend.claim(req(slot, "b"))).outcome is ClaimOutcome.RUNNING


async def test_max_attempts_ends_interrupted_for_good(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot, "a", max_attempts=2)
    await lease_backend.claim(r)
    await sleep_past_lease()
    r2 = req(slot, "b", max_attempts=2)
    assert (await lease_backend.claim(r2)).attempt == 2
    await sleep_past_lease()
    last = await lease_backend.claim(req(slot, "c", max_attempts=2))
    assert last.outcome is ClaimOutcome.DONE
    assert not await lease_backend.heartbeat(ref(r2, 2), LEASE)
    runs = await lease_backend.history("job")
    assert [(x.attempt, x.status) for x in runs] == [(2, "interrupted"), (1, "interrupted")]
    assert "max_attempts" in (runs[0].error or "")
    assert (await lease_backend.claim(req(slot, "d"))).outcome is ClaimOutcome.DONE


async def test_overlap_skips_and_records_the_slot_once(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    assert (await lease_backend.claim(req(slot, "a"))).won
    skipped = await lease_backend.claim(req(slot + 1000, "b"))
    assert skipped.outcome is ClaimOutcome.OVERLAP
    again = await lease_backend.claim(req(slot + 1000, "c"))
    assert again.outcome is ClaimOutcome.DONE
    runs = await lease_backend.history("job")
    assert [(x.slot, x.status) for x in runs] == [(slot + 1000, "skipped"), (slot, "running")]
    assert "overlap" in (runs[0].error or "")


async def test_overlap_allowed_runs_both(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    assert (await lease_backend.claim(req(slot, "a", overlap=True))).won
    assert (await lease_backend.claim(req(slot + 1000, "b", overlap=True))).won


async def test_expired_earlier_run_does_not_cause_overlap(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    await lease_backend.claim(req(slot, "a"))
    await sleep_past_lease()
    assert (await lease_backend.claim(req(slot + 1000, "b"))).won


async def test_late_first_claim_is_skipped(lease_backend: Backend) -> None:
    now = await slot_now(lease_backend)
    late = await lease_backend.claim(req(now - 5_000, "a", max_late_ms=1_000))
    assert late.outcome is ClaimOutcome.LATE
    assert (await lease_backend.claim(req(now - 5_000, "b", max_late_ms=1_000))).outcome \
        is ClaimOutcome.DONE
    [run] = await lease_backend.history("job")
    assert run.status == "skipped"
    assert "late" in (run.error or "")
    assert (await lease_backend.claim(req(now - 5_000, "c", job="other",
                                          max_late_ms=10_000))).won


async def test_claim_far_ahead_of_the_store_clock_is_refused_unrecorded(
    lease_backend: Backend,
) -> None:
    now = await slot_now(lease_backend)
    early = await lease_backend.claim(req(now + 30_000, "skewed"))
    assert early.outcome is ClaimOutcome.EARLY
    assert await lease_backend.history("job") == []
    assert (await lease_backend.claim(req(now + 500, "on-time"))).won


async def test_release_hands_over_at_once(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot, "a", lease_ms=60_000)
    await lease_backend.claim(r)
    assert await lease_backend.release(ref(r, 1))
    taken = await lease_backend.claim(req(slot, "b", lease_ms=60_000))
    assert (taken.outcome, taken.attempt) == (ClaimOutcome.WON, 2)


async def test_a_release_is_final(lease_backend: Backend) -> None:
    """No heartbeat or finish of a released attempt gives its lease back."""
    slot = await slot_now(lease_backend)
    r = req(slot, "a", lease_ms=60_000)
    await lease_backend.claim(r)
    assert await lease_backend.release(ref(r, 1))
    assert not await lease_backend.heartbeat(ref(r, 1), 60_000)
    assert not await lease_backend.finish(ref(r, 1), "success")
    assert await lease_backend.release(ref(r, 1)), "a retried release answers True again"
    taken = await lease_backend.claim(req(slot, "b", lease_ms=60_000))
    assert (taken.outcome, taken.attempt) == (ClaimOutcome.WON, 2)
    _, first = await lease_backend.history("job")
    assert (first.attempt, first.status) == (1, "interrupted")


async def test_a_heartbeat_sent_with_the_release_does_not_undo_it(
        lease_backend: Backend) -> None:
    """A heartbeat and the release of one attempt sent together (batched, in either order)."""
    for order in ("release first", "heartbeat first"):
        job = order.replace(" ", "-")
        slot = await slot_now(lease_backend)
        r = req(slot, "a", lease_ms=60_000, job=job)
        assert (await lease_backend.claim(r)).won
        release = lease_backend.release(ref(r, 1))
        beat = lease_backend.heartbeat(ref(r, 1), 60_000)
        if order == "release first":
            released, _ = await asyncio.gather(release, beat)
        else:
            _, released = await asyncio.gather(beat, release)
        assert released
        taken = await lease_backend.claim(req(slot, "b", lease_ms=60_000, job=job))
        assert (taken.outcome, taken.attempt) == (ClaimOutcome.WON, 2), order


async def test_released_run_reads_interrupted_until_taken_over(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot, "a", lease_ms=60_000)
    await lease_backend.claim(r)
    await lease_backend.release(ref(r, 1))
    [run] = await lease_backend.history("job")
    assert run.status == "interrupted"
    assert "handed over" in (run.error or "")
    await lease_backend.claim(req(slot, "b", lease_ms=60_000))
    _, first = await lease_backend.history("job")
    assert (first.attempt, first.status) == (1, "interrupted")
    assert "handed over" in (first.error or "")


async def test_manual_run_is_separate_from_the_scheduled_slot(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    assert (await lease_backend.claim(req(slot, "a"))).won
    manual = req(slot, "b", manual=True, overlap=True)
    assert (await lease_backend.claim(manual)).won
    assert await lease_backend.finish(ref(manual, 1), "success")
    runs = await lease_backend.history("job")
    assert {(x.manual, x.status) for x in runs} == {(True, "success"), (False, "running")}


async def test_live_manual_run_makes_scheduled_slot_overlap(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    assert (await lease_backend.claim(req(slot, "a", manual=True, overlap=True))).won
    assert (await lease_backend.claim(req(slot + 1, "b"))).outcome is ClaimOutcome.OVERLAP


async def test_history_is_newest_first_and_limited(lease_backend: Backend) -> None:
    base = await slot_now(lease_backend) - 10_000
    for i in range(5):
        r = req(base + i * 1000, overlap=True)
        await lease_backend.claim(r)
        await lease_backend.finish(ref(r, 1), "success")
    runs = await lease_backend.history("job", limit=3)
    assert [x.slot for x in runs] == [base + 4000, base + 3000, base + 2000]
    assert await lease_backend.history("nothing-here") == []


async def test_namespaces_never_see_each_other(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    one = lease_store[1].backend(namespace + "a")
    two = lease_store[1].backend(namespace + "b")
    await one.start()
    await two.start()
    try:
        slot = await one.clock_ms()
        assert (await one.claim(req(slot, "a"))).won
        assert (await two.claim(req(slot, "b"))).won
        assert [r.runner for r in await one.history("job")] == ["a"]
        assert [r.runner for r in await two.history("job")] == ["b"]
    finally:
        await one.stop()
        await two.stop()


async def test_history_is_trimmed_but_running_runs_stay(lease_backend: Backend) -> None:
    base = await slot_now(lease_backend) - 10_000_000
    lease_backend.configure_retention(Retention(history_size=5))
    running = req(base - 1000, "keeper", overlap=True, lease_ms=600_000, max_late_ms=None)
    assert (await lease_backend.claim(running)).won
    for i in range(300):
        r = req(base + i, overlap=True, max_late_ms=None)
        assert (await lease_backend.claim(r)).won
        await lease_backend.finish(ref(r, 1), "success")
    runs = await lease_backend.history("job", limit=1000)
    assert len(runs) < 300 / 2, "history was never trimmed"
    assert any(x.runner == "keeper" and x.status == "running" for x in runs)


async def test_trimming_keeps_runs_a_late_claim_could_ask_for(lease_backend: Backend) -> None:
    now = await slot_now(lease_backend)
    lease_backend.configure_retention(Retention(history_size=1, keep_ms=60_000))
    for i in range(200):
        r = req(now - 1000 + i, overlap=True)
        await lease_backend.claim(r)
        await lease_backend.finish(ref(r, 1), "success")
    assert len(await lease_backend.history("job", limit=1000)) == 200


async def test_history_ttl_drops_old_runs(lease_backend: Backend) -> None:
    # 700 runs older than the TTL, then 300 within it: trimming runs on a random ~5 % of
    # won claims, so one of the last 300 trims everything older (P(miss) ≈ 2e-7). Each side
    # is 50 s from the TTL's edge: the store's clock moves on while the 1,000 claims are
    # made (over 10 s on a loaded machine).
    now = await slot_now(lease_backend)
    lease_backend.configure_retention(Retention(history_ttl_ms=350_000))
    slots = [now - 1_100_000 + i * 1_000 for i in range(700)] + \
        [now - 300_000 + i * 1_000 for i in range(300)]
    for slot in slots:
        r = req(slot, overlap=True)
        await lease_backend.claim(r)
        await lease_backend.finish(ref(r, 1), "success")
    runs = await lease_backend.history("job", limit=2000)
    assert len(runs) >= 290
    assert min(x.slot for x in runs) >= now - 350_000


async def test_clock_is_close_to_local_time(lease_backend: Backend) -> None:
    assert abs(await lease_backend.clock_ms() - time.time() * 1000) < 5_000


async def test_newer_store_format_is_refused(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    handle = persistent_lease_store[1]
    assert handle.set_format is not None
    backend = handle.backend(namespace)
    await backend.start()
    await backend.stop()
    handle.set_format(namespace, "999")
    again = handle.backend(namespace)
    with pytest.raises(StoreFormatError) as info:
        await again.start()
    await again.stop()
    assert info.value.code == "ANARCHON_STORE_FORMAT"
    assert "999" in str(info.value)


# -- expired runs (orphan recovery) -------------------------------------------------------


async def test_expired_runs_lists_an_orphan_and_not_live_or_finished_runs(
    lease_backend: Backend,
) -> None:
    slot = await slot_now(lease_backend)
    orphan = req(slot - 3_000, "gone", overlap=True)
    live = req(slot - 2_000, "alive", overlap=True, lease_ms=60_000)
    done = req(slot - 1_000, "done", overlap=True)
    other_job = req(slot - 3_000, "gone", overlap=True, job="other")
    for r in (orphan, live, done, other_job):
        assert (await lease_backend.claim(r)).won
    assert await lease_backend.finish(ref(done, 1), "success")
    assert await lease_backend.expired_runs("job") == []  # every lease still live
    await sleep_past_lease()
    expired = await lease_backend.expired_runs("job")
    assert [(e.job, e.slot, e.attempt, e.manual) for e in expired] == [
        ("job", orphan.slot, 1, False)]
    # When the lease ended, by the store's clock: the start of the recovery window.
    until = expired[0].lease_until_ms
    assert until is not None
    assert slot - 1_000 <= until <= await lease_backend.clock_ms()
    # Claiming it, as a recovering instance does, takes it over as attempt 2.
    taken = await lease_backend.claim(req(orphan.slot, "new", overlap=True))
    assert (taken.outcome, taken.attempt) == (ClaimOutcome.WON, 2)
    assert await lease_backend.expired_runs("job") == []


async def test_expired_runs_is_bounded_by_limit_and_reports_manual_runs(
    lease_backend: Backend,
) -> None:
    slot = await slot_now(lease_backend)
    for i in range(5):
        assert (await lease_backend.claim(req(slot - 1_000 * i, "gone", overlap=True))).won
    manual = req(slot, "gone", manual=True, overlap=True)
    assert (await lease_backend.claim(manual)).won
    await sleep_past_lease()
    assert len(await lease_backend.expired_runs("job", limit=2)) == 2
    everything = await lease_backend.expired_runs("job", limit=100)
    assert len(everything) == 6
    assert [(e.slot, e.manual) for e in everything if e.manual] == [(slot, True)]


async def test_a_released_run_is_listed_as_expired_at_once(lease_backend: Backend) -> None:
    slot = await slot_now(lease_backend)
    r = req(slot, "a", lease_ms=60_000)
    assert (await lease_backend.claim(r)).won
    assert await lease_backend.expired_runs("job") == []
    assert await lease_backend.release(ref(r, 1))
    assert [(e.slot, e.attempt) for e in await lease_backend.expired_runs("job")] == [(slot, 1)]


# ---------------------------------------------------------------- the read model

async def test_meta_round_trips(lease_backend: Backend) -> None:
    await cases.meta_round_trips(lease_backend)


async def test_meta_size_is_checked(lease_backend: Backend) -> None:
    await cases.meta_size_is_checked(lease_backend)


async def test_runs_pages_are_stable_under_concurrent_writes(lease_backend: Backend) -> None:
    await cases.pages_are_stable_under_concurrent_writes(lease_backend)


async def test_runs_filters_apply_before_the_limit(lease_backend: Backend) -> None:
    await cases.filters_apply_before_the_limit(lease_backend)


async def test_job_names_lists_every_job_of_the_store(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    backends = [lease_store[1].backend(namespace) for _ in range(3)]
    for b in backends:
        await b.start()
    try:
        await cases.job_names_lists_the_store(*backends)
    finally:
        for b in backends:
            await b.stop()


async def test_expired_running_attempt_reads_interrupted_on_every_read_path(
    lease_backend: Backend,
) -> None:
    slot = await slot_now(lease_backend)
    assert (await lease_backend.claim(req(slot, "gone"))).won
    page = await lease_backend.runs(HistoryQuery(status="running"))
    assert [r.runner for r in page] == ["gone"]
    await sleep_past_lease()
    [run] = await lease_backend.history("job")
    assert (run.status, run.error) == ("interrupted", EXPIRED_READ)
    assert [r.status for r in await lease_backend.runs(HistoryQuery())] == ["interrupted"]
    assert [r.runner for r in await lease_backend.runs(HistoryQuery(status="interrupted"))] \
        == ["gone"]
    assert await lease_backend.runs(HistoryQuery(status="running")) == []
    newest = (await lease_backend.job_names())["job"]
    assert newest is not None
    assert newest.status == "interrupted"


async def test_read_only_backend_reads_and_refuses_writes(
    lease_store: tuple[StoreSpec, StoreHandle], lease_backend: Backend, namespace: str
) -> None:
    await cases.read_only_refuses_writes(lease_backend, lease_store[1].read_only(namespace))


async def test_read_only_backend_needs_a_store_that_was_set_up(
    persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    await cases.read_only_needs_a_store(persistent_lease_store[1].read_only(namespace))
