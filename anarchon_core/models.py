"""Plain data passed between the scheduler, the backends and users."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .errors import ConfigError
from .schedules import ms_to_datetime

RunStatus = Literal["running", "success", "failed", "interrupted", "skipped", "missed"]
#: Every status a run can have, in the order history filters list them.
RUN_STATUSES: tuple[str, ...] = ("running", "success", "failed", "interrupted", "skipped",
                                 "missed")
FINISHED_STATUSES: frozenset[str] = frozenset(RUN_STATUSES[1:])


#: Limits of :attr:`Run.meta`: it is stored with every attempt, so it stays small.
META_MAX_KEYS = 16
META_MAX_KEY_CHARS = 64
META_MAX_VALUE_CHARS = 1_024
META_MAX_TOTAL_CHARS = 4_096


def validate_meta(meta: Mapping[str, str] | None) -> dict[str, str]:
    """Check a run's ``meta`` mapping and return it as a plain dict.

    String keys and values only, at most :data:`META_MAX_KEYS` keys of at most
    :data:`META_MAX_KEY_CHARS` characters, values of at most :data:`META_MAX_VALUE_CHARS`,
    and :data:`META_MAX_TOTAL_CHARS` in all; anything else is a :class:`ConfigError`.
    """
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise ConfigError(f"invalid meta {meta!r}: expected a mapping of str to str")
    out: dict[str, str] = {}
    total = 0
    for key, value in meta.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"invalid meta entry {key!r}: {value!r}: keys and values must "
                              "be str")
        if not key or len(key) > META_MAX_KEY_CHARS:
            raise ConfigError(f"invalid meta key {key[:80]!r}: 1 to {META_MAX_KEY_CHARS} "
                              "characters")
        if len(value) > META_MAX_VALUE_CHARS:
            raise ConfigError(f"meta value of {key!r} is {len(value)} characters; at most "
                              f"{META_MAX_VALUE_CHARS}")
        total += len(key) + len(value)
        out[key] = value
    if len(out) > META_MAX_KEYS:
        raise ConfigError(f"meta has {len(out)} keys; at most {META_MAX_KEYS}")
    if total > META_MAX_TOTAL_CHARS:
        raise ConfigError(f"meta holds {total} characters; at most {META_MAX_TOTAL_CHARS}")
    return out


class ClaimOutcome(str, enum.Enum):
    """What a claim answered.

    * ``WON``: the caller runs this attempt (attempt 1, or the next one after a takeover).
    * ``TAKEN``: another instance won; claim-only backends (no lease to watch).
    * ``RUNNING``: another instance runs it and its lease is live; the caller may watch
      it as a backup by claiming again every 1–2 heartbeats.
    * ``OVERLAP``: an earlier run of the job holds a live lease and overlap is off; this
      slot is recorded ``skipped``.
    * ``DONE``: the run has finished (any status) or was given up; nothing to do.
    * ``LATE``: nobody claimed the slot within ``max_late_ms`` of its time by the store's
      clock; it is recorded ``skipped`` and never run.
    * ``PAUSED``: the job is paused fleet-wide (:meth:`Scheduler.pause`); the scheduler
      won the claim and recorded the slot ``skipped`` (error ``paused``). Stores never
      answer it themselves.
    * ``EARLY``: the slot is still more than ``EARLY_TOLERANCE_MS`` in the future by the
      store's clock (the caller's clock is ahead or was stepped); nothing is recorded and
      the caller should claim again at the slot's time.
    * ``BUFFERED``: another run of the job holds a live lease and the job's overlap policy
      is ``buffer_one`` or ``cancel_other``: the caller holds this slot's lease (heartbeat
      it) and claims again with the same token until the answer is ``won`` (the other run
      ended) or ``done`` (this slot was cancelled in turn).
    """

    WON = "won"
    TAKEN = "taken"
    RUNNING = "running"
    OVERLAP = "overlap"
    DONE = "done"
    LATE = "late"
    EARLY = "early"
    PAUSED = "paused"
    BUFFERED = "buffered"


#: What a slot does when it comes due while another run of its job holds a live lease.
OVERLAP_POLICIES = ("skip", "allow", "buffer_one", "cancel_other")


@dataclass(frozen=True)
class ClaimRequest:
    """One claim: "record that ``runner`` runs ``(job, slot)``, unless it is taken".

    ``token`` is fresh for every claim call; if the claim wins it becomes the attempt's
    fencing token. ``max_late_ms`` bounds how long after ``slot`` (by the store's clock) a
    first attempt may still start; ``None`` means no bound (manual runs). How much history
    the store keeps is the namespace's configuration (``Backend.retention``), not the
    claim's.

    ``missed`` (a reason) makes it a request to *account for* a slot nobody claimed in
    time, never to run it: if the run has no record, the store records it ``missed`` with
    that reason and answers ``late``; otherwise it answers ``done`` (or ``running``) and
    writes nothing. It never starts or takes over an attempt.

    ``overlap`` is the job's overlap policy (:data:`OVERLAP_POLICIES`: ``"skip"``,
    ``"allow"``, ``"buffer_one"``, ``"cancel_other"``); ``True`` and ``False`` stand for
    ``"allow"`` and ``"skip"``.
    """

    job: str
    slot: int
    token: str
    runner: str
    manual: bool = False
    lease_ms: int = 30_000
    overlap: str | bool = "skip"
    max_attempts: int = 3
    max_late_ms: int | None = None
    missed: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.overlap, bool):
            object.__setattr__(self, "overlap", "allow" if self.overlap else "skip")
        elif self.overlap not in OVERLAP_POLICIES:
            raise ValueError(f"invalid overlap {self.overlap!r}: expected one of "
                             f"{', '.join(OVERLAP_POLICIES)}")

    @property
    def policy(self) -> str:
        """The overlap policy, a name of :data:`OVERLAP_POLICIES`."""
        return str(self.overlap)


@dataclass(frozen=True)
class ClaimResult:
    """The answer to a claim: the outcome, and the attempt number when one was involved."""

    outcome: ClaimOutcome
    attempt: int = 0
    token: str | None = None
    lease_until_ms: int | None = None

    @property
    def won(self) -> bool:
        """True when the caller must run this attempt."""
        return self.outcome is ClaimOutcome.WON


@dataclass(frozen=True)
class RunRef:
    """Identifies one attempt of one run for heartbeat, finish and release."""

    job: str
    slot: int
    token: str
    attempt: int = 1
    manual: bool = False


@dataclass(frozen=True)
class Run:
    """One history entry: one attempt of one run.

    ``status`` is ``"running"``, ``"success"``, ``"failed"``, ``"interrupted"`` or
    ``"skipped"``. Times are aware UTC datetimes; ``started_at`` is when the attempt was
    claimed (for ``skipped``, when the skip was recorded).
    """

    job: str
    slot: int
    attempt: int
    status: str
    runner: str
    started_at: datetime | None
    finished_at: datetime | None = None
    error: str | None = None
    manual: bool = False
    #: Small string → string mapping stored with the attempt (``ctx.meta``,
    #: ``claim.finish(meta=...)``), e.g. the id of the Celery task a beat sent.
    meta: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def scheduled_at(self) -> datetime:
        """The slot as an aware UTC datetime."""
        return ms_to_datetime(self.slot)

    @property
    def duration_ms(self) -> int | None:
        """Milliseconds between start and finish, or None while unfinished."""
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds() * 1000)


@dataclass(frozen=True)
class JobInfo:
    """A registered job as :meth:`Scheduler.jobs` reports it."""

    name: str
    schedule: str
    next_slot: int
    options: dict[str, Any] = field(default_factory=dict)
    #: The job's handler (None for a job ``define()``d without one: its caller runs it).
    handler: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    @property
    def next_run_at(self) -> datetime:
        """``next_slot`` as an aware UTC datetime."""
        return ms_to_datetime(self.next_slot)


class RunPage(list[Run]):
    """One page of history, newest first: a ``list[Run]`` with the cursor of the next page.

    Pass :attr:`cursor` as ``before=`` to read the page after this one; it is ``None`` on
    the last page. Pages are keyed on ``(slot, job, manual, attempt)``, so runs written
    while a reader pages never shift the pages it has not read yet.
    """

    def __init__(self, runs: list[Run] | None = None, cursor: str | None = None) -> None:
        super().__init__(runs or [])
        self.cursor = cursor


@dataclass(frozen=True)
class HistoryQuery:
    """A read of the history of one namespace (see :meth:`Backend.runs`).

    ``job=None`` reads every job; ``status`` and ``runner`` filter; ``before`` is the
    cursor of the previous page (:attr:`RunPage.cursor`); ``limit`` bounds the page.
    """

    job: str | None = None
    status: str | None = None
    runner: str | None = None
    before: str | None = None
    limit: int = 50


@dataclass(frozen=True)
class ExpiredRun:
    """A run still ``running`` in the store whose lease has expired (an orphan candidate)."""

    job: str
    slot: int
    attempt: int
    manual: bool = False
    #: The store-clock instant the lease expired (ms), when the store knows it.
    lease_until_ms: int | None = None
