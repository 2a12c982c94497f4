"""The chaos runner: a fleet of instances under random faults, then the checker's verdict.

::

    python -m chaos.run --backend sqlite|redis|valkey|postgres|rabbitmq|nats|
                                  redis-cluster|redis-cluster-acks|URL
                        --seconds 60 --instances 5 --seed 1234 --profile short|long
                        [--allow-missing-fault NAME ...]

It prints the seed first (a run is reproduced by passing the same ``--seed``: the same
faults are drawn in the same order, though their exact timing against the slots depends
on the machine), then the result table of :mod:`chaos.check`. Exit status 1 when the
checker finds a duplicate success, a lost run, a fenced side effect after a takeover, two
runs of a job at once where its overlap policy forbids it, or a clock shift that did not
apply.

Stores: ``redis``, ``valkey``, ``postgres`` and ``nats`` get a dedicated server on a free
port (the store-restart fault needs one); ``sqlite`` a file in the run's directory;
``rabbitmq`` starts a dedicated RabbitMQ node; ``redis-cluster`` a local Redis Cluster of 3
primaries and 3 replicas (the failover fault), ``redis-cluster-acks`` the same with
``min_replicas_acks=1``; a URL is used as given, with a fresh namespace added.
``redis-script`` and ``redis-stream-id`` run the claim-only Redis strategies on a dedicated
redis-server. A run never falls back to a shared service: a dedicated store that cannot
start ends the run with the reason.

Every fault of :data:`chaos.faults.FAULTS` is requested unless it cannot apply to the
backend at all (``not applicable``, with the reason: SQLite has no network, no server and
no clock of its own) or is opted out (``--no-restart``, ``--no-skew``, ``--no-partition``).
A requested fault that is not applied at least once, or cannot be set up (e.g. restarts
on a store given by URL), FAILS the run with the reason, unless ``--allow-missing-fault
NAME`` waives it; the verdict lists the faults requested, applied (with counts), waived
and not applicable.
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
from urllib.parse import urlsplit

from anarchon_core import Scheduler, backend_from_url
from anarchon_core.cli.processes import InstanceJob
from anarchon_core.durations import parse_duration_ms
from anarchon_core.models import Run
from anarchon_core.options import default_jitter_ms, default_max_late_ms, overlap_policy
from anarchon_core.url import mask_url

from .check import BackendReport, check_run, format_report
from .faults import FAULTS, Chaos, ChaosCluster, FaultLog, FaultProfile, faketime_library
from .proxy import FreezableProxy
from .servers import (
    NatsServer,
    PostgresServer,
    RabbitMQServer,
    RedisClusterServer,
    RedisServer,
    StoreServer,
)

__all__ = ["PROFILES", "RunResult", "Target", "chaos_jobs", "main", "open_target", "run_chaos"]

log = logging.getLogger("anarchon.chaos")

NAMED = ("sqlite", "redis", "valkey", "postgres", "rabbitmq", "nats", "redis-script",
         "redis-stream-id", "redis-cluster", "redis-cluster-acks")

#: Fault mix per profile: ``short`` hits hard for CI-length runs, ``long`` is the release
#: check (10+ minutes).
PROFILES = {
    "short": FaultProfile(gap_s=(1.0, 3.0)),
    "long": FaultProfile(gap_s=(2.0, 6.0)),
}
LEASE_MS, HEARTBEAT_MS = 2_000, 500
HISTORY_SIZE = 100_000
#: The most attempts history() reads per job (its upper bound); a 10-minute run has fewer.
HISTORY_LIMIT = 10_000
READY_TIMEOUT_S = 90


@dataclass
class Target:
    """Where a run happens: the namespaced URL, its server if we own it, and caveats.

    ``not_applicable``: faults that cannot apply to this backend at all, with the reason.
    ``unavailable``: faults that apply but cannot be set up here, with the reason (they
    fail the run unless waived). ``upstream``: the store's address, for partition proxies.
    """

    name: str
    url: str
    leases: bool
    server: StoreServer | None = None
    skew: bool = True
    notes: list[str] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    upstream: tuple[str, int] | None = None
    store: str = ""
    #: Duplicate successes (and runs lost) right after a failover are the measured cost of
    #: asynchronous replication, reported apart instead of failing the run.
    tolerate_failover_loss: bool = False


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by ``127.0.0.1:port`` (a proxy)."""
    parts = urlsplit(url)
    user, at, _ = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{user}{at}127.0.0.1:{port}").geturl()


def _upstream(url: str) -> tuple[str, int] | None:
    parts = urlsplit(url)
    return (parts.hostname, parts.port) if parts.hostname and parts.port else None


NO_FAILOVER = "a single server: no replica to promote (the failover fault runs on redis-cluster)"


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
def open_target(backend: str, workdir: Path) -> Iterator[Target]:
    """Start (or reach) the store for ``backend`` and yield its target; stop it after.

    A dedicated store that cannot start raises (RuntimeError): no shared service is ever
    used in its place.
    """
    ns = f"chaos{secrets.token_hex(4)}"
    server: StoreServer | None = None
    notes: list[str] = []
    na: dict[str, str] = {"failover": NO_FAILOVER}
    unavailable: dict[str, str] = {}
    skew = True
    tolerate = False
    if backend == "sqlite":
        url = f"sqlite:///{workdir / 'store.db'}?table={ns}"
        skew = False
        reason = ("SQLite's store clock is each process's own clock: a shifted clock would "
                  "shift the store itself")
        na.update(restart="SQLite has no server", partition="SQLite has no network",
                  skew=reason, skew_step=reason)
    elif backend in ("redis", "valkey", "redis-script", "redis-stream-id"):
        server = RedisServer(workdir / "server", valkey=backend == "valkey")
        server.start()
        url = _with_param(server.url, f"prefix={ns}:")
        if backend.startswith("redis-"):
            url = _with_param(url, f"strategy={backend.removeprefix('redis-')}")
    elif backend in ("redis-cluster", "redis-cluster-acks"):
        server = RedisClusterServer(workdir / "server")
        server.start()
        url = _with_param(server.url, f"prefix={ns}:")
        na.pop("failover")
        na["restart"] = ("the cluster is never restarted as a whole: the failover fault "
                         "takes one primary down at a time")
        na["partition"] = ("cluster clients reach every node at the address the cluster "
                           "announces, so one proxy per instance cannot stand in between")
        if backend.endswith("-acks"):
            url = _with_param(url, "min_replicas_acks=1")
            notes.append("min_replicas_acks=1: every lease write waits for its replica")
        else:
            tolerate = True
            notes.append("no replica acknowledgement: a duplicate success or a lost run "
                         "right after a failover is the measured cost of asynchronous "
                         "replication (counted apart, not failed)")
    elif backend == "postgres":
        server = PostgresServer(workdir / "server")
        server.start()
        url = _with_param(server.url, f"table={ns}")
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
        unavailable["restart"] = ("RabbitMQ loses a run's history record when the broker "
                                  "dies right after the claim (documented): not restarted")
    elif "://" in backend:
        url = _with_param(backend, _namespace_param(backend, ns))
        unavailable["restart"] = "a store given by URL is shared: it is never restarted"
        if backend.lower().startswith("sqlite"):
            skew = False
            na.update(restart="SQLite has no server", partition="SQLite has no network",
                      skew="SQLite's store clock is each process's own clock",
                      skew_step="SQLite's store clock is each process's own clock")
    else:
        raise SystemExit(f"unknown backend {backend!r}: use a URL or one of {', '.join(NAMED)}")
    try:
        leases = backend_from_url(url).supports_leases
        if not leases:
            na.setdefault("partition", "claim-only backend: no lease to lose (partition is "
                                       "a lease fault)")
        target = Target(backend, url, leases, server, skew, notes, na,
                        unavailable, None if "partition" in na else _upstream(url),
                        server.describe() if server is not None else
                        ("a file in the run directory" if backend == "sqlite" else
                         f"given by URL: {mask_url(url)}"),
                        tolerate)
        yield target
    finally:
        if server is not None:
            server.stop()


def chaos_jobs(leases: bool, seed: int) -> list[InstanceJob]:
    """The job mix, the same on every backend of a kind.

    Short and long handlers (``long`` outlives the lease), sync and async, and ``slow``,
    whose handler overruns its ``timeout_ms`` in about a third of its slots. Lease
    backends also run one job per overlap policy whose runs outlast the gap between its
    slots: ``skipping`` (``skip``), ``buffered`` (``buffer_one``, sync), ``replaced``
    (``cancel_other``: each run is cancelled by the next slot) and ``beside`` (``allow``).
    """
    jobs = [
        InstanceJob("tick", every="1s", sleep_s=0.05),
        InstanceJob("work", every="2s", sleep_s=0.6, sync=True),
        InstanceJob("long", every="5s", sleep_s=3.0),
        InstanceJob("slow", every="3s", sleep_s=0.2, sync=True, slow_ratio=0.35,
                slow_sleep_s=4.0, slow_seed=seed, options={"timeout_ms": 1_500}),
    ]
    if leases:
        jobs += [
            InstanceJob("skipping", every="1s", sleep_s=1.5, options={"overlap": "skip"}),
            InstanceJob("buffered", every="2s", sleep_s=2.5, sync=True,
                        options={"overlap": "buffer_one"}),
            InstanceJob("replaced", every="3s", sleep_s=6.0,
                        options={"overlap": "cancel_other"}),
            InstanceJob("beside", every="2s", sleep_s=3.0, options={"overlap": "allow"}),
        ]
    return jobs


def _job_meta(spec: InstanceJob) -> dict[str, Any]:
    assert spec.every is not None
    interval = parse_duration_ms(spec.every)
    jitter = spec.options.get("jitter_ms", default_jitter_ms(interval))
    max_late = spec.options.get("max_late_ms", default_max_late_ms(interval, jitter))
    return {"name": spec.name, "interval_ms": interval, "jitter_ms": jitter,
            "max_late_ms": max_late, "sleep_s": spec.sleep_s,
            "timeout_ms": spec.options.get("timeout_ms"), "slow_ratio": spec.slow_ratio,
            "max_attempts": spec.options.get("max_attempts", 3),
            "overlap": overlap_policy(spec.options.get("overlap", "skip"))}


def _read_history(url: str, jobs: list[str]) -> dict[str, list[dict[str, Any]]]:
    async def read() -> dict[str, list[dict[str, Any]]]:
        reader = Scheduler(backend_from_url(url))
        out: dict[str, list[dict[str, Any]]] = {}
        try:
            for job in jobs:
                for attempt in range(10):  # the store may still be recovering
                    try:
                        runs: list[Run] = []
                        try:
                            cursor: str | None = None
                            while True:  # every page: a long run has more than one
                                page = await reader.history(job, HISTORY_LIMIT, before=cursor)
                                runs.extend(page)
                                cursor = page.cursor
                                if cursor is None:
                                    break
                        except NotImplementedError:  # a backend without paged reads yet
                            runs = list(await reader.backend.history(job, HISTORY_LIMIT))
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


def plan_faults(target: Target, *, restart: bool, skew: bool, partition: bool,
                allow_missing: frozenset[str]) -> dict[str, Any]:
    """Which faults this run requests, and why the others are not."""
    opted_out = {}
    if not restart:
        opted_out["restart"] = "--no-restart"
    if not skew:
        opted_out.update(skew="--no-skew", skew_step="--no-skew")
    if not partition:
        opted_out["partition"] = "--no-partition"
    unavailable = dict(target.unavailable)
    if "skew" not in target.not_applicable and skew and faketime_library() is None:
        why = "clock skew needs the libfaketime package (pip install libfaketime)"
        unavailable.update(skew=why, skew_step=why)
    requested = [f for f in FAULTS if f not in target.not_applicable and f not in opted_out]
    unknown = sorted(allow_missing - set(FAULTS))
    if unknown:
        raise SystemExit(f"--allow-missing-fault {unknown[0]!r}: not a fault "
                         f"(one of {', '.join(FAULTS)})")
    return {"requested": requested, "not_applicable": dict(target.not_applicable),
            "opted_out": opted_out, "unavailable": unavailable,
            "allow_missing": sorted(allow_missing)}


def run_chaos(backend: str, *, seconds: float, instances: int = 5, seed: int,
              profile: str = "short", workdir: Path, restart: bool = True,
              skew: bool = True, partition: bool = True,
              allow_missing: frozenset[str] | set[str] = frozenset(), cover_s: float = 30.0,
              out: Any = None) -> RunResult:
    """Run the fleet under faults for ``seconds`` and check it; artefacts in ``workdir``.

    A requested fault not applied by then gets up to ``cover_s`` more seconds (see
    :meth:`Chaos.run`).
    """
    def say(text: str) -> None:
        print(text, file=out or sys.stdout, flush=True)

    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    command = (f"python -m chaos.run --backend {backend} --seconds {seconds:g} "
               f"--instances {instances} --seed {seed} --profile {profile}"
               + "".join(f" --allow-missing-fault {f}" for f in sorted(allow_missing))
               + ("" if restart else " --no-restart") + ("" if skew else " --no-skew")
               + ("" if partition else " --no-partition"))
    with open_target(backend, workdir) as target:
        plan = plan_faults(target, restart=restart, skew=skew, partition=partition,
                           allow_missing=frozenset(allow_missing))
        applying = frozenset(f for f in plan["requested"] if f not in plan["unavailable"])
        use_skew = "skew" in applying
        lease_ms, heartbeat_ms = (LEASE_MS, HEARTBEAT_MS) if target.leases else (None, None)
        jobs = chaos_jobs(target.leases, seed)
        cluster = ChaosCluster(target.url, jobs, workdir, lease_ms=lease_ms,
                               heartbeat_ms=heartbeat_ms, grace_ms=1_000,
                               history_size=HISTORY_SIZE)
        faults = FaultLog()
        clock0 = {"wall_ms": time.time() * 1000, "mono_ns": time.monotonic_ns()}
        upstream = target.upstream

        def proxy_for() -> tuple[FreezableProxy, str]:
            assert upstream is not None
            proxy = FreezableProxy(upstream, name=f"proxy-{len(cluster.instances)}").start()
            return proxy, _via(target.url, proxy.port)

        chaos = Chaos(cluster, rng, PROFILES[profile], lease_ms=lease_ms, server=target.server,
                      skew=use_skew, workdir=workdir, faults=faults, requested=applying,
                      proxy_for=proxy_for if "partition" in applying and upstream else None)
        say(f"backend {target.name}: {mask_url(target.url)} "
            f"({'lease' if target.leases else 'claim-only'}); store: {target.store}; "
            f"{instances} instances; {seconds:g} s of faults; profile {profile}; "
            f"faults requested: {', '.join(plan['requested'])}; artefacts in {workdir}")
        try:
            with cluster:
                for n in range(instances):
                    # The first instance always runs skewed (when skew applies), the rest
                    # by lot.
                    chaos.spawn(rng.uniform(-30, 30) if n == 0 and use_skew else None)
                cluster.wait_ready(READY_TIMEOUT_S)
                begin = time.time() * 1000 + 1_000
                chaos.run(seconds, cover_s)
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
                if target.leases:
                    # A lease heartbeated just before its runner exited (or whose release
                    # was not acknowledged) is live a moment longer: read after it ends.
                    time.sleep(LEASE_MS / 1000 + 0.5)
        finally:
            chaos.close()
        history = _read_history(target.url, [j.name for j in jobs])
        meta = {
            "backend": target.name, "url": mask_url(target.url), "seed": seed,
            "profile": profile, "seconds": seconds, "instances": instances,
            "fault_seconds": round((end - begin) / 1000 + 1, 1),
            "leases": target.leases, "lease_ms": lease_ms, "heartbeat_ms": heartbeat_ms,
            "jobs": [_job_meta(j) for j in jobs], "window": [begin, end], "clock0": clock0,
            "skew": use_skew, "restart": "restart" in applying, "notes": target.notes,
            "fault_counts": chaos.counts, "command": command, "store": target.store,
            "server_starts": target.server.starts if target.server is not None else 0,
            "fault_plan": plan, "fault_problems": chaos.problems, "exit_lines": True,
            "tolerate_failover_loss": target.tolerate_failover_loss,
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
    parser.add_argument("--no-restart", action="store_true",
                        help="do not request store restarts (printed in the verdict)")
    parser.add_argument("--no-skew", action="store_true",
                        help="do not request clock skew (printed in the verdict)")
    parser.add_argument("--no-partition", action="store_true",
                        help="do not request network partitions (printed in the verdict)")
    parser.add_argument("--allow-missing-fault", action="append", default=[], metavar="NAME",
                        help="a requested fault that may go unapplied without failing the "
                             f"run (printed in the verdict); one of {', '.join(FAULTS)}")
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
                       skew=not args.no_skew, partition=not args.no_partition,
                       allow_missing=frozenset(args.allow_missing_fault))
    print(format_report(result.report), flush=True)
    failed = bool(result.report.failures())
    if failed or args.workdir is not None:
        print(f"artefacts kept in {workdir} (re-check: python -m chaos.check {workdir})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
