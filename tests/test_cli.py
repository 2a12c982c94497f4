"""The ``anarchon`` command line, run as users run it (a subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anarchon_core import Run
from anarchon_core.cli.main import format_history

from .support.helpers import free_port

#: The installed console script, next to this interpreter (the entry point users run).
SCRIPT = str(Path(sys.executable).with_name("anarchon"))


def anarchon(*args: str, cwd: Path | None = None, timeout: float = 60,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, check=False, env=env)


def one_error_line(out: subprocess.CompletedProcess[str], command: str) -> str:
    """The failure contract: status ≠ 0, one line on stderr, no traceback, nothing on stdout."""
    assert out.returncode != 0, out
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"anarchon {command}: error: "), lines[0]
    assert "Traceback" not in out.stderr
    assert out.stdout == ""
    return lines[0]


def test_next_prints_iso_times_with_offsets_across_dst() -> None:
    out = anarchon("next", "0 8 * * *", "--tz", "Europe/Athens", "-n", "5")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert len(lines) == 5
    times = [datetime.fromisoformat(line) for line in lines]
    assert all(t.hour == 8 and t.minute == 0 for t in times)
    assert all(t.utcoffset() is not None for t in times)
    assert times == sorted(times)


def test_next_rejects_a_bad_expression_with_a_clear_message() -> None:
    out = anarchon("next", "61 * * * *")
    assert out.returncode == 2
    assert "invalid cron expression '61 * * * *'" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "lines"),
    [(["*/30 * * * *", "--after", "2026-10-25T02:00+03:00", "-n", "7"],
      ["2026-10-25T02:30:00+03:00",
       "2026-10-25T03:00:00+03:00  DST fall-back, first pass (both: the wildcard default)",
       "2026-10-25T03:30:00+03:00  DST fall-back, first pass (both: the wildcard default)",
       "2026-10-25T03:00:00+02:00  DST fall-back, second pass (both: the wildcard default)",
       "2026-10-25T03:30:00+02:00  DST fall-back, second pass (both: the wildcard default)",
       "2026-10-25T04:00:00+02:00", "2026-10-25T04:30:00+02:00"]),
     (["0 3 * * *", "--dst", "once_last", "--after", "2026-10-24T12:00Z", "-n", "2"],
      ["2026-10-25T03:00:00+02:00  DST fall-back, second pass (once_last)",
       "2026-10-26T03:00:00+02:00"]),
     (["30 3 * * *", "--after", "2026-03-28T00:00Z", "-n", "2"],
      ["2026-03-28T03:30:00+02:00",
       "2026-03-29T04:00:00+03:00  DST spring-forward gap: 03:30 shifted to 04:00 "
       "(shift: the fixed-time default)"]),
     (["30 3 * * *", "--dst", "skip", "--after", "2026-03-28T00:00Z", "-n", "2"],
      ["2026-03-28T03:30:00+02:00",
       "2026-03-30T03:30:00+03:00  DST spring-forward gap: 03:30 skipped (skip)"]),
     (["0 8 * * *", "--after", "2026-03-28T00:00Z", "-n", "2"],
      ["2026-03-28T08:00:00+02:00", "2026-03-29T08:00:00+03:00"])],
)
def test_next_marks_the_slots_a_dst_change_decided(args: list[str], lines: list[str]) -> None:
    out = anarchon("next", *args, "--tz", "Europe/Athens")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == lines


def test_jobs_run_and_history_on_a_user_module(tmp_path: Path) -> None:
    db = tmp_path / "cron.db"
    (tmp_path / "myjobs.py").write_text(textwrap.dedent(f"""
        from anarchon_core import Scheduler
        scheduler = Scheduler("sqlite:///{db}")

        @scheduler.every("tick", "1s")
        def tick(ctx):
            pass

        scheduler.cron("daily", "0 8 * * *", tick, tz="Europe/Athens")
    """))
    jobs = anarchon("jobs", "myjobs:scheduler", cwd=tmp_path)
    assert jobs.returncode == 0, jobs.stderr
    assert re.search(r"tick\s+every 1s", jobs.stdout)
    assert re.search(r"daily\s+cron 0 8 \* \* \* Europe/Athens", jobs.stdout)

    proc = subprocess.Popen([sys.executable, "-m", "anarchon_core", "run", "myjobs:scheduler"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            hist = anarchon("history", "tick", "--backend", f"sqlite:///{db}")
            if hist.returncode == 0 and hist.stdout.count("success") >= 2:
                break
            time.sleep(0.5)
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
    assert hist.stdout.count("success") >= 2, hist.stdout + hist.stderr
    assert "scheduled (UTC)" in hist.stdout


def test_history_without_a_backend_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANARCHON_URL", raising=False)
    out = anarchon("history", "tick")
    assert out.returncode == 2
    assert "--backend" in out.stderr


def test_run_with_a_wrong_target_explains(tmp_path: Path) -> None:
    (tmp_path / "notsched.py").write_text("scheduler = 42\n")
    out = anarchon("run", "notsched:scheduler", cwd=tmp_path)
    assert out.returncode == 2
    assert "not an anarchon Scheduler" in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_shows_every_slot_once_and_the_takeover() -> None:
    out = anarchon("demo", "--seconds", "12", timeout=110)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SIGKILL instance" in out.stdout
    summary = re.search(r"slots: (\d+)\s+successes: (\d+)\s+duplicates: (\d+)\s+takeovers: (\d+)",
                        out.stdout)
    assert summary, out.stdout
    slots, successes, duplicates, takeovers = map(int, summary.groups())
    assert duplicates == 0
    assert takeovers >= 1
    assert slots >= 5
    assert successes >= slots - 2  # the runs cut by the final stop may be unfinished
    assert re.search(r"report\s+#1 \S+ interrupted \(killed\)\s+→\s+#2 \S+ success", out.stdout)


@pytest.mark.parametrize(
    ("args", "command", "status", "says"),
    [(["run", "nonexistent_mod_zz:scheduler"], "run", 2,
      "no module named 'nonexistent_mod_zz': run anarchon from your project's directory"),
     (["jobs", "os:missing_attr"], "jobs", 2, "module 'os' has no attribute 'missing_attr'"),
     (["jobs", "os"], "jobs", 2, "expected module:attribute"),
     (["jobs", "os:sep"], "jobs", 2, "os:sep is a str, not an anarchon Scheduler"),
     (["next", "0 8 * * *", "-n", "-1"], "next", 2, "argument -n: expected 1 to 10000, got -1"),
     (["next", "0 8 * * *", "-n", "0"], "next", 2, "expected 1 to 10000, got 0"),
     (["next", "0 8 * * *", "-n", "many"], "next", 2, "expected a whole number, got 'many'"),
     (["next", "0 8 * * 9"], "next", 2, "invalid cron expression '0 8 * * 9'"),
     (["next", "0 8 * *"], "next", 2, "expected 5 fields"),
     (["next", "0 8 * * *", "--tz", "Mars/Olympus"], "next", 2,
      "invalid time zone 'Mars/Olympus'"),
     (["next", "0 8 * * *", "--dst", "sometimes"], "next", 2,
      "invalid dst 'sometimes': expected None, a choice for the repeated hour"),
     (["next", "0 8 * * *", "--after", "Tuesday"], "next", 2,
      "argument --after: expected an ISO 8601 date-time, got 'Tuesday'"),
     (["history", "tick", "--backend", "postgres://[::1"], "history", 2,
      "invalid backend URL 'postgres://[::1'"),
     (["history", "tick", "--backend", "redis://127.0.0.1/abc"], "history", 2,
      "the path '/abc' is not a database number"),
     (["history", "tick", "--backend", "redis://127.0.0.1/0?foo=bar"], "history", 2,
      "unknown parameter 'foo'"),
     (["history", "tick", "--backend", "mysql://127.0.0.1/db"], "history", 2,
      "unknown backend URL scheme 'mysql'"),
     (["history", "tick", "--backend", "sqlite:///x.db", "--limit", "0"], "history", 2,
      "argument -n/--limit: expected 1 to 10000, got 0"),
     (["demo", "--instances", "0"], "demo", 2, "argument --instances"),
     (["demo", "--seconds", "nan"], "demo", 2, "argument --seconds")],
)
def test_every_failure_is_one_line_with_a_non_zero_status(
        tmp_path: Path, args: list[str], command: str, status: int, says: str) -> None:
    out = anarchon(*args, cwd=tmp_path)
    line = one_error_line(out, command)
    assert out.returncode == status
    assert says in line


@pytest.mark.parametrize(
    "template",
    ["redis://app:{pw}@127.0.0.1:{port}/0", "postgresql://app:{pw}@127.0.0.1:{port}/test",
     "amqp://app:{pw}@127.0.0.1:{port}/"],
)
def test_history_against_a_closed_port(template: str) -> None:
    password = "Cl1Secret%2Fx"
    url = template.format(pw=password, port=free_port())
    out = anarchon("history", "tick", "--backend", url, "--timeout", "20")
    line = one_error_line(out, "history")
    assert out.returncode == 1
    assert "Cl1Secret" not in out.stderr
    assert "***@127.0.0.1" in line  # the store is named, the password masked
    assert line.endswith("(--traceback for details)")


def test_errors_in_the_users_module_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "badjobs.py").write_text(textwrap.dedent(f"""
        from anarchon_core import Scheduler
        scheduler = Scheduler("sqlite:///{tmp_path}/x.db")
        scheduler.every("sync", "10x", print)
    """))
    (tmp_path / "brokenimport.py").write_text("import not_installed_dependency_zz\n")
    (tmp_path / "factory.py").write_text("def make():\n    raise RuntimeError('no config')\n")
    out = anarchon("jobs", "badjobs:scheduler", cwd=tmp_path)
    assert "importing 'badjobs' failed: invalid interval '10x'" in one_error_line(out, "jobs")
    assert out.returncode == 2
    out = anarchon("run", "brokenimport:scheduler", cwd=tmp_path)
    line = one_error_line(out, "run")
    assert "importing 'brokenimport' failed: ModuleNotFoundError" in line
    assert "not_installed_dependency_zz" in line
    out = anarchon("jobs", "factory:make", cwd=tmp_path)
    assert "calling factory:make() failed: RuntimeError: no config" in one_error_line(out, "jobs")


def test_traceback_flag_shows_the_rest(tmp_path: Path) -> None:
    for flags in (["--traceback"], ["-v"]):
        out = anarchon(*flags, "jobs", "os:missing_attr", cwd=tmp_path)
        assert out.returncode == 2
        assert "Traceback (most recent call last)" in out.stderr
        assert out.stderr.rstrip().splitlines()[-1] == \
            "anarchon jobs: error: module 'os' has no attribute 'missing_attr'"
    out = anarchon("next", "61 * * * *", "--traceback")  # after the command works too
    assert "Traceback" in out.stderr
    assert "ConfigError: invalid cron expression '61 * * * *'" in out.stderr


def test_history_table_shows_each_runs_meta() -> None:
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    runs = [Run(job="report", slot=1_796_025_600_000, attempt=2, status="success",
                runner="beat-2", started_at=at, finished_at=at,
                meta={"task_id": "5f1c", "task": "proj.report"}),
            Run(job="report", slot=1_796_025_600_000, attempt=1, status="interrupted",
                runner="beat-1", started_at=at, finished_at=None, error="lease expired")]
    lines = format_history(runs).splitlines()
    assert "meta" in lines[0]
    assert lines[1].endswith("beat-2  [task=proj.report task_id=5f1c]")
    assert lines[2].endswith("beat-1  lease expired")
