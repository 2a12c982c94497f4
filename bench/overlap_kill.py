"""Overlap policies when a runner dies: SIGKILL the instance whose handler just started.

    python -m bench.overlap_kill [--backend postgres|sqlite|redis] [--url URL]
                                 [--lease 30000] [--heartbeat MS] [--instances 3] [--smoke]

One job ``every 1s`` with a 0.2 s handler on ``--instances`` instance processes
(``anarchon_core.cli.instance``), one fleet per overlap policy (``allow``, ``skip``,
``buffer_one``), the three at once, each in its own namespace of the same store. In each
fleet the instance whose handler has just started is SIGKILLed: its run's lease lives on
for up to ``--lease`` ms, and the policy decides what happens to the slots due meanwhile.
``allow`` is the baseline (the ratio column divides by its runs).

Per policy, over the slots due in the lease after the kill: how many ran, how many were
recorded skipped, how many ran late (more than a slot's gap after their time), the longest
gap between two handler starts (from the killed run's start until the fleet stops), how
many pairs of runs overlapped (by the handlers' ledger; the killed run ends at its kill)
and what became of the killed slot. The fleets run on for two heartbeats and 3 s past the
lease, so a backup has seen the dead lease expire. ``--smoke`` uses a 4 s lease.

``--backend`` picks the machine's shared store in a fresh namespace (PostgreSQL database
``test``, Redis db 0) or a SQLite file in a temporary directory; ``--url`` names another
server (a namespace parameter is added).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from anarchon_core import Scheduler, backend_from_url
from anarchon_core.cli.processes import Cluster, InstanceJob, LedgerEntry
from anarchon_core.models import Run

from .common import add_smoke_flag

STORES = {
    "postgres": "postgresql://postgres@127.0.0.1:5432/test",
    "redis": "redis://127.0.0.1:6379/0",
    "sqlite": "sqlite:///{dir}/overlap.db",
}
POLICIES = ("allow", "skip", "buffer_one")
GAP_MS = 1_000
HANDLER_S = 0.2
JITTER_MS = 100
JOB = "job"
#: Slots after start-up left alone before a kill (first connections, missed-slot scans).
SETTLE_MS = 1_500


def namespaced(url: str, ns: str) -> str:
    """``url`` with the namespace parameter of its scheme (``table`` or ``prefix``)."""
    param = f"table={ns}" if url.split("://", 1)[0].startswith(("postgres", "sqlite")) \
        else f"prefix={ns}:"
    return f"{url}{'&' if '?' in url else '?'}{param}"


@dataclass
class Kill:
    """The killed run's start line, and when the kill landed (wall ms, monotonic ns)."""

    start: LedgerEntry
    wall_ms: int
    mono_ns: int


@dataclass
class Row:
    """One policy's figures."""

    policy: str
    due: int
    ran: int
    skipped: int
    late: int
    longest_gap_s: float
    at_once: int
    killed_slot: str


def _history(url: str) -> list[Run]:
    async def read() -> list[Run]:
        reader = Scheduler(backend_from_url(url))
        try:
            return [r for r in await reader.history(JOB, 10_000) if not r.manual]
        finally:
            await reader.stop()

    return asyncio.run(read())


def overlapping(entries: list[LedgerEntry], kill: Kill) -> int:
    """Pairs of runs whose handlers ran at the same time (the killed one until its kill)."""
    spans: dict[str, list[int]] = {}
    for e in entries:
        if e.mono_ns is None:
            continue
        span = spans.setdefault(e.token, [0, 2**63])
        if e.event == "start":
            span[0] = e.mono_ns
        elif e.event == "exit":
            span[1] = e.mono_ns
    if kill.start.token in spans:
        spans[kill.start.token][1] = min(spans[kill.start.token][1], kill.mono_ns)
    ordered = sorted(spans.values())
    return sum(1 for (_, a1), (b0, _) in itertools.combinations(ordered, 2) if b0 < a1)


def fate(slot: int, history: list[Run], kill: Kill) -> str:
    """What became of the killed slot, in words."""
    runs = sorted((r for r in history if r.slot == slot), key=lambda r: -r.attempt)
    if not runs:
        return "no record"
    last = runs[0]
    if last.status == "success" and last.attempt > 1 and last.started_at is not None:
        again = last.started_at.timestamp() - kill.wall_ms / 1000
        return f"run again {again:.1f} s after the kill"
    error = last.error or ""
    return f"{last.status} ({error.split(':')[0] or '-'})"


def measure(policy: str, entries: list[LedgerEntry], history: list[Run], kill: Kill, *,
            lease_ms: int, until_ms: float) -> Row:
    """The row of one policy."""
    slot0 = kill.start.slot
    due = list(range(slot0 + GAP_MS, kill.wall_ms + lease_ms + 1, GAP_MS))
    first: dict[int, int] = {}
    for e in entries:
        if e.event == "start":
            first[e.slot] = min(first.get(e.slot, e.time_ms), e.time_ms)
    ran = [s for s in due if s in first]
    skipped = {r.slot for r in history if r.status == "skipped"}
    starts = sorted(e.time_ms for e in entries if e.event == "start"
                    and kill.start.time_ms <= e.time_ms <= until_ms)
    gaps = [b - a for a, b in itertools.pairwise(starts)] or [0]
    return Row(policy, len(due), len(ran), len(skipped & set(due)),
               sum(1 for s in ran if first[s] - s > GAP_MS), max(gaps) / 1000,
               overlapping(entries, kill), fate(slot0, history, kill))


@contextlib.contextmanager
def fleets(urls: dict[str, str], workdir: Path, instances: int, lease_ms: int,
           heartbeat_ms: int) -> Iterator[dict[str, Cluster]]:
    """One started fleet per policy; every process is SIGKILLed on the way out."""
    with contextlib.ExitStack() as stack:
        clusters = {}
        for policy, url in urls.items():
            job = InstanceJob(JOB, every="1s", sleep_s=HANDLER_S,
                              options={"overlap": policy, "jitter_ms": JITTER_MS})
            cluster = stack.enter_context(Cluster(
                url, [job], workdir / policy, lease_ms=lease_ms, heartbeat_ms=heartbeat_ms))
            for _ in range(instances):
                cluster.add()
            clusters[policy] = cluster
        for cluster in clusters.values():
            cluster.wait_ready()
        yield clusters


def kill_runners(clusters: dict[str, Cluster]) -> dict[str, Kill]:
    """In each fleet, SIGKILL the instance whose handler has just started."""
    settled = time.time() * 1000 + SETTLE_MS
    kills: dict[str, Kill] = {}
    deadline = time.monotonic() + 30
    while len(kills) < len(clusters):
        if time.monotonic() > deadline:
            raise SystemExit(f"no run started in {sorted(set(clusters) - set(kills))}")
        for policy, cluster in clusters.items():
            if policy in kills:
                continue
            start = next((e for e in cluster.ledger() if e.event == "start"
                          and e.slot >= settled and e.attempt == 1), None)
            if start is not None:
                next(i for i in cluster.instances if i.pid == start.pid).kill()
                kills[policy] = Kill(start, round(time.time() * 1000), time.monotonic_ns())
        time.sleep(0.01)
    return kills


def run(url: str, instances: int, lease_ms: int, heartbeat_ms: int) -> list[Row]:
    """The three fleets, their kills, and a row each."""
    ns = f"ovk{uuid.uuid4().hex[:8]}"
    urls = {policy: namespaced(url, f"{ns}{policy[:2]}") for policy in POLICIES}
    drain_ms = 2 * heartbeat_ms + 3_000
    with tempfile.TemporaryDirectory(prefix="anarchon-overlap-") as tmp, \
            fleets(urls, Path(tmp), instances, lease_ms, heartbeat_ms) as clusters:
        kills = kill_runners(clusters)
        until = max(k.wall_ms for k in kills.values()) + lease_ms + drain_ms
        time.sleep(max(0.0, until / 1000 - time.time()))
        for cluster in clusters.values():
            cluster.stop_all()
        rows = []
        for policy, cluster in clusters.items():
            entries = [e for e in cluster.ledger() if not e.manual]
            kill = kills[policy]
            if any(e.token == kill.start.token and e.event != "start" for e in entries):
                raise SystemExit(f"{policy}: the handler returned before the SIGKILL landed")
            rows.append(measure(policy, entries, _history(urls[policy]), kill,
                                lease_ms=lease_ms, until_ms=until))
    return rows


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m bench.overlap_kill``."""
    parser = argparse.ArgumentParser(prog="python -m bench.overlap_kill")
    parser.add_argument("--backend", choices=sorted(STORES), default="postgres")
    parser.add_argument("--url", help="another server of that kind (a namespace is added)")
    parser.add_argument("--lease", type=int, default=30_000, metavar="MS")
    parser.add_argument("--heartbeat", type=int, default=None, metavar="MS",
                        help="default: a third of the lease")
    parser.add_argument("--instances", type=int, default=3)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.lease, args.heartbeat = 4_000, 1_000
    heartbeat = args.heartbeat or args.lease // 3
    with tempfile.TemporaryDirectory(prefix="anarchon-overlap-store-") as store_dir:
        url = args.url or STORES[args.backend].format(dir=store_dir)
        rows = run(url, args.instances, args.lease, heartbeat)
    print(f"\nevery 1 s, {HANDLER_S} s handler, {args.instances} instances on "
          f"{args.backend}, lease {args.lease / 1000:g} s, heartbeat {heartbeat / 1000:g} s; "
          "the instance whose handler had just started SIGKILLed\n")
    print("| overlap | slots due in the lease after the kill | run | skipped | late runs | "
          "run ÷ allow | longest gap between starts (s) | runs at once | killed slot |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = rows[0].ran or 1
    for r in rows:
        print(f"| {r.policy} | {r.due} | {r.ran} | {r.skipped} | {r.late} | "
              f"{r.ran / base:.2f} | {r.longest_gap_s:.2f} | {r.at_once} | {r.killed_slot} |")
    broken = [r.policy for r in rows if r.at_once and r.policy != "allow"]
    if broken:
        raise SystemExit(f"two runs at once under {', '.join(broken)}: the policy failed")


if __name__ == "__main__":
    main()
