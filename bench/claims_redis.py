"""Claim latency and throughput of each Redis strategy beside the floor ``SET NX PX``.

    .venv/bin/python -m bench.claims_redis [--url redis://127.0.0.1:6379/0] [--count 2000]

For every strategy, over the same ``redis.asyncio`` client anarchon opens: the strategy's
claim of a fresh run (the winning path; 100 jobs in turn, as a service with many jobs
would), for ``lease`` also a backup's check of a live run (the ``running`` answer), and
the floor ``SET <key> <token> NX PX 30000``, the cheapest atomic "first writer wins" Redis
has. Latencies are taken one call at a time with the floor and the claims interleaved, so
that noise from other processes hits both alike; ops/s is a separate batch with
``--concurrency`` calls in flight. The last column is the median over the floor's median
(target for ``lease``: ≤ 1.5). Keys go under a fresh prefix and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from anarchon_core.backend import new_token
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis.clients import Commands
from anarchon_core.models import ClaimRequest

from .common import Measurement, print_table

JOBS = 100
Op = Callable[[int], Awaitable[object]]


async def interleaved(ops: dict[str, Op], count: int, concurrency: int,
                      warmup: int = 100) -> list[Measurement]:
    """Latencies of each op, calls interleaved (op1(i), op2(i)...); then ops/s per op."""
    for i in range(warmup):
        for op in ops.values():
            await op(-1 - i)
    latencies: dict[str, list[float]] = {name: [] for name in ops}
    for i in range(count):
        for name, op in ops.items():
            started = time.perf_counter()
            await op(i)
            latencies[name].append((time.perf_counter() - started) * 1000)
    out = []
    for name, op in ops.items():
        queue = iter(range(count, 2 * count))

        async def worker(op: Op = op, queue: object = queue) -> None:
            for i in queue:  # type: ignore[attr-defined]
                await op(i)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        out.append(Measurement(name, latencies[name], count / (time.perf_counter() - started)))
    return out


async def bench_strategy(url: str, strategy: str, count: int,
                         concurrency: int) -> list[Measurement]:
    prefix = f"bench-{secrets.token_hex(4)}:"
    backend = RedisBackend(url, strategy=strategy, prefix=prefix)
    await backend.start()
    conn = backend._conn
    assert conn is not None
    base = await backend.clock_ms()

    def request(i: int, runner: str) -> ClaimRequest:
        return ClaimRequest(job=f"job{i % JOBS}", slot=base + i * 1_000, token=new_token(),
                            runner=runner, overlap=True, max_late_ms=None)

    async def floor(i: int) -> object:
        return await conn.call("SET", f"{prefix}floor:{i}", new_token(), "NX", "PX", 30_000)

    async def claim(i: int) -> object:
        result = await backend.claim(request(i, "bench"))
        assert result.won, result
        return result

    async def backup(i: int) -> object:
        return await backend.claim(request(i, "backup"))  # the run claim(i) just won

    ops: dict[str, Op] = {"floor: SET NX PX 30000": floor, f"{strategy}: claim (wins)": claim}
    if strategy == "lease":
        ops["lease: claim (running: backup)"] = backup
    try:
        return await interleaved(ops, count, concurrency)
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
    args = parser.parse_args()
    for strategy in ("lease", "stream-id", "script"):
        rows = await bench_strategy(args.url, strategy, args.count, args.concurrency)
        print_table(f"Redis strategy {strategy!r} ({args.url}, {args.count} calls each, "
                    f"{args.concurrency} in flight for ops/s)", rows, floor=rows[0])
    print("\nidmp: needs Redis 8.6+ (this server refuses it), not measured.")


if __name__ == "__main__":
    asyncio.run(main())
