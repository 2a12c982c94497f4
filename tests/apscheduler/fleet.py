"""Starting worker processes (tests.apscheduler.worker) and reading their ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EPOCH = "1970-01-01 00:00:00+00:00"
EVENT_JOB_EXECUTED, EVENT_JOB_ERROR, EVENT_JOB_MISSED = 2**12, 2**13, 2**14
EVENT_JOB_SUBMITTED, EVENT_JOB_MAX_INSTANCES = 2**15, 2**16


def interval(job_id: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"id": job_id, "trigger": "interval",
            "args": {"seconds": seconds, "start_date": EPOCH}, "grid_ms": int(seconds * 1000),
            **extra}


def cron(job_id: str, second: str, grid_ms: int = 1000, **extra: Any) -> dict[str, Any]:
    return {"id": job_id, "trigger": "cron", "args": {"second": second}, "grid_ms": grid_ms,
            **extra}


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class Fleet:
    """Worker processes sharing one ledger directory."""

    workdir: Path
    workers: dict[str, Worker] = field(default_factory=dict)

    _commands: int = 0

    def __post_init__(self) -> None:
        (self.workdir / "ledger").mkdir(parents=True, exist_ok=True)
        (self.workdir / "control").mkdir(exist_ok=True)

    def start(self, name: str, config: dict[str, Any]) -> Worker:
        config = {**config, "name": name, "control": str(self.workdir / "control")}
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps(config))
        log = self.workdir / f"{name}.log"
        env = {**os.environ, "APS_LEDGER_DIR": str(self.workdir / "ledger"), "APS_NAME": name,
               "PYTHONPATH": str(ROOT)}
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "tests.apscheduler.worker",
                                     str(path)], cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        worker = self.workers[name] = Worker(name, proc, log)
        return worker

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for name, worker in self.workers.items():
            ready = self.workdir / "ledger" / f"{name}.ready"
            while not ready.exists():
                assert worker.proc.poll() is None, f"{name} exited:\n{worker.log.read_text()}"
                assert time.monotonic() < deadline, f"{name} not ready:\n{worker.log.read_text()}"
                time.sleep(0.1)

    def command(self, name: str, **command: Any) -> None:
        self._commands += 1
        path = self.workdir / "control" / f"{name}.{self._commands:04d}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(command))
        tmp.rename(path)

    def stop_all(self, timeout: float = 30) -> None:
        for worker in self.workers.values():
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        for worker in self.workers.values():
            try:
                worker.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                worker.proc.send_signal(signal.SIGUSR1)  # the worker dumps its threads
                time.sleep(1)
                worker.kill()
                raise AssertionError(f"{worker.name} did not stop on SIGTERM:\n"
                                     f"{worker.log.read_text()[-8000:]}") from None

    def kill_all(self) -> None:
        for worker in self.workers.values():
            worker.kill()

    def ledger(self) -> list[dict[str, Any]]:
        lines = []
        for path in sorted((self.workdir / "ledger").glob("ledger-*.jsonl")):
            lines.extend(json.loads(line) for line in path.read_text().splitlines() if line)
        return lines

    def logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.log.read_text()[-4000:]}"
                         for w in self.workers.values())

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()


def ends(ledger: list[dict[str, Any]], job: str) -> Counter[int]:
    """How many times each slot of ``job`` reached its side effect."""
    return Counter(e["slot"] for e in ledger if e["event"] == "end" and e.get("job") == job)


def events(ledger: list[dict[str, Any]], job: str, code: int) -> dict[int, list[str]]:
    """Slot → the instances that emitted APScheduler event ``code`` for it."""
    out: dict[int, list[str]] = defaultdict(list)
    for e in ledger:
        if e["event"] == "aps" and e.get("job") == job and e["code"] == code:
            for slot in e.get("slots", []):
                out[slot].append(e["instance"])
    return out


def grid(step_ms: int, lo_ms: int, hi_ms: int) -> list[int]:
    first = -(-lo_ms // step_ms) * step_ms
    return list(range(first, hi_ms + 1, step_ms))


def now_ms() -> int:
    return int(time.time() * 1000)
