"""``anarchon_database_schedules``: beats sending the ``anarchon_django.Schedule`` rows.

The process test runs real ``celery beat -S anarchon_celery:Scheduler`` processes of a
generated Celery app in a Django project (``tests.django.settings`` on a SQLite file of the
test's own, with a short ``SCHEDULES_POLL_MS``); rows are created, edited, disabled and
deleted through the ORM in a separate process while the beats run. The Redis broker's
queue is the ground truth of what was sent.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery  # type: ignore[import-untyped]

from anarchon_celery import Settings
from anarchon_celery.dbschedules import BeatRows
from anarchon_celery.scheduler import _Runner
from anarchon_core import ConfigError, EverySchedule, JobContext
from anarchon_core.sources import SourceChanges, SourcedJob, SourceSync

from .support.helpers import RedisServer, make_scheduler, start_redis, wait_for
from .support.procs import grid_slots
from .test_celery_beats import Fleet

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "dbq"
POLL_MS = 500

SETTINGS_SOURCE = f'''
from tests.django.settings import *  # noqa: F403

ANARCHON = {{"BACKEND": "default", "LEASE_MS": 3_000, "SCHEDULES_POLL_MS": {POLL_MS}}}
'''

APP_SOURCE = '''
import json, os
from datetime import timedelta

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "beatsettings")

from celery import Celery

app = Celery("beatapp", broker=os.environ["BROKER"])
app.conf.update(json.loads(os.environ.get("CONF", "{}")))
app.conf.beat_schedule = {
    name: {"task": spec["task"], "schedule": timedelta(seconds=spec["every"]),
           "args": spec.get("args", ()), "options": spec.get("options", {})}
    for name, spec in json.loads(os.environ["SCHEDULE"]).items()}


@app.task(name="beatapp.tick")
def tick(*args, **kwargs):
    return None
'''


class DjangoFleet(Fleet):
    """Beats of an app in a Django project whose database is a SQLite file in ``workdir``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        (self.workdir / "beatapp.py").write_text(APP_SOURCE)
        (self.workdir / "beatsettings.py").write_text(SETTINGS_SOURCE)

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(DJANGO_SETTINGS_MODULE="beatsettings",
                   ANARCHON_DJANGO_TEST_DIR=str(self.workdir))
        return env

    def django(self, code: str) -> str:
        """Run ``code`` in a Django process of the project (``Schedule`` imported)."""
        script = ("import django\ndjango.setup()\n"
                  "from anarchon_django.models import Schedule\n" + code)
        done = subprocess.run([sys.executable, "-c", script], cwd=self.workdir,
                              env=self.env(), capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def migrate(self) -> None:
        done = subprocess.run([sys.executable, "-m", "django", "migrate", "--noinput",
                               "-v", "0"], cwd=self.workdir, env=self.env(),
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-3000:]

    def log_text(self) -> str:
        return "\n".join(log.read_text(errors="replace") for log in self.logs)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: the Celery broker and the anarchon store at once."""
    server = start_redis(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


def queued(url: str) -> list[dict[str, Any]]:
    """Every message waiting in the queue, oldest first: headers, args and kwargs."""
    with redis.Redis.from_url(url) as client:
        raw = client.lrange(QUEUE, 0, -1)
    out = []
    for item in reversed(raw):
        message = json.loads(item)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append({**message["headers"], "args": args, "kwargs": kwargs})
    return out


def now_ms() -> int:
    return round(time.time() * 1000)


@pytest.mark.slow
def test_two_beats_send_the_celery_rows_and_follow_their_edits(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Two beats on one store: a row created while they run is sent once per slot across
    both; an edit of its kwargs and its disable are picked up within the poll interval; a
    deleted row stops being sent; a one-off row is sent once and disabled. A handler row
    is not the beat's; a row the beat cannot schedule, and one named like a beat_schedule
    entry (the entry wins), are warnings."""
    schedule = {"e0": {"task": "beatapp.tick", "every": 1, "args": [0],
                       "options": {"queue": QUEUE}}}
    conf = {"anarchon_lease_ms": 2_000, "anarchon_database_schedules": True,
            "broker_connection_retry_on_startup": True}
    group = DjangoFleet(tmp_path / "app", redis_server.url, schedule, conf)
    try:
        group.migrate()
        group.django(
            "Schedule.objects.create(name='greet-row', target_kind='handler', "
            "target='testapp.greet', every='1s')\n"
            "Schedule.objects.create(name='bad-cron', target_kind='celery', "
            "target='beatapp.tick', cron='61 * * * *')\n"
            "Schedule.objects.create(name='bad-overlap', target_kind='celery', "
            "target='beatapp.tick', every='1s', overlap='cancel_other')\n"
            "Schedule.objects.create(name='e0', target_kind='celery', target='beatapp.tick', "
            "every='1s', kwargs={'row': True}, task_options={'queue': 'dbq'})\n")
        beats = [group.beat(), group.beat()]
        group.wait_connected(beats)
        # Each change is committed somewhere inside its django() call, which starts a
        # Python process: the times before and after the call bound the commit.
        group.django(
            "Schedule.objects.create(name='dbtick', target_kind='celery', "
            "target='beatapp.tick', every='1s', kwargs={'v': 1}, task_options="
            "{'queue': 'dbq', 'headers': {'tenant': 't1'}, 'expires': 60})\n"
            "Schedule.objects.create(name='dbauto', target='beatapp.tick', every='1s', "
            "args=[7], task_options={'queue': 'dbq'})\n"
            "Schedule.objects.create(name='dbonce', target='beatapp.tick', every='2s', "
            "one_off=True, task_options={'queue': 'dbq'})\n")
        created = now_ms()
        time.sleep(4)
        editing = now_ms()
        group.django("Schedule.objects.filter(name='dbtick').update(kwargs={'v': 2})\n")
        edited = now_ms()
        time.sleep(4)
        stopping = now_ms()
        group.django("Schedule.objects.filter(name='dbtick').update(enabled=False)\n"
                     "Schedule.objects.filter(name='dbauto').delete()\n")
        stopped = now_ms()
        time.sleep(3)
        group.stop_all()
        assert not group.errors(), group.errors()
        logs = group.log_text()
        once = group.django("print(Schedule.objects.get(name='dbonce').enabled)")
    finally:
        group.kill_all()
    messages = queued(redis_server.url)
    sent = Counter((m["anarchon_job"], int(m["anarchon_slot"])) for m in messages)
    assert all(n == 1 for n in sent.values()), {k: n for k, n in sent.items() if n > 1}
    settle = POLL_MS + 1_000  # a poll, then the next slot's claim (jitter ≤ 100 ms)

    rows = {m["anarchon_slot"]: m for m in messages if m["anarchon_job"] == "dbtick"}
    expected = set(grid_slots(1_000, created + settle, stopping - 500))
    assert expected, "the test's timeline left no slot to check"
    assert not expected - set(rows), sorted(expected - set(rows))
    for slot, message in rows.items():
        assert message["args"] == []
        assert message["tenant"] == "t1"
        assert message["expires"]
        assert message["anarchon_id"] == f"dbtick@{slot}"
        if slot < editing - 500:
            assert message["kwargs"] == {"v": 1}, (slot, edited, message)
        elif slot > edited + settle:
            assert message["kwargs"] == {"v": 2}, (slot, edited, message)
    assert max(rows) <= stopped + settle, "a disabled row was still sent"

    auto = {m["anarchon_slot"]: m for m in messages if m["anarchon_job"] == "dbauto"}
    assert set(grid_slots(1_000, created + settle, stopping - 500)) <= set(auto)
    assert all(m["args"] == [7] for m in auto.values())
    assert max(auto) <= stopped + settle, "a deleted row was still sent"

    assert [job for job, _ in sent].count("dbonce") == 1
    assert once.strip() == "False"

    entry = [m for m in messages if m["anarchon_job"] == "e0"]
    assert entry
    assert all(m["args"] == [0] and m["kwargs"] == {} for m in entry)
    assert "greet-row" not in sent
    assert "greet-row" not in logs
    assert not {"bad-cron", "bad-overlap"} & {job for job, _ in sent}
    for beat_log in group.logs:
        text = beat_log.read_text(errors="replace")
        assert "schedule 'e0'" in text
        assert "a beat_schedule entry has that name" in text
        assert "schedule 'bad-cron'" in text
        assert "cron:" in text
        assert "schedule 'bad-overlap'" in text
        assert "cancel_other" in text


# ------------------------------------------------------------------ in-process


def test_the_setting_is_a_bool() -> None:
    """``anarchon_database_schedules`` is off by default, and only True or False."""
    app = Celery("dbs", broker="redis://127.0.0.1:1/0", set_as_current=False)
    assert Settings.from_app(app).database_schedules is False
    app.conf.anarchon_database_schedules = True
    assert Settings.from_app(app).database_schedules is True
    app.conf.anarchon_database_schedules = "yes"
    with pytest.raises(ConfigError, match="anarchon_database_schedules 'yes'"):
        Settings.from_app(app)


def _row(key: str, name: str) -> SourcedJob:
    from anarchon_django.dbschedules import ScheduleTarget  # noqa: PLC0415

    return SourcedJob(key, name, f"r{key}", EverySchedule(timedelta(minutes=1)), {},
                      ScheduleTarget(int(key), "celery", "beatapp.tick"))


def test_a_row_named_like_an_entry_waits_until_the_entry_goes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The beat_schedule entry wins over a row of its name; once the entry is gone the row
    is scheduled, and an entry added later takes its name back."""
    core = make_scheduler(tmp_path)
    entries = {"report"}

    async def send(ctx: JobContext, entry: Any, digest: str) -> None:
        return None

    rows = BeatRows(core, send, lambda: entries, threading.RLock(), "the table")
    rows(SourceChanges(put=[_row("1", "report"), _row("2", "other")]))
    assert {job.name for job in core.jobs()} == {"other"}
    assert "schedule 'report' (id 1) is not sent by this beat" in caplog.text
    entries.clear()
    rows.entries_changed()
    assert {job.name for job in core.jobs()} == {"other", "report"}
    entries.add("other")
    rows.yield_name("other")
    assert {job.name for job in core.jobs()} == {"report"}
    entries.clear()
    rows.entries_changed()
    assert {job.name for job in core.jobs()} == {"other", "report"}
    rows(SourceChanges(dropped=["1", "2"]))
    assert core.jobs() == []


class _DownTable:
    """A job source whose database does not answer."""

    description = "a table that is down"

    def __init__(self) -> None:
        self.calls = 0

    def changed_since(self, since_ms: float | None) -> dict[str, str]:
        self.calls += 1
        raise OSError("database down")

    def count(self) -> int:
        raise OSError("database down")

    def load(self, keys: Any) -> list[SourcedJob | str]:
        raise OSError("database down")


def test_a_database_that_is_down_neither_stops_nor_delays_the_beat(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The first load fails: the beat's scheduler starts all the same, and the table is
    polled again every interval (each failure logged, none ending the polling)."""
    core = make_scheduler(tmp_path)
    table = _DownTable()
    runner = _Runner(core, (SourceSync(table, lambda changes: None, interval_s=0.05),))
    runner.start()
    try:
        wait_for(lambda: core.running and table.calls >= 4, timeout=20,
                 what="the scheduler running and the table polled again")
    finally:
        runner.stop(10)
    assert not core.running
    assert "the first load" in caplog.text
    assert "database down" in caplog.text
