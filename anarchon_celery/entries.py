"""``beat_schedule`` entries as anarchon jobs: their schedule, options and definition digest.

* A ``timedelta`` or number (Celery's ``schedule``) becomes ``every`` on the epoch grid:
  ``timedelta(seconds=10)`` fires at :00, :10, :20 whenever each beat started.
* A ``crontab`` becomes a cron expression in the app's time zone, built from the sets of
  minutes, hours, days and months the crontab itself computed, so every spelling Celery
  accepts (``"*/15"``, ``"mon-fri"``, ranges, lists) maps exactly. Its DST rule is
  cron(8)'s, decided by the spelling (:func:`crontab_dst`), not by the built expression.
* ``solar`` and any other schedule class are refused with the entry's name: their slots
  could not be computed identically by every beat.

An entry's job name in the store is its name in ``beat_schedule``, so a slot is one
record whatever version of the entry a beat runs (see docs/celery.md, "Rolling deploys").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery.schedules import crontab, schedule, solar  # type: ignore[import-untyped]

from anarchon_core import ConfigError
from anarchon_core.schedules import DstRule, cron_list

__all__ = ["ENTRY_OPTIONS_KEY", "JOB_OPTIONS", "JobSpec", "cron_expression", "crontab_dst",
           "entry_job_options", "job_spec", "publish_options"]

#: The key of ``options`` an entry may carry anarchon job options in (never published).
ENTRY_OPTIONS_KEY = "anarchon"
#: Job options an entry may set under ``options["anarchon"]`` (and the app in ``anarchon_*``).
JOB_OPTIONS = ("jitter_ms", "max_late_ms", "catch_up_ms", "catch_up", "max_attempts",
               "overlap")


@dataclass(frozen=True)
class JobSpec:
    """How one entry is registered: ``every`` with an interval, or ``cron`` in a zone."""

    name: str
    kind: str                      # "every" or "cron"
    interval: timedelta | None = None
    expression: str | None = None
    tz: str = "UTC"
    options: Mapping[str, Any] = field(default_factory=dict)
    #: A digest of the entry's task, schedule, args, kwargs and options.
    digest: str = ""
    #: A cron entry's DST rule, ``"<fall_back>,<spring_forward>"`` (see :func:`crontab_dst`).
    dst: str | None = None

    def describe(self) -> str:
        """The schedule as text: ``every 0:00:10``, ``cron 0 8 * * * UTC dst=once_first,shift``."""
        if self.kind == "every":
            return f"every {self.interval}"
        return f"cron {self.expression} {self.tz} dst={self.dst}"


def _field(values: Iterable[int], low: int, high: int) -> str:
    values = set(values)
    return "*" if values >= set(range(low, high + 1)) else cron_list(values)


def cron_expression(entry_name: str, cron: Any) -> str:
    """The 5-field cron expression of a Celery ``crontab`` (its computed sets, exactly).

    Celery fires a crontab whose day of month *and* day of week are both restricted only
    on days matching both; cron fires on days matching either. Such an entry is refused
    (split it, or restrict one field and check the other in the task).
    """
    dom = _field(cron.day_of_month, 1, 31)
    dow = _field(cron.day_of_week, 0, 6)
    if dom != "*" and dow != "*":
        raise ConfigError(
            f"beat_schedule entry {entry_name!r}: a crontab restricting both day_of_month "
            f"({dom}) and day_of_week ({dow}) fires in Celery only on days matching both; "
            "cron fires on days matching either, so anarchon refuses it: restrict one of "
            "them and check the other in the task")
    return " ".join((_field(cron.minute, 0, 59), _field(cron.hour, 0, 23), dom,
                     _field(cron.month_of_year, 1, 12), dow))


def crontab_dst(cron: Any) -> str:
    """The DST rule of a Celery ``crontab``, as cron(8) would read its spelling.

    A minute or hour given as a text starting with ``*`` (``minute="*/15"``, the default
    ``"*"``) makes a wildcard job, ``both,skip``: it follows the wall clock. Anything else
    (numbers, lists, ranges, ``"0-59"``) is a fixed-time job, ``once_first,shift``. The
    built expression cannot tell: ``"*/15"`` becomes ``0,15,30,45`` and ``"0-59"``
    becomes ``*``.
    """
    spelled = (getattr(cron, "_orig_minute", "*"), getattr(cron, "_orig_hour", "*"))
    wildcard = any(isinstance(text, str) and text.strip().startswith("*") for text in spelled)
    return str(DstRule.default(wildcard=wildcard))


def _zone_name(entry_name: str, tz: Any) -> str:
    key = getattr(tz, "key", None)
    if isinstance(key, str) and key:
        return key
    if tz is not None and tz.utcoffset(None) == timedelta(0) and str(tz) in ("UTC", "UTC+00:00"):
        return "UTC"
    raise ConfigError(
        f"beat_schedule entry {entry_name!r}: the app's time zone {tz!r} has no IANA name; "
        "set app.conf.timezone to one (e.g. 'Europe/Athens') so every beat computes the "
        "same slots")


def _stable(value: object) -> str:
    # Objects without a JSON form (lazy functions, custom classes) are digested by type:
    # their repr usually holds a memory address, different in every process.
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"


def _digest(task: str, schedule_text: str, args: Any, kwargs: Any,
            options: Mapping[str, Any]) -> str:
    payload = json.dumps([task, schedule_text, list(args or ()), dict(kwargs or {}),
                          dict(options)], sort_keys=True, default=_stable)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def entry_job_options(entry_name: str, options: Mapping[str, Any] | None,
                      defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The app's ``anarchon_*`` job options with the entry's ``options["anarchon"]`` over them."""
    merged = {k: v for k, v in defaults.items() if v is not None}
    own = (options or {}).get(ENTRY_OPTIONS_KEY)
    if own is None:
        return _checked_overlap(entry_name, merged)
    if not isinstance(own, Mapping):
        raise ConfigError(f"beat_schedule entry {entry_name!r}: options[{ENTRY_OPTIONS_KEY!r}] "
                          f"must be a dict of {', '.join(JOB_OPTIONS)}, not {own!r}")
    unknown = sorted(set(map(str, own)) - set(JOB_OPTIONS))
    if unknown:
        raise ConfigError(f"beat_schedule entry {entry_name!r}: unknown anarchon option(s) "
                          f"{', '.join(unknown)}; valid: {', '.join(JOB_OPTIONS)}")
    merged.update({k: v for k, v in own.items() if v is not None})
    return _checked_overlap(entry_name, merged)


def _checked_overlap(entry_name: str, merged: dict[str, Any]) -> dict[str, Any]:
    if merged.get("overlap") == "cancel_other":
        raise ConfigError(f"beat_schedule entry {entry_name!r}: overlap='cancel_other' cannot "
                          "stop a task already sent to a worker; use 'skip', 'buffer_one' "
                          "(with anarchon_track_tasks) or 'allow'")
    return merged


def publish_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The entry's options as Celery publishes them (without anarchon's own key)."""
    return {k: v for k, v in (options or {}).items() if k != ENTRY_OPTIONS_KEY}


def job_spec(entry: Any, tz: Any, defaults: Mapping[str, Any]) -> JobSpec:
    """Turn a ``celery.beat.ScheduleEntry`` into a :class:`JobSpec`, or raise ConfigError."""
    name = entry.name
    sched = entry.schedule
    options = entry_job_options(name, entry.options, defaults)
    if isinstance(sched, solar):
        raise ConfigError(
            f"beat_schedule entry {name!r}: solar schedules are not supported by "
            "anarchon_celery (their times depend on a location's sunrise and cannot be put "
            "on a grid every beat shares); use a crontab in the app's timezone instead")
    if isinstance(sched, crontab):
        spec = JobSpec(name, "cron", expression=cron_expression(name, sched),
                       tz=_zone_name(name, tz), options=options, dst=crontab_dst(sched))
    elif type(sched) is schedule:
        interval = sched.run_every
        if not isinstance(interval, timedelta) or interval <= timedelta(0):
            raise ConfigError(f"beat_schedule entry {name!r}: invalid interval {interval!r}")
        spec = JobSpec(name, "every", interval=interval, options=options)
    else:
        raise ConfigError(
            f"beat_schedule entry {name!r}: unsupported schedule {type(sched).__name__} "
            f"({sched!r}); anarchon_celery accepts a timedelta, a number of seconds or a "
            "crontab")
    digest = _digest(entry.task, spec.describe(), entry.args, entry.kwargs,
                     publish_options(entry.options))
    return JobSpec(spec.name, spec.kind, spec.interval, spec.expression, spec.tz,
                   spec.options, digest, spec.dst)
