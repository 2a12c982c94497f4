"""Shared measuring and printing for the benchmarks (one command each, a table out).

Every command takes ``--smoke``: tiny counts, a few seconds, the same tables (floor row
included). It checks that the command still runs against the current code; its figures
mean nothing. ``tests/test_bench_smoke.py`` runs every command that way.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

#: Calls per row under ``--smoke`` (and in flight for the ops/s batch).
SMOKE_COUNT = 20
SMOKE_CONCURRENCY = 4
#: Untimed calls before each measured row (fewer when the row itself is shorter).
WARMUP = 100


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--smoke``: the command's every table with tiny counts, to see that it runs."""
    parser.add_argument(
        "--smoke", action="store_true",
        help="tiny counts (a few seconds): checks that the command runs and prints its "
             "tables; the figures are meaningless")


def warmup_for(count: int) -> int:
    """Untimed calls before a row of ``count`` timed calls."""
    return min(WARMUP, count)


@dataclass
class Measurement:
    """Latencies of one operation, and the throughput of a concurrent batch of it."""

    name: str
    latencies_ms: list[float]
    per_second: float
    #: The floor's median when the floor's calls were interleaved with this row's
    #: (:func:`interleaved`): the row's ratio is taken against it.
    floor_ms: float | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_ms)

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def measure(
    name: str, op: Callable[[int], Awaitable[object]], *, count: int = 2000,
    concurrency: int = 16, warmup: int | None = None,
) -> Measurement:
    """Time ``op(i)`` ``count`` times one after another (latency), then ``count`` times
    with ``concurrency`` in flight (throughput). ``i`` is unique per call, so each call can
    claim a fresh slot: the untimed warm-up calls take ``-warmup .. -1`` (default
    :func:`warmup_for`), the timed ones ``0 .. 2*count-1``, each range in increasing order.
    """
    for i in range(-(warmup_for(count) if warmup is None else warmup), 0):
        await op(i)
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        await op(i)
        latencies.append((time.perf_counter() - started) * 1000)
    queue = iter(range(count, 2 * count))

    async def worker() -> None:
        for i in queue:
            await op(i)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return Measurement(name, latencies, count / elapsed)


Op = Callable[[int], Awaitable[object]]


async def interleaved(ops: dict[str, Op], count: int, concurrency: int,
                      warmup: int) -> list[Measurement]:
    """Latencies of each op, calls interleaved (op1(i), op2(i)...); then ops/s per op.

    Noise from other processes (and the machine's speed, which drifts) hits every op
    alike. ``i`` runs from ``-warmup`` (untimed) up to ``2 * count - 1``, in increasing
    order. If the first op is named ``floor...``, every other row carries its median as
    :attr:`Measurement.floor_ms`.
    """
    for i in range(-warmup, 0):
        for op in ops.values():
            await op(i)
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
    if out[0].name.startswith("floor"):
        for row in out[1:]:
            row.floor_ms = out[0].median_ms
    return out


def print_table(title: str, rows: list[Measurement], floor: Measurement | None = None) -> None:
    """Print rows with median, p99, throughput and, if given, the ratio to the floor.

    A row measured interleaved with the floor (:attr:`Measurement.floor_ms`) is divided by
    the floor of its own run.
    """
    print(f"\n{title}")
    header = f"{'operation':<34} {'median ms':>10} {'p99 ms':>9} {'ops/s':>10}"
    if floor:
        header += f" {'median ×floor':>14}"
    print(header)
    print("-" * len(header))
    for row in rows:
        line = f"{row.name:<34} {row.median_ms:>10.3f} {row.p99_ms:>9.3f} {row.per_second:>10.0f}"
        if floor:
            line += f" {row.median_ms / (row.floor_ms or floor.median_ms):>14.2f}"
        print(line)
