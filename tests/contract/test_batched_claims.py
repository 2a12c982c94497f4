"""Claims, heartbeats and finishes made at one instant, all at once, on every lease store.

Stores that batch concurrent calls into shared transactions (PostgreSQL, SQLite) must give
exactly the answers the decision table gives when the same calls are made one at a time:
the bursts below mix every row of the table, and their outcomes are compared with what a
sequential application yields, whatever order the store served them in.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from anarchon_core.backend import Backend, new_token
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.postgres import connections as pg_connections
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.backends.sqlstore import Batched
from anarchon_core.batching import rounds
from anarchon_core.errors import StoreError, StoreUnavailable
from anarchon_core.models import ClaimOutcome, ClaimRequest, ClaimResult, RunRef

from ..stores import StoreHandle, StoreSpec

pytestmark = pytest.mark.timeout(90)

LEASE = 600
#: Claims of the burst hold their lease longer than any burst takes.
LONG = 60_000
W, R, D = ClaimOutcome.WON, ClaimOutcome.RUNNING, ClaimOutcome.DONE


def req(job: str, slot: int, runner: str = "a", **kw: Any) -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner,
                        lease_ms=kw.pop("lease_ms", LEASE), **kw)


def ref(request: ClaimRequest, attempt: int = 1) -> RunRef:
    return RunRef(request.job, request.slot, request.token, attempt, request.manual)


def outcomes(pairs: list[tuple[ClaimRequest, ClaimResult]],
             key: Callable[[ClaimRequest], object]) -> dict[object, Counter[tuple[str, int]]]:
    """(outcome, attempt) counts per key."""
    out: dict[object, Counter[tuple[str, int]]] = {}
    for request, result in pairs:
        out.setdefault(key(request), Counter())[(result.outcome.value, result.attempt)] += 1
    return out


def first_then(first: ClaimOutcome, attempt: int, then: ClaimOutcome,
               n: int, then_attempt: int | None = None) -> Counter[tuple[str, int]]:
    """What ``n`` claims of one key get in any order: the first one ``first``, every
    later one ``then`` (the table's answer once the first one's write is there)."""
    return Counter({(first.value, attempt): 1,
                    (then.value, attempt if then_attempt is None else then_attempt): n - 1})


async def test_a_mixed_burst_gets_the_answers_of_the_sequential_table(
    lease_backend: Backend,
) -> None:
    now = await lease_backend.clock_ms()
    # Before the burst: a live lease, an expired one, one expired with no attempt left,
    # and a finished run.
    held = req("held", now - 5_000, "owner", lease_ms=60_000)
    expired = req("expired", now - 4_000, "gone")
    exhausted = req("exhausted", now - 4_000, "gone", max_attempts=1)
    finished = req("finished", now - 3_000, "done")
    for r in (held, expired, exhausted, finished):
        assert (await lease_backend.claim(r)).won
    assert await lease_backend.finish(ref(finished), "success")
    await asyncio.sleep(LEASE / 1000 + 0.25)
    now = await lease_backend.clock_ms()

    burst: list[ClaimRequest] = []
    burst += [req(f"many-{i}", now, f"r{i}", lease_ms=LONG) for i in range(250)]
    burst += [req("contended", now, f"c{i}", lease_ms=LONG) for i in range(20)]
    overlap_slots = [held.slot + 1_000 * k for k in range(1, 6)]
    burst += [req("held", s, f"o{i}") for s in overlap_slots for i in range(4)]
    burst += [req("held", held.slot, f"h{i}") for i in range(3)]
    burst += [req(f"late-{i}", now - 10_000, f"l{j}", max_late_ms=1_000)
              for i in range(10) for j in range(3)]
    burst += [req("early", now + 60_000, f"e{i}") for i in range(5)]
    burst += [req("expired", expired.slot, f"t{i}", lease_ms=LONG) for i in range(6)]
    burst += [req("exhausted", exhausted.slot, f"x{i}", max_attempts=1) for i in range(4)]
    burst += [req("finished", finished.slot, f"f{i}") for i in range(3)]
    retried = req("retried", now, "same", lease_ms=LONG)
    burst += [retried] * 4  # one claim whose answer was lost, retried with its token
    random.Random(7).shuffle(burst)
    assert len(burst) >= 300

    results = await asyncio.gather(*(lease_backend.claim(r) for r in burst))
    got = outcomes(list(zip(burst, results, strict=True)), lambda r: (r.job, r.slot))

    expected: dict[object, Counter[tuple[str, int]]] = {}
    for i in range(250):
        expected[(f"many-{i}", now)] = Counter({("won", 1): 1})
    expected[("contended", now)] = first_then(W, 1, R, 20)
    for s in overlap_slots:  # a live lease elsewhere: the first skips, then it is done
        expected[("held", s)] = first_then(ClaimOutcome.OVERLAP, 1, D, 4)
    expected[("held", held.slot)] = Counter({("running", 1): 3})
    for i in range(10):
        expected[(f"late-{i}", now - 10_000)] = first_then(ClaimOutcome.LATE, 1, D, 3)
    expected[("early", now + 60_000)] = Counter({("early", 0): 5})
    expected[("expired", expired.slot)] = first_then(W, 2, R, 6)
    expected[("exhausted", exhausted.slot)] = Counter({("done", 1): 4})
    expected[("finished", finished.slot)] = Counter({("done", 1): 3})
    expected[("retried", now)] = Counter({("won", 1): 4})
    assert got == expected

    # Every won claim's token is the caller's own; what was recorded is in history.
    for r, result in zip(burst, results, strict=True):
        assert result.token == (r.token if result.won else None)
    assert [(x.slot, x.status) for x in await lease_backend.history("held", limit=20)] == [
        *((s, "skipped") for s in reversed(overlap_slots)), (held.slot, "running")]
    assert await lease_backend.history("early") == []
    [late] = await lease_backend.history("late-3")
    assert (late.status, late.attempt) == ("skipped", 1)
    assert "late" in (late.error or "")
    second, first = await lease_backend.history("expired")
    assert (second.attempt, second.status, first.status) == (2, "running", "interrupted")
    [gave_up] = await lease_backend.history("exhausted")
    assert gave_up.status == "interrupted"
    assert "max_attempts" in (gave_up.error or "")
    assert [(x.attempt, x.runner) for x in await lease_backend.history("retried")] == [
        (1, "same")]


async def test_heartbeats_and_finishes_of_many_runs_at_once_all_land(
    lease_backend: Backend,
) -> None:
    now = await lease_backend.clock_ms()
    runs = [req(f"job-{i}", now, f"r{i}", lease_ms=LONG) for i in range(150)]
    assert all(r.won for r in await asyncio.gather(*(lease_backend.claim(r) for r in runs)))
    stale = req("job-0", now, "stale")  # a token that never held the run: fenced
    beats = await asyncio.gather(*(lease_backend.heartbeat(ref(r), LONG) for r in runs),
                                 lease_backend.heartbeat(ref(stale), LONG))
    assert beats == [True] * len(runs) + [False]

    def end(i: int) -> tuple[str, str | None]:
        return ("failed", f"ValueError: {i}") if i % 3 == 0 else ("success", None)

    finishes = [lease_backend.finish(ref(r), *end(i), meta={"i": str(i)})
                for i, r in enumerate(runs)]
    # The same run ended twice in one burst: one of the calls counts, the other is fenced.
    finishes.append(lease_backend.finish(ref(runs[1]), *end(1), meta={"i": "1"}))
    done = await asyncio.gather(*finishes)
    assert done[:1] + done[2:-1] == [True] * (len(runs) - 1)
    assert sorted([done[1], done[-1]]) == [False, True]
    for i, r in enumerate(runs):
        [run] = await lease_backend.history(r.job)
        assert (run.status, run.error, run.meta) == (*end(i), {"i": str(i)})
    handed = [req(f"handed-{i}", now, "a", lease_ms=LONG) for i in range(40)]
    assert all(r.won for r in await asyncio.gather(*(lease_backend.claim(r) for r in handed)))
    assert all(await asyncio.gather(*(lease_backend.release(ref(r)) for r in handed)))
    taken = await asyncio.gather(*(lease_backend.claim(req(r.job, now, "b", lease_ms=LONG))
                                   for r in handed))
    assert [(t.outcome, t.attempt) for t in taken] == [(W, 2)] * len(handed)


async def test_instances_claiming_the_same_jobs_at_once_never_deadlock(
    lease_store: tuple[StoreSpec, StoreHandle], namespace: str,
) -> None:
    """Several instances batch the same 120 jobs in different orders: one winner each."""
    backends = [lease_store[1].backend(namespace) for _ in range(3)]
    for b in backends:
        await b.start()
    try:
        slot = await backends[0].clock_ms()
        calls = []
        for n, b in enumerate(backends):
            jobs = [f"j{i}" for i in range(120)]
            random.Random(n).shuffle(jobs)
            calls += [(job, b.claim(req(job, slot, f"i{n}", lease_ms=LONG))) for job in jobs]
        results = await asyncio.gather(*(call for _, call in calls))
        by_job: dict[str, list[ClaimOutcome]] = {}
        for (job, _), result in zip(calls, results, strict=True):
            by_job.setdefault(job, []).append(result.outcome)
        assert all(sorted(o.value for o in v) == ["running", "running", "won"]
                   for v in by_job.values()), by_job
    finally:
        for b in backends:
            await b.stop()


# -- the SQL stores batch: fewer transactions than calls ----------------------------------

SQL_STORES = ["sqlite", "postgres"]


@pytest.fixture(params=SQL_STORES)
async def sql_backend(request: pytest.FixtureRequest,
                      store_handles: Callable[[str], StoreHandle],
                      namespace: str) -> AsyncIterator[SqliteBackend | PostgresBackend]:
    backend = store_handles(request.param).backend(namespace)
    assert isinstance(backend, SqliteBackend | PostgresBackend)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


async def test_a_burst_goes_out_in_far_fewer_transactions_than_calls(
    sql_backend: SqliteBackend | PostgresBackend,
) -> None:
    def transactions(calls: Batched[Any, Any]) -> int:
        return calls.batcher.batches + calls.alone

    now = await sql_backend.clock_ms()
    runs = [req(f"job-{i}", now, overlap=i % 2 == 0, lease_ms=LONG) for i in range(500)]
    before, calls = transactions(sql_backend._claims), sql_backend._claims.batcher.calls
    results = await asyncio.gather(*(sql_backend.claim(r) for r in runs))
    assert all(r.won for r in results)
    made = transactions(sql_backend._claims) - before
    # The first call of the burst goes out alone, the others in batches.
    assert sql_backend._claims.batcher.calls - calls == 499
    assert made <= 500 / 20, f"{made} transactions for 500 claims"
    before = transactions(sql_backend._updates)
    assert all(await asyncio.gather(*(sql_backend.finish(ref(r), "success") for r in runs)))
    assert transactions(sql_backend._updates) - before <= 500 / 20
    assert {x.status for r in runs[::50] for x in await sql_backend.history(r.job)} == {
        "success"}


async def test_a_call_the_store_refuses_fails_alone(
    sql_backend: SqliteBackend | PostgresBackend,
) -> None:
    now = await sql_backend.clock_ms()
    good = [req(f"job-{i}", now, lease_ms=LONG) for i in range(30)]
    # No bigint holds this slot: the store refuses the claim (not a transient failure).
    bad = req("bad", -(2 ** 70), overlap=True)
    results = await asyncio.gather(*(sql_backend.claim(r) for r in [*good[:15], bad,
                                                                   *good[15:]]),
                                   return_exceptions=True)
    failed = results.pop(15)
    assert isinstance(failed, StoreError)
    assert not isinstance(failed, StoreUnavailable)
    assert all(isinstance(r, ClaimResult) and r.won for r in results), results
    assert [x.runner for x in await sql_backend.history("job-20")] == ["a"]


async def test_a_transient_failure_reaches_every_caller_of_the_batch_and_a_retry_wins(
    store_handles: Callable[[str], StoreHandle], namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = store_handles("postgres").backend(namespace)
    assert isinstance(backend, PostgresBackend)
    await backend.start()
    now = await backend.clock_ms()
    real = pg_connections.drive_async
    transactions = 0

    async def drive(*args: Any) -> Any:
        nonlocal transactions
        result = await real(*args)
        transactions += 1
        if transactions == 2:  # the batch: committed, then the answer is lost
            raise psycopg.OperationalError("server closed the connection")
        return result

    monkeypatch.setattr(pg_connections, "drive_async", drive)
    try:
        runs = [req(f"job-{i}", now, lease_ms=LONG) for i in range(40)]
        # The first claim of the burst goes out alone, the other 39 in one batch.
        lone, *batch = await asyncio.gather(*(backend.claim(r) for r in runs),
                                            return_exceptions=True)
        assert isinstance(lone, ClaimResult)
        assert lone.won
        assert all(isinstance(r, StoreUnavailable) for r in batch), batch
        # Each caller retries with its own token: its own attempt, recorded once.
        again = await asyncio.gather(*(backend.claim(r) for r in runs[1:]))
        assert [(r.outcome, r.attempt) for r in again] == [(W, 1)] * 39
        assert [x.runner for x in await backend.history("job-7")] == ["a"]
    finally:
        await backend.stop()


def test_rounds_hold_one_call_per_key_and_keep_each_keys_order() -> None:
    items = ["a1", "b1", "a2", "c1", "a3", "b2"]
    assert rounds(items, lambda s: s[0]) == [[0, 1, 3], [2, 5], [4]]
    assert rounds([], lambda s: s) == []
