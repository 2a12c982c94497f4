"""The ``anarchon`` command line, run as users run it (a subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest


def anarchon(*args: str, cwd: Path | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "anarchon_core", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, check=False)


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
