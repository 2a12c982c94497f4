"""Store footprint: bytes per job and per run record after an hour of a fleet, and its bound.

    python -m bench.footprint [--backend redis|postgres|sqlite ...] [--jobs 10000]
        [--instances 5] [--minutes 60] [--history-size 10] [--concurrency 200]
        [--vacuum-every 5] [--postgres-url URL] [--redis-server PATH] [--smoke]

An hour of a fleet, without waiting an hour: ``--instances`` backends (one connection of
its own each, runner ids ``host-1`` .. ``host-N``) play the instances of one service with
``--jobs`` jobs ``every("60s")``. For each of the ``--minutes`` one-minute slots before
the start (by the store's clock), in order, every instance claims every job's slot (the
claims of one slot at the same time, at most ``--concurrency`` jobs in flight); exactly
one claim wins and its instance finishes the run (``success``, no meta). The command stops
with an error on any other answer: two winners, none, or an outcome other than
``running``/``done`` for the others.

The hour runs twice per store: with the retention a ``Scheduler`` configures by default
(``history_size=1000``: nothing of the hour is trimmed), then with
``Scheduler(history_size=--history-size)``. The retention is the one a real scheduler
with these jobs configures on its backend (``keep_ms``: the job's ``max_late_ms`` and
jitter plus a margin, printed under the table). Only the claims carry a larger
``max_late_ms``, so that the slots of the simulated hour, all in the past, are claimed
rather than skipped as late; trimming reads the store's clock at the end of the hour, so
it keeps the last ``keep_ms`` of slots, as it would at the end of a real hour.

Footprint, measured after the hour and at each quarter of it:

* Redis: ``used_memory`` of a dedicated ``redis-server`` (started on a free loopback port
  for each pass, stopped by its PID) minus what it used empty, client buffers left out;
  the detail column adds the sum of ``MEMORY USAGE`` over every key, per part of the key
  layout. Records kept: the runs in the jobs' ``slots`` sets. About 0.5 MB of the
  difference is the server's own (scripts, structures grown on first use): it swamps the
  smoke profile, not 10,000 jobs.
* PostgreSQL: ``pg_total_relation_size`` (heap, TOAST, indexes) of the runs table and its
  ``_meta`` table, a fresh table name in the given database for each pass, dropped at the
  end. Records kept: rows. The table is ``VACUUM``-ed every ``--vacuum-every`` simulated
  minutes, standing in for autovacuum (which would visit it about every minute of a real
  hour; a shared test server may run with it off).
* SQLite: the pages of the database (``page_count``, those still in the WAL included), a
  file in a temporary directory; the WAL file's peak size is in the detail column (it is
  bounded by checkpoints, not by the history). Records kept: rows.

Bytes per job is the footprint over ``--jobs``; bytes per run kept is over the records
kept. The default stores are Redis and PostgreSQL (``--backend sqlite`` adds SQLite);
``--smoke`` runs all three, both retentions, with 20 jobs over 8 minutes.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import os
import shutil
import socket
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis.asyncio as aioredis

from anarchon_core import JobContext, Scheduler
from anarchon_core.backend import Backend, Retention, new_token
from anarchon_core.backends.redis.keys import redis_key
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef
from anarchon_core.schema import sql_names
from anarchon_core.url import backend_from_url, mask_url

from .common import add_smoke_flag

STORES = ("redis", "postgres", "sqlite")
DEFAULT_POSTGRES_URL = os.environ.get("ANARCHON_BENCH_POSTGRES_URL",
                                      "postgresql://postgres@127.0.0.1:5432/test")
EVERY = "60s"
EVERY_MS = 60_000
LEASE_MS = 30_000
REDIS_PREFIX = "fp:"
#: Bound on one simulated minute (every job's claims and finish); a stuck store fails.
MINUTE_TIMEOUT_S = 600.0
#: Bound on starting a redis-server, and on stopping anything this command started.
START_TIMEOUT_S = 10.0
#: Bound on SCAN rounds over a dedicated server (COUNT 1000 each).
MAX_SCAN_ROUNDS = 100_000
LOSING = (ClaimOutcome.RUNNING, ClaimOutcome.DONE)


class ExactlyOnceError(Exception):
    """A claim or finish did not answer what exactly-once requires."""


def job_name(i: int) -> str:
    """The name of job ``i`` (``job00042``)."""
    return f"job{i:05d}"


UNITS = {"B": 1, "KB": 1_000, "MB": 1_000_000, "GB": 1_000_000_000}


def human(n: float, unit: str | None = None) -> str:
    """Bytes as ``12.3 MB`` (or in the given unit)."""
    unit = unit or unit_for(n)
    return f"{n / UNITS[unit]:,.1f} {unit}"


def unit_for(n: float) -> str:
    """The largest unit in which ``n`` bytes is at least 1."""
    return next((u for u in ("GB", "MB", "KB") if abs(n) >= UNITS[u]), "B")


# ------------------------------------------------------------------------ stores


class Probe(abc.ABC):
    """One pass's store: where the instances connect, and how its footprint is read."""

    url: str

    @abc.abstractmethod
    async def open(self) -> None:
        """Get the store ready and read what it holds empty."""

    @abc.abstractmethod
    async def footprint(self) -> int:
        """Bytes the namespace takes now (see the module docstring, per store)."""

    @abc.abstractmethod
    async def kept(self, jobs: int) -> tuple[int, int]:
        """Run records kept: in all, and for the job with the most."""

    @abc.abstractmethod
    async def detail(self) -> str:
        """A few words on what the footprint is made of."""

    async def after_minute(self, minute: int) -> None:  # noqa: B027 - optional hook
        """Housekeeping between simulated minutes (PostgreSQL's VACUUM)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop or drop whatever :meth:`open` started or created."""


class RedisProbe(Probe):
    """A dedicated redis-server on a free loopback port, for one pass only."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.proc: asyncio.subprocess.Process | None = None
        self.client: aioredis.Redis | None = None
        self.empty = 0
        self.stream_entries = 0

    async def open(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with (self.workdir / f"redis-{port}.log").open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir),
                stdout=log, stderr=asyncio.subprocess.STDOUT)
        self.client = aioredis.Redis(host="127.0.0.1", port=port, decode_responses=True,
                                     socket_timeout=30)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                await self.client.ping()
                break
            except (OSError, aioredis.RedisError):
                if time.monotonic() > deadline or self.proc.returncode is not None:
                    raise SystemExit(f"{self.binary} did not answer on port {port} "
                                     f"within {START_TIMEOUT_S:g} s") from None
                await asyncio.sleep(0.05)
        self.empty = await self._used()
        self.url = f"redis://127.0.0.1:{port}/0?prefix={REDIS_PREFIX}"

    async def _used(self) -> int:
        assert self.client is not None
        info = await self.client.info("memory")
        return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))

    async def footprint(self) -> int:
        return await self._used() - self.empty

    async def kept(self, jobs: int) -> tuple[int, int]:
        assert self.client is not None
        total, most = 0, 0
        for start in range(0, jobs, 1000):
            pipe = self.client.pipeline(transaction=False)
            for i in range(start, min(jobs, start + 1000)):
                pipe.zcard(redis_key(REDIS_PREFIX, "slots", job_name(i), tagged=True))
                pipe.xlen(redis_key(REDIS_PREFIX, "runs", job_name(i), tagged=True))
            counts = [int(n) for n in await pipe.execute()]
            total += sum(counts[::2])
            most = max(most, *counts[::2])
            self.stream_entries += sum(counts[1::2])
        return total, most

    async def detail(self) -> str:
        assert self.client is not None
        keys, by_part, cursor = 0, Counter[str](), 0
        for _ in range(MAX_SCAN_ROUNDS):
            cursor, batch = await self.client.scan(cursor, count=1000)
            if batch:
                pipe = self.client.pipeline(transaction=False)
                for key in batch:
                    pipe.memory_usage(key, samples=0)
                for key, size in zip(map(str, batch), await pipe.execute(), strict=True):
                    part = key.rsplit(":", 1)[1] if key.startswith("{") else "other"
                    by_part[part] += int(size or 0)
                keys += len(batch)
            if cursor == 0:
                break
        parts = ", ".join(f"{part} {human(size)}" for part, size in by_part.most_common())
        return (f"used_memory Δ; Σ MEMORY USAGE {human(sum(by_part.values()))} over "
                f"{keys:,} keys ({parts}); {self.stream_entries:,} entries in the runs streams")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), START_TIMEOUT_S)
            except TimeoutError:
                self.proc.kill()
                await asyncio.wait_for(self.proc.wait(), START_TIMEOUT_S)


class PostgresProbe(Probe):
    """A fresh table in the given database, dropped at the end."""

    def __init__(self, base_url: str, vacuum_every: int) -> None:
        self.base_url = base_url
        self.vacuum_every = vacuum_every
        table = f"footprint_{uuid.uuid4().hex[:10]}"
        names = sql_names("postgresql", table)
        self.runs, self.meta = names.runs, names.meta
        self.url = f"{base_url}{'&' if '?' in base_url else '?'}table={table}"
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.vacuums = 0

    async def open(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(self.base_url, autocommit=True,
                                                          connect_timeout=10)

    async def _one(self, query: str) -> tuple[Any, ...]:
        assert self.conn is not None
        cur = await self.conn.execute(query)
        row = await cur.fetchone()
        assert row is not None
        return tuple(row)

    async def footprint(self) -> int:
        (size,) = await self._one(
            f"SELECT pg_total_relation_size('{self.runs}') + pg_total_relation_size('{self.meta}')")
        return int(size)

    async def after_minute(self, minute: int) -> None:
        if self.vacuum_every and minute % self.vacuum_every == 0:
            assert self.conn is not None
            await self.conn.execute(f"VACUUM {self.runs}")
            self.vacuums += 1

    async def kept(self, jobs: int) -> tuple[int, int]:
        total, most = await self._one(
            f"SELECT COALESCE(SUM(n), 0), COALESCE(MAX(n), 0) FROM "
            f"(SELECT COUNT(*) AS n FROM {self.runs} GROUP BY job) per_job")
        return int(total), int(most)

    async def detail(self) -> str:
        heap, indexes = await self._one(
            f"SELECT pg_table_size('{self.runs}'), pg_indexes_size('{self.runs}')")
        return (f"heap {human(heap)} + indexes {human(indexes)}; "
                f"{self.vacuums} VACUUMs")

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.execute(f"DROP TABLE IF EXISTS {self.runs}, {self.meta}")
            await self.conn.close()


class SqliteProbe(Probe):
    """A database file in a temporary directory."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.path = workdir / f"{name}.db"
        self.wal = self.path.with_name(self.path.name + "-wal")
        self.url = f"sqlite:///{self.path}"
        self.wal_peak = 0

    async def open(self) -> None:
        pass

    @staticmethod
    def _size(path: Path) -> int:
        return path.stat().st_size if path.exists() else 0

    async def footprint(self) -> int:
        # The database's size as a reader sees it (pages still in the WAL included); the
        # WAL file itself is bounded by SQLite's checkpoints, not by the history.
        self.wal_peak = max(self.wal_peak, self._size(self.wal))
        if not self.path.exists():
            return 0
        (pages,) = await asyncio.to_thread(self._query, "PRAGMA page_count")
        (page,) = await asyncio.to_thread(self._query, "PRAGMA page_size")
        return int(pages) * int(page)

    def _query(self, query: str) -> tuple[Any, ...]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        try:
            return tuple(conn.execute(query).fetchone())
        finally:
            conn.close()

    async def kept(self, jobs: int) -> tuple[int, int]:
        total, most = await asyncio.to_thread(
            self._query, "SELECT COALESCE(SUM(n), 0), COALESCE(MAX(n), 0) FROM "
                         "(SELECT COUNT(*) AS n FROM anarchon_runs GROUP BY job)")
        return int(total), int(most)

    async def detail(self) -> str:
        (free,) = await asyncio.to_thread(self._query, "PRAGMA freelist_count")
        (page,) = await asyncio.to_thread(self._query, "PRAGMA page_size")
        return (f"pages of the database file, {human(free * page)} of them free; WAL file "
                f"up to {human(self.wal_peak)} while running")

    async def close(self) -> None:
        pass


# ------------------------------------------------------------------------ the hour


@dataclass
class Row:
    """One pass: a store, a retention, an hour."""

    store: str
    retention: Retention
    runs: int = 0
    kept: int = 0
    most_per_job: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)
    total: int = 0
    detail: str = ""
    seconds: float = 0.0


async def _noop(ctx: JobContext) -> None:
    """The registered job's handler (never run: the scheduler is not started)."""


def configure_like_scheduler(backend: Backend, instance: str, history_size: int | None) -> None:
    """Give ``backend`` the retention a Scheduler with ``every("60s")`` jobs gives it."""
    kwargs = {} if history_size is None else {"history_size": history_size}
    scheduler = Scheduler(backend, instance_id=instance, **kwargs)
    scheduler.every(job_name(0), EVERY, _noop)


async def run_slot(fleet: list[tuple[str, Backend]], job: str, slot: int,
                   max_late_ms: int) -> None:
    """Every instance claims ``(job, slot)``; the one that wins finishes the run."""
    requests = [ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner,
                             lease_ms=LEASE_MS, overlap=True, max_late_ms=max_late_ms)
                for runner, _ in fleet]
    answers = await asyncio.gather(*(backend.claim(req) for (_, backend), req
                                      in zip(fleet, requests, strict=True)))
    won = [i for i, answer in enumerate(answers) if answer.won]
    if len(won) != 1 or any(a.outcome not in LOSING for i, a in enumerate(answers)
                            if i not in won):
        raise ExactlyOnceError(f"{job} slot {slot}: {[a.outcome.value for a in answers]}")
    (winner,) = won
    ref = RunRef(job, slot, requests[winner].token, answers[winner].attempt)
    if not await fleet[winner][1].finish(ref, "success"):
        raise ExactlyOnceError(f"{job} slot {slot}: the winner's finish was refused")


async def run_minute(fleet: list[tuple[str, Backend]], jobs: int, slot: int,
                     max_late_ms: int, concurrency: int) -> None:
    """One slot of every job, ``concurrency`` jobs in flight."""
    queue = iter(range(jobs))

    async def worker() -> None:
        for i in queue:
            await run_slot(fleet, job_name(i), slot, max_late_ms)

    tasks = [asyncio.ensure_future(worker()) for _ in range(max(1, min(concurrency, jobs)))]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), MINUTE_TIMEOUT_S)
    finally:
        # A failed slot or the time bound ends the other workers too, before the backends
        # are stopped under them.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def checkpoints(minutes: int) -> list[int]:
    """The simulated minutes after which the footprint is read: each quarter of the run."""
    return sorted({max(1, round(minutes * q / 4)) for q in range(1, 5)})


async def run_pass(store: str, probe: Probe, *, jobs: int, instances: int, minutes: int,
                   history_size: int | None, concurrency: int) -> Row:
    """Simulate the hour on ``probe``'s store with one retention; return its row."""
    await probe.open()
    try:
        fleet: list[tuple[str, Backend]] = []
        for n in range(1, instances + 1):
            backend = backend_from_url(probe.url)
            configure_like_scheduler(backend, f"host-{n}", history_size)
            fleet.append((f"host-{n}", backend))
        row = Row(store, fleet[0][1].retention)
        try:
            await asyncio.gather(*(backend.start() for _, backend in fleet))
            now = await fleet[0][1].clock_ms()
            first = (now // EVERY_MS - minutes) * EVERY_MS
            # The claims come up to `minutes` after their slot: never late for this run.
            max_late_ms = (minutes + 10) * EVERY_MS
            marks = checkpoints(minutes)
            started = time.perf_counter()
            for minute in range(minutes):
                await run_minute(fleet, jobs, first + minute * EVERY_MS, max_late_ms,
                                 concurrency)
                row.runs += jobs
                await probe.after_minute(minute + 1)
                if minute + 1 in marks:
                    row.samples.append((minute + 1, await probe.footprint()))
            row.seconds = time.perf_counter() - started
            print(f"{store}, history_size {row.retention.history_size}: {minutes} simulated "
                  f"minutes in {row.seconds:.0f} s", file=sys.stderr)
        finally:
            for _, backend in fleet:
                await asyncio.wait_for(backend.stop(), START_TIMEOUT_S)
        row.total = await probe.footprint()
        row.kept, row.most_per_job = await probe.kept(jobs)
        row.detail = await probe.detail()
        return row
    finally:
        await probe.close()


def print_rows(rows: list[Row], args: argparse.Namespace) -> None:
    """The markdown table, then what the figures rest on."""
    marks = " / ".join(str(m) for m in checkpoints(args.minutes))
    print(f"\n{args.jobs:,} jobs every {EVERY}, {args.instances} instances, {args.minutes} "
          f"simulated minutes: {args.jobs * args.minutes:,} runs, "
          f"{args.jobs * args.minutes * args.instances:,} claims per row\n")
    print(f"| store | history_size | runs recorded | run records kept | kept per job "
          f"(mean / max) | footprint after {marks} min | bytes per job | bytes per run kept "
          f"| made of | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        unit = unit_for(r.total)
        curve = " / ".join(human(size, unit).split()[0] for _, size in r.samples)
        per_run = r.total / r.kept if r.kept else float("nan")
        print(f"| {r.store} | {r.retention.history_size:,} | {r.runs:,} | {r.kept:,} | "
              f"{r.kept / args.jobs:.1f} / {r.most_per_job} | {curve} {unit} | "
              f"{r.total / args.jobs:,.0f} | {per_run:,.0f} | {r.detail} | {r.seconds:.0f} |")
    keep = {r.retention.keep_ms for r in rows}
    print(f"\nRetention as a Scheduler configures it for every({EVERY!r}) jobs: keep_ms "
          f"{', '.join(f'{k:,}' for k in sorted(keep))} (runs newer than that are never "
          f"trimmed), history_ttl_ms none. Runner ids host-1..host-{args.instances}, "
          f"lease {LEASE_MS:,} ms, no meta.")


async def amain(args: argparse.Namespace) -> list[Row]:
    """Every store, both retentions."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="anarchon-footprint-") as tmp:
        for store in args.backend:
            for history_size in (None, args.history_size):
                probe: Probe
                if store == "redis":
                    probe = RedisProbe(args.redis_server, Path(tmp))
                elif store == "postgres":
                    probe = PostgresProbe(args.postgres_url, args.vacuum_every)
                else:
                    probe = SqliteProbe(Path(tmp), f"footprint-{len(rows)}")
                try:
                    rows.append(await run_pass(
                        store, probe, jobs=args.jobs, instances=args.instances,
                        minutes=args.minutes, history_size=history_size,
                        concurrency=args.concurrency))
                except ExactlyOnceError as exc:
                    raise SystemExit(f"{store}: exactly-once failed: {exc}") from None
    return rows


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m bench.footprint``."""
    parser = argparse.ArgumentParser(prog="python -m bench.footprint",
                                     description="Store footprint after a simulated hour.")
    parser.add_argument("--backend", action="append", choices=STORES,
                        help="store(s) to measure (default: redis and postgres; "
                             "with --smoke all three)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--minutes", type=int, default=60,
                        help="simulated minutes: one slot per job each")
    parser.add_argument("--history-size", type=int, default=10,
                        help="the small retention of each store's second pass")
    parser.add_argument("--concurrency", type=int, default=200,
                        help="jobs whose slot is being claimed at once")
    parser.add_argument("--vacuum-every", type=int, default=5, metavar="MINUTES",
                        help="VACUUM the PostgreSQL table every this many simulated "
                             "minutes (0: never)")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--redis-server", default=shutil.which("redis-server"),
                        help="redis-server binary to start (default: the one on PATH)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.jobs, args.minutes, args.history_size = 20, 8, 3
        args.concurrency, args.vacuum_every = 20, 2
        args.backend = args.backend or list(STORES)
    args.backend = args.backend or ["redis", "postgres"]
    if min(args.jobs, args.instances, args.minutes, args.history_size, args.concurrency) < 1:
        parser.error("--jobs, --instances, --minutes, --history-size and --concurrency "
                     "must be at least 1")
    if "redis" in args.backend and not args.redis_server:
        parser.error("redis-server is not on PATH; pass --redis-server or leave out redis")
    if "postgres" in args.backend:
        print(f"PostgreSQL: {mask_url(args.postgres_url)}")
    print_rows(asyncio.run(amain(args)), args)


if __name__ == "__main__":
    main()
