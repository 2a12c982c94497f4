"""Faults injected into a running fleet, chosen at random from one seed.

:class:`Chaos` drives a :class:`~anarchon_core.cli.processes.Cluster` (and, when the run owns
one, a dedicated store server) and writes every action it takes to a :class:`FaultLog`
with both the harness's wall clock and the machine-wide monotonic clock, so the checker
can line faults up with the ledgers and the store's history.

Faults:

* ``kill``: SIGKILL an instance (a crash: nothing handed over); a new instance starts a
  moment later.
* ``pause``: SIGSTOP an instance for longer than the lease (a zombie runner), then SIGCONT.
* ``stop``: SIGTERM an instance (a deploy: graceful stop with hand-over); a new one starts.
* ``restart``: stop the dedicated store server (crash where its durability allows it),
  keep it down a moment, start it again on the same port and data.
* ``skew_step``: change the wall-clock shift of a skewed instance while it runs.
* ``partition``: freeze the TCP proxy between one instance and the store for 1–3 leases
  (:mod:`chaos.proxy`): its connections stay open but nothing goes through, while the
  store stays reachable for the others; then thaw it.
* ``failover``: on a Redis Cluster, kill one primary (or ask its replica to take over with
  ``CLUSTER FAILOVER``) and wait for the replica's promotion (in a thread, so the other
  faults keep their timing).

Every fault a run requests is applied at least once when the run lasts long enough:
:meth:`Chaos.inject` picks a requested fault that has not been applied yet whenever one
is possible, and only then draws by weight.

Slow handlers that hit ``timeout_ms`` are part of the job mix (see :mod:`chaos.run`), and
clock skew is set when an instance starts: with libfaketime preloaded (``LD_PRELOAD`` and a
``FAKETIME_TIMESTAMP_FILE`` holding e.g. ``+12.5s``) its ``time.time()`` is shifted while
its monotonic clock is left alone.
"""

from __future__ import annotations

import heapq
import importlib.util
import json
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anarchon_core.cli.processes import Cluster, Instance

from .proxy import FreezableProxy
from .servers import RedisClusterServer, StoreServer

__all__ = ["FAULTS", "Chaos", "ChaosCluster", "FaultEvent", "FaultLog", "FaultProfile",
           "faketime_library"]

#: Every fault a profile can ask for, and the fault-log events that count as applying it.
FAULTS: dict[str, tuple[str, ...]] = {
    "kill": ("kill",),
    "pause": ("pause",),
    "stop": ("stop",),
    "rolling": ("rolling",),
    "restart": ("store_down",),
    "skew": ("spawn",),  # counted only for instances spawned with a shifted clock
    "skew_step": ("skew_step",),
    "partition": ("partition",),
    "failover": ("failover",),
}

log = logging.getLogger("anarchon.chaos")


def faketime_library() -> str | None:
    """Path of ``libfaketime.so.1`` bundled by the ``libfaketime`` package, if installed."""
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    return str(path) if path.exists() else None


@dataclass
class FaultEvent:
    """One action of the harness, timed by its wall clock and the monotonic clock."""

    kind: str
    wall_ms: float
    mono_ns: int
    pid: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class FaultLog:
    """Every action of a chaos run, in order; saved as JSON lines."""

    def __init__(self) -> None:
        self.events: list[FaultEvent] = []

    def add(self, kind: str, pid: int | None = None, **detail: Any) -> FaultEvent:
        """Record an action happening now (safe from the failover thread too)."""
        event = FaultEvent(kind, time.time() * 1000, time.monotonic_ns(), pid, detail)
        self.events.append(event)  # list.append is atomic
        log.info("fault %s pid=%s %s", kind, pid, detail or "")
        return event

    def save(self, path: Path) -> None:
        """Write the log as JSON lines."""
        path.write_text("".join(json.dumps(asdict(e)) + "\n" for e in self.events))

    @staticmethod
    def load(path: Path) -> list[FaultEvent]:
        """Read a saved log."""
        return [FaultEvent(**json.loads(line)) for line in path.read_text().splitlines() if line]


@dataclass(frozen=True)
class FaultProfile:
    """How often and how hard to hit. Times in seconds."""

    gap_s: tuple[float, float] = (1.5, 4.0)
    #: Relative weights of the faults (those not possible on a run are dropped).
    weights: tuple[tuple[str, float], ...] = (
        ("kill", 3), ("pause", 3), ("stop", 1), ("rolling", 1), ("restart", 1.5),
        ("skew_step", 1), ("partition", 2.5), ("failover", 2),
    )
    #: A rolling deploy: how many instances it replaces, one after the other, and the
    #: time between two of them.
    rolling_instances: int = 3
    rolling_gap_s: tuple[float, float] = (0.8, 2.0)
    #: SIGSTOP length, as multiples of the lease (above 1: the lease expires).
    pause_leases: tuple[float, float] = (1.3, 3.0)
    restart_down_s: tuple[float, float] = (0.3, 3.0)
    #: How long a partition lasts, as multiples of the lease.
    partition_leases: tuple[float, float] = (1.0, 3.0)
    #: Share of failovers made by SIGKILL of the primary (the rest: CLUSTER FAILOVER).
    failover_kill_ratio: float = 0.75
    respawn_s: tuple[float, float] = (0.3, 2.5)
    #: Share of new instances started with a shifted clock, and the largest shift.
    skew_ratio: float = 0.5
    max_skew_s: float = 30.0
    #: Never leave fewer instances alive and unpaused than this.
    min_healthy: int = 2


class ChaosCluster(Cluster):
    """A fleet whose instances may each reach the store by a URL of their own (a proxy)."""

    def command(self, url: str | None = None) -> list[str]:
        """The instance command line, with ``url`` as its backend when given."""
        cmd = super().command()
        if url is not None:
            cmd[cmd.index("--backend") + 1] = url
        return cmd

    def add(self, env: dict[str, str] | None = None, url: str | None = None) -> Instance:
        """Start one more instance (through ``url`` when given)."""
        log_path = self.ledger_dir / f"instance-{len(self.instances)}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                self.command(url), stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, **(env or {})}, stdin=subprocess.DEVNULL,
            )
        instance = Instance(proc, self.ledger_dir, log_path)
        self.instances.append(instance)
        return instance


class Chaos:
    """Injects faults into ``cluster`` until a deadline; every action goes to ``faults``.

    ``requested`` names the faults this run applies (see :data:`FAULTS`); ``proxy_for``,
    when given, makes a proxy for each new instance and returns it with the instance's
    URL through it (the ``partition`` fault needs it).
    """

    def __init__(self, cluster: ChaosCluster, rng: random.Random, profile: FaultProfile, *,
                 lease_ms: int | None, server: StoreServer | None, skew: bool,
                 workdir: Path, faults: FaultLog, requested: frozenset[str] | None = None,
                 proxy_for: Callable[[], tuple[FreezableProxy, str]] | None = None) -> None:
        self.cluster = cluster
        self.rng = rng
        self.profile = profile
        self.lease_ms = lease_ms
        self.server = server
        self.requested = frozenset(FAULTS) if requested is None else requested
        self.proxy_for = proxy_for
        self.proxies: dict[int, FreezableProxy] = {}
        self.partitioned: set[int] = set()
        self.problems: list[str] = []
        self._failover: threading.Thread | None = None
        self.faketime = faketime_library() if skew else None
        if skew and self.faketime is None:
            raise RuntimeError("clock skew needs the libfaketime package "
                               "(pip install libfaketime)")
        self.skew_dir = workdir / "skew"
        self.skew_dir.mkdir(parents=True, exist_ok=True)
        self.faults = faults
        self.paused: set[int] = set()
        self.skew_files: dict[int, Path] = {}
        self.store_down = False
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.counts: dict[str, int] = {}

    # ------------------------------------------------------------ instances

    def spawn(self, skew_s: float | None = None) -> Instance:
        """Start one instance, with a shifted clock for a share of them (when enabled)."""
        env: dict[str, str] = {}
        file: Path | None = None
        if self.faketime is not None:
            if skew_s is None and self.rng.random() < self.profile.skew_ratio:
                skew_s = self.rng.uniform(-self.profile.max_skew_s, self.profile.max_skew_s)
            if skew_s is not None:
                file = self.skew_dir / f"instance-{len(self.cluster.instances)}.faketime"
                file.write_text(f"{skew_s:+.3f}s\n")
                env = {
                    "LD_PRELOAD": self.faketime,
                    "FAKETIME_TIMESTAMP_FILE": str(file),
                    "FAKETIME_CACHE_DURATION": "1",
                    # Keep the monotonic clock real: asyncio timers, and the ledger's
                    # machine-wide ordering, rely on it.
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "DONT_FAKE_MONOTONIC": "1",
                }
        proxy, url = self.proxy_for() if self.proxy_for is not None else (None, None)
        instance = self.cluster.add(env=env, url=url)
        if proxy is not None:
            self.proxies[instance.pid] = proxy
        if file is not None:
            self.skew_files[instance.pid] = file
        self.faults.add("spawn", instance.pid,
                        skew_ms=None if skew_s is None else round(skew_s * 1000),
                        proxy_port=proxy.port if proxy is not None else None)
        return instance

    def healthy(self) -> list[Instance]:
        """Instances alive, not paused and not cut off from the store."""
        return [i for i in self.cluster.instances
                if i.alive and i.pid not in self.paused and i.pid not in self.partitioned]

    def _later(self, delay_s: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (time.monotonic() + delay_s, self._seq, action))

    def _run_timers(self, until: float | None = None) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= (now if until is None else until):
            due, _, action = heapq.heappop(self._timers)
            if until is not None and due > time.monotonic():
                time.sleep(max(0.0, due - time.monotonic()))
            action()

    # ------------------------------------------------------------ faults

    def possible(self) -> list[tuple[str, float]]:
        """The faults that can be applied right now, with their weights."""
        spare = len(self.healthy()) > self.profile.min_healthy
        options = []
        for kind, weight in self.profile.weights:
            if kind not in self.requested:
                continue
            if (kind in ("kill", "pause", "stop", "rolling", "partition") and not spare) or \
                    (kind == "restart" and (self.server is None or self.store_down
                                            or isinstance(self.server, RedisClusterServer))):
                continue
            if kind == "partition" and not any(i.pid in self.proxies for i in self.healthy()):
                continue
            if kind == "failover" and (not isinstance(self.server, RedisClusterServer)
                                       or self._failover is not None):
                continue
            if kind == "skew_step" and not any(
                    i.alive and i.pid in self.skew_files for i in self.cluster.instances):
                continue
            options.append((kind, weight))
        return options

    def inject(self) -> str | None:
        """Apply one fault chosen at random among the possible ones; its name."""
        options = self.possible()
        if not options:
            return None
        kinds, weights = zip(*options, strict=True)
        # A requested fault not applied yet goes first, so every one is exercised.
        fresh = [k for k in kinds if not self.counts.get(k)]
        kind: str = self.rng.choice(fresh) if fresh else self.rng.choices(kinds, weights)[0]
        getattr(self, f"_fault_{kind}")()
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return kind

    def _victim(self) -> Instance:
        return self.rng.choice(self.healthy())

    def _respawn_later(self) -> None:
        def respawn() -> None:
            self.spawn()

        self._later(self.rng.uniform(*self.profile.respawn_s), respawn)

    def _fault_kill(self) -> None:
        victim = self._victim()
        self.faults.add("kill", victim.pid)
        victim.kill()
        self._respawn_later()

    def _fault_stop(self) -> None:
        victim = self._victim()
        self.faults.add("stop", victim.pid)
        victim.proc.send_signal(signal.SIGTERM)  # not waited for: it hands over meanwhile
        self._respawn_later()

    def _fault_rolling(self) -> None:
        """A rolling deploy: the oldest healthy instance is SIGTERMed and replaced, in turn.

        Each step is logged as a ``stop`` (a graceful stop, judged as one); a step that
        would leave too few healthy instances is left out.
        """
        self.faults.add("rolling", None, instances=self.profile.rolling_instances)
        at = 0.0
        for _ in range(self.profile.rolling_instances):
            self._later(at, self._rolling_step)
            at += self.rng.uniform(*self.profile.rolling_gap_s)

    def _rolling_step(self) -> None:
        healthy = self.healthy()
        if len(healthy) <= self.profile.min_healthy:
            return
        oldest = min(healthy, key=self.cluster.instances.index)
        self.faults.add("stop", oldest.pid, rolling=True)
        oldest.proc.send_signal(signal.SIGTERM)
        self._respawn_later()

    def _fault_pause(self) -> None:
        victim = self._victim()
        lease_s = (self.lease_ms or 2_000) / 1000
        length = self.rng.uniform(*self.profile.pause_leases) * lease_s
        self.faults.add("pause", victim.pid, seconds=round(length, 3))
        victim.pause()
        self.paused.add(victim.pid)

        def resume() -> None:
            if victim.pid in self.paused:
                self.paused.discard(victim.pid)
                self.faults.add("resume", victim.pid)
                victim.resume()

        self._later(length, resume)

    def _fault_restart(self) -> None:
        assert self.server is not None
        down = self.rng.uniform(*self.profile.restart_down_s)
        crash = self.server.can_crash and self.rng.random() < 0.5
        self.faults.add("store_down", None, seconds=round(down, 3), crash=crash)
        self.server.halt(crash)
        self.store_down = True

        def up() -> None:
            assert self.server is not None
            self.server.start()
            self.store_down = False
            self.faults.add("store_up", None)

        self._later(down, up)

    def _fault_partition(self) -> None:
        victim = self.rng.choice([i for i in self.healthy() if i.pid in self.proxies])
        proxy = self.proxies[victim.pid]
        lease_s = (self.lease_ms or 2_000) / 1000
        length = self.rng.uniform(*self.profile.partition_leases) * lease_s
        self.faults.add("partition", victim.pid, seconds=round(length, 3),
                        proxy_port=proxy.port)
        proxy.freeze()
        self.partitioned.add(victim.pid)

        def heal() -> None:
            if victim.pid in self.partitioned:
                self.partitioned.discard(victim.pid)
                proxy.thaw()
                self.faults.add("heal", victim.pid)

        self._later(length, heal)

    def _fault_failover(self) -> None:
        server = self.server
        assert isinstance(server, RedisClusterServer)
        kill = self.rng.random() < self.profile.failover_kill_ratio
        pick = random.Random(self.rng.random())
        self.faults.add("failover", None, kill=kill)

        def run() -> None:
            try:
                detail = server.failover(pick, kill=kill)
                self.faults.add("promoted", None, **detail)
            except Exception as exc:  # noqa: BLE001 - reported: the fault did not happen
                self.problems.append(f"failover did not complete: {exc}")
                self.faults.add("failover_error", None, error=str(exc)[:500])
            finally:
                self._failover = None

        self._failover = threading.Thread(target=run, name="anarchon-chaos-failover",
                                          daemon=True)
        self._failover.start()

    def _fault_skew_step(self) -> None:
        victim = self.rng.choice([i for i in self.cluster.instances
                                  if i.alive and i.pid in self.skew_files])
        skew_s = self.rng.uniform(-self.profile.max_skew_s, self.profile.max_skew_s)
        self.skew_files[victim.pid].write_text(f"{skew_s:+.3f}s\n")
        self.faults.add("skew_step", victim.pid, skew_ms=round(skew_s * 1000))

    # ------------------------------------------------------------ driving

    def missing(self) -> set[str]:
        """Requested faults not applied yet (clock skew at start counts by its spawns)."""
        return set(self.requested) - set(self.counts) - {"skew"}

    def run(self, seconds: float, cover_s: float = 30.0) -> None:
        """Inject faults at random gaps for ``seconds``; respawns and resumes run on time.

        If a requested fault has not been applied by then, go on for up to ``cover_s``
        more seconds, a fault every 0.5–1 s, until each one has been: a short run still
        applies every fault it asked for (or the verdict says which it did not).
        """
        deadline = time.monotonic() + seconds
        hard = deadline + cover_s
        next_fault = time.monotonic() + self.rng.uniform(*self.profile.gap_s)
        while (now := time.monotonic()) < deadline or (now < hard and self.missing()):
            self._run_timers()
            if now >= next_fault:
                self.inject()
                gap = self.profile.gap_s if now < deadline else (0.5, 1.0)
                next_fault = now + self.rng.uniform(*gap)
            self._reap()
            time.sleep(0.02)

    def _reap(self) -> None:
        for i in self.cluster.instances:
            if not i.alive and not getattr(i, "_reaped", False):
                i._reaped = True  # type: ignore[attr-defined]
                self.faults.add("exited", i.pid, code=i.proc.returncode)
                proxy = self.proxies.pop(i.pid, None)
                self.partitioned.discard(i.pid)
                if proxy is not None:
                    proxy.stop()

    def close(self) -> None:
        """Wait for a failover in progress; stop every proxy."""
        thread = self._failover
        if thread is not None:
            thread.join(RedisClusterServer.PROMOTION_TIMEOUT_S * 2 + 10)
        for proxy in self.proxies.values():
            proxy.stop()
        self.proxies.clear()

    def settle(self) -> None:
        """End the chaos: run pending timers now (resumes, store start, respawns)."""
        self._run_timers(until=float("inf"))
        thread = self._failover
        if thread is not None:
            thread.join(RedisClusterServer.PROMOTION_TIMEOUT_S * 2 + 10)
        for i in self.cluster.instances:
            if i.pid in self.paused:
                self.paused.discard(i.pid)
                self.faults.add("resume", i.pid)
                i.resume()
        self._reap()
        self.faults.add("settle", None)
