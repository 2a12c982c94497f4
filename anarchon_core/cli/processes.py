"""Instance processes for the demo, the tests and chaos runs, and the ledger they write.

Each instance is ``python -m anarchon_core.cli.instance``; see that module for the ledger.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Cluster", "Instance", "InstanceJob", "LedgerEntry", "read_ledger", "start_instances"]


@dataclass
class InstanceJob:
    """A job every instance registers. ``sleep_s`` is how long its handler works."""

    name: str
    every: str | None = None
    cron: str | None = None
    sleep_s: float = 0.05
    sync: bool = False
    fail: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    #: Fraction of slots whose handler sleeps ``slow_sleep_s`` instead (e.g. past timeout_ms).
    slow_ratio: float = 0.0
    slow_sleep_s: float = 0.0
    slow_seed: int = 0
    #: The handler ignores its cancellation (timeout, stop, lost lease) and works on.
    stubborn: bool = False

    def as_json(self) -> dict[str, Any]:
        """The spec as ``anarchon_core.cli.instance --jobs`` reads it."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class LedgerEntry:
    """One line of a ledger: ``start``, ``end`` or ``exit`` of an attempt, as its handler wrote it.

    ``end`` is the side effect (written right after confirming the lease); ``exit`` is
    written when the handler's code returns, whatever the outcome.
    """

    event: str
    job: str
    slot: int
    attempt: int
    token: str
    manual: bool
    instance: str
    pid: int
    time_ms: int
    #: ``time.monotonic_ns()`` of the writing process (machine-wide; not skewed by faketime).
    mono_ns: int | None = None
    #: On ``exit`` lines: why the handler had been asked to stop, if it had.
    cancelled: str | None = None


class Instance:
    """One instance process."""

    def __init__(self, proc: subprocess.Popen[bytes], ledger_dir: Path, log_path: Path) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.ledger_dir = ledger_dir
        self.log_path = log_path

    @property
    def alive(self) -> bool:
        """Whether the process has not exited."""
        return self.proc.poll() is None

    @property
    def ready(self) -> bool:
        """Whether its scheduler has started."""
        return (self.ledger_dir / f"{self.pid}.ready").exists()

    def _signal(self, sig: signal.Signals) -> None:
        if self.alive:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing handed over."""
        self._signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: a frozen process (GC pause, VM migration)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        self._signal(signal.SIGCONT)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM: graceful stop with hand-over; returns the exit code."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self) -> str:
        """What the process printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Cluster:
    """A group of instances sharing one backend URL and job list."""

    def __init__(self, url: str, jobs: list[InstanceJob], workdir: Path, *,
                 lease_ms: int | None = None, heartbeat_ms: int | None = None,
                 env: dict[str, str] | None = None, grace_ms: int = 2_000,
                 log_level: str = "INFO", history_size: int | None = None,
                 contenders: bool = True) -> None:
        self.url = url
        self.jobs = jobs
        self.ledger_dir = workdir / "ledger"
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self.lease_ms = lease_ms
        self.heartbeat_ms = heartbeat_ms
        self.env = env or {}
        self.grace_ms = grace_ms
        self.log_level = log_level
        self.history_size = history_size
        #: False: every instance claims every slot (``Scheduler(contenders=False)``).
        self.contenders = contenders
        self.instances: list[Instance] = []

    def command(self) -> list[str]:
        """The command line of one instance."""
        cmd = [sys.executable, "-m", "anarchon_core.cli.instance", "--backend", self.url,
               "--jobs", json.dumps([j.as_json() for j in self.jobs]),
               "--ledger", str(self.ledger_dir), "--grace-ms", str(self.grace_ms),
               "--log-level", self.log_level]
        if self.lease_ms:
            cmd += ["--lease-ms", str(self.lease_ms)]
        if self.heartbeat_ms:
            cmd += ["--heartbeat-ms", str(self.heartbeat_ms)]
        if self.history_size:
            cmd += ["--history-size", str(self.history_size)]
        if not self.contenders:
            cmd.append("--no-contenders")
        return cmd

    def add(self, env: dict[str, str] | None = None) -> Instance:
        """Start one more instance."""
        log_path = self.ledger_dir / f"instance-{len(self.instances)}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, **(env or {})}, stdin=subprocess.DEVNULL,
            )
        instance = Instance(proc, self.ledger_dir, log_path)
        self.instances.append(instance)
        return instance

    def wait_ready(self, timeout: float = 30) -> None:
        """Wait until every live instance has started its scheduler."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pending = [i for i in self.instances if i.alive and not i.ready]
            dead = [i for i in self.instances if not i.alive and not i.ready]
            if dead:
                raise RuntimeError(f"instance {dead[0].pid} died:\n{dead[0].log()[-3000:]}")
            if not pending:
                return
            time.sleep(0.05)
        raise TimeoutError(f"instances not ready after {timeout}s: "
                           f"{[i.log()[-2000:] for i in self.instances if not i.ready]}")

    def stop_all(self, timeout: float = 30) -> None:
        """SIGTERM every live instance and wait for them."""
        live = [i for i in self.instances if i.alive]
        for i in live:
            i.resume()
            i._signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for i in live:
            try:
                i.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                i.kill()

    def running_instance(self, job: str) -> Instance | None:
        """The live instance whose handler of ``job`` has started and not ended."""
        entries = self.ledger()
        ended = {(e.slot, e.attempt) for e in entries if e.job == job and e.event == "end"}
        for e in sorted(entries, key=lambda e: e.time_ms, reverse=True):
            if e.job == job and e.event == "start" and (e.slot, e.attempt) not in ended:
                for i in self.instances:
                    if i.pid == e.pid and i.alive:
                        return i
        return None

    def ledger(self) -> list[LedgerEntry]:
        """Everything every instance's handlers wrote so far."""
        return read_ledger(self.ledger_dir)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for i in self.instances:
            if i.alive:
                i.resume()
                i.kill()


def start_instances(url: str, jobs: list[InstanceJob], count: int, workdir: Path, *,
                    lease_ms: int | None = None, heartbeat_ms: int | None = None,
                    env: dict[str, str] | None = None, grace_ms: int = 2_000,
                    contenders: bool = True) -> Cluster:
    """Start ``count`` instance processes (call ``wait_ready`` before timing anything)."""
    cluster = Cluster(url, jobs, workdir, lease_ms=lease_ms, heartbeat_ms=heartbeat_ms,
                      env=env, grace_ms=grace_ms, contenders=contenders)
    for _ in range(count):
        cluster.add()
    return cluster


def read_ledger(directory: Path) -> list[LedgerEntry]:
    """Every complete line of every ledger file in ``directory``."""
    entries = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by SIGKILL
            entries.append(LedgerEntry(**data))
    return entries
