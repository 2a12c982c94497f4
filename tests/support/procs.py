"""Real instance processes for multi-process tests, and the ledger they write.

    cluster = start_instances(url, [InstanceJob("tick", every="1s")], count=4, workdir=tmp_path)
    with cluster:                      # every instance is SIGKILLed on exit
        cluster.wait_ready()
        time.sleep(15)
        cluster.stop_all()
    report = assert_exactly_once(cluster.ledger(), "tick", history=read_history(url, "tick"))
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from anarchon_core import Run, Scheduler, backend_from_url
from anarchon_core.cli.processes import (
    Cluster,
    Instance,
    InstanceJob,
    LedgerEntry,
    read_ledger,
    start_instances,
)

from .helpers import await_until, wait_for

__all__ = [
    "Cluster",
    "Instance",
    "InstanceJob",
    "LedgerEntry",
    "OnceReport",
    "assert_exactly_once",
    "assert_no_concurrent_execution",
    "await_until",
    "check_every_slot_runs_once",
    "grid_slots",
    "now_ms",
    "read_history",
    "read_ledger",
    "start_instances",
    "wait_for",
]


def read_history(url: str, job: str, limit: int = 10_000) -> list[Run]:
    """The store's history of ``job`` through a fresh reader (a scheduler with no jobs)."""

    async def read() -> list[Run]:
        reader = Scheduler(backend_from_url(url))
        try:
            return await reader.history(job, limit)
        finally:
            await reader.stop()

    return asyncio.run(read())


@dataclass
class OnceReport:
    slots: list[int]
    successes: Counter[int]
    ledger_ends: Counter[int]
    takeovers: int

    def __str__(self) -> str:
        return (f"{len(self.slots)} slots, {sum(self.successes.values())} successes, "
                f"{self.takeovers} takeovers")


def assert_exactly_once(entries: list[LedgerEntry], job: str, *,
                        history: list[Run] | None = None,
                        between: tuple[int, int] | None = None) -> OnceReport:
    """Assert no slot of ``job`` ended twice (ledger) or succeeded twice (history).

    With ``between`` (ms, inclusive), also assert every slot the ledger or history knows in
    that window, and every ``every`` grid slot there, has exactly one of each.
    """
    ends = Counter(e.slot for e in entries if e.job == job and e.event == "end"
                   and not e.manual)
    twice = {slot: n for slot, n in ends.items() if n > 1}
    assert not twice, f"{job}: slots ended twice in the ledger: {twice}"
    successes: Counter[int] = Counter()
    takeovers = 0
    if history is not None:
        scheduled = [r for r in history if not r.manual]
        successes = Counter(r.slot for r in scheduled if r.status == "success")
        takeovers = sum(1 for r in scheduled if r.attempt > 1)
        doubled = {slot: n for slot, n in successes.items() if n > 1}
        assert not doubled, f"{job}: slots with two successes in history: {doubled}"
        assert set(successes) == set(ends), (
            f"{job}: ledger and history disagree: only in history "
            f"{sorted(set(successes) - set(ends))}, only in ledger "
            f"{sorted(set(ends) - set(successes))}"
        )
    slots = sorted(ends)
    if between is not None:
        lo, hi = between
        window = [s for s in slots if lo <= s <= hi]
        assert window, f"{job}: no slot ran between {lo} and {hi}"
        slots = window
    return OnceReport(slots, successes, ends, takeovers)


def grid_slots(interval_ms: int, lo: int, hi: int) -> list[int]:
    """The ``every`` grid slots in [lo, hi]."""
    first = -(-lo // interval_ms) * interval_ms
    return list(range(first, hi + 1, interval_ms))


def now_ms() -> int:
    return round(time.time() * 1000)


def check_every_slot_runs_once(url: str, workdir: Path, *, seconds: float = 10,
                               instances: int = 4) -> dict[str, list[Run]]:
    """4 instances, two ``every("1s")`` jobs (async and sync) for ``seconds``: every grid
    slot in the window ran exactly once by the ledger and by history, and jitter spread
    the runs over several instances. Returns each job's history for further checks.
    """
    jobs = [InstanceJob("tick", every="1s", sleep_s=0.2),
            InstanceJob("tock", every="1s", sleep_s=0.3, sync=True)]
    with start_instances(url, jobs, instances, workdir) as cluster:
        cluster.wait_ready()
        begin = now_ms() + 1_500
        time.sleep(seconds)
        end = now_ms() - 1_500
        cluster.stop_all()
        entries = cluster.ledger()
    histories = {}
    for job in ("tick", "tock"):
        history = histories[job] = read_history(url, job)
        report = assert_exactly_once(entries, job, history=history, between=(begin, end))
        missing = sorted(set(grid_slots(1_000, begin, end)) - set(report.slots))
        assert not missing, f"{job}: slots that never ran: {missing}"
        runners = {e.instance for e in entries if e.job == job and e.event == "end"}
        assert len(runners) >= 2, f"{job}: jitter should spread runs, all ran on {runners}"
        in_window = {r.status for r in history if begin <= r.slot <= end}
        assert in_window == {"success"}, f"{job}: statuses in the window: {in_window}"
    return histories


def assert_no_concurrent_execution(entries: list[LedgerEntry], job: str, *,
                                   deaths: dict[int, int] | None = None,
                                   across_slots: bool = False) -> int:
    """Assert no two attempts' code of ``job`` ran at the same time (by ``mono_ns``).

    An attempt's code runs from its ``start`` line to its ``exit`` line; without an exit
    line, until its process died (``deaths``: pid → monotonic ns) or forever. Attempts of
    one slot must never overlap; with ``across_slots`` no two attempts of any slots either
    (an ``overlap=False`` job). Returns how many executions were compared.
    """
    spans: dict[str, list[int | None]] = {}
    meta: dict[str, LedgerEntry] = {}
    for e in entries:
        if e.job != job or e.mono_ns is None:
            continue
        span = spans.setdefault(e.token, [None, None])
        if e.event == "start":
            span[0] = e.mono_ns
            meta[e.token] = e
        elif e.event == "exit":
            span[1] = e.mono_ns
    runs = []
    for token, (begin, end) in spans.items():
        if begin is None:
            continue
        entry = meta[token]
        stop = end if end is not None else (deaths or {}).get(entry.pid, 2**63)
        runs.append((begin, stop, entry))
    runs.sort(key=lambda r: r[0])
    for i, (_, a1, a) in enumerate(runs):
        for b0, b1, b in runs[i + 1:]:
            if b0 >= a1:
                break
            if across_slots or a.slot == b.slot:
                raise AssertionError(
                    f"{job}: slot {a.slot} attempt {a.attempt} (pid {a.pid}) and slot {b.slot} "
                    f"attempt {b.attempt} (pid {b.pid}) ran at the same time "
                    f"({(min(a1, b1) - b0) / 1e6:.0f} ms)")
    return len(runs)
