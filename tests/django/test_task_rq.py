"""Scheduled Django tasks on ``django-tasks-rq``, with real processes on a dedicated Redis.

Two ``manage.py anarchon`` workers of the task site (``tests/django/tasksite``, with
``TASKSITE_RQ``) enqueue a task every second; a ``manage.py rqworker`` runs them. The
redis-server (one of the test's own, on a free port) is rq's broker and anarchon's store
(strategy ``lease``). Checked: one rq job per slot, the run's meta names it, and the task's
outcome, reported by ``task_finished`` in the rq worker, reaches the run's meta.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry

from anarchon_core import Run
from anarchon_core.url import backend_from_url
from tests.support.helpers import start_redis, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
JOB = "tasksite.tick"
TASK = "tests.django.tasksite.shop.jobs.tick"


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own: no persistence, stopped by PID."""
    server = start_redis(tmp_path / "redis")
    try:
        yield server.url
    finally:
        server.stop()


def runs(url: str) -> list[Run]:
    async def read() -> list[Run]:
        backend = backend_from_url(url)
        await backend.start()
        try:
            return await backend.history(JOB, 500)
        finally:
            await backend.stop()

    return asyncio.run(read())


def rq_jobs(client: redis.Redis) -> list[Job]:
    ids = [key.decode().rpartition(":")[2] for key in client.scan_iter("rq:job:*", count=500)]
    return [job for job in Job.fetch_many(ids, connection=client) if job is not None]


def _logs(logs: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted(logs.glob("*.log")))


def test_rq_runs_each_slot_s_task_once_and_its_outcome_reaches_the_run(
        tmp_path: Path, redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANARCHON", "TASKSITE_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "tests.django.tasksite.settings",
                "PYTHONPATH": str(REPO), "TASKSITE_RQ": redis_url,
                "TASKSITE_DB": f"sqlite:///{tmp_path / 'site.sqlite3'}"})
    commands = {"anarchon0": ["anarchon"], "anarchon1": ["anarchon"],
                "rqworker": ["rqworker", "--job-class", "django_tasks_rq.backend.Job",
                             "default"]}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def stop(names: list[str]) -> None:
        for name in names:
            if procs[name].poll() is None:
                procs[name].send_signal(signal.SIGTERM)
        for name in names:
            try:
                procs[name].wait(30)
            except subprocess.TimeoutExpired:
                procs[name].kill()
                procs[name].wait(10)

    client = redis.Redis.from_url(redis_url)
    queue = Queue("default", connection=client)
    try:
        for name, args in commands.items():
            with (tmp_path / f"{name}.log").open("wb") as out:
                procs[name] = subprocess.Popen([sys.executable, "-m", "django", *args],
                                               cwd=REPO, env=env, stdout=out,
                                               stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL)
        wait_for(lambda: sum(r.status == "success" for r in runs(redis_url)) >= 6, 90,
                 "six slots enqueued")
        stop(["anarchon0", "anarchon1"])
        # Every enqueued task run by the rq worker, and its outcome recorded beside its run.
        wait_for(lambda: queue.count == 0 and StartedJobRegistry(queue=queue).count == 0,
                 30, "the rq queue to drain")
        wait_for(lambda: all("task_status" in r.meta for r in runs(redis_url)
                             if r.status == "success"), 30, "every run's task_status")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_logs(tmp_path)}") from None
    finally:
        stop(list(procs))
        client.close()

    client = redis.Redis.from_url(redis_url)
    try:
        jobs = rq_jobs(client)
        statuses = Counter(job.get_status() for job in jobs)
    finally:
        client.close()
    by_slot: dict[int, list[Job]] = {}
    for job in jobs:
        assert job.func_name == TASK
        by_slot.setdefault(int(job.kwargs["slot_key"].rpartition("@")[2]), []).append(job)
    doubled = {slot: len(found) for slot, found in by_slot.items() if len(found) != 1}
    assert not doubled, f"slots enqueued more than once: {doubled}\n{_logs(tmp_path)}"
    assert statuses == {JobStatus.FINISHED: len(jobs)}, statuses
    success = {r.slot: r for r in runs(redis_url) if r.status == "success"}
    assert set(success) == set(by_slot), (sorted(success), sorted(by_slot))
    assert len(success) >= 6
    for slot, run in success.items():
        assert run.meta == {"task_id": by_slot[slot][0].id, "task_backend": "default",
                            "task_name": TASK, "task_status": "SUCCESSFUL"}, (slot, run.meta)
