"""``backfill`` of a range at the ends of the calendar is a usage error, never an overflow."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anarchon_core import ConfigError, Scheduler
from anarchon_core.backends.sqlite import SqliteBackend

pytestmark = pytest.mark.timeout(60)

SCRIPT = str(Path(sys.executable).with_name("anarchon"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "myjobs.py").write_text(textwrap.dedent(f"""
        from anarchon_core import Scheduler
        from anarchon_core.backends.sqlite import SqliteBackend
        scheduler = Scheduler(SqliteBackend({str(tmp_path / "cron.db")!r}))
        scheduler.cron("hourly", "0 * * * *", lambda ctx: None)
    """))
    return tmp_path


@pytest.mark.parametrize(("start", "end"), [
    ("0001-01-01T00:00Z", "2026-01-01T00:00Z"),
    ("0001-01-01T00:00Z", "0001-01-01T05:00Z"),
    ("2025-12-31T00:00Z", "9999-12-31T23:59-14:00"),
])
def test_a_range_at_the_ends_of_the_calendar_is_a_usage_error(
        project: Path, start: str, end: str) -> None:
    out = subprocess.run([SCRIPT, "backfill", "myjobs:scheduler", "hourly", "--from", start,
                          "--to", end], capture_output=True, text=True, timeout=60,
                         cwd=project, check=False)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith("anarchon backfill: error: invalid "), line
    assert "Overflow" not in line


def test_slots_outside_the_calendar_are_refused_by_backfill(tmp_path: Path) -> None:
    scheduler = Scheduler(SqliteBackend(tmp_path / "cron.db"))
    scheduler.cron("hourly", "0 * * * *", lambda ctx: None)

    async def backfill(start: datetime | int, end: datetime | int) -> None:
        try:
            await scheduler.backfill("hourly", start, end)
        finally:
            await scheduler.stop()

    with pytest.raises(ConfigError, match="invalid slot"):
        asyncio.run(backfill(0, 10**20))
    with pytest.raises(ConfigError, match="cannot be computed"):
        asyncio.run(backfill(datetime(1, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)))
