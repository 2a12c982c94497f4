"""``anarchon_celery`` in one process: entries as jobs, settings, what is published, the
beat loop during a store outage. Multi-process runs are in test_celery_beats.py."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import sys
import threading
import time
import types
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery, beat
from celery.schedules import crontab, schedule, solar
from celery.signals import before_task_publish

import anarchon_celery
from anarchon_celery import __main__
from anarchon_core import ConfigError, CronSchedule, EverySchedule
from anarchon_core.logjson import JsonFormatter

from .support.helpers import RedisServer, call_within, free_port, start_redis, wait_for
from .test_celery_beats import redis_server  # noqa: F401 - fixture


def make_app(broker: str, entries: dict[str, dict[str, Any]], **conf: Any) -> Celery:
    app = Celery("t", broker=broker, set_as_current=False)
    app.conf.update(conf)
    app.conf.beat_schedule = entries
    return app


def a_solar() -> solar:
    """A solar schedule without the optional ``ephem`` package (only its type matters)."""
    sun = solar.__new__(solar)
    sun.nowfun, sun._app, sun.event = None, None, "sunrise"
    return sun


def entry(app: Celery, name: str, **fields: Any) -> beat.ScheduleEntry:
    return beat.ScheduleEntry(name=name, app=app, **fields)


# ------------------------------------------------------------------ entries → jobs


def test_intervals_become_every_on_the_epoch_grid() -> None:
    app = make_app("memory://", {})
    spec = anarchon_celery.job_spec(entry(app, "a", task="x", schedule=timedelta(seconds=10)),
                                    app.timezone, {})
    assert (spec.kind, spec.interval) == ("every", timedelta(seconds=10))
    number = anarchon_celery.job_spec(entry(app, "b", task="x", schedule=2.5), app.timezone, {})
    assert number.interval == timedelta(seconds=2.5)
    grid = EverySchedule(number.interval)
    assert grid.next_after(1_000) == 2_500  # the epoch grid, whenever a beat started


@pytest.mark.parametrize(("cron", "expression"), [
    (crontab(), "* * * * *"),
    (crontab(minute="*/15", hour="8-17", day_of_week="mon-fri"), "0,15,30,45 8-17 * * 1-5"),
    (crontab(minute=0, hour=4), "0 4 * * *"),
    (crontab(minute="5", hour="0,12", day_of_month="1-7"), "5 0,12 1-7 * *"),
    (crontab(minute=0, hour=0, month_of_year="*/3", day_of_month=1), "0 0 1 1,4,7,10 *"),
    (crontab(minute=30, day_of_week="sun"), "30 * * * 0"),
])
def test_crontabs_become_the_same_cron_expression(cron: crontab, expression: str) -> None:
    assert anarchon_celery.cron_expression("e", cron) == expression


@pytest.mark.parametrize("fields", [
    {"minute": "*/20", "hour": "9-10", "day_of_week": "mon-fri"},
    {"minute": 0, "hour": "*/6", "day_of_month": "1-3"},
    {"minute": 15, "hour": 4, "month_of_year": "6,7"},
])
def test_crontab_fires_when_celery_fires_it(fields: dict[str, Any]) -> None:
    """On ordinary days the cron slots are the instants Celery's own crontab computes."""
    tz = ZoneInfo("Europe/Athens")
    app = make_app("memory://", {}, timezone="Europe/Athens")
    now = [datetime(2027, 5, 28, 8, 0, tzinfo=tz)]
    cron = crontab(app=app, nowfun=lambda: now[0], **fields)
    spec = anarchon_celery.job_spec(entry(app, "c", task="x", schedule=cron), app.timezone, {})
    assert spec.tz == "Europe/Athens"
    ours = [datetime.fromtimestamp(s / 1000, tz) for s in CronSchedule(
        spec.expression or "", spec.tz).upcoming(int(now[0].timestamp() * 1000), 12)]
    theirs = []
    last = now[0]
    for _ in range(12):
        now[0] = last
        last = (last + cron.remaining_estimate(last)).astimezone(tz)
        theirs.append(last)
    assert ours == theirs


def test_crontab_across_dst_changes_in_the_app_timezone() -> None:
    """America/New_York: 02:30 does not exist on 2027-03-14 (fires once at 03:00 EDT);
    01:30 occurs twice on 2027-11-07 (fires once, at the first)."""
    app = make_app("memory://", {}, timezone="America/New_York")
    tz = app.timezone

    def slots(cron: crontab, start: datetime, count: int) -> list[str]:
        spec = anarchon_celery.job_spec(entry(app, "d", task="x", schedule=cron), tz, {})
        assert spec.tz == "America/New_York"
        computed = CronSchedule(spec.expression or "", spec.tz, spec.dst)
        return [datetime.fromtimestamp(s / 1000, UTC).strftime("%m-%d %H:%M")
                for s in computed.upcoming(int(start.timestamp() * 1000), count)]

    spring = datetime(2027, 3, 13, 12, tzinfo=UTC)
    assert slots(crontab(minute=30, hour=2), spring, 3) == [
        "03-14 07:00", "03-15 06:30", "03-16 06:30"]
    fall = datetime(2027, 11, 6, 12, tzinfo=UTC)
    assert slots(crontab(minute=30, hour=1), fall, 3) == [
        "11-07 05:30", "11-08 06:30", "11-09 06:30"]
    hourly = slots(crontab(minute=0, hour="0-3"), datetime(2027, 11, 7, 3, tzinfo=UTC),
                   4)
    assert hourly == ["11-07 04:00", "11-07 05:00", "11-07 07:00", "11-07 08:00"]
    # Wildcard entries follow the wall clock: both passes of 01:xx, no 02:xx in March.
    night = datetime(2027, 11, 7, 4, 50, tzinfo=UTC)
    assert slots(crontab(minute="*/30"), night, 5) == [
        "11-07 05:00", "11-07 05:30", "11-07 06:00", "11-07 06:30", "11-07 07:00"]
    assert slots(crontab(minute="*/30"), datetime(2027, 3, 14, 6, 10, tzinfo=UTC), 3) == [
        "03-14 06:30", "03-14 07:00", "03-14 07:30"]


@pytest.mark.parametrize(("cron", "expression", "dst"), [
    (crontab(), "* * * * *", "both,skip"),
    (crontab(minute="*/15", hour="1"), "0,15,30,45 1 * * *", "both,skip"),
    (crontab(minute=30, hour="*/2"), "30 0,2,4,6,8,10,12,14,16,18,20,22 * * *", "both,skip"),
    (crontab(minute="0-59", hour="1"), "* 1 * * *", "once_first,shift"),
    (crontab(minute=[0, 30], hour=range(24)), "0,30 * * * *", "once_first,shift"),
    (crontab(minute=30, hour=1), "30 1 * * *", "once_first,shift"),
    (crontab(minute={5, 10}, hour="1-3"), "5,10 1-3 * * *", "once_first,shift"),
])
def test_a_crontab_is_a_wildcard_job_by_its_spelling(cron: crontab, expression: str,
                                                     dst: str) -> None:
    """cron(8) decides by the first character of the minute and hour as written, which
    the built expression no longer shows (``*/15`` → ``0,15,30,45``, ``0-59`` → ``*``)."""
    app = make_app("memory://", {}, timezone="America/New_York")
    spec = anarchon_celery.job_spec(entry(app, "w", task="x", schedule=cron), app.timezone, {})
    assert (spec.expression, spec.dst) == (expression, dst)
    assert spec.describe() == f"cron {expression} America/New_York dst={dst}"
    # 01:00-02:00 occurs twice on 7 November (05:00-07:00Z): a wildcard job runs each of
    # its times there twice, a fixed-time job once.
    schedule = CronSchedule(expression, "America/New_York", dst)
    start, end = (int(datetime(2027, 11, 7, h, tzinfo=UTC).timestamp() * 1000) for h in (5, 7))
    slots = [s for s in schedule.upcoming(start - 1, 130) if s < end]
    walls = {datetime.fromtimestamp(s / 1000, app.timezone).strftime("%H:%M") for s in slots}
    assert len(slots) == (2 if dst.startswith("both") else 1) * len(walls)


def test_the_beat_registers_crontabs_with_their_dst(tmp_path: Path) -> None:
    app = make_app("memory://", {
        "wild": {"task": "x", "schedule": crontab(minute="*/15", hour="9-17")},
        "fixed": {"task": "x", "schedule": crontab(minute=0, hour=3)},
    }, timezone="Europe/Athens", anarchon_backend=f"sqlite:///{tmp_path / 'beat.db'}")
    ours = anarchon_celery.Scheduler(app)
    try:
        assert ours.core is not None
        shown = {job.name: job.schedule for job in ours.core.jobs()}
    finally:
        ours.close()
    assert shown["wild"] == "cron 0,15,30,45 9-17 * * * Europe/Athens dst=both,skip"
    assert shown["fixed"] == "cron 0 3 * * * Europe/Athens dst=once_first,shift"


def test_unsupported_schedules_are_refused_naming_the_entry() -> None:
    app = make_app("memory://", {})
    with pytest.raises(ConfigError, match=r"'sunrise'.*solar"):
        anarchon_celery.job_spec(entry(app, "sunrise", task="x",
                                       schedule=a_solar()),
                                 app.timezone, {})
    with pytest.raises(ConfigError, match=r"'both'.*day_of_month.*day_of_week"):
        anarchon_celery.job_spec(entry(app, "both", task="x",
                                       schedule=crontab(day_of_month=1, day_of_week=1)),
                                 app.timezone, {})

    class Odd(schedule):
        pass

    with pytest.raises(ConfigError, match=r"'odd'.*unsupported schedule Odd"):
        anarchon_celery.job_spec(entry(app, "odd", task="x", schedule=Odd(10)), app.timezone, {})
    with pytest.raises(ConfigError, match=r"'opts'.*unknown anarchon option"):
        anarchon_celery.job_spec(entry(app, "opts", task="x", schedule=10,
                                       options={"anarchon": {"jitter": 5}}), app.timezone, {})


def test_an_entry_picks_its_overlap_policy_but_cannot_cancel_a_sent_task() -> None:
    app = make_app("memory://", {})
    spec = anarchon_celery.job_spec(entry(app, "buffered", task="x", schedule=10, options={
        "anarchon": {"overlap": "buffer_one", "catch_up": "all", "catch_up_ms": 60_000}}),
        app.timezone, {})
    assert spec.options == {"overlap": "buffer_one", "catch_up": "all", "catch_up_ms": 60_000}
    with pytest.raises(ConfigError, match=r"'cancels'.*cancel_other.*already sent"):
        anarchon_celery.job_spec(entry(app, "cancels", task="x", schedule=10,
                                       options={"anarchon": {"overlap": "cancel_other"}}),
                                 app.timezone, {})


def test_the_digest_follows_the_definition_not_the_process() -> None:
    app = make_app("memory://", {})

    def digest(**fields: Any) -> str:
        base = {"task": "x", "schedule": 10, "args": (1,), "options": {"queue": "q"}}
        return anarchon_celery.job_spec(entry(app, "e", **{**base, **fields}),
                                        app.timezone, {}).digest

    assert digest() == digest()
    assert digest(args=(2,)) != digest()
    assert digest(schedule=20) != digest()
    assert digest(options={"queue": "q", "anarchon": {"jitter_ms": 5}}) == digest()


# ------------------------------------------------------------------ settings


def test_settings_default_to_a_redis_broker_and_refuse_others() -> None:
    settings = anarchon_celery.Settings.from_app(make_app("redis://127.0.0.1:6379/3", {}))
    assert settings.backend_url == "redis://127.0.0.1:6379/3"
    assert settings.prefix == "anarchon:celery:"
    with pytest.raises(ConfigError, match=r"anarchon_backend.*not Redis"):
        anarchon_celery.Settings.from_app(make_app("amqp://guest:secret@127.0.0.1//", {}))
    with pytest.raises(ConfigError) as info:
        anarchon_celery.Settings.from_app(make_app("amqp://guest:secret@127.0.0.1//", {}))
    assert "secret" not in str(info.value)
    with pytest.raises(ConfigError, match="anarchon_prefix does not apply"):
        anarchon_celery.Settings.from_app(make_app(
            "memory://", {}, anarchon_backend="postgresql://h/db", anarchon_prefix="x:"))
    with pytest.raises(ConfigError, match="anarchon_lease_ms"):
        anarchon_celery.Settings.from_app(make_app("redis://h", {}, anarchon_lease_ms="5s"))
    with pytest.raises(ConfigError, match="invalid anarchon_metrics_port 70000"):
        anarchon_celery.Settings.from_app(make_app("redis://h", {},
                                                   anarchon_metrics_port=70_000))
    with pytest.raises(ConfigError, match="invalid anarchon_log_format 'yaml': expected "
                                          "'text' or 'json'"):
        anarchon_celery.Settings.from_app(make_app("redis://h", {}, anarchon_log_format="yaml"))
    assert anarchon_celery.Settings.from_app(
        make_app("redis://h", {}, anarchon_log_format="json")).log_format == "json"
    with pytest.raises(ConfigError, match="anarchon_track_tasks needs a lease store"):
        anarchon_celery.Settings.from_app(make_app(
            "memory://", {}, anarchon_backend="amqp://127.0.0.1//",
            anarchon_track_tasks=True)).make_scheduler()


def test_a_bad_entry_stops_the_beat_at_start_with_its_name() -> None:
    app = make_app("memory://", {"sun": {"task": "x", "schedule": a_solar()}},
                   anarchon_backend="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="'sun'"):
        anarchon_celery.Scheduler(app)
    lazy = anarchon_celery.Scheduler(app, lazy=True)  # celery beat's banner: no connection
    assert "anarchon -> redis://127.0.0.1:1/0" in lazy.info
    assert lazy.core is None


def test_a_beat_refused_for_a_bad_entry_serves_no_metrics() -> None:
    port = free_port()
    app = make_app("memory://", {"sun": {"task": "x", "schedule": a_solar()}},
                   anarchon_backend="redis://127.0.0.1:1/0", anarchon_metrics_port=port,
                   anarchon_metrics_addr="127.0.0.1")
    with pytest.raises(ConfigError, match="'sun'"):
        anarchon_celery.Scheduler(app)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the metrics server was left running"


@pytest.mark.parametrize(("conf", "says"), [
    ({"anarchon_heartbeat_ms": 10_000},
     "invalid anarchon_heartbeat_ms 10000: must be smaller than anarchon_lease_ms (10000)"),
    ({"anarchon_lease_ms": 3_000, "anarchon_heartbeat_ms": 5_000},
     "invalid anarchon_heartbeat_ms 5000: must be smaller than anarchon_lease_ms (3000)"),
    ({"anarchon_instance_id": "b" * 500},
     "invalid anarchon_instance_id 'bbb"),
])
def test_scheduler_settings_are_refused_by_their_setting_name(conf: dict[str, Any],
                                                              says: str) -> None:
    settings = anarchon_celery.Settings.from_app(make_app("redis://127.0.0.1:1/0", {}, **conf))
    with pytest.raises(ConfigError) as info:
        settings.make_scheduler()
    assert str(info.value).startswith(says), info.value


# ------------------------------------------------------------------ what is published


class Captured:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.event = threading.Event()

    def __call__(self, sender: Any = None, body: Any = None, exchange: Any = None,
                 routing_key: Any = None, headers: Any = None, properties: Any = None,
                 **_: Any) -> None:
        self.messages.append({"task": sender, "body": body, "exchange": exchange,
                              "routing_key": routing_key, "headers": dict(headers or {}),
                              "properties": dict(properties or {})})
        self.event.set()


@pytest.fixture
def captured() -> Iterator[Captured]:
    capture = Captured()
    before_task_publish.connect(capture, weak=False)
    try:
        yield capture
    finally:
        before_task_publish.disconnect(capture)


def test_entry_args_kwargs_and_options_are_published_as_celery_beat_does(
        redis_server: RedisServer, captured: Captured) -> None:  # noqa: F811
    options = {"queue": "q1", "routing_key": "rk1", "priority": 7, "expires": 30,
               "headers": {"x-custom": "v"}}
    entries = {"e": {"task": "t.add", "schedule": 1.0, "args": (1, "a"),
                     "kwargs": {"k": [1, 2]}, "options": dict(options)}}
    port = free_port()
    app = make_app(redis_server.url, entries, anarchon_lease_ms=2_000,
                   anarchon_metrics_port=port, anarchon_metrics_addr="127.0.0.1")
    ours = anarchon_celery.Scheduler(app)
    try:
        wait_for(lambda: any(m["headers"].get("anarchon_job") == "e"
                             for m in captured.messages))
        # The beat's own metrics, scraped over HTTP (anarchon_metrics_port).
        wait_for(lambda: 'anarchon_claims_total{job="e",outcome="won"}' in urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode())
        sent = next(m for m in captured.messages if m["headers"].get("anarchon_job") == "e")
        runner = ours.core.instance_id if ours.core else ""
        assert ours.core is not None
        wait_for(lambda: any(r.status == "success" for r in ours.core.sync.history("e", 5)))
        run = next(r for r in ours.core.sync.history("e", 5) if r.status == "success")
    finally:
        ours.close()
    captured.messages.clear()
    theirs = beat.Scheduler(app, lazy=True)
    theirs.apply_async(theirs.Entry(name="e", app=app, **entries["e"]), advance=False)
    reference = captured.messages[0]
    assert sent["task"] == reference["task"] == "t.add"
    assert sent["body"][:2] == reference["body"][:2] == ([1, "a"], {"k": [1, 2]})
    assert (sent["exchange"], sent["routing_key"]) == (reference["exchange"],
                                                       reference["routing_key"])
    assert sent["properties"]["priority"] == reference["properties"]["priority"] == 7
    same = ("x-custom", "celery_beat_task", "ignore_result", "retries", "timelimit")
    assert {k: sent["headers"].get(k) for k in same} == \
           {k: reference["headers"].get(k) for k in same}
    expires = [datetime.fromisoformat(m["headers"]["expires"]) for m in (sent, reference)]
    assert abs((expires[1] - expires[0]).total_seconds() - 0) < 30
    # The slot headers a consumer deduplicates on, and history naming beat and task.
    headers = sent["headers"]
    assert headers["anarchon_id"] == f"e@{headers['anarchon_slot']}"
    assert headers["anarchon_attempt"] == 1
    assert headers["anarchon_runner"] == runner
    assert headers["anarchon_slot"] % 1000 == 0
    assert run.slot == headers["anarchon_slot"]
    assert run.runner == runner
    assert run.meta["task_id"] == headers["id"]
    assert run.meta["task"] == "t.add"
    assert entries["e"]["options"] == options  # the entry itself is left as it was


def test_history_command_shows_the_beat_and_task_id_of_each_slot(
        redis_server: RedisServer, captured: Captured, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app(redis_server.url, {"h": {"task": "t.h", "schedule": 1.0}},
                   anarchon_lease_ms=2_000, anarchon_log_format="json")
    module = types.ModuleType("anarchon_history_app")
    module.app = app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    logger = logging.getLogger("anarchon")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    root_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)  # what celery beat -l info sets
    ours = anarchon_celery.Scheduler(app)
    # The beat's own handler, alone on the anarchon logger; its stream read here rather
    # than through capture (another test's capture may still be what it was given).
    [handler] = logger.handlers
    assert isinstance(handler, logging.StreamHandler)
    assert isinstance(handler.formatter, JsonFormatter)
    lines = io.StringIO()
    handler.setStream(lines)
    try:
        assert ours.core is not None
        core = ours.core
        wait_for(lambda: core.running)  # sync calls then run on the beat's own loop
        wait_for(lambda: any(r.status == "success" for r in core.sync.history("h", 5)))
    finally:
        ours.close()
        logger.handlers[:] = saved[0]
        logger.propagate, logger.level = saved[1], saved[2]
        logging.getLogger().setLevel(root_level)
    # anarchon_log_format="json": the beat's lines, one JSON object each.
    logged = [json.loads(line) for line in lines.getvalue().splitlines()]
    ends = [r for r in logged if r.get("job") == "h" and r.get("status") == "success"]
    assert ends, logged
    assert {"slot", "attempt", "runner", "duration_ms"} <= set(ends[0])
    sent = [m["headers"] for m in captured.messages if m["headers"].get("anarchon_job") == "h"]
    assert __main__.main(["history", "-A", f"{module.__name__}:app", "h"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["scheduled", "(UTC)", "job", "attempt", "status",
                                           "ms", "runner", "/", "error", "/", "meta"]
    assert any(f"task_id={h['id']}" in out for h in sent), out
    assert re.search(rf" success +\d* +{re.escape(core.instance_id)}  ", out), out
    assert __main__.main(["history", "-A", f"{module.__name__}:app", "-n", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert __main__.main(["history", "-A", f"{module.__name__}:app", "nope"]) == 2
    assert "no runs of 'nope'; the store holds runs of 1 job(s): h" in capsys.readouterr().err


def test_beat_loop_never_waits_on_an_unreachable_store(
        tmp_path: Path, captured: Captured, caplog: pytest.LogCaptureFixture) -> None:
    """With the store down, beat starts, ticks at once and logs the outage once; when the
    store comes up it says so once and sends the next slots.

    The store stays down until the ticks are done, so a start-up or a tick that waited for
    it would never return: the bounds below only fail such a hang.
    """
    port = free_port()
    app = make_app("memory://", {"e": {"task": "t.x", "schedule": 1.0}},
                   anarchon_backend=f"redis://127.0.0.1:{port}/0", anarchon_lease_ms=2_000)
    caplog.set_level(logging.INFO, logger="anarchon")
    scheduler = call_within(30, lambda: anarchon_celery.Scheduler(app),
                            "beat's start-up with the store down")
    runner = scheduler._runner
    assert runner is not None
    server: RedisServer | None = None

    def ticks() -> list[float]:
        sleeps = []
        for _ in range(20):
            sleeps.append(scheduler.tick())
            time.sleep(0.2)
        return sleeps

    try:
        assert all(s <= 5 for s in call_within(30, ticks, "20 ticks with the store down"))
        assert not captured.messages
        down = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(down) == 1, [r.getMessage() for r in caplog.records]
        server = start_redis(tmp_path / "late", port=port)
        wait_for(lambda: captured.messages, timeout=40)
        assert captured.messages[0]["headers"]["anarchon_job"] == "e"
        assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1
        back = [r for r in caplog.records if "answers again" in r.getMessage()
                or "connected" in r.getMessage()]
        assert len(back) == 1, [r.getMessage() for r in caplog.records]
    finally:
        call_within(60, scheduler.close, "close()")
        if server is not None:
            server.stop()
    # close() stopped the core scheduler; it did not give up waiting for it.
    assert not runner.thread.is_alive()


# ------------------------------------------------------------------ misspelled settings


@pytest.mark.parametrize(("conf", "message"), [
    ({"anarchon_leas_ms": 5_000},
     "unknown anarchon setting 'anarchon_leas_ms': did you mean 'anarchon_lease_ms'?"),
    ({"anarchon_backed": "sqlite:///x.db"},
     "unknown anarchon setting 'anarchon_backed': did you mean 'anarchon_backend'?"),
    ({"anarchon_nothing_like_it": 1}, "unknown anarchon setting 'anarchon_nothing_like_it': "
     "valid: anarchon_backend, anarchon_prefix"),
    ({"ANARCHON_LEASE_MS": 5_000}, "setting 'ANARCHON_LEASE_MS' is never read by Celery in "
     "this form: spell it 'anarchon_lease_ms'"),
])
def test_a_misspelled_setting_is_refused_naming_the_closest(conf: dict[str, Any],
                                                            message: str) -> None:
    app = make_app("redis://127.0.0.1:1/0", {"e": {"task": "x", "schedule": 10.0}}, **conf)
    with pytest.raises(ConfigError) as error:
        anarchon_celery.Settings.from_app(app)
    assert str(error.value).startswith(message)
    with pytest.raises(ConfigError, match=next(iter(conf))):
        anarchon_celery.Scheduler(app)  # beat refuses to start


def namespaced_app(namespace: str, **settings: Any) -> Celery:
    """An app configured as Django projects do: ``config_from_object(settings, namespace)``."""
    app = Celery("t", set_as_current=False)
    app.config_from_object(types.SimpleNamespace(ANARCHON={"BACKEND": "default"}, **settings),
                           namespace=namespace)
    return app


def test_settings_work_in_every_form_celery_reads() -> None:
    app = namespaced_app("CELERY", CELERY_BROKER_URL="memory://",
                         CELERY_ANARCHON_BACKEND="redis://127.0.0.1:6379/5",
                         CELERY_ANARCHON_LEASE_MS=4_000, anarchon_prefix="p:",
                         DEBUG=True)
    settings = anarchon_celery.Settings.from_app(app)
    assert (settings.backend_url, settings.lease_ms, settings.prefix) == (
        "redis://127.0.0.1:6379/5", 4_000, "p:")
    lower = namespaced_app("celery", celery_anarchon_backend="redis://127.0.0.1:6379/6",
                           celery_anarchon_jitter_ms=5)
    settings = anarchon_celery.Settings.from_app(lower)
    assert (settings.backend_url, settings.job_defaults["jitter_ms"]) == (
        "redis://127.0.0.1:6379/6", 5)
    plain = make_app("memory://", {}, anarchon_backend="redis://127.0.0.1:6379/7",
                     anarchon_history_size=10)
    assert anarchon_celery.Settings.from_app(plain).history_size == 10


@pytest.mark.parametrize(("settings", "message"), [
    ({"CELERY_ANARCHON_LEAS_MS": 5_000}, "unknown anarchon setting "
     "'CELERY_ANARCHON_LEAS_MS': did you mean 'CELERY_ANARCHON_LEASE_MS'?"),
    ({"ANARCHON_BACKEND": "redis://h"}, "setting 'ANARCHON_BACKEND' is never read by Celery "
     "in this form: spell it 'CELERY_ANARCHON_BACKEND'"),
])
def test_a_misspelled_namespaced_setting_is_refused(settings: dict[str, Any],
                                                    message: str) -> None:
    app = namespaced_app("CELERY", CELERY_BROKER_URL="redis://127.0.0.1:1/0", **settings)
    with pytest.raises(ConfigError) as error:
        anarchon_celery.Settings.from_app(app)
    assert str(error.value) == message


# ------------------------------------------------------------------ app-level job options


def test_a_bad_app_level_job_option_names_its_setting_not_an_entry() -> None:
    entries = {"e5": {"task": "x", "schedule": 10.0}, "e6": {"task": "y", "schedule": 20.0}}
    app = make_app("redis://127.0.0.1:1/0", entries, anarchon_jitter_ms=-1)
    with pytest.raises(ConfigError) as error:
        anarchon_celery.Scheduler(app)
    assert str(error.value).startswith("anarchon_jitter_ms: invalid jitter_ms -1")
    assert "e5" not in str(error.value)
    app = make_app("redis://127.0.0.1:1/0", entries, anarchon_jitter_ms=2_000,
                   anarchon_max_late_ms=1_000)
    with pytest.raises(ConfigError, match=r"^anarchon_jitter_ms, anarchon_max_late_ms: "
                       r"invalid max_late_ms 1000"):
        anarchon_celery.Scheduler(app)
    app = make_app("memory://", entries, anarchon_backend="amqp://guest:guest@127.0.0.1//",
                   anarchon_catch_up_ms=60_000)
    with pytest.raises(ConfigError) as error:
        anarchon_celery.Scheduler(app)
    assert str(error.value).startswith("anarchon_catch_up_ms need(s) a lease store")
    assert "e5" not in str(error.value)


def test_an_app_level_option_one_entry_refuses_names_both() -> None:
    # 15 s of jitter is fine for the 20 s entry, not for the 10 s one.
    entries = {"e6": {"task": "y", "schedule": 20.0}, "e5": {"task": "x", "schedule": 10.0},
               "own": {"task": "z", "schedule": 10.0,
                       "options": {"anarchon": {"jitter_ms": 100}}}}
    app = make_app("redis://127.0.0.1:1/0", entries, anarchon_jitter_ms=15_000)
    with pytest.raises(ConfigError) as error:
        anarchon_celery.Scheduler(app)
    text = str(error.value)
    assert text.startswith("beat_schedule entry 'e5': invalid jitter_ms 15000")
    assert text.endswith("(set by anarchon_jitter_ms=15000; override it in the entry's "
                         "options['anarchon'])")
