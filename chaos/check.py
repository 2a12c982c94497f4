"""The checker: judges a chaos run from the ledgers, the store's history and the fault log.

``python -m chaos.check WORKDIR [WORKDIR ...]`` re-checks saved runs (each workdir holds
``run.json``, ``faults.jsonl``, ``history.json`` and the ``ledger/`` directory) and prints
one table per run and a summary with one row per backend.

What it counts, per job (slots are the job's scheduled times, ms since the epoch):

* **due**: grid slots inside the chaos window; **run**: slots whose handler started
  (ledger); **success**: slots with a ``success`` in history.
* **dup success**: slots with two ``success`` records in history, or whose handlers wrote
  two ``end`` lines (the side effect made twice). Must be 0.
* **fenced after takeover**: ledger lines an attempt wrote after a later attempt of the
  same slot had been claimed (ordered by the machine-wide monotonic clock). A ``start`` line
  there is a zombie that woke up and began work it then lost at its first lease check
  (shown); an ``end`` line is a side effect made after the takeover, which fencing must
  prevent (counted as a failure).
* **lost**: lease backends: an attempt whose handler started but that history does not
  know, or a slot whose last attempt is neither finished nor ``interrupted`` after the
  fleet settled. Claim-only backends: a run started but absent from history. Must be 0.
  On claim-only backends a run whose runner died stays ``running`` in history: counted as
  **abandoned** (no takeover exists there), not lost.
* **takeovers**: attempts > 1. For takeovers caused by SIGKILL or SIGSTOP of the previous
  runner, the delay after lease expiry is ``takeover claim time - (fault time + lease_ms -
  heartbeat_ms)``: the runner's last heartbeat was at most ``heartbeat_ms`` before the
  fault, so its lease ended in ``[fault + lease_ms - heartbeat_ms, fault + lease_ms]`` and
  this figure is the longest delay consistent with that (the true one is at most
  ``heartbeat_ms`` shorter). The fault is the first one since the attempt began that kept
  the runner away for a whole lease (a kill, or a pause or partition that long): a runner
  paused again after it woke up fenced has no lease left to lose. A takeover clearly
  before that window (negative beyond a tolerance) would mean a live lease was broken and
  fails the run.
  A hand-over (SIGTERM) is taken within two heartbeats plus the tolerance of the
  runner's handler returning, unless another fault (a backup killed, SIGSTOPped or
  partitioned, the store down) came between: a slower one fails the run.
* **claims/slot**: claim answers per due slot across the fleet, from each instance's
  ``<pid>.claims`` log (shown, not judged).
* **missed**: due slots with no record at all, with the reason: the store was down
  during their claim window, no instance was alive and unpaused, or unexplained.
* **overlap**: two executions of one slot (different tokens) whose handler code ran at
  the same time: from one's ``start`` line to its ``exit`` line (written when the code
  returned, however it ended) or the death of its process, by the monotonic clock. Excused
  only when the earlier runner was frozen by SIGSTOP meanwhile (a zombie cannot be told
  it lost its lease; shown apart). Must be 0.
* **runs at once**: the same across slots of one job. On a lease backend every overlap
  policy but ``allow`` promises that no two runs of a job run at once (``skip``,
  ``buffer_one``, ``cancel_other``): such an overlap fails the run, excused only for a
  zombie as above. ``allow`` jobs, claim-only backends and runs saved without the job's
  policy: shown.
* Overlap policies (lease backends): ``buffer_one``: a buffered slot runs at most once: a
  handler that began after a later attempt of its slot had been claimed fails the run
  (a waiting attempt starts only on the store's word), unless its runner was SIGSTOPped in
  between. ``cancel_other``: every run a later slot cancelled is recorded
  ``interrupted`` once the fleet settled. Runs the policy cancelled are counted by
  reason, not listed as never taken over.
* **faults**: the faults the run requested and how often each was applied. A requested
  fault never applied, or one that could not be set up, fails the run unless it was
  waived (``--allow-missing-fault``); faults that cannot apply to the backend are listed
  with the reason.
* With a Redis Cluster without replica acknowledgement, a duplicate success, a lost run or
  an overlap of a slot claimed around a failover is the measured cost of asynchronous
  replication: counted as **failover loss**, not failed.
* Clock checks: the shift each skewed instance's ledger shows (``time_ms`` against its
  monotonic stamp, which libfaketime leaves alone); handlers that began before their slot
  (**early**), and first attempts that began later than ``max_late_ms`` after it, both by
  real time (the monotonic stamp on the harness's clock). Shown, not failed: running early
  is not running twice, but it is reported with the runner's clock history.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from anarchon_core.cli.processes import LedgerEntry, read_ledger

from .faults import FAULTS, FaultEvent, FaultLog

__all__ = ["BackendReport", "JobReport", "check_run", "format_report", "format_summary",
           "main"]

EARLY_TOLERANCE_MS = 50
LATE_TOLERANCE_MS = 250
SKEW_TOLERANCE_MS = 1_500
#: How history notes the runs an overlap policy interrupted on purpose (never retried).
POLICY_INTERRUPTIONS = ("cancelled",)


@dataclass
class HistoryRun:
    """One history entry as saved in ``history.json``."""

    job: str
    slot: int
    attempt: int
    status: str
    runner: str
    started_ms: float | None
    finished_ms: float | None
    error: str | None
    manual: bool

    @property
    def pid(self) -> int | None:
        """The runner's PID when its instance id is the default ``host:pid``."""
        tail = self.runner.rsplit(":", 1)[-1]
        return int(tail) if tail.isdigit() else None


def _ms(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value).timestamp() * 1000


@dataclass
class JobReport:
    """The verdict on one job of one run."""

    name: str
    #: The job's overlap policy on a lease backend (None: claim-only, or not saved).
    policy: str | None = None
    due: int = 0
    #: Claim answers each due slot got across the fleet (its instances' claim logs).
    claims: list[int] = field(default_factory=list)
    run: int = 0
    successes: int = 0
    #: Slots with a success in history, in the window or not (a shifted clock runs some early).
    succeeded_slots: int = 0
    dup_success: list[str] = field(default_factory=list)
    fenced_starts: list[str] = field(default_factory=list)
    fenced_effects: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    abandoned: int = 0
    takeovers: int = 0
    takeover_delays_ms: list[float] = field(default_factory=list)
    handover_delays_ms: list[float] = field(default_factory=list)
    #: Hand-overs not taken over within two heartbeats (+ tolerance) of the runner's handler
    #: returning, with no other fault or store outage meanwhile (a release undone looks
    #: like this).
    slow_handovers: list[str] = field(default_factory=list)
    early_takeovers: list[str] = field(default_factory=list)
    takeover_causes: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    interrupted: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)
    unexplained_missed: list[int] = field(default_factory=list)
    not_taken_over: list[str] = field(default_factory=list)
    ended_unrecorded: list[str] = field(default_factory=list)
    early_starts: list[str] = field(default_factory=list)
    late_starts: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    zombie_overlaps: list[str] = field(default_factory=list)
    slot_overlaps: list[str] = field(default_factory=list)
    #: Two runs of a job at once under a policy that forbids it (not a zombie).
    policy_overlaps: list[str] = field(default_factory=list)
    #: ``buffer_one``: a slot's handler began after a later attempt had been claimed.
    buffered_twice: list[str] = field(default_factory=list)
    #: ``cancel_other``: a cancelled run not recorded ``interrupted``.
    cancelled_unrecorded: list[str] = field(default_factory=list)
    #: ``interrupted`` attempts in the window by reason (the error up to its colon).
    interrupted_by: Counter[str] = field(default_factory=Counter)
    failover_loss: list[str] = field(default_factory=list)
    #: Side effects made twice because the first runner was cut off from the store right
    #: after making it, for longer than its lease: its end could not be recorded (the
    #: documented limit of any lease; counted apart, not failed).
    cut_off_ends: list[str] = field(default_factory=list)


@dataclass
class BackendReport:
    """The verdict on one chaos run (one backend)."""

    backend: str
    seed: int
    leases: bool
    seconds: float
    jobs: list[JobReport]
    faults: Counter[str]
    notes: list[str]
    skew: list[str]
    skew_problems: list[str]
    command: str
    fault_lines: list[str] = field(default_factory=list)
    fault_problems: list[str] = field(default_factory=list)
    failovers: int = 0

    def total(self, name: str) -> int:
        """Sum of a count (int attribute or list length) over the jobs."""
        values = [getattr(j, name) for j in self.jobs]
        return sum(v if isinstance(v, int) else len(v) for v in values)

    @property
    def delays(self) -> list[float]:
        """Every measured takeover delay after lease expiry."""
        return [d for j in self.jobs for d in j.takeover_delays_ms]

    def failures(self) -> list[str]:
        """Why this run fails (empty when it passes)."""
        out = []
        for j in self.jobs:
            out += [f"{j.name}: duplicate success {d}" for d in j.dup_success]
            out += [f"{j.name}: lost run {d}" for d in j.lost]
            out += [f"{j.name}: fenced side effect after takeover {d}" for d in j.fenced_effects]
            out += [f"{j.name}: takeover before lease expiry {d}" for d in j.early_takeovers]
            out += [f"{j.name}: two attempts ran at once {d}" for d in j.overlaps]
            out += [f"{j.name}: two runs at once {d}" for d in j.policy_overlaps]
            out += [f"{j.name}: buffered slot ran twice {d}" for d in j.buffered_twice]
            out += [f"{j.name}: cancelled run not recorded interrupted {d}"
                    for d in j.cancelled_unrecorded]
            out += [f"{j.name}: slow hand-over {d}" for d in j.slow_handovers]
        out += self.skew_problems
        out += self.fault_problems
        return out


def _grid(interval_ms: int, offset_ms: int, lo: float, hi: float) -> list[int]:
    first = -(-(int(lo) - offset_ms) // interval_ms) * interval_ms + offset_ms
    return list(range(first, int(hi) + 1, interval_ms))


class _Clock:
    """Converts between the harness's wall clock and the machine's monotonic clock."""

    def __init__(self, wall_ms: float, mono_ns: int) -> None:
        self.wall_ms, self.mono_ns = wall_ms, mono_ns

    def wall(self, mono_ns: int) -> float:
        return self.wall_ms + (mono_ns - self.mono_ns) / 1e6

    def mono(self, wall_ms: float) -> int:
        return self.mono_ns + round((wall_ms - self.wall_ms) * 1e6)


def _intervals(events: list[FaultEvent], start: str, end: str,
               pid: bool = False) -> dict[int | None, list[tuple[float, float]]]:
    out: dict[int | None, list[tuple[float, float]]] = defaultdict(list)
    open_: dict[int | None, float] = {}
    for e in events:
        key = e.pid if pid else None
        if e.kind == start:
            open_[key] = e.wall_ms
        elif e.kind in (end, "settle") and key in open_:
            out[key].append((open_.pop(key), e.wall_ms))
    for key, began in open_.items():
        out[key].append((began, float("inf")))
    return out


def _merge_spans(*groups: dict[int | None, list[tuple[float, float]]]
                 ) -> dict[int | None, list[tuple[float, float]]]:
    out: dict[int | None, list[tuple[float, float]]] = defaultdict(list)
    for group in groups:
        for key, spans in group.items():
            out[key] += spans
    return out


def read_claims(directory: Path) -> Counter[tuple[str, int]]:
    """Claim answers per (job, slot), from the instances' ``<pid>.claims`` files.

    A line cut short by a killed instance is skipped.
    """
    out: Counter[tuple[str, int]] = Counter()
    for path in sorted(directory.glob("*.claims")):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                out[(str(row["job"]), int(row["slot"]))] += 1
            except (ValueError, KeyError, TypeError):
                continue
    return out


def _overlaps(spans: list[tuple[float, float]], lo: float, hi: float) -> bool:
    return any(a <= hi and b >= lo for a, b in spans)


def check_run(workdir: Path) -> BackendReport:
    """Judge the saved run in ``workdir``."""
    meta = json.loads((workdir / "run.json").read_text())
    events = FaultLog.load(workdir / "faults.jsonl")
    ledger = read_ledger(workdir / "ledger")
    raw_history: dict[str, list[dict[str, Any]]] = json.loads(
        (workdir / "history.json").read_text())
    clock = _Clock(meta["clock0"]["wall_ms"], meta["clock0"]["mono_ns"])
    leases: bool = meta["leases"]
    lease_ms: int = meta.get("lease_ms") or 0
    heartbeat_ms: int = meta.get("heartbeat_ms") or 0
    begin, end = meta["window"]
    # A shard failing over is its store down (for missed slots and takeover judging):
    # heartbeats not yet replicated are gone, so a lease may end before fault + lease.
    store_down = (_intervals(events, "store_down", "store_up").get(None, [])
                  + _intervals(events, "failover", "promoted").get(None, []))
    paused = _intervals(events, "pause", "resume", pid=True)
    partitions = _intervals(events, "partition", "heal", pid=True)
    lifetimes = _lifetimes(events)
    deaths = _deaths(events)
    failovers = [e for e in events if e.kind == "failover"]
    tolerate = bool(meta.get("tolerate_failover_loss"))

    claims = read_claims(workdir / "ledger")
    jobs = []
    for spec in meta["jobs"]:
        name = spec["name"]
        history = [HistoryRun(
            job=r["job"], slot=r["slot"], attempt=r["attempt"], status=r["status"],
            runner=r["runner"], started_ms=_ms(r["started_at"]),
            finished_ms=_ms(r["finished_at"]), error=r["error"], manual=r["manual"],
        ) for r in raw_history.get(name, []) if not r["manual"]]
        entries = [e for e in ledger if e.job == name and not e.manual]
        jobs.append(_check_job(
            spec, history, entries, leases=leases, lease_ms=lease_ms,
            heartbeat_ms=heartbeat_ms, window=(begin, end), clock=clock, events=events,
            store_down=store_down, partitions=partitions, paused=paused,
            lifetimes=lifetimes,
            history_complete=meta.get("history_complete", True),
        ))
        if claims:
            jobs[-1].claims = [claims[(name, slot)] for slot in _grid(
                spec["interval_ms"], spec.get("offset_ms", 0), begin, end)]
        if meta.get("exit_lines"):
            _check_overlaps(jobs[-1], entries, deaths=deaths, paused=paused, clock=clock,
                            policy=spec.get("overlap") if leases else None)
        if tolerate:
            _move_failover_loss(jobs[-1], history, entries, failovers, lease_ms)
    skew, skew_problems = _check_skew(events, ledger, clock, meta.get("skew", False))
    faults = _fault_counts(events)
    fault_lines, fault_problems = _check_faults(meta, faults)
    return BackendReport(
        backend=meta["backend"], seed=meta["seed"], leases=leases, seconds=meta["seconds"],
        jobs=jobs, faults=faults, notes=meta.get("notes", []), skew=skew,
        skew_problems=skew_problems, command=meta.get("command", ""),
        fault_lines=fault_lines, fault_problems=fault_problems, failovers=len(failovers),
    )


def _fault_counts(events: list[FaultEvent]) -> Counter[str]:
    """How often each fault of :data:`FAULTS` was applied."""
    kinds = {kind: name for name, evs in FAULTS.items() for kind in evs}
    out: Counter[str] = Counter()
    for e in events:
        name = kinds.get(e.kind)
        if name == "skew" and e.detail.get("skew_ms") is None:
            continue
        if name is not None:
            out[name] += 1
    return out


def _check_faults(meta: dict[str, Any], counts: Counter[str]) -> tuple[list[str], list[str]]:
    """The verdict's fault lines, and the problems (requested faults not applied)."""
    plan = meta.get("fault_plan")
    if plan is None:  # a run saved before fault plans existed
        return ["faults applied: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                + " (no fault plan saved: requested faults not checked)"], []
    allowed = set(plan.get("allow_missing", []))
    lines = ["faults requested: " + (", ".join(plan["requested"]) or "none"),
             "faults applied: " + (", ".join(f"{f} {counts[f]}" for f in plan["requested"]
                                             if counts[f]) or "none")]
    problems = [f"fault problem: {p}" for p in meta.get("fault_problems", [])]
    for fault in plan["requested"]:
        if counts[fault]:
            continue
        why = plan["unavailable"].get(fault, "never applied during the run (too short?)")
        if fault in allowed:
            lines.append(f"fault waived (--allow-missing-fault {fault}): {fault} not applied: "
                         f"{why}")
        else:
            problems.append(f"requested fault {fault!r} not applied: {why} (waive it "
                            f"explicitly with --allow-missing-fault {fault})")
    for fault, why in plan.get("opted_out", {}).items():
        lines.append(f"fault opted out: {fault} ({why})")
    for fault, why in plan.get("not_applicable", {}).items():
        lines.append(f"fault not applicable: {fault}: {why}")
    if meta.get("store"):
        starts = meta.get('server_starts', 0)
        lines.append(f"store: {meta['store']}" + (f"; started {starts} times" if starts else ""))
    return lines, problems


def _deaths(events: list[FaultEvent]) -> dict[int, int]:
    """Each PID's end (monotonic ns): its SIGKILL, or when the harness saw it exit."""
    out: dict[int, int] = {}
    for e in events:
        if e.pid is not None and e.kind in ("kill", "exited") and e.pid not in out:
            out[e.pid] = e.mono_ns
    return out


def _check_overlaps(report: JobReport, entries: list[LedgerEntry], *, deaths: dict[int, int],
                    paused: dict[int | None, list[tuple[float, float]]],
                    clock: _Clock, policy: str | None = None) -> None:
    """Executions of this job whose code ran at the same time (same slot, or any slot).

    ``policy`` is the job's overlap policy on a lease backend (None: not judged across
    slots): under any but ``allow``, two slots at once fail the run unless a zombie.
    """
    runs: dict[str, dict[str, Any]] = {}
    for e in entries:
        if not e.mono_ns:
            continue
        run = runs.setdefault(e.token, {"slot": e.slot, "attempt": e.attempt, "pid": e.pid,
                                        "start": None, "exit": None})
        if e.event == "start":
            run["start"] = e.mono_ns if run["start"] is None else min(run["start"], e.mono_ns)
        elif e.event == "exit":
            run["exit"] = e.mono_ns
    spans = []
    for token, r in runs.items():
        if r["start"] is None:
            continue
        stop = r["exit"] if r["exit"] is not None else deaths.get(r["pid"], 2**63)
        spans.append((r["start"], stop, token, r))
    spans.sort()
    for i, (a0, a1, _, a) in enumerate(spans):
        for b0, _b1, _, b in spans[i + 1:]:
            if b0 >= a1:
                continue
            ran_on = "until its process ended" if a["exit"] is None else "after"
            line = (f"slot {a['slot']} attempt {a['attempt']} (pid {a['pid']}) still ran "
                    f"{(a1 - b0) / 1e6:.0f} ms {ran_on} slot {b['slot']} attempt "
                    f"{b['attempt']} (pid {b['pid']}) began")
            zombie = _overlaps(paused.get(a["pid"], []), clock.wall(a0), clock.wall(b0))
            if a["slot"] != b["slot"]:
                if policy in (None, "allow"):
                    report.slot_overlaps.append(line)
                elif zombie:
                    report.zombie_overlaps.append(line + " (its process was SIGSTOPped)")
                else:
                    report.policy_overlaps.append(f"{line} (overlap {policy})")
            elif zombie:
                report.zombie_overlaps.append(line + " (its process was SIGSTOPped)")
            else:
                report.overlaps.append(line)


def _move_failover_loss(report: JobReport, history: list[HistoryRun],
                        entries: list[LedgerEntry], failovers: list[FaultEvent],
                        lease_ms: int) -> None:
    """Duplicates, losses and overlaps of slots claimed around a failover: measured apart."""
    if not failovers:
        return
    near = max(10_000, 4 * lease_ms)

    def around(slot: int) -> bool:
        return any(abs(f.wall_ms - slot) <= near for f in failovers)

    for name in ("dup_success", "lost", "overlaps", "policy_overlaps"):
        kept = []
        for line in getattr(report, name):
            slot = int(line.split("slot ", 1)[1].split()[0].rstrip(":"))
            if around(slot):
                report.failover_loss.append(f"{name.replace('_', ' ')}: {line}")
            else:
                kept.append(line)
        setattr(report, name, kept)


def _lifetimes(events: list[FaultEvent]) -> dict[int, tuple[float, float]]:
    """Each PID's life: (spawned, gone), wall ms."""
    out: dict[int, tuple[float, float]] = {}
    for e in events:
        if e.pid is None:
            continue
        if e.kind == "spawn":
            out[e.pid] = (e.wall_ms, float("inf"))
        elif e.kind in ("kill", "exited") and e.pid in out:
            began, gone = out[e.pid]
            out[e.pid] = (began, min(gone, e.wall_ms))
    return out


def _check_job(spec: dict[str, Any], history: list[HistoryRun], entries: list[LedgerEntry], *,
               leases: bool, lease_ms: int, heartbeat_ms: int, window: tuple[float, float],
               clock: _Clock, events: list[FaultEvent],
               store_down: list[tuple[float, float]],
               partitions: dict[int | None, list[tuple[float, float]]],
               paused: dict[int | None, list[tuple[float, float]]],
               lifetimes: dict[int, tuple[float, float]], history_complete: bool) -> JobReport:
    name = spec["name"]
    interval, max_late, jitter = spec["interval_ms"], spec["max_late_ms"], spec["jitter_ms"]
    policy: str | None = spec.get("overlap") if leases else None
    report = JobReport(name, policy)
    by_slot: dict[int, list[HistoryRun]] = defaultdict(list)
    for r in history:
        by_slot[r.slot].append(r)
    starts: dict[int, list[LedgerEntry]] = defaultdict(list)
    ends: dict[int, list[LedgerEntry]] = defaultdict(list)
    #: When each attempt's handler returned, in the harness's wall time.
    exits: dict[tuple[int, int], float] = {}
    for e in entries:
        if e.event in ("start", "end"):
            (starts if e.event == "start" else ends)[e.slot].append(e)
        elif e.event == "exit" and not e.manual:
            exits[(e.slot, e.attempt)] = (clock.wall(e.mono_ns) if e.mono_ns is not None
                                          else e.time_ms)

    due = _grid(interval, spec.get("offset_ms", 0), *window)
    report.due = len(due)
    report.run = len([s for s in due if starts.get(s)])
    report.successes = len([s for s in due if any(r.status == "success" for r in by_slot[s])])
    report.succeeded_slots = len([s for s, runs in by_slot.items()
                                  if any(r.status == "success" for r in runs)])

    for slot in sorted(set(by_slot) | set(starts) | set(ends)):
        runs = sorted(by_slot.get(slot, []), key=lambda r: r.attempt)
        succ = [r for r in runs if r.status == "success"]
        if len(succ) > 1:
            report.dup_success.append(
                f"slot {slot}: {len(succ)} successes in history "
                f"(attempts {[r.attempt for r in succ]}, runners {[r.runner for r in succ]})")
        slot_ends = ends.get(slot, [])
        if len({e.token for e in slot_ends}) > 1:
            line = (f"slot {slot}: side effect made {len(slot_ends)} times (ledger end lines of "
                    f"attempts {[e.attempt for e in slot_ends]} by pids "
                    f"{[e.pid for e in slot_ends]})")
            if _end_cut_off(slot_ends, starts.get(slot, []), partitions, clock):
                report.cut_off_ends.append(line)
            else:
                report.dup_success.append(line)
        if not leases and len({e.token for e in starts.get(slot, [])}) > 1:
            report.dup_success.append(
                f"slot {slot}: claim-only run started {len(starts[slot])} times "
                f"(pids {[e.pid for e in starts[slot]]})")
        for r in runs if window[0] <= slot <= window[1] else []:
            if r.status in ("failed", "skipped", "missed"):
                kind = (r.error or "?").split(":")[0]
                (report.failed if r.status == "failed" else report.skipped)[kind] += 1
            elif r.status == "interrupted":
                report.interrupted += 1
                report.interrupted_by[(r.error or "?").split(":")[0]] += 1
        _check_attempts(report, slot, runs, starts.get(slot, []), slot_ends, leases=leases,
                        clock=clock, history_complete=history_complete)
        if policy == "buffer_one":
            _check_buffered_once(report, slot, runs, starts.get(slot, []), paused=paused,
                                 clock=clock)
        if policy == "cancel_other" and window[0] <= slot <= window[1]:
            report.cancelled_unrecorded += [
                f"slot {slot} attempt {r.attempt} on {r.runner}: '{r.status}' ({r.error})"
                for r in runs if (r.error or "").startswith("cancelled")
                and r.status != "interrupted"]
        if leases and runs and window[0] <= slot <= window[1] and \
                runs[-1].status == "interrupted" and \
                runs[-1].attempt < spec.get("max_attempts", 3) and \
                not (runs[-1].error or "").startswith(POLICY_INTERRUPTIONS):
            report.not_taken_over.append(
                f"slot {slot}: attempt {runs[-1].attempt} on {runs[-1].runner} ended "
                f"'interrupted' ({runs[-1].error}) and no backup took over")
        if leases:
            _check_takeovers(report, slot, runs, starts.get(slot, []), lease_ms=lease_ms,
                             heartbeat_ms=heartbeat_ms, events=events, store_down=store_down,
                             exits=exits, held=_merge_spans(paused, partitions),
                             waits=policy in ("buffer_one", "cancel_other"))
        elif any(r.attempt > 1 for r in runs):
            report.dup_success.append(f"slot {slot}: attempt > 1 on a claim-only backend")
        _check_timing(report, slot, starts.get(slot, []), leases=leases,
                      max_late=None if policy == "buffer_one" else max_late, clock=clock,
                      events=events)

    for slot in due:
        if by_slot.get(slot) or starts.get(slot):
            continue
        lo, hi = slot, slot + max_late + jitter
        if _overlaps(store_down, lo - 1_000, hi):
            report.missed["store down"] += 1
        elif not any(a <= hi and b >= lo and not _overlaps(paused.get(pid, []), lo, hi)
                     for pid, (a, b) in lifetimes.items()):
            report.missed["no healthy instance"] += 1
        else:
            report.missed["unexplained"] += 1
            report.unexplained_missed.append(slot)
    return report


#: How close to the start of its partition a runner's side effect counts as cut off: its
#: lease check was answered just before the partition, its end record was not.
CUT_OFF_MS = 250


def _end_cut_off(ends: list[LedgerEntry], starts: list[LedgerEntry],
                 partitions: dict[int | None, list[tuple[float, float]]],
                 clock: _Clock) -> bool:
    """Whether the first side effect's runner lost the store right after making it.

    Lost until another attempt had started: its end could not be recorded, whatever the
    scheduler did.
    """
    timed = [(e.mono_ns, e) for e in ends if e.mono_ns]
    if not timed:
        return False
    mono, first = min(timed, key=lambda t: t[0])
    others = [e.mono_ns for e in starts if e.token != first.token and e.mono_ns]
    if not others:
        return False
    wrote, retaken = clock.wall(mono), clock.wall(min(others))
    return any(began - CUT_OFF_MS <= wrote <= began + CUT_OFF_MS and healed >= retaken
               for began, healed in partitions.get(first.pid, []))


def _check_timing(report: JobReport, slot: int, starts: list[LedgerEntry], *, leases: bool,
                  max_late: int | None, clock: _Clock, events: list[FaultEvent]) -> None:
    """Handlers that began before their slot, or a first attempt past ``max_late_ms``.

    Judged by real time (the ledger's monotonic stamp on the harness's clock), whatever
    the runner's own wall clock said. ``max_late`` None: lateness not judged (a
    ``buffer_one`` slot waits for the run before it by design).
    """
    timed = sorted((clock.wall(e.mono_ns), e) for e in starts if e.mono_ns)
    if not timed:
        return
    began, first = timed[0]
    shift = _shift_of(events, first.pid, began)
    if began < slot - EARLY_TOLERANCE_MS:
        report.early_starts.append(
            f"slot {slot}: handler began {slot - began:.0f} ms before its time on pid "
            f"{first.pid} ({shift})")
    elif max_late is not None and first.attempt == 1 and \
            began > slot + max_late + LATE_TOLERANCE_MS:
        report.late_starts.append(
            f"slot {slot}: first attempt began {began - slot:.0f} ms after its time "
            f"(max_late_ms={max_late}) on pid {first.pid} ({shift})")


def _shift_of(events: list[FaultEvent], pid: int, at: float) -> str:
    """How the clock of ``pid`` was shifted at ``at`` (for the reader of a timing problem)."""
    spawn = next((e for e in events if e.kind == "spawn" and e.pid == pid), None)
    steps = [e for e in events if e.kind == "skew_step" and e.pid == pid and e.wall_ms <= at]
    if steps:
        return (f"its clock was stepped to {steps[-1].detail.get('skew_ms')} ms "
                f"{(at - steps[-1].wall_ms) / 1000:.0f} s before; started at "
                f"{spawn.detail.get('skew_ms') if spawn else '?'} ms")
    skew = spawn.detail.get("skew_ms") if spawn else None
    return f"clock shifted {skew} ms since start" if skew else "clock not shifted"


def _check_attempts(report: JobReport, slot: int, runs: list[HistoryRun],
                    starts: list[LedgerEntry], ends: list[LedgerEntry], *, leases: bool,
                    clock: _Clock, history_complete: bool) -> None:
    known = {r.attempt: r for r in runs}
    for s in starts:
        r = known.get(s.attempt)
        if r is None and history_complete:
            report.lost.append(f"slot {slot} attempt {s.attempt}: handler started on pid "
                               f"{s.pid} but history has no record of it")
        elif r is not None and r.status == "running" and leases:
            report.lost.append(f"slot {slot} attempt {s.attempt}: still 'running' in "
                               "history after the fleet settled")
    if not leases and any(r.status == "running" for r in runs):
        # The runner died before recording the end (with or without doing the work).
        report.abandoned += 1
    for e in ends:
        r = known.get(e.attempt)
        if r is None or r.status != "success":
            report.ended_unrecorded.append(
                f"slot {slot} attempt {e.attempt}: handler on pid {e.pid} wrote its end but "
                f"history says {r.status if r else 'nothing'} ({r.error if r else ''})")
    for r in runs:
        if r.status == "success" and not any(e.attempt == r.attempt for e in ends):
            report.lost.append(f"slot {slot} attempt {r.attempt}: 'success' in history but "
                               "its handler never wrote its end (work not done)")
    if leases and runs and runs[-1].status == "running" and not starts:
        report.lost.append(f"slot {slot} attempt {runs[-1].attempt}: 'running' in history "
                           "after the fleet settled, and no handler ever started")
    # Work by an attempt after a later attempt of the slot was claimed.
    for later, taken_at in _taken_over_at(runs, starts, clock):
        for e in [*starts, *ends]:
            if e.attempt < later.attempt and e.mono_ns and e.mono_ns > taken_at:
                line = (f"slot {slot}: attempt {e.attempt} (pid {e.pid}) wrote '{e.event}' "
                        f"{(e.mono_ns - taken_at) / 1e6:.0f} ms after attempt "
                        f"{later.attempt} took over")
                (report.fenced_effects if e.event == "end" else report.fenced_starts).append(
                    line)


def _taken_over_at(runs: list[HistoryRun], starts: list[LedgerEntry],
                   clock: _Clock) -> list[tuple[HistoryRun, int]]:
    """Each later attempt of a slot, with the first instant (monotonic ns) it was claimed.

    That is its handler's start or its recorded start, whichever is known first.
    """
    out = []
    for later in runs:
        if later.attempt < 2:
            continue
        marks = [e.mono_ns for e in starts if e.attempt == later.attempt and e.mono_ns]
        if later.started_ms is not None:
            marks.append(clock.mono(later.started_ms))
        if marks:
            out.append((later, min(marks)))
    return out


def _check_buffered_once(report: JobReport, slot: int, runs: list[HistoryRun],
                         starts: list[LedgerEntry], *,
                         paused: dict[int | None, list[tuple[float, float]]],
                         clock: _Clock) -> None:
    """``buffer_one``: a handler that began after a later attempt of its slot was claimed.

    A waiting attempt starts only when the store answers its own token ``won``, so such a
    start is the slot run twice, unless its runner was SIGSTOPped between its attempt's
    claim and that start (a zombie that woke up; it stops at its first lease check).
    """
    known = {r.attempt: r for r in runs}
    for later, taken_at in _taken_over_at(runs, starts, clock):
        for e in starts:
            if e.attempt >= later.attempt or not e.mono_ns or e.mono_ns <= taken_at:
                continue
            began = clock.wall(e.mono_ns)
            claimed = known[e.attempt].started_ms if e.attempt in known else None
            if _overlaps(paused.get(e.pid, []), claimed or began - 60_000, began):
                continue
            report.buffered_twice.append(
                f"slot {slot}: attempt {e.attempt} (pid {e.pid}) began "
                f"{(e.mono_ns - taken_at) / 1e6:.0f} ms after attempt {later.attempt} was "
                "claimed, its runner never SIGSTOPped")


def _check_takeovers(report: JobReport, slot: int, runs: list[HistoryRun],
                     starts: list[LedgerEntry], *, lease_ms: int, heartbeat_ms: int,
                     events: list[FaultEvent], store_down: list[tuple[float, float]],
                     exits: dict[tuple[int, int], float] | None = None,
                     held: dict[int | None, list[tuple[float, float]]] | None = None,
                     waits: bool = False) -> None:
    """Judge each takeover's delay against the fault that ended the lease before it.

    ``waits``: the job's attempts may wait (``buffer_one``, ``cancel_other``) and
    heartbeat meanwhile, so one whose handler never started is judged by its runner's
    faults, not by its claim plus one lease.
    """
    known = {r.attempt: r for r in runs}
    for r in runs:
        if r.attempt < 2:
            continue
        report.takeovers += 1
        prev = known.get(r.attempt - 1)
        taken = r.started_ms
        if prev is None or taken is None:
            report.takeover_causes["unknown"] += 1
            continue
        pid = prev.pid
        faults = [e for e in events if e.pid == pid and e.pid is not None
                  and e.kind in ("kill", "pause", "stop", "partition") and e.wall_ms <= taken]
        if "handed over" in (prev.error or "") or (faults and faults[-1].kind == "stop"):
            report.takeover_causes["hand-over (SIGTERM)"] += 1
            if faults and faults[-1].kind == "stop":
                report.handover_delays_ms.append(taken - faults[-1].wall_ms)
            returned = (exits or {}).get((slot, prev.attempt))
            if "handed over" in (prev.error or "") and returned is not None:
                _check_handover(report, slot, r.attempt, returned, taken, runner=pid,
                                lease_ms=lease_ms, heartbeat_ms=heartbeat_ms, events=events,
                                store_down=store_down, held=held or {})
            continue
        if prev.started_ms is not None and prev.started_ms < slot - EARLY_TOLERANCE_MS:
            # Claimed before its time: no backup watches a slot before it is due, so the
            # takeover waits for the slot's time and its delay says nothing about leases.
            report.takeover_causes["after an early claim (no backups before the slot)"] += 1
            continue
        if not waits and prev.started_ms is not None \
                and not any(e.attempt == prev.attempt for e in starts) \
                and not _overlaps(store_down, prev.started_ms, taken):
            # Its handler never started: the claim's answer came after the lease could be
            # confirmed (the runner fenced itself at once), or the runner was killed or
            # stopped before its handler's first line. Either way it never heartbeated, so
            # the lease ended at the claim plus one lease, by the store's clock, whatever
            # happened to the runner afterwards.
            report.takeover_causes["won too late to run (never started)"] += 1
            delay = taken - (prev.started_ms + lease_ms)
            report.takeover_delays_ms.append(delay)
            if delay < -LATE_TOLERANCE_MS:
                report.early_takeovers.append(
                    f"slot {slot} attempt {r.attempt}: claimed {-delay:.0f} ms before the "
                    f"lease of attempt {prev.attempt} (pid {pid}, never started, so never "
                    "heartbeated) could expire")
            continue
        fault = _lease_ending_fault(faults, events, prev.started_ms, lease_ms)
        fault_window_store_down = fault is not None and _overlaps(
            store_down, fault.wall_ms - lease_ms, fault.wall_ms)
        if fault is not None and (prev.started_ms is None
                                  or fault.wall_ms >= prev.started_ms - 1) \
                and not fault_window_store_down:
            report.takeover_causes[f"{fault.kind}"] += 1
            # The lease ended between fault + lease - heartbeat and fault + lease: the
            # figure is the longest delay consistent with that (never an understatement).
            delay = taken - (fault.wall_ms + lease_ms - heartbeat_ms)
            report.takeover_delays_ms.append(delay)
            if delay < -LATE_TOLERANCE_MS:
                report.early_takeovers.append(
                    f"slot {slot} attempt {r.attempt}: claimed {-delay:.0f} ms before the "
                    f"lease of pid {pid} (last heartbeat ≤ {fault.kind} time) could expire")
            continue
        # With the store down in the lease before the fault, the runner's heartbeats did not
        # reach it: its lease could end before fault + lease, so no delay is judged.
        lo = prev.started_ms if prev.started_ms is not None else taken - 60_000
        if fault_window_store_down or _overlaps(store_down, lo, taken):
            report.takeover_causes["store restart or failover"] += 1
        else:
            report.takeover_causes["other (heartbeats late: CPU or store latency)"] += 1


#: Fault-log events that can delay a takeover for reasons of their own.
_DISRUPTIONS = frozenset({"kill", "pause", "stop", "store_down", "skew_step", "partition",
                          "failover"})


def _check_handover(report: JobReport, slot: int, attempt: int, returned: float, taken: float,
                    *, runner: int | None, lease_ms: int, heartbeat_ms: int,
                    events: list[FaultEvent], store_down: list[tuple[float, float]],
                    held: dict[int | None, list[tuple[float, float]]]) -> None:
    """Judge a hand-over: a backup's next check takes a released run.

    Backups check every one to two heartbeats, so a released run is taken within two
    heartbeats plus the timing tolerance; a release undone by a late heartbeat holds the
    run for at least ``lease_ms - heartbeat_ms``. Not judged when another fault came
    between: a backup killed, SIGSTOPped or partitioned (``held``: pause and partition
    spans per pid, which may have begun before the hand-over), or the store down.
    """
    if taken - returned <= 2 * heartbeat_ms + LATE_TOLERANCE_MS:
        return
    # A fault up to a lease before the hand-over may still hold a backup back (a pause).
    since = returned - lease_ms
    if _overlaps(store_down, since, taken) or any(
            since <= e.wall_ms <= taken and not (e.pid == runner and e.kind == "stop")
            for e in events if e.kind in _DISRUPTIONS) or any(
            _overlaps(spans, returned, taken) for pid, spans in held.items() if pid != runner):
        return
    report.slow_handovers.append(
        f"slot {slot}: attempt {attempt} started {taken - returned:.0f} ms after attempt "
        f"{attempt - 1}'s handler returned and handed over (lease {lease_ms} ms: the release "
        "was undone or no backup watched)")


def _lease_ending_fault(faults: list[FaultEvent], events: list[FaultEvent],
                        started_ms: float | None, lease_ms: int) -> FaultEvent | None:
    """The fault of the runner's that ended its attempt's lease (None: no fault).

    The first fault since the attempt began that kept the runner from the store for a
    whole lease (a kill, or a pause or partition at least ``lease_ms`` long): the lease
    ended within a lease of it, and later faults of the same runner (paused again after
    it woke up fenced) say nothing about it. Failing that, the runner's last fault.
    """
    if not faults:
        return None
    ends = {"pause": "resume", "partition": "heal"}
    for fault in faults:
        if started_ms is not None and fault.wall_ms < started_ms - 1:
            continue
        if fault.kind == "kill":
            return fault
        end_kind = ends.get(fault.kind)
        if end_kind is None:
            continue
        end = next((e.wall_ms for e in events if e.pid == fault.pid and e.kind == end_kind
                    and e.wall_ms >= fault.wall_ms), None)
        if end is None or end - fault.wall_ms >= lease_ms:
            return fault
    return faults[-1]


def _check_skew(events: list[FaultEvent], ledger: list[LedgerEntry], clock: _Clock,
                enabled: bool) -> tuple[list[str], list[str]]:
    """Compare each skewed instance's requested shift with what its ledger lines show."""
    if not enabled:
        return [], []
    wanted: dict[int, list[tuple[float, int]]] = defaultdict(list)  # pid → [(since, skew)]
    for e in events:
        if e.pid is not None and e.kind in ("spawn", "skew_step"):
            wanted[e.pid].append((e.wall_ms, e.detail.get("skew_ms") or 0))
    lines: list[str] = []
    problems: list[str] = []
    observed_all: list[float] = []
    checked = 0
    for pid, plan in sorted(wanted.items()):
        mine = [e for e in ledger if e.pid == pid and e.mono_ns]
        if not mine or not any(s for _, s in plan):
            continue
        for line in mine:
            at = clock.wall(line.mono_ns or 0)
            # The shift in force then (a step takes up to a second to be read).
            current = [s for since, s in plan if since <= at - 1_500]
            if not current:
                continue
            observed = line.time_ms - at
            observed_all.append(observed)
            checked += 1
            if abs(observed - current[-1]) > SKEW_TOLERANCE_MS and \
                    not any(abs(observed - s) <= SKEW_TOLERANCE_MS for _, s in plan):
                problems.append(f"pid {pid}: ledger shows clock shift {observed:.0f} ms, "
                                f"expected {current[-1]} ms")
    skewed = [pid for pid, plan in wanted.items() if any(s for _, s in plan)]
    lines.append(f"{len(skewed)} instances ran with a shifted clock; {checked} ledger lines "
                 "checked against the requested shift")
    if observed_all:
        lines.append(f"shift seen inside the instances: {min(observed_all):+.0f} … "
                     f"{max(observed_all):+.0f} ms")
    return lines, problems[:20]


# ---------------------------------------------------------------------- printing

def _fmt_delays(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f}/{max(values):.0f}"


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) if i else c.ljust(w)
                     for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [_row(header, widths), _row(["-" * w for w in widths], widths)]
    lines += [_row(r, widths) for r in rows]
    return "\n".join(lines)


HEADER = ["job", "policy", "due", "run", "success", "dup success", "overlap", "runs at once",
          "fenced after takeover",
          "lost", "abandoned", "takeovers", "delay ms med/max", "failed", "interrupted",
          "skipped", "missed", "early", "failover loss", "claims/slot mean/max"]


def _job_row(j: JobReport) -> list[str]:
    return [
        j.name, j.policy or "-", str(j.due), str(j.run), str(j.successes),
        str(len(j.dup_success)), f"{len(j.overlaps)} (+{len(j.zombie_overlaps)} zombie)",
        f"{len(j.policy_overlaps)}" + (f" (+{len(j.slot_overlaps)} allowed)"
                                       if j.slot_overlaps else ""),
        f"{len(j.fenced_effects)} end / {len(j.fenced_starts)} start",
        str(len(j.lost)), str(j.abandoned), str(j.takeovers),
        _fmt_delays(j.takeover_delays_ms), str(sum(j.failed.values())),
        str(j.interrupted), str(sum(j.skipped.values())), str(sum(j.missed.values())),
        str(len(j.early_starts)), str(len(j.failover_loss)), _fmt_claims(j.claims),
    ]


def _fmt_claims(claims: list[int]) -> str:
    return f"{sum(claims) / len(claims):.2f}/{max(claims)}" if claims else "-"


def format_report(report: BackendReport) -> str:
    """The full result table of one run, with the details behind every non-zero count."""
    kind = "lease" if report.leases else "claim-only"
    out = [f"== {report.backend} ({kind}), seed {report.seed}, {report.seconds:.0f} s of "
           f"faults: " + ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items()))]
    rows = [_job_row(j) for j in report.jobs]
    total = JobReport("TOTAL")
    for j in report.jobs:
        for attr in ("due", "run", "successes", "abandoned", "takeovers", "interrupted"):
            setattr(total, attr, getattr(total, attr) + getattr(j, attr))
        total.claims.extend(j.claims)
        for attr in ("dup_success", "fenced_effects", "fenced_starts", "lost",
                     "takeover_delays_ms", "early_starts", "overlaps", "zombie_overlaps",
                     "policy_overlaps", "slot_overlaps", "failover_loss"):
            getattr(total, attr).extend(getattr(j, attr))
        total.failed.update(j.failed)
        total.skipped.update(j.skipped)
        total.missed.update(j.missed)
    rows.append(_job_row(total))
    out.append(_table(HEADER, rows))
    causes: Counter[str] = Counter()
    for j in report.jobs:
        causes.update(j.takeover_causes)
    if causes:
        out.append("takeovers by cause: " + ", ".join(f"{k} {v}" for k, v in causes.items()))
    handovers = [d for j in report.jobs for d in j.handover_delays_ms]
    if handovers:
        out.append(f"hand-over delay after SIGTERM ms (median/max): {_fmt_delays(handovers)}")
    details: list[tuple[str, list[str]]] = []
    for j in report.jobs:
        details += [
            (f"{j.name} DUPLICATE SUCCESS", j.dup_success),
            (f"{j.name} LOST", j.lost),
            (f"{j.name} FENCED SIDE EFFECT AFTER TAKEOVER", j.fenced_effects),
            (f"{j.name} TAKEOVER BEFORE LEASE EXPIRY", j.early_takeovers),
            (f"{j.name} TWO ATTEMPTS RAN AT ONCE", j.overlaps),
            (f"{j.name} a SIGSTOPped runner ran on after a takeover (zombie)",
             j.zombie_overlaps),
            (f"{j.name} slots of the job ran at the same time", j.slot_overlaps),
            (f"{j.name} TWO RUNS AT ONCE (its overlap policy forbids it)", j.policy_overlaps),
            (f"{j.name} BUFFERED SLOT RAN TWICE", j.buffered_twice),
            (f"{j.name} CANCELLED RUN NOT RECORDED INTERRUPTED", j.cancelled_unrecorded),
            (f"{j.name} failover loss (asynchronous replication, measured)",
             j.failover_loss),
            (f"{j.name} side effect made again: its runner was cut off from the store right "
             "after it, for longer than the lease (end not recordable; documented)",
             j.cut_off_ends),
            (f"{j.name} fenced start after takeover (zombie woke up; stopped at its "
             "first lease check)", j.fenced_starts),
            (f"{j.name} began before its slot (real time)", j.early_starts),
            (f"{j.name} started later than max_late_ms", j.late_starts),
            (f"{j.name} missed slots, unexplained", [str(s) for s in j.unexplained_missed]),
            (f"{j.name} interrupted with attempts left, never taken over", j.not_taken_over),
            (f"{j.name} handler ended but its attempt is not a success", j.ended_unrecorded),
        ]
        if j.failed:
            out.append(f"{j.name}: failed by reason: " +
                       ", ".join(f"{k} {v}" for k, v in j.failed.items()))
        if j.skipped:
            out.append(f"{j.name}: skipped by reason: " +
                       ", ".join(f"{k} {v}" for k, v in j.skipped.items()))
        if j.interrupted_by:
            out.append(f"{j.name}: interrupted by reason: " +
                       ", ".join(f"{k} {v}" for k, v in j.interrupted_by.items()))
        if j.missed:
            out.append(f"{j.name}: missed (never claimed) by reason: " +
                       ", ".join(f"{k} {v}" for k, v in j.missed.items()))
    for title, items in details:
        if items:
            out.append(f"{title}: {len(items)}")
            out += [f"  {line}" for line in items[:15]]
            if len(items) > 15:
                out.append(f"  ... and {len(items) - 15} more")
    out += report.fault_lines
    if report.failovers:
        loss = sum(len(j.failover_loss) for j in report.jobs)
        dups = sum(1 for j in report.jobs for x in j.failover_loss
                   if x.startswith("dup success"))
        out.append(f"failovers {report.failovers}: duplicate successes after a failover "
                   f"{dups} ({dups / report.failovers:.2f} per failover), all failover "
                   f"losses {loss}")
    out += [f"FAULT NOT APPLIED: {p}" for p in report.fault_problems]
    out += report.skew
    out += [f"SKEW NOT APPLIED: {p}" for p in report.skew_problems]
    out += [f"note: {n}" for n in report.notes]
    failures = report.failures()
    out.append(f"RESULT {report.backend}: " +
               ("PASS" if not failures else f"FAIL ({len(failures)} problems)"))
    if report.command:
        out.append(f"reproduce: {report.command}")
    return "\n".join(out)


def format_summary(reports: list[BackendReport]) -> str:
    """One row per backend."""
    header = ["backend", "kind", "seed", "seconds", "faults applied", "due", "run", "success",
              "dup success", "overlap", "at once", "fenced end/start", "lost", "takeovers",
              "delay ms med/max", "early", "failover loss", "result"]
    rows = []
    for r in reports:
        rows.append([
            r.backend, "lease" if r.leases else "claim", str(r.seed), f"{r.seconds:.0f}",
            " ".join(f"{k}:{v}" for k, v in sorted(r.faults.items())),
            str(r.total("due")), str(r.total("run")), str(r.total("successes")),
            str(r.total("dup_success")), str(r.total("overlaps")),
            str(r.total("policy_overlaps")),
            f"{r.total('fenced_effects')}/{r.total('fenced_starts')}", str(r.total("lost")),
            str(r.total("takeovers")), _fmt_delays(r.delays), str(r.total("early_starts")),
            str(r.total("failover_loss")), "PASS" if not r.failures() else "FAIL",
        ])
    return _table(header, rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.check WORKDIR...``: print the tables; exit 1 on any failure."""
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not dirs:
        print("usage: python -m chaos.check WORKDIR [WORKDIR ...]", file=sys.stderr)
        return 2
    reports = [check_run(d) for d in dirs]
    for r in reports:
        print(format_report(r), end="\n\n")
    print(format_summary(reports))
    return 1 if any(r.failures() for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
