"""The chaos runner: a fleet of instances under random faults, then the checker's verdict.

::

    python -m chaos.run --backend sqlite|redis|valkey|postgres|rabbitmq|nats|URL
                        --seconds 60 --instances 5 --seed 1234 --profile short|long

It prints the seed first (a run is reproduced by passing the same ``--seed``: the same
faults are drawn in the same order, though their exact timing against the slots depends
on the machine), then the result table of :mod:`chaos.check`. Exit status 1 when the
checker finds a duplicate success, a lost run, a fenced side effect after a takeover, or a
clock shift that did not apply.

Stores: ``redis``, ``valkey``, ``postgres`` and ``nats`` get a dedicated server on a free
port (the store-restart fault needs one); ``sqlite`` a file in the run's directory;
``rabbitmq`` starts a dedicated RabbitMQ node (restarted like the others); a URL is used as
given, with a fresh namespace added (no restart fault). ``redis-script`` and
``redis-stream-id`` run the claim-only Redis strategies on a dedicated redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anarchon_core import Scheduler, backend_from_url
from anarchon_core.cli.fleet import Cluster, JobSpec
from anarchon_core.durations import parse_duration_ms
from anarchon_core.options import default_jitter_ms, default_max_late_ms
from anarchon_core.url import mask_url

from .check import BackendReport, check_run, format_report
from .faults import Chaos, FaultLog, FaultProfile
from .servers import NatsServer, PostgresServer, RabbitMQServer, RedisServer, StoreServer

__all__ = ["PROFILES", "RunResult", "Target", "chaos_jobs", "main", "open_target", "run_chaos"]

log = logging.getLogger("anarchon.chaos")

SHARED_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
NAMED = ("sqlite", "redis", "valkey", "postgres", "rabbitmq", "nats", "redis-script",
         "redis-stream-id")

#: Fault mix per profile: ``short`` hits hard for CI-length runs, ``long`` is the release
#: check (10+ minutes).
PROFILES = {
    "short": FaultProfile(gap_s=(1.0, 3.0)),
    "long": FaultProfile(gap_s=(2.0, 6.0)),
}
LEASE_MS, HEARTBEAT_MS = 2_000, 500
HISTORY_SIZE = 100_000
READY_TIMEOUT_S = 90


@dataclass
class Target:
    """Where a run happens: the namespaced URL, its server if we own it, and caveats."""

    name: str
    url: str
    leases: bool
    server: StoreServer | None = None
    skew: bool = True
    notes: list[str] = field(default_factory=list)


def _with_param(url: str, param: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{param}"


def _namespace_param(url: str, ns: str) -> str:
    scheme = url.split("://", 1)[0].lower()
    if scheme.startswith(("postgres", "sqlite")):
        return f"table={ns}"
    if scheme.startswith(("redis", "valkey")):
        return f"prefix={ns}:"
    if scheme.startswith("nats") or scheme == "tls":
        return f"prefix={ns}.&stream={ns.upper()}"
    return f"prefix={ns}."


@contextlib.contextmanager
def open_target(backend: str, workdir: Path, *, restart: bool = True) -> Iterator[Target]:
    """Start (or reach) the store for ``backend`` and yield its target; stop it after."""
    ns = f"chaos{secrets.token_hex(4)}"
    server: StoreServer | None = None
    notes: list[str] = []
    skew = True
    if backend == "sqlite":
        url = f"sqlite:///{workdir / 'store.db'}?table={ns}"
        skew = False
        notes.append("SQLite's store clock is each process's own clock: a shifted clock "
                     "would shift the store, so the clock-skew fault is skipped on SQLite")
        notes.append("SQLite has no server: the store-restart fault is skipped")
    elif backend in ("redis", "valkey", "redis-script", "redis-stream-id"):
        server = RedisServer(workdir / "server", valkey=backend == "valkey")
        server.start()
        url = _with_param(server.url, f"prefix={ns}:")
        if backend.startswith("redis-"):
            url = _with_param(url, f"strategy={backend.removeprefix('redis-')}")
    elif backend == "postgres":
        try:
            server = PostgresServer(workdir / "server")
            server.start()
            url = _with_param(server.url, f"table={ns}")
        except (RuntimeError, OSError, Exception) as exc:  # noqa: BLE001 - fall back, say so
            server = None
            url = _with_param(SHARED_POSTGRES, f"table={ns}")
            notes.append(f"no dedicated PostgreSQL ({exc}); shared server used, no restarts")
    elif backend == "nats":
        server = NatsServer(workdir / "server")
        server.start()
        url = _with_param(server.url, f"prefix={ns}.&stream={ns.upper()}")
        notes.append("nats-server 2.9 fsyncs JetStream periodically: restarts are clean "
                     "(SIGTERM), never crashes")
    elif backend == "rabbitmq":
        server = RabbitMQServer(workdir / "server")
        server.start()
        url = _with_param(server.url, f"prefix={ns}.")
        # A claim and its history record are two writes: a broker that dies between them
        # loses the run's record (docs/backends/rabbitmq.md). Restarts would only show that.
        restart = False
        notes.append("RabbitMQ: store restarts off (a run's history record can be lost "
                     "when the broker dies right after the claim; documented)")
    elif "://" in backend:
        url = _with_param(backend, _namespace_param(backend, ns))
        notes.append("a store given by URL is shared: the store-restart fault is skipped")
        if backend.lower().startswith("sqlite"):
            skew = False
    else:
        raise SystemExit(f"unknown backend {backend!r}: use a URL or one of {', '.join(NAMED)}")
    if server is not None and not restart:
        notes.append("store restarts disabled for this run")
    try:
        leases = backend_from_url(url).supports_leases
        yield Target(backend, url, leases, server if restart else None, skew, notes)
    finally:
        if server is not None:
            server.stop()


def chaos_jobs(leases: bool, seed: int) -> list[JobSpec]:
    """The job mix, the same on every backend.

    Short and long handlers (``long`` outlives the lease), sync and async, and ``slow``,
    whose handler overruns its ``timeout_ms`` in about a third of its slots.
    """
    return [
        JobSpec("tick", every="1s", sleep_s=0.05),
        JobSpec("work", every="2s", sleep_s=0.6, sync=True),
        JobSpec("long", every="5s", sleep_s=3.0),
        JobSpec("slow", every="3s", sleep_s=0.2, sync=True, slow_ratio=0.35,
                slow_sleep_s=4.0, slow_seed=seed, options={"timeout_ms": 1_500}),
    ]


def _job_meta(spec: JobSpec) -> dict[str, Any]:
    assert spec.every is not None
    interval = parse_duration_ms(spec.every)
    jitter = spec.options.get("jitter_ms", default_jitter_ms(interval))
    max_late = spec.options.get("max_late_ms", default_max_late_ms(interval, jitter))
    return {"name": spec.name, "interval_ms": interval, "jitter_ms": jitter,
            "max_late_ms": max_late, "sleep_s": spec.sleep_s,
            "timeout_ms": spec.options.get("timeout_ms"), "slow_ratio": spec.slow_ratio,
            "max_attempts": spec.options.get("max_attempts", 3)}


def _read_history(url: str, jobs: list[str]) -> dict[str, list[dict[str, Any]]]:
    async def read() -> dict[str, list[dict[str, Any]]]:
        reader = Scheduler(backend_from_url(url))
        out: dict[str, list[dict[str, Any]]] = {}
        try:
            for job in jobs:
                for attempt in range(10):  # the store may still be recovering
                    try:
                        runs = await reader.history(job, HISTORY_SIZE)
                        break
                    except Exception:
                        if attempt == 9:
                            raise
                        await asyncio.sleep(1)
                out[job] = [{
                    "job": r.job, "slot": r.slot, "attempt": r.attempt, "status": r.status,
                    "runner": r.runner, "error": r.error, "manual": r.manual,
                    "started_at": r.started_at.isoformat() if r.started_at else None,
                    "finished_at": r.finished_at.isoformat() if r.finished_at else None,
                } for r in runs]
        finally:
            await reader.stop()
        return out

    return asyncio.run(read())


@dataclass
class RunResult:
    """A finished run: its directory (kept for ``chaos.check``) and the verdict."""

    workdir: Path
    report: BackendReport


def run_chaos(backend: str, *, seconds: float, instances: int = 5, seed: int,
              profile: str = "short", workdir: Path, restart: bool = True,
              skew: bool = True, out: Any = None) -> RunResult:
    """Run the fleet under faults for ``seconds`` and check it; artefacts in ``workdir``."""
    def say(text: str) -> None:
        print(text, file=out or sys.stdout, flush=True)

    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    command = (f"python -m chaos.run --backend {backend} --seconds {seconds:g} "
               f"--instances {instances} --seed {seed} --profile {profile}")
    with open_target(backend, workdir, restart=restart) as target:
        use_skew = skew and target.skew
        lease_ms, heartbeat_ms = (LEASE_MS, HEARTBEAT_MS) if target.leases else (None, None)
        jobs = chaos_jobs(target.leases, seed)
        cluster = Cluster(target.url, jobs, workdir, lease_ms=lease_ms,
                          heartbeat_ms=heartbeat_ms, grace_ms=1_000,
                          history_size=HISTORY_SIZE)
        faults = FaultLog()
        clock0 = {"wall_ms": time.time() * 1000, "mono_ns": time.monotonic_ns()}
        chaos = Chaos(cluster, rng, PROFILES[profile], lease_ms=lease_ms, server=target.server,
                      skew=use_skew, workdir=workdir, faults=faults)
        say(f"backend {target.name}: {mask_url(target.url)} "
            f"({'lease' if target.leases else 'claim-only'}); {instances} instances; "
            f"{seconds:g} s of faults; profile {profile}; artefacts in {workdir}")
        with cluster:
            for n in range(instances):
                # The first instance always runs skewed (when skew applies), the rest by lot.
                chaos.spawn(rng.uniform(-30, 30) if n == 0 and use_skew else None)
            cluster.wait_ready(READY_TIMEOUT_S)
            begin = time.time() * 1000 + 1_000
            chaos.run(seconds)
            end = time.time() * 1000
            chaos.settle()
            # Let every run of a slot in the window end, be taken over and end again.
            settle_s = (2 * LEASE_MS / 1000 + 3) if target.leases else 4
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline:
                chaos._run_timers()
                time.sleep(0.1)
            faults.add("stop_all", None)
            cluster.stop_all()
            chaos._reap()
        history = _read_history(target.url, [j.name for j in jobs])
        meta = {
            "backend": target.name, "url": mask_url(target.url), "seed": seed,
            "profile": profile, "seconds": seconds, "instances": instances,
            "leases": target.leases, "lease_ms": lease_ms, "heartbeat_ms": heartbeat_ms,
            "jobs": [_job_meta(j) for j in jobs], "window": [begin, end], "clock0": clock0,
            "skew": use_skew, "restart": target.server is not None, "notes": target.notes,
            "fault_counts": chaos.counts, "command": command,
        }
        (workdir / "run.json").write_text(json.dumps(meta, indent=1))
        (workdir / "history.json").write_text(json.dumps(history))
        faults.save(workdir / "faults.jsonl")
    report = check_run(workdir)
    return RunResult(workdir, report)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m chaos.run``."""
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="sqlite",
                        help=f"a backend URL or one of: {', '.join(NAMED)}")
    parser.add_argument("--seconds", type=float, default=None,
                        help="how long to inject faults (default 30 short, 600 long)")
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="short")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where ledgers, logs and history go (default: a temp dir, "
                             "removed after a passing run)")
    parser.add_argument("--no-restart", action="store_true", help="no store restarts")
    parser.add_argument("--no-skew", action="store_true", help="no clock skew")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    print(f"seed {seed}", flush=True)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    seconds = args.seconds if args.seconds is not None else (
        600 if args.profile == "long" else 30)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="anarchon-chaos-"))
    result = run_chaos(args.backend, seconds=seconds, instances=args.instances, seed=seed,
                       profile=args.profile, workdir=workdir, restart=not args.no_restart,
                       skew=not args.no_skew)
    print(format_report(result.report), flush=True)
    failed = bool(result.report.failures())
    if failed or args.workdir is not None:
        print(f"artefacts kept in {workdir} (re-check: python -m chaos.check {workdir})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
