"""Real ``celery beat -S anarchon_celery:Scheduler`` processes against real brokers and stores.

Every beat runs a generated Celery app (``beatapp``) whose ``before_task_publish`` handler
appends each publish to a fsynced ledger; the broker's queue is read afterwards as the
ground truth of what was sent. Leases are short (2 s) so takeovers fit the test's time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from .stores import StoreHandle, unavailable
from .support.helpers import RedisServer, start_redis
from .support.procs import grid_slots, read_history

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "beatq"

APP_SOURCE = '''
import json, os, time
from datetime import timedelta
from celery import Celery
from celery.schedules import crontab
from celery.signals import before_task_publish

import anarchon_celery  # noqa: F401  (worker-side signals of anarchon_track_tasks)

app = Celery("beatapp", broker=os.environ["BROKER"])
app.conf.update(json.loads(os.environ.get("CONF", "{}")))
app.conf.beat_schedule = {
    name: {"task": spec["task"],
           "schedule": (crontab(**spec["crontab"]) if "crontab" in spec
                        else timedelta(seconds=spec["every"])),
           "args": spec.get("args", ()), "kwargs": spec.get("kwargs", {}),
           "options": spec.get("options", {})}
    for name, spec in json.loads(os.environ["SCHEDULE"]).items()}


def _append(path, record):
    fd = os.open(path, os.O_APPEND | os.O_CREAT | os.O_WRONLY)
    try:
        os.write(fd, (json.dumps(record) + "\\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@before_task_publish.connect
def _ledger(sender=None, headers=None, **kwargs):
    headers = headers or {}
    _append(os.environ["LEDGER"], {
        "pid": os.getpid(), "time": time.time(), "task": sender, "id": headers.get("id"),
        "job": headers.get("anarchon_job"), "slot": headers.get("anarchon_slot"),
        "attempt": headers.get("anarchon_attempt")})


@app.task(name="beatapp.tick", bind=True)
def tick(self, *args, **kwargs):
    request = self.request
    _append(os.environ["RUNLOG"], {
        "event": "run", "id": request.id, "args": list(args), "kwargs": kwargs,
        "job": getattr(request, "anarchon_job", None),
        "slot": getattr(request, "anarchon_slot", None),
        "start": time.monotonic(), "end": time.monotonic(), "pid": os.getpid()})


@app.task(name="beatapp.slow", bind=True)
def slow(self, seconds):
    request = self.request
    start = time.monotonic()
    time.sleep(seconds)
    _append(os.environ["RUNLOG"], {
        "event": "run", "id": request.id, "job": getattr(request, "anarchon_job", None),
        "slot": getattr(request, "anarchon_slot", None), "start": start,
        "end": time.monotonic(), "pid": os.getpid()})
'''


def every_entries(count: int, seconds: float = 1.0, task: str = "beatapp.tick",
                  **extra: Any) -> dict[str, dict[str, Any]]:
    return {f"e{i}": {"task": task, "every": seconds, "args": [i],
                      "options": {"queue": QUEUE}, **extra} for i in range(count)}


@dataclass
class Fleet:
    """Beat (and worker) processes of one generated app; all SIGKILLed on exit."""

    workdir: Path
    broker: str
    schedule: dict[str, dict[str, Any]]
    conf: dict[str, Any]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "beatapp.py").write_text(APP_SOURCE)
        self.ledger_path = self.workdir / "ledger.jsonl"
        self.runlog_path = self.workdir / "runs.jsonl"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(BROKER=self.broker, CONF=json.dumps(self.conf),
                   SCHEDULE=json.dumps(self.schedule), LEDGER=str(self.ledger_path),
                   RUNLOG=str(self.runlog_path),
                   PYTHONPATH=os.pathsep.join([str(self.workdir), str(ROOT)]))
        return env

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "beatapp", *args],
                                    cwd=self.workdir, env=self.env(), stdout=out,
                                    stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def beat(self) -> subprocess.Popen[bytes]:
        index = len(self.procs)
        return self._spawn(["beat", "-S", "anarchon_celery:Scheduler", "-l", "info",
                            "--pidfile=", "-s", str(self.workdir / f"beat{index}.db")],
                           f"beat{index}")

    def worker(self) -> subprocess.Popen[bytes]:
        index = len(self.procs)
        return self._spawn(["worker", "-P", "threads", "-c", "4", "-Q", QUEUE, "-l", "info",
                            "--without-heartbeat", "--without-gossip", "--without-mingle",
                            "-n", f"w{index}@%h"], f"worker{index}")

    def wait_connected(self, procs: list[subprocess.Popen[bytes]], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for proc in procs:
            log = self.logs[self.procs.index(proc)]
            while "connected" not in log.read_text(errors="replace"):
                assert proc.poll() is None, f"{log.name} exited:\n{self.tail(log)}"
                assert time.monotonic() < deadline, f"{log.name} not ready:\n{self.tail(log)}"
                time.sleep(0.1)

    def wait_worker(self, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
        log = self.logs[self.procs.index(proc)]
        deadline = time.monotonic() + timeout
        while " ready." not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"{log.name} exited:\n{self.tail(log)}"
            assert time.monotonic() < deadline, f"{log.name} not ready:\n{self.tail(log)}"
            time.sleep(0.1)

    @staticmethod
    def tail(log: Path) -> str:
        return log.read_text(errors="replace")[-3000:]

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            self.stop(proc)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)

    def ledger(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.ledger_path)

    def runs(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.runlog_path)

    def errors(self) -> list[str]:
        """Tracebacks and error lines in every process's log."""
        found = []
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                if "Traceback" in line or "CRITICAL" in line or "crashed" in line:
                    found.append(f"{log.name}: {line}")
        return found


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def fleet(workdir: Path, broker: str, schedule: dict[str, dict[str, Any]],
          conf: dict[str, Any]) -> Iterator[Fleet]:
    group = Fleet(workdir, broker, schedule, conf)
    try:
        yield group
    finally:
        group.kill_all()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: the Celery broker and the anarchon store at once."""
    server = start_redis(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


def redis_queue(url: str, queue: str = QUEUE) -> list[dict[str, Any]]:
    """The headers of every message waiting in a Redis-broker queue, oldest first."""
    with redis.Redis.from_url(url) as client:
        raw = client.lrange(queue, 0, -1)
    return [json.loads(item)["headers"] for item in reversed(raw)]


def sent_slots(headers: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    return Counter((h["anarchon_job"], int(h["anarchon_slot"])) for h in headers)


BASE_CONF = {"anarchon_lease_ms": 2_000, "broker_connection_retry_on_startup": True}


# ------------------------------------------------------------------------------- tests


def test_three_beats_send_every_slot_once_and_survive_a_sigkill(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """3 beats, 10 entries every 1 s: each slot published once, none missing; then the
    beat that sent the last slot is SIGKILLed and the other two go on without a gap."""
    schedule = every_entries(10)
    with fleet(tmp_path / "app", redis_server.url, schedule, BASE_CONF) as group:
        beats = [group.beat() for _ in range(3)]
        group.wait_connected(beats)
        begin = round(time.time() * 1000) + 1_500
        time.sleep(16)
        ledger = group.ledger()
        last = max(ledger, key=lambda e: (e["slot"], e["time"]))
        victim = next(p for p in beats if p.pid == last["pid"])
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
        killed_at = round(time.time() * 1000)
        time.sleep(8)
        end = round(time.time() * 1000) - 1_500
        group.stop_all()
        assert not group.errors(), group.errors()
        ledger = group.ledger()
    queue = redis_queue(redis_server.url)
    sent = sent_slots(queue)
    # The queue is the broker's truth; the ledger says which beat sent what.
    assert len(ledger) >= len(queue)  # the ledger line is written just before the publish
    expected = {(name, slot) for name in schedule for slot in grid_slots(1_000, begin, end)}
    missing = sorted(expected - set(sent))
    assert not missing, f"slots never sent: {missing[:10]} ({len(missing)})"
    twice = {key: n for key, n in sent.items() if n > 1}
    # A slot is published at most once per attempt. Only a takeover of a slot whose
    # publisher was SIGKILLed after publishing but before recording it may send it again,
    # as attempt 2 with the same anarchon_id header (for the consumer to deduplicate).
    attempts = Counter((h["anarchon_job"], int(h["anarchon_slot"]), int(h["anarchon_attempt"]))
                       for h in queue)
    assert all(n == 1 for n in attempts.values()), "a slot was published twice in one attempt"
    for key in twice:
        first = next(e for e in ledger if (e["job"], e["slot"]) == key and e["attempt"] == 1)
        assert first["pid"] == victim.pid, (key, first)
        assert abs(key[1] - killed_at) < 3_000, (key, first)
    assert len(twice) <= 1, f"slots sent twice: {twice}"
    senders = Counter(e["pid"] for e in ledger)
    assert len(senders) == 3, f"all beats should send (jitter spreads the claims): {senders}"
    after = [e for e in ledger if e["slot"] > killed_at + 1_000]
    assert after
    assert victim.pid not in {e["pid"] for e in after}
    history = read_history(f"{redis_server.url}?prefix=anarchon:celery:", "e0")
    by_slot = {r.slot: r for r in history if r.status == "success"}
    for header in queue:
        if header["anarchon_job"] == "e0" and header["anarchon_attempt"] == 1:
            run = by_slot.get(int(header["anarchon_slot"]))
            if run is not None:
                assert run.meta.get("task_id") == header["id"]
                assert run.runner.startswith("beat@")


def test_worker_runs_the_tasks_and_track_tasks_prevents_overlap(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """End to end on a Redis broker: 2 beats and a worker. Every slot of a fast entry runs
    once with its args and kwargs; a 2.5 s task every 1 s with ``anarchon_track_tasks``
    never runs twice at the same time (its next slots are skipped while it runs), and with
    ``overlap="buffer_one"`` the slot due meanwhile is sent as soon as the task ends."""
    schedule = {
        "fast": {"task": "beatapp.tick", "every": 1, "args": [1, "a"],
                 "kwargs": {"k": [1, 2]}, "options": {"queue": QUEUE}},
        "slow": {"task": "beatapp.slow", "every": 1, "args": [2.5],
                 "options": {"queue": QUEUE}},
        "buffered": {"task": "beatapp.slow", "every": 1, "args": [2.5],
                     "options": {"queue": QUEUE, "anarchon": {"overlap": "buffer_one"}}},
    }
    conf = {**BASE_CONF, "anarchon_track_tasks": True}
    with fleet(tmp_path / "app", redis_server.url, schedule, conf) as group:
        worker = group.worker()
        group.wait_worker(worker)
        beats = [group.beat(), group.beat()]
        group.wait_connected(beats)
        begin = round(time.time() * 1000) + 1_500
        time.sleep(11)
        end = round(time.time() * 1000) - 4_000
        for beat in beats:
            group.stop(beat)
        time.sleep(3)  # the last slow task finishes
        group.stop(worker)
        assert not group.errors(), group.errors()
        runs = group.runs()
    fast = [r for r in runs if r["job"] == "fast"]
    assert all(r["args"] == [1, "a"] and r["kwargs"] == {"k": [1, 2]} for r in fast)
    executed = Counter(r["slot"] for r in fast)
    assert all(n == 1 for n in executed.values()), executed
    missing = sorted(set(grid_slots(1_000, begin, end)) - set(executed))
    assert not missing, f"fast slots that never ran on the worker: {missing}"
    slow = sorted((r["start"], r["end"], r["slot"]) for r in runs if r["job"] == "slow")
    assert len(slow) >= 2, slow
    for (_, end_a, slot_a), (start_b, _, slot_b) in itertools.pairwise(slow):
        assert start_b >= end_a, f"slow slots {slot_a} and {slot_b} ran at the same time"
    history = read_history(f"{redis_server.url}?prefix=anarchon:celery:", "slow")
    statuses = Counter(r.status for r in history)
    assert statuses["skipped"] >= 3, statuses
    tracked = read_history(f"{redis_server.url}?prefix=anarchon:celery:", "slow~task")
    assert {r.status for r in tracked} >= {"success"}
    assert all(r.runner.startswith("worker@") for r in tracked)
    buffered = sorted((r["start"], r["end"], r["slot"]) for r in runs
                      if r["job"] == "buffered")
    assert len(buffered) >= 3, buffered
    for (_, end_a, slot_a), (start_b, _, slot_b) in itertools.pairwise(buffered):
        assert start_b >= end_a, f"buffered slots {slot_a} and {slot_b} ran at the same time"
        assert start_b - end_a < 2.0, f"slot {slot_b} was not sent when {slot_a} ended"
    assert len({slot for _, _, slot in buffered}) == len(buffered)


@pytest.mark.parametrize("store", ["postgres", "redis"])
def test_rabbitmq_broker_with_a_separate_store(
        tmp_path: Path, store: str, store_handles: Callable[[str], StoreHandle],
        namespace: str) -> None:
    """The RabbitMQ broker (the test session's own node) with a PostgreSQL or Redis store:
    2 beats, 3 entries every 1 s, each slot's message in the queue exactly once."""
    from .stores import rabbitmq as rabbitmq_store  # noqa: PLC0415 - starts the node

    handle = store_handles("rabbitmq")
    assert handle is not None
    if rabbitmq_store.URL == rabbitmq_store.SHARED_URL:
        unavailable("a dedicated RabbitMQ node", "none was started")
    store_url = store_handles(store).url
    assert store_url is not None
    queue = f"beatq_{namespace}"
    schedule = {name: {**spec, "options": {"queue": queue}}
                for name, spec in every_entries(3).items()}
    conf = {**BASE_CONF, "anarchon_backend": store_url(namespace)}
    with fleet(tmp_path / "app", rabbitmq_store.URL, schedule, conf) as group:
        beats = [group.beat(), group.beat()]
        group.wait_connected(beats)
        begin = round(time.time() * 1000) + 1_500
        time.sleep(7)
        end = round(time.time() * 1000) - 1_500
        group.stop_all()
        assert not group.errors(), group.errors()
    headers = amqp_drain(rabbitmq_store.URL, queue)
    sent = sent_slots(headers)
    assert all(n == 1 for n in sent.values()), sent
    expected = {(name, slot) for name in schedule for slot in grid_slots(1_000, begin, end)}
    assert not expected - set(sent), sorted(expected - set(sent))


def amqp_drain(url: str, queue: str) -> list[dict[str, Any]]:
    """Take every message off ``queue`` (then delete it); return their headers."""
    import kombu  # noqa: PLC0415

    out = []
    with kombu.Connection(url) as conn:
        channel = conn.default_channel
        for _ in range(10_000):
            message = channel.basic_get(queue, no_ack=True)
            if message is None:
                break
            out.append(dict(message.headers))
        channel.queue_delete(queue)
    return out
