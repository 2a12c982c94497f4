"""The command line as a newcomer meets it: version, help, history, pause, doctor, JSON logs."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from anarchon_core import ConfigError, Run, Scheduler, __version__
from anarchon_core.cli.demo import _describe
from anarchon_core.cli.main import build_parser
from tests.test_cli import anarchon, one_error_line


def _record_runs(url: str, jobs: dict[str, int]) -> None:
    """``jobs[name]`` manual runs of each job, recorded in the store at ``url``."""
    async def go() -> None:
        scheduler = Scheduler(url)
        for name in jobs:
            scheduler.every(name, "1h", lambda ctx: None)
        try:
            for name, count in jobs.items():
                for _ in range(count):
                    await scheduler.run_now(name)
        finally:
            await scheduler.stop()
    asyncio.run(go())


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cron.db'}"
    _record_runs(url, {"sync": 2, "report": 1})
    return url


def test_version() -> None:
    out = anarchon("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"anarchon {__version__}"


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _parsers(child)
    return found


def test_every_option_and_argument_has_help() -> None:
    missing = [f"{p.prog} {a.dest}" for p in _parsers(build_parser()) for a in p._actions
               if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert not missing


def test_timeout_zero_says_what_is_accepted() -> None:
    line = one_error_line(anarchon("history", "--timeout", "0", "--backend", "sqlite:///x"),
                          "history")
    assert "expected a number of seconds above 0 and at most 86400" in line
    assert "got '0'" in line


def test_history_without_a_job_lists_every_jobs_newest_runs(store: str) -> None:
    out = anarchon("history", "--backend", store)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split()[:6] == ["scheduled", "(UTC)", "job", "attempt", "status", "ms"]
    assert sorted(r.split()[1] for r in rows) == ["report", "sync", "sync"]
    assert all(r.split()[0].endswith("Z") for r in rows)
    one = anarchon("history", "sync", "-n", "1", "--backend", store)
    assert len(one.stdout.splitlines()) == 2, one.stdout
    limited = anarchon("history", "--limit", "2", "--status", "success", "--backend", store)
    assert len(limited.stdout.splitlines()) == 3, limited.stdout
    none = anarchon("history", "sync", "--status", "failed", "--backend", store)
    assert none.returncode == 0
    assert none.stdout.strip() == "no runs of 'sync' with status failed"


def test_history_of_an_unknown_job_names_the_jobs_the_store_holds(store: str) -> None:
    line = one_error_line(anarchon("history", "nosuchjob", "--backend", store), "history")
    assert "no runs of 'nosuchjob'; the store holds runs of 2 job(s): report, sync" in line
    assert anarchon("history", "nosuchjob", "--backend", store).returncode == 2


def test_pause_refuses_a_job_nobody_knows_unless_forced(store: str) -> None:
    line = one_error_line(anarchon("pause", "sync-typo", "--backend", store), "pause")
    assert "no live instance defines 'sync-typo'" in line
    assert "known jobs: report, sync" in line
    assert "--force" in line
    assert anarchon("pause", "sync-typo", "--backend", store).returncode == 2
    forced = anarchon("pause", "sync-typo", "--force", "--backend", store)
    assert forced.returncode == 0, forced.stderr
    known = anarchon("pause", "sync", "--reason", "deploy of 2.3", "--backend", store)
    assert known.returncode == 0, known.stderr
    assert "paused 'sync' (deploy of 2.3)" in known.stdout
    status = anarchon("status", "--backend", store)
    assert status.returncode == 0, status.stderr
    line = next(ln for ln in status.stdout.splitlines() if ln.startswith("sync "))
    assert "paused by " in line
    assert line.endswith(": deploy of 2.3")


def test_backfill_refusal_names_the_option() -> None:
    scheduler = Scheduler("sqlite:///:memory:")
    scheduler.every("tick", "1s", lambda ctx: None)
    now = datetime.now(UTC)
    with pytest.raises(ConfigError, match="--limit of anarchon backfill"):
        asyncio.run(scheduler.backfill("tick", now - timedelta(minutes=1), now, limit=5))


def test_demo_says_why_a_slot_was_skipped_for_overlap() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    run = Run(job="report", slot=0, attempt=1, status="skipped", runner="vm:1", started_at=at,
              finished_at=at, error="overlap: an earlier run of this job still holds a lease")
    assert _describe(run, None) == "#1 vm:1 skipped (overlap: the run before it was still going)"


def _user_module(tmp_path: Path, db: Path, body: str = "") -> None:
    (tmp_path / "myjobs.py").write_text(textwrap.dedent(f"""
        from anarchon_core import Scheduler
        scheduler = Scheduler("sqlite:///{db}")

        @scheduler.every("tick", "1s")
        def tick(ctx):
            pass
    """) + textwrap.dedent(body))


@pytest.mark.timeout(60)
def test_run_logs_json_lines_with_the_runs_fields(tmp_path: Path) -> None:
    db = tmp_path / "cron.db"
    _user_module(tmp_path, db)
    proc = subprocess.Popen([sys.executable, "-m", "anarchon_core", "run", "myjobs:scheduler",
                             "--log-format", "json"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    ends: list[dict[str, object]] = []
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 30
        assert proc.stderr is not None
        while time.monotonic() < deadline and not ends:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            record = json.loads(line)  # every line is one JSON object
            if record.get("status") == "success":
                ends.append(record)
    finally:
        proc.terminate()
        proc.wait(20)
    assert ends, "".join(lines)
    end = ends[0]
    assert end["job"] == "tick"
    assert isinstance(end["slot"], int)
    assert end["slot"] % 1000 == 0
    assert end["attempt"] == 1
    assert str(end["runner"]).endswith(f":{proc.pid}")
    assert isinstance(end["duration_ms"], int)
    assert {"time", "level", "logger", "message"} <= set(end)


def test_doctor_passes_on_a_healthy_setup(tmp_path: Path) -> None:
    db = tmp_path / "cron.db"
    _user_module(tmp_path, db)
    _record_runs(f"sqlite:///{db}", {"tick": 1})
    out = anarchon("doctor", "myjobs:scheduler", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    checks = [line.split(":")[0] for line in out.stdout.splitlines()]
    assert checks == ["config", "job tick", "store", "clock", "format", "namespace"]
    assert all(": ok, " in line for line in out.stdout.splitlines()), out.stdout


def test_doctor_fails_on_the_wrong_namespace_and_a_lost_handler(tmp_path: Path) -> None:
    db = tmp_path / "cron.db"
    _user_module(tmp_path, db, "del tick\n")
    _record_runs(f"sqlite:///{db}", {"other-service-job": 1})
    out = anarchon("doctor", "myjobs:scheduler", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = {line.split(":")[0]: line for line in out.stdout.splitlines()}
    assert lines["job tick"].startswith("job tick: FAIL, handler myjobs.tick cannot be imported")
    assert lines["namespace"].startswith("namespace: FAIL, it holds runs of 1 other job(s) "
                                         "(other-service-job)")


def test_doctor_fails_when_the_store_does_not_answer(tmp_path: Path) -> None:
    db = tmp_path / "cron.db"
    _user_module(tmp_path, db)
    out = anarchon("doctor", "myjobs:scheduler", "--backend", "redis://127.0.0.1:1/0",
                   "--timeout", "5", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert any(line.startswith("store: FAIL, ") for line in out.stdout.splitlines()), out.stdout


def test_doctor_of_a_module_that_does_not_import(tmp_path: Path) -> None:
    out = anarchon("doctor", "nosuchmodule:scheduler", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stdout.startswith("config: FAIL, no module named 'nosuchmodule'")


def test_doctor_on_another_store_reads_it_without_creating_it(tmp_path: Path) -> None:
    db = tmp_path / "cron.db"
    _user_module(tmp_path, db)
    missing = tmp_path / "typo.db"
    out = anarchon("doctor", "myjobs:scheduler", "--backend", f"sqlite:///{missing}",
                   cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert any(": FAIL, no anarchon store" in line for line in out.stdout.splitlines()), \
        out.stdout
    assert not missing.exists()


def test_main_in_process_gives_logging_back(tmp_path: Path) -> None:
    """A command quiets logging for its one-line errors, then gives it back to its caller."""
    from anarchon_core.cli.main import main  # noqa: PLC0415

    assert logging.root.manager.disable == logging.NOTSET
    assert main(["history", "--backend", f"sqlite:///{tmp_path / 'none.db'}"]) == 1
    assert logging.root.manager.disable == logging.NOTSET
    assert logging.getLogger("anarchon.lease").isEnabledFor(logging.WARNING)
