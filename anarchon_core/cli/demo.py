"""``anarchon demo``: several instances race for every slot; one is killed mid-run.

By default on a temporary SQLite file (no server needed). Prints, at the end, every slot
with its attempts (who ran each, how it ended) and a summary: slots, successes,
duplicates (must be 0) and takeovers.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from ..models import Run
from ..scheduler import Scheduler
from ..schedules import ms_to_datetime
from ..url import backend_from_url, mask_url
from .processes import Cluster, InstanceJob

__all__ = ["run_demo"]

LEASE_MS, HEARTBEAT_MS = 3_000, 1_000
JOBS = [
    InstanceJob("heartbeat", every="2s", sleep_s=0.2),
    InstanceJob("report", every="8s", sleep_s=4.0),
]


def _namespaced(url: str) -> str:
    """Give the demo its own namespace in a shared store."""
    tag = secrets.token_hex(3)
    scheme = url.split("://", 1)[0].lower()
    if scheme.startswith(("postgres", "sqlite")):
        param = f"table=anarchon_demo_{tag}"
    elif scheme.startswith(("redis", "valkey")):
        param = f"prefix=anarchon-demo-{tag}:"
    else:
        param = f"prefix=anarchon-demo-{tag}."
    return f"{url}{'&' if '?' in url else '?'}{param}"


def _say(text: str) -> None:
    print(text, flush=True)


def _history(url: str) -> dict[str, list[Run]]:
    async def read() -> dict[str, list[Run]]:
        reader = Scheduler(backend_from_url(url))
        try:
            return {job.name: await reader.history(job.name, 1000) for job in JOBS}
        finally:
            await reader.stop()
    return asyncio.run(read())


def _print_table(history: dict[str, list[Run]], killed_pid: int | None) -> int:
    """Print the slot table and the summary; return the number of duplicate successes."""
    _say(f"\n{'slot (UTC)':<10} {'job':<10} attempts (runner → status)")
    _say("-" * 78)
    rows, slots, successes, duplicates, takeovers = [], 0, 0, 0, 0
    for job, runs in history.items():
        by_slot: dict[int, list[Run]] = defaultdict(list)
        for run in runs:
            by_slot[run.slot].append(run)
        for slot, attempts in by_slot.items():
            attempts.sort(key=lambda r: r.attempt)
            ok = sum(1 for r in attempts if r.status == "success")
            slots += 1
            successes += min(ok, 1)
            duplicates += max(0, ok - 1)
            takeovers += sum(1 for r in attempts if r.attempt > 1)
            text = "  →  ".join(_describe(r, killed_pid) for r in attempts)
            rows.append((slot, job, text))
    for slot, job, text in sorted(rows):
        _say(f"{_clock_ms(slot):<10} {job:<10} {text}")
    _say("-" * 78)
    _say(f"slots: {slots}   successes: {successes}   duplicates: {duplicates}   "
         f"takeovers: {takeovers}")
    if any(r.status == "skipped" and (r.error or "").startswith("overlap")
           for runs in history.values() for r in runs):
        _say("skipped (overlap): with overlap='skip', the default, a job's slot is skipped "
             "while its run before is still going (holds a live lease); 'buffer_one' runs "
             "one of them right after it, 'allow' runs them side by side")
    return duplicates


def _describe(run: Run, killed_pid: int | None) -> str:
    text = f"#{run.attempt} {run.runner} {run.status}"
    if run.status == "success":
        return text
    if killed_pid and run.runner.endswith(f":{killed_pid}"):
        return f"{text} (killed)"
    reason = (run.error or "").split(":")[0]
    if run.status == "skipped" and reason == "overlap":
        # overlap="skip" (the default): a slot is not run while the job's run before it
        # still holds a live lease, here the taken-over run that started late.
        return f"{text} (overlap: the run before it was still going)"
    return f"{text} ({reason})" if reason else text


def _clock_ms(slot: int) -> str:
    return ms_to_datetime(slot).strftime("%H:%M:%S")


def run_demo(*, backend: str | None, instances: int, seconds: float) -> int:
    """Run the demo; return the exit code (1 if any slot succeeded twice)."""
    with tempfile.TemporaryDirectory(prefix="anarchon-demo-") as tmp:
        workdir = Path(tmp)
        url = _namespaced(backend or f"sqlite:///{workdir / 'demo.db'}")
        leases = backend_from_url(url).supports_leases
        _say(f"anarchon demo: {instances} instances on {mask_url(url)}")
        _say("jobs: heartbeat every 2s (0.2 s of work), report every 8s (4 s of work)"
             + (f"; lease {LEASE_MS} ms, heartbeat {HEARTBEAT_MS} ms" if leases else ""))
        cluster = Cluster(url, JOBS, workdir, lease_ms=LEASE_MS if leases else None,
                          heartbeat_ms=HEARTBEAT_MS if leases else None, log_level="WARNING")
        killed_pid = None
        with cluster:
            for _ in range(instances):
                cluster.add()
            cluster.wait_ready()
            _say("instances: " + ", ".join(str(i.pid) for i in cluster.instances))
            started = time.monotonic()
            deadline = started + seconds
            while time.monotonic() < deadline and killed_pid is None:
                victim = cluster.running_instance("report")
                if victim is not None and len(cluster.instances) > 1:
                    time.sleep(1.0)
                    victim.kill()
                    killed_pid = victim.pid
                    _say(f"[{time.monotonic() - started:5.1f}s] SIGKILL instance {victim.pid} "
                         "while it runs 'report'"
                         + (": a backup takes over once its lease expires" if leases else
                            " (claim-only backend: no takeover)"))
                time.sleep(0.1)
            # Let a takeover finish before stopping (bounded).
            finish_by = max(deadline, time.monotonic() + (LEASE_MS + 6_000) / 1000)
            while time.monotonic() < finish_by:
                time.sleep(0.2)
            _say(f"[{time.monotonic() - started:5.1f}s] stopping all instances (SIGTERM)")
            cluster.stop_all()
        duplicates = _print_table(_history(url), killed_pid)
        return 1 if duplicates else 0
