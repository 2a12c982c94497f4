"""The chaos checker on saved runs made by hand.

A side effect made again: a runner confirms its lease, makes its side effect, and is cut
off from the store (a partition) before it can record its end, for longer than the lease:
a backup runs the slot again. No lease can prevent that (docs/concepts.md), so the checker
lists it apart; the same two side effects without that partition are a duplicate and fail
the run.

A takeover's delay: judged from the pause that ended the lease, not from a later one, and
from the claim for an attempt whose handler never started. A hand-over (SIGTERM): taken
over within lease/2 of the runner's handler returning, or it is a problem.

Overlap policies: two slots of a job running at once fail the run when the job's policy
forbids it (``skip``, ``buffer_one``, ``cancel_other``), are shown under ``allow`` or for a
run saved without its policy, and are excused for a SIGSTOPped runner; a buffered slot
begun after a later attempt of it was claimed fails; a run ``cancel_other`` cancelled
must end ``interrupted`` in history.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.check import BackendReport, JobReport, check_run, format_report, read_claims

WALL0 = 1_800_000_000_000  # the harness clock: wall ms at monotonic 0
SLOT = WALL0 + 10_000
LEASE_MS = 2_000


def _iso(wall_ms: float) -> str:
    return datetime.fromtimestamp(wall_ms / 1000, UTC).isoformat()


def _ledger_line(event: str, attempt: int, pid: int, at: int) -> dict[str, Any]:
    return {"event": event, "job": "work", "slot": SLOT, "attempt": attempt,
            "token": f"token{attempt}", "manual": False, "instance": f"vm:{pid}", "pid": pid,
            "time_ms": SLOT + at, "mono_ns": (SLOT + at - WALL0) * 1_000_000}


Event = tuple[str, int, int | None, dict[str, Any]]
Line = tuple[str, int, int]


def _write_run(workdir: Path, *, backend: str, interval_ms: int, max_late_ms: int,
               events: list[Event], ledger: dict[int, list[Line]], taken_at: int,
               first_end: int, second_end: int,
               first_error: str = "lease expired: the runner stopped heartbeating") -> Path:
    """A saved run of job ``work``: attempt 1 (pid 1) from 5 ms after the slot, ended
    ``interrupted`` when attempt 2 (pid 2) took over at ``taken_at`` (events, ledger lines
    and times in ms after the slot)."""
    workdir.mkdir()
    meta = {
        "backend": backend, "seed": 1, "leases": True, "seconds": 20.0,
        "lease_ms": LEASE_MS, "heartbeat_ms": 500, "window": [SLOT, SLOT],
        "clock0": {"wall_ms": WALL0, "mono_ns": 0},
        "jobs": [{"name": "work", "interval_ms": interval_ms, "max_late_ms": max_late_ms,
                  "jitter_ms": 0}],
    }
    (workdir / "run.json").write_text(json.dumps(meta))
    (workdir / "faults.jsonl").write_text("".join(
        json.dumps({"kind": kind, "wall_ms": SLOT + at, "mono_ns": (SLOT + at - WALL0) * 10**6,
                    "pid": pid, "detail": detail}) + "\n"
        for kind, at, pid, detail in events))
    (workdir / "ledger").mkdir()
    for pid, lines in ledger.items():
        (workdir / "ledger" / f"{pid}.jsonl").write_text("".join(
            json.dumps(_ledger_line(event, attempt, pid, at)) + "\n"
            for event, attempt, at in lines))
    history = {"work": [
        {"job": "work", "slot": SLOT, "attempt": 1, "status": "interrupted", "runner": "vm:1",
         "error": first_error, "manual": False,
         "started_at": _iso(SLOT + 5), "finished_at": _iso(SLOT + first_end)},
        {"job": "work", "slot": SLOT, "attempt": 2, "status": "success", "runner": "vm:2",
         "error": None, "manual": False, "started_at": _iso(SLOT + taken_at),
         "finished_at": _iso(SLOT + second_end)},
    ]}
    (workdir / "history.json").write_text(json.dumps(history))
    return workdir


def _saved_run(workdir: Path, *, partition_at: int, healed_at: int) -> Path:
    """Attempt 1 (pid 1) writes its end 644 ms after the slot; pid 1 is partitioned from
    ``partition_at`` to ``healed_at``; attempt 2 (pid 2) takes over at 2,920 ms."""
    events: list[Event] = [
        ("spawn", -5_000, 1, {}), ("spawn", -5_000, 2, {}),
        ("partition", partition_at, 1, {"seconds": (healed_at - partition_at) / 1000}),
        ("heal", healed_at, 1, {}), ("settle", 9_000, None, {})]
    ledger: dict[int, list[Line]] = {
        1: [("start", 1, 11), ("end", 1, 644), ("exit", 1, 645)],
        2: [("start", 2, 2_920), ("end", 2, 3_550), ("exit", 2, 3_551)]}
    return _write_run(workdir, backend="postgres", interval_ms=6_000, max_late_ms=7_000,
                      events=events, ledger=ledger, taken_at=2_915, first_end=2_915,
                      second_end=3_560)


def test_a_runner_cut_off_right_after_its_side_effect_is_listed_apart(tmp_path: Path) -> None:
    report = check_run(_saved_run(tmp_path / "run", partition_at=635, healed_at=5_390))
    [job] = report.jobs
    assert report.failures() == []
    assert job.dup_success == []
    assert len(job.cut_off_ends) == 1
    assert "side effect made 2 times" in job.cut_off_ends[0]


def test_the_same_side_effects_without_that_partition_fail_the_run(tmp_path: Path) -> None:
    # The partition began a second after the side effect: the end had time to be recorded.
    late = check_run(_saved_run(tmp_path / "late", partition_at=1_700, healed_at=5_390))
    # The partition was over before the takeover: the runner could have recorded its end.
    short = check_run(_saved_run(tmp_path / "short", partition_at=635, healed_at=2_500))
    for report in (late, short):
        [job] = report.jobs
        assert job.cut_off_ends == []
        assert any("duplicate success" in f and "side effect made 2 times" in f
                   for f in report.failures()), report.failures()


def _paused_run(workdir: Path, pauses: list[tuple[int, int]], taken_at: int) -> Path:
    """Attempt 1 (pid 1) starts 5 ms after the slot; pid 1 is SIGSTOPped over ``pauses``
    (ms after the slot); attempt 2 (pid 2) takes the run over at ``taken_at``."""
    events: list[Event] = [("spawn", -5_000, 1, {}), ("spawn", -5_000, 2, {})]
    for paused, resumed in pauses:
        events += [("pause", paused, 1, {"seconds": (resumed - paused) / 1000}),
                   ("resume", resumed, 1, {})]
    events.append(("settle", 15_000, None, {}))
    # Attempt 1 wakes up fenced after its first long pause: it never writes its end.
    first_exit = next((r for p, r in pauses if r - p >= LEASE_MS), taken_at - 5)
    return _taken_over(workdir, events, [("start", 1, 11), ("exit", 1, first_exit + 1)],
                       taken_at)


def _taken_over(workdir: Path, events: list[Event], first_lines: list[Line],
                taken_at: int) -> Path:
    """A Redis run whose attempt 1 (pid 1) wrote ``first_lines`` and which attempt 2
    (pid 2) took over at ``taken_at``, then ran to success."""
    ledger: dict[int, list[Line]] = {
        1: first_lines,
        2: [("start", 2, taken_at + 5), ("end", 2, taken_at + 600),
            ("exit", 2, taken_at + 601)]}
    return _write_run(workdir, backend="redis", interval_ms=20_000, max_late_ms=19_000,
                      events=events, ledger=ledger, taken_at=taken_at, first_end=taken_at,
                      second_end=taken_at + 610)


def test_a_takeover_is_judged_against_the_pause_that_ended_the_lease(tmp_path: Path) -> None:
    """Paused for longer than the lease, woken up fenced, paused again: the takeover came
    long after the first pause (the store was slow to answer backups), just after the
    second. Chaos seed 20261215 on Redis and PostgreSQL."""
    report = check_run(_paused_run(tmp_path / "run", [(150, 5_028), (6_650, 11_000)],
                                   taken_at=7_350))
    [job] = report.jobs
    assert report.failures() == []
    assert job.early_takeovers == []
    assert job.takeover_delays_ms == [7_350 - (150 + LEASE_MS - 500)]


def test_a_takeover_within_the_lease_of_the_only_pause_fails_the_run(tmp_path: Path) -> None:
    # A short pause first (the lease survived it), then the pause that ended it.
    report = check_run(_paused_run(tmp_path / "run", [(150, 900), (6_650, 11_000)],
                                   taken_at=7_350))
    [job] = report.jobs
    assert len(job.early_takeovers) == 1
    assert "claimed 800 ms before the lease of pid 1" in job.early_takeovers[0]
    assert any("TAKEOVER BEFORE LEASE EXPIRY" in f or "before the lease" in f
               for f in report.failures()), report.failures()


def _unstarted_run(workdir: Path, taken_at: int) -> Path:
    """Attempt 1 (pid 1) is claimed 5 ms after the slot but its handler never starts (the
    claim's answer came too late); pid 1 is partitioned 1,700 ms after the slot; attempt 2
    (pid 2) takes the run over at ``taken_at``."""
    events: list[Event] = [
        ("spawn", -5_000, 1, {}), ("spawn", -5_000, 2, {}),
        ("partition", 1_700, 1, {"seconds": 2.3}), ("heal", 4_000, 1, {}),
        ("settle", 9_000, None, {})]
    return _taken_over(workdir, events, [], taken_at)


def test_an_attempt_that_never_started_is_judged_from_its_claim(tmp_path: Path) -> None:
    """Its runner never heartbeated, so a partition after the claim says nothing about
    when its lease ended: the claim plus one lease does. Chaos seed 1173561178 on Redis,
    under a loaded machine."""
    report = check_run(_unstarted_run(tmp_path / "run", taken_at=2_100))
    [job] = report.jobs
    assert report.failures() == []
    assert job.early_takeovers == []
    assert job.takeover_delays_ms == [2_100 - (5 + LEASE_MS)]
    assert job.takeover_causes["won too late to run (never started)"] == 1


def test_an_attempt_that_never_started_taken_over_within_its_lease_fails_the_run(
        tmp_path: Path) -> None:
    report = check_run(_unstarted_run(tmp_path / "run", taken_at=1_500))
    [job] = report.jobs
    assert len(job.early_takeovers) == 1
    assert "claimed 505 ms before the lease of attempt 1 (pid 1, never started" in \
        job.early_takeovers[0]
    assert any("before the lease" in f for f in report.failures()), report.failures()


def _handed_over(workdir: Path, taken_at: int, extra: list[Event] | None = None) -> Path:
    """Pid 1 is SIGTERMed 1,000 ms after the slot, its handler returns at 1,200 ms and it
    hands over; attempt 2 (pid 2) starts at ``taken_at``."""
    events: list[Event] = [("spawn", -5_000, 1, {}), ("spawn", -5_000, 2, {}),
                           ("stop", 1_000, 1, {}), *(extra or []),
                           ("settle", 15_000, None, {})]
    ledger: dict[int, list[Line]] = {
        1: [("start", 1, 11), ("exit", 1, 1_200)],
        2: [("start", 2, taken_at + 5), ("end", 2, taken_at + 600),
            ("exit", 2, taken_at + 601)]}
    return _write_run(workdir, backend="sqlite", interval_ms=20_000, max_late_ms=19_000,
                      events=events, ledger=ledger, taken_at=taken_at, first_end=taken_at,
                      second_end=taken_at + 610,
                      first_error="handed over: the runner was stopping")


def test_a_prompt_hand_over_passes(tmp_path: Path) -> None:
    report = check_run(_handed_over(tmp_path / "run", taken_at=1_900))
    [job] = report.jobs
    assert report.failures() == []
    assert job.takeover_causes["hand-over (SIGTERM)"] == 1


def test_a_hand_over_taken_only_when_the_lease_ran_out_fails_the_run(tmp_path: Path) -> None:
    report = check_run(_handed_over(tmp_path / "run", taken_at=1_200 + LEASE_MS + 100))
    [job] = report.jobs
    assert len(job.slow_handovers) == 1
    assert any("slow hand-over" in f for f in report.failures()), report.failures()


def test_a_slow_hand_over_with_the_backup_paused_is_not_judged(tmp_path: Path) -> None:
    pause: list[Event] = [("pause", 1_100, 2, {"seconds": 2.5}), ("resume", 3_600, 2, {})]
    report = check_run(_handed_over(tmp_path / "run", taken_at=3_700, extra=pause))
    assert report.jobs[0].slow_handovers == []


def test_a_hand_over_within_a_backups_check_interval_passes(tmp_path: Path) -> None:
    """Backups check every one to two heartbeats (500 ms here): a hand-over taken 1,019 ms
    after the handler returned is the next check plus the claim's latency (SQLite, CI)."""
    report = check_run(_handed_over(tmp_path / "run", taken_at=1_200 + 1_019))
    assert report.failures() == []


def test_a_backup_paused_since_before_the_hand_over_excuses_a_slow_one(tmp_path: Path) -> None:
    """The only backup was SIGSTOPped well before the hand-over and resumed after it: the
    pause's span counts, not only its start (chaos seed 1475947154 on SQLite)."""
    pause: list[Event] = [("pause", -1_900, 2, {"seconds": 3.8}), ("resume", 1_900, 2, {})]
    report = check_run(_handed_over(tmp_path / "run", taken_at=1_900 + 1_000, extra=pause))
    assert report.jobs[0].slow_handovers == []


# Overlap policies: the guarantee of each job's policy, judged from the same records.

PolicyLine = tuple[str, int, int, int, int]  # event, slot offset, attempt, pid, at
HistoryRow = tuple[int, int, str, int, int, int | None, str | None]


def _policy_run(workdir: Path, overlap: str | None, *, interval_ms: int,
                lines: list[PolicyLine], runs: list[HistoryRow],
                events: list[Event] | None = None, slots: int = 2) -> Path:
    """A saved run of job ``work`` under overlap policy ``overlap`` (None: a run saved
    before the policy was recorded). ``lines`` are ledger lines, ``runs`` history rows
    ``(slot offset, attempt, status, pid, claimed at, finished at, error)``; slot offsets
    and times are ms after ``SLOT``; the window holds ``slots`` slots."""
    workdir.mkdir()
    spec: dict[str, Any] = {"name": "work", "interval_ms": interval_ms,
                            "max_late_ms": interval_ms, "jitter_ms": 0}
    if overlap is not None:
        spec["overlap"] = overlap
    meta = {"backend": "sqlite", "seed": 1, "leases": True, "seconds": 20.0,
            "lease_ms": LEASE_MS, "heartbeat_ms": 500,
            "window": [SLOT, SLOT + (slots - 1) * interval_ms],
            "clock0": {"wall_ms": WALL0, "mono_ns": 0}, "jobs": [spec], "exit_lines": True}
    (workdir / "run.json").write_text(json.dumps(meta))
    pids = {pid for *_, pid, _ in lines} | {row[3] for row in runs}
    spawns: list[Event] = [("spawn", -5_000, pid, {}) for pid in sorted(pids)]
    (workdir / "faults.jsonl").write_text("".join(
        json.dumps({"kind": kind, "wall_ms": SLOT + at, "mono_ns": (SLOT + at - WALL0) * 10**6,
                    "pid": pid, "detail": detail}) + "\n"
        for kind, at, pid, detail in [*spawns, *(events or []),
                                      ("settle", 20_000, None, {})]))
    (workdir / "ledger").mkdir()
    for pid in pids:
        (workdir / "ledger" / f"{pid}.jsonl").write_text("".join(
            json.dumps({**_ledger_line(event, attempt, pid, at),
                        "slot": SLOT + offset, "token": f"t{offset}-{attempt}"}) + "\n"
            for event, offset, attempt, p, at in lines if p == pid))
    history = {"work": [
        {"job": "work", "slot": SLOT + offset, "attempt": attempt, "status": status,
         "runner": f"vm:{pid}", "error": error, "manual": False,
         "started_at": _iso(SLOT + claimed),
         "finished_at": _iso(SLOT + finished) if finished is not None else None}
        for offset, attempt, status, pid, claimed, finished, error in runs]}
    (workdir / "history.json").write_text(json.dumps(history))
    return workdir


def _slot_after_slot(workdir: Path, overlap: str | None, *, first_exits_at: int,
                     events: list[Event] | None = None) -> Path:
    """Slot 1 runs on pid 1 from 5 ms; slot 2 (2 s later) on pid 2 from 2,010 ms."""
    lines: list[PolicyLine] = [
        ("start", 0, 1, 1, 5), ("end", 0, 1, 1, first_exits_at - 1),
        ("exit", 0, 1, 1, first_exits_at),
        ("start", 2_000, 1, 2, 2_010), ("end", 2_000, 1, 2, 2_300),
        ("exit", 2_000, 1, 2, 2_301)]
    runs: list[HistoryRow] = [(0, 1, "success", 1, 3, first_exits_at + 2, None),
                              (2_000, 1, "success", 2, 2_005, 2_305, None)]
    return _policy_run(workdir, overlap, interval_ms=2_000, lines=lines, runs=runs,
                       events=events)


def test_two_slots_at_once_fail_a_skip_job(tmp_path: Path) -> None:
    report = check_run(_slot_after_slot(tmp_path / "run", "skip", first_exits_at=2_400))
    [job] = report.jobs
    assert len(job.policy_overlaps) == 1
    assert "still ran 390 ms after slot" in job.policy_overlaps[0]
    assert any("two runs at once" in f and "overlap skip" in f for f in report.failures())


def test_two_slots_at_once_are_shown_for_allow_and_for_runs_saved_without_a_policy(
        tmp_path: Path) -> None:
    for overlap in ("allow", None):
        report = check_run(_slot_after_slot(tmp_path / str(overlap), overlap,
                                            first_exits_at=2_400))
        [job] = report.jobs
        assert report.failures() == []
        assert job.policy_overlaps == []
        assert len(job.slot_overlaps) == 1


def test_a_sigstopped_runner_past_the_next_slot_is_a_zombie(tmp_path: Path) -> None:
    pause: list[Event] = [("pause", 100, 1, {"seconds": 2.2}), ("resume", 2_300, 1, {})]
    report = check_run(_slot_after_slot(tmp_path / "run", "buffer_one", first_exits_at=2_400,
                                        events=pause))
    [job] = report.jobs
    assert report.failures() == []
    assert len(job.zombie_overlaps) == 1


def test_slots_one_after_the_other_pass_under_every_policy(tmp_path: Path) -> None:
    for overlap in ("skip", "buffer_one", "cancel_other", "allow"):
        report = check_run(_slot_after_slot(tmp_path / overlap, overlap, first_exits_at=1_900))
        assert report.failures() == [], overlap
        assert report.jobs[0].slot_overlaps == report.jobs[0].policy_overlaps == []


def _buffered_taken_over(workdir: Path, late_start_at: int,
                         events: list[Event] | None = None) -> Path:
    """Slot 2 waits (buffered) on pid 1 from 2,005 ms; its lease expires and pid 2 claims
    attempt 2 at 4,600 and runs it 5,000–5,600; pid 1 then begins attempt 1 at
    ``late_start_at`` and stops at its first lease check 50 ms later."""
    lines: list[PolicyLine] = [
        ("start", 0, 1, 3, 5), ("end", 0, 1, 3, 300), ("exit", 0, 1, 3, 301),
        ("start", 2_000, 2, 2, 5_000), ("end", 2_000, 2, 2, 5_599),
        ("exit", 2_000, 2, 2, 5_600),
        ("start", 2_000, 1, 1, late_start_at), ("exit", 2_000, 1, 1, late_start_at + 50)]
    runs: list[HistoryRow] = [
        (0, 1, "success", 3, 3, 305, None),
        (2_000, 1, "interrupted", 1, 2_005, 4_600,
         "buffered: waits for another run of this job to end"),
        (2_000, 2, "success", 2, 4_600, 5_605, None)]
    return _policy_run(workdir, "buffer_one", interval_ms=2_000, lines=lines, runs=runs,
                       events=events)


def test_a_buffered_slot_begun_after_its_takeover_fails_the_run(tmp_path: Path) -> None:
    report = check_run(_buffered_taken_over(tmp_path / "run", late_start_at=5_700))
    [job] = report.jobs
    assert len(job.buffered_twice) == 1
    assert "attempt 1 (pid 1) began 1100 ms after attempt 2 was claimed" in \
        job.buffered_twice[0]
    assert any("buffered slot ran twice" in f for f in report.failures()), report.failures()


def test_a_buffered_slot_begun_by_a_woken_zombie_passes(tmp_path: Path) -> None:
    pause: list[Event] = [("pause", 2_010, 1, {"seconds": 3.6}), ("resume", 5_650, 1, {})]
    report = check_run(_buffered_taken_over(tmp_path / "run", late_start_at=5_700,
                                            events=pause))
    [job] = report.jobs
    assert job.buffered_twice == []
    assert report.failures() == []
    assert len(job.fenced_starts) == 1  # shown: it stopped at its first lease check


CANCELLED = "cancelled: a later slot of this job replaces it (overlap cancel_other)"


def _cancelled(workdir: Path, first_status: str) -> Path:
    """Slot 1 runs on pid 1 from 5 ms; slot 2 (3 s later) is claimed by pid 2 at 3,005,
    which cancels slot 1: pid 1 stops at its next heartbeat (3,400), slot 2 begins at
    3,500. Slot 1's record ends ``first_status``."""
    lines: list[PolicyLine] = [
        ("start", 0, 1, 1, 5), ("exit", 0, 1, 1, 3_400),
        ("start", 3_000, 1, 2, 3_500), ("end", 3_000, 1, 2, 3_799),
        ("exit", 3_000, 1, 2, 3_800)]
    runs: list[HistoryRow] = [
        (0, 1, first_status, 1, 3, 3_900 if first_status != "running" else None, CANCELLED),
        (3_000, 1, "success", 2, 3_005, 3_805, None)]
    return _policy_run(workdir, "cancel_other", interval_ms=3_000, lines=lines, runs=runs)


def test_a_cancelled_run_recorded_interrupted_passes(tmp_path: Path) -> None:
    report = check_run(_cancelled(tmp_path / "run", "interrupted"))
    [job] = report.jobs
    assert report.failures() == []
    assert job.interrupted_by == {"cancelled": 1}
    assert job.not_taken_over == []  # interrupted by its policy, not waiting for a backup


def test_a_cancelled_run_left_running_fails_the_run(tmp_path: Path) -> None:
    report = check_run(_cancelled(tmp_path / "run", "running"))
    [job] = report.jobs
    assert len(job.cancelled_unrecorded) == 1
    assert any("cancelled run not recorded interrupted" in f for f in report.failures())


def test_claims_per_slot_are_counted_from_the_instances_claim_logs(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (ledger / "1.claims").write_text(
        json.dumps({"job": "work", "slot": SLOT, "outcome": "won"}) + "\n"
        + json.dumps({"job": "work", "slot": SLOT + 20_000, "outcome": "won"}) + "\n"
        + '{"job": "work", "sl')  # cut short by a SIGKILL
    (ledger / "2.claims").write_text(
        json.dumps({"job": "work", "slot": SLOT, "outcome": "running"}) + "\n")
    (ledger / "2.jsonl").write_text("")  # the run ledger beside it is not read here
    assert read_claims(ledger) == {("work", SLOT): 2, ("work", SLOT + 20_000): 1}
    job = JobReport("work", claims=[2, 1])
    assert "1.50/2" in format_report(BackendReport(
        backend="sqlite", seed=1, leases=True, seconds=8.0, jobs=[job], faults=Counter(),
        notes=[], skew=[], skew_problems=[], command=""))
