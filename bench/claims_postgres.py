"""PostgreSQL claim benchmark: latency (median, p99) and claims/s beside the floor.

    python -m bench.claims_postgres [--url postgresql://postgres@127.0.0.1/test]
                                    [--count 2000] [--concurrency 16] [--history 200000]
                                    [--smoke]

The backend is built from the URL, as most users build it (one connection of its own); the
floor is a plain ``INSERT ... ON CONFLICT DO NOTHING`` (autocommit, one round trip) over
that same connection, measured in the same run: interleaved with the calls of each row
but the pool one (a floor call, then the row's calls, in turn), and each ratio is taken
against the floor of its own interleaving (the floor row printed is the first). Rows:

* ``claim won``: a fresh run, the full path (lock, clock, state, overlap check, insert);
* ``claim won, N rows of history``: the same after ``--history`` finished runs were added
  to the table (the indexes should keep it flat);
* ``claim lost (backup check)``: claiming a run another instance holds (what backups do
  every 1-2 heartbeats);
* ``heartbeat``: extending a lease (of those held runs: thousands running in one job; the
  table is analyzed once they are claimed, as autovacuum keeps a table in use);
* ``claim won, pool of 4``: throughput when the backend is given a 4-connection pool.

Latency is measured one call at a time; ops/s with ``--concurrency`` calls in flight. A
second table fires ``--count`` claims of distinct jobs due at one instant all at once,
then their finishes, and reports how long each burst took and in how many transactions
(calls made together share one), beside the same rows written by single-row INSERTs one
after another and by one INSERT of all the rows.

Tables are created under a fresh name and dropped at the end. Every claimed slot is in the
past (long due, no ``max_late_ms``), so the store never refuses one as ``early``.
``--smoke`` runs the whole table with tiny counts (see ``bench/common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from anarchon_core.backend import new_token
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.sqlstore import Batched
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef
from anarchon_core.url import mask_url

from .common import (
    SMOKE_CONCURRENCY,
    SMOKE_COUNT,
    Measurement,
    add_smoke_flag,
    interleaved,
    measure,
    print_table,
    warmup_for,
)

DEFAULT_URL = os.environ.get("ANARCHON_BENCH_POSTGRES_URL",
                             "postgresql://postgres@127.0.0.1:5432/test")
BASE_SLOT = 10**12  # 2001-09-09: due long ago
SMOKE_HISTORY = 1_000


def claim_request(job: str, slot: int, runner: str = "bench", *,
                  overlap: bool = False) -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner, lease_ms=600_000,
                        overlap=overlap)


async def run(url: str, count: int, concurrency: int, history: int) -> None:
    table = f"bench_{uuid.uuid4().hex[:10]}"
    floor_table = sql.Identifier(f"{table}_floor")
    backend = PostgresBackend(url, table=table)
    await backend.start()
    # The floor runs on the connection the backend's calls use one after another (its
    # first own connection; concurrent calls may open up to OWN_CONNECTIONS more).
    conn = backend._source.slots[0].conn  # type: ignore[attr-defined]
    assert isinstance(conn, psycopg.AsyncConnection)
    try:
        await conn.execute(sql.SQL(
            "CREATE TABLE {} (job TEXT, slot BIGINT, PRIMARY KEY (job, slot))").format(floor_table))
        floor_sql = sql.SQL(
            "INSERT INTO {} (job, slot) VALUES (%s, %s) ON CONFLICT DO NOTHING"
        ).format(floor_table)
        kw = {"count": count, "concurrency": concurrency}
        warmup = warmup_for(count)
        floor_name = "floor: INSERT ON CONFLICT"

        def floor_of(phase: str) -> Callable[[int], Awaitable[None]]:
            async def floor(i: int) -> None:
                await conn.execute(floor_sql, (phase, BASE_SLOT + i))
            return floor

        async def claim_won(i: int, tag: str = "a") -> None:
            # A job per call: every claim takes the full path, overlap check included.
            result = await backend.claim(claim_request(f"{tag}{i}", BASE_SLOT))
            assert result.won, result

        floor_row, won_row = await interleaved(
            {floor_name: floor_of("a"), "claim won": claim_won}, count, concurrency, warmup)
        rows = [won_row]

        # Backups: every slot is first won by "owner", then claimed by the measured caller.
        held: dict[int, ClaimRequest] = {}
        for i in range(-warmup_for(count), 2 * count):
            held[i] = claim_request("held", BASE_SLOT + i * 1000, "owner", overlap=True)
            assert (await backend.claim(held[i])).won
        # Statistics, as autovacuum keeps them on a table in use: without any, the planner
        # may read one run of a job with thousands running through the index of running
        # runs (every running run of the job) instead of the primary key.
        await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))

        async def claim_lost(i: int) -> None:
            result = await backend.claim(claim_request("held", held[i].slot, overlap=True))
            assert result.outcome is ClaimOutcome.RUNNING, result

        async def heartbeat(i: int) -> None:
            r = held[i]
            assert await backend.heartbeat(RunRef(r.job, r.slot, r.token, 1), 600_000)

        rows += (await interleaved({floor_name: floor_of("b"),
                                    "claim lost (backup check)": claim_lost,
                                    "heartbeat": heartbeat}, count, concurrency, warmup))[1:]

        if history:
            await conn.execute(sql.SQL(
                "INSERT INTO {} (job, slot, manual, attempt, token, status, runner, "
                "lease_until, started_at, finished_at, error) "
                "SELECT 'h' || (i %% 50), i, 0, 1, 't', 'success', 'r', NULL, i, i + 5, NULL "
                "FROM generate_series(1, %s) i").format(sql.Identifier(table)),
                (history,))
            await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
            rows += (await interleaved({floor_name: floor_of("c"),
                                        f"claim won, {history} rows of history":
                                        lambda i: claim_won(i, "b")},
                                       count, concurrency, warmup))[1:]

        pool = AsyncConnectionPool(url, min_size=4, max_size=4, open=False,
                                   kwargs={"autocommit": True})
        await pool.open(wait=True, timeout=30)
        try:
            pooled = PostgresBackend(pool, table=table)

            async def claim_pooled(i: int) -> None:
                result = await pooled.claim(claim_request(f"c{i}", BASE_SLOT))
                assert result.won, result

            rows.append(await measure("claim won, pool of 4", claim_pooled, **kw))
        finally:
            await pool.close()

        burst_rows = await bursts(backend, conn, floor_table, count)

        print_table(
            f"PostgreSQL claims ({mask_url(url)}, {count} sequential calls for latency, "
            f"{count} with {concurrency} in flight for ops/s)",
            [*rows, floor_row], floor=floor_row,
        )
        print_claims_per_second(rows, floor_row)
        print_bursts(count, burst_rows)
    finally:
        for name in (table, f"{table}_meta", f"{table}_floor"):
            await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        await backend.stop()


async def bursts(backend: PostgresBackend, conn: psycopg.AsyncConnection[object],
                 floor_table: sql.Identifier, size: int) -> list[tuple[str, float, int]]:
    """``size`` claims due at one instant, all in flight at once, then their finishes;
    and the floors: as many single-row INSERTs one after another, one INSERT of them all.

    Each row: (name, seconds, transactions).
    """
    def transactions(calls: Batched[Any, Any]) -> int:
        return calls.batcher.batches + calls.alone

    requests = [claim_request(f"burst{i}", BASE_SLOT) for i in range(size)]
    out = []
    before, started = transactions(backend._claims), time.perf_counter()
    results = await asyncio.gather(*(backend.claim(r) for r in requests))
    out.append(("claims (each won)", time.perf_counter() - started,
                transactions(backend._claims) - before))
    assert all(r.won for r in results), "a claim of the burst was not won"
    before, started = transactions(backend._updates), time.perf_counter()
    ended = await asyncio.gather(*(backend.finish(RunRef(r.job, r.slot, r.token, 1), "success")
                                   for r in requests))
    out.append(("finishes", time.perf_counter() - started,
                transactions(backend._updates) - before))
    assert all(ended), "a finish of the burst was fenced"
    one = sql.SQL("INSERT INTO {} (job, slot) VALUES (%s, %s) ON CONFLICT DO NOTHING").format(
        floor_table)
    started = time.perf_counter()
    for i in range(size):
        await conn.execute(one, ("burst-one", i))
    out.append(("floor: single-row INSERTs in turn", time.perf_counter() - started, size))
    started = time.perf_counter()
    await conn.execute(sql.SQL(
        "INSERT INTO {} (job, slot) SELECT 'burst-all', i FROM generate_series(1, %s) i "
        "ON CONFLICT DO NOTHING").format(floor_table), (size,))
    out.append(("floor: one INSERT of every row", time.perf_counter() - started, 1))
    return out


def print_bursts(size: int, rows: list[tuple[str, float, int]]) -> None:
    print(f"\nA burst of {size} calls due at one instant, all in flight at once")
    header = f"{'operation':<34} {'total ms':>10} {'calls/s':>10} {'transactions':>13}"
    print(header)
    print("-" * len(header))
    for name, seconds, transactions in rows:
        print(f"{name:<34} {seconds * 1000:>10.1f} {size / seconds:>10.0f} {transactions:>13}")


def print_claims_per_second(rows: list[Measurement], floor: Measurement) -> None:
    print(f"\nthroughput ÷ floor: {rows[0].name}: {rows[0].per_second / floor.per_second:.2f}"
          f" ({rows[0].per_second:.0f} vs {floor.per_second:.0f} ops/s on one connection)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--history", type=int, default=200_000)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.count, args.concurrency = SMOKE_COUNT, SMOKE_CONCURRENCY
        args.history = SMOKE_HISTORY
    asyncio.run(run(args.url, args.count, args.concurrency, args.history))


if __name__ == "__main__":
    main()
