"""Claim latency and throughput of each Redis strategy beside the floor ``SET NX PX``.

    .venv/bin/python -m bench.claims_redis [--url redis://127.0.0.1:6379/0] [--count 2000]
        [--concurrency 16] [--smoke]

For every strategy, over the same ``redis.asyncio`` client anarchon opens: the strategy's
claim of a fresh run (the winning path; 100 jobs in turn, as a service with many jobs
would), for ``lease`` also a backup's check of a live run (the ``running`` answer), and
the floor ``SET <key> <token> NX PX 30000``, the cheapest atomic "first writer wins" Redis
has. For ``lease``, two more rows split a claim's cost above the floor. "Its six commands
alone" is the least a claim script on the documented key layout can cost: it makes only
the commands a won claim makes (``TIME``, ``HGET`` of the run's state, then one write to
each of ``state``, ``active``, ``slots`` and ``runs``) and decides nothing. "Its script
alone" is the claim script with its arguments built beforehand. The script row minus the
six commands' row is the decision table's part; the claim row minus the script row is the
Python that builds the call and reads the answer.
Latencies are taken one call at a time with the floor and the claims interleaved, so that
noise from other processes hits both alike; ops/s is a separate batch with
``--concurrency`` calls in flight. The last column is the median over the floor's median
(target for the lease claim: ≤ 1.2). Keys go under a fresh prefix and are deleted afterwards.

Slots are due ones, as the scheduler claims them: every call claims its own slot, all of
them in the few seconds before the store's clock as read at the start (a slot more than
a second ahead of that clock is refused as ``early``). ``--smoke`` runs every table with
tiny counts (see ``bench/common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import replace

from anarchon_core.backend import new_token
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis.clients import Commands, LuaScript
from anarchon_core.backends.redis.keys import LEASE_PARTS, redis_key
from anarchon_core.backends.redis.lease import claim_call
from anarchon_core.models import ClaimOutcome, ClaimRequest

from .common import (
    SMOKE_CONCURRENCY,
    SMOKE_COUNT,
    Measurement,
    Op,
    add_smoke_flag,
    interleaved,
    print_table,
    warmup_for,
)

JOBS = 100
#: The six commands of a won lease claim (the documented key layout), with no decision around them.
SIX_COMMANDS = """
redis.call('TIME')
redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 1000, '*', 'slot', ARGV[1], 'manual', '0',
           'attempt', '1', 'status', 'running', 'runner', 'bench', 'token', ARGV[2])
return {'won', 1, ARGV[1]}
"""
SIX_COMMANDS_ROW = "lease: its six commands alone"
SCRIPT_ROW = "lease: its script alone"


async def bench_strategy(url: str, strategy: str, count: int,
                         concurrency: int) -> list[Measurement]:
    prefix = f"bench-{secrets.token_hex(4)}:"
    backend = RedisBackend(url, strategy=strategy, prefix=prefix)
    await backend.start()
    conn = backend._conn
    assert conn is not None
    warmup = warmup_for(count)
    # Call i (from -warmup to 2*count - 1) claims slot `due + i`: one slot per call, the
    # last one a millisecond before the store's clock, increasing per job (the stream-id
    # strategy refuses a slot below one it already holds).
    due = await backend.clock_ms() - 2 * count

    def request(i: int, runner: str) -> ClaimRequest:
        return ClaimRequest(job=f"job{i % JOBS}", slot=due + i, token=new_token(),
                            runner=runner, overlap=True, max_late_ms=None)

    async def floor(i: int) -> object:
        result = await conn.call("SET", f"{prefix}floor:{i}", new_token(), "NX", "PX", 30_000)
        assert result is not None, "SET NX refused a fresh key"
        return result

    async def claim(i: int) -> object:
        result = await backend.claim(request(i, "bench"))
        assert result.outcome is ClaimOutcome.WON, result
        return result

    async def backup(i: int) -> object:
        result = await backend.claim(request(i, "backup"))  # the run claim(i) just won
        assert result.outcome is ClaimOutcome.RUNNING, result
        return result

    ops: dict[str, Op] = {"floor: SET NX PX 30000": floor, f"{strategy}: claim (wins)": claim}
    if strategy == "lease":
        ops["lease: claim (running: backup)"] = backup
        sha = await conn.call("SCRIPT", "LOAD", SIX_COMMANDS)
        # The run's state as a won claim writes it; keys of the same layout, other jobs.
        state = json.dumps({"a": "1", "s": "running", "l": str(due + 30_000),
                            "t": new_token(), "r": "bench", "b": str(due)})
        calls = {i: (*(redis_key(prefix, part, f"six{i % JOBS}", tagged=True)
                       for part in LEASE_PARTS), str(due + i), state)
                 for i in range(-warmup, 2 * count)}

        async def six_commands(i: int) -> object:
            return await conn.call("EVALSHA", sha, len(LEASE_PARTS), *calls[i])

        ops[SIX_COMMANDS_ROW] = six_commands
        script = LuaScript.load("lease_claim")
        await conn.call("SCRIPT", "LOAD", script.source)
        ready = {i: claim_call(prefix, replace(request(i, "bench"), job=f"script{i % JOBS}"),
                               backend.retention) for i in range(-warmup, 2 * count)}

        async def script_alone(i: int) -> object:
            keys, args = ready[i]
            return await conn.call("EVALSHA", script.sha, len(keys), *keys, *args)

        ops[SCRIPT_ROW] = script_alone
    try:
        return await interleaved(ops, count, concurrency, warmup)
    finally:
        keys = [k async for k in _scan(conn, f"{prefix}*")]
        keys += [k async for k in _scan(conn, f"{{{prefix}*")]
        for start in range(0, len(keys), 500):
            await conn.call("DEL", *keys[start:start + 500])
        await backend.stop()


async def _scan(conn: Commands, pattern: str) -> AsyncIterator[str]:
    cursor = "0"
    for _ in range(100_000):
        cursor, keys = await conn.call("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        for key in keys:
            yield key
        if str(cursor) == "0":
            return


async def main() -> None:
    parser = argparse.ArgumentParser(description="Redis claim latency beside SET NX PX.")
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--count", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=16)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.count, args.concurrency = SMOKE_COUNT, SMOKE_CONCURRENCY
    for strategy in ("lease", "stream-id", "script"):
        rows = await bench_strategy(args.url, strategy, args.count, args.concurrency)
        print_table(f"Redis strategy {strategy!r} ({args.url}, {args.count} calls each, "
                    f"{args.concurrency} in flight for ops/s)", rows, floor=rows[0])
    print("\nidmp: needs Redis 8.6+ (this server refuses it), not measured.")


if __name__ == "__main__":
    asyncio.run(main())
