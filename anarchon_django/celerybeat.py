"""django-celery-beat's periodic tasks as :class:`~anarchon_django.models.Schedule` rows.

``manage.py anarchon import-celery-beat`` calls :func:`import_periodic_tasks`: each
``PeriodicTask`` row becomes a ``Schedule`` row that sends the same Celery task by name
(``target_kind = "celery"``), with a report per row of what was taken as it is, what
anarchon does differently and what was dropped, and why. A row anarchon cannot run the
way celery beat does (a clocked or solar schedule, arguments that are not JSON...) is
refused with the reason; a name that exists already is skipped, never updated.

:func:`convert` maps one row without touching the database.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction

from anarchon_core import ConfigError
from anarchon_core.schedules import CronSchedule, cron_list, zone_name

from . import registry

if TYPE_CHECKING:
    from .models import Schedule

__all__ = ["APP_LABEL", "ImportReport", "RowReport", "convert", "import_periodic_tasks",
           "periodic_task_model"]

log = logging.getLogger("anarchon.django.celerybeat")

#: django-celery-beat's app label (in ``INSTALLED_APPS`` as ``django_celery_beat``).
APP_LABEL = "django_celery_beat"
#: django-celery-beat's interval periods as anarchon duration units.
_UNITS = {"days": "d", "hours": "h", "minutes": "m", "seconds": "s"}
#: The crontab fields in cron order: field, smallest and largest value.
_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31),
                ("month_of_year", 1, 12), ("day_of_week", 0, 6))
_SHOWN = 60
_CHUNK = 500
_DROPPED_RUNS = "anarchon keeps its runs in its own store and counts slots from now"


class _RefusedError(Exception):
    """A row anarchon cannot take; the message says why."""


@dataclass
class RowReport:
    """What became of one ``PeriodicTask`` row.

    ``outcome`` is ``imported`` (or would be, in a dry run), ``skipped`` (the name
    exists), ``refused`` (anarchon cannot run it as celery beat does: ``reason`` says
    why) or ``failed`` (the database refused the write). ``taken``, ``different`` and
    ``dropped`` list the fields, each with what became of it.
    """

    name: str
    pk: int
    outcome: str = "imported"
    reason: str = ""
    taken: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    row: Schedule | None = None

    def lines(self, *, dry_run: bool = False) -> list[str]:
        """The report's lines for this row: a heading, then taken, different, dropped."""
        verb = {"imported": "would import" if dry_run else "imported",
                "skipped": "would skip" if dry_run else "skipped",
                "refused": "would refuse" if dry_run else "refused"}.get(self.outcome,
                                                                         self.outcome)
        head = f"{verb} {self.name!r} (periodic task {self.pk})"
        out = [f"{head}: {self.reason}" if self.reason else head]
        if self.outcome != "imported":
            return out
        for label, items in (("taken", self.taken), ("maps differently", self.different),
                             ("dropped", self.dropped)):
            if items:
                out.append(f"  {label}: {'; '.join(items)}")
        return out


@dataclass
class ImportReport:
    """The rows of one import, in name order, and the options it ran with."""

    rows: list[RowReport]
    dry_run: bool = False
    disabled: bool = False

    def count(self, outcome: str) -> int:
        """How many rows had ``outcome``."""
        return sum(1 for r in self.rows if r.outcome == outcome)

    @property
    def ok(self) -> bool:
        """Whether every row was imported or skipped (none refused, none failed)."""
        return not (self.count("refused") or self.count("failed"))

    def lines(self) -> Iterator[str]:
        """Every row's lines, then the summary."""
        for row in self.rows:
            yield from row.lines(dry_run=self.dry_run)
        yield self.summary()

    def summary(self) -> str:
        """One line: how many rows, how many of each outcome."""
        imported = "would be imported" if self.dry_run else "imported"
        text = (f"{len(self.rows)} periodic task(s): {self.count('imported')} {imported}, "
                f"{self.count('skipped')} skipped (the name exists), "
                f"{self.count('refused')} refused, {self.count('failed')} failed")
        notes = [n for n, on in (("dry run: nothing written", self.dry_run),
                                 ("--disabled: every row imported disabled", self.disabled))
                 if on]
        return f"{text} ({'; '.join(notes)})" if notes else text


def periodic_task_model() -> Any:
    """django-celery-beat's ``PeriodicTask`` model; ConfigError if the app is not installed."""
    if not apps.is_installed(APP_LABEL):
        raise ConfigError("django_celery_beat is not in INSTALLED_APPS: the import reads "
                          "its PeriodicTask table (pip install django-celery-beat)")
    return apps.get_model(APP_LABEL, "PeriodicTask")


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 1]}…"


def _json(task: Any, name: str, default: Any, kind: type) -> Any:
    text = getattr(task, name)
    if text is None or not text.strip():
        return default
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _RefusedError(f"{name} is not valid JSON ({exc}): {_shown(text)!r}") from None
    if not isinstance(value, kind):
        expected = "a JSON list" if kind is list else "a JSON object"
        raise _RefusedError(f"{name} is not {expected}: {_shown(text)!r}")
    return value


def _interval(task: Any, report: RowReport) -> dict[str, str]:
    every, period = task.interval.every, task.interval.period
    if not isinstance(every, int) or every < 1:
        raise _RefusedError(f"interval every {every!r} {period}: expected 1 or more")
    if period == "microseconds":
        if every % 1000:
            raise _RefusedError(f"interval every {every} microseconds: anarchon counts whole "
                           "milliseconds")
        text = f"{every // 1000}ms"
    elif period in _UNITS:
        text = f"{every}{_UNITS[period]}"
    else:
        raise _RefusedError(f"interval period {period!r}: expected days, hours, minutes, "
                       "seconds or microseconds")
    report.taken.append(f"interval every {every} {period} → every {text!r}")
    report.different.append(
        f"interval: anarchon's every {text} runs on a grid counted from 1970-01-01 00:00 "
        f"UTC, the same slots on every worker; celery beat counts {every} {period} from "
        "the last run")
    return {"every": text}


#: The core's name of each cron field, by position.
_FIELD_NAMES = ("minute", "hour", "day", "month", "day_of_week")


def _cron_reading(text: str, position: int) -> set[int] | None:
    """The values the core's cron schedule reads in ``text`` at ``position``, or None."""
    fields = ["*"] * 5
    fields[position] = text
    try:
        read = CronSchedule(" ".join(fields)).fields()
    except ConfigError:
        return None
    if read.last_day or read.weekday_positions:
        return None
    return set(read.values(_FIELD_NAMES[position]))


def _crontab(task: Any, report: RowReport) -> dict[str, str]:
    from celery.schedules import crontab  # type: ignore[import-untyped]  # noqa: PLC0415

    tab = task.crontab
    texts = {name: str(getattr(tab, name) if getattr(tab, name) is not None else "*")
             for name, _, _ in _CRON_FIELDS}
    given = " ".join(texts[name] for name, _, _ in _CRON_FIELDS)
    try:
        parsed = crontab(**texts)
    except Exception as exc:  # noqa: BLE001 - Celery's parser raises several kinds
        raise _RefusedError(f"crontab {given!r}: Celery refuses it ({exc}), so celery beat "
                       "never ran it either") from None
    out: list[str] = []
    for position, (name, low, high) in enumerate(_CRON_FIELDS):
        # Celery's reading of the field (Sunday is 0) is what celery beat ran: the cron
        # field says the same, in the text given when cron reads it the same way.
        values = sorted(getattr(parsed, name))
        text = "".join(texts[name].split())
        if values == list(range(low, high + 1)):
            text = "*"
        elif _cron_reading(text, position) != set(values):
            text = cron_list(values, min_range=3)
        out.append(text)
    if out[2] != "*" and out[4] != "*":
        raise _RefusedError(
            f"crontab {given!r} restricts both day_of_month and day_of_week: Celery runs "
            "on the days that match both, cron on the days that match either")
    cron = " ".join(out)
    zone = zone_name(tab.timezone)
    zone = zone if isinstance(zone, str) else str(tab.timezone)
    report.taken.append(f"crontab {given!r} {zone} → cron {cron!r}, tz {zone!r}")
    if not getattr(settings, "DJANGO_CELERY_BEAT_TZ_AWARE", True):
        from celery import current_app  # type: ignore[import-untyped]  # noqa: PLC0415

        app_zone = zone_name(current_app.timezone)
        if isinstance(app_zone, str) and app_zone != zone:
            report.different.append(
                f"tz: DJANGO_CELERY_BEAT_TZ_AWARE is False, so celery beat read the crontab "
                f"in the Celery app's time zone {app_zone}, not {zone}: tz {app_zone!r}")
            zone = app_zone
    return {"cron": cron, "tz": zone}


def _timing(task: Any, report: RowReport) -> dict[str, str]:
    kinds = [k for k in ("interval", "crontab", "solar", "clocked")
             if getattr(task, f"{k}_id") is not None]
    if not kinds:
        raise _RefusedError("no schedule: none of interval, crontab, solar, clocked is set")
    if len(kinds) > 1:
        raise _RefusedError(f"more than one schedule ({', '.join(kinds)}): celery beat allows one")
    if kinds[0] == "interval":
        return _interval(task, report)
    if kinds[0] == "crontab":
        return _crontab(task, report)
    if kinds[0] == "solar":
        solar = task.solar
        raise _RefusedError(f"a solar schedule ({solar.event} at {solar.latitude}, "
                       f"{solar.longitude}): anarchon has no sunrise or sunset schedules")
    raise _RefusedError(f"a clocked schedule (once at {task.clocked.clocked_time.isoformat()}): "
                   "anarchon has no schedule for a single moment (a cron at that minute "
                   "with one_off and start_at does the same)")


def _task_options(task: Any, report: RowReport) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name in ("queue", "exchange", "routing_key"):
        value = getattr(task, name)
        if value:
            options[name] = value
    if task.priority is not None:
        options["priority"] = task.priority
    headers = _json(task, "headers", {}, dict)
    if headers:
        options["headers"] = headers
    for name, value in options.items():
        report.taken.append(f"{name} {_shown(value)} → task_options.{name}")
    if task.expires is not None:
        # celery beat sends each message with the schedule's end as its expiry too.
        options["expires"] = task.expires.isoformat()
        report.taken.append(f"expires {task.expires.isoformat()} → expires_at, and "
                            "task_options.expires (each message expires then, as celery "
                            "beat sent it)")
        if task.expire_seconds:
            report.dropped.append(f"expire_seconds {task.expire_seconds}: expires is set "
                                  "too, and celery beat gave messages that expiry instead")
    elif task.expire_seconds:
        options["expires"] = task.expire_seconds
        report.taken.append(f"expire_seconds {task.expire_seconds} → task_options.expires")
    report.dropped.append("the periodic_task_name header celery beat adds to each message "
                          "(add it to task_options.headers if a task reads it)")
    return options


def convert(task: Any, *, disabled: bool = False) -> RowReport:
    """``task`` (a ``PeriodicTask``) as an unsaved, checked ``Schedule``, in a report.

    Writes nothing. The report's ``row`` is the ``Schedule`` when the outcome is
    ``imported``; ``refused`` says why it is not. ``disabled`` imports it disabled.
    """
    from .models import Schedule  # noqa: PLC0415 - needs the app registry

    report = RowReport(str(task.name), int(task.pk))
    try:
        values: dict[str, Any] = {"name": task.name, "target_kind": "celery",
                                  "target": task.task}
        report.taken.append(f"task {task.task!r} → target (kind celery)")
        values.update(_timing(task, report))
        values["args"] = _json(task, "args", [], list)
        values["kwargs"] = _json(task, "kwargs", {}, dict)
        for name in ("args", "kwargs"):
            if values[name]:
                report.taken.append(f"{name} {_shown(values[name])}")
        values["task_options"] = _task_options(task, report)
        values["one_off"] = bool(task.one_off)
        ran = bool(task.one_off) and (task.total_run_count or 0) > 0
        if task.one_off:
            report.taken.append("one_off")
        values["start_at"] = task.start_time
        values["expires_at"] = task.expires
        if task.start_time is not None:
            report.taken.append(f"start_time {task.start_time.isoformat()} → start_at")
        values["enabled"] = bool(task.enabled) and not disabled and not ran
        if ran and task.enabled:
            report.different.append(
                f"enabled: a one-off that ran already ({task.total_run_count} time(s)), "
                "which celery beat disables before it runs again: imported disabled")
        elif disabled and task.enabled:
            report.different.append("enabled: imported disabled (--disabled): enable it "
                                    "once celery beat is stopped")
        else:
            report.taken.append(f"enabled {bool(task.enabled)}")
        values["description"] = task.description or ""
        if values["description"]:
            report.taken.append("description")
        report.dropped.append(
            f"last_run_at {task.last_run_at.isoformat() if task.last_run_at else 'never'}, "
            f"total_run_count {task.total_run_count}, date_changed: {_DROPPED_RUNS}")
        row = Schedule(**values)
        _check(row)
    except _RefusedError as exc:
        return RowReport(report.name, report.pk, "refused", str(exc))
    report.row = row
    return report


def _check(row: Schedule) -> None:
    # The checks of the admin, but for the target's: a Celery task this process does not
    # know is fine (target_kind "celery" sends it by name, resolve() accepts it).
    try:
        row.full_clean(validate_unique=False)
    except ValidationError as exc:
        if not hasattr(exc, "error_dict"):
            raise _RefusedError(" ".join(exc.messages)) from None
        raise _RefusedError("; ".join(f"{name}: {' '.join(messages)}"
                                      for name, messages in exc.message_dict.items())
                            ) from None


def _existing(names: list[str]) -> set[str]:
    from .models import Schedule  # noqa: PLC0415

    found: set[str] = set()
    for start in range(0, len(names), _CHUNK):
        found.update(Schedule.objects.filter(name__in=names[start:start + _CHUNK])
                     .values_list("name", flat=True))
    return found


def import_periodic_tasks(*, dry_run: bool = False, disabled: bool = False) -> ImportReport:
    """Copy every ``PeriodicTask`` row into a new ``Schedule`` row; the report.

    A name that exists in ``Schedule`` is skipped (the row is left as it is); a name
    declared in code is refused (the code's job keeps it). Each row is written on its
    own: one the database refuses is ``failed`` and the others go on. ``dry_run`` writes
    nothing and reports the same; ``disabled`` imports every row disabled.
    """
    model = periodic_task_model()
    tasks = list(model.objects.select_related("interval", "crontab", "solar", "clocked")
                 .order_by("name"))
    taken = _existing([str(t.name) for t in tasks])
    declared = {d.name for d in registry.declarations()}
    report = ImportReport([], dry_run=dry_run, disabled=disabled)
    for task in tasks:
        if task.name in taken:
            report.rows.append(RowReport(task.name, task.pk, "skipped",
                                         f"a schedule named {task.name!r} exists already "
                                         "(left as it is)"))
            continue
        if task.name in declared:
            report.rows.append(RowReport(task.name, task.pk, "refused",
                                         f"a job declared in code is named {task.name!r} "
                                         "(the code's job keeps the name)"))
            continue
        try:
            row_report = convert(task, disabled=disabled)
        except Exception as exc:  # noqa: BLE001 - a hostile row must not stop the others
            row_report = RowReport(task.name, task.pk, "failed",
                                   f"{type(exc).__name__}: {exc}")
        report.rows.append(row_report)
        if row_report.row is None or dry_run:
            continue
        try:
            with transaction.atomic():
                row_report.row.save()
        except DatabaseError as exc:
            row_report.outcome = "failed"
            row_report.reason = f"the database refused the row: {exc}"
    log.info("celery beat import%s: %s", " (dry run)" if dry_run else "", report.summary())
    return report
