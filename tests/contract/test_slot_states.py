"""``Backend.slot_states``: what a later contender of a slot reads before it claims.

Every lease store answers, in one read, the status of the newest attempt of each
scheduled slot it has a record of, and leaves out slots without one; manual runs of the
same slot are not scheduled slots. Claim-only stores cannot tell (``None``).
"""

from __future__ import annotations

import pytest

from anarchon_core.backend import Backend
from anarchon_core.models import RunRef

from .test_lease_contract import req, slot_now

pytestmark = pytest.mark.timeout(60)


async def test_each_slot_on_record_answers_its_newest_attempts_status(
        lease_backend: Backend) -> None:
    backend = lease_backend
    slot = await slot_now(backend)
    ran = await backend.claim(req(slot, job="ran"))
    assert ran.won
    await backend.finish(RunRef("ran", slot, ran.token), "success")
    assert (await backend.claim(req(slot, job="going:on {x}"))).won
    assert (await backend.claim(req(slot, job="manual", manual=True))).won
    asked = [("ran", slot), ("going:on {x}", slot), ("manual", slot), ("never", slot),
             ("ran", slot + 1_000)]
    assert await backend.slot_states(asked) == {("ran", slot): "success",
                                                ("going:on {x}", slot): "running"}
    assert await backend.slot_states([]) == {}


async def test_a_slot_taken_over_answers_the_newest_attempt(lease_backend: Backend) -> None:
    backend = lease_backend
    slot = await slot_now(backend)
    first = await backend.claim(req(slot, job="j", lease_ms=1_000, max_attempts=2))
    assert first.won
    assert await backend.release(RunRef("j", slot, first.token))
    assert (await backend.claim(req(slot, "b", job="j", max_attempts=2))).attempt == 2
    assert await backend.slot_states([("j", slot)]) == {("j", slot): "running"}


async def test_claim_only_stores_cannot_tell(claim_backend: Backend) -> None:
    assert await claim_backend.slot_states([("j", 0)]) is None
