"""Scale: many jobs sharing one instant, per instance CPU and start lateness.

    python -m bench.scale [--backend redis|postgres|sqlite] [--jobs 10000] [--every 60s]
                          [--instances 1] [--seconds 130] [--smoke]
    python -m bench.scale --registration 100000      # start-up and memory per daily job
                                                     # (only that, unless --backend is given)

Each instance is a process running one Scheduler with ``--jobs`` no-op async jobs
``every(--every)`` with the default options (jitter = min(1 s, 10 % of the interval)), all
sharing the same instants. Every run records its start minus its slot (lateness). The
table shows, per store: CPU seconds per minute per instance, lateness p50/p99/max, the
jitter bound it is measured against (the floor: a run cannot start before its jitter), the
runs against the slots due (exactly once: no slot twice, none missing) and the number of
warning/error log lines (connection errors and the like). ``--smoke`` runs 200 jobs × 2 s
for a few seconds. ``--gc-freeze`` calls :func:`gc.freeze` in each instance once its
scheduler has started (see docs/benchmarks.md, Scale).

``--registration N`` registers N daily jobs in one scheduler (no store needed beyond
SQLite), and reports start-up time, idle CPU and memory per registered job.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from anarchon_core import JobContext, Scheduler
from anarchon_core.durations import parse_duration_ms

from .common import add_smoke_flag

#: After the measured window, how long instances go on so late slots of it still start.
DRAIN_S = 10.0
STORES = {
    "redis": "redis://127.0.0.1:6379/0?prefix={ns}:",
    "postgres": "postgresql://postgres@127.0.0.1:5432/test?table={ns}",
    "sqlite": "sqlite:///{dir}/scale.db?table={ns}",
}


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.samples) < 3:
            self.samples.append(record.getMessage()[:160])


def _instance(url: str, jobs: int, every: str, seconds: float, index: int,  # noqa: PLR0917
              out: mp.Queue[dict[str, Any]], drain_s: float = DRAIN_S,
              gc_freeze: bool = False) -> None:
    counter = _Counter()
    logging.getLogger("anarchon").addHandler(counter)
    logging.getLogger("anarchon").setLevel(logging.WARNING)
    starts: list[tuple[str, int, float]] = []

    async def run() -> dict[str, Any]:
        scheduler = Scheduler(url, instance_id=f"scale-{index}")

        async def handler(ctx: JobContext) -> None:
            starts.append((ctx.job, ctx.slot, time.time() * 1000 - ctx.slot))

        for i in range(jobs):
            scheduler.every(f"job{i:05d}", every, handler)
        await scheduler.start()
        if gc_freeze:
            gc.freeze()  # what start-up made is never scanned by the collector again
        await asyncio.sleep(2.0)  # connections, first clock sync
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        began = time.time() * 1000
        await asyncio.sleep(seconds)
        ended = time.time() * 1000
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(drain_s)  # slots of the window still starting (late ones)
        await scheduler.stop()
        cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
        return {"cpu_s": cpu, "seconds": seconds, "began": began, "ended": ended,
                "starts": starts, "warnings": counter.count, "samples": counter.samples}

    out.put(asyncio.run(run()))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def run_scale(store: str, jobs: int, every: str, instances: int, seconds: float,  # noqa: PLR0917
              workdir: Path, drain_s: float = DRAIN_S, gc_freeze: bool = False
              ) -> dict[str, Any]:
    """Run one configuration; return the row of the table."""
    ns = f"s{uuid.uuid4().hex[:10]}"
    url = STORES[store].format(ns=ns, dir=workdir)
    ctx = mp.get_context("spawn")
    out: mp.Queue[dict[str, Any]] = ctx.Queue()
    procs = [ctx.Process(target=_instance,
                         args=(url, jobs, every, seconds, i, out, drain_s, gc_freeze))
             for i in range(instances)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=seconds + DRAIN_S + 300) for _ in procs]
    for proc in procs:
        proc.join(30)
    interval = parse_duration_ms(every)
    jitter = min(1_000, interval // 10)
    began = max(r["began"] for r in results)
    ended = min(r["ended"] for r in results)
    per_slot = Counter((job, slot) for r in results for job, slot, _ in r["starts"])
    window = [(job, slot) for job, slot in per_slot if began <= slot <= ended]
    due_slots = sorted({slot for _, slot in window} | set(
        range(-(-int(began) // interval) * interval, int(ended) + 1, interval)))
    expected = len(due_slots) * jobs
    ran = len(window)
    duplicates = sum(n - 1 for key, n in per_slot.items() if n > 1)
    lateness = [late for r in results for job, slot, late in r["starts"]
                if began <= slot <= ended]
    return {
        "store": store, "jobs": jobs, "every": every, "instances": instances,
        "cpu_per_min": max(r["cpu_s"] / r["seconds"] * 60 for r in results),
        "p50": _percentile(lateness, 0.5), "p99": _percentile(lateness, 0.99),
        "max": max(lateness, default=float("nan")), "jitter": jitter,
        "expected": expected, "ran": ran, "duplicates": duplicates,
        "warnings": sum(r["warnings"] for r in results),
        "samples": [s for r in results for s in r["samples"]][:3],
    }


def registration(count: int) -> dict[str, float]:
    """Register ``count`` daily jobs; start, idle, stop. Time, idle CPU and memory per job.

    Every job is due at one instant 12 hours away, so nothing runs while idle CPU is
    measured. Memory is measured in a second pass under :mod:`tracemalloc` (which slows
    registration, so the timings come from the first pass).
    """
    offset = f"{(time.gmtime().tm_hour + 12) % 24}h"

    async def handler(ctx: JobContext) -> None:
        pass

    async def timed(tmp: str) -> dict[str, float]:
        scheduler = Scheduler(f"sqlite:///{tmp}/reg.db", instance_id="reg")
        t0 = time.perf_counter()
        for i in range(count):
            scheduler.every(f"daily{i:06d}", "1d", handler, offset=offset)
        registered = time.perf_counter()
        await scheduler.start()
        started = time.perf_counter()
        await asyncio.sleep(2)
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(5)
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        await scheduler.stop()
        idle = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
        return {"register_s": registered - t0, "start_s": started - registered,
                "idle_cpu_per_min": idle / 5 * 60}

    def memory(tmp: str) -> float:
        scheduler = Scheduler(f"sqlite:///{tmp}/mem.db", instance_id="mem")
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            scheduler.every(f"daily{i:06d}", "1d", handler, offset=offset)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return (after - before) / count

    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(timed(tmp))
        result["bytes_per_job"] = memory(tmp)
    return result


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m bench.scale``."""
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--backend", action="append", choices=sorted(STORES),
                        help="store(s) to run on (default: redis and postgres)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--every", default="60s")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=130.0)
    parser.add_argument("--gc-freeze", action="store_true",
                        help="call gc.freeze() in each instance once its scheduler started")
    parser.add_argument("--registration", type=int, default=0, metavar="N",
                        help="measure start-up and memory of N registered daily jobs "
                             "(only that, unless --backend is given)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    drain_s = DRAIN_S
    if args.smoke:
        args.jobs, args.every, args.seconds, drain_s = 200, "2s", 3.0, 3.0
        args.registration = args.registration or 2_000
    # --registration alone measures registration only; with --backend, the scale runs too.
    only_registration = bool(args.registration) and not args.backend and not args.smoke
    stores = [] if only_registration else args.backend or ["redis", "postgres"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_scale(s, args.jobs, args.every, args.instances, args.seconds, Path(tmp),
                          drain_s, args.gc_freeze)
                for s in stores]
    if rows:
        print(f"\n{args.jobs} jobs every {args.every}, {args.instances} instance(s), "
              f"{args.seconds:.0f} s (no-op async handlers, default jitter"
              f"{', gc.freeze() after start' if args.gc_freeze else ''})\n")
        print("| store | CPU s/min per instance | lateness p50 / p99 / max (ms) | jitter "
              "floor (ms) | runs / due | duplicates | warning lines |")
        print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['store']} | {r['cpu_per_min']:.2f} | {r['p50']:.0f} / {r['p99']:.0f} / "
              f"{r['max']:.0f} | {r['jitter']} | {r['ran']} / {r['expected']} | "
              f"{r['duplicates']} | {r['warnings']} |")
    for r in rows:
        for sample in r["samples"]:
            print(f"  {r['store']} log sample: {sample}", file=sys.stderr)
    if args.registration:
        reg = registration(args.registration)
        print(f"\n{args.registration} registered daily jobs, one instance (SQLite)\n")
        print("| register s | start s | idle CPU s/min | bytes per job |")
        print("|---|---|---|---|")
        print(f"| {reg['register_s']:.2f} | {reg['start_s']:.2f} | "
              f"{reg['idle_cpu_per_min']:.3f} | {reg['bytes_per_job']:.0f} |")
    if any(r["duplicates"] for r in rows):
        raise SystemExit("duplicate runs: the exactly-once promise failed")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
