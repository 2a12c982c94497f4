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
                       lease, overlap ``skip``                   (overlap) → ``overlap``
none                   another run holds a live lease and one    record ``skipped``
                       waits already, overlap ``buffer_one``     (buffered) → ``overlap``
none                   another run of the job holds a live       attempt 1 waiting
                       lease, overlap ``buffer_one``             → ``buffered``
none                   another run of the job holds a live       mark the live runs
                       lease, overlap ``cancel_other``           cancelled, attempt 1
                                                                 waiting → ``buffered``
none                   otherwise                                 attempt 1 → ``won``
finished (any status)                                            none → ``done``
running                a ``missed`` request                      none → ``running``
running                the caller's own token, cancelled         mark ``interrupted``
                                                                 for good → ``done``
running                the caller's own token, waiting, another  none → ``buffered``
                       run holds a live lease
running                the caller's own token, waiting, no       start the waiting
                       other run live                            attempt → ``won``
running                the caller's own token (a claim retried   none → ``won``
                       after its answer was lost)                (same attempt)
running                lease in the future                       none → ``running``
running                lease expired, cancelled                  mark ``interrupted``
                                                                 for good → ``done``
running                lease expired, waiting, attempt <         mark attempt
                       max_attempts, another run holds a live    ``interrupted``,
                       lease                                     attempt+1 waiting →
                                                                 ``buffered``
running                lease expired, another run holds a live   none → ``running``
                       lease, overlap not ``allow``              (taken over once it
                                                                 ends)
running                lease expired, attempt < max_attempts     mark attempt
                                                                 ``interrupted``, store
                                                                 attempt+1 → ``won``
running                lease expired, no attempts left           mark ``interrupted``
                                                                 for good → ``done``
=====================  ========================================  =====================

"Waiting" and "cancelled" are notes in the running attempt's error (:data:`WAITING`,
:data:`WAITING_HANDED_OVER`, :data:`CANCELLED`): a waiting attempt holds its slot's lease
while another run of the job ends, and starts (its error cleared, a fresh lease) on its
holder's next claim once no other run's lease is live. A ``cancel_other`` claim marks every
other live run of the job :data:`CANCELLED`: their heartbeats are refused from then on, so
their runners stop their code and release, and the new slot starts once no lease of theirs
is live. A run whose lease expired while another run of the job is live is not taken over
until that run has ended unless the job allows overlap, so no two runs of a job run at
once but under ``allow``.

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
                       released nor cancelled                    → ``True``
finish                 ``running``, the caller's token, not      the end → ``True``
                       released nor cancelled
release                ``running``, the caller's token           lease = now, error
                                                                 :func:`released_error`
                                                                 → ``True``
any                    otherwise                                 none → ``False``
=====================  ========================================  =====================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .models import FINISHED_STATUSES, ClaimOutcome, ClaimRequest
from .options import MAX_LEASE_MS

__all__ = ["CANCELLED", "MAX_LEASE_AHEAD_MS", "WAITING", "WAITING_HANDED_OVER", "Action",
           "Decision", "RunState", "decide", "lease_is_live", "needs_overlap_check",
           "released_error", "update_applies"]

LEASE_EXPIRED = "lease expired: the runner stopped heartbeating"
GAVE_UP = "lease expired: the runner stopped heartbeating; max_attempts reached"
HANDED_OVER = "handed over: the runner was stopping"
#: The error notes of a running attempt that waits (overlap ``buffer_one``/``cancel_other``).
WAITING = "buffered: waits for another run of this job to end"
WAITING_HANDED_OVER = "buffered: handed over by a stopping instance while waiting"
#: The error note of a run a later slot's ``cancel_other`` claim replaces.
CANCELLED = "cancelled: a later slot of this job replaces it (overlap cancel_other)"
#: Why a slot is skipped under ``buffer_one`` when another slot is buffered already.
ALREADY_BUFFERED = "overlap: another slot of this job is buffered already"
#: Notes that end an attempt's right to heartbeat or finish (see :func:`update_applies`).
FINAL_NOTES = (HANDED_OVER, WAITING_HANDED_OVER, CANCELLED)
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
    WAIT = "wait"              # START, with the attempt's error noted WAITING
    RESUME = "resume"          # the waiting attempt starts: error cleared, lease renewed
    SKIP = "skip"              # record the run as skipped with `error`
    GIVE_UP = "give_up"        # mark the current attempt interrupted for good with `error`


@dataclass(frozen=True)
class RunState:
    """The current attempt of a run as the store holds it."""

    attempt: int
    token: str
    status: str
    lease_until_ms: int | None
    #: The running attempt's error note (:data:`HANDED_OVER`, :data:`WAITING`, ...).
    error: str | None = None

    @property
    def waiting(self) -> bool:
        """Whether the attempt waits for another run (overlap ``buffer_one``/``cancel_other``)."""
        return self.error in (WAITING, WAITING_HANDED_OVER)


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
    #: Mark every other live run of the job :data:`CANCELLED` (overlap ``cancel_other``).
    cancel_others: bool = False


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
    return update == "release" or error not in FINAL_NOTES


def released_error(error: str | None) -> str:
    """The error note a release leaves on the running attempt whose note was ``error``.

    :data:`HANDED_OVER`; a waiting attempt's :data:`WAITING_HANDED_OVER` (it still waits
    when taken over); a cancelled one stays :data:`CANCELLED` (it is never taken over).
    """
    if error == CANCELLED:
        return CANCELLED
    if error in (WAITING, WAITING_HANDED_OVER):
        return WAITING_HANDED_OVER
    return HANDED_OVER


def lease_is_live(lease_until_ms: int | None, now_ms: int) -> bool:
    """Whether another run's lease counts for the overlap check (see the module docstring).

    It ends after ``now_ms`` (the store's clock) and at most :data:`MAX_LEASE_AHEAD_MS`
    after it; a lease further ahead is corrupt and does not count.
    """
    return lease_until_ms is not None and now_ms < lease_until_ms <= now_ms + MAX_LEASE_AHEAD_MS


def needs_overlap_check(request: ClaimRequest, state: RunState | None) -> bool:
    """Whether :func:`decide` needs to know of the job's other live runs.

    A first claim under any policy but ``allow``; a waiting attempt's own claim; a
    takeover (the caller cannot know here whether the lease expired: the store's clock
    decides, so any claim of a running attempt that is not the caller's asks).
    """
    if state is None:
        return request.policy != "allow"
    if state.status != "running" or request.missed is not None:
        return False
    if state.token == request.token:
        return state.waiting
    return request.policy != "allow" or state.waiting


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
    request: ClaimRequest, state: RunState | None, now_ms: int, other_live: bool = False,
    other_waiting: bool = False,
) -> Decision:
    """Apply the lease decision table (see the module docstring).

    ``now_ms`` is the store's clock. ``other_live`` tells whether another run of the same
    job holds a live lease (:func:`lease_is_live`), ``other_waiting`` whether one of those
    is a waiting attempt; they are read only when :func:`needs_overlap_check` says so.
    """
    policy = request.policy
    if state is None:
        if request.slot > now_ms + EARLY_TOLERANCE_MS and not request.manual:
            return Decision(ClaimOutcome.EARLY)
        if request.missed is not None:
            return Decision(ClaimOutcome.LATE, Action.SKIP, 1, request.missed,
                            status="missed")
        if request.max_late_ms is not None and now_ms > request.slot + request.max_late_ms:
            return Decision(ClaimOutcome.LATE, Action.SKIP, 1, late_error(request, now_ms))
        lease_until = now_ms + request.lease_ms
        if other_live and policy == "skip":
            return Decision(ClaimOutcome.OVERLAP, Action.SKIP, 1, OVERLAP_SKIP)
        if other_live and policy == "buffer_one":
            if other_waiting:
                return Decision(ClaimOutcome.OVERLAP, Action.SKIP, 1, ALREADY_BUFFERED)
            return Decision(ClaimOutcome.BUFFERED, Action.WAIT, 1, WAITING, lease_until)
        if other_live and policy == "cancel_other":
            return Decision(ClaimOutcome.BUFFERED, Action.WAIT, 1, WAITING, lease_until,
                            cancel_others=True)
        return Decision(ClaimOutcome.WON, Action.START, 1, None, lease_until)
    if state.status in FINISHED_STATUSES or state.status != "running":
        # An unknown status (a corrupt or foreign record) is never taken over: the run
        # may be executing; the backend reports the record and the job's other runs go on.
        return Decision(ClaimOutcome.DONE, attempt=state.attempt)
    if request.missed is not None:
        return Decision(ClaimOutcome.RUNNING, attempt=state.attempt,
                        lease_until_ms=state.lease_until_ms)
    if state.token == request.token:
        if state.error == CANCELLED:
            return Decision(ClaimOutcome.DONE, Action.GIVE_UP, state.attempt, CANCELLED)
        if state.waiting:
            if other_live:
                return Decision(ClaimOutcome.BUFFERED, Action.NONE, state.attempt, None,
                                state.lease_until_ms)
            return Decision(ClaimOutcome.WON, Action.RESUME, state.attempt, None,
                            now_ms + request.lease_ms)
        return Decision(ClaimOutcome.WON, Action.NONE, state.attempt, None, state.lease_until_ms)
    if state.lease_until_ms is not None and state.lease_until_ms > now_ms:
        return Decision(
            ClaimOutcome.RUNNING, attempt=state.attempt, lease_until_ms=state.lease_until_ms
        )
    if state.error == CANCELLED:
        return Decision(ClaimOutcome.DONE, Action.GIVE_UP, state.attempt, CANCELLED)
    can_retry = state.attempt < request.max_attempts
    if state.waiting and can_retry and other_live:
        return Decision(ClaimOutcome.BUFFERED, Action.WAIT, state.attempt + 1, WAITING,
                        now_ms + request.lease_ms)
    if other_live and policy != "allow" and not state.waiting:
        # Taken over once that run has ended (its backups and orphan recovery claim on).
        return Decision(ClaimOutcome.RUNNING, attempt=state.attempt,
                        lease_until_ms=state.lease_until_ms)
    if can_retry:
        return Decision(
            ClaimOutcome.WON, Action.START, state.attempt + 1, LEASE_EXPIRED,
            now_ms + request.lease_ms,
        )
    return Decision(ClaimOutcome.DONE, Action.GIVE_UP, state.attempt, GAVE_UP)
