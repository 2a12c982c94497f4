"""``manage.py anarchon import-celery-beat``: django-celery-beat's periodic tasks as Schedule
rows, against django-celery-beat's own models and migrations in the test database."""

from __future__ import annotations

import importlib.util
import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import django
import pytest

if importlib.util.find_spec("django_celery_beat") is None and django.VERSION >= (6, 1):
    pytest.skip("django-celery-beat 2.9 requires Django<6.1 (not installed beside 6.1)",
                allow_module_level=True)

from celery import Celery, current_app
from django.core.management import CommandError, call_command
from django.db import IntegrityError
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from anarchon_core import CronSchedule, EverySchedule
from anarchon_django import celerybeat
from anarchon_django.dbschedules import handler_for, job_for
from anarchon_django.models import Schedule

pytestmark = pytest.mark.django_db(databases=["default"])


def unique(prefix: str = "beat") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def periodic(schedule: Any = None, **fields: Any) -> PeriodicTask:
    if schedule is None:
        schedule = IntervalSchedule.objects.create(every=5, period="minutes")
    kind = {IntervalSchedule: "interval", CrontabSchedule: "crontab",
            SolarSchedule: "solar", ClockedSchedule: "clocked"}[type(schedule)]
    values = {"name": unique(), "task": "shop.tasks.report", kind: schedule, **fields}
    return PeriodicTask.objects.create(**values)


def crontab(**fields: Any) -> CrontabSchedule:
    return CrontabSchedule.objects.create(**{"minute": "0", "hour": "4", **fields})


def run(*args: str) -> tuple[list[str], CommandError | None]:
    out = io.StringIO()
    try:
        call_command("anarchon", "import-celery-beat", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue().splitlines(), exc
    return out.getvalue().splitlines(), None


def block(lines: list[str], name: str) -> list[str]:
    """The report lines of the row ``name``: its heading and the indented lines under it."""
    for i, line in enumerate(lines):
        if f"{name!r} (periodic task" in line:
            end = i + 1
            while end < len(lines) and lines[end].startswith("  "):
                end += 1
            return lines[i:end]
    raise AssertionError(f"no report line for {name!r} in {lines}")


def imported(name: str) -> Schedule:
    return Schedule.objects.get(name=name)


# ---------------------------------------------------------------- intervals


@pytest.mark.parametrize(("every", "period", "expected"), [
    (2, "days", "2d"), (3, "hours", "3h"), (90, "minutes", "90m"), (30, "seconds", "30s"),
    (250_000, "microseconds", "250ms"),
])
def test_each_interval_period_becomes_every(every: int, period: str, expected: str) -> None:
    task = periodic(IntervalSchedule.objects.create(every=every, period=period))
    lines, error = run()
    assert error is None
    row = imported(task.name)
    assert (row.every, row.cron, row.target_kind, row.target) == (
        expected, "", "celery", "shop.tasks.report")
    assert EverySchedule(expected).interval_ms == \
        timedelta(**{period: every}) // timedelta(milliseconds=1)
    text = "\n".join(block(lines, task.name))
    assert f"taken: task 'shop.tasks.report' → target (kind celery); interval every " \
           f"{every} {period} → every {expected!r}" in text
    assert f"maps differently: interval: anarchon's every {expected} runs on a grid " \
           "counted from 1970-01-01 00:00 UTC" in text
    assert f"celery beat counts {every} {period} from the last run" in text


def test_an_interval_below_a_millisecond_is_refused() -> None:
    task = periodic(IntervalSchedule.objects.create(every=1500, period="microseconds"))
    lines, error = run()
    assert block(lines, task.name) == [
        f"refused {task.name!r} (periodic task {task.pk}): interval every 1500 "
        "microseconds: anarchon counts whole milliseconds"]
    assert error is not None
    assert error.returncode == 1
    assert not Schedule.objects.filter(name=task.name).exists()


# ---------------------------------------------------------------- crontabs


def test_a_crontab_keeps_its_text_and_time_zone() -> None:
    tab = crontab(minute="*/15", hour="8-18", day_of_week="mon-fri",
                  timezone=ZoneInfo("America/New_York"))
    task = periodic(tab)
    lines, error = run()
    assert error is None
    row = imported(task.name)
    assert (row.cron, row.tz, row.every) == ("*/15 8-18 * * mon-fri", "America/New_York", "")
    assert "crontab '*/15 8-18 * * mon-fri' America/New_York → cron '*/15 8-18 * * " \
           "mon-fri', tz 'America/New_York'" in block(lines, task.name)[1]


@pytest.mark.parametrize(("day_of_week", "cron_field", "weekdays"), [
    ("0", "0", {6}),                # Sunday is 0 for Celery and for cron
    ("sun", "sun", {6}),
    ("6", "6", {5}),                # Saturday
    ("monday", "1", {0}),           # Celery reads a day's name; cron only its abbreviation
    ("5-1", "5-1", {4, 5, 6, 0}),   # a range round the week's end, for both
    ("*/2", "*/2", {6, 1, 3, 5}),   # the days divisible by two: Sun, Tue, Thu, Sat
])
def test_day_of_week_numbering_is_celerys(day_of_week: str, cron_field: str,
                                          weekdays: set[int]) -> None:
    task = periodic(crontab(day_of_week=day_of_week, timezone=ZoneInfo("Europe/Athens")))
    _, error = run()
    assert error is None
    row = imported(task.name)
    assert row.cron == f"0 4 * * {cron_field}"
    schedule = CronSchedule(row.cron, row.tz)
    slot = int(datetime(2027, 3, 1, tzinfo=UTC).timestamp() * 1000)
    seen = set()
    for _ in range(len(weekdays) * 3):
        slot = schedule.next_after(slot)
        moment = datetime.fromtimestamp(slot / 1000, ZoneInfo(row.tz))
        assert (moment.hour, moment.minute) == (4, 0)
        seen.add(moment.weekday())
    assert seen == weekdays


def test_a_full_field_is_a_star_and_spaces_go() -> None:
    task = periodic(crontab(minute="0, 30", hour="0-23", day_of_month="1-31",
                            day_of_week="1"))
    run()
    # "1-31" is every day: written "*", else cron would run on every day OR Monday.
    assert imported(task.name).cron == "0,30 * * * 1"


@pytest.mark.parametrize(("fields", "reason"), [
    ({"day_of_week": "7"}, "Celery refuses it (Invalid end range: 7 > 6.), so celery beat "
                           "never ran it either"),
    ({"day_of_week": "1", "day_of_month": "1-7"},
     "restricts both day_of_month and day_of_week: Celery runs on the days that match "
     "both, cron on the days that match either"),
])
def test_a_crontab_cron_reads_otherwise_is_refused(fields: dict[str, str], reason: str) -> None:
    task = periodic(crontab(**fields))
    lines, error = run()
    assert reason in block(lines, task.name)[0]
    assert block(lines, task.name)[0].startswith(f"refused {task.name!r}")
    assert error is not None
    assert error.returncode == 1


def test_crontab_in_the_celery_apps_zone_when_not_tz_aware(settings: Any) -> None:
    settings.DJANGO_CELERY_BEAT_TZ_AWARE = False
    task = periodic(crontab(timezone=ZoneInfo("Asia/Tokyo")))
    lines, _ = run()
    zone = str(current_app.timezone)
    assert zone != "Asia/Tokyo"
    assert imported(task.name).tz == zone
    assert f"DJANGO_CELERY_BEAT_TZ_AWARE is False, so celery beat read the crontab in the " \
           f"Celery app's time zone {zone}, not Asia/Tokyo" in "\n".join(block(lines, task.name))


# ---------------------------------------------------------------- refused kinds


def test_clocked_and_solar_are_refused() -> None:
    at = datetime(2027, 5, 1, 9, 30, tzinfo=UTC)
    clocked = periodic(ClockedSchedule.objects.create(clocked_time=at), one_off=True)
    solar = periodic(SolarSchedule.objects.create(event="sunrise", latitude="37.98",
                                                  longitude="23.72"))
    lines, error = run()
    assert block(lines, clocked.name) == [
        f"refused {clocked.name!r} (periodic task {clocked.pk}): a clocked schedule (once at "
        "2027-05-01T09:30:00+00:00): anarchon has no schedule for a single moment (a cron "
        "at that minute with one_off and start_at does the same)"]
    assert block(lines, solar.name) == [
        f"refused {solar.name!r} (periodic task {solar.pk}): a solar schedule (sunrise at "
        "37.980000, 23.720000): anarchon has no sunrise or sunset schedules"]
    assert lines[-1] == "2 periodic task(s): 0 imported, 0 skipped (the name exists), " \
                        "2 refused, 0 failed"
    assert error is not None
    assert error.returncode == 1
    assert str(error) == "2 periodic task(s) not imported (see above)"
    assert not Schedule.objects.exists()


def test_no_schedule_or_two_are_refused() -> None:
    none = periodic()
    two = periodic()
    PeriodicTask.objects.filter(pk=none.pk).update(interval=None)
    PeriodicTask.objects.filter(pk=two.pk).update(crontab=crontab())
    lines, _ = run()
    assert "no schedule: none of interval, crontab, solar, clocked is set" in \
        block(lines, none.name)[0]
    assert "more than one schedule (interval, crontab): celery beat allows one" in \
        block(lines, two.name)[0]


@pytest.mark.parametrize(("fields", "reason"), [
    ({"args": "[1, 2"}, "args is not valid JSON (Expecting ',' delimiter: line 1 column 6 "
                        "(char 5)): '[1, 2'"),
    ({"kwargs": "{'who': 1}"}, "kwargs is not valid JSON"),
    ({"args": '{"a": 1}'}, "args is not a JSON list: '{\"a\": 1}'"),
    ({"kwargs": "[1]"}, "kwargs is not a JSON object: '[1]'"),
    ({"headers": "nope"}, "headers is not valid JSON"),
])
def test_arguments_that_are_not_json_are_refused(fields: dict[str, str], reason: str) -> None:
    task = periodic(**fields)
    lines, error = run()
    assert block(lines, task.name)[0].startswith(f"refused {task.name!r}")
    assert reason in block(lines, task.name)[0]
    assert error is not None
    assert error.returncode == 1
    assert not Schedule.objects.filter(name=task.name).exists()


def test_a_name_anarchon_refuses_is_refused() -> None:
    task = periodic(name="  padded")
    lines, _ = run()
    assert "name: invalid job name '  padded'" in block(lines, task.name)[0]


def test_an_unknown_celery_task_is_taken_but_not_a_blank_one() -> None:
    unknown = periodic(task="other.service.tasks.nobody_here_knows")
    blank = periodic(task="")
    lines, _ = run()
    assert imported(unknown.name).target == "other.service.tasks.nobody_here_knows"
    assert block(lines, blank.name) == [
        f"refused {blank.name!r} (periodic task {blank.pk}): target: This field cannot be "
        "blank."]


def test_the_arguments_of_a_known_celery_task_are_checked() -> None:
    previous = current_app._get_current_object()
    app = Celery("import-args", set_as_current=True)

    @app.task(name="tests.import_beat.add")
    def add(x: int, y: int) -> int:
        return x + y

    good = periodic(task="tests.import_beat.add", args="[1, 2]")
    bad = periodic(task="tests.import_beat.add", args="[1, 2, 3]")
    try:
        lines, _ = run()
    finally:
        previous.set_current()
    assert imported(good.name).args == [1, 2]
    assert block(lines, bad.name)[0].startswith(
        f"refused {bad.name!r} (periodic task {bad.pk}): args: the arguments do not fit")


def test_a_name_declared_in_code_is_refused() -> None:
    task = periodic(name="testapp.note")
    lines, _ = run()
    assert block(lines, task.name)[0] == (
        f"refused 'testapp.note' (periodic task {task.pk}): a job declared in code is "
        "named 'testapp.note' (the code's job keeps the name)")


# ---------------------------------------------------------------- the other fields


def test_arguments_options_and_bounds_are_taken() -> None:
    start = datetime(2027, 1, 1, 8, tzinfo=UTC)
    end = datetime(2027, 6, 1, tzinfo=UTC)
    task = periodic(args=json.dumps([1, "two"]), kwargs=json.dumps({"who": "ana"}),
                    queue="reports", exchange="beat", routing_key="reports.daily",
                    priority=0, headers=json.dumps({"tenant": "t1"}), one_off=True,
                    start_time=start, expires=end, description="Daily report",
                    last_run_at=datetime(2026, 12, 1, tzinfo=UTC), total_run_count=0)
    lines, error = run()
    assert error is None
    row = imported(task.name)
    assert (row.args, row.kwargs) == ([1, "two"], {"who": "ana"})
    assert row.task_options == {"queue": "reports", "exchange": "beat",
                                "routing_key": "reports.daily", "priority": 0,
                                "headers": {"tenant": "t1"}, "expires": end.isoformat()}
    assert (row.one_off, row.start_at, row.expires_at, row.enabled) == (True, start, end, True)
    assert row.description == "Daily report"
    assert (row.timeout_ms, row.overlap, row.max_attempts) == (None, "", None)
    text = block(lines, task.name)
    assert text[0] == f"imported {task.name!r} (periodic task {task.pk})"
    assert text[1] == (
        "  taken: task 'shop.tasks.report' → target (kind celery); interval every 5 minutes "
        "→ every '5m'; args [1, \"two\"]; kwargs {\"who\": \"ana\"}; queue reports → "
        "task_options.queue; exchange beat → task_options.exchange; routing_key "
        "reports.daily → task_options.routing_key; priority 0 → task_options.priority; "
        "headers {\"tenant\": \"t1\"} → task_options.headers; expires "
        "2027-06-01T00:00:00+00:00 → expires_at, and task_options.expires (each message "
        "expires then, as celery beat sent it); one_off; start_time "
        "2027-01-01T08:00:00+00:00 → start_at; enabled True; description")
    assert text[3] == (
        "  dropped: the periodic_task_name header celery beat adds to each message (add it "
        "to task_options.headers if a task reads it); last_run_at 2026-12-01T00:00:00+00:00, "
        "total_run_count 0, date_changed: anarchon keeps its runs in its own store and "
        "counts slots from now")


def test_expire_seconds_is_the_messages_expiry() -> None:
    task = periodic(expire_seconds=300)
    lines, _ = run()
    assert imported(task.name).task_options == {"expires": 300}
    assert "expire_seconds 300 → task_options.expires" in block(lines, task.name)[1]


def test_expires_before_start_is_refused() -> None:
    start = datetime(2027, 1, 1, tzinfo=UTC)
    task = periodic(start_time=start, expires=start - timedelta(days=1))
    lines, _ = run()
    assert "expires_at: must be after start_at" in block(lines, task.name)[0]


def test_the_row_sends_the_task_as_celery_beat_did() -> None:
    end = datetime.now(UTC) + timedelta(days=1)
    task = periodic(args="[7]", kwargs='{"who": "ana"}', queue="reports", priority=3,
                    headers='{"tenant": "t1"}', expires=end)
    run()
    row = imported(task.name)
    previous = current_app._get_current_object()
    app = Celery("import-test", broker="memory://", set_as_current=True)
    try:
        job = job_for(row, {})
        send = handler_for(job)

        ctx = SimpleNamespace(meta={}, manual=False)
        send(ctx)
        with app.connection_for_read() as conn:
            message = conn.SimpleQueue("reports").get(timeout=5)
            message.ack()
    finally:
        previous.set_current()
    headers = message.headers
    assert (headers["task"], headers["id"]) == ("shop.tasks.report", ctx.meta["task_id"])
    assert json.loads(message.body)[:2] == [[7], {"who": "ana"}]
    assert headers["tenant"] == "t1"
    assert datetime.fromisoformat(headers["expires"]) == end
    assert message.properties["priority"] == 3


# ---------------------------------------------------------------- enabled, clashes, options


def test_disabled_rows_stay_disabled() -> None:
    on, off = periodic(), periodic(enabled=False)
    lines, _ = run()
    assert imported(on.name).enabled is True
    assert imported(off.name).enabled is False
    assert "enabled False" in block(lines, off.name)[1]


def test_a_one_off_that_ran_is_imported_disabled() -> None:
    task = periodic(one_off=True)
    PeriodicTask.objects.filter(pk=task.pk).update(total_run_count=1)
    lines, _ = run()
    assert imported(task.name).enabled is False
    assert "enabled: a one-off that ran already (1 time(s))" in block(lines, task.name)[2]


def test_disabled_imports_every_row_disabled() -> None:
    tasks = [periodic(), periodic(crontab()), periodic(enabled=False)]
    lines, error = run("--disabled")
    assert error is None
    assert [imported(t.name).enabled for t in tasks] == [False, False, False]
    for task in tasks[:2]:
        different = block(lines, task.name)[2]
        assert different.startswith("  maps differently: ")
        assert "enabled: imported disabled (--disabled): enable it once celery beat is " \
               "stopped" in different
    assert lines[-1] == "3 periodic task(s): 3 imported, 0 skipped (the name exists), " \
                        "0 refused, 0 failed (--disabled: every row imported disabled)"


def test_a_name_that_exists_is_skipped_and_left_alone() -> None:
    task = periodic()
    existing = Schedule.objects.create(name=task.name, target="testapp.greet", every="1h")
    lines, error = run()
    assert error is None  # already there: nothing failed
    assert block(lines, task.name) == [
        f"skipped {task.name!r} (periodic task {task.pk}): a schedule named {task.name!r} "
        "exists already (left as it is)"]
    row = Schedule.objects.get(name=task.name)
    assert (row.target, row.every, row.revision) == ("testapp.greet", "1h", existing.revision)
    assert lines[-1].startswith("1 periodic task(s): 0 imported, 1 skipped")


def test_dry_run_writes_nothing_and_reports_the_same() -> None:
    tasks = [periodic(), periodic(crontab(timezone=ZoneInfo("Europe/Paris"))),
             periodic(SolarSchedule.objects.create(event="sunset", latitude="1",
                                                   longitude="2"))]
    dry, dry_error = run("--dry-run")
    assert not Schedule.objects.exists()
    assert dry[-1] == "3 periodic task(s): 2 would be imported, 0 skipped (the name " \
                      "exists), 1 refused, 0 failed (dry run: nothing written)"
    assert dry_error is not None
    assert dry_error.returncode == 1
    assert str(dry_error) == "1 periodic task(s) would not be imported (see above)"
    real, _ = run()
    assert Schedule.objects.count() == 2
    assert [line.replace("would import", "imported").replace("would refuse", "refused")
            for line in dry[:-1]] == real[:-1]
    assert block(dry, tasks[0].name)[0].startswith(f"would import {tasks[0].name!r}")
    again, again_error = run("--dry-run")
    assert again_error is not None  # the solar row still
    assert block(again, tasks[0].name)[0].startswith(f"would skip {tasks[0].name!r}")


def test_a_write_the_database_refuses_is_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    good, bad = periodic(name=unique("a")), periodic(name=unique("b"))

    def save(self: Schedule, *args: Any, **kwargs: Any) -> None:
        if self.name == bad.name:
            raise IntegrityError("no room")
        original(self, *args, **kwargs)

    original = Schedule.save
    monkeypatch.setattr(Schedule, "save", save)
    lines, error = run()
    assert block(lines, bad.name) == [
        f"failed {bad.name!r} (periodic task {bad.pk}): the database refused the row: no room"]
    assert Schedule.objects.filter(name=good.name).exists()
    assert error is not None
    assert error.returncode == 1
    assert lines[-1].endswith("0 refused, 1 failed")


def test_the_report_is_the_module_api_too() -> None:
    task = periodic()
    report = celerybeat.convert(PeriodicTask.objects.get(pk=task.pk), disabled=True)
    assert report.outcome == "imported"
    assert report.row is not None
    assert report.row.pk is None
    assert report.row.enabled is False
    assert not Schedule.objects.exists()


def test_without_the_app_the_command_says_so(settings: Any) -> None:
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "django_celery_beat"]
    with pytest.raises(CommandError) as caught:
        call_command("anarchon", "import-celery-beat", stdout=io.StringIO())
    assert caught.value.returncode == 2
    assert "django_celery_beat is not in INSTALLED_APPS" in str(caught.value)
