"""Every ``bench/`` command still runs: its ``--smoke`` profile exits 0 and prints its tables.

Nothing here looks at a figure (tiny counts measure nothing): a command passes when it
runs against the current code and prints each of its tables with the row it is measured
against (the floor) and its measured rows. Each command runs as users run it, a
subprocess ``python -m bench.<name> --smoke``, on the stores the rest of the suite uses;
RabbitMQ only ever on the test session's own node. A missing store skips loudly, or fails
under ``CI=true``.

A new benchmark joins by adding a :class:`Smoke` entry to ``SMOKES`` (its command must
take ``--smoke``); :func:`test_every_bench_command_is_smoke_tested` fails until it does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from .stores import StoreHandle, unavailable
from .stores import nats as nats_store
from .stores import postgres as postgres_store
from .stores import rabbitmq as rabbitmq_store
from .stores import redis as redis_store

ROOT = Path(__file__).resolve().parents[1]
#: Bound on one smoke run; each takes a few seconds.
TIMEOUT_S = 60

_NUM = r"\d+(?:\.\d+)?"


@dataclass(frozen=True)
class Expect:
    """A line pattern the output must match exactly ``times`` times."""

    pattern: str
    times: int = 1


def floor_row(label: str, times: int = 1) -> Expect:
    """The floor row: label, median, p99, ops/s, and 1.00 (its median over itself)."""
    return Expect(rf"^{re.escape(label)} +{_NUM} +{_NUM} +{_NUM} +1\.00$", times)


def row(label: str, times: int = 1) -> Expect:
    """A measured row: label, median, p99, ops/s, and its ratio to the floor."""
    return Expect(rf"^{re.escape(label)} +{_NUM} +{_NUM} +{_NUM} +{_NUM}$", times)


def table(floor: str, rows: list[str], times: int = 1) -> list[Expect]:
    """A ``bench.common.print_table`` table: header, floor row and measured rows."""
    header = Expect(r"^operation +median ms +p99 ms +ops/s +median ×floor$", times)
    return [header, floor_row(floor, times), *(row(label, times) for label in rows)]


def dedicated_amqp() -> str:
    """The test session's own RabbitMQ node; never the machine's shared broker."""
    if rabbitmq_store.URL == rabbitmq_store.SHARED_URL:
        unavailable("a dedicated RabbitMQ node",
                    "none was started (the shared broker is not used for benchmarks)")
    return rabbitmq_store.URL


def own_redis_server() -> list[str]:
    """``--redis-server`` for a command that starts its own Redis: the binary on PATH."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server", "not on PATH (the command starts its own server)")
    return ["--redis-server", str(binary)]


def own_servers(*binaries: str) -> list[str]:
    """No arguments; first, each server binary a command starts on its own is on PATH."""
    for binary in binaries:
        if shutil.which(binary) is None:
            unavailable(binary, "not on PATH (the command starts its own server)")
    return []


@dataclass(frozen=True)
class Smoke:
    """One benchmark command's smoke run and what its output must show."""

    id: str
    module: str
    expect: list[Expect]
    #: Store ids (see tests/stores) opened first: a missing one skips, or fails under CI.
    stores: tuple[str, ...] = ()
    #: Extra arguments, built once the stores are known to be there.
    args: Callable[[], list[str]] = list


SMOKES: list[Smoke] = [
    Smoke("core", "bench.core", [
        Expect(r"^processes +anarchon claim/s +INSERT floor/s +claim ÷ floor$"),
        Expect(rf"^ +1 +\d+ +\d+ +{_NUM}$"),
        Expect(rf"^ +4 +\d+ +\d+ +{_NUM}$"),
        Expect(rf"^1,000 daily jobs \(timers only\) +{_NUM} +{_NUM}%$"),
        Expect(rf"^1,000 every\('10s'\) no-op jobs +{_NUM} +{_NUM}%$"),
    ]),
    Smoke("redis", "bench.claims_redis", [
        *table("floor: SET NX PX 30000", [], times=3),
        row("lease: claim (wins)"), row("lease: claim (running: backup)"),
        row("lease: its six commands alone"), row("lease: its script alone"),
        row("stream-id: claim (wins)"), row("script: claim (wins)"),
    ], stores=("redis",), args=lambda: ["--url", redis_store.SHARED_URL]),
    Smoke("postgres", "bench.claims_postgres", [
        *table("floor: INSERT ON CONFLICT", [
            "claim won", "claim lost (backup check)", "heartbeat",
            "claim won, 1000 rows of history", "claim won, pool of 4"]),
        Expect(r"^throughput ÷ floor: claim won: "),
    ], stores=("postgres",), args=lambda: ["--url", postgres_store.POSTGRES_URL]),
    Smoke("rabbitmq", "bench.claims_brokers", [
        Expect(r"^RabbitMQ "),
        *table("confirmed publish (floor)", ["claim, won", "claim, taken"]),
    ], stores=("rabbitmq",), args=lambda: ["--only", "rabbitmq", "--amqp", dedicated_amqp()]),
    Smoke("scale", "bench.scale", [
        Expect(r"^\| store \| CPU s/min per instance \| lateness p50 / p99 / max \(ms\) \|"),
        *(Expect(rf"^\| {store} \| {_NUM} \| {_NUM} / {_NUM} / {_NUM} \| \d+ \| "
                 rf"\d+ / \d+ \| 0 \| \d+ \|$") for store in ("redis", "postgres")),
        Expect(r"^\| register s \| start s \| idle CPU s/min \| bytes per job \|$"),
    ], stores=("redis", "postgres")),
    Smoke("fleet-claims", "bench.fleet_claims", [
        *(Expect(rf"^{store}, {mode}: dedicated ") for store in ("redis", "postgres")
          for mode in ("contender sets", "every instance claims every slot")),
        Expect(r"^\| instances \| [\w +]+ per run \| fleet CPU s/min \(sum of instances\) \| "
               r"runs / due \| slots run twice \|", 4),
        *(Expect(rf"^\| {n} \| {_NUM} \| {_NUM} \| [\d,]+ / [\d,]+ \| 0 \| \d+ \| "
                 rf"{ratio} \| {ratio} \| \d+ \|$", 4)
          for n, ratio in ((1, r"1\.00"), (2, _NUM))),
    ], args=lambda: own_servers("redis-server", "initdb", "pg_ctl")),
    Smoke("nats", "bench.claims_brokers", [
        Expect(r"^NATS JetStream "),
        *table("JetStream publish (floor)", ["claim, won", "claim, taken"]),
    ], stores=("nats",), args=lambda: ["--only", "nats", "--nats", nats_store.URL]),
    Smoke("apscheduler", "bench.apscheduler_duplicates", [
        Expect(r"^store +setup +firings +runs +runs/firing +duplicates +missing$"),
        *(Expect(rf"^sqlite +{re.escape(s)} +\d+ +\d+ +{_NUM} +\d+ +\d+$") for s in (
            "no wrapper (shared store)", "AnarchonExecutor", "+ AnarchonJobStore")),
    ]),
    Smoke("celery", "bench.celery_beats", [
        Expect(r"^scheduler +sends +duplicates +missing +period ms$"),
        Expect(r"^scheduler +longest gap s +slots lost +of slots$"),
        Expect(r"^scheduler +CPU s/min +due +on time % +≤1 s late % +p95 late s$"),
        *(Expect(rf"^{kind} +[\d .na]+$", 3) for kind in ("default", "redbeat", "anarchon")),
        Expect(r"^floor +[\d.]+ +- +- +- +- +\(apply_async of the same sends"),
    ]),
    Smoke("footprint", "bench.footprint", [
        Expect(r"^\| store \| history_size \| runs recorded \| run records kept \| kept per job "),
        *(Expect(rf"^\| {store} \| {size} \| 160 \| \d+ \| {_NUM} / \d+ \| "
                 rf"[-\d.,/ ]+ [KMG]?B \| -?[\d,]+ \| -?[\d,]+ \| .+ \| \d+ \|$")
          for store in ("redis", "postgres", "sqlite") for size in ("1,000", "3")),
    ], stores=("postgres",), args=lambda: [
        "--postgres-url", postgres_store.POSTGRES_URL, *own_redis_server()]),
    Smoke("overlap-kill", "bench.overlap_kill", [
        Expect(r"^\| overlap \| slots due in the lease after the kill \| run \| skipped \| "
               r"late runs \| run ÷ allow \| longest gap between starts \(s\) \| runs at once "
               r"\| killed slot \|$"),
        Expect(rf"^\| allow \| \d+ \| \d+ \| \d+ \| \d+ \| 1\.00 \| {_NUM} \| \d+ \| .+ \|$"),
        *(Expect(rf"^\| {policy} \| \d+ \| \d+ \| \d+ \| \d+ \| {_NUM} \| {_NUM} \| 0 \| "
                 r".+ \|$") for policy in ("skip", "buffer_one")),
    ], args=lambda: ["--backend", "sqlite"]),
    Smoke("django-tasks", "bench.django_tasks", [
        Expect(r"^Django [\d.]+\w*, Python [\d.]+\w*, SQLite; 20 entries every 1 s, 3 s "
               r"measured per row$"),
        Expect(r"^row +tasks +CPU s/min +×floor +late p50 ms +late p99 ms +tasks/slot$"),
        Expect(rf"^floor: enqueue\(\) loop +\d+ +{_NUM} +1\.00 +{_NUM} +{_NUM} +\d+/\d+$"),
        Expect(rf"^anarchon: scheduled tasks +\d+ +{_NUM} +{_NUM} +{_NUM} +{_NUM} +\d+/\d+$"),
    ]),
    # Starts its own PostgreSQL (initdb) and redis-server, as the full run does.
    Smoke("db-schedules", "bench.db_schedules", [
        Expect(r"^\| rows \| scheduler \| start-up s \| late p50 / p99 ms \| × code p50 / p99 "
               r"\| runs / due \|"),
        *(Expect(rf"^\| 20 \| {re.escape(label)} \| {_NUM} \| -?[\d,]+ / -?[\d,]+ \| "
                 rf"[-\d.na]+ / [-\d.na]+ \| \d+ / 20 \| {_NUM} / {_NUM} \| {_NUM} \| "
                 rf"-?[\d,]+ \| {edits} \| [\d,]+ \|$")
          for label, edits in (
              ("anarchon: Schedule table (1 worker)", rf"{_NUM} / {_NUM}"),
              ("anarchon: code-declared jobs (1 worker)", "-"),
              ("django-celery-beat DatabaseScheduler (1 beat)", rf"{_NUM} / {_NUM}"))),
    ]),
]


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def bench_commands() -> set[str]:
    """Every runnable module of ``bench/`` (one with a ``__main__`` block)."""
    return {f"bench.{path.stem}" for path in (ROOT / "bench").glob("*.py")
            if 'if __name__ == "__main__":' in path.read_text()}


def test_every_bench_command_is_smoke_tested() -> None:
    missing = bench_commands() - {smoke.module for smoke in SMOKES}
    assert not missing, f"add a Smoke entry to SMOKES in {Path(__file__).name} for {missing}"


@pytest.mark.parametrize("smoke", SMOKES, ids=[smoke.id for smoke in SMOKES])
def test_smoke_profile_runs_and_prints_tables(
        smoke: Smoke, store_handles: Callable[[str], StoreHandle]) -> None:
    for store in smoke.stores:
        store_handles(store)
    command = [sys.executable, "-m", smoke.module, "--smoke", *smoke.args()]
    try:
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                             timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command[1:])} still running after {TIMEOUT_S} s:\n"
                    f"{_text(exc.stdout)}\n{_text(exc.stderr)}")
    report = f"$ {' '.join(command[1:])}\n{out.stdout}\n{out.stderr[-3000:]}"
    status = out.returncode
    assert status == 0, report
    for expect in smoke.expect:
        found = len(re.findall(expect.pattern, out.stdout, re.MULTILINE))
        assert found == expect.times, f"{expect.pattern!r}: {found} lines\n{report}"
