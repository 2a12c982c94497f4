"""Every row of the decision table on every lease store, from the cases of decision_cases.

Each case sets its state up through the backend's public API (claim, finish, release, and
waiting out a short lease), makes its claim or update, and checks the answer, the attempt
and what history shows for the slot. tests/test_decision_table.py runs the same cases
against decide() and update_applies().
"""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core.backend import Backend, new_token
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from .decision_cases import (
    CLAIMS,
    EXPIRY_WAIT_S,
    LIVE_LEASE_MS,
    SHORT_LEASE_MS,
    UPDATES,
    Attempt,
    ClaimCase,
    State,
    UpdateCase,
)

pytestmark = pytest.mark.timeout(60)

JOB = "job"
#: How far before the case's slot the earlier run of the overlap states is.
EARLIER_MS = 1_000


def _request(slot: int, runner: str, *, token: str | None = None, manual: bool = False,
             lease_ms: int = LIVE_LEASE_MS, overlap: str | bool = False,
             max_attempts: int = 3,
             max_late_ms: int | None = None, missed: str | None = None) -> ClaimRequest:
    return ClaimRequest(job=JOB, slot=slot, token=token or new_token(), runner=runner,
                        manual=manual, lease_ms=lease_ms, overlap=overlap,
                        max_attempts=max_attempts, max_late_ms=max_late_ms, missed=missed)


def _ref(request: ClaimRequest, attempt: int = 1) -> RunRef:
    return RunRef(request.job, request.slot, request.token, attempt, request.manual)


async def _earlier_live(backend: Backend, slot: int) -> ClaimRequest:
    """An earlier slot of the job that runs, with a live lease."""
    other = _request(slot - EARLIER_MS, "holder")
    assert (await backend.claim(other)).won
    return other


async def set_up_overlap(backend: Backend, state: State, slot: int,
                         caller_token: str) -> ClaimRequest | None:
    """The states of the overlap policies (waiting and cancelled attempts)."""
    if state is State.NONE_OTHER_WAITING:
        await _earlier_live(backend, slot - EARLIER_MS)
        waiter = _request(slot - EARLIER_MS, "waiter", overlap="buffer_one")
        assert (await backend.claim(waiter)).outcome is ClaimOutcome.BUFFERED
        return None
    if state is State.EXPIRED_OTHER_LIVE:
        holder = _request(slot, "holder", lease_ms=SHORT_LEASE_MS)
        assert (await backend.claim(holder)).won
        assert (await backend.claim(_request(slot + EARLIER_MS // 2, "later",
                                             overlap="allow"))).won
        await asyncio.sleep(EXPIRY_WAIT_S)
        return holder
    earlier = await _earlier_live(backend, slot)
    expires = state in (State.WAITING_EXPIRED, State.CANCELLED_EXPIRED)
    mine = state in (State.WAITING_OWN, State.WAITING_OWN_FREE, State.CANCELLED_OWN)
    if state in (State.CANCELLED, State.CANCELLED_EXPIRED):
        # The slot runs (its lease started before the later slot came); a later slot's
        # cancel_other claim cancels it.
        holder = _request(slot, "holder", overlap="allow",
                          lease_ms=SHORT_LEASE_MS if expires else LIVE_LEASE_MS)
        assert (await backend.claim(holder)).won
    else:
        holder = _request(slot, "holder", token=caller_token if mine else None,
                          overlap="buffer_one",
                          lease_ms=SHORT_LEASE_MS if expires else LIVE_LEASE_MS)
        assert (await backend.claim(holder)).outcome is ClaimOutcome.BUFFERED
    if state in (State.CANCELLED_OWN, State.CANCELLED, State.CANCELLED_EXPIRED):
        later = _request(slot + EARLIER_MS // 2, "later", overlap="cancel_other")
        assert (await backend.claim(later)).outcome is ClaimOutcome.BUFFERED
    if state is State.WAITING_OWN_FREE:
        assert await backend.finish(_ref(earlier), "success")
    if state is State.WAITING_RELEASED:
        assert await backend.release(_ref(holder))
    if expires:
        await asyncio.sleep(EXPIRY_WAIT_S)
    return holder


_OVERLAP_STATES = {State.NONE_OTHER_WAITING, State.EXPIRED_OTHER_LIVE, State.WAITING_OWN,
                   State.WAITING_OWN_FREE, State.CANCELLED_OWN, State.CANCELLED,
                   State.CANCELLED_EXPIRED, State.WAITING_EXPIRED, State.WAITING_RELEASED}


async def set_up(backend: Backend, state: State, slot: int, *, manual: bool = False,
                 max_attempts: int = 3, caller_token: str = "") -> ClaimRequest | None:
    """Put (JOB, slot) in ``state``; the holder's claim request, when there is one."""
    if state is State.NONE:
        return None
    if state in _OVERLAP_STATES:
        return await set_up_overlap(backend, state, slot, caller_token)
    if state in (State.NONE_OTHER_LIVE, State.NONE_OTHER_EXPIRED):
        expires = state is State.NONE_OTHER_EXPIRED
        other = _request(slot - EARLIER_MS, "holder",
                         lease_ms=SHORT_LEASE_MS if expires else LIVE_LEASE_MS)
        assert (await backend.claim(other)).won
        if expires:
            await asyncio.sleep(EXPIRY_WAIT_S)
        return None
    expires = state is State.EXPIRED
    holder = _request(slot, "holder", manual=manual, overlap=manual,
                      lease_ms=SHORT_LEASE_MS if expires else LIVE_LEASE_MS,
                      max_attempts=max_attempts)
    assert (await backend.claim(holder)).won
    if state is State.FINISHED:
        assert await backend.finish(_ref(holder), "success")
    elif state is State.FAILED:
        assert await backend.finish(_ref(holder), "failed", "ValueError: boom")
    elif state is State.RELEASED:
        assert await backend.release(_ref(holder))
    elif expires:
        await asyncio.sleep(EXPIRY_WAIT_S)
    return holder


async def slot_history(backend: Backend, slot: int, manual: bool) -> list[Attempt]:
    """The slot's attempts, newest first, as (attempt, status, error)."""
    runs = [r for r in await backend.history(JOB) if r.slot == slot and r.manual == manual]
    return [(r.attempt, r.status, r.error) for r in runs]


def assert_history(got: list[Attempt], expected: tuple[Attempt, ...] | list[Attempt],
                   case_id: str) -> None:
    assert [(a, s) for a, s, _ in got] == [(a, s) for a, s, _ in expected], (case_id, got)
    for (_, _, error), (_, _, part) in zip(got, expected, strict=True):
        if part is None:
            assert error is None, (case_id, got)
        else:
            assert part in (error or ""), (case_id, got)


@pytest.mark.parametrize("case", CLAIMS, ids=lambda c: c.id)
async def test_claim_row(lease_backend: Backend, case: ClaimCase) -> None:
    now = await lease_backend.clock_ms()
    slot = now + case.slot_offset_ms
    caller_token = new_token()
    holder = await set_up(lease_backend, case.state, slot, manual=case.manual,
                          max_attempts=case.max_attempts, caller_token=caller_token)
    own = holder.token if case.state in (State.RUNNING_OWN, State.WAITING_OWN,
                                         State.WAITING_OWN_FREE, State.CANCELLED_OWN) \
        and holder is not None else None
    request = _request(slot, "caller", token=own, manual=case.manual, overlap=case.overlap,
                       max_attempts=case.max_attempts, max_late_ms=case.max_late_ms,
                       missed=case.missed)
    result = await lease_backend.claim(request)
    assert (result.outcome, result.attempt) == (case.outcome, case.attempt)
    assert_history(await slot_history(lease_backend, slot, case.manual), case.history, case.id)
    if result.won:
        assert await lease_backend.heartbeat(_ref(request, result.attempt), LIVE_LEASE_MS), \
            "the winner holds the attempt's lease"


@pytest.mark.parametrize("case", UPDATES, ids=lambda c: c.id)
async def test_update_row(lease_backend: Backend, case: UpdateCase) -> None:
    slot = await lease_backend.clock_ms()
    holder = await set_up(lease_backend, case.state, slot, caller_token=new_token())
    assert holder is not None
    ref = _ref(holder) if case.own_token else RunRef(JOB, slot, new_token(), 1, False)
    if case.update == "heartbeat":
        answer = await lease_backend.heartbeat(ref, LIVE_LEASE_MS)
    elif case.update == "finish":
        answer = await lease_backend.finish(ref, "success")
    else:
        answer = await lease_backend.release(ref)
    assert answer is case.applies
    after = await slot_history(lease_backend, slot, False)
    assert_history(after, [case.history], case.id)
    # A live lease keeps a backup out; a released or ended attempt lets it through at once.
    backup = await lease_backend.claim(_request(slot, "backup"))
    live = case.history[1] == "running"
    expected = ClaimOutcome.RUNNING if live else (
        ClaimOutcome.WON if case.history[1] == "interrupted" else ClaimOutcome.DONE)
    note = after[0][2] or ""
    if not live and "cancelled" in note:
        expected = ClaimOutcome.DONE  # a cancelled run is never taken over
    elif not live and "buffered" in note:
        expected = ClaimOutcome.BUFFERED  # still waits for a live run: the backup waits on
    assert backup.outcome is expected, case.id
