"""Scheduled Django tasks on the DB task backend, run by real ``manage.py anarchon`` workers.

The task site (``tests/django/tasksite``) enqueues a ``django-tasks-db`` task every second
into the database that also holds anarchon's runs table, so each slot's enqueue and its
run's end commit together. Checked on SQLite and PostgreSQL:

* 3 workers, one SIGKILLed: one task row per slot, and it is the one the run names.
* Workers that kill themselves (SIGKILL) at an enqueue, again and again: between the
  task row and the run's end (both roll back: a backup enqueues again) or right after
  their commit (nothing to redo). Every slot still has exactly one task row.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.stores import unavailable
from tests.stores.postgres import POSTGRES_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
JOB = "tasksite.tick"


@dataclass
class Site:
    """One deployment of the task site: its database URL and environment."""

    db: str
    env: dict[str, str]
    logs: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def manage(self, *args: str, timeout: float = 120) -> None:
        out = subprocess.run([sys.executable, "-m", "django", *args], cwd=REPO, env=self.env,
                             capture_output=True, text=True, timeout=timeout, check=False)
        assert out.returncode == 0, out.stderr[-3000:]

    def start(self, fault: str = "") -> subprocess.Popen[bytes]:
        env = {**self.env, "TASKSITE_FAULT": fault}
        log = self.logs / f"worker{len(self.workers)}-{fault.replace(':', '')}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "django", "anarchon"], cwd=REPO,
                                    env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        self.workers.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.db.startswith("sqlite:///"):
            with sqlite3.connect(self.db.split(":///", 1)[1], timeout=30) as conn:
                return list(conn.execute(sql))
        with psycopg.connect(self.db, connect_timeout=5) as conn:
            return list(conn.execute(sql))

    def task_rows(self) -> list[tuple[str, int]]:
        """(task id without dashes, slot) of every task row."""
        out = []
        for task_id, args_kwargs in self.query(
                "SELECT id, args_kwargs FROM django_tasks_database_dbtaskresult"):
            data = json.loads(args_kwargs) if isinstance(args_kwargs, str) else args_kwargs
            out.append((str(task_id).replace("-", ""),
                        int(data["kwargs"]["slot_key"].rpartition("@")[2])))
        return out

    def runs(self) -> list[tuple[int, int, str, dict[str, str]]]:
        """(slot, attempt, status, meta) of every attempt of the job."""
        return [(int(slot), int(attempt), str(status), json.loads(meta) if meta else {})
                for slot, attempt, status, meta in self.query(
                    "SELECT slot, attempt, status, meta FROM anarchon_runs "
                    f"WHERE job = '{JOB}' AND manual = 0")]


@pytest.fixture(params=["sqlite", "postgres"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANARCHON", "TASKSITE_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "tests.django.tasksite.settings",
                "PYTHONPATH": str(REPO)})
    if request.param == "sqlite":
        db = f"sqlite:///{tmp_path / 'site.sqlite3'}"
        yield _ready(Site(db, {**env, "TASKSITE_DB": db}, tmp_path))
        return
    name = f"ts_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", str(exc).strip())
        return
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
    db = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield _ready(Site(db, {**env, "TASKSITE_DB": db}, tmp_path))
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _ready(site: Site) -> Site:
    site.manage("migrate", "-v0")
    return site


def _logs(site: Site) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted(site.logs.glob("worker*.log")))


def newest_success(site: Site) -> int:
    """The newest slot that succeeded so far (0: none)."""
    return max((slot for slot, _, status, _ in site.runs() if status == "success"), default=0)


def assert_one_task_per_slot(site: Site, upto: int) -> int:
    """Every slot that ran has one success and exactly one task row, the one it names.

    No slot has two rows; up to slot ``upto`` (the workers were stopped after it, and may
    have handed later slots over unfinished) every slot that ran has succeeded, or was
    given up with no row.
    """
    rows = site.task_rows()
    per_slot = Counter(slot for _, slot in rows)
    doubled = {slot: n for slot, n in per_slot.items() if n != 1}
    assert not doubled, f"slots with several task rows: {doubled}\n{_logs(site)}"
    # A slot due while every worker was down is recorded "missed": it never ran.
    runs = [r for r in site.runs() if r[0] <= upto and r[2] != "missed"]
    per_slot = Counter({slot: n for slot, n in per_slot.items() if slot <= upto})
    success = {slot: meta for slot, _, status, meta in runs if status == "success"}
    # A run whose runners were all killed until it was older than its recovery window is
    # closed "interrupted" for good by orphan recovery: it never enqueued (no row).
    given_up = {slot for slot, _error in site.query(
        "SELECT slot, error FROM anarchon_runs WHERE status = 'interrupted' AND "
        "error LIKE '%max_attempts reached%'")}
    unfinished = {(slot, attempt, status) for slot, attempt, status, _ in runs
                  if slot not in success and slot not in given_up}
    assert not unfinished, (f"slots without a success: {sorted(unfinished)}: " + str(
        site.query(f"SELECT slot, attempt, status, error, runner FROM anarchon_runs WHERE slot "
                   f"IN ({', '.join(str(s) for s, _, _ in unfinished)})")) + _logs(site))
    assert set(per_slot) == set(success), (
        f"rows without a success: {sorted(set(per_slot) - set(success))}; successes "
        f"without a row: {sorted(set(success) - set(per_slot))}\n{_logs(site)}")
    by_slot = {slot: task_id for task_id, slot in rows}
    for slot, meta in success.items():
        assert meta.get("task_id", "").replace("-", "") == by_slot[slot], (slot, meta)
        assert meta.get("task_name") == "tests.django.tasksite.shop.jobs.tick"
    return len(success)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_three_workers_one_killed_one_task_row_per_slot(site: Site) -> None:
    try:
        for _ in range(3):
            site.start()
        _wait(lambda: len(site.task_rows()) >= 3, 60, "the first slots")
        site.workers[0].kill()  # SIGKILL, wherever it is
        site.workers[0].wait(10)
        before = len(site.task_rows())
        _wait(lambda: len(site.task_rows()) >= before + 5, 60, "slots after the kill")
        upto = newest_success(site)
    finally:
        site.stop_all()
    assert assert_one_task_per_slot(site, upto) >= 8


def test_killed_at_enqueue_many_times_keeps_one_task_row_per_slot(site: Site) -> None:
    rng = random.Random(0x5107)
    kills = 0
    deadline = time.monotonic() + 120
    try:
        live: list[subprocess.Popen[bytes]] = []
        while kills < 12 and time.monotonic() < deadline:
            while len(live) < 3:
                mode = rng.choice(["between", "after"])
                live.append(site.start(f"{mode}:{rng.randint(1, 3)}"))
            time.sleep(0.2)
            for proc in list(live):
                if proc.poll() is not None:
                    live.remove(proc)
                    assert proc.returncode == -signal.SIGKILL, _logs(site)
                    kills += 1
        # Faultless workers take over what the last kills left running, then stop.
        for _ in range(2):
            site.start()
        _wait(lambda: not any(status == "running" for _, _, status, _ in site.runs()), 60,
              "every killed run to be taken over")
        upto = newest_success(site)
    finally:
        site.stop_all()
    assert kills >= 12, f"only {kills} kills in time\n{_logs(site)}"
    modes = Counter(p.name.split("-")[1][:5] for p in site.logs.glob("worker*-*.log"))
    assert modes["betwe"], modes
    assert modes["after"], modes
    assert assert_one_task_per_slot(site, upto) >= 6
