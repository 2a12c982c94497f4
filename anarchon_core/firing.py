"""Firing each job's slots on time: the one timer armed per job, and the claims of what is due.

:class:`Firing` puts every job's next slot (with jitter) on the scheduler's one timer
(:class:`~anarchon_core.timers.SlotTimers`), claims the slots that come due together in one
store call, and at start catches up the slots missed within a job's ``catch_up_ms`` by its
``catch_up`` policy: the newest one (``"newest"``, standing for all of them), every one
oldest first (``"all"``), or none. What each claim's answer leads to is
:class:`~anarchon_core.runs.Runs`' part.

With a view of the fleet (:mod:`~anarchon_core.contenders`) only the slots this instance
contends for are armed: rank 0 at the slot's time plus a jitter every contender draws
alike, a later rank that many rank delays later, when it first reads whether the slot is
on record (:meth:`Firing.look_then_claim`) and claims only if it is not.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any

from .backend import Backend
from .claim import ClaimHandle
from .claiming import Claims, NotClaimed
from .contenders import CONTENDERS, Contenders, look_at, rank_delay_ms
from .downtime import CATCH_UP_ALL_MAX, catch_up_slots, slots_between
from .errors import StoreError, StoreUnavailable
from .health import StoreHealth
from .jobs import RegisteredJob
from .models import ClaimOutcome, ClaimRequest
from .runs import Runs
from .schedules import Schedule
from .supervision import LoopGuard
from .timers import SlotTimers

__all__ = ["Firing"]

log = logging.getLogger("anarchon.scheduler")

#: A catch-up claim of ``catch_up="all"`` may come this long after the claim's own lateness
#: (its slot was in the window when the catch-up began).
_CATCH_UP_MARGIN_MS = 1_000
#: ``catch_up="all"`` goes on with the slots that came due while it caught up, this many
#: times at most; then the job's timer takes over.
_CATCH_UP_PASSES = 4
#: A job's slots this instance does not contend for are passed over up to this far ahead
#: (ms), and at most this many; past that it wakes up and looks again.
_SKIP_HORIZON_MS = 600_000
_MAX_SKIPS = 256
#: Why a member that does not contend for a slot did not claim it.
NOT_A_CONTENDER = "taken: another instance of the fleet contends for this slot"
#: Jobs re-armed between two turns of the event loop after the fleet view changed.
_REARM_CHUNK = 500


class Firing:
    """Fires one scheduler's jobs (see the module's docstring).

    :param active: whether the scheduler runs and is not stopping.
    :param catch_up: whether ``catch_up_ms`` applies (lease stores only).
    :param watch: be a backup of a slot running elsewhere until it ends (or is run here).
    """

    def __init__(self, backend: Backend, timers: SlotTimers, claims: Claims, runs: Runs, *,
                 health: StoreHealth,
                 watch: Callable[[RegisteredJob, int], Coroutine[Any, Any, None]],
                 now_ms: Callable[[], float], job: Callable[[str], RegisteredJob | None],
                 jobs: Callable[[], list[RegisteredJob]],
                 spawn: Callable[[Coroutine[Any, Any, Any]], object],
                 active: Callable[[], bool], stopping: Callable[[], bool],
                 catch_up: bool, contenders: Contenders) -> None:
        self._backend = backend
        self._health = health
        self._watch = watch
        self._timers = timers
        self._claims = claims
        self._runs = runs
        self._now_ms = now_ms
        self._job = job
        self._job_list = jobs
        self._spawn = spawn
        self._active = active
        self._stopping = stopping
        self._catch_up_allowed = catch_up
        self._contenders = contenders
        self._rearm_round = 0

    def start_job(self, job: RegisteredJob) -> None:
        """Arm a job's next slot (and catch its last one up) if this scheduler fires it."""
        if job.handler is None or job.schedule is None or not job.fires:
            return
        if self._job(job.name) is not job or not self._active():
            return
        job.generation += 1
        job.handled_ms = now = round(self._now_ms())
        catch_up = job.options.catch_up if job.options.catch_up_ms and \
            self._catch_up_allowed else "none"
        if catch_up == "all":
            job.catching_up = True  # armed once the missed slots are through
        self.arm(job, job.schedule, now)
        if catch_up != "none":
            self._spawn(self.catch_up(job, job.schedule))

    def arm(self, job: RegisteredJob, schedule: Schedule, after_ms: int) -> None:
        """Put the job's first slot after ``after_ms`` this instance contends for on the timer.

        Without a view of the fleet: the first slot, with fresh jitter. With one, slots
        ranked to others are passed over (up to a bound, then a wake-up that looks again).
        """
        if job.catching_up:
            return
        slot = schedule.next_after(after_ms)
        view = self._contenders.view()
        if view is None:
            job.generation = self._timers.arm(job.name, slot,
                                              slot + random.uniform(0, job.options.jitter_ms))
            return
        rank = view.rank(job.name, slot)
        horizon = slot + _SKIP_HORIZON_MS
        for _ in range(_MAX_SKIPS):
            if rank < CONTENDERS:
                break
            later = schedule.next_after(slot)
            if later > horizon:
                break
            slot, rank = later, view.rank(job.name, later)
        at = float(slot)
        if rank < CONTENDERS:
            at += view.jitter(job.name, slot, job.options.jitter_ms)
        if 0 < rank < CONTENDERS:
            at = look_at(at, rank, job.options.max_late_ms)
        job.generation = self._timers.arm(job.name, slot, at)

    async def loop(self, guard: LoopGuard) -> None:
        """Claim each job's slots as they come off the one timer (:mod:`.timers`)."""
        due: list[tuple[RegisteredJob, int]] = []

        def fire(name: str, seq: int, slot: int, now: float) -> bool:
            job = self._job(name)
            if job is None or job.generation != seq or job.schedule is None:
                return False  # removed or re-armed since
            due.append((job, slot))
            job.handled_ms = slot
            # A wake-up late by up to the job's jitter still claims its next slot.
            self.arm(job, job.schedule, max(slot, round(now) - job.options.jitter_ms))
            return True

        def claim_due() -> None:
            batch = due.copy()
            due.clear()
            self._spawn(self.claim_due(batch))

        await self._timers.run(guard, stopping=self._stopping, fire=fire,
                               due=claim_due, rearm_all=self.rearm_all)

    def rearm_all(self) -> None:
        """Arm every job again from now (the store's clock moved)."""
        now = round(self._now_ms())
        self._timers.clear()
        for job in self._job_list():
            if job.handler is not None and job.schedule is not None and job.fires:
                job.generation += 1
                self.arm(job, job.schedule, now)

    def contenders_changed(self) -> None:
        """Arm every job again after the fleet view changed (members, or none at all).

        Each job goes on from the newest slot it fired (or from its start), at most as far
        back as a slot could still be waiting for its jitter and rank delays: a slot this
        instance passed over and now contends for is not passed over again. Jobs are
        re-armed a chunk at a time (each keeps its old timer until then), and a newer
        change starts over.
        """
        if not self._active():
            return
        self._rearm_round += 1
        self._spawn(self._rearm_from_handled(self._rearm_round))

    async def _rearm_from_handled(self, round_: int) -> None:
        jobs = [j for j in self._job_list()
                if j.handler is not None and j.schedule is not None and j.fires]
        for i, job in enumerate(jobs):
            if i and i % _REARM_CHUNK == 0:
                await asyncio.sleep(0)
            if self._rearm_round != round_ or not self._active():
                return
            if self._job(job.name) is not job or job.schedule is None:
                continue
            back = round(self._now_ms()) - job.options.jitter_ms - CONTENDERS * rank_delay_ms(
                job.options.max_late_ms)
            handled = job.handled_ms
            self.arm(job, job.schedule, back if handled is None else max(back, handled))

    async def catch_up(self, job: RegisteredJob, schedule: Schedule) -> None:
        """Claim the slots missed within ``catch_up_ms`` by the job's policy (at start).

        The run that catches up carries ``missed_count`` (in ``ctx.missed_count`` and its
        history ``meta``): how many missed slots it stands for.
        """
        if job.options.catch_up == "all":
            await self._catch_up_all(job, schedule)
            return
        window = catch_up_slots(job, schedule, round(self._now_ms()))
        if not window:
            return
        try:
            newest = (await self._health.timed(
                "newest_slots", self._backend.newest_slots([job.name]))).get(job.name)
        except StoreUnavailable as exc:
            log.debug("%s: catch-up reads no newest run (%s); the claim decides", job.name, exc)
            newest = None
        missed = [slot for slot in window if newest is None or slot > newest]
        if missed:
            log.info("%s: catching up slot %s (%d missed)", job.name, missed[-1], len(missed))
            await self._catch_up_one(job, missed[-1], len(missed),
                                     max_late_ms=job.options.catch_up_ms)

    async def _catch_up_all(self, job: RegisteredJob, schedule: Schedule) -> None:
        """Every slot of the window in turn, then those that came due meanwhile; then arm.

        Also the slots that ran are claimed (they answer done): an instance that started
        later than another must not claim ahead of it.
        """
        upto: int | None = None
        try:
            window = catch_up_slots(job, schedule, round(self._now_ms()))
            if window:
                log.info("%s: catching up the slots of the last %d ms, oldest first",
                         job.name, job.options.catch_up_ms)
            for _ in range(_CATCH_UP_PASSES):
                for slot in window:
                    if not self._active():
                        return
                    late = round(self._now_ms()) - slot + _CATCH_UP_MARGIN_MS
                    await self._catch_up_one(job, slot, 1,
                                             max_late_ms=max(job.options.catch_up_ms, late))
                    upto = slot
                if upto is None:
                    break
                window = slots_between(schedule, upto, round(self._now_ms()),
                                       CATCH_UP_ALL_MAX)
                if not window:
                    break
        finally:
            job.catching_up = False
            if self._job(job.name) is job and self._active():
                self.arm(job, schedule, round(self._now_ms()) if upto is None else upto)

    async def _catch_up_one(self, job: RegisteredJob, slot: int, missed_count: int, *,
                            max_late_ms: int) -> None:
        """Claim one catch-up slot and wait for its end: run here, or watched elsewhere.

        Under ``skip`` a catch-up slot waits for a run of the job still live (a run taken
        over at start, say) instead of being skipped beside it: it is the one chance that
        slot has.
        """
        policy = job.options.overlap
        request = self._claims.request(job, slot, max_late_ms=max_late_ms,
                                       overlap="buffer_one" if policy == "skip" else policy)
        outcome = await self._claims.claim_slot(job, slot, request=request)
        if isinstance(outcome, ClaimHandle):
            outcome.meta.update(catch_up=job.options.catch_up, missed_count=str(missed_count))
            await self._runs.run_handle(job, outcome)
        elif outcome.outcome is ClaimOutcome.RUNNING:
            await self._watch(job, slot)  # another instance catches up: be its backup
        else:
            self._runs.on_not_claimed(job, slot, outcome)

    async def claim_due(self, due: list[tuple[RegisteredJob, int]]) -> None:
        """Claim the slots the timer found due together, in one call of the store.

        Each claim is still its own request and decision; one that failed (or came early
        by the store's clock) goes the one-by-one way, with its retries, same token.
        With a view of the fleet, the slots of a later rank are looked at first
        (:meth:`look_then_claim`) and a wake-up of a slot ranked to others does nothing.
        """
        view = self._contenders.view()
        if view is not None:
            ranks = [view.rank(job.name, slot) for job, slot in due]
            later = [d for d, rank in zip(due, ranks, strict=True) if 0 < rank < CONTENDERS]
            due = [d for d, rank in zip(due, ranks, strict=True) if rank == 0]
            if later:
                self._spawn(self.look_then_claim(later))
        if due:
            await self._claim(due)

    async def look_then_claim(self, due: list[tuple[RegisteredJob, int]]) -> None:
        """A later contender's turn: claim the slots the store has no record of.

        A slot found running elsewhere is watched, as a backup; one that ended is left.
        A store that cannot tell (or does not answer) is claimed instead: the claim decides.
        """
        try:
            states = await self._health.timed("slot_states", self._backend.slot_states(
                [(job.name, slot) for job, slot in due]))
        except (StoreUnavailable, StoreError) as exc:
            log.debug("%d slot(s) not looked at (%s); claiming them", len(due), exc)
            states = None
        if states is None:
            await self._claim(due)
            return
        unclaimed = []
        for job, slot in due:
            status = states.get((job.name, slot))
            if status is None:
                unclaimed.append((job, slot))
            elif status == "running" and not self._stopping():
                self._spawn(self._watch(job, slot))
        if unclaimed:
            await self._claim(unclaimed)

    async def caller_turn(self, job: RegisteredJob, slot: int) -> NotClaimed | None:
        """Whether a caller's claim of a ``define(contenders=True)`` job goes to the store.

        None: claim now (rank 0, or no view). A later contender waits its rank delays and
        looks first: a slot on record is answered as it is (``running``, watched by a
        backup job's :meth:`watch`; else ``done``). A member that does not contend for
        the slot is answered ``taken`` at once.
        """
        rank = self._contenders.rank(job.name, slot)
        if rank is None or rank == 0:
            return None
        if rank >= CONTENDERS:
            return NotClaimed(job.name, slot, ClaimOutcome.TAKEN, NOT_A_CONTENDER)
        await asyncio.sleep(rank * rank_delay_ms(job.options.max_late_ms) / 1000)
        try:
            states = await self._health.timed("slot_states",
                                              self._backend.slot_states([(job.name, slot)]))
        except (StoreUnavailable, StoreError):
            return None
        status = None if states is None else states.get((job.name, slot))
        if status is None:
            return None
        if status != "running":
            return NotClaimed(job.name, slot, ClaimOutcome.DONE, f"done: {status}")
        if job.on_takeover is not None and not self._stopping():
            self._spawn(self._watch(job, slot))
        return NotClaimed(job.name, slot, ClaimOutcome.RUNNING,
                          "running: claimed by another instance")

    async def _claim(self, due: list[tuple[RegisteredJob, int]]) -> None:
        claims, runs = self._claims, self._runs
        requests = [claims.request(job, slot) for job, slot in due]
        results, sent = await claims.send_many(requests)
        for (job, slot), request, result in zip(due, requests, results, strict=True):
            if isinstance(result, BaseException) or result.outcome is ClaimOutcome.EARLY:
                self._spawn(self.claim_and_handle(
                    job, slot, request=request, answer_lost=isinstance(result, BaseException)))
                continue
            claims.report(request, result)
            if result.won:
                self._spawn(runs.run_won(job, claims.handle(request, result, sent)))
            elif result.outcome is ClaimOutcome.BUFFERED:
                self._spawn(runs.run_buffered(job, request, claims.handle(request, result, sent)))
            elif not self._stopping():
                runs.on_not_claimed(job, slot, claims.not_claimed(request, result))

    async def claim_and_handle(self, job: RegisteredJob, slot: int,
                               max_late_ms: int | None = None,
                               request: ClaimRequest | None = None,
                               answer_lost: bool = False) -> None:
        """Claim one slot the one-by-one way, then run, watch or log."""
        outcome = await self._claims.claim_slot(job, slot, max_late_ms=max_late_ms,
                                                request=request, answer_lost=answer_lost)
        await self._runs.go_on(job, slot, outcome)

