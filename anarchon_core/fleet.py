"""The fleet's shared control state: paused jobs and the registry of live instances.

Both live in the store as *control records* (:meth:`Backend.write_control`), small JSON
texts every instance of the namespace reads:

* ``paused:<job>``: the job is paused for the whole fleet (who paused it, when, why).
  Every instance re-reads the paused jobs every :data:`PAUSE_REFRESH_S` seconds; a slot
  of a paused job is still claimed (so exactly one instance records it) and recorded
  ``skipped`` with the error ``paused``, its handler never called.
* ``instance:<id>``: an instance that is alive (version, when it started, when it was
  last seen, when the record expires); refreshed every :data:`REGISTER_EVERY_S` seconds,
  deleted by ``stop()``, ignored (and deleted by readers) once expired.
* ``jobs:<id>``: the jobs that instance runs and their definitions (schedule and the
  options that decide what runs: ``overlap``, ``max_attempts``, ``timeout_ms``), written
  when its set of jobs changes. Instances whose definitions of a job differ (a rolling
  deploy that changed a schedule) are flagged by :class:`FleetStatus`.

This module is the pure part: encoding, decoding, and assembling the status view.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .durations import format_ms
from .errors import ConfigError
from .models import Run
from .naming import validate_job_name
from .options import JobOptions
from .schedules import CronSchedule, EverySchedule, Schedule, ms_to_datetime

__all__ = [
    "INSTANCE", "JOBS", "PAUSED", "PAUSE_REFRESH_S", "REGISTER_EVERY_S", "FleetStatus",
    "InstanceInfo", "JobDefinition", "JobStatus", "PauseInfo",
]

log = logging.getLogger("anarchon.fleet")

PAUSED, INSTANCE, JOBS = "paused:", "instance:", "jobs:"
#: How often every instance re-reads the paused jobs (s).
PAUSE_REFRESH_S = 2.0
#: How often a running instance refreshes its registry record (s); it expires after 3×.
REGISTER_EVERY_S = 10.0
REGISTER_TTL_MS = round(3 * REGISTER_EVERY_S * 1000)
#: The longest pause reason kept.
MAX_REASON = 500


@dataclass(frozen=True)
class PauseInfo:
    """A job paused for the whole fleet: by whom (instance id), since when (ms), why."""

    job: str
    by: str
    at_ms: int
    reason: str | None = None

    def encode(self) -> str:
        """The control record's text."""
        return json.dumps({"by": self.by, "at": self.at_ms, "reason": self.reason})

    @classmethod
    def decode(cls, job: str, text: str) -> PauseInfo:
        """Read a ``paused:<job>`` record; an unreadable one still means paused."""
        try:
            data = json.loads(text)
            return cls(job, str(data.get("by", "?")), int(data.get("at", 0)),
                       None if data.get("reason") is None else str(data["reason"]))
        except (ValueError, TypeError, AttributeError):
            return cls(job, "?", 0, "unreadable pause record")


def validate_reason(reason: object) -> str | None:
    """A pause reason: None or a short printable text."""
    if reason is None:
        return None
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ConfigError(f"invalid reason {reason!r}: expected a text of at most "
                          f"{MAX_REASON} characters")
    return reason


@dataclass(frozen=True)
class JobDefinition:
    """How one instance defines a job: its schedule, and a digest of what decides runs."""

    name: str
    schedule: str
    digest: str
    #: Enough to compute the next slot elsewhere: {"every": ms, "offset": ms} or
    #: {"cron": expression, "tz": zone}; empty for a schedule anarchon does not know.
    spec: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, schedule: Schedule | None, options: JobOptions) -> JobDefinition:
        """The definition of a registered job."""
        text = schedule.describe() if schedule is not None else "(claimed by its caller)"
        spec: dict[str, Any] = {}
        if isinstance(schedule, EverySchedule):
            spec = {"every": schedule.interval_ms, "offset": schedule.offset_ms}
        elif isinstance(schedule, CronSchedule):
            spec = {"cron": schedule.expression, "tz": schedule.tz}
        deciding = f"{text}|overlap={options.overlap}|max_attempts={options.max_attempts}" \
                   f"|timeout_ms={options.timeout_ms}"
        return cls(name, text, hashlib.sha1(deciding.encode()).hexdigest()[:10], spec)

    def next_slot(self, after_ms: int) -> int | None:
        """The first slot after ``after_ms`` (None if the schedule cannot be rebuilt)."""
        try:
            if "every" in self.spec:
                return EverySchedule(timedelta(milliseconds=int(self.spec["every"])),
                                     timedelta(milliseconds=int(self.spec.get("offset", 0)))
                                     ).next_after(after_ms)
            if "cron" in self.spec:
                return CronSchedule(str(self.spec["cron"]),
                                    str(self.spec.get("tz", "UTC"))).next_after(after_ms)
        except (ConfigError, ValueError, TypeError):
            return None
        return None


def encode_jobs(definitions: Iterable[JobDefinition]) -> str:
    """The text of a ``jobs:<id>`` record."""
    return json.dumps({d.name: {"schedule": d.schedule, "digest": d.digest,
                                "spec": dict(d.spec)} for d in definitions},
                      separators=(",", ":"), sort_keys=True)


def decode_jobs(text: str) -> list[JobDefinition]:
    """Read a ``jobs:<id>`` record (unreadable entries are left out)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    out = []
    for name, entry in data.items() if isinstance(data, dict) else ():
        try:
            out.append(JobDefinition(str(name), str(entry["schedule"]), str(entry["digest"]),
                                     dict(entry.get("spec") or {})))
        except (KeyError, TypeError, AttributeError):
            continue
    return out


@dataclass(frozen=True)
class InstanceInfo:
    """A live instance of the fleet, as its registry record says."""

    instance_id: str
    version: str
    started_at_ms: int
    seen_at_ms: int
    expires_at_ms: int
    jobs: int

    def encode(self) -> str:
        """The text of an ``instance:<id>`` record."""
        return json.dumps({"version": self.version, "started": self.started_at_ms,
                           "seen": self.seen_at_ms, "expires": self.expires_at_ms,
                           "jobs": self.jobs})

    @classmethod
    def decode(cls, instance_id: str, text: str) -> InstanceInfo | None:
        """Read an ``instance:<id>`` record; None if unreadable."""
        try:
            data = json.loads(text)
            return cls(instance_id, str(data["version"]), int(data["started"]),
                       int(data["seen"]), int(data["expires"]), int(data.get("jobs", 0)))
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class JobStatus:
    """One job across the fleet.

    ``definitions`` maps each definition digest to the instances that use it; more than
    one (``disagree``) means instances run different versions of the job.
    """

    name: str
    schedule: str | None
    next_slot: int | None
    last_run: Run | None
    paused: PauseInfo | None
    definitions: Mapping[str, tuple[str, ...]]
    schedules: Mapping[str, str]

    @property
    def disagree(self) -> bool:
        """True when live instances define this job differently."""
        return len(self.definitions) > 1

    @property
    def instances(self) -> tuple[str, ...]:
        """The live instances that run this job."""
        return tuple(sorted(i for ids in self.definitions.values() for i in ids))


@dataclass(frozen=True)
class FleetStatus:
    """The fleet view: live instances and, per job, schedule, last attempt, next slot."""

    at_ms: int
    instances: list[InstanceInfo]
    jobs: list[JobStatus]

    @property
    def warnings(self) -> list[str]:
        """One line per job whose live instances disagree on its definition."""
        out = []
        for job in self.jobs:
            if job.disagree:
                variants = "; ".join(
                    f"{job.schedules.get(d, '?')} on {', '.join(ids)}"
                    for d, ids in sorted(job.definitions.items()))
                out.append(f"job {job.name!r} is defined differently across instances: "
                           f"{variants}")
        return out

    def format(self) -> str:
        """The view as text (``anarchon status``)."""
        now = self.at_ms
        lines = [f"{len(self.instances)} instance(s) alive"]
        for inst in self.instances:
            lines.append(f"  {inst.instance_id:<32} version {inst.version:<10} "
                         f"{inst.jobs:>6} job(s)  up {_ago(now, inst.started_at_ms)}, "
                         f"seen {_ago(now, inst.seen_at_ms)} ago")
        lines.append("")
        lines.append(f"{'job':<24} {'schedule':<30} {'next slot (UTC)':<21} "
                     f"{'last attempt':<36} state")
        for job in self.jobs:
            nxt = _when(job.next_slot) if job.next_slot else "-"
            last = job.last_run
            last_text = (f"{last.status} {_when(last.slot)} on {last.runner}"
                         if last is not None else "-")
            state = _paused_text(job.paused) if job.paused else (
                "no live instance" if not job.definitions else "")
            if job.disagree:
                state = (state + " DEFINITIONS DIFFER").strip()
            lines.append(f"{job.name:<24} {(job.schedule or '-'):<30} {nxt:<21} "
                         f"{last_text:<36} {state}".rstrip())
        for warning in self.warnings:
            lines.append(f"warning: {warning}")
        return "\n".join(lines)


def assemble(now_ms: int, instance_records: Mapping[str, str], job_records: Mapping[str, str],
             paused_records: Mapping[str, str], last_runs: Mapping[str, Run | None]
             ) -> tuple[FleetStatus, list[str]]:
    """Build the fleet view from the records read; also the stale records to delete."""
    instances, stale = [], []
    for instance_id, text in instance_records.items():
        info = InstanceInfo.decode(instance_id, text)
        if info is None or info.expires_at_ms < now_ms:
            stale += [INSTANCE + instance_id, JOBS + instance_id]
            continue
        instances.append(info)
    alive = {i.instance_id for i in instances}
    stale += [JOBS + i for i in job_records if i not in alive and JOBS + i not in stale]
    per_job: dict[str, dict[str, list[str]]] = {}
    texts: dict[str, dict[str, str]] = {}
    specs: dict[str, JobDefinition] = {}
    for instance_id, text in job_records.items():
        if instance_id not in alive:
            continue
        for definition in decode_jobs(text):
            per_job.setdefault(definition.name, {}).setdefault(definition.digest,
                                                               []).append(instance_id)
            texts.setdefault(definition.name, {})[definition.digest] = definition.schedule
            specs.setdefault(definition.name, definition)
    paused = {job: PauseInfo.decode(job, text) for job, text in paused_records.items()}
    names = sorted(set(per_job) | set(last_runs) | set(paused))
    jobs = []
    for name in names:
        known = specs.get(name)
        jobs.append(JobStatus(
            name=name, schedule=known.schedule if known else None,
            next_slot=known.next_slot(now_ms) if known else None,
            last_run=last_runs.get(name), paused=paused.get(name),
            definitions={d: tuple(sorted(ids)) for d, ids in per_job.get(name, {}).items()},
            schedules=texts.get(name, {})))
    instances.sort(key=lambda i: i.instance_id)
    return FleetStatus(now_ms, instances, jobs), stale


def check_job_name(name: object) -> str:
    """A job name for pause/resume (need not be registered on this instance)."""
    return validate_job_name(name)


def _paused_text(info: PauseInfo) -> str:
    """``paused by <who> at <when>: <reason>`` (the reason given to ``pause``)."""
    when = f" at {_when(info.at_ms)}" if info.at_ms else ""
    return f"paused by {info.by}{when}" + (f": {info.reason}" if info.reason else "")


def _ago(now_ms: int, then_ms: int) -> str:
    """A past instant's age in whole seconds (``"0s"`` under one)."""
    return format_ms(max(0, now_ms - then_ms) // 1000 * 1000) if now_ms - then_ms >= 1000 \
        else "0s"


def _when(slot: int) -> str:
    return ms_to_datetime(slot).isoformat(timespec="seconds").replace("+00:00", "Z")
