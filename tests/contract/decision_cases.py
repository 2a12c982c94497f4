"""The lease decision table as cases: one list drives the unit test and the store contract.

Each :class:`ClaimCase` names the row of the claim table it exercises (its state and the
start of its condition, as in :mod:`anarchon_core.decision`'s docstring), the state a run
is in before the claim, the request, and what must follow: the outcome, the attempt, the
write :func:`~anarchon_core.decision.decide` asks for, and what history shows afterwards.
Each :class:`UpdateCase` does the same for a heartbeat, finish or release
(:func:`~anarchon_core.decision.update_applies`).

``tests/test_decision_table.py`` runs them against the pure functions (and checks that
every row of the docstring's tables, and of docs/concepts.md's, has a case);
``test_decision_contract.py`` sets each state up through a lease backend's public API on
every lease store and checks the same outcome, attempt and history there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from anarchon_core.decision import Action
from anarchon_core.models import ClaimOutcome

#: The lease the runs set up by the contract hold (long enough never to expire by itself).
LIVE_LEASE_MS = 60_000
#: The lease of runs meant to expire, and how long the contract waits for that.
SHORT_LEASE_MS = 200
EXPIRY_WAIT_S = 0.45


class State(enum.Enum):
    """The state of (job, slot) before the claim, and how the contract sets it up."""

    NONE = "no record"
    #: No record for the slot, but another (earlier) slot of the job holds a live lease.
    NONE_OTHER_LIVE = "no record, an earlier slot runs"
    #: No record for the slot; an earlier slot's lease has expired.
    NONE_OTHER_EXPIRED = "no record, an earlier slot's lease expired"
    FINISHED = "finished (success)"
    FAILED = "finished (failed)"
    RUNNING = "running, lease live"
    #: Running with the lease the caller itself claimed: the claim is retried.
    RUNNING_OWN = "running, the caller's own token"
    EXPIRED = "running, lease expired"
    #: Running, handed over by its runner (released): the lease is already expired.
    RELEASED = "running, released"
    #: No record; an earlier slot runs and another earlier slot waits for it (buffered).
    NONE_OTHER_WAITING = "no record, an earlier slot runs and another waits"
    #: The caller's own waiting attempt; the run it waits for is still live.
    WAITING_OWN = "running, the caller's own token, waiting"
    #: The caller's own waiting attempt; the run it waited for has ended.
    WAITING_OWN_FREE = "running, the caller's own token, waiting, the other run ended"
    #: The caller's own waiting attempt, cancelled since by a later slot (cancel_other).
    CANCELLED_OWN = "running, the caller's own token, cancelled"
    #: Running, cancelled by a later slot (cancel_other), its lease expired.
    CANCELLED_EXPIRED = "running, cancelled, lease expired"
    #: A waiting attempt whose lease expired, while the run it waits for is still live.
    WAITING_EXPIRED = "running, waiting, lease expired, the other run live"
    #: Running, lease expired, while another slot of the job holds a live lease.
    EXPIRED_OTHER_LIVE = "running, lease expired, another slot live"
    #: Running, cancelled by a later slot (cancel_other), its lease live.
    CANCELLED = "running, cancelled"
    #: A waiting attempt released by its stopping holder.
    WAITING_RELEASED = "running, waiting, released"


#: One attempt as history shows it: (attempt, status, a piece of its error or None).
Attempt = tuple[int, str, str | None]


@dataclass(frozen=True)
class ClaimCase:
    """One claim against one state, and the row of the claim table it exercises."""

    id: str
    #: (state column, start of the condition column) of the docstring's claim table.
    row: tuple[str, str]
    state: State
    outcome: ClaimOutcome
    attempt: int
    action: Action
    #: The slot relative to the store's clock, in ms.
    slot_offset_ms: int = 0
    missed: str | None = None
    max_late_ms: int | None = None
    overlap: str | bool = False
    manual: bool = False
    max_attempts: int = 3
    #: The slot's attempts after the claim, newest first.
    history: tuple[Attempt, ...] = ()


@dataclass(frozen=True)
class UpdateCase:
    """One heartbeat, finish or release of attempt 1, and the row of the update table."""

    id: str
    #: (update column, start of the condition column) of the docstring's update table.
    row: tuple[str, str]
    update: str
    state: State
    #: Whether the caller holds the attempt's token (False: a fenced-out runner).
    own_token: bool
    applies: bool
    #: Attempt 1 as history shows it after the update.
    history: Attempt = field(default=(1, "running", None))


REASON = "missed: no instance claimed it in time"

CLAIMS: list[ClaimCase] = [
    ClaimCase("early", ("none", "the slot is more than"), State.NONE, ClaimOutcome.EARLY, 0,
              Action.NONE, slot_offset_ms=30_000),
    ClaimCase("manual-run-ahead-is-not-early", ("none", "otherwise"), State.NONE,
              ClaimOutcome.WON, 1, Action.START, slot_offset_ms=30_000, manual=True,
              overlap=True, history=((1, "running", None),)),
    ClaimCase("missed-unrecorded", ("none", "a ``missed`` request"), State.NONE,
              ClaimOutcome.LATE, 1, Action.SKIP, slot_offset_ms=-5_000, missed=REASON,
              history=((1, "missed", "no instance claimed it"),)),
    ClaimCase("late", ("none", "first attempt claimed later"), State.NONE, ClaimOutcome.LATE,
              1, Action.SKIP, slot_offset_ms=-5_000, max_late_ms=1_000,
              history=((1, "skipped", "late"),)),
    ClaimCase("overlap",
              ("none", "another run of the job holds a live lease, overlap ``skip``"),
              State.NONE_OTHER_LIVE, ClaimOutcome.OVERLAP, 1, Action.SKIP,
              history=((1, "skipped", "overlap"),)),
    ClaimCase("overlap-allowed", ("none", "otherwise"), State.NONE_OTHER_LIVE,
              ClaimOutcome.WON, 1, Action.START, overlap=True,
              history=((1, "running", None),)),
    ClaimCase("overlap-allow-by-name", ("none", "otherwise"), State.NONE_OTHER_LIVE,
              ClaimOutcome.WON, 1, Action.START, overlap="allow",
              history=((1, "running", None),)),
    ClaimCase("overlap-skip-by-name",
              ("none", "another run of the job holds a live lease, overlap ``skip``"),
              State.NONE_OTHER_LIVE, ClaimOutcome.OVERLAP, 1, Action.SKIP, overlap="skip",
              history=((1, "skipped", "overlap"),)),
    ClaimCase("buffered-already", ("none", "another run holds a live lease and one"),
              State.NONE_OTHER_WAITING, ClaimOutcome.OVERLAP, 1, Action.SKIP,
              overlap="buffer_one", history=((1, "skipped", "buffered already"),)),
    ClaimCase("buffer-one",
              ("none", "another run of the job holds a live lease, overlap ``buffer_one``"),
              State.NONE_OTHER_LIVE, ClaimOutcome.BUFFERED, 1, Action.WAIT,
              overlap="buffer_one", history=((1, "running", "buffered"),)),
    ClaimCase("cancel-other",
              ("none", "another run of the job holds a live lease, overlap ``cancel_other``"),
              State.NONE_OTHER_LIVE, ClaimOutcome.BUFFERED, 1, Action.WAIT,
              overlap="cancel_other", history=((1, "running", "buffered"),)),
    ClaimCase("buffer-one-nothing-live", ("none", "otherwise"), State.NONE_OTHER_EXPIRED,
              ClaimOutcome.WON, 1, Action.START, overlap="buffer_one",
              history=((1, "running", None),)),
    ClaimCase("earlier-lease-expired", ("none", "otherwise"), State.NONE_OTHER_EXPIRED,
              ClaimOutcome.WON, 1, Action.START, history=((1, "running", None),)),
    ClaimCase("first", ("none", "otherwise"), State.NONE, ClaimOutcome.WON, 1, Action.START,
              history=((1, "running", None),)),
    ClaimCase("finished", ("finished (any status)", ""), State.FINISHED, ClaimOutcome.DONE,
              1, Action.NONE, history=((1, "success", None),)),
    ClaimCase("failed", ("finished (any status)", ""), State.FAILED, ClaimOutcome.DONE, 1,
              Action.NONE, history=((1, "failed", "boom"),)),
    ClaimCase("missed-after-finished", ("finished (any status)", ""), State.FINISHED,
              ClaimOutcome.DONE, 1, Action.NONE, missed=REASON,
              history=((1, "success", None),)),
    ClaimCase("missed-while-running", ("running", "a ``missed`` request"), State.RUNNING,
              ClaimOutcome.RUNNING, 1, Action.NONE, missed=REASON,
              history=((1, "running", None),)),
    ClaimCase("missed-after-expiry", ("running", "a ``missed`` request"), State.EXPIRED,
              ClaimOutcome.RUNNING, 1, Action.NONE, missed=REASON,
              history=((1, "interrupted", "lease expired"),)),
    ClaimCase("own-token", ("running", "the caller's own token (a claim retried"),
              State.RUNNING_OWN, ClaimOutcome.WON, 1, Action.NONE,
              history=((1, "running", None),)),
    ClaimCase("own-cancelled", ("running", "the caller's own token, cancelled"),
              State.CANCELLED_OWN, ClaimOutcome.DONE, 1, Action.GIVE_UP,
              overlap="buffer_one", history=((1, "interrupted", "cancelled"),)),
    ClaimCase("own-waiting", ("running", "the caller's own token, waiting, another"),
              State.WAITING_OWN, ClaimOutcome.BUFFERED, 1, Action.NONE,
              overlap="buffer_one", history=((1, "running", "buffered"),)),
    ClaimCase("own-waiting-starts", ("running", "the caller's own token, waiting, no"),
              State.WAITING_OWN_FREE, ClaimOutcome.WON, 1, Action.RESUME,
              overlap="buffer_one", history=((1, "running", None),)),
    ClaimCase("live", ("running", "lease in the future"), State.RUNNING,
              ClaimOutcome.RUNNING, 1, Action.NONE, history=((1, "running", None),)),
    ClaimCase("live-cancelled", ("running", "lease in the future"), State.CANCELLED,
              ClaimOutcome.RUNNING, 1, Action.NONE, overlap="cancel_other",
              history=((1, "running", "cancelled"),)),
    ClaimCase("expired-cancelled", ("running", "lease expired, cancelled"),
              State.CANCELLED_EXPIRED, ClaimOutcome.DONE, 1, Action.GIVE_UP,
              overlap="cancel_other", history=((1, "interrupted", "cancelled"),)),
    ClaimCase("waiting-taken-over", ("running", "lease expired, waiting, attempt <"),
              State.WAITING_EXPIRED, ClaimOutcome.BUFFERED, 2, Action.WAIT,
              overlap="buffer_one",
              history=((2, "running", "buffered"), (1, "interrupted", "buffered"))),
    ClaimCase("waiting-released-taken-over", ("running", "lease expired, waiting, attempt <"),
              State.WAITING_RELEASED, ClaimOutcome.BUFFERED, 2, Action.WAIT,
              overlap="buffer_one",
              history=((2, "running", "buffered"), (1, "interrupted", "handed over"))),
    ClaimCase("takeover-waits-for-a-live-run", ("running", "lease expired, another run"),
              State.EXPIRED_OTHER_LIVE, ClaimOutcome.RUNNING, 1, Action.NONE,
              history=((1, "interrupted", "lease expired"),)),
    ClaimCase("retried-beside-a-live-run-when-allowed",
              ("running", "lease expired, attempt < max_attempts"), State.EXPIRED_OTHER_LIVE,
              ClaimOutcome.WON, 2, Action.START, overlap="allow",
              history=((2, "running", None), (1, "interrupted", "lease expired"))),
    ClaimCase("takeover", ("running", "lease expired, attempt < max_attempts"),
              State.EXPIRED, ClaimOutcome.WON, 2, Action.START,
              history=((2, "running", None), (1, "interrupted", "lease expired"))),
    ClaimCase("takeover-after-release", ("running", "lease expired, attempt < max_attempts"),
              State.RELEASED, ClaimOutcome.WON, 2, Action.START,
              history=((2, "running", None), (1, "interrupted", "handed over"))),
    ClaimCase("give-up", ("running", "lease expired, no attempts left"), State.EXPIRED,
              ClaimOutcome.DONE, 1, Action.GIVE_UP, max_attempts=1,
              history=((1, "interrupted", "max_attempts"),)),
]

UPDATES: list[UpdateCase] = [
    UpdateCase("heartbeat", ("heartbeat", "``running``"), "heartbeat", State.RUNNING, True,
               True),
    UpdateCase("finish", ("finish", "``running``"), "finish", State.RUNNING, True, True,
               (1, "success", None)),
    UpdateCase("release", ("release", "``running``"), "release", State.RUNNING, True, True,
               (1, "interrupted", "handed over")),
    UpdateCase("release-retried", ("release", "``running``"), "release", State.RELEASED,
               True, True, (1, "interrupted", "handed over")),
    UpdateCase("heartbeat-after-release", ("any", "otherwise"), "heartbeat", State.RELEASED,
               True, False, (1, "interrupted", "handed over")),
    UpdateCase("finish-after-release", ("any", "otherwise"), "finish", State.RELEASED, True,
               False, (1, "interrupted", "handed over")),
    UpdateCase("heartbeat-fenced", ("any", "otherwise"), "heartbeat", State.RUNNING, False,
               False),
    UpdateCase("finish-fenced", ("any", "otherwise"), "finish", State.RUNNING, False, False),
    UpdateCase("release-fenced", ("any", "otherwise"), "release", State.RUNNING, False,
               False),
    UpdateCase("heartbeat-finished", ("any", "otherwise"), "heartbeat", State.FINISHED, True,
               False, (1, "success", None)),
    UpdateCase("finish-twice", ("any", "otherwise"), "finish", State.FINISHED, True, False,
               (1, "success", None)),
    UpdateCase("release-finished", ("any", "otherwise"), "release", State.FINISHED, True,
               False, (1, "success", None)),
    UpdateCase("heartbeat-waiting", ("heartbeat", "``running``"), "heartbeat",
               State.WAITING_OWN, True, True, (1, "running", "buffered")),
    UpdateCase("release-waiting", ("release", "``running``"), "release", State.WAITING_OWN,
               True, True, (1, "interrupted", "handed over")),
    UpdateCase("heartbeat-cancelled", ("any", "otherwise"), "heartbeat", State.CANCELLED,
               True, False, (1, "running", "cancelled")),
    UpdateCase("finish-cancelled", ("any", "otherwise"), "finish", State.CANCELLED, True,
               False, (1, "running", "cancelled")),
    UpdateCase("release-cancelled", ("release", "``running``"), "release", State.CANCELLED,
               True, True, (1, "interrupted", "cancelled")),
]
