"""Fleet claims: what the store does, and the fleet's CPU, per run as instances are added.

    python -m bench.fleet_claims [--backend redis,postgres] [--instances 1,2,4,6,8]
                                 [--modes contenders,all] [--jobs 500] [--every 5s]
                                 [--seconds 30] [--smoke]

With contender sets (the default) only three instances of a fleet act on each slot: the
first claims it, two others look whether it was claimed and claim only if not; every
other instance passes it over. With ``contenders=False`` (mode ``all``) every instance
claims every slot and only one claim wins. Per store, the command starts a dedicated
server (never a shared one), then for each mode and instance count N runs N processes,
each one Scheduler with ``--jobs`` no-op async jobs ``every(--every)`` (default options),
the same jobs in every instance. Once every instance has started (and a warm-up long
enough for every instance to see the others in the fleet registry), the store's counters
are reset and the measured window of ``--seconds`` begins, halfway between two slot
instants (so a window of whole intervals holds whole slots, each claimed inside it,
jitter included):

* Redis (``redis-server``, nothing on disk): ``CONFIG RESETSTAT`` before the window, the
  sum of ``calls`` of ``INFO commandstats`` after it; commands run inside scripts count
  too (the ``INFO`` and ``CONFIG`` of the measurement are left out).
* PostgreSQL (``initdb`` + ``pg_ctl``): the calls of ``pg_stat_statements`` (loaded with
  ``shared_preload_libraries``, ``pg_stat_statements.track = all``: statements inside
  functions count too, as does each ``BEGIN``/``COMMIT``) when the server has the
  extension; else the commits of ``pg_stat_database`` plus the calls of
  ``pg_stat_user_functions`` (``track_functions = all``). The table says which.

Per row: store commands per run (commands in the window ÷ runs of the window's slots),
the fleet's CPU s/min (the sum over instances), runs against slots due and slots run twice
(exactly once: no slot twice, none missing), lateness p99 (start minus slot), and the
ratios to the one-instance row of the same mode, measured in the same run: commands per
run ÷ its, fleet CPU per run ÷ its. Under each contender-sets table, a straight line through
its rows of more instances than contenders (where a slot's work stops growing with the
fleet, so what grows is each instance's own upkeep), the largest fleet left out, gives
both ratios at 50 instances; its value at the largest fleet is printed beside the
measurement, as the check of the line. ``--smoke`` runs 100 jobs × 1 s, 1 and
2 instances, a 2 s window: it checks that the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing as mp
import os
import resource
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import psycopg
import redis

from anarchon_core import JobContext, Scheduler
from anarchon_core.contenders import CONTENDERS
from anarchon_core.durations import parse_duration_ms
from chaos.servers import PostgresServer, RedisServer

from .common import add_smoke_flag
from .scale import DRAIN_S, _Counter, _percentile

STORES = ("redis", "postgres")
#: After every instance has started, how long before the window (connections, first sync,
#: every instance's view of the fleet registry with every other in it).
WARMUP_S = 8.0
#: The instance count the model of each table is extrapolated to.
MODEL_INSTANCES = 50
MODES = {"contenders": True, "all": False}
#: Bound on an instance's start-up, and on its report after the drain.
START_TIMEOUT_S = 180.0


def _instance(url: str, jobs: int, every: str, index: int,  # noqa: PLR0917
              ready: mp.Queue[int], go: Event, seconds: float, drain_s: float,
              out: mp.Queue[dict[str, Any]], contenders: bool) -> None:
    counter = _Counter()
    logging.getLogger("anarchon").addHandler(counter)
    logging.getLogger("anarchon").setLevel(logging.WARNING)
    starts: list[tuple[str, int, float]] = []

    async def run() -> dict[str, Any]:
        scheduler = Scheduler(url, instance_id=f"fleet-{index}", contenders=contenders)

        async def handler(ctx: JobContext) -> None:
            starts.append((ctx.job, ctx.slot, time.time() * 1000 - ctx.slot))

        for i in range(jobs):
            scheduler.every(f"job{i:05d}", every, handler)
        await scheduler.start()
        ready.put(index)
        # The scheduler keeps running on this loop while the thread waits for the window.
        if not await asyncio.to_thread(go.wait, START_TIMEOUT_S):
            await scheduler.stop()
            raise RuntimeError("the measured window never began")
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(seconds)
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(drain_s)  # slots of the window still starting (late ones)
        await scheduler.stop()
        cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
        return {"cpu_s": cpu, "starts": starts, "warnings": counter.count,
                "samples": counter.samples}

    out.put(asyncio.run(run()))


class StoreCounter:
    """A dedicated server and a count of the commands it runs between two calls."""

    #: What a "command" is, for the table's title.
    method = ""
    #: The table's column name.
    column = ""

    def url(self, ns: str) -> str:
        """The store URL of a run under namespace ``ns``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Start counting from zero."""
        raise NotImplementedError

    def count(self) -> int:
        """Commands run since :meth:`reset`."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server."""
        raise NotImplementedError


class RedisCounter(StoreCounter):
    """``redis-server`` of our own; ``CONFIG RESETSTAT`` and ``INFO commandstats``."""

    column = "Redis commands per run"

    def __init__(self, workdir: Path) -> None:
        self.server = RedisServer(workdir / "redis", durable=False)
        self.server.start()
        try:
            self.client = redis.Redis.from_url(self.server.redis_url)
            version = self.client.info("server")["redis_version"]
        except BaseException:
            self.server.stop()
            raise
        self.method = (f"dedicated redis-server {version}, nothing on disk; commands from "
                       "INFO commandstats after CONFIG RESETSTAT (commands inside scripts "
                       "included)")

    def url(self, ns: str) -> str:
        return f"{self.server.redis_url}?prefix={ns}:"

    def reset(self) -> None:
        self.client.config_resetstat()

    def count(self) -> int:
        stats: dict[str, dict[str, int]] = self.client.info("commandstats")
        return sum(entry["calls"] for name, entry in stats.items()
                   if name not in {"cmdstat_info", "cmdstat_config"})

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


class PostgresCounter(StoreCounter):
    """A PostgreSQL cluster of our own; ``pg_stat_statements`` if it loads, else commits
    plus function calls."""

    column = "PostgreSQL statements per run"

    def __init__(self, workdir: Path) -> None:
        self.server = PostgresServer(workdir / "postgres")
        self.server.start()
        try:
            self._set_up()
        except BaseException:
            self.server.stop()
            raise

    def _set_up(self) -> None:
        with psycopg.connect(self.server.url, autocommit=True) as conn:
            available = conn.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'",
            ).fetchone() is not None
            conn.execute("ALTER SYSTEM SET track_functions = 'all'")
            if available:
                conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        self.server.halt(crash=False)
        self.server.start()
        self.conn = psycopg.connect(self.server.url, autocommit=True)
        version = self.conn.execute("SHOW server_version").fetchone()
        self.statements = available and "pg_stat_statements" in str(
            self.conn.execute("SHOW shared_preload_libraries").fetchone())
        if self.statements:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            # Known to the server only once the library is loaded; a reload applies it.
            self.conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            self.conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and str(self.conn.execute(
                    "SHOW pg_stat_statements.track").fetchone()) != "('all',)":
                time.sleep(0.1)
            how = ("statements from pg_stat_statements (track = all: statements inside "
                   "functions and BEGIN/COMMIT included)")
        else:
            self.column = "PostgreSQL commits + function calls per run"
            how = ("commits (pg_stat_database.xact_commit) + function calls "
                   "(pg_stat_user_functions, track_functions = all); pg_stat_statements "
                   "could not be loaded")
        self.method = (f"dedicated PostgreSQL {version[0] if version else '?'}; {how}")
        self._base = 0

    def url(self, ns: str) -> str:
        return f"{self.server.url}?table={ns}"

    def _fallback_total(self) -> int:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres')"
            " + (SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions)").fetchone()
        return int(row[0]) if row else 0

    def reset(self) -> None:
        if self.statements:
            self.conn.execute("SELECT pg_stat_statements_reset()")
        else:
            self._base = self._fallback_total()

    def count(self) -> int:
        if not self.statements:
            time.sleep(1.5)  # backends flush their counters at most once a second
            return self._fallback_total() - self._base
        row = self.conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE query NOT ILIKE '%pg_stat%'").fetchone()
        return int(row[0]) if row else 0

    def stop(self) -> None:
        self.conn.close()
        self.server.stop()


COUNTERS: dict[str, Callable[[Path], StoreCounter]] = {
    "redis": RedisCounter, "postgres": PostgresCounter}


@dataclass
class Row:
    """One instance count on one store."""

    instances: int
    commands: int
    runs: int
    due: int
    duplicates: int
    fleet_cpu_s: float
    seconds: float
    p99_ms: float
    warnings: int
    samples: list[str]

    @property
    def commands_per_run(self) -> float:
        return self.commands / self.runs if self.runs else float("nan")

    @property
    def fleet_cpu_per_min(self) -> float:
        return self.fleet_cpu_s / self.seconds * 60

    @property
    def cpu_per_run(self) -> float:
        return self.fleet_cpu_s / self.runs if self.runs else float("nan")


def run_fleet(counter: StoreCounter, instances: int, jobs: int, every: str,  # noqa: PLR0917
              seconds: float, warmup_s: float, drain_s: float, *,
              contenders: bool = True) -> Row:
    """Run ``instances`` processes on a fresh namespace of the store; return the row."""
    url = counter.url(f"f{uuid.uuid4().hex[:10]}")
    ctx = mp.get_context("spawn")
    ready: mp.Queue[int] = ctx.Queue()
    out: mp.Queue[dict[str, Any]] = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_instance,
                         args=(url, jobs, every, i, ready, go, seconds, drain_s, out,
                               contenders))
             for i in range(instances)]
    interval = parse_duration_ms(every)
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=START_TIMEOUT_S)
        time.sleep(warmup_s)
        # Begin halfway between two instants, so that every slot of the window is claimed
        # (jitter included) inside it and none of the slots before or after.
        now_ms = time.time() * 1000
        time.sleep(((interval // 2 - now_ms) % interval) / 1000)
        counter.reset()
        began = time.time() * 1000
        go.set()
        time.sleep(seconds)
        ended = time.time() * 1000
        commands = counter.count()
        results = [out.get(timeout=drain_s + START_TIMEOUT_S) for _ in procs]
    finally:
        go.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    per_slot = Counter((job, slot) for r in results for job, slot, _ in r["starts"])
    window = [key for key in per_slot if began <= key[1] <= ended]
    due_slots = {slot for _, slot in window} | set(
        range(-(-int(began) // interval) * interval, int(ended) + 1, interval))
    due = len(due_slots) * jobs
    lateness = [late for r in results for _, slot, late in r["starts"]
                if began <= slot <= ended]
    return Row(
        instances=instances, commands=commands, runs=len(window), due=due,
        duplicates=sum(n - 1 for n in per_slot.values() if n > 1),
        fleet_cpu_s=sum(r["cpu_s"] for r in results), seconds=seconds,
        p99_ms=_percentile(lateness, 0.99), warnings=sum(r["warnings"] for r in results),
        samples=[s for r in results for s in r["samples"]][:3])


def print_rows(store: str, method: str, column: str, rows: list[Row], mode: str) -> None:
    """The table of one store and mode, with ratios to its row of fewest instances."""
    base = min(rows, key=lambda r: r.instances)
    of = "one instance" if base.instances == 1 else f"{base.instances} instances"
    title = "contender sets" if mode == "contenders" else "every instance claims every slot"
    print(f"\n{store}, {title}: {method}\n")
    print(f"| instances | {column} | fleet CPU s/min (sum of instances) | runs / due | "
          f"slots run twice | lateness p99 (ms) | commands per run ÷ {of} | "
          f"fleet CPU per run ÷ {of} | warning lines |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.instances} | {r.commands_per_run:.1f} | {r.fleet_cpu_per_min:.2f} | "
              f"{r.runs:,} / {r.due:,} | {r.duplicates} | {r.p99_ms:.0f} | "
              f"{r.commands_per_run / base.commands_per_run:.2f} | "
              f"{r.cpu_per_run / base.cpu_per_run:.2f} | {r.warnings} |")
    if mode == "contenders":
        print_model(rows, base)
    for r in rows:
        for sample in r.samples:
            print(f"  {store} ×{r.instances} log sample: {sample}")


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line ``a + b * n`` through ``points`` (n, value)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return mean_y - slope * mean_x, slope


def print_model(rows: list[Row], base: Row) -> None:
    """Both ratios at MODEL_INSTANCES, from a line checked against the largest fleet.

    The line goes through the rows of more instances than contenders (where a slot's work
    no longer grows with the fleet, so what grows is each instance's own upkeep), the
    largest fleet left out: its measured ratio is the check of the line.
    """
    grown = sorted((r for r in rows if r.instances > CONTENDERS), key=lambda r: r.instances)
    if len(grown) < 3:
        return
    *fitted, check = grown
    parts = []
    measures: list[tuple[str, Callable[[Row], float]]] = [
        ("commands per run", lambda r: r.commands_per_run / base.commands_per_run),
        ("fleet CPU per run", lambda r: r.cpu_per_run / base.cpu_per_run)]
    for name, value in measures:
        a, b = fit([(r.instances, value(r)) for r in fitted])
        parts.append(f"{name} ÷ one instance ≈ {a + b * MODEL_INSTANCES:.2f} (line "
                     f"{a:.2f} + {b:.3f} × N through {', '.join(str(r.instances) for r in fitted)}"
                     f" instances; at {check.instances} it gives {a + b * check.instances:.2f},"
                     f" measured {value(check):.2f})")
    print(f"\nModel for {MODEL_INSTANCES} instances: " + "; ".join(parts))


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        return [kind(part.strip()) for part in text.split(",") if part.strip()]
    return parse


def _stores(text: str) -> list[str]:
    stores: list[str] = _csv(str)(text)
    unknown = set(stores) - set(STORES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown store(s) {sorted(unknown)}; "
                                         f"choose from {', '.join(STORES)}")
    return stores


def _modes(text: str) -> list[str]:
    modes: list[str] = _csv(str)(text)
    unknown = set(modes) - set(MODES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {sorted(unknown)}; "
                                         f"choose from {', '.join(MODES)}")
    return modes


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m bench.fleet_claims``."""
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_claims")
    parser.add_argument("--backend", type=_stores, default=list(STORES),
                        help="comma-separated stores (default: redis,postgres)")
    parser.add_argument("--instances", type=_csv(int), default=[1, 2, 4, 6, 8],
                        help="comma-separated instance counts (default: 1,2,4,6,8)")
    parser.add_argument("--modes", type=_modes, default=list(MODES),
                        help="comma-separated: contenders (contender sets, the default) "
                             "and/or all (contenders=False); default both")
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--every", default="5s")
    parser.add_argument("--seconds", type=float, default=30.0)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    warmup_s, drain_s = WARMUP_S, DRAIN_S
    if args.smoke:
        args.jobs, args.every, args.seconds, args.instances = 100, "1s", 2.0, [1, 2]
        warmup_s, drain_s = 0.5, 1.0
    if not args.instances or min(args.instances) < 1:
        parser.error("--instances needs counts of 1 or more")
    slots_per_s = args.jobs / (parse_duration_ms(args.every) / 1000)
    print(f"{args.jobs} no-op jobs every {args.every} ({slots_per_s:,.0f} slots/s), "
          f"{args.seconds:.0f} s window, instances {', '.join(map(str, args.instances))}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="anarchon-fleet-") as tmp:
        for store in args.backend:
            counter = COUNTERS[store](Path(tmp))
            try:
                for mode in args.modes:
                    rows = [run_fleet(counter, n, args.jobs, args.every, args.seconds,
                                      warmup_s, drain_s, contenders=MODES[mode])
                            for n in args.instances]
                    print_rows(store, counter.method, counter.column, rows, mode)
                    failed = failed or any(r.duplicates for r in rows)
            finally:
                counter.stop()
    if failed:
        raise SystemExit("slots run twice: the exactly-once promise failed")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
