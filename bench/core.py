"""Core benchmark: SQLite claims per second (1 and 4 processes) and scheduler CPU.

    python -m bench.core [--seconds 5] [--cpu-seconds 30] [--smoke]

Prints two tables. Claims: each process claims fresh slots back to back for ``--seconds``
(slots long due, each won: a refused claim stops the run); the baseline is a plain
``INSERT ... ON CONFLICT DO NOTHING`` in a ``BEGIN IMMEDIATE`` transaction on the same kind
of file, measured in the same run. CPU: one scheduler with 1,000 ``every("10s")`` jobs
whose handlers do nothing (100 claims/s), against the same scheduler whose 1,000 jobs are
daily (timers only), scaled to CPU seconds per minute. ``--smoke`` runs both tables for a
fraction of a second each (see ``bench/common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import queue
import resource
import sqlite3
import tempfile
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TypeVar

from anarchon_core import Scheduler
from anarchon_core.backend import new_token
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.models import ClaimOutcome, ClaimRequest

from .common import add_smoke_flag

#: Seconds the scheduler runs before CPU is measured (first claims, thread start-up).
SETTLE_SECONDS = 2.0
SMOKE_SECONDS = 0.2
T = TypeVar("T")

def _claims_worker(path: str, seconds: float, worker: int, out: mp.Queue[int]) -> None:
    async def run() -> int:
        backend = SqliteBackend(path, table="bench")
        await backend.start()
        count, deadline = 0, time.monotonic() + seconds
        base = 10**12 + worker * 10**9  # 2001 onwards: due long ago
        while time.monotonic() < deadline:
            result = await backend.claim(ClaimRequest(
                job="bench", slot=base + count, token=new_token(), runner=f"w{worker}",
                overlap=True))
            if result.outcome is not ClaimOutcome.WON:
                raise AssertionError(f"claim of a fresh slot answered {result}")
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
    total = sum(_collect(out, workers, timeout=seconds + 60))
    return total / seconds


def _collect(out: mp.Queue[T], workers: list[BaseProcess], timeout: float) -> list[T]:
    """One result from each worker, then join them; fail at once if one of them fails."""
    results: list[T] = []
    deadline = time.monotonic() + timeout
    while len(results) < len(workers):
        try:
            results.append(out.get(timeout=0.2))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a benchmark process failed (exit code {failed[0]}); "
                                   "see its traceback above") from None
            if time.monotonic() > deadline:
                message = f"no result from the benchmark processes in {timeout:g} s"
                raise TimeoutError(message) from None
    for w in workers:
        w.join()
    return results


def claims_table(seconds: float) -> None:
    print(f"\nSQLite claims per second (fresh slots, {seconds:g} s per row, same machine)")
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


def _cpu_worker(path: str, interval: str, seconds: float, settle: float,
                out: mp.Queue[float]) -> None:
    async def run() -> float:
        scheduler = Scheduler(SqliteBackend(path, table="cpu"))

        async def noop(ctx: object) -> None:
            return None

        for i in range(1000):
            scheduler.every(f"job-{i}", interval, noop)
        await scheduler.start()
        await asyncio.sleep(settle)
        before = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        await scheduler.stop()
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out.put(asyncio.run(run()))


def cpu_table(seconds: float, settle: float = SETTLE_SECONDS) -> None:
    print(f"\nScheduler CPU with 1,000 jobs in one instance (measured {seconds:g} s, "
          "scaled to a minute)")
    print(f"{'jobs':<34} {'CPU s/min':>10} {'% of a core':>12}")
    ctx = mp.get_context("spawn")
    for label, interval in (("1,000 daily jobs (timers only)", "1d"),
                            ("1,000 every('10s') no-op jobs", "10s")):
        with tempfile.TemporaryDirectory() as tmp:
            out: mp.Queue[float] = ctx.Queue()
            p = ctx.Process(target=_cpu_worker,
                            args=(str(Path(tmp) / "cpu.db"), interval, seconds, settle, out))
            p.start()
            [cpu] = _collect(out, [p], timeout=settle + seconds + 120)
        per_min = cpu * 60 / seconds
        print(f"{label:<34} {per_min:>10.2f} {per_min / 60 * 100:>11.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.seconds = args.cpu_seconds = SMOKE_SECONDS
    claims_table(args.seconds)
    cpu_table(args.cpu_seconds, settle=SMOKE_SECONDS if args.smoke else SETTLE_SECONDS)


if __name__ == "__main__":
    main()
