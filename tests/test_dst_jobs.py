"""A cron job's dst= as registered, listed, recorded for the fleet and rebuilt from it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from anarchon_core import ConfigError, JobContext
from anarchon_core.fleet import JobDefinition, assemble, decode_jobs, encode_jobs
from anarchon_core.options import JobOptions
from anarchon_core.schedules import CronSchedule, ms_to_datetime

from .support.helpers import make_scheduler

ATHENS = "Europe/Athens"
#: 2026-10-25 02:30 EEST, before the repeated hour 03:00-04:00 of Athens.
BEFORE_FALL_BACK = 1_792_884_600_000


def noop(ctx: JobContext) -> None:
    pass


def definition(name: str, schedule: CronSchedule) -> JobDefinition:
    options = JobOptions.build(schedule, {}, leases=True, now_ms=BEFORE_FALL_BACK)
    return JobDefinition.of(name, schedule, options)


def local(slot: int | None) -> str:
    assert slot is not None
    return ms_to_datetime(slot).astimezone(CronSchedule("0 0 * * *", ATHENS).zone).isoformat()


def test_scheduler_cron_takes_dst_and_jobs_show_it(tmp_path: Path) -> None:
    scheduler = make_scheduler(tmp_path)
    scheduler.cron("plain", "0 3 * * *", noop, tz=ATHENS)
    scheduler.cron("late", "0 3 * * *", noop, tz=ATHENS, dst="once_last")

    @scheduler.cron("wild", "*/30 * * * *", tz=ATHENS, dst=("once_first", "shift"))
    def wild(ctx: JobContext) -> None:
        pass

    shown = {job.name: job.schedule for job in scheduler.jobs()}
    assert shown == {"plain": "cron 0 3 * * * Europe/Athens",
                     "late": "cron 0 3 * * * Europe/Athens dst=once_last,shift",
                     "wild": "cron */30 * * * * Europe/Athens dst=once_first,shift"}
    with pytest.raises(ConfigError, match=r"invalid dst 'twice': expected None"):
        scheduler.cron("bad", "0 3 * * *", noop, tz=ATHENS, dst="twice")
    assert "bad" not in {job.name for job in scheduler.jobs()}


def test_the_definition_records_dst_only_when_given() -> None:
    plain = definition("report", CronSchedule("0 3 * * *", ATHENS))
    late = definition("report", CronSchedule("0 3 * * *", ATHENS, dst="once_last"))
    assert dict(plain.spec) == {"cron": "0 3 * * *", "tz": ATHENS}
    assert dict(late.spec) == {"cron": "0 3 * * *", "tz": ATHENS, "dst": "once_last,shift"}
    assert plain.digest != late.digest
    # Without dst the definition, and so its digest, is what earlier versions wrote.
    assert plain.schedule == "cron 0 3 * * * Europe/Athens"


def test_the_next_slot_is_rebuilt_with_the_recorded_dst() -> None:
    late = definition("report", CronSchedule("0 3 * * *", ATHENS, dst="once_last"))
    [read] = decode_jobs("i", encode_jobs([late]))
    assert local(read.next_slot(BEFORE_FALL_BACK)) == "2026-10-25T03:00:00+02:00"
    plain = definition("report", CronSchedule("0 3 * * *", ATHENS))
    assert local(plain.next_slot(BEFORE_FALL_BACK)) == "2026-10-25T03:00:00+03:00"
    wild = definition("tick", CronSchedule("*/30 * * * *", ATHENS, dst="once_last"))
    assert local(wild.next_slot(BEFORE_FALL_BACK + 1)) == "2026-10-25T03:00:00+02:00"


@pytest.mark.parametrize("dst", ["sometimes", "both,both", 3, ["both"], {"fall_back": "x"},
                                 "x" * 200])
def test_an_unreadable_dst_is_a_warning_naming_it_never_a_crash(
        dst: object, caplog: pytest.LogCaptureFixture) -> None:
    record = json.dumps({"report": {"schedule": "cron 0 3 * * * Europe/Athens dst=?",
                                    "digest": "d",
                                    "spec": {"cron": "0 3 * * *", "tz": ATHENS, "dst": dst}}})
    [read] = decode_jobs("i", record)
    with caplog.at_level(logging.WARNING, logger="anarchon.fleet"):
        assert read.next_slot(BEFORE_FALL_BACK) is None
    [message] = [r.getMessage() for r in caplog.records if r.name == "anarchon.fleet"]
    assert "job 'report'" in message
    assert f"unknown dst {dst!r}"[:60] in message


def test_instances_that_differ_in_dst_are_reported() -> None:
    now = BEFORE_FALL_BACK
    plain = definition("report", CronSchedule("0 3 * * *", ATHENS))
    late = definition("report", CronSchedule("0 3 * * *", ATHENS, dst="once_last"))
    alive = json.dumps({"version": "0", "started": now, "seen": now, "expires": now + 60_000})
    status, _ = assemble(now, {"a": alive, "b": alive},
                         {"a": encode_jobs([plain]), "b": encode_jobs([late])}, {}, {})
    [job] = status.jobs
    assert job.disagree
    [warning] = status.warnings
    assert "cron 0 3 * * * Europe/Athens on a" in warning
    assert "cron 0 3 * * * Europe/Athens dst=once_last,shift on b" in warning
