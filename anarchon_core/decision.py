"""The lease decision table: the single source of truth for every lease backend.

A lease backend reads the run's current state inside one atomic step (a transaction, a
Lua script), asks :func:`decide` what to do, applies the returned :class:`Decision` in
that same step, and answers with its outcome. The Redis ``lease`` Lua script and the
PostgreSQL claim function (:mod:`anarchon_core.backends.pgfunctions`) implement this same
table line for line; the conformance suite in ``tests/`` holds every lease backend to it.
The first row that matches the state and the request applies; ``docs/concepts.md`` shows
the same tables to users.

=====================  ========================================  =====================
state of (job, slot)   condition                                 write → outcome
=====================  ========================================  =====================
none                   the slot is more than                     none → ``early``
                       ``EARLY_TOLERANCE_MS`` (1 s) in the
                       future (not a manual run)
none                   a ``missed`` request (accounting for a    record ``missed``
                       slot nobody claimed in time)              (its reason) → ``late``
none                   first attempt claimed later than          record ``skipped``
                       ``max_late_ms`` after the slot            (late) → ``late``
none                   another run of the job holds a live       record ``skipped``
                       lease and ``overlap`` is off              (overlap) → ``overlap``
none                   otherwise                                 attempt 1 → ``won``
finished (any status)                                            none → ``done``
running                a ``missed`` request                      none → ``running``
running                the caller's own token (a claim retried   none → ``won``
                       after its answer was lost)                (same attempt)
running                lease in the future                       none → ``running``
running                lease expired, attempt < max_attempts     mark attempt
                                                                 ``interrupted``, store
                                                                 attempt+1 → ``won``
running                lease expired, no attempts left           mark ``interrupted``
                                                                 for good → ``done``
=====================  ========================================  =====================

A live lease, in the overlap row, ends after the store's clock and no more than
:data:`MAX_LEASE_AHEAD_MS` after it (the longest ``lease_ms``, one day, plus an hour for a
clock stepped back). A lease further ahead was never written by anarchon (a corrupt or
foreign record): the overlap check ignores it and the backend reports that run once, so it
cannot skip every later slot of its job. :func:`lease_is_live` is the rule; the SQL
statement, the PostgreSQL function and the Redis script apply the same test.

Heartbeat, finish and release act only while the run is ``running`` with the caller's
token; any other token is fenced out and the call reports ``False``. Release (hand-over on
stop) expires the lease at once and notes :data:`HANDED_OVER` as the attempt's error, which
the takeover keeps when it marks the attempt ``interrupted``.

A release is final. Once an attempt's error is :data:`HANDED_OVER` its lease stays
expired: a heartbeat or finish of that attempt reports ``False`` and changes nothing (one
sent beside the release, or batched after it, must not give the lease back to a runner
that is leaving), so the next claim takes over at once. Only a release retried with the
same token (its first answer lost) is answered ``True`` again. :func:`update_applies` is
the rule; the SQL statements and the Redis ``lease_update`` script apply the same test.

=====================  ========================================  =====================
update                 acts when the current attempt is          write → answer
=====================  ========================================  =====================
heartbeat              ``running``, the caller's token, not      lease = now + lease
                       released                                  → ``True``
finish                 ``running``, the caller's token, not      the end → ``True``
                       released
release                ``running``, the caller's token           lease = now, error
                                                                 :data:`HANDED_OVER`
                                                                 → ``True``
any                    otherwise                                 none → ``False``
=====================  ========================================  =====================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .models import FINISHED_STATUSES, ClaimOutcome, ClaimRequest
from .options import MAX_LEASE_MS

__all__ = ["MAX_LEASE_AHEAD_MS", "Action", "Decision", "RunState", "decide", "lease_is_live",
           "needs_overlap_check", "update_applies"]

LEASE_EXPIRED = "lease expired: the runner stopped heartbeating"
GAVE_UP = "lease expired: the runner stopped heartbeating; max_attempts reached"
HANDED_OVER = "handed over: the runner was stopping"
#: How far ahead of the store's clock a first claim may come (an instance's clock error).
EARLY_TOLERANCE_MS = 1_000
OVERLAP_SKIP = "overlap: an earlier run of this job still holds a live lease"
#: How far ahead of the store's clock a lease anarchon wrote can end: the longest
#: ``lease_ms`` (see :func:`~anarchon_core.options.validate_lease_timings`) plus an hour,
#: for a store clock stepped back since. A lease further ahead is corrupt.
MAX_LEASE_AHEAD_MS = MAX_LEASE_MS + 3_600_000
#: How a backend reports a run whose lease is further ahead than :data:`MAX_LEASE_AHEAD_MS`.
CORRUPT_LEASE = (f"its lease ends more than {MAX_LEASE_AHEAD_MS} ms after the store's clock, "
                 "which anarchon never writes; the overlap check ignores it")


class Action(str, enum.Enum):
    """The write a backend performs for a decision."""

    NONE = "none"
    START = "start"            # insert attempt `attempt` (after marking attempt-1 interrupted)
    SKIP = "skip"              # record the run as skipped with `error`
    GIVE_UP = "give_up"        # mark the current attempt interrupted for good with `error`


@dataclass(frozen=True)
class RunState:
    """The current attempt of a run as the store holds it."""

    attempt: int
    token: str
    status: str
    lease_until_ms: int | None


@dataclass(frozen=True)
class Decision:
    """What to write and what to answer."""

    outcome: ClaimOutcome
    action: Action = Action.NONE
    attempt: int = 0
    error: str | None = None
    lease_until_ms: int | None = None
    #: The status a ``SKIP`` records: ``skipped``, or ``missed`` for a missed request.
    status: str = "skipped"


#: The lease updates of :func:`update_applies`.
UPDATES = ("heartbeat", "finish", "release")


def update_applies(update: str, status: str, error: str | None, token_matches: bool) -> bool:
    """Whether a heartbeat, finish or release acts on the current attempt (the table above).

    ``status`` and ``error`` are the current attempt's; ``token_matches`` says whether the
    caller holds its token (and attempt number).
    """
    if update not in UPDATES:
        raise ValueError(f"unknown lease update {update!r}: expected one of {UPDATES}")
    if status != "running" or not token_matches:
        return False
    return update == "release" or error != HANDED_OVER


def lease_is_live(lease_until_ms: int | None, now_ms: int) -> bool:
    """Whether another run's lease counts for the overlap check (see the module docstring).

    It ends after ``now_ms`` (the store's clock) and at most :data:`MAX_LEASE_AHEAD_MS`
    after it; a lease further ahead is corrupt and does not count.
    """
    return lease_until_ms is not None and now_ms < lease_until_ms <= now_ms + MAX_LEASE_AHEAD_MS


def needs_overlap_check(request: ClaimRequest, state: RunState | None) -> bool:
    """Whether :func:`decide` needs to know if another run holds a live lease."""
    return state is None and not request.overlap


def late_error(request: ClaimRequest, now_ms: int) -> str:
    """The error text recorded for a slot skipped because it was claimed too late."""
    return (
        f"late: first claimed {now_ms - request.slot} ms after its time "
        f"(max_late_ms={request.max_late_ms})"
    )


def not_run(request: ClaimRequest, now_ms: int) -> tuple[str, str] | None:
    """What a claim-only store records for a won claim instead of running it, if anything.

    ``(status, error)`` for a ``missed`` request, or for a first claim later than
    ``max_late_ms``; None when the winner runs it.
    """
    if request.missed is not None:
        return "missed", request.missed
    if request.max_late_ms is not None and now_ms > request.slot + request.max_late_ms:
        return "skipped", late_error(request, now_ms)
    return None


def decide(
    request: ClaimRequest, state: RunState | None, now_ms: int, other_live: bool = False
) -> Decision:
    """Apply the lease decision table (see the module docstring).

    ``now_ms`` is the store's clock. ``other_live`` tells whether another run of the same
    job holds a live lease (:func:`lease_is_live`); it is read only when
    :func:`needs_overlap_check` says so.
    """
    if state is None:
        if request.slot > now_ms + EARLY_TOLERANCE_MS and not request.manual:
            return Decision(ClaimOutcome.EARLY)
        if request.missed is not None:
            return Decision(ClaimOutcome.LATE, Action.SKIP, 1, request.missed,
                            status="missed")
        if request.max_late_ms is not None and now_ms > request.slot + request.max_late_ms:
            return Decision(ClaimOutcome.LATE, Action.SKIP, 1, late_error(request, now_ms))
        if not request.overlap and other_live:
            return Decision(ClaimOutcome.OVERLAP, Action.SKIP, 1, OVERLAP_SKIP)
        return Decision(ClaimOutcome.WON, Action.START, 1, None, now_ms + request.lease_ms)
    if state.status in FINISHED_STATUSES or state.status != "running":
        # An unknown status (a corrupt or foreign record) is never taken over: the run
        # may be executing; the backend reports the record and the job's other runs go on.
        return Decision(ClaimOutcome.DONE, attempt=state.attempt)
    if request.missed is not None:
        return Decision(ClaimOutcome.RUNNING, attempt=state.attempt,
                        lease_until_ms=state.lease_until_ms)
    if state.token == request.token:
        return Decision(ClaimOutcome.WON, Action.NONE, state.attempt, None, state.lease_until_ms)
    if state.lease_until_ms is not None and state.lease_until_ms > now_ms:
        return Decision(
            ClaimOutcome.RUNNING, attempt=state.attempt, lease_until_ms=state.lease_until_ms
        )
    if state.attempt < request.max_attempts:
        return Decision(
            ClaimOutcome.WON, Action.START, state.attempt + 1, LEASE_EXPIRED,
            now_ms + request.lease_ms,
        )
    return Decision(ClaimOutcome.DONE, Action.GIVE_UP, state.attempt, GAVE_UP)
