"""The claim-only backend contract on every claim-only store.

A claim-only backend answers ``won`` to the first claim of a run and ``taken`` to every
other, keeps a history ``history()`` can read, refuses late first claims, keeps manual
runs apart, isolates namespaces and refuses a newer store format. Every test drives the
backend directly, except the last ones, which check that the scheduler refuses the
lease-only options on it.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from anarchon_core import Scheduler
from anarchon_core.backend import Backend, new_token
from anarchon_core.errors import ConfigError, StoreFormatError
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from ..stores import StoreHandle, StoreSpec
from . import readmodel_cases as cases

pytestmark = pytest.mark.timeout(60)


def req(slot: int, runner: str = "a", **kw: object) -> ClaimRequest:
    kw.setdefault("max_late_ms", 60_000)
    return ClaimRequest(job=str(kw.pop("job", "job")), slot=slot, token=new_token(),
                        runner=runner, **kw)  # type: ignore[arg-type]


def ref(request: ClaimRequest) -> RunRef:
    return RunRef(request.job, request.slot, request.token, 1, request.manual)


async def test_backend_says_it_has_no_leases(claim_backend: Backend) -> None:
    assert claim_backend.supports_leases is False


async def test_first_claim_wins_and_every_other_is_taken(claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    first = await claim_backend.claim(req(slot, "a"))
    assert first.outcome is ClaimOutcome.WON
    assert first.attempt == 1
    for runner in ("b", "c", "a"):
        assert (await claim_backend.claim(req(slot, runner))).outcome is ClaimOutcome.TAKEN
    [run] = await claim_backend.history("job")
    assert (run.slot, run.attempt, run.status, run.runner, run.manual) == \
        (slot, 1, "running", "a", False)
    assert run.started_at is not None
    assert run.finished_at is None


async def test_concurrent_claims_from_many_backends_have_one_winner(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    backends = [claim_store[1].backend(namespace) for _ in range(4)]
    for b in backends:
        await b.start()
    try:
        base = await backends[0].clock_ms()
        for k in range(5):
            slot = base + k * 1000
            claims = [b.claim(req(slot, f"r{i}-{j}")) for j in range(5)
                      for i, b in enumerate(backends)]
            outcomes = [r.outcome for r in await asyncio.gather(*claims)]
            assert outcomes.count(ClaimOutcome.WON) == 1, outcomes
            assert outcomes.count(ClaimOutcome.TAKEN) == len(outcomes) - 1, outcomes
        runs = await backends[1].history("job")
        assert sorted(r.slot for r in runs) == [base + k * 1000 for k in range(5)]
    finally:
        for b in backends:
            await b.stop()


async def test_finished_run_is_in_history_with_its_runner(claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    r = req(slot, "host-1:42")
    assert (await claim_backend.claim(r)).won
    await asyncio.sleep(0.02)
    assert await claim_backend.finish(ref(r), "success")
    assert (await claim_backend.claim(req(slot, "b"))).outcome is ClaimOutcome.TAKEN
    [run] = await claim_backend.history("job")
    assert (run.status, run.runner, run.error, run.manual) == \
        ("success", "host-1:42", None, False)
    assert run.finished_at is not None
    assert run.duration_ms is not None
    assert run.duration_ms >= 0


async def test_a_run_ends_once(claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    r = req(slot)
    assert (await claim_backend.claim(r)).won
    assert await claim_backend.finish(ref(r), "success")
    assert not await claim_backend.finish(ref(r), "failed", "late echo")
    [run] = await claim_backend.history("job")
    assert (run.status, run.error) == ("success", None)


async def test_only_the_winner_can_finish(claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    winner, loser = req(slot, "a"), req(slot, "b")
    assert (await claim_backend.claim(winner)).won
    assert not (await claim_backend.claim(loser)).won
    assert not await claim_backend.finish(ref(loser), "success")
    [run] = await claim_backend.history("job")
    assert (run.status, run.runner) == ("running", "a")


async def test_failed_run_keeps_its_error(claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    r = req(slot)
    await claim_backend.claim(r)
    assert await claim_backend.finish(ref(r), "failed", "ValueError: boom ✗")
    [run] = await claim_backend.history("job")
    assert (run.status, run.error) == ("failed", "ValueError: boom ✗")


async def test_manual_run_is_separate_from_the_scheduled_slot(claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    assert (await claim_backend.claim(req(slot, "a"))).won
    manual = req(slot, "b", manual=True, max_late_ms=None)
    assert (await claim_backend.claim(manual)).won
    again = req(slot, "c", manual=True, max_late_ms=None)
    assert (await claim_backend.claim(again)).outcome is ClaimOutcome.TAKEN
    assert await claim_backend.finish(ref(manual), "success")
    runs = await claim_backend.history("job")
    assert {(x.manual, x.status, x.runner) for x in runs} == \
        {(True, "success", "b"), (False, "running", "a")}


async def test_history_is_newest_first_limited_and_per_job(claim_backend: Backend) -> None:
    base = await claim_backend.clock_ms()
    for i in range(5):
        r = req(base + i * 1000)
        assert (await claim_backend.claim(r)).won
        await claim_backend.finish(ref(r), "success")
    other = req(base + 10_000, job="other")
    assert (await claim_backend.claim(other)).won
    runs = await claim_backend.history("job", limit=3)
    assert [x.slot for x in runs] == [base + 4000, base + 3000, base + 2000]
    assert all(x.job == "job" for x in runs)
    assert len(await claim_backend.history("job", limit=100)) == 5
    assert [x.slot for x in await claim_backend.history("other")] == [base + 10_000]
    assert await claim_backend.history("nothing-here") == []


async def test_history_finds_the_newest_runs_among_many(claim_backend: Backend) -> None:
    base = await claim_backend.clock_ms() - 500_000
    for i in range(120):
        r = req(base + i * 1000, max_late_ms=None)
        assert (await claim_backend.claim(r)).won
        if i % 3 == 0:
            await claim_backend.finish(ref(r), "success")
        b = req(base + i * 1000, job="noise", max_late_ms=None)
        assert (await claim_backend.claim(b)).won
    runs = await claim_backend.history("job", limit=10)
    assert [x.slot for x in runs] == [base + i * 1000 for i in range(119, 109, -1)]
    assert {x.status for x in runs if (x.slot - base) // 1000 % 3 == 0} == {"success"}
    assert {x.status for x in runs if (x.slot - base) // 1000 % 3 != 0} == {"running"}


async def test_odd_job_names_round_trip(claim_backend: Backend) -> None:
    slot = await claim_backend.clock_ms()
    names = ["report:daily/eu ü.x", "a.b", "a", "tenant-42_sync", "*>~ 7"]
    for name in names:
        assert (await claim_backend.claim(req(slot, job=name))).won
    for name in names:
        assert not (await claim_backend.claim(req(slot, "z", job=name))).won
        [run] = await claim_backend.history(name)
        assert (run.job, run.slot, run.runner) == (name, slot, "a")


async def test_late_first_claim_never_runs(claim_backend: Backend) -> None:
    now = await claim_backend.clock_ms()
    late = await claim_backend.claim(req(now - 5_000, "a", max_late_ms=1_000))
    assert late.outcome is ClaimOutcome.LATE
    again = await claim_backend.claim(req(now - 5_000, "b", max_late_ms=1_000))
    assert not again.won
    for run in await claim_backend.history("job"):
        assert run.slot == now - 5_000
        assert run.status == "skipped"
        assert "late" in (run.error or "")
    on_time = await claim_backend.claim(req(now - 5_000, "c", job="other", max_late_ms=10_000))
    assert on_time.won


async def test_namespaces_never_see_each_other(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    one = claim_store[1].backend(namespace + "a")
    two = claim_store[1].backend(namespace + "b")
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


async def test_clock_is_close_to_local_time(claim_backend: Backend) -> None:
    assert abs(await claim_backend.clock_ms() - time.time() * 1000) < 5_000


async def test_newer_store_format_is_refused(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    handle = claim_store[1]
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
    handle.set_format(namespace, "1")
    same = handle.backend(namespace)
    await same.start()
    await same.stop()


def _noop(ctx: object) -> None:
    return None


@pytest.mark.parametrize("option", ["lease_ms", "heartbeat_ms"])
def test_scheduler_refuses_lease_timings(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str, option: str
) -> None:
    backend = claim_store[1].backend(namespace)
    with pytest.raises(ConfigError, match=option):
        Scheduler(backend, **{option: 3_000})


@pytest.mark.parametrize(("option", "value"),
                         [("overlap", True), ("overlap", False), ("overlap", "skip"),
                          ("overlap", "allow"), ("overlap", "buffer_one"),
                          ("overlap", "cancel_other"), ("max_attempts", 2),
                          ("catch_up_ms", 60_000), ("catch_up", "all"),
                          ("catch_up", "none"), ("catch_up", "newest")])
def test_scheduler_refuses_lease_only_job_options(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str, option: str, value: object
) -> None:
    """A claim-only store keeps no lease, so no overlap or catch-up policy: each is refused
    by its name and value, at definition."""
    scheduler = Scheduler(claim_store[1].backend(namespace))
    named = f"{option}={value!r}" if option in ("overlap", "catch_up") else option
    expected = re.escape(f"option(s) {named} need a lease backend")
    with pytest.raises(ConfigError, match=expected):
        scheduler.every("tick", "10s", _noop, **{option: value})
    with pytest.raises(ConfigError, match=expected):
        scheduler.cron("report", "0 8 * * *", _noop, **{option: value})
    scheduler.every("tick", "10s", _noop, max_late_ms=5_000, jitter_ms=100)
    assert [j.name for j in scheduler.jobs()] == ["tick"]


# ---------------------------------------------------------------- the read model

async def test_meta_round_trips(claim_backend: Backend) -> None:
    await cases.meta_round_trips(claim_backend)


async def test_meta_size_is_checked(claim_backend: Backend) -> None:
    await cases.meta_size_is_checked(claim_backend)


async def test_runs_pages_are_stable_under_concurrent_writes(claim_backend: Backend) -> None:
    await cases.pages_are_stable_under_concurrent_writes(claim_backend)


async def test_runs_filters_apply_before_the_limit(claim_backend: Backend) -> None:
    await cases.filters_apply_before_the_limit(claim_backend)


async def test_job_names_lists_every_job_of_the_store(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    backends = [claim_store[1].backend(namespace) for _ in range(3)]
    for b in backends:
        await b.start()
    try:
        await cases.job_names_lists_the_store(*backends)
    finally:
        for b in backends:
            await b.stop()


async def test_read_only_backend_reads_and_refuses_writes(
    claim_store: tuple[StoreSpec, StoreHandle], claim_backend: Backend, namespace: str
) -> None:
    await cases.read_only_refuses_writes(claim_backend, claim_store[1].read_only(namespace))


async def test_read_only_backend_needs_a_store_that_was_set_up(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str
) -> None:
    await cases.read_only_needs_a_store(claim_store[1].read_only(namespace))
