"""Real ``manage.py anarchon`` workers of the example project (examples/django).

* Exactly once across 3 workers on the database backend (SQLite file, PostgreSQL) and on
  Redis, with one worker SIGKILLed while it runs a slot: every slot in the window succeeds
  once in history and writes one ``Tick`` row through the ORM; the killed slot is taken
  over (attempt 2).
* SIGTERM is graceful: the worker hands its running slot over and exits 0; the other
  worker takes the next attempt at once instead of waiting for the lease to expire.
* A worker survives a restart of its (dedicated) PostgreSQL server: the scheduler's
  connection and the job threads' ORM connections are replaced.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from anarchon_core import Run
from tests.stores import unavailable
from tests.stores.redis import SHARED_URL as REDIS_URL
from tests.support.helpers import free_port, wait_for
from tests.support.procs import grid_slots, now_ms, read_history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django"
REPO = EXAMPLE.parents[1]
_STARTED = re.compile(r"tick slot (\d+) attempt (\d+): started on (\S+)")


@dataclass
class Setup:
    """One example deployment: its environment, and where history and ticks are read."""

    env: dict[str, str]
    history_url: str
    database_url: str


class Worker:
    """One ``manage.py anarchon`` process, its log in a file."""

    def __init__(self, setup: Setup, log: Path, *args: str) -> None:
        self.log_path = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "anarchon", *args], cwd=EXAMPLE, env=setup.env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.instance_id = f"{os.uname().nodename}:{self.proc.pid}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        return "anarchon worker " in self.log()

    def running_slot(self) -> int | None:
        """A slot this worker has started and not finished, per its log."""
        text = self.log()
        for match in reversed(list(_STARTED.finditer(text))):
            slot = match.group(1)
            if not re.search(rf"tick slot {slot} attempt \d+: (success|failed)", text):
                return int(slot)
        return None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"worker {self.proc.pid} ignored {sig.name}:\n"
                                 f"{self.log()[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def base_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANARCHON", "EXAMPLE_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "shop.settings", "EXAMPLE_DATABASE_URL": database_url,
                "PYTHONPATH": str(REPO), "EXAMPLE_TICK_EVERY": "1s",
                "EXAMPLE_TICK_SLEEP_MS": "300", "ANARCHON_LEASE_MS": "3000", **extra})
    return env


def migrate(setup: Setup) -> None:
    out = subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=EXAMPLE,
                         env=setup.env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]


def ticks(database_url: str) -> list[tuple[int, int, str]]:
    """The Tick rows: (slot, attempt, runner)."""
    query = "SELECT slot, attempt, runner FROM orders_tick"
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.split(":///", 1)[1], timeout=30) as conn:
            return [tuple(r) for r in conn.execute(query)]  # type: ignore[misc]
    with psycopg.connect(database_url, connect_timeout=5) as conn:
        return [tuple(r) for r in conn.execute(query)]  # type: ignore[misc]


# ------------------------------------------------------------------ deployments


@pytest.fixture(scope="module")
def dedicated_postgres() -> Iterator[Any]:
    """A PostgreSQL server of this module's own (restarted by a test)."""
    try:
        from chaos.servers import PostgresServer  # noqa: PLC0415

        server = PostgresServer()
    except RuntimeError as exc:
        unavailable("PostgreSQL server binaries", str(exc))
        return
    try:
        server.start()
        yield server
    finally:
        server.stop()


def postgres_database(server: Any) -> str:
    name = f"ex_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    kind = request.param
    sqlite_url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    if kind == "sqlite":
        yield Setup(base_env(sqlite_url), f"{sqlite_url}?table=anarchon_runs", sqlite_url)
    elif kind == "postgres":
        url = postgres_database(request.getfixturevalue("dedicated_postgres"))
        yield Setup(base_env(url), f"{url}?table=anarchon_runs", url)
    else:
        import redis  # noqa: PLC0415

        prefix = f"t{uuid.uuid4().hex[:10]}:"
        client = redis.Redis.from_url(REDIS_URL)
        try:
            client.ping()
        except redis.RedisError as exc:
            unavailable("Redis", str(exc))
        try:
            yield Setup(base_env(sqlite_url, ANARCHON_BACKEND=REDIS_URL,
                                 ANARCHON_PREFIX=prefix),
                        f"{REDIS_URL}?prefix={prefix}", sqlite_url)
        finally:
            keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()


# ------------------------------------------------------------------ tests


def test_exactly_once_across_three_workers_with_one_killed(deployment: Setup,
                                                           tmp_path: Path) -> None:
    migrate(deployment)
    with ExitStack() as stack:
        port = free_port()
        workers = [Worker(deployment, tmp_path / f"worker{i}.log",
                          *(["--metrics-port", str(port), "--metrics-addr", "127.0.0.1"]
                            if i == 0 else [])) for i in range(3)]
        for worker in workers:
            stack.callback(worker.kill)
        wait_for(lambda: all(w.ready() for w in workers), 60, "3 workers to start")
        begin = now_ms() + 1_500
        time.sleep(3)

        def metrics() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                return reply.read().decode()

        # With contender sets a worker claims only the slots it ranks first for (about one
        # in three here), and looks at others: wait for its first claim.
        wait_for(lambda: 'anarchon_claims_total{job="tick"' in metrics(), 20,
                 "worker 0's metrics to count a claim of tick")
        victim: Worker | None = None
        killed_slot: int | None = None
        deadline = time.monotonic() + 20
        while victim is None and time.monotonic() < deadline:
            for worker in workers:
                slot = worker.running_slot()
                if slot is not None:
                    worker.kill()  # SIGKILL while it runs a slot
                    victim, killed_slot = worker, slot
                    break
            time.sleep(0.01)
        assert victim is not None, "no worker was seen running a slot"
        assert killed_slot is not None
        time.sleep(7)  # the lease (3 s) expires, a backup takes the slot over
        end = now_ms() - 1_500
        survivors = [w for w in workers if w is not victim]
        codes = [w.stop() for w in survivors]
        assert codes == [0, 0], [w.log()[-2000:] for w in survivors]

    history = [r for r in read_history(deployment.history_url, "tick") if not r.manual]
    successes: dict[int, list[Run]] = defaultdict(list)
    for run in history:
        if run.status == "success":
            successes[run.slot].append(run)
    window = grid_slots(1_000, begin, end)
    assert len(window) >= 6
    twice = {s: runs for s, runs in successes.items() if len(runs) > 1}
    assert not twice, f"slots that succeeded twice: {twice}"
    # While the killed slot holds a live lease (the dead worker's, then its takeover's until
    # that attempt ends), the next slots are skipped (the job does not overlap itself) and
    # recorded so; every other slot succeeded once.
    skipped = {r.slot for r in history if r.status == "skipped" and "overlap" in (r.error or "")}
    ends = [r.finished_at for r in history if r.slot == killed_slot and r.finished_at]
    held_until = max((round(t.timestamp() * 1000) for t in ends), default=killed_slot + 4_000)
    lease_live = range(killed_slot + 1, max(held_until, killed_slot + 4_000) + 1)
    window = [s for s in window if not (s in skipped and s in lease_live)]
    problems = {s: [(r.attempt, r.status) for r in history if r.slot == s]
                for s in window if len(successes[s]) != 1}
    assert not problems, f"slots without exactly one success: {problems}"
    # The ORM side effect: one Tick row per slot, written by the attempt that succeeded.
    # Only the SIGKILLed worker may have left another row (killed after writing it).
    rows: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for slot, attempt, runner in ticks(deployment.database_url):
        rows[slot].append((attempt, runner))
    for slot in window:
        [won] = successes[slot]
        assert rows[slot].count((won.attempt, won.runner)) == 1, (slot, rows[slot])
        others = [r for r in rows[slot] if r != (won.attempt, won.runner)]
        assert all(runner == victim.instance_id for _, runner in others), (slot, others)
    # The killed slot was taken over by another worker as attempt 2.
    [taken] = successes[killed_slot]
    assert taken.attempt == 2
    assert taken.runner != victim.instance_id
    # Jitter spreads the slots over the workers. Judged over every slot they ran, not the
    # window alone: the window holds as few as 3 successes, all of which one worker may win.
    winners = {r.runner for runs in successes.values() for r in runs}
    assert len(winners) >= 2, (winners, sorted(successes))


def test_sigterm_hands_the_running_slot_over(tmp_path: Path) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    setup = Setup(base_env(sqlite_url, EXAMPLE_TICK_EVERY="5s", EXAMPLE_TICK_SLEEP_MS="3000",
                           ANARCHON_LEASE_MS="30000", ANARCHON_HEARTBEAT_MS="1000"),
                  f"{sqlite_url}?table=anarchon_runs", sqlite_url)
    migrate(setup)
    with ExitStack() as stack:
        workers = [Worker(setup, tmp_path / f"worker{i}.log") for i in range(2)]
        for worker in workers:
            stack.callback(worker.kill)
        wait_for(lambda: all(w.ready() for w in workers), 60, "2 workers to start")
        # A slot due after both workers started: both claimed it, so the other one
        # watches it as a backup (a worker started after a slot's time never claims it).
        both_running = now_ms()
        found: list[tuple[Worker, int]] = []

        def someone_runs() -> bool:
            found[:] = [(w, s) for w in workers if (s := w.running_slot()) is not None
                        and s > both_running]
            return bool(found)

        wait_for(someone_runs, 20, "a worker to start a slot")
        runner, slot = found[0]
        other = next(w for w in workers if w is not runner)
        signalled = time.time()
        assert runner.stop(signal.SIGTERM) == 0
        assert "stopping; unfinished runs are handed over" in runner.log()
        assert "stopped" in runner.log()
        # The other worker takes attempt 2 long before the 30 s lease would expire.
        wait_for(lambda: f"tick slot {slot} attempt 2: started on {other.instance_id}"
                 in other.log(), 15, "the other worker to take the slot over")
        taken_after = time.time() - signalled
        assert other.stop(signal.SIGINT) == 0
    assert taken_after < 10, taken_after
    attempts = {r.attempt: r for r in read_history(setup.history_url, "tick")
                if r.slot == slot}
    assert attempts[2].runner == other.instance_id
    assert attempts[1].runner == runner.instance_id
    assert attempts[1].status != "success"


def test_worker_survives_a_database_restart(dedicated_postgres: Any, tmp_path: Path) -> None:
    url = postgres_database(dedicated_postgres)
    # Kept ORM connections (CONN_MAX_AGE) are what a restart breaks.
    setup = Setup(base_env(url, EXAMPLE_CONN_MAX_AGE="600", EXAMPLE_TICK_SLEEP_MS="50"),
                  f"{url}?table=anarchon_runs", url)
    migrate(setup)
    with ExitStack() as stack:
        worker = Worker(setup, tmp_path / "worker.log")
        stack.callback(worker.kill)
        wait_for(worker.ready, 60, "the worker to start")
        time.sleep(3)
        dedicated_postgres.restart(down_s=2, crash=False)
        back = now_ms()
        time.sleep(8)
        end = now_ms() - 1_500
        assert worker.proc.poll() is None, worker.log()[-3000:]
        assert worker.stop() == 0, worker.log()[-3000:]
    history = [r for r in read_history(setup.history_url, "tick") if not r.manual]
    by_slot = {r.slot: r for r in history}
    window = grid_slots(1_000, back + 3_000, end)
    assert len(window) >= 3
    statuses = {s: by_slot[s].status if s in by_slot else "missing" for s in window}
    assert set(statuses.values()) == {"success"}, statuses
    written = {slot for slot, _, _ in ticks(url)}
    assert set(window) <= written
