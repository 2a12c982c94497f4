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

This module is the pure part: encoding, decoding, and assembling the status view. The
records are untrusted (any client of the store can write them): a decoder raises
:class:`~anarchon_core.errors.CorruptRecordError` for a record it cannot read, and the
readers of many records report each such record once at WARNING and skip it. A corrupt
``paused:<job>`` record still pauses its job (pausing is the safe side; ``resume``
deletes it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .backends.storeerrors import CorruptRecords
from .durations import format_ms
from .errors import ConfigError, CorruptRecordError
from .models import Run
from .naming import validate_job_name
from .options import JobOptions
from .records import MAX_COUNT, corrupt, record_int, record_map, record_ms, record_text
from .schedules import CronSchedule, DstRule, EverySchedule, Schedule, ms_to_datetime
from .slots import MAX_SLOT

__all__ = [
    "INSTANCE", "JOBS", "PAUSED", "PAUSE_REFRESH_S", "REGISTER_EVERY_S", "FleetStatus",
    "InstanceInfo", "JobDefinition", "JobStatus", "PauseInfo", "decode_jobs", "read_paused",
]

log = logging.getLogger("anarchon.fleet")
#: Control records anarchon cannot read are reported once each, then skipped quietly.
corrupt_records = CorruptRecords(log)

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
        """Read a ``paused:<job>`` record; :class:`CorruptRecordError` if unreadable."""
        try:
            data = record_map(json.loads(text), "record")
            reason = data.get("reason")
            return cls(job, record_text(data.get("by", "?"), "by", limit=MAX_REASON),
                       record_ms(data.get("at", 0), "at", lo=0),
                       None if reason is None else record_text(reason, "reason"))
        except (ValueError, TypeError, RecursionError) as exc:
            raise corrupt(PAUSED + job, exc) from None


def read_paused(records: Mapping[str, str]) -> dict[str, PauseInfo]:
    """The paused jobs of ``paused:<job>`` records (by job name).

    A corrupt record is reported once and still pauses its job, as paused by ``"?"``.
    """
    out = {}
    for job, text in records.items():
        try:
            out[job] = PauseInfo.decode(job, text)
        except CorruptRecordError as exc:
            corrupt_records.report(f"control record {exc.key}", job, text, exc.detail)
            out[job] = PauseInfo(job, "?", 0, "unreadable pause record")
    return out


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
    #: {"cron": expression, "tz": zone}, with "dst": "<fall_back>,<spring_forward>" when
    #: the job chose its DST rule; empty for a schedule anarchon does not know.
    spec: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, schedule: Schedule | None, options: JobOptions, *,
           text: str | None = None) -> JobDefinition:
        """The definition of a registered job (``text``: the caller's timing, no schedule)."""
        text = schedule.describe() if schedule is not None else text or "(claimed by its caller)"
        spec: dict[str, Any] = {}
        if isinstance(schedule, EverySchedule):
            spec = {"every": schedule.interval_ms, "offset": schedule.offset_ms}
        elif isinstance(schedule, CronSchedule):
            spec = {"cron": schedule.expression, "tz": schedule.tz}
            if schedule.dst_given:
                spec["dst"] = str(schedule.dst)
        # skip and allow read as the booleans they were, so a fleet in the middle of an
        # upgrade does not report every job as defined differently.
        overlap = {"skip": False, "allow": True}.get(options.overlap, options.overlap)
        deciding = f"{text}|overlap={overlap}|max_attempts={options.max_attempts}" \
                   f"|timeout_ms={options.timeout_ms}"
        return cls(name, text, hashlib.sha1(deciding.encode()).hexdigest()[:10], spec)

    def next_slot(self, after_ms: int) -> int | None:
        """The first slot after ``after_ms`` (None if the schedule cannot be rebuilt).

        A ``dst`` this version cannot read (a newer anarchon's choice, a corrupt record)
        is reported once at WARNING, naming it, and the slot is None: the default rule
        might give another slot than the instance that wrote it.
        """
        slot: int | None = None
        try:
            if "every" in self.spec:
                every = record_int(self.spec["every"], "every", 1, MAX_SLOT)
                offset = record_int(self.spec.get("offset", 0), "offset", 0, every - 1)
                slot = EverySchedule(timedelta(milliseconds=every),
                                     timedelta(milliseconds=offset)).next_after(after_ms)
            elif "cron" in self.spec:
                expression = record_text(self.spec["cron"], "cron", limit=200)
                zone = record_text(self.spec.get("tz", "UTC"), "tz", limit=100)
                slot = CronSchedule(expression, zone, self._dst()).next_after(after_ms)
        except (ConfigError, ValueError, TypeError, OverflowError):
            return None
        return slot if slot is not None and slot <= MAX_SLOT else None

    def _dst(self) -> str | None:
        """The record's ``dst`` (None without one); ValueError, reported once, if unreadable."""
        dst = self.spec.get("dst")
        if dst is None:
            return None
        try:
            text = record_text(dst, "dst", limit=100)
            DstRule.parse(text, wildcard=False)
        except (ConfigError, ValueError) as exc:
            corrupt_records.report("a job definition", self.name, repr(dict(self.spec)),
                                   f"unknown dst {dst!r}, its next slot is not shown: {exc}")
            raise ValueError(f"unknown dst {dst!r}") from None
        return text


def encode_jobs(definitions: Iterable[JobDefinition]) -> str:
    """The text of a ``jobs:<id>`` record."""
    return json.dumps({d.name: {"schedule": d.schedule, "digest": d.digest,
                                "spec": dict(d.spec)} for d in definitions},
                      separators=(",", ":"), sort_keys=True)


def decode_jobs(instance_id: str, text: str) -> list[JobDefinition]:
    """Read a ``jobs:<id>`` record: :class:`CorruptRecordError` if it is not readable at all.

    An entry that cannot be read is reported once and left out; the others are returned.
    """
    key = JOBS + instance_id
    try:
        data = record_map(json.loads(text), "record")
    except (ValueError, TypeError, RecursionError) as exc:
        raise corrupt(key, exc) from None
    out = []
    for name, entry in data.items():
        try:
            fields = record_map(entry, "entry")
            out.append(JobDefinition(
                record_text(name, "name", limit=1_000),
                record_text(fields["schedule"], "schedule", limit=1_000),
                record_text(fields["digest"], "digest", limit=100),
                dict(record_map(fields.get("spec") or {}, "spec"))))
        except (KeyError, ValueError, TypeError) as exc:
            corrupt_records.report(f"control record {key}", name, repr(entry),
                                   f"unreadable job definition: {exc!r}")
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
    #: The digest of the jobs it fires (:func:`~anarchon_core.contenders.group_digest`):
    #: instances of one group share each slot's contenders. None: it claims every slot.
    group: str | None = None

    def encode(self) -> str:
        """The text of an ``instance:<id>`` record."""
        data: dict[str, Any] = {"version": self.version, "started": self.started_at_ms,
                                "seen": self.seen_at_ms, "expires": self.expires_at_ms,
                                "jobs": self.jobs}
        if self.group is not None:
            data["group"] = self.group
        return json.dumps(data)

    @classmethod
    def decode(cls, instance_id: str, text: str) -> InstanceInfo:
        """Read an ``instance:<id>`` record; :class:`CorruptRecordError` if unreadable."""
        try:
            data = record_map(json.loads(text), "record")
            return cls(instance_id, record_text(data["version"], "version", limit=100),
                       record_ms(data["started"], "started", lo=0),
                       record_ms(data["seen"], "seen", lo=0),
                       record_ms(data["expires"], "expires", lo=0),
                       record_int(data.get("jobs", 0), "jobs", 0, MAX_COUNT),
                       None if data.get("group") is None
                       else record_text(data["group"], "group", limit=100))
        except (KeyError, ValueError, TypeError, RecursionError) as exc:
            raise corrupt(INSTANCE + instance_id, exc) from None


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
    """Build the fleet view from the records read; also the stale records to delete.

    Expired records are stale. A corrupt record is reported once and left out of the view,
    but not deleted (it may be a newer anarchon's), nor is its instance's ``jobs:`` record.
    """
    instances, stale, unreadable = [], [], set()
    for instance_id, text in instance_records.items():
        try:
            info = InstanceInfo.decode(instance_id, text)
        except CorruptRecordError as exc:
            corrupt_records.report(f"control record {exc.key}", None, text, exc.detail)
            unreadable.add(instance_id)
            continue
        if info.expires_at_ms < now_ms:
            stale += [INSTANCE + instance_id, JOBS + instance_id]
            continue
        instances.append(info)
    alive = {i.instance_id for i in instances}
    stale += [JOBS + i for i in job_records
              if i not in alive and i not in unreadable and JOBS + i not in stale]
    per_job: dict[str, dict[str, list[str]]] = {}
    texts: dict[str, dict[str, str]] = {}
    specs: dict[str, JobDefinition] = {}
    for instance_id, text in job_records.items():
        if instance_id not in alive:
            continue
        try:
            definitions = decode_jobs(instance_id, text)
        except CorruptRecordError as exc:
            corrupt_records.report(f"control record {exc.key}", None, text, exc.detail)
            continue
        for definition in definitions:
            per_job.setdefault(definition.name, {}).setdefault(definition.digest,
                                                               []).append(instance_id)
            texts.setdefault(definition.name, {})[definition.digest] = definition.schedule
            specs.setdefault(definition.name, definition)
    paused = read_paused(paused_records)
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
