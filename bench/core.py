"""Core benchmark: SQLite claims per second (1 and 4 processes) and scheduler CPU.

    python -m bench.core [--seconds 5] [--cpu-seconds 30]

Prints two tables. Claims: each process claims fresh slots back to back for ``--seconds``;
the baseline is a plain ``INSERT ... ON CONFLICT DO NOTHING`` in a ``BEGIN IMMEDIATE``
transaction on the same kind of file, measured in the same run. CPU: one scheduler with
1,000 ``every("10s")`` jobs whose handlers do nothing (100 claims/s), against the same
scheduler whose 1,000 jobs are daily (timers only), scaled to CPU seconds per minute.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import resource
import sqlite3
import tempfile
import time
from pathlib import Path

from anarchon_core import Scheduler
from anarchon_core.backend import new_token
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.models import ClaimRequest


def _claims_worker(path: str, seconds: float, worker: int, out: mp.Queue[int]) -> None:
    async def run() -> int:
        backend = SqliteBackend(path, table="bench")
        await backend.start()
        count, deadline = 0, time.monotonic() + seconds
        base = 10**12 + worker * 10**9
        while time.monotonic() < deadline:
            await backend.claim(ClaimRequest(job="bench", slot=base + count, token=new_token(),
                                             runner=f"w{worker}", overlap=True))
            count += 1
        await backend.stop()
        return count
    out.put(asyncio.run(run()))


def _floor_worker(path: str, seconds: float, worker: int, out: mp.Queue[int]) -> None:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    count, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO floor VALUES (?, ?) ON CONFLICT DO NOTHING",
                     (worker, count))
        conn.execute("COMMIT")
        count += 1
    conn.close()
    out.put(count)


def _rate(target: object, path: str, procs: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out: mp.Queue[int] = ctx.Queue()
    workers = [ctx.Process(target=target, args=(path, seconds, i, out))  # type: ignore[arg-type]
               for i in range(procs)]
    for w in workers:
        w.start()
    total = sum(out.get(timeout=seconds + 60) for _ in workers)
    for w in workers:
        w.join()
    return total / seconds


def claims_table(seconds: float) -> None:
    print(f"\nSQLite claims per second (fresh slots, {seconds:.0f} s per row, same machine)")
    print(f"{'processes':>9} {'anarchon claim/s':>17} {'INSERT floor/s':>15} {'claim ÷ floor':>14}")
    for procs in (1, 4):
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "bench.db")
            asyncio.run(_prepare(path))
            with sqlite3.connect(path) as conn:
                conn.execute("CREATE TABLE floor (a INTEGER, b INTEGER, PRIMARY KEY (a, b))")
            claims = _rate(_claims_worker, path, procs, seconds)
            floor = _rate(_floor_worker, path, procs, seconds)
        print(f"{procs:>9} {claims:>17.0f} {floor:>15.0f} {claims / floor:>14.2f}")


async def _prepare(path: str) -> None:
    backend = SqliteBackend(path, table="bench")
    await backend.start()
    await backend.stop()


def _cpu_worker(path: str, interval: str, seconds: float, out: mp.Queue[float]) -> None:
    async def run() -> float:
        scheduler = Scheduler(SqliteBackend(path, table="cpu"))

        async def noop(ctx: object) -> None:
            return None

        for i in range(1000):
            scheduler.every(f"job-{i}", interval, noop)
        await scheduler.start()
        await asyncio.sleep(2)  # settle: first claims, thread start-up
        before = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        await scheduler.stop()
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out.put(asyncio.run(run()))


def cpu_table(seconds: float) -> None:
    print(f"\nScheduler CPU with 1,000 jobs in one instance (measured {seconds:.0f} s, "
          "scaled to a minute)")
    print(f"{'jobs':<34} {'CPU s/min':>10} {'% of a core':>12}")
    ctx = mp.get_context("spawn")
    for label, interval in (("1,000 daily jobs (timers only)", "1d"),
                            ("1,000 every('10s') no-op jobs", "10s")):
        with tempfile.TemporaryDirectory() as tmp:
            out: mp.Queue[float] = ctx.Queue()
            p = ctx.Process(target=_cpu_worker,
                            args=(str(Path(tmp) / "cpu.db"), interval, seconds, out))
            p.start()
            cpu = out.get(timeout=seconds + 120)
            p.join()
        per_min = cpu * 60 / seconds
        print(f"{label:<34} {per_min:>10.2f} {per_min / 60 * 100:>11.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    args = parser.parse_args()
    claims_table(args.seconds)
    cpu_table(args.cpu_seconds)


if __name__ == "__main__":
    main()
