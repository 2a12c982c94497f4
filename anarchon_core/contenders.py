"""Contender sets: which instances of a fleet claim a slot, agreed on without talking.

Every instance of a fleet refreshes its registry record (:mod:`.membership`) with a
*group*: a digest of the jobs it fires and how it defines them, so instances in one group
fire the same slots. For each (job, slot) the live members of an instance's group are
ranked by rendezvous hashing of (job, slot, member): every instance that sees the same
members computes the same order, and a member joining or leaving moves only the slots it
ranks first or among the first.

The first :data:`CONTENDERS` members contend for the slot: rank 0 claims at the slot's
time, rank ``r`` looks ``r`` × :data:`RANK_DELAY_MS` later (on a grid of
:data:`LOOK_GRID_MS`) whether the store has a record
of the slot (one read for every slot due together) and claims only if it has none; it
watches a run found going on, as a backup. The other members neither claim nor watch
the slot. The claim itself still decides, so a member's wrong view can only cost work (two
contenders claiming) or time (a slot ranked to a member that is gone starts when the
next contender looks), never a second run. A slot is missed only when all its contenders
are gone within one refresh of the view (:data:`MEMBER_FRESH_MS`).

Without a fresh view every instance claims every slot, as without contender sets: on a
store with no fleet registry (claim-only stores), before the first read of the registry,
and when it could not be read for :data:`VIEW_STALE_S`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable

from .clocks import Clock

__all__ = ["CONTENDERS", "JITTER_STEP_MS", "LOOK_GRID_MS", "MAX_JITTER_STEP_MS",
           "MEMBER_FRESH_MS", "ORPHAN_SCAN", "RANK_DELAY_MS", "VIEW_STALE_S", "Contenders",
           "FleetView", "group_digest", "look_at", "rank_delay_ms"]

log = logging.getLogger("anarchon.fleet")

#: How many members of a group contend for each slot (rank 0 claims, the others look).
CONTENDERS = 3
#: How long after the previous rank each later contender looks at a slot (ms).
RANK_DELAY_MS = 300
#: Later contenders look at the slots due on a grid of this step (ms), so that one read
#: answers for the slots of many jobs.
LOOK_GRID_MS = 250
#: The jitter of a slot is drawn on a grid of this step per live member (ms), up to
#: :data:`MAX_JITTER_STEP_MS`.
JITTER_STEP_MS = 20
MAX_JITTER_STEP_MS = 250
#: A member whose registry record was refreshed longer ago than this is left out (ms).
MEMBER_FRESH_MS = 8_000
#: Without a successful read of the registry for this long, every slot is claimed (s).
VIEW_STALE_S = 8.0
#: The "slot" orphan recovery ranks a job by: the same contenders scan a job every period.
ORPHAN_SCAN = -1

_MASK = (1 << 64) - 1


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _mix(x: int) -> int:
    """A 64-bit finaliser (splitmix64): every input bit moves every output bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def group_digest(jobs: Iterable[tuple[str, str]]) -> str:
    """The group of an instance firing ``jobs`` (pairs of name and definition digest)."""
    text = "\n".join(sorted(f"{name}\0{digest}" for name, digest in jobs))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def rank_delay_ms(max_late_ms: int | None) -> int:
    """The delay between ranks for a job: every contender looks within its lateness bound."""
    if max_late_ms is None:
        return RANK_DELAY_MS
    return max(0, min(RANK_DELAY_MS, max_late_ms // CONTENDERS))


def look_at(fire_at: float, rank: int, max_late_ms: int | None) -> float:
    """When a later contender (``rank`` ≥ 1) of a slot due at ``fire_at`` looks at it.

    ``rank`` rank delays later, rounded up to the look grid, unless the job's lateness
    bound is too short for the grid: then exactly the delays later.
    """
    delay = rank * rank_delay_ms(max_late_ms)
    if max_late_ms is not None and \
            max_late_ms < CONTENDERS * (RANK_DELAY_MS + LOOK_GRID_MS):
        return fire_at + delay
    return -(-(fire_at + delay) // LOOK_GRID_MS) * LOOK_GRID_MS


class FleetView:
    """The live members of this instance's group, as one read of the registry found them."""

    __slots__ = ("_mine", "_others", "me", "members")

    def __init__(self, me: str, members: tuple[str, ...]) -> None:
        self.me = me
        self.members = members
        self._mine = _hash64(me)
        self._others = tuple(_hash64(m) for m in members if m != me)

    def rank(self, job: str, slot: int) -> int:
        """The rank of ``me`` for ``slot`` of ``job``: 0 first; at most :data:`CONTENDERS`.

        A rank of :data:`CONTENDERS` means "not a contender" (how far past it is not
        counted).
        """
        key = _hash64(f"{job}\0{slot}")
        mine = _mix(key ^ self._mine)
        better = 0
        for other in self._others:
            if _mix(key ^ other) > mine:
                better += 1
                if better >= CONTENDERS:
                    break
        return better

    def jitter(self, job: str, slot: int, jitter_ms: int) -> float:
        """The jitter (ms) every member draws alike for this slot, within ``jitter_ms``.

        Drawn on a grid of :data:`JITTER_STEP_MS` per member (at most
        :data:`MAX_JITTER_STEP_MS`): with a larger fleet each instance claims fewer slots,
        and the grid keeps its claims of one stretch in one round trip.
        """
        if jitter_ms <= 0:
            return 0.0
        drawn = jitter_ms * _mix(_hash64(f"{job}\0{slot}\0jitter")) / (1 << 64)
        step = min(jitter_ms, MAX_JITTER_STEP_MS, JITTER_STEP_MS * len(self.members))
        return float(drawn // step * step)


class Contenders:
    """One scheduler's view of its group (see the module's docstring).

    :param enabled: False: every slot is claimed here (no view is ever used).
    :param on_change: called (on the scheduler's loop) when the view starts or stops
        applying, or its members change: the timers are armed again.
    """

    def __init__(self, instance_id: str, *, enabled: bool, clock: Clock,
                 on_change: Callable[[], None] | None = None) -> None:
        self.instance_id = instance_id
        self.enabled = enabled
        self._clock = clock
        self.on_change = on_change
        self._view: FleetView | None = None
        self._fresh_until = 0.0
        self._applied: FleetView | None = None

    def update(self, members: Iterable[str]) -> None:
        """A read of the registry found these live members of the group (self included)."""
        if not self.enabled:
            return
        ids = tuple(sorted({*members, self.instance_id}))
        if self._view is None or self._view.members != ids:
            self._view = FleetView(self.instance_id, ids)
        self._fresh_until = self._clock.monotonic() + VIEW_STALE_S
        self._check_change()

    def forget(self) -> None:
        """Drop the view (the scheduler stopped): every slot is claimed until the next read."""
        self._view = self._applied = None
        self._fresh_until = 0.0

    def check(self) -> None:
        """Notice a view gone stale (called on every refresh, successful or not)."""
        self._check_change()

    def view(self) -> FleetView | None:
        """The view to rank by now; None: claim every slot."""
        if self._view is None or self._clock.monotonic() > self._fresh_until:
            return None
        return self._view

    def rank(self, job: str, slot: int) -> int | None:
        """The rank of this instance for a slot (None: no view, claim it)."""
        view = self.view()
        return None if view is None else view.rank(job, slot)

    def _check_change(self) -> None:
        view = self.view()
        if view is self._applied or (view is not None and self._applied is not None
                                     and view.members == self._applied.members):
            return
        before = self._applied
        self._applied = view
        if view is None:
            log.info("contender sets off: no fresh view of the fleet; every slot is claimed")
        elif before is None or len(before.members) != len(view.members):
            log.info("contender sets: %d live instance(s) in this group",
                     len(view.members))
        if self.on_change is not None:
            self.on_change()
