"""Core benchmark: SQLite claims per second (1 and 4 processes) and scheduler CPU.

    python -m bench.core [--seconds 5] [--cpu-seconds 30] [--smoke]

Claims: each process claims fresh slots back to back for ``--seconds`` (slots long due,
each won: a refused claim stops the run), one at a time, or with ``BURST`` claims in
flight (they share transactions). Two floors, measured in the same run on the same kind
of file: a plain ``INSERT ... ON CONFLICT DO NOTHING`` in a ``BEGIN IMMEDIATE``
transaction reached the way a claim is, awaited from the event loop and run by a worker
thread that owns the connection (the floor of the first table), and the same transaction
in a tight synchronous loop, no thread hop (the bare floor of the second table). CPU: one
scheduler with 1,000 ``every("10s")`` jobs whose handlers do nothing (100 claims/s),
against the same scheduler whose 1,000 jobs are daily (timers only), scaled to CPU
seconds per minute. ``--smoke`` runs every table for a fraction of a second per row (see
``bench/common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import queue
import resource
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
#: Claims in flight in the batched row (each process keeps this many going).
BURST = 256
T = TypeVar("T")


def _claims_worker(path: str, seconds: float, worker: int, in_flight: int,
                   out: mp.Queue[int]) -> None:
    async def run() -> int:
        backend = SqliteBackend(path, table="bench")
        await backend.start()
        count, deadline = 0, time.monotonic() + seconds
        base = 10**12 + worker * 10**9  # 2001 onwards: due long ago

        async def claimer(lane: int) -> int:
            done, slot = 0, base + lane * 10**7
            while time.monotonic() < deadline:
                result = await backend.claim(ClaimRequest(
                    job=f"bench-{in_flight}-{lane}", slot=slot + done, token=new_token(),
                    runner=f"w{worker}", overlap=True))
                if result.outcome is not ClaimOutcome.WON:
                    raise AssertionError(f"claim of a fresh slot answered {result}")
                done += 1
            return done

        count = sum(await asyncio.gather(*(claimer(lane) for lane in range(in_flight))))
        await backend.stop()
        return count
    out.put(asyncio.run(run()))


def _floor_connection(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _floor_insert(conn: sqlite3.Connection, worker: int, count: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO floor VALUES (?, ?) ON CONFLICT DO NOTHING", (worker, count))
    conn.execute("COMMIT")


def _floor_worker(path: str, seconds: float, worker: int, in_flight: int,
                  out: mp.Queue[int]) -> None:
    conn = _floor_connection(path)
    count, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        _floor_insert(conn, worker, count)
        count += 1
    conn.close()
    out.put(count)


def _hop_floor_worker(path: str, seconds: float, worker: int, in_flight: int,
                      out: mp.Queue[int]) -> None:
    """The floor on a claim's own path: each insert awaited from the event loop, run by
    one worker thread that owns the connection, as SqliteBackend does."""
    async def run() -> int:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as thread:
            conn = await loop.run_in_executor(thread, _floor_connection, path)
            count, deadline = 0, time.monotonic() + seconds
            while time.monotonic() < deadline:
                await loop.run_in_executor(thread, _floor_insert, conn, worker, count)
                count += 1
            await loop.run_in_executor(thread, conn.close)
        return count
    out.put(asyncio.run(run()))


def _rate(target: object, path: str, procs: int, seconds: float, in_flight: int = 1) -> float:
    ctx = mp.get_context("spawn")
    out: mp.Queue[int] = ctx.Queue()
    workers = [ctx.Process(target=target,  # type: ignore[arg-type]
                           args=(path, seconds, i, in_flight, out))
               for i in range(procs)]
    for w in workers:
        w.start()
    counts: list[int] = _collect(out, workers, timeout=seconds + 60)
    total = sum(counts)
    return total / seconds


def _collect(out: mp.Queue[T], workers: Sequence[BaseProcess], timeout: float) -> list[T]:
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
    rates: dict[int, dict[str, float]] = {}
    for procs in (1, 4):
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "bench.db")
            asyncio.run(_prepare(path))
            with contextlib.closing(sqlite3.connect(path)) as conn, conn:
                conn.execute("CREATE TABLE floor (a INTEGER, b INTEGER, PRIMARY KEY (a, b))")
            rates[procs] = {
                "one": _rate(_claims_worker, path, procs, seconds),
                "burst": _rate(_claims_worker, path, procs, seconds, BURST),
                "bare": _rate(_floor_worker, path, procs, seconds),
                "hop": _rate(_hop_floor_worker, path, procs, seconds),
            }
    print(f"\nSQLite claims per second, one at a time (fresh slots, {seconds:g} s per row); "
          "floor: the same INSERT transaction reached the same way (event loop, worker thread)")
    print(f"{'processes':>9} {'anarchon claim/s':>17} {'INSERT floor/s':>15} {'claim ÷ floor':>14}")
    for procs, r in rates.items():
        print(f"{procs:>9} {r['one']:>17.0f} {r['hop']:>15.0f} {r['one'] / r['hop']:>14.2f}")
    print(f"\nThe same against the bare floor (a tight synchronous INSERT loop, no thread hop), "
          f"and with {BURST} claims in flight per process (they share transactions)")
    print(f"{'processes':>9} {'in flight':>9} {'claim/s':>9} {'bare INSERT/s':>14} "
          f"{'÷ bare':>7} {'÷ floor':>8}")
    for procs, r in rates.items():
        for in_flight, claims in ((1, r["one"]), (BURST, r["burst"])):
            print(f"{procs:>9} {in_flight:>9} {claims:>9.0f} {r['bare']:>14.0f} "
                  f"{claims / r['bare']:>7.2f} {claims / r['hop']:>8.2f}")


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
